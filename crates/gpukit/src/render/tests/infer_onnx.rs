//! `gpukit infer --onnx`: the report of a fixture model, imported and optimized for real, with
//! rows made by hand (timings are not reproducible).

use super::{assert_drawn, terminal, timing};
use crate::render::onnx_run_sections;
use gpukit_bench::infer::onnx::{
    describe, Float64Reference, OnnxRun, PassesCheck, GPU_NOT_LOOKED_FOR, GRAPH_CPU_ROW,
};
use gpukit_bench::infer::peer::{BestFp16, Layers, PytorchComparison, PytorchRow, SameModel};
use gpukit_bench::infer::{row as blank_row, Agreement, Float64Check, InferRow, ORT_ROW};
use gpukit_bench::measure::Clock;
use gpukit_bench::report::{PeerFigure, RowStatus};
use gpukit_models::onnx::{fixtures, ModelFile};

fn row(strategy: &str, device: &str, batch: usize, ms: Option<f64>) -> InferRow {
    InferRow {
        timing: ms.map(|ms| timing(Clock::Host, ms, ms * 0.9, ms * 1.2, 10)),
        images_per_s: ms.map(|ms| batch as f64 / ms * 1e3),
        ..blank_row(strategy, device, batch)
    }
}

fn checked(mut r: InferRow, max_rel: f64) -> InferRow {
    r.agreement = Some(Agreement {
        max_abs: max_rel * 3.0,
        max_rel,
        top1: 1.0,
    });
    r.tolerance = Some(1e-5);
    r.compared_with = Some("ONNX Runtime CPU on the same input".into());
    r.speedup_vs_reference = Some(1.0);
    r
}

fn vs(mut r: InferRow, gpukit_ms: f64) -> InferRow {
    r.speedup_vs_reference = r.timing.as_ref().map(|t| gpukit_ms / t.summary_ms.median);
    r
}

/// tiny_resnet (seed 7) imported and optimized at batch 1; gpukit and ONNX Runtime at batch 1
/// and 8, gpukit failing its check at 8, a GPU strategy skipped.
fn fixture_run() -> OnnxRun {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny_resnet.onnx");
    std::fs::write(&path, fixtures::bytes(&fixtures::tiny_resnet(7))).unwrap();
    let mut model = describe(&ModelFile::read(&path).unwrap(), 1, &[]).unwrap();
    model.file = "models/tiny_resnet.onnx".into();
    // the fixtures' producer carries the crate's version, which a snapshot must not
    model.producer = "gpukit-tests".into();
    let mut failed = row(GRAPH_CPU_ROW, "cpu", 8, None);
    failed.status = RowStatus::Failed(
        "output logits: logits differ from the reference: max relative difference 3.0e-4 is over the tolerance 1e-5".into(),
    );
    let gpu = |n| {
        let mut r = row("fp16-nhwc-graph", "cuda:0", n, None);
        r.status = RowStatus::Skipped(GPU_NOT_LOOKED_FOR.into());
        r
    };
    OnnxRun {
        model,
        batch_sizes: vec![1, 8],
        cpu_threads: 16,
        input: "random standard normal f32 for input, fresh at each batch size; both rows at one batch size get the same".into(),
        passes_check: Some(PassesCheck {
            batch: 1,
            agreement: Some(Agreement {
                max_abs: 1e-7,
                max_rel: 8.5e-8,
                top1: 1.0,
            }),
            tolerance: 1e-5,
            status: RowStatus::Ok,
        }),
        rows: vec![
            checked(row(GRAPH_CPU_ROW, "cpu", 1, Some(0.25)), 1.7e-7),
            vs(row(ORT_ROW, "cpu", 1, Some(0.05)), 0.25),
            gpu(1),
            failed,
            row(ORT_ROW, "cpu", 8, Some(0.2)),
            gpu(8),
        ],
        onnxruntime: Some("/opt/onnxruntime/libonnxruntime.so.1.32.0".into()),
        onnxruntime_unavailable: None,
        gpu: Some(GPU_NOT_LOOKED_FOR.into()),
        gpu_engine: None,
        gpu_device: None,
        pytorch: None,
        float64: Vec::new(),
        fp8: None,
    }
}

