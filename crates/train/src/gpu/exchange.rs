//! Data-parallel with a sharded optimizer: the first layer's weight gradient exchanged piece by
//! piece while the next piece is computed (`GpuOptions::dp_exchange`).
//!
//! The first layer's weight gradient is backward's last product (64 MiB in f32 for the
//! 4096-wide MLP), so its reduce-scatter cannot start before backward ends and sits whole on
//! the step's path. Here its rows are cut into one piece a rank (piece q: the rows whose
//! weights rank q updates, its block of the layer's weights), and each rank computes the other
//! ranks' pieces first, in the order r + 1, r + 2, ... (mod world), its own last. After piece q
//! rank r sends it to rank q and, in the same NCCL group, receives its own piece from the rank
//! that computes it at the same step (r - j at step j): the transfers of step j run on the
//! communication stream while the work stream computes the piece of step j + 1 (NCCL's
//! send/receive take few multiprocessors, where a reduce-scatter's kernel waits for the
//! product's blocks to drain). After its own piece, a rank averages its piece with the world - 1
//! received (`(own + received) / world`, as NCCL's Avg), and updates it. The layer's bias (and
//! the padding after it) is reduce-scattered as before. Only f32 gradients; the weights'
//! all-gather after the update is unchanged.
//!
//! Not yet run on two GPUs: off unless `GPUKIT_DP_EXCHANGE=1`.

use super::parallel::{span, Dp};
use super::plan::Layout;
use super::GpuTrainer;
use crate::error::{Error, Result};
use gpukit_cuda::nccl;
use gpukit_cuda::DeviceBuffer;
use gpukit_types::DType;

/// A rank's side of the exchange.
pub(super) struct Exchange {
    /// Each piece's span of the flat gradient buffer (rows of the first layer's weight only).
    pub(super) pieces: Vec<(usize, usize)>,
    /// The layer's bias and padding: reduce-scattered as a region of its own.
    pub(super) tail: (usize, usize),
    /// The pieces received at steps 1..world, one after another (world - 1 pieces).
    recv: DeviceBuffer,
}

/// The first layer's rows in one piece a rank, where the exchange applies: `world` ranks of a
/// sharded optimizer, f32 gradients, `outputs` a multiple of `world`. None elsewhere.
pub(super) fn exchange_pieces(
    outputs: usize,
    world: usize,
    sharded: bool,
    grad_comm: DType,
) -> Option<Vec<(usize, usize)>> {
    let fits = world >= 2 && sharded && grad_comm == DType::F32 && outputs.is_multiple_of(world);
    fits.then(|| {
        let c = outputs / world;
        (0..world).map(|q| (q * c, (q + 1) * c)).collect()
    })
}

/// The spans of the exchange's pieces (`rows`, ranges of the first layer's outputs) and of the
/// layer's tail (its bias and the padding after it) in the flat gradient buffer.
pub(super) fn exchange_spans(
    layout: &Layout,
    rows: &[(usize, usize)],
) -> (Vec<(usize, usize)>, (usize, usize)) {
    let (i, _) = layout.io(0);
    let (wo, _) = layout.offsets[0];
    let end = span(layout, 0, 0).1;
    let pieces: Vec<(usize, usize)> = rows
        .iter()
        .map(|&(a, b)| (wo + a * i, wo + b * i))
        .collect();
    let tail_start = pieces.last().map_or(wo, |p| p.1);
    (pieces, (tail_start, end))
}

/// The order rank `rank` of `world` computes the pieces in: the other ranks' from `rank + 1`
/// on, its own last.
pub(super) fn piece_order(rank: usize, world: usize) -> Vec<usize> {
    (1..=world).map(|j| (rank + j) % world).collect()
}

/// The rank a rank receives its own piece from when it has just computed piece `p`, and the
/// step (1..world) that is: at step j rank r computes piece r + j and rank r - j computes r.
pub(super) fn exchange_step(rank: usize, world: usize, p: usize) -> (usize, usize) {
    let j = (p + world - rank) % world;
    (j, (rank + world - j) % world)
}

impl Exchange {
    /// The exchange's buffers on `gpu` for pieces `pieces` (equal spans) and `tail`.
    pub(super) fn new(
        gpu: &gpukit_cuda::Gpu,
        pieces: Vec<(usize, usize)>,
        tail: (usize, usize),
    ) -> Result<Exchange> {
        let n = pieces.first().map_or(0, |p| p.1 - p.0);
        if pieces.iter().any(|p| p.1 - p.0 != n) {
            return Err(Error::Failed(format!(
                "the exchange's pieces are not equal: {pieces:?}"
            )));
        }
        let recv = gpu.alloc((pieces.len().saturating_sub(1) * n * 4).max(4))?;
        Ok(Exchange { pieces, tail, recv })
    }

