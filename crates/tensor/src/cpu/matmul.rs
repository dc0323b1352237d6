//! Matrix multiply on the gemm crate: the public row-major matmuls (f64, f32, f16), tiled over
//! single-threaded gemm calls, and the strided gemm wrappers the im2col convolutions use.

use super::{threads, SharedOut};
use gemm::Parallelism;
use half::f16;
use rayon::prelude::*;

// `matmul_f16` promises native half precision; gemm only dispatches to its f16 kernels when the
// element type *is* its own `f16`. Should the two `half` versions ever diverge this fails to
// compile instead of panicking inside gemm at run time.
const _: fn(f16) -> gemm::f16 = |x| x;

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
pub(super) unsafe fn gemm_strided<T: 'static + Copy + Default>(
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
pub(super) unsafe fn gemm_split(
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
/// lent 16-core Xeon, where tiles of 192-384 ran 1.4-1.7.
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

/// `C (m x n) = op(A) * op(B)`, overwriting C, for row-major storage: `op(A)` is A (stored
/// m x k) or, with `ta`, the transpose of A stored k x m; likewise B (k x n, or n x k with
/// `tb`). Transposes are strides, nothing is copied. What a training step needs: `x * W^T`
/// forward, `dy * W` and `dy^T * x` backward. gemm's own threads above [`MIN_SPLIT_FLOP`].
///
/// # Panics
///
/// If a slice's length is not its operand's element count.
#[allow(clippy::too_many_arguments)]
pub fn gemm_t<T: 'static + Copy + Default + Send + Sync + GemmOne>(
    (ta, tb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    a: &[T],
    b: &[T],
    c: &mut [T],
) {
    assert_eq!(
        a.len(),
        m.saturating_mul(k),
        "gemm_t: A must hold m * k elements"
    );
    assert_eq!(
        b.len(),
        k.saturating_mul(n),
        "gemm_t: B must hold k * n elements"
    );
    assert_eq!(
        c.len(),
        m.saturating_mul(n),
        "gemm_t: C must hold m * n elements"
    );
    if m == 0 || n == 0 {
        return;
    }
    let a_strides = if ta { (1, m) } else { (k, 1) };
    let b_strides = if tb { (1, k) } else { (n, 1) };
    let parallelism = if 2 * m * n * k < MIN_SPLIT_FLOP || threads() <= 1 {
        Parallelism::None
    } else {
        Parallelism::Rayon(threads())
    };
    // SAFETY: the asserts make each view's extent, (rows - 1) * rs + (cols - 1) * cs + 1,
    // exactly its slice's length (m x k read with the strides above touches m * k elements);
    // C is exclusively borrowed. With k = 0 gemm writes zeros and reads neither operand.
    unsafe {
        gemm_raw(
            (m, n, k),
            c.as_mut_ptr(),
            (n, 1),
            a.as_ptr(),
            a_strides,
            b.as_ptr(),
            b_strides,
            T::ONE,
            parallelism,
        );
    }
}

/// The element types [`gemm_t`] runs: f32 and f64.
pub trait GemmOne {
    /// The multiplicative identity (gemm's scale on the product).
    const ONE: Self;
}

impl GemmOne for f32 {
    const ONE: f32 = 1.0;
}

impl GemmOne for f64 {
    const ONE: f64 = 1.0;
}

#[cfg(test)]
mod tests;
