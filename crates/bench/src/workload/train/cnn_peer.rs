//! `gpukit train --model NAME --compare-pytorch`: torchvision's ResNet trained by the PyTorch
//! reference script (`train-cnn`) from the same initial weights on the same images in the same
//! order, with the same optimizer, precision and batch: eager, torch.compile, and
//! torch.compile with CUDA graphs and the fused optimizer (PyTorch's fastest training in run 95).
//! Each mode's per-update losses, images a second, first update and peak memory stand beside
//! gpukit's.
//!
//! What is held: the first update's loss (the same weights and batch before any update: the
//! forward pass and the loss) against eager PyTorch's, within the precision's tolerance
//! ([`super::peer::peer_tolerance`]). Later losses are reported, not held: a ResNet's trajectory
//! parts by more than rounding within a few updates in any two engines, PyTorch's f32 against
//! its own float64 included (runs 94 and 95).

use crate::error::{Error, Result};
use gpukit_train::cnn::data::Images;
use gpukit_train::cnn::optim::CnnOptimizerConfig;
use gpukit_train::cnn::resnet::ResNet;
use gpukit_train::cnn::run::LoopConfig;
use gpukit_train::optim::OptimizerKind;
use gpukit_train::precision::Precision;
use serde::{Deserialize, Serialize};

/// PyTorch's modes beside gpukit: its eager loop, torch.compile, and torch.compile with CUDA
/// graphs and the fused optimizer.
pub const MODES: &str = "eager,compile,compile_graphs";

/// One mode of PyTorch's training.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CnnPeerRow {
    pub mode: String,
    /// Why the mode gave no figures (a compiler missing, memory), when it did not.
    pub failed: Option<String>,
    pub images_per_s: Option<f64>,
    /// The median of its timed updates.
    pub step_ms: Option<f64>,
    /// The first update's seconds (compilation included).
    pub first_step_s: Option<f64>,
    pub peak_bytes: Option<u64>,
    pub losses: Vec<f64>,
}

/// PyTorch's run beside gpukit's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnPeer {
    pub torch_version: String,
    pub device_name: Option<String>,
    pub rows: Vec<CnnPeerRow>,
    /// |gpukit - eager| / |eager| of the first update's loss, held to `tolerance`.
    pub first_difference: f64,
    pub tolerance: f64,
    /// The largest relative difference over the compared updates (reported), and where (1-based).
    pub max_difference: f64,
    pub at_update: usize,
    /// Each residual block ran under torch.utils.checkpoint (gpukit's run recomputed its
    /// blocks' maps).
    #[serde(default)]
    pub checkpoint: bool,
}

impl CnnPeer {
    /// Why the two runs are not the same training, if they are not.
    pub fn disagreement(&self) -> Option<String> {
        match self.first_difference.partial_cmp(&self.tolerance) {
            Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal) => None,
            _ => Some(format!(
                "the first update's loss differs from PyTorch's by {:.1e} (relative), over the \
                 tolerance {:.0e}: the same weights and images did not give the same loss",
                self.first_difference, self.tolerance
            )),
        }
    }

    /// PyTorch's fastest mode that ran.
    pub fn best(&self) -> Option<&CnnPeerRow> {
        self.rows
            .iter()
            .filter(|r| r.images_per_s.is_some())
            .max_by(|a, b| {
                a.images_per_s
                    .partial_cmp(&b.images_per_s)
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
    }
}

/// What the comparison hands PyTorch.
pub struct Handover<'a> {
    /// torchvision's name of the network (`resnet50`).
    pub model: &'a str,
    pub initial: &'a ResNet<f32>,
    pub images: &'a Images,
    pub cfg: &'a LoopConfig,
    pub precision: Precision,
    pub opt: CnnOptimizerConfig,
    pub smoothing: f64,
    /// gpukit recomputed each block's maps: PyTorch runs each block under
    /// torch.utils.checkpoint.
    pub checkpoint: bool,
}

