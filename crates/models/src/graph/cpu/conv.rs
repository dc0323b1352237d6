//! 2-D convolution on NCHW: plain convolutions (one group, no dilation, one stride) through
//! im2col + gemm (the tensor crate's in f32, `real::im2col_gemm` in f64), input padded first where
//! the padding is asymmetric; grouped, depthwise, dilated and unevenly strided ones through a
//! direct loop, one output plane per task. Then the epilogue (bias, residual, activation) in
//! one pass.

use super::elementwise::activate;
use super::real::Real;
use super::View;
use crate::graph::Conv;
use gpukit_tensor::ConvShape;
use rayon::prelude::*;

/// `x` `[n, c, h, w]` with `pads` (top, left, bottom, right) of zeros around each image.
fn pad_input<T: Real>(x: &[T], [n, c, h, w]: [usize; 4], pads: [usize; 4]) -> (Vec<T>, [usize; 2]) {
    let (ph, pw) = (h + pads[0] + pads[2], w + pads[1] + pads[3]);
    let mut out = vec![T::ZERO; n * c * ph * pw];
    out.par_chunks_mut(ph * pw)
        .zip(x.par_chunks(h * w))
        .for_each(|(dst, src)| {
            for (y, row) in src.chunks(w).enumerate() {
                let at = (y + pads[0]) * pw + pads[1];
                dst[at..at + w].copy_from_slice(row);
            }
        });
    (out, [ph, pw])
}

/// One output plane `[p, q]` of a direct convolution: the sum over the group's input channels
/// `planes` (each `[h, w]`) and the filter taps `filter` (`[cg, r, s]`).
fn direct_plane<T: Real>(
    c: &Conv,
    planes: &[T],
    [h, w]: [usize; 2],
    filter: &[T],
    out: &mut [T],
    q: usize,
) {
    let [r, s] = c.kernel;
    let [sh, sw] = c.strides;
    let [dh, dw] = c.dilations;
    let (pt, pl) = (c.pads[0], c.pads[1]);
    for (ci, plane) in planes.chunks(h * w).enumerate() {
        for a in 0..r {
            for b in 0..s {
                let wv = filter[(ci * r + a) * s + b];
                // output columns j whose input column j * sw + b * dw - pl lies in [0, w)
                let off = b * dw;
                let j_lo = pl.saturating_sub(off).div_ceil(sw);
                let j_hi = (w + pl).saturating_sub(off).div_ceil(sw).min(q);
                for (i, orow) in out.chunks_mut(q).enumerate() {
                    let Some(y) = (i * sh + a * dh).checked_sub(pt).filter(|&y| y < h) else {
                        continue;
                    };
                    let irow = &plane[y * w..(y + 1) * w];
                    for (j, o) in orow.iter_mut().enumerate().take(j_hi).skip(j_lo) {
                        *o += wv * irow[j * sw + off - pl];
                    }
                }
            }
        }
    }
}

