//! CPU reference paths: matrix multiply and convolution, multithreaded (the gemm crate).
//!
//! These are the CPU side of the CPU-vs-GPU comparisons, so they aim to be competitive with a
//! tuned CPU library (PyTorch's CPU backend) rather than merely correct: matmul reads its
//! operands in place through gemm's strides, and convolution lowers to im2col + gemm in the
//! orientation that writes the requested output layout directly, parallelised whichever way
//! the batch size and layer shape make fastest.
//!
//! The inference engine's convolution, [`conv2d_nhwc_packed`], goes further: weights packed
//! once, NHWC activations read in place, an AVX-512 micro-kernel with bias, residual and ReLU
//! fused, and a spinning thread team (see the sections below).
#![allow(unsafe_code)]

use gemm::Parallelism;
use gpukit_types::{ConvShape, Layout};
use half::f16;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

// `matmul_f16` promises native half precision; gemm only dispatches to its f16 kernels when the
// element type *is* its own `f16`. Should the two `half` versions ever diverge this fails to
// compile instead of panicking inside gemm at run time.
const _: fn(f16) -> gemm::f16 = |x| x;

/// How many threads CPU kernels use: rayon's current pool size.
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// `dst (m x n) = lhs (m x k) * rhs (k x n)` on raw operands, each read through a
/// (row stride, column stride) pair, so transposed views cost nothing.
///
/// # Safety
///
/// Every element each view addresses, `(rows - 1) * rs + (cols - 1) * cs` past its pointer,
/// must be valid (readable, and for `dst` writable and not read or written by anyone else
/// meanwhile) whenever that view is non-empty.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw<T: 'static + Copy + Default>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    (dst_rs, dst_cs): (usize, usize),
    lhs: *const T,
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: *const T,
    (rhs_rs, rhs_cs): (usize, usize),
    one: T,
    parallelism: Parallelism,
) {
    // SAFETY: the caller guarantees the extents; they lie within allocations, which never
    // exceed isize::MAX bytes, so the stride casts cannot wrap. read_dst = false makes gemm
    // ignore alpha and never read dst, so stale contents (even NaN) do not leak in.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs as isize,
            dst_rs as isize,
            false,
            lhs,
            lhs_cs as isize,
            lhs_rs as isize,
            rhs,
            rhs_cs as isize,
            rhs_rs as isize,
            T::default(),
            one,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `gemm_raw` on slices.
///
/// # Safety
///
/// Each view's extent, `(rows - 1) * rs + (cols - 1) * cs`, must lie inside its slice
/// whenever the view is non-empty (checked in debug builds).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_strided<T: 'static + Copy + Default>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    dst_strides: (usize, usize),
    lhs: &[T],
    lhs_strides: (usize, usize),
    rhs: &[T],
    rhs_strides: (usize, usize),
    one: T,
    parallelism: Parallelism,
) {
    debug_assert!(fits(dst.len(), m, n, dst_strides));
    debug_assert!(fits(lhs.len(), m, k, lhs_strides));
    debug_assert!(fits(rhs.len(), k, n, rhs_strides));
    // SAFETY: extents per the caller; `dst` is exclusively borrowed.
    unsafe {
        gemm_raw(
            (m, n, k),
            dst.as_mut_ptr(),
            dst_strides,
            lhs.as_ptr(),
            lhs_strides,
            rhs.as_ptr(),
            rhs_strides,
            one,
            parallelism,
        );
    }
}

/// Whether a `rows x cols` view with strides `(rs, cs)` stays inside `len` elements (the
/// debug check of `gemm_strided`'s contract).
fn fits(len: usize, rows: usize, cols: usize, (rs, cs): (usize, usize)) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * rs + (cols - 1) * cs < len
}

/// The output pointer handed to every task of a split product (`gemm_split`, the tiled
/// `matmul`, the convolution kernels), each of which writes its own disjoint block through it.
struct SharedOut<T = f32>(*mut T);

// Clone and Copy by hand: derived ones would ask T to be Copy too.
impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedOut<T> {}

// SAFETY: tasks only ever write disjoint elements through the pointer (see its users), and
// the borrow it came from outlives them all.
unsafe impl<T> Send for SharedOut<T> {}
// SAFETY: as for Send.
unsafe impl<T> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The pointer; a method so closures capture the whole (Send) wrapper, not its field.
    fn get(self) -> *mut T {
        self.0
    }
}

/// `gemm_strided` (f32) over `threads` rayon tasks, each a single-threaded gemm on one block
/// of the longer output dimension. gemm's own threading scales poorly on the short, wide
/// products convolutions produce (measured 1.5-3x slower than this on 16 cores for ResNet-50
/// layers at small batch); splitting the longer side keeps blocks as square as possible, so
/// each task re-reads the least of the shared operand per flop.
///
/// # Safety
///
/// As `gemm_strided`; in addition distinct `(i, j)` of the `dst` view must address distinct
/// elements (true of any row- or column-major view), so the blocks are disjoint.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_split(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    lhs: &[f32],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[f32],
    (rhs_rs, rhs_cs): (usize, usize),
    threads: usize,
) {
    let split_rows = m >= n;
    let len = if split_rows { m } else { n };
    if threads <= 1 || len <= 1 {
        // SAFETY: per the caller.
        unsafe {
            gemm_strided(
                (m, n, k),
                dst,
                (dst_rs, dst_cs),
                lhs,
                (lhs_rs, lhs_cs),
                rhs,
                (rhs_rs, rhs_cs),
                1.0,
                Parallelism::None,
            );
        }
        return;
    }
    debug_assert!(fits(dst.len(), m, n, (dst_rs, dst_cs)));
    debug_assert!(fits(lhs.len(), m, k, (lhs_rs, lhs_cs)));
    debug_assert!(fits(rhs.len(), k, n, (rhs_rs, rhs_cs)));
    let tile = len.div_ceil(threads);
    let out = SharedOut(dst.as_mut_ptr());
    (0..len.div_ceil(tile)).into_par_iter().for_each(|task| {
        let start = task * tile;
        let size = tile.min(len - start);
        // Rows [start, start + size) take those rows of lhs; columns take those of rhs.
        let (dims, dst_off, lhs_off, rhs_off) = if split_rows {
            ((size, n, k), start * dst_rs, start * lhs_rs, 0)
        } else {
            ((m, size, k), start * dst_cs, 0, start * rhs_cs)
        };
        // SAFETY: each block is a sub-view of the caller's in-bounds views, and blocks of
        // distinct tasks cover distinct rows (or columns) of dst, hence distinct elements;
        // `dst` stays mutably borrowed until every task has finished. wrapping_add: an
        // operand with k = 0 is never read, and its offset may point past an empty slice.
        unsafe {
            gemm_raw(
                dims,
                out.get().wrapping_add(dst_off),
                (dst_rs, dst_cs),
                lhs.as_ptr().wrapping_add(lhs_off),
                (lhs_rs, lhs_cs),
                rhs.as_ptr().wrapping_add(rhs_off),
                (rhs_rs, rhs_cs),
                1.0,
                Parallelism::None,
            );
        }
    });
}

/// Shared body of the public matmuls, which differ only in element type.
fn matmul<T: 'static + Copy + Default + Send + Sync>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    (m, n, k): (usize, usize, usize),
    one: T,
) {
    assert_eq!(
        a.len(),
        m.saturating_mul(k),
        "matmul: A must hold m * k elements"
    );
    assert_eq!(
        b.len(),
        k.saturating_mul(n),
        "matmul: B must hold k * n elements"
    );
    assert_eq!(
        c.len(),
        m.saturating_mul(n),
        "matmul: C must hold m * n elements"
    );
    let threads = threads();
    if threads <= 1 || 2 * m * n * k < MIN_SPLIT_FLOP {
        // SAFETY: the asserts above make every row-major view exactly fill its slice.
        unsafe {
            gemm_strided(
                (m, n, k),
                c,
                (n, 1),
                a,
                (k, 1),
                b,
                (n, 1),
                one,
                Parallelism::None,
            );
        }
        return;
    }
    let tm = tile_edge(m, n, threads);
    let tn = tile_edge(n, m, threads);
    let (gm, gn) = (m.div_ceil(tm), n.div_ceil(tn));
    let out = SharedOut(c.as_mut_ptr());
    (0..gm * gn).into_par_iter().for_each(|task| {
        let (i0, j0) = ((task / gn) * tm, (task % gn) * tn);
        let (rows, cols) = (tm.min(m - i0), tn.min(n - j0));
        // SAFETY: rows [i0, i0 + rows) x columns [j0, j0 + cols) of the row-major C, the same
        // rows of A and columns of B, all inside the slices the asserts sized (i0 < m and
        // j0 < n by construction of the grid); distinct tasks own distinct blocks of C, and
        // `c` stays mutably borrowed until every task has finished.
        unsafe {
            gemm_raw(
                (rows, cols, k),
                out.get().add(i0 * n + j0),
                (n, 1),
                a.as_ptr().add(i0 * k),
                (k, 1),
                b.as_ptr().add(j0),
                (n, 1),
                one,
                Parallelism::None,
            );
        }
    });
}

/// Below this many flops a product runs on the calling thread: waking the pool costs more.
const MIN_SPLIT_FLOP: usize = 1 << 22;

/// The output tile's edge along a side of length `len` (the other side `other`) for a
/// multithreaded product: near sqrt(m * n / (8 * threads)), so there are about eight tiles a
/// thread to balance, kept within 128..=384 and a multiple of 16, and never longer than the
/// side. Each tile is one single-threaded gemm whose packed panels stay in the core's own L2.
/// gemm's own threading shares packed panels across cores and stopped near 1.0 TFLOP/s on the
/// lent 16-core Xeon, where tiles of 192-384 ran 1.4-1.7 (runs 33-34, decision 33).
fn tile_edge(len: usize, other: usize, threads: usize) -> usize {
    let area = (len as f64) * (other as f64) / (8.0 * threads.max(1) as f64);
    let edge = (area.sqrt() / 16.0).round() as usize * 16;
    edge.clamp(128, 384).min(len).max(1)
}

/// C = A * B for row-major A (m x k), B (k x n), C (m x n), in f64. Overwrites C.
///
/// # Panics
///
/// If `a.len() != m * k`, `b.len() != k * n` or `c.len() != m * n`.
pub fn matmul_f64(a: &[f64], b: &[f64], c: &mut [f64], m: usize, n: usize, k: usize) {
    matmul(a, b, c, (m, n, k), 1.0);
}

/// C = A * B for row-major A (m x k), B (k x n), C (m x n), in f32. Overwrites C.
///
/// # Panics
///
/// If `a.len() != m * k`, `b.len() != k * n` or `c.len() != m * n`.
pub fn matmul_f32(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    matmul(a, b, c, (m, n, k), 1.0);
}

