//! The binary as a user runs it: exit codes, messages, JSON, reports. Three kinds of test: those
//! that hold on any machine; those that need a GPU (reported as ignored, with the reason, where
//! there is none; GPUKIT_REQUIRE_GPU=1 on the GPU machine turns "no GPU" into a failure); and
//! those about a machine without one (ignored, with the reason, where a GPU is usable). None
//! branches on the machine inside: what a test checks is fixed by its kind. GPUKIT_BIN
//! overrides the binary's path (the staged copy on the GPU machine).

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;
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

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// An error unless the process exited with `code`; names the command and its stderr.
fn exited(out: &Output, code: i32, args: &[&str]) -> Result<(), Failed> {
    ensure(out.status.code() == Some(code), || {
        format!(
            "{args:?}: exit {:?}, wanted {code}; stderr: {}",
            out.status.code(),
            text(&out.stderr)
        )
    })?;
    ensure(!text(&out.stderr).contains("panicked"), || {
        format!("{args:?} panicked: {}", text(&out.stderr))
    })
}

/// Runs gpukit with `--json`, expects exit `code` and returns the document (the envelope).
fn document(args: &[&str], code: i32) -> Result<Value, Failed> {
    let mut all = args.to_vec();
    all.push("--json");
    let out = gpukit(&all);
    exited(&out, code, &all)?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{all:?}: stdout is not one JSON document: {e}"))?;
    for key in [
        "gpukit_version",
        "command",
        "ok",
        "failure",
        "notes",
        "pytorch",
        "result",
    ] {
        ensure(doc.get(key).is_some(), || format!("{key} missing: {doc}"))?;
    }
    ensure(doc["gpukit_version"] == env!("CARGO_PKG_VERSION"), || {
        format!("{doc}")
    })?;
    ensure(doc["ok"] == (code == 0), || {
        format!("ok must follow the exit code: {doc}")
    })?;
    Ok(doc)
}

// ---- any machine ----

fn check_json_is_an_envelope_with_host_facts() -> Result<(), Failed> {
    let doc = document(&["check"], 0)?;
    let v = &doc["result"];
    ensure(doc["command"] == "check", || format!("{doc}"))?;
    ensure(v["available"].is_boolean(), || format!("{v}"))?;
    ensure(
        v["host"]["logical_cores"].as_u64().unwrap_or(0) >= 1,
        || format!("{v}"),
    )?;
    ensure(v["libraries"].as_array().map_or(0, Vec::len) == 9, || {
        format!("{v}")
    })
}

fn check_human_view_has_a_headline_and_host_facts() -> Result<(), Failed> {
    let out = gpukit(&["check"]);
    exited(&out, 0, &["check"])?;
    let s = text(&out.stdout);
    ensure(
        s.contains("GPU available") || s.contains("No GPU available"),
        || s.clone(),
    )?;
    ensure(
        s.contains("CUDA libraries") && s.contains("Host") && s.contains("SIMD"),
        || s.clone(),
    )
}

fn unknown_flag_and_bad_device_exit_2_with_a_message() -> Result<(), Failed> {
    let out = gpukit(&["check", "--bogus"]);
    exited(&out, 2, &["check", "--bogus"])?;
    ensure(text(&out.stderr).contains("--bogus"), || text(&out.stderr))?;
    let out = gpukit(&["check", "--device", "tpu:0"]);
    exited(&out, 2, &["check", "--device", "tpu:0"])?;
    ensure(text(&out.stderr).contains("unknown device 'tpu:0'"), || {
        text(&out.stderr)
    })?;
    exited(&gpukit(&["frobnicate"]), 2, &["frobnicate"])
}

fn bench_bad_input_exits_2() -> Result<(), Failed> {
    for args in [
        &["bench", "matmul", "--sizes", "0"][..],
        &["bench", "matmul", "--sizes", "12,abc"][..],
        &["bench", "matmul", "--matrix-size", "-4"][..],
        &["bench", "matmul", "--dtype", "int8"][..],
        &["bench", "matmul", "--iterations", "0"][..],
        &["bench", "bandwidth", "--sizes", "12Q"][..],
        &["bench", "conv", "--dtype", "f64"][..],
        &["bench", "conv", "--layout", "nwhc"][..],
    ] {
        exited(&gpukit(args), 2, args)?;
    }
    Ok(())
}

