//! The training loop of a convolutional network, on the CPU ([`CpuResNet`]) or the GPU
//! ([`super::gpu::GpuResNet`]) alike: batches of an epoch in a seeded order (whole batches
//! only), one update each, every update's loss, accuracy and time; images per second over the
//! updates after the first (which plans, allocates and warms caches, and is reported apart).
//!
//! To use: a [`Stepper`], the [`Images`], then [`train`] with a [`LoopConfig`].

use super::data::Images;
use super::optim::CnnOptimizer;
use super::resnet::ResNet;
use super::Tensor;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// One micro-batch of a training update of a network: `micro` = (i, k), the update made after
/// micro-batch k - 1 (k = 1: every call is an update). Returns the batch's loss before the
/// update and how many of its images were classified right.
pub trait Stepper {
    /// `fresh` is false when the batch is the one the previous call had (a GPU keeps it).
    fn step(
        &mut self,
        batch: Batch<'_>,
        fresh: bool,
        micro: (usize, usize),
    ) -> Result<(f64, usize)>;

    /// Whether this stepper keeps the whole data set and takes a batch by its images' indices:
    /// the loop then gathers no pixels on the host.
    fn resident(&self) -> bool {
        false
    }
}

/// A batch as the loop hands it over: its images' indices in the data set, their labels, and
/// the images themselves unless the stepper keeps the data set ([`Stepper::resident`]).
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub indices: &'a [usize],
    pub images: Option<&'a Tensor<f32>>,
    pub labels: &'a [u32],
}

impl<'a> Batch<'a> {
    /// A batch of these images and labels, not indexed in a data set.
    pub fn of(images: &'a Tensor<f32>, labels: &'a [u32]) -> Batch<'a> {
        Batch {
            indices: &[],
            images: Some(images),
            labels,
        }
    }
}

/// A batch the loop holds: [`Batch`]'s parts, owned.
struct Held {
    indices: Vec<usize>,
    images: Option<Tensor<f32>>,
    labels: Vec<u32>,
}

impl Held {
    fn batch(&self) -> Batch<'_> {
        Batch {
            indices: &self.indices,
            images: self.images.as_ref(),
            labels: &self.labels,
        }
    }
}

/// A ResNet, its optimizer and the label smoothing, trained on the CPU by
/// [`super::micro_step`].
#[derive(Debug, Clone)]
pub struct CpuResNet {
    pub model: ResNet<f32>,
    pub opt: CnnOptimizer<f32>,
    pub smoothing: f64,
    /// The gradients summed so far in an update of several micro-batches.
    pub accumulated: Vec<Vec<f32>>,
}

impl CpuResNet {
    pub fn new(model: ResNet<f32>, opt: CnnOptimizer<f32>, smoothing: f64) -> CpuResNet {
        CpuResNet {
            model,
            opt,
            smoothing,
            accumulated: Vec::new(),
        }
    }
}

impl Stepper for CpuResNet {
    fn step(&mut self, batch: Batch<'_>, _: bool, micro: (usize, usize)) -> Result<(f64, usize)> {
        let (labels, images) = (batch.labels, batch.images);
        let images = images.ok_or_else(|| Error::Failed("a batch without its images".into()))?;
        let [n, c, h, w] = images.shape;
        if c != 3 || n != labels.len() || n == 0 || h == 0 || w == 0 {
            return Err(Error::Setting(format!(
                "a batch of images {:?} with {} labels",
                images.shape,
                labels.len()
            )));
        }
        if let Some(&l) = labels.iter().find(|&&l| l as usize >= self.model.classes) {
            return Err(Error::Setting(format!(
                "label {l} of a model of {} classes",
                self.model.classes
            )));
        }
        Ok(super::micro_step(
            (&mut self.model, &mut self.opt),
            &mut self.accumulated,
            (images, labels),
            self.smoothing,
            micro,
        ))
    }
}

/// How the loop walks the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopConfig {
    pub batch_size: usize,
    /// Updates in all.
    pub steps: u64,
    /// Micro-batches of `batch_size` an update sums the gradients of (1: none); an update may
    /// take the last micro-batches of one epoch and the first of the next.
    pub accumulate: usize,
    /// Orders the batches of each epoch.
    pub seed: u64,
}

impl LoopConfig {
    /// Whether every update trains the one batch `images` hold (gathered and uploaded once).
    fn single(&self, images: usize) -> bool {
        images == self.batch_size
    }

    /// The order of the images in `epoch` (shuffled by the seed unless the data is one batch).
    fn epoch_order(&self, images: usize, epoch: u64) -> Vec<usize> {
        crate::data::batch_order(images, epoch, self.seed, !self.single(images))
    }

    /// The images each micro-batch trains on, in order, as [`train`] takes them: for handing
    /// the same batches to another framework.
    pub fn update_batches(&self, images: usize) -> Result<Vec<Vec<usize>>> {
        let per_epoch = self.batches_per_epoch(images)?;
        let mut out = Vec::new();
        let mut order = Vec::new();
        for step in 0..self.micro_batches() {
            let (epoch, b) = (step / per_epoch, (step % per_epoch) as usize);
            if b == 0 {
                order = self.epoch_order(images, epoch);
            }
            out.push(order[b * self.batch_size..(b + 1) * self.batch_size].to_vec());
        }
        Ok(out)
    }

