//! `infer`: ResNet inference per batch size, on the CPU and on a GPU, every row's logits checked.
//!
//! - CPU: gpukit's own forward pass (batch norm folded, im2col + gemm), the CPU reference, and
//!   ONNX Runtime's CPU provider running the same weights, checked against it.
//! - GPU: gpukit's engine ([`gpukit_models::gpu`]) in each requested [`Strategy`] (precision x
//!   layout x eager or CUDA graph), timed with CUDA events. The fp32 NCHW eager logits are the GPU
//!   reference: they are checked against gpukit's CPU forward on the first images of the batch,
//!   then every other strategy is compared with them on the whole batch ([`tolerance`]).
//!
//! - One image at a time ([`InferStrategy::OneAtATime`]): at a batch size N > 1, a strategy's
//!   N images as N batch-1 passes back to back, against the same strategy's one pass over the
//!   batch ([`InferRow::batching_gain`]).
//!
//! Every strategy at one batch size sees the same random input. Weights are uploaded once per
//! (precision, layout) and kept across batch sizes; each batch size gets its own [`Session`],
//! dropped before the next (the one-at-a-time rows' batch-1 Session is kept across batch sizes).
//!
//! TensorRT is not run; the report only says whether its library is there ([`tensorrt_status`]).

use crate::harness::{time_device, time_host, Measurement, Plan};
use crate::matmul::{PeerFigure, RowStatus};
use crate::random::{fresh_seed, uniform_f32};
use gpukit_cuda::loader::{find_extra_library, Discovery};
use gpukit_models::forward::{fold, FoldedResNet};
use gpukit_models::gpu::{
    EngineError, GpuContext, GpuWeights, Precision, Session, SessionMemory, Strategy,
};
use gpukit_models::onnx::export_resnet;
use gpukit_models::ort_runner::{find_onnxruntime, OrtModel};
use gpukit_models::weights::{load_safetensors, seeded_init, WeightsError};
use gpukit_models::ResNet;
use gpukit_tensor::{DType, Device, DeviceSelection};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The CPU reference row's strategy name.
pub const CPU_ROW: &str = "gpukit f32 (folded BN, direct NHWC conv)";
/// ONNX Runtime's row's strategy name.
pub const ORT_ROW: &str = "ONNX Runtime CPU (same weights)";

/// Untimed passes before a GPU row's timed ones (after the verification pass).
pub const GPU_WARMUP: usize = 3;

/// Images of the batch the GPU fp32 reference is checked on against gpukit's CPU forward.
pub const CPU_CHECK_IMAGES: usize = 4;

/// How a one-at-a-time strategy's name ends: `fp16-nhwc-graph-one-at-a-time`.
pub const ONE_AT_A_TIME: &str = "-one-at-a-time";

/// Batch-1 passes a one-at-a-time row times at most (over all repetitions): fewer repetitions
/// at large batch sizes, never fewer than [`ONE_AT_A_TIME_MIN_REPS`].
pub const ONE_AT_A_TIME_MAX_PASSES: usize = 4096;
/// Timed repetitions a one-at-a-time row keeps however large the batch (unless fewer asked).
pub const ONE_AT_A_TIME_MIN_REPS: usize = 5;

/// One kind of row of `gpukit infer`, as `--strategies` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferStrategy {
    /// gpukit's f32 CPU forward ([`CPU_ROW`]): the CPU reference.
    Cpu,
    /// ONNX Runtime's CPU provider on the same weights ([`ORT_ROW`]).
    OnnxRuntime,
    /// gpukit's GPU engine.
    Gpu(Strategy),
    /// The strategy's engine at batch 1, run once per image of the batch: at batch size N,
    /// N passes back to back (eager, or N replays of its CUDA graph). Rows only at N > 1.
    OneAtATime(Strategy),
}

impl InferStrategy {
    /// `cpu`, `onnxruntime`, or the GPU strategy's [`Strategy::name`].
    pub fn name(&self) -> String {
        match self {
            InferStrategy::Cpu => "cpu".into(),
            InferStrategy::OnnxRuntime => "onnxruntime".into(),
            InferStrategy::Gpu(s) => s.name(),
            InferStrategy::OneAtATime(s) => format!("{}{ONE_AT_A_TIME}", s.name()),
        }
    }

    /// Parses one name as [`InferStrategy::name`] writes it (`ort` also names ONNX Runtime).
    pub fn parse(text: &str) -> Result<InferStrategy, String> {
        let t = text.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(InferStrategy::Cpu),
            "onnxruntime" | "ort" => Ok(InferStrategy::OnnxRuntime),
            _ => {
                let (base, single) = match t.strip_suffix(ONE_AT_A_TIME) {
                    Some(base) => (base, true),
                    None => (t.as_str(), false),
                };
                Strategy::parse(base)
                    .map(|g| {
                        if single {
                            InferStrategy::OneAtATime(g)
                        } else {
                            InferStrategy::Gpu(g)
                        }
                    })
                    .map_err(|e| {
                        format!(
                            "{e}: a strategy is cpu, onnxruntime or \
                             PRECISION[-nhwc][-graph][{ONE_AT_A_TIME}] with PRECISION one of \
                             fp32, tf32, fp16, bf16 (e.g. fp16-nhwc-graph)"
                        )
                    })
            }
        }
    }

    /// The best GPU strategy, one image at a time: the default one-at-a-time row.
    pub fn default_one_at_a_time() -> InferStrategy {
        InferStrategy::OneAtATime(Strategy {
            precision: Precision::F16,
            nhwc: true,
            graph: true,
        })
    }

    /// cpu, onnxruntime, [`Strategy::defaults`], and fp16-nhwc-graph one image at a time.
    pub fn defaults() -> Vec<InferStrategy> {
        let mut v = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
        v.extend(Strategy::defaults().into_iter().map(InferStrategy::Gpu));
        v.push(InferStrategy::default_one_at_a_time());
        v
    }

    pub fn on_cpu(&self) -> bool {
        matches!(self, InferStrategy::Cpu | InferStrategy::OnnxRuntime)
    }
}

fn selection_has_cpu(selection: DeviceSelection) -> bool {
    matches!(
        selection,
        DeviceSelection::All | DeviceSelection::One(Device::Cpu)
    )
}

/// The CUDA ordinal the GPU rows run on: cuda:0 for `all`.
fn gpu_ordinal(selection: DeviceSelection) -> Option<usize> {
    match selection {
        DeviceSelection::All => Some(0),
        DeviceSelection::One(Device::Cuda(n)) => Some(n),
        DeviceSelection::One(Device::Cpu) => None,
    }
}

fn runs_on(s: &InferStrategy, selection: DeviceSelection) -> bool {
    if s.on_cpu() {
        selection_has_cpu(selection)
    } else {
        gpu_ordinal(selection).is_some()
    }
}

/// The strategies `--device` lets run, duplicates dropped (first kept). `requested` None: the
/// defaults, silently narrowed to the device; a requested strategy the device leaves out, or
/// nothing left to run, is bad input (the message says which).
pub fn select_strategies(
    requested: Option<&[InferStrategy]>,
    selection: DeviceSelection,
) -> Result<Vec<InferStrategy>, String> {
    let list = requested.map_or_else(InferStrategy::defaults, <[InferStrategy]>::to_vec);
    let mut unique: Vec<InferStrategy> = Vec::new();
    for s in list {
        if !unique.contains(&s) {
            unique.push(s);
        }
    }
    let (keep, left_out): (Vec<_>, Vec<_>) =
        unique.into_iter().partition(|s| runs_on(s, selection));
    if requested.is_some() && !left_out.is_empty() {
        let names: Vec<String> = left_out.iter().map(InferStrategy::name).collect();
        let side = if left_out[0].on_cpu() {
            "the CPU"
        } else {
            "a GPU"
        };
        return Err(format!(
            "--device {selection} leaves out strategy {} (it runs on {side}): use --device all, or drop it from --strategies",
            names.join(", ")
        ));
    }
    if keep.is_empty() {
        return Err(format!("no strategy runs on --device {selection}"));
    }
    Ok(keep)
}

