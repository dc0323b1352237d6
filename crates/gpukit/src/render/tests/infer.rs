//! `gpukit infer`: GPU and CPU-only reports, one-at-a-time rows, PyTorch's own rows, and
//! `infer --input`'s logits.

use super::{assert_drawn, pytorch, terminal, timing};
use crate::render::{infer_sections, input_run_section};
use gpukit_bench::infer::io::{InputRun, SavedLogits};
use gpukit_bench::infer::peer::{BestFp16, PytorchComparison, PytorchRow, RESNET_LOGITS_REFERENCE};
use gpukit_bench::infer::{Agreement, InferReport, InferRow, CPU_ROW, ORT_ROW};
use gpukit_bench::measure::Clock;
use gpukit_bench::report::RowStatus;

fn agreement(max_rel: f64) -> Agreement {
    Agreement {
        max_abs: 1e-3,
        max_rel,
        top1: 1.0,
    }
}

fn infer_row(strategy: &str, device: &str, batch: usize, rate: f64) -> InferRow {
    let ms = batch as f64 / rate * 1e3;
    InferRow {
        strategy: strategy.into(),
        device: device.into(),
        batch,
        status: RowStatus::Ok,
        timing: Some(timing(Clock::CudaEvents, ms, ms, ms, 1)),
        images_per_s: Some(rate),
        speedup_vs_reference: None,
        speedup_vs_fp32_eager: None,
        gpu_memory_bytes: (device != "cpu").then_some(300 << 20),
        gpu_memory: None,
        agreement: Some(agreement(2e-4)),
        compared_with: None,
        tolerance: Some(1e-2),
        float64: None,
        pytorch: None,
        batching_gain: None,
        power: None,
    }
}

fn infer_report(rows: Vec<InferRow>, gpu_unavailable: Option<&str>) -> InferReport {
    InferReport {
        model: "resnet50".into(),
        parameters: 25_557_032,
        weights: "seeded".into(),
        image_size: 224,
        cpu_threads: 16,
        cpu_kernel: "im2col + gemm".into(),
        rows,
        onnxruntime_unavailable: None,
        gpu_device: gpu_unavailable
            .is_none()
            .then(|| "cuda:0 Test GPU".to_string()),
        gpu_unavailable: gpu_unavailable.map(str::to_string),
        pytorch: None,
        tensorrt: None,
        planning: Vec::new(),
        cache_note: None,
    }
}

/// gpukit's CPU reference, which is compared with nothing.
fn cpu_reference(batch: usize, rate: f64) -> InferRow {
    let mut cpu = infer_row(CPU_ROW, "cpu", batch, rate);
    cpu.agreement = None;
    cpu.tolerance = None;
    cpu
}

/// Batch 1 and 32 on the GPU, the CPU reference at 32, and a GPU row that failed its check.
fn gpu_report() -> InferReport {
    let mut fp32 = infer_row("fp32", "cuda:0", 32, 4000.0);
    fp32.speedup_vs_fp32_eager = Some(1.0);
    let mut fast = infer_row("fp16-nhwc-graph", "cuda:0", 32, 12_345.0);
    fast.speedup_vs_fp32_eager = Some(3.09);
    fast.speedup_vs_reference = Some(308.6);
    let mut broken = infer_row("bf16-nhwc", "cuda:0", 32, 99_999.0);
    broken.status = RowStatus::Failed("logits differ".into());
    let rows = vec![
        infer_row("fp32", "cuda:0", 1, 500.0),
        cpu_reference(32, 40.0),
        fp32,
        fast,
        broken,
    ];
    infer_report(rows, None)
}

#[test]
fn infer_has_a_table_per_batch_and_the_best_gpu_strategy_under_it() {
    let sections = infer_sections(&gpu_report());
    let titles: Vec<&str> = sections.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(
        titles,
        [
            "Inference: resnet50",
            "Inference at batch 1",
            "Inference at batch 32"
        ]
    );
    let b32 = &sections[2];
    assert_eq!(b32.rows.len(), 4);
    assert_eq!(
        b32.notes,
        ["best at batch 32: fp16-nhwc-graph 12,345 img/s, 3.09x fp32 eager, 309x gpukit's CPU f32"]
    );
    let text = terminal(&sections);
    assert!(text.contains("FAILED: logits differ"), "{text}");
    assert!(
        text.contains("reference") && text.contains("300.0 MiB"),
        "{text}"
    );
    assert!(
        text.contains("cuda:0 Test GPU") && text.contains("25,557,032"),
        "{text}"
    );
    assert_drawn("infer_gpu", &sections);
}

