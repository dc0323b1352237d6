//! The loop: it learns, it resumes bit for bit, accumulation equals a larger batch, and it
//! refuses what cannot train.

use super::*;
use crate::checkpoint::{self, Meta};
use crate::data::{classification_preset, regression_preset};
use crate::optim::OptimizerKind;
use gpukit_tensor::random::{fresh_seed, normal_f32};

fn config(widths: &[usize], loss: LossKind, kind: OptimizerKind, lr: f64) -> TrainConfig {
    TrainConfig {
        widths: widths.to_vec(),
        loss,
        optimizer: OptimizerConfig {
            kind,
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        batch_size: 32,
        epochs: 3,
        seed: 7,
        shuffle: true,
        accumulate: 1,
        max_steps: None,
        checkpoint_activations: false,
    }
}

/// y = a learnable function of x (a fixed linear map), so a working loop must cut the loss.
fn learnable(samples: usize, seed: u64) -> Dataset {
    let x = normal_f32(samples * 4, seed);
    let y = x
        .chunks(4)
        .map(|r| 0.5 * r[0] - r[1] + 0.25 * r[2] * r[3])
        .collect();
    Dataset {
        features: 4,
        x,
        y: Targets::Values { width: 1, data: y },
    }
}

/// A fresh model of `seed` and optimizer trained from the start.
fn attempt(
    cfg: &TrainConfig,
    data: &Dataset,
    seed: u64,
) -> Result<(Mlp<f32>, Optimizer<f32>, RunOutcome)> {
    let mut model = Mlp::new(&cfg.widths, seed);
    let mut opt = Optimizer::new(cfg.optimizer);
    let out = train_cpu(
        cfg,
        &mut model,
        &mut opt,
        Position::default(),
        data,
        None,
        &mut |_| {},
    )?;
    Ok((model, opt, out))
}

fn run(cfg: &TrainConfig, data: &Dataset, seed: u64) -> (Mlp<f32>, Optimizer<f32>, RunOutcome) {
    attempt(cfg, data, seed).unwrap()
}

#[test]
fn training_cuts_the_loss_of_a_learnable_target() {
    let seed = fresh_seed();
    let data = learnable(512, seed);
    let mut cfg = config(&[4, 32, 1], LossKind::Mse, OptimizerKind::Adam, 1e-2);
    cfg.epochs = 20;
    let (_, opt, out) = run(&cfg, &data, seed);
    let (first, last) = (out.epochs[0].train_loss, out.epochs[19].train_loss);
    assert!(last < 0.2 * first, "seed {seed}: {first} -> {last}");
    assert_eq!(opt.step, 20 * 16);
    assert_eq!(out.step_losses.len(), 320);
    assert!(out.epochs.iter().all(|e| e.complete && e.batches == 16));
}

#[test]
fn the_tutorial_classification_preset_learns_and_reports_accuracy() {
    let data = classification_preset(100, 3, 1);
    let mut cfg = config(&[3, 10, 2], LossKind::CrossEntropy, OptimizerKind::Sgd, 0.1);
    cfg.batch_size = 100;
    cfg.epochs = 200;
    let (train, eval) = data.split(0.2).unwrap();
    let mut model = Mlp::new(&cfg.widths, 3);
    let mut opt = Optimizer::new(cfg.optimizer);
    let out = train_cpu(
        &cfg,
        &mut model,
        &mut opt,
        Position::default(),
        &train,
        eval.as_ref(),
        &mut |_| {},
    )
    .unwrap();
    let last = out.epochs.last().unwrap();
    assert!(last.train_accuracy.is_some() && last.eval_accuracy.is_some());
    assert!(last.eval_loss.is_some());
    assert!(last.train_loss < out.epochs[0].train_loss, "{last:?}");
    assert_eq!(opt.step, 200);
}

/// N updates, a checkpoint, then M more from it: the same weights, optimizer state and
/// losses as N + M updates in one run, bit for bit, for every optimizer, across an epoch
/// boundary and inside an epoch.
#[test]
fn a_resumed_run_equals_the_uninterrupted_one_bit_for_bit() {
    let seed = fresh_seed();
    let data = regression_preset(200, 6, seed);
    for kind in [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
    ] {
        let mut cfg = config(&[6, 16, 1], LossKind::Mse, kind, 1e-2);
        cfg.optimizer.weight_decay = 0.01;
        if kind == OptimizerKind::Sgd {
            cfg.optimizer.momentum = 0.9;
        }
        cfg.batch_size = 16; // 13 batches an epoch
        cfg.epochs = 3;
        let (whole_model, whole_opt, whole) = run(&cfg, &data, seed);
        for split_at in [5u64, 13, 20] {
            let mut first = cfg.clone();
            first.max_steps = Some(split_at);
            let (m1, o1, out1) = run(&first, &data, seed);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("ck.safetensors");
            let meta = Meta {
                format: 0,
                widths: cfg.widths.clone(),
                optimizer: cfg.optimizer,
                position: out1.position,
                seed: cfg.seed,
                scaler: None,
            };
            checkpoint::save(&path, &m1, &o1, &meta).unwrap();
            let (mut m2, mut o2, meta2) = checkpoint::load(&path, &cfg.widths).unwrap();
            assert_eq!(meta2.position, out1.position);
            let out2 = train_cpu(
                &cfg,
                &mut m2,
                &mut o2,
                meta2.position,
                &data,
                None,
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(m2, whole_model, "{kind:?} split at {split_at}");
            assert_eq!(o2, whole_opt, "{kind:?} split at {split_at}");
            let joined: Vec<f64> = out1
                .step_losses
                .iter()
                .chain(&out2.step_losses)
                .copied()
                .collect();
            assert_eq!(joined, whole.step_losses, "{kind:?} split at {split_at}");
        }
    }
}

/// K batches of b accumulated (each loss divided by K) against one batch of K*b, without
/// shuffling, plain SGD: the same update up to float rounding of the sums (f32, sums of 64
/// terms of order one: 1e-5 is ~100 ulps of slack).
#[test]
fn accumulating_k_batches_equals_one_batch_k_times_larger() {
    let seed = fresh_seed();
    let data = regression_preset(256, 5, seed);
    let mut big = config(&[5, 8, 1], LossKind::Mse, OptimizerKind::Sgd, 0.05);
    big.shuffle = false;
    big.batch_size = 64;
    big.epochs = 2;
    let mut small = big.clone();
    small.batch_size = 16;
    small.accumulate = 4;
    let (mb, ob, _) = run(&big, &data, seed);
    let (ms, os, _) = run(&small, &data, seed);
    assert_eq!(ob.step, os.step);
    for (a, b) in mb.layers.iter().zip(&ms.layers) {
        for (x, y) in a
            .weight
            .iter()
            .chain(&a.bias)
            .zip(b.weight.iter().chain(&b.bias))
        {
            assert!((x - y).abs() < 1e-5, "seed {seed}: {x} vs {y}");
        }
    }
}

#[test]
fn a_diverging_run_stops_naming_the_update_and_keeps_the_updates_before_it() {
    let data = learnable(64, 1);
    let mut cfg = config(&[4, 16, 1], LossKind::Mse, OptimizerKind::Sgd, 1e30);
    cfg.epochs = 5;
    let (_, _, out) = attempt(&cfg, &data, 1).unwrap();
    let why = out.diverged.clone().expect("a diverged run says so");
    assert!(
        why.contains("diverged") && why.contains("at update"),
        "{why}"
    );
    // the updates before the divergence are kept, each finite, and the run stopped there
    assert!(out.step_losses.iter().all(|l| l.is_finite()), "{out:?}");
    let at: u64 = why
        .split("at update ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(out.step_losses.len() as u64, at - 1);
    assert!(out.position.step < cfg.total_updates(64, 1).unwrap());
}

#[test]
fn settings_and_data_that_cannot_train_are_refused_naming_the_flag() {
    let data = learnable(64, 1);
    let ok = config(&[4, 8, 1], LossKind::Mse, OptimizerKind::Sgd, 0.1);
    let cases: Vec<(TrainConfig, &str)> = vec![
        (
            TrainConfig {
                batch_size: 0,
                ..ok.clone()
            },
            "--batch-size",
        ),
        (
            TrainConfig {
                epochs: 0,
                ..ok.clone()
            },
            "--epochs",
        ),
        (
            TrainConfig {
                accumulate: 0,
                ..ok.clone()
            },
            "--accumulate",
        ),
        (
            TrainConfig {
                max_steps: Some(0),
                ..ok.clone()
            },
            "--steps",
        ),
        (
            TrainConfig {
                widths: vec![5, 8, 1],
                ..ok.clone()
            },
            "4 features",
        ),
        (
            TrainConfig {
                widths: vec![4, 8, 2],
                ..ok.clone()
            },
            "1 target value",
        ),
        (
            TrainConfig {
                loss: LossKind::CrossEntropy,
                ..ok.clone()
            },
            "use --loss mse",
        ),
    ];
    for (cfg, fragment) in cases {
        let e = attempt(&cfg, &data, 1).unwrap_err();
        assert_eq!(
            gpukit_types::HasKind::kind(&e),
            gpukit_types::ErrorKind::BadInput
        );
        assert!(e.to_string().contains(fragment), "{fragment}: {e}");
    }
    let classes = classification_preset(50, 3, 1);
    let cfg = TrainConfig {
        widths: vec![3, 4, 1],
        ..config(&[3, 4, 1], LossKind::CrossEntropy, OptimizerKind::Sgd, 0.1)
    };
    let e = cfg.check_data(&classes).unwrap_err().to_string();
    assert!(e.contains("2 classes"), "{e}");
}

/// The engine's memory figures come from its buffers: the activations grow with the batch, the
/// optimizer state is one buffer a parameter for SGD with momentum and two for Adam.
#[test]
fn memory_use_follows_the_batch_and_the_optimizer() {
    let data = learnable(256, 3);
    let mut small = config(&[4, 32, 1], LossKind::Mse, OptimizerKind::Adam, 1e-3);
    small.batch_size = 16;
    small.epochs = 1;
    let mut big = small.clone();
    big.batch_size = 64;
    let (model, _, a) = run(&small, &data, 3);
    let (_, _, b) = run(&big, &data, 3);
    let params = model.parameters() * 4;
    assert_eq!(a.memory.weights, params);
    assert_eq!(a.memory.gradients, params);
    assert_eq!(a.memory.optimizer_state, 2 * params);
    // outputs kept: the input (4), hidden (32) and output (1) per sample
    assert_eq!(a.memory.activations, 16 * (4 + 32 + 1) * 4);
    assert_eq!(b.memory.activations, 4 * a.memory.activations);
    let mut sgd = small.clone();
    sgd.optimizer = OptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 0.0,
    };
    let (_, _, c) = run(&sgd, &data, 3);
    assert_eq!(c.memory.optimizer_state, params);
}

/// With checkpointing the losses and weights are the same bit for bit, and a deep model
/// holds fewer activation bytes.
#[test]
fn checkpointed_training_is_the_same_training_in_less_memory() {
    let data = learnable(128, 5);
    let mut plain = config(
        &[4, 64, 64, 64, 64, 64, 64, 64, 1],
        LossKind::Mse,
        OptimizerKind::Adam,
        1e-3,
    );
    plain.epochs = 2;
    let mut checkpointed = plain.clone();
    checkpointed.checkpoint_activations = true;
    let (m1, _, a) = run(&plain, &data, 5);
    let (m2, _, b) = run(&checkpointed, &data, 5);
    assert_eq!(m1, m2);
    assert_eq!(a.step_losses, b.step_losses);
    assert_eq!(a.memory.activations_all_kept, b.memory.activations_all_kept);
    assert_eq!(a.memory.activations, a.memory.activations_all_kept);
    assert!(
        b.memory.activations < a.memory.activations,
        "{} vs {}",
        b.memory.activations,
        a.memory.activations
    );
}
