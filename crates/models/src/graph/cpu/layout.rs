//! Operators that move elements without arithmetic: transpose, concat and gather (any type).

use super::real::Real;
use super::{int, real, strides, Elems, Tensor, View};

/// Applies `f` to the elements of `data`, whichever their type.
macro_rules! each_type {
    ($data:expr, |$v:ident| $body:expr) => {
        match $data {
            Elems::Real($v) => real($body),
            Elems::I64($v) => int($body),
        }
    };
}

fn transpose_t<T: Copy>(x: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    // the input stride of each output axis
    let ist: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let mut out = Vec::with_capacity(x.len());
    let mut idx = vec![0usize; out_shape.len()];
    for _ in 0..x.len() {
        let at: usize = idx.iter().zip(&ist).map(|(i, s)| i * s).sum();
        out.push(x[at]);
        // the next output index, last axis fastest
        for a in (0..idx.len()).rev() {
            idx[a] += 1;
            if idx[a] < out_shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    out
}

/// Output axis `i` is input axis `perm[i]`.
pub(super) fn transpose<T: Real>(x: View<T>, perm: &[usize]) -> Tensor<'static, T> {
    each_type!(x.data, |v| transpose_t(v, x.shape, perm))
}

fn concat_t<T: Copy>(parts: &[(&[T], &[usize])], axis: usize) -> Vec<T> {
    let outer: usize = parts.first().map_or(1, |(_, s)| s[..axis].iter().product());
    let mut out = Vec::with_capacity(parts.iter().map(|(d, _)| d.len()).sum());
    for o in 0..outer {
        for (d, s) in parts {
            let run: usize = s[axis..].iter().product();
            out.extend_from_slice(&d[o * run..(o + 1) * run]);
        }
    }
    out
}

/// The inputs joined along `axis` (all of one type, checked by inference).
pub(super) fn concat<T: Real>(
    inputs: &[View<T>],
    axis: usize,
) -> Result<Tensor<'static, T>, String> {
    match inputs.first().map(|v| v.data) {
        Some(Elems::Real(_)) => {
            let parts = inputs
                .iter()
                .map(|v| v.real().map(|d| (d, v.shape)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(real(concat_t(&parts, axis)))
        }
        Some(Elems::I64(_)) => {
            let parts = inputs
                .iter()
                .map(|v| match v.data {
                    Elems::I64(d) => Ok((d, v.shape)),
                    Elems::Real(_) => Err("inputs of two types"),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(int(concat_t(&parts, axis)))
        }
        None => Err("takes at least one input".into()),
    }
}

fn gather_t<T: Copy>(x: &[T], shape: &[usize], axis: usize, idx: &[usize]) -> Vec<T> {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let dim = shape[axis];
    let mut out = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &i in idx {
            let at = (o * dim + i) * inner;
            out.extend_from_slice(&x[at..at + inner]);
        }
    }
    out
}

/// The slices of `axis` that the i64 indices (negative ones counting from the end) pick.
pub(super) fn gather<T: Real>(
    inputs: &[View<T>],
    axis: usize,
) -> Result<Tensor<'static, T>, String> {
    let [x, indices] = inputs else {
        return Err("takes data and indices".into());
    };
    let dim = *x.shape.get(axis).ok_or("axis out of range")?;
    let Elems::I64(indices) = indices.data else {
        return Err("indices must be i64".into());
    };
    let idx = indices
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + dim as i64 } else { i };
            usize::try_from(j)
                .ok()
                .filter(|&j| j < dim)
                .ok_or_else(|| format!("index {i} is out of range for axis {axis} of size {dim}"))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    Ok(each_type!(x.data, |v| gather_t(v, x.shape, axis, &idx)))
}