#[derive(Debug, Clone)]
pub struct InferOptions {
    pub model: ResNet,
    pub batch_sizes: Vec<usize>,
    /// Timed repetitions per CPU row (fewer when `budget_s` cuts in).
    pub iterations: usize,
    /// A torchvision state_dict as safetensors; None: seeded initialisation (seed 0).
    pub weights: Option<PathBuf>,
    pub image_size: usize,
    /// Longest one CPU row may run, in seconds (fewer repetitions then, said in the count).
    pub budget_s: f64,
    /// cpu, cuda:N, or all (the CPU rows and cuda:0).
    pub selection: DeviceSelection,
    /// The rows wanted; those `selection` leaves out are dropped (see [`select_strategies`]).
    pub strategies: Vec<InferStrategy>,
    /// Timed repetitions per GPU row, after [`GPU_WARMUP`] warm-up passes.
    pub gpu_iterations: usize,
    /// CPU rows only at batch sizes up to this (`gpukit all`'s short tour); None: all of them.
    pub cpu_max_batch: Option<usize>,
}

impl InferOptions {
    /// The CPU rows of [`InferStrategy::defaults`] for `model` at `batch_sizes`, nothing else.
    pub fn cpu_only(model: ResNet, batch_sizes: Vec<usize>) -> InferOptions {
        InferOptions {
            model,
            batch_sizes,
            iterations: 10,
            weights: None,
            image_size: 224,
            budget_s: 10.0,
            selection: DeviceSelection::One(Device::Cpu),
            strategies: vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime],
            gpu_iterations: 50,
            cpu_max_batch: None,
        }
    }
}

/// How a strategy's logits compare with a reference on the same input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Agreement {
    pub max_abs: f64,
    /// max |a - b| over max |reference|.
    pub max_rel: f64,
    /// Fraction of images whose top-1 class is the same.
    pub top1: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferRow {
    /// CPU rows: [`CPU_ROW`] or [`ORT_ROW`]; GPU rows: [`Strategy::name`] (`fp16-nhwc-graph`).
    pub strategy: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub batch: usize,
    pub status: RowStatus,
    pub timing: Option<Measurement>,
    pub images_per_s: Option<f64>,
    /// Over gpukit's f32 CPU path at the same batch size (None where that row did not run).
    pub speedup_vs_reference: Option<f64>,
    /// GPU rows: over gpukit's fp32 eager GPU row at the same batch size (None where that row
    /// was not timed: not requested, or it failed).
    #[serde(default)]
    pub speedup_vs_fp32_eager: Option<f64>,
    /// GPU rows: device memory the engine itself accounts for at this batch size: weights +
    /// activation arena (input and logits included) + the largest convolution workspace. The
    /// engine's own accounting ([`SessionMemory`]), not the driver's: the CUDA context, library
    /// handles and a captured graph's memory are not included.
    #[serde(default)]
    pub gpu_memory_bytes: Option<u64>,
    /// GPU rows: the parts of `gpu_memory_bytes`, and the arena's size without the memory plan.
    #[serde(default)]
    pub gpu_memory: Option<SessionMemory>,
    /// Against `compared_with`, on the logits of the last timed pass.
    pub agreement: Option<Agreement>,
    /// What `agreement` compares with: "gpukit's f32 CPU forward", "gpukit's GPU fp32 eager
    /// logits (whole batch)", ... None for the CPU reference row itself.
    #[serde(default)]
    pub compared_with: Option<String>,
    /// Largest `agreement.max_rel` the row may show and pass.
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// PyTorch's figure for the same strategy (`--compare-pytorch`).
    #[serde(default)]
    pub pytorch: Option<PeerFigure>,
    /// One-at-a-time rows: the batched row's images/s (the same strategy, one pass over the
    /// batch) over this row's: what batching gains. None where either row did not pass.
    #[serde(default)]
    pub batching_gain: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferReport {
    pub model: String,
    pub parameters: usize,
    pub weights: String,
    pub image_size: usize,
    pub cpu_threads: usize,
    /// By batch size, then the CPU rows, then the GPU rows in the order strategies were asked.
    pub rows: Vec<InferRow>,
    /// Why ONNX Runtime's rows are absent, when they are.
    pub onnxruntime_unavailable: Option<String>,
    /// The GPU the GPU rows ran on: `cuda:0 NVIDIA H100 80GB HBM3`.
    #[serde(default)]
    pub gpu_device: Option<String>,
    /// Why the GPU rows are absent, when the selection included a GPU and none could be used.
    #[serde(default)]
    pub gpu_unavailable: Option<String>,
    /// `--compare-pytorch`: PyTorch's rows, the logits check and the best fp16 of each side.
    #[serde(default)]
    pub pytorch: Option<crate::infer_peer::PytorchComparison>,
    /// Whether TensorRT's libnvinfer is on this machine ([`tensorrt_status`]); gpukit runs no
    /// TensorRT strategy. None where no GPU strategy was asked for.
    #[serde(default)]
    pub tensorrt: Option<String>,
}

/// The report's TensorRT line, from where libnvinfer was found
/// ([`gpukit_cuda::loader::find_extra_library`]), if anywhere.
pub fn tensorrt_status(libnvinfer: Option<&Path>) -> String {
    match libnvinfer {
        Some(p) => format!(
            "libnvinfer found at {}; gpukit has no TensorRT strategy yet",
            p.display()
        ),
        None => "unavailable: libnvinfer not found (install TensorRT, e.g. pip install tensorrt, \
                 to compare)"
            .into(),
    }
}

/// Bad input (exit 2): unusable weights or shapes.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error("{0}")]
    Weights(#[from] WeightsError),
    #[error("{0}")]
    Invalid(String),
}

/// Compares `got` with `reference` (both `batch x classes`).
pub fn agreement(got: &[f32], reference: &[f32], classes: usize) -> Agreement {
    let max_ref = reference
        .iter()
        .fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let max_abs = got.iter().zip(reference).fold(0f64, |m, (a, b)| {
        let d = (f64::from(*a) - f64::from(*b)).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            m.max(d)
        }
    });
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                if x > best.1 {
                    (i, x)
                } else {
                    best
                }
            })
            .0
    };
    let images = reference.len() / classes.max(1);
    let same = (0..images)
        .filter(|&i| {
            argmax(&got[i * classes..(i + 1) * classes])
                == argmax(&reference[i * classes..(i + 1) * classes])
        })
        .count();
    Agreement {
        max_abs,
        max_rel: max_abs / max_ref.max(f64::MIN_POSITIVE),
        top1: same as f64 / images.max(1) as f64,
    }
}

/// Largest max_rel (as [`agreement`] computes it) a GPU precision may show against the GPU fp32
/// reference on the same input.
pub fn tolerance(p: Precision) -> f64 {
    match p {
        Precision::F32 => 1e-4,
        Precision::Tf32 | Precision::F16 => 1e-2,
        Precision::Bf16 => 5e-2,
    }
}

/// Whether logits pass: all finite, and max_rel within `tolerance`. Top-1 agreement is shown,
/// not judged (random-weight logits can be close enough for rounding to swap the top class).
pub fn verdict(got: &[f32], a: &Agreement, tolerance: f64) -> Result<(), String> {
    let bad = got.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 {
        return Err(format!(
            "{bad} of {} logits are not finite (NaN or infinite)",
            got.len()
        ));
    }
    if a.max_rel.is_nan() || a.max_rel > tolerance {
        return Err(format!(
            "logits differ from the reference: max relative difference {:.1e} is over the tolerance {:.0e} (max abs {:.2e}, top-1 agreement {:.0}%)",
            a.max_rel,
            tolerance,
            a.max_abs,
            a.top1 * 100.0
        ));
    }
    Ok(())
}

pub fn is_gpu_row(r: &InferRow) -> bool {
    r.device != "cpu"
}

/// Whether the row is a strategy run one image at a time ([`InferStrategy::OneAtATime`]).
pub fn is_one_at_a_time(r: &InferRow) -> bool {
    is_gpu_row(r) && r.strategy.ends_with(ONE_AT_A_TIME)
}

/// Timed repetitions of a one-at-a-time row at batch `n`: `reps`, fewer where they would pass
/// [`ONE_AT_A_TIME_MAX_PASSES`] batch-1 passes, but at least [`ONE_AT_A_TIME_MIN_REPS`].
pub fn one_at_a_time_reps(reps: usize, n: usize) -> usize {
    reps.min((ONE_AT_A_TIME_MAX_PASSES / n.max(1)).max(ONE_AT_A_TIME_MIN_REPS))
        .max(1)
}

