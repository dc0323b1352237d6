//! PyTorch's rows read and set beside gpukit's, on rows made by hand.

use super::*;
use serde_json::json;

#[test]
fn rows_parse_with_missing_figures() {
    let doc = json!([
        {"strategy": "eager_fp32", "batch": 8, "status": "ok", "median_ms": 2.0,
         "p10_ms": 1.9, "p90_ms": 2.2, "images_per_s": 4000.0, "peak_allocated_bytes": 123},
        {"strategy": "compile_fp16", "batch": 8, "status": "skipped", "reason": "no triton",
         "median_ms": null},
        {"batch": 1}
    ]);
    let rows = parse_rows(doc.as_array().unwrap(), "cuda");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].images_per_s, Some(4000.0));
    assert_eq!(rows[0].peak_allocated_bytes, Some(123));
    assert_eq!(rows[1].status, "skipped");
    assert_eq!(rows[1].reason.as_deref(), Some("no triton"));
    assert_eq!(rows[1].median_ms, None);
}

#[test]
fn every_counterpart_is_a_gpukit_strategy_name() {
    for (g, _) in COUNTERPARTS {
        let s = gpukit_models::gpu::Strategy::parse(g).unwrap();
        assert_eq!(s.name(), g);
    }
}

/// A row of gpukit's that passed with `rate` images/s.
fn ours(strategy: &str, device: &str, batch: usize, rate: f64) -> InferRow {
    InferRow {
        images_per_s: Some(rate),
        ..crate::infer::row(strategy, device, batch)
    }
}

fn theirs(strategy: &str, device: &str, batch: usize, rate: Option<f64>) -> PytorchRow {
    PytorchRow {
        strategy: strategy.into(),
        device: device.into(),
        batch,
        status: if rate.is_some() { "ok" } else { "failed" }.into(),
        reason: None,
        median_ms: rate.map(|r| batch as f64 / r * 1e3),
        p10_ms: None,
        p90_ms: None,
        images_per_s: rate,
        peak_allocated_bytes: None,
        compile_s: None,
    }
}

/// `infer --onnx`'s rows: gpukit's graph interpreter and ONNX Runtime on the CPU, the general
/// engine's GPU rows.
fn onnx_rows() -> Vec<InferRow> {
    let cpu_row = crate::infer::onnx::GRAPH_CPU_ROW;
    let mut skipped = ours("fp16-nhwc", "cuda:0", 32, 1.0);
    skipped.status = RowStatus::Skipped("out of memory".into());
    skipped.images_per_s = None;
    vec![
        ours(cpu_row, "cpu", 1, 20.0),
        ours(crate::infer::ORT_ROW, "cpu", 1, 120.0),
        ours("fp32", "cuda:0", 1, 400.0),
        ours("fp16-nhwc-graph", "cuda:0", 1, 2_000.0),
        ours("fp32", "cuda:0", 32, 3_000.0),
        ours("fp16-nhwc-graph", "cuda:0", 32, 12_000.0),
        ours("fp16-nhwc-graph-one-at-a-time", "cuda:0", 32, 90_000.0),
        skipped,
    ]
}

#[test]
fn pytorch_stands_beside_each_counterpart_and_its_best_fp16_beside_ours() {
    let mut rows = onnx_rows();
    let pytorch = [
        theirs("eager_fp32", "cpu", 1, Some(50.0)),
        theirs("eager_fp32", "cuda", 1, Some(500.0)),
        theirs("cuda_graph_fp16", "cuda", 1, Some(1_000.0)),
        theirs("eager_fp32", "cuda", 32, Some(2_000.0)),
        theirs("cuda_graph_fp16", "cuda", 32, Some(8_000.0)),
        theirs("compile_fp16", "cuda", 32, Some(10_000.0)),
        // failed rows are never a figure, however fast
        theirs("channels_last_fp16", "cuda", 32, None),
    ];
    let best = attach(&mut rows, crate::infer::onnx::GRAPH_CPU_ROW, &pytorch);
    let ratio = |i: usize| rows[i].pytorch.as_ref().map(|p| p.ratio);
    // gpukit's CPU row beside PyTorch's eager fp32 on the CPU; ONNX Runtime beside nothing
    assert_eq!(ratio(0), Some(20.0 / 50.0));
    assert_eq!(ratio(1), None);
    // GPU rows beside their counterparts on cuda, not on the CPU
    assert_eq!(ratio(2), Some(400.0 / 500.0));
    assert_eq!(ratio(3), Some(2.0));
    assert_eq!(ratio(4), Some(1.5));
    assert_eq!(ratio(5), Some(1.5));
    assert_eq!(ratio(6), None);
    assert_eq!(ratio(7), None);
    // batch 1: the CUDA graphs; batch 32: torch.compile, faster than PyTorch's CUDA graph, and
    // not gpukit's one-at-a-time row
    assert_eq!(best.len(), 2);
    assert_eq!(
        (best[0].batch, best[0].gpukit_strategy.as_str()),
        (1, "fp16-nhwc-graph")
    );
    assert_eq!(best[0].pytorch_strategy, "cuda_graph_fp16");
    assert_eq!(best[0].ratio, 2.0);
    assert_eq!(
        (best[1].batch, best[1].gpukit_strategy.as_str()),
        (32, "fp16-nhwc-graph")
    );
    assert_eq!(best[1].pytorch_strategy, "compile_fp16");
    assert_eq!(best[1].ratio, 1.2);
}

#[test]
fn the_resnet_cpu_row_is_set_beside_only_when_it_is_the_cpu_row_named() {
    let mut rows = vec![ours(crate::infer::CPU_ROW, "cpu", 1, 20.0)];
    let pytorch = [theirs("eager_fp32", "cpu", 1, Some(40.0))];
    attach(&mut rows, crate::infer::onnx::GRAPH_CPU_ROW, &pytorch);
    assert!(rows[0].pytorch.is_none());
    attach(&mut rows, crate::infer::CPU_ROW, &pytorch);
    assert_eq!(rows[0].pytorch.as_ref().map(|p| p.ratio), Some(0.5));
}

#[test]
fn pytorch_runs_at_the_batch_sizes_of_rows_that_were_not_skipped() {
    let rows = onnx_rows();
    let cpu_row = crate::infer::onnx::GRAPH_CPU_ROW;
    assert_eq!(batches_of(&rows, cpu_row, false), [1, 32]);
    assert_eq!(batches_of(&rows, cpu_row, true), [1]);
    // ONNX Runtime's CPU rows alone take no PyTorch CPU run
    assert!(batches_of(&rows[1..], cpu_row, true).is_empty());
    let mut all_skipped = rows.clone();
    for r in &mut all_skipped {
        r.status = RowStatus::Skipped("no GPU".into());
    }
    assert!(batches_of(&all_skipped, cpu_row, false).is_empty());
}
