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
//! Rows:
//! - [`GRAPH_CPU_ROW`]: `gpukit_models::graph::forward_cpu` on the optimized graph, f32. It
//!   fails when any output differs from ONNX Runtime's by more than [`TOLERANCE`] (max |diff|
//!   over max |ONNX Runtime's|, [`crate::accuracy::agreement`]).
//! - [`ORT_ROW`]: ONNX Runtime on the file's bytes as they are (its path where the weights
//!   are in external data files), the reference.
//! - GPU strategies: skipped, [`GPU_NOT_YET`]; never a figure.
//!
//! The passes are checked once, at the first batch size: the graph as imported and as
//! optimized run on the same input and must agree within [`TOLERANCE`]. The CPU row's check
//! covers both at every batch size; this one says which of the two a difference comes from.

use super::report::{rate, row, sort_rows, InferRow};
use super::InferStrategy;
use crate::accuracy::{agreement, verdict, Agreement};
use crate::error::{Error, Result};
use crate::measure::{time_host, Plan};
use crate::random::{fresh_seed, normal_f32};
use crate::report::{judge_rows, Document, RowStatus};
use crate::workload::strategy::{gpu_ordinal, runs_on, select_strategies, ORT_ROW};
use gpukit_models::graph::passes::{optimize, PassStats};
use gpukit_models::graph::{forward_cpu, last_uses, Array, DType, Data, Graph};
use gpukit_models::onnx::{DeclaredValue, ImportOptions, ModelFile};
use gpukit_models::ort_runner::{find_onnxruntime, OrtModel};
use gpukit_tensor::DeviceSelection;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The row of gpukit's graph interpreter.
pub const GRAPH_CPU_ROW: &str = "gpukit graph f32";
/// Why a GPU strategy has no figure for an imported model.
pub const GPU_NOT_YET: &str = "the GPU engine does not run imported ONNX graphs yet";
/// Largest max |gpukit - ONNX Runtime| / max |ONNX Runtime| a row may show and pass (f32 both).
pub const TOLERANCE: f64 = 1e-5;
/// The batch sizes when none are given and the model leaves its batch open.
pub const DEFAULT_BATCH_SIZES: [usize; 4] = [1, 8, 16, 32];

#[derive(Debug, Clone)]
pub struct OnnxOptions {
    pub file: PathBuf,
    /// None: the model's own batch where it fixes one, else [`DEFAULT_BATCH_SIZES`].
    pub batch_sizes: Option<Vec<usize>>,
    /// Sizes of the input's other named axes (`--input-dims height=224`).
    pub dims: Vec<(String, usize)>,
    /// Timed repetitions per row (fewer when `budget_s` cuts in).
    pub iterations: usize,
    /// Longest one row may run, in seconds.
    pub budget_s: f64,
    pub selection: DeviceSelection,
    /// From [`onnx_strategies`].
    pub strategies: Vec<InferStrategy>,
}

/// One graph input or output: as declared, and its shape at the report's first batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxValue {
    pub name: String,
    /// `float`, `int64`, ...
    pub elem_type: String,
    /// Each axis as the model writes it: a size, a symbolic name (`batch`) or `?`.
    pub declared: Vec<String>,
    /// Resolved at `OnnxModel::batch`.
    pub shape: Vec<usize>,
}

/// What gpukit's passes changed ([`PassStats`], as the report keeps it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Passes {
    pub folded_constants: usize,
    pub folded_batch_norms: usize,
    pub gelus: usize,
    pub fused_epilogues: usize,
    pub squeeze_excites: usize,
    pub dead_nodes: usize,
}

impl From<PassStats> for Passes {
    fn from(s: PassStats) -> Passes {
        Passes {
            folded_constants: s.folded_constants,
            folded_batch_norms: s.folded_batch_norms,
            gelus: s.gelus,
            fused_epilogues: s.fused_epilogues,
            squeeze_excites: s.squeeze_excites,
            dead_nodes: s.dead_nodes,
        }
    }
}