/// C = A * B for row-major A (m x k), B (k x n), C (m x n), in native half precision through
/// gemm's f16 kernels. Overwrites C.
///
/// # Panics
///
/// If `a.len() != m * k`, `b.len() != k * n` or `c.len() != m * n`.
pub fn matmul_f16(a: &[f16], b: &[f16], c: &mut [f16], m: usize, n: usize, k: usize) {
    matmul(a, b, c, (m, n, k), f16::ONE);
}

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
            run.write_copy_of_slice(&src[iw0..iw0 + run.len()]);
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
fn im2col_nhwc_row(sh: &ConvShape, img: &[f32], pq: usize, dst: &mut [MaybeUninit<f32>]) {
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
        run.write_copy_of_slice(&img[start..start + run.len()]);
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

// ---------------------------------------------------------------------------------------------
// Packed NHWC convolution with a fused epilogue (the inference engine's path).
//
// The weights are packed once into panels of `PANEL` output channels, each panel stored
// depth-major (for every filter tap and input channel, its `PANEL` weights side by side), so the
// micro-kernel streams one panel with plain vector loads. Activations stay NHWC, where the S
// filter taps of one filter row read S * C adjacent input values: the kernel reads them in
// place through a table of row pointers, one per filter row and output pixel (rows wholly in
// the padding point at a zero row; only rows clipped by the left or right padding are copied,
// zero-filled), so there is no im2col matrix. Each micro-kernel tile is `ROWS` output pixels by
// `PANEL` channels held in registers over the reduction, then bias, residual and ReLU are
// applied before the store. Panels larger than L2 are reduced in chunks (partial sums kept in
// the output rows), and tiles prefetch the weights the next tiles will need. CPUs without
// AVX-512 run the same decomposition through the gemm crate instead (`Kernel::Gemm`).
// ---------------------------------------------------------------------------------------------

/// Output channels per weight panel and per micro-kernel tile (four 16-float vectors).
const PANEL: usize = 64;

/// Output pixels per micro-kernel tile: 7 rows x 4 vectors = 28 accumulators, plus 3 weight
/// vectors and a broadcast fill the 32 AVX-512 registers. Seven divides every ResNet feature
/// map at 224 x 224 (112, 56, 28, 14, 7), so no tile is partly wasted.
const ROWS: usize = 7;

/// Bytes of input a block of pixel groups should touch, so that the block stays in a core's
/// L2 while every weight panel streams past it.
const BLOCK_INPUT_BYTES: usize = 512 << 10;

/// One cache line of floats: the unit of the aligned buffers.
#[derive(Clone, Copy, Default, PartialEq)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A buffer of f32 whose data starts on a 64-byte boundary, so that vector loads and stores of
/// rows whose length is a multiple of 16 never straddle two cache lines (a plain `Vec<f32>` of
/// this size is 16 bytes past a page boundary). Dereferences to `[f32]`.
#[derive(Clone, Default)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::default();
        b.resize(len);
        b
    }

    /// Sets the length to `len`. Within `capacity()` this writes nothing: the elements keep
    /// whatever values they last had (callers overwrite what they use); past it the buffer
    /// grows, and elements never used before are zero.
    pub fn resize(&mut self, len: usize) {
        let lines = len.div_ceil(16);
        if lines > self.lines.len() {
            self.lines.resize(lines, Line::default());
        }
        self.len = len;
    }

    /// How long the buffer can be made without writing anything.
    pub fn capacity(&self) -> usize {
        self.lines.len() * 16
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is a repr(C) [f32; 16] (no padding), the lines are contiguous and
        // initialised, and `len <= 16 * lines.len()`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as for Deref; the borrow is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

/// Equal when the elements are (what lies past the length does not count).
impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} floats)", self.len)
    }
}

/// A convolution's weight and bias packed for [`conv2d_nhwc_packed`]: panels of 64 output
/// channels (the last zero-padded), each laid out (r, s, c, channel-in-panel).
#[derive(Clone, PartialEq)]
pub struct PackedConv {
    k: usize,
    c: usize,
    r: usize,
    s: usize,
    weight: AlignedBuf,
    bias: AlignedBuf,
}

impl std::fmt::Debug for PackedConv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedConv({}x{}x{}x{})", self.k, self.c, self.r, self.s)
    }
}

impl PackedConv {
    /// Packs a K x C x R x S (PyTorch order) weight and its bias (K values; empty for none).
    ///
    /// # Panics
    ///
    /// If `weight` does not hold K * C * R * S values or `bias` is neither empty nor K long.
    pub fn new((k, c, r, s): (usize, usize, usize, usize), weight: &[f32], bias: &[f32]) -> Self {
        assert_eq!(
            weight.len(),
            k.saturating_mul(c).saturating_mul(r).saturating_mul(s),
            "PackedConv: weight length"
        );
        assert!(
            bias.is_empty() || bias.len() == k,
            "PackedConv: bias length"
        );
        let panels = k.div_ceil(PANEL);
        let depth = r * s * c;
        let mut packed = AlignedBuf::zeroed(panels * depth * PANEL);
        // (max(1): with no depth there is nothing to fill, and chunks must not be empty)
        for (p, panel) in packed.chunks_exact_mut((depth * PANEL).max(1)).enumerate() {
            let k0 = p * PANEL;
            let width = PANEL.min(k - k0);
            for (d, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
                let (tap, ci) = (d / c, d % c);
                let (ri, si) = (tap / s, tap % s);
                for (j, v) in dst[..width].iter_mut().enumerate() {
                    *v = weight[(((k0 + j) * c + ci) * r + ri) * s + si];
                }
            }
        }
        let mut b = AlignedBuf::zeroed(panels * PANEL);
        b[..bias.len()].copy_from_slice(bias);
        PackedConv {
            k,
            c,
            r,
            s,
            weight: packed,
            bias: b,
        }
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.k
    }
}

/// What one micro-kernel call computes: for each of `ROWS` output rows j,
/// `out[j][0..64] = epilogue(init + sum over taps t, depth d of row(t, j)[d] * weight[t][d][..])`
/// where `row(t, j)` is `rows[t][j]` advanced by `offset` bytes, `init` is `out[j]` itself when
/// `accumulate` (a partial sum from an earlier call) and the bias otherwise, and the epilogue
/// adds `residual[j]` when `has_residual` and clamps at zero when `relu`. The layout is shared
/// with the assembly kernel, which reads fields by byte offset.
#[repr(C)]
struct Tile {
    /// `taps` groups of `ROWS` row pointers, each row `depth` floats past `offset`.
    rows: *const *const f32,
    /// The panel: `taps * depth` steps of 64 floats.
    weight: *const f32,
    taps: usize,
    depth: usize,
    /// 64 floats.
    bias: *const f32,
    /// 64 writable floats per row (readable too when `accumulate`).
    out: [*mut f32; ROWS],
    /// 64 readable floats per row when `has_residual`.
    residual: [*const f32; ROWS],
    relu: usize,
    has_residual: usize,
    /// Where to prefetch weights for a later tile from, one cache line per depth step (into
    /// L2; prefetching never faults, any address will do).
    prefetch: *const f32,
    accumulate: usize,
    /// Bytes to skip at the start of every row.
    offset: usize,
}

/// Whether the packed convolutions run on the AVX-512 kernel (else im2col + gemm); see
/// `GPUKIT_CPU_KERNEL`.
pub fn uses_avx512_kernel() -> bool {
    Kernel::best() == Kernel::Avx512
}

/// How the packed convolutions are computed in this process, in words for reports.
pub fn conv_kernel_name() -> &'static str {
    match Kernel::best() {
        Kernel::Avx512 => "packed AVX-512 kernel",
        Kernel::Gemm => "im2col + gemm",
    }
}

/// How the tiles are computed; the fastest way this CPU supports unless a test asks otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// The AVX-512F assembly micro-kernel (x86-64 only).
    Avx512,
    /// Anywhere else: per block of pixels their im2col rows, then per weight panel one gemm
    /// (the gemm crate, with its own SIMD dispatch: AVX2, NEON, ...) onto output rows
    /// prefilled with bias and residual, then the ReLU over those rows.
    Gemm,
}

impl Kernel {
    /// The AVX-512 kernel where the CPU has it, unless `GPUKIT_CPU_KERNEL=gemm` asks for the
    /// portable path (so one machine can test both; CI runs the suite both ways).
    fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("GPUKIT_CPU_KERNEL").is_ok_and(|v| v == "gemm");
            if Kernel::Avx512.available() && !forced {
                Kernel::Avx512
            } else {
                Kernel::Gemm
            }
        })
    }

    /// Whether this CPU can run the kernel.
    fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 => false,
            Kernel::Gemm => true,
        }
    }

    /// Runs one tile.
    ///
    /// # Safety
    ///
    /// Every pointer of `t` must address what its field's documentation says, `taps >= 1`,
    /// no output row may alias any input, and the kernel must be `available`.
    unsafe fn run(self, t: &Tile) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: per the caller.
            Kernel::Avx512 => unsafe { tile_avx512(t) },
            _ => unreachable!("{self:?} computes no tiles (asked for {:p})", t),
        }
    }
}

/// Row j's part of one depth step of the AVX-512 kernel: broadcast its value at byte `$a` of
/// its row pointer `$row`, multiply it by the panel's four weight vectors (three in zmm28-30,
/// the fourth read from `[rsi + $w3]`) into its accumulators `$a0..$a3`.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_fma {
    ($row:literal, $a:literal, $w3:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [", $row, " + ", $a, "]\n",
            "vfmadd231ps zmm", $a0, ", zmm28, zmm31\n",
            "vfmadd231ps zmm", $a1, ", zmm29, zmm31\n",
            "vfmadd231ps zmm", $a2, ", zmm30, zmm31\n",
            "vfmadd231ps zmm", $a3, ", zmm31, [rsi + ", $w3, "]\n",
        )
    };
}

/// One depth step of the AVX-512 kernel, `$a` bytes into the rows and `$w0` into the panel:
/// 7 rows x 4 vectors = 28 FMAs. The fourth weight vector is a memory operand (there is no
/// register left for it), which keeps the loads at 10 full vectors and 7 scalars per 28 FMAs.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_step {
    ($a:literal, $w0:literal, $w1:literal, $w2:literal, $w3:literal) => {
        concat!(
            "vmovups zmm28, [rsi + ", $w0, "]\n",
            "vmovups zmm29, [rsi + ", $w1, "]\n",
            "vmovups zmm30, [rsi + ", $w2, "]\n",
            avx512_row_fma!("rax", $a, $w3, "0", "1", "2", "3"),
            avx512_row_fma!("rcx", $a, $w3, "4", "5", "6", "7"),
            avx512_row_fma!("rdx", $a, $w3, "8", "9", "10", "11"),
            avx512_row_fma!("r10", $a, $w3, "12", "13", "14", "15"),
            avx512_row_fma!("r11", $a, $w3, "16", "17", "18", "19"),
            avx512_row_fma!("r12", $a, $w3, "20", "21", "22", "23"),
            avx512_row_fma!("r14", $a, $w3, "24", "25", "26", "27"),
        )
    };
}

