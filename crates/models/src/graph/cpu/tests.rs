//! Each operator of the interpreter against a naive float64 reference written from the ONNX
//! definitions (multi-indices, explicit padding), on random shapes, attributes and values drawn
//! from a fresh seed (printed on failure). Every node runs through both interpreters: f32
//! within each test's tolerance of the reference, f64 within [`F64_TOLERANCE`] of it and within
//! the f32 tolerance of f32.

use crate::graph::{
    forward_cpu, forward_cpu_f64, Activation, Array, Binary, Conv, DType, Data, Epilogue, Gemm,
    GraphBuilder, Op, Pool,
};
use gpukit_tensor::random::{fresh_seed, uniform_f32};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How far the f64 interpreter may be from a float64 reference computed from the same f32
/// inputs: rounding in f64's last bits. (The references take f32 attributes such as epsilon as
/// the interpreter does, widened from f32: written as f64 literals they differed by 2.5e-15,
/// which over a row of nearly equal values came to 1.3e-10.)
const F64_TOLERANCE: f64 = 1e-10;

/// Relative L2 error of `got` against `want`.
fn rel_l2(got: impl Iterator<Item = f64>, want: &[f64]) -> f64 {
    let num: f64 = got.zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum::<f64>().max(1e-30);
    (num / den).sqrt()
}

/// Asserts that `got`'s f32 output is within `tol` of `want` (relative L2), its f64 output
/// within [`F64_TOLERANCE`] of it, and the two within `tol` of each other.
fn assert_close(got: &Ran, want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.f32.len(), want.len(), "{what}: length");
    assert_eq!(got.f64.len(), want.len(), "{what}: f64 length");
    let rel = rel_l2(got.f32.iter().map(|&v| f64::from(v)), want);
    assert!(rel <= tol, "{what}: relative error {rel}");
    let rel64 = rel_l2(got.f64.iter().copied(), want);
    assert!(rel64 <= F64_TOLERANCE, "{what}: f64 relative error {rel64}");
    let apart = rel_l2(got.f32.iter().map(|&v| f64::from(v)), &got.f64);
    assert!(apart <= tol, "{what}: f32 and f64 differ by {apart}");
}

/// One node's output from both interpreters.
pub(super) struct Ran {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub f64: Vec<f64>,
}

impl Ran {
    fn as_f32(&self) -> Option<&[f32]> {
        Some(&self.f32)
    }
}

/// A node input for [`run_one`]: shape, values, and whether it is a constant (else fed).
pub(super) type Input = (Vec<usize>, Vec<f32>, bool);

/// Runs one node of `op` on `inputs` (name, shape, values; constants where `values` given to a
/// constant) through [`forward_cpu`] and [`forward_cpu_f64`], and returns its output.
pub(super) fn run_one(op: Op, inputs: &[Input]) -> Ran {
    let mut b = GraphBuilder::new();
    let mut ids = Vec::new();
    let mut feed = Vec::new();
    for (i, (shape, values, constant)) in inputs.iter().enumerate() {
        let name = format!("in{i}");
        ids.push(if *constant {
            b.constant(&name, shape.clone(), Data::F32(values.clone()))
                .unwrap()
        } else {
            feed.push(Array::f32(shape, values.clone()));
            b.input(&name, DType::F32, shape.clone()).unwrap()
        });
    }
    let out = b.node("n", op, &ids, &["y"]).unwrap()[0];
    b.output(out);
    let g = b.finish().unwrap();
    let single = forward_cpu(&g, &feed).unwrap().remove(0);
    let double = forward_cpu_f64(&g, &feed).unwrap().remove(0);
    assert_eq!(single.shape, double.shape);
    Ran {
        f32: single.as_f32().unwrap().to_vec(),
        shape: single.shape,
        f64: double.data,
    }
}

pub(super) fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

pub(super) fn rng() -> (u64, ChaCha8Rng) {
    let seed = fresh_seed();
    (seed, ChaCha8Rng::seed_from_u64(seed))
}

