//! `gpukit profile` as a user runs it: on the CPU (host time, a trace that keeps the format's
//! rules), bad input refused with exit 2, and on a GPU: every kernel tied to an op and a layer,
//! the recorded kernel time never more than the step, a graph's replay attributed op by op
//! with fewer idle gaps than the eager pass, the event-timed fallback, and training.

mod common;

use common::*;
use libtest_mimic::Failed;
use serde_json::Value;

fn trace_is_valid(path: &std::path::Path) -> Result<Value, Failed> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let trace: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("the trace is not JSON: {e}"))?;
    let broken = gpukit_bench::workload::profile::trace::validate(&trace);
    ensure(broken.is_empty(), || format!("trace: {broken:?}"))?;
    Ok(trace)
}

fn rows(doc: &Value) -> Vec<Value> {
    doc["result"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn profile_infer_on_the_cpu_times_every_op_and_writes_a_trace() -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let trace = dir.path().join("cpu.json");
    let t = trace.to_string_lossy().to_string();
    let doc = document(
        &[
            "profile",
            "infer",
            "--device",
            "cpu",
            "--model-name",
            "resnet18",
            "--batch-size",
            "1",
            "--image-size",
            "64",
            "--steps",
            "2",
            "--trace",
            &t,
            "--group-by",
            "layer",
        ],
        0,
    )?;
    let r = &doc["result"];
    ensure(r["host_only"] == true && r["timing"] == "host", || {
        format!("{r}")
    })?;
    // resnet18: the stem, 16 block convolutions, 3 projections, max pooling, the head
    let layers: Vec<String> = rows(&doc)
        .iter()
        .filter_map(|row| row["key"].as_str().map(String::from))
        .collect();
    for want in [
        "conv1",
        "layer1.0.conv1",
        "layer4.1.conv2",
        "layer2.0.downsample.0",
        "fc",
    ] {
        ensure(layers.iter().any(|l| l == want), || {
            format!("no row for {want}: {layers:?}")
        })?;
    }
    ensure(layers.len() == 22, || {
        format!("{} layers: {layers:?}", layers.len())
    })?;
    let calls: u64 = rows(&doc).iter().filter_map(|r| r["calls"].as_u64()).sum();
    ensure(calls == 2 * 22, || format!("{calls} calls over 2 steps"))?;
    let trace = trace_is_valid(&trace)?;
    let events = trace["traceEvents"].as_array().map_or(0, Vec::len);
    ensure(events > 2 * 22, || format!("{events} trace events"))
}

fn profile_train_on_the_cpu_records_the_loop() -> Result<(), Failed> {
    let doc = document(&["profile", "train", "--epochs", "2"], 0)?;
    let names: Vec<String> = rows(&doc)
        .iter()
        .filter_map(|r| r["key"].as_str().map(String::from))
        .collect();
    for want in ["forward", "backward", "optimizer step"] {
        ensure(names.iter().any(|n| n.starts_with(want)), || {
            format!("no {want} row: {names:?}")
        })?;
    }
    // 1024 samples, batch 64: 16 batches an epoch, both epochs recorded (on the CPU every
    // epoch is), and no GPU regime is claimed for host time
    ensure(doc["result"]["steps"] == 32, || {
        format!("{}", doc["result"])
    })?;
    ensure(rows(&doc).iter().all(|r| r["regime"].is_null()), || {
        format!("{}", doc["result"])
    })
}

fn profile_bad_input_exits_2() -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let nowhere = dir.path().join("missing").join("t.json");
    let nowhere = nowhere.to_string_lossy().to_string();
    let missing_model = dir.path().join("none.onnx").to_string_lossy().to_string();
    let model_path = dir.path().join("tiny.onnx");
    std::fs::write(
        &model_path,
        gpukit_models::onnx::fixtures::bytes(&gpukit_models::onnx::fixtures::tiny_resnet(1)),
    )
    .map_err(|e| e.to_string())?;
    let model = model_path.to_string_lossy().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["profile", "lessons"], "unrecognized subcommand"),
        (
            vec!["profile", "infer", "--device", "cpu", "--top", "0"],
            "--top 0",
        ),
        (
            vec!["profile", "infer", "--device", "cpu", "--trace", &nowhere],
            "does not exist",
        ),
        (
            vec!["profile", "infer", "--group-by", "stream"],
            "op, kernel or layer",
        ),
        (
            vec![
                "profile",
                "infer",
                "--device",
                "cpu",
                "--strategy",
                "onnxruntime",
            ],
            "gpukit's own engines",
        ),
        (
            vec![
                "profile",
                "infer",
                "--device",
                "cpu",
                "--strategy",
                "fp16-nhwc",
            ],
            "runs on a GPU",
        ),
        (
            vec![
                "profile", "train", "--model", "resnet18", "--device", "cuda:0", "--gpus", "2",
            ],
            "records one GPU",
        ),
        (
            vec!["profile", "train", "--model", "resnet18"],
            "add --device cuda:0",
        ),
        (
            vec!["profile", "train", "--model", "resnet18", "--layers", "4,4"],
            "--layers",
        ),
        (
            vec!["profile", "infer", "--onnx", &missing_model],
            "cannot be read",
        ),
        (
            vec!["profile", "infer", "--onnx", &model, "--strategy", "cpu"],
            "not one of its strategies",
        ),
        (
            vec!["profile", "infer", "--onnx", &model, "--weights", &model],
            "cannot be used with",
        ),
    ];
    for (args, says) in cases {
        let out = gpukit(&args);
        exited(&out, 2, &args)?;
        ensure(text(&out.stderr).contains(says), || {
            format!("{args:?}: {}", text(&out.stderr))
        })?;
    }
    Ok(())
}

