//! `gpukit infer` as a user runs it: on the CPU anywhere, its GPU rows where a GPU is usable
//! (ignored, with the reason, elsewhere), and what it says where none is.

mod common;
mod fake_pytorch;

use common::*;
use libtest_mimic::Failed;
use serde_json::Value;

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

/// Every importer fixture (the dilated, unevenly padded one too) written to a file in `dir`,
/// by name.
fn onnx_fixtures(dir: &std::path::Path) -> Result<Vec<(String, String)>, Failed> {
    use gpukit_models::onnx::fixtures;
    let mut files = Vec::new();
    let seed = gpukit_tensor::random::fresh_seed();
    let atrous = fixtures::Fixture {
        name: "atrous",
        model: fixtures::atrous(seed),
    };
    for f in fixtures::all(seed).into_iter().chain([atrous]) {
        let path = dir.join(format!("{}.onnx", f.name));
        std::fs::write(&path, f.bytes())?;
        let shown = path.to_str().ok_or("a temporary path that is not UTF-8")?;
        files.push((f.name.to_string(), shown.to_string()));
    }
    Ok(files)
}

/// Each fixture model through `infer --onnx` on the CPU: gpukit's rows checked against ONNX
/// Runtime's (within 1e-5) and timed, ONNX Runtime's timed, the passes' check passed, the model
/// described (opset, nodes before and after the passes, input and output shapes at the batch).
fn infer_onnx_runs_every_fixture_checked_against_onnxruntime() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    for (name, file) in onnx_fixtures(dir.path())? {
        let args = [
            "infer",
            "--onnx",
            &file,
            "--batch-sizes",
            "2,1",
            "--iterations",
            "2",
            "--device",
            "cpu",
        ];
        let doc = document(&args, 0)?;
        ensure(doc["command"] == "infer --onnx", || format!("{doc}"))?;
        let v = &doc["result"];
        ensure(v["batch_sizes"] == serde_json::json!([1, 2]), || {
            format!("{name}: {v}")
        })?;
        let m = &v["model"];
        ensure(
            m["opset"].as_i64().is_some_and(|o| o >= 13)
                && m["nodes_optimized"].as_u64() <= m["nodes_imported"].as_u64()
                && m["inputs"][0]["shape"] == serde_json::json!([1, 3, 32, 32])
                && m["outputs"][0]["name"] == "logits"
                && m["outputs"][0]["shape"] == serde_json::json!([1, 10]),
            || format!("{name}: {m}"),
        )?;
        ensure(v["passes_check"]["status"]["status"] == "ok", || {
            format!("{name}: {v}")
        })?;
        ensure(v["onnxruntime_unavailable"].is_null(), || {
            format!("{name}: {v}")
        })?;
        let rows = v["rows"].as_array().cloned().unwrap_or_default();
        ensure(rows.len() == 4, || format!("{name}: {v}"))?;
        for r in &rows {
            ensure(
                r["status"]["status"] == "ok"
                    && r["device"] == "cpu"
                    && r["images_per_s"].as_f64().unwrap_or(0.0) > 0.0
                    && r["timing"]["summary_ms"]["count"].as_u64() == Some(2),
                || format!("{name}: {r}"),
            )?;
        }
        let gpukit: Vec<&Value> = rows
            .iter()
            .filter(|r| r["strategy"] == "gpukit graph f32")
            .collect();
        ensure(gpukit.len() == 2, || format!("{name}: {v}"))?;
        // judged against float64 (within 1e-5, or as close as ONNX Runtime's f32), its
        // agreement with ONNX Runtime shown beside
        for r in gpukit {
            let f = &r["float64"];
            ensure(
                f["tolerance"].as_f64().is_some_and(|t| t >= 1e-5)
                    && f["max_rel"]
                        .as_f64()
                        .zip(f["tolerance"].as_f64())
                        .is_some_and(|(m, t)| m <= t)
                    && r["agreement"]["max_rel"]
                        .as_f64()
                        .is_some_and(|m| m <= 1e-5)
                    && r["compared_with"]
                        .as_str()
                        .is_some_and(|c| c.contains("ONNX Runtime")),
                || format!("{name}: {r}"),
            )?;
        }
        ensure(
            v["float64"].as_array().is_some_and(|f| f.len() == 2),
            || format!("{name}: {v}"),
        )?;
    }
    Ok(())
}