/// The model, as the file declares it and as gpukit imported and optimized it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxModel {
    /// The path as given.
    pub file: String,
    pub file_bytes: u64,
    /// The default domain's opset.
    pub opset: i64,
    /// `pytorch 2.5.1`, as the model says (empty when it does not).
    pub producer: String,
    /// Whether its weights are in external data files (ONNX Runtime then reads the path).
    pub external_data: bool,
    /// Nodes in the file.
    pub nodes_in_file: usize,
    /// Nodes of gpukit's graph as imported, and after the passes.
    pub nodes_imported: usize,
    pub nodes_optimized: usize,
    pub passes: Passes,
    /// Elements of the imported graph's constants (weights, and shape constants).
    pub parameters: usize,
    /// The batch size `inputs` and `outputs` are resolved at.
    pub batch: usize,
    pub inputs: Vec<OnnxValue>,
    pub outputs: Vec<OnnxValue>,
}

/// The passes' own check: the imported graph against the optimized one, on one input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassesCheck {
    pub batch: usize,
    /// The worst output's.
    pub agreement: Option<Agreement>,
    pub tolerance: f64,
    pub status: RowStatus,
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
}

/// The rows `infer --onnx` runs: those named (a GPU one gives a skipped row), else gpukit's
/// CPU row and ONNX Runtime's where the CPU is selected (the GPU defaults otherwise, each a
/// skipped row).
pub fn onnx_strategies(
    requested: Option<&[InferStrategy]>,
    selection: DeviceSelection,
) -> Result<Vec<InferStrategy>> {
    let all = select_strategies(requested, selection)?;
    if requested.is_some() || !all.iter().any(InferStrategy::on_cpu) {
        return Ok(all);
    }
    Ok(all.into_iter().filter(InferStrategy::on_cpu).collect())
}

/// The JSON document of `infer --onnx`: failed when a row failed, the passes' check failed, or
/// nothing was measured. ONNX Runtime's absence is a warning: gpukit's rows are unchecked.
pub fn document(run: OnnxRun) -> Document<OnnxRun> {
    let failure = judge_rows(run.rows.iter().map(|r| &r.status)).or_else(|| {
        match run.passes_check.as_ref().map(|c| &c.status) {
            Some(RowStatus::Failed(why)) => {
                Some(format!("gpukit's passes changed the outputs: {why}"))
            }
            _ => None,
        }
    });
    let notes = run
        .onnxruntime_unavailable
        .iter()
        .map(|why| {
            format!("warning: ONNX Runtime did not run ({why}): gpukit's outputs are not checked")
        })
        .collect::<Vec<_>>();
    Document::new("infer --onnx", run, failure).with_notes(notes)
}

/// The batch sizes to run: those given, else the model's fixed batch, else the defaults. A
/// size a fixed batch cannot take is bad input, said before any work.
fn batch_sizes(
    file: &ModelFile,
    input: &DeclaredValue,
    given: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let mut sizes = match (given, input.fixed_first) {
        (Some(g), _) => g.to_vec(),
        (None, Some(fixed)) => vec![fixed],
        (None, None) => DEFAULT_BATCH_SIZES.to_vec(),
    };
    sizes.sort_unstable();
    sizes.dedup();
    if let (Some(fixed), Some(other)) = (
        input.fixed_first,
        sizes.iter().find(|&&n| Some(n) != input.fixed_first),
    ) {
        return Err(Error::BadInput(format!(
            "{}: input {} has a fixed batch of {fixed}, --batch-sizes asks for {other}: give \
             --batch-sizes {fixed}, or re-export the model with a dynamic batch axis \
             (torch.onnx.export(..., dynamic_axes={{\"{}\": {{0: \"batch\"}}}}))",
            file.path().display(),
            input.name,
            input.name
        )));
    }
    if sizes.is_empty() {
        return Err(Error::BadInput("--batch-sizes names no batch size".into()));
    }
    Ok(sizes)
}

/// The one input gpukit feeds, checked: one graph input, of f32, and `dims` not naming its
/// batch axis (that is `--batch-sizes`'s).
fn the_input(file: &ModelFile, dims: &[(String, usize)]) -> Result<DeclaredValue> {
    let shown = file.path().display();
    let inputs = file.inputs();
    let input = match inputs.as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(Error::BadInput(format!(
                "{shown}: the model has no graph input"
            )))
        }
        many => {
            let names: Vec<&str> = many.iter().map(|v| v.name.as_str()).collect();
            return Err(Error::BadInput(format!(
                "{shown}: the model has {} inputs ({}); infer --onnx feeds one input for now",
                many.len(),
                names.join(", ")
            )));
        }
    };
    if input.elem_type != "float" {
        return Err(Error::BadInput(format!(
            "{shown}: input {} is {}; infer --onnx feeds a random float (f32) input",
            input.name, input.elem_type
        )));
    }
    if let Some((name, _)) =
        named_batch_axis(&input).and_then(|first| dims.iter().find(|(n, _)| n == first))
    {
        return Err(Error::BadInput(format!(
            "--input-dims {name}: {name} is input {}'s batch axis; give it with --batch-sizes",
            input.name
        )));
    }
    for (name, _) in dims {
        if !input.dims.contains(name) {
            return Err(Error::BadInput(format!(
                "--input-dims {name}: input {} has no axis named {name} (its axes: {})",
                input.name,
                input.dims.join(", ")
            )));
        }
    }
    Ok(input)
}

