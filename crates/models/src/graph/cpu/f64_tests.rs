//! The f64 interpreter beyond agreeing with f32 (every operator's test in `tests` runs both):
//! exact where f64 holds every partial sum exactly and f32 cannot, a cancelling sum f32 loses,
//! each ONNX fixture, i64 values and errors.

use super::tests::{conv_case, f64s, rng, run_one};
use crate::graph::passes::optimize;
use crate::graph::{
    exact_convolutions, forward_cpu, forward_cpu_exact, forward_cpu_f64, Activation, Array, Conv,
    DType, Data, Epilogue, GraphBuilder, Op,
};
use crate::onnx::{fixtures, import_bytes, ImportOptions};
use gpukit_tensor::random::{fresh_seed, uniform_f32};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// `count` values `i / 2^bits` for random integers `|i| < 2^bits`: every product of two is a
/// multiple of `2^-2bits` below 1, so f64 holds sums of millions of them exactly.
fn grid(rng: &mut ChaCha8Rng, count: usize, bits: u32) -> Vec<f32> {
    let top = 1i32 << bits;
    (0..count)
        .map(|_| rng.random_range(-top + 1..top) as f32 / top as f32)
        .collect()
}

/// max |got - want| / max |want|.
fn max_rel(got: impl Iterator<Item = f64>, want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-300);
    got.zip(want).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn conv(kernel: usize, stride: usize, pad: usize, groups: usize, bias: bool) -> Conv {
    Conv {
        kernel: [kernel, kernel],
        strides: [stride, stride],
        pads: [pad; 4],
        dilations: [1, 1],
        groups,
        bias,
        epilogue: Epilogue::default(),
    }
}

#[test]
fn f64_convolutions_are_exact_on_a_grid_where_f32_rounds() {
    let (seed, mut rng) = rng();
    // im2col + gemm (3x3, 1x1 strided, pointwise, several images) and the direct loop (grouped)
    let cases = [
        (conv(3, 1, 1, 1, true), [2, 64, 9, 9], 32),
        (conv(1, 2, 0, 1, false), [3, 256, 6, 6], 16),
        (conv(1, 1, 0, 1, true), [2, 512, 5, 5], 8),
        (conv(3, 1, 1, 4, false), [1, 256, 7, 7], 16),
    ];
    let mut f32_worst = 0f64;
    for (cv, [n, c, h, w], k) in cases {
        let [r, s] = cv.kernel;
        let x = grid(&mut rng, n * c * h * w, 12);
        let wt = grid(&mut rng, k * c / cv.groups * r * s, 12);
        let bias = grid(&mut rng, k, 12);
        // the naive f64 sum is exact here: every partial sum is a multiple of 2^-24 below 2^10
        let (want, oshape, inputs) = conv_case(&cv, [n, c, h, w], k, x, wt, bias);
        let got = run_one(Op::Conv(cv.clone()), &inputs);
        assert_eq!(got.shape, oshape);
        assert_eq!(got.f64, want, "seed {seed} {cv:?}: f64 is not exact");
        f32_worst = f32_worst.max(max_rel(got.f32.iter().map(|&v| f64::from(v)), &want));
    }
    // f32 rounds partial sums of this size: the comparison shows something
    assert!(f32_worst > 1e-8, "seed {seed}: f32 {f32_worst:e}");
}

