//! `gpukit profile`: ResNet-50 inference replayed as a CUDA graph on an H100 under CUPTI (its
//! kernels tied back to ops, the idle gaps the graph removes, a key too long for the table), and
//! a training run timed by events after CUPTI could not be loaded. The summaries follow from
//! the rows, so that the shares and the coverage agree as a real run's do.

use super::{assert_drawn, terminal};
use crate::render::profile_sections;
use gpukit_bench::stats::Summary;
use gpukit_bench::workload::profile::run::StepIdle;
use gpukit_bench::workload::profile::table::{GroupBy, Regime, Row};
use gpukit_bench::workload::profile::ProfileReport;
use gpukit_cuda::profiler::Timing;

const STEPS: usize = 20;

/// An op of the profiled steps: `calls` calls of `avg_us` each over [`STEPS`] steps, with
/// `flops` and `bytes` a call (rates and intensity follow; none when `flops` is 0), and no host
/// time (a graph replay's ops launch nothing one by one). Its share of the step is set by
/// [`report`].
fn row(key: &str, calls: usize, avg_us: f64, flops: f64, bytes: f64) -> Row {
    let total = calls as f64 * avg_us;
    let seconds = avg_us * 1e-6;
    let counted = flops > 0.0;
    Row {
        key: key.into(),
        calls,
        gpu_total_us: total,
        gpu_self_us: total,
        gpu_avg_us: avg_us,
        pct_of_step: 0.0,
        cpu_launch_us: 0.0,
        flops: flops * calls as f64,
        bytes: bytes * calls as f64,
        tflops: counted.then(|| flops / seconds / 1e12),
        gbs: counted.then(|| bytes / seconds / 1e9),
        intensity: counted.then(|| flops / bytes),
        // The H100's fp16 and bf16 ridge: 989 TFLOP/s over 3.35 TB/s, about 295 FLOP/B.
        regime: if avg_us < 5.0 {
            Some(Regime::LaunchOverhead)
        } else if !counted {
            None
        } else if flops / bytes < 295.0 {
            Some(Regime::Memory)
        } else {
            Some(Regime::Compute)
        },
    }
}

/// A report of `rows` (sorted, their shares filled in) whose recorded time is `coverage` of
/// the step without profiler; the profiled step took `overhead_pct` longer.
fn report(mut rows: Vec<Row>, coverage: f64, overhead_pct: f64, timing: Timing) -> ProfileReport {
    rows.sort_by(|a, b| b.gpu_total_us.total_cmp(&a.gpu_total_us));
    let recorded_us = rows.iter().map(|r| r.gpu_total_us).sum::<f64>() / STEPS as f64;
    let step_ms = recorded_us / coverage / 1e3;
    for r in &mut rows {
        r.pct_of_step = 100.0 * r.gpu_total_us / (STEPS as f64 * step_ms * 1e3);
    }
    ProfileReport {
        workload: String::new(),
        device: "cuda:0 NVIDIA H100 80GB HBM3".into(),
        timing,
        timing_note: timing.describe().into(),
        fallback: None,
        nvtx: false,
        steps: STEPS,
        step_ms: Some(Summary {
            count: 30,
            median: step_ms,
            p10: step_ms * 0.99,
            p90: step_ms * 1.02,
            min: step_ms * 0.98,
            max: step_ms * 1.05,
            mean: step_ms,
            cv: 0.01,
        }),
        profiled_step_ms: Some(step_ms * (1.0 + overhead_pct / 100.0)),
        overhead_pct: Some(overhead_pct),
        recorded_ms_per_step: recorded_us / 1e3,
        coverage: Some(coverage),
        kernels: 0,
        unattributed_kernels: 0,
        without_layer: 0,
        attribution: None,
        idle: None,
        eager_idle: None,
        group_by: GroupBy::Op,
        top: 5,
        rows,
        host_only: false,
        trace: None,
        dropped: 0,
        verified: String::new(),
    }
}