#[test]
fn infer_onnx_reports_the_model_its_passes_latency_and_throughput() {
    let sections = onnx_run_sections(&fixture_run());
    let titles: Vec<&str> = sections.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(
        titles,
        [
            "Inference: tiny_resnet.onnx (ONNX)",
            "Latency at batch 1 (ms)",
            "Throughput"
        ]
    );
    let text = terminal(&sections);
    for needle in [
        "opset 17",
        "batch norm(s) folded into convolutions",
        "input: float [batch, 3, 32, 32], [1, 3, 32, 32] at batch 1",
        "logits: float [batch, 10], [1, 10] at batch 1",
        "FAILED: output logits",
        "skipped: the GPU rows did not run: no GPU libraries were looked for",
        "1.7e-7 (1e-5)",
    ] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    // the latency table has the timed rows of the first batch size only
    assert_eq!(sections[1].rows.len(), 2);
    assert_drawn("infer_onnx", &sections);
}

#[test]
fn infer_onnx_without_onnxruntime_says_the_rows_are_unchecked() {
    let mut run = fixture_run();
    run.onnxruntime = None;
    run.onnxruntime_unavailable = Some("ONNX Runtime was not found".into());
    run.rows = vec![row(GRAPH_CPU_ROW, "cpu", 1, Some(0.25))];
    let text = terminal(&onnx_run_sections(&run));
    assert!(
        text.contains("did not run (ONNX Runtime was not found): gpukit's rows are unchecked")
            && text.contains("unchecked"),
        "{text}"
    );
}

/// fp32 GPU rows judged against float64: each row's distance from it and its tolerance in a
/// column of their own, ONNX Runtime's distance from it on the setup's Float64 line, a failing
/// row's reason naming both.
#[test]
fn infer_onnx_fp32_rows_show_their_distance_from_float64_beside_onnxruntimes() {
    let mut run = fixture_run();
    let fp32 = |n: usize, ms: f64, max_rel: f64, ort: f64| {
        let mut r = checked(row("fp32", "cuda:0", n, Some(ms)), 2.2e-5);
        r.tolerance = None;
        r.float64 = Some(Float64Check {
            max_rel,
            onnxruntime_max_rel: Some(ort),
            tolerance: ort.max(1e-5),
        });
        r
    };
    let mut failed = fp32(8, 1.0, 2.4e-5, 1.6e-5);
    failed.status = RowStatus::Failed(
        "max rel. diff 2.4e-5 from float64: over 1e-5, and farther than ONNX Runtime's f32 \
         (1.6e-5)"
            .into(),
    );
    run.rows = vec![
        checked(row(GRAPH_CPU_ROW, "cpu", 1, Some(0.25)), 1.7e-7),
        fp32(1, 0.5, 1.2e-5, 1.5e-5),
        failed,
    ];
    run.gpu = None;
    run.gpu_engine =
        Some("gpukit's general GPU engine on cuda:0 NVIDIA H200; f32 nchw: 12 conv (cuDNN)".into());
    run.gpu_device = Some("cuda:0 NVIDIA H200".into());
    run.float64 = vec![
        Float64Reference {
            batch: 1,
            onnxruntime_max_rel: Some(1.5e-5),
            seconds: Some(0.9),
            unavailable: None,
        },
        Float64Reference {
            batch: 8,
            onnxruntime_max_rel: Some(1.6e-5),
            seconds: Some(3.2),
            unavailable: None,
        },
    ];
    let sections = onnx_run_sections(&run);
    let text = terminal(&sections);
    for needle in [
        "batch 1: ONNX Runtime's f32 is 1.5e-5 from it (computed in 0.9 s)",
        "vs float64 (tolerance)",
        "1.2e-5 (1.5e-5)",
        "2.2e-5",
        "2.4e-5 from float64",
        "fp32 GPU rows) are judged against float64",
    ] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    assert_drawn("infer_onnx_float64", &sections);
}