/// The first (batch) axis's name, where the model names it.
fn named_batch_axis(v: &DeclaredValue) -> Option<&str> {
    v.dims
        .first()
        .map(String::as_str)
        .filter(|d| d.parse::<usize>().is_err() && *d != "?")
}

/// The graph at batch `n`: as imported, optimized, and what the passes did.
struct Prepared {
    imported: Graph,
    optimized: Graph,
    stats: PassStats,
}

fn prepare(file: &ModelFile, n: usize, dims: &[(String, usize)]) -> Result<Prepared> {
    let imported = file.import(&ImportOptions {
        batch: Some(n),
        dims: dims.to_vec(),
    })?;
    let mut optimized = imported.clone();
    let stats = optimize(&mut optimized).map_err(gpukit_models::Error::from)?;
    Ok(Prepared {
        imported,
        optimized,
        stats,
    })
}

fn values(graph: &Graph, ids: &[usize], declared: &[DeclaredValue]) -> Vec<OnnxValue> {
    ids.iter()
        .filter_map(|&id| graph.values.get(id))
        .map(|v| {
            let d = declared.iter().find(|d| d.name == v.name);
            OnnxValue {
                name: v.name.clone(),
                elem_type: d.map_or_else(
                    || match v.dtype {
                        DType::F32 => "float".into(),
                        DType::I64 => "int64".into(),
                    },
                    |d| d.elem_type.clone(),
                ),
                declared: d.map(|d| d.dims.clone()).unwrap_or_default(),
                shape: v.shape.clone(),
            }
        })
        .collect()
}

fn model_of(file: &ModelFile, n: usize, p: &Prepared) -> OnnxModel {
    OnnxModel {
        file: file.path().display().to_string(),
        file_bytes: file.bytes().len() as u64,
        opset: file.opset().unwrap_or(0),
        producer: file.producer(),
        external_data: file.has_external_data(),
        nodes_in_file: file.node_count(),
        nodes_imported: p.imported.nodes.len(),
        nodes_optimized: p.optimized.nodes.len(),
        passes: p.stats.into(),
        parameters: p
            .imported
            .values
            .iter()
            .filter_map(|v| v.constant.as_ref())
            .map(Data::len)
            .sum(),
        batch: n,
        inputs: values(&p.imported, &p.imported.inputs, &file.inputs()),
        outputs: values(&p.imported, &p.imported.outputs, &file.outputs()),
    }
}

/// The model part of the report at batch `n`: imported and optimized, nothing run.
pub fn describe(file: &ModelFile, n: usize, dims: &[(String, usize)]) -> Result<OnnxModel> {
    the_input(file, dims)?;
    Ok(model_of(file, n, &prepare(file, n, dims)?))
}

/// The most bytes the interpreter holds at once: the input and the values alive after each
/// node (each freed after its last reader, as `forward_cpu` does); constants not counted (the
/// graph holds them already). None when it cannot be counted.
fn peak_activation_bytes(graph: &Graph) -> Option<u64> {
    let size = |id: usize| -> Option<u64> {
        let v = graph.values.get(id)?;
        let elem = match v.dtype {
            DType::F32 => 4,
            DType::I64 => 8,
        };
        gpukit_types::resources::bytes(&v.shape, elem)
    };
    let computed = |id: &&usize| graph.values.get(**id).is_some_and(|v| v.constant.is_none());
    let last = last_uses(graph);
    let mut live = graph
        .inputs
        .iter()
        .try_fold(0u64, |acc, &id| acc.checked_add(size(id)?))?;
    let mut peak = live;
    for (i, node) in graph.nodes.iter().enumerate() {
        for &o in &node.outputs {
            live = live.checked_add(size(o)?)?;
        }
        peak = peak.max(live);
        let mut freed: Vec<usize> = node
            .inputs
            .iter()
            .filter(computed)
            .copied()
            .filter(|&v| last.get(v).copied().flatten() == Some(i))
            .collect();
        freed.sort_unstable();
        freed.dedup();
        for v in freed {
            live = live.saturating_sub(size(v)?);
        }
    }
    Some(peak)
}

