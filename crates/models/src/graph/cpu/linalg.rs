//! Gemm and MatMul through the tensor crate's gemm (numpy's batch broadcasting for MatMul).

use super::real::Real;
use super::{broadcast_strides, View};
use crate::graph::Gemm;
use gpukit_tensor::cpu::gemm_t;

/// `alpha * op(A) * op(B) + beta * C`.
pub(super) fn gemm<T: Real>(
    g: &Gemm,
    inputs: &[View<T>],
    out_shape: &[usize],
) -> Result<Vec<T>, String> {
    let (a, b) = match inputs {
        [a, b, ..] => (a, b),
        _ => return Err("takes A and B".into()),
    };
    let &[m, n] = out_shape else {
        return Err("the output is not 2-D".into());
    };
    let k = if g.trans_a { a.shape[0] } else { a.shape[1] };
    let mut out = vec![T::ZERO; m * n];
    gemm_t(
        (g.trans_a, g.trans_b),
        (m, n, k),
        a.real()?,
        b.real()?,
        &mut out,
    );
    if g.alpha != 1.0 {
        let alpha = T::from_f32(g.alpha);
        out.iter_mut().for_each(|v| *v = *v * alpha);
    }
    if let Some(c) = inputs.get(2) {
        let data = c.real()?;
        let beta = T::from_f32(g.beta);
        let st = broadcast_strides(c.shape, out_shape);
        for (i, row) in out.chunks_mut(n).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v += beta * data[i * st[0] + j * st[1]];
            }
        }
    }
    Ok(out)
}

/// numpy's matmul: 1-D operands promoted (and their axis dropped from the output), batch axes
/// broadcast.
pub(super) fn matmul<T: Real>(inputs: &[View<T>], out_shape: &[usize]) -> Result<Vec<T>, String> {
    let [a, b] = inputs else {
        return Err("takes A and B".into());
    };
    let (ad, bd) = (a.real()?, b.real()?);
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k) = if ra == 1 {
        (1, a.shape[0])
    } else {
        (a.shape[ra - 2], a.shape[ra - 1])
    };
    let n = if rb == 1 { 1 } else { b.shape[rb - 1] };
    let batch_shape = &out_shape[..out_shape.len() - usize::from(ra > 1) - usize::from(rb > 1)];
    let batches: usize = batch_shape.iter().product();
    let sa = broadcast_strides(&a.shape[..ra.saturating_sub(2)], batch_shape);
    let sb = broadcast_strides(&b.shape[..rb.saturating_sub(2)], batch_shape);
    let mut out = vec![T::ZERO; batches * m * n];
    for (t, o) in out.chunks_mut(m * n).enumerate() {
        let (mut rest, mut oa, mut ob) = (t, 0, 0);
        for axis in (0..batch_shape.len()).rev() {
            let i = rest % batch_shape[axis];
            rest /= batch_shape[axis];
            oa += i * sa[axis];
            ob += i * sb[axis];
        }
        let am = &ad[oa * m * k..(oa + 1) * m * k];
        let bm = &bd[ob * k * n..(ob + 1) * k * n];
        T::matmul(am, bm, o, m, n, k);
    }
    Ok(out)
}