#[test]
fn infer_against_pytorch() {
    let mut report = gpu_report();
    for row in report.rows.iter_mut().filter(|x| x.batch == 32) {
        row.pytorch = match row.strategy.as_str() {
            "fp32" => Some(pytorch(3_810.0, 1.05, &[])),
            "fp16-nhwc-graph" => Some(pytorch(10_210.0, 1.21, &[1.18, 1.21, 1.24])),
            _ => None,
        };
    }
    let row = |strategy: &str, status: &str, median_ms: Option<f64>| PytorchRow {
        strategy: strategy.into(),
        device: "cuda:0".into(),
        batch: 32,
        status: status.into(),
        reason: (status != "ok").then(|| "torch.compile needs Triton".to_string()),
        median_ms,
        p10_ms: median_ms.map(|m| m * 0.99),
        p90_ms: None,
        images_per_s: median_ms.map(|m| 32.0 / m * 1e3),
        peak_allocated_bytes: median_ms.map(|_| 2_215 << 20),
        compile_s: None,
    };
    report.pytorch = Some(PytorchComparison {
        torch_version: "2.9.0+cu130".into(),
        torchvision: None,
        device_name: Some("NVIDIA H100 80GB HBM3".into()),
        cudnn_benchmark: true,
        rows: vec![
            row("eager_fp32", "ok", Some(8.399)),
            row("cuda_graph_fp16", "ok", Some(3.134)),
            row("compile_fp16", "skipped", None),
        ],
        logits: Some(agreement(3.2e-6)),
        logits_images: 8,
        logits_unavailable: None,
        logits_reference: RESNET_LOGITS_REFERENCE.into(),
        same_model: None,
        cpu_rows_failed: None,
        best_fp16: vec![BestFp16 {
            batch: 32,
            gpukit_strategy: "fp16-nhwc-graph".into(),
            gpukit_images_per_s: 12_345.0,
            pytorch_strategy: "cuda_graph_fp16".into(),
            pytorch_images_per_s: 10_210.0,
            ratio: 1.21,
        }],
    });
    assert_drawn("infer_pytorch", &infer_sections(&report));
}

#[test]
fn infer_shows_one_image_at_a_time_under_the_best_line() {
    let batched = infer_row("fp16-nhwc-graph", "cuda:0", 32, 12_000.0);
    let mut single = infer_row("fp16-nhwc-graph-one-at-a-time", "cuda:0", 32, 1_500.0);
    single.batching_gain = Some(8.0);
    let mut eager = infer_row("fp16-one-at-a-time", "cuda:0", 32, 500.0);
    eager.batching_gain = None;
    let mut failed = infer_row("fp32-one-at-a-time", "cuda:0", 32, 99_999.0);
    failed.status = RowStatus::Failed("logits differ".into());
    let mut report = infer_report(vec![batched, single, eager, failed], None);
    report.tensorrt = Some(gpukit_bench::infer::tensorrt_status(None));
    let sections = infer_sections(&report);
    let b32 = &sections[1];
    assert_eq!(b32.rows.len(), 4);
    assert_eq!(
        b32.notes,
        [
            "best at batch 32: fp16-nhwc-graph 12,000 img/s",
            "one image at a time at batch 32: fp16-nhwc-graph as 32 batch-1 graph replays, 1,500 img/s; batched, 8.00x the images/s",
            "one image at a time at batch 32: fp16 as 32 batch-1 eager passes, 500 img/s",
        ],
        "the one-at-a-time rows are never the best; the failed one has no line"
    );
    let text = terminal(&sections);
    assert!(
        text.contains("TensorRT") && text.contains("libnvinfer not found"),
        "{text}"
    );
    assert!(text.contains("N batch-1 passes back to back"), "{text}");
    assert_drawn("infer_one_at_a_time", &sections);
    // no one-at-a-time rows, no TensorRT field: neither is mentioned
    let plain = terminal(&infer_sections(&infer_report(
        vec![infer_row("fp16", "cuda:0", 8, 10.0)],
        None,
    )));
    assert!(
        !plain.contains("TensorRT") && !plain.contains("batch-1 passes"),
        "{plain}"
    );
}

#[test]
fn infer_without_a_gpu_says_why_and_keeps_cpu_columns() {
    let mut ort = infer_row(ORT_ROW, "cpu", 1, 31.5);
    ort.tolerance = Some(1e-3);
    ort.speedup_vs_reference = Some(1.58);
    let rows = vec![cpu_reference(1, 20.0), ort];
    let sections = infer_sections(&infer_report(rows, Some("no NVIDIA driver found")));
    let text = terminal(&sections);
    assert!(
        text.contains("GPU rows absent: no NVIDIA driver found"),
        "{text}"
    );
    assert!(
        !text.contains("GPU memory") && !text.contains("best at"),
        "{text}"
    );
    assert_drawn("infer_cpu_only", &sections);
}

#[test]
fn infer_input_compares_each_strategy_with_the_cpu() {
    let logits = |strategy: &str, agreement: Option<Agreement>, status: RowStatus| SavedLogits {
        tensor: match strategy {
            "cpu" => "logits".into(),
            "bf16-nhwc" => String::new(),
            _ => format!("logits_{}", strategy.replace('-', "_")),
        },
        strategy: strategy.into(),
        tolerance: agreement.as_ref().map(|_| 1e-2),
        agreement,
        status,
    };
    let run = InputRun {
        input: "batch.safetensors".into(),
        shape: vec![8, 3, 224, 224],
        output: Some("logits.safetensors".into()),
        logits: vec![
            logits("cpu", None, RowStatus::Ok),
            logits("fp32", Some(agreement(1.1e-6)), RowStatus::Ok),
            logits(
                "fp16-nhwc",
                Some(agreement(f64::INFINITY)),
                RowStatus::Failed(
                    "8000 of 8000 logits are not finite (NaN or infinite): fp16 overflow, the \
                     CPU's f32 pass reaches 1.234e5 at layer3.4.conv2 (fp16's largest value is \
                     65504); use bf16 or fp32"
                        .into(),
                ),
            ),
            logits(
                "bf16-nhwc",
                None,
                RowStatus::Failed("cudnnFind: CUDNN_STATUS_NOT_SUPPORTED".into()),
            ),
        ],
        largest_activation: 1.234e5,
        fp16_overflow: Some(gpukit_bench::infer::io::Overflow {
            layer: "layer3.4.conv2".into(),
            peak: 1.234e5,
        }),
    };
    assert_drawn("infer_input", &[input_run_section(&run)]);
}
