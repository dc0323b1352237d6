//! Data-parallel training of a [`GpuResNet`]: each rank trains its share of every combined
//! batch and the gradients are averaged over the ranks through NCCL while backward goes on.
//!
//! Backward finishes the parameters a group at a time: the head's, then each residual block's
//! from the last, then the stem's. Each group's gradients are one contiguous span of the flat
//! gradient buffer (torchvision's parameter order). Consecutive groups are joined into buckets
//! of at least the bucket size; when backward has finished a bucket's last group, its average
//! starts on the communicator's stream after the work stream's current point, so it overlaps
//! the backward of the blocks before it. The update waits for the last. The stem's small
//! bucket is all that is left to average when backward ends.
//!
//! Averaging in bf16 (`grad_comm`): each bucket's f32 gradients are cast into a bf16 copy on
//! the work stream, averaged in it, and widened back before the update: half the bytes, every
//! averaged gradient rounded to bf16 (it changes the numerics; f32 is the default).
//!
//! Batch norm is per rank, as DistributedDataParallel without SyncBatchNorm: each rank
//! normalises its own images and keeps its own running statistics (rank 0's are the model's,
//! as DDP's broadcast of rank 0's buffers makes them).

use super::GpuResNet;
use crate::error::{Error, Result};
use gpukit_cuda::nccl::{Comm, RedOp};
use gpukit_types::DType;

/// A trainer's peers: its communicator and its buckets.
pub(super) struct CnnDp {
    comm: Comm,
    /// Each bucket: the backward group that completes it and its span of the flat gradients,
    /// elements [start, end).
    buckets: Vec<(usize, (usize, usize))>,
    /// Averaging in bf16: the gradients' bf16 copy (None: averaged in f32 in place).
    comm_buf: Option<gpukit_cuda::DeviceBuffer>,
}

impl CnnDp {
    /// The type the gradients are averaged in.
    fn comm_type(&self) -> DType {
        match self.comm_buf {
            Some(_) => DType::Bf16,
            None => DType::F32,
        }
    }
}

/// Joins the spans of consecutive groups (backward order, each [start, end)) into buckets of at
/// least `bytes` (f32 gradients; the last may be smaller): each the group that completes it and
/// its span, the spans tiling [0, `total`) (the flat layout's padding after a group goes with
/// it). An error unless the groups come from the end down, each ending at most `slack`
/// elements below where the one before it starts (padding, not gradients left out).
pub fn buckets_of(
    groups: &[(usize, usize)],
    total: usize,
    (bytes, slack): (usize, usize),
) -> Result<Vec<(usize, (usize, usize))>> {
    let mut out = Vec::new();
    // the lowest start so far, and the top of the bucket being filled
    let (mut end, mut top) = (total, total);
    for (g, &(a, b)) in groups.iter().enumerate() {
        if a > b || b > end || end - b >= slack.max(1) {
            return Err(Error::Failed(format!(
                "backward group {g} spans gradients {a}..{b}, the one after it starts at {end}"
            )));
        }
        end = a;
        if (top - a) * 4 >= bytes {
            out.push((g, (a, top)));
            top = a;
        }
    }
    if end >= slack.max(1) {
        return Err(Error::Failed(format!(
            "the backward groups leave gradients 0..{end} out"
        )));
    }
    match out.last_mut() {
        // the padding below the lowest group, or the groups since the last full bucket
        Some(last) if top == end => last.1 .0 = 0,
        _ if !groups.is_empty() => out.push((groups.len() - 1, (0, top))),
        _ => {}
    }
    Ok(out)
}

