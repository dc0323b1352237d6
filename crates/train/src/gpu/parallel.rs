//! Data-parallel training, as PyTorch's DistributedDataParallel does it: every rank holds the
//! whole model, takes its share of each combined batch (world x batch rows of the epoch's one
//! shuffled order), and averages its gradients with the others' through NCCL in buckets, each
//! launched on a communication stream as soon as backward has finished its layers, so the
//! transfers overlap the rest of backward. Each bucket's parameters are updated once its
//! averaging ends (the last bucket's averaging overlaps the others' update); every rank makes
//! the same update, and the run's losses are the combined batch's.
//!
//! With [`GpuOptions::shard_optimizer`] the optimizer is sharded as ZeRO stage 2 does it: each
//! bucket (and first-layer piece) is reduce-scattered instead, so rank r holds the average of
//! block r of it (every bucket splits into equal blocks: the layout is aligned to the ranks),
//! updates that block only, and the updated weights (the 16-bit copy in mixed precision, else
//! the f32 weights) are all-gathered on the communication stream while the next block is
//! updated. Every rank then makes the same update it would have made from all-reduced
//! gradients; the f32 master weights and the optimizer's moments outside a rank's blocks are
//! gathered once, at the end of a run.
//!
//! To use: build the [`GpuTrainer`] with [`GpuOptions::shard`] set, then
//! [`GpuTrainer::attach`] the rank's communicator (made on a stream of its own).

use super::exchange::{exchange_spans, Exchange};
use super::plan::{buckets, piece_spans};
use super::GpuTrainer;
use crate::error::{Error, Result};
use gpukit_cuda::nccl::{Comm, RedOp};
use gpukit_cuda::{Event, View};
use gpukit_types::DType;
use serde::{Deserialize, Serialize};

/// This process's (or thread's) place among the data-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub rank: usize,
    pub world: usize,
}

impl Shard {
    /// This rank's block of `region` (`n` elements of `ty`, split into `world` equal blocks)
    /// and the block's element count: what a reduce-scatter leaves here and an all-gather
    /// sends from here.
    fn block<'a>(
        self,
        region: gpukit_cuda::View<'a>,
        n: usize,
        ty: DType,
    ) -> Result<(gpukit_cuda::View<'a>, usize)> {
        let (e, c) = (ty.size_bytes(), n / self.world.max(1));
        Ok((region.sub(self.rank * c * e, c * e)?, c))
    }

    /// Rank `rank`'s first row (within the combined batch) and row count, for a combined batch
    /// of `m` rows of at most `world x batch`: `batch` each when full; the last, partial one
    /// shared as evenly as it goes (the first `m % world` ranks one row more).
    pub fn rows(self, m: usize, batch: usize) -> (usize, usize) {
        let (r, w) = (self.rank, self.world.max(1));
        if m >= w * batch {
            return (r * batch, batch);
        }
        let (base, extra) = (m / w, m % w);
        (r * base + r.min(extra), base + usize::from(r < extra))
    }
}

/// A rank's blocks of the flat buffer: each span [a, b) and its offset where they are packed.
type Blocks = [((usize, usize), usize)];

/// `whole` (`total` f32 values) cut to the blocks `own` (each at its packed offset, `len`
/// values in all), in a new buffer.
fn packed_copy(
    gpu: &gpukit_cuda::Gpu,
    whole: &gpukit_cuda::DeviceBuffer,
    (total, own, len): (usize, &Blocks, usize),
) -> Result<gpukit_cuda::DeviceBuffer> {
    if whole.len() != total * 4 {
        return Err(Error::Failed(
            "the optimizer's state is sharded already".into(),
        ));
    }
    let mine = gpu.alloc(len * 4)?;
    for &((a, b), at) in own {
        let n = (b - a) * 4;
        gpu.copy_view(mine.view().sub(at * 4, n)?, whole.view().sub(a * 4, n)?, n)?;
    }
    gpu.synchronize()?;
    Ok(mine)
}

