//! `bench conv`: every distinct convolution of ResNet-50, forward, CPU (f32, im2col + gemm)
//! against the GPU (cuDNN, each row's engine chosen by the inference engine's selection policy),
//! f32 / tf32 / f16 / bf16, NCHW and NHWC, each GPU output checked against the CPU's, optionally
//! in turns with PyTorch's cudnn.benchmark on the same convolution.

mod part;
pub use part::{ConvPart, PART};
mod gpu;
mod shapes;
pub mod summary;
#[cfg(test)]
mod tests;

pub use shapes::{resnet50_shapes, NamedShape};
pub use summary::{ConvTotal, SlowestRow};

use crate::cpu;
use crate::error::{Error, Result};
use crate::gpu::{describe_gpu, GpuFacts};
use crate::measure::{tflops, time_host, Measurement, Plan};
use crate::peer::PeerServer;
use crate::random::{fresh_seed, uniform_f32};
use crate::report::{judge_rows, Document, PeerFigure, RowStatus, Verification};
use gpu::{gpu_conv, ConvTurns, Staging};
use gpukit_cuda::dnn::{Conv, Dnn, GraphSpec};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::Gpu;
use gpukit_tensor::{ConvShape, DType, Device, Layout};
use serde::{Deserialize, Serialize};

/// gpukit's rate over PyTorch's below which a row is flagged as behind: the floor both tools
/// calling cuDNN must reach, and below the 0.98-1.05 spread the turns method read on rows where
/// both ran the same vendor kernel.
pub const PARITY_FLOOR: f64 = 0.95;

#[derive(Debug, Clone)]
pub struct ConvOptions {
    /// Every shape runs at each of these batch sizes.
    pub batches: Vec<usize>,
    pub dtypes: Vec<DType>,
    pub layouts: Vec<Layout>,
    pub ordinal: Option<usize>,
    /// Time the CPU rows (the CPU's f32 result is computed either way: every GPU row is checked
    /// against it).
    pub cpu: bool,
    pub iterations: usize,
    /// Repetitions of a CPU row, where fewer than `iterations` (a CPU row is the reference
    /// beside the GPU's, timed for the speed-up column; `gpukit all` times it 5 times).
    pub cpu_iterations: Option<usize>,
    /// Seconds the CPU may spend timing one row (at least one repetition runs).
    pub cpu_budget_s: f64,
    /// With PyTorch: alternating blocks per side, split over both orders.
    pub rounds: usize,
    /// How thoroughly each convolution's engine is searched for.
    pub search: gpukit_cuda::dnn::Search,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            batches: vec![32],
            dtypes: vec![DType::F32, DType::Tf32, DType::F16, DType::Bf16],
            layouts: vec![Layout::Nchw, Layout::Nhwc],
            ordinal: Some(0),
            cpu: true,
            iterations: 30,
            cpu_iterations: None,
            cpu_budget_s: 1.0,
            rounds: 4,
            search: gpukit_cuda::dnn::Search::Fast,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConvRow {
    /// `layer2 3x3/2 128->128 @56`.
    pub name: String,
    /// How many times one forward pass of the network runs this convolution.
    pub count: usize,
    pub shape: ConvShape,
    pub layout: Layout,
    pub device: Device,
    pub dtype: DType,
    pub status: RowStatus,
    /// GPU rows: the engine that won (`IMPLICIT_PRECOMP_GEMM`, `backend engine 12 (rank 1 of
    /// 9)`); CPU rows: the method.
    pub engine: Option<String>,
    /// `legacy` (cudnnConvolutionForward) or `backend` (the graph API).
    pub api: Option<String>,
    /// Whether the engine runs on tensor cores (None where cuDNN does not say).
    pub tensor_cores: Option<bool>,
    /// GPU rows: convolutions per timed CUDA-graph replay (None: timed as direct launches,
    /// where capture failed).
    #[serde(default)]
    pub per_replay: Option<usize>,
    pub timing: Option<Measurement>,
    pub tflops: Option<f64>,
    pub pct_of_peak: Option<f64>,
    /// GPU rate over the CPU's f32 rate for the same shape and layout.
    pub speedup_vs_cpu: Option<f64>,
    /// GPU rows: against the CPU's f32 result from the same (rounded) inputs.
    pub verification: Option<Verification>,
    pub pytorch: Option<PeerFigure>,
    /// gpukit's rate is under [`PARITY_FLOOR`] times PyTorch's.
    #[serde(default)]
    pub behind_pytorch: bool,
}

impl ConvRow {
    fn new(named: &NamedShape, layout: Layout, device: Device, dtype: DType) -> ConvRow {
        ConvRow {
            name: named.name.clone(),
            count: named.count(),
            shape: named.shape,
            layout,
            device,
            dtype,
            status: RowStatus::Ok,
            engine: None,
            api: None,
            tensor_cores: None,
            per_replay: None,
            timing: None,
            tflops: None,
            pct_of_peak: None,
            speedup_vs_cpu: None,
            verification: None,
            pytorch: None,
            behind_pytorch: false,
        }
    }