impl GpuResNet {
    /// The spans of the flat gradients backward finishes a group at a time: the head's, each
    /// block's from the last, the stem's.
    fn backward_groups(&self) -> Result<Vec<(usize, usize)>> {
        let span = |indices: &[usize]| -> Result<(usize, usize)> {
            let (lo, hi) = (
                *indices.iter().min().unwrap_or(&0),
                *indices.iter().max().unwrap_or(&0),
            );
            let (a, _) = self.params_layout.range(lo)?;
            let (b, n) = self.params_layout.range(hi)?;
            Ok((a, b + n))
        };
        let of_units = |units: &mut dyn Iterator<Item = &super::GpuUnit>| -> Vec<usize> {
            units
                .flat_map(|u| [u.spec.weight, u.spec.gamma, u.spec.beta])
                .collect()
        };
        let (_, w, bias) = self.head;
        let mut groups = vec![span(&[w, bias])?];
        for b in self.blocks.iter().rev() {
            let ids = of_units(&mut b.main.iter().chain(b.down.as_ref()));
            groups.push(span(&ids)?);
        }
        groups.push(span(&of_units(&mut std::iter::once(&self.stem)))?);
        Ok(groups)
    }

    /// Joins this trainer to its data-parallel peers: `comm` (this rank's communicator, on a
    /// stream of this GPU other than the work stream) averages the gradients in `grad_comm`
    /// (f32, or bf16 which rounds them) in buckets of at least `bucket_bytes` of f32
    /// gradients while backward goes on. Every rank must attach with the same network, bucket
    /// size and type. With gradient accumulation the sum of an update's micro-batches is
    /// averaged: the last micro-batch's backward adds each bucket's gradients into the sum,
    /// then averages that bucket of it.
    pub fn attach(&mut self, comm: Comm, bucket_bytes: usize, grad_comm: DType) -> Result<()> {
        let buckets = buckets_of(
            &self.backward_groups()?,
            self.params_layout.total,
            (bucket_bytes.max(1), super::layout::ALIGN),
        )?;
        let comm_buf = match grad_comm {
            DType::F32 => None,
            DType::Bf16 => Some(self.gpu.alloc(self.params_layout.total * 2)?),
            other => {
                return Err(Error::Setting(format!(
                    "gradients are averaged in f32 or bf16, not {other}"
                )))
            }
        };
        // NCCL connects its peers at a communicator's first collective of each size class,
        // which a graph capture refuses: average every bucket once now (the first backward
        // overwrites the gradients and their copy)
        let (whole, e) = match &comm_buf {
            Some(buf) => (buf.view(), 2),
            None => (self.grads.view(), 4),
        };
        for &(_, (a, b)) in &buckets {
            let region = whole.sub(a * e, (b - a) * e)?;
            comm.all_reduce(region, region, b - a, grad_comm, RedOp::Avg)?;
        }
        comm.stream().synchronize()?;
        comm.async_error()?;
        self.dp = Some(CnnDp {
            comm,
            buckets,
            comm_buf,
        });
        // graphs captured without the communication would skip it
        self.graphs = [None, None, None];
        Ok(())
    }

    /// After backward has finished group `g` ([`GpuResNet::backward_groups`]'s order): the
    /// bucket it completes starts averaging on the communicator's stream once the work stream
    /// has reached this point.
    pub(super) fn group_done(&self, g: usize) -> Result<()> {
        let Some(dp) = &self.dp else { return Ok(()) };
        // accumulating: only the update's last micro-batch averages (the sum of them all)
        if !self.last_micro.get() {
            return Ok(());
        }
        for &(last, (a, b)) in &dp.buckets {
            if last == g {
                let grads = match &self.acc {
                    Some(acc) => {
                        let sum = acc.view().sub(a * 4, (b - a) * 4)?;
                        let own = self.grads.view().sub(a * 4, (b - a) * 4)?;
                        self.k.axpy(sum, own, b - a)?;
                        sum
                    }
                    None => self.grads.view().sub(a * 4, (b - a) * 4)?,
                };
                let region = match &dp.comm_buf {
                    Some(buf) => {
                        let half = buf.view().sub(a * 2, (b - a) * 2)?;
                        self.k.cast(grads, half, DType::Bf16, b - a)?;
                        half
                    }
                    None => grads,
                };
                dp.comm.stream().wait(&self.gpu.stream().record()?)?;
                dp.comm
                    .all_reduce(region, region, b - a, dp.comm_type(), RedOp::Avg)?;
            }
        }
        Ok(())
    }

