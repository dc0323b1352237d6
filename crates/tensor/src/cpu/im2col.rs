//! Convolution lowered to im2col + gemm ([`conv2d_f32`], NCHW and NHWC), and the NHWC im2col
//! row the packed convolution's portable kernel reuses.

use super::matmul::{gemm_split, gemm_strided};
use super::threads;
use gemm::Parallelism;
use gpukit_types::{ConvShape, Layout};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Output indices `o < count` whose input coordinate `o * stride + offset - pad` lies in
/// `0..len`, as a half-open range; lets im2col copy whole runs and zero-fill only the edges.
fn valid_range(
    count: usize,
    len: usize,
    offset: usize,
    stride: usize,
    pad: usize,
) -> (usize, usize) {
    let lo = pad.saturating_sub(offset).div_ceil(stride);
    let hi = len
        .saturating_add(pad)
        .saturating_sub(offset)
        .div_ceil(stride)
        .min(count);
    (lo.min(hi), hi)
}

/// Input row/column hit by output index `o` at filter tap `tap`, or None inside the padding.
fn in_coord(o: usize, tap: usize, stride: usize, pad: usize, len: usize) -> Option<usize> {
    (o * stride + tap).checked_sub(pad).filter(|&i| i < len)
}

/// A zero ready to store into not-yet-initialised buffer memory.
const ZERO: MaybeUninit<f32> = MaybeUninit::new(0.0);

/// Resets `buf` to `len` elements produced chunk by chunk by `fill(chunk index, chunk)`
/// (chunks of `chunk_len`, the last possibly shorter), writing straight into uninitialised
/// capacity: zeroing first would be a single-threaded memset as large as the buffer, a
/// sizeable share of a batch-1 layer. Chunks are filled in parallel when asked, since this is
/// memory-bound work that would otherwise serialise.
///
/// # Safety
///
/// `fill` must initialise every element of the chunk it is given (panicking is fine: `buf`
/// is then left empty).
unsafe fn build_rows<F>(buf: &mut Vec<f32>, len: usize, chunk_len: usize, parallel: bool, fill: F)
where
    F: Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
{
    buf.clear();
    if len == 0 || chunk_len == 0 {
        return;
    }
    buf.reserve(len);
    let spare = &mut buf.spare_capacity_mut()[..len];
    if parallel {
        // Short chunks are grouped so each rayon task moves a useful amount.
        spare
            .par_chunks_mut(chunk_len)
            .with_min_len(4096usize.div_ceil(chunk_len))
            .enumerate()
            .for_each(|(i, chunk)| fill(i, chunk));
    } else {
        for (i, chunk) in spare.chunks_mut(chunk_len).enumerate() {
            fill(i, chunk);
        }
    }
    // SAFETY: the chunks tile exactly the first `len` slots of capacity, and the caller
    // guarantees `fill` initialised every element of each.
    unsafe { buf.set_len(len) };
}

/// The KRSC weight (K x CRS) transposed to CRS x K, as gemm prefers it for NHWC.
fn transpose_weight(weight: &[f32], k: usize, crs: usize, parallel: bool) -> Vec<f32> {
    // Blocks of 16 output rows: each weight cache line (16 floats) is read once and lands in
    // a 16 x K block that stays in cache; a plain row-by-row gather misses on every element.
    const BLOCK: usize = 16;
    let mut wt = Vec::new();
    // SAFETY: a chunk holds `rows` whole output rows, rows j0.. j0 + rows of CRS x K; the loops
    // write element (jj, kk) of each for every jj < rows and kk < K, i.e. all of it.
    unsafe {
        build_rows(&mut wt, crs * k, BLOCK * k, parallel, |b, chunk| {
            let j0 = b * BLOCK;
            let rows = chunk.len() / k;
            for kk in 0..k {
                let src = &weight[kk * crs + j0..kk * crs + j0 + rows];
                for (jj, &x) in src.iter().enumerate() {
                    chunk[jj * k + kk].write(x);
                }
            }
        });
    }
    wt
}