/// Naive convolution: every output, every tap, padding by bounds checks.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    wt: &[f64],
    k: usize,
    cv: &Conv,
    b: Option<&[f64]>,
) -> (Vec<f64>, [usize; 4]) {
    let [r, s] = cv.kernel;
    let g = cv.groups;
    let (cg, kg) = (c / g, k / g);
    let span = |k: usize, d: usize| (k - 1) * d + 1;
    let p = (h + cv.pads[0] + cv.pads[2] - span(r, cv.dilations[0])) / cv.strides[0] + 1;
    let q = (w + cv.pads[1] + cv.pads[3] - span(s, cv.dilations[1])) / cv.strides[1] + 1;
    let mut out = vec![0f64; n * k * p * q];
    for img in 0..n {
        for o in 0..k {
            let grp = o / kg;
            for i in 0..p {
                for j in 0..q {
                    let mut acc = b.map_or(0.0, |b| b[o]);
                    for ci in 0..cg {
                        for a in 0..r {
                            for bb in 0..s {
                                let y = (i * cv.strides[0] + a * cv.dilations[0]) as i64
                                    - cv.pads[0] as i64;
                                let xx = (j * cv.strides[1] + bb * cv.dilations[1]) as i64
                                    - cv.pads[1] as i64;
                                if y < 0 || xx < 0 || y >= h as i64 || xx >= w as i64 {
                                    continue;
                                }
                                let ch = grp * cg + ci;
                                acc += x[((img * c + ch) * h + y as usize) * w + xx as usize]
                                    * wt[((o * cg + ci) * r + a) * s + bb];
                            }
                        }
                    }
                    out[((img * k + o) * p + i) * q + j] = acc;
                }
            }
        }
    }
    (out, [n, k, p, q])
}

/// A convolution `cv` of `x` `[n, c, h, w]` into `k` channels: its naive reference, output
/// shape and node inputs (x fed; the weight, and the bias where `cv` has one, as constants).
pub(super) fn conv_case(
    cv: &Conv,
    [n, c, h, w]: [usize; 4],
    k: usize,
    x: Vec<f32>,
    wt: Vec<f32>,
    bias: Vec<f32>,
) -> (Vec<f64>, [usize; 4], Vec<Input>) {
    let [r, s] = cv.kernel;
    let (want, oshape) = conv_ref(
        &f64s(&x),
        [n, c, h, w],
        &f64s(&wt),
        k,
        cv,
        cv.bias.then(|| f64s(&bias)).as_deref(),
    );
    let mut inputs = vec![
        (vec![n, c, h, w], x, false),
        (vec![k, c / cv.groups, r, s], wt, true),
    ];
    if cv.bias {
        inputs.push((vec![k], bias, true));
    }
    (want, oshape, inputs)
}

fn act_ref(a: Activation, x: f64) -> f64 {
    match a {
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::HardSigmoid { alpha, beta } => {
            (f64::from(alpha) * x + f64::from(beta)).clamp(0.0, 1.0)
        }
        Activation::HardSwish => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
        Activation::Gelu => 0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt())),
        Activation::Silu => x / (1.0 + (-x).exp()),
    }
}

const ACTIVATIONS: [Activation; 6] = [
    Activation::Relu,
    Activation::Sigmoid,
    Activation::HardSigmoid {
        alpha: 0.2,
        beta: 0.5,
    },
    Activation::HardSwish,
    Activation::Gelu,
    Activation::Silu,
];

