//! `infer --onnx FILE`: a user's own ONNX model (torch.onnx.export's, say) on the CPU, as
//! trtexec reports one: what the model is, what gpukit's passes did to it, then per batch size
//! gpukit's graph interpreter and ONNX Runtime's CPU provider, timed alike, gpukit's outputs
//! checked against ONNX Runtime's on the same random input.
//!
//! To use:
//! 1. pick the rows with [`onnx_strategies`] (cpu and onnxruntime unless others are named);
//! 2. `run_onnx(&OnnxOptions { file, .. }, progress)` reads the file once, imports it at each
//!    batch size, optimizes and runs it; [`document`] judges the rows;
//! 3. [`describe`] alone gives the model part of the report (no timing).
//!
//! The parts: `model` (the file checked, imported and optimized at a batch size, described),
//! `rows` (the rows at one batch size and the checks), `gpu` and `general` (the GPU rows), and
//! [`peer`] with [`torchvision`] (`--compare-pytorch --torchvision NAME`: PyTorch's NAME beside,
//! checked to be the file's model).
//!
//! Rows:
//! - [`GRAPH_CPU_ROW`]: `gpukit_models::graph::forward_cpu_exact` on the optimized graph, f32,
//!   with the convolutions the accuracy budget picks summed in f64 (`exact_convolutions`). It
//!   fails when any output differs from ONNX Runtime's by more than [`TOLERANCE`] (max |diff|
//!   over max |ONNX Runtime's|, [`crate::accuracy::agreement`]).
//! - [`ORT_ROW`](crate::workload::strategy::ORT_ROW): ONNX Runtime on the file's bytes as they are (its path where the weights
//!   are in external data files), the reference.
//! - GPU strategies: every graph runs on the general engine (`gpukit_models::gpu::program`).
//!   fp32 rows are judged against float64 outputs on the same input (the optimized graph run
//!   in f64 by `gpukit_models::graph::forward_cpu_f64`, once a batch size): they pass within
//!   [`float64_tolerance`], the larger of [`TOLERANCE`] and ONNX Runtime f32's own distance
//!   from float64 ([`Float64Reference`]), since on a deep model f32 itself lands farther than
//!   1e-5 (ResNet-50: 1.5e-5). Every other precision's outputs are checked against ONNX
//!   Runtime's on the same input (the interpreter's where ONNX Runtime is missing), within
//!   [`general_tolerance`], and fp32 rows show that agreement too. With
//!   [`OnnxOptions::resnet_engine`], a model of torchvision's ResNet family (read back from the
//!   optimized graph by `gpukit_models::graph::recognize::as_resnet`, and checked equal to the
//!   graph on the CPU) runs on gpukit's hand-built ResNet engine with every check `infer`
//!   makes, judged by the same tolerances. Without a GPU discovery the rows are skipped,
//!   [`GPU_NOT_LOOKED_FOR`], never a figure.
//!
//!
//! The passes are checked once, at the first batch size: the graph as imported and as
//! optimized run on the same input and must agree within [`TOLERANCE`]. The CPU row's check
//! covers both at every batch size; this one says which of the two a difference comes from.

pub mod figures;
pub mod fp8;
mod general;
mod gpu;
mod model;
pub mod peer;
mod rows;
#[cfg(test)]
mod tests;
pub mod torchvision;

pub use general::general_tolerance;
pub use model::{describe, OnnxModel, OnnxValue, Passes, DEFAULT_BATCH_SIZES};
pub use rows::{float64_tolerance, Float64Reference, PassesCheck, GRAPH_CPU_ROW, TOLERANCE};
pub use torchvision::TORCHVISION_CLASSIFIERS;