/// PyTorch's rows beside (`--torchvision`): the layers both sides have, the logits' verdict on
/// the weights, PyTorch's figure beside gpukit's row and the best fp16 of each side.
fn with_pytorch(same_weights: bool) -> OnnxRun {
    let mut run = fixture_run();
    let mut gpu = row("fp16-nhwc-graph", "cuda:0", 8, Some(0.4));
    gpu.pytorch = Some(PeerFigure::single(0.8, 10_000.0, 20_000.0));
    run.rows = vec![gpu];
    let max_rel = if same_weights { 2.5e-6 } else { 0.9 };
    run.pytorch = Some(PytorchComparison {
        torch_version: "2.9.0+cu130".into(),
        torchvision: Some("0.24.0".into()),
        device_name: Some("NVIDIA H100 80GB HBM3".into()),
        cudnn_benchmark: true,
        rows: vec![PytorchRow {
            strategy: "cuda_graph_fp16".into(),
            device: "cuda".into(),
            batch: 8,
            status: "ok".into(),
            reason: None,
            median_ms: Some(0.8),
            p10_ms: Some(0.79),
            p90_ms: Some(0.82),
            images_per_s: Some(10_000.0),
            peak_allocated_bytes: Some(40 << 20),
            compile_s: None,
        }],
        logits: Some(Agreement {
            max_abs: max_rel * 10.0,
            max_rel,
            top1: 1.0,
        }),
        logits_images: 8,
        logits_unavailable: None,
        logits_reference: "ONNX Runtime's on the file (both on the CPU)".into(),
        same_model: Some(SameModel {
            torchvision: "resnet18".into(),
            weights: "seeded".into(),
            onnx: Layers { conv: 6, linear: 1 },
            pytorch: Layers { conv: 6, linear: 1 },
            output_shape: vec![10],
            pytorch_parameters: 11_689_512,
            logits_tolerance: 1e-4,
            same_weights: Some(same_weights),
        }),
        cpu_rows_failed: None,
        best_fp16: vec![BestFp16 {
            batch: 8,
            gpukit_strategy: "fp16-nhwc-graph".into(),
            gpukit_images_per_s: 20_000.0,
            pytorch_strategy: "cuda_graph_fp16".into(),
            pytorch_images_per_s: 10_000.0,
            ratio: 2.0,
        }],
    });
    run
}

#[test]
fn infer_onnx_with_pytorch_says_what_made_it_the_same_model() {
    let sections = onnx_run_sections(&with_pytorch(true));
    let text = terminal(&sections);
    for needle in [
        "PyTorch 2.9.0+cu130 (torchvision 0.24.0, cudnn.benchmark true)",
        "the file has 6 Conv and 1 Gemm/MatMul node(s) on constant weights",
        "PyTorch's resnet18 calls 6 convolution(s) and 1 linear layer(s)",
        "against ONNX Runtime's on the file (both on the CPU) on the same 8 images",
        "the same weights (<= 1e-4)",
        "best fp16 at batch 8: gpukit fp16-nhwc-graph 20,000 img/s",
    ] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    assert_drawn("infer_onnx_pytorch", &sections);
    let other = terminal(&onnx_run_sections(&with_pytorch(false)));
    assert!(
        other.contains("(over 1e-4): other weights") && !other.contains("the same weights"),
        "{other}"
    );
}

#[test]
fn a_failed_fp8_check_names_its_worst_layer_and_fails_the_document() {
    use gpukit_bench::infer::onnx::fp8::Fp8Check;
    use gpukit_models::graph::fp8::{Fp8Accuracy, LayerError};
    let accuracy = Fp8Accuracy {
        rows: 128,
        top1_agreement: 0.953,
        max_rel_error: 0.41,
        mean_rel_error: 0.07,
        layers: vec![
            LayerError {
                node: "layer4.2.conv3".into(),
                rel_error: 0.38,
            },
            LayerError {
                node: "conv1".into(),
                rel_error: 0.02,
            },
        ],
    };
    let failed = accuracy.verdict(0.99, f64::INFINITY).err();
    assert!(failed
        .as_deref()
        .is_some_and(|w| w.contains("layer4.2.conv3")));
    let mut run = fixture_run();
    // the fixture's own failed row left out: the fp8 check is what fails the document
    run.rows
        .retain(|r| !matches!(r.status, RowStatus::Failed(_)));
    run.fp8 = Some(Fp8Check {
        calibration: "max (the largest magnitude seen)".into(),
        calibration_rows: 64,
        input: "random standard normal f32".into(),
        accuracy,
        min_top1_agreement: 0.99,
        failed,
        rescue: Some(gpukit_models::graph::fp8::Rescue {
            kept: vec!["layer4.2.conv3".into()],
            top1_agreement: 0.992,
            enough: true,
        }),
        scales_saved: None,
        seconds: 1.5,
    });
    let text = terminal(&onnx_run_sections(&run));
    for want in [
        "fp8 (E4M3), simulated on the CPU",
        "95.30% of 128 rows calibration never saw keep f32's top class (needs 99%)",
        "relative error 4.10e-1 at most, 7.00e-2 on average",
        "layer4.2.conv3 (3.8e-1 of its own output), conv1 (2.0e-2 of its own output)",
        "FAILED: fp8 agrees with f32 on the top class of 95.30% of 128 rows",
        "keep 1 layer(s) out of fp8 (layer4.2.conv3): 99.20% of the same rows then keep their top class",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let doc = gpukit_bench::infer::onnx::document(run);
    assert!(!doc.ok);
    assert!(
        doc.failure
            .as_deref()
            .is_some_and(|f| f.starts_with("fp8 check:") && f.contains("layer4.2.conv3")),
        "{:?}",
        doc.failure
    );
}