/// Advances the seven row pointers by `$b` bytes (a number, or a memory operand).
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_advance_rows {
    ($b:literal) => {
        concat!(
            "add rax, ", $b, "\n", "add rcx, ", $b, "\n", "add rdx, ", $b, "\n",
            "add r10, ", $b, "\n", "add r11, ", $b, "\n", "add r12, ", $b, "\n",
            "add r14, ", $b, "\n",
        )
    };
}

/// Loads the pointer at byte `$field` of the tile into rax, then applies `$op` to accumulators
/// `$a0..$a3` with the four vectors there: `$op zmm, zmm, [rax + 64v]`.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_mem {
    ($op:literal, $field:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "mov rax, [rdi + ", $field, "]\n",
            $op, " zmm", $a0, ", zmm", $a0, ", [rax]\n",
            $op, " zmm", $a1, ", zmm", $a1, ", [rax + 64]\n",
            $op, " zmm", $a2, ", zmm", $a2, ", [rax + 128]\n",
            $op, " zmm", $a3, ", zmm", $a3, ", [rax + 192]\n",
        )
    };
}

/// Loads the pointer at byte `$field` of the tile into rax and loads accumulators `$a0..$a3`
/// from there.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_load {
    ($field:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "mov rax, [rdi + ", $field, "]\n",
            "vmovups zmm", $a0, ", [rax]\n",
            "vmovups zmm", $a1, ", [rax + 64]\n",
            "vmovups zmm", $a2, ", [rax + 128]\n",
            "vmovups zmm", $a3, ", [rax + 192]\n",
        )
    };
}

/// Loads the pointer at byte `$field` of the tile into rax and stores accumulators `$a0..$a3`
/// there.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_store {
    ($field:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "mov rax, [rdi + ", $field, "]\n",
            "vmovups [rax], zmm", $a0, "\n",
            "vmovups [rax + 64], zmm", $a1, "\n",
            "vmovups [rax + 128], zmm", $a2, "\n",
            "vmovups [rax + 192], zmm", $a3, "\n",
        )
    };
}

/// Sets accumulators `$a0..$a3` to the bias in zmm28-31, or clamps them at zero (zmm28).
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_init {
    ($a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "vmovaps zmm", $a0, ", zmm28\n", "vmovaps zmm", $a1, ", zmm29\n",
            "vmovaps zmm", $a2, ", zmm30\n", "vmovaps zmm", $a3, ", zmm31\n",
        )
    };
}
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_relu {
    ($a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "vmaxps zmm", $a0, ", zmm", $a0, ", zmm28\n", "vmaxps zmm", $a1, ", zmm", $a1, ", zmm28\n",
            "vmaxps zmm", $a2, ", zmm", $a2, ", zmm28\n", "vmaxps zmm", $a3, ", zmm", $a3, ", zmm28\n",
        )
    };
}

/// The AVX-512 micro-kernel: a 7 x 64 tile in 28 zmm accumulators (row j in zmm4j..4j+3), the
/// depth loop unrolled by 4. Written as inline assembly because the AVX-512 intrinsics and
/// target feature are newer than this crate's minimum Rust; it only ever runs after runtime
/// detection, and declares every register it touches: the System V ABI's caller-saved set
/// (named explicitly, so that on Windows too, where rsi, rdi and xmm6-15 are callee-saved, the
/// compiler saves what it needs), plus r12, r13, r14 and r15.
///
/// # Safety
///
/// As `Kernel::run`, on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_avx512(t: &Tile) {
    // SAFETY: the kernel reads the rows, weights, bias and residual rows and writes the output
    // rows within the extents the caller guarantees, at the `Tile` field offsets checked below;
    // it uses no stack, and vzeroupper avoids AVX-SSE transition penalties after it.
    unsafe {
        std::arch::asm!(
            // accumulators = the partial sums in out (accumulate at 176), else the bias
            "cmp qword ptr [rdi + 176], 0",
            "je 9f",
            avx512_row_load!("40", "0", "1", "2", "3"),
            avx512_row_load!("48", "4", "5", "6", "7"),
            avx512_row_load!("56", "8", "9", "10", "11"),
            avx512_row_load!("64", "12", "13", "14", "15"),
            avx512_row_load!("72", "16", "17", "18", "19"),
            avx512_row_load!("80", "20", "21", "22", "23"),
            avx512_row_load!("88", "24", "25", "26", "27"),
            "jmp 23f",
            "9:",
            "mov rax, [rdi + 32]",
            "vmovups zmm28, [rax]",
            "vmovups zmm29, [rax + 64]",
            "vmovups zmm30, [rax + 128]",
            "vmovups zmm31, [rax + 192]",
            avx512_row_init!("0", "1", "2", "3"),
            avx512_row_init!("4", "5", "6", "7"),
            avx512_row_init!("8", "9", "10", "11"),
            avx512_row_init!("12", "13", "14", "15"),
            avx512_row_init!("16", "17", "18", "19"),
            avx512_row_init!("20", "21", "22", "23"),
            avx512_row_init!("24", "25", "26", "27"),
            "23:",
            "mov r15, [rdi + 168]",
            "mov rsi, [rdi + 8]",
            "mov r9, [rdi]",
            "mov r8, [rdi + 16]",
            // for each tap: its seven row pointers, then the depth loop
            "2:",
            "mov rax, [r9]",
            "mov rcx, [r9 + 8]",
            "mov rdx, [r9 + 16]",
            "mov r10, [r9 + 24]",
            "mov r11, [r9 + 32]",
            "mov r12, [r9 + 40]",
            "mov r14, [r9 + 48]",
            "add r9, 56",
            avx512_advance_rows!("[rdi + 184]"),
            "mov r13, [rdi + 24]",
            "cmp r13, 4",
            "jb 4f",
            // (aligned: the loop's placement otherwise moved with unrelated code, ~2% either way)
            ".p2align 6",
            "3:",
            avx512_step!("0", "0", "64", "128", "192"),
            avx512_step!("4", "256", "320", "384", "448"),
            avx512_step!("8", "512", "576", "640", "704"),
            avx512_step!("12", "768", "832", "896", "960"),
            "prefetcht1 [r15]",
            "prefetcht1 [r15 + 64]",
            "prefetcht1 [r15 + 128]",
            "prefetcht1 [r15 + 192]",
            "add r15, 256",
            "add rsi, 1024",
            avx512_advance_rows!("16"),
            "sub r13, 4",
            "cmp r13, 4",
            "jae 3b",
            "4:",
            "test r13, r13",
            "jz 6f",
            "5:",
            avx512_step!("0", "0", "64", "128", "192"),
            "prefetcht1 [r15]",
            "add r15, 64",
            "add rsi, 256",
            avx512_advance_rows!("4"),
            "dec r13",
            "jnz 5b",
            "6:",
            "dec r8",
            "jnz 2b",
            // epilogue: + residual (has_residual at 160, pointers from 96), ReLU (relu at
            // 152), store (pointers from 40)
            "cmp qword ptr [rdi + 160], 0",
            "je 7f",
            avx512_row_mem!("vaddps", "96", "0", "1", "2", "3"),
            avx512_row_mem!("vaddps", "104", "4", "5", "6", "7"),
            avx512_row_mem!("vaddps", "112", "8", "9", "10", "11"),
            avx512_row_mem!("vaddps", "120", "12", "13", "14", "15"),
            avx512_row_mem!("vaddps", "128", "16", "17", "18", "19"),
            avx512_row_mem!("vaddps", "136", "20", "21", "22", "23"),
            avx512_row_mem!("vaddps", "144", "24", "25", "26", "27"),
            "7:",
            "cmp qword ptr [rdi + 152], 0",
            "je 8f",
            "vpxord zmm28, zmm28, zmm28",
            avx512_row_relu!("0", "1", "2", "3"),
            avx512_row_relu!("4", "5", "6", "7"),
            avx512_row_relu!("8", "9", "10", "11"),
            avx512_row_relu!("12", "13", "14", "15"),
            avx512_row_relu!("16", "17", "18", "19"),
            avx512_row_relu!("20", "21", "22", "23"),
            avx512_row_relu!("24", "25", "26", "27"),
            "8:",
            avx512_row_store!("40", "0", "1", "2", "3"),
            avx512_row_store!("48", "4", "5", "6", "7"),
            avx512_row_store!("56", "8", "9", "10", "11"),
            avx512_row_store!("64", "12", "13", "14", "15"),
            avx512_row_store!("72", "16", "17", "18", "19"),
            avx512_row_store!("80", "20", "21", "22", "23"),
            avx512_row_store!("88", "24", "25", "26", "27"),
            "vzeroupper",
            in("rdi") t as *const Tile,
            out("r12") _,
            out("r13") _,
            out("r14") _,
            out("r15") _,
            clobber_abi("sysv64"),
            options(nostack),
        );
    }
}

// The byte offsets the assembly kernel reads `Tile` at, and the shape it is written for.
#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(std::mem::offset_of!(Tile, rows) == 0);
    assert!(std::mem::offset_of!(Tile, weight) == 8);
    assert!(std::mem::offset_of!(Tile, taps) == 16);
    assert!(std::mem::offset_of!(Tile, depth) == 24);
    assert!(std::mem::offset_of!(Tile, bias) == 32);
    assert!(std::mem::offset_of!(Tile, out) == 40);
    assert!(std::mem::offset_of!(Tile, residual) == 96);
    assert!(std::mem::offset_of!(Tile, relu) == 152);
    assert!(std::mem::offset_of!(Tile, has_residual) == 160);
    assert!(std::mem::offset_of!(Tile, prefetch) == 168);
    assert!(std::mem::offset_of!(Tile, accumulate) == 176);
    assert!(std::mem::offset_of!(Tile, offset) == 184);
    assert!(ROWS == 7 && PANEL == 64);
};

