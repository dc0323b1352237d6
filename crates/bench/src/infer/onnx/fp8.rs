//! `infer --onnx FILE --fp8-check`: what fp8 (E4M3) would do to the model's answers,
//! simulated on the CPU (`gpukit_models::graph::fp8`): every convolution's and matrix
//! product's operands rounded to E4M3, the activations with scales calibrated on generated
//! inputs, the weights per output channel; then the fp8 run set beside the f32 one on inputs
//! calibration never saw. The check fails when fewer than [`MIN_TOP1_AGREEMENT`] of the rows
//! keep their top class, naming the layer fp8 hurts most.

use super::model::prepare;
use crate::error::{Error, Result};
use crate::random::{fresh_seed, normal_f32};
use gpukit_models::graph::cpu::Array;
use gpukit_models::graph::fp8::{calibrate, judge, rescue, Fp8Accuracy, Method, Rescue};
use gpukit_models::onnx::ModelFile;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Rows a batch of the check.
pub const FP8_BATCH: usize = 8;
/// Batches calibration runs (64 rows).
pub const CALIBRATION_BATCHES: usize = 8;
/// Batches the fp8 run is judged on (128 rows: one row is 0.8%).
pub const JUDGED_BATCHES: usize = 16;
/// The share of rows whose top class fp8 must keep.
pub const MIN_TOP1_AGREEMENT: f64 = 0.99;
/// Most layers a failed check tries keeping out of fp8.
pub const MOST_KEPT: usize = 8;

/// What `--fp8-check` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Options {
    pub method: Method,
    /// Sample inputs (safetensors, `[n, ...]` of the model's input): the first half of their
    /// whole batches calibrates, the second half is judged (None: generated inputs).
    pub samples: Option<PathBuf>,
    /// Where to write the calibrated scales (JSON).
    pub save_scales: Option<PathBuf>,
}

/// The check's report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fp8Check {
    /// How calibration chose each activation's scale.
    pub calibration: String,
    pub calibration_rows: usize,
    /// How the inputs were drawn.
    pub input: String,
    pub accuracy: Fp8Accuracy,
    pub min_top1_agreement: f64,
    /// Why the check fails (None: it passes).
    pub failed: Option<String>,
    /// When it fails: the fewest of the layers fp8 hurts most that, kept out of fp8, make the
    /// judged rows pass (or the most tried, and the agreement they reach).
    #[serde(default)]
    pub rescue: Option<Rescue>,
    /// Where the scales were written.
    pub scales_saved: Option<String>,
    pub seconds: f64,
}

/// One input set of fresh standard normal values for the graph's one input.
fn batch(graph: &gpukit_models::graph::Graph) -> Vec<Array> {
    graph
        .inputs
        .iter()
        .map(|&v| {
            let shape = &graph.values[v].shape;
            Array::f32(shape, normal_f32(shape.iter().product(), fresh_seed()))
        })
        .collect()
}

/// Refuses, before any work, a samples file that cannot be read, and a scales file that is
/// the model itself or cannot be written.
pub(super) fn check_options(model: &std::path::Path, opts: &Fp8Options) -> Result<()> {
    if let Some(path) = &opts.samples {
        std::fs::metadata(path).map_err(|source| Error::Io {
            what: "--calibrate",
            path: path.clone(),
            source,
        })?;
    }
    let Some(path) = &opts.save_scales else {
        return Ok(());
    };
    let same = match (path.canonicalize(), model.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => path == model,
    };
    if same {
        return Err(Error::BadInput(format!(
            "--save-fp8-scales {}: is the model file itself",
            path.display()
        )));
    }
    gpukit_types::files::check_writable_file(path).map_err(|source| Error::Io {
        what: "--save-fp8-scales",
        path: path.clone(),
        source,
    })
}

