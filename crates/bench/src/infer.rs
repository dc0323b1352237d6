//! `infer` on the CPU: gpukit's own ResNet inference (batch norm folded, im2col + gemm) against
//! ONNX Runtime's CPU provider running the same weights, per batch size; every strategy's logits
//! checked against gpukit's f32 CPU path. GPU strategies join this table with the GPU engine.

use crate::harness::{time_host, Measurement, Plan};
use crate::matmul::RowStatus;
use crate::random::{fresh_seed, uniform_f32};
use gpukit_models::forward::{fold, FoldedResNet};
use gpukit_models::onnx::export_resnet;
use gpukit_models::ort_runner::{find_onnxruntime, OrtModel};
use gpukit_models::weights::{load_safetensors, seeded_init, WeightsError};
use gpukit_models::ResNet;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct InferOptions {
    pub model: ResNet,
    pub batch_sizes: Vec<usize>,
    pub iterations: usize,
    /// A torchvision state_dict as safetensors; None: seeded initialisation (seed 0).
    pub weights: Option<PathBuf>,
    pub image_size: usize,
    /// Longest one row may run, in seconds (fewer repetitions then, said in the count).
    pub budget_s: f64,
}

/// How a strategy's logits compare with gpukit's f32 CPU reference on the same input.
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
    pub strategy: String,
    pub device: String,
    pub batch: usize,
    pub status: RowStatus,
    pub timing: Option<Measurement>,
    pub images_per_s: Option<f64>,
    /// Over gpukit's f32 CPU path at the same batch size.
    pub speedup_vs_reference: Option<f64>,
    pub agreement: Option<Agreement>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferReport {
    pub model: String,
    pub parameters: usize,
    pub weights: String,
    pub image_size: usize,
    pub cpu_threads: usize,
    pub rows: Vec<InferRow>,
    /// Why ONNX Runtime's rows are absent, when they are.
    pub onnxruntime_unavailable: Option<String>,
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

fn row(strategy: &str, batch: usize) -> InferRow {
    InferRow {
        strategy: strategy.to_string(),
        device: "cpu".into(),
        batch,
        status: RowStatus::Ok,
        timing: None,
        images_per_s: None,
        speedup_vs_reference: None,
        agreement: None,
    }
}

/// Runs every CPU strategy at every batch size.
pub fn run_infer(
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
    };
    let mut ort = match find_onnxruntime()
        .and_then(|lib| OrtModel::new(&lib, &export_resnet(&folded), gpukit_tensor::cpu::threads()))
    {
        Ok(m) => Some(m),
        Err(e) => {
            report.onnxruntime_unavailable = Some(e);
            None
        }
    };
    let s = opts.image_size;
    for &n in &opts.batch_sizes {
        let x = uniform_f32(n * 3 * s * s, fresh_seed());
        progress(&format!("infer cpu gpukit f32 batch {n}"));
        let plan = Plan::new(1, opts.iterations).with_budget(opts.budget_s);
        let mut reference = Vec::new();
        let mut r = row("gpukit f32 (folded BN, im2col+gemm)", n);
        let mut ws = gpukit_models::forward::Workspace::default();
        match time_host(plan, || {
            reference = folded.forward_cpu_with(&x, n, s, s, &mut ws)?;
            Ok::<(), gpukit_models::forward::ForwardError>(())
        }) {
            Ok(t) => {
                r.images_per_s = Some(n as f64 / (t.summary_ms.median / 1e3));
                r.speedup_vs_reference = Some(1.0);
                r.timing = Some(t);
            }
            Err(e) => r.status = RowStatus::Failed(e.to_string()),
        }
        let reference_rate = r.images_per_s;
        report.rows.push(r);
        if let Some(m) = ort.as_mut() {
            progress(&format!("infer cpu onnxruntime batch {n}"));
            let mut r = row("ONNX Runtime CPU (same weights)", n);
            let mut out = Vec::new();
            match time_host(plan, || {
                out = m.run(&x, n, s, s)?;
                Ok::<(), String>(())
            }) {
                Ok(t) => {
                    let a = agreement(&out, &reference, classes);
                    if a.max_rel > 1e-3 || a.top1 < 1.0 {
                        r.status = RowStatus::Failed(format!(
                            "logits differ from gpukit's: max relative {:.1e}, top-1 agreement {:.0}%",
                            a.max_rel,
                            a.top1 * 100.0
                        ));
                    } else {
                        let rate = n as f64 / (t.summary_ms.median / 1e3);
                        r.images_per_s = Some(rate);
                        r.speedup_vs_reference = reference_rate.map(|g| rate / g);
                        r.timing = Some(t);
                    }
                    r.agreement = Some(a);
                }
                Err(e) => r.status = RowStatus::Failed(e.to_string()),
            }
            report.rows.push(r);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn cpu_inference_runs_and_ort_rows_agree_where_present() {
        let opts = InferOptions {
            model: ResNet::R18,
            batch_sizes: vec![1, 2],
            iterations: 2,
            weights: None,
            image_size: 48,
            budget_s: 5.0,
        };
        let r = run_infer(&opts, &mut |_| {}).unwrap();
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
    }
}