/// A rank's communicator and its buckets.
pub(super) struct Dp {
    comm: Comm,
    buckets: Vec<(usize, usize)>,
    /// The first layer's weight-gradient pieces, as elements of the flat gradient buffer
    /// (empty: the layer is in `buckets`).
    pieces: Vec<(usize, usize)>,
    /// Averaging in bf16: the gradients cast into it before each all-reduce, widened back after.
    comm_buf: Option<gpukit_cuda::DeviceBuffer>,
    /// The optimizer is sharded: each region reduce-scattered, its block updated here and the
    /// weights all-gathered.
    sharded: bool,
    /// Why the optimizer is not sharded although it was asked to be.
    unsharded: Option<String>,
    /// The launched regions of the flat buffer (buckets, then pieces), for gathering the
    /// sharded state at the end of a run.
    regions: Vec<(usize, usize)>,
    /// Sharded: this rank's block of each region, [start, end) of the flat buffer, with its
    /// offset in the rank's moment buffers (the blocks packed in region order).
    own: Vec<((usize, usize), usize)>,
    /// Sharded: the weights' all-gathers of the last update not yet waited for, with the point
    /// of the communication stream after each; the next forward waits for a layer's before
    /// its product.
    /// (None: carried by the copy engines, exchange.rs).
    gathering: std::sync::Mutex<Vec<Gathering>>,
    /// The buckets launched for the update being enqueued: their elements of the flat
    /// gradient buffer, [start, end), and the point of the communication stream after each (with
    /// the exchange, every region's: the point its own gradients are done; the update waits for
    /// the other ranks' copies and averages while it reads, exchange.rs).
    launched: std::sync::Mutex<Vec<Launched>>,
    /// The first layer's weight gradient exchanged piece by piece (exchange.rs), where asked
    /// for and it applies.
    pub(super) exchange: Option<Exchange>,
}

/// A region's gather of the last update: its elements and NCCL's end (None: the copy engines).
type Gathering = ((usize, usize), Option<Event>);

/// A region launched for the update: its elements and the point its averaging is done (or,
/// carried by the copy engines, its own gradients are).
type Launched = ((usize, usize), Event);

impl Dp {
    /// Region [a, b) of the flat buffer done on `t`'s work stream up to here, its blocks on
    /// their way to their owners by the copy engines: launched for the update.
    pub(super) fn launched_copies(&self, t: &GpuTrainer, region: (usize, usize)) -> Result<()> {
        let done = t.gpu.stream().record()?;
        lock(&self.launched).push((region, done));
        Ok(())
    }
}

impl GpuTrainer {
    /// Data-parallel ranks as threads of one process: `peers` is where their exchange meets
    /// (the first layer's pieces through the copy engines, `GpuOptions::dp_exchange`). Before
    /// [`GpuTrainer::attach`]; every rank of `peers` must join.
    pub fn join_peers(&mut self, peers: std::sync::Arc<super::DpPeers>) {
        self.peers = Some(peers);
    }