/// One row of the NCHW im2col matrix (CRS x PQ): filter tap `row = (c, r, s)` across all
/// output pixels. Rows this way round make the weight (K x CRS) the left operand and write the
/// NKPQ output row-major with no transpose.
///
/// Writes every element of `dst` (length PQ), as `build_rows` requires.
fn im2col_nchw_row(sh: &ConvShape, img: &[f32], row: usize, dst: &mut [MaybeUninit<f32>]) {
    let (p_len, q_len) = (sh.out_h(), sh.out_w());
    let (ci, ri, si) = (row / (sh.r * sh.s), row / sh.s % sh.r, row % sh.s);
    let plane = &img[ci * sh.h * sh.w..(ci + 1) * sh.h * sh.w];
    let (q_lo, q_hi) = valid_range(q_len, sh.w, si, sh.stride, sh.pad);
    for (pi, out) in dst.chunks_exact_mut(q_len).take(p_len).enumerate() {
        let Some(ih) = in_coord(pi, ri, sh.stride, sh.pad, sh.h) else {
            out.fill(ZERO);
            continue;
        };
        out[..q_lo].fill(ZERO);
        out[q_hi..].fill(ZERO);
        let src = &plane[ih * sh.w..(ih + 1) * sh.w];
        let run = &mut out[q_lo..q_hi];
        if run.is_empty() {
            continue;
        }
        let iw0 = q_lo * sh.stride + si - sh.pad;
        if sh.stride == 1 {
            copy_into(run, &src[iw0..iw0 + run.len()]);
        } else {
            // Indexed, not zipped: a short source must fail loudly, never leave a hole.
            for (i, d) in run.iter_mut().enumerate() {
                d.write(src[iw0 + i * sh.stride]);
            }
        }
    }
}

/// One row of the NHWC im2col matrix (PQ x RSC): the patch under output pixel `pq`, ordered
/// (r, s, c) like the KRSC weight. Channels are innermost in NHWC, so each filter row of the
/// patch is one contiguous copy, and the gemm writes NPQK output row-major.
///
/// Writes every element of `dst` (length RSC), as `build_rows` requires.
pub(super) fn im2col_nhwc_row(
    sh: &ConvShape,
    img: &[f32],
    pq: usize,
    dst: &mut [MaybeUninit<f32>],
) {
    let q_len = sh.out_w();
    let (pi, qi) = (pq / q_len, pq % q_len);
    let sc = sh.s * sh.c;
    let base = qi * sh.stride;
    let s_hi = sh.w.saturating_add(sh.pad).saturating_sub(base).min(sh.s);
    let s_lo = sh.pad.saturating_sub(base).min(s_hi);
    for (ri, out) in dst.chunks_exact_mut(sc).take(sh.r).enumerate() {
        let Some(ih) = in_coord(pi, ri, sh.stride, sh.pad, sh.h) else {
            out.fill(ZERO);
            continue;
        };
        out[..s_lo * sh.c].fill(ZERO);
        out[s_hi * sh.c..].fill(ZERO);
        let run = &mut out[s_lo * sh.c..s_hi * sh.c];
        if run.is_empty() {
            continue;
        }
        let start = (ih * sh.w + base + s_lo - sh.pad) * sh.c;
        copy_into(run, &img[start..start + run.len()]);
    }
}

/// Convolution (cross-correlation, as PyTorch/cuDNN compute it), f32, im2col + gemm,
/// multithreaded.
///
/// `Layout::Nchw`: input N,C,H,W; weight K,C,R,S; output N,K,P,Q.
/// `Layout::Nhwc`: input N,H,W,C; weight K,R,S,C; output N,P,Q,K.
/// Zero padding `pad` on all four sides, `stride` in both directions. Overwrites output.
///
/// NCHW lowers each image to `out (K x PQ) = weight (K x CRS) * col (CRS x PQ)`. With
/// N >= threads the batch is split into one contiguous run of images per thread, each with
/// its own im2col buffer and single-threaded gemms; otherwise every image runs at once with
/// its share of the threads, through a parallel im2col and a gemm split along K or PQ.
///
/// NHWC sees the whole batch as `out (NPQ x K) = col (NPQ x RSC) * weight^T (RSC x K)`: the
/// NPQ output rows are split into one contiguous run per thread, each building and
/// multiplying at most PQ im2col rows at a time; when there are fewer rows than output
/// channels the gemm is split along K instead. The weight is transposed once per call.
///
/// Extra memory is at most threads * C*R*S*P*Q floats of im2col (none for 1x1 stride-1
/// unpadded shapes, whose input already is the matrix; under one weight's worth for NHWC's
/// split along K), plus one weight-sized copy for NHWC, independent of N.
///
/// # Panics
///
/// If `input`, `weight` or `output` do not hold `shape.input_len()`, `shape.weight_len()` and
/// `shape.output_len()` elements.
pub fn conv2d_f32(
    shape: &ConvShape,
    layout: Layout,
    input: &[f32],
    weight: &[f32],
    output: &mut [f32],
) {
    conv2d_f32_with(shape, layout, input, weight, output, threads());
}

