//! Pipeline stages of one process joined by the GPUs' copy engines instead of NCCL.
//!
//! NCCL's send and receive are kernels: each pair meets on both GPUs' work streams, so every
//! transfer sits on the critical path of both stages (the slower stage waits for its partner's
//! kernel to start, then for the bytes), and a transfer queued on a stream of its own takes
//! multiprocessors from the products beside it. Here each direction between two neighbouring
//! stages is a [`Mailbox`]: two buffers on the receiver's GPU that the sender's copy engine
//! fills (`cuMemcpyPeerAsync` over NVLink or PCIe, no kernel) on a copy stream of its own, once
//! its work stream has produced the data and the receiver has emptied the buffer. The receiver's
//! work stream waits for the copy's event, then moves the bytes into its own buffer with a local
//! copy, which frees the mailbox's buffer for the transfer after next. Neither stage's work
//! stream runs a communication kernel, and a transfer overlaps whatever the two stages compute.
//!
//! The host threads hand each other the events through the mailbox (a bounded buffer of two):
//! a sender waits on the host only when the receiver has not yet taken the transfer two back,
//! a receiver until its sender has queued the copy. Both wait at most the given timeout, and a
//! stage that fails closes its mailboxes so the stage beside stops with a message.
//!
//! To use: every stage's thread calls [`Links::connect`] once with its trainer's GPU and the
//! bytes its inbound transfers take; the [`StageLinks`] it returns is handed to
//! [`super::GpuTrainer::attach_pipeline_links`].