/// Per-thread buffers of the packed convolution, kept between calls.
#[derive(Default)]
struct Scratch {
    /// Row pointers of the block being computed: groups x filter rows x `ROWS`.
    table: Vec<*const f32>,
    /// Copies of the filter rows clipped by the left or right padding, zero-filled.
    cols: AlignedBuf,
    /// Table entries that point into `cols`, as (index, offset), set once `cols` has stopped
    /// growing.
    pending: Vec<(usize, usize)>,
    /// At least `depth` zeros: the row every padding tap and missing pixel reads.
    zeros: AlignedBuf,
    /// Stand-in output and residual rows for pixels past the end and channels past K.
    tmp_out: AlignedBuf,
    tmp_res: AlignedBuf,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Most depth steps (64-float weight rows, 256 bytes each) of a panel one tile call reads: a
/// chunk of at most 512 KB stays in a core's L2 while every tile of the thread's run uses it,
/// where a larger panel (up to 1.2 MB in ResNet-50) would be streamed from L3 or memory for each.
const CHUNK_STEPS: usize = 2048;

/// A piece of the reduction: `taps` filter rows from `tap0`, `depth` values of each from `d0`
/// (whole filter rows, or a part of one).
#[derive(Clone, Copy)]
struct Chunk {
    tap0: usize,
    taps: usize,
    d0: usize,
    depth: usize,
}

/// One packed convolution call, shared by its tasks.
struct PackedRun<'a> {
    sh: ConvShape,
    q_len: usize,
    /// Output pixels per image, and in all.
    pq: usize,
    npq: usize,
    input: &'a [f32],
    packed: &'a PackedConv,
    /// The residual's first element: another buffer, or the output itself.
    residual: Option<SharedOut>,
    relu: bool,
    out: SharedOut,
    /// Filter rows (at least 1), and what each reads: S * C.
    taps: usize,
    /// Pieces the reduction is split into (see `chunk`), of at most `chunk_steps` steps.
    chunks: usize,
    chunk_steps: usize,
    depth: usize,
    /// Tiles of `ROWS` pixels, weight panels, tiles per block.
    groups: usize,
    panels: usize,
    block: usize,
    kernel: Kernel,
}

impl PackedRun<'_> {
    /// Fills `sc.table` (and `sc.cols`) for groups `g0..g1`: for each group, filter row and
    /// pixel, where that pixel's S * C values under that filter row start.
    fn prepare(&self, sc: &mut Scratch, g0: usize, g1: usize) {
        let sh = &self.sh;
        let zero = sc.zeros.as_ptr();
        let (h, w, c) = (sh.h, sh.w, sh.c);
        // rows clipped by the left/right padding: copied into `cols` as (table index, offset)
        sc.pending.clear();
        let mut used = 0;
        let input = self.input.as_ptr();
        // a local vector, so its length stays in a register across the pushes
        let mut table = std::mem::take(&mut sc.table);
        table.clear();
        table.reserve((g1 - g0) * self.taps * ROWS);
        let (stride, pad) = (sh.stride as isize, sh.pad as isize);
        let (hi, wi, ci) = (h as isize, w as isize, c as isize);
        for g in g0..g1 {
            // The group's pixels, as (input row of image 0 at filter row 0 counting every image
            // row before it, that row within its image, input column at filter column 0).
            let mut pixels = [(0isize, 0isize, 0isize); ROWS];
            let first = g * ROWS;
            let valid = ROWS.min(self.npq - first);
            let (mut n, rest) = (first / self.pq, first % self.pq);
            let (mut pi, mut qi) = (rest / self.q_len, rest % self.q_len);
            for px in &mut pixels[..valid] {
                let row = pi as isize * stride - pad;
                *px = (n as isize * hi + row, row, qi as isize * stride - pad);
                qi += 1;
                if qi == self.q_len {
                    qi = 0;
                    pi += 1;
                    if pi * self.q_len == self.pq {
                        pi = 0;
                        n += 1;
                    }
                }
            }
            for ri in 0..self.taps as isize {
                for &(abs_row, row, iw0) in &pixels[..valid] {
                    let ih = row + ri;
                    let mut ptr = zero;
                    if (0..hi).contains(&ih) {
                        let at = |iw: isize| ((abs_row + ri) * wi + iw) * ci;
                        if iw0 >= 0 && iw0 + sh.s as isize <= wi {
                            // in bounds: image n, row ih < h, columns iw0..iw0 + S <= w
                            ptr = input.wrapping_offset(at(iw0));
                        } else {
                            sc.cols.resize(used + self.depth);
                            let dst = &mut sc.cols[used..used + self.depth];
                            for (si, dst) in dst.chunks_exact_mut(c.max(1)).enumerate() {
                                let iw = iw0 + si as isize;
                                if (0..wi).contains(&iw) {
                                    let at = at(iw) as usize;
                                    dst.copy_from_slice(&self.input[at..at + c]);
                                } else {
                                    dst.fill(0.0);
                                }
                            }
                            sc.pending.push((table.len(), used));
                            used += self.depth;
                        }
                    }
                    table.push(ptr);
                }
                for _ in valid..ROWS {
                    table.push(zero);
                }
            }
        }
        sc.table = table;
        let base = sc.cols.as_ptr();
        for &(i, offset) in &sc.pending {
            sc.table[i] = base.wrapping_add(offset);
        }
    }

    /// Computes tile `g` (the `local`-th group of the table) x panel `p`.
    ///
    /// Only chunk `c` of the reduction is added: the first chunk starts from the bias, later
    /// ones from the partial sums in the output rows, and the last applies the epilogue (and
    /// copies a partial panel out of the scratch rows).
    fn tile(
        &self,
        sc: &mut Scratch,
        (local, g): (usize, usize),
        (p, c): (usize, usize),
        prefetch: *const f32,
    ) {
        let k = self.sh.k;
        let k0 = p * PANEL;
        let width = PANEL.min(k - k0);
        let tmp_out = sc.tmp_out.as_mut_ptr();
        let tmp_res = sc.tmp_res.as_mut_ptr();
        let chunk = self.chunk(c);
        let last = c + 1 == self.chunks;
        let residual = self.residual.filter(|_| last);
        let mut t = Tile {
            rows: sc.table[(local * self.taps + chunk.tap0) * ROWS..].as_ptr(),
            weight: self.packed.weight[self.weights_at(p, &chunk)..].as_ptr(),
            taps: chunk.taps,
            depth: chunk.depth,
            bias: self.packed.bias[k0..].as_ptr(),
            out: [tmp_out; ROWS],
            residual: [tmp_res.cast_const(); ROWS],
            relu: usize::from(last && self.relu),
            has_residual: usize::from(residual.is_some()),
            prefetch,
            accumulate: usize::from(c > 0),
            offset: chunk.d0 * 4,
        };
        let valid = ROWS.min(self.npq - g * ROWS);
        for j in 0..ROWS {
            let spare_out = tmp_out.wrapping_add(j * PANEL);
            let spare_res = tmp_res.wrapping_add(j * PANEL);
            t.out[j] = spare_out;
            t.residual[j] = spare_res;
            if j >= valid {
                continue;
            }
            let at = (g * ROWS + j) * k + k0;
            if width == PANEL {
                // SAFETY: pixel g*ROWS+j < NPQ, so `at + PANEL <= NPQ*K`, the output's length.
                t.out[j] = unsafe { self.out.get().add(at) };
                if let Some(r) = residual {
                    // SAFETY: the residual has the output's length.
                    t.residual[j] = unsafe { r.get().add(at) };
                }
            } else if let Some(r) = residual {
                // SAFETY: as above, `at + width <= NPQ*K`; the scratch row is another buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        r.get().add(at),
                        sc.tmp_res.as_mut_ptr().add(j * PANEL),
                        width,
                    );
                }
            }
        }
        // SAFETY: rows: the table holds taps x ROWS pointers for this group, each to `depth`
        // readable floats (input rows, copied clipped rows or the zero row, all at least depth
        // long);
        // weight: panel p holds taps*depth*64 floats; bias: 64 per panel; out/residual: whole
        // 64-float rows of this tile's pixels (disjoint from every other tile's, and from every
        // input; the residual may be the output itself, which the kernel reads before it
        // writes) or the ROWS x 64 scratch rows; taps >= 1; the kernel is available.
        unsafe { self.kernel.run(&t) };
        if width < PANEL && last {
            for j in 0..valid {
                let at = (g * ROWS + j) * k + k0;
                // SAFETY: as above, `at + width <= NPQ*K`; the scratch row is not borrowed.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        sc.tmp_out.as_ptr().add(j * PANEL),
                        self.out.get().add(at),
                        width,
                    );
                }
            }
        }
    }

    /// Chunk `c` of the reduction: `taps` filter rows from `tap0`, each `depth` values from `d0`.
    fn chunk(&self, c: usize) -> Chunk {
        if self.chunks == 1 {
            Chunk {
                tap0: 0,
                taps: self.taps,
                d0: 0,
                depth: self.depth,
            }
        } else if self.depth <= self.chunk_steps {
            let per = self.chunk_steps / self.depth;
            Chunk {
                tap0: c * per,
                taps: per.min(self.taps - c * per),
                d0: 0,
                depth: self.depth,
            }
        } else {
            let pieces = self.depth.div_ceil(self.chunk_steps);
            let len = self.depth.div_ceil(pieces);
            let d0 = c % pieces * len;
            Chunk {
                tap0: c / pieces,
                taps: 1,
                d0,
                depth: len.min(self.depth - d0),
            }
        }
    }

    /// Where chunk `chunk` of panel `p` starts in the packed weights.
    fn weights_at(&self, p: usize, chunk: &Chunk) -> usize {
        (p * self.taps * self.depth + chunk.tap0 * self.depth + chunk.d0) * PANEL
    }

    /// Tiles of panel `p` for groups `g0 + gs` (whose table starts at group `g0 + first`).
    ///
    /// With the reduction in chunks, chunk by chunk: every tile's first chunk, then every
    /// tile's second, and so on, so that one chunk of the panel stays in cache while all the
    /// tiles use it; tiles that write through the scratch rows (partial panels, the last
    /// pixels) go last, one at a time. Meanwhile the tiles prefetch the next chunk (or the next
    /// panel's first), each its share, so that it is in L2 by the time it is needed rather than
    /// fetched from memory by the first tile that uses it.
    fn panel(&self, sc: &mut Scratch, p: usize, (g0, first): (usize, usize), gs: Range<usize>) {
        let partial = (p + 1) * PANEL > self.sh.k;
        let scratch = |g: usize| self.chunks > 1 && (partial || (g0 + g + 1) * ROWS > self.npq);
        let count = gs.clone().filter(|&g| !scratch(g)).count();
        for c in 0..self.chunks {
            let chunk = self.chunk(c);
            let here = self.weights_at(p, &chunk);
            let next = if c + 1 < self.chunks {
                Some((p, c + 1))
            } else {
                (p + 1 < self.panels).then_some((p + 1, 0))
            };
            let next = next.map(|(p, c)| {
                let chunk = self.chunk(c);
                (self.weights_at(p, &chunk), chunk.taps * chunk.depth * PANEL)
            });
            // Shares under 4 KB would only repeat each other's prefetches: then every tile
            // prefetches the weights it reads anyway (cached).
            let next = next.filter(|&(_, len)| len / count.max(1) >= 1024);
            for (i, g) in gs.clone().filter(|&g| !scratch(g)).enumerate() {
                let at = next.map_or(here, |(at, len)| at + len * i / count / 16 * 16);
                let prefetch = self.packed.weight[at..].as_ptr();
                self.tile(sc, (g - first, g0 + g), (p, c), prefetch);
            }
        }
        for g in gs.filter(|&g| scratch(g)) {
            for c in 0..self.chunks {
                let here = self.weights_at(p, &self.chunk(c));
                let prefetch = self.packed.weight[here..].as_ptr();
                self.tile(sc, (g - first, g0 + g), (p, c), prefetch);
            }
        }
    }

    /// `run` with `Kernel::Gemm`: for each block, the im2col rows of the pixels the units touch
    /// (none for a 1x1 stride-1 unpadded convolution, whose input rows are those rows), then
    /// per panel one gemm over that panel's pixels.
    fn run_gemm(&self, sc: &mut Scratch, u0: usize, u1: usize) {
        let sh = &self.sh;
        let k = sh.k;
        let rsc = sh.r * sh.s * sh.c;
        let pointwise = sh.is_pointwise();
        let img_in = sh.h * sh.w * sh.c;
        let mut u = u0;
        while u < u1 {
            let b = u / (self.block * self.panels);
            let g0 = b * self.block;
            let len = self.block.min(self.groups - g0);
            let base = g0 * self.panels;
            let end = (base + len * self.panels).min(u1);
            let (l0, l1) = (u - base, end - base);
            let (first, last) = if l0 / len == (l1 - 1) / len {
                (l0 % len, (l1 - 1) % len + 1)
            } else {
                (0, len)
            };
            let pixels = |from: usize, to: usize| {
                ((g0 + from) * ROWS).min(self.npq)..((g0 + to) * ROWS).min(self.npq)
            };
            let touched = pixels(first, last);
            let (lhs, lhs_first) = if pointwise {
                (self.input, 0)
            } else {
                sc.cols.resize(touched.len() * rsc);
                for (pix, row) in touched.clone().zip(sc.cols.chunks_exact_mut(rsc.max(1))) {
                    let img = &self.input[pix / self.pq * img_in..][..img_in];
                    // SAFETY: viewing initialised f32 as MaybeUninit<f32> only allows writes of
                    // valid f32, which the function does to every element.
                    let dst = unsafe { &mut *(row as *mut [f32] as *mut [MaybeUninit<f32>]) };
                    im2col_nhwc_row(sh, img, pix % self.pq, dst);
                }
                (&sc.cols[..], touched.start)
            };
            for p in l0 / len..=(l1 - 1) / len {
                let from = if p == l0 / len { l0 % len } else { 0 };
                let to = if p == (l1 - 1) / len {
                    (l1 - 1) % len + 1
                } else {
                    len
                };
                let rows = pixels(from, to);
                if rows.is_empty() {
                    continue;
                }
                let k0 = p * PANEL;
                let width = PANEL.min(k - k0);
                let bias = &self.packed.bias[k0..k0 + width];
                let out = self.out.get();
                // SAFETY: rows < NPQ, channels k0..k0 + width < K: inside the output (and the
                // residual, of the same length); these rows x channels are this unit range's
                // alone.
                unsafe {
                    for pix in rows.clone() {
                        let dst = std::slice::from_raw_parts_mut(out.add(pix * k + k0), width);
                        match self.residual {
                            Some(r) if r.get() == out => {
                                for (d, &b) in dst.iter_mut().zip(bias) {
                                    *d += b;
                                }
                            }
                            Some(r) => {
                                let res =
                                    std::slice::from_raw_parts(r.get().add(pix * k + k0), width);
                                for ((d, &b), &r) in dst.iter_mut().zip(bias).zip(res) {
                                    *d = b + r;
                                }
                            }
                            None => dst.copy_from_slice(bias),
                        }
                    }
                    gemm::gemm(
                        rows.len(),
                        width,
                        rsc,
                        out.add(rows.start * k + k0),
                        1,
                        k as isize,
                        true,
                        lhs.as_ptr().wrapping_add((rows.start - lhs_first) * rsc),
                        1,
                        rsc as isize,
                        self.packed.weight.as_ptr().wrapping_add(p * rsc * PANEL),
                        1,
                        PANEL as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                    if self.relu {
                        for pix in rows {
                            let dst = std::slice::from_raw_parts_mut(out.add(pix * k + k0), width);
                            for d in dst {
                                *d = if *d > 0.0 { *d } else { 0.0 };
                            }
                        }
                    }
                }
            }
            u = end;
        }
    }

    /// Runs work units `u0..u1`: unit `u` is, within block `b = u / (block * panels)`, panel
    /// `local / len` of group `b * block + local % len`, so consecutive units sweep a block's
    /// groups under one weight panel before moving to the next panel.
    fn run(&self, u0: usize, u1: usize) {
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let sc = &mut *guard;
            if sc.zeros.len() < self.depth {
                sc.zeros.resize(self.depth);
            }
            sc.tmp_out.resize(ROWS * PANEL);
            sc.tmp_res.resize(ROWS * PANEL);
            if self.kernel == Kernel::Gemm {
                self.run_gemm(sc, u0, u1);
                return;
            }
            let mut u = u0;
            while u < u1 {
                let b = u / (self.block * self.panels);
                let g0 = b * self.block;
                let len = self.block.min(self.groups - g0);
                let base = g0 * self.panels;
                let end = (base + len * self.panels).min(u1);
                let (l0, l1) = (u - base, end - base);
                // the groups these units touch: a sub-range unless they wrap past a panel
                let (first, last) = if l0 / len == (l1 - 1) / len {
                    (l0 % len, (l1 - 1) % len + 1)
                } else {
                    (0, len)
                };
                self.prepare(sc, g0 + first, g0 + last);
                for p in l0 / len..=(l1 - 1) / len {
                    // this panel's groups among the units
                    let from = if p == l0 / len { l0 % len } else { 0 };
                    let to = if p == (l1 - 1) / len {
                        (l1 - 1) % len + 1
                    } else {
                        len
                    };
                    self.panel(sc, p, (g0, first), from..to);
                }
                u = end;
            }
        });
    }
}

