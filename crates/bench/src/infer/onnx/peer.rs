//! `infer --onnx --compare-pytorch --torchvision NAME`: PyTorch runs torchvision's NAME beside
//! the file's rows, once it is checked to be the file's model.
//!
//! To use:
//! 1. before gpukit's rows, [`check_same_model`]: PyTorch builds NAME (the state dict of
//!    `--torchvision-weights`, else the seeded weights scripts/export_torchvision.py exports),
//!    counts its layers and computes its eager fp32 logits on one random batch, on the CPU. The
//!    file's layers and output shape must be the same ([`same_structure`]; else bad input, before
//!    anything is timed); ONNX Runtime's logits on the file (gpukit's interpreter's without it)
//!    on the same batch say whether the weights are the same too;
//! 2. after them, [`compare`]: PyTorch's timed rows at the same batch sizes, set beside gpukit's
//!    as `infer --compare-pytorch` sets them (`infer::peer`).

use super::model::{prepare, the_input, Prepared};
use super::rows::{as_f32, Outputs};
use super::torchvision::{layers_of, same_structure, PytorchStructure};
use super::{open_onnxruntime, OnnxOptions, OnnxRun, GRAPH_CPU_ROW};
use crate::accuracy::agreement;
use crate::error::{Error, Result};
use crate::infer::peer::{
    batches_of, comparison, run_rows, temp_path, Cleanup, Head, LogitsCheck, SameModel,
    LOGITS_IMAGES,
};
use crate::peer::run_pytorch;
use crate::random::{fresh_seed, normal_f32};
use gpukit_models::graph::{forward_cpu, Array};
use gpukit_models::onnx::ModelFile;
use gpukit_models::weights::{load_tensor, save_tensors};
use std::path::{Path, PathBuf};

/// Largest max rel. diff of PyTorch's fp32 logits against the file's for the two to count as
/// the same weights: both are f32 computations of the same sums in another order (against ONNX
/// Runtime on a 2-core CPU: 1.2e-6 for ConvNeXt-T to 2.4e-5 for ResNet-50, seeded); other
/// weights move the logits by their own size (1e-2 with one layer's weights scaled by 1%).
pub const SAME_WEIGHTS_TOLERANCE: f64 = 1e-4;

/// Timed repetitions of PyTorch's GPU rows: as many as the general engine's rows time.
const GPU_ITERATIONS: usize = 50;

/// The torchvision model to run beside the file.
#[derive(Debug, Clone)]
pub struct Torchvision {
    /// One of [`super::TORCHVISION_CLASSIFIERS`].
    pub name: String,
    /// Its state dict as safetensors; None: the seeded weights.
    pub weights: Option<PathBuf>,
}

impl Torchvision {
    /// The script's flags naming the model.
    fn model_args(&self) -> Vec<String> {
        let mut a = vec!["--model".to_string(), self.name.clone()];
        if let Some(w) = &self.weights {
            a.extend(["--weights".into(), w.display().to_string()]);
        }
        a
    }
}

/// What [`check_same_model`] found, for [`compare`].
#[derive(Debug, Clone)]
pub struct Checked {
    same_model: SameModel,
    logits: LogitsCheck,
    /// The check's run (on the CPU), in case the timed one gives none.
    head: Head,
    image_size: usize,
}

impl Checked {
    pub fn same_model(&self) -> &SameModel {
        &self.same_model
    }
}

