//! Every layer's backward against central finite differences in f64 on fresh random inputs
//! (the seed is printed on failure), forwards against their definitions written directly, the
//! loss, a whole ResNet's gradients, torchvision's names and sizes, and the optimizers'
//! formulas.

// finite differences index the perturbed input and the analytic gradient by the same i
#![allow(clippy::needless_range_loop)]

use super::layers::*;
use super::loss::cross_entropy_smoothed;
use super::optim::{CnnOptimizer, CnnOptimizerConfig};
use super::resnet::{Depth, Mode, ResNet};
use super::Tensor;
use crate::optim::OptimizerKind;
use gpukit_tensor::random::{fresh_seed, normal_f64};

const H: f64 = 1e-5;

fn rand_tensor(shape: [usize; 4], seed: u64) -> Tensor<f64> {
    Tensor::from_vec(shape, normal_f64(shape.iter().product(), seed))
}

/// |a - b| small against their size: finite differences of smooth f64 functions. The floor
/// 1e-2 of the scale allows an absolute 1e-8: a central difference with step 1e-5 of sums of
/// order 10 carries rounding of about 1e-9 (a conv's dx of 3e-4 once came out 2.9e-9 off).
fn close(a: f64, b: f64, what: &str, seed: u64) {
    let err = (a - b).abs() / (a.abs() + b.abs()).max(1e-2);
    assert!(
        err < 1e-6,
        "{what}: analytic {a} vs numeric {b} (seed {seed})"
    );
}