    /// The median time of one run, when the row measured one.
    pub fn median_ms(&self) -> Option<f64> {
        self.timing.as_ref().map(|t| t.summary_ms.median)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConvReport {
    pub gpu: Option<GpuFacts>,
    pub gpu_unavailable: Option<String>,
    pub cpu_threads: usize,
    /// How the CPU rows compute (`im2col + gemm, 16 threads`).
    pub cpu_method: String,
    /// Alternating blocks per side when PyTorch took turns (0 when gpukit ran alone).
    pub rounds: usize,
    pub rows: Vec<ConvRow>,
    /// The whole network's convolutions per batch, dtype and layout (time-weighted).
    pub totals: Vec<ConvTotal>,
    /// The GPU row with the lowest ratio to PyTorch.
    pub slowest: Option<SlowestRow>,
    /// How the engines were searched for, and what planning cost (None without a GPU).
    #[serde(default)]
    pub planning: Option<ConvPlanning>,
}

/// What choosing every GPU row's engine took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvPlanning {
    pub search: gpukit_cuda::dnn::Search,
    pub stats: gpukit_cuda::dnn::PlanStats,
    /// Why the cuDNN choice cache on disk was not used, when it could not be read.
    #[serde(default)]
    pub cache_note: Option<String>,
}

/// Whether `bench conv` runs this dtype on the GPU (f64 and fp8 are not convolution dtypes here).
pub fn benchmarked(d: DType) -> bool {
    // fp8 is a matmul input type only (cuDNN convolutions in it are not gpukit's)
    d != DType::F64 && !d.matmul_only()
}

/// Tolerance against the CPU's f32 result computed from the same stored inputs (f16 and bf16
/// rows: from the inputs rounded as the GPU stores them), relative RMS.
pub(crate) fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        // 10-bit mantissa products, f32 accumulation; f16 outputs round to 11 bits
        DType::Tf32 | DType::F16 => 3e-3,
        // outputs stored with an 8-bit mantissa: 2^-9 relative rounding per element
        _ => 1e-2,
    }
}

/// The JSON document of `bench conv`: the report, PyTorch's outcome, the headline notes and the
/// verdict.
pub fn document(report: ConvReport, peer: Option<&Result<String>>) -> Document<ConvReport> {
    let notes = summary::notes(&report, matches!(peer, Some(Ok(_))));
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench conv", report, failure)
        .with_peer(peer)
        .with_notes(notes)
}

/// Runs every shape x batch x layout on the CPU (f32) and the GPU (each dtype), gpukit alone.
pub fn run_conv(
    discovery: &Discovery,
    shapes: &[NamedShape],
    opts: &ConvOptions,
    progress: &mut dyn FnMut(&str),
) -> ConvReport {
    run(discovery, shapes, opts, None, progress)
}