/// A model whose f32 weights are in an external data file beside it (as torch.onnx.export
/// writes models over 2 GiB): gpukit imports it, ONNX Runtime reads it from its path, and the
/// rows agree.
fn infer_onnx_reads_external_data_beside_the_model() -> Result<(), Failed> {
    use gpukit_models::onnx::proto::{StringStringEntryProto, DATA_LOCATION_EXTERNAL};
    let dir = tempfile::tempdir()?;
    let mut model = gpukit_models::onnx::fixtures::tiny_resnet(gpukit_tensor::random::fresh_seed());
    let mut data = Vec::new();
    let graph = model.graph.as_mut().ok_or("the fixture has no graph")?;
    for t in graph
        .initializer
        .iter_mut()
        .filter(|t| !t.raw_data.is_empty())
    {
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
        };
        t.external_data = vec![
            entry("location", "weights.bin".into()),
            entry("offset", data.len().to_string()),
            entry("length", t.raw_data.len().to_string()),
        ];
        t.data_location = DATA_LOCATION_EXTERNAL;
        data.append(&mut t.raw_data);
    }
    std::fs::write(dir.path().join("weights.bin"), &data)?;
    let file = dir.path().join("external.onnx");
    std::fs::write(&file, gpukit_models::onnx::fixtures::bytes(&model))?;
    let file = file.to_str().ok_or("a temporary path that is not UTF-8")?;
    let args = [
        "infer",
        "--onnx",
        file,
        "--batch-sizes",
        "2",
        "--iterations",
        "1",
        "--device",
        "cpu",
    ];
    let doc = document(&args, 0)?;
    let v = &doc["result"];
    ensure(v["model"]["external_data"] == true, || format!("{v}"))?;
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    ensure(
        rows.len() == 2
            && rows.iter().all(|r| r["status"]["status"] == "ok")
            && rows[0]["agreement"]["max_rel"]
                .as_f64()
                .is_some_and(|m| m <= 1e-5),
        || format!("{v}"),
    )
}

/// `infer --onnx` on a fixture with GPU strategies named; what `check` does with its GPU rows is
/// the caller's: see the two tests below.
fn infer_onnx_document(
    model: &gpukit_models::onnx::ModelProto,
    name: &str,
) -> Result<(tempfile::TempDir, Vec<String>), Failed> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join(format!("{name}.onnx"));
    std::fs::write(&file, gpukit_models::onnx::fixtures::bytes(model))?;
    let file = file.to_str().ok_or("a temporary path that is not UTF-8")?;
    let args: Vec<String> = [
        "infer",
        "--onnx",
        file,
        "--batch-sizes",
        "1,2",
        "--iterations",
        "1",
        "--device",
        "all",
        "--strategies",
        "cpu,fp32,fp16-nhwc-graph",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Ok((dir, args))
}

