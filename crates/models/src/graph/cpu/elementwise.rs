//! Element-wise operators: the activations, erf, and Add/Sub/Mul/Div with numpy broadcasting
//! (f32, and i64 for shape arithmetic, where overflow and division by zero are errors).

use super::{broadcast_strides, View};
use crate::graph::{Activation, Binary, Data};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// One activation of one value.
pub(crate) fn activate(a: Activation, x: f32) -> f32 {
    match a {
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
        Activation::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        Activation::Gelu => gelu(x),
        Activation::Silu => x / (1.0 + (-x).exp()),
    }
}

/// GELU's exact form, in f64.
fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// `a` applied to every element.
pub(super) fn activation(a: Activation, x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    out.par_chunks_mut(CHUNK)
        .for_each(|c| c.iter_mut().for_each(|v| *v = activate(a, *v)));
    out
}

/// erf of every element (computed in f64).
pub(super) fn erf(x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    out.par_chunks_mut(CHUNK).for_each(|c| {
        c.iter_mut()
            .for_each(|v| *v = libm::erf(f64::from(*v)) as f32)
    });
    out
}

/// `a op b` broadcast to `out_shape`, row by row along the last axis.
fn broadcast_apply<T: Copy + Send + Sync + Default>(
    (a, a_shape): (&[T], &[usize]),
    (b, b_shape): (&[T], &[usize]),
    out_shape: &[usize],
    f: impl Fn(T, T) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let count: usize = out_shape.iter().product();
    let mut out = vec![T::default(); count];
    if count == 0 {
        return Ok(out);
    }
    let sa = broadcast_strides(a_shape, out_shape);
    let sb = broadcast_strides(b_shape, out_shape);
    let rank = out_shape.len();
    let row = out_shape.last().copied().unwrap_or(1).max(1);
    let (ia, ib) = (
        sa.last().copied().unwrap_or(0),
        sb.last().copied().unwrap_or(0),
    );
    // rows per task: about CHUNK elements
    let rows_per = (CHUNK / row).max(1);
    out.par_chunks_mut(row * rows_per)
        .enumerate()
        .try_for_each(|(t, chunk)| {
            for (k, o) in chunk.chunks_mut(row).enumerate() {
                // the offsets of this row's first element in a and b
                let mut rest = t * rows_per + k;
                let (mut oa, mut ob) = (0usize, 0usize);
                for axis in (0..rank.saturating_sub(1)).rev() {
                    let i = rest % out_shape[axis];
                    rest /= out_shape[axis];
                    oa += i * sa[axis];
                    ob += i * sb[axis];
                }
                for (j, v) in o.iter_mut().enumerate() {
                    *v = f(a[oa + j * ia], b[ob + j * ib])?;
                }
            }
            Ok::<(), String>(())
        })?;
    Ok(out)
}

fn i64_op(op: Binary, x: i64, y: i64) -> Result<i64, String> {
    let r = match op {
        Binary::Add => x.checked_add(y),
        Binary::Sub => x.checked_sub(y),
        Binary::Mul => x.checked_mul(y),
        Binary::Div if y == 0 => return Err("integer division by zero".into()),
        Binary::Div => x.checked_div(y),
    };
    r.ok_or_else(|| format!("{x} {} {y} overflows", op.name()))
}

/// `op` on two inputs of one type, broadcast to `out_shape`.
pub(super) fn binary(op: Binary, inputs: &[View], out_shape: &[usize]) -> Result<Data, String> {
    let [a, b] = inputs else {
        return Err("takes two inputs".into());
    };
    match (a.data, b.data) {
        (Data::F32(x), Data::F32(y)) => {
            let f = match op {
                Binary::Add => |x: f32, y: f32| x + y,
                Binary::Sub => |x: f32, y: f32| x - y,
                Binary::Mul => |x: f32, y: f32| x * y,
                Binary::Div => |x: f32, y: f32| x / y,
            };
            broadcast_apply((x, a.shape), (y, b.shape), out_shape, |x, y| Ok(f(x, y)))
                .map(Data::F32)
        }
        (Data::I64(x), Data::I64(y)) => {
            broadcast_apply((x, a.shape), (y, b.shape), out_shape, |x, y| {
                i64_op(op, x, y)
            })
            .map(Data::I64)
        }
        _ => Err("inputs of two types".into()),
    }
}