/// `run_conv` with PyTorch taking turns on every GPU row (`scripts/pytorch_reference.py
/// serve`, cudnn.benchmark on): each row's repetitions are split into `opts.rounds` blocks per
/// side in both orders, so both see the same clocks. Returns the report and PyTorch's version
/// (with the rows it gave no figure for), or why it could not run (the report then has
/// gpukit's figures only).
pub fn run_conv_with_pytorch(
    discovery: &Discovery,
    shapes: &[NamedShape],
    opts: &ConvOptions,
    progress: &mut dyn FnMut(&str),
) -> (ConvReport, Result<String>) {
    let server = match PeerServer::start("cuda", Some(cpu::threads())) {
        Ok(s) => s,
        Err(e) => return (run_conv(discovery, shapes, opts, progress), Err(e)),
    };
    let version = server.torch_version.clone();
    let mut turns = ConvTurns {
        server,
        missed: Vec::new(),
    };
    let report = run(discovery, shapes, opts, Some(&mut turns), progress);
    (
        report,
        Ok(crate::peer::outcome_line(version, &turns.missed)),
    )
}

/// The GPU and its cuDNN, or why not.
fn open_gpu(
    discovery: &Discovery,
    ordinal: usize,
) -> std::result::Result<(Gpu, Dnn, GpuFacts), String> {
    let g = Gpu::open(discovery, ordinal).map_err(|e| e.to_string())?;
    let facts = describe_gpu(discovery, ordinal).map_err(|e| e.to_string())?;
    let dnn = Dnn::new(discovery, &g).map_err(|e| e.to_string())?;
    Ok((g, dnn, facts))
}

fn run(
    discovery: &Discovery,
    shapes: &[NamedShape],
    opts: &ConvOptions,
    mut turns: Option<&mut ConvTurns>,
    progress: &mut dyn FnMut(&str),
) -> ConvReport {
    let mut report = ConvReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_threads: cpu::threads(),
        cpu_method: format!("im2col + gemm, {} threads", cpu::threads()),
        rounds: if turns.is_some() {
            opts.rounds.max(1)
        } else {
            0
        },
        rows: Vec::new(),
        totals: Vec::new(),
        slowest: None,
        planning: None,
    };
    let gpu = opts.ordinal.and_then(|o| match open_gpu(discovery, o) {
        Ok((g, d, f)) => {
            report.gpu = Some(f);
            d.set_search(opts.search);
            Some((g, d))
        }
        Err(why) => {
            report.gpu_unavailable = Some(why);
            None
        }
    });
    // helper threads finalize the engines that compile at run time, row by row ahead of the
    // planner
    if let Some((_, dnn)) = &gpu {
        let mut specs = Vec::new();
        for &batch in &opts.batches {
            for named in shapes {
                for &layout in &opts.layouts {
                    for &dtype in opts.dtypes.iter().filter(|d| benchmarked(**d)) {
                        specs.push(GraphSpec::plain(Conv {
                            shape: named.shape.with_batch(batch),
                            layout,
                            dtype,
                        }));
                    }
                }
            }
        }
        dnn.precompile(&specs, true);
    }
    let mut staging = Staging::default();
    for &batch in &opts.batches {
        for named in shapes {
            let named = NamedShape {
                shape: named.shape.with_batch(batch),
                ..named.clone()
            };
            for &layout in &opts.layouts {
                let rows = shape_rows(
                    &named,
                    layout,
                    (gpu.as_ref(), report.gpu.as_ref()),
                    opts,
                    (turns.as_deref_mut(), &mut staging),
                    progress,
                );
                report.rows.extend(rows);
            }
        }
    }
    if let Some((_, dnn)) = &gpu {
        dnn.finish_precompile();
    }
    report.totals = summary::totals(&report.rows);
    report.slowest = summary::slowest(&report.rows);
    report.planning = gpu.as_ref().map(|(_, d)| ConvPlanning {
        search: d.search(),
        stats: d.stats(),
        cache_note: d.cache_note(),
    });
    report
}

