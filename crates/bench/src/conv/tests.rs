use super::summary::{notes, slowest, totals};
use super::*;
use crate::stats::Summary;

fn tiny(name: &str, modules: usize) -> NamedShape {
    NamedShape {
        name: name.to_string(),
        modules: (0..modules).map(|i| format!("m{i}")).collect(),
        shape: ConvShape {
            n: 2,
            c: 3,
            h: 9,
            w: 9,
            k: 4,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
            groups: 1,
        },
    }
}

#[test]
fn cpu_only_run_reports_cpu_rows_at_every_batch() {
    let opts = ConvOptions {
        ordinal: None,
        iterations: 2,
        batches: vec![1, 3],
        ..ConvOptions::default()
    };
    let r = run_conv(
        &gpukit_cuda::loader::discover(),
        &[tiny("tiny", 2)],
        &opts,
        &mut |_| {},
    );
    // two batches x two layouts
    assert_eq!(r.rows.len(), 4);
    assert!(r
        .rows
        .iter()
        .all(|x| x.device == Device::Cpu && x.tflops.unwrap() > 0.0 && x.count == 2));
    let batches: Vec<usize> = r.rows.iter().map(|x| x.shape.n).collect();
    assert_eq!(batches, [1, 1, 3, 3]);
    // no GPU rows: nothing to total, and the document says nothing was compared
    assert!(r.totals.is_empty() && r.slowest.is_none());
    let doc = document(r, None);
    assert!(doc.failure.is_none(), "{:?}", doc.failure);
}

/// A measured row: `ms` per run, PyTorch's `theirs_ms` when given.
fn row(
    name: &str,
    count: usize,
    device: Device,
    dtype: DType,
    ms: f64,
    theirs: Option<f64>,
) -> ConvRow {
    let mut r = ConvRow::new(&tiny(name, count), Layout::Nhwc, device, dtype);
    let samples = [ms, ms, ms];
    r.timing = Some(Measurement {
        clock: crate::measure::Clock::CudaEvents,
        warmup: 0,
        reps_planned: 3,
        summary_ms: Summary::of(&samples).unwrap(),
    });
    r.pytorch = theirs.map(|t| PeerFigure {
        median_ms: t,
        rate: 1.0,
        ratio: t / ms,
        turn_ratios: Vec::new(),
        by_opener: Vec::new(),
    });
    r.behind_pytorch = r.pytorch.as_ref().is_some_and(|p| p.ratio < PARITY_FLOOR);
    r
}

#[test]
fn totals_weight_each_shape_by_how_often_the_network_runs_it() {
    let gpu = Device::Cuda(0);
    let rows = vec![
        row("a", 3, Device::Cpu, DType::F32, 30.0, None),
        row("a", 3, gpu, DType::F16, 1.0, Some(1.0)),
        row("b", 1, Device::Cpu, DType::F32, 10.0, None),
        row("b", 1, gpu, DType::F16, 2.0, Some(1.6)),
    ];
    let t = totals(&rows);
    assert_eq!(t.len(), 1);
    let t = &t[0];
    assert_eq!((t.convolutions, t.shapes, t.shapes_measured), (4, 2, 2));
    // GPU 3 x 1 + 2 = 5 ms; CPU 3 x 30 + 10 = 100 ms; PyTorch 3 x 1 + 1.6 = 4.6 ms
    assert_eq!(t.gpu_ms, Some(5.0));
    assert_eq!(t.cpu_ms, Some(100.0));
    assert_eq!(t.speedup_vs_cpu, Some(20.0));
    assert!((t.ratio_vs_pytorch.unwrap() - 0.92).abs() < 1e-12);
    // the slowest row is b, at 0.8x, and only b is flagged
    let s = slowest(&rows).unwrap();
    assert_eq!((s.name.as_str(), s.ratio), ("b", 0.8));
    assert_eq!(
        rows.iter().filter(|r| r.behind_pytorch).count(),
        1,
        "only b is under the floor"
    );
}

#[test]
fn a_missing_shape_leaves_no_whole_network_figure_and_says_so() {
    let gpu = Device::Cuda(0);
    let mut failed = row("b", 1, gpu, DType::F16, 2.0, None);
    failed.timing = None;
    failed.status = RowStatus::Failed("wrong result".into());
    let rows = vec![
        row("a", 3, Device::Cpu, DType::F32, 30.0, None),
        row("a", 3, gpu, DType::F16, 1.0, None),
        row("b", 1, Device::Cpu, DType::F32, 10.0, None),
        failed,
    ];
    let report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: 2,
        cpu_method: "im2col + gemm, 2 threads".into(),
        rounds: 0,
        totals: totals(&rows),
        slowest: slowest(&rows),
        planning: None,
        rows,
    };
    let t = &report.totals[0];
    assert_eq!(
        (t.shapes_measured, t.gpu_ms, t.speedup_vs_cpu),
        (1, None, None)
    );
    let n = notes(&report, false);
    assert!(
        n.iter()
            .any(|l| l.contains("f16 NHWC batch 2: 1 of 2 shapes")),
        "{n:?}"
    );
    assert!(!n.iter().any(|l| l.starts_with("GPU over CPU")), "{n:?}");
    // and the failed row fails the run
    assert!(document(report, None).failure.is_some());
}

#[test]
fn notes_state_the_speedup_per_dtype_and_the_slowest_ratio() {
    let gpu = Device::Cuda(0);
    let rows = vec![
        row("a", 2, Device::Cpu, DType::F32, 50.0, None),
        row("a", 2, gpu, DType::F32, 2.0, Some(2.0)),
        row("a", 2, gpu, DType::F16, 1.0, Some(0.9)),
    ];
    let report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: 2,
        cpu_method: "im2col + gemm, 2 threads".into(),
        rounds: 4,
        totals: totals(&rows),
        slowest: slowest(&rows),
        planning: None,
        rows,
    };
    let n = notes(&report, true);
    assert!(
        n[0].starts_with("GPU over CPU on all 2 convolutions")
            && n[0].ends_with("f32 NHWC 25x; f16 NHWC 50x"),
        "{n:?}"
    );
    assert!(n[1].ends_with("f32 NHWC 1.00x; f16 NHWC 0.90x"), "{n:?}");
    assert!(
        n[2].starts_with("slowest against PyTorch: a batch 2 NHWC f16 at 0.90x")
            && n[2].contains("1 row(s) under 0.95x"),
        "{n:?}"
    );
    assert!(n[3].contains("4 alternating blocks"), "{n:?}");
}

#[test]
fn tolerances_loosen_with_the_stored_precision() {
    assert!(tolerance(DType::F32) < tolerance(DType::Tf32));
    assert!(tolerance(DType::F16) < tolerance(DType::Bf16));
    assert!(!benchmarked(DType::F64) && benchmarked(DType::Bf16));
    assert!(!benchmarked(DType::F8E4M3));
}