    /// Micro-batches in all.
    fn micro_batches(&self) -> u64 {
        self.steps.saturating_mul(self.accumulate.max(1) as u64)
    }

    /// Whole batches an epoch of `images` holds (the remainder is left out, as PyTorch's
    /// `drop_last`); an error when there is not one.
    pub fn batches_per_epoch(&self, images: usize) -> Result<u64> {
        match images.checked_div(self.batch_size) {
            Some(b) if b > 0 => Ok(b as u64),
            _ => Err(Error::Setting(format!(
                "--batch-size {}: the data holds {images} images, not one whole batch",
                self.batch_size
            ))),
        }
    }
}

/// One update's figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UpdateStats {
    /// 1-based.
    pub step: u64,
    pub loss: f64,
    /// Images of the batch classified right, as a fraction.
    pub accuracy: f64,
    /// Wall time of the update, its batch's copy to the device included.
    pub seconds: f64,
}

/// What the loop did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopOutcome {
    pub updates: Vec<UpdateStats>,
    /// The first update's seconds (algorithms chosen, caches warmed).
    pub first_step_seconds: f64,
    /// Images a second over every update after the first; None with one update.
    pub images_per_s: Option<f64>,
    /// Why the loop stopped at a non-finite loss.
    pub diverged: Option<String>,
}

/// Trains `stepper` for `cfg.steps` updates over `images`, telling `progress` of each. The
/// batches are gathered on a thread of their own, one ahead of the step that trains on them
/// (a data set of one batch is gathered once).
pub fn train(
    stepper: &mut dyn Stepper,
    images: &Images,
    cfg: &LoopConfig,
    progress: &mut dyn FnMut(&UpdateStats),
) -> Result<LoopOutcome> {
    let per_epoch = cfg.batches_per_epoch(images.len())?;
    let single = cfg.single(images.len());
    let k = cfg.accumulate.max(1);
    let micro = if single {
        cfg.micro_batches().min(1)
    } else {
        cfg.micro_batches()
    };
    let pixels = !stepper.resident();
    std::thread::scope(|scope| {
        // a batch waiting at most: the gathering stays one step ahead; an early return drops
        // the receiver, which ends the thread at its next send
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        scope.spawn(move || {
            let mut order = Vec::new();
            for j in 0..micro {
                let (epoch, b) = (j / per_epoch, (j % per_epoch) as usize);
                if b == 0 {
                    order = cfg.epoch_order(images.len(), epoch);
                }
                let indices = order[b * cfg.batch_size..(b + 1) * cfg.batch_size].to_vec();
                let held = if pixels {
                    let (t, labels) = images.batch(&indices);
                    Held {
                        indices,
                        images: Some(t),
                        labels,
                    }
                } else {
                    let labels = indices.iter().map(|&i| images.labels[i]).collect();
                    Held {
                        indices,
                        images: None,
                        labels,
                    }
                };
                if tx.send(held).is_err() {
                    return;
                }
            }
        });
        run_updates(stepper, (rx, single, k), cfg, progress)
    })
}

/// The batches of [`train`], in training order, from the thread that gathers them.
type Batches = std::sync::mpsc::Receiver<Held>;

