//! Tests of the im2col convolutions against a float64 direct convolution: every edge case of
//! the lowering, in both layouts and under every thread split, and degenerate shapes.

use super::*;
use crate::cpu::tests::{
    conv_cases, degenerate_shapes, naive_conv, narrow, rel_err, seeded, shape, uniform, wide,
    F32_SUM_TOL,
};
use rand_chacha::ChaCha8Rng;

/// Runs one case (through `conv2d_f32`, or `conv2d_f32_with` when a thread count is
/// forced) and checks it against the f64 reference.
fn check_conv(
    rng: &mut ChaCha8Rng,
    seed: u64,
    name: &str,
    sh: &ConvShape,
    layout: Layout,
    threads: Option<usize>,
) {
    let input = uniform(rng, sh.input_len());
    let weight = uniform(rng, sh.weight_len());
    let (in32, w32) = (narrow(&input), narrow(&weight));
    // The reference sees exactly the f32-rounded inputs, so only accumulation differs.
    let reference = naive_conv(sh, layout, &wide(&in32), &wide(&w32));
    let mut out = vec![f32::NAN; sh.output_len()];
    match threads {
        None => conv2d_f32(sh, layout, &in32, &w32, &mut out),
        Some(t) => conv2d_f32_with(sh, layout, &in32, &w32, &mut out, t),
    }
    let err = rel_err(wide(&out), &reference);
    assert!(
        err < F32_SUM_TOL,
        "conv {name} {layout:?} n={} threads={threads:?}: err {err:e}, seed {seed}",
        sh.n
    );
}

#[test]
fn conv2d_matches_reference() {
    let (mut rng, seed) = seeded();
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
    let (mut rng, seed) = seeded();
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
    for sh in degenerate_shapes() {
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