    /// Elements of one piece.
    fn piece_len(&self) -> usize {
        self.pieces.first().map_or(0, |p| p.1 - p.0)
    }
}

impl GpuTrainer {
    /// The order backward computes the first layer's weight-gradient pieces in (their indices).
    pub(super) fn piece_order(&self) -> Vec<usize> {
        let n = self.grad_pieces.len();
        match self.dp.as_ref().and_then(|d| d.exchange.as_ref()) {
            Some(_) => piece_order(self.shard().rank, self.shard().world),
            None => (0..n).collect(),
        }
    }

    /// After piece `p` of the first layer's weight gradient (exchange mode): another rank's
    /// piece goes to it while this rank's arrives from the rank computing it now; after its own
    /// piece, the tail is reduce-scattered, the received pieces averaged into its own, and the
    /// layer's weights are launched for the update.
    pub(super) fn exchange_piece_done(&self, dp: &Dp, ex: &Exchange, p: usize) -> Result<()> {
        let shard = self.shard();
        let n = ex.piece_len();
        let comm = dp.comm();
        if p != shard.rank {
            let (j, from) = exchange_step(shard.rank, shard.world, p);
            let (a, _) = ex.pieces[p];
            let send = self.grads.view().sub(a * 4, n * 4)?;
            let recv = ex.recv.view().sub((j - 1) * n * 4, n * 4)?;
            comm.stream().wait(&self.gpu.stream().record()?)?;
            nccl::group(|| {
                comm.send(send, n, DType::F32, p)?;
                comm.recv(recv, n, DType::F32, from)
            })?;
            return Ok(());
        }
        // the work stream after every piece this rank receives; then the tail's reduce-scatter
        self.gpu.stream().wait(&comm.stream().record()?)?;
        self.launch_average(dp, ex.tail)?;
        let (a, b) = ex.pieces[p];
        let own = self.grads.view().sub(a * 4, n * 4)?;
        let world = shard.world;
        for s in 0..world - 1 {
            let got = ex.recv.view().sub(s * n * 4, n * 4)?;
            if s + 2 < world {
                self.k.axpy(own, got, n)?;
            } else {
                self.k.add_scale(own, got, n, 1.0 / world as f32)?;
            }
        }
        let first = ex.pieces[0].0;
        let last = ex.pieces[world - 1].1;
        debug_assert!(first <= a && b <= last);
        dp.launched_now(self, (first, last))
    }

    /// The exchange's connections made before any capture (NCCL connects a pair at its first
    /// send and receive): each piece sent and received once, from the gradients (the first
    /// backward overwrites them).
    pub(super) fn exchange_warm_up(&self, dp: &Dp, ex: &Exchange) -> Result<()> {
        let shard = self.shard();
        for p in piece_order(shard.rank, shard.world) {
            if p != shard.rank {
                let n = ex.piece_len();
                let (j, from) = exchange_step(shard.rank, shard.world, p);
                let send = self.grads.view().sub(ex.pieces[p].0 * 4, n * 4)?;
                let recv = ex.recv.view().sub((j - 1) * n * 4, n * 4)?;
                let comm = dp.comm();
                nccl::group(|| {
                    comm.send(send, n, DType::F32, p)?;
                    comm.recv(recv, n, DType::F32, from)
                })?;
            }
        }
        dp.comm().stream().synchronize()?;
        dp.comm().async_error()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_receives_its_piece_from_the_rank_computing_it_at_the_same_step() {
        for world in 2..=8 {
            for r in 0..world {
                let order = piece_order(r, world);
                assert_eq!(order.last(), Some(&r), "own piece last");
                let mut seen = order.clone();
                seen.sort_unstable();
                assert_eq!(seen, (0..world).collect::<Vec<_>>());
                for (step, &p) in order.iter().enumerate().take(world - 1) {
                    let (j, from) = exchange_step(r, world, p);
                    assert_eq!(j, step + 1);
                    // the sender computes r at the same step, and sends it to r
                    assert_eq!(piece_order(from, world)[step], r);
                    // the rank r sends to receives from r at that step
                    assert_eq!(exchange_step(p, world, piece_order(p, world)[step]).1, r);
                }
            }
        }
    }

    #[test]
    fn pieces_split_the_rows_evenly_where_the_exchange_applies() {
        assert_eq!(
            exchange_pieces(4096, 2, true, DType::F32),
            Some(vec![(0, 2048), (2048, 4096)])
        );
        assert_eq!(exchange_pieces(4096, 2, false, DType::F32), None);
        assert_eq!(exchange_pieces(4096, 2, true, DType::Bf16), None);
        assert_eq!(exchange_pieces(4095, 2, true, DType::F32), None);
        assert_eq!(exchange_pieces(4096, 1, true, DType::F32), None);
        assert_eq!(
            exchange_pieces(96, 3, true, DType::F32).map(|p| p.len()),
            Some(3)
        );
    }
}