#[test]
fn conv_matches_naive_reference_over_groups_pads_strides_dilations_and_epilogues() {
    let (seed, mut rng) = rng();
    for case in 0..40 {
        let g = [1, 1, 2, 3, 4][rng.random_range(0..5)];
        let depthwise = rng.random_bool(0.3);
        let (c, k) = if depthwise {
            (g * 2, g * 2)
        } else {
            (g * rng.random_range(1..4), g * rng.random_range(1..4))
        };
        let groups = if depthwise { c } else { g };
        let (r, s) = (rng.random_range(1..5), rng.random_range(1..5));
        let n = rng.random_range(1..3);
        let (h, w) = (
            rng.random_range(r.max(3)..12),
            rng.random_range(s.max(3)..12),
        );
        let cv = Conv {
            kernel: [r, s],
            strides: [rng.random_range(1..3), rng.random_range(1..3)],
            pads: std::array::from_fn(|_| rng.random_range(0..3)),
            dilations: if rng.random_bool(0.3) { [2, 1] } else { [1, 1] },
            groups,
            bias: rng.random_bool(0.5),
            epilogue: Epilogue {
                residual: rng.random_bool(0.3),
                activation: rng
                    .random_bool(0.5)
                    .then(|| ACTIVATIONS[rng.random_range(0..5)]),
            },
        };
        if (r - 1) * cv.dilations[0] + 1 > h + cv.pads[0] + cv.pads[2] {
            continue;
        }
        let x = uniform_f32(n * c * h * w, seed ^ case);
        let wt = uniform_f32(k * (c / groups) * r * s, seed.wrapping_add(case + 1));
        let bias = uniform_f32(k, seed.wrapping_add(case + 2));
        let (mut want, oshape, mut inputs) = conv_case(&cv, [n, c, h, w], k, x, wt, bias);
        if cv.epilogue.residual {
            let res = uniform_f32(want.len(), seed.wrapping_add(case + 3));
            want.iter_mut()
                .zip(&res)
                .for_each(|(w, r)| *w += f64::from(*r));
            inputs.push((oshape.to_vec(), res, false));
        }
        if let Some(a) = cv.epilogue.activation {
            want.iter_mut().for_each(|v| *v = act_ref(a, *v));
        }
        let got = run_one(Op::Conv(cv.clone()), &inputs);
        assert_eq!(got.shape, oshape, "seed {seed} case {case} {cv:?}");
        assert_close(
            &got,
            &want,
            1e-5,
            &format!("seed {seed} case {case} {cv:?}"),
        );
    }
}

/// Naive pooling from the definition: the window in padded coordinates, taps in the input.
fn pool_ref(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    p: &Pool,
    max: bool,
    [oh, ow]: [usize; 2],
) -> Vec<f64> {
    let mut out = Vec::new();
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let (mut m, mut sum, mut taps, mut padded) =
                    (f64::NEG_INFINITY, 0.0, 0usize, 0usize);
                for a in 0..p.kernel[0] {
                    for b in 0..p.kernel[1] {
                        let y = (i * p.strides[0] + a) as i64 - p.pads[0] as i64;
                        let xx = (j * p.strides[1] + b) as i64 - p.pads[1] as i64;
                        // inside the padded input (count_include_pad's divisor)
                        if y < h as i64 + p.pads[2] as i64 && xx < w as i64 + p.pads[3] as i64 {
                            padded += 1;
                        }
                        if y < 0 || xx < 0 || y >= h as i64 || xx >= w as i64 {
                            continue;
                        }
                        let v = x[(plane * h + y as usize) * w + xx as usize];
                        m = m.max(v);
                        sum += v;
                        taps += 1;
                    }
                }
                out.push(if max {
                    m
                } else if p.count_include_pad {
                    sum / padded as f64
                } else {
                    sum / taps as f64
                });
            }
        }
    }
    out
}

