//! The GPUs of this process taking part in a sweep: their communicators, buffers and pattern
//! kernels, and the three things done with them for every row: check, warm up, time.

use super::sweep::{expectation, Collective, Counts};
use super::Place;
use crate::error::{Error, Result};
use gpukit_cuda::nccl::{self, Comm, RedOp};
use gpukit_cuda::pattern::Pattern;
use gpukit_cuda::{DeviceBuffer, Gpu, View};
use gpukit_types::DType;

/// One GPU of this process: its rank's communicator and two buffers of the sweep's largest size.
pub(super) struct Rank {
    pub gpu: Gpu,
    pub comm: Comm,
    pattern: Pattern,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

/// One row's collective: what runs, on which elements.
#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    pub op: Collective,
    pub dtype: DType,
    pub redop: RedOp,
    pub root: usize,
    pub counts: Counts,
}

/// The GPUs this process drives (all of them in one-process mode, one under a launcher).
pub(super) struct Local {
    pub ranks: Vec<Rank>,
    /// Ranks in the whole world (across processes).
    pub world: usize,
}

impl Local {
    /// Buffers of `bytes` each on every GPU, and the pattern kernels.
    pub fn new(
        discovery: &gpukit_cuda::loader::Discovery,
        gpus: Vec<Gpu>,
        comms: Vec<Comm>,
        bytes: usize,
    ) -> Result<Local> {
        let world = comms.first().map_or(1, |c| c.size);
        let mut ranks = Vec::new();
        for (gpu, comm) in gpus.into_iter().zip(comms) {
            let pattern = Pattern::new(discovery, &gpu)?;
            let send = gpu.alloc(bytes.max(1))?;
            let recv = gpu.alloc(bytes.max(1))?;
            ranks.push(Rank {
                gpu,
                comm,
                pattern,
                send,
                recv,
            });
        }
        Ok(Local { ranks, world })
    }

    /// The row's collective on every local GPU, as one NCCL group (queued, not waited for).
    pub fn issue(&self, case: &Case, place: Place) -> Result<()> {
        nccl::group(|| {
            for r in &self.ranks {
                issue_rank(r, self.world, case, place)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Runs the row once on fresh inputs and counts the wrong output elements on every local
    /// rank (nccl-tests' #wrong). The output is first filled with NaN, so a collective that
    /// wrote nothing cannot pass on what an earlier row left there.
    pub fn check(&self, case: &Case, place: Place) -> Result<u64> {
        for r in &self.ranks {
            let (send, _) = views(r, case, place)?;
            r.gpu.fill(r.recv.view(), 0xff)?;
            r.pattern
                .fill(send, case.counts.send, case.dtype, r.comm.rank)?;
        }
        self.issue(case, place)?;
        let mut wrong = 0;
        for r in &self.ranks {
            r.gpu.synchronize()?;
            r.comm.async_error()?;
            let Some(expect) = expectation(
                case.op,
                case.counts,
                r.comm.rank,
                self.world,
                case.redop,
                case.root,
            ) else {
                continue;
            };
            let (_, recv) = views(r, case, place)?;
            wrong += r
                .pattern
                .count_wrong(recv, case.counts.recv, case.dtype, expect)?;
        }
        Ok(wrong)
    }

    /// Microseconds per collective on each local GPU: `warmup` untimed, then `repeats` blocks
    /// of `iterations` back to back between two events (or, with `graph`, the iterations
    /// captured once as a CUDA graph and replayed); each GPU's figure is its median block. Each
    /// GPU is driven by a thread of its own, and the threads start each block together (as
    /// nccl-tests' threads do): one thread issuing for every GPU would time its own launches.
    pub fn time(&mut self, case: &Case, t: Timing) -> Result<Vec<f64>> {
        let world = self.world;
        if self.ranks.len() == 1 {
            return Ok(vec![time_rank(&self.ranks[0], world, case, t, None)?]);
        }
        let barrier = std::sync::Barrier::new(self.ranks.len());
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .ranks
                .iter_mut()
                .map(|r| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let out = time_rank(r, world, case, t, Some(barrier));
                        if let Err(e) = &out {
                            crate::hang_guard::after_failure(
                                std::time::Duration::from_secs(30),
                                format!("cuda:{}: {e}", r.gpu.ordinal),
                            );
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Failed("a timing thread panicked".into())))
                })
                .collect()
        })
    }
}