/// `conv2d_f32` with the thread count explicit, so tests can drive every parallel strategy
/// on any machine.
fn conv2d_f32_with(
    sh: &ConvShape,
    layout: Layout,
    input: &[f32],
    weight: &[f32],
    output: &mut [f32],
    threads: usize,
) {
    assert_eq!(input.len(), sh.input_len(), "conv2d: input length");
    assert_eq!(weight.len(), sh.weight_len(), "conv2d: weight length");
    assert_eq!(output.len(), sh.output_len(), "conv2d: output length");
    if output.is_empty() {
        return;
    }
    if input.is_empty() || sh.r * sh.s == 0 {
        // Every tap reads padding (or there are none): the sum is empty. This also keeps
        // every matrix dimension below non-zero.
        output.fill(0.0);
        return;
    }
    let threads = threads.max(1);
    match layout {
        Layout::Nchw => conv_nchw(sh, input, weight, output, threads),
        Layout::Nhwc => conv_nhwc(sh, input, weight, output, threads),
    }
}

/// NCHW convolution; all dimensions non-zero, lengths checked.
fn conv_nchw(sh: &ConvShape, input: &[f32], weight: &[f32], output: &mut [f32], threads: usize) {
    let img_in = sh.c * sh.h * sh.w;
    let img_out = sh.k * sh.out_h() * sh.out_w();
    if threads > 1 && sh.n >= threads {
        let per = sh.n.div_ceil(threads);
        output
            .par_chunks_mut(per * img_out)
            .zip(input.par_chunks(per * img_in))
            .for_each(|(outs, imgs)| {
                let mut col = Vec::new();
                for (out, img) in outs
                    .chunks_exact_mut(img_out)
                    .zip(imgs.chunks_exact(img_in))
                {
                    nchw_image(sh, img, weight, out, &mut col, 1);
                }
            });
    } else {
        // Fewer images than threads: all images at once, each splitting its gemm over its
        // share of the threads, which keeps every core busy where one image at a time would
        // synchronise all of them per image.
        let share = threads.div_ceil(sh.n);
        output
            .par_chunks_mut(img_out)
            .zip(input.par_chunks(img_in))
            .for_each(|(out, img)| {
                nchw_image(sh, img, weight, out, &mut Vec::new(), share);
            });
    }
}

/// One NCHW image: `out (K x PQ) = weight (K x CRS) * col (CRS x PQ)`. `col` is the caller's
/// reusable im2col buffer, so a worker allocates it once however many images it handles;
/// `threads` is what this image may use.
fn nchw_image(
    sh: &ConvShape,
    img: &[f32],
    weight: &[f32],
    out: &mut [f32],
    col: &mut Vec<f32>,
    threads: usize,
) {
    let pq = sh.out_h() * sh.out_w();
    let crs = sh.c * sh.r * sh.s;
    let rhs = if sh.is_pointwise() {
        // C x HW with HW = PQ and C = CRS: already the matrix.
        img
    } else {
        // SAFETY: im2col_nchw_row writes its whole row.
        unsafe {
            build_rows(col, crs * pq, pq, threads > 1, |i, row| {
                im2col_nchw_row(sh, img, i, row)
            });
        }
        col.as_slice()
    };
    // SAFETY: out is K x PQ, weight K x CRS, rhs CRS x PQ, all row-major and exact.
    unsafe {
        gemm_split(
            (sh.k, pq, crs),
            out,
            (pq, 1),
            weight,
            (crs, 1),
            rhs,
            (pq, 1),
            threads,
        );
    }
}