#[test]
fn profile_of_a_graph_under_cupti() {
    let rows = vec![
        row("conv 32x256x14x14 f16 NHWC, 3x3", 120, 38.2, 7.40e9, 7.6e6),
        row("conv 32x128x28x28 f16 NHWC, 3x3", 80, 36.9, 7.40e9, 13.4e6),
        row("conv 32x512x7x7 f16 NHWC, 3x3", 60, 37.5, 7.40e9, 5.9e6),
        row("conv 32x1024x14x14 f16 NHWC, 1x1", 240, 22.6, 3.29e9, 3.2e7),
        row(
            "conv 32x64x56x56 f16 NHWC, 1x1 (backend engine 7, tensor cores, no split-k)",
            180,
            21.4,
            3.29e9,
            6.4e7,
        ),
        row(
            "batch_norm+relu 32x256x56x56 f16 NHWC",
            60,
            41.2,
            1.03e8,
            1.03e8,
        ),
        row("add 32x1024x14x14 f16", 120, 13.8, 6.4e6, 3.85e7),
        row("global_avg_pool 32x2048x7x7 f16", 20, 6.2, 0.0, 0.0),
        row("fc 32x2048 -> 1000 f16", 20, 4.1, 1.31e8, 4.2e6),
    ];
    let mut r = report(rows, 0.943, 3.9, Timing::Cupti);
    let step_us = r.step_ms.as_ref().map_or(0.0, |s| s.median * 1e3);
    let recorded_us = r.recorded_ms_per_step * 1e3;
    r.workload = "infer resnet50 fp16-nhwc-graph batch 32".into();
    r.nvtx = true;
    r.kernels = 61 * STEPS;
    r.without_layer = 2 * STEPS;
    r.attribution =
        Some("each replay's kernels matched the eager pass's, in order: each is its op's".into());
    r.idle = Some(StepIdle {
        idle_us_per_step: step_us - recorded_us,
        gaps_per_step: 58.0,
        largest_gap_us: 12.4,
        busy_fraction: recorded_us / step_us,
    });
    // Launched op by op, the same kernels wait on the host between launches.
    let eager_idle = 1_530.0;
    r.eager_idle = Some(StepIdle {
        idle_us_per_step: eager_idle,
        gaps_per_step: 58.0,
        largest_gap_us: 48.9,
        busy_fraction: recorded_us / (recorded_us + eager_idle),
    });
    r.trace = Some("resnet50.trace.json".into());
    r.verified = "logits of the first 4 image(s) against gpukit's f32 CPU path, before and after \
                  profiling (tolerance 0.02)"
        .into();
    let sections = profile_sections(&r);
    let text = terminal(&sections);
    assert!(
        text.contains("Top 5 by GPU time, grouped by op (9 rows in all)"),
        "{text}"
    );
    // The long key is cut in the table (the JSON keeps it whole).
    assert!(text.contains("tensor co…"), "{text}");
    assert!(!text.contains("NaN") && !text.contains("inf "), "{text}");
    assert_drawn("profile_graph_cupti", &sections);
}

#[test]
fn profile_timed_by_events() {
    // Forward and backward of each stage a step; the optimiser's and the loss's ops belong to
    // no layer, and their FLOPs are not counted.
    let stages = [
        ("layer3", 4.905, 2.91e11, 1.10e9, 6.0),
        ("layer4", 3.710, 2.15e11, 0.96e9, 3.0),
        ("layer2", 3.490, 2.02e11, 1.40e9, 4.0),
        ("layer1", 3.070, 1.87e11, 2.20e9, 3.0),
        ("(no layer)", 1.135, 0.0, 0.0, 1.0),
    ];
    let rows = stages
        .iter()
        .map(|&(name, ms, flops, bytes, blocks)| Row {
            // Each block's ops cost the host about 100 us of launches a call.
            cpu_launch_us: 2.0 * STEPS as f64 * blocks * 100.0,
            ..row(name, 2 * STEPS, ms * 1e3, flops, bytes)
        })
        .collect();
    let mut r = report(rows, 0.532, 4.3, Timing::Events);
    r.workload = "train resnet50 bf16 batch 128".into();
    r.group_by = GroupBy::Layer;
    r.top = 15;
    r.fallback = Some(
        "libcupti.so.13 (CUPTI) was not found; pip install nvidia-cuda-cupti (or the CUDA 13 \
         toolkit)"
            .into(),
    );
    r.verified = "the run's own checks (losses finite; a diverging run fails)".into();
    assert_drawn("profile_events", &profile_sections(&r));
}
