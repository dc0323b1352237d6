//! The binary as a user runs it: exit codes, messages, JSON, reports. These pass on a machine
//! with or without a GPU; GPUKIT_REQUIRE_GPU=1 (set by scripts/gpu-test.sh) adds the GPU facts.
//! GPUKIT_BIN overrides the binary's path (the staged copy on the GPU machine).

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> PathBuf {
    std::env::var_os("GPUKIT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpukit")))
}

fn gpukit(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run gpukit")
}

fn require_gpu() -> bool {
    std::env::var("GPUKIT_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_json_parses_and_says_whether_a_gpu_is_there() {
    let out = gpukit(&["check", "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let available = v["available"].as_bool().expect("available is a bool");
    assert!(v["host"]["logical_cores"].as_u64().unwrap() >= 1);
    assert!(!v["host"]["cpu_model"].as_str().unwrap().is_empty());
    assert_eq!(v["libraries"].as_array().unwrap().len(), 9);
    if available {
        assert!(v["reason"].is_null());
        let gpu = &v["gpus"][0];
        assert!(gpu["sm_count"].as_u64().unwrap() > 0);
        assert!(gpu["memory_usable_bytes"].as_u64().unwrap() > 0);
        assert!(gpu["l2_cache_bytes"].as_u64().unwrap() > 0);
        assert_eq!(v["cuda_initialized"], true);
        assert!(gpu["peaks"]["f32_tflops"].as_f64().unwrap() > 0.0);
    } else {
        assert!(
            !require_gpu(),
            "GPU required but check says: {}",
            v["reason"]
        );
        let reason = v["reason"].as_str().expect("a reason when unavailable");
        assert!(reason.len() > 20, "{reason}");
        assert!(v["gpus"].as_array().unwrap().is_empty());
    }
    if require_gpu() {
        for lib in v["libraries"].as_array().unwrap() {
            // NVTX's library is optional (NVTX 3 is header-only); the rest must be found
            if lib["library"] != "nvtx" {
                assert_eq!(lib["found"], true, "{lib}");
            }
        }
    }
}

#[test]
fn quick_check_asks_nvml_only_and_says_so() {
    let out = gpukit(&["check", "--quick", "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cuda_initialized"], false);
    assert!(v["loader_path_added"].as_array().unwrap().is_empty());
    if v["available"] == true {
        let gpu = &v["gpus"][0];
        assert!(gpu["memory_board_bytes"].as_u64().unwrap() > 0);
        assert!(gpu["l2_cache_bytes"].is_null(), "L2 comes from CUDA only");
        assert!(gpu["compute_capability"].is_array());
    } else {
        assert!(
            !require_gpu(),
            "GPU required but --quick says: {}",
            v["reason"]
        );
        assert!(
            v["reason"].as_str().unwrap().contains("driver"),
            "{}",
            v["reason"]
        );
    }
}

#[test]
fn check_human_view_has_a_headline_and_host_facts() {
    let out = gpukit(&["check"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("GPU available") || s.contains("No GPU available"),
        "{s}"
    );
    assert!(
        s.contains("CUDA libraries") && s.contains("Host") && s.contains("SIMD"),
        "{s}"
    );
}

#[test]
fn unknown_flag_and_bad_device_exit_2_with_a_message() {
    let out = gpukit(&["check", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--bogus"));
    let out = gpukit(&["check", "--device", "tpu:0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("unknown device 'tpu:0'"),
        "{}",
        text(&out.stderr)
    );
    let out = gpukit(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_device_that_does_not_exist_exits_2_and_no_gpu_exits_1() {
    let has_gpu = {
        let v: serde_json::Value =
            serde_json::from_slice(&gpukit(&["check", "--quick", "--json"]).stdout).unwrap();
        v["available"] == true
    };
    for args in [
        &["check", "--device", "cuda:9"][..],
        &["bench", "matmul", "--device", "cuda:9", "--sizes", "64"][..],
        &[
            "infer",
            "--device",
            "cuda:9",
            "--model-name",
            "resnet18",
            "--batch-sizes",
            "1",
            "--image-size",
            "32",
        ][..],
    ] {
        let out = gpukit(args);
        // a GPU index past the last is a typo (2); no GPU at all is missing hardware (1)
        let want = if has_gpu { 2 } else { 1 };
        assert_eq!(
            out.status.code(),
            Some(want),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(err.contains("cuda:9"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn bench_bad_input_exits_2() {
    for args in [
        &["bench", "matmul", "--sizes", "0"][..],
        &["bench", "matmul", "--sizes", "12,abc"][..],
        &["bench", "matmul", "--matrix-size", "-4"][..],
        &["bench", "matmul", "--dtype", "int8"][..],
        &["bench", "matmul", "--iterations", "0"][..],
        &["bench", "bandwidth", "--sizes", "12Q"][..],
        &["bench", "conv", "--dtype", "bf16"][..],
        &["bench", "conv", "--layout", "nwhc"][..],
    ] {
        let out = gpukit(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!text(&out.stderr).contains("panicked"));
    }
}

#[test]
fn bench_matmul_on_the_cpu_verifies_and_reports() {
    let out = gpukit(&[
        "bench",
        "matmul",
        "--device",
        "cpu",
        "--sizes",
        "65,128",
        "--iterations",
        "3",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["matmul"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "5 dtypes x 2 sizes");
    for r in rows {
        assert_eq!(r["status"]["status"], "ok", "{r}");
        assert_eq!(r["verification"]["passed"], true, "{r}");
        assert!(r["tflops"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_conv_on_the_cpu_runs_every_shape() {
    let out = gpukit(&[
        "bench",
        "conv",
        "--device",
        "cpu",
        "--batch",
        "1",
        "--iterations",
        "1",
        "--layout",
        "nhwc",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for shape in ["conv1 7x7/2", "layer1 3x3", "layer4 1x1 reduce"] {
        assert!(s.contains(shape), "{s}");
    }
}

#[test]
fn gpukit_cuda_path_pointing_nowhere_warns_and_carries_on() {
    let out = Command::new(bin())
        .args(["check", "--json"])
        .env("GPUKIT_CUDA_PATH", "/nonexistent/cuda")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("GPUKIT_CUDA_PATH") && err.contains("/nonexistent/cuda"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["warnings"][0]
        .as_str()
        .unwrap()
        .contains("/nonexistent/cuda"));
}

#[test]
fn gpukit_cuda_path_finds_libraries_placed_there() {
    // A fake libnccl.so.2 in a user directory must be found there, ahead of anything else.
    let dir = std::env::temp_dir().join(format!("gpukit-cli-libs-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(dir.join("lib/libnccl.so.2"), b"not really a library").unwrap();
    let out = Command::new(bin())
        .args(["check", "--json"])
        .env("GPUKIT_CUDA_PATH", &dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nccl = v["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["library"] == "nccl")
        .unwrap()
        .clone();
    assert_eq!(nccl["found"], true);
    assert_eq!(nccl["source"], "gpukit_cuda_path");
    assert_eq!(nccl["path"], dir.join("lib/libnccl.so.2").to_str().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn all_writes_both_reports() {
    let dir = std::env::temp_dir().join(format!("gpukit-cli-all-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = gpukit(&["all", "--out", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert!(json["check"]["host"]["cpu_model"].is_string());
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.starts_with("# gpukit report"));
    assert!(md.contains("### CUDA libraries"));
    if json["check"]["available"] == false {
        assert!(md.contains("## Skipped"), "{md}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn all_into_an_unwritable_place_fails_with_the_path() {
    let out = gpukit(&["all", "--out", "/proc/gpukit-cannot-write-here"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/proc/gpukit-cannot-write-here"));
}

#[test]
fn help_lists_only_real_commands() {
    let out = gpukit(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    assert!(s.contains("check") && s.contains("all"));
}

#[test]
fn infer_on_the_cpu_reports_rows_that_agree() {
    let out = gpukit(&[
        "infer",
        "--model-name",
        "resnet18",
        "--batch-sizes",
        "1,2",
        "--image-size",
        "48",
        "--iterations",
        "1",
        "--device",
        "cpu",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["parameters"], 11_689_512);
    assert!(
        v["gpu_device"].is_null() && v["gpu_unavailable"].is_null(),
        "{v}"
    );
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.len() >= 2);
    for r in rows {
        assert_eq!(r["status"]["status"], "ok", "{r}");
        assert_eq!(r["device"], "cpu", "{r}");
        assert!(r["images_per_s"].as_f64().unwrap() > 0.0);
        // every row has the same keys, GPU-only ones null on the CPU
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        for k in [
            "strategy",
            "device",
            "batch",
            "status",
            "timing",
            "images_per_s",
            "speedup_vs_reference",
            "speedup_vs_fp32_eager",
            "gpu_memory_bytes",
            "gpu_memory",
            "agreement",
            "compared_with",
            "tolerance",
            "pytorch",
        ] {
            assert!(keys.contains(&k), "{k} missing from {r}");
        }
        assert!(r["gpu_memory_bytes"].is_null() && r["speedup_vs_fp32_eager"].is_null());
    }
    // sorted by batch, the CPU reference first within a batch
    let order: Vec<(u64, String)> = rows
        .iter()
        .map(|r| {
            (
                r["batch"].as_u64().unwrap(),
                r["strategy"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(order[0].0, 1);
    assert!(order[0].1.starts_with("gpukit f32"), "{order:?}");
    assert_eq!(order.last().unwrap().0, 2);
}

fn has_gpu() -> bool {
    let v: serde_json::Value =
        serde_json::from_slice(&gpukit(&["check", "--quick", "--json"]).stdout).unwrap();
    v["available"] == true
}

/// A small, quick infer run on every device the machine has.
const SMALL_INFER: [&str; 10] = [
    "infer",
    "--model-name",
    "resnet18",
    "--batch-sizes",
    "1,2",
    "--image-size",
    "48",
    "--iterations",
    "1",
    "--gpu-iterations",
];

#[test]
fn infer_on_all_devices_runs_gpu_rows_or_says_why_not() {
    let mut args = SMALL_INFER.to_vec();
    args.extend(["3", "--json"]);
    let out = gpukit(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let gpu_rows: Vec<&serde_json::Value> = rows.iter().filter(|r| r["device"] != "cpu").collect();
    assert!(rows.iter().any(|r| r["device"] == "cpu"), "{v}");
    // gpukit runs no TensorRT; the report says whether its library is there
    let tensorrt = v["tensorrt"].as_str().expect("the TensorRT line");
    assert!(
        tensorrt.starts_with("unavailable: libnvinfer not found")
            || (tensorrt.starts_with("libnvinfer found at ") && tensorrt.contains("no TensorRT")),
        "{tensorrt}"
    );
    if has_gpu() {
        assert!(v["gpu_unavailable"].is_null(), "{v}");
        assert!(
            v["gpu_device"].as_str().unwrap().starts_with("cuda:0 "),
            "{v}"
        );
        // 12 default GPU strategies x 2 batch sizes, and fp16-nhwc-graph one image at a time
        // at batch 2 (none at batch 1)
        assert_eq!(gpu_rows.len(), 25, "{v}");
        let single: Vec<&&serde_json::Value> = gpu_rows
            .iter()
            .filter(|r| r["strategy"] == "fp16-nhwc-graph-one-at-a-time")
            .collect();
        assert_eq!(single.len(), 1, "{v}");
        assert_eq!(single[0]["batch"], 2);
        assert!(
            single[0]["batching_gain"].as_f64().unwrap() > 0.0,
            "{}",
            single[0]
        );
        assert!(
            single[0]["compared_with"]
                .as_str()
                .unwrap()
                .starts_with("fp16-nhwc-graph at batch 2"),
            "{}",
            single[0]
        );
        for r in &gpu_rows {
            assert_eq!(r["status"]["status"], "ok", "{r}");
            assert_eq!(r["device"], "cuda:0");
            assert!(r["gpu_memory_bytes"].as_u64().unwrap() > 0, "{r}");
            assert!(r["tolerance"].as_f64().unwrap() > 0.0, "{r}");
            assert!(
                r["agreement"]["max_rel"].as_f64().unwrap() <= r["tolerance"].as_f64().unwrap()
            );
            assert!(r["speedup_vs_fp32_eager"].as_f64().unwrap() > 0.0, "{r}");
        }
        let first_gpu = rows.iter().position(|r| r["device"] != "cpu").unwrap();
        assert_eq!(
            rows[first_gpu]["strategy"], "fp32",
            "GPU rows in the default order"
        );
    } else {
        assert!(gpu_rows.is_empty(), "{v}");
        let why = v["gpu_unavailable"]
            .as_str()
            .expect("the reason GPU rows are absent");
        assert!(why.len() > 20, "{why}");
        // the table says it too
        let mut args = SMALL_INFER.to_vec();
        args.push("3");
        let out = gpukit(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let s = text(&out.stdout);
        assert!(s.contains("GPU rows absent: "), "{s}");
        assert!(s.contains("TensorRT"), "{s}");
        assert!(s.contains("Inference at batch 2"), "{s}");
    }
}

#[test]
fn infer_on_a_named_gpu_runs_it_or_exits_1_naming_the_driver() {
    let mut args = SMALL_INFER.to_vec();
    args.extend([
        "3",
        "--device",
        "cuda:0",
        "--strategies",
        "fp16-nhwc-graph,fp32-graph,fp16-nhwc-one-at-a-time",
        "--json",
    ]);
    let out = gpukit(&args);
    if has_gpu() {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows: Vec<(u64, String)> = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["batch"].as_u64().unwrap(),
                    r["strategy"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (1, "fp16-nhwc-graph".to_string()),
                (1, "fp32-graph".to_string()),
                (2, "fp16-nhwc-graph".to_string()),
                (2, "fp32-graph".to_string()),
                (2, "fp16-nhwc-one-at-a-time".to_string()),
            ],
            "only the GPU rows asked for, in their order; fp32 eager runs as the reference only; \
             one image at a time only over batch 1"
        );
        // without a batched fp16-nhwc row, the one-at-a-time row is checked against the reference
        let single = &v["rows"].as_array().unwrap()[4];
        assert_eq!(single["status"]["status"], "ok", "{single}");
        assert!(single["batching_gain"].is_null(), "{single}");
        assert!(
            single["compared_with"]
                .as_str()
                .unwrap()
                .contains("no passing batched fp16-nhwc row"),
            "{single}"
        );
    } else {
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("cuda:0") && err.contains("NVIDIA driver"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn infer_bad_input_exits_2_with_the_reason() {
    for (args, needle) in [
        (&["infer", "--batch-sizes", "0"][..], "at least 1"),
        (&["infer", "--batch-sizes", "x"][..], "'x'"),
        (&["infer", "--model-name", "vgg16"][..], "vgg16"),
        (&["infer", "--strategies", "fp16,fp8"][..], "\"fp8\""),
        (&["infer", "--strategies", "fp16-nhwc-fast"][..], "\"fast\""),
        (
            &["infer", "--strategies", "fp16-one-at-a-time-graph"][..],
            "-one-at-a-time]",
        ),
        (
            &[
                "infer",
                "--strategies",
                "fp16-one-at-a-time",
                "--device",
                "cpu",
            ][..],
            "fp16-one-at-a-time",
        ),
        (
            &["infer", "--strategies", "cpu", "--device", "cuda:0"][..],
            "cpu",
        ),
        (
            &["infer", "--strategies", "bf16-nhwc", "--device", "cpu"][..],
            "bf16-nhwc",
        ),
        (&["infer", "--device", "tpu"][..], "tpu"),
        (
            &["infer", "--weights", "/nonexistent/w.safetensors"][..],
            "/nonexistent/w.safetensors",
        ),
        (
            &["infer", "--image-size", "16", "--model-name", "resnet18"][..],
            "too small",
        ),
    ] {
        let out = gpukit(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn memory_bad_input_exits_2_and_no_gpu_exits_1() {
    for (args, needle) in [
        (&["memory", "--memory-fraction", "0"][..], "above 0"),
        (&["memory", "--memory-fraction", "1.5"][..], "at most 1"),
        (&["memory", "--memory-fraction", "half"][..], "'half'"),
        (&["memory", "--batch-sizes", "0"][..], "at least 1"),
        (&["memory", "--batch-sizes=-4"][..], "'-4'"),
        (&["memory", "--precision", "fp8"][..], "fp8"),
        (&["memory", "--device", "cpu"][..], "cuda:N"),
        (&["memory", "--max-workspace", "300"][..], "256 MiB"),
        (&["memory", "--max-workspace", "lots"][..], "'lots'"),
    ] {
        let o = gpukit(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // without an NVIDIA driver at all (CI): a clear message naming what to install, exit 1
    if !require_gpu() && !std::path::Path::new("/dev/nvidiactl").exists() {
        let o = gpukit(&["memory", "--batch-sizes", "1"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("no GPU") && err.contains("NVIDIA driver"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
