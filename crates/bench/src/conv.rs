//! `bench conv`: convolutions at ResNet-50's shapes, CPU (im2col + gemm) against GPU (cuDNN,
//! algorithm chosen by measurement), f32 / tf32 / f16, NCHW and NHWC, each GPU output checked
//! against the CPU's.

use crate::check::{describe_gpu, GpuFacts};
use crate::cpu;
use crate::error::{Error, Result};
use crate::harness::{tflops, time_device, time_host, Measurement, Plan};
use crate::random::{fresh_seed, uniform_f32};
use crate::report::{judge_rows, Document, PeerFigure, RowStatus, Verification};
use gpukit_cuda::dnn::{Conv, Dnn};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::Gpu;
use gpukit_tensor::codec::{decode_f32, encode_f32, round_f32};
use gpukit_tensor::{ConvShape, DType, Device, Layout};
use serde::{Deserialize, Serialize};

/// A named convolution shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NamedShape {
    pub name: &'static str,
    pub shape: ConvShape,
}

/// ResNet-50's convolutions that carry most of its time, at batch `n`.
pub fn resnet50_shapes(n: usize) -> Vec<NamedShape> {
    let s = |name, c, h, k, r, stride, pad| NamedShape {
        name,
        shape: ConvShape {
            n,
            c,
            h,
            w: h,
            k,
            r,
            s: r,
            stride,
            pad,
        },
    };
    vec![
        s("conv1 7x7/2", 3, 224, 64, 7, 2, 3),
        s("layer1 3x3", 64, 56, 64, 3, 1, 1),
        s("layer1 1x1 expand", 64, 56, 256, 1, 1, 0),
        s("layer2 3x3/2", 128, 56, 128, 3, 2, 1),
        s("layer3 3x3", 256, 14, 256, 3, 1, 1),
        s("layer4 1x1 reduce", 2048, 7, 512, 1, 1, 0),
    ]
}

/// `NxCxHxW:KxRxS:s<stride>p<pad>`, the reference script's syntax.
pub fn shape_string(s: &ConvShape) -> String {
    s.spec()
}