/// NHWC convolution with packed weights and a fused epilogue:
/// `output = relu?(conv(input, weight) + bias + residual)`, ReLU when `relu`.
///
/// Input N,H,W,C; output and `residual` N,P,Q,K; the packed weight's K, C, R, S must be the
/// shape's. Zero padding `pad` on all sides, `stride` in both directions. Overwrites output.
/// Work is split in tiles of 7 pixels x 64 channels, each of `threads()` threads taking one
/// contiguous run of tiles (on the spinning team, see `parallel_ranges`).
///
/// # Panics
///
/// If the lengths or the packed weight's shape do not match `shape`.
pub fn conv2d_nhwc_packed(
    shape: &ConvShape,
    input: &[f32],
    packed: &PackedConv,
    residual: Option<&[f32]>,
    relu: bool,
    output: &mut [f32],
) {
    let residual = residual.map_or(Residual::None, Residual::Separate);
    conv_packed_with(
        shape,
        (input, packed, residual),
        relu,
        output,
        (threads(), Kernel::best(), CHUNK_STEPS),
    );
}

/// [`conv2d_nhwc_packed`] with the residual already in `output`, which the result overwrites:
/// `output = relu?(conv(input, weight) + bias + output)`. Saves a buffer, and the memory
/// traffic of a third activation-sized array.
///
/// # Panics
///
/// As [`conv2d_nhwc_packed`].
pub fn conv2d_nhwc_packed_onto(
    shape: &ConvShape,
    input: &[f32],
    packed: &PackedConv,
    relu: bool,
    output: &mut [f32],
) {
    conv_packed_with(
        shape,
        (input, packed, Residual::InPlace),
        relu,
        output,
        (threads(), Kernel::best(), CHUNK_STEPS),
    );
}

/// Where a packed convolution's residual comes from.
#[derive(Clone, Copy)]
enum Residual<'a> {
    None,
    Separate(&'a [f32]),
    /// The output buffer holds it.
    InPlace,
}