/// Each output as f32 (int64 outputs converted, as ONNX Runtime's are).
fn as_f32(outputs: Vec<Array>) -> Vec<(Vec<usize>, Vec<f32>)> {
    outputs
        .into_iter()
        .map(|a| {
            let values = match a.data {
                Data::F32(v) => v,
                Data::I64(v) => v.into_iter().map(|i| i as f32).collect(),
            };
            (a.shape, values)
        })
        .collect()
}

/// `got` against `reference`, output by output: the worst agreement, and why it fails (a
/// shape that differs, a value not finite, or a difference over [`TOLERANCE`]), naming the
/// output.
fn judge(
    got: &[(Vec<usize>, Vec<f32>)],
    reference: &[(Vec<usize>, Vec<f32>)],
    names: &[String],
) -> (Option<Agreement>, Option<String>) {
    if got.len() != reference.len() {
        return (
            None,
            Some(format!(
                "{} outputs against the reference's {}",
                got.len(),
                reference.len()
            )),
        );
    }
    let mut worst: Option<Agreement> = None;
    for (i, ((gs, g), (rs, r))) in got.iter().zip(reference).enumerate() {
        let name = names.get(i).map_or("?", String::as_str);
        if gs != rs || g.len() != r.len() {
            return (
                worst,
                Some(format!(
                    "output {name} has shape {gs:?}, the reference's is {rs:?}"
                )),
            );
        }
        // one "sample" per batch item for the top-1 figure, the whole output where the first
        // axis is not the batch's
        let per_item = gs.iter().skip(1).product::<usize>().max(1);
        let a = agreement(g, r, per_item);
        if let Some(why) = verdict(g, &a, TOLERANCE) {
            return (Some(a), Some(format!("output {name}: {why}")));
        }
        if worst.as_ref().is_none_or(|w| a.max_rel > w.max_rel) {
            worst = Some(a);
        }
    }
    (worst, None)
}