fn bench_matmul_on_the_cpu_verifies_and_reports() -> Result<(), Failed> {
    let args = [
        "bench",
        "matmul",
        "--device",
        "cpu",
        "--sizes",
        "65,128",
        "--iterations",
        "3",
    ];
    let doc = document(&args, 0)?;
    ensure(doc["command"] == "bench matmul", || format!("{doc}"))?;
    let rows = doc["result"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure(rows.len() == 10, || format!("5 dtypes x 2 sizes: {doc}"))?;
    for r in rows {
        ensure(r["status"]["status"] == "ok", || format!("{r}"))?;
        ensure(r["verification"]["passed"] == true, || format!("{r}"))?;
        ensure(r["tflops"].as_f64().unwrap_or(0.0) > 0.0, || format!("{r}"))?;
    }
    Ok(())
}

fn bench_conv_on_the_cpu_runs_every_shape() -> Result<(), Failed> {
    let args = [
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
    ];
    let out = gpukit(&args);
    exited(&out, 0, &args)?;
    let s = text(&out.stdout);
    for shape in [
        "conv1 7x7/2 3->64 @224",
        "layer1 3x3 64->64 @56",
        "layer4 1x1 2048->512 @7",
    ] {
        ensure(s.contains(shape), || s.clone())?;
    }
    Ok(())
}

fn gpukit_cuda_path_pointing_nowhere_warns_and_carries_on() -> Result<(), Failed> {
    let out = Command::new(bin())
        .args(["check", "--json"])
        .env("GPUKIT_CUDA_PATH", "/nonexistent/cuda")
        .output()?;
    exited(&out, 0, &["check", "--json"])?;
    let err = text(&out.stderr);
    ensure(
        err.contains("GPUKIT_CUDA_PATH") && err.contains("/nonexistent/cuda"),
        || err.clone(),
    )?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    ensure(
        doc["result"]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("/nonexistent/cuda")),
        || format!("{doc}"),
    )?;
    // the warning is one of the document's notes too
    ensure(
        doc["notes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n.as_str().is_some_and(|n| n.contains("/nonexistent/cuda")))
        }),
        || format!("{doc}"),
    )
}

fn gpukit_cuda_path_finds_libraries_placed_there() -> Result<(), Failed> {
    // A fake libnccl.so.2 in a user directory must be found there, ahead of anything else.
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("lib"))?;
    std::fs::write(dir.path().join("lib/libnccl.so.2"), b"not really a library")?;
    let out = Command::new(bin())
        .args(["check", "--json"])
        .env("GPUKIT_CUDA_PATH", dir.path())
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .output()?;
    exited(&out, 0, &["check", "--json"])?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    let nccl = doc["result"]["libraries"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["library"] == "nccl").cloned())
        .ok_or("no nccl row")?;
    ensure(nccl["found"] == true, || format!("{nccl}"))?;
    ensure(nccl["source"] == "gpukit_cuda_path", || format!("{nccl}"))?;
    let want = dir.path().join("lib/libnccl.so.2");
    ensure(nccl["path"] == want.to_str().unwrap_or_default(), || {
        format!("{nccl}")
    })
}