/// How a row is timed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub place: Place,
    pub warmup: usize,
    pub iterations: usize,
    pub repeats: usize,
    pub graph: bool,
}

/// Rank `r`'s send and receive buffers for the row (in place: windows of one buffer).
fn views<'a>(r: &'a Rank, case: &Case, place: Place) -> Result<(View<'a>, View<'a>)> {
    let w = case.dtype.size_bytes();
    let (s, v) = (case.counts.send * w, case.counts.recv * w);
    let g = r.comm.rank;
    Ok(match place {
        Place::Out => (r.send.view().sub(0, s)?, r.recv.view().sub(0, v)?),
        Place::In => {
            let buf = r.recv.view();
            match case.op {
                Collective::AllGather => (buf.sub(g * s, s)?, buf.sub(0, v)?),
                Collective::ReduceScatter => (buf.sub(0, s)?, buf.sub(g * v, v)?),
                Collective::AllToAll => {
                    return Err(Error::BadInput(
                        "alltoall has no in-place form (its sends would overwrite what they \
                         still have to send)"
                            .into(),
                    ))
                }
                _ => (buf.sub(0, s)?, buf.sub(0, v)?),
            }
        }
    })
}

/// Rank `r`'s call of the row's collective (queued on its stream).
fn issue_rank(r: &Rank, world: usize, case: &Case, place: Place) -> gpukit_cuda::Result<()> {
    let (send, recv) = views(r, case, place).map_err(to_cuda)?;
    let c = case.counts;
    let (d, op) = (case.dtype, case.redop);
    match case.op {
        Collective::AllReduce => r.comm.all_reduce(send, recv, c.send, d, op),
        Collective::AllGather => r.comm.all_gather(send, recv, c.send, d),
        Collective::ReduceScatter => r.comm.reduce_scatter(send, recv, c.recv, d, op),
        Collective::Broadcast => r.comm.broadcast(send, recv, c.count, d, case.root),
        Collective::Reduce => r.comm.reduce(send, recv, c.count, d, op, case.root),
        Collective::AllToAll => r.comm.all_to_all(send, recv, c.count / world, d),
    }
}

/// One rank's median microseconds per collective over `t.repeats` blocks.
fn time_rank(
    r: &Rank,
    world: usize,
    case: &Case,
    t: Timing,
    together: Option<&std::sync::Barrier>,
) -> Result<f64> {
    let issue = || -> Result<()> { Ok(issue_rank(r, world, case, t.place)?) };
    for _ in 0..t.warmup {
        issue()?;
    }
    let graph = if t.graph {
        let g = r.gpu.capture(|| -> Result<()> {
            for _ in 0..t.iterations {
                issue()?;
            }
            Ok(())
        })?;
        // the first replay uploads the graph: untimed
        g.launch()?;
        Some(g)
    } else {
        None
    };
    let mut blocks = Vec::with_capacity(t.repeats);
    for _ in 0..t.repeats.max(1) {
        r.gpu.synchronize()?;
        if let Some(b) = together {
            b.wait();
        }
        let start = r.gpu.stream().record_timed()?;
        match &graph {
            Some(g) => g.launch()?,
            None => {
                for _ in 0..t.iterations {
                    issue()?;
                }
            }
        }
        let end = r.gpu.stream().record_timed()?;
        end.synchronize()?;
        r.comm.async_error()?;
        blocks.push(start.elapsed_ms(&end)? * 1e3 / t.iterations as f64);
    }
    crate::stats::Summary::of(&blocks)
        .map(|s| s.median)
        .ok_or(Error::NoSamples)
}

fn to_cuda(e: Error) -> gpukit_cuda::Error {
    match e {
        Error::Cuda(c) => c,
        other => gpukit_cuda::Error::Invalid(other.to_string()),
    }
}
