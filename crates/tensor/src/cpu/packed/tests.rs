//! Tests of the packed convolution, in every micro-kernel this CPU can run, against a float64
//! direct convolution with bias, residual and ReLU; degenerate shapes; the split of a thread's
//! work units into blocks; the aligned buffer.

use super::*;
use crate::cpu::tests::{
    conv_cases, degenerate_shapes, naive_conv, narrow, rel_err, seeded, shape, uniform, wide,
    F32_SUM_TOL,
};
use gpukit_types::Layout;

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
    let (mut rng, seed) = seeded();
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
        let input = narrow(&uniform(&mut rng, sh.input_len()));
        let weight = narrow(&uniform(&mut rng, sh.weight_len()));
        let bias = narrow(&uniform(&mut rng, sh.k));
        let residual = narrow(&uniform(&mut rng, sh.output_len()));
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
                    let err = rel_err(wide(&out), &reference);
                    assert!(
                        err < F32_SUM_TOL,
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

#[test]
fn packed_conv_degenerate_shapes_give_the_bias() {
    let mut cases = degenerate_shapes();
    cases.push(shape(2, 20, (0, 3), 2, (3, 3), 1, 1)); // empty input, rows per tap
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

/// The decomposition both kernels run their units by: every thread's run of units, block by
/// block and panel by panel, is each of its units once and in order, and the groups a block's
/// units touch (those `prepare` reads) include every group its panels compute.
#[test]
fn runs_of_units_split_into_blocks_cover_each_unit_once() {
    for groups in 1..12 {
        for panels in 1..4 {
            for block in 1..=groups {
                let units = groups * panels;
                for parts in 1..=units.min(5) {
                    for i in 0..parts {
                        let (u0, u1) = (units * i / parts, units * (i + 1) / parts);
                        let mut seen = Vec::new();
                        for b in BlockUnits::split(u0, u1, (groups, panels, block)) {
                            assert!(b.g0 % block == 0 && b.g0 + b.len <= groups);
                            let touched = b.touched();
                            for (p, gs) in b.panels() {
                                assert!(p < panels && !gs.is_empty());
                                assert!(touched.start <= gs.start && gs.end <= touched.end);
                                seen.extend(gs.map(|g| b.g0 * panels + p * b.len + g));
                            }
                        }
                        assert_eq!(
                            seen,
                            (u0..u1).collect::<Vec<_>>(),
                            "{groups} groups, {panels} panels, blocks of {block}, \
                             part {i} of {parts}"
                        );
                    }
                }
            }
        }
    }
}