fn all_writes_the_three_reports() -> Result<(), Failed> {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir()?;
    // a directory name that is not UTF-8 is a name like any other
    let out_dir = dir.path().join(std::ffi::OsStr::from_bytes(b"report-\xff"));
    let out = Command::new(bin())
        .arg("all")
        .arg("--out")
        .arg(&out_dir)
        .output()?;
    exited(&out, 0, &["all", "--out", "report-\u{fffd}"])?;
    let json: Value = serde_json::from_slice(&std::fs::read(out_dir.join("report.json"))?)?;
    ensure(json["command"] == "all" && json["ok"] == true, || {
        format!("{json}")
    })?;
    ensure(
        json["result"]["check"]["host"]["cpu_model"].is_string(),
        || format!("{json}"),
    )?;
    // the GPU rows are there (a device named) or say why not: never neither
    let infer = &json["result"]["infer"];
    ensure(
        infer["gpu_device"].is_string() || infer["gpu_unavailable"].is_string(),
        || format!("{infer}"),
    )?;
    let md = std::fs::read_to_string(out_dir.join("report.md"))?;
    ensure(md.starts_with("# gpukit report"), || md.clone())?;
    ensure(!md.contains("not selected"), || md.clone())?;
    ensure(md.contains("### CUDA libraries"), || md.clone())?;
    // every note of the document is in report.md too
    for n in json["notes"].as_array().cloned().unwrap_or_default() {
        let n = n.as_str().unwrap_or_default().to_string();
        ensure(md.contains(&n), || {
            format!("note {n:?} missing from report.md")
        })?;
    }
    let names: Vec<String> = std::fs::read_dir(&out_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let html = std::fs::read_to_string(out_dir.join("report.html"))?;
    ensure(
        html.starts_with("<!DOCTYPE html>")
            && html.contains("id=\"matmul\"")
            && !html.contains("<script"),
        || html.chars().take(2000).collect(),
    )?;
    ensure(names.len() == 3, || format!("{names:?}"))
}

fn all_into_an_unwritable_place_fails_at_once_with_the_path() -> Result<(), Failed> {
    let args = ["all", "--out", "/proc/gpukit-cannot-write-here"];
    let started = std::time::Instant::now();
    let out = gpukit(&args);
    exited(&out, 2, &args)?;
    ensure(
        text(&out.stderr).contains("/proc/gpukit-cannot-write-here"),
        || text(&out.stderr),
    )?;
    // checked before any benchmark runs
    ensure(started.elapsed().as_secs_f64() < 5.0, || {
        format!("took {:?}", started.elapsed())
    })
}

fn help_lists_only_real_commands() -> Result<(), Failed> {
    let out = gpukit(&["--help"]);
    exited(&out, 0, &["--help"])?;
    let s = text(&out.stdout);
    ensure(s.contains("check") && s.contains("all"), || s.clone())
}

fn infer_on_the_cpu_reports_rows_that_agree() -> Result<(), Failed> {
    let doc = document(
        &[
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
        ],
        0,
    )?;
    let v = &doc["result"];
    ensure(v["parameters"] == 11_689_512, || format!("{v}"))?;
    ensure(
        v["gpu_device"].is_null() && v["gpu_unavailable"].is_null(),
        || format!("{v}"),
    )?;
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    ensure(rows.len() >= 2, || format!("{v}"))?;
    for r in &rows {
        ensure(r["status"]["status"] == "ok", || format!("{r}"))?;
        ensure(r["device"] == "cpu", || format!("{r}"))?;
        ensure(r["images_per_s"].as_f64().unwrap_or(0.0) > 0.0, || {
            format!("{r}")
        })?;
        // every row has the same keys, GPU-only ones null on the CPU
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
            ensure(r.get(k).is_some(), || format!("{k} missing from {r}"))?;
        }
        ensure(
            r["gpu_memory_bytes"].is_null() && r["speedup_vs_fp32_eager"].is_null(),
            || format!("{r}"),
        )?;
    }
    // sorted by batch, the CPU reference first within a batch
    ensure(rows[0]["batch"] == 1, || format!("{v}"))?;
    ensure(
        rows[0]["strategy"]
            .as_str()
            .is_some_and(|s| s.starts_with("gpukit f32")),
        || format!("{v}"),
    )?;
    ensure(rows[rows.len() - 1]["batch"] == 2, || format!("{v}"))
}

fn infer_bad_input_exits_2_with_the_reason() -> Result<(), Failed> {
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
        exited(&out, 2, args)?;
        ensure(text(&out.stderr).contains(needle), || {
            format!("{args:?}: {}", text(&out.stderr))
        })?;
    }
    Ok(())
}

fn memory_bad_input_exits_2() -> Result<(), Failed> {
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
        exited(&o, 2, args)?;
        ensure(text(&o.stderr).contains(needle), || {
            format!("{args:?}: {}", text(&o.stderr))
        })?;
    }
    Ok(())
}

// ---- a machine without a GPU ----