    /// Joins this trainer to its data-parallel peers: `comm` (this rank's communicator, on a
    /// stream of this GPU other than the work stream) averages the gradients in buckets of
    /// about `bucket_bytes`.
    pub fn attach(&mut self, comm: Comm, bucket_bytes: usize) -> Result<()> {
        let shard = self.opts.shard.ok_or_else(|| {
            Error::Setting("a communicator needs a trainer built for a shard".into())
        })?;
        if comm.size != shard.world || comm.rank != shard.rank {
            return Err(Error::Setting(format!(
                "the communicator is rank {} of {}, the trainer's shard rank {} of {}",
                comm.rank, comm.size, shard.rank, shard.world
            )));
        }
        let comm_buf = match self.opts.grad_comm {
            DType::F32 => None,
            DType::Bf16 => Some(self.gpu.alloc(self.layout.total * 2)?),
            other => {
                return Err(Error::Setting(format!(
                    "gradients are averaged in f32 or bf16, not {other}"
                )))
            }
        };
        let comm_type = self.opts.grad_comm;
        // in 16-bit precision a sharded rank keeps only its blocks of the f32 weights current
        // (the products read the gathered 16-bit copy): a forward that reads a bias in f32
        // (gpukit's bias kernel, or an epilogue without a 16-bit bias) needs them all
        let f32_bias = self.half.is_some().then(|| {
            self.fusion.iter().position(|f| {
                !matches!(f.forward, Some(t) if t != DType::F32)
                    || !matches!(f.eval, Some(t) if t != DType::F32)
            })
        });
        let unsharded = match f32_bias.flatten() {
            Some(l) if self.opts.shard_optimizer => Some(format!(
                "layer {l}'s forward reads its bias in f32, which a sharded rank does not keep \
                 current: every gradient is averaged instead"
            )),
            _ => None,
        };
        let sharded = self.opts.shard_optimizer && shard.world > 1 && unsharded.is_none();
        if sharded && self.opts.precision.scaled() {
            return Err(Error::Setting(
                "a sharded optimizer needs every rank to see every gradient's overflow check: \
                 train in bf16 rather than fp16"
                    .into(),
            ));
        }
        // exchanged: one piece a rank, the layer's rows only (the bias a region of its own)
        let exchanged = sharded
            && self.opts.dp_exchange
            && self.opts.graph != Some(true)
            && comm_type == DType::F32
            && self.grad_pieces.len() == shard.world
            && self.peers.is_some();
        let (pieces, tail) = match exchanged {
            true => {
                let (p, t) = exchange_spans(&self.layout, &self.grad_pieces);
                (p, Some(t))
            }
            false => (piece_spans(&self.layout, &self.grad_pieces), None),
        };
        let first = usize::from(!pieces.is_empty());
        let buckets = buckets(&self.layout, bucket_bytes.max(1), first);
        let exchange_regions = match (tail, pieces.first(), pieces.last()) {
            (Some(t), Some(f), Some(l)) => vec![t, (f.0, l.1)],
            _ => pieces.clone(),
        };
        let regions: Vec<(usize, usize)> = buckets
            .iter()
            .map(|&(lo, hi)| self.layout.span(lo, hi))
            .chain(exchange_regions)
            .collect();
        if sharded {
            if let Some(&(a, b)) = regions.iter().find(|(a, b)| (b - a) % shard.world != 0) {
                return Err(Error::Failed(format!(
                    "gradient elements {a}..{b} do not split into {} equal blocks",
                    shard.world
                )));
            }
        }
        // NCCL connects its peers at a communicator's first collective of each kind and size
        // class, which a graph capture refuses: run every region's collectives once now, on
        // the gradients (the first backward overwrites them)
        let weight_type = self.weight_type();
        for &(a, b) in &regions {
            let e = comm_type.size_bytes();
            let whole = comm_buf.as_ref().unwrap_or(&self.grads).view();
            let region = whole.sub(a * e, (b - a) * e)?;
            if sharded {
                let (block, c) = shard.block(region, b - a, comm_type)?;
                comm.reduce_scatter(region, block, c, comm_type, RedOp::Avg)?;
                let we = weight_type.size_bytes();
                let region = self.grads.view().sub(a * we, (b - a) * we)?;
                let (block, c) = shard.block(region, b - a, weight_type)?;
                comm.all_gather(block, region, c, weight_type)?;
            } else {
                comm.all_reduce(region, region, b - a, comm_type, RedOp::Avg)?;
            }
        }
        comm.stream().synchronize()?;
        comm.async_error()?;
        // sharded: the moments of this rank's blocks only (what the update reads and writes)
        let mut own = Vec::new();
        if sharded {
            let mut at = 0;
            for &(a, b) in &regions {
                let c = (b - a) / shard.world;
                let block = (a + shard.rank * c, a + (shard.rank + 1) * c);
                own.push((block, at));
                at += c;
            }
            self.shard_state(&own, at)?;
        }
        if self.opts.comm_sms > 0 {
            self.leave_sms_to_communication(self.opts.comm_sms)?;
        }
        let exchange = match (tail, &self.peers) {
            (Some(t), Some(peers)) => Some(Exchange::new(
                (&self.gpu, self.half.clone()),
                (shard.rank, peers.clone()),
                &regions,
                (pieces.clone(), t),
            )?),
            _ => None,
        };
        self.dp = Some(Dp {
            buckets,
            pieces,
            comm_buf,
            comm,
            sharded,
            unsharded,
            regions,
            own,
            gathering: std::sync::Mutex::new(Vec::new()),
            launched: std::sync::Mutex::new(Vec::new()),
            exchange,
        });
        // graphs captured without the communication would skip it
        self.graphs.clear();
        Ok(())
    }

