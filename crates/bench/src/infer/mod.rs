//! `infer`: ResNet inference per batch size, on the CPU and on a GPU, every row's logits checked.
//!
//! - CPU: gpukit's own forward pass (batch norm folded, im2col + gemm), the CPU reference, and
//!   ONNX Runtime's CPU provider running the same weights, checked against it.
//! - GPU: gpukit's engine ([`gpukit_models::gpu`]) in each requested [`Strategy`] (dtype x
//!   layout x eager or CUDA graph), timed with CUDA events. The fp32 NCHW eager logits are the GPU
//!   reference: they are checked against gpukit's CPU forward on the first images of the batch,
//!   then every other strategy is compared with them on the whole batch ([`tolerance`]).
//!
//! - One image at a time ([`InferStrategy::OneAtATime`]): at a batch size N > 1, a strategy's
//!   N images as N batch-1 passes back to back, against the same strategy's one pass over the
//!   batch ([`InferRow::batching_gain`]).
//!
//! Every strategy at one batch size sees the same random input. Weights are uploaded once per
//! (dtype, layout) and kept across batch sizes; each batch size gets its own [`Session`],
//! dropped before the next (the one-at-a-time rows' batch-1 Session is kept across batch sizes).
//!
//! TensorRT is not run; the report only says whether its library is there ([`tensorrt_status`]).

//!
//! The parts: [`report`] (the rows), `cpu` and `gpu` (the rows of each side), [`peer`] (PyTorch
//! beside), [`io`] (a user's own input) and [`onnx`] (a user's own ONNX model, `--onnx`). What
//! `--strategies` names is the workload layer's ([`crate::workload::strategy`]), how logits are
//! judged the harness's ([`crate::accuracy`]).

mod part;
pub use part::{InferPart, PART};
mod cpu;
mod gpu;
pub mod io;
pub mod onnx;
pub mod peer;
pub mod report;
#[cfg(test)]
mod tests;

pub use crate::accuracy::{agreement, tolerance, verdict, Agreement};
pub use crate::workload::strategy::{
    check_batches, select_strategies, InferStrategy, CPU_CHECK_IMAGES, CPU_ROW, GPU_WARMUP,
    ONE_AT_A_TIME, ONE_AT_A_TIME_MAX_PASSES, ONE_AT_A_TIME_MIN_REPS, ORT_ROW,
};
pub use report::{
    best_gpu_rows, gpu_rows_without_figure, is_gpu_row, is_one_at_a_time, one_at_a_time_reps, row,
    sort_rows, tensorrt_status, Float64Check, InferReport, InferRow, Planning,
};

use crate::error::{Error, Result};
use crate::measure::Plan;
use crate::power::PowerMeter;
use crate::random::fresh_seed;
use crate::report::{judge_rows, Document, RowStatus};
use crate::workload::strategy::{gpu_ordinal, runs_on};
use cpu::cpu_rows;
use gpu::GpuRun;
use gpukit_cuda::loader::{find_extra_library, Discovery};
use gpukit_models::forward::{fold, FoldedResNet};
use gpukit_models::gpu::{GpuContext, Strategy};
use gpukit_models::onnx::export_resnet;
use gpukit_models::ort_runner::{find_onnxruntime, OrtModel};
use gpukit_models::weights::{load_safetensors, seeded_init};
use gpukit_models::ResNet;
use gpukit_tensor::{Device, DeviceSelection};
use report::sort_rows_as_asked;
use std::collections::BTreeMap;
use std::path::PathBuf;

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
    /// How thoroughly each convolution's way to run is searched for.
    pub search: gpukit_cuda::dnn::Search,
    /// How far each precision's logits may be from the GPU fp32 reference: [`tolerance`] for
    /// gpukit's own models, [`crate::accuracy::graph_tolerance`] for a user's graph.
    pub tolerance: fn(gpukit_tensor::DType) -> f64,
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
            search: gpukit_cuda::dnn::Search::Fast,
            tolerance,
        }
    }
}

/// `--compare-pytorch`: the same model, weights and batch sizes through PyTorch
/// (scripts/pytorch_reference.py); see [`peer`].
pub fn compare_with_pytorch(report: &mut InferReport, opts: &InferOptions) -> Result<String> {
    peer::compare(report, opts)
}

/// The JSON document of `gpukit infer`: the report, PyTorch's outcome and the verdict (a failed
/// row, nothing measured, or GPU rows asked for that all ran into limits).
pub fn document(report: InferReport, peer: Option<&Result<String>>) -> Document<InferReport> {
    let failure = judge_rows(report.rows.iter().map(|r| &r.status))
        .or_else(|| gpu_rows_without_figure(&report));
    Document::new("infer", report, failure).with_peer(peer)
}