    /// Before the update: the work stream waits for every bucket's average (and, averaging in
    /// bf16, widens them back into the f32 gradients).
    pub(super) fn gradients_averaged(&self) -> Result<()> {
        if let Some(dp) = &self.dp {
            self.gpu.stream().wait(&dp.comm.stream().record()?)?;
            if let Some(buf) = &dp.comm_buf {
                for &(_, (a, b)) in &dp.buckets {
                    let half = buf.view().sub(a * 2, (b - a) * 2)?;
                    let sum = self.acc.as_ref().unwrap_or(&self.grads);
                    let grads = sum.view().sub(a * 4, (b - a) * 4)?;
                    self.k.widen(half, grads, DType::Bf16, b - a)?;
                }
            }
        }
        Ok(())
    }

    /// A digest of the f32 weights: ranks that averaged the same gradients hold the same bits.
    pub fn weights_digest(&self) -> Result<u64> {
        use std::hash::Hasher;
        let bytes = self.gpu.download(&self.params)?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write(&bytes);
        Ok(h.finish())
    }

    /// `values` summed over the ranks through the communicator (as they are without peers):
    /// every rank must call it with as many values.
    pub fn sum_over_ranks(&self, values: &[f64]) -> Result<Vec<f64>> {
        match &self.dp {
            Some(dp) => crate::gpu::parallel::reduce_f64((&self.gpu, &dp.comm), values, RedOp::Sum),
            None => Ok(values.to_vec()),
        }
    }

    /// Whether a communicator is attached.
    pub fn has_peers(&self) -> bool {
        self.dp.is_some()
    }

    /// The type the gradients are averaged in (None without peers).
    pub fn grad_comm(&self) -> Option<DType> {
        self.dp.as_ref().map(CnnDp::comm_type)
    }

    /// How many buckets the gradients are averaged in (0 without peers).
    pub fn buckets(&self) -> usize {
        self.dp.as_ref().map_or(0, |d| d.buckets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Groups from the end of the gradients join into buckets of at least the size, the last
    /// bucket taking what is left and the padding between groups going with the group above;
    /// groups that overlap, come out of order or leave more than padding out are refused.
    #[test]
    fn groups_join_into_buckets_from_the_end() {
        // head 10..12, blocks 6..10 and 2..6, stem 0..2 (f32: 4 bytes each)
        let groups = [(10, 12), (6, 10), (2, 6), (0, 2)];
        let b = buckets_of(&groups, 12, (20, 4)).unwrap();
        assert_eq!(b, vec![(1, (6, 12)), (3, (0, 6))]);
        let each = buckets_of(&groups, 12, (1, 4)).unwrap();
        assert_eq!(each.len(), 4);
        assert_eq!(each[0], (0, (10, 12)));
        let one = buckets_of(&groups, 12, (1 << 20, 4)).unwrap();
        assert_eq!(one, vec![(3, (0, 12))]);
        // padding after each group (the flat layout's alignment), and below the lowest
        let padded = [(12, 14), (7, 10), (1, 5)];
        let b = buckets_of(&padded, 16, (1, 4)).unwrap();
        assert_eq!(b, vec![(0, (12, 16)), (1, (7, 12)), (2, (0, 7))]);
        let b = buckets_of(&padded, 16, (1 << 20, 4)).unwrap();
        assert_eq!(b, vec![(2, (0, 16))]);
        // overlapping, out of order, more than padding left out between or below
        assert!(buckets_of(&[(10, 12), (5, 11), (0, 5)], 12, (4, 4)).is_err());
        assert!(buckets_of(&[(0, 2), (10, 12)], 12, (4, 4)).is_err());
        assert!(buckets_of(&[(10, 12), (0, 5)], 12, (4, 4)).is_err());
        assert!(buckets_of(&[(10, 12), (6, 10)], 12, (4, 4)).is_err());
    }
}
