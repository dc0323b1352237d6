//! A pipeline stage's place and share: which layers it holds, how its batches are cut into
//! micro-batches, how many micro-batches' maps it keeps (the schedule itself is in
//! [`super::pipeline`]).

use crate::error::{Error, Result};
use crate::run::TrainConfig;

/// One GPU's part of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// Its place: 0 reads the data, `count - 1` computes the loss.
    pub index: usize,
    pub count: usize,
    /// The model's layers it holds: `[first, end)`.
    pub layers: (usize, usize),
    /// Micro-batches a batch is cut into.
    pub micro: usize,
}

impl Stage {
    pub fn first(&self) -> bool {
        self.index == 0
    }

    pub fn last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// Micro-batches whose maps the stage holds at once under 1F1B.
    pub fn slots(&self) -> usize {
        (self.count - self.index).min(self.micro).max(1)
    }

    /// The stage's own training config: the whole model's, its widths cut to its layers.
    pub(super) fn config(&self, cfg: &TrainConfig) -> Result<TrainConfig> {
        let (a, b) = self.layers;
        let layers = cfg.widths.len() - 1;
        if a >= b || b > layers || self.index >= self.count || self.micro == 0 {
            return Err(Error::Setting(format!(
                "pipeline stage {} of {}: layers {a}..{b} of {layers}, {} micro-batches",
                self.index, self.count, self.micro
            )));
        }
        if cfg.accumulate > 1 || cfg.checkpoint_activations {
            return Err(Error::Setting(
                "a pipeline stage takes no --accumulate or --checkpoint-activations".into(),
            ));
        }
        Ok(TrainConfig {
            widths: cfg.widths[a..=b].to_vec(),
            ..cfg.clone()
        })
    }
}

/// `rows` cut into `micro` near-equal parts (the first ones a row more; fewer parts when there
/// are fewer rows).
pub fn split_rows(rows: usize, micro: usize) -> Vec<usize> {
    let parts = micro.min(rows).max(1);
    (0..parts)
        .map(|j| rows / parts + usize::from(j < rows % parts))
        .collect()
}