#[test]
fn pools_match_naive_reference_with_pads_and_ceil_mode() {
    let (seed, mut rng) = rng();
    for case in 0..60 {
        let kernel = [rng.random_range(1..4), rng.random_range(1..4)];
        let p = Pool {
            kernel,
            strides: [rng.random_range(1..4), rng.random_range(1..4)],
            pads: std::array::from_fn(|i| rng.random_range(0..kernel[i % 2])),
            ceil_mode: rng.random_bool(0.5),
            count_include_pad: rng.random_bool(0.5),
        };
        let (n, c, h, w) = (
            rng.random_range(1..3),
            rng.random_range(1..4),
            rng.random_range(3..10),
            rng.random_range(3..10),
        );
        let x = uniform_f32(n * c * h * w, seed ^ case);
        for max in [true, false] {
            let op = if max {
                Op::MaxPool(p.clone())
            } else {
                Op::AveragePool(p.clone())
            };
            let got = run_one(op, &[(vec![n, c, h, w], x.clone(), false)]);
            // the extents, from the definition: ceil or floor, then drop a window starting in
            // the end padding
            let ext = |len: usize, a: usize| {
                let room = len + p.pads[a] + p.pads[a + 2] - p.kernel[a];
                let mut o = if p.ceil_mode {
                    room.div_ceil(p.strides[a])
                } else {
                    room / p.strides[a]
                } + 1;
                if p.ceil_mode && (o - 1) * p.strides[a] >= len + p.pads[a] {
                    o -= 1;
                }
                o
            };
            let (oh, ow) = (ext(h, 0), ext(w, 1));
            assert_eq!(got.shape, [n, c, oh, ow], "seed {seed} case {case} {p:?}");
            let want = pool_ref(&f64s(&x), [n, c, h, w], &p, max, [oh, ow]);
            assert_close(
                &got,
                &want,
                1e-6,
                &format!("seed {seed} case {case} max {max} {p:?}"),
            );
        }
    }
}

/// The flat index into a tensor of `shape` broadcast to `out` at multi-index `idx`.
fn broadcast_index(shape: &[usize], out: &[usize], idx: &[usize]) -> usize {
    let lead = out.len() - shape.len();
    shape.iter().enumerate().fold(0, |acc, (a, &d)| {
        acc * d + if d == 1 { 0 } else { idx[lead + a] }
    })
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = i % shape[a];
        i /= shape[a];
    }
    idx
}

#[test]
fn binary_ops_broadcast_as_numpy() {
    let (seed, mut rng) = rng();
    for case in 0..40 {
        let rank = rng.random_range(1..5);
        let out: Vec<usize> = (0..rank).map(|_| rng.random_range(1..5)).collect();
        let pick = |rng: &mut ChaCha8Rng| -> Vec<usize> {
            let drop = rng.random_range(0..=rank);
            out[drop..]
                .iter()
                .map(|&d| if rng.random_bool(0.4) { 1 } else { d })
                .collect()
        };
        let (sa, sb) = (pick(&mut rng), pick(&mut rng));
        let (a, b) = (
            uniform_f32(sa.iter().product(), seed ^ case),
            uniform_f32(sb.iter().product(), !seed ^ case),
        );
        for op in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
            let got = run_one(
                Op::Binary(op),
                &[
                    (sa.clone(), a.clone(), false),
                    (sb.clone(), b.clone(), rng.random_bool(0.5)),
                ],
            );
            let oshape = got.shape.clone();
            let want: Vec<f64> = (0..oshape.iter().product())
                .map(|i| {
                    let idx = unravel(i, &oshape);
                    let (x, y) = (
                        f64::from(a[broadcast_index(&sa, &oshape, &idx)]),
                        f64::from(b[broadcast_index(&sb, &oshape, &idx)]),
                    );
                    match op {
                        Binary::Add => x + y,
                        Binary::Sub => x - y,
                        Binary::Mul => x * y,
                        Binary::Div => x / y,
                    }
                })
                .collect();
            assert_eq!(oshape.len(), sa.len().max(sb.len()), "seed {seed}");
            assert_close(
                &got,
                &want,
                1e-6,
                &format!("seed {seed} case {case} {op:?} {sa:?} {sb:?}"),
            );
        }
    }
}