/// Why `gpukit infer` cannot report at all: a GPU named on the command line that cannot be
/// used, or no strategy that could run.
pub fn unusable(report: &InferReport, selection: DeviceSelection) -> Option<Error> {
    if let (Some(n), Some(why)) = (selection.named_cuda(), &report.gpu_unavailable) {
        return Some(Error::Unavailable(format!(
            "infer on cuda:{n} cannot run: {why}"
        )));
    }
    if report.rows.is_empty() {
        let why: Vec<String> = [
            report.gpu_unavailable.as_ref().map(|w| format!("GPU: {w}")),
            report
                .onnxruntime_unavailable
                .as_ref()
                .map(|w| format!("ONNX Runtime: {w}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let why = if why.is_empty() {
            "no strategy has a row at these batch sizes".to_string()
        } else {
            why.join("; ")
        };
        return Some(Error::Unavailable(format!("no strategy could run: {why}")));
    }
    None
}

/// Runs every requested strategy at every batch size: the CPU rows, then the GPU rows. The GPU
/// is opened while the weights are made on another thread.
pub fn run_infer(
    discovery: &Discovery,
    opts: &InferOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<InferReport> {
    if opts.image_size < 32 {
        return Err(Error::BadInput(format!(
            "--image-size {} is too small: ResNet needs at least 32",
            opts.image_size
        )));
    }
    let on_gpu = opts.strategies.iter().any(|s| {
        runs_on(s, opts.selection)
            && matches!(s, InferStrategy::Gpu(_) | InferStrategy::OneAtATime(_))
    });
    std::thread::scope(|scope| {
        let made = scope.spawn(|| -> Result<(FoldedResNet, String)> {
            let t = gpukit_cuda::trace::start();
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
            gpukit_cuda::trace::done("infer: weights", t);
            let t = gpukit_cuda::trace::start();
            let folded = fold(&dict)?;
            gpukit_cuda::trace::done("infer: batch norm folded", t);
            Ok((folded, weights))
        });
        let ctx = match (on_gpu, gpu_ordinal(opts.selection)) {
            (true, Some(ordinal)) => {
                progress(&format!("infer cuda:{ordinal}: opening the GPU"));
                Some((ordinal, GpuContext::open(discovery, ordinal)))
            }
            _ => None,
        };
        let (folded, weights) = made
            .join()
            .map_err(|_| Error::Failed("making the weights stopped".into()))??;
        run_with(discovery, opts, (&folded, weights), ctx, progress)
    })
}

/// [`run_infer`]'s GPU rows for a model already folded (an imported graph read back as a ResNet,
/// say): the GPU is opened here, `opts.model` and `opts.weights` are not read.
pub(crate) fn run_on_folded(
    discovery: &Discovery,
    opts: &InferOptions,
    (folded, weights): (&FoldedResNet, String),
    progress: &mut dyn FnMut(&str),
) -> Result<InferReport> {
    let ctx = gpu_ordinal(opts.selection).map(|ordinal| {
        progress(&format!("infer cuda:{ordinal}: opening the GPU"));
        (ordinal, GpuContext::open(discovery, ordinal))
    });
    run_with(discovery, opts, (folded, weights), ctx, progress)
}

/// [`run_infer`] once the weights are made and the GPU (when one runs) is open.
fn run_with(
    discovery: &Discovery,
    opts: &InferOptions,
    (folded, weights): (&FoldedResNet, String),
    ctx: Option<(usize, gpukit_models::Result<GpuContext>)>,
    progress: &mut dyn FnMut(&str),
) -> Result<InferReport> {
    let classes = folded.num_classes;
    let mut report = InferReport {
        model: opts.model.name().to_string(),
        parameters: opts.model.parameter_count(classes),
        weights,
        image_size: opts.image_size,
        cpu_threads: gpukit_tensor::cpu::threads(),
        cpu_kernel: gpukit_tensor::cpu::conv_kernel_name().to_string(),
        rows: Vec::new(),
        onnxruntime_unavailable: None,
        gpu_device: None,
        gpu_unavailable: None,
        pytorch: None,
        tensorrt: None,
        planning: Vec::new(),
        cache_note: None,
    };
    let wanted: Vec<InferStrategy> = opts
        .strategies
        .iter()
        .copied()
        .filter(|s| runs_on(s, opts.selection))
        .collect();
    // one input per batch size, shared by every strategy (regenerated from its seed when needed)
    let mut batches: Vec<(usize, u64)> = Vec::new();
    for &n in &opts.batch_sizes {
        // the input and two copies of it on the host, whatever runs it
        let s = opts.image_size as u64;
        let input = (n as u64)
            .checked_mul(3 * 4)
            .and_then(|b| b.checked_mul(s)?.checked_mul(s)?.checked_mul(3));
        let guard = gpukit_types::resources::Need::host(format!("batch {n} of {s}x{s} images"))
            .with("the input and two copies", input)
            .check_host("lower --batch-sizes or --image-size");
        match guard {
            Ok(()) => batches.push((n, fresh_seed())),
            Err(refused) => report.rows.extend(wanted.iter().map(|st| {
                let (name, device) = match st {
                    InferStrategy::Cpu => (CPU_ROW.to_string(), "cpu".to_string()),
                    InferStrategy::OnnxRuntime => (ORT_ROW.to_string(), "cpu".to_string()),
                    gpu => (
                        gpu.name(),
                        gpu_ordinal(opts.selection).map_or("cuda".into(), |o| format!("cuda:{o}")),
                    ),
                };
                let mut r = row(&name, &device, n);
                r.status = RowStatus::Skipped(refused.to_string());
                r
            })),
        }
    }

    let want_cpu = wanted.contains(&InferStrategy::Cpu);
    let mut ort = if wanted.contains(&InferStrategy::OnnxRuntime) {
        match find_onnxruntime().and_then(|lib| {
            OrtModel::new(&lib, &export_resnet(folded), gpukit_tensor::cpu::threads())
        }) {
            Ok(m) => Some(m),
            Err(e) => {
                report.onnxruntime_unavailable = Some(e.to_string());
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
            folded,
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
        let t = gpukit_cuda::trace::start();
        report.tensorrt = Some(tensorrt_status(
            find_extra_library(discovery, "nvinfer").as_deref(),
        ));
        gpukit_cuda::trace::done("infer: TensorRT looked for", t);
    }
    if let (true, Some((ordinal, opened))) = (any_gpu, ctx) {
        match opened {
            Ok(ctx) => {
                let (name, compute_capability) = gpu_name(discovery, ordinal);
                report.gpu_device = Some(name);
                let cpu_rates: BTreeMap<usize, f64> = report
                    .rows
                    .iter()
                    .filter(|r| r.strategy == CPU_ROW && r.status == RowStatus::Ok)
                    .filter_map(|r| Some((r.batch, r.images_per_s?)))
                    .collect();
                ctx.dnn.set_search(opts.search);
                precompile_ahead(&ctx, folded, opts, &gpu, &singles, &batches);
                let run = GpuRun {
                    ctx: &ctx,
                    folded,
                    device: format!("cuda:{ordinal}"),
                    image: opts.image_size,
                    plan: Plan::new(GPU_WARMUP, opts.gpu_iterations),
                    cpu_rates,
                    compute_capability,
                    meter: PowerMeter::for_ordinal(discovery, ordinal),
                    planning: Default::default(),
                    tolerance: opts.tolerance,
                };
                let rows = run.rows(&gpu, &singles, &batches, progress);
                report.rows.extend(rows);
                report.planning = run.planning.take();
                report.cache_note = ctx.dnn.cache_note();
            }
            Err(e) => report.gpu_unavailable = Some(e.to_string()),
        }
    }
    sort_rows_as_asked(&mut report.rows, &wanted);
    Ok(report)
}

/// `cuda:0 NVIDIA H100 80GB HBM3` (just `cuda:0` if the driver does not say), and the
/// compute capability.
pub(crate) fn gpu_name(discovery: &Discovery, ordinal: usize) -> (String, Option<(u32, u32)>) {
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

/// Starts cuDNN's helper threads on every operation graph the GPU rows will plan, before the
/// first session is prepared: the engines that compile at run time are then compiling while
/// the reference is made and the first convolutions are timed. The CPU rows have run by then
/// (the helpers would take their cores).
fn precompile_ahead(
    ctx: &GpuContext,
    folded: &FoldedResNet,
    opts: &InferOptions,
    gpu: &[Strategy],
    singles: &[Strategy],
    batches: &[(usize, u64)],
) {
    let s = opts.image_size;
    let all: Vec<Strategy> = gpu.iter().chain(singles).copied().collect();
    let mut specs = Vec::new();
    // in the order the rows prepare their sessions; the reference pair only where it has rows
    // (alone it is planned from the heuristic's first suggestion, compiling nothing)
    for (dtype, layout) in gpu::pairs(&all) {
        if !all
            .iter()
            .any(|st| (st.dtype, st.layout) == (dtype, layout))
        {
            continue;
        }
        let Ok(net) = gpukit_models::gpu::NetShape::of(folded, dtype, layout) else {
            continue;
        };
        for &(n, _) in batches {
            if let Ok(more) = gpukit_models::gpu::graph_specs(&net, n, s, s) {
                specs.extend(more);
            }
        }
    }
    ctx.dnn.precompile(&specs, true);
}
