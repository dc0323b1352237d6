//! How a strategy's logits are judged: agreement with a reference on the same input, the
//! tolerance of each precision, and the verdict.

use gpukit_tensor::DType;
use serde::{Deserialize, Serialize};

/// How a strategy's logits compare with a reference on the same input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Agreement {
    pub max_abs: f64,
    /// max |a - b| over max |reference|.
    pub max_rel: f64,
    /// Fraction of images whose top-1 class is the same.
    pub top1: f64,
}

/// Compares `got` with `reference` (both `batch x classes`; the reference in f32, or in f64
/// where it is a float64 computation).
pub fn agreement<R: Copy + Into<f64>>(got: &[f32], reference: &[R], classes: usize) -> Agreement {
    let max_ref = reference.iter().fold(0f64, |m, &v| m.max(v.into().abs()));
    let max_abs = got.iter().zip(reference).fold(0f64, |m, (&a, &b)| {
        let d = (f64::from(a) - b.into()).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            m.max(d)
        }
    });
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

/// The index of the first largest value (NaN never wins).
fn argmax<T: Copy + Into<f64>>(v: &[T]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, &x)| {
            let x = x.into();
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0
}

/// Largest max_rel (as [`agreement`] computes it) a GPU precision may show against the GPU fp32
/// reference on the same input.
pub fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 | DType::F32 => 1e-4,
        DType::Tf32 | DType::F16 => 1e-2,
        DType::Bf16 => 5e-2,
        // the inference engine runs no fp8 (ENGINE_DTYPES): nothing can pass
        DType::F8E4M3 => 0.0,
    }
}

/// Largest max_rel a GPU precision of a user's graph (`infer --onnx`, the general engine) may
/// show against an f32 reference on the same input (ONNX Runtime's, or gpukit's interpreter's):
/// ONNX Runtime's own bound for f32; for tf32, f16 and bf16 a bound that a broken step exceeds
/// by far but 50 layers of 10-bit (tf32, f16) or 7-bit mantissas stay under on a model whose
/// logits are of order one (ResNet-50 with measured batch-norm statistics: 2.4-3.4e-2 in f16 on
/// both GPU engines, 1.6e-2 in tf32, every top-1 class the same). Top-1 agreement is shown
/// beside, not judged.
pub fn graph_tolerance(d: DType) -> f64 {
    match d {
        DType::F64 | DType::F32 => 1e-5,
        DType::Tf32 | DType::F16 => 5e-2,
        DType::Bf16 => 1e-1,
        // the engines run no fp8 (ENGINE_DTYPES): no row of it can pass
        DType::F8E4M3 => 0.0,
    }
}

/// Why logits fail, or None when they pass: all finite, and max_rel within `tolerance`. Top-1
/// agreement is shown, not judged (random-weight logits can be close enough for rounding to
/// swap the top class).
pub fn verdict(got: &[f32], a: &Agreement, tolerance: f64) -> Option<String> {
    let bad = got.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 {
        return Some(format!(
            "{bad} of {} logits are not finite (NaN or infinite)",
            got.len()
        ));
    }
    if a.max_rel.is_nan() || a.max_rel > tolerance {
        return Some(format!(
            "logits differ from the reference: max relative difference {:.1e} is over the tolerance {:.0e} (max abs {:.2e}, top-1 agreement {:.0}%)",
            a.max_rel,
            tolerance,
            a.max_abs,
            a.top1 * 100.0
        ));
    }
    None
}