fn gpu_profile(args: &[&str]) -> Result<Value, Failed> {
    let mut all = vec!["profile", "infer", "--device", "cuda:0"];
    all.extend_from_slice(args);
    document(&all, 0)
}

fn with_a_gpu_every_kernel_has_an_op_and_a_layer() -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let trace = dir.path().join("gpu.json");
    let t = trace.to_string_lossy().to_string();
    let doc = gpu_profile(&[
        "--model-name",
        "resnet18",
        "--batch-size",
        "8",
        "--image-size",
        "128",
        "--strategy",
        "fp16-nhwc",
        "--steps",
        "3",
        "--trace",
        &t,
    ])?;
    let r = &doc["result"];
    ensure(r["timing"] == "cupti", || {
        format!("CUPTI was not used: {}", r["fallback"])
    })?;
    ensure(r["kernels"].as_u64().unwrap_or(0) >= 3 * 23, || {
        format!("{r}")
    })?;
    ensure(
        r["unattributed_kernels"] == 0 && r["without_layer"] == 0,
        || format!("{r}"),
    )?;
    // kernels of one stream run one at a time: their total cannot pass the step
    let coverage = r["coverage"].as_f64().unwrap_or(f64::NAN);
    ensure(coverage > 0.3 && coverage <= 1.05, || {
        format!("kernel time / step = {coverage}: {r}")
    })?;
    trace_is_valid(&trace).map(drop)
}

/// An ONNX model on the general engine: every kernel tied to a step named by its ONNX node,
/// the graph replay attributed through the eager pass.
fn with_a_gpu_an_onnx_model_is_profiled_by_node() -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("convnext.onnx");
    let seed = gpukit_tensor::random::fresh_seed();
    std::fs::write(
        &path,
        gpukit_models::onnx::fixtures::bytes(&gpukit_models::onnx::fixtures::convnext(seed)),
    )
    .map_err(|e| e.to_string())?;
    let p = path.to_string_lossy().to_string();
    for strategy in ["fp16-nhwc", "fp32-graph"] {
        let doc = gpu_profile(&[
            "--onnx",
            &p,
            "--batch-size",
            "4",
            "--strategy",
            strategy,
            "--steps",
            "3",
            "--group-by",
            "layer",
        ])?;
        let r = &doc["result"];
        ensure(
            r["unattributed_kernels"] == 0 && r["without_layer"] == 0,
            || format!("{strategy}: {r}"),
        )?;
        let rows = rows(&doc);
        ensure(rows.len() >= 5, || format!("{strategy}: {r}"))?;
    }
    Ok(())
}

fn with_a_gpu_a_graph_replay_is_attributed_and_has_fewer_gaps() -> Result<(), Failed> {
    let doc = gpu_profile(&[
        "--model-name",
        "resnet18",
        "--batch-size",
        "1",
        "--image-size",
        "64",
        "--strategy",
        "fp16-nhwc-graph",
        "--steps",
        "5",
        "--group-by",
        "layer",
    ])?;
    let r = &doc["result"];
    ensure(
        r["attribution"]
            .as_str()
            .is_some_and(|a| a.contains("matched")),
        || format!("{r}"),
    )?;
    ensure(r["unattributed_kernels"] == 0, || format!("{r}"))?;
    let graph = r["idle"]["idle_us_per_step"].as_f64().unwrap_or(f64::NAN);
    let eager = r["eager_idle"]["idle_us_per_step"]
        .as_f64()
        .unwrap_or(f64::NAN);
    ensure(graph < eager, || {
        format!("idle a step: graph {graph} us, eager {eager} us")
    })
}