/// Step 1 of the module's doc. Bad input: a weights file that cannot be read, a file whose
/// input is not square images, a structure that differs; a PyTorch that cannot run is the
/// peer's error (say it before gpukit's rows take minutes).
pub fn check_same_model(
    opts: &OnnxOptions,
    tv: &Torchvision,
    progress: &mut dyn FnMut(&str),
) -> Result<Checked> {
    if let Some(w) = &tv.weights {
        std::fs::File::open(w).map_err(|e| {
            Error::BadInput(format!(
                "--torchvision-weights {}: cannot be read: {e}",
                w.display()
            ))
        })?;
    }
    let file = ModelFile::read(&opts.file)?;
    let input = the_input(&file, &opts.dims)?;
    let n = input.fixed_first.unwrap_or(LOGITS_IMAGES);
    let prepared = prepare(&file, n, &opts.dims)?;
    let graph = &prepared.imported;
    let shape = graph
        .inputs
        .first()
        .map(|&i| graph.value(i).shape.clone())
        .unwrap_or_default();
    let size = match shape[..] {
        [_, 3, h, w] if h == w => h,
        _ => {
            return Err(Error::BadInput(format!(
                "--torchvision: torchvision's classifiers run here on square images [n, 3, s, s]; \
                 {}'s input is {shape:?}",
                opts.file.display()
            )))
        }
    };
    let per_image: Vec<Vec<usize>> = graph
        .outputs
        .iter()
        .map(|&o| graph.value(o).shape.iter().skip(1).copied().collect())
        .collect();

    let (input_path, output_path) = (temp_path("input"), temp_path("logits"));
    let _cleanup = Cleanup(vec![input_path.clone(), output_path.clone()]);
    let x = normal_f32(shape.iter().product(), fresh_seed());
    save_tensors(&input_path, &[("input", &shape, &x)])?;
    progress(&format!(
        "infer --onnx: PyTorch's {}, its layers and logits on the CPU",
        tv.name
    ));
    let mut args = vec!["infer".to_string()];
    args.extend(tv.model_args());
    args.extend([
        "--image-size".into(),
        size.to_string(),
        "--device".into(),
        "cpu".into(),
        "--check-only".into(),
        "--input".into(),
        input_path.display().to_string(),
        "--save-output".into(),
        output_path.display().to_string(),
    ]);
    let run = run_pytorch(&args)?;
    let structure = PytorchStructure::parse(&run.document)
        .ok_or_else(|| Error::Peer("the PyTorch reference reported no structure".into()))?;
    let onnx = layers_of(graph);
    same_structure(&tv.name, onnx, &per_image, &structure).map_err(Error::BadInput)?;

    progress("infer --onnx: the file's logits on the same batch");
    let logits = logits_check(&file, &prepared, &input.name, &shape, &x, &output_path);
    let same_weights = logits
        .agreement
        .as_ref()
        .map(|a| a.max_rel <= SAME_WEIGHTS_TOLERANCE);
    Ok(Checked {
        same_model: SameModel {
            torchvision: tv.name.clone(),
            weights: run.document["weights"]
                .as_str()
                .unwrap_or("seeded")
                .to_string(),
            onnx,
            pytorch: structure.layers,
            output_shape: structure.output_shape,
            pytorch_parameters: structure.parameters,
            logits_tolerance: SAME_WEIGHTS_TOLERANCE,
            same_weights,
        },
        logits,
        head: Head::of(&run),
        image_size: size,
    })
}

/// The file's logits on `x` (ONNX Runtime's, else gpukit's interpreter's) against PyTorch's in
/// `output`.
fn logits_check(
    file: &ModelFile,
    prepared: &Prepared,
    input: &str,
    shape: &[usize],
    x: &[f32],
    output: &Path,
) -> LogitsCheck {
    let n = shape.first().copied().unwrap_or(1);
    let mut check = LogitsCheck {
        agreement: None,
        images: n,
        unavailable: None,
        reference: String::new(),
    };
    let (ours, reference) = match file_logits(file, prepared, input, shape, x) {
        Ok(found) => found,
        Err(why) => {
            check.unavailable = Some(why);
            return check;
        }
    };
    check.reference = reference;
    match load_tensor(output, "logits") {
        Ok((theirs_shape, theirs)) if theirs_shape.len() == 2 && theirs.len() == ours.len() => {
            check.agreement = Some(agreement(&theirs, &ours, theirs_shape[1].max(1)));
        }
        Ok((theirs_shape, _)) => {
            check.unavailable = Some(format!(
                "PyTorch's logits have shape {theirs_shape:?}, the file's {} values for {n} images",
                ours.len()
            ))
        }
        Err(e) => check.unavailable = Some(format!("PyTorch's logits: {e}")),
    }
    check
}

