//! Normalizations: inference batch norm (per channel, axis 1), layer norm (over the axes from
//! `axis` on, statistics in f64), and ReduceMean over any axes.

use super::{broadcast_strides, strides, View};
use rayon::prelude::*;

/// `(x - mean) / sqrt(var + epsilon) * scale + bias`, per channel of axis 1.
pub(super) fn batch_norm(epsilon: f32, inputs: &[View]) -> Result<Vec<f32>, String> {
    let [x, scale, bias, mean, var] = inputs else {
        return Err("takes five inputs".into());
    };
    let (data, c) = (
        x.f32()?,
        x.shape.get(1).copied().ok_or("input has no axis 1")?,
    );
    let (scale, bias, mean, var) = (scale.f32()?, bias.f32()?, mean.f32()?, var.f32()?);
    let plane: usize = x.shape.iter().skip(2).product();
    // per channel y = a * x + b, a and b in f64
    let ab: Vec<(f64, f64)> = (0..c)
        .map(|i| {
            let a = f64::from(scale[i]) / (f64::from(var[i]) + f64::from(epsilon)).sqrt();
            (a, f64::from(bias[i]) - f64::from(mean[i]) * a)
        })
        .collect();
    let mut out = data.to_vec();
    out.par_chunks_mut(plane.max(1))
        .enumerate()
        .for_each(|(i, o)| {
            let (a, b) = ab[i % c];
            o.iter_mut()
                .for_each(|v| *v = (a * f64::from(*v) + b) as f32);
        });
    Ok(out)
}

/// `p` (of a shape broadcasting to `normalized`) expanded to all of `normalized`'s elements.
fn expand(p: &View, normalized: &[usize]) -> Result<Vec<f32>, String> {
    let data = p.f32()?;
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
pub(super) fn layer_norm(axis: usize, epsilon: f32, inputs: &[View]) -> Result<Vec<f32>, String> {
    let x = inputs.first().ok_or("takes an input")?;
    let normalized = x.shape.get(axis..).ok_or("axis out of range")?;
    let d: usize = normalized.iter().product();
    if d == 0 {
        return Err("normalizes over no elements".into());
    }
    let scale = expand(inputs.get(1).ok_or("the scale is missing")?, normalized)?;
    let bias = match inputs.get(2) {
        Some(b) => expand(b, normalized)?,
        None => vec![0.0; d],
    };
    let mut out = x.f32()?.to_vec();
    out.par_chunks_mut(d).for_each(|row| {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / d as f64;
        let inv = 1.0 / (var + f64::from(epsilon)).sqrt();
        for ((v, &s), &b) in row.iter_mut().zip(&scale).zip(&bias) {
            *v = ((f64::from(*v) - mean) * inv * f64::from(s) + f64::from(b)) as f32;
        }
    });
    Ok(out)
}

/// The mean over `axes` (the output has `out_shape`'s element count, reduced axes of size 1 or
/// gone).
pub(super) fn reduce_mean(
    axes: &[usize],
    x: View,
    out_shape: &[usize],
) -> Result<Vec<f32>, String> {
    let data = x.f32()?;
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
        sums[at] += f64::from(v);
    }
    let n = (data.len() / count.max(1)).max(1) as f64;
    Ok(sums.into_iter().map(|s| (s / n) as f32).collect())
}