/// `conv2d_nhwc_packed` with the thread count, kernel and chunk size explicit, for tests.
fn conv_packed_with(
    sh: &ConvShape,
    (input, packed, residual): (&[f32], &PackedConv, Residual<'_>),
    relu: bool,
    output: &mut [f32],
    (threads, kernel, chunk_steps): (usize, Kernel, usize),
) {
    assert_eq!(
        (packed.k, packed.c, packed.r, packed.s),
        (sh.k, sh.c, sh.r, sh.s),
        "conv2d_nhwc_packed: packed weight shape"
    );
    assert_eq!(
        input.len(),
        sh.input_len(),
        "conv2d_nhwc_packed: input length"
    );
    assert_eq!(
        output.len(),
        sh.output_len(),
        "conv2d_nhwc_packed: output length"
    );
    if let Residual::Separate(r) = residual {
        assert_eq!(r.len(), output.len(), "conv2d_nhwc_packed: residual length");
    }
    assert!(
        kernel.available(),
        "conv2d_nhwc_packed: kernel {kernel:?} unavailable"
    );
    let chunk_steps = chunk_steps.max(1);
    if output.is_empty() {
        return;
    }
    let (p_len, q_len) = (sh.out_h(), sh.out_w());
    let pq = p_len * q_len;
    let npq = sh.n * pq;
    // With no filter rows there is nothing to read: one tap of depth 0 leaves the bias.
    let (taps, depth) = if sh.r == 0 {
        (1, 0)
    } else {
        (sh.r, sh.s * sh.c)
    };
    // Partial sums go to the output rows, so a residual already there must stay whole.
    let chunks = if taps * depth <= chunk_steps || matches!(residual, Residual::InPlace) {
        1
    } else if depth <= chunk_steps {
        taps.div_ceil(chunk_steps / depth)
    } else {
        taps * depth.div_ceil(chunk_steps)
    };
    let groups = npq.div_ceil(ROWS);
    let panels = sh.k.div_ceil(PANEL);
    // The input a group reads: its pixels' rows (with a stride the filter spans, the rows
    // between them too).
    let group_bytes = ROWS * sh.c * 4 * sh.stride.min(sh.r) * sh.stride.min(sh.s);
    // (With the reduction in chunks, a chunk of weights shares L2 with the block: half as much.)
    let budget = if chunks > 1 {
        BLOCK_INPUT_BYTES / 2
    } else {
        BLOCK_INPUT_BYTES
    };
    let block = (budget / group_bytes.max(1)).clamp(1, groups);
    let run = PackedRun {
        sh: *sh,
        q_len,
        pq,
        npq,
        input,
        packed,
        residual: match residual {
            Residual::None => None,
            // read only, through the shared pointer
            Residual::Separate(r) => Some(SharedOut(r.as_ptr().cast_mut())),
            Residual::InPlace => Some(SharedOut(output.as_mut_ptr())),
        },
        relu,
        out: SharedOut(output.as_mut_ptr()),
        taps,
        chunks,
        chunk_steps,
        depth,
        groups,
        panels,
        block,
        kernel,
    };
    // One contiguous run of units per thread: the units of a layer cost the same, so this
    // balances to within one unit, and each thread reads the fewest weight panels and input
    // rows. (Guided self-scheduling from a shared counter measured a few percent slower.)
    let units = groups * panels;
    run_parts(threads.clamp(1, units), &|i, parts| {
        run.run(units * i / parts, units * (i + 1) / parts)
    });
}

// ---------------------------------------------------------------------------------------------
// A team of spinning threads for the layer-by-layer inference path.
//
// A ResNet forward pass is some 55 parallel steps of 0.05-0.5 ms each at batch 1. Handing each
// to rayon wakes its sleeping workers every time, and the last one starts tens of microseconds
// late (measured 7-12 us per step on 2 cores, more with more threads). The team's workers
// instead wait between steps without sleeping, like an OpenMP runtime's: they spin for 50 us,
// then keep checking but yield their core to any other runnable thread in between, and park
// after 2 ms, so a step reaches every thread within a cache-line transfer while the machine is
// otherwise idle, and the team gives way to other work while it is not. The convolution and
// `parallel_ranges` use it when the work is split as many ways as rayon has threads (so a
// caller's own rayon pool of another size still gets rayon), and not from inside a team job.
// ---------------------------------------------------------------------------------------------

/// How long an idle team worker spins flat out before it starts yielding its core to any
/// other runnable thread between checks, and how long it waits in all before it parks.
const TEAM_SPIN: std::time::Duration = std::time::Duration::from_micros(50);
const TEAM_PARK: std::time::Duration = std::time::Duration::from_millis(2);

/// A job as the workers see it: the leader's closure, its lifetime erased (the leader does not
/// return before every worker is done with it).
type JobPtr = *const (dyn Fn(usize) + Sync + 'static);

/// What the leader and the workers share.
struct TeamState {
    /// Bumped (SeqCst) by the leader to start a job.
    generation: AtomicUsize,
    /// The current job; written only while no worker runs one.
    job: std::cell::UnsafeCell<JobPtr>,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Whether a worker's share of the current job panicked.
    panicked: AtomicBool,
    /// Workers parked (or about to park) on `cv`.
    sleepers: AtomicUsize,
    mutex: Mutex<()>,
    cv: Condvar,
}

// SAFETY: `job` is written by the leader only between jobs (no worker reads it then, see
// `Team::run`) and read by workers only during one; the closure it points to is Sync, so
// calling it from any thread is fine; everything else is atomics and locks.
unsafe impl Sync for TeamState {}
// SAFETY: as for Sync: the pointer is only a handle to a Sync closure.
unsafe impl Send for TeamState {}

/// Threads that run one job at a time, each member (the caller being member 0) with its index.
struct Team {
    size: usize,
    state: Arc<TeamState>,
    /// One job at a time, whoever calls.
    leader: Mutex<()>,
}

thread_local! {
    /// Whether this thread is running a team job (a nested job must not wait for the team).
    static IN_TEAM_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Placeholder for `TeamState::job` before the first job.
fn no_job(_: usize) {}

impl Team {
    /// A team of `size` members: the caller and `size - 1` new threads; None if a thread
    /// cannot be started.
    fn new(size: usize) -> Option<Team> {
        let placeholder: &'static (dyn Fn(usize) + Sync) = &no_job;
        let state = Arc::new(TeamState {
            generation: AtomicUsize::new(0),
            job: std::cell::UnsafeCell::new(placeholder as JobPtr),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            mutex: Mutex::new(()),
            cv: Condvar::new(),
        });
        for index in 1..size {
            let st = Arc::clone(&state);
            std::thread::Builder::new()
                .name(format!("gpukit-team-{index}"))
                .spawn(move || Team::work(&st, index))
                .ok()?;
        }
        Some(Team {
            size,
            state,
            leader: Mutex::new(()),
        })
    }

    /// A worker's life: wait for a job, run its share, report; forever (the team is static).
    fn work(st: &TeamState, index: usize) {
        let mut seen = 0;
        loop {
            let mut spins = 0u32;
            let mut since = None;
            loop {
                let g = st.generation.load(Ordering::Acquire);
                if g != seen {
                    seen = g;
                    break;
                }
                spins = spins.wrapping_add(1);
                if spins & 63 == 0 {
                    let start = *since.get_or_insert_with(std::time::Instant::now);
                    let waited = start.elapsed();
                    if waited > TEAM_SPIN {
                        // on a busy machine, let whoever else is runnable have the core
                        std::thread::yield_now();
                    }
                    if waited > TEAM_PARK {
                        // park; the leader notifies under the mutex when it sees a sleeper
                        st.sleepers.fetch_add(1, Ordering::SeqCst);
                        let mut guard = st.mutex.lock().unwrap_or_else(|e| e.into_inner());
                        while st.generation.load(Ordering::SeqCst) == seen {
                            guard = st.cv.wait(guard).unwrap_or_else(|e| e.into_inner());
                        }
                        drop(guard);
                        st.sleepers.fetch_sub(1, Ordering::SeqCst);
                        since = None;
                    }
                }
                std::hint::spin_loop();
            }
            // SAFETY: the generation was bumped after the job was written (Release/Acquire),
            // and the leader keeps the closure alive until `pending` reaches zero below.
            let job = unsafe { &**st.job.get() };
            IN_TEAM_JOB.with(|f| f.set(true));
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index)));
            IN_TEAM_JOB.with(|f| f.set(false));
            if ok.is_err() {
                st.panicked.store(true, Ordering::Relaxed);
            }
            st.pending.fetch_sub(1, Ordering::Release);
        }
    }

    /// Runs `job(i)` for every member i, the caller taking 0; returns when all are done.
    ///
    /// # Panics
    ///
    /// If any member's share panicked (after every member has finished).
    fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        let _leader = self.leader.lock().unwrap_or_else(|e| e.into_inner());
        let st = &*self.state;
        /// Waits for the workers even when the leader's own share unwinds, since they borrow
        /// the job from the leader's stack.
        struct Wait<'a>(&'a TeamState);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                let mut spins = 0u32;
                while self.0.pending.load(Ordering::Acquire) != 0 {
                    // a worker still busy, or descheduled: after a short spin, yield
                    spins = spins.saturating_add(1);
                    if spins > 2048 {
                        std::thread::yield_now();
                    }
                    std::hint::spin_loop();
                }
            }
        }
        // SAFETY: no worker is running a job (the previous run waited for all of them), so
        // none reads `job` while it is replaced; the erased lifetime is upheld by `Wait`.
        unsafe {
            *st.job.get() = std::mem::transmute::<&(dyn Fn(usize) + Sync), JobPtr>(job);
        }
        st.panicked.store(false, Ordering::Relaxed);
        st.pending.store(self.size - 1, Ordering::Relaxed);
        st.generation.fetch_add(1, Ordering::SeqCst);
        if st.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = st.mutex.lock().unwrap_or_else(|e| e.into_inner());
            st.cv.notify_all();
        }
        {
            let _wait = Wait(st);
            IN_TEAM_JOB.with(|f| f.set(true));
            let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0)));
            IN_TEAM_JOB.with(|f| f.set(false));
            if let Err(payload) = mine {
                drop(_wait);
                std::panic::resume_unwind(payload);
            }
        }
        assert!(
            !st.panicked.load(Ordering::Relaxed),
            "a team thread panicked"
        );
    }
}

/// The process's team, sized like rayon's global pool when first asked for.
fn global_team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<Team>> = OnceLock::new();
    TEAM.get_or_init(|| Team::new(rayon::current_num_threads()))
        .as_ref()
}

/// Runs `job(i, parts)` for i in 0..parts, in parallel: on the spinning team when this thread
/// may use it and its size is `parts` (else on rayon), inline when `parts` is 1.
fn run_parts(parts: usize, job: &(dyn Fn(usize, usize) + Sync)) {
    if parts <= 1 {
        job(0, 1);
        return;
    }
    let team = global_team().filter(|t| t.size == parts && !IN_TEAM_JOB.with(|f| f.get()));
    match team {
        Some(t) => t.run(&|i| job(i, parts)),
        None => (0..parts).into_par_iter().for_each(|i| job(i, parts)),
    }
}

/// Calls `f` on `threads()` contiguous, nearly equal ranges covering `0..count`, in parallel
/// (on the same spinning team as [`conv2d_nhwc_packed`], so that short steps between
/// convolutions do not wake rayon's sleeping threads). Ranges may be empty.
pub fn parallel_ranges(count: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let parts = threads().min(count).max(1);
    run_parts(parts, &|i, parts| {
        f(count * i / parts..count * (i + 1) / parts)
    });
}