/// Reads, imports and runs the model: see the module's doc.
pub fn run_onnx(opts: &OnnxOptions, progress: &mut dyn FnMut(&str)) -> Result<OnnxRun> {
    let file = ModelFile::read(&opts.file)?;
    let input = the_input(&file, &opts.dims)?;
    let sizes = batch_sizes(&file, &input, opts.batch_sizes.as_deref())?;
    let first = sizes.first().copied().unwrap_or(1);
    progress(&format!("infer --onnx: importing {}", opts.file.display()));
    let prepared = prepare(&file, first, &opts.dims)?;
    let model = model_of(&file, first, &prepared);
    let output_names: Vec<String> = model.outputs.iter().map(|o| o.name.clone()).collect();

    let wanted: Vec<InferStrategy> = opts
        .strategies
        .iter()
        .copied()
        .filter(|s| runs_on(s, opts.selection))
        .collect();
    let want_cpu = wanted.contains(&InferStrategy::Cpu);
    let want_ort = wanted.contains(&InferStrategy::OnnxRuntime);
    let threads = gpukit_tensor::cpu::threads();
    let mut run = OnnxRun {
        model,
        batch_sizes: sizes.clone(),
        cpu_threads: threads,
        input: format!(
            "random standard normal f32 for {}, fresh at each batch size; both rows at one batch size get the same",
            input.name
        ),
        passes_check: None,
        rows: Vec::new(),
        onnxruntime: None,
        onnxruntime_unavailable: None,
        gpu: gpu_ordinal(opts.selection).map(|_| GPU_NOT_YET.to_string()),
    };

    // ONNX Runtime runs whenever a CPU row does: it is the reference gpukit's row is checked
    // against, timed only when its row was asked for
    let mut ort = None;
    if want_cpu || want_ort {
        let opened = find_onnxruntime().and_then(|lib| {
            let m = if file.has_external_data() {
                OrtModel::from_file(&lib, file.path(), threads)
            } else {
                OrtModel::new(&lib, file.bytes(), threads)
            };
            Ok((lib, m?))
        });
        match opened {
            Ok((lib, m)) => {
                run.onnxruntime = Some(lib.display().to_string());
                ort = Some(m);
            }
            Err(e) => run.onnxruntime_unavailable = Some(e.to_string()),
        }
    }

    let plan = Plan::new(1, opts.iterations).with_budget(opts.budget_s);
    let mut prepared = Some(prepared);
    for &n in &sizes {
        let p = match prepared.take() {
            Some(p) => p,
            None => prepare(&file, n, &opts.dims)?,
        };
        let check_passes = n == first;
        let graph = &p.optimized;
        let Some(&input_id) = graph.inputs.first() else {
            return Err(Error::BadInput(format!(
                "{}: the imported graph has no input",
                opts.file.display()
            )));
        };
        let shape = graph.values[input_id].shape.clone();
        let rows_here: Vec<&str> = [
            (want_cpu, GRAPH_CPU_ROW),
            (want_ort && ort.is_some(), ORT_ROW),
        ]
        .iter()
        .filter(|(w, _)| *w)
        .map(|(_, name)| *name)
        .collect();
        let elements: usize = shape.iter().product();
        let guard = gpukit_types::resources::Need::host(format!(
            "the graph interpreter at batch {n} of {}",
            input.name
        ))
        .with("input and live activations", peak_activation_bytes(graph))
        .with(
            "the graph as imported, for the passes' check",
            if check_passes {
                peak_activation_bytes(&p.imported)
            } else {
                Some(0)
            },
        )
        .check_host("lower --batch-sizes");
        if let Err(refused) = guard {
            for name in &rows_here {
                let mut r = row(name, "cpu", n);
                r.status = RowStatus::Skipped(refused.to_string());
                run.rows.push(r);
            }
            continue;
        }
        let x = normal_f32(elements, fresh_seed());
        let inputs = [Array::f32(&shape, x)];

        // the reference, timed when its row was asked for
        let mut reference: Option<std::result::Result<Vec<(Vec<usize>, Vec<f32>)>, String>> = None;
        let mut ort_row = None;
        if let Some(m) = ort.as_mut() {
            progress(&format!("infer --onnx: onnxruntime batch {n}"));
            let mut out = Vec::new();
            let mut once = || -> std::result::Result<(), gpukit_models::Error> {
                out = m.run_named(
                    &input.name,
                    &shape,
                    inputs[0].as_f32().unwrap_or(&[]),
                    &output_names,
                )?;
                Ok(())
            };
            let mut r = row(ORT_ROW, "cpu", n);
            if want_ort {
                match time_host(plan, &mut once) {
                    Ok(t) => {
                        r.images_per_s = Some(rate(n, &t));
                        r.timing = Some(t);
                        reference = Some(Ok(std::mem::take(&mut out)));
                    }
                    Err(e) => {
                        r.status = RowStatus::Failed(e.to_string());
                        reference = Some(Err(e.to_string()));
                    }
                }
                ort_row = Some(r);
            } else {
                reference = Some(match once() {
                    Ok(()) => Ok(std::mem::take(&mut out)),
                    Err(e) => Err(e.to_string()),
                });
            }
        }

        // gpukit's row, and the optimized graph's outputs for the passes' check
        let mut optimized_out: Option<Vec<(Vec<usize>, Vec<f32>)>> = None;
        let mut gpukit_rate = None;
        if want_cpu {
            progress(&format!("infer --onnx: gpukit graph f32 batch {n}"));
            let mut r = row(GRAPH_CPU_ROW, "cpu", n);
            let mut out = Vec::new();
            let timed = time_host(plan, || {
                out = forward_cpu(graph, &inputs)?;
                Ok::<(), gpukit_models::Error>(())
            });
            match timed {
                Ok(t) => {
                    let got = as_f32(std::mem::take(&mut out));
                    match &reference {
                        Some(Ok(want)) => {
                            let (a, why) = judge(&got, want, &output_names);
                            r.agreement = a;
                            r.compared_with = Some("ONNX Runtime CPU on the same input".into());
                            r.tolerance = Some(TOLERANCE);
                            if let Some(why) = why {
                                r.status = RowStatus::Failed(why);
                            }
                        }
                        Some(Err(e)) => {
                            r.compared_with =
                                Some(format!("nothing: ONNX Runtime failed on this input ({e})"));
                        }
                        None => {}
                    }
                    if r.status == RowStatus::Ok {
                        let g = rate(n, &t);
                        gpukit_rate = Some(g);
                        r.images_per_s = Some(g);
                        r.speedup_vs_reference = Some(1.0);
                        r.timing = Some(t);
                    }
                    optimized_out = Some(got);
                }
                Err(e) => r.status = RowStatus::Failed(e.to_string()),
            }
            run.rows.push(r);
        }
        if let Some(mut r) = ort_row {
            r.speedup_vs_reference = match (r.images_per_s, gpukit_rate) {
                (Some(o), Some(g)) => Some(o / g),
                _ => None,
            };
            run.rows.push(r);
        }

        if check_passes && (want_cpu || want_ort) {
            progress(&format!(
                "infer --onnx: the graph as imported, batch {n} (the passes' check)"
            ));
            run.passes_check = Some(passes_check(&p, &inputs, optimized_out, &output_names, n));
        }
    }

    for s in wanted.iter().filter(|s| !s.on_cpu()) {
        let device = gpu_ordinal(opts.selection).map_or("cuda".into(), |o| format!("cuda:{o}"));
        for &n in &sizes {
            // one image at a time is against the batch: it has no row at batch 1
            if matches!(s, InferStrategy::OneAtATime(_)) && n < 2 {
                continue;
            }
            let mut r = row(&s.name(), &device, n);
            r.status = RowStatus::Skipped(GPU_NOT_YET.into());
            run.rows.push(r);
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
    let order: Vec<String> = wanted
        .iter()
        .filter(|s| !s.on_cpu())
        .map(InferStrategy::name)
        .collect();
    sort_rows(&mut run.rows, &order);
    Ok(run)
}

/// The imported graph against the optimized one on `inputs` (the optimized outputs run again
/// where gpukit's row did not give them).
fn passes_check(
    p: &Prepared,
    inputs: &[Array],
    optimized: Option<Vec<(Vec<usize>, Vec<f32>)>>,
    names: &[String],
    n: usize,
) -> PassesCheck {
    let mut check = PassesCheck {
        batch: n,
        agreement: None,
        tolerance: TOLERANCE,
        status: RowStatus::Ok,
    };
    let optimized = match optimized {
        Some(o) => Ok(o),
        None => forward_cpu(&p.optimized, inputs).map(as_f32),
    };
    let imported = forward_cpu(&p.imported, inputs).map(as_f32);
    match (imported, optimized) {
        (Ok(before), Ok(after)) => {
            let (a, why) = judge(&after, &before, names);
            check.agreement = a;
            if let Some(why) = why {
                check.status = RowStatus::Failed(format!("optimized against imported: {why}"));
            }
        }
        (Err(e), _) | (_, Err(e)) => check.status = RowStatus::Failed(e.to_string()),
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_models::onnx::fixtures;
    use gpukit_tensor::Device;

    fn written(model: &gpukit_models::onnx::ModelProto) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, fixtures::bytes(model)).unwrap();
        (dir, path)
    }

    fn options(file: PathBuf, strategies: Vec<InferStrategy>) -> OnnxOptions {
        OnnxOptions {
            file,
            batch_sizes: Some(vec![2, 1]),
            dims: Vec::new(),
            iterations: 1,
            budget_s: 5.0,
            selection: DeviceSelection::All,
            strategies,
        }
    }

    #[test]
    fn the_defaults_are_the_cpu_rows_and_named_gpu_strategies_stay() {
        let cpu = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
        assert_eq!(onnx_strategies(None, DeviceSelection::All).unwrap(), cpu);
        let gpu = onnx_strategies(None, DeviceSelection::One(Device::Cuda(0))).unwrap();
        assert!(!gpu.is_empty() && gpu.iter().all(|s| !s.on_cpu()));
        let named = [InferStrategy::Cpu, InferStrategy::parse("fp16").unwrap()];
        assert_eq!(
            onnx_strategies(Some(&named), DeviceSelection::All).unwrap(),
            named
        );
    }

    #[test]
    fn describe_counts_nodes_passes_and_resolves_shapes() {
        let (_dir, path) = written(&fixtures::tiny_resnet(3));
        let file = ModelFile::read(&path).unwrap();
        let m = describe(&file, 4, &[]).unwrap();
        assert_eq!(m.opset, 17);
        assert_eq!(m.batch, 4);
        assert_eq!(m.inputs[0].shape, [4, 3, 32, 32]);
        assert_eq!(m.inputs[0].declared, ["batch", "3", "32", "32"]);
        assert_eq!(m.outputs[0].name, "logits");
        assert_eq!(m.outputs[0].shape, [4, 10]);
        assert!(m.passes.folded_batch_norms > 0 && m.passes.fused_epilogues > 0);
        assert!(m.nodes_optimized < m.nodes_imported);
        assert!(m.parameters > 1000);
    }

    #[test]
    fn gpu_strategies_give_skipped_rows_and_no_figure() {
        let (_dir, path) = written(&fixtures::tiny_resnet(5));
        let strategies = vec![
            InferStrategy::Cpu,
            InferStrategy::parse("fp16-nhwc-graph").unwrap(),
            InferStrategy::parse("fp16-nhwc-graph-one-at-a-time").unwrap(),
        ];
        let run = run_onnx(&options(path, strategies), &mut |_| {}).unwrap();
        assert_eq!(run.batch_sizes, [1, 2]);
        let gpu: Vec<&InferRow> = run.rows.iter().filter(|r| r.device != "cpu").collect();
        // fp16-nhwc-graph at 1 and 2, one at a time at 2 only
        assert_eq!(gpu.len(), 3);
        for r in gpu {
            assert_eq!(r.status, RowStatus::Skipped(GPU_NOT_YET.into()));
            assert!(r.timing.is_none() && r.images_per_s.is_none());
        }
        let cpu: Vec<&InferRow> = run.rows.iter().filter(|r| r.device == "cpu").collect();
        assert_eq!(cpu.len(), 2);
        assert!(cpu
            .iter()
            .all(|r| r.strategy == GRAPH_CPU_ROW && r.timing.is_some()));
        assert_eq!(run.gpu.as_deref(), Some(GPU_NOT_YET));
    }

    #[test]
    fn a_fixed_batch_model_refuses_another_batch_before_any_work() {
        let mut m = fixtures::tiny_resnet(1);
        let dim = &mut m.graph.as_mut().unwrap().input[0]
            .r#type
            .as_mut()
            .unwrap()
            .tensor_type
            .as_mut()
            .unwrap()
            .shape
            .as_mut()
            .unwrap()
            .dim[0];
        dim.dim_param = None;
        dim.dim_value = Some(1);
        let (_dir, path) = written(&m);
        let e = run_onnx(
            &options(path.clone(), vec![InferStrategy::Cpu]),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("fixed batch of 1") && e.contains("asks for 2"),
            "{e}"
        );
        let mut o = options(path, vec![InferStrategy::Cpu]);
        o.batch_sizes = None;
        assert_eq!(run_onnx(&o, &mut |_| {}).unwrap().batch_sizes, [1]);
    }

    #[test]
    fn input_dims_may_not_name_the_batch_or_an_unknown_axis() {
        let (_dir, path) = written(&fixtures::tiny_resnet(1));
        for (name, says) in [
            ("batch", "--batch-sizes"),
            ("height", "no axis named height"),
        ] {
            let mut o = options(path.clone(), vec![InferStrategy::Cpu]);
            o.dims = vec![(name.to_string(), 8)];
            let e = run_onnx(&o, &mut |_| {}).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn judge_names_the_output_that_differs_and_passes_within_tolerance() {
        let names = vec!["logits".to_string()];
        let want = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.0])];
        let close = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.000_01])];
        assert!(judge(&close, &want, &names).1.is_none());
        let far = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.01])];
        let why = judge(&far, &want, &names).1.unwrap();
        assert!(why.starts_with("output logits:"), "{why}");
        let shape = vec![(vec![4], vec![1.0, -2.0, 3.0, 4.0])];
        assert!(judge(&shape, &want, &names).1.unwrap().contains("shape"));
        let nan = vec![(vec![2, 2], vec![1.0, f32::NAN, 3.0, 4.0])];
        assert!(judge(&nan, &want, &names).1.unwrap().contains("not finite"));
    }

    #[test]
    fn the_peak_counts_live_values_not_all_of_them() {
        let (_dir, path) = written(&fixtures::tiny_resnet(1));
        let file = ModelFile::read(&path).unwrap();
        let p = prepare(&file, 2, &[]).unwrap();
        let g = &p.optimized;
        let peak = peak_activation_bytes(g).unwrap();
        let all: u64 = g
            .values
            .iter()
            .filter(|v| v.constant.is_none())
            .map(|v| v.shape.iter().product::<usize>() as u64 * 4)
            .sum();
        let input = 2 * 3 * 32 * 32 * 4;
        assert!(peak >= input && peak < all, "{peak} of {all}");
    }
}
