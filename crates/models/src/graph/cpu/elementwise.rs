//! Element-wise operators: the activations, erf, and Add/Sub/Mul/Div with numpy broadcasting
//! (floats, and i64 for shape arithmetic, where overflow and division by zero are errors).

use super::real::Real;
use super::{broadcast_strides, int, real, Elems, Tensor, View};
use crate::graph::{Activation, Binary};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// One activation of one value.
pub(crate) fn activate<T: Real>(a: Activation, x: T) -> T {
    let (zero, one) = (T::ZERO, T::ONE);
    match a {
        Activation::Relu => x.max(zero),
        Activation::Sigmoid => one / (one + (-x).exp()),
        Activation::HardSigmoid { alpha, beta } => {
            (T::from_f32(alpha) * x + T::from_f32(beta)).clamp(zero, one)
        }
        Activation::HardSwish => x * (x / T::from_f32(6.0) + T::from_f32(0.5)).clamp(zero, one),
        Activation::Gelu => gelu(x),
        Activation::Silu => x / (one + (-x).exp()),
    }
}

/// GELU's exact form, in f64.
fn gelu<T: Real>(x: T) -> T {
    let x = x.to_f64();
    T::from_f64(0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)))
}

/// `a` applied to every element.
pub(super) fn activation<T: Real>(a: Activation, x: &[T]) -> Vec<T> {
    let mut out = x.to_vec();
    out.par_chunks_mut(CHUNK)
        .for_each(|c| c.iter_mut().for_each(|v| *v = activate(a, *v)));
    out
}

/// erf of every element (computed in f64).
pub(super) fn erf<T: Real>(x: &[T]) -> Vec<T> {
    let mut out = x.to_vec();
    out.par_chunks_mut(CHUNK).for_each(|c| {
        c.iter_mut()
            .for_each(|v| *v = T::from_f64(libm::erf(v.to_f64())))
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
pub(super) fn binary<T: Real>(
    op: Binary,
    inputs: &[View<T>],
    out_shape: &[usize],
) -> Result<Tensor<'static, T>, String> {
    let [a, b] = inputs else {
        return Err("takes two inputs".into());
    };
    match (a.data, b.data) {
        (Elems::Real(x), Elems::Real(y)) => {
            let f = match op {
                Binary::Add => |x: T, y: T| x + y,
                Binary::Sub => |x: T, y: T| x - y,
                Binary::Mul => |x: T, y: T| x * y,
                Binary::Div => |x: T, y: T| x / y,
            };
            broadcast_apply((x, a.shape), (y, b.shape), out_shape, |x, y| Ok(f(x, y))).map(real)
        }
        (Elems::I64(x), Elems::I64(y)) => {
            broadcast_apply((x, a.shape), (y, b.shape), out_shape, |x, y| {
                i64_op(op, x, y)
            })
            .map(int)
        }
        _ => Err("inputs of two types".into()),
    }
}