/// Orders rows by batch size, then the CPU rows (in the order they came), then the GPU rows in
/// the order of `gpu_order` (strategy names).
pub fn sort_rows(rows: &mut [InferRow], gpu_order: &[String]) {
    rows.sort_by_key(|r| {
        (
            r.batch,
            is_gpu_row(r),
            gpu_order
                .iter()
                .position(|s| *s == r.strategy)
                .unwrap_or(usize::MAX),
        )
    });
}

/// Per batch size (ascending): the GPU row that passed with the most images/s. One-at-a-time
/// rows are not candidates: they show what the batch would cost without batching.
pub fn best_gpu_rows(rows: &[InferRow]) -> Vec<&InferRow> {
    let mut best: BTreeMap<usize, &InferRow> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| is_gpu_row(r) && !is_one_at_a_time(r) && r.status == RowStatus::Ok)
    {
        let Some(rate) = r.images_per_s else { continue };
        let better = best
            .get(&r.batch)
            .is_none_or(|b| b.images_per_s.is_none_or(|x| rate > x));
        if better {
            best.insert(r.batch, r);
        }
    }
    best.into_values().collect()
}

/// Why the command must fail though no row failed: GPU rows were asked for and ran into limits
/// (out of memory at every batch size, say), so none produced a figure.
pub fn gpu_rows_without_figure(report: &InferReport) -> Option<String> {
    let gpu: Vec<&InferRow> = report.rows.iter().filter(|r| is_gpu_row(r)).collect();
    if gpu.is_empty() || gpu.iter().any(|r| r.status == RowStatus::Ok) {
        return None;
    }
    let first = gpu.iter().find_map(|r| match &r.status {
        RowStatus::Skipped(w) | RowStatus::Failed(w) => {
            Some(format!("{} at batch {}: {w}", r.strategy, r.batch))
        }
        RowStatus::Ok => None,
    });
    Some(format!(
        "none of the {} GPU row(s) produced a figure; the first: {}",
        gpu.len(),
        first.unwrap_or_default()
    ))
}

/// Whether an engine error is the device running out of memory (a limit, not a bug).
pub fn is_oom(e: &EngineError) -> bool {
    e.is_out_of_memory()
}

/// Out of memory skips a row (with the numbers); anything else fails it.
fn engine_status(what: &str, e: &EngineError) -> RowStatus {
    if is_oom(e) {
        RowStatus::Skipped(format!("{what}: {e}"))
    } else {
        RowStatus::Failed(format!("{what}: {e}"))
    }
}

fn row(strategy: &str, device: &str, batch: usize) -> InferRow {
    InferRow {
        strategy: strategy.to_string(),
        device: device.to_string(),
        batch,
        status: RowStatus::Ok,
        timing: None,
        images_per_s: None,
        speedup_vs_reference: None,
        speedup_vs_fp32_eager: None,
        gpu_memory_bytes: None,
        gpu_memory: None,
        agreement: None,
        compared_with: None,
        tolerance: None,
        pytorch: None,
        batching_gain: None,
    }
}

fn rate(n: usize, t: &Measurement) -> f64 {
    n as f64 / (t.summary_ms.median / 1e3)
}

/// `--compare-pytorch`: the same model, weights and batch sizes through PyTorch
/// (scripts/pytorch_reference.py); see [`crate::infer_peer`].
pub fn compare_with_pytorch(
    report: &mut InferReport,
    opts: &InferOptions,
) -> Result<String, String> {
    crate::infer_peer::compare(report, opts)
}