    /// Plans every product again for the GPU's multiprocessors less `sms` (the ones NCCL's
    /// kernels then find free beside a product); the epilogues must stay the ones chosen.
    fn leave_sms_to_communication(&mut self, sms: u32) -> Result<()> {
        let ordinal = self.gpu.ordinal;
        let all = gpukit_cuda::driver::device_attributes(ordinal, ordinal + 1)?.sm_count;
        if sms >= all {
            return Err(Error::Setting(format!(
                "--comm-sms {sms}: this GPU has {all} multiprocessors; leave fewer to communication"
            )));
        }
        let before = self.fusion.clone();
        self.sm_target = Some(all - sms);
        self.plan_all()?;
        if self.fusion != before {
            return Err(Error::Failed(format!(
                "planned for {} of {all} multiprocessors, cuBLASLt fused other epilogues",
                all - sms
            )));
        }
        Ok(())
    }

    /// Multiprocessors the products leave to communication (0: none).
    pub fn comm_sms(&self) -> u32 {
        if self.sm_target.is_some() {
            self.opts.comm_sms
        } else {
            0
        }
    }

    /// After backward has finished layer `l` of an update's last batch: the bucket that ends
    /// there starts averaging on the communication stream, once the work stream has reached
    /// this point.
    pub(super) fn layer_done(&self, l: usize) -> Result<()> {
        let Some(dp) = &self.dp else { return Ok(()) };
        for &(lo, hi) in &dp.buckets {
            if lo == l {
                self.launch_average(dp, self.layout.span(lo, hi))?;
            }
        }
        Ok(())
    }

    /// After piece `p` of the first layer's weight gradient of an update's last batch: its
    /// averaging starts on the communication stream once the work stream has reached here.
    pub(super) fn piece_done(&self, p: usize) -> Result<()> {
        let Some(dp) = &self.dp else { return Ok(()) };
        if let Some(ex) = &dp.exchange {
            if self.exchange_piece_done(ex, p)? {
                dp.launched_copies(self, ex.tail)?;
                dp.launched_copies(self, ex.pieces_region())?;
            }
            return Ok(());
        }
        let Some(&(a, b)) = dp.pieces.get(p) else {
            return Ok(());
        };
        self.launch_average(dp, (a, b))
    }

    /// Averages gradient elements [a, b) on the communication stream after the work stream's
    /// current point; the update waits for it.
    pub(super) fn launch_average(&self, dp: &Dp, (a, b): (usize, usize)) -> Result<()> {
        if let Some(ex) = &dp.exchange {
            self.exchange_region(ex, (a, b))?;
            return dp.launched_copies(self, (a, b));
        }
        let grads = self.grads.view().sub(a * 4, (b - a) * 4)?;
        let (region, ty) = match &dp.comm_buf {
            Some(buf) => {
                let half = buf.view().sub(a * 2, (b - a) * 2)?;
                self.k.cast(grads, half, DType::Bf16, b - a)?;
                (half, DType::Bf16)
            }
            None => (grads, DType::F32),
        };
        dp.comm.stream().wait(&self.gpu.stream().record()?)?;
        if dp.sharded {
            let (block, c) = self.shard().block(region, b - a, ty)?;
            dp.comm.reduce_scatter(region, block, c, ty, RedOp::Avg)?;
        } else {
            dp.comm.all_reduce(region, region, b - a, ty, RedOp::Avg)?;
        }
        let done = dp.comm.stream().record()?;
        lock(&dp.launched).push(((a, b), done));
        Ok(())
    }

    /// Before the update: the work stream waits for the last bucket (and, averaging in bf16,
    /// widens every launched region back into the f32 gradients).
    pub(super) fn gradients_averaged(&self) -> Result<()> {
        if let Some(dp) = &self.dp {
            let launched = std::mem::take(&mut *lock(&dp.launched));
            self.gpu.stream().wait(&dp.comm.stream().record()?)?;
            for ((a, b), _) in launched {
                self.widen_averaged(dp, (a, b))?;
            }
        }
        Ok(())
    }

    /// Averaging in bf16: gradient elements [a, b) back from the communication buffer (on the
    /// work stream, after it waited for their all-reduce).
    fn widen_averaged(&self, dp: &Dp, (a, b): (usize, usize)) -> Result<()> {
        if let Some(buf) = &dp.comm_buf {
            let half = buf.view().sub(a * 2, (b - a) * 2)?;
            let grads = self.grads.view().sub(a * 4, (b - a) * 4)?;
            self.k.widen(half, grads, DType::Bf16, b - a)?;
        }
        Ok(())
    }