#[test]
fn activations_and_erf_match_float64() {
    let seed = fresh_seed();
    let x: Vec<f32> = uniform_f32(999, seed)
        .into_iter()
        .map(|v| v * 8.0)
        .collect();
    for a in ACTIVATIONS {
        let got = run_one(Op::Activation(a), &[(vec![3, 333], x.clone(), false)]);
        let want: Vec<f64> = x.iter().map(|&v| act_ref(a, f64::from(v))).collect();
        assert_close(&got, &want, 1e-6, &format!("seed {seed} {a:?}"));
    }
    let got = run_one(Op::Erf, &[(vec![999], x.clone(), false)]);
    let want: Vec<f64> = x.iter().map(|&v| libm::erf(f64::from(v))).collect();
    assert_close(&got, &want, 1e-6, &format!("seed {seed} erf"));
}

#[test]
fn gemm_and_matmul_match_naive_products() {
    let (seed, mut rng) = rng();
    for case in 0..20 {
        let (m, n, k) = (
            rng.random_range(1..9),
            rng.random_range(1..9),
            rng.random_range(1..9),
        );
        let g = Gemm {
            alpha: 0.5 + rng.random::<f32>(),
            beta: rng.random::<f32>(),
            trans_a: rng.random_bool(0.5),
            trans_b: rng.random_bool(0.5),
        };
        let a = uniform_f32(m * k, seed ^ case);
        let b = uniform_f32(k * n, !seed ^ case);
        let c = uniform_f32(n, seed.wrapping_add(case));
        let sa = if g.trans_a { vec![k, m] } else { vec![m, k] };
        let sb = if g.trans_b { vec![n, k] } else { vec![k, n] };
        let got = run_one(
            Op::Gemm(g),
            &[
                (sa, a.clone(), false),
                (sb, b.clone(), true),
                (vec![n], c.clone(), true),
            ],
        );
        let at = |i: usize, l: usize| {
            f64::from(if g.trans_a {
                a[l * m + i]
            } else {
                a[i * k + l]
            })
        };
        let bt = |l: usize, j: usize| {
            f64::from(if g.trans_b {
                b[j * k + l]
            } else {
                b[l * n + j]
            })
        };
        let want: Vec<f64> = (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                f64::from(g.alpha) * (0..k).map(|l| at(i, l) * bt(l, j)).sum::<f64>()
                    + f64::from(g.beta) * f64::from(c[j])
            })
            .collect();
        assert_close(&got, &want, 1e-5, &format!("seed {seed} case {case} {g:?}"));
        // MatMul with broadcast batches, and 1-D operands
        let (ba, bb): (Vec<usize>, Vec<usize>) = match case % 4 {
            0 => (vec![2, 3], vec![3]),
            1 => (vec![1], vec![2, 1]),
            2 => (vec![], vec![]),
            _ => (vec![2], vec![]),
        };
        let mut sa = ba.clone();
        sa.extend([m, k]);
        let mut sb = bb.clone();
        sb.extend([k, n]);
        let a = uniform_f32(sa.iter().product(), seed ^ (case + 100));
        let b = uniform_f32(sb.iter().product(), !seed ^ (case + 100));
        let got = run_one(
            Op::MatMul,
            &[
                (sa.clone(), a.clone(), false),
                (sb.clone(), b.clone(), true),
            ],
        );
        let oshape = got.shape.clone();
        let want: Vec<f64> = (0..oshape.iter().product())
            .map(|f| {
                let idx = unravel(f, &oshape);
                let r = idx.len();
                let (i, j) = (idx[r - 2], idx[r - 1]);
                (0..k)
                    .map(|l| {
                        let mut ia = idx[..r - 2].to_vec();
                        ia.extend([i, l]);
                        let mut ib = idx[..r - 2].to_vec();
                        ib.extend([l, j]);
                        f64::from(a[broadcast_index(&sa, &oshape, &ia)])
                            * f64::from(b[broadcast_index(&sb, &oshape, &ib)])
                    })
                    .sum()
            })
            .collect();
        assert_close(
            &got,
            &want,
            1e-5,
            &format!("seed {seed} case {case} matmul {sa:?} {sb:?}"),
        );
    }
    // 1-D by 2-D and 2-D by 1-D drop the promoted axis
    let v = run_one(
        Op::MatMul,
        &[
            (vec![3], vec![1.0, 2.0, 3.0], false),
            (vec![3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], true),
        ],
    );
    assert_eq!(
        (v.shape.as_slice(), v.as_f32().unwrap()),
        (&[2][..], &[4.0, 5.0][..])
    );
    let v = run_one(
        Op::MatMul,
        &[
            (vec![2, 3], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], false),
            (vec![3], vec![1.0, 2.0, 3.0], true),
        ],
    );
    assert_eq!(
        (v.shape.as_slice(), v.as_f32().unwrap()),
        (&[2][..], &[1.0, 6.0][..])
    );
}