/// Without a GPU, GPU strategies named with `--onnx` give rows skipped with the reason (the
/// driver to install), never a figure, and the command still passes on its CPU rows; the table
/// says why (without ONNX Runtime the CPU row is unchecked, and still passes). The float64
/// reference the fp32 rows would be judged against is computed at each batch size, ONNX
/// Runtime's distance from it given where ONNX Runtime ran.
fn without_a_gpu_infer_onnx_skips_gpu_strategies_with_the_reason() -> Result<(), Failed> {
    let model = gpukit_models::onnx::fixtures::tiny_resnet(2);
    let (_dir, args) = infer_onnx_document(&model, "tiny_resnet")?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let doc = document(&args, 0)?;
    let v = &doc["result"];
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let gpu: Vec<&Value> = rows.iter().filter(|r| r["device"] != "cpu").collect();
    ensure(gpu.len() == 4, || format!("{v}"))?;
    for r in &gpu {
        ensure(
            r["status"]["status"] == "skipped"
                && r["status"]["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("driver"))
                && r["timing"].is_null()
                && r["images_per_s"].is_null(),
            || format!("{r}"),
        )?;
    }
    ensure(
        rows.iter()
            .any(|r| r["device"] == "cpu" && r["status"]["status"] == "ok"),
        || format!("{v}"),
    )?;
    let float64 = v["float64"].as_array().cloned().unwrap_or_default();
    let batches: Vec<u64> = float64.iter().filter_map(|f| f["batch"].as_u64()).collect();
    ensure(batches == [1, 2], || format!("{v}"))?;
    for f in &float64 {
        ensure(
            f["unavailable"].is_null()
                && f["seconds"].as_f64().is_some()
                && (v["onnxruntime"].is_null()
                    || f["onnxruntime_max_rel"]
                        .as_f64()
                        .is_some_and(|m| m > 0.0 && m <= 1e-5)),
            || format!("{f}"),
        )?;
    }
    let out = gpukit(&args);
    exited(&out, 0, &args)?;
    let s = text(&out.stdout);
    ensure(
        s.contains("Inference: tiny_resnet.onnx (ONNX)")
            && s.contains("skipped: ")
            && s.contains("driver")
            && s.contains("Latency at batch 1")
            && s.contains("Throughput"),
        || s.clone(),
    )
}

/// With a GPU, every fixture's GPU rows run on the general engine, each checked against the
/// reference of its batch with a figure, a ResNet included: fp32 rows against float64 (ONNX
/// Runtime's agreement shown beside), the others against ONNX Runtime's outputs where it is
/// installed, else the interpreter's.
fn with_a_gpu_infer_onnx_runs_every_fixture_on_the_gpu() -> Result<(), Failed> {
    for f in gpukit_models::onnx::fixtures::all(gpukit_tensor::random::fresh_seed()) {
        let (_dir, args) = infer_onnx_document(&f.model, f.name)?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let doc = document(&args, 0)?;
        let v = &doc["result"];
        let rows = v["rows"].as_array().cloned().unwrap_or_default();
        let gpu: Vec<&Value> = rows.iter().filter(|r| r["device"] != "cpu").collect();
        ensure(gpu.len() == 4, || format!("{}: {v}", f.name))?;
        for r in &gpu {
            let judged = if r["strategy"] == "fp32" {
                r["agreement"]["max_rel"].as_f64().is_some()
                    && r["float64"]["max_rel"]
                        .as_f64()
                        .zip(r["float64"]["tolerance"].as_f64())
                        .is_some_and(|(m, t)| m <= t)
            } else {
                r["agreement"]["max_rel"]
                    .as_f64()
                    .zip(r["tolerance"].as_f64())
                    .is_some_and(|(m, t)| m <= t)
            };
            ensure(
                r["status"]["status"] == "ok"
                    && r["images_per_s"].as_f64().is_some_and(|x| x > 0.0)
                    && judged,
                || format!("{}: {r}", f.name),
            )?;
        }
        ensure(
            v["gpu_engine"]
                .as_str()
                .is_some_and(|e| e.contains("general GPU engine")),
            || format!("{}: {v}", f.name),
        )?;
    }
    Ok(())
}

/// `infer --onnx --fp8-check` on the CPU: the fp8 simulation's section (64 calibration rows,
/// 128 judged, every convolution and Gemm named among the layers), the scales written as
/// JSON, and the exit code that follows the verdict (0 exactly when 99% of the rows keep their
/// top class; otherwise the failure names the layer fp8 hurts most).
fn infer_onnx_fp8_check_judges_fp8_against_f32() -> Result<(), Failed> {
    use gpukit_models::onnx::fixtures;
    let dir = tempfile::tempdir()?;
    let model = dir.path().join("tiny_resnet.onnx");
    std::fs::write(
        &model,
        fixtures::bytes(&fixtures::tiny_resnet(gpukit_tensor::random::fresh_seed())),
    )?;
    let scales = dir.path().join("scales.json");
    let (model, scales) = (
        model.to_str().ok_or("a temporary path that is not UTF-8")?,
        scales
            .to_str()
            .ok_or("a temporary path that is not UTF-8")?,
    );
    // the CPU row at batch 1 once, then the fp8 check with `more`
    let base = [
        "infer",
        "--onnx",
        model,
        "--batch-sizes",
        "1",
        "--iterations",
        "1",
        "--device",
        "cpu",
        "--strategies",
        "cpu",
        "--fp8-check",
    ];
    let mut args = [
        &base[..],
        &[
            "--fp8-calibration",
            "percentile:99.99",
            "--save-fp8-scales",
            scales,
            "--json",
        ],
    ]
    .concat();
    let out = gpukit(&args);
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{args:?}: stdout is not one JSON document: {e}"))?;
    let f = &doc["result"]["fp8"];
    let a = &f["accuracy"];
    ensure(
        f["calibration_rows"] == 64
            && a["rows"] == 128
            && f["calibration"]
                .as_str()
                .is_some_and(|c| c.contains("percentile 99.99")),
        || format!("{f}"),
    )?;
    let agreement = a["top1_agreement"].as_f64().ok_or("no agreement")?;
    let passed = agreement >= 0.99;
    ensure(f["failed"].is_null() == passed, || format!("{f}"))?;
    ensure(
        out.status.code() == Some(if passed { 0 } else { 1 }),
        || {
            format!(
                "exit {:?} with agreement {agreement}: {}",
                out.status,
                text(&out.stderr)
            )
        },
    )?;
    if !passed {
        let worst = a["layers"][0]["node"].as_str().unwrap_or("?");
        ensure(
            f["failed"].as_str().is_some_and(|w| w.contains(worst))
                && f["rescue"]["kept"][0] == a["layers"][0]["node"],
            || format!("{f}"),
        )?;
    } else {
        ensure(f["rescue"].is_null(), || format!("{f}"))?;
    }
    // every convolution and Gemm has its own error and its scales in the file
    let layers = a["layers"].as_array().cloned().unwrap_or_default();
    let saved: Value = serde_json::from_slice(&std::fs::read(scales)?)?;
    let nodes = saved["nodes"].as_array().cloned().unwrap_or_default();
    ensure(layers.len() >= 7 && nodes.len() == layers.len(), || {
        format!("{} layers, {} scaled: {saved}", layers.len(), nodes.len())
    })?;
    ensure(
        layers
            .iter()
            .all(|l| l["rel_error"].as_f64().is_some_and(|e| e > 0.0 && e < 0.5)),
        || format!("{layers:?}"),
    )?;
    // the terminal report has the section
    args.pop();
    let out = gpukit(&args);
    ensure(
        text(&out.stdout).contains("fp8 (E4M3), simulated on the CPU"),
        || text(&out.stdout),
    )?;
    // samples from a file: 43 rows are 5 batches of 8, 3 calibrate and 2 are judged
    let samples = dir.path().join("samples.safetensors");
    let values = gpukit_tensor::random::normal_f32(43 * 3 * 32 * 32, 7);
    let header = format!(
        "{{\"input\":{{\"dtype\":\"F32\",\"shape\":[43,3,32,32],\"data_offsets\":[0,{}]}}}}",
        values.len() * 4
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&samples, bytes)?;
    let samples = samples
        .to_str()
        .ok_or("a temporary path that is not UTF-8")?;
    let args = [&base[..], &["--calibrate", samples, "--json"]].concat();
    let out = gpukit(&args);
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{args:?}: stdout is not one JSON document: {e}"))?;
    let f = &doc["result"]["fp8"];
    ensure(
        f["calibration_rows"] == 24
            && f["accuracy"]["rows"] == 16
            && f["input"]
                .as_str()
                .is_some_and(|i| i.contains("samples.safetensors") && i.contains("3 left over")),
        || format!("{f}"),
    )?;
    Ok(())
}

/// The ONNX Runtime trials: ignored, with the reason, where it is not installed (a failure
/// under GPUKIT_REQUIRE_ORT=1).
fn onnxruntime_trials() -> Vec<libtest_mimic::Trial> {
    let missing = match gpukit_models::ort_runner::find_onnxruntime() {
        Ok(_) => None,
        Err(e) if std::env::var("GPUKIT_REQUIRE_ORT").is_ok_and(|v| v == "1") => {
            eprintln!("GPUKIT_REQUIRE_ORT=1 but {e}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("ort:: tests ignored (reported as ignored, not passed): {e}");
            Some(e)
        }
    };
    let trials: [(&str, Test); 2] = [
        (
            "ort::infer_onnx_runs_every_fixture_checked_against_onnxruntime",
            infer_onnx_runs_every_fixture_checked_against_onnxruntime,
        ),
        (
            "ort::infer_onnx_reads_external_data_beside_the_model",
            infer_onnx_reads_external_data_beside_the_model,
        ),
    ];
    trials
        .into_iter()
        .map(|(name, f)| libtest_mimic::Trial::test(name, f).with_ignored_flag(missing.is_some()))
        .collect()
}

fn main() {
    run_kinds(
        vec![
            (
                "infer_on_the_cpu_reports_rows_that_agree",
                infer_on_the_cpu_reports_rows_that_agree,
            ),
            (
                "infer_bad_input_exits_2_with_the_reason",
                infer_bad_input_exits_2_with_the_reason,
            ),
            (
                "infer_onnx_fp8_check_judges_fp8_against_f32",
                infer_onnx_fp8_check_judges_fp8_against_f32,
            ),
        ],
        vec![
            (
                "no_gpu::infer_says_why_gpu_rows_are_absent",
                without_a_gpu_infer_says_why_gpu_rows_are_absent,
            ),
            (
                "no_gpu::infer_onnx_skips_gpu_strategies_with_the_reason",
                without_a_gpu_infer_onnx_skips_gpu_strategies_with_the_reason,
            ),
        ],
        vec![
            (
                "gpu::infer_onnx_runs_every_fixture_on_the_gpu",
                with_a_gpu_infer_onnx_runs_every_fixture_on_the_gpu,
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
        ],
        onnxruntime_trials()
            .into_iter()
            .chain(fake_pytorch::trials())
            .collect(),
    )
}