/// The loop of [`train`] over the batches `batches` hands over in order.
fn run_updates(
    stepper: &mut dyn Stepper,
    (batches, single, k): (Batches, bool, usize),
    cfg: &LoopConfig,
    progress: &mut dyn FnMut(&UpdateStats),
) -> Result<LoopOutcome> {
    let mut updates = Vec::new();
    let mut diverged = None;
    let mut held: Option<Held> = None;
    'updates: for step in 0..cfg.steps {
        let start = Instant::now();
        let (mut loss, mut correct) = (0.0, 0);
        for i in 0..k {
            let fresh = !(single && held.is_some());
            if fresh {
                held = Some(batches.recv().map_err(|_| {
                    Error::Failed("the thread gathering the batches ended early".into())
                })?);
            }
            let Some(batch) = held.as_ref() else {
                return Err(Error::Failed("no batch to train on".into()));
            };
            let (l, c) = stepper.step(batch.batch(), fresh, (i, k))?;
            loss += l / k as f64;
            correct += c;
            if !l.is_finite() {
                diverged = Some(format!(
                    "the loss of update {} is {l}{}",
                    step + 1,
                    if k > 1 {
                        format!(" (micro-batch {} of {k})", i + 1)
                    } else {
                        String::new()
                    }
                ));
                let stats = UpdateStats {
                    step: step + 1,
                    loss: l,
                    accuracy: 0.0,
                    seconds: start.elapsed().as_secs_f64(),
                };
                progress(&stats);
                updates.push(stats);
                break 'updates;
            }
        }
        let stats = UpdateStats {
            step: step + 1,
            loss,
            accuracy: correct as f64 / (k * cfg.batch_size) as f64,
            seconds: start.elapsed().as_secs_f64(),
        };
        progress(&stats);
        updates.push(stats);
    }
    let later: f64 = updates.iter().skip(1).map(|u| u.seconds).sum();
    Ok(LoopOutcome {
        first_step_seconds: updates.first().map_or(0.0, |u| u.seconds),
        images_per_s: (updates.len() > 1 && later > 0.0)
            .then(|| (updates.len() - 1) as f64 * (k * cfg.batch_size) as f64 / later),
        updates,
        diverged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cnn::optim::CnnOptimizerConfig;
    use crate::cnn::resnet::Depth;
    use crate::optim::OptimizerKind;

    fn cpu(seed: u64) -> CpuResNet {
        CpuResNet::new(
            ResNet::new(Depth::ResNet18, 10, seed),
            CnnOptimizer::new(CnnOptimizerConfig {
                kind: OptimizerKind::Sgd,
                lr: 0.01,
                momentum: 0.9,
                nesterov: false,
                weight_decay: 0.0,
            }),
            0.0,
        )
    }

    /// The loop's updates are `train_step`'s on the batches of `batch_order`, whole batches
    /// only, epoch after epoch.
    #[test]
    fn the_loop_makes_train_steps_on_the_epochs_batches() {
        let images = crate::cnn::data::generated(5, (16, 16), 10, 2).unwrap();
        let cfg = LoopConfig {
            batch_size: 2,
            steps: 3,
            accumulate: 1,
            seed: 4,
        };
        let mut stepper = cpu(1);
        let mut seen = 0;
        let out = train(&mut stepper, &images, &cfg, &mut |_| seen += 1).unwrap();
        assert_eq!((seen, out.updates.len()), (3, 3));
        assert!(out.images_per_s.is_some() && out.diverged.is_none());
        let mut reference = cpu(1);
        let handed = cfg.update_batches(5).unwrap();
        assert_eq!(handed.len(), 3);
        for (step, (epoch, b)) in [(0u64, 0usize), (0, 1), (1, 0)].into_iter().enumerate() {
            let order = crate::data::batch_order(5, epoch, 4, true);
            assert_eq!(handed[step], order[b * 2..b * 2 + 2]);
            let (x, y) = images.batch(&order[b * 2..b * 2 + 2]);
            let (loss, correct) =
                crate::cnn::train_step(&mut reference.model, &mut reference.opt, &x, &y, 0.0);
            assert_eq!(out.updates[step].loss, loss);
            assert_eq!(out.updates[step].accuracy, correct as f64 / 2.0);
        }
        let e = train(
            &mut cpu(1),
            &images,
            &LoopConfig {
                batch_size: 6,
                ..cfg
            },
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("holds 5 images, not one whole batch"), "{e}");
    }

    /// With `accumulate` 2 an update sums two micro-batches' gradients, each of the loss over
    /// 2, as PyTorch accumulates: the same as two backward passes of the halved loss by hand,
    /// then one step; the update's loss is the micro-batches' mean, its accuracy over both; the
    /// micro-batches run on through the epochs.
    #[test]
    fn an_update_sums_its_micro_batches_gradients() {
        let images = crate::cnn::data::generated(6, (16, 16), 10, 2).unwrap();
        let cfg = LoopConfig {
            batch_size: 2,
            steps: 2,
            accumulate: 2,
            seed: 4,
        };
        let mut stepper = cpu(1);
        let out = train(&mut stepper, &images, &cfg, &mut |_| {}).unwrap();
        assert_eq!(out.updates.len(), 2);
        let micro = cfg.update_batches(6).unwrap();
        assert_eq!(micro.len(), 4);
        let mut reference = cpu(1);
        for u in 0..2 {
            let mut sum: Vec<Vec<f32>> = Vec::new();
            let mut losses = 0.0;
            for i in 0..2 {
                let (x, y) = images.batch(&micro[2 * u + i]);
                let m = &mut reference.model;
                let (logits, tape) = m.forward(&x, crate::cnn::resnet::Mode::Train);
                let mut d = Vec::new();
                let (loss, _) =
                    crate::cnn::loss::cross_entropy_smoothed(&logits, 10, &y, 0.0, &mut d);
                losses += loss / 2.0;
                d.iter_mut().for_each(|v| *v *= 0.5);
                let mut g = m.zero_grads();
                m.backward(tape.as_ref().unwrap(), &d, &mut g);
                if sum.is_empty() {
                    sum = g;
                } else {
                    for (a, b) in sum.iter_mut().zip(&g) {
                        a.iter_mut().zip(b).for_each(|(p, q)| *p += q);
                    }
                }
            }
            reference
                .opt
                .update(reference.model.params.iter_mut().map(|p| &mut p.data), &sum);
            assert_eq!(out.updates[u].loss, losses);
        }
        assert_eq!(stepper.model.params, reference.model.params);
        assert_eq!(stepper.model.buffers, reference.model.buffers);
        assert!(stepper.accumulated.is_empty());
    }
}