/// Calls `f(row_index, row)` for every `row_len`-element row of `buf` (the last row may be
/// shorter), the rows split over the team in contiguous ranges as [`parallel_ranges`] splits
/// them: each call gets its own row, so callers write in parallel with no unsafe code.
pub fn parallel_rows(buf: &mut [f32], row_len: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let row_len = row_len.max(1);
    let len = buf.len();
    let rows = len.div_ceil(row_len);
    let out = SharedOut(buf.as_mut_ptr());
    parallel_ranges(rows, &|range| {
        for i in range {
            let start = i * row_len;
            let n = row_len.min(len - start);
            // SAFETY: every row index is handed to exactly one range, rows are disjoint and
            // inside `buf`, whose exclusive borrow outlives the parallel section.
            let row = unsafe { std::slice::from_raw_parts_mut(out.get().add(start), n) };
            f(i, row);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    /// xorshift64* seeded from the clock, so every run sees fresh inputs.
    struct Rng(u64);

    impl Rng {
        /// A generator for one test; `salt` keeps tests started in the same instant apart.
        fn new(salt: u64) -> (Self, u64) {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let seed = nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (Self::from_seed(seed), seed)
        }

        fn from_seed(seed: u64) -> Self {
            Rng(seed | 1)
        }

        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }

        fn vec(&mut self, len: usize) -> Vec<f64> {
            (0..len).map(|_| self.unit()).collect()
        }
    }

    /// ||out - reference|| / ||reference|| (absolute when the reference is zero).
    fn rel_err(out: impl IntoIterator<Item = f64>, reference: &[f64]) -> f64 {
        let (mut diff, mut norm) = (0.0, 0.0);
        let mut count = 0;
        for (o, r) in out.into_iter().zip(reference) {
            diff += (o - r) * (o - r);
            norm += r * r;
            count += 1;
        }
        assert_eq!(count, reference.len());
        if norm == 0.0 {
            diff.sqrt()
        } else {
            (diff / norm).sqrt()
        }
    }

    fn naive_matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        c
    }

    const MATMUL_SHAPES: &[(usize, usize, usize)] = &[
        (37, 53, 71),
        (1, 53, 71),
        (37, 1, 71),
        (37, 53, 1),
        (1, 1, 1),
        (64, 48, 96),
        (3, 0, 5),
        (0, 4, 5),
        (4, 3, 0),
    ];

    #[test]
    fn matmul_f64_matches_reference() {
        let (mut rng, seed) = Rng::new(1);
        for &(m, n, k) in MATMUL_SHAPES {
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let mut c = vec![f64::NAN; m * n];
            matmul_f64(&a, &b, &mut c, m, n, k);
            let err = rel_err(c, &naive_matmul(&a, &b, m, n, k));
            assert!(err < 1e-12, "f64 {m}x{n}x{k}: err {err:e}, seed {seed}");
        }
    }

    #[test]
    fn matmul_f32_matches_reference() {
        let (mut rng, seed) = Rng::new(2);
        for &(m, n, k) in MATMUL_SHAPES {
            let a: Vec<f32> = rng.vec(m * k).into_iter().map(|x| x as f32).collect();
            let b: Vec<f32> = rng.vec(k * n).into_iter().map(|x| x as f32).collect();
            let mut c = vec![f32::NAN; m * n];
            matmul_f32(&a, &b, &mut c, m, n, k);
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let reference = naive_matmul(&wide(&a), &wide(&b), m, n, k);
            let err = rel_err(c.iter().map(|&x| f64::from(x)), &reference);
            assert!(err < 1e-5, "f32 {m}x{n}x{k}: err {err:e}, seed {seed}");
        }
    }

    #[test]
    fn tile_edges_follow_the_size_and_the_threads() {
        // the sizes runs 33-34 measured on 16 threads
        assert_eq!(tile_edge(2048, 2048, 16), 176);
        assert_eq!(tile_edge(4096, 4096, 16), 368);
        assert_eq!(tile_edge(8192, 8192, 16), 384);
        // fewer threads, bigger share each: still capped
        assert_eq!(tile_edge(4096, 4096, 2), 384);
        // never below 128 unless the side is shorter
        assert_eq!(tile_edge(1000, 1000, 64), 128);
        assert_eq!(tile_edge(37, 100_000, 16), 37);
        for &(len, other, t) in &[(1, 1, 1), (5000, 3, 7), (100_000, 64, 16)] {
            let e = tile_edge(len, other, t);
            assert!(
                e >= 1 && e <= len.max(1) && e <= 384,
                "{len} {other} {t}: {e}"
            );
        }
    }

    #[test]
    fn tiled_matmuls_match_the_reference_in_every_block() {
        // a 7-thread pool and these sizes give grids with ragged last tiles
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(7)
            .build()
            .unwrap();
        let (mut rng, seed) = Rng::new(4);
        for &(m, n, k) in &[
            (301, 257, 129),
            (200, 700, 64),
            (513, 515, 100),
            (1000, 9, 900),
        ] {
            assert!(
                2 * m * n * k >= MIN_SPLIT_FLOP,
                "{m}x{n}x{k} would not be split"
            );
            let a = rng.vec(m * k);
            let b = rng.vec(k * n);
            let reference = naive_matmul(&a, &b, m, n, k);
            let mut c64 = vec![f64::NAN; m * n];
            pool.install(|| matmul_f64(&a, &b, &mut c64, m, n, k));
            let err = rel_err(c64.iter().copied(), &reference);
            assert!(err < 1e-12, "f64 {m}x{n}x{k}: err {err:e}, seed {seed}");
            let (a32, b32): (Vec<f32>, Vec<f32>) = (
                a.iter().map(|&x| x as f32).collect(),
                b.iter().map(|&x| x as f32).collect(),
            );
            let mut c = vec![f32::NAN; m * n];
            pool.install(|| matmul_f32(&a32, &b32, &mut c, m, n, k));
            // every element, not only the norm: a block left unwritten stays NaN
            assert!(
                c.iter().all(|x| x.is_finite()),
                "f32 {m}x{n}x{k}: unwritten block"
            );
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let reference = naive_matmul(&wide(&a32), &wide(&b32), m, n, k);
            let err = rel_err(c.iter().map(|&x| f64::from(x)), &reference);
            assert!(err < 1e-5, "f32 {m}x{n}x{k}: err {err:e}, seed {seed}");
        }
    }

    #[test]
    fn matmul_f16_matches_reference() {
        let (mut rng, seed) = Rng::new(3);
        for &(m, n, k) in MATMUL_SHAPES {
            let a: Vec<f16> = rng.vec(m * k).into_iter().map(f16::from_f64).collect();
            let b: Vec<f16> = rng.vec(k * n).into_iter().map(f16::from_f64).collect();
            let mut c = vec![f16::NAN; m * n];
            matmul_f16(&a, &b, &mut c, m, n, k);
            let wide = |v: &[f16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
            let reference = naive_matmul(&wide(&a), &wide(&b), m, n, k);
            let err = rel_err(c.iter().map(|x| x.to_f64()), &reference);
            assert!(err < 1e-2, "f16 {m}x{n}x{k}: err {err:e}, seed {seed}");
        }
    }

    #[test]
    #[should_panic(expected = "matmul: B must hold")]
    fn matmul_rejects_wrong_length() {
        let mut c = vec![0.0f32; 4];
        matmul_f32(&[0.0; 4], &[0.0; 3], &mut c, 2, 2, 2);
    }

    /// Direct convolution in f64 with logical (n, c, h, w) indexing, mapped per layout.
    fn naive_conv(sh: &ConvShape, layout: Layout, input: &[f64], weight: &[f64]) -> Vec<f64> {
        let (p_len, q_len) = (sh.out_h(), sh.out_w());
        let in_at = |n: usize, c: usize, h: usize, w: usize| match layout {
            Layout::Nchw => input[((n * sh.c + c) * sh.h + h) * sh.w + w],
            Layout::Nhwc => input[((n * sh.h + h) * sh.w + w) * sh.c + c],
        };
        let w_at = |k: usize, c: usize, r: usize, s: usize| match layout {
            Layout::Nchw => weight[((k * sh.c + c) * sh.r + r) * sh.s + s],
            Layout::Nhwc => weight[((k * sh.r + r) * sh.s + s) * sh.c + c],
        };
        let mut out = vec![0.0; sh.output_len()];
        for n in 0..sh.n {
            for k in 0..sh.k {
                for p in 0..p_len {
                    for q in 0..q_len {
                        let mut acc = 0.0;
                        for c in 0..sh.c {
                            for r in 0..sh.r {
                                for s in 0..sh.s {
                                    let ih = (p * sh.stride + r) as isize - sh.pad as isize;
                                    let iw = (q * sh.stride + s) as isize - sh.pad as isize;
                                    if ih < 0
                                        || iw < 0
                                        || ih >= sh.h as isize
                                        || iw >= sh.w as isize
                                    {
                                        continue;
                                    }
                                    acc += in_at(n, c, ih as usize, iw as usize) * w_at(k, c, r, s);
                                }
                            }
                        }
                        let idx = match layout {
                            Layout::Nchw => ((n * sh.k + k) * p_len + p) * q_len + q,
                            Layout::Nhwc => ((n * p_len + p) * q_len + q) * sh.k + k,
                        };
                        out[idx] = acc;
                    }
                }
            }
        }
        out
    }

    fn shape(
        n: usize,
        c: usize,
        (h, w): (usize, usize),
        k: usize,
        (r, s): (usize, usize),
        stride: usize,
        pad: usize,
    ) -> ConvShape {
        ConvShape {
            n,
            c,
            h,
            w,
            k,
            r,
            s,
            stride,
            pad,
        }
    }

    /// Small shapes covering every im2col edge case, each run at batch 1 and 3.
    fn conv_cases() -> Vec<(&'static str, ConvShape)> {
        let mut cases = Vec::new();
        for n in [1, 3] {
            cases.extend([
                ("3x3 s1 p1", shape(n, 5, (9, 11), 6, (3, 3), 1, 1)),
                ("3x3 s2 p1", shape(n, 4, (10, 9), 7, (3, 3), 2, 1)),
                ("1x1 s1", shape(n, 6, (7, 5), 5, (1, 1), 1, 0)),
                ("1x1 s2", shape(n, 6, (7, 8), 5, (1, 1), 2, 0)),
                ("7x7 s2 p3", shape(n, 3, (13, 12), 8, (7, 7), 2, 3)),
                ("3x2 s1 p0", shape(n, 2, (6, 7), 3, (3, 2), 1, 0)),
                ("5x5 s3 p2", shape(n, 3, (8, 11), 4, (5, 5), 3, 2)),
                ("3x3 s1 p2 tiny", shape(n, 2, (1, 2), 3, (3, 3), 1, 2)),
                // Few pixels, many taps and channels: NCHW's split over output channels.
                ("3x3 s1 p1 deep", shape(n, 8, (5, 4), 9, (3, 3), 1, 1)),
                ("1x1 s1 deep", shape(n, 16, (3, 3), 12, (1, 1), 1, 0)),
                // More output channels than output pixels: the splits over channels.
                ("3x3 s2 p1 wide", shape(n, 8, (3, 3), 20, (3, 3), 2, 1)),
            ]);
        }
        cases
    }

    /// Runs one case (through `conv2d_f32`, or `conv2d_f32_with` when a thread count is
    /// forced) and checks it against the f64 reference.
    fn check_conv(
        rng: &mut Rng,
        seed: u64,
        name: &str,
        sh: &ConvShape,
        layout: Layout,
        threads: Option<usize>,
    ) {
        let input = rng.vec(sh.input_len());
        let weight = rng.vec(sh.weight_len());
        let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        let (in32, w32) = (narrow(&input), narrow(&weight));
        // The reference sees exactly the f32-rounded inputs, so only accumulation differs.
        let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let reference = naive_conv(sh, layout, &wide(&in32), &wide(&w32));
        let mut out = vec![f32::NAN; sh.output_len()];
        match threads {
            None => conv2d_f32(sh, layout, &in32, &w32, &mut out),
            Some(t) => conv2d_f32_with(sh, layout, &in32, &w32, &mut out, t),
        }
        let err = rel_err(out.iter().map(|&x| f64::from(x)), &reference);
        assert!(
            err < 1e-5,
            "conv {name} {layout:?} n={} threads={threads:?}: err {err:e}, seed {seed}",
            sh.n
        );
    }

    #[test]
    fn conv2d_matches_reference() {
        let (mut rng, seed) = Rng::new(4);
        for (name, sh) in conv_cases() {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                check_conv(&mut rng, seed, name, &sh, layout, None);
            }
        }
    }

    /// Forces each parallel strategy (serial; NCHW batch chunks with a remainder, one image
    /// per chunk, gemm-internal, channel split; NHWC row runs that do and do not align with
    /// images) whatever this machine's core count.
    #[test]
    fn conv2d_every_thread_split_matches_reference() {
        let (mut rng, seed) = Rng::new(5);
        for (name, sh) in conv_cases() {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                for t in [1, 2, 3, 8] {
                    check_conv(&mut rng, seed, name, &sh, layout, Some(t));
                }
            }
        }
    }

    #[test]
    fn conv2d_degenerate_shapes_do_not_panic() {
        let cases = [
            shape(2, 3, (0, 4), 2, (1, 1), 1, 1), // empty input, output is all padding
            shape(2, 0, (4, 4), 2, (3, 3), 1, 1), // no input channels
            shape(2, 3, (4, 4), 2, (0, 0), 1, 0), // empty filter
            shape(2, 3, (4, 4), 0, (3, 3), 1, 1), // no filters
            shape(0, 3, (4, 4), 2, (3, 3), 1, 1), // empty batch
            shape(2, 3, (4, 4), 2, (3, 3), 0, 1), // stride 0: empty output
            shape(2, 3, (2, 2), 2, (5, 5), 1, 0), // filter larger than the input
        ];
        for sh in cases {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let input = vec![1.0; sh.input_len()];
                let weight = vec![1.0; sh.weight_len()];
                let mut out = vec![f32::NAN; sh.output_len()];
                conv2d_f32(&sh, layout, &input, &weight, &mut out);
                assert!(out.iter().all(|&x| x == 0.0), "{sh:?} {layout:?}: {out:?}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "conv2d: weight length")]
    fn conv2d_rejects_wrong_length() {
        let sh = shape(1, 2, (4, 4), 3, (3, 3), 1, 1);
        let mut out = vec![0.0; sh.output_len()];
        let input = vec![0.0; sh.input_len()];
        conv2d_f32(&sh, Layout::Nchw, &input, &[0.0; 5], &mut out);
    }

    /// Every micro-kernel this CPU can run.
    fn kernels() -> Vec<Kernel> {
        [Kernel::Avx512, Kernel::Gemm]
            .into_iter()
            .filter(|k| k.available())
            .collect()
    }

    /// The packed convolution against the f64 reference with bias, residual and ReLU, in every
    /// kernel and several thread splits, on shapes with odd channel counts (partial weight
    /// panels), pixel counts that leave a partial tile, strides, padding (filter rows clipped
    /// on the left, the right and both) and batches > 1.
    #[test]
    fn packed_conv_matches_reference() {
        let (mut rng, seed) = Rng::new(6);
        let mut cases = conv_cases();
        cases.extend([
            ("3x3 s1 p1 c19 k70", shape(3, 19, (9, 11), 70, (3, 3), 1, 1)),
            ("1x1 s2 c32 k64", shape(2, 32, (7, 8), 64, (1, 1), 2, 0)),
            (
                "3x3 s2 p1 c16 k130",
                shape(1, 16, (5, 5), 130, (3, 3), 2, 1),
            ),
            ("1x1 s1 c33 k5", shape(2, 33, (3, 5), 5, (1, 1), 1, 0)),
            ("7x7 s2 p3 c3 k64", shape(2, 3, (15, 14), 64, (7, 7), 2, 3)),
            (
                "1x1 s1 c64 k128 one pixel",
                shape(5, 64, (1, 1), 128, (1, 1), 1, 0),
            ),
        ]);
        for (name, sh) in cases {
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<_>>();
            let input = narrow(rng.vec(sh.input_len()));
            let weight = narrow(rng.vec(sh.weight_len()));
            let bias = narrow(rng.vec(sh.k));
            let residual = narrow(rng.vec(sh.output_len()));
            // KCRS -> KRSC for the NHWC reference
            let mut krsc = vec![0.0; weight.len()];
            for k in 0..sh.k {
                for c in 0..sh.c {
                    for rs in 0..sh.r * sh.s {
                        krsc[(k * sh.r * sh.s + rs) * sh.c + c] =
                            weight[(k * sh.c + c) * sh.r * sh.s + rs];
                    }
                }
            }
            let conv = naive_conv(&sh, Layout::Nhwc, &wide(&input), &wide(&krsc));
            let packed = PackedConv::new((sh.k, sh.c, sh.r, sh.s), &weight, &bias);
            for (with_res, relu) in [(false, false), (true, true), (false, true), (true, false)] {
                let reference: Vec<f64> = conv
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let mut y = v + f64::from(bias[i % sh.k]);
                        if with_res {
                            y += f64::from(residual[i]);
                        }
                        if relu {
                            y.max(0.0)
                        } else {
                            y
                        }
                    })
                    .collect();
                // whole reductions, and chunks of whole filter rows or of parts of one
                let chunkings = [CHUNK_STEPS, 2 * sh.s * sh.c, sh.s * sh.c / 2 + 1, 7];
                for (kernel, threads, chunk) in kernels().into_iter().flat_map(|k| {
                    [1, 2, 3, 8]
                        .into_iter()
                        .flat_map(move |t| chunkings.map(move |c| (k, t, c)))
                }) {
                    {
                        // the residual in its own buffer, and (with one) already in the output
                        for in_place in [false, with_res] {
                            let (mut out, res) = if in_place {
                                (residual.clone(), Residual::InPlace)
                            } else if with_res {
                                (
                                    vec![f32::NAN; sh.output_len()],
                                    Residual::Separate(&residual),
                                )
                            } else {
                                (vec![f32::NAN; sh.output_len()], Residual::None)
                            };
                            conv_packed_with(
                                &sh,
                                (&input, &packed, res),
                                relu,
                                &mut out,
                                (threads, kernel, chunk),
                            );
                            let err = rel_err(out.iter().map(|&x| f64::from(x)), &reference);
                            assert!(
                                err < 1e-5,
                                "packed {name} n={} {kernel:?} threads={threads} \
                                 chunk={chunk} residual={with_res} in place={in_place} \
                                 relu={relu}: err {err:e}, seed {seed}",
                                sh.n
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn packed_conv_degenerate_shapes_give_the_bias() {
        let cases = [
            shape(2, 3, (0, 4), 2, (1, 1), 1, 1), // empty input, output is all padding
            shape(2, 0, (4, 4), 2, (3, 3), 1, 1), // no input channels
            shape(2, 3, (4, 4), 2, (0, 0), 1, 0), // empty filter
            shape(2, 3, (4, 4), 0, (3, 3), 1, 1), // no filters
            shape(0, 3, (4, 4), 2, (3, 3), 1, 1), // empty batch
            shape(2, 3, (4, 4), 2, (3, 3), 0, 1), // stride 0: empty output
            shape(2, 3, (2, 2), 2, (5, 5), 1, 0), // filter larger than the input
            shape(2, 20, (0, 3), 2, (3, 3), 1, 1), // empty input, rows per tap
        ];
        for sh in cases {
            let input = vec![1.0; sh.input_len()];
            let weight = vec![1.0; sh.weight_len()];
            let bias: Vec<f32> = (0..sh.k).map(|i| i as f32 - 0.5).collect();
            let packed = PackedConv::new((sh.k, sh.c, sh.r, sh.s), &weight, &bias);
            let want: Vec<f32> = (0..sh.output_len()).map(|i| bias[i % sh.k]).collect();
            for kernel in kernels() {
                let mut out = vec![f32::NAN; sh.output_len()];
                conv_packed_with(
                    &sh,
                    (&input, &packed, Residual::None),
                    false,
                    &mut out,
                    (2, kernel, CHUNK_STEPS),
                );
                assert_eq!(out, want, "{sh:?} {kernel:?}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "conv2d_nhwc_packed: packed weight shape")]
    fn packed_conv_rejects_another_shape() {
        let sh = shape(1, 2, (4, 4), 3, (3, 3), 1, 1);
        let packed = PackedConv::new((3, 2, 1, 1), &[0.0; 6], &[]);
        let mut out = vec![0.0; sh.output_len()];
        conv2d_nhwc_packed(
            &sh,
            &vec![0.0; sh.input_len()],
            &packed,
            None,
            false,
            &mut out,
        );
    }

    /// Every index is visited exactly once per call, with calls from several threads at once
    /// and calls nested inside a share (which must not wait for the team it runs on).
    #[test]
    fn parallel_ranges_cover_everything_once_concurrently_and_nested() {
        const COUNT: usize = 1000;
        let outer: Vec<AtomicUsize> = (0..COUNT).map(|_| AtomicUsize::new(0)).collect();
        let inner = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        parallel_ranges(COUNT, &|range| {
                            for i in range {
                                outer[i].fetch_add(1, Ordering::Relaxed);
                            }
                            parallel_ranges(3, &|r| {
                                inner.fetch_add(r.len(), Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert!(outer.iter().all(|c| c.load(Ordering::Relaxed) == 200));
        let shares = threads().min(COUNT);
        assert_eq!(inner.load(Ordering::Relaxed), 200 * shares * 3);
        parallel_ranges(0, &|r| assert!(r.is_empty()));
    }

    #[test]
    fn a_panicking_share_panics_the_caller_and_the_team_goes_on() {
        // the first share is the caller's own, the last a team thread's (with > 1 thread)
        for bad in [0, threads() * 4 - 1] {
            let result = std::panic::catch_unwind(|| {
                parallel_ranges(threads() * 4, &|r| {
                    assert!(!r.contains(&bad), "share with {bad} panics");
                })
            });
            assert!(result.is_err(), "{bad}");
        }
        let sum = AtomicUsize::new(0);
        parallel_ranges(100, &|r| {
            sum.fetch_add(r.sum::<usize>(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }

    #[test]
    fn aligned_buf_is_aligned_and_keeps_values() {
        let mut b = AlignedBuf::zeroed(5);
        assert_eq!(&b[..], &[0.0; 5]);
        b[4] = 2.0;
        b.resize(100);
        assert_eq!(b.len(), 100);
        assert_eq!((b[4], b[99]), (2.0, 0.0));
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.capacity() >= 100);
        b.resize(3);
        assert_eq!(b.len(), 3);
        b.resize(100);
        assert_eq!(
            (b.len(), b[4], b[99]),
            (100, 2.0, 0.0),
            "shrinking keeps the values"
        );
    }

    #[test]
    fn resnet50_shape_counts() {
        let sh = shape(1, 64, (56, 56), 64, (3, 3), 1, 1);
        assert_eq!((sh.out_h(), sh.out_w()), (56, 56));
        assert_eq!(sh.flops(), 2.0 * 64.0 * 56.0 * 56.0 * 64.0 * 9.0);
        assert_eq!(sh.input_len(), 64 * 56 * 56);
        assert_eq!(sh.weight_len(), 64 * 64 * 9);
        assert_eq!(sh.output_len(), 64 * 56 * 56);
        let stem = shape(1, 3, (224, 224), 64, (7, 7), 2, 3);
        assert_eq!((stem.out_h(), stem.out_w()), (112, 112));
    }

    #[test]
    fn shape_and_layout_round_trip_through_serde() {
        let sh = shape(3, 64, (56, 56), 128, (3, 3), 2, 1);
        let json = serde_json::to_string(&(sh, Layout::Nhwc)).unwrap();
        let back: (ConvShape, Layout) = serde_json::from_str(&json).unwrap();
        assert_eq!(back, (sh, Layout::Nhwc));
    }

    #[test]
    fn threads_is_positive() {
        assert!(threads() >= 1);
    }

    #[test]
    fn rng_is_deterministic_per_seed() {
        let (mut a, mut b) = (Rng::from_seed(42), Rng::from_seed(42));
        assert!((0..8).all(|_| a.next() == b.next()));
        assert!((0..1000).all(|_| (-1.0..1.0).contains(&a.unit())));
    }
}