fn without_a_gpu_check_says_why() -> Result<(), Failed> {
    for quick in [false, true] {
        let args: &[&str] = if quick {
            &["check", "--quick"]
        } else {
            &["check"]
        };
        let doc = document(args, 0)?;
        let v = &doc["result"];
        ensure(v["available"] == false, || format!("{v}"))?;
        let reason = v["reason"].as_str().unwrap_or_default();
        ensure(reason.contains("driver") && reason.len() > 20, || {
            format!("{v}")
        })?;
        ensure(v["gpus"].as_array().is_some_and(Vec::is_empty), || {
            format!("{v}")
        })?;
        ensure(v["cuda_initialized"] == false, || format!("{v}"))?;
    }
    Ok(())
}

fn without_a_gpu_a_named_gpu_exits_1_naming_the_driver() -> Result<(), Failed> {
    for args in [
        &["check", "--device", "cuda:9"][..],
        &["bench", "matmul", "--device", "cuda:0", "--sizes", "64"][..],
        &["memory", "--batch-sizes", "1"][..],
        &[
            "infer",
            "--device",
            "cuda:0",
            "--model-name",
            "resnet18",
            "--batch-sizes",
            "1",
            "--image-size",
            "32",
        ][..],
    ] {
        let out = gpukit(args);
        exited(&out, 1, args)?;
        let err = text(&out.stderr);
        ensure(err.contains("NVIDIA driver"), || format!("{args:?}: {err}"))?;
        ensure(out.stdout.is_empty(), || {
            format!("{args:?} printed a report")
        })?;
    }
    Ok(())
}

fn without_a_gpu_infer_says_why_gpu_rows_are_absent() -> Result<(), Failed> {
    let args = [
        "infer",
        "--model-name",
        "resnet18",
        "--batch-sizes",
        "1,2",
        "--image-size",
        "48",
        "--iterations",
        "1",
    ];
    let doc = document(&args, 0)?;
    let v = &doc["result"];
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    ensure(rows.iter().all(|r| r["device"] == "cpu"), || format!("{v}"))?;
    let why = v["gpu_unavailable"].as_str().unwrap_or_default();
    ensure(why.len() > 20, || format!("{v}"))?;
    // the table says it too
    let out = gpukit(&args);
    exited(&out, 0, &args)?;
    let s = text(&out.stdout);
    ensure(
        s.contains("GPU rows absent: ")
            && s.contains("TensorRT")
            && s.contains("Inference at batch 2"),
        || s.clone(),
    )
}

// ---- a machine with a GPU ----

fn with_a_gpu_check_reports_it() -> Result<(), Failed> {
    let doc = document(&["check"], 0)?;
    let v = &doc["result"];
    ensure(v["available"] == true && v["reason"].is_null(), || {
        format!("{v}")
    })?;
    let gpu = &v["gpus"][0];
    ensure(gpu["sm_count"].as_u64().unwrap_or(0) > 0, || {
        format!("{gpu}")
    })?;
    ensure(gpu["l2_cache_bytes"].as_u64().unwrap_or(0) > 0, || {
        format!("{gpu}")
    })?;
    ensure(v["cuda_initialized"] == true, || format!("{v}"))?;
    ensure(
        gpu["peaks"]["f32_tflops"].as_f64().unwrap_or(0.0) > 0.0,
        || format!("{gpu}"),
    )?;
    for lib in v["libraries"].as_array().cloned().unwrap_or_default() {
        // NVTX's library is optional (NVTX 3 is header-only); the rest must be found
        if lib["library"] != "nvtx" {
            ensure(lib["found"] == true, || format!("{lib}"))?;
        }
    }
    let quick = document(&["check", "--quick"], 0)?;
    let q = &quick["result"];
    ensure(
        q["available"] == true && q["cuda_initialized"] == false,
        || format!("{q}"),
    )?;
    let qg = &q["gpus"][0];
    ensure(
        qg["memory_board_bytes"].as_u64().unwrap_or(0) > 0 && qg["l2_cache_bytes"].is_null(),
        || format!("L2 comes from CUDA only: {qg}"),
    )
}

fn with_a_gpu_a_device_past_the_last_exits_2() -> Result<(), Failed> {
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
        exited(&out, 2, args)?;
        ensure(text(&out.stderr).contains("cuda:9"), || text(&out.stderr))?;
    }
    Ok(())
}