use super::report::{row, sort_rows_as_asked, InferRow};
use super::InferStrategy;
use crate::error::{Error, Result};
use crate::measure::Plan;
use crate::report::{judge_rows, Document, RowStatus};
use crate::workload::strategy::{gpu_ordinal, runs_on, select_strategies, GPU_WARMUP};
use gpukit_cuda::loader::Discovery;
use gpukit_models::onnx::ModelFile;
use gpukit_models::ort_runner::{find_onnxruntime, OrtModel};
use gpukit_tensor::DeviceSelection;
use model::{batch_sizes, model_of, prepare, the_input};
use rows::Bench;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Why a GPU strategy has no figure when `run_onnx` was given no discovery of the GPU libraries.
pub const GPU_NOT_LOOKED_FOR: &str = "the GPU rows did not run: no GPU libraries were looked for";

#[derive(Debug, Clone)]
pub struct OnnxOptions {
    pub file: PathBuf,
    /// None: the model's own batch where it fixes one, else [`DEFAULT_BATCH_SIZES`].
    pub batch_sizes: Option<Vec<usize>>,
    /// Sizes of the input's other named axes (`--input-dims height=224`).
    pub dims: Vec<(String, usize)>,
    /// Timed repetitions per CPU row (fewer when `budget_s` cuts in).
    pub iterations: usize,
    /// Timed repetitions per GPU row, after at least 100 ms of untimed passes.
    pub gpu_iterations: usize,
    /// Longest one row may run, in seconds.
    pub budget_s: f64,
    pub selection: DeviceSelection,
    /// From [`onnx_strategies`].
    pub strategies: Vec<InferStrategy>,
    /// Run a model of torchvision's ResNet family on the hand-built ResNet engine, read back
    /// from the graph (every graph runs on the general engine otherwise).
    pub resnet_engine: bool,
    /// `--fp8-check`: fp8 simulated on the CPU against f32 (None: not asked).
    pub fp8: Option<fp8::Fp8Options>,
}

/// `infer --onnx`'s report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OnnxRun {
    pub model: OnnxModel,
    pub batch_sizes: Vec<usize>,
    pub cpu_threads: usize,
    /// How the input was drawn.
    pub input: String,
    pub passes_check: Option<PassesCheck>,
    /// By batch size: gpukit's row, ONNX Runtime's, then the GPU strategies asked for.
    pub rows: Vec<InferRow>,
    /// The ONNX Runtime library that ran, when one did.
    pub onnxruntime: Option<String>,
    /// Why ONNX Runtime did not run: gpukit's rows are then unchecked.
    pub onnxruntime_unavailable: Option<String>,
    /// Why there are no GPU figures, when a GPU was selected.
    pub gpu: Option<String>,
    /// The device the GPU rows ran on (`cuda:0 NVIDIA H100 80GB HBM3`), when they ran.
    #[serde(default)]
    pub gpu_device: Option<String>,
    /// What runs the GPU rows, when they ran: the model the graph was read as and the check that
    /// it equals the graph.
    #[serde(default)]
    pub gpu_engine: Option<String>,
    /// `--compare-pytorch --torchvision NAME`: PyTorch's rows, how its model was checked to be
    /// the file's, and the best fp16 of each side.
    #[serde(default)]
    pub pytorch: Option<crate::infer::peer::PytorchComparison>,
    /// By batch size, the float64 reference the f32 rows were judged against (where gpukit's
    /// CPU row or fp32 GPU rows on the general engine ran).
    #[serde(default)]
    pub float64: Vec<Float64Reference>,
    /// `--fp8-check`: fp8 (E4M3) simulated on the CPU against f32, on inputs calibration did
    /// not see.
    #[serde(default)]
    pub fp8: Option<fp8::Fp8Check>,
}

/// The rows `infer --onnx` runs: those named; else gpukit's CPU row and ONNX Runtime's where
/// the CPU is selected, and the GPU engine's default strategies where a GPU is selected and
/// `gpu_usable` (one image at a time is the ResNet engine's and is left out of the defaults).
/// Without a usable GPU the defaults are the CPU rows, not a wall of skipped rows.
pub fn onnx_strategies(
    requested: Option<&[InferStrategy]>,
    selection: DeviceSelection,
    gpu_usable: bool,
) -> Result<Vec<InferStrategy>> {
    let all = select_strategies(requested, selection)?;
    if requested.is_some() || !all.iter().any(InferStrategy::on_cpu) {
        return Ok(all);
    }
    Ok(all
        .into_iter()
        .filter(|s| s.on_cpu() || (gpu_usable && matches!(s, InferStrategy::Gpu(_))))
        .collect())
}

