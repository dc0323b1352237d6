//! `gpukit train`: a classification run resumed from a checkpoint (accuracy columns, the
//! resumed line, a partial first epoch) and a regression run (no accuracy columns).

use super::{assert_drawn, terminal};
use crate::render::train_sections;
use gpukit_bench::workload::train::{Preset, TrainReport};
use gpukit_train::checkpoint::Position;
use gpukit_train::loss::LossKind;
use gpukit_train::optim::{OptimizerConfig, OptimizerKind};
use gpukit_train::run::{EpochStats, TrainConfig};

fn epoch(epoch: u64, complete: bool, loss: f64, accuracy: Option<f64>) -> EpochStats {
    EpochStats {
        epoch,
        complete,
        batches: if complete { 4 } else { 2 },
        steps: if complete { 4 } else { 2 },
        train_loss: loss,
        train_accuracy: accuracy,
        eval_loss: Some(loss * 1.1),
        eval_accuracy: accuracy.map(|a| a - 0.05),
        seconds: 0.00125,
        samples_per_s: 102_400.0,
    }
}

pub(super) fn report(loss: LossKind) -> TrainReport {
    let classes = loss == LossKind::CrossEntropy;
    let accuracy = |a: f64| classes.then_some(a);
    TrainReport {
        preset: Some(if classes {
            Preset::SeedClassification
        } else {
            Preset::SeedRegression
        }),
        device: "cpu".into(),
        precision: "fp32".into(),
        config: TrainConfig {
            widths: vec![3, 10, 2],
            loss,
            optimizer: OptimizerConfig {
                kind: if classes {
                    OptimizerKind::Sgd
                } else {
                    OptimizerKind::Adam
                },
                lr: 0.01,
                momentum: if classes { 0.9 } else { 0.0 },
                weight_decay: 0.0,
            },
            batch_size: 20,
            epochs: 3,
            seed: 4,
            shuffle: true,
            accumulate: if classes { 2 } else { 1 },
            max_steps: None,
            checkpoint_activations: false,
        },
        parameters: 62,
        data: "generated: x ~ N(0,1), labels 0/1, seed 4".into(),
        samples: 80,
        features: 3,
        eval_samples: 20,
        initial_weights: "from the checkpoint".into(),
        resumed_from: classes.then(|| "ck.safetensors".into()),
        resumed_at: classes.then_some(Position {
            step: 6,
            epoch: 1,
            batch: 2,
        }),
        epochs: vec![
            epoch(2, !classes, 0.69, accuracy(0.55)),
            epoch(3, true, 0.61, accuracy(0.7)),
        ],
        step_losses: vec![0.7; 6],
        diverged: None,
        final_position: Position {
            step: 12,
            epoch: 3,
            batch: 0,
        },
        seconds: 0.0025,
        memory: gpukit_train::run::MemoryUse {
            weights: 248,
            gradients: 248,
            optimizer_state: 248,
            activations: 1920,
            workspace: 2048,
            activations_all_kept: 1920,
            data: 0,
            pool_peak: None,
        },
        saved_checkpoint: Some("ck2.safetensors".into()),
        saved_losses: Some("losses.csv".into()),
        pytorch: None,
        gpu: None,
        data_parallel: None,
        recording: None,
    }
}

#[test]
fn train_resumed_classification() {
    let sections = train_sections(&report(LossKind::CrossEntropy));
    assert_drawn("train_classification", &sections);
}

#[test]
fn train_regression_has_no_accuracy_columns() {
    let text = terminal(&train_sections(&report(LossKind::Mse)));
    assert!(!text.contains("acc."), "{text}");
    assert!(!text.contains("Resumed"), "{text}");
    assert!(text.contains("adam, lr 0.01, betas 0.9/0.999"), "{text}");
}