/// The file's one output on `x`, and what computed it.
fn file_logits(
    file: &ModelFile,
    prepared: &Prepared,
    input: &str,
    shape: &[usize],
    x: &[f32],
) -> std::result::Result<(Vec<f32>, String), String> {
    let graph = &prepared.optimized;
    let names: Vec<String> = graph
        .outputs
        .iter()
        .map(|&o| graph.value(o).name.clone())
        .collect();
    let first = |outputs: Outputs| outputs.into_iter().next().map(|(_, v)| v);
    let threads = gpukit_tensor::cpu::threads();
    let ort_failed = match open_onnxruntime(file, threads) {
        Ok((mut m, _)) => match m.run_named(input, shape, x, &names) {
            Ok(o) => {
                let found = first(o).ok_or("ONNX Runtime gave no output")?;
                return Ok((found, "ONNX Runtime's on the file (both on the CPU)".into()));
            }
            Err(e) => e.to_string(),
        },
        Err(why) => why,
    };
    let outputs = forward_cpu(graph, &[Array::f32(shape, x.to_vec())])
        .map_err(|e| format!("ONNX Runtime did not run ({ort_failed}), nor gpukit's graph: {e}"))?;
    let found = first(as_f32(outputs)).ok_or("the graph gave no output")?;
    Ok((
        found,
        format!("{GRAPH_CPU_ROW}'s on the file (ONNX Runtime did not run: {ort_failed})"),
    ))
}

/// Step 2 of the module's doc: PyTorch's rows beside `run`'s (GPU rows, and gpukit's CPU row
/// beside PyTorch's eager fp32 on the CPU), the comparison in `run.pytorch` whatever happens;
/// PyTorch's version, or why its timed rows are missing.
pub fn compare(
    run: &mut OnnxRun,
    opts: &OnnxOptions,
    tv: &Torchvision,
    checked: Checked,
    progress: &mut dyn FnMut(&str),
) -> Result<String> {
    let gpu = batches_of(&run.rows, GRAPH_CPU_ROW, false);
    let cpu = batches_of(&run.rows, GRAPH_CPU_ROW, true);
    for (device, sizes) in [("the GPU", &gpu), ("the CPU", &cpu)] {
        if !sizes.is_empty() {
            progress(&format!(
                "infer --onnx: PyTorch's {} on {device} at batch sizes {}",
                tv.name,
                crate::peer::csv(sizes)
            ));
        }
    }
    // PyTorch's counterparts of the GPU rows asked for, and its best forms (a CUDA graph,
    // torch.compile, torch.compile replayed as CUDA graphs) for the best-of-each-side figures
    let mut only: Vec<&str> = run
        .rows
        .iter()
        .filter(|r| r.device != "cpu")
        .filter_map(|r| super::super::peer::counterpart(&r.strategy))
        .chain(["cuda_graph_fp16", "compile_fp16", "compile_graph_fp16"])
        .collect();
    only.sort_unstable();
    only.dedup();
    let ran = run_rows(
        &tv.model_args(),
        checked.image_size,
        Some(&only),
        (&gpu, GPU_ITERATIONS),
        (&cpu, opts.iterations),
        None,
    );
    let (head, rows, cpu_failed, outcome) = match ran {
        Ok(r) => match r.head {
            Some(head) => {
                let version = head.torch_version.clone();
                (head, r.rows, r.cpu_failed, Ok(version))
            }
            None => (
                checked.head,
                Vec::new(),
                None,
                Err(Error::Peer(format!(
                    "no row of gpukit's to set PyTorch's beside: PyTorch runs beside the GPU \
                     rows and {GRAPH_CPU_ROW}, and none of them ran"
                ))),
            ),
        },
        Err(e) => (checked.head, Vec::new(), None, Err(e)),
    };
    run.pytorch = Some(comparison(
        head,
        rows,
        &mut run.rows,
        GRAPH_CPU_ROW,
        checked.logits,
        Some(checked.same_model),
        cpu_failed,
    ));
    outcome
}