#[test]
fn f64_keeps_a_cancelling_sum_that_f32_loses() {
    // out = sum_i u_i * w_i - sum_i u_i * (w_i + e_i) = -sum_i u_i * e_i: terms near 1, an
    // answer near 2^-9, as a pointwise convolution over 2 * half channels
    let (seed, mut rng) = rng();
    let (half, pixels, k) = (2048, 64, 4);
    let u = grid(&mut rng, half * pixels, 12);
    let mut x = u.clone();
    x.extend_from_slice(&u);
    let mut wt = Vec::new();
    let mut want = vec![0f64; k * pixels];
    for o in 0..k {
        let w = grid(&mut rng, half, 12);
        let e: Vec<f32> = (0..half)
            .map(|_| rng.random_range(-8i32..=8) as f32 / 4096.0)
            .collect();
        wt.extend_from_slice(&w);
        wt.extend(w.iter().zip(&e).map(|(w, e)| -(w + e)));
        for (p, out) in want[o * pixels..(o + 1) * pixels].iter_mut().enumerate() {
            *out = -(0..half)
                .map(|i| f64::from(u[i * pixels + p]) * f64::from(e[i]))
                .sum::<f64>();
        }
    }
    let got = run_one(
        Op::Conv(conv(1, 1, 0, 1, false)),
        &[
            (vec![1, 2 * half, 8, 8], x, false),
            (vec![k, 2 * half, 1, 1], wt, true),
        ],
    );
    assert_eq!(got.f64, want, "seed {seed}: f64 is not exact");
    let lost = max_rel(got.f32.iter().map(|&v| f64::from(v)), &want);
    assert!(lost > 1e-6, "seed {seed}: f32 is {lost:e} from the answer");
}

#[test]
fn every_fixture_runs_in_f64_within_f32_tolerance_of_f32() {
    let seed = fresh_seed();
    let options = ImportOptions {
        batch: Some(2),
        dims: Vec::new(),
    };
    for f in fixtures::all(seed) {
        let imported = import_bytes(&f.bytes(), &options).unwrap();
        let mut optimized = imported.clone();
        optimize(&mut optimized).unwrap();
        let x = uniform_f32(2 * 3 * fixtures::SIDE * fixtures::SIDE, seed);
        let inputs = [Array::f32(&[2, 3, fixtures::SIDE, fixtures::SIDE], x)];
        let mut by_graph = Vec::new();
        for (which, g) in [("imported", &imported), ("optimized", &optimized)] {
            let single = forward_cpu(g, &inputs).unwrap();
            let mut double = forward_cpu_f64(g, &inputs).unwrap();
            let (s, d) = (single[0].as_f32().unwrap(), &double[0].data);
            assert_eq!(double[0].shape, [2, fixtures::CLASSES], "{}", f.name);
            let apart = max_rel(s.iter().map(|&v| f64::from(v)), d);
            let what = format!("seed {seed} {} {which}", f.name);
            assert!(apart <= 1e-5, "{what}: f32 is {apart:e} from f64");
            // f64 is computed, not f32 widened
            assert!(apart > 0.0, "{what}: f64 gave f32's very outputs");
            by_graph.push(double.remove(0).data);
        }
        // the passes round folded weights to f32, nothing else
        let passes = max_rel(by_graph[1].iter().copied(), &by_graph[0]);
        assert!(passes <= 1e-6, "seed {seed} {}: {passes:e}", f.name);
    }
}

#[test]
fn i64_outputs_and_bad_inputs_are_the_same_in_f64() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![2, 3, 4]).unwrap();
    let s = b
        .node("shape", Op::Shape { start: 0, end: 3 }, &[x], &["s"])
        .unwrap()[0];
    let minus = b.constant("minus", vec![1], Data::I64(vec![-1])).unwrap();
    let cat = b
        .node("cat", Op::Concat { axis: 0 }, &[s, minus], &["t"])
        .unwrap()[0];
    let y = b
        .node("flat", Op::Flatten { axis: 1 }, &[x], &["y"])
        .unwrap()[0];
    b.output(y);
    b.output(cat);
    let g = b.finish().unwrap();
    let values = uniform_f32(24, fresh_seed());
    let out = forward_cpu_f64(&g, &[Array::f32(&[2, 3, 4], values.clone())]).unwrap();
    assert_eq!(out[0].shape, [2, 12]);
    assert_eq!(out[0].data, f64s(&values));
    assert_eq!(out[1].data, [2.0, 3.0, 4.0, -1.0]);
    for bad in [vec![], vec![Array::f32(&[2, 3, 5], vec![0.0; 30])]] {
        assert_eq!(
            forward_cpu_f64(&g, &bad).unwrap_err().to_string(),
            forward_cpu(&g, &bad).unwrap_err().to_string()
        );
    }
}

