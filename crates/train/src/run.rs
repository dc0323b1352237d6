//! The training loop on the CPU: batches in the epoch's seeded order, forward, loss, backward,
//! an optimizer update every `accumulate` batches (and at each epoch's last batch), evaluation
//! of the held-out part without gradients after each epoch. It starts from any [`Position`], so
//! a run resumed from a checkpoint takes exactly the batches and updates the uninterrupted run
//! would have.

use crate::checkpoint::Position;
use crate::data::{batch_order, Dataset, Targets};
use crate::error::{Error, Result};
use crate::loss::{loss_and_grad, BatchTargets, LossKind};
use crate::model::{Activations, Backward, Grads, Mlp};
use crate::optim::{Optimizer, OptimizerConfig};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What a run does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub widths: Vec<usize>,
    pub loss: LossKind,
    pub optimizer: OptimizerConfig,
    pub batch_size: usize,
    pub epochs: u64,
    /// Orders the batches (each epoch's order is drawn from it and the epoch's number).
    pub seed: u64,
    pub shuffle: bool,
    /// Batches whose gradients are summed (each loss divided by this) before one update.
    pub accumulate: usize,
    /// Stop after this many updates in all, counted from the run's very start (None: train
    /// every epoch).
    pub max_steps: Option<u64>,
    /// Keep only some layer outputs in forward and recompute the others in backward.
    #[serde(default)]
    pub checkpoint_activations: bool,
}

impl TrainConfig {
    /// Layers a checkpointed segment spans: about the square root of the layer count, which
    /// keeps the fewest outputs (layers / segment kept + one segment recomputed at a time).
    pub fn segment(&self) -> usize {
        let layers = self.widths.len().saturating_sub(1).max(1);
        (layers as f64).sqrt().ceil() as usize
    }
}

impl TrainConfig {
    /// Refuses settings that cannot train, naming the flag.
    pub fn check(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::Setting("--batch-size 0: must be at least 1".into()));
        }
        if self.epochs == 0 {
            return Err(Error::Setting("--epochs 0: must be at least 1".into()));
        }
        if self.accumulate == 0 {
            return Err(Error::Setting("--accumulate 0: must be at least 1".into()));
        }
        if self.max_steps == Some(0) {
            return Err(Error::Setting("--steps 0: must be at least 1".into()));
        }
        self.optimizer.check()
    }

    /// Checks that the data fits the model: as many inputs as features, as many outputs as
    /// target values (MSE) or classes (cross-entropy), and targets of the loss's kind.
    pub fn check_data(&self, data: &Dataset) -> Result<()> {
        let (first, last) = (self.widths[0], self.widths[self.widths.len() - 1]);
        if first != data.features {
            return Err(Error::Setting(format!(
                "--layers starts with {first} inputs, but the data has {} features",
                data.features
            )));
        }
        match (&data.y, self.loss) {
            (Targets::Values { width, .. }, LossKind::Mse) if *width != last => {
                Err(Error::Setting(format!(
                    "--layers ends with {last} outputs, but the data has {width} target value(s) a sample"
                )))
            }
            (Targets::Classes { classes, .. }, LossKind::CrossEntropy) if *classes > last => {
                Err(Error::Setting(format!(
                    "--layers ends with {last} outputs, but the data has {classes} classes (one output a class)"
                )))
            }
            (Targets::Values { .. }, LossKind::Mse)
            | (Targets::Classes { .. }, LossKind::CrossEntropy) => Ok(()),
            (_, loss) => Err(Error::Setting(format!(
                "--loss {}: the data's targets are {}",
                loss.name(),
                match data.y {
                    Targets::Values { .. } => "values (use --loss mse)",
                    Targets::Classes { .. } => "classes (use --loss cross-entropy)",
                }
            ))),
        }
    }
}

/// One epoch's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    pub epoch: u64,
    /// Whether every batch of the epoch ran (false when --steps stopped the run inside it, or
    /// it resumed inside it).
    pub complete: bool,
    pub batches: u64,
    pub steps: u64,
    /// Mean of the epoch's batch losses.
    pub train_loss: f64,
    pub train_accuracy: Option<f64>,
    pub eval_loss: Option<f64>,
    pub eval_accuracy: Option<f64>,
    /// Training time of the epoch (evaluation not included).
    pub seconds: f64,
    pub samples_per_s: f64,
}

/// Host memory the engine held during a run, read from its buffers' capacities at the end
/// (they only grow, so these are the peaks), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MemoryUse {
    pub weights: usize,
    pub gradients: usize,
    pub optimizer_state: usize,
    /// Layer outputs kept for backward, for the largest batch.
    pub activations: usize,
    /// Backward's running gradients, the loss gradient and the batch being assembled.
    pub workspace: usize,
    /// What every layer output of the largest batch takes when all are kept (the activations
    /// without checkpointing).
    #[serde(default)]
    pub activations_all_kept: usize,
    /// The data set where the engine holds it in its own memory (on the GPU when resident;
    /// 0 on the CPU, which reads the caller's).
    #[serde(default)]
    pub data: usize,
    /// The GPU memory pool's peak of live bytes over the run (None on the CPU).
    #[serde(default)]
    pub pool_peak: Option<u64>,
}