/// The JSON document of `infer --onnx`: failed when a row failed, the passes' check failed, or
/// nothing was measured. ONNX Runtime's absence is a warning: gpukit's rows are unchecked; so
/// are PyTorch's other weights (`--torchvision`): its figures are for the same layers only.
pub fn document(run: OnnxRun) -> Document<OnnxRun> {
    let failure = judge_rows(run.rows.iter().map(|r| &r.status))
        .or_else(|| match run.passes_check.as_ref().map(|c| &c.status) {
            Some(RowStatus::Failed(why)) => {
                Some(format!("gpukit's passes changed the outputs: {why}"))
            }
            _ => None,
        })
        .or_else(|| {
            let why = run.fp8.as_ref()?.failed.as_ref()?;
            Some(format!("fp8 check: {why}"))
        });
    let notes = run
        .onnxruntime_unavailable
        .iter()
        .map(|why| {
            format!("warning: ONNX Runtime did not run ({why}): gpukit's outputs are not checked")
        })
        .chain(run.pytorch.as_ref().and_then(other_weights))
        .collect::<Vec<_>>();
    Document::new("infer --onnx", run, failure).with_notes(notes)
}

/// The warning when PyTorch's model has the file's layers but not its weights.
fn other_weights(p: &crate::infer::peer::PytorchComparison) -> Option<String> {
    let same = p.same_model.as_ref()?;
    if same.same_weights != Some(false) {
        return None;
    }
    let diff = p.logits.as_ref().map_or(f64::NAN, |a| a.max_rel);
    let hint = if same.weights == "seeded" {
        "pass the state dict the file was exported from with --torchvision-weights".to_string()
    } else {
        format!(
            "is {} the state dict the file was exported from?",
            same.weights
        )
    };
    Some(format!(
        "warning: PyTorch's {} has the file's layers but other weights (its logits differ from \
         the file's by {diff:.1e}, over {:.0e}): its times are for the same layers, not the same \
         numbers; {hint}",
        same.torchvision, same.logits_tolerance
    ))
}

/// ONNX Runtime on the model (its path where its weights are in external data files), and the
/// library's path; or why it cannot run.
pub(super) fn open_onnxruntime(
    file: &ModelFile,
    threads: usize,
) -> std::result::Result<(OrtModel, String), String> {
    let lib = find_onnxruntime().map_err(|e| e.to_string())?;
    let model = if file.has_external_data() {
        OrtModel::from_file(&lib, file.path(), threads)
    } else {
        OrtModel::new(&lib, file.bytes(), threads)
    };
    model
        .map(|m| (m, lib.display().to_string()))
        .map_err(|e| e.to_string())
}

/// The skipped rows of the GPU strategies asked for: no figure, `why`.
fn gpu_rows(
    wanted: &[InferStrategy],
    selection: DeviceSelection,
    sizes: &[usize],
    why: &str,
) -> Vec<InferRow> {
    let device = gpu_ordinal(selection).map_or("cuda".into(), |o| format!("cuda:{o}"));
    let mut rows = Vec::new();
    for s in wanted.iter().filter(|s| !s.on_cpu()) {
        for &n in sizes {
            // one image at a time is against the batch: it has no row at batch 1
            if matches!(s, InferStrategy::OneAtATime(_)) && n < 2 {
                continue;
            }
            let mut r = row(&s.name(), &device, n);
            r.status = RowStatus::Skipped(why.into());
            rows.push(r);
        }
    }
    rows
}

