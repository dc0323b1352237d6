//! `gpukit train --compare-pytorch`: the same loop run by the PyTorch reference script on the
//! same data, initial weights and batch order, held to per-update tolerances, and timed.

use crate::error::{Error, Result};
use gpukit_train::checkpoint::Position;
use gpukit_train::data::Dataset;
use gpukit_train::gpu::feed::Loader;
use gpukit_train::gpu::{GpuTrainer, Precision};
use gpukit_train::model::Mlp;
use gpukit_train::optim::Optimizer;
use gpukit_train::run::{train_cpu, RunOutcome, TrainConfig};
use serde::{Deserialize, Serialize};

/// How many times each side runs the loop from the same weights when compared (the first
/// run's losses are compared; the median time is reported).
pub const PEER_REPEATS: usize = 5;

/// The largest relative difference of a per-update loss from PyTorch's that fp32 training on
/// the same weights and batches may show over the first [`PEER_EARLY_UPDATES`] updates: both
/// sides sum in f32 in other orders, which moves each loss by a few units in the last place
/// (about 1e-7 relative). A wrong rule (a loss, a gradient, an optimizer step) shows at once,
/// far above this.
pub const PEER_LOSS_TOLERANCE: f64 = 1e-4;

/// The early-update tolerance of a precision. fp32: [`PEER_LOSS_TOLERANCE`]. The others round
/// every product's inputs (tf32 and fp16 to 11 significant bits, bf16 to 8) and the two sides
/// round at different points (PyTorch's autocast rounds the bias to 16 bits and the weight
/// gradients too; gpukit keeps both in f32), so a loss moves by several units of the type's
/// roundoff (fp16/tf32 2^-11 = 4.9e-4, bf16 2^-8 = 3.9e-3): a wrong rule still shows far
/// above these.
pub fn peer_tolerance(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 => PEER_LOSS_TOLERANCE,
        Precision::Tf32 | Precision::Fp16 => 1e-2,
        Precision::Bf16 => 5e-2,
    }
}

/// The updates held to [`PEER_LOSS_TOLERANCE`]. Later, the two runs may drift apart: once a
/// ReLU input lies within rounding of zero on one side and not the other, the runs take
/// slightly different steps, and Adam's normalised steps amplify it (seen from about update
/// 40 on a 16-256x4-1 model: 1e-7 to 3e-4). Such drift is not a different training.
pub const PEER_EARLY_UPDATES: usize = 10;

/// How far apart the final losses may be after any drift: the same training ends within this.
pub const PEER_FINAL_TOLERANCE: f64 = 0.02;

/// PyTorch's run of the same loop.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainPeer {
    pub torch_version: String,
    pub device_name: Option<String>,
    pub step_losses: Vec<f64>,
    /// Every run's loop time.
    pub seconds: Vec<f64>,
    pub seconds_median: f64,
    /// gpukit's runs of the same loop (the first is the reported run), and their median.
    pub gpukit_seconds: Vec<f64>,
    pub gpukit_seconds_median: f64,
    /// Largest |gpukit - PyTorch| / |PyTorch| over the per-update losses, and where.
    pub max_relative_difference: f64,
    pub at_update: usize,
    /// The largest over the first [`PEER_EARLY_UPDATES`] updates, held to `tolerance`.
    #[serde(default)]
    pub early_difference: f64,
    pub tolerance: f64,
    /// The last update's relative difference, held to `final_tolerance`.
    #[serde(default)]
    pub final_difference: f64,
    #[serde(default)]
    pub final_tolerance: f64,
    /// PyTorch's peak of allocated GPU memory over its first run (torch.cuda.max_memory_allocated).
    #[serde(default)]
    pub peak_bytes: Option<u64>,
    /// gpukit's peak of live bytes in its memory pool over its first run.
    #[serde(default)]
    pub gpukit_peak_bytes: Option<u64>,
    /// Updates skipped on overflow (fp16) by PyTorch's GradScaler and by gpukit's scaler.
    #[serde(default)]
    pub skipped_updates: Option<(u64, u64)>,
}