    /// The update in pieces, each as soon as its gradients are averaged: `update(start, end)`
    /// is enqueued for each bucket's elements once the work stream waits for that bucket, so
    /// the update of the layers backward finished first overlaps the averaging of the last.
    /// Without peers: one piece. When the launched buckets do not cover every gradient: one
    /// piece after every bucket.
    pub(super) fn update_in_pieces(
        &self,
        mut update: impl FnMut(usize, usize, Option<(View<'_>, f32)>) -> Result<()>,
    ) -> Result<()> {
        let total = self.layout.total;
        let Some(dp) = &self.dp else {
            return update(0, total, None);
        };
        let launched = std::mem::take(&mut *lock(&dp.launched));
        let covered: usize = launched.iter().map(|((a, b), _)| b - a).sum();
        if dp.sharded {
            if covered != total {
                return Err(Error::Failed(format!(
                    "a sharded update needs every gradient averaged: {covered} of {total} were"
                )));
            }
            // each region's own block updated once its reduce-scatter is done; then the
            // weights gathered in the order the next forward reads them (the first layer's
            // first), each layer's product waiting only for its own
            let mut regions = Vec::new();
            let work = self.gpu.stream();
            if let Some(ex) = &dp.exchange {
                ex.before_update(work)?;
            }
            for ((a, b), done) in launched {
                work.wait(&done)?;
                let (oa, ob) = self.own_block((a, b));
                let also = match &dp.exchange {
                    Some(ex) => self.received_for_update(ex, (a, b), (oa, ob))?,
                    None => {
                        self.widen_averaged(dp, (oa, ob))?;
                        None
                    }
                };
                update(oa, ob, also)?;
                regions.push((a, b));
            }
            if let Some(ex) = &dp.exchange {
                ex.copies_out(work)?;
            }
            regions.sort_unstable();
            let mut gathering = lock(&dp.gathering);
            if let Some(ex) = dp.exchange.as_ref().filter(|ex| ex.gathers()) {
                self.exchange_gather(ex, &regions, self.weight_type().size_bytes())?;
                gathering.extend(regions.into_iter().map(|r| (r, None)));
                return Ok(());
            }
            dp.comm.stream().wait(&self.gpu.stream().record()?)?;
            for region in regions {
                self.gather(dp, region, self.weights_buffer(), self.weight_type())?;
                gathering.push((region, Some(dp.comm.stream().record()?)));
            }
            return Ok(());
        }
        if covered != total {
            self.gpu.stream().wait(&dp.comm.stream().record()?)?;
            for &((a, b), _) in &launched {
                self.widen_averaged(dp, (a, b))?;
            }
            return update(0, total, None);
        }
        for ((a, b), done) in launched {
            self.gpu.stream().wait(&done)?;
            self.widen_averaged(dp, (a, b))?;
            update(a, b, None)?;
        }
        Ok(())
    }

    /// Before layer `l`'s forward product (sharded): the work stream waits for the gathers of
    /// the last update that cover the layer's weights and bias.
    pub(super) fn weights_ready(&self, l: usize) -> Result<()> {
        let Some(dp) = self.dp.as_ref().filter(|d| d.sharded) else {
            return Ok(());
        };
        let (lo, hi) = self.layout.span(l, l);
        let mut gathering = lock(&dp.gathering);
        for ((a, _), done) in gathering.iter().filter(|((a, b), _)| *a < hi && lo < *b) {
            self.gather_done(dp, *a, done.as_ref())?;
        }
        gathering.retain(|((a, b), _)| !(*a < hi && lo < *b));
        Ok(())
    }

    /// The work stream waits for every gather still pending (before the end of an epoch's
    /// work, which a graph capture or a read of the results needs joined).
    pub(super) fn gathers_joined(&self) -> Result<()> {
        let Some(dp) = self.dp.as_ref().filter(|d| d.sharded) else {
            return Ok(());
        };
        let mut gathering = lock(&dp.gathering);
        for ((a, _), done) in gathering.drain(..) {
            self.gather_done(dp, a, done.as_ref())?;
        }
        Ok(())
    }

    /// The work stream waits for the gather of the region starting at `a`: NCCL's (`done`) or
    /// the other ranks' copies.
    fn gather_done(&self, dp: &Dp, a: usize, done: Option<&Event>) -> Result<()> {
        match (done, &dp.exchange) {
            (Some(e), _) => Ok(self.gpu.stream().wait(e)?),
            (None, Some(ex)) => ex.wait_for_gather(self.gpu.stream(), self.shard().rank, a),
            (None, None) => Err(Error::Failed(
                "a gather by the copy engines without the exchange".into(),
            )),
        }
    }

    /// Rank r's block of region [a, b) of the flat buffer, sharded: block r of `world` equal
    /// blocks.
    pub(super) fn own_block(&self, (a, b): (usize, usize)) -> (usize, usize) {
        let s = self.shard();
        let c = (b - a) / s.world;
        (a + s.rank * c, a + (s.rank + 1) * c)
    }

    /// Region [a, b) of `buf` (elements of `ty`) made whole on every rank from each rank's own
    /// block of it, on the communication stream (NCCL's in-place all-gather).
    fn gather(
        &self,
        dp: &Dp,
        (a, b): (usize, usize),
        buf: &gpukit_cuda::DeviceBuffer,
        ty: DType,
    ) -> Result<()> {
        let e = ty.size_bytes();
        let region = buf.view().sub(a * e, (b - a) * e)?;
        let (block, c) = self.shard().block(region, b - a, ty)?;
        dp.comm.all_gather(block, region, c, ty)?;
        Ok(())
    }

    /// The weights the products read: the 16-bit copy in mixed precision, else the f32 ones.
    fn weights_buffer(&self) -> &gpukit_cuda::DeviceBuffer {
        self.half.as_deref().unwrap_or(&self.params)
    }

    fn weight_type(&self) -> DType {
        if self.half.is_some() {
            self.opts.precision.storage()
        } else {
            DType::F32
        }
    }

    /// A sharded optimizer's state made whole at the end of a run, before anything reads it
    /// back (each rank updated, and in mixed precision keeps, only its blocks): the f32 weights
    /// gathered in place where every rank keeps them whole (fp32: the products read them),
    /// else, with the moments, one at a time through the gradients' buffer (free at the end of
    /// a run) and kept on the host for `store`. Every rank must call it. Nothing to do
    /// otherwise.
    pub(super) fn gather_shards(&self) -> Result<()> {
        let Some(dp) = self.dp.as_ref().filter(|d| d.sharded) else {
            return Ok(());
        };
        dp.comm.stream().wait(&self.gpu.stream().record()?)?;
        let params = if self.params_sharded() {
            Some(self.gather_packed(dp, &self.params)?)
        } else {
            for &region in &dp.regions {
                self.gather(dp, region, &self.params, DType::F32)?;
            }
            None
        };
        let mut moments = Vec::new();
        for buf in [self.m.as_ref(), self.v.as_ref()].into_iter().flatten() {
            moments.push(self.gather_packed(dp, buf)?);
        }
        self.gpu.stream().wait(&dp.comm.stream().record()?)?;
        self.gpu.synchronize()?;
        dp.comm.async_error()?;
        self.gathered
            .replace(Some(super::Gathered { params, moments }));
        Ok(())
    }

    /// Every parameter's values of a buffer each rank keeps packed (its blocks only): the
    /// blocks put in place in the gradients' buffer, all-gathered there, downloaded.
    fn gather_packed(&self, dp: &Dp, buf: &gpukit_cuda::DeviceBuffer) -> Result<Vec<f32>> {
        for &((a, b), at) in &dp.own {
            let n = (b - a) * 4;
            self.gpu.copy_view(
                self.grads.view().sub(a * 4, n)?,
                buf.view().sub(at * 4, n)?,
                n,
            )?;
        }
        dp.comm.stream().wait(&self.gpu.stream().record()?)?;
        for &region in &dp.regions {
            self.gather(dp, region, &self.grads, DType::F32)?;
        }
        self.gpu.stream().wait(&dp.comm.stream().record()?)?;
        Ok(super::f32s(&self.gpu.download(&self.grads)?))
    }

    /// Sharded at attach: the moments, and in mixed precision the f32 weights (the products
    /// read the 16-bit copy), cut to this rank's blocks (`own`, `len` elements in all), their
    /// values kept; the freed memory leaves the report.
    fn shard_state(&mut self, own: &Blocks, len: usize) -> Result<()> {
        let total = self.layout.total;
        let mixed = self.half.is_some();
        let mut kept = 0;
        for slot in [&mut self.m, &mut self.v] {
            let Some(whole) = slot.as_ref() else {
                continue;
            };
            let mine = packed_copy(&self.gpu, whole, (total, own, len))?;
            kept += mine.len();
            *slot = Some(mine);
        }
        self.memory.optimizer_state = kept;
        if mixed {
            self.params = packed_copy(&self.gpu, &self.params, (total, own, len))?;
            self.memory.weights = self.params.len()
                + self
                    .half
                    .as_deref()
                    .map_or(0, gpukit_cuda::DeviceBuffer::len);
        }
        Ok(())
    }

    /// Whether this rank keeps only its blocks of the moments.
    pub(super) fn moments_sharded(&self) -> bool {
        self.dp.as_ref().is_some_and(|d| !d.own.is_empty())
    }

    /// Whether this rank keeps only its blocks of the f32 weights (sharded in mixed precision).
    pub(super) fn params_sharded(&self) -> bool {
        self.moments_sharded() && self.half.is_some()
    }

    /// Elements [a, b) of the flat buffer in a moment buffer `buf`: the same span, or with
    /// sharded moments the packed place of this rank's block that is exactly [a, b).
    pub(super) fn state_span<'b>(
        &self,
        buf: &'b gpukit_cuda::DeviceBuffer,
        (a, b): (usize, usize),
    ) -> Result<gpukit_cuda::View<'b>> {
        self.span_in(buf, (a, b), self.moments_sharded())
    }