#[test]
fn a_convolution_summed_in_f64_is_the_f64_result_rounded_once() {
    // bias, residual and ReLU: the sums, bias and residual in f64, one rounding, then ReLU
    let (seed, mut rng) = rng();
    let (n, c, h, k) = (2, 48, 7, 24);
    let cv = Conv {
        epilogue: Epilogue {
            residual: true,
            activation: Some(Activation::Relu),
        },
        ..conv(3, 1, 1, 1, true)
    };
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![n, c, h, h]).unwrap();
    let z = b.input("z", DType::F32, vec![n, k, h, h]).unwrap();
    let values = |rng: &mut ChaCha8Rng, len: usize| -> Vec<f32> {
        (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    };
    let w = b
        .constant(
            "w",
            vec![k, c, 3, 3],
            Data::F32(values(&mut rng, k * c * 9)),
        )
        .unwrap();
    let bias = b
        .constant("b", vec![k], Data::F32(values(&mut rng, k)))
        .unwrap();
    let y = b
        .node("conv", Op::Conv(cv), &[x, w, bias, z], &["y"])
        .unwrap()[0];
    b.output(y);
    let g = b.finish().unwrap();
    let feed = [
        Array::f32(&[n, c, h, h], values(&mut rng, n * c * h * h)),
        Array::f32(&[n, k, h, h], values(&mut rng, n * k * h * h)),
    ];
    let exact = forward_cpu_exact(&g, &feed, &[true]).unwrap();
    let double = forward_cpu_f64(&g, &feed).unwrap();
    let rounded: Vec<f32> = double[0].data.iter().map(|&v| v as f32).collect();
    assert_eq!(exact[0].as_f32().unwrap(), &rounded[..], "seed {seed}");
    // and f32's own sums are not that (so the comparison shows something)
    let single = forward_cpu(&g, &feed).unwrap();
    assert_ne!(single[0].as_f32().unwrap(), &rounded[..], "seed {seed}");
}

#[test]
fn the_budget_leaves_shallow_fixtures_on_f32_sums_and_marks_only_convolutions() {
    let seed = fresh_seed();
    let options = ImportOptions {
        batch: Some(2),
        dims: Vec::new(),
    };
    for f in fixtures::all(seed) {
        let mut g = import_bytes(&f.bytes(), &options).unwrap();
        optimize(&mut g).unwrap();
        let (flags, before, moved) = exact_convolutions(&g).unwrap();
        assert_eq!(flags.len(), g.nodes.len());
        // a few layers of f32 sums stay well within 4e-6 of f64 sums (run 117's GPU
        // fixtures: 0.6-2.4e-7)
        assert!(
            before <= crate::sums::SUM_BUDGET,
            "seed {seed} {}: {before:e}",
            f.name
        );
        assert_eq!(moved, 0, "seed {seed} {}", f.name);
        assert!(flags.iter().all(|&f| !f));
        // every flag set runs: all convolutions in f64 stay within f32's tolerance of f32
        let all: Vec<bool> = g
            .nodes
            .iter()
            .map(|n| matches!(n.op, Op::Conv(_)))
            .collect();
        let x = uniform_f32(2 * 3 * fixtures::SIDE * fixtures::SIDE, seed);
        let inputs = [Array::f32(&[2, 3, fixtures::SIDE, fixtures::SIDE], x)];
        let exact = forward_cpu_exact(&g, &inputs, &all).unwrap();
        let double = forward_cpu_f64(&g, &inputs).unwrap();
        let apart = max_rel(
            exact[0].as_f32().unwrap().iter().map(|&v| f64::from(v)),
            &double[0].data,
        );
        assert!(apart <= 1e-5, "seed {seed} {}: {apart:e}", f.name);
    }
}