impl TrainPeer {
    /// Whether the curves can be held to each other update by update: not when the two
    /// scalers skipped different updates (PyTorch's autocast rounds weight gradients to fp16,
    /// where they overflow sooner than gpukit's f32 ones).
    pub fn comparable(&self) -> bool {
        self.skipped_updates
            .is_none_or(|(theirs, ours)| theirs == ours)
    }

    /// Why the two runs are not the same training, if they are not: the first updates apart by
    /// more than rounding, or the final losses by more than drift explains (NaN fails too).
    pub fn disagreement(&self) -> Option<String> {
        if !self.comparable() {
            return None;
        }
        let within = |d: f64, t: f64| {
            matches!(
                d.partial_cmp(&t),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
        };
        if !within(self.early_difference, self.tolerance) {
            return Some(format!(
                "the first {PEER_EARLY_UPDATES} updates' losses differ from PyTorch's by up to {:.1e} \
                 (relative), over the tolerance {:.0e}: the two loops did not compute the same training",
                self.early_difference, self.tolerance
            ));
        }
        if !within(self.final_difference, self.final_tolerance) {
            return Some(format!(
                "the final loss differs from PyTorch's by {:.1e} (relative), over {:.0e}: the two \
                 runs did not end in the same place",
                self.final_difference, self.final_tolerance
            ));
        }
        None
    }
}

/// Runs the same loop in PyTorch on the CPU (the data, initial weights and every epoch's
/// order handed over as files) and times both sides `PEER_REPEATS` times from the same
/// weights.
pub(super) fn compare(
    cfg: &TrainConfig,
    train: &Dataset,
    initial: &Mlp<f32>,
    outcome: &RunOutcome,
    mut trainer: Option<&mut GpuTrainer>,
    precision: Precision,
    gpukit_skipped: u64,
) -> Result<TrainPeer> {
    let dir = handover_dir()?;
    let file = |name: &str| dir.path().join(name);
    train.save(&file("data.safetensors"))?;
    gpukit_train::export::save_weights(&file("init.safetensors"), initial)?;
    gpukit_train::export::save_order(
        &file("order.safetensors"),
        train.len(),
        cfg.epochs,
        cfg.seed,
        cfg.shuffle,
    )?;
    let resident = trainer
        .as_ref()
        .is_some_and(|t| t.loader() == Loader::Resident);
    write_config(dir.path(), cfg, precision.name(), resident)?;
    let path = |name: &str| file(name).display().to_string();
    let peer = crate::peer::run_pytorch(&[
        "train".into(),
        "--data".into(),
        path("data.safetensors"),
        "--init".into(),
        path("init.safetensors"),
        "--order".into(),
        path("order.safetensors"),
        "--config".into(),
        path("config.json"),
        "--repeats".into(),
        PEER_REPEATS.to_string(),
        "--device".into(),
        if trainer.is_some() { "cuda" } else { "cpu" }.into(),
    ])?;
    let row = peer.results.first().cloned().unwrap_or_default();
    let numbers = |key: &str| -> Vec<f64> {
        row[key]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default()
    };
    let (theirs, seconds) = (numbers("step_losses"), numbers("seconds"));
    let mut gpukit_seconds = vec![outcome.seconds];
    for _ in 1..PEER_REPEATS {
        let mut model = initial.clone();
        let mut opt = Optimizer::new(cfg.optimizer);
        let again = match trainer.as_deref_mut() {
            Some(t) => {
                t.load(&model, &opt, None)?;
                t.run(Position::default(), &mut |_| {})?.0
            }
            None => train_cpu(
                cfg,
                &mut model,
                &mut opt,
                Position::default(),
                train,
                None,
                &mut |_| {},
            )?,
        };
        gpukit_seconds.push(again.seconds);
    }
    let peak_bytes = row["peak_bytes"].as_u64();
    let (max_relative_difference, at_update) = loss_difference(&outcome.step_losses, &theirs)?;
    let early = PEER_EARLY_UPDATES.min(theirs.len());
    let (early_difference, _) = loss_difference(&outcome.step_losses[..early], &theirs[..early])?;
    let last = theirs.len().saturating_sub(1);
    let (final_difference, _) = loss_difference(&outcome.step_losses[last..], &theirs[last..])?;
    Ok(TrainPeer {
        torch_version: peer.torch_version,
        device_name: peer.device_name,
        seconds_median: median(&seconds)?,
        step_losses: theirs,
        seconds,
        gpukit_seconds_median: median(&gpukit_seconds)?,
        gpukit_seconds,
        max_relative_difference,
        at_update,
        early_difference,
        tolerance: peer_tolerance(precision),
        final_difference,
        final_tolerance: PEER_FINAL_TOLERANCE,
        peak_bytes,
        gpukit_peak_bytes: outcome.memory.pool_peak,
        skipped_updates: row["skipped_steps"]
            .as_u64()
            .map(|theirs| (theirs, gpukit_skipped)),
    })
}

/// `cfg` as the JSON file PyTorch's side reads (`config.json` in `dir`), with the precision and
/// whether the data stays on the GPU; returns its path.
pub(super) fn write_config(
    dir: &std::path::Path,
    cfg: &TrainConfig,
    precision: &str,
    resident: bool,
) -> Result<std::path::PathBuf> {
    let path = dir.join("config.json");
    let mut json = serde_json::to_value(cfg).map_err(|e| Error::Failed(e.to_string()))?;
    json["precision"] = precision.into();
    json["resident"] = resident.into();
    std::fs::write(&path, json.to_string()).map_err(|source| Error::Io {
        what: "the training config",
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// A temporary directory for the files a run hands PyTorch (removed when dropped).
pub(super) fn handover_dir() -> Result<tempfile::TempDir> {
    tempfile::tempdir().map_err(|source| Error::Io {
        what: "a temporary directory",
        path: std::env::temp_dir(),
        source,
    })
}

fn median(samples: &[f64]) -> Result<f64> {
    crate::stats::Summary::of(samples)
        .map(|s| s.median)
        .ok_or(Error::NoSamples)
}

/// The largest relative difference between the two loss curves and its update (from 1); a
/// curve of another length is a failure of the comparison itself.
fn loss_difference(ours: &[f64], theirs: &[f64]) -> Result<(f64, usize)> {
    if ours.len() != theirs.len() {
        return Err(Error::Failed(format!(
            "PyTorch made {} updates, gpukit {}: the two loops did not follow the same batches",
            theirs.len(),
            ours.len()
        )));
    }
    let scale = theirs
        .iter()
        .fold(0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    Ok(ours
        .iter()
        .zip(theirs)
        .enumerate()
        .map(|(i, (a, b))| ((a - b).abs() / b.abs().max(1e-6 * scale), i + 1))
        .fold((0.0, 0), |best, x| {
            if x.0 > best.0 || x.0.is_nan() {
                x
            } else {
                best
            }
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_curves_are_compared_update_by_update() {
        let ours = [1.0, 0.5, 0.25, 0.125];
        let (d, at) = loss_difference(&ours, &ours).unwrap();
        assert_eq!((d, at), (0.0, 0));
        let theirs = [1.0, 0.5, 0.26, 0.125];
        let (d, at) = loss_difference(&ours, &theirs).unwrap();
        assert!((d - 0.01 / 0.26).abs() < 1e-12 && at == 3, "{d} {at}");
        let nan = [1.0, f64::NAN, 0.25, 0.125];
        assert!(loss_difference(&nan, &theirs).unwrap().0.is_nan());
        let e = loss_difference(&ours, &theirs[..3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("PyTorch made 3 updates, gpukit 4"), "{e}");
    }
}
