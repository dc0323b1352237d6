//! `gpukit bench conv`: the CPU reference, GPU rows in both layouts, one above the peak (Winograd)
//! and one skipped.

use super::{assert_drawn, timing, verified};
use crate::render::conv_sections;
use gpukit_bench::conv::{ConvReport, ConvRow};
use gpukit_bench::measure::Clock;
use gpukit_bench::report::{PeerFigure, RowStatus};
use gpukit_tensor::{ConvShape, DType, Device, Layout};

fn row(
    name: &str,
    shape: ConvShape,
    layout: Layout,
    device: Device,
    dtype: DType,
    figure: Option<(f64, f64)>,
) -> ConvRow {
    let gpu = device != Device::Cpu;
    let clock = if gpu { Clock::CudaEvents } else { Clock::Host };
    ConvRow {
        name: name.into(),
        count: 3,
        shape,
        layout,
        device,
        dtype,
        status: RowStatus::Ok,
        engine: Some(
            if gpu {
                "IMPLICIT_PRECOMP_GEMM"
            } else {
                "im2col + gemm, 16 threads"
            }
            .into(),
        ),
        api: gpu.then(|| "legacy".into()),
        tensor_cores: gpu.then_some(false),
        per_replay: gpu.then_some(8),
        timing: figure.map(|(ms, _)| timing(clock, ms, ms, ms, 30)),
        tflops: figure.map(|(_, t)| t),
        pct_of_peak: figure.filter(|_| gpu).map(|(_, t)| t / 66.9 * 100.0),
        speedup_vs_cpu: None,
        verification: gpu.then(|| verified(3.2e-7)),
        pytorch: None,
        behind_pytorch: false,
    }
}

#[test]
fn conv_rows() {
    let shape = ConvShape {
        n: 32,
        c: 64,
        h: 56,
        w: 56,
        k: 64,
        r: 3,
        s: 3,
        stride: 1,
        pad: 1,
        groups: 1,
    };
    let name = "layer1 3x3 64->64 @56";
    let gpu = Device::Cuda(0);
    let mut nchw = row(
        name,
        shape,
        Layout::Nchw,
        gpu,
        DType::F32,
        Some((0.512, 45.1)),
    );
    nchw.speedup_vs_cpu = Some(152.0);
    let mut winograd = row(
        name,
        shape,
        Layout::Nhwc,
        gpu,
        DType::F16,
        Some((0.069, 334.9)),
    );
    winograd.engine = Some("backend engine 12 (rank 1 of 9)".into());
    winograd.api = Some("backend".into());
    winograd.tensor_cores = Some(true);
    winograd.pct_of_peak = Some(108.3);
    winograd.speedup_vs_cpu = Some(1128.4);
    winograd.verification = Some(verified(4.1e-4));
    let mut skipped = row(name, shape, Layout::Nhwc, gpu, DType::Bf16, None);
    skipped.status = RowStatus::Skipped("needs 3 GiB of GPU memory, 1 GiB free".into());
    let rows = vec![
        row(
            name,
            shape,
            Layout::Nchw,
            Device::Cpu,
            DType::F32,
            Some((77.8, 0.30)),
        ),
        nchw,
        winograd,
        skipped,
    ];
    let report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: 16,
        cpu_method: "im2col + gemm, 16 threads".into(),
        rounds: 0,
        totals: gpukit_bench::conv::summary::totals(&rows),
        slowest: None,
        planning: None,
        rows,
    };
    assert_drawn("conv", &conv_sections(&report));
}

/// Beside PyTorch: one row at parity and one flagged as behind.
#[test]
fn conv_rows_beside_pytorch() {
    let shape = ConvShape {
        n: 32,
        c: 2048,
        h: 7,
        w: 7,
        k: 512,
        r: 1,
        s: 1,
        stride: 1,
        pad: 0,
        groups: 1,
    };
    let name = "layer4 1x1 2048->512 @7";
    let peer = |rate: f64, ratio: f64| PeerFigure {
        median_ms: 0.1,
        rate,
        ratio,
        turn_ratios: vec![ratio * 0.99, ratio, ratio * 1.01],
        by_opener: vec![ratio, ratio],
    };
    let gpu = Device::Cuda(0);
    let mut even = row(
        name,
        shape,
        Layout::Nhwc,
        gpu,
        DType::F16,
        Some((0.1, 210.0)),
    );
    even.pytorch = Some(peer(208.0, 1.01));
    let mut behind = row(
        name,
        shape,
        Layout::Nchw,
        gpu,
        DType::F16,
        Some((0.2, 105.0)),
    );
    behind.pytorch = Some(peer(150.0, 0.70));
    behind.behind_pytorch = true;
    let rows = vec![even, behind];
    let report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: 16,
        cpu_method: "im2col + gemm, 16 threads".into(),
        rounds: 4,
        totals: gpukit_bench::conv::summary::totals(&rows),
        slowest: gpukit_bench::conv::summary::slowest(&rows),
        planning: None,
        rows,
    };
    let sections = conv_sections(&report);
    let text = crate::render::to_markdown(&sections, 2);
    assert!(text.contains("0.70x (0.69-0.71) BEHIND"), "{text}");
    assert!(!text.contains("1.01x (1.00-1.02) BEHIND"), "{text}");
    assert_drawn("conv_pytorch", &sections);
}