fn with_a_gpu_events_time_each_op_without_cupti() -> Result<(), Failed> {
    let doc = gpu_profile(&[
        "--model-name",
        "resnet18",
        "--batch-size",
        "4",
        "--image-size",
        "64",
        "--strategy",
        "tf32",
        "--steps",
        "3",
        "--timing",
        "events",
    ])?;
    let r = &doc["result"];
    ensure(r["timing"] == "events" && r["kernels"] == 0, || {
        format!("{r}")
    })?;
    ensure(
        r["timing_note"]
            .as_str()
            .is_some_and(|n| n.contains("not kernel time")),
        || format!("{r}"),
    )?;
    ensure(rows(&doc).len() > 5, || format!("{r}"))
}

fn with_a_gpu_training_is_profiled_op_by_op() -> Result<(), Failed> {
    let doc = document(
        &[
            "profile",
            "train",
            "--device",
            "cuda:0",
            "--precision",
            "bf16",
            "--layers",
            "64,256,256,1",
            "--samples",
            "4096",
            "--features",
            "64",
            "--batch-size",
            "256",
            "--group-by",
            "layer",
        ],
        0,
    )?;
    let layers: Vec<String> = rows(&doc)
        .iter()
        .filter_map(|r| r["key"].as_str().map(String::from))
        .collect();
    for want in ["fc1", "fc2", "fc3", "loss", "optimizer"] {
        ensure(layers.iter().any(|l| l == want), || {
            format!("no {want}: {layers:?}")
        })?;
    }
    let r = &doc["result"];
    ensure(r["unattributed_kernels"] == 0, || format!("{r}"))
}

/// A ResNet's update: every kernel belongs to an op, and the convolutions' passes, the norms,
/// the head, the loss and the optimizer are there by torchvision's layer names.
fn with_a_gpu_a_resnet_update_is_profiled_op_by_op() -> Result<(), Failed> {
    let args = [
        "profile",
        "train",
        "--model",
        "resnet18",
        "--device",
        "cuda:0",
        "--precision",
        "bf16",
        "--batch-size",
        "16",
        "--image-size",
        "64",
        "--classes",
        "10",
        "--steps",
        "4",
    ];
    let by_layer = document(&[&args[..], &["--group-by", "layer"]].concat(), 0)?;
    let layers: Vec<String> = rows(&by_layer)
        .iter()
        .filter_map(|r| r["key"].as_str().map(String::from))
        .collect();
    for want in [
        "conv1",
        "bn1",
        "layer4.1.conv2",
        "layer4.1.bn2",
        "fc",
        "loss",
        "optimizer",
    ] {
        ensure(layers.iter().any(|l| l == want), || {
            format!("no {want}: {layers:?}")
        })?;
    }
    let r = &by_layer["result"];
    ensure(r["unattributed_kernels"] == 0, || format!("{r}"))?;
    let by_op = document(&[&args[..], &["--group-by", "op"]].concat(), 0)?;
    let ops: Vec<String> = rows(&by_op)
        .iter()
        .filter_map(|r| r["key"].as_str().map(String::from))
        .collect();
    for want in [
        "conv forward",
        "conv backward data",
        "conv backward filter",
        "batch norm forward",
        "batch norm backward",
    ] {
        // an op's key is its name and shapes ("conv forward 16x64x16x16 -> 64, ...")
        ensure(ops.iter().any(|o| o.starts_with(want)), || {
            format!("no {want}: {ops:?}")
        })?;
    }
    Ok(())
}

fn main() {
    let any: Vec<(&str, Test)> = vec![
        (
            "profile_infer_on_the_cpu_times_every_op_and_writes_a_trace",
            profile_infer_on_the_cpu_times_every_op_and_writes_a_trace,
        ),
        (
            "profile_train_on_the_cpu_records_the_loop",
            profile_train_on_the_cpu_records_the_loop,
        ),
        ("profile_bad_input_exits_2", profile_bad_input_exits_2),
    ];
    let gpu: Vec<(&str, Test)> = vec![
        (
            "gpu::every_kernel_has_an_op_and_a_layer",
            with_a_gpu_every_kernel_has_an_op_and_a_layer,
        ),
        (
            "gpu::a_graph_replay_is_attributed_and_has_fewer_gaps",
            with_a_gpu_a_graph_replay_is_attributed_and_has_fewer_gaps,
        ),
        (
            "gpu::events_time_each_op_without_cupti",
            with_a_gpu_events_time_each_op_without_cupti,
        ),
        (
            "gpu::training_is_profiled_op_by_op",
            with_a_gpu_training_is_profiled_op_by_op,
        ),
        (
            "gpu::an_onnx_model_is_profiled_by_node",
            with_a_gpu_an_onnx_model_is_profiled_by_node,
        ),
        (
            "gpu::a_resnet_update_is_profiled_op_by_op",
            with_a_gpu_a_resnet_update_is_profiled_op_by_op,
        ),
    ];
    run_kinds(any, Vec::new(), gpu, Vec::new());
}
