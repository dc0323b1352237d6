use super::*;
use crate::data::regression_preset;
use crate::model::Mlp;
use crate::optim::{Optimizer, OptimizerConfig, OptimizerKind};
use crate::run::{train_cpu, TrainConfig};

fn cfg(batch: usize, accumulate: usize, max_steps: Option<u64>) -> TrainConfig {
    TrainConfig {
        widths: vec![4, 8, 1],
        loss: crate::loss::LossKind::Mse,
        optimizer: OptimizerConfig {
            kind: OptimizerKind::Sgd,
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        batch_size: batch,
        epochs: 3,
        seed: 1,
        shuffle: true,
        accumulate,
        max_steps,
        checkpoint_activations: false,
    }
}

/// The GPU loop's batches make the same updates, epoch by epoch, as the CPU loop: the count of
/// updates per epoch and where a run stopped by --steps resumes.
#[test]
fn the_gpu_loop_takes_the_cpu_loops_batches_and_updates() {
    for (n, batch, accumulate, max_steps) in [
        (100, 10, 1, None),
        (101, 10, 3, None),
        (64, 64, 1, None),
        (7, 3, 2, Some(4)),
        (50, 8, 4, Some(5)),
    ] {
        let c = cfg(batch, accumulate, max_steps);
        let data = regression_preset(n, 4, 3);
        let mut model = Mlp::new(&c.widths, 1);
        let mut opt = Optimizer::new(c.optimizer);
        let cpu = train_cpu(
            &c,
            &mut model,
            &mut opt,
            Position::default(),
            &data,
            None,
            &mut |_| {},
        )
        .unwrap();
        let mut pos = Position::default();
        let mut updates = Vec::new();
        while pos.epoch < c.epochs && c.max_steps.is_none_or(|m| pos.step < m) {
            let bs = epoch_batches(&c, n, &pos, Shard { rank: 0, world: 1 });
            let steps = bs.iter().filter(|b| b.update).count() as u64;
            assert!(bs.iter().all(|b| b.rows >= 1 && b.first_row + b.rows <= n));
            // every update's first batch overwrites the gradients
            let mut expect_first = true;
            for b in &bs {
                assert_eq!(
                    b.first_micro, expect_first,
                    "{n} {batch} {accumulate}: {b:?}"
                );
                expect_first = b.update;
            }
            updates.push(steps);
            pos.step += steps;
            pos.batch = bs.last().map_or(pos.batch, |b| b.index as u64 + 1);
            if pos.batch as usize == n.div_ceil(batch) {
                pos.epoch += 1;
                pos.batch = 0;
            }
        }
        let cpu_updates: Vec<u64> = cpu.epochs.iter().map(|e| e.steps).collect();
        assert_eq!(
            updates, cpu_updates,
            "{n} {batch} {accumulate} {max_steps:?}"
        );
        assert_eq!(pos, cpu.position);
    }
}

/// The flat layout keeps every tensor 128-element aligned, packs and unpacks a model exactly.
#[test]
fn the_flat_layout_is_aligned_and_round_trips() {
    let widths = [5, 33, 7, 1];
    let layout = super::super::plan::Layout::new(&widths);
    let model = Mlp::<f32>::new(&widths, 9);
    let flat = layout.pack(&model);
    assert_eq!(flat.len(), layout.total);
    for (wo, bo) in &layout.offsets {
        assert_eq!((wo % 128, bo % 128), (0, 0));
    }
    let back = layout.unpack(&flat);
    let named: Vec<Vec<f32>> = model
        .named()
        .into_iter()
        .map(|(_, _, v)| v.to_vec())
        .collect();
    assert_eq!(back, named);
}