#[test]
fn normalizations_and_means_match_float64() {
    let (seed, mut rng) = rng();
    for case in 0..10 {
        let shape: Vec<usize> = (0..4).map(|_| rng.random_range(1..6)).collect();
        let count: usize = shape.iter().product();
        let x = uniform_f32(count, seed ^ case);
        let c = shape[1];
        let params: Vec<Vec<f32>> = (0..4)
            .map(|i| uniform_f32(c, seed.wrapping_add(case * 7 + i)))
            .collect();
        let var: Vec<f32> = params[3].iter().map(|v| v.abs() + 0.1).collect();
        let got = run_one(
            Op::BatchNorm { epsilon: 1e-5 },
            &[
                (shape.clone(), x.clone(), false),
                (vec![c], params[0].clone(), true),
                (vec![c], params[1].clone(), true),
                (vec![c], params[2].clone(), true),
                (vec![c], var.clone(), true),
            ],
        );
        let plane: usize = shape[2..].iter().product();
        let want: Vec<f64> = (0..count)
            .map(|i| {
                let ch = (i / plane) % c;
                (f64::from(x[i]) - f64::from(params[2][ch]))
                    / (f64::from(var[ch]) + f64::from(1e-5f32)).sqrt()
                    * f64::from(params[0][ch])
                    + f64::from(params[1][ch])
            })
            .collect();
        assert_close(
            &got,
            &want,
            1e-6,
            &format!("seed {seed} case {case} batch norm"),
        );
        // layer norm over the last axis or the last two, scale broadcast from the last axis
        let axis = 2 + case as usize % 2;
        let d: usize = shape[axis..].iter().product();
        let last = shape[3];
        let (scale, bias) = (uniform_f32(last, seed ^ 77), uniform_f32(last, seed ^ 78));
        let got = run_one(
            Op::LayerNorm {
                axis,
                epsilon: 1e-6,
            },
            &[
                (shape.clone(), x.clone(), false),
                (vec![last], scale.clone(), true),
                (vec![last], bias.clone(), true),
            ],
        );
        let want: Vec<f64> = x
            .chunks(d)
            .flat_map(|row| {
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
                let var = row
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / d as f64;
                row.iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        (f64::from(v) - mean) / (var + f64::from(1e-6f32)).sqrt()
                            * f64::from(scale[i % last])
                            + f64::from(bias[i % last])
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(
            &got,
            &want,
            1e-5,
            &format!("seed {seed} case {case} layer norm axis {axis}"),
        );
        // ReduceMean over a random subset of axes, and GlobalAveragePool
        let axes: Vec<usize> = (0..4).filter(|_| rng.random_bool(0.5)).collect();
        let keep_dims = rng.random_bool(0.5);
        let got = run_one(
            Op::ReduceMean {
                axes: axes.clone(),
                keep_dims,
            },
            &[(shape.clone(), x.clone(), false)],
        );
        let kept: Vec<usize> = (0..4)
            .map(|a| if axes.contains(&a) { 1 } else { shape[a] })
            .collect();
        let mut sums = vec![(0f64, 0usize); kept.iter().product()];
        for (i, &v) in x.iter().enumerate() {
            let idx = unravel(i, &shape);
            let at = (0..4).fold(0, |acc, a| {
                acc * kept[a] + if axes.contains(&a) { 0 } else { idx[a] }
            });
            sums[at].0 += f64::from(v);
            sums[at].1 += 1;
        }
        let want: Vec<f64> = sums.iter().map(|(s, n)| s / *n as f64).collect();
        let want_shape: Vec<usize> = if keep_dims {
            kept.clone()
        } else {
            (0..4)
                .filter(|a| !axes.contains(a))
                .map(|a| shape[a])
                .collect()
        };
        assert_eq!(got.shape, want_shape, "seed {seed}");
        assert_close(
            &got,
            &want,
            1e-6,
            &format!("seed {seed} case {case} mean {axes:?}"),
        );
        let got = run_one(Op::GlobalAveragePool, &[(shape.clone(), x.clone(), false)]);
        let want: Vec<f64> = x
            .chunks(plane)
            .map(|p| p.iter().map(|&v| f64::from(v)).sum::<f64>() / plane as f64)
            .collect();
        assert_eq!(got.shape, [shape[0], shape[1], 1, 1]);
        assert_close(&got, &want, 1e-6, &format!("seed {seed} gap"));
    }
}

#[test]
fn layout_ops_move_elements_as_defined() {
    let (seed, mut rng) = rng();
    for case in 0..20 {
        let shape: Vec<usize> = (0..rng.random_range(1..5))
            .map(|_| rng.random_range(1..5))
            .collect();
        let rank = shape.len();
        let x = uniform_f32(shape.iter().product(), seed ^ case);
        // a random permutation
        let mut perm: Vec<usize> = (0..rank).collect();
        for i in (1..rank).rev() {
            perm.swap(i, rng.random_range(0..=i));
        }
        let got = run_one(
            Op::Transpose { perm: perm.clone() },
            &[(shape.clone(), x.clone(), false)],
        );
        let oshape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        assert_eq!(got.shape, oshape);
        let want: Vec<f64> = (0..x.len())
            .map(|i| {
                let oi = unravel(i, &oshape);
                let mut ii = vec![0; rank];
                for (a, &p) in perm.iter().enumerate() {
                    ii[p] = oi[a];
                }
                f64::from(x[ii.iter().zip(&shape).fold(0, |acc, (i, d)| acc * d + i)])
            })
            .collect();
        assert_close(&got, &want, 0.0, &format!("seed {seed} transpose {perm:?}"));
        // concat of two along a random axis
        let axis = rng.random_range(0..rank);
        let mut s2 = shape.clone();
        s2[axis] = rng.random_range(1..4);
        let y = uniform_f32(s2.iter().product(), !seed ^ case);
        let got = run_one(
            Op::Concat { axis },
            &[
                (shape.clone(), x.clone(), false),
                (s2.clone(), y.clone(), true),
            ],
        );
        let mut oshape = shape.clone();
        oshape[axis] += s2[axis];
        let flat =
            |s: &[usize], idx: &[usize]| idx.iter().zip(s).fold(0, |acc, (i, d)| acc * d + i);
        let want: Vec<f64> = (0..oshape.iter().product())
            .map(|i| {
                let mut idx = unravel(i, &oshape);
                f64::from(if idx[axis] < shape[axis] {
                    x[flat(&shape, &idx)]
                } else {
                    idx[axis] -= shape[axis];
                    y[flat(&s2, &idx)]
                })
            })
            .collect();
        assert_close(&got, &want, 0.0, &format!("seed {seed} concat axis {axis}"));
    }
}

#[test]
fn shape_arithmetic_runs_on_i64() {
    // Shape -> Gather(0) -> Unsqueeze -> Concat with [-1] -> Reshape, as torch writes flatten
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![2, 3, 4]).unwrap();
    let s = b
        .node("shape", Op::Shape { start: 0, end: 3 }, &[x], &["s"])
        .unwrap()[0];
    let zero = b.constant("zero", vec![], Data::I64(vec![0])).unwrap();
    let n = b
        .node("gather", Op::Gather { axis: 0 }, &[s, zero], &["n"])
        .unwrap()[0];
    let n1 = b
        .node("unsq", Op::Unsqueeze { axes: vec![0] }, &[n], &["n1"])
        .unwrap()[0];
    let minus = b.constant("minus", vec![1], Data::I64(vec![-1])).unwrap();
    let target = b
        .node("cat", Op::Concat { axis: 0 }, &[n1, minus], &["t"])
        .unwrap()[0];
    assert_eq!(b.known(target), Some(&Data::I64(vec![2, -1])));
    let y = b
        .node("reshape", Op::Reshape, &[x, target], &["y"])
        .unwrap()[0];
    assert_eq!(b.value(y).unwrap().shape, [2, 12]);
    b.output(y);
    b.output(target);
    let g = b.finish().unwrap();
    let values = uniform_f32(24, fresh_seed());
    let out = forward_cpu(&g, &[Array::f32(&[2, 3, 4], values.clone())]).unwrap();
    assert_eq!(out[0], Array::f32(&[2, 12], values));
    assert_eq!(out[1].data, Data::I64(vec![2, -1]));
}

#[test]
fn each_value_is_freed_after_its_last_reader_and_outputs_are_kept() {
    // x -> a -> b, x and a read again by c; b and c are outputs
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![4]).unwrap();
    let relu = Op::Activation(Activation::Relu);
    let a = b.node("a", relu.clone(), &[x], &["a"]).unwrap()[0];
    let bb = b.node("b", relu, &[a], &["b"]).unwrap()[0];
    let c = b
        .node("c", Op::Binary(Binary::Add), &[x, a], &["c"])
        .unwrap()[0];
    b.output(bb);
    b.output(c);
    let g = b.finish().unwrap();
    assert_eq!(crate::graph::last_uses(&g), [Some(2), Some(2), None, None]);
    let out = forward_cpu(&g, &[Array::f32(&[4], vec![-1.0, 2.0, -3.0, 4.0])]).unwrap();
    assert_eq!(out[1].as_f32().unwrap(), [-1.0, 4.0, -3.0, 8.0]);
}

