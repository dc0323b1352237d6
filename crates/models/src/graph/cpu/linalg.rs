//! Gemm and MatMul through the tensor crate's gemm (numpy's batch broadcasting for MatMul).

use super::{broadcast_strides, View};
use crate::graph::Gemm;
use gpukit_tensor::cpu::{gemm_t, matmul_f32};

/// `alpha * op(A) * op(B) + beta * C`.
pub(super) fn gemm(g: &Gemm, inputs: &[View], out_shape: &[usize]) -> Result<Vec<f32>, String> {
    let (a, b) = match inputs {
        [a, b, ..] => (a, b),
        _ => return Err("takes A and B".into()),
    };
    let &[m, n] = out_shape else {
        return Err("the output is not 2-D".into());
    };
    let k = if g.trans_a { a.shape[0] } else { a.shape[1] };
    let mut out = vec![0f32; m * n];
    gemm_t(
        (g.trans_a, g.trans_b),
        (m, n, k),
        a.f32()?,
        b.f32()?,
        &mut out,
    );
    if g.alpha != 1.0 {
        out.iter_mut().for_each(|v| *v *= g.alpha);
    }
    if let Some(c) = inputs.get(2) {
        let data = c.f32()?;
        let st = broadcast_strides(c.shape, out_shape);
        for (i, row) in out.chunks_mut(n).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v += g.beta * data[i * st[0] + j * st[1]];
            }
        }
    }
    Ok(out)
}

/// numpy's matmul: 1-D operands promoted (and their axis dropped from the output), batch axes
/// broadcast.
pub(super) fn matmul(inputs: &[View], out_shape: &[usize]) -> Result<Vec<f32>, String> {
    let [a, b] = inputs else {
        return Err("takes A and B".into());
    };
    let (ad, bd) = (a.f32()?, b.f32()?);
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
    let mut out = vec![0f32; batches * m * n];
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
        matmul_f32(am, bm, o, m, n, k);
    }
    Ok(out)
}
