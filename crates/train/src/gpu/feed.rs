//! How batches reach the GPU: the four loaders users compare.
//!
//! - plain: each batch gathered on the host into pageable memory and copied (the driver stages
//!   the copy, and the host waits for it);
//! - pinned: a worker thread assembles the batches, in order, into a ring of pinned buffers;
//!   the copy from them is a true DMA that does not hold the host;
//! - prefetch: pinned, and the copy of batch i+1 runs on its own stream into the second of
//!   two device slots while batch i computes, ordered by events (the tutorials'
//!   AsyncGPUDataLoader);
//! - resident: the whole data set on the GPU once; each epoch's order is uploaded and the
//!   batches gathered there by a kernel.

use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use gpukit_cuda::transfer::{copy_pinned_to, PinnedBytes};
use gpukit_cuda::{Event, Gpu, Stream};
use serde::{Deserialize, Serialize};
use std::sync::mpsc;

/// The loader a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loader {
    Plain,
    Pinned,
    Prefetch,
    Resident,
}

impl Loader {
    pub const ALL: [Loader; 4] = [
        Loader::Plain,
        Loader::Pinned,
        Loader::Prefetch,
        Loader::Resident,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Loader::Plain => "plain",
            Loader::Pinned => "pinned",
            Loader::Prefetch => "prefetch",
            Loader::Resident => "resident",
        }
    }

    pub fn parse(s: &str) -> Option<Loader> {
        Loader::ALL.into_iter().find(|l| l.name() == s.trim())
    }
}

/// Bytes of one sample's targets on the device (f32 values or u32 classes).
pub(crate) fn target_width(data: &Dataset) -> usize {
    data.target_width()
}

/// A batch's x rows and targets as the bytes copied to the device: x (f32) then y.
pub(crate) fn batch_bytes(data: &Dataset, idx: &[usize], out: &mut Vec<u8>) {
    let (x, y) = data.gather(idx);
    out.clear();
    out.extend_from_slice(gpukit_tensor::codec::bytes_of(&x));
    match &y {
        Targets::Values { data, .. } => out.extend_from_slice(gpukit_tensor::codec::bytes_of(data)),
        Targets::Classes { data, .. } => {
            out.extend_from_slice(gpukit_tensor::codec::bytes_of(data))
        }
    }
}

/// Pinned buffers filled by a worker thread in batch order: [`PinnedRing::next`] hands out the
/// next filled buffer; [`PinnedRing::give_back`] returns it with the event after which the DMA
/// reading it has finished (the worker waits for that event before refilling it).
pub(crate) struct PinnedRing {
    filled: mpsc::Receiver<Result<(usize, PinnedBytes, usize)>>,
    free: mpsc::Sender<(PinnedBytes, Option<Event>)>,
    worker: Option<std::thread::JoinHandle<()>>,
}

/// Buffers in the ring: one being copied, one being filled, one ready.
pub(crate) const RING: usize = 3;

impl PinnedRing {
    /// Starts the worker over `batches` (each a list of sample indices) of `data`.
    pub(crate) fn start(
        gpu: &Gpu,
        data: std::sync::Arc<Dataset>,
        batches: Vec<Vec<usize>>,
        capacity: usize,
    ) -> Result<PinnedRing> {
        let (free_tx, free_rx) = mpsc::channel::<(PinnedBytes, Option<Event>)>();
        let (filled_tx, filled_rx) = mpsc::sync_channel(RING);
        for _ in 0..RING {
            let buf = PinnedBytes::new(gpu, capacity.max(1), false)?;
            free_tx
                .send((buf, None))
                .map_err(|_| Error::Failed("the loader's ring closed".into()))?;
        }
        let worker = std::thread::Builder::new()
            .name("gpukit-loader".into())
            .spawn(move || {
                let mut scratch = Vec::new();
                for (i, idx) in batches.iter().enumerate() {
                    let Ok((mut buf, done)) = free_rx.recv() else {
                        return;
                    };
                    if let Some(e) = done {
                        if let Err(e) = e.synchronize() {
                            let _ = filled_tx.send(Err(Error::Cuda(e)));
                            return;
                        }
                    }
                    batch_bytes(&data, idx, &mut scratch);
                    buf.as_mut_slice()[..scratch.len()].copy_from_slice(&scratch);
                    if filled_tx.send(Ok((i, buf, scratch.len()))).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| Error::Failed(format!("cannot start the loader thread: {e}")))?;
        Ok(PinnedRing {
            filled: filled_rx,
            free: free_tx,
            worker: Some(worker),
        })
    }

    /// The next batch's pinned bytes (x then y) and their length.
    pub(crate) fn next(&mut self) -> Result<(PinnedBytes, usize)> {
        match self.filled.recv() {
            Ok(Ok((_, buf, len))) => Ok((buf, len)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Failed("the loader thread stopped early".into())),
        }
    }

    /// Returns a buffer once its copy is queued; `after` fires when the copy has read it.
    pub(crate) fn give_back(&mut self, buf: PinnedBytes, after: Event) {
        // a closed channel means the worker has finished every batch: nothing to refill
        let _ = self.free.send((buf, Some(after)));
    }
}

impl Drop for PinnedRing {
    fn drop(&mut self) {
        // unblock the worker (its receive fails once the sender is gone), then wait for it
        let (dead, _) = mpsc::channel();
        self.free = dead;
        while self.filled.try_recv().is_ok() {}
        if let Some(w) = self.worker.take() {
            // drain so that a worker blocked on a full channel can finish
            while !w.is_finished() {
                while self.filled.try_recv().is_ok() {}
                std::thread::yield_now();
            }
            let _ = w.join();
        }
    }
}

/// Queues the copy of `len` pinned bytes into `dst` on `stream` and returns the event after
/// which the pinned buffer may be refilled.
pub(crate) fn copy_in(
    stream: &Stream,
    src: &PinnedBytes,
    len: usize,
    dst: gpukit_cuda::View<'_>,
) -> Result<Event> {
    copy_pinned_to(stream, src, len, dst)?;
    Ok(stream.record()?)
}