#[derive(Debug, Clone)]
pub struct ConvOptions {
    pub batch: usize,
    pub dtypes: Vec<DType>,
    pub layouts: Vec<Layout>,
    pub ordinal: Option<usize>,
    pub cpu: bool,
    pub iterations: usize,
    pub cpu_budget_s: f64,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            batch: 32,
            dtypes: vec![DType::F32, DType::Tf32, DType::F16],
            layouts: vec![Layout::Nchw, Layout::Nhwc],
            ordinal: Some(0),
            cpu: true,
            iterations: 30,
            cpu_budget_s: 5.0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConvRow {
    pub name: String,
    pub shape: ConvShape,
    pub layout: Layout,
    pub device: Device,
    pub dtype: DType,
    pub status: RowStatus,
    /// cuDNN's algorithm (chosen by measurement), or the CPU method.
    pub algorithm: Option<String>,
    pub timing: Option<Measurement>,
    pub tflops: Option<f64>,
    pub pct_of_peak: Option<f64>,
    /// GPU rate over the CPU's f32 rate for the same shape and layout.
    pub speedup_vs_cpu: Option<f64>,
    /// GPU rows: against the CPU's f32 result from the same (rounded) inputs.
    pub verification: Option<Verification>,
    pub pytorch: Option<PeerFigure>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConvReport {
    pub gpu: Option<GpuFacts>,
    pub gpu_unavailable: Option<String>,
    pub cpu_threads: usize,
    pub rows: Vec<ConvRow>,
}

/// Whether `bench conv` runs this dtype on the GPU (f64 is not a convolution dtype here).
fn benchmarked(d: DType) -> bool {
    d != DType::F64
}

/// Tolerance against the CPU's f32 result computed from the same stored inputs.
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        DType::Tf32 => 3e-3,
        _ => 3e-3,
    }
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        num += (f64::from(*g) - f64::from(*w)).powi(2);
        den += f64::from(*w).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

fn row(named: &NamedShape, layout: Layout, device: Device, dtype: DType) -> ConvRow {
    ConvRow {
        name: named.name.to_string(),
        shape: named.shape,
        layout,
        device,
        dtype,
        status: RowStatus::Ok,
        algorithm: None,
        timing: None,
        tflops: None,
        pct_of_peak: None,
        speedup_vs_cpu: None,
        verification: None,
        pytorch: None,
    }
}

/// The JSON document of `bench conv`: the report, PyTorch's outcome and the verdict.
pub fn document(report: ConvReport, peer: Option<&Result<String>>) -> Document<ConvReport> {
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench conv", report, failure).with_peer(peer)
}

/// Runs every shape x layout on the CPU (f32) and the GPU (each dtype).
pub fn run_conv(
    discovery: &Discovery,
    shapes: &[NamedShape],
    opts: &ConvOptions,
    progress: &mut dyn FnMut(&str),
) -> ConvReport {
    let mut report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: cpu::threads(),
        rows: Vec::new(),
    };
    let gpu =
        opts.ordinal.and_then(
            |o| match (Gpu::open(discovery, o), describe_gpu(discovery, o)) {
                (Ok(g), Ok(f)) => match Dnn::new(discovery, &g) {
                    Ok(d) => {
                        report.gpu = Some(f);
                        Some((g, d))
                    }
                    Err(e) => {
                        report.gpu_unavailable = Some(e.to_string());
                        None
                    }
                },
                (Err(e), _) => {
                    report.gpu_unavailable = Some(e.to_string());
                    None
                }
                (_, Err(e)) => {
                    report.gpu_unavailable = Some(e.to_string());
                    None
                }
            },
        );
    let host_free = crate::host::host_facts().memory_available_bytes;
    for named in shapes {
        for &layout in &opts.layouts {
            let sh = &named.shape;
            // inputs, the reference, rounded copies for f16 and im2col scratch: stay well inside
            let need = 4 * 4 * (sh.input_len() + sh.weight_len() + sh.output_len()) as u64;
            if host_free.is_some_and(|free| need > free) {
                let mut r = row(named, layout, Device::Cpu, DType::F32);
                r.status = RowStatus::Skipped(format!(
                    "needs about {:.1} GiB of host memory, {:.1} GiB available",
                    need as f64 / (1u64 << 30) as f64,
                    host_free.unwrap_or(0) as f64 / (1u64 << 30) as f64
                ));
                report.rows.push(r);
                continue;
            }
            let seed = fresh_seed();
            let x = uniform_f32(sh.input_len(), seed ^ 1);
            let w = uniform_f32(sh.weight_len(), seed ^ 2);
            let flops = sh.flops();
            // CPU f32: the timed row, and the reference every GPU row is checked against
            progress(&format!("conv cpu {} {layout:?}", named.name));
            let mut y_ref = vec![f32::NAN; sh.output_len()];
            let plan = Plan::new(1, opts.iterations).with_budget(opts.cpu_budget_s);
            let mut cpu_row = row(named, layout, Device::Cpu, DType::F32);
            cpu_row.algorithm = Some(format!("im2col + gemm, {} threads", cpu::threads()));
            if opts.cpu {
                match time_host(plan, || {
                    cpu::conv2d_f32(sh, layout, &x, &w, &mut y_ref);
                    Ok::<(), Error>(())
                }) {
                    Ok(t) => {
                        cpu_row.tflops = Some(tflops(flops, t.summary_ms.median));
                        cpu_row.timing = Some(t);
                    }
                    Err(e) => cpu_row.status = RowStatus::Failed(e.to_string()),
                }
            } else {
                cpu::conv2d_f32(sh, layout, &x, &w, &mut y_ref);
            }
            let cpu_tflops = cpu_row.tflops;
            if opts.cpu {
                report.rows.push(cpu_row);
            }
            let Some((g, dnn)) = &gpu else { continue };
            for &dtype in &opts.dtypes {
                let mut r = row(named, layout, Device::Cuda(g.ordinal), dtype);
                if !benchmarked(dtype) {
                    r.status =
                        RowStatus::Skipped(format!("{dtype} convolution is not benchmarked"));
                    report.rows.push(r);
                    continue;
                }
                progress(&format!("conv cuda {} {layout:?} {dtype}", named.name));
                let conv = Conv {
                    shape: *sh,
                    layout,
                    dtype,
                };
                let result = gpu_conv(g, dnn, conv, &x, &w, &y_ref, opts.iterations);
                match result {
                    Ok((algo, timing, v)) => {
                        r.algorithm = Some(algo);
                        if v.passed {
                            let t = tflops(flops, timing.summary_ms.median);
                            r.tflops = Some(t);
                            r.speedup_vs_cpu = cpu_tflops.map(|c| t / c);
                            r.pct_of_peak = report
                                .gpu
                                .as_ref()
                                .and_then(|f| f.peaks.for_dtype(dtype.name()))
                                .map(|p| 100.0 * t / p);
                            r.timing = Some(timing);
                        } else {
                            r.status = RowStatus::Failed(format!(
                                "wrong result: relative error {:.2e} over tolerance {:.0e}",
                                v.rel_err, v.tolerance
                            ));
                        }
                        r.verification = Some(v);
                    }
                    Err(e) => r.status = RowStatus::Failed(e.to_string()),
                }
                report.rows.push(r);
            }
        }
    }
    report
}

