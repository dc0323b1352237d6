//! `gpukit bench conv`: the CPU reference, GPU rows in both layouts, one above the peak (Winograd)
//! and one skipped.

use super::{assert_drawn, timing, verified};
use crate::render::conv_sections;
use gpukit_bench::conv::{ConvReport, ConvRow};
use gpukit_bench::harness::Clock;
use gpukit_bench::matmul::RowStatus;
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
        shape,
        layout,
        device,
        dtype,
        status: RowStatus::Ok,
        algorithm: Some(
            if gpu {
                "IMPLICIT_PRECOMP_GEMM"
            } else {
                "im2col + gemm"
            }
            .into(),
        ),
        timing: figure.map(|(ms, _)| timing(clock, ms, ms, ms, 30)),
        tflops: figure.map(|(_, t)| t),
        pct_of_peak: figure.filter(|_| gpu).map(|(_, t)| t / 66.9 * 100.0),
        speedup_vs_cpu: None,
        verification: gpu.then(|| verified(3.2e-7)),
        pytorch: None,
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
    };
    let name = "layer1 3x3";
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
    winograd.algorithm = Some("WINOGRAD_NONFUSED".into());
    winograd.pct_of_peak = Some(108.3);
    winograd.speedup_vs_cpu = Some(1128.4);
    winograd.verification = Some(verified(4.1e-4));
    let mut skipped = row(name, shape, Layout::Nhwc, gpu, DType::Bf16, None);
    skipped.status = RowStatus::Skipped("bf16 is not benchmarked in bench conv".into());
    let report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: 16,
        rows: vec![
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
        ],
    };
    assert_drawn("conv", &conv_sections(&report));
}