/// A small, quick infer run on every device the machine has.
const SMALL_INFER: [&str; 11] = [
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
    "3",
];

fn with_a_gpu_infer_runs_every_default_strategy() -> Result<(), Failed> {
    let doc = document(&SMALL_INFER, 0)?;
    let v = &doc["result"];
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let gpu_rows: Vec<&Value> = rows.iter().filter(|r| r["device"] != "cpu").collect();
    ensure(rows.iter().any(|r| r["device"] == "cpu"), || format!("{v}"))?;
    let tensorrt = v["tensorrt"].as_str().unwrap_or_default();
    ensure(
        tensorrt.starts_with("unavailable: libnvinfer not found")
            || (tensorrt.starts_with("libnvinfer found at ") && tensorrt.contains("no TensorRT")),
        || tensorrt.to_string(),
    )?;
    ensure(v["gpu_unavailable"].is_null(), || format!("{v}"))?;
    ensure(
        v["gpu_device"]
            .as_str()
            .is_some_and(|d| d.starts_with("cuda:0 ")),
        || format!("{v}"),
    )?;
    // 12 default GPU strategies x 2 batch sizes, and fp16-nhwc-graph one image at a time at
    // batch 2 (none at batch 1)
    ensure(gpu_rows.len() == 25, || {
        format!("{} GPU rows: {v}", gpu_rows.len())
    })?;
    let single: Vec<&&Value> = gpu_rows
        .iter()
        .filter(|r| r["strategy"] == "fp16-nhwc-graph-one-at-a-time")
        .collect();
    ensure(single.len() == 1 && single[0]["batch"] == 2, || {
        format!("{v}")
    })?;
    ensure(
        single[0]["batching_gain"].as_f64().unwrap_or(0.0) > 0.0,
        || format!("{}", single[0]),
    )?;
    ensure(
        single[0]["compared_with"]
            .as_str()
            .is_some_and(|c| c.starts_with("fp16-nhwc-graph at batch 2")),
        || format!("{}", single[0]),
    )?;
    for r in &gpu_rows {
        ensure(
            r["status"]["status"] == "ok" && r["device"] == "cuda:0",
            || format!("{r}"),
        )?;
        ensure(r["gpu_memory_bytes"].as_u64().unwrap_or(0) > 0, || {
            format!("{r}")
        })?;
        let tol = r["tolerance"].as_f64().unwrap_or(0.0);
        ensure(tol > 0.0, || format!("{r}"))?;
        ensure(
            r["agreement"]["max_rel"].as_f64().is_some_and(|m| m <= tol),
            || format!("{r}"),
        )?;
        ensure(
            r["speedup_vs_fp32_eager"].as_f64().unwrap_or(0.0) > 0.0,
            || format!("{r}"),
        )?;
    }
    let first_gpu = rows
        .iter()
        .position(|r| r["device"] != "cpu")
        .ok_or("no GPU row")?;
    ensure(rows[first_gpu]["strategy"] == "fp32", || {
        "GPU rows in the default order".to_string()
    })
}