/// Runs every requested strategy at every batch size: the CPU rows, then the GPU rows.
pub fn run_infer(
    discovery: &Discovery,
    opts: &InferOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<InferReport, InferError> {
    let (dict, weights) = match &opts.weights {
        Some(p) => (
            load_safetensors(p, opts.model, None)?,
            p.display().to_string(),
        ),
        None => (
            seeded_init(opts.model, 1000, 0, true),
            "seeded initialisation (seed 0, torchvision's scheme)".to_string(),
        ),
    };
    if opts.image_size < 32 {
        return Err(InferError::Invalid(format!(
            "--image-size {} is too small: ResNet needs at least 32",
            opts.image_size
        )));
    }
    let folded: FoldedResNet = fold(&dict).map_err(|e| InferError::Invalid(e.to_string()))?;
    let classes = folded.num_classes;
    let mut report = InferReport {
        model: opts.model.name().to_string(),
        parameters: opts.model.parameter_count(classes),
        weights,
        image_size: opts.image_size,
        cpu_threads: gpukit_tensor::cpu::threads(),
        rows: Vec::new(),
        onnxruntime_unavailable: None,
        gpu_device: None,
        gpu_unavailable: None,
        pytorch: None,
        tensorrt: None,
    };
    let wanted: Vec<InferStrategy> = opts
        .strategies
        .iter()
        .copied()
        .filter(|s| runs_on(s, opts.selection))
        .collect();
    // one input per batch size, shared by every strategy (regenerated from its seed when needed)
    let batches: Vec<(usize, u64)> = opts
        .batch_sizes
        .iter()
        .map(|&n| (n, fresh_seed()))
        .collect();

    let want_cpu = wanted.contains(&InferStrategy::Cpu);
    let mut ort = if wanted.contains(&InferStrategy::OnnxRuntime) {
        match find_onnxruntime().and_then(|lib| {
            OrtModel::new(&lib, &export_resnet(&folded), gpukit_tensor::cpu::threads())
        }) {
            Ok(m) => Some(m),
            Err(e) => {
                report.onnxruntime_unavailable = Some(e);
                None
            }
        }
    } else {
        None
    };
    if want_cpu || ort.is_some() {
        let cpu_batches: Vec<(usize, u64)> = batches
            .iter()
            .copied()
            .filter(|(n, _)| opts.cpu_max_batch.is_none_or(|m| *n <= m))
            .collect();
        report.rows.extend(cpu_rows(
            &folded,
            opts,
            &cpu_batches,
            want_cpu,
            ort.as_mut(),
            progress,
        ));
    }
    drop(ort);

    let gpu: Vec<Strategy> = wanted
        .iter()
        .filter_map(|s| match s {
            InferStrategy::Gpu(g) => Some(*g),
            _ => None,
        })
        .collect();
    let singles: Vec<Strategy> = wanted
        .iter()
        .filter_map(|s| match s {
            InferStrategy::OneAtATime(g) => Some(*g),
            _ => None,
        })
        .collect();
    let any_gpu = !(gpu.is_empty() && singles.is_empty());
    if any_gpu {
        report.tensorrt = Some(tensorrt_status(
            find_extra_library(discovery, "nvinfer").as_deref(),
        ));
    }
    if let (true, Some(ordinal)) = (any_gpu, gpu_ordinal(opts.selection)) {
        progress(&format!("infer cuda:{ordinal}: opening the GPU"));
        match GpuContext::open(discovery, ordinal) {
            Ok(ctx) => {
                let (name, compute_capability) = gpu_name(discovery, ordinal);
                report.gpu_device = Some(name);
                let cpu_rates: BTreeMap<usize, f64> = report
                    .rows
                    .iter()
                    .filter(|r| r.strategy == CPU_ROW && r.status == RowStatus::Ok)
                    .filter_map(|r| Some((r.batch, r.images_per_s?)))
                    .collect();
                let run = GpuRun {
                    ctx: &ctx,
                    folded: &folded,
                    device: format!("cuda:{ordinal}"),
                    image: opts.image_size,
                    plan: Plan::new(GPU_WARMUP, opts.gpu_iterations),
                    cpu_rates,
                    compute_capability,
                };
                let rows = run.rows(&gpu, &singles, &batches, progress);
                report.rows.extend(rows);
            }
            Err(e) => report.gpu_unavailable = Some(e.to_string()),
        }
    }
    let order: Vec<String> = wanted
        .iter()
        .filter(|s| !s.on_cpu())
        .map(InferStrategy::name)
        .collect();
    sort_rows(&mut report.rows, &order);
    Ok(report)
}

/// `cuda:0 NVIDIA H100 80GB HBM3` (just `cuda:0` if the driver does not say), and the
/// compute capability.
fn gpu_name(discovery: &Discovery, ordinal: usize) -> (String, Option<(u32, u32)>) {
    let attributes = gpukit_cuda::driver::probe(discovery)
        .ok()
        .and_then(|d| gpukit_cuda::driver::device_attributes(ordinal, d.device_count).ok());
    match attributes {
        Some(a) => (
            format!("cuda:{ordinal} {}", a.name),
            Some(a.compute_capability),
        ),
        None => (format!("cuda:{ordinal}"), None),
    }
}

/// Whether the GPU has the arithmetic for `p` (unknown capability: assume it does).
fn supported(cc: Option<(u32, u32)>, p: Precision) -> Result<(), String> {
    let d = match p {
        Precision::F32 => DType::F32,
        Precision::Tf32 => DType::Tf32,
        Precision::F16 => DType::F16,
        Precision::Bf16 => DType::Bf16,
    };
    cc.map_or(Ok(()), |cc| crate::matmul::gpu_supports(cc, d))
}

/// gpukit's f32 CPU row (when `want_cpu`; untimed as ONNX Runtime's reference otherwise) and
/// ONNX Runtime's, at each batch size.
fn cpu_rows(
    folded: &FoldedResNet,
    opts: &InferOptions,
    batches: &[(usize, u64)],
    want_cpu: bool,
    mut ort: Option<&mut OrtModel>,
    progress: &mut dyn FnMut(&str),
) -> Vec<InferRow> {
    let classes = folded.num_classes;
    let s = opts.image_size;
    let plan = Plan::new(1, opts.iterations).with_budget(opts.budget_s);
    let mut rows = Vec::new();
    let mut ws = gpukit_models::forward::Workspace::default();
    for &(n, seed) in batches {
        let x = uniform_f32(n * 3 * s * s, seed);
        let mut reference = Vec::new();
        let mut reference_rate = None;
        let computed = if want_cpu {
            progress(&format!("infer cpu gpukit f32 batch {n}"));
            let mut r = row(CPU_ROW, "cpu", n);
            let timed = time_host(plan, || {
                reference = folded.forward_cpu_with(&x, n, s, s, &mut ws)?;
                Ok::<(), gpukit_models::forward::ForwardError>(())
            });
            let ok = match timed {
                Ok(t) => {
                    r.images_per_s = Some(rate(n, &t));
                    r.speedup_vs_reference = Some(1.0);
                    r.timing = Some(t);
                    reference_rate = r.images_per_s;
                    Ok(())
                }
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    Err(e.to_string())
                }
            };
            rows.push(r);
            ok
        } else if ort.is_some() {
            progress(&format!(
                "infer cpu gpukit f32 batch {n} (reference, untimed)"
            ));
            folded
                .forward_cpu_with(&x, n, s, s, &mut ws)
                .map(|l| reference = l)
                .map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        let Some(m) = ort.as_deref_mut() else {
            continue;
        };
        progress(&format!("infer cpu onnxruntime batch {n}"));
        let mut r = row(ORT_ROW, "cpu", n);
        if let Err(e) = computed {
            r.status = RowStatus::Skipped(format!("no CPU reference to check it with: {e}"));
            rows.push(r);
            continue;
        }
        let mut out = Vec::new();
        match time_host(plan, || {
            out = m.run(&x, n, s, s)?;
            Ok::<(), String>(())
        }) {
            Ok(t) => {
                let a = agreement(&out, &reference, classes);
                r.compared_with = Some("gpukit's f32 CPU forward".into());
                r.tolerance = Some(1e-3);
                if a.max_rel > 1e-3 || a.top1 < 1.0 {
                    r.status = RowStatus::Failed(format!(
                        "logits differ from gpukit's: max relative {:.1e}, top-1 agreement {:.0}%",
                        a.max_rel,
                        a.top1 * 100.0
                    ));
                } else {
                    let rate = rate(n, &t);
                    r.images_per_s = Some(rate);
                    r.speedup_vs_reference = reference_rate.map(|g| rate / g);
                    r.timing = Some(t);
                }
                r.agreement = Some(a);
            }
            Err(e) => r.status = RowStatus::Failed(e.to_string()),
        }
        rows.push(r);
    }
    rows
}

/// The (precision, layout) whose eager logits are the GPU reference.
const REFERENCE_PAIR: (Precision, bool) = (Precision::F32, false);

/// What a GPU strategy's logits are checked against at one batch size.
struct Reference {
    logits: Vec<f32>,
    /// How many images (the first of the batch) `logits` covers.
    images: usize,
    /// Shown in each row's `compared_with`.
    label: String,
}

/// The reference at one batch size: ready, or the status the rows that needed it get.
enum RefState {
    Ready(Reference),
    /// Skipped (it did not fit, or the fp32 rows already carry the failure) or Failed (the
    /// fp32 engine is wrong and no fp32 row says so).
    Unavailable(RowStatus),
}

/// The status of rows whose reference could not be made: a limit (out of memory) skips them;
/// an error fails them unless the fp32 rows (`fp32_rows`) already carry it.
fn dependent_status(why: String, limit: bool, fp32_rows: bool) -> RowStatus {
    let why = format!("not verifiable: {why}");
    if limit || fp32_rows {
        RowStatus::Skipped(why)
    } else {
        RowStatus::Failed(why)
    }
}

/// The (precision, layout) pairs to upload, the reference's first, then in the order the
/// strategies name them.
fn pairs(strategies: &[Strategy]) -> Vec<(Precision, bool)> {
    let mut v = vec![REFERENCE_PAIR];
    for s in strategies {
        if !v.contains(&(s.precision, s.nhwc)) {
            v.push((s.precision, s.nhwc));
        }
    }
    v
}

fn layout(nhwc: bool) -> &'static str {
    if nhwc {
        "NHWC"
    } else {
        "NCHW"
    }
}

/// The batch-1 Session the one-at-a-time rows of one (precision, layout) share across batch
/// sizes, or why it could not be made; and its CUDA graph's capture, once tried.
struct Single<'w> {
    session: Result<Session<'w>, RowStatus>,
    graph: Option<Result<(), String>>,
}

/// What one-at-a-time rows at one batch size are checked and compared against.
struct Checks<'c> {
    /// Per batched strategy that passed: its logits of the batch's first image.
    firsts: &'c [(Strategy, Vec<f32>)],
    /// The batch's reference, for strategies without a passing batched row.
    reference: &'c RefState,
    /// The batched rows of the same (precision, layout) at this batch size.
    batched: &'c [InferRow],
    /// The fp32 eager GPU rate at this batch size.
    fp32_eager: Option<f64>,
}

/// One GPU's part of the report.
struct GpuRun<'a> {
    ctx: &'a GpuContext,
    folded: &'a FoldedResNet,
    /// `cuda:N`.
    device: String,
    image: usize,
    plan: Plan,
    /// gpukit's f32 CPU rate per batch size, where that row ran.
    cpu_rates: BTreeMap<usize, f64>,
    compute_capability: Option<(u32, u32)>,
}