impl MemoryUse {
    pub fn total(&self) -> usize {
        self.weights + self.gradients + self.optimizer_state + self.activations + self.workspace
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    pub epochs: Vec<EpochStats>,
    /// The loss of each update (the mean of its batches' losses), in order.
    pub step_losses: Vec<f64>,
    /// Where the run stopped: a checkpoint saved now resumes from here.
    pub position: Position,
    /// Training time in all (evaluation not included).
    pub seconds: f64,
    pub memory: MemoryUse,
    /// Why the run stopped early with a loss that is not finite (the update, epoch and batch
    /// where it happened, and what to change); the updates before it are in `step_losses`.
    #[serde(default)]
    pub diverged: Option<String>,
}

/// A profiler's op around CPU work on an MLP of `widths`: `passes` products per layer
/// (forward 1, backward 2) on `rows` rows; rows 0 is the optimizer's pass over the parameters.
/// Nothing is built unless a profiler records on this thread.
fn cpu_op(
    name: &str,
    widths: &[usize],
    rows: usize,
    passes: f64,
) -> Option<gpukit_cuda::profiler::OpGuard> {
    gpukit_cuda::profiler::op(|| {
        let params: usize = widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum();
        let acts: usize = widths.iter().sum::<usize>() * rows;
        let (flops, bytes) = if rows == 0 {
            (4.0 * params as f64, 16.0 * params as f64)
        } else {
            (
                passes * 2.0 * (rows * params) as f64,
                4.0 * passes * (params + acts) as f64,
            )
        };
        gpukit_cuda::profiler::OpInfo {
            name: name.into(),
            layer: Some("model".into()),
            detail: if rows == 0 {
                format!("{params} parameters f32")
            } else {
                format!("{rows} rows, widths {widths:?} f32")
            },
            library: "gpukit CPU".into(),
            flops,
            bytes,
            dtype: "f32".into(),
        }
    })
}

/// Trains `model` with `opt` from `pos` on `train`, evaluating on `eval` after each epoch;
/// `progress` hears about each finished epoch. A loss that is not finite stops the run as
/// failed, naming the update where it happened.
#[allow(clippy::too_many_arguments)]
pub fn train_cpu(
    cfg: &TrainConfig,
    model: &mut Mlp<f32>,
    opt: &mut Optimizer<f32>,
    mut pos: Position,
    train: &Dataset,
    eval: Option<&Dataset>,
    progress: &mut dyn FnMut(&EpochStats),
) -> Result<RunOutcome> {
    cfg.check()?;
    cfg.check_data(train)?;
    let n = train.len();
    let width = outputs(model);
    let per_epoch = n.div_ceil(cfg.batch_size) as u64;
    let scale = 1.0 / cfg.accumulate as f64;
    let mut grads = Grads::zeros(model);
    let (mut acts, mut scratch, mut dy) = (Activations::default(), Backward::default(), Vec::new());
    let mut out = RunOutcome {
        epochs: Vec::new(),
        step_losses: Vec::new(),
        position: pos,
        seconds: 0.0,
        memory: MemoryUse::default(),
        diverged: None,
    };
    let (mut batch_bytes, mut largest_batch) = (0usize, 0usize);
    let at_limit = |p: &Position| cfg.max_steps.is_some_and(|m| p.step >= m);
    'epochs: while pos.epoch < cfg.epochs && !at_limit(&pos) {
        let order = batch_order(n, pos.epoch, cfg.seed, cfg.shuffle);
        let started = Instant::now();
        let first_batch = pos.batch;
        let (mut loss_sum, mut batches, mut correct, mut seen) = (0.0, 0u64, 0usize, 0usize);
        let (mut micro, mut micro_loss, mut steps) = (0usize, 0.0, 0u64);
        while pos.batch < per_epoch && !at_limit(&pos) {
            let lo = pos.batch as usize * cfg.batch_size;
            let idx = &order[lo..(lo + cfg.batch_size).min(n)];
            let (x, y) = train.gather(idx);
            batch_bytes = batch_bytes.max(x.capacity() * 4 + targets_bytes(&y));
            largest_batch = largest_batch.max(idx.len());
            gpukit_cuda::profiler::step((pos.epoch * per_epoch + pos.batch) as usize);
            let forward_op = cpu_op("forward", &cfg.widths, idx.len(), 1.0);
            if cfg.checkpoint_activations {
                model.forward_checkpointed(&x, idx.len(), cfg.segment(), &mut acts);
            } else {
                model.forward(&x, idx.len(), &mut acts);
            }
            drop(forward_op);
            let targets = batch_targets(&y);
            let (loss, right) = loss_and_grad(acts.output(), width, targets, scale, &mut dy);
            if !loss.is_finite() {
                out.diverged = Some(diverged(loss, &pos, pos.batch, ""));
                break 'epochs;
            }
            {
                let _op = cpu_op("backward", &cfg.widths, idx.len(), 2.0);
                model.backward(&mut acts, &dy, &mut grads, &mut scratch);
            }
            loss_sum += loss;
            micro_loss += loss;
            batches += 1;
            micro += 1;
            seen += idx.len();
            correct += right.unwrap_or(0);
            pos.batch += 1;
            if micro == cfg.accumulate || pos.batch == per_epoch {
                let update_op = cpu_op("optimizer step", &cfg.widths, 0, 0.0);
                opt.update(model, &grads);
                drop(update_op);
                grads.clear();
                out.step_losses.push(micro_loss / micro as f64);
                pos.step += 1;
                steps += 1;
                micro = 0;
                micro_loss = 0.0;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        out.seconds += seconds;
        let complete = first_batch == 0 && pos.batch == per_epoch;
        let (eval_loss, eval_accuracy) = match eval {
            Some(e) if pos.batch == per_epoch => {
                let (l, a) = evaluate(model, e, cfg.batch_size);
                (Some(l), a)
            }
            _ => (None, None),
        };
        let stats = EpochStats {
            epoch: pos.epoch + 1,
            complete,
            batches,
            steps,
            train_loss: loss_sum / batches.max(1) as f64,
            train_accuracy: matches!(train.y, Targets::Classes { .. })
                .then(|| correct as f64 / seen.max(1) as f64),
            eval_loss,
            eval_accuracy,
            seconds,
            samples_per_s: seen as f64 / seconds.max(1e-9),
        };
        progress(&stats);
        out.epochs.push(stats);
        if pos.batch == per_epoch {
            pos.epoch += 1;
            pos.batch = 0;
        }
    }
    out.position = pos;
    let f32s = |n: usize| n * std::mem::size_of::<f32>();
    out.memory = MemoryUse {
        weights: f32s(model.parameters()),
        gradients: f32s(
            grads
                .weight
                .iter()
                .chain(&grads.bias)
                .map(Vec::capacity)
                .sum(),
        ),
        optimizer_state: f32s(opt.m.iter().chain(&opt.v).map(Vec::capacity).sum()),
        activations: acts.bytes(),
        workspace: scratch.bytes() + f32s(dy.capacity()) + batch_bytes,
        activations_all_kept: f32s(largest_batch * cfg.widths.iter().sum::<usize>()),
        data: 0,
        pool_peak: None,
    };
    Ok(out)
}

/// Why a run stopped: "the loss became NaN at update 5 (epoch 1, batch 5): the run diverged;
/// lower --lr", with `advice` after it. `batch` is 0-based within the epoch.
pub fn diverged(loss: f64, pos: &Position, batch: u64, advice: &str) -> String {
    format!(
        "the loss became {loss} at update {} (epoch {}, batch {}): the run diverged; lower \
         --lr{advice}",
        pos.step + 1,
        pos.epoch + 1,
        batch + 1
    )
}

/// Bytes a batch's targets hold (f32 values or u32 classes: four bytes each).
fn targets_bytes(y: &Targets) -> usize {
    4 * match y {
        Targets::Values { data, .. } => data.capacity(),
        Targets::Classes { data, .. } => data.capacity(),
    }
}

/// Mean loss (weighted by samples) and, for classes, accuracy of `model` on `data`, in batches
/// of `batch_size`, without gradients.
pub fn evaluate(model: &Mlp<f32>, data: &Dataset, batch_size: usize) -> (f64, Option<f64>) {
    let n = data.len();
    let width = outputs(model);
    let (mut acts, mut dy) = (Activations::default(), Vec::new());
    let (mut total, mut correct) = (0.0, 0usize);
    let idx: Vec<usize> = (0..n).collect();
    for chunk in idx.chunks(batch_size.max(1)) {
        let (x, y) = data.gather(chunk);
        model.forward(&x, chunk.len(), &mut acts);
        let (loss, right) = loss_and_grad(acts.output(), width, batch_targets(&y), 1.0, &mut dy);
        total += loss * chunk.len() as f64;
        correct += right.unwrap_or(0);
    }
    let classes = matches!(data.y, Targets::Classes { .. });
    (
        total / n.max(1) as f64,
        classes.then(|| correct as f64 / n.max(1) as f64),
    )
}

fn batch_targets(y: &Targets) -> BatchTargets<'_, f32> {
    match y {
        Targets::Values { data, .. } => BatchTargets::Values(data),
        Targets::Classes { data, .. } => BatchTargets::Classes(data),
    }
}

/// Values per sample in the model's output: its last width (cross-entropy may have more
/// outputs than the data has classes).
fn outputs(model: &Mlp<f32>) -> usize {
    model.layers.last().map_or(0, |l| l.outputs)
}

#[cfg(test)]
mod tests;