fn with_a_gpu_infer_on_a_named_gpu_runs_what_was_asked() -> Result<(), Failed> {
    let mut args = SMALL_INFER.to_vec();
    args.extend([
        "--device",
        "cuda:0",
        "--strategies",
        "fp16-nhwc-graph,fp32-graph,fp16-nhwc-one-at-a-time",
    ]);
    let doc = document(&args, 0)?;
    let rows = doc["result"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let got: Vec<(u64, String)> = rows
        .iter()
        .map(|r| {
            (
                r["batch"].as_u64().unwrap_or(0),
                r["strategy"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let want: Vec<(u64, String)> = [
        (1, "fp16-nhwc-graph"),
        (1, "fp32-graph"),
        (2, "fp16-nhwc-graph"),
        (2, "fp32-graph"),
        (2, "fp16-nhwc-one-at-a-time"),
    ]
    .into_iter()
    .map(|(b, s)| (b, s.to_string()))
    .collect();
    // only the GPU rows asked for, in their order; fp32 eager runs as the reference only; one
    // image at a time only over batch 1
    ensure(got == want, || format!("{got:?}"))?;
    // without a batched fp16-nhwc row, the one-at-a-time row is checked against the reference
    let single = &rows[4];
    ensure(single["status"]["status"] == "ok", || format!("{single}"))?;
    ensure(single["batching_gain"].is_null(), || format!("{single}"))?;
    ensure(
        single["compared_with"]
            .as_str()
            .is_some_and(|c| c.contains("no passing batched fp16-nhwc row")),
        || format!("{single}"),
    )
}

/// Weights whose stem output passes fp16's range (its batch-norm scale made huge), run on the
/// GPU with `infer --input`: fp16 must fail naming the overflow and the layer (conv1); fp32 and
/// bf16 keep the range and pass; the run exits 1 and still writes every strategy's logits.
fn with_a_gpu_infer_input_fails_fp16_overflow_naming_the_layer() -> Result<(), Failed> {
    use gpukit_models::weights::{save_safetensors, save_tensors, seeded_init};
    use gpukit_models::ResNet;
    let dir = tempfile::tempdir()?;
    let (weights, input, output) = (
        dir.path().join("w.safetensors"),
        dir.path().join("x.safetensors"),
        dir.path().join("logits.safetensors"),
    );
    let mut dict = seeded_init(ResNet::R18, 1000, 0, true);
    let scale = dict.params.get_mut("bn1.weight").ok_or("no bn1.weight")?;
    scale.data.iter_mut().for_each(|v| *v = 1e6);
    save_safetensors(&dict, &weights)?;
    let x =
        gpukit_tensor::random::uniform_f32(2 * 3 * 64 * 64, gpukit_tensor::random::fresh_seed());
    save_tensors(&input, &[("input", &[2, 3, 64, 64], &x)])?;
    let s = |p: &std::path::Path| p.to_str().unwrap_or_default().to_string();
    let (w, i, o) = (s(&weights), s(&input), s(&output));
    let args = [
        "infer",
        "--model-name",
        "resnet18",
        "--weights",
        &w,
        "--input",
        &i,
        "--save-output",
        &o,
        "--device",
        "all",
        "--strategies",
        "cpu,fp32,fp16-nhwc,bf16-nhwc",
    ];
    let doc = document(&args, 1)?;
    let rows = doc["result"]["logits"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let status = |name: &str| {
        rows.iter()
            .find(|r| r["strategy"] == name)
            .map(|r| r["status"].clone())
            .unwrap_or(Value::Null)
    };
    for ok in ["cpu", "fp32", "bf16-nhwc"] {
        ensure(status(ok)["status"] == "ok", || format!("{ok}: {doc}"))?;
    }
    let why = status("fp16-nhwc")["why"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure(
        status("fp16-nhwc")["status"] == "failed"
            && why.contains("fp16 overflow")
            && why.contains("conv1"),
        || format!("fp16-nhwc: {doc}"),
    )?;
    ensure(doc["result"]["fp16_overflow"]["layer"] == "conv1", || {
        format!("{doc}")
    })?;
    ensure(output.exists(), || {
        "the logits were not written".to_string()
    })
}

/// The tutorial loops run on the CPU and report per epoch; a run stopped after 30 updates and
/// resumed from its checkpoint writes the same per-update losses, to the last digit, as the
/// run that was never stopped.
fn train_runs_the_presets_and_resumes_exactly() -> Result<(), Failed> {
    let doc = document(&["train"], 0)?;
    ensure(doc["command"] == "train" && doc["ok"] == true, || {
        format!("{doc}")
    })?;
    let epochs = doc["result"]["epochs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure(epochs.len() == 3, || format!("{doc}"))?;
    ensure(
        doc["result"]["step_losses"].as_array().map(Vec::len) == Some(48),
        || format!("{doc}"),
    )?;
    let doc = document(
        &[
            "train",
            "--preset",
            "seed-classification",
            "--eval-fraction",
            "0.2",
        ],
        0,
    )?;
    let last = &doc["result"]["epochs"][4];
    ensure(
        last["train_accuracy"].is_number() && last["eval_accuracy"].is_number(),
        || format!("{doc}"),
    )?;
    let dir = tempfile::tempdir()?;
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (ck, a, b, whole) = (p("ck.safetensors"), p("a.csv"), p("b.csv"), p("whole.csv"));
    for args in [
        vec!["train", "--steps", "30", "--save", &ck, "--save-losses", &a],
        vec!["train", "--resume", &ck, "--save-losses", &b],
        vec!["train", "--save-losses", &whole],
    ] {
        exited(&gpukit(&args), 0, &args)?;
    }
    let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
    let joined = format!("{}{}", read(&a), read(&b).trim_start_matches("step,loss\n"));
    ensure(
        joined == read(&whole) && read(&whole).lines().count() == 49,
        || format!("stopped and resumed:\n{joined}\nwhole:\n{}", read(&whole)),
    )
}

fn train_on_a_gpu_says_its_path_is_not_built() -> Result<(), Failed> {
    let args = ["train", "--device", "cuda:0"];
    let out = gpukit(&args);
    exited(&out, 1, &args)?;
    ensure(text(&out.stderr).contains("not built yet"), || {
        text(&out.stderr)
    })
}

/// The python that `--compare-pytorch` runs (GPUKIT_PYTHON, else python3), if it imports torch.
fn python_with_torch() -> Option<String> {
    let python = std::env::var("GPUKIT_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Both tutorial loops through PyTorch on the CPU from the same weights, data and order: the
/// per-update losses agree within the tolerance, and both times are there.
fn with_torch_train_matches_pytorch_update_by_update() -> Result<(), Failed> {
    for preset in ["seed-regression", "seed-classification"] {
        let doc = document(&["train", "--preset", preset, "--compare-pytorch"], 0)?;
        let p = &doc["result"]["pytorch"];
        let d = p["max_relative_difference"].as_f64().unwrap_or(f64::NAN);
        ensure(d <= 1e-4, || format!("{preset}: {p}"))?;
        ensure(
            p["step_losses"].as_array().map(Vec::len)
                == doc["result"]["step_losses"].as_array().map(Vec::len)
                && p["seconds_median"].as_f64().is_some_and(|s| s > 0.0),
            || format!("{preset}: {p}"),
        )?;
    }
    Ok(())
}

/// Without PyTorch, --compare-pytorch fails (exit 1) saying what to install.
fn train_compare_without_python_says_what_to_install() -> Result<(), Failed> {
    let args = ["train", "--compare-pytorch"];
    let out = Command::new(bin())
        .args(args)
        .env("GPUKIT_PYTHON", "/nonexistent/python3")
        .output()?;
    exited(&out, 1, &args)?;
    ensure(
        text(&out.stderr).contains("install Python 3 and PyTorch"),
        || text(&out.stderr),
    )
}

/// The conventions of command-line tools: a version that says the build's CUDA, completion
/// scripts for the shells, a man page; each names every command.
fn version_completions_and_man_page() -> Result<(), Failed> {
    let out = gpukit(&["--version"]);
    exited(&out, 0, &["--version"])?;
    let v = text(&out.stdout);
    ensure(
        v.starts_with("gpukit ") && v.contains("CUDA") && v.contains("build"),
        || v.clone(),
    )?;
    for shell in ["bash", "zsh", "fish"] {
        let out = gpukit(&["completions", shell]);
        exited(&out, 0, &["completions", shell])?;
        let script = text(&out.stdout);
        for command in ["check", "infer", "train", "compare", "all"] {
            ensure(script.contains(command), || {
                format!("{shell} lacks {command}")
            })?;
        }
    }
    let out = gpukit(&["completions", "tcsh"]);
    exited(&out, 2, &["completions", "tcsh"])?;
    let out = gpukit(&["man"]);
    exited(&out, 0, &["man"])?;
    let page = text(&out.stdout);
    ensure(
        page.contains(".TH gpukit 1") && page.contains("train"),
        || page.chars().take(300).collect(),
    )
}

fn main() {
    let (_discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    let args = Arguments::from_args();
    type Test = fn() -> Result<(), Failed>;
    let any: Vec<(&str, Test)> = vec![
        (
            "check_json_is_an_envelope_with_host_facts",
            check_json_is_an_envelope_with_host_facts,
        ),
        (
            "check_human_view_has_a_headline_and_host_facts",
            check_human_view_has_a_headline_and_host_facts,
        ),
        (
            "unknown_flag_and_bad_device_exit_2_with_a_message",
            unknown_flag_and_bad_device_exit_2_with_a_message,
        ),
        ("bench_bad_input_exits_2", bench_bad_input_exits_2),
        (
            "bench_matmul_on_the_cpu_verifies_and_reports",
            bench_matmul_on_the_cpu_verifies_and_reports,
        ),
        (
            "bench_conv_on_the_cpu_runs_every_shape",
            bench_conv_on_the_cpu_runs_every_shape,
        ),
        (
            "gpukit_cuda_path_pointing_nowhere_warns_and_carries_on",
            gpukit_cuda_path_pointing_nowhere_warns_and_carries_on,
        ),
        (
            "gpukit_cuda_path_finds_libraries_placed_there",
            gpukit_cuda_path_finds_libraries_placed_there,
        ),
        ("all_writes_the_three_reports", all_writes_the_three_reports),
        (
            "all_into_an_unwritable_place_fails_at_once_with_the_path",
            all_into_an_unwritable_place_fails_at_once_with_the_path,
        ),
        (
            "help_lists_only_real_commands",
            help_lists_only_real_commands,
        ),
        (
            "version_completions_and_man_page",
            version_completions_and_man_page,
        ),
        (
            "infer_on_the_cpu_reports_rows_that_agree",
            infer_on_the_cpu_reports_rows_that_agree,
        ),
        (
            "infer_bad_input_exits_2_with_the_reason",
            infer_bad_input_exits_2_with_the_reason,
        ),
        ("memory_bad_input_exits_2", memory_bad_input_exits_2),
        (
            "train_runs_the_presets_and_resumes_exactly",
            train_runs_the_presets_and_resumes_exactly,
        ),
        (
            "train_on_a_gpu_says_its_path_is_not_built",
            train_on_a_gpu_says_its_path_is_not_built,
        ),
        (
            "train_compare_without_python_says_what_to_install",
            train_compare_without_python_says_what_to_install,
        ),
    ];
    let no_gpu: Vec<(&str, Test)> = vec![
        ("no_gpu::check_says_why", without_a_gpu_check_says_why),
        (
            "no_gpu::a_named_gpu_exits_1_naming_the_driver",
            without_a_gpu_a_named_gpu_exits_1_naming_the_driver,
        ),
        (
            "no_gpu::infer_says_why_gpu_rows_are_absent",
            without_a_gpu_infer_says_why_gpu_rows_are_absent,
        ),
    ];
    let gpu: Vec<(&str, Test)> = vec![
        ("gpu::check_reports_it", with_a_gpu_check_reports_it),
        (
            "gpu::a_device_past_the_last_exits_2",
            with_a_gpu_a_device_past_the_last_exits_2,
        ),
        (
            "gpu::infer_runs_every_default_strategy",
            with_a_gpu_infer_runs_every_default_strategy,
        ),
        (
            "gpu::infer_on_a_named_gpu_runs_what_was_asked",
            with_a_gpu_infer_on_a_named_gpu_runs_what_was_asked,
        ),
        (
            "gpu::infer_input_fails_fp16_overflow_naming_the_layer",
            with_a_gpu_infer_input_fails_fp16_overflow_naming_the_layer,
        ),
    ];
    if skip.is_none() {
        eprintln!("no_gpu:: tests ignored: this machine has a usable GPU");
    }
    let mut trials: Vec<Trial> = any
        .into_iter()
        .map(|(name, f)| Trial::test(name, f))
        .collect();
    trials.extend(
        no_gpu
            .into_iter()
            .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_none())),
    );
    trials.extend(
        gpu.into_iter()
            .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some())),
    );
    // PyTorch's own tests: ignored (and said so) where the python has no torch
    let torch = python_with_torch();
    if torch.is_none() {
        eprintln!("torch:: tests ignored: no python with torch (set GPUKIT_PYTHON to one)");
    }
    trials.push(
        Trial::test(
            "torch::train_matches_pytorch_update_by_update",
            with_torch_train_matches_pytorch_update_by_update,
        )
        .with_ignored_flag(torch.is_none()),
    );
    libtest_mimic::run(&args, trials).exit();
}
