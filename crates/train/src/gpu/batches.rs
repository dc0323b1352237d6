//! Which batches an epoch runs: each batch's rows of the epoch's order, where updates fall
//! (accumulation, the step limit), a data-parallel rank's share of each combined batch, a
//! pipeline stage's micro-batches, and the range of batches a captured graph replays.

use super::parallel::Shard;
use crate::checkpoint::Position;

/// One batch of an epoch as the loop runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Batch {
    /// Its number in the epoch (its loss's slot, or on a pipeline stage with `micro`).
    pub(super) index: usize,
    /// Pipeline-parallel: its place among its batch's micro-batches (0 elsewhere).
    pub(super) micro: usize,
    /// Its first row in the epoch's order.
    pub(super) first_row: usize,
    pub(super) rows: usize,
    /// The first batch of an update: its gradients overwrite, later ones add.
    pub(super) first_micro: bool,
    /// An update follows it.
    pub(super) update: bool,
    /// Rows of the combined batch this is a share of (all ranks' rows; `rows` on one GPU).
    pub(super) combined: usize,
    /// This share's weight in the combined batch's mean: rows x ranks / combined (1 for full
    /// combined batches and on one GPU), applied to the loss's gradient so that the average
    /// over ranks is the combined batch's gradient.
    pub(super) weight: f32,
}

/// The batches of epoch `pos.epoch` from `pos.batch` on for `n` samples: an update after every
/// `accumulate` batches and after the epoch's last, stopping at the step limit (the CPU loop's
/// rule, which the unit tests hold it to). Data-parallel, a batch is this rank's share of a
/// combined batch of `world` x batch size rows.
pub(super) fn epoch_batches(
    cfg: &crate::run::TrainConfig,
    n: usize,
    pos: &Position,
    shard: Shard,
) -> Vec<Batch> {
    let bs = cfg.batch_size * shard.world.max(1);
    let per_epoch = n.div_ceil(bs);
    let (mut b, mut step, mut micro) = (pos.batch as usize, pos.step, 0usize);
    let mut out = Vec::new();
    while b < per_epoch && cfg.max_steps.is_none_or(|m| step < m) {
        let first_row = b * bs;
        let first_micro = micro == 0;
        micro += 1;
        let update = micro == cfg.accumulate || b + 1 == per_epoch;
        if update {
            step += 1;
            micro = 0;
        }
        let combined = bs.min(n - first_row);
        let (offset, rows) = shard.rows(combined, cfg.batch_size);
        out.push(Batch {
            index: b,
            micro: 0,
            first_row: first_row + offset,
            rows,
            first_micro,
            update,
            combined,
            weight: (rows * shard.world.max(1)) as f32 / combined.max(1) as f32,
        });
        b += 1;
    }
    out
}

/// Each batch as its micro-batches: consecutive rows of it, the first one's gradients
/// overwriting, the update after the last; each micro-batch's loss gradient weighted by its
/// share of the batch's rows (`weight / micro` = rows / batch rows).
pub(super) fn micro_batches(batches: &[Batch], micro: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    for b in batches {
        let parts = super::stage::split_rows(b.rows, micro);
        let mut offset = 0;
        for (j, &rows) in parts.iter().enumerate() {
            out.push(Batch {
                micro: j,
                first_row: b.first_row + offset,
                rows,
                first_micro: b.first_micro && j == 0,
                update: b.update && j + 1 == parts.len(),
                weight: b.weight * (rows * micro) as f32 / b.rows.max(1) as f32,
                ..*b
            });
            offset += rows;
        }
    }
    out
}

/// A captured graph replays one range of an epoch's batches: its first and one past its last.
pub(super) fn graph_key(batches: &[Batch]) -> (u64, u64) {
    (
        batches.first().map_or(0, |b| b.index) as u64,
        batches.last().map_or(0, |b| b.index + 1) as u64,
    )
}
