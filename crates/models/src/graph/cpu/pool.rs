//! Pooling on NCHW: max and average windows (padding, ceil mode, count_include_pad) and the
//! global average, one plane per task.

use super::real::Real;
use super::View;
use crate::graph::Pool;
use rayon::prelude::*;

/// The input rows (or columns) window `i` covers, clipped to the input, and its extent
/// clipped to the padded input instead (average pooling's divisor with count_include_pad).
fn window(
    i: usize,
    stride: usize,
    kernel: usize,
    pad_begin: usize,
    pad_end: usize,
    len: usize,
) -> (usize, usize, usize) {
    // in padded coordinates
    let start = i * stride;
    let end = (start + kernel).min(len + pad_begin + pad_end);
    let padded_extent = end - start;
    let lo = start.saturating_sub(pad_begin).min(len);
    let hi = end.saturating_sub(pad_begin).min(len);
    (lo, hi.max(lo), padded_extent)
}

/// Applies `f` to every window of every plane: `f(plane, rows, cols, padded_count)`.
fn pool_with<T: Real>(
    p: &Pool,
    x: View<T>,
    out_shape: &[usize],
    f: impl Fn(&[T], (usize, usize), (usize, usize), usize, usize) -> T + Sync,
) -> Result<Vec<T>, String> {
    let x_data = x.real()?;
    let (&[n, c, h, w], &[_, _, oh, ow]) = (x.shape, out_shape) else {
        return Err("pooling takes 4-D tensors".into());
    };
    let mut out = vec![T::ZERO; n * c * oh * ow];
    out.par_chunks_mut(oh * ow)
        .enumerate()
        .for_each(|(plane, o)| {
            let src = &x_data[plane * h * w..(plane + 1) * h * w];
            for (i, orow) in o.chunks_mut(ow).enumerate() {
                let (y0, y1, ph) = window(i, p.strides[0], p.kernel[0], p.pads[0], p.pads[2], h);
                for (j, v) in orow.iter_mut().enumerate() {
                    let (x0, x1, pw) =
                        window(j, p.strides[1], p.kernel[1], p.pads[1], p.pads[3], w);
                    *v = f(src, (y0, y1), (x0, x1), ph * pw, w);
                }
            }
        });
    Ok(out)
}

/// Max pooling (padding never wins: windows always hold at least one input element, which
/// shape inference ensures by keeping pads below the kernel).
pub(super) fn max_pool<T: Real>(
    p: &Pool,
    x: View<T>,
    out_shape: &[usize],
) -> Result<Vec<T>, String> {
    pool_with(p, x, out_shape, |src, (y0, y1), (x0, x1), _, w| {
        let mut m = T::NEG_INFINITY;
        for y in y0..y1 {
            for &v in &src[y * w + x0..y * w + x1] {
                // NaN propagates, as in ONNX Runtime and PyTorch
                if v > m || v.is_nan() {
                    m = v;
                }
            }
        }
        m
    })
}

/// Average pooling: the sum over the window's input elements, divided by their count, or with
/// count_include_pad by the window's size within the padded input.
pub(super) fn average_pool<T: Real>(
    p: &Pool,
    x: View<T>,
    out_shape: &[usize],
) -> Result<Vec<T>, String> {
    let include = p.count_include_pad;
    pool_with(p, x, out_shape, |src, (y0, y1), (x0, x1), padded, w| {
        let mut sum = 0f64;
        for y in y0..y1 {
            sum += src[y * w + x0..y * w + x1]
                .iter()
                .map(|&v| v.to_f64())
                .sum::<f64>();
        }
        let count = if include {
            padded
        } else {
            (y1 - y0) * (x1 - x0)
        };
        T::from_f64(sum / count.max(1) as f64)
    })
}

/// The mean of every plane (all axes after the second), summed in f64.
pub(super) fn global_average<T: Real>(x: View<T>) -> Result<Vec<T>, String> {
    let data = x.real()?;
    let planes: usize = x.shape.iter().take(2).product();
    let plane = data.len() / planes.max(1);
    if plane == 0 {
        return Err("the mean of no elements".into());
    }
    Ok(data
        .par_chunks(plane)
        .map(|c| T::from_f64(c.iter().map(|&v| v.to_f64()).sum::<f64>() / plane as f64))
        .collect())
}
