//! Tests of the matmuls against a float64 reference: odd and empty shapes in every element
//! type, and the tiled multithreaded path with ragged last tiles.

use super::*;
use crate::cpu::tests::{narrow, rel_err, seeded, uniform, wide, F32_SUM_TOL};

/// The float64 reference: row-major C = A * B, one dot product per element.
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
    let (mut rng, seed) = seeded();
    for &(m, n, k) in MATMUL_SHAPES {
        let (a, b) = (uniform(&mut rng, m * k), uniform(&mut rng, k * n));
        let mut c = vec![f64::NAN; m * n];
        matmul_f64(&a, &b, &mut c, m, n, k);
        let err = rel_err(c, &naive_matmul(&a, &b, m, n, k));
        assert!(err < 1e-12, "f64 {m}x{n}x{k}: err {err:e}, seed {seed}");
    }
}

#[test]
fn matmul_f32_matches_reference() {
    let (mut rng, seed) = seeded();
    for &(m, n, k) in MATMUL_SHAPES {
        let a = narrow(&uniform(&mut rng, m * k));
        let b = narrow(&uniform(&mut rng, k * n));
        let mut c = vec![f32::NAN; m * n];
        matmul_f32(&a, &b, &mut c, m, n, k);
        let reference = naive_matmul(&wide(&a), &wide(&b), m, n, k);
        let err = rel_err(wide(&c), &reference);
        assert!(
            err < F32_SUM_TOL,
            "f32 {m}x{n}x{k}: err {err:e}, seed {seed}"
        );
    }
}

#[test]
fn tile_edges_follow_the_size_and_the_threads() {
    // the sizes measured on the lent 16-thread Xeon
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
    let (mut rng, seed) = seeded();
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
        let a = uniform(&mut rng, m * k);
        let b = uniform(&mut rng, k * n);
        let reference = naive_matmul(&a, &b, m, n, k);
        let mut c64 = vec![f64::NAN; m * n];
        pool.install(|| matmul_f64(&a, &b, &mut c64, m, n, k));
        let err = rel_err(c64.iter().copied(), &reference);
        assert!(err < 1e-12, "f64 {m}x{n}x{k}: err {err:e}, seed {seed}");
        let (a32, b32) = (narrow(&a), narrow(&b));
        let mut c = vec![f32::NAN; m * n];
        pool.install(|| matmul_f32(&a32, &b32, &mut c, m, n, k));
        // every element, not only the norm: a block left unwritten stays NaN
        assert!(
            c.iter().all(|x| x.is_finite()),
            "f32 {m}x{n}x{k}: unwritten block"
        );
        let reference = naive_matmul(&wide(&a32), &wide(&b32), m, n, k);
        let err = rel_err(wide(&c), &reference);
        assert!(
            err < F32_SUM_TOL,
            "f32 {m}x{n}x{k}: err {err:e}, seed {seed}"
        );
    }
}

#[test]
fn matmul_f16_matches_reference() {
    let (mut rng, seed) = seeded();
    for &(m, n, k) in MATMUL_SHAPES {
        let a: Vec<f16> = uniform(&mut rng, m * k)
            .into_iter()
            .map(f16::from_f64)
            .collect();
        let b: Vec<f16> = uniform(&mut rng, k * n)
            .into_iter()
            .map(f16::from_f64)
            .collect();
        let mut c = vec![f16::NAN; m * n];
        matmul_f16(&a, &b, &mut c, m, n, k);
        let wide16 = |v: &[f16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        let reference = naive_matmul(&wide16(&a), &wide16(&b), m, n, k);
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

/// `gemm_t` in every transpose combination against the float64 reference on the transposed
/// copies, fresh random operands, odd and empty shapes, single- and multithreaded sizes.
#[test]
fn gemm_t_matches_the_reference_in_every_transpose() {
    let transpose = |x: &[f64], rows: usize, cols: usize| -> Vec<f64> {
        (0..cols * rows)
            .map(|i| x[(i % rows) * cols + i / rows])
            .collect()
    };
    for &(m, n, k) in &[
        (37, 53, 71),
        (1, 1, 1),
        (5, 3, 0),
        (0, 4, 3),
        (300, 257, 190),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let seed = crate::random::fresh_seed();
            let a = crate::random::uniform_f64(m * k, seed);
            let b = crate::random::uniform_f64(k * n, seed ^ 1);
            let want = naive_matmul(&a, &b, m, n, k);
            // stored as the transpose where asked: op() must undo it
            let a_stored = if ta { transpose(&a, m, k) } else { a.clone() };
            let b_stored = if tb { transpose(&b, k, n) } else { b.clone() };
            let mut c = vec![f64::NAN; m * n];
            gemm_t((ta, tb), (m, n, k), &a_stored, &b_stored, &mut c);
            for (g, w) in c.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-12 * (k as f64 + 1.0),
                    "{m}x{n}x{k} {ta} {tb}: {g} vs {w}"
                );
            }
            let a32: Vec<f32> = a_stored.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = b_stored.iter().map(|&v| v as f32).collect();
            let mut c32 = vec![f32::NAN; m * n];
            gemm_t((ta, tb), (m, n, k), &a32, &b32, &mut c32);
            for (g, w) in c32.iter().zip(&want) {
                // |a|, |b| < 1: f32 rounding of inputs and k sums bounds the error by
                // about (k + 2) * 2^-24 * k; 1e-6 * (k + 1) is a loose multiple of that
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-6 * (k as f64 + 1.0),
                    "f32 {m}x{n}x{k} {ta} {tb}: {g} vs {w}"
                );
            }
        }
    }
}