/// The rows of one shape in one layout: the CPU's (timed when asked) and each dtype's on the GPU.
fn shape_rows(
    named: &NamedShape,
    layout: Layout,
    (gpu, facts): (Option<&(Gpu, Dnn)>, Option<&GpuFacts>),
    opts: &ConvOptions,
    (mut turns, staging): (Option<&mut ConvTurns>, &mut Staging),
    progress: &mut dyn FnMut(&str),
) -> Vec<ConvRow> {
    let sh = &named.shape;
    let mut rows = Vec::new();
    // inputs, the reference, rounded copies for f16/bf16 and im2col scratch: stay well inside
    let need = [sh.input_len(), sh.weight_len(), sh.output_len()]
        .iter()
        .try_fold(0u64, |sum, &len| sum.checked_add(len as u64))
        .and_then(|elements| elements.checked_mul(16));
    let guard = gpukit_types::resources::Need::host(format!(
        "the CPU reference of {} at batch {}",
        named.name, sh.n
    ))
    .with("operands, reference and scratch", need)
    .check_host("lower --batch");
    if let Err(refused) = guard {
        let mut r = ConvRow::new(named, layout, Device::Cpu, DType::F32);
        r.status = RowStatus::Skipped(refused.to_string());
        return vec![r];
    }
    let seed = fresh_seed();
    let x = uniform_f32(sh.input_len(), seed ^ 1);
    let w = uniform_f32(sh.weight_len(), seed ^ 2);
    // CPU f32: the timed row, and the reference every GPU row is checked against
    progress(&format!("conv cpu {} n={} {layout}", named.name, sh.n));
    let mut y_ref = vec![f32::NAN; sh.output_len()];
    let mut cpu_row = ConvRow::new(named, layout, Device::Cpu, DType::F32);
    cpu_row.engine = Some(format!("im2col + gemm, {} threads", cpu::threads()));
    let mut compute = || {
        cpu::conv2d_f32(sh, layout, &x, &w, &mut y_ref);
        Ok::<(), Error>(())
    };
    if opts.cpu {
        let reps = opts.cpu_iterations.unwrap_or(opts.iterations).max(1);
        let plan = Plan::new(1, reps).with_budget(opts.cpu_budget_s);
        match time_host(plan, &mut compute) {
            Ok(t) => {
                cpu_row.tflops = Some(tflops(sh.flops(), t.summary_ms.median));
                cpu_row.timing = Some(t);
            }
            Err(e) => cpu_row.status = RowStatus::Failed(e.to_string()),
        }
    } else {
        let _ = compute();
    }
    let cpu_tflops = cpu_row.tflops;
    if opts.cpu {
        rows.push(cpu_row);
    }
    let Some((g, dnn)) = gpu else { return rows };
    for &dtype in &opts.dtypes {
        let mut r = ConvRow::new(named, layout, Device::Cuda(g.ordinal), dtype);
        if !benchmarked(dtype) {
            r.status = RowStatus::Skipped(format!("{dtype} convolution is not benchmarked"));
            rows.push(r);
            continue;
        }
        progress(&format!(
            "conv cuda {} n={} {layout} {dtype}",
            named.name, sh.n
        ));
        let conv = Conv {
            shape: *sh,
            layout,
            dtype,
        };
        let io = (turns.as_deref_mut(), &mut *staging);
        match gpu_conv((g, dnn), conv, (&x, &w, &y_ref), opts, io) {
            Ok(m) => {
                r.engine = Some(m.engine);
                r.api = Some(m.api.to_string());
                r.tensor_cores = m.tensor_cores;
                r.per_replay = m.per_replay;
                if m.verification.passed {
                    let t = tflops(sh.flops(), m.timing.summary_ms.median);
                    r.tflops = Some(t);
                    r.speedup_vs_cpu = cpu_tflops.map(|c| t / c);
                    r.pct_of_peak = facts
                        .and_then(|f| f.peaks.for_dtype(dtype.name()))
                        .map(|p| 100.0 * t / p);
                    r.timing = Some(m.timing);
                    r.pytorch = PeerFigure::from_turns(m.theirs, |ms| tflops(sh.flops(), ms), t);
                    r.behind_pytorch = r.pytorch.as_ref().is_some_and(|p| p.ratio < PARITY_FLOOR);
                } else {
                    r.status = RowStatus::Failed(format!(
                        "wrong result: relative error {:.2e} over tolerance {:.0e}",
                        m.verification.rel_err, m.verification.tolerance
                    ));
                }
                r.verification = Some(m.verification);
            }
            Err(e) => r.status = RowStatus::Failed(e.to_string()),
        }
        rows.push(r);
    }
    rows
}