    /// Elements [a, b) of the f32 weights (as [`GpuTrainer::state_span`], where they are
    /// sharded).
    pub(super) fn params_span(&self, (a, b): (usize, usize)) -> Result<gpukit_cuda::View<'_>> {
        self.span_in(&self.params, (a, b), self.params_sharded())
    }

    fn span_in<'b>(
        &self,
        buf: &'b gpukit_cuda::DeviceBuffer,
        (a, b): (usize, usize),
        packed: bool,
    ) -> Result<gpukit_cuda::View<'b>> {
        let at = match self.dp.as_ref().filter(|_| packed) {
            None => a,
            Some(dp) => {
                let &(_, at) = dp.own.iter().find(|(s, _)| *s == (a, b)).ok_or_else(|| {
                    Error::Failed(format!(
                        "elements {a}..{b} are not one of this rank's blocks of the optimizer's \
                         state"
                    ))
                })?;
                at
            }
        };
        Ok(buf.view().sub(at * 4, (b - a) * 4)?)
    }

    /// A moment buffer set from every parameter's values (`flat`): with sharded moments, this
    /// rank's blocks of them.
    pub(super) fn upload_state(&self, buf: &gpukit_cuda::DeviceBuffer, flat: &[f32]) -> Result<()> {
        self.upload_in(buf, flat, self.moments_sharded())
    }

    /// The f32 weights set from every parameter's values (`flat`), packed where sharded.
    pub(super) fn upload_params(&self, flat: &[f32]) -> Result<()> {
        self.upload_in(&self.params, flat, self.params_sharded())
    }

    fn upload_in(&self, buf: &gpukit_cuda::DeviceBuffer, flat: &[f32], packed: bool) -> Result<()> {
        match self.dp.as_ref().filter(|_| packed) {
            None => self.gpu.upload_into(buf.view(), super::bytes(flat))?,
            Some(dp) => {
                for &((a, b), at) in &dp.own {
                    self.gpu.upload_into(
                        buf.view().sub(at * 4, (b - a) * 4)?,
                        super::bytes(&flat[a..b]),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Whether the optimizer is sharded over the ranks.
    pub fn sharded_optimizer(&self) -> bool {
        self.dp.as_ref().is_some_and(|d| d.sharded)
    }

    /// Whether the first layer's weight gradient is exchanged piece by piece (exchange.rs).
    pub fn first_layer_exchanged(&self) -> bool {
        self.dp.as_ref().is_some_and(|d| d.exchange.is_some())
    }

    /// Whether the updated 16-bit weights reach the other ranks by the copy engines (else
    /// NCCL's all-gather).
    pub fn weights_gathered_by_copies(&self) -> bool {
        self.dp
            .as_ref()
            .and_then(|d| d.exchange.as_ref())
            .is_some_and(|ex| ex.gathers())
    }

    /// Why the optimizer is not sharded although the options asked for it.
    pub fn unsharded_reason(&self) -> Option<&str> {
        self.dp.as_ref().and_then(|d| d.unsharded.as_deref())
    }

    /// The whole combined batches' figures from each rank's own: `values` (one per batch,
    /// already weighted by the rank's share) summed over ranks. Identity without peers.
    pub(super) fn sum_over_ranks(&self, values: &[f64]) -> Result<Vec<f64>> {
        match &self.dp {
            Some(dp) => reduce_f64((&self.gpu, &dp.comm), values, RedOp::Sum),
            None => Ok(values.to_vec()),
        }
    }

    /// How many buckets the gradients are averaged in (0 without peers).
    pub fn buckets(&self) -> usize {
        self.dp.as_ref().map_or(0, |d| d.buckets.len())
    }

    /// How many pieces the first layer's weight gradient is computed and averaged in (1:
    /// whole, in a bucket; 0 without peers).
    pub fn grad_pieces(&self) -> usize {
        self.dp.as_ref().map_or(0, |d| d.pieces.len().max(1))
    }

    pub(super) fn shard(&self) -> Shard {
        self.opts.shard.unwrap_or(Shard { rank: 0, world: 1 })
    }
}

/// The mutex's value, also after a panic elsewhere held it (the list is only pushed and taken).
/// `values` reduced by `op` over the ranks of `comm` (on `gpu`), back on the host; every rank
/// must call it with as many values.
pub(crate) fn reduce_f64(
    (gpu, comm): (&gpukit_cuda::Gpu, &Comm),
    values: &[f64],
    op: RedOp,
) -> Result<Vec<f64>> {
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let buf = gpu.upload(&bytes)?;
    gpu.synchronize()?;
    comm.all_reduce(buf.view(), buf.view(), values.len(), DType::F64, op)?;
    comm.stream().synchronize()?;
    comm.async_error()?;
    let back = gpu.download(&buf)?;
    Ok(back
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::super::plan::Layout;
    use super::*;

    #[test]
    fn ranks_share_each_combined_batch_without_gaps_or_overlaps() {
        for (m, batch, world) in [(8, 4, 2), (7, 4, 2), (5, 4, 3), (12, 4, 3), (3, 8, 3)] {
            let mut next = 0;
            for rank in 0..world {
                let (first, rows) = Shard { rank, world }.rows(m, batch);
                assert_eq!(first, next, "{m} {batch} {world} rank {rank}");
                assert!(rows <= batch);
                next += rows;
            }
            assert_eq!(next, m.min(world * batch));
        }
        // full batches: `batch` rows each, in rank order
        assert_eq!(Shard { rank: 1, world: 2 }.rows(8, 4), (4, 4));
    }

    #[test]
    fn a_sharded_optimizers_regions_split_into_equal_blocks_a_rank() {
        use super::super::plan::{split, split_for_blocks};
        for widths in [
            vec![48, 64, 64, 10],
            vec![7, 33, 5],
            vec![3, 1, 1],
            vec![4096, 4096, 1],
        ] {
            for world in 1..=8 {
                let layout = Layout::aligned(&widths, world);
                let (i, o) = layout.io(0);
                for count in [1, 2, 3, 4, 7] {
                    let pieces = split_for_blocks(split(o, count), i, world);
                    assert!(!pieces.is_empty() && pieces.len() <= count);
                    assert_eq!(pieces.last().map(|p| p.1), Some(o));
                    let spans = if pieces.len() > 1 {
                        piece_spans(&layout, &pieces)
                    } else {
                        Vec::new()
                    };
                    let first = usize::from(!spans.is_empty());
                    let mut all: Vec<(usize, usize)> = buckets(&layout, 1, first)
                        .iter()
                        .map(|&(lo, hi)| layout.span(lo, hi))
                        .chain(spans)
                        .collect();
                    all.sort_unstable();
                    let mut at = 0;
                    for &(a, b) in &all {
                        let tag = format!("{widths:?} world {world} {count} pieces: {all:?}");
                        assert_eq!(a, at, "{tag}");
                        assert!(b > a, "{tag}");
                        assert_eq!((b - a) % world, 0, "{tag}");
                        at = b;
                    }
                    assert_eq!(at, layout.total);
                }
            }
        }
    }
}