use crate::error::{Error, Result};
use gpukit_cuda::transfer::{copy_peer, enable_peer_access};
use gpukit_cuda::{DeviceBuffer, Event, Gpu, Stream, View};
use std::sync::{Arc, Barrier, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Transfers a mailbox holds at once.
const DEPTH: usize = 2;

/// The host's record of a mailbox's transfers.
#[derive(Default)]
struct Ring {
    pushed: u64,
    taken: u64,
    /// The copy into each buffer, once queued (the receiver's work stream waits for it).
    arrived: [Option<Event>; DEPTH],
    /// The receiver's local copy out of each buffer (the next copy into it waits for it).
    free: [Option<Event>; DEPTH],
    closed: bool,
}

/// One direction between two stages: buffers on the receiver's GPU filled by the sender's
/// copy engine.
pub struct Mailbox {
    // declared before `to`: freed while the receiver's context lives
    slots: [DeviceBuffer; DEPTH],
    ring: Mutex<Ring>,
    moved: Condvar,
    to: Arc<Gpu>,
    timeout: Duration,
}

impl Mailbox {
    fn new(to: &Arc<Gpu>, bytes: usize, timeout: Duration) -> Result<Mailbox> {
        let slots = [to.alloc(bytes.max(4))?, to.alloc(bytes.max(4))?];
        // allocated in the order of `to`'s work stream: ready before another GPU's copy
        to.synchronize()?;
        Ok(Mailbox {
            slots,
            ring: Mutex::new(Ring::default()),
            moved: Condvar::new(),
            to: to.clone(),
            timeout,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ring once `ready` holds (or an error once closed or after the timeout).
    fn wait_for(&self, what: &str, ready: impl Fn(&Ring) -> bool) -> Result<MutexGuard<'_, Ring>> {
        let deadline = Instant::now() + self.timeout;
        let mut ring = self.lock();
        loop {
            if ready(&ring) {
                return Ok(ring);
            }
            if ring.closed {
                return Err(Error::Failed(format!(
                    "pipeline: the stage beside stopped ({what})"
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Failed(format!(
                    "pipeline: no progress from the stage beside in {:.0} s ({what})",
                    self.timeout.as_secs_f64()
                )));
            }
            ring = self
                .moved
                .wait_timeout(ring, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Sender: queues on `copy` (a stream of `from`) a copy of `bytes` bytes of `src` into the
    /// next buffer, once `work` (`from`'s work stream) has reached this point and the receiver
    /// has emptied the buffer. Returns the copy's end: `src` may be overwritten after it.
    fn push(
        &self,
        from: &Gpu,
        work: &Stream,
        copy: &Stream,
        src: View<'_>,
        bytes: usize,
    ) -> Result<Event> {
        let mut ring = self.wait_for("its buffers stayed full", |r| {
            r.pushed - r.taken < DEPTH as u64
        })?;
        let k = (ring.pushed % DEPTH as u64) as usize;
        if let Some(free) = ring.free[k].take() {
            copy.wait(&free)?;
        }
        copy.wait(&work.record()?)?;
        let dst = self.slots[k].view().sub(0, bytes)?;
        copy_peer(copy, dst, &self.to, src, from, bytes)?;
        ring.arrived[k] = Some(copy.record()?);
        let done = copy.record()?;
        ring.pushed += 1;
        drop(ring);
        self.moved.notify_all();
        Ok(done)
    }

    /// Receiver: makes the work stream of `gpu` (this mailbox's GPU) wait for the next
    /// transfer, then copy its `bytes` bytes into `dst`.
    fn take(&self, gpu: &Gpu, dst: View<'_>, bytes: usize) -> Result<()> {
        let mut ring = self.wait_for("nothing was sent", |r| r.pushed > r.taken)?;
        let k = (ring.taken % DEPTH as u64) as usize;
        let arrived = ring.arrived[k]
            .take()
            .ok_or_else(|| Error::Failed("pipeline: a transfer without its copy".into()))?;
        let work = gpu.stream();
        work.wait(&arrived)?;
        gpu.copy_view(dst, self.slots[k].view(), bytes)?;
        ring.free[k] = Some(work.record()?);
        ring.taken += 1;
        drop(ring);
        self.moved.notify_all();
        Ok(())
    }

    /// Wakes and fails every wait on this mailbox (the stage on one side stopped).
    fn close(&self) {
        self.lock().closed = true;
        self.moved.notify_all();
    }
}

/// A stage's inbound mailboxes: from the stage before and from the stage after.
type Inboxes = (Option<Arc<Mailbox>>, Option<Arc<Mailbox>>);

/// What every stage of one process publishes: its GPU and its inbound mailboxes.
#[derive(Default)]
struct Board {
    /// `inbox[i]`: stage i's.
    inbox: Vec<Option<Inboxes>>,
    gpus: Vec<Option<Arc<Gpu>>>,
}

/// The stages' meeting point, shared by their threads.
pub struct Links {
    stages: usize,
    board: Mutex<Board>,
    barrier: Barrier,
    timeout: Duration,
}

impl Links {
    /// For `stages` stages, each waiting at most `timeout` for the stage beside.
    pub fn new(stages: usize, timeout: Duration) -> Links {
        Links {
            stages,
            board: Mutex::new(Board {
                inbox: vec![None; stages],
                gpus: vec![None; stages],
            }),
            barrier: Barrier::new(stages),
            timeout,
        }
    }

    /// Stage `index` (on `gpu`) joins: its inbound mailboxes are made (`from_prev` bytes a
    /// transfer from the stage before, `from_next` from the stage after), every stage waits
    /// for the others, then each opens its GPU to its neighbours' and takes their mailboxes.
    /// Every stage must call it (an error is returned after the meeting, to every stage).
    pub fn connect(
        &self,
        index: usize,
        gpu: &Arc<Gpu>,
        (from_prev, from_next): (usize, usize),
    ) -> Result<StageLinks> {
        let n = self.stages;
        let made = (|| -> Result<_> {
            let make = |b| Mailbox::new(gpu, b, self.timeout).map(Arc::new);
            let prev = if index > 0 {
                Some(make(from_prev)?)
            } else {
                None
            };
            let next = if index + 1 < n {
                Some(make(from_next)?)
            } else {
                None
            };
            Ok((prev, next))
        })();
        let mine = match &made {
            Ok(m) => Some(m.clone()),
            Err(_) => None,
        };
        {
            let mut board = self.board.lock().unwrap_or_else(|p| p.into_inner());
            board.inbox[index] = mine;
            board.gpus[index] = made.is_ok().then(|| gpu.clone());
        }
        self.barrier.wait();
        made?;
        let board = self.board.lock().unwrap_or_else(|p| p.into_inner());
        let neighbour = |i: usize| -> Result<(Arc<Gpu>, &Inboxes)> {
            match (&board.gpus[i], &board.inbox[i]) {
                (Some(g), Some(m)) => Ok((g.clone(), m)),
                _ => Err(Error::Failed(format!(
                    "pipeline: stage {i} could not make its transfer buffers (its error is reported)"
                ))),
            }
        };
        let (own_prev, own_next) = board.inbox[index]
            .clone()
            .ok_or_else(|| Error::Failed("pipeline: this stage's buffers".into()))?;
        let mut links = StageLinks {
            copy: gpu.new_stream()?,
            prev: None,
            next: None,
            sent_grad: Default::default(),
            sent_act: Default::default(),
        };
        let open = |peer: &Gpu| -> Result<()> {
            if enable_peer_access(gpu, peer)? {
                Ok(())
            } else {
                Err(Error::Failed(format!(
                    "pipeline: cuda:{} cannot reach cuda:{}'s memory directly",
                    gpu.ordinal, peer.ordinal
                )))
            }
        };
        if index > 0 {
            let (g, (_, to_prev)) = neighbour(index - 1)?;
            open(&g)?;
            let out = to_prev
                .clone()
                .ok_or_else(|| Error::Failed("pipeline: no mailbox".into()))?;
            let inn = own_prev.ok_or_else(|| Error::Failed("pipeline: no mailbox".into()))?;
            links.prev = Some((inn, out));
        }
        if index + 1 < n {
            let (g, (from_prev_of_next, _)) = neighbour(index + 1)?;
            open(&g)?;
            let out = from_prev_of_next
                .clone()
                .ok_or_else(|| Error::Failed("pipeline: no mailbox".into()))?;
            let inn = own_next.ok_or_else(|| Error::Failed("pipeline: no mailbox".into()))?;
            links.next = Some((inn, out));
        }
        Ok(links)
    }
}

/// A stage's mailboxes: (inbound, outbound) with the stage before and the stage after, and
/// the copies it sent that its work stream must see finished before reusing their source.
pub struct StageLinks {
    copy: Stream,
    prev: Option<(Arc<Mailbox>, Arc<Mailbox>)>,
    next: Option<(Arc<Mailbox>, Arc<Mailbox>)>,
    /// The last input gradient sent back (its buffer is the next backward's).
    sent_grad: std::cell::RefCell<Option<Event>>,
    /// The last output sent on from each maps slot (its buffer is that slot's next forward's).
    sent_act: std::cell::RefCell<Vec<Option<Event>>>,
}

impl StageLinks {
    fn pair(&self, forward: bool) -> Result<&(Arc<Mailbox>, Arc<Mailbox>)> {
        if forward { &self.next } else { &self.prev }
            .as_ref()
            .ok_or_else(|| Error::Failed("pipeline: no stage on that side".into()))
    }

    /// Sends `bytes` bytes of `src` to the stage after (`forward`: an output of maps slot
    /// `slot`) or before (an input gradient).
    pub(super) fn send(
        &self,
        gpu: &Gpu,
        forward: bool,
        slot: usize,
        src: View<'_>,
        bytes: usize,
    ) -> Result<()> {
        let (_, out) = self.pair(forward)?;
        let done = out.push(gpu, gpu.stream(), &self.copy, src, bytes)?;
        if forward {
            let mut sent = self.sent_act.borrow_mut();
            if sent.len() <= slot {
                sent.resize_with(slot + 1, || None);
            }
            sent[slot] = Some(done);
        } else {
            *self.sent_grad.borrow_mut() = Some(done);
        }
        Ok(())
    }

    /// Receives the next transfer from the stage after (`forward`: a gradient) or before (an
    /// input) into `dst`.
    pub(super) fn recv(&self, gpu: &Gpu, forward: bool, dst: View<'_>, bytes: usize) -> Result<()> {
        if forward {
            // the gradient lands where the last one sent back may still be read from
            self.before_backward(gpu)?;
        }
        let (inn, _) = self.pair(forward)?;
        inn.take(gpu, dst, bytes)
    }

    /// The work stream waits until the input gradient sent last has left its buffer.
    pub(super) fn before_backward(&self, gpu: &Gpu) -> Result<()> {
        if let Some(done) = self.sent_grad.borrow_mut().take() {
            gpu.stream().wait(&done)?;
        }
        Ok(())
    }

    /// The work stream waits until the output last sent from maps slot `slot` has left it.
    pub(super) fn before_forward(&self, gpu: &Gpu, slot: usize) -> Result<()> {
        if let Some(done) = self
            .sent_act
            .borrow_mut()
            .get_mut(slot)
            .and_then(Option::take)
        {
            gpu.stream().wait(&done)?;
        }
        Ok(())
    }

    /// Fails every wait of the stages beside on this stage's mailboxes (it stopped).
    pub fn close(&self) {
        for (inn, out) in self.prev.iter().chain(&self.next) {
            inn.close();
            out.close();
        }
    }
}

impl Drop for StageLinks {
    fn drop(&mut self) {
        // a copy still queued reads this stage's buffers: let it finish first
        let _ = self.copy.synchronize();
        self.close();
    }
}