/// The convolution `c` of `inputs` (x, weight, bias?, residual?) into a tensor of `out_shape`.
pub(super) fn conv<T: Real>(
    c: &Conv,
    inputs: &[View<T>],
    out_shape: &[usize],
) -> Result<Vec<T>, String> {
    let (x, wt) = match inputs {
        [x, w, ..] => (x.real()?, w.real()?),
        _ => return Err("takes an input and a weight".into()),
    };
    let &[n, ch, h, w] = inputs[0].shape else {
        return Err("input is not 4-D".into());
    };
    let &[_, k, p, q] = out_shape else {
        return Err("output is not 4-D".into());
    };
    let [r, s] = c.kernel;
    let mut out = vec![T::ZERO; n * k * p * q];
    // The padded copy an asymmetric padding needs is bounded here (shape inference bounds the
    // output, not it): absurd pads take the direct loop instead.
    let padded_fits = [
        h.saturating_add(c.pads[0]).saturating_add(c.pads[2]),
        w.saturating_add(c.pads[1]).saturating_add(c.pads[3]),
        n,
        ch,
    ]
    .iter()
    .try_fold(1usize, |a, &d| a.checked_mul(d))
    .is_some_and(|e| e <= 2 * x.len() + (1 << 20));
    let plain =
        c.groups == 1 && c.dilations == [1, 1] && c.strides[0] == c.strides[1] && padded_fits;
    if plain {
        let symmetric = c.pads.iter().all(|&v| v == c.pads[0]);
        let padded;
        let (src, [hh, ww], pad) = if symmetric {
            (x, [h, w], c.pads[0])
        } else {
            padded = pad_input(x, [n, ch, h, w], c.pads);
            (&padded.0[..], padded.1, 0)
        };
        let shape = ConvShape {
            n,
            c: ch,
            h: hh,
            w: ww,
            k,
            r,
            s,
            stride: c.strides[0],
            pad,
            groups: 1,
        };
        if (shape.out_h(), shape.out_w()) != (p, q) {
            return Err(format!(
                "im2col output {}x{} differs from {p}x{q}",
                shape.out_h(),
                shape.out_w()
            ));
        }
        T::conv_nchw(&shape, src, wt, &mut out);
    } else {
        let (kg, cg) = (k / c.groups, ch / c.groups);
        out.par_chunks_mut(p * q)
            .enumerate()
            .for_each(|(plane, o)| {
                let (img, oc) = (plane / k, plane % k);
                let g = oc / kg;
                let first = (img * ch + g * cg) * h * w;
                let planes = &x[first..first + cg * h * w];
                let filter = &wt[oc * cg * r * s..(oc + 1) * cg * r * s];
                direct_plane(c, planes, [h, w], filter, o, q);
            });
    }
    epilogue(c, inputs, &mut out, k, p * q)?;
    Ok(out)
}

/// Bias, residual and activation, in that order, over every output plane.
fn epilogue<T: Real>(
    c: &Conv,
    inputs: &[View<T>],
    out: &mut [T],
    k: usize,
    plane: usize,
) -> Result<(), String> {
    let bias = match c.bias {
        true => Some(inputs.get(2).ok_or("the bias is missing")?.real()?),
        false => None,
    };
    let residual = match c.residual_input() {
        Some(i) => Some(inputs.get(i).ok_or("the residual is missing")?.real()?),
        None => None,
    };
    let act = c.epilogue.activation;
    if bias.is_none() && residual.is_none() && act.is_none() {
        return Ok(());
    }
    out.par_chunks_mut(plane).enumerate().for_each(|(i, o)| {
        let b = bias.map_or(T::ZERO, |b| b[i % k]);
        let res = residual.map(|r| &r[i * plane..(i + 1) * plane]);
        for (j, v) in o.iter_mut().enumerate() {
            let mut y = *v + b;
            if let Some(r) = res {
                y += r[j];
            }
            *v = act.map_or(y, |a| activate(a, y));
        }
    });
    Ok(())
}

/// [`conv`] with its sums in f64: the inputs widened, the convolution, bias and residual in
/// f64, each output rounded once to `T`, then the activation in `T` (what the f32 interpreter
/// runs for a convolution chosen by `exact::exact_convolutions`).
pub(super) fn conv_exact<T: Real>(
    c: &Conv,
    inputs: &[View<T>],
    out_shape: &[usize],
) -> Result<Vec<T>, String> {
    let wide: Vec<Vec<f64>> = inputs
        .iter()
        .map(|v| Ok(v.real()?.par_iter().map(|x| x.to_f64()).collect()))
        .collect::<Result<_, String>>()?;
    let views: Vec<View<f64>> = inputs
        .iter()
        .zip(&wide)
        .map(|(v, w)| View {
            shape: v.shape,
            data: super::Elems::Real(w),
        })
        .collect();
    let mut bare = c.clone();
    bare.epilogue.activation = None;
    let sums = conv::<f64>(&bare, &views, out_shape)?;
    let act = c.epilogue.activation;
    Ok(sums
        .par_iter()
        .map(|&v| {
            let y = T::from_f64(v);
            act.map_or(y, |a| activate(a, y))
        })
        .collect())
}