/// One GPU row: the convolution's engine chosen by cuDNN's selection policy (the inference
/// engine's: legacy algorithms and backend engines timed alike), timed, then run once more on a
/// poisoned output and checked against the CPU's f32 result of the same (rounded) inputs.
fn gpu_conv(
    g: &Gpu,
    dnn: &Dnn,
    conv: Conv,
    x: &[f32],
    w: &[f32],
    y_ref_f32: &[f32],
    iterations: usize,
) -> Result<(String, Measurement, Verification)> {
    let (xb, wb) = (encode_f32(x, conv.dtype), encode_f32(w, conv.dtype));
    let need = xb.len() + wb.len() + conv.output_bytes();
    let free = g.mem_info().map(|(f, _)| f as usize).unwrap_or(0);
    if need + gpukit_cuda::dnn::CONV_WORKSPACE_BYTES > free {
        return Err(Error::Failed(format!(
            "needs {need} bytes of GPU memory, {free} free"
        )));
    }
    let xd = g.upload(&xb)?;
    let wd = g.upload(&wb)?;
    let yd = g.alloc(conv.output_bytes())?;
    let choice = dnn.plan_plain_best(conv, xd.view(), wd.view(), yd.view(), true)?;
    let ws = g.alloc(choice.workspace_bytes().max(1))?;
    dnn.release_workspace();
    let run = || dnn.bare_forward(&choice, xd.view(), wd.view(), yd.view(), ws.view());
    let timing = time_device(g.stream(), Plan::new(3, iterations), run)?;
    // poison, run once more, compare with the CPU
    g.fill(yd.view(), 0xFF)?;
    run()?;
    let got = decode_f32(&g.download(&yd)?, conv.dtype);
    // f16/bf16 rows are checked against an f32 product of the rounded inputs
    let reference: Vec<f32> = if conv.dtype.size_bytes() == 2 {
        let mut y = vec![0f32; conv.shape.output_len()];
        let (xr, wr) = (round_f32(x, conv.dtype), round_f32(w, conv.dtype));
        cpu::conv2d_f32(&conv.shape, conv.layout, &xr, &wr, &mut y);
        y
    } else {
        y_ref_f32.to_vec()
    };
    let err = rel_err(&got, &reference);
    let v = Verification {
        samples: got.len(),
        rel_err: err,
        tolerance: tolerance(conv.dtype),
        passed: err <= tolerance(conv.dtype),
    };
    Ok((choice.name(), timing, v))
}

/// Runs the same convolutions through PyTorch (cudnn.benchmark on: it too picks algorithms by
/// measurement) and fills the `pytorch` column.
pub fn compare_with_pytorch(
    report: &mut ConvReport,
    shapes: &[NamedShape],
    opts: &ConvOptions,
) -> Result<String> {
    let dtypes: Vec<&str> = opts
        .dtypes
        .iter()
        .filter(|d| benchmarked(**d))
        .map(|d| d.name())
        .collect();
    let layouts: Vec<&str> = opts
        .layouts
        .iter()
        .map(|l| if *l == Layout::Nhwc { "nhwc" } else { "nchw" })
        .collect();
    let args = vec![
        "conv".to_string(),
        "--shapes".into(),
        shapes
            .iter()
            .map(|s| shape_string(&s.shape))
            .collect::<Vec<_>>()
            .join(","),
        "--dtypes".into(),
        dtypes.join(","),
        "--layouts".into(),
        layouts.join(","),
        "--iterations".into(),
        opts.iterations.to_string(),
        "--benchmark-cudnn".into(),
    ];
    let run = crate::peer::run_pytorch(&args)?;
    for r in report.rows.iter_mut().filter(|r| r.device != Device::Cpu) {
        let layout = if r.layout == Layout::Nhwc {
            "nhwc"
        } else {
            "nchw"
        };
        let hit = run.results.iter().find(|p| {
            p["dtype"].as_str() == Some(r.dtype.name())
                && p["layout"].as_str() == Some(layout)
                && p["shape"].as_str() == Some(shape_string(&r.shape).as_str())
        });
        if let (Some(p), Some(ours)) = (hit, r.tflops) {
            if let (Some(ms), Some(t)) = (p["median_ms"].as_f64(), p["tflops"].as_f64()) {
                r.pytorch = Some(PeerFigure {
                    median_ms: ms,
                    rate: t,
                    ratio: ours / t,
                    turn_ratios: Vec::new(),
                    by_opener: Vec::new(),
                });
            }
        }
    }
    Ok(run.torch_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet_shapes_have_the_right_outputs() {
        let s = resnet50_shapes(2);
        assert_eq!((s[0].shape.out_h(), s[0].shape.out_w()), (112, 112));
        assert_eq!(s[3].shape.out_h(), 28);
        assert_eq!(shape_string(&s[1].shape), "2x64x56x56:64x3x3:s1p1");
    }

    #[test]
    fn cpu_only_run_reports_cpu_rows() {
        let shapes = vec![NamedShape {
            name: "tiny",
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
            },
        }];
        let opts = ConvOptions {
            ordinal: None,
            iterations: 2,
            ..ConvOptions::default()
        };
        let r = run_conv(
            &gpukit_cuda::loader::discover(),
            &shapes,
            &opts,
            &mut |_| {},
        );
        assert_eq!(r.rows.len(), 2);
        assert!(r
            .rows
            .iter()
            .all(|x| x.device == Device::Cpu && x.tflops.unwrap() > 0.0));
    }

    #[test]
    fn relative_error_catches_nan_and_differences() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_err(&[f32::NAN], &[1.0]).is_infinite());
        assert!((rel_err(&[1.1], &[1.0]) - 0.1).abs() < 1e-6);
    }
}