/// The central difference of `f` at `x` along coordinate `i`.
fn numeric(x: &mut [f64], i: usize, mut f: impl FnMut(&[f64]) -> f64) -> f64 {
    let keep = x[i];
    x[i] = keep + H;
    let up = f(x);
    x[i] = keep - H;
    let down = f(x);
    x[i] = keep;
    (up - down) / (2.0 * H)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The convolution written from its definition.
fn conv_direct(c: &Conv2d, w: &[f64], x: &Tensor<f64>) -> Tensor<f64> {
    let [n, ci, h, wd] = x.shape;
    let (oh, ow) = c.out_size(h, wd);
    let k = c.kernel;
    let mut y = Tensor::zeros([n, c.out_channels, oh, ow]);
    for img in 0..n {
        for o in 0..c.out_channels {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = 0.0;
                    for ch in 0..ci {
                        for ky in 0..k {
                            for kx in 0..k {
                                let iy = (oy * c.stride + ky) as isize - c.padding as isize;
                                let ix = (ox * c.stride + kx) as isize - c.padding as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    s += w[((o * ci + ch) * k + ky) * k + kx]
                                        * x.data[((img * ci + ch) * h + iy as usize) * wd
                                            + ix as usize];
                                }
                            }
                        }
                    }
                    y.data[((img * c.out_channels + o) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    y
}

#[test]
fn conv_forward_and_backward_match_definition_and_finite_differences() {
    let seed = fresh_seed();
    let cases = [
        (3, 4, 3, 1, 1, 7, 6),
        (3, 5, 3, 2, 1, 7, 8),
        (4, 6, 1, 2, 0, 5, 5),
        (3, 2, 7, 2, 3, 9, 8),
        (2, 3, 1, 1, 0, 4, 3),
    ];
    for (case, &(ci, co, k, stride, padding, h, w)) in cases.iter().enumerate() {
        let s = seed.wrapping_add(case as u64 * 10);
        let conv = Conv2d {
            in_channels: ci,
            out_channels: co,
            kernel: k,
            stride,
            padding,
        };
        let mut x = rand_tensor([2, ci, h, w], s);
        let mut wt = normal_f64(conv.weight_len(), s + 1);
        let y = conv.forward(&wt, &x);
        let want = conv_direct(&conv, &wt, &x);
        assert_eq!(y.shape, want.shape);
        for (a, b) in y.data.iter().zip(&want.data) {
            assert!(
                (a - b).abs() < 1e-12,
                "conv forward case {case} (seed {seed})"
            );
        }
        let r = rand_tensor(y.shape, s + 2);
        let mut dw = vec![0.0; wt.len()];
        let dx = conv
            .backward(&wt, &x, &r, &mut dw, true)
            .expect("dx asked for");
        for i in 0..x.data.len() {
            let wt2 = wt.clone();
            let shape = x.shape;
            let num = numeric(&mut x.data, i, |xd| {
                dot(
                    &conv
                        .forward(&wt2, &Tensor::from_vec(shape, xd.to_vec()))
                        .data,
                    &r.data,
                )
            });
            close(dx.data[i], num, &format!("conv case {case} dx[{i}]"), seed);
        }
        for i in 0..wt.len() {
            let x2 = x.clone();
            let num = numeric(&mut wt, i, |wd| dot(&conv.forward(wd, &x2).data, &r.data));
            close(dw[i], num, &format!("conv case {case} dw[{i}]"), seed);
        }
    }
}

#[test]
fn batchnorm_training_backward_matches_finite_differences() {
    let seed = fresh_seed();
    let bn = BatchNorm2d::new(3);
    let mut x = rand_tensor([3, 3, 2, 3], seed);
    let mut gamma = normal_f64(3, seed + 1);
    let mut beta = normal_f64(3, seed + 2);
    let r = rand_tensor(x.shape, seed + 3);
    let loss = |x: &Tensor<f64>, g: &[f64], b: &[f64]| {
        let (mut m, mut v) = (vec![0.0; 3], vec![1.0; 3]);
        dot(
            &bn.forward_train((g, b), (&mut m, &mut v), x).0.data,
            &r.data,
        )
    };
    let (mut m, mut v) = (vec![0.0; 3], vec![1.0; 3]);
    let (_, cache) = bn.forward_train((&gamma, &beta), (&mut m, &mut v), &x);
    let (mut dg, mut db) = (vec![0.0; 3], vec![0.0; 3]);
    let dx = bn.backward(&gamma, &cache, &r, (&mut dg, &mut db));
    for i in 0..x.data.len() {
        let shape = x.shape;
        let num = numeric(&mut x.data, i, |d| {
            loss(&Tensor::from_vec(shape, d.to_vec()), &gamma, &beta)
        });
        close(dx.data[i], num, &format!("bn dx[{i}]"), seed);
    }
    for i in 0..3 {
        let b2 = beta.clone();
        let num = numeric(&mut gamma, i, |g| loss(&x, g, &b2));
        close(dg[i], num, &format!("bn dgamma[{i}]"), seed);
        let g2 = gamma.clone();
        let num = numeric(&mut beta, i, |b| loss(&x, &g2, b));
        close(db[i], num, &format!("bn dbeta[{i}]"), seed);
    }
}

/// Running statistics as PyTorch moves them: momentum 0.1 towards the batch mean and the
/// unbiased variance; normalisation by the biased one; eval mode from the running ones.
#[test]
fn batchnorm_statistics_follow_pytorch() {
    let seed = fresh_seed();
    let bn = BatchNorm2d::new(2);
    let x = rand_tensor([4, 2, 3, 3], seed);
    let (gamma, beta) = (vec![1.5, -0.5], vec![0.25, 2.0]);
    let (mut rm, mut rv) = (vec![0.3, -0.2], vec![1.2, 0.8]);
    let (y, _) = bn.forward_train((&gamma, &beta), (&mut rm, &mut rv), &x);
    for c in 0..2 {
        let vals: Vec<f64> = (0..4)
            .flat_map(|n| x.data[(n * 2 + c) * 9..][..9].to_vec())
            .collect();
        let m = vals.len() as f64;
        let mean = vals.iter().sum::<f64>() / m;
        let biased = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / m;
        let unbiased = biased * m / (m - 1.0);
        let rm0 = [0.3, -0.2][c];
        let rv0 = [1.2, 0.8][c];
        assert!(
            (rm[c] - (0.9 * rm0 + 0.1 * mean)).abs() < 1e-12,
            "seed {seed}"
        );
        assert!(
            (rv[c] - (0.9 * rv0 + 0.1 * unbiased)).abs() < 1e-12,
            "seed {seed}"
        );
        let want = (x.data[c * 9] - mean) / (biased + 1e-5).sqrt() * gamma[c] + beta[c];
        assert!((y.data[c * 9] - want).abs() < 1e-12, "seed {seed}");
    }
    let e = bn.forward_eval((&gamma, &beta), (&rm, &rv), &x);
    let want = (x.data[9] - rm[1]) / (rv[1] + 1e-5).sqrt() * gamma[1] + beta[1];
    assert!((e.data[9] - want).abs() < 1e-12, "seed {seed}");
}

#[test]
fn pooling_relu_linear_backward_match_finite_differences() {
    let seed = fresh_seed();
    // max pooling 3/2/1 (random values: no ties within H)
    let pool = MaxPool2d {
        kernel: 3,
        stride: 2,
        padding: 1,
    };
    let mut x = rand_tensor([2, 2, 7, 6], seed);
    let (y, arg) = pool.forward(&x);
    assert_eq!(y.shape, [2, 2, 4, 3]);
    let r = rand_tensor(y.shape, seed + 1);
    let dx = pool.backward(x.shape, &arg, &r);
    // (where two values of a window lie within the step of each other, a step flips which is
    // the maximum: the function has a kink there and its difference quotient is no gradient;
    // such coordinates are left out, as ReLU's near zero below, and they are few)
    let mut checked = 0;
    for i in 0..x.data.len() {
        let shape = x.shape;
        let flips = [H, -H].iter().any(|&step| {
            let mut d = x.data.clone();
            d[i] += step;
            pool.forward(&Tensor::from_vec(shape, d)).1 != arg
        });
        if flips {
            continue;
        }
        let num = numeric(&mut x.data, i, |d| {
            dot(
                &pool.forward(&Tensor::from_vec(shape, d.to_vec())).0.data,
                &r.data,
            )
        });
        close(dx.data[i], num, &format!("maxpool dx[{i}]"), seed);
        checked += 1;
    }
    assert!(
        checked + 4 >= x.data.len(),
        "maxpool: {checked} of {} coordinates away from a tie (seed {seed})",
        x.data.len()
    );
    // global average pooling
    let r = normal_f64(4, seed + 2);
    let dx = avgpool_backward(x.shape, &r);
    for i in 0..x.data.len() {
        let shape = x.shape;
        let num = numeric(&mut x.data, i, |d| {
            dot(&avgpool_forward(&Tensor::from_vec(shape, d.to_vec())), &r)
        });
        close(dx.data[i], num, &format!("avgpool dx[{i}]"), seed);
    }
    // ReLU (away from zero)
    let mut out = x.clone();
    relu_inplace(&mut out);
    let mut d = rand_tensor(x.shape, seed + 3);
    let r = d.clone();
    relu_backward(&out, &mut d);
    for i in 0..x.data.len() {
        if x.data[i].abs() < 1e-3 {
            continue;
        }
        let shape = x.shape;
        let num = numeric(&mut x.data, i, |v| {
            let mut t = Tensor::from_vec(shape, v.to_vec());
            relu_inplace(&mut t);
            dot(&t.data, &r.data)
        });
        close(d.data[i], num, &format!("relu dx[{i}]"), seed);
    }
    // linear
    let lin = Linear {
        inputs: 5,
        outputs: 3,
    };
    let mut xin = normal_f64(4 * 5, seed + 4);
    let mut w = normal_f64(15, seed + 5);
    let mut b = normal_f64(3, seed + 6);
    let r = normal_f64(12, seed + 7);
    let (mut dw, mut db) = (vec![0.0; 15], vec![0.0; 3]);
    let dxin = lin.backward(&w, &xin, &r, (&mut dw, &mut db));
    for i in 0..xin.len() {
        let num = numeric(&mut xin, i, |v| dot(&lin.forward((&w, &b), v), &r));
        close(dxin[i], num, &format!("linear dx[{i}]"), seed);
    }
    for i in 0..w.len() {
        let num = numeric(&mut w, i, |v| dot(&lin.forward((v, &b), &xin), &r));
        close(dw[i], num, &format!("linear dw[{i}]"), seed);
    }
    for i in 0..3 {
        let num = numeric(&mut b, i, |v| dot(&lin.forward((&w, v), &xin), &r));
        close(db[i], num, &format!("linear db[{i}]"), seed);
    }
}

/// Ties go to the window's first largest value (row-major), a NaN wins, and a window of
/// -inf still points inside itself.
#[test]
fn maxpool_routes_ties_and_nan_as_pytorch() {
    let pool = MaxPool2d {
        kernel: 3,
        stride: 2,
        padding: 1,
    };
    let mut x = Tensor::from_vec([1, 1, 3, 3], vec![1.0f64; 9]);
    let (_, arg) = pool.forward(&x);
    assert_eq!(arg, vec![0, 1, 3, 4]);
    x.data[4] = f64::NAN;
    x.data[0] = 5.0;
    let (y, arg) = pool.forward(&x);
    assert!(y.data[0].is_nan());
    assert_eq!(arg[0], 4);
    let x = Tensor::from_vec([1, 1, 2, 2], vec![f64::NEG_INFINITY; 4]);
    let (_, arg) = pool.forward(&x);
    assert_eq!(arg, vec![0]);
}

#[test]
fn smoothed_cross_entropy_matches_definition_and_finite_differences() {
    let seed = fresh_seed();
    let (n, c, eps) = (4, 6, 0.1);
    let mut z = normal_f64(n * c, seed);
    let labels = [0u32, 5, 2, 2];
    let mut g = Vec::new();
    let (loss, _) = cross_entropy_smoothed(&z, c, &labels, eps, &mut g);
    let mut want = 0.0;
    for (row, &y) in z.chunks(c).zip(&labels) {
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        let logp: Vec<f64> = row.iter().map(|v| v - lse).collect();
        want += (1.0 - eps) * -logp[y as usize] + eps * -logp.iter().sum::<f64>() / c as f64;
    }
    want /= n as f64;
    assert!(
        (loss - want).abs() < 1e-12,
        "{loss} vs {want} (seed {seed})"
    );
    for i in 0..z.len() {
        let num = numeric(&mut z, i, |v| {
            cross_entropy_smoothed(v, c, &labels, eps, &mut Vec::new()).0
        });
        close(g[i], num, &format!("ce dz[{i}]"), seed);
    }
}

/// The loss of `model` on a batch in training mode (running statistics restored, so repeated
/// calls see the same network).
fn model_loss(model: &mut ResNet<f64>, x: &Tensor<f64>, labels: &[u32]) -> f64 {
    let keep = model.buffers.clone();
    let (logits, _) = model.forward(x, Mode::Train);
    model.buffers = keep;
    cross_entropy_smoothed(&logits, model.classes, labels, 0.1, &mut Vec::new()).0
}

/// [`check_seed`] on fresh seeds until one leaves enough smooth coordinates (at most three).
fn check_resnet(depth: Depth, shape: (usize, usize), h: f64, names: &[&str]) {
    for _ in 0..3 {
        if check_seed(depth, shape, h, names, fresh_seed()) {
            return;
        }
    }
    panic!("{depth:?}: three seeds with kinks nearly everywhere");
}

/// The gradients of `names` (two coordinates each) against finite differences; false when
/// kinks (a ReLU or a max pool's choice switching within the steps) left too few smooth
/// coordinates to check. A gradient off panics.
fn check_seed(
    depth: Depth,
    (batch, size): (usize, usize),
    h: f64,
    names: &[&str],
    seed: u64,
) -> bool {
    let mut model = ResNet::<f64>::new(depth, 5, seed);
    let x = rand_tensor([batch, 3, size, size], seed + 1);
    let labels: Vec<u32> = (0..batch as u32).map(|i| (i * 3 + 1) % 5).collect();
    let (logits, tape) = model.forward(&x, Mode::Train);
    let mut dz = Vec::new();
    cross_entropy_smoothed(&logits, 5, &labels, 0.1, &mut dz);
    let mut grads = model.zero_grads();
    model.backward(&tape.expect("a training tape"), &dz, &mut grads);
    let mut pick = seed;
    let (mut bad, mut kinks) = (0, 0);
    for &name in names {
        let k = model
            .params
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("no parameter {name}"));
        let mut checked = 0;
        while checked < 2 {
            pick = pick
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (pick >> 33) as usize % model.params[k].data.len();
            let keep = model.params[k].data[i];
            let mut at = |v: f64| {
                model.params[k].data[i] = v;
                let loss = model_loss(&mut model, &x, &labels);
                model.params[k].data[i] = keep;
                loss
            };
            let (f0, up, down) = (at(keep), at(keep + h), at(keep - h));
            let (up2, down2) = (at(keep + 2.0 * h), at(keep - 2.0 * h));
            let num = (up - down) / (2.0 * h);
            let wide = (up2 - down2) / (4.0 * h);
            // a ReLU or a max pool's choice switching within +-2h (a kink): the central
            // quotients of two steps disagree, and neither is the derivative: take another
            // coordinate
            let scale = |a: f64, b: f64| (a.abs() + b.abs()).max(1e-4);
            if (wide - num).abs() > 1e-5 * scale(wide, num) {
                kinks += 1;
                if kinks >= 60 {
                    eprintln!("{depth:?}: kinks nearly everywhere (seed {seed}); another seed");
                    return false;
                }
                continue;
            }
            checked += 1;
            let err = (grads[k][i] - num).abs() / scale(grads[k][i], num);
            // where the switch sits within +-h of the middle, both central quotients give the
            // mean of the two slopes and agree; the derivative the backward pass takes is one
            // of the one-sided slopes, (f(x+h) - f(x)) / h or (f(x) - f(x-h)) / h, within
            // f'' h of it
            let one_sided = [(up - f0) / h, (f0 - down) / h]
                .iter()
                .map(|s| (grads[k][i] - s).abs() / scale(grads[k][i], *s))
                .fold(f64::INFINITY, f64::min);
            eprintln!(
                "{depth:?} {name}[{i}]: analytic {} vs numeric {num} err {err:.1e}, one-sided \
                 {one_sided:.1e} (seed {seed})",
                grads[k][i]
            );
            // steps of 1e-7 leave the quotient ~1e-8 of rounding: 1e-4 of small gradients
            bad += usize::from(err >= 1e-4 && one_sided >= 1e-3);
        }
    }
    assert_eq!(bad, 0, "{depth:?}: gradients off (seed {seed})");
    true
}

/// ResNet-18 at 64x64, batch 2, f64 (smaller images leave layer4's batch norm two values a
/// channel, ill-conditioned): parameters from every kind of layer and stage.
#[test]
fn resnet18_gradients_match_finite_differences() {
    check_resnet(
        Depth::ResNet18,
        (2, 64),
        // steps of 1e-5 switch a ReLU or a pool's choice somewhere for most coordinates
        1e-6,
        &[
            "conv1.weight",
            "bn1.weight",
            "layer1.0.conv1.weight",
            "layer1.1.bn2.bias",
            "layer2.0.downsample.0.weight",
            "layer2.0.downsample.1.weight",
            "layer3.1.conv2.weight",
            "layer4.0.bn1.weight",
            "fc.weight",
            "fc.bias",
        ],
    );
}

/// ResNet-50's bottlenecks at 64x64, batch 2, f64.
#[test]
fn resnet50_gradients_match_finite_differences() {
    check_resnet(
        Depth::ResNet50,
        (2, 64),
        // 16 blocks downstream of layer1 switch a ReLU somewhere for most steps of 1e-5
        1e-7,
        &[
            "layer1.0.conv3.weight",
            "layer1.0.downsample.0.weight",
            "layer2.0.conv2.weight",
            "layer3.2.bn3.bias",
        ],
    );
}

/// torchvision's names, order and sizes (its parameter counts with 1,000 classes).
#[test]
fn resnets_have_torchvision_names_and_sizes() {
    for (depth, count, tensors) in [
        (Depth::ResNet18, 11_689_512, 62),
        (Depth::ResNet34, 21_797_672, 110),
        (Depth::ResNet50, 25_557_032, 161),
    ] {
        let m = ResNet::<f32>::new(depth, 1000, 1);
        assert_eq!(m.parameter_count(), count, "{depth:?}");
        assert_eq!(m.params.len(), tensors, "{depth:?}");
        assert_eq!(m.params[0].name, "conv1.weight");
        assert_eq!(m.params[0].shape, vec![64, 3, 7, 7]);
        assert_eq!(m.params.last().map(|p| p.name.as_str()), Some("fc.bias"));
        assert_eq!(m.buffers[0].name, "bn1.running_mean");
        assert!(m.tensor("layer2.0.downsample.1.running_var").is_some());
        assert!(m.tensor("layer1.0.downsample.0.weight").is_some() == (depth == Depth::ResNet50));
    }
    assert_eq!(Depth::parse("ResNet-50").ok(), Some(Depth::ResNet50));
    assert!(Depth::parse("vgg16").is_err());
}

/// A 32x32 forward in eval mode uses the running statistics and leaves them unchanged.
#[test]
fn eval_mode_keeps_running_statistics() {
    let mut m = ResNet::<f32>::new(Depth::ResNet18, 10, 3);
    let x = Tensor::from_vec(
        [1, 3, 32, 32],
        gpukit_tensor::random::normal_f32(3 * 1024, 4),
    );
    let before = m.buffers.clone();
    let (logits, tape) = m.forward(&x, Mode::Eval);
    assert!(tape.is_none());
    assert_eq!(logits.len(), 10);
    assert!(logits.iter().all(|v| v.is_finite()));
    assert_eq!(m.buffers, before);
    assert_eq!(m.batches_tracked, 0);
    m.forward(&x, Mode::Train);
    assert_ne!(m.buffers, before);
    assert_eq!(m.batches_tracked, 1);
}

/// SGD with momentum, Nesterov and weight decay, and AdamW, against their formulas over three
/// steps of fresh gradients.
#[test]
fn optimizers_follow_pytorch_rules() {
    let seed = fresh_seed();
    let p0 = normal_f64(5, seed);
    let grads: Vec<Vec<f64>> = (0..3).map(|t| normal_f64(5, seed + 1 + t)).collect();
    let (lr, mom, wd) = (0.1, 0.9, 5e-4);
    let mut p = [p0.clone()];
    let mut opt = CnnOptimizer::new(CnnOptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr,
        momentum: mom,
        nesterov: true,
        weight_decay: wd,
    });
    let (mut want, mut buf) = (p0.clone(), vec![0.0; 5]);
    for (t, g) in grads.iter().enumerate() {
        opt.update(p.iter_mut(), std::slice::from_ref(g));
        for i in 0..5 {
            let d = g[i] + wd * want[i];
            buf[i] = if t == 0 { d } else { mom * buf[i] + d };
            want[i] -= lr * (d + mom * buf[i]);
        }
        for i in 0..5 {
            assert!(
                (p[0][i] - want[i]).abs() < 1e-14,
                "sgd step {t} (seed {seed})"
            );
        }
    }
    let (lr, wd) = (1e-3, 0.01);
    let mut p = [p0.clone()];
    let mut opt = CnnOptimizer::new(CnnOptimizerConfig {
        kind: OptimizerKind::AdamW,
        lr,
        momentum: 0.0,
        nesterov: false,
        weight_decay: wd,
    });
    let (mut want, mut m, mut v) = (p0, vec![0.0; 5], vec![0.0; 5]);
    for (t, g) in grads.iter().enumerate() {
        opt.update(p.iter_mut(), std::slice::from_ref(g));
        let step = (t + 1) as i32;
        for i in 0..5 {
            want[i] *= 1.0 - lr * wd;
            m[i] = 0.9 * m[i] + 0.1 * g[i];
            v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
            let mh = m[i] / (1.0 - 0.9f64.powi(step));
            let vh = v[i] / (1.0 - 0.999f64.powi(step));
            want[i] -= lr * mh / (vh.sqrt() + 1e-8);
        }
        for i in 0..5 {
            assert!(
                (p[0][i] - want[i]).abs() < 1e-12,
                "adamw step {t} (seed {seed})"
            );
        }
    }
    let bad = CnnOptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 0.1,
        momentum: 0.0,
        nesterov: true,
        weight_decay: 0.0,
    };
    assert!(bad.check().is_err());
}