/// NHWC convolution; all dimensions non-zero, lengths checked.
fn conv_nhwc(sh: &ConvShape, input: &[f32], weight: &[f32], output: &mut [f32], threads: usize) {
    let pq = sh.out_h() * sh.out_w();
    let crs = sh.c * sh.r * sh.s;
    let img_in = sh.c * sh.h * sh.w;
    let k = sh.k;
    // gemm is markedly faster with the right operand stored RSC x K than reading the KRSC
    // weight transposed through strides (measured 1.3-5x on ResNet layers), and the copy is
    // small next to the product.
    let wt = transpose_weight(weight, k, crs, threads > 1);
    let rows_total = sh.n * pq;
    if threads > 1 && rows_total < k {
        // Too few output pixels to share out (small batch, deep layer): build every im2col
        // row, at most a weight's worth since rows < K, and split output channels instead.
        let mut col = Vec::new();
        let lhs = if sh.is_pointwise() {
            input
        } else {
            // SAFETY: im2col_nhwc_row writes its whole row.
            unsafe {
                build_rows(&mut col, rows_total * crs, crs, true, |g, row| {
                    let img = &input[g / pq * img_in..(g / pq + 1) * img_in];
                    im2col_nhwc_row(sh, img, g % pq, row);
                });
            }
            &col
        };
        // SAFETY: lhs is NPQ x CRS, wt CRS x K, output NPQ x K, all row-major and exact.
        unsafe {
            gemm_split(
                (rows_total, k, crs),
                output,
                (k, 1),
                lhs,
                (crs, 1),
                &wt,
                (k, 1),
                threads,
            );
        }
        return;
    }
    // Otherwise each task owns a contiguous run of output rows and builds its own im2col rows,
    // which stay in its core's cache for the gemm that consumes them.
    let per = rows_total.div_ceil(threads.min(rows_total));
    output
        .par_chunks_mut(per * k)
        .enumerate()
        .for_each(|(task, out)| {
            let first = task * per;
            if sh.is_pointwise() {
                // The input rows already are the im2col rows (C = CRS, HW = PQ).
                let rows = out.len() / k;
                let lhs = &input[first * crs..(first + rows) * crs];
                // SAFETY: lhs is rows x CRS, wt CRS x K, out rows x K, all row-major.
                unsafe {
                    gemm_strided(
                        (rows, k, crs),
                        out,
                        (k, 1),
                        lhs,
                        (crs, 1),
                        &wt,
                        (k, 1),
                        1.0,
                        Parallelism::None,
                    );
                }
                return;
            }
            let mut col = Vec::new();
            // At most PQ im2col rows at a time bounds the buffer to one image's matrix.
            for (block, out) in out.chunks_mut(pq * k).enumerate() {
                let rows = out.len() / k;
                let start = first + block * pq;
                // SAFETY: im2col_nhwc_row writes its whole row.
                unsafe {
                    build_rows(&mut col, rows * crs, crs, false, |i, row| {
                        let g = start + i;
                        let img = &input[g / pq * img_in..(g / pq + 1) * img_in];
                        im2col_nhwc_row(sh, img, g % pq, row);
                    });
                }
                // SAFETY: col is rows x CRS, wt CRS x K, out rows x K, all row-major.
                unsafe {
                    gemm_strided(
                        (rows, k, crs),
                        out,
                        (k, 1),
                        &col,
                        (crs, 1),
                        &wt,
                        (k, 1),
                        1.0,
                        Parallelism::None,
                    );
                }
            }
        });
}

#[cfg(test)]
mod tests;

/// `dst.write_copy_of_slice(src)` (stable only since Rust 1.93, above this workspace's minimum):
/// the lengths must match.
fn copy_into<T: Copy>(dst: &mut [std::mem::MaybeUninit<T>], src: &[T]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "im2col run and its source differ in length"
    );
    for (d, s) in dst.iter_mut().zip(src) {
        d.write(*s);
    }
}
