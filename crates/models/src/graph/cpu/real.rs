//! The float type the interpreter computes in: f32, the graph's own ([`forward_cpu`]), or f64
//! ([`forward_cpu_f64`], a reference for f32 results that f32 itself cannot give). Every
//! operator is written once over [`Real`]; what differs between the two is here: how a graph's
//! f32 elements become the type (borrowed as they are, or widened), and which multithreaded
//! product and convolution run underneath.
//!
//! The f32 instance delegates to the very calls the interpreter made before f64 existed, so
//! f32 results are bit for bit what they were.
//!
//! [`forward_cpu`]: super::forward_cpu
//! [`forward_cpu_f64`]: super::forward_cpu_f64

use gpukit_tensor::cpu::{conv2d_f32, matmul_f32, matmul_f64, GemmOne};
use gpukit_tensor::ConvShape;
use gpukit_types::Layout;
use rayon::prelude::*;
use std::borrow::Cow;
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

/// A float type the interpreter runs in (f32 or f64). `GemmOne::ONE` is its 1.
pub(crate) trait Real:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + GemmOne
{
    const ZERO: Self;
    const NEG_INFINITY: Self;

    /// An f32 (an attribute, a constant's element) in this type: exact for both.
    fn from_f32(v: f32) -> Self;
    /// An f64 rounded to this type.
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    /// The larger of the two, as `f32::max` (a NaN operand gives the other).
    fn max(self, other: Self) -> Self;
    fn clamp(self, lo: Self, hi: Self) -> Self;
    fn is_nan(self) -> bool;

    /// `c (m x n) = a (m x k) * b (k x n)`, row-major, multithreaded.
    fn matmul(a: &[Self], b: &[Self], c: &mut [Self], m: usize, n: usize, k: usize);

    /// A convolution of one group and one stride on NCHW, padding `shape.pad` on every side:
    /// `x` `[n, c, h, w]`, `weight` `[k, c, r, s]`, `out` `[n, k, p, q]` (overwritten).
    fn conv_nchw(shape: &ConvShape, x: &[Self], weight: &[Self], out: &mut [Self]);

    /// A graph's f32 elements (a constant's, an input's) in this type: f32 borrows them, f64
    /// widens them.
    fn adopt(v: &[f32]) -> Cow<'_, [Self]>;
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const NEG_INFINITY: f32 = f32::NEG_INFINITY;

    fn from_f32(v: f32) -> f32 {
        v
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn exp(self) -> f32 {
        f32::exp(self)
    }
    fn max(self, other: f32) -> f32 {
        f32::max(self, other)
    }
    fn clamp(self, lo: f32, hi: f32) -> f32 {
        f32::clamp(self, lo, hi)
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn matmul(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
        matmul_f32(a, b, c, m, n, k);
    }
    fn conv_nchw(shape: &ConvShape, x: &[f32], weight: &[f32], out: &mut [f32]) {
        conv2d_f32(shape, Layout::Nchw, x, weight, out);
    }
    fn adopt(v: &[f32]) -> Cow<'_, [f32]> {
        Cow::Borrowed(v)
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const NEG_INFINITY: f64 = f64::NEG_INFINITY;

    fn from_f32(v: f32) -> f64 {
        f64::from(v)
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn max(self, other: f64) -> f64 {
        f64::max(self, other)
    }
    fn clamp(self, lo: f64, hi: f64) -> f64 {
        f64::clamp(self, lo, hi)
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn matmul(a: &[f64], b: &[f64], c: &mut [f64], m: usize, n: usize, k: usize) {
        matmul_f64(a, b, c, m, n, k);
    }
    fn conv_nchw(shape: &ConvShape, x: &[f64], weight: &[f64], out: &mut [f64]) {
        im2col_gemm(shape, x, weight, out);
    }
    fn adopt(v: &[f32]) -> Cow<'_, [f64]> {
        Cow::Owned(v.par_iter().map(|&x| f64::from(x)).collect())
    }
}

/// Convolution of one group and one stride on NCHW by im2col + gemm, for types the tensor
/// crate has no convolution of (f64): each image's `col (CRS x PQ)` built in parallel, then
/// `out (K x PQ) = weight (K x CRS) * col` by the tensor crate's multithreaded product. Images
/// run in parallel too, each with its own im2col buffer (at most one per thread). A 1x1
/// stride-1 unpadded convolution reads the image as the matrix it already is.
fn im2col_gemm<T: Real>(sh: &ConvShape, x: &[T], weight: &[T], out: &mut [T]) {
    let (p, q) = (sh.out_h(), sh.out_w());
    let (crs, pq) = (sh.c * sh.r * sh.s, p * q);
    let (img_in, img_out) = (sh.c * sh.h * sh.w, sh.k * pq);
    if img_out == 0 || img_in == 0 {
        out.fill(T::ZERO);
        return;
    }
    out.par_chunks_mut(img_out)
        .zip(x.par_chunks(img_in))
        .for_each(|(o, img)| {
            if sh.is_pointwise() {
                T::matmul(weight, img, o, sh.k, pq, crs);
                return;
            }
            let mut col = vec![T::ZERO; crs * pq];
            col.par_chunks_mut(pq).enumerate().for_each(|(row, dst)| {
                let (ci, a, b) = (row / (sh.r * sh.s), row / sh.s % sh.r, row % sh.s);
                let plane = &img[ci * sh.h * sh.w..(ci + 1) * sh.h * sh.w];
                // output columns whose input column j * stride + b - pad lies in [0, w)
                let j_lo = sh.pad.saturating_sub(b).div_ceil(sh.stride).min(q);
                let j_hi = (sh.w + sh.pad).saturating_sub(b).div_ceil(sh.stride).min(q);
                for (i, drow) in dst.chunks_mut(q).enumerate() {
                    let Some(y) = (i * sh.stride + a)
                        .checked_sub(sh.pad)
                        .filter(|&y| y < sh.h)
                    else {
                        continue;
                    };
                    let irow = &plane[y * sh.w..(y + 1) * sh.w];
                    for (j, d) in drow.iter_mut().enumerate().take(j_hi).skip(j_lo) {
                        *d = irow[j * sh.stride + b - sh.pad];
                    }
                }
            });
            T::matmul(weight, &col, o, sh.k, pq, crs);
        });
}
