//! Data-parallel with a sharded optimizer, ranks as threads of one process: the gradients
//! reduce-scattered by the GPUs' copy engines, the first layer's exchanged piece by piece while
//! the next piece is computed (`GpuOptions::dp_exchange`).
//!
//! NCCL's reduce-scatter is a kernel: beside backward's products it takes multiprocessors
//! from them (run 125's profile: the product beside a reduce-scatter 113 us against 93
//! alone), and the first layer's weight gradient, backward's last product (64 MiB in f32 for
//! the 4096-wide MLP), cannot start its reduce-scatter before backward ends. Here every region
//! of the gradients (the buckets, the first layer's bias and its rows) is cut into one block a
//! rank as before; once a region is done, this GPU's copy engine writes each other rank's block
//! into that rank's receive buffer (`cuMemcpyPeerAsync` on a copy stream of its own, no
//! kernel), and the owner's optimizer reads its block and the received ones averaged in the
//! same pass (`(own + received) / world`, as NCCL's Avg; the ranks past two added first). The
//! first layer's rows are cut into one piece a rank (piece q: the rows rank q updates), each
//! rank computes the other ranks' pieces first (r + 1, r + 2, ... mod world), its own last,
//! and each piece leaves as soon as it is done, so the copies run under the next piece's
//! product. Only f32 gradients and op-by-op launches (a graph cannot hold another thread's
//! event); the weights' all-gather after the update stays NCCL's.
//!
//! The host threads hand each other the copies' events through [`DpPeers`] (a queue an
//! ordered pair of ranks and region): an owner waits on the host until the sender has queued
//! the copy, at most the timeout, and a rank that fails closes the queues so the others stop
//! with a message. A receive buffer is written again only after its owner read it: the sender's
//! next copy follows its next forward, which waited for the weights the owner gathered after
//! its update.

use super::plan::Layout;
use super::GpuTrainer;
use crate::error::{Error, Result};
use gpukit_cuda::transfer::{copy_peer, enable_peer_access};
use gpukit_cuda::{DeviceBuffer, Event, Gpu, Stream};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The copies' events from one rank to another, a queue a region (keyed by its first
/// element), in the order they were queued.
#[derive(Default)]
struct Queues {
    events: HashMap<(usize, usize, usize), VecDeque<Event>>,
    closed: bool,
}

/// What a rank publishes to the others: its GPU, its receive buffer, and the 16-bit weights
/// the products read (mixed precision: the others write their updated blocks there).
#[derive(Clone)]
struct Member {
    gpu: Arc<Gpu>,
    recv: Arc<DeviceBuffer>,
    weights: Option<Arc<DeviceBuffer>>,
}

/// A gather's queue key: the region's first element with the top bit set (a reduction's is
/// the first element alone).
const GATHER: usize = 1 << (usize::BITS - 1);

/// The ranks met so far: what each published (None: it failed before), and how many came.
struct Meeting {
    members: Vec<Option<Member>>,
    arrived: usize,
}

/// The data-parallel ranks of one process, met for the exchange: each one's GPU and receive
/// buffer, and a queue of copy events per sender, receiver and region. Shared by the threads.
pub struct DpPeers {
    world: usize,
    meeting: Mutex<Meeting>,
    met: Condvar,
    queues: Mutex<Queues>,
    moved: Condvar,
    timeout: Duration,
}

