//! What the kernels' tests share (their inputs, drawn afresh each run; the float64 references
//! they are checked against; the convolution shapes they run), and the tests of this module's
//! own items.

use super::threads;
use crate::random;
use gpukit_types::{ConvShape, Layout};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A fresh seed, so every run checks new inputs, and the ChaCha8 stream it starts, from which a
/// test draws all its inputs: naming the seed in its failure messages lets a failure be replayed
/// with `ChaCha8Rng::seed_from_u64(seed)`.
pub(super) fn seeded() -> (ChaCha8Rng, u64) {
    let seed = random::fresh_seed();
    (ChaCha8Rng::seed_from_u64(seed), seed)
}

/// A test's next `len` inputs, uniform in [-1, 1): the crate's own generator (the one the
/// benchmarks draw from), seeded by the test's stream.
pub(super) fn uniform(rng: &mut ChaCha8Rng, len: usize) -> Vec<f64> {
    random::uniform_f64(len, rng.random())
}

/// f32 values as f64, exactly.
pub(super) fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// f64 values rounded to f32.
pub(super) fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// ||out - reference|| / ||reference|| (absolute when the reference is zero).
/// The normwise tolerance for f32 convolutions and products checked against float64 on the
/// same f32-rounded inputs, so that only accumulation differs. Each output is a sum of K
/// products with random signs; its rounding error is a random walk of about sqrt(K) u times
/// the terms' size (u = 2^-24, about 6e-8), and the normwise error over many outputs is that
/// root-mean-square: for the largest K in these tests (64 x 3 x 3 = 576) about
/// 24 x 6e-8 = 1.5e-6, a factor of about 7 under the bound. It holds for both CPU families:
/// the packed AVX-512 kernel and im2col + gemm (AVX2 or AVX-512 FMA inside gemm) only change
/// the order of the same sums, and a fused multiply-add rounds once where multiply then add
/// rounds twice, which can only lower the error. The worst case, every rounding in one
/// direction (K u = 3.4e-5), does not occur with random data.
pub(super) const F32_SUM_TOL: f64 = 1e-5;

pub(super) fn rel_err(out: impl IntoIterator<Item = f64>, reference: &[f64]) -> f64 {
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

/// Direct convolution in f64 with logical (n, c, h, w) indexing, mapped per layout.
pub(super) fn naive_conv(
    sh: &ConvShape,
    layout: Layout,
    input: &[f64],
    weight: &[f64],
) -> Vec<f64> {
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
                                if ih < 0 || iw < 0 || ih >= sh.h as isize || iw >= sh.w as isize {
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

/// A convolution shape, with the image's and the filter's sides paired.
pub(super) fn shape(
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
        groups: 1,
    }
}

/// Small shapes covering every im2col edge case, each run at batch 1 and 3.
pub(super) fn conv_cases() -> Vec<(&'static str, ConvShape)> {
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

/// Shapes where some dimension is empty or the filter finds nothing to read: the output is the
/// bias alone (zero for `conv2d_f32`).
pub(super) fn degenerate_shapes() -> Vec<ConvShape> {
    vec![
        shape(2, 3, (0, 4), 2, (1, 1), 1, 1), // empty input, output is all padding
        shape(2, 0, (4, 4), 2, (3, 3), 1, 1), // no input channels
        shape(2, 3, (4, 4), 2, (0, 0), 1, 0), // empty filter
        shape(2, 3, (4, 4), 0, (3, 3), 1, 1), // no filters
        shape(0, 3, (4, 4), 2, (3, 3), 1, 1), // empty batch
        shape(2, 3, (4, 4), 2, (3, 3), 0, 1), // stride 0: empty output
        shape(2, 3, (2, 2), 2, (5, 5), 1, 0), // filter larger than the input
    ]
}

#[test]
fn threads_is_positive() {
    assert!(threads() >= 1);
}

/// The seed a failure names gives back the inputs that failed, and inputs drawn one after
/// another are not copies of each other.
#[test]
fn inputs_replay_from_their_seed() {
    let (mut a, seed) = seeded();
    let mut b = ChaCha8Rng::seed_from_u64(seed);
    let from_a: Vec<Vec<f64>> = (0..2).map(|_| uniform(&mut a, 1000)).collect();
    let from_b: Vec<Vec<f64>> = (0..2).map(|_| uniform(&mut b, 1000)).collect();
    assert_eq!(from_a, from_b, "seed {seed}");
    assert_ne!(from_a[0], from_a[1], "seed {seed}");
    assert!(
        from_a.iter().flatten().all(|x| (-1.0..1.0).contains(x)),
        "seed {seed}"
    );
}