/// Batches of [`FP8_BATCH`] rows from a samples file: the first half of its whole batches for
/// calibration, the second half to judge, and how the inputs were drawn.
#[allow(clippy::type_complexity)]
fn from_file(
    graph: &gpukit_models::graph::Graph,
    path: &std::path::Path,
) -> Result<(Vec<Vec<Array>>, Vec<Vec<Array>>, String)> {
    let bad = |why: String| Error::BadInput(format!("--calibrate {}: {why}", path.display()));
    let id = *graph
        .inputs
        .first()
        .ok_or_else(|| Error::Failed("the graph has no input".into()))?;
    let value = &graph.values[id];
    let row = &value.shape[1..];
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        what: "--calibrate",
        path: path.to_path_buf(),
        source,
    })?;
    let (n, values) = gpukit_models::graph::fp8::samples_from_safetensors(&bytes, &value.name, row)
        .map_err(bad)?;
    let batches = n / FP8_BATCH;
    if batches < 2 {
        return Err(bad(format!(
            "holds {n} rows; the check takes at least {} ({} to calibrate, {} to judge)",
            2 * FP8_BATCH,
            FP8_BATCH,
            FP8_BATCH
        )));
    }
    let per = row.iter().product::<usize>() * FP8_BATCH;
    let mut all: Vec<Vec<Array>> = values
        .chunks_exact(per)
        .take(batches)
        .map(|c| vec![Array::f32(&value.shape, c.to_vec())])
        .collect();
    let judged = all.split_off(batches.div_ceil(2));
    let left = n - batches * FP8_BATCH;
    Ok((
        all,
        judged,
        format!(
            "{}: {n} rows, the first {} calibrate, the next {} are judged{}",
            path.display(),
            batches.div_ceil(2) * FP8_BATCH,
            batches / 2 * FP8_BATCH,
            if left > 0 {
                format!(" ({left} left over: batches of {FP8_BATCH})")
            } else {
                String::new()
            }
        ),
    ))
}

/// Calibrates on generated inputs (or a samples file's), judges on others, writes the scales
/// where asked.
pub(super) fn fp8_check(
    file: &ModelFile,
    dims: &[(String, usize)],
    opts: &Fp8Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Fp8Check> {
    let started = std::time::Instant::now();
    check_options(file.path(), opts)?;
    let graph = prepare(file, FP8_BATCH, dims)?.optimized;
    let (calibration, unseen, input) = match &opts.samples {
        Some(path) => from_file(&graph, path)?,
        None => (
            (0..CALIBRATION_BATCHES).map(|_| batch(&graph)).collect(),
            (0..JUDGED_BATCHES).map(|_| batch(&graph)).collect(),
            "random standard normal f32, fresh for calibration and for the check".to_string(),
        ),
    };
    let calibration_rows = calibration.len() * FP8_BATCH;
    progress(&format!(
        "infer --onnx: fp8 calibration on {calibration_rows} rows ({})",
        opts.method.name()
    ));
    let scales =
        calibrate(&graph, &calibration, opts.method).map_err(gpukit_models::Error::from)?;
    drop(calibration);
    progress(&format!(
        "infer --onnx: fp8 against f32 on {} rows calibration did not see",
        unseen.len() * FP8_BATCH
    ));
    let accuracy = judge(&graph, &scales, &unseen).map_err(gpukit_models::Error::from)?;
    let failed = accuracy.verdict(MIN_TOP1_AGREEMENT, f64::INFINITY).err();
    let rescue = match failed {
        Some(_) => {
            progress("infer --onnx: fp8 failed; which layers kept out of fp8 make it pass");
            Some(
                rescue(
                    &graph,
                    &scales,
                    &unseen,
                    &accuracy.layers,
                    MIN_TOP1_AGREEMENT,
                    MOST_KEPT,
                )
                .map_err(gpukit_models::Error::from)?,
            )
        }
        None => None,
    };
    let scales_saved = match &opts.save_scales {
        Some(path) => {
            let json = serde_json::to_vec_pretty(&scales)
                .map_err(|e| Error::Failed(format!("the fp8 scales as JSON: {e}")))?;
            gpukit_types::files::write_atomically(path, &json).map_err(|source| Error::Io {
                what: "--save-fp8-scales",
                path: path.clone(),
                source,
            })?;
            Some(path.display().to_string())
        }
        None => None,
    };
    Ok(Fp8Check {
        calibration: opts.method.name(),
        calibration_rows,
        input,
        accuracy,
        min_top1_agreement: MIN_TOP1_AGREEMENT,
        failed,
        rescue,
        scales_saved,
        seconds: started.elapsed().as_secs_f64(),
    })
}
