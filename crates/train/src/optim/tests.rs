//! The optimizers against their textbook formulas in float64 (Adam with bias-corrected
//! moments m_hat / (sqrt(v_hat) + eps), written independently of the PyTorch arrangement the
//! engine uses), over several steps with fresh random gradients.

use super::*;
use crate::model::{Grads, Mlp};
use gpukit_tensor::random::{fresh_seed, normal_f64};

fn flat(m: &Mlp<f64>) -> Vec<f64> {
    m.layers
        .iter()
        .flat_map(|l| l.weight.iter().chain(&l.bias).copied())
        .collect()
}

fn grads_for(model: &Mlp<f64>, seed: u64) -> (Grads<f64>, Vec<f64>) {
    let mut g = Grads::zeros(model);
    let mut k = 0;
    for (w, b) in g.weight.iter_mut().zip(g.bias.iter_mut()) {
        let nw = normal_f64(w.len(), seed + k);
        w.copy_from_slice(&nw);
        let nb = normal_f64(b.len(), seed + k + 1);
        b.copy_from_slice(&nb);
        k += 2;
    }
    let flat = g
        .weight
        .iter()
        .zip(&g.bias)
        .flat_map(|(w, b)| w.iter().chain(b).copied())
        .collect();
    (g, flat)
}

#[test]
fn every_optimizer_follows_its_formula() {
    let seed = fresh_seed();
    let configs = [
        (OptimizerKind::Sgd, 0.1, 0.0, 0.0),
        (OptimizerKind::Sgd, 0.05, 0.9, 0.01),
        (OptimizerKind::Adam, 1e-3, 0.0, 0.0),
        (OptimizerKind::Adam, 1e-2, 0.0, 0.1),
        (OptimizerKind::AdamW, 1e-2, 0.0, 0.1),
    ];
    for (kind, lr, momentum, weight_decay) in configs {
        let config = OptimizerConfig {
            kind,
            lr,
            momentum,
            weight_decay,
        };
        config.check().unwrap();
        let mut model = Mlp::<f64>::new(&[3, 4, 2], seed);
        let mut opt = Optimizer::new(config);
        let mut p = flat(&model);
        let (mut buf, mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()], vec![0.0; p.len()]);
        for step in 1..=5u64 {
            let (g, gf) = grads_for(&model, seed ^ (step * 1000));
            opt.update(&mut model, &g);
            for i in 0..p.len() {
                match kind {
                    OptimizerKind::Sgd => {
                        let d = gf[i] + weight_decay * p[i];
                        buf[i] = if step == 1 { d } else { momentum * buf[i] + d };
                        p[i] -= lr * if momentum > 0.0 { buf[i] } else { d };
                    }
                    OptimizerKind::Adam | OptimizerKind::AdamW => {
                        let d = if kind == OptimizerKind::Adam {
                            gf[i] + weight_decay * p[i]
                        } else {
                            p[i] -= lr * weight_decay * p[i];
                            gf[i]
                        };
                        m[i] = BETA1 * m[i] + (1.0 - BETA1) * d;
                        v[i] = BETA2 * v[i] + (1.0 - BETA2) * d * d;
                        let mh = m[i] / (1.0 - BETA1.powi(step as i32));
                        let vh = v[i] / (1.0 - BETA2.powi(step as i32));
                        p[i] -= lr * mh / (vh.sqrt() + EPS);
                    }
                }
            }
            for (a, b) in flat(&model).iter().zip(&p) {
                assert!(
                    (a - b).abs() < 1e-12,
                    "seed {seed} {kind:?} step {step}: {a} vs {b}"
                );
            }
        }
        assert_eq!(opt.step, 5);
    }
}

#[test]
fn hyperparameters_that_cannot_work_are_refused_naming_the_flag() {
    let ok = OptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 0.01,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    for (bad, flag) in [
        (OptimizerConfig { lr: 0.0, ..ok }, "--lr"),
        (OptimizerConfig { lr: -1.0, ..ok }, "--lr"),
        (OptimizerConfig { lr: f64::NAN, ..ok }, "--lr"),
        (
            OptimizerConfig {
                lr: f64::INFINITY,
                ..ok
            },
            "--lr",
        ),
        (
            OptimizerConfig {
                momentum: 1.0,
                ..ok
            },
            "--momentum",
        ),
        (
            OptimizerConfig {
                momentum: -0.1,
                ..ok
            },
            "--momentum",
        ),
        (
            OptimizerConfig {
                kind: OptimizerKind::Adam,
                momentum: 0.9,
                ..ok
            },
            "--momentum",
        ),
        (
            OptimizerConfig {
                weight_decay: -1.0,
                ..ok
            },
            "--weight-decay",
        ),
        (
            OptimizerConfig {
                weight_decay: f64::NAN,
                ..ok
            },
            "--weight-decay",
        ),
    ] {
        let e = bad.check().unwrap_err().to_string();
        assert!(e.contains(flag), "{bad:?}: {e}");
    }
}