/// Reads, imports and runs the model: see the module's doc. The file's problems (unreadable,
/// not ONNX, an operator gpukit does not implement, inputs it cannot feed) are bad input,
/// found before anything is timed.
/// `discovery`: where the CUDA libraries are (None: GPU rows are not run, each one skipped).
pub fn run_onnx(
    opts: &OnnxOptions,
    discovery: Option<&Discovery>,
    progress: &mut dyn FnMut(&str),
) -> Result<OnnxRun> {
    if let Some(f) = &opts.fp8 {
        fp8::check_options(&opts.file, f)?;
    }
    let file = ModelFile::read(&opts.file)?;
    let input = the_input(&file, &opts.dims)?;
    let sizes = batch_sizes(&file, &input, opts.batch_sizes.as_deref())?;
    let first = sizes.first().copied().unwrap_or(1);
    progress(&format!("infer --onnx: importing {}", opts.file.display()));
    let prepared = prepare(&file, first, &opts.dims)?;
    let model = model_of(&file, first, &prepared);
    let outputs: Vec<String> = model.outputs.iter().map(|o| o.name.clone()).collect();
    let wanted: Vec<InferStrategy> = opts
        .strategies
        .iter()
        .copied()
        .filter(|s| runs_on(s, opts.selection))
        .collect();
    let bench = Bench {
        plan: Plan::new(1, opts.iterations).with_budget(opts.budget_s),
        input: &input.name,
        outputs: &outputs,
        cpu: wanted.contains(&InferStrategy::Cpu),
        ort: wanted.contains(&InferStrategy::OnnxRuntime),
        keep_reference: false,
        float64: false,
    };
    let threads = gpukit_tensor::cpu::threads();
    let mut run = OnnxRun {
        model,
        batch_sizes: sizes.clone(),
        cpu_threads: threads,
        input: format!(
            "random standard normal f32 for {}, fresh at each batch size; both rows at one \
             batch size get the same",
            input.name
        ),
        passes_check: None,
        rows: Vec::new(),
        onnxruntime: None,
        onnxruntime_unavailable: None,
        gpu: None,
        gpu_engine: None,
        gpu_device: None,
        pytorch: None,
        float64: Vec::new(),
        fp8: None,
    };
    // the GPU rows' model: every graph runs on the general engine; with `resnet_engine`, a
    // ResNet read from the graph runs on the hand-built one
    let on_gpu: Vec<InferStrategy> = wanted.iter().copied().filter(|s| !s.on_cpu()).collect();
    let resnet = (!on_gpu.is_empty() && opts.resnet_engine).then(|| gpu::resnet_of(&prepared));
    let general = !on_gpu.is_empty() && !matches!(resnet, Some(Ok(_)));
    let refused = match &resnet {
        Some(Err(why)) if why.contains("differs from the graph") => Some(why.clone()),
        _ => None,
    };
    let fp32 = on_gpu
        .iter()
        .any(|s| matches!(s, InferStrategy::Gpu(g) if g.dtype == gpukit_tensor::DType::F32));
    // the float64 reference where an f32 row is judged: gpukit's CPU row, or fp32 GPU rows
    let bench = Bench {
        keep_reference: general && discovery.is_some(),
        float64: bench.cpu || (general && discovery.is_some() && fp32),
        ..bench
    };
    // ONNX Runtime runs whenever a CPU row does, or GPU rows need a reference: gpukit's rows
    // are checked against it, timed only when its own row was asked for
    let mut ort = None;
    if bench.cpu || bench.ort || bench.keep_reference {
        match open_onnxruntime(&file, threads) {
            Ok((m, lib)) => {
                ort = Some(m);
                run.onnxruntime = Some(lib);
            }
            Err(why) => run.onnxruntime_unavailable = Some(why),
        }
    }
    // per batch size, what the general engine's rows take: the graph, the input, the reference
    let mut for_gpu = Vec::new();
    if bench.cpu || ort.is_some() || bench.keep_reference {
        let mut prepared = Some(prepared);
        for &n in &sizes {
            let p = match prepared.take() {
                Some(p) => p,
                None => prepare(&file, n, &opts.dims)?,
            };
            let at = bench.rows_at(n, &p, ort.as_mut(), n == first, progress);
            run.rows.extend(at.rows);
            if at.passes_check.is_some() {
                run.passes_check = at.passes_check;
            }
            run.float64.extend(at.float64_reference);
            if bench.keep_reference {
                for_gpu.push((n, p.optimized, at.input, at.reference, at.float64));
            }
        }
    }
    // ONNX Runtime's threads wait spinning for the next run: gone before the GPU rows, whose
    // eager passes are bound by the host's launches
    drop(ort);
    let device = gpu_ordinal(opts.selection).map_or("cuda".into(), |o| format!("cuda:{o}"));
    match (resnet, discovery) {
        (Some(Ok(read)), Some(discovery)) => {
            let gpu_opts = gpu::options(opts, &read, &on_gpu, &sizes);
            let weights = format!(
                "{}, read as {}",
                opts.file.display(),
                read.folded.model.name()
            );
            let report =
                super::run_on_folded(discovery, &gpu_opts, (&read.folded, weights), progress)?;
            run.gpu = report.gpu_unavailable.clone();
            run.gpu_engine = Some(read.describe(report.gpu_device.as_deref()));
            run.gpu_device = report.gpu_device.clone();
            run.rows.extend(report.rows);
        }
        (_, Some(discovery)) if general => {
            let ctx = general::open(discovery, gpu_ordinal(opts.selection).unwrap_or(0));
            if let Err(why) = &ctx {
                run.gpu = Some(why.clone());
            }
            let plan = Plan::new(GPU_WARMUP, opts.gpu_iterations.max(1));
            // each distinct program's steps (precision and layout), from the first batch size
            let mut steps: Option<Vec<general::ProgramSteps>> = None;
            for (n, graph, input, reference, float64) in &for_gpu {
                if steps.is_none() {
                    let mut programs: Vec<general::ProgramSteps> = Vec::new();
                    for s in &on_gpu {
                        let InferStrategy::Gpu(g) = s else { continue };
                        let label = general::program_label(g.dtype, g.layout);
                        if programs.iter().any(|p| p.0 == label) {
                            continue;
                        }
                        if let Ok(p) =
                            gpukit_models::gpu::program::Program::lower(graph, g.dtype, g.layout)
                        {
                            let counts = p.step_counts();
                            let counts = counts.into_iter().map(|(k, n)| (k.to_string(), n));
                            programs.push((label, counts.collect(), false));
                        }
                    }
                    steps = Some(programs);
                }
                let reference = reference.as_ref().map(|(o, label)| general::Reference {
                    input,
                    outputs: o,
                    label,
                    float64: float64.as_ref(),
                });
                run.rows.extend(general::rows_at(
                    ctx.as_ref().map_err(String::as_str),
                    discovery,
                    &device,
                    graph,
                    *n,
                    &on_gpu,
                    reference,
                    plan,
                    steps.get_or_insert_with(Vec::new),
                    progress,
                ));
            }
            if ctx.is_ok() {
                let ordinal = gpu_ordinal(opts.selection).unwrap_or(0);
                let (name, _) = crate::infer::gpu_name(discovery, ordinal);
                // the engine's line names the device as the hand-built engine's does
                let mut engine = general::describe(steps.as_deref(), &name);
                run.gpu_device = Some(name);
                // a graph of the ResNet family the reader refused: say why it is not on the
                // hand-built engine
                if let Some(why) = &refused {
                    engine.push_str(&format!(" (not on the ResNet engine: {why})"));
                }
                run.gpu_engine = Some(engine);
            }
        }
        _ => {
            if !on_gpu.is_empty() {
                run.gpu = Some(GPU_NOT_LOOKED_FOR.to_string());
            }
            run.rows.extend(gpu_rows(
                &wanted,
                opts.selection,
                &sizes,
                GPU_NOT_LOOKED_FOR,
            ));
        }
    }
    if run.rows.is_empty() {
        let why = run
            .onnxruntime_unavailable
            .as_deref()
            .unwrap_or("no strategy has a row at these batch sizes");
        return Err(Error::Unavailable(format!(
            "no strategy could run: ONNX Runtime: {why}"
        )));
    }
    sort_rows_as_asked(&mut run.rows, &wanted);
    if let Some(f) = &opts.fp8 {
        run.fp8 = Some(fp8::fp8_check(&file, &opts.dims, f, progress)?);
    }
    Ok(run)
}