impl GpuRun<'_> {
    fn row(&self, s: &Strategy, n: usize, status: RowStatus) -> InferRow {
        let mut r = row(&s.name(), &self.device, n);
        r.status = status;
        r
    }

    /// Every strategy at every batch size, and each of `singles` one image at a time at every
    /// batch size over 1. The reference pair runs first, at every batch size, so each other
    /// strategy finds its batch's reference ready.
    fn rows(
        &self,
        strategies: &[Strategy],
        singles: &[Strategy],
        batches: &[(usize, u64)],
        progress: &mut dyn FnMut(&str),
    ) -> Vec<InferRow> {
        let mut rows = Vec::new();
        let mut refs: Vec<RefState> = batches
            .iter()
            .map(|_| {
                RefState::Unavailable(RowStatus::Skipped("the fp32 reference did not run".into()))
            })
            .collect();
        let mut fp32_eager: Vec<Option<f64>> = vec![None; batches.len()];
        let all: Vec<Strategy> = strategies.iter().chain(singles).copied().collect();
        for (precision, nhwc) in pairs(&all) {
            // eager before graph: the graph is captured once, after the eager rows are timed
            let of_pair = |list: &[Strategy]| -> Vec<Strategy> {
                let mut v: Vec<Strategy> = list
                    .iter()
                    .copied()
                    .filter(|s| (s.precision, s.nhwc) == (precision, nhwc))
                    .collect();
                v.sort_by_key(|s| s.graph);
                v
            };
            let here = of_pair(strategies);
            let here_single = of_pair(singles);
            let is_ref = (precision, nhwc) == REFERENCE_PAIR;
            // the rows of this pair at one batch size, all with one status
            let all_rows = |n: usize, status: &RowStatus| -> Vec<InferRow> {
                let mut v: Vec<InferRow> = here
                    .iter()
                    .map(|s| self.row(s, n, status.clone()))
                    .collect();
                if n > 1 {
                    v.extend(here_single.iter().map(|s| {
                        let mut r = row(&InferStrategy::OneAtATime(*s).name(), &self.device, n);
                        r.status = status.clone();
                        r
                    }));
                }
                v
            };
            // tf32 and bf16 need Ampere or newer: a limit of the GPU, not an error
            if let Err(why) = supported(self.compute_capability, precision) {
                for &(n, _) in batches {
                    rows.extend(all_rows(n, &RowStatus::Skipped(why.clone())));
                }
                continue;
            }
            progress(&format!(
                "infer {}: uploading {} {} weights",
                self.device,
                precision.name(),
                layout(nhwc)
            ));
            let weights = match GpuWeights::upload(self.ctx, self.folded, precision, nhwc) {
                Ok(w) => w,
                Err(e) => {
                    let what = format!(
                        "uploading the {} {} weights",
                        precision.name(),
                        layout(nhwc)
                    );
                    for (bi, &(n, _)) in batches.iter().enumerate() {
                        if is_ref {
                            refs[bi] = RefState::Unavailable(dependent_status(
                                format!("no GPU fp32 reference: {what}: {e}"),
                                is_oom(&e),
                                !here.is_empty(),
                            ));
                        }
                        rows.extend(all_rows(n, &engine_status(&what, &e)));
                    }
                    continue;
                }
            };
            // the one-at-a-time rows' batch-1 Session, made at the first batch size over 1
            let mut single: Option<Single<'_>> = None;
            for (bi, &(n, seed)) in batches.iter().enumerate() {
                let x = uniform_f32(n * 3 * self.image * self.image, seed);
                let mut firsts = Vec::new();
                // a pair asked for only one image at a time needs no Session at batch n
                let batched = if here.is_empty() && !is_ref {
                    Vec::new()
                } else {
                    self.at_batch(
                        &weights,
                        &here,
                        is_ref,
                        n,
                        &x,
                        &mut refs[bi],
                        &mut fp32_eager[bi],
                        &mut firsts,
                        progress,
                    )
                };
                if n > 1 && !here_single.is_empty() {
                    let single = single.get_or_insert_with(|| {
                        progress(&format!(
                            "infer {} {} {} batch 1 (one image at a time): planning",
                            self.device,
                            precision.name(),
                            layout(nhwc)
                        ));
                        Single {
                            session: Session::new(
                                self.ctx, &weights, 1, self.image, self.image, true,
                            )
                            .map_err(|e| engine_status("preparing batch 1", &e)),
                            graph: None,
                        }
                    });
                    let image = &x[..3 * self.image * self.image];
                    let singles_rows = self.one_at_a_time(
                        single,
                        &here_single,
                        n,
                        image,
                        Checks {
                            firsts: &firsts,
                            reference: &refs[bi],
                            batched: &batched,
                            fp32_eager: fp32_eager[bi],
                        },
                        progress,
                    );
                    rows.extend(batched);
                    rows.extend(singles_rows);
                } else {
                    rows.extend(batched);
                }
            }
        }
        rows
    }

    /// The one-at-a-time rows of one (precision, layout) at batch `n` (over 1): `n` batch-1
    /// passes back to back (eager calls, or replays of the captured graph), timed together with
    /// CUDA events. Every pass runs on the batch's first image, uploaded once before the timed
    /// passes and resident on the GPU: the time is the engine's alone, no per-image upload.
    /// The last pass's logits are checked against the same strategy's batched logits of that
    /// image, or the batch's reference where the batched row did not pass.
    fn one_at_a_time(
        &self,
        single: &mut Single<'_>,
        strategies: &[Strategy],
        n: usize,
        image: &[f32],
        checks: Checks<'_>,
        progress: &mut dyn FnMut(&str),
    ) -> Vec<InferRow> {
        let classes = self.folded.num_classes;
        let mut rows = Vec::new();
        for &st in strategies {
            let name = InferStrategy::OneAtATime(st).name();
            let mut r = row(&name, &self.device, n);
            let tol = tolerance(st.precision);
            r.tolerance = Some(tol);
            let resident = "every timed pass runs on that one image, resident on the GPU";
            let (expected, label) = match checks.firsts.iter().find(|(s, _)| *s == st) {
                Some((_, l)) => (
                    l.as_slice(),
                    format!("{} at batch {n}, its first image ({resident})", st.name()),
                ),
                None => match checks.reference {
                    RefState::Ready(re) => (
                        &re.logits[..classes],
                        format!(
                            "{}, its first image; no passing batched {} row ({resident})",
                            re.label,
                            st.name()
                        ),
                    ),
                    RefState::Unavailable(status) => {
                        r.status = status.clone();
                        rows.push(r);
                        continue;
                    }
                },
            };
            let session = match &mut single.session {
                Ok(session) => session,
                Err(status) => {
                    r.status = status.clone();
                    rows.push(r);
                    continue;
                }
            };
            let mem = session.memory;
            r.gpu_memory = Some(mem);
            r.gpu_memory_bytes = Some(mem.total() as u64);
            if st.graph {
                let captured = single
                    .graph
                    .get_or_insert_with(|| session.capture().map_err(|e| e.to_string()));
                if let Err(e) = captured {
                    r.status = RowStatus::Failed(format!("capturing the CUDA graph: {e}"));
                    rows.push(r);
                    continue;
                }
            }
            if let Err(e) = session.set_input(image) {
                r.status = engine_status("uploading the image", &e);
                rows.push(r);
                continue;
            }
            progress(&format!(
                "infer {} {name} batch {n}: {n} batch-1 passes",
                self.device
            ));
            let plan = Plan::new(self.plan.warmup, one_at_a_time_reps(self.plan.reps, n));
            let session = &*session;
            let timed = time_device(&self.ctx.gpu.stream, plan, || -> Result<(), EngineError> {
                for _ in 0..n {
                    if st.graph {
                        session.replay()?;
                    } else {
                        session.enqueue()?;
                    }
                }
                Ok(())
            });
            let t = match timed {
                Ok(t) => t,
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    rows.push(r);
                    continue;
                }
            };
            let got = match session.logits() {
                Ok(l) => l,
                Err(e) => {
                    r.status = RowStatus::Failed(format!("reading the logits: {e}"));
                    rows.push(r);
                    continue;
                }
            };
            let a = agreement(&got, expected, classes);
            let judged = verdict(&got, &a, tol);
            r.agreement = Some(a);
            r.compared_with = Some(label);
            if let Err(why) = judged {
                r.status = RowStatus::Failed(why);
                rows.push(r);
                continue;
            }
            let rate = rate(n, &t);
            r.images_per_s = Some(rate);
            r.speedup_vs_fp32_eager = checks.fp32_eager.map(|f| rate / f);
            r.speedup_vs_reference = self.cpu_rates.get(&n).map(|c| rate / c);
            r.batching_gain = checks
                .batched
                .iter()
                .find(|b| b.strategy == st.name() && b.status == RowStatus::Ok)
                .and_then(|b| b.images_per_s)
                .map(|b| b / rate);
            r.timing = Some(t);
            rows.push(r);
        }
        rows
    }

    /// One (precision, layout) at one batch size: its Session, one verification pass, then
    /// each strategy timed (eager, then the captured graph) and its last pass's logits checked.
    /// For the reference pair it also sets the batch's reference. Each strategy that passes
    /// leaves its logits of the first image in `firsts`.
    #[allow(clippy::too_many_arguments)]
    fn at_batch(
        &self,
        weights: &GpuWeights,
        here: &[Strategy],
        is_ref: bool,
        n: usize,
        x: &[f32],
        reference: &mut RefState,
        fp32_eager: &mut Option<f64>,
        firsts: &mut Vec<(Strategy, Vec<f32>)>,
        progress: &mut dyn FnMut(&str),
    ) -> Vec<InferRow> {
        let s = self.image;
        let classes = self.folded.num_classes;
        let all = |status: RowStatus| -> Vec<InferRow> {
            here.iter()
                .map(|st| self.row(st, n, status.clone()))
                .collect()
        };
        let pair = format!("{} {}", weights.precision.name(), layout(weights.nhwc));
        if !is_ref {
            if let RefState::Unavailable(status) = &*reference {
                return all(status.clone());
            }
        }
        let fp32_rows = !here.is_empty();
        // the GPU reference's own check: gpukit's CPU forward on the first images
        let cpu_check = if is_ref {
            let k = n.min(CPU_CHECK_IMAGES);
            progress(&format!(
                "infer cpu: checking logits for {k} image(s) of batch {n}"
            ));
            Some(
                self.folded
                    .forward_cpu(&x[..k * 3 * s * s], k, s, s)
                    .map(|logits| Reference {
                        logits,
                        images: k,
                        label: format!(
                            "gpukit's f32 CPU forward (first {k} image(s) of the batch)"
                        ),
                    })
                    .map_err(|e| e.to_string()),
            )
        } else {
            None
        };
        progress(&format!(
            "infer {} {pair} batch {n}: planning (cuDNN algorithm search)",
            self.device
        ));
        let mut session = match Session::new(self.ctx, weights, n, s, s, true) {
            Ok(session) => session,
            Err(e) => {
                if let Some(check) = cpu_check {
                    *reference = match check {
                        // too big for fp32: smaller precisions may fit; check them on the CPU's
                        Ok(mut r) if is_oom(&e) => {
                            r.label.push_str(": the GPU fp32 reference did not fit");
                            RefState::Ready(r)
                        }
                        _ => RefState::Unavailable(dependent_status(
                            format!("the GPU fp32 reference could not run at batch {n}: {e}"),
                            is_oom(&e),
                            fp32_rows,
                        )),
                    };
                }
                return all(engine_status(&format!("preparing batch {n}"), &e));
            }
        };
        if std::env::var("GPUKIT_DEBUG_CLOBBER").is_ok_and(|v| v == "1") {
            // diagnostic (decision 22): which op, if any, changes a tensor it must not touch;
            // printed whether or not a person watches (it is asked for)
            let found = session.set_input(x).and_then(|_| session.find_clobbers());
            match found {
                Ok(lines) if lines.is_empty() => {
                    eprintln!("clobber check {pair} batch {n}: no op changed a live tensor")
                }
                Ok(lines) => {
                    for l in lines {
                        eprintln!("clobber check {pair} batch {n}: {l}");
                    }
                }
                Err(e) => eprintln!("clobber check {pair} batch {n} failed: {e}"),
            }
        }
        let first = match session.run(x) {
            Ok(l) => l,
            Err(e) => {
                if is_ref {
                    *reference = RefState::Unavailable(dependent_status(
                        format!("the GPU fp32 reference failed at batch {n}: {e}"),
                        is_oom(&e),
                        fp32_rows,
                    ));
                }
                return all(engine_status("the verification pass", &e));
            }
        };
        // the reference pair: its rows show the CPU check; the reference is its first pass
        let mut cpu_agreement = None;
        if let Some(check) = cpu_check {
            let cpu = match check {
                Ok(c) => c,
                Err(e) => {
                    *reference = RefState::Unavailable(dependent_status(
                        format!("gpukit's CPU forward: {e}"),
                        false,
                        fp32_rows,
                    ));
                    return all(RowStatus::Failed(format!("gpukit's CPU forward: {e}")));
                }
            };
            let a = agreement(&first[..cpu.images * classes], &cpu.logits, classes);
            if let Err(why) = verdict(&first, &a, tolerance(Precision::F32)) {
                *reference = RefState::Unavailable(dependent_status(
                    format!("the GPU fp32 logits differ from gpukit's CPU forward ({why})"),
                    false,
                    fp32_rows,
                ));
                let mut rows = all(RowStatus::Failed(format!(
                    "against gpukit's CPU forward: {why}"
                )));
                for r in &mut rows {
                    r.agreement = Some(a.clone());
                    r.compared_with = Some(cpu.label.clone());
                    r.tolerance = Some(tolerance(Precision::F32));
                }
                return rows;
            }
            cpu_agreement = Some((a, cpu.label));
            *reference = RefState::Ready(Reference {
                logits: first,
                images: n,
                label: "gpukit's GPU fp32 eager logits (whole batch)".into(),
            });
        }
        let RefState::Ready(reference) = &*reference else {
            return all(RowStatus::Skipped("no reference to verify against".into()));
        };
        let tol = tolerance(weights.precision);
        let mem = session.memory;
        let mut rows = Vec::new();
        let mut captured = false;
        for st in here {
            let mut r = self.row(st, n, RowStatus::Ok);
            r.gpu_memory = Some(mem);
            r.gpu_memory_bytes = Some(mem.total() as u64);
            r.tolerance = Some(tol);
            if st.graph && !captured {
                if let Err(e) = session.capture() {
                    r.status = RowStatus::Failed(format!("capturing the CUDA graph: {e}"));
                    rows.push(r);
                    continue;
                }
                captured = true;
            }
            progress(&format!("infer {} {} batch {n}", self.device, st.name()));
            let stream = &self.ctx.gpu.stream;
            let timed = if st.graph {
                time_device(stream, self.plan, || session.replay())
            } else {
                time_device(stream, self.plan, || session.enqueue())
            };
            let t = match timed {
                Ok(t) => t,
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    rows.push(r);
                    continue;
                }
            };
            // the last timed pass's logits (same input as the verification pass)
            let got = match session.logits() {
                Ok(l) => l,
                Err(e) => {
                    r.status = RowStatus::Failed(format!("reading the logits: {e}"));
                    rows.push(r);
                    continue;
                }
            };
            let a = agreement(
                &got[..reference.images * classes],
                &reference.logits,
                classes,
            );
            let judged = verdict(&got, &a, tol);
            match &cpu_agreement {
                // fp32 NCHW: the timed passes must repeat the verified one; the CPU check shows
                Some((cpu, label)) => {
                    r.agreement = Some(cpu.clone());
                    r.compared_with = Some(label.clone());
                    if let Err(why) = judged {
                        r.status = RowStatus::Failed(format!(
                            "the timed passes differ from the verified one: {why}"
                        ));
                    }
                }
                None => {
                    r.agreement = Some(a);
                    r.compared_with = Some(reference.label.clone());
                    if let Err(why) = judged {
                        r.status = RowStatus::Failed(why);
                    }
                }
            }
            if r.status == RowStatus::Ok {
                firsts.push((*st, got[..classes].to_vec()));
                let rate = rate(n, &t);
                if is_ref && !st.graph {
                    *fp32_eager = Some(rate);
                }
                r.images_per_s = Some(rate);
                r.speedup_vs_fp32_eager = fp32_eager.map(|f| rate / f);
                r.speedup_vs_reference = self.cpu_rates.get(&n).map(|c| rate / c);
                r.timing = Some(t);
            }
            rows.push(r);
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Summary;

    #[test]
    fn agreement_counts_top1_and_errors() {
        let reference = [1.0, 2.0, 3.0, 0.5, 0.1, 0.0];
        let a = agreement(&reference, &reference, 3);
        assert_eq!((a.max_abs, a.top1), (0.0, 1.0));
        let other = [1.0, 2.0, 3.0, 0.0, 0.6, 0.0];
        let b = agreement(&other, &reference, 3);
        assert_eq!(b.top1, 0.5);
        assert!((b.max_abs - 0.5).abs() < 1e-6);
        assert!((b.max_rel - 0.5 / 3.0).abs() < 1e-6);
        let nan = [f32::NAN; 6];
        assert!(agreement(&nan, &reference, 3).max_abs.is_infinite());
    }

    #[test]
    fn strategies_parse_by_name_and_say_what_is_wrong() {
        assert_eq!(InferStrategy::parse("cpu"), Ok(InferStrategy::Cpu));
        assert_eq!(
            InferStrategy::parse(" ORT "),
            Ok(InferStrategy::OnnxRuntime)
        );
        assert_eq!(
            InferStrategy::parse("onnxruntime"),
            Ok(InferStrategy::OnnxRuntime)
        );
        assert_eq!(
            InferStrategy::parse("FP16-nhwc-graph"),
            Ok(InferStrategy::Gpu(Strategy {
                precision: Precision::F16,
                nhwc: true,
                graph: true
            }))
        );
        for bad in ["fp8", "fp16-fast", "", "gpu"] {
            let e = InferStrategy::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("onnxruntime"), "{e}");
        }
        let names: Vec<String> = InferStrategy::defaults()
            .iter()
            .map(InferStrategy::name)
            .collect();
        assert_eq!(names.len(), 15);
        assert_eq!(names[..3], ["cpu", "onnxruntime", "fp32"]);
        assert_eq!(names[14], "fp16-nhwc-graph-one-at-a-time");
        for s in InferStrategy::defaults() {
            assert_eq!(InferStrategy::parse(&s.name()), Ok(s));
        }
    }

    #[test]
    fn one_at_a_time_strategies_parse_and_run_on_the_gpu() {
        let s = |t: &str| Strategy::parse(t).unwrap();
        assert_eq!(
            InferStrategy::parse("FP16-NHWC-graph-one-at-a-time"),
            Ok(InferStrategy::OneAtATime(s("fp16-nhwc-graph")))
        );
        assert_eq!(
            InferStrategy::parse("fp32-one-at-a-time"),
            Ok(InferStrategy::OneAtATime(s("fp32")))
        );
        assert_eq!(
            InferStrategy::OneAtATime(s("bf16-nhwc")).name(),
            "bf16-nhwc-one-at-a-time"
        );
        assert_eq!(
            InferStrategy::default_one_at_a_time(),
            InferStrategy::OneAtATime(s("fp16-nhwc-graph"))
        );
        for bad in [
            "one-at-a-time",
            "cpu-one-at-a-time",
            "fp16-one-at-a-time-graph",
            "fp16-one-at-a-time-one-at-a-time",
        ] {
            let e = InferStrategy::parse(bad).unwrap_err();
            assert!(e.contains("-one-at-a-time]"), "{bad}: {e}");
        }
        let single = InferStrategy::parse("fp16-one-at-a-time").unwrap();
        assert!(!single.on_cpu());
        let cpu = DeviceSelection::One(Device::Cpu);
        let e = select_strategies(Some(&[single]), cpu).unwrap_err();
        assert!(
            e.contains("fp16-one-at-a-time") && e.contains("a GPU"),
            "{e}"
        );
        // the batched strategy and the same one at a time are two rows
        let batched = InferStrategy::parse("fp16").unwrap();
        assert_eq!(
            select_strategies(Some(&[batched, single, single]), DeviceSelection::All).unwrap(),
            vec![batched, single]
        );
    }

    #[test]
    fn one_at_a_time_reps_bound_the_passes() {
        assert_eq!(one_at_a_time_reps(50, 2), 50);
        assert_eq!(one_at_a_time_reps(50, 32), 50);
        assert_eq!(one_at_a_time_reps(50, 128), 32);
        assert_eq!(one_at_a_time_reps(50, 4096), ONE_AT_A_TIME_MIN_REPS);
        assert_eq!(one_at_a_time_reps(3, 4096), 3, "never more than asked");
        assert_eq!(one_at_a_time_reps(1, 0), 1);
    }

    #[test]
    fn the_tensorrt_line_says_whether_libnvinfer_is_there() {
        let absent = tensorrt_status(None);
        assert_eq!(
            absent,
            "unavailable: libnvinfer not found (install TensorRT, e.g. pip install tensorrt, to compare)"
        );
        let found = tensorrt_status(Some(Path::new(
            "/venv/site-packages/tensorrt_libs/libnvinfer.so.10",
        )));
        assert_eq!(
            found,
            "libnvinfer found at /venv/site-packages/tensorrt_libs/libnvinfer.so.10; gpukit has no TensorRT strategy yet"
        );
    }

    #[test]
    fn the_device_narrows_the_strategies() {
        let cpu = DeviceSelection::One(Device::Cpu);
        let gpu = DeviceSelection::One(Device::Cuda(0));
        let all = DeviceSelection::All;
        assert_eq!(select_strategies(None, all).unwrap().len(), 15);
        assert_eq!(
            select_strategies(None, cpu).unwrap(),
            vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime]
        );
        assert_eq!(select_strategies(None, gpu).unwrap().len(), 13);
        let fp16 = InferStrategy::parse("fp16").unwrap();
        let req = [fp16, InferStrategy::Cpu, fp16];
        assert_eq!(
            select_strategies(Some(&req), all).unwrap(),
            vec![fp16, InferStrategy::Cpu],
            "duplicates dropped, order kept"
        );
        let e = select_strategies(Some(&req), cpu).unwrap_err();
        assert!(e.contains("fp16") && e.contains("--device cpu"), "{e}");
        let e = select_strategies(Some(&[InferStrategy::OnnxRuntime]), gpu).unwrap_err();
        assert!(e.contains("onnxruntime") && e.contains("cuda:0"), "{e}");
    }

    #[test]
    fn tolerances_and_verdicts() {
        assert_eq!(tolerance(Precision::F32), 1e-4);
        assert_eq!(tolerance(Precision::Tf32), 1e-2);
        assert_eq!(tolerance(Precision::F16), 1e-2);
        assert_eq!(tolerance(Precision::Bf16), 5e-2);
        let reference = [1.0f32, 2.0, 3.0, 4.0];
        let close = [1.0f32, 2.0, 3.0, 4.01];
        let a = agreement(&close, &reference, 2);
        assert!(verdict(&close, &a, 1e-2).is_ok());
        let e = verdict(&close, &a, 1e-4).unwrap_err();
        assert!(e.contains("2.5e-3") && e.contains("1e-4"), "{e}");
        let inf = [1.0f32, f32::INFINITY, 3.0, 4.0];
        let a = agreement(&inf, &reference, 2);
        assert!(verdict(&inf, &a, 1.0).unwrap_err().contains("not finite"));
        let nan_rel = Agreement {
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            top1: 1.0,
        };
        assert!(verdict(&reference, &nan_rel, 1.0).is_err());
    }

    fn timed(strategy: &str, device: &str, batch: usize, rate: Option<f64>) -> InferRow {
        let mut r = row(strategy, device, batch);
        r.images_per_s = rate;
        r.timing = rate.map(|x| Measurement {
            clock: crate::harness::Clock::CudaEvents,
            warmup: 3,
            reps_planned: 5,
            summary_ms: Summary::of(&[batch as f64 / x * 1e3]).unwrap(),
        });
        r
    }

    #[test]
    fn rows_sort_by_batch_then_cpu_then_asked_order() {
        let mut rows = vec![
            timed("fp16-graph", "cuda:0", 1, Some(3.0)),
            timed("fp32", "cuda:0", 8, Some(1.0)),
            timed(ORT_ROW, "cpu", 8, Some(1.0)),
            timed("fp32", "cuda:0", 1, Some(1.0)),
            timed(CPU_ROW, "cpu", 1, Some(1.0)),
            timed(CPU_ROW, "cpu", 8, Some(1.0)),
        ];
        sort_rows(&mut rows, &["fp32".into(), "fp16-graph".into()]);
        let got: Vec<(usize, &str)> = rows
            .iter()
            .map(|r| (r.batch, r.strategy.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, CPU_ROW),
                (1, "fp32"),
                (1, "fp16-graph"),
                (8, ORT_ROW),
                (8, CPU_ROW),
                (8, "fp32"),
            ]
        );
    }

    #[test]
    fn one_at_a_time_rows_sort_where_they_were_asked() {
        let mut rows = vec![
            timed("fp16-nhwc-graph-one-at-a-time", "cuda:0", 8, Some(1.0)),
            timed("fp16-nhwc-graph", "cuda:0", 8, Some(1.0)),
            timed("fp32", "cuda:0", 8, Some(1.0)),
            timed(CPU_ROW, "cpu", 8, Some(1.0)),
            timed("fp16-nhwc-graph", "cuda:0", 1, Some(1.0)),
        ];
        let order: Vec<String> = InferStrategy::defaults()
            .iter()
            .filter(|s| !s.on_cpu())
            .map(InferStrategy::name)
            .collect();
        sort_rows(&mut rows, &order);
        let got: Vec<(usize, &str)> = rows
            .iter()
            .map(|r| (r.batch, r.strategy.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, "fp16-nhwc-graph"),
                (8, CPU_ROW),
                (8, "fp32"),
                (8, "fp16-nhwc-graph"),
                (8, "fp16-nhwc-graph-one-at-a-time"),
            ]
        );
        assert!(is_one_at_a_time(&rows[4]));
        assert!(!is_one_at_a_time(&rows[3]) && !is_one_at_a_time(&rows[1]));
    }

    #[test]
    fn best_rows_are_the_fastest_passing_gpu_row_per_batch() {
        let mut failed = timed("bf16-nhwc", "cuda:0", 1, Some(99.0));
        failed.status = RowStatus::Failed("wrong".into());
        let rows = vec![
            timed(CPU_ROW, "cpu", 1, Some(50.0)),
            timed("fp32", "cuda:0", 1, Some(10.0)),
            timed("fp16-nhwc-graph", "cuda:0", 1, Some(30.0)),
            failed,
            timed("fp16", "cuda:0", 1, Some(20.0)),
            timed("fp32", "cuda:0", 32, Some(100.0)),
            // never the best: it shows the batch without batching
            timed("fp32-one-at-a-time", "cuda:0", 32, Some(1000.0)),
            timed(CPU_ROW, "cpu", 64, Some(1.0)),
        ];
        let best: Vec<(usize, &str)> = best_gpu_rows(&rows)
            .iter()
            .map(|r| (r.batch, r.strategy.as_str()))
            .collect();
        assert_eq!(best, vec![(1, "fp16-nhwc-graph"), (32, "fp32")]);
    }

    fn report(rows: Vec<InferRow>) -> InferReport {
        InferReport {
            model: "resnet18".into(),
            parameters: 1,
            weights: "seeded".into(),
            image_size: 224,
            cpu_threads: 1,
            rows,
            onnxruntime_unavailable: None,
            gpu_device: Some("cuda:0 Test GPU".into()),
            gpu_unavailable: None,
            pytorch: None,
            tensorrt: None,
        }
    }

    #[test]
    fn gpu_rows_that_all_ran_out_of_memory_are_a_failure() {
        let mut oom = timed("fp16", "cuda:0", 4096, None);
        oom.status = RowStatus::Skipped("preparing batch 4096: out of GPU memory".into());
        let cpu = timed(CPU_ROW, "cpu", 4096, Some(1.0));
        let why = gpu_rows_without_figure(&report(vec![cpu.clone(), oom.clone()])).unwrap();
        assert!(
            why.contains("fp16 at batch 4096") && why.contains("out of GPU memory"),
            "{why}"
        );
        assert!(gpu_rows_without_figure(&report(vec![cpu.clone()])).is_none());
        let ok = timed("fp16", "cuda:0", 1, Some(5.0));
        assert!(gpu_rows_without_figure(&report(vec![cpu, oom, ok])).is_none());
    }

    #[test]
    fn reports_without_the_gpu_fields_still_read() {
        let old = r#"{"model":"resnet50","parameters":25557032,"weights":"seeded","image_size":224,
            "cpu_threads":2,"onnxruntime_unavailable":null,"rows":[{"strategy":"gpukit f32 (folded BN, im2col+gemm)",
            "device":"cpu","batch":1,"status":{"status":"ok"},"timing":null,"images_per_s":3.5,
            "speedup_vs_reference":1.0,"agreement":null}]}"#;
        let r: InferReport = serde_json::from_str(old).unwrap();
        assert_eq!(r.rows[0].images_per_s, Some(3.5));
        assert!(r.gpu_device.is_none() && r.rows[0].gpu_memory_bytes.is_none());
        assert!(r.tensorrt.is_none() && r.rows[0].batching_gain.is_none());
        // and the new shape round-trips
        let mut g = timed("fp16-nhwc-graph", "cuda:0", 32, Some(1000.0));
        g.gpu_memory_bytes = Some(123);
        g.speedup_vs_fp32_eager = Some(3.0);
        g.batching_gain = Some(7.5);
        let mut rep = report(vec![g]);
        rep.tensorrt = Some(tensorrt_status(None));
        let text = serde_json::to_string(&rep).unwrap();
        let back: InferReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back.rows[0].gpu_memory_bytes, Some(123));
        assert_eq!(back.rows[0].speedup_vs_fp32_eager, Some(3.0));
        assert_eq!(back.rows[0].batching_gain, Some(7.5));
        assert_eq!(back.tensorrt, rep.tensorrt);
    }

    #[test]
    fn rows_without_a_reference_fail_only_when_nothing_else_says_why() {
        let why = || "the GPU fp32 logits differ".to_string();
        assert!(
            matches!(dependent_status(why(), false, false), RowStatus::Failed(w) if w.contains("not verifiable"))
        );
        assert!(matches!(
            dependent_status(why(), false, true),
            RowStatus::Skipped(_)
        ));
        assert!(matches!(
            dependent_status(why(), true, false),
            RowStatus::Skipped(_)
        ));
        let oom = EngineError::OutOfMemory {
            what: "activation arena".into(),
            requested_mib: 10.0,
            free_mib: 1.0,
            total_mib: 80.0,
            reserved_mib: 0.0,
            limit_mib: None,
        };
        assert!(is_oom(&oom));
        assert!(is_oom(&EngineError::Invalid(
            "CUDNN_STATUS_ALLOC_FAILED".into()
        )));
        assert!(!is_oom(&EngineError::Invalid(
            "batch size must be at least 1".into()
        )));
        assert!(
            matches!(engine_status("preparing batch 8", &oom), RowStatus::Skipped(w) if w.contains("10.0 MiB"))
        );
    }

    #[test]
    fn upload_pairs_start_with_the_reference() {
        let s = |t: &str| Strategy::parse(t).unwrap();
        assert_eq!(
            pairs(&[s("fp16-nhwc-graph"), s("fp16-nhwc"), s("tf32")]),
            vec![
                (Precision::F32, false),
                (Precision::F16, true),
                (Precision::Tf32, false)
            ]
        );
        assert_eq!(pairs(&[s("fp32-graph")]), vec![(Precision::F32, false)]);
        assert_eq!(pairs(&[]), vec![(Precision::F32, false)]);
    }

    #[test]
    fn cpu_inference_runs_and_ort_rows_agree_where_present() {
        let mut opts = InferOptions::cpu_only(ResNet::R18, vec![1, 2]);
        opts.iterations = 2;
        opts.image_size = 48;
        opts.budget_s = 5.0;
        let r = run_infer(&gpukit_cuda::loader::discover(), &opts, &mut |_| {}).unwrap();
        let gpukit_rows: Vec<_> = r
            .rows
            .iter()
            .filter(|x| x.strategy.starts_with("gpukit"))
            .collect();
        assert_eq!(gpukit_rows.len(), 2);
        assert!(gpukit_rows.iter().all(|x| x.images_per_s.unwrap() > 0.0));
        for ort in r.rows.iter().filter(|x| x.strategy.starts_with("ONNX")) {
            assert_eq!(ort.status, RowStatus::Ok, "{ort:?}");
            assert!(ort.agreement.as_ref().unwrap().top1 == 1.0);
        }
        assert_eq!(r.parameters, 11_689_512);
        assert!(r.rows.iter().all(|x| !is_gpu_row(x)));
        assert!(
            r.gpu_unavailable.is_none(),
            "the CPU selection opens no GPU"
        );
        assert!(r.tensorrt.is_none(), "no GPU strategy, no TensorRT line");
    }

    #[test]
    fn ort_alone_is_checked_against_an_untimed_reference() {
        let mut opts = InferOptions::cpu_only(ResNet::R18, vec![1]);
        opts.iterations = 1;
        opts.image_size = 32;
        opts.strategies = vec![InferStrategy::OnnxRuntime];
        let r = run_infer(&gpukit_cuda::loader::discover(), &opts, &mut |_| {}).unwrap();
        assert!(r.rows.iter().all(|x| x.strategy == ORT_ROW), "{:?}", r.rows);
        match &r.onnxruntime_unavailable {
            Some(_) => assert!(r.rows.is_empty()),
            None => {
                assert_eq!(r.rows.len(), 1);
                assert_eq!(r.rows[0].status, RowStatus::Ok, "{:?}", r.rows[0]);
                assert_eq!(r.rows[0].speedup_vs_reference, None);
            }
        }
    }
}
