//! SGD, Adam and AdamW with PyTorch's update rules (torch.optim, default arguments apart from
//! those given), so that the same weights, batches and hyperparameters give the same losses:
//! - SGD: `g += wd p`; with momentum `buf = g` on the first step, then `buf = m buf + g`;
//!   `p -= lr buf` (dampening 0); with Nesterov (the CNN path) `p -= lr (g + m buf)`.
//! - Adam: `g += wd p`; `m = lerp(m, g, 1 - b1)`; `v = b2 v + (1 - b2) g^2`;
//!   `p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)`, the bias corrections in
//!   float64 as PyTorch computes them from its step count.
//! - AdamW: `p *= 1 - lr wd` first, then Adam without the `wd p` term.

use crate::error::{Error, Result};
use crate::model::{Grads, Mlp};
use crate::real::Real;
use serde::{Deserialize, Serialize};

/// Which optimizer, and its hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    pub lr: f64,
    /// SGD only.
    pub momentum: f64,
    pub weight_decay: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adam,
    AdamW,
}

impl OptimizerKind {
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
        }
    }
}

/// PyTorch's defaults for Adam and AdamW.
pub const BETA1: f64 = 0.9;
pub const BETA2: f64 = 0.999;
pub const EPS: f64 = 1e-8;

impl OptimizerConfig {
    /// Refuses hyperparameters no optimizer can use, naming the flag: a learning rate that is
    /// not a positive finite number, momentum outside [0, 1), weight decay negative or not
    /// finite, momentum given to Adam or AdamW.
    pub fn check(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(Error::Setting(format!(
                "--lr {}: the learning rate must be a positive number",
                self.lr
            )));
        }
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return Err(Error::Setting(format!(
                "--momentum {}: must be in [0, 1)",
                self.momentum
            )));
        }
        if self.kind != OptimizerKind::Sgd && self.momentum != 0.0 {
            return Err(Error::Setting(format!(
                "--momentum applies to sgd, not {} (its betas are PyTorch's defaults, 0.9 and 0.999)",
                self.kind.name()
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(Error::Setting(format!(
                "--weight-decay {}: must be zero or a positive number",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// An optimizer's state: its step count and per-parameter buffers (momentum for SGD, first
/// and second moments for Adam/AdamW), in the order of [`Mlp::named`].
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer<T> {
    pub config: OptimizerConfig,
    /// Updates applied so far.
    pub step: u64,
    /// SGD momentum buffers or Adam's first moments; empty until the first step.
    pub m: Vec<Vec<T>>,
    /// Adam's second moments; empty for SGD.
    pub v: Vec<Vec<T>>,
}

impl<T: Real> Optimizer<T> {
    pub fn new(config: OptimizerConfig) -> Optimizer<T> {
        Optimizer {
            config,
            step: 0,
            m: Vec::new(),
            v: Vec::new(),
        }
    }

    /// The names and contents of the state buffers, for checkpoints.
    pub fn buffers(&self) -> Vec<(&'static str, &Vec<Vec<T>>)> {
        vec![("m", &self.m), ("v", &self.v)]
    }

    /// Applies one update to `model` from `grads`.
    pub fn update(&mut self, model: &mut Mlp<T>, grads: &Grads<T>) {
        let c = self.config;
        let first = self.m.is_empty();
        if first {
            let sizes: Vec<usize> = model
                .layers
                .iter()
                .flat_map(|l| [l.weight.len(), l.bias.len()])
                .collect();
            let zeros = || sizes.iter().map(|&n| vec![T::ZERO; n]).collect::<Vec<_>>();
            let uses_m = c.kind != OptimizerKind::Sgd || c.momentum != 0.0;
            if uses_m {
                self.m = zeros();
            }
            if c.kind != OptimizerKind::Sgd {
                self.v = zeros();
            }
        }
        let params = model
            .layers
            .iter_mut()
            .flat_map(|l| [&mut l.weight, &mut l.bias]);
        let gs = grads
            .weight
            .iter()
            .zip(&grads.bias)
            .flat_map(|(w, b)| [w, b]);
        self.step += 1;
        let rule = StepRule::new(c.kind, c.lr, c.momentum, c.weight_decay, false, self.step);
        for (k, (p, g)) in params.zip(gs).enumerate() {
            let m = self.m.get_mut(k).map(Vec::as_mut_slice);
            let v = self.v.get_mut(k).map(Vec::as_mut_slice);
            rule.apply(p, g, m, v, first);
        }
    }
}

/// One step's update rule with its constants computed once (the bias corrections in float64
/// from the step count, as PyTorch computes them), applied tensor by tensor: what the MLP's
/// [`Optimizer`] and the convolutional networks' optimizer ([`crate::cnn::optim`]) share.
#[derive(Debug, Clone, Copy)]
pub struct StepRule<T> {
    kind: OptimizerKind,
    nesterov: bool,
    lr: T,
    wd: T,
    momentum: T,
    step_size: T,
    bc2_sqrt: T,
    b1c: T,
    b2: T,
    b2c: T,
    eps: T,
    decay: T,
}

impl<T: Real> StepRule<T> {
    /// The rule of update number `step` (1 for the first). `nesterov` applies to SGD with
    /// momentum: `g = g + m buf` after the buffer's update, `p -= lr g`.
    pub fn new(
        kind: OptimizerKind,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
        nesterov: bool,
        step: u64,
    ) -> StepRule<T> {
        let t = step as f64;
        StepRule {
            kind,
            nesterov,
            lr: T::from_f64(lr),
            wd: T::from_f64(weight_decay),
            momentum: T::from_f64(momentum),
            step_size: T::from_f64(lr / (1.0 - BETA1.powf(t))),
            bc2_sqrt: T::from_f64((1.0 - BETA2.powf(t)).sqrt()),
            b1c: T::from_f64(1.0 - BETA1),
            b2: T::from_f64(BETA2),
            b2c: T::from_f64(1.0 - BETA2),
            eps: T::from_f64(EPS),
            decay: T::from_f64(1.0 - lr * weight_decay),
        }
    }

    /// Updates `p` from its gradient `g`. `m`: SGD's momentum buffer (None: plain SGD) or
    /// Adam's first moment; `v`: Adam's second moment. `first`: the buffers' first step (SGD
    /// then sets `buf = g` as PyTorch does).
    ///
    /// # Panics
    ///
    /// For Adam or AdamW without both moments.
    pub fn apply(
        &self,
        p: &mut [T],
        g: &[T],
        m: Option<&mut [T]>,
        v: Option<&mut [T]>,
        first: bool,
    ) {
        let (lr, wd, momentum) = (self.lr, self.wd, self.momentum);
        match self.kind {
            OptimizerKind::Sgd => match m {
                Some(buf) => {
                    for ((pi, &gi), bi) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
                        let d = gi + wd * *pi;
                        *bi = if first { d } else { momentum * *bi + d };
                        if self.nesterov {
                            *pi -= lr * (d + momentum * *bi);
                        } else {
                            *pi -= lr * *bi;
                        }
                    }
                }
                None => {
                    for (pi, &gi) in p.iter_mut().zip(g) {
                        let d = gi + wd * *pi;
                        *pi -= lr * d;
                    }
                }
            },
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                let adam = self.kind == OptimizerKind::Adam;
                let (m, v) = (
                    m.expect("Adam needs its first moments"),
                    v.expect("Adam needs its second moments"),
                );
                // one pass of zipped slices (no indexing): the compiler vectorises it
                for (((pi, &gi), mi), vi) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut())
                {
                    let d = if adam {
                        gi + wd * *pi
                    } else {
                        *pi *= self.decay;
                        gi
                    };
                    *mi = *mi + self.b1c * (d - *mi);
                    *vi = self.b2 * *vi + self.b2c * d * d;
                    let denom = vi.sqrt() / self.bc2_sqrt + self.eps;
                    *pi -= self.step_size * (*mi / denom);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
