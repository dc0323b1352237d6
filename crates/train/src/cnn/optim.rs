//! SGD (momentum, dampening 0, Nesterov, weight decay) and AdamW over a network's named
//! parameters, with PyTorch's update rules ([`crate::optim::StepRule`], shared with the MLP
//! path). Batch-norm weights and biases are parameters like any other (decayed too, as
//! `torch.optim` does given `model.parameters()`); running statistics are buffers and never
//! updated here.

use crate::error::{Error, Result};
use crate::optim::{OptimizerKind, StepRule};
use crate::real::Real;

/// Hyperparameters of the CNN optimizer.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CnnOptimizerConfig {
    pub kind: OptimizerKind,
    pub lr: f64,
    /// SGD only.
    pub momentum: f64,
    /// SGD with momentum only.
    pub nesterov: bool,
    pub weight_decay: f64,
}

impl CnnOptimizerConfig {
    /// Refuses what PyTorch refuses or this engine does not run: a learning rate that is not
    /// positive, momentum outside [0, 1), negative weight decay, Nesterov without momentum,
    /// momentum or Nesterov given to AdamW, plain Adam (use AdamW).
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Setting(m));
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr {}: must be a positive number", self.lr));
        }
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return bad(format!("--momentum {}: must be in [0, 1)", self.momentum));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!(
                "--weight-decay {}: must be zero or positive",
                self.weight_decay
            ));
        }
        match self.kind {
            OptimizerKind::Sgd if self.nesterov && self.momentum == 0.0 => {
                bad("--nesterov needs a positive --momentum (as PyTorch)".into())
            }
            OptimizerKind::AdamW if self.momentum != 0.0 || self.nesterov => {
                bad("--momentum and --nesterov apply to sgd, not adamw".into())
            }
            OptimizerKind::Adam => bad("convolutional networks train with sgd or adamw".into()),
            _ => Ok(()),
        }
    }
}

/// The optimizer's state: its step count and a buffer set a parameter (SGD's momentum, or
/// AdamW's two moments), in the network's parameter order.
#[derive(Debug, Clone)]
pub struct CnnOptimizer<T> {
    pub config: CnnOptimizerConfig,
    pub step: u64,
    pub m: Vec<Vec<T>>,
    pub v: Vec<Vec<T>>,
}

impl<T: Real> CnnOptimizer<T> {
    pub fn new(config: CnnOptimizerConfig) -> CnnOptimizer<T> {
        CnnOptimizer {
            config,
            step: 0,
            m: Vec::new(),
            v: Vec::new(),
        }
    }

    /// One update of `params` (each a parameter's values) from `grads`, in the same order.
    pub fn update<'a>(&mut self, params: impl Iterator<Item = &'a mut Vec<T>>, grads: &[Vec<T>]) {
        let c = self.config;
        let first = self.step == 0;
        if first {
            let zeros = || grads.iter().map(|g| vec![T::ZERO; g.len()]).collect();
            if c.kind != OptimizerKind::Sgd || c.momentum != 0.0 {
                self.m = zeros();
            }
            if c.kind != OptimizerKind::Sgd {
                self.v = zeros();
            }
        }
        self.step += 1;
        let rule = StepRule::new(
            c.kind,
            c.lr,
            c.momentum,
            c.weight_decay,
            c.nesterov,
            self.step,
        );
        for (k, (p, g)) in params.zip(grads).enumerate() {
            assert_eq!(p.len(), g.len(), "a gradient shaped like its parameter");
            let m = self.m.get_mut(k).map(Vec::as_mut_slice);
            let v = self.v.get_mut(k).map(Vec::as_mut_slice);
            rule.apply(p, g, m, v, first);
        }
    }
}