#[test]
fn bad_graphs_and_inputs_are_errors_naming_the_node_or_input() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![1, 3, 8, 8]).unwrap();
    let w = b
        .constant("w", vec![4, 2, 3, 3], Data::F32(vec![0.0; 72]))
        .unwrap();
    let conv = Conv {
        kernel: [3, 3],
        strides: [1, 1],
        pads: [1; 4],
        dilations: [1, 1],
        groups: 1,
        bias: false,
        epilogue: Epilogue::default(),
    };
    let e = b
        .node("c1", Op::Conv(conv.clone()), &[x, w], &["y"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("node c1 (Conv)") && e.contains("group"), "{e}");
    let w = b
        .constant("w3", vec![4, 3, 3, 3], Data::F32(vec![0.0; 108]))
        .unwrap();
    let y = b.node("c2", Op::Conv(conv), &[x, w], &["y"]).unwrap()[0];
    b.output(y);
    let g = b.finish().unwrap();
    let e = forward_cpu(&g, &[Array::f32(&[1, 3, 8, 7], vec![0.0; 168])])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("input x:"), "{e}");
    let e = forward_cpu(&g, &[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs"), "{e}");
    // a graph edited by hand into an inconsistent one is refused, not run
    let mut bad = g.clone();
    bad.values[y].shape = vec![1, 4, 8, 9];
    let e = forward_cpu(&bad, &[Array::f32(&[1, 3, 8, 8], vec![0.0; 192])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("node c2 (Conv): output y is recorded as"), "{e}");
    bad.nodes[0].inputs[1] = 99;
    assert!(forward_cpu(&bad, &[Array::f32(&[1, 3, 8, 8], vec![0.0; 192])]).is_err());
}