/// Runs PyTorch's side on the handed-over run and compares it with gpukit's losses.
pub fn compare(h: &Handover<'_>, gpukit_losses: &[f64]) -> Result<CnnPeer> {
    let dir = super::peer::handover_dir()?;
    let file = |name: &str| dir.path().join(name);
    gpukit_train::export::save_resnet(&file("init.safetensors"), h.initial)?;
    gpukit_train::export::save_images(&file("data.safetensors"), h.images)?;
    gpukit_train::export::save_update_order(
        &file("order.safetensors"),
        &h.cfg.update_batches(h.images.len())?,
    )?;
    let path = |name: &str| file(name).display().to_string();
    let o = h.opt;
    let mut args: Vec<String> = vec![
        "train-cnn".into(),
        "--model".into(),
        h.model.into(),
        "--classes".into(),
        h.initial.classes.to_string(),
        "--batch-size".into(),
        h.cfg.batch_size.to_string(),
        "--precision".into(),
        h.precision.name().into(),
        "--optimizer".into(),
        match o.kind {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam | OptimizerKind::AdamW => "adamw",
        }
        .into(),
        "--lr".into(),
        o.lr.to_string(),
        "--momentum".into(),
        o.momentum.to_string(),
        "--weight-decay".into(),
        o.weight_decay.to_string(),
        "--label-smoothing".into(),
        h.smoothing.to_string(),
        "--init".into(),
        path("init.safetensors"),
        "--data".into(),
        path("data.safetensors"),
        "--order".into(),
        path("order.safetensors"),
        // as many updates as gpukit's: the first, then the rest timed
        "--warmup".into(),
        "0".into(),
        "--steps".into(),
        h.cfg.steps.saturating_sub(1).max(1).to_string(),
        "--loss-steps".into(),
        h.cfg.steps.to_string(),
        "--modes".into(),
        MODES.into(),
    ];
    if o.nesterov {
        args.push("--nesterov".into());
    }
    if h.checkpoint {
        args.push("--checkpoint".into());
    }
    let run = crate::peer::run_pytorch(&args)?;
    let rows: Vec<CnnPeerRow> = run
        .results
        .iter()
        .map(|r| CnnPeerRow {
            mode: r["mode"].as_str().unwrap_or("?").to_string(),
            failed: (r["status"] != "ok")
                .then(|| r["reason"].as_str().unwrap_or("failed").to_string()),
            images_per_s: r["images_per_s"].as_f64(),
            step_ms: r["step_ms"]["median_ms"].as_f64(),
            first_step_s: r["first_step_s"].as_f64(),
            peak_bytes: r["peak_allocated_bytes"].as_u64(),
            losses: r["losses"]
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
                .unwrap_or_default(),
        })
        .collect();
    let eager = rows
        .iter()
        .find(|r| r.mode == "eager" && r.failed.is_none())
        .ok_or_else(|| {
            Error::Peer(format!(
                "PyTorch's eager training gave no losses: {}",
                rows.iter()
                    .find(|r| r.mode == "eager")
                    .and_then(|r| r.failed.clone())
                    .unwrap_or_else(|| "no eager row".into())
            ))
        })?;
    let (first_difference, (max_difference, at_update)) =
        differences(gpukit_losses, &eager.losses)?;
    Ok(CnnPeer {
        torch_version: run.torch_version,
        device_name: run.device_name,
        first_difference,
        tolerance: super::peer::peer_tolerance(h.precision),
        max_difference,
        at_update,
        checkpoint: h.checkpoint,
        rows,
    })
}

/// The first update's relative difference, and the largest over the updates both have with
/// its 1-based update (NaN anywhere is the largest).
fn differences(ours: &[f64], theirs: &[f64]) -> Result<(f64, (f64, usize))> {
    let rel = |a: f64, b: f64| {
        let d = (a - b).abs() / b.abs().max(1e-30);
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    };
    let pairs: Vec<f64> = ours.iter().zip(theirs).map(|(&a, &b)| rel(a, b)).collect();
    let first = *pairs
        .first()
        .ok_or_else(|| Error::Peer("no update's loss to compare".into()))?;
    let (at, max) = pairs.iter().enumerate().fold(
        (0, 0.0f64),
        |(i, m), (j, &d)| if d > m { (j, d) } else { (i, m) },
    );
    Ok((first, (max, at + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_update_is_held_the_rest_reported() {
        let (first, (max, at)) = differences(&[2.0, 1.5, 1.2], &[2.0 + 2e-6, 1.5, 1.0]).unwrap();
        assert!((first - 1e-6).abs() < 1e-9);
        assert!((max - 0.2).abs() < 1e-12 && at == 3);
        let (nan, _) = differences(&[f64::NAN], &[1.0]).unwrap();
        assert!(nan.is_infinite());
        assert!(differences(&[], &[1.0]).is_err());
        let peer = |first_difference| CnnPeer {
            torch_version: "2.11".into(),
            device_name: None,
            rows: vec![
                CnnPeerRow {
                    mode: "eager".into(),
                    images_per_s: Some(100.0),
                    ..Default::default()
                },
                CnnPeerRow {
                    mode: "compile".into(),
                    failed: Some("no compiler".into()),
                    ..Default::default()
                },
                CnnPeerRow {
                    mode: "compile_graphs".into(),
                    images_per_s: Some(150.0),
                    ..Default::default()
                },
            ],
            first_difference,
            tolerance: 1e-4,
            max_difference: 0.1,
            at_update: 5,
            checkpoint: false,
        };
        assert!(peer(1e-6).disagreement().is_none());
        assert!(peer(1e-3).disagreement().unwrap().contains("first update"));
        assert!(peer(f64::INFINITY).disagreement().is_some());
        assert_eq!(peer(0.0).best().unwrap().mode, "compile_graphs");
    }
}
