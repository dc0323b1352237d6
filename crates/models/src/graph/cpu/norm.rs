//! Normalizations: inference batch norm (per channel, axis 1), layer norm (over the axes from
//! `axis` on, statistics in f64), and ReduceMean over any axes.

use super::real::Real;
use super::{broadcast_strides, strides, View};
use rayon::prelude::*;

/// `(x - mean) / sqrt(var + epsilon) * scale + bias`, per channel of axis 1.
pub(super) fn batch_norm<T: Real>(epsilon: f32, inputs: &[View<T>]) -> Result<Vec<T>, String> {
    let [x, scale, bias, mean, var] = inputs else {
        return Err("takes five inputs".into());
    };
    let (data, c) = (
        x.real()?,
        x.shape.get(1).copied().ok_or("input has no axis 1")?,
    );
    let (scale, bias, mean, var) = (scale.real()?, bias.real()?, mean.real()?, var.real()?);
    let plane: usize = x.shape.iter().skip(2).product();
    // per channel y = a * x + b, a and b in f64
    let ab: Vec<(f64, f64)> = (0..c)
        .map(|i| {
            let a = scale[i].to_f64() / (var[i].to_f64() + f64::from(epsilon)).sqrt();
            (a, bias[i].to_f64() - mean[i].to_f64() * a)
        })
        .collect();
    let mut out = data.to_vec();
    out.par_chunks_mut(plane.max(1))
        .enumerate()
        .for_each(|(i, o)| {
            let (a, b) = ab[i % c];
            o.iter_mut()
                .for_each(|v| *v = T::from_f64(a * v.to_f64() + b));
        });
    Ok(out)
}

/// `p` (of a shape broadcasting to `normalized`) expanded to all of `normalized`'s elements.
fn expand<T: Real>(p: &View<T>, normalized: &[usize]) -> Result<Vec<T>, String> {
    let data = p.real()?;
    let st = broadcast_strides(p.shape, normalized);
    let count: usize = normalized.iter().product();
    Ok((0..count)
        .map(|mut i| {
            let mut at = 0;
            for a in (0..normalized.len()).rev() {
                at += (i % normalized[a]) * st[a];
                i /= normalized[a];
            }
            data[at]
        })
        .collect())
}

/// Layer normalization over the axes from `axis` on, then `* scale + bias`.
pub(super) fn layer_norm<T: Real>(
    axis: usize,
    epsilon: f32,
    inputs: &[View<T>],
) -> Result<Vec<T>, String> {
    let x = inputs.first().ok_or("takes an input")?;
    let normalized = x.shape.get(axis..).ok_or("axis out of range")?;
    let d: usize = normalized.iter().product();
    if d == 0 {
        return Err("normalizes over no elements".into());
    }
    let scale = expand(inputs.get(1).ok_or("the scale is missing")?, normalized)?;
    let bias = match inputs.get(2) {
        Some(b) => expand(b, normalized)?,
        None => vec![T::ZERO; d],
    };
    let mut out = x.real()?.to_vec();
    out.par_chunks_mut(d).for_each(|row| {
        let mean = row.iter().map(|&v| v.to_f64()).sum::<f64>() / d as f64;
        let var = row
            .iter()
            .map(|&v| (v.to_f64() - mean).powi(2))
            .sum::<f64>()
            / d as f64;
        let inv = 1.0 / (var + f64::from(epsilon)).sqrt();
        for ((v, &s), &b) in row.iter_mut().zip(&scale).zip(&bias) {
            *v = T::from_f64((v.to_f64() - mean) * inv * s.to_f64() + b.to_f64());
        }
    });
    Ok(out)
}

/// The mean over `axes` (the output has `out_shape`'s element count, reduced axes of size 1 or
/// gone).
pub(super) fn reduce_mean<T: Real>(
    axes: &[usize],
    x: View<T>,
    out_shape: &[usize],
) -> Result<Vec<T>, String> {
    let data = x.real()?;
    // the output's strides in the input's rank, 0 along the reduced axes
    let kept: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(a, &d)| if axes.contains(&a) { 1 } else { d })
        .collect();
    let ks = strides(&kept);
    let os: Vec<usize> = (0..x.shape.len())
        .map(|a| if axes.contains(&a) { 0 } else { ks[a] })
        .collect();
    let count: usize = out_shape.iter().product();
    let mut sums = vec![0f64; count];
    for (i, &v) in data.iter().enumerate() {
        let (mut rest, mut at) = (i, 0);
        for a in (0..x.shape.len()).rev() {
            at += (rest % x.shape[a]) * os[a];
            rest /= x.shape[a];
        }
        sums[at] += v.to_f64();
    }
    let n = (data.len() / count.max(1)).max(1) as f64;
    Ok(sums.into_iter().map(|s| T::from_f64(s / n)).collect())
}