impl DpPeers {
    /// For `world` ranks, each waiting at most `timeout` for another's copy.
    pub fn new(world: usize, timeout: Duration) -> Arc<DpPeers> {
        Arc::new(DpPeers {
            world,
            meeting: Mutex::new(Meeting {
                members: vec![None; world],
                arrived: 0,
            }),
            met: Condvar::new(),
            queues: Mutex::new(Queues::default()),
            moved: Condvar::new(),
            timeout,
        })
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank` (`me`: its GPU, receive buffer and weights; None: it failed to make
    /// them) joins: every rank waits for the others (at most the timeout), then opens its GPU
    /// to theirs. Every rank must call it; an error reaches every rank.
    fn join(&self, rank: usize, me: Option<Member>) -> Result<Vec<Member>> {
        // allocated in the order of this GPU's work stream: ready before another's copy
        let ready = match &me {
            Some(m) => m.gpu.synchronize().map_err(Error::from),
            None => Err(Error::Failed("data-parallel: no receive buffer".into())),
        };
        let deadline = Instant::now() + self.timeout;
        let mut m = self.meeting.lock().unwrap_or_else(|p| p.into_inner());
        if ready.is_ok() {
            m.members[rank] = me;
        }
        m.arrived += 1;
        self.met.notify_all();
        while m.arrived < self.world {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Failed(format!(
                    "data-parallel: {} of {} ranks met for the exchange in {:.0} s",
                    m.arrived,
                    self.world,
                    self.timeout.as_secs_f64()
                )));
            }
            m = self
                .met
                .wait_timeout(m, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let all = m.members.clone();
        drop(m);
        ready?;
        let all: Vec<Member> = all.into_iter().collect::<Option<_>>().ok_or_else(|| {
            Error::Failed("data-parallel: another rank failed to join the exchange".into())
        })?;
        let gpu = all[rank].gpu.clone();
        for (q, m) in all.iter().enumerate() {
            // without peer access the driver stages the copies through the host: slower, the
            // same bytes
            if q != rank {
                enable_peer_access(&gpu, &m.gpu)?;
            }
        }
        Ok(all)
    }

    /// `from`'s copy of region `key` to `to` queued: its end.
    fn post(&self, (from, to, key): (usize, usize, usize), e: Event) {
        self.queues()
            .events
            .entry((from, to, key))
            .or_default()
            .push_back(e);
        self.moved.notify_all();
    }

    /// The end of the next copy of region `key` that `from` queued for `to` (waits for it on
    /// the host, at most the timeout).
    fn take(&self, (from, to, key): (usize, usize, usize)) -> Result<Event> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut warned = false;
        let mut q = self.queues();
        loop {
            if let Some(e) = q
                .events
                .get_mut(&(from, to, key))
                .and_then(VecDeque::pop_front)
            {
                return Ok(e);
            }
            if q.closed {
                return Err(Error::Failed(format!(
                    "data-parallel: rank {from} stopped before its copy to rank {to}"
                )));
            }
            if !warned && start.elapsed() > Duration::from_secs(5) {
                warned = true;
                gpukit_cuda::trace::note(|| {
                    format!("data-parallel: rank {to} waits for rank {from}'s copy of region {key}")
                });
            }
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(5));
            if Instant::now() >= deadline {
                return Err(Error::Failed(format!(
                    "data-parallel: no copy from rank {from} to rank {to} in {:.0} s",
                    self.timeout.as_secs_f64()
                )));
            }
            q = self
                .moved
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Wakes and fails every wait (a rank stopped).
    pub fn close(&self) {
        self.queues().closed = true;
        self.moved.notify_all();
    }
}

/// A rank's side of the exchange.
pub(super) struct Exchange {
    /// The first layer's rows, one piece a rank: its span of the flat gradient buffer.
    pieces_region: (usize, usize),
    /// The layer's bias and padding: each rank's block sent with its piece.
    pub(super) tail: (usize, usize),
    /// Where each region's received blocks start in a receive buffer (elements), by the
    /// region's first element.
    slots: HashMap<usize, usize>,
    /// The copy stream the blocks leave on.
    copy: Stream,
    /// Every rank's GPU and buffers (this rank's included).
    members: Vec<Member>,
    peers: Arc<DpPeers>,
    /// The end of this rank's last gather copies: its next update writes the blocks they read.
    gathered: Mutex<Option<Event>>,
}

/// The spans of the exchange's pieces (`rows`, ranges of the first layer's outputs) and of the
/// layer's tail (its bias and the padding after it) in the flat gradient buffer.
pub(super) fn exchange_spans(
    layout: &Layout,
    rows: &[(usize, usize)],
) -> (Vec<(usize, usize)>, (usize, usize)) {
    let (i, _) = layout.io(0);
    let (wo, _) = layout.offsets[0];
    let end = layout.span(0, 0).1;
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

/// Where in `owner`'s receive buffer `sender`'s copies land: slot 0..world - 1.
pub(super) fn slot(owner: usize, sender: usize, world: usize) -> usize {
    (sender + world - owner - 1) % world
}

impl Exchange {
    /// Rank `rank`'s side of the exchange on `gpu` for `regions` (each a multiple of the
    /// world's size), the first layer's `pieces` (equal spans, one a rank, together one of the
    /// regions) and `tail` (another): its receive buffer made, then the ranks met through
    /// `peers` (every rank must call it).
    pub(super) fn new(
        (gpu, weights): (&Arc<Gpu>, Option<Arc<DeviceBuffer>>),
        (rank, peers): (usize, Arc<DpPeers>),
        regions: &[(usize, usize)],
        (pieces, tail): (Vec<(usize, usize)>, (usize, usize)),
    ) -> Result<Exchange> {
        let world = peers.world;
        let n = pieces.first().map_or(0, |p| p.1 - p.0);
        let mut slots = HashMap::new();
        let mut at = 0;
        for &(a, b) in regions {
            slots.insert(a, at);
            at += (world - 1) * (b - a) / world;
        }
        let made = (|| -> Result<_> {
            if pieces.len() != world || pieces.iter().any(|p| p.1 - p.0 != n) {
                return Err(Error::Failed(format!(
                    "the exchange's pieces are not one a rank of {world} in equal spans: {pieces:?}"
                )));
            }
            Ok((Arc::new(gpu.alloc((at * 4).max(4))?), gpu.new_stream()?))
        })();
        let (recv, copy) = match made {
            Ok(m) => m,
            Err(e) => {
                // the others meet without this rank and fail there
                let _ = peers.join(rank, None);
                return Err(e);
            }
        };
        let me = Member {
            gpu: gpu.clone(),
            recv,
            weights,
        };
        let members = peers.join(rank, Some(me))?;
        Ok(Exchange {
            pieces_region: (pieces[0].0, pieces[world - 1].1),
            tail,
            slots,
            copy,
            members,
            peers,
            gathered: Mutex::new(None),
        })
    }

    /// The region the first layer's pieces make together.
    pub(super) fn pieces_region(&self) -> (usize, usize) {
        self.pieces_region
    }

    /// Block `sender`'s copy of region (a, b) lands in, in `owner`'s receive buffer: its
    /// first element and length.
    fn slot_of(
        &self,
        (a, b): (usize, usize),
        owner: usize,
        sender: usize,
    ) -> Result<(usize, usize)> {
        let world = self.members.len();
        let c = (b - a) / world;
        let base = self.slots.get(&a).copied().ok_or_else(|| {
            Error::Failed(format!("the exchange has no slots for region {a}..{b}"))
        })?;
        Ok((base + slot(owner, sender, world) * c, c))
    }

    /// The receive buffer's bytes for region (a, b)'s block from `sender` (this rank's buffer).
    pub(super) fn received(
        &self,
        region: (usize, usize),
        rank: usize,
        sender: usize,
    ) -> Result<gpukit_cuda::View<'_>> {
        let (at, c) = self.slot_of(region, rank, sender)?;
        Ok(self.members[rank].recv.view().sub(at * 4, c * 4)?)
    }

    /// The copy stream's work done before the gradients are written again.
    pub(super) fn copies_out(&self, work: &Stream) -> Result<()> {
        Ok(work.wait(&self.copy.record()?)?)
    }

    /// Whether the updated weights go to the other ranks by the copy engines (every rank's
    /// 16-bit weights shared; else NCCL's all-gather).
    pub(super) fn gathers(&self) -> bool {
        self.members.iter().all(|m| m.weights.is_some())
    }

    /// The work stream waits for every other rank's copy of its block of region `a..` of the
    /// weights into `rank`'s (the gather the last update launched).
    pub(super) fn wait_for_gather(&self, work: &Stream, rank: usize, a: usize) -> Result<()> {
        self.wait_for_copies(work, rank, a | GATHER)
    }

    /// Before an update writes this rank's blocks: the work stream waits for the gather
    /// copies that read them last.
    pub(super) fn before_update(&self, work: &Stream) -> Result<()> {
        let last = self
            .gathered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match last {
            Some(e) => Ok(work.wait(&e)?),
            None => Ok(()),
        }
    }

    /// The work stream waits for every other rank's copy of region `a..` into `rank`.
    pub(super) fn wait_for_copies(&self, work: &Stream, rank: usize, a: usize) -> Result<()> {
        for q in (0..self.members.len()).filter(|&q| q != rank) {
            work.wait(&self.peers.take((q, rank, a))?)?;
        }
        Ok(())
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

    /// Rank `to`'s block of region (a, b) of the gradients to it by this GPU's copy engine,
    /// once the work stream reaches here.
    fn send_block(&self, ex: &Exchange, (a, b): (usize, usize), to: usize) -> Result<()> {
        let rank = self.shard().rank;
        let (at, c) = ex.slot_of((a, b), to, rank)?;
        let (g, buf) = (&ex.members[to].gpu, &ex.members[to].recv);
        let block = self.grads.view().sub((a + to * c) * 4, c * 4)?;
        copy_peer(
            &ex.copy,
            buf.view().sub(at * 4, c * 4)?,
            g,
            block,
            &self.gpu,
            c * 4,
        )?;
        ex.peers.post((rank, to, a), ex.copy.record()?);
        Ok(())
    }

    /// After the update: this rank's block of each region of the 16-bit weights goes to every
    /// other rank's weights by this GPU's copy engine (the gather; `we` bytes an element).
    pub(super) fn exchange_gather(
        &self,
        ex: &Exchange,
        regions: &[(usize, usize)],
        we: usize,
    ) -> Result<()> {
        let (rank, world) = (self.shard().rank, self.shard().world);
        let weights = |q: usize| {
            ex.members[q].weights.as_ref().ok_or_else(|| {
                Error::Failed(format!("data-parallel: rank {q} shares no 16-bit weights"))
            })
        };
        ex.copy.wait(&self.gpu.stream().record()?)?;
        let mine = weights(rank)?;
        for &(a, b) in regions {
            let c = (b - a) / world;
            let src = mine.view().sub((a + rank * c) * we, c * we)?;
            for q in (0..world).filter(|&q| q != rank) {
                let dst = weights(q)?.view().sub((a + rank * c) * we, c * we)?;
                copy_peer(&ex.copy, dst, &ex.members[q].gpu, src, &self.gpu, c * we)?;
                ex.peers.post((rank, q, a | GATHER), ex.copy.record()?);
            }
        }
        *ex.gathered.lock().unwrap_or_else(|p| p.into_inner()) = Some(ex.copy.record()?);
        Ok(())
    }

    /// Region (a, b) of the gradients done (a bucket): every other rank's block leaves for it.
    pub(super) fn exchange_region(&self, ex: &Exchange, region: (usize, usize)) -> Result<()> {
        ex.copy.wait(&self.gpu.stream().record()?)?;
        let rank = self.shard().rank;
        for q in (0..self.shard().world).filter(|&q| q != rank) {
            self.send_block(ex, region, q)?;
        }
        Ok(())
    }

    /// Before the update of this rank's block `own` of region (a, b) carried by the copy
    /// engines: the work stream waits for the other ranks' copies, adds all but the last in,
    /// and returns the last with the scale the update averages by in its pass.
    pub(super) fn received_for_update<'e>(
        &self,
        ex: &'e Exchange,
        (a, b): (usize, usize),
        (oa, ob): (usize, usize),
    ) -> Result<Option<(gpukit_cuda::View<'e>, f32)>> {
        let (rank, world) = (self.shard().rank, self.shard().world);
        ex.wait_for_copies(self.gpu.stream(), rank, a)?;
        let own = self.grads.view().sub(oa * 4, (ob - oa) * 4)?;
        let others: Vec<usize> = (0..world).filter(|&q| q != rank).collect();
        let Some((&last, rest)) = others.split_last() else {
            return Ok(None);
        };
        for &q in rest {
            self.k.axpy(own, ex.received((a, b), rank, q)?, ob - oa)?;
        }
        Ok(Some((ex.received((a, b), rank, last)?, 1.0 / world as f32)))
    }

    /// After piece `p` of the first layer's weight gradient: another rank's piece and its
    /// block of the layer's tail leave for it. Whether `p` was this rank's own (the last: both
    /// regions are then ready for the update, which waits for the others' copies).
    pub(super) fn exchange_piece_done(&self, ex: &Exchange, p: usize) -> Result<bool> {
        if p == self.shard().rank {
            return Ok(true);
        }
        ex.copy.wait(&self.gpu.stream().record()?)?;
        self.send_block(ex, ex.tail, p)?;
        self.send_block(ex, ex.pieces_region(), p)?;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_computes_the_others_pieces_first_and_no_two_the_same_at_once() {
        for world in 2..=8 {
            for r in 0..world {
                let order = piece_order(r, world);
                assert_eq!(order.last(), Some(&r), "own piece last");
                let mut seen = order.clone();
                seen.sort_unstable();
                assert_eq!(seen, (0..world).collect::<Vec<_>>());
            }
            // at every step each piece is computed by one rank: each owner's copies arrive
            // one at a time
            for step in 0..world {
                let mut at: Vec<usize> = (0..world).map(|r| piece_order(r, world)[step]).collect();
                at.sort_unstable();
                assert_eq!(at, (0..world).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn every_sender_has_a_slot_of_its_own_in_each_owners_buffer() {
        for world in 2..=8 {
            for owner in 0..world {
                let mut slots: Vec<usize> = (0..world)
                    .filter(|&s| s != owner)
                    .map(|s| slot(owner, s, world))
                    .collect();
                slots.sort_unstable();
                assert_eq!(slots, (0..world - 1).collect::<Vec<_>>());
            }
        }
    }
}
