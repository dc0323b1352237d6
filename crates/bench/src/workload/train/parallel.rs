//! `gpukit train --gpus N`, or `gpukit train` under torchrun, srun, mpirun or `gpukit launch`:
//! data-parallel training. Every rank (a thread per GPU in one process, or a process per GPU)
//! builds the same model from the same seed, trains on its share of each combined batch and
//! averages gradients through NCCL in buckets that overlap backward (the train crate's
//! `gpu::parallel`). Before that, each rank runs the same batches without any communication:
//! the one-GPU baseline of exactly the work each GPU does, so the scaling efficiency is the
//! baseline's step time over the data-parallel one, and what is left is communication that
//! backward did not hide.

use crate::error::{Error, Result};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nccl::{Comm, UniqueId};
use gpukit_cuda::Gpu;
use gpukit_ranks::rendezvous::{OnLost, Session};
use gpukit_ranks::world::World;
use gpukit_train::checkpoint::Position;
use gpukit_train::data::Dataset;
use gpukit_train::gpu::parallel::Shard;
use gpukit_train::gpu::{DpPeers, GpuDetails, GpuOptions, GpuTrainer};
use gpukit_train::model::Mlp;
use gpukit_train::optim::Optimizer;
use gpukit_train::run::{EpochStats, RunOutcome, TrainConfig};
use serde::{Deserialize, Serialize};

/// How the ranks were started.
#[derive(Debug, Clone)]
pub enum Ranks {
    /// One process, a thread per GPU on cuda:0..N.
    Threads(usize),
    /// This process is one rank of a launcher's world (one GPU: its LOCAL_RANK).
    Launched(World),
}

/// What data-parallel training did, beside the run's own figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DataParallel {
    pub ranks: usize,
    /// `threads in one process`, or the launcher.
    pub started_by: String,
    pub batch_per_gpu: usize,
    pub combined_batch: usize,
    pub buckets: usize,
    pub bucket_mb: f64,
    /// Pieces the first layer's weight gradient was computed and averaged in (1: whole).
    #[serde(default)]
    pub grad_pieces: usize,
    /// The gradients went to the ranks that update them by the copy engines (instead of NCCL's
    /// reduce-scatter), the first layer's in one piece a rank, each sent as it was computed.
    #[serde(default)]
    pub first_layer_exchanged: bool,
    /// The updated 16-bit weights went to the other ranks by the copy engines too (instead of
    /// NCCL's all-gather).
    #[serde(default)]
    pub weights_gathered_by_copies: bool,
    /// The type gradients were averaged in ("f32", or "bf16", which rounds them).
    #[serde(default)]
    pub grad_comm: String,
    /// Each rank updated only its share of the parameters (gradients reduce-scattered, the
    /// updated weights all-gathered), as ZeRO stage 2.
    #[serde(default)]
    pub sharded_optimizer: bool,
    /// Why the optimizer was not sharded where that was the default or asked for.
    #[serde(default)]
    pub unsharded_reason: Option<String>,
    /// Multiprocessors the products left to communication (0: none).
    #[serde(default)]
    pub comm_sms: u32,
    pub gradient_mib: f64,
    /// Each rank's step time with the same batches and no communication (median of its epochs).
    pub single_step_ms: Vec<f64>,
    /// Each rank's data-parallel step time (median of its epochs).
    pub step_ms: Vec<f64>,
    /// Samples a second of the whole world, data-parallel.
    pub samples_per_s: f64,
    /// Of one GPU doing its share alone (the slowest rank's baseline).
    pub single_samples_per_s: f64,
    /// Baseline step time over data-parallel step time (1.0: communication fully hidden).
    pub scaling_efficiency: f64,
    /// Data-parallel step time minus the baseline's, per step: the communication backward did
    /// not hide (and what it slowed down).
    pub exposed_comm_ms: f64,
    /// DistributedDataParallel of the same model, with --compare-pytorch.
    #[serde(default)]
    pub pytorch: Option<DdpPeer>,
}

/// PyTorch DDP on the same model, batch per GPU and GPUs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DdpPeer {
    pub torch_version: String,
    pub single_samples_per_s: f64,
    pub samples_per_s: f64,
    pub scaling_efficiency: f64,
    /// DDP with the optimizer sharded (ZeroRedundancyOptimizer), beside a sharded run:
    /// samples/s and scaling efficiency.
    #[serde(default)]
    pub zero: Option<(f64, f64)>,
    /// torch.compile of the model with the fused optimizer (PyTorch's fastest here): one GPU
    /// alone, then DDP.
    #[serde(default)]
    pub compiled: Option<CompiledPeer>,
    /// Each mode's peak of allocated memory on its busiest GPU (torch.cuda.max_memory_allocated
    /// over the run: model, gradients, optimizer state, activations and its one batch).
    #[serde(default)]
    pub peaks: PeerPeaks,
}

/// PyTorch's data-parallel modes' peaks of allocated memory a GPU, in bytes (None: not read).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PeerPeaks {
    pub ddp: Option<u64>,
    pub zero: Option<u64>,
    pub compiled: Option<u64>,
}

/// PyTorch's compiled mode's figures (torch.compile with the fused optimizer).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CompiledPeer {
    pub single_samples_per_s: f64,
    pub samples_per_s: f64,
    pub scaling_efficiency: f64,
}

impl DdpPeer {
    /// PyTorch's highest data-parallel throughput of its modes (eager DDP, compiled, sharded).
    pub fn best_samples_per_s(&self) -> f64 {
        let modes = [
            Some(self.samples_per_s),
            self.zero.map(|z| z.0),
            self.compiled.map(|c| c.samples_per_s),
        ];
        modes
            .into_iter()
            .flatten()
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::max)
    }
}

/// One rank's part of a run.
struct RankRun {
    outcome: RunOutcome,
    details: GpuDetails,
    single_step_ms: f64,
    step_ms: f64,
    buckets: usize,
    grad_pieces: usize,
    first_layer_exchanged: bool,
    weights_gathered_by_copies: bool,
    sharded_optimizer: bool,
    unsharded_reason: Option<String>,
    comm_sms: u32,
    model: Option<(Mlp<f32>, Optimizer<f32>)>,
    recording: Option<gpukit_cuda::profiler::Recording>,
}

/// Median seconds an update over the complete epochs (all epochs if none is complete).
pub(super) fn step_ms(epochs: &[EpochStats]) -> f64 {
    let per: Vec<f64> = epochs
        .iter()
        .filter(|e| e.steps > 0)
        .map(|e| e.seconds * 1e3 / e.steps as f64)
        .collect();
    crate::stats::Summary::of(&per).map_or(f64::NAN, |s| s.median)
}

/// Everything a rank needs, shared by reference across the threads.
pub struct Job<'a> {
    pub discovery: &'a Discovery,
    pub cfg: &'a TrainConfig,
    pub opts: GpuOptions,
    pub train: &'a Dataset,
    pub eval: Option<&'a Dataset>,
    pub model: &'a Mlp<f32>,
    pub opt: &'a Optimizer<f32>,
    pub scaler: Option<(f64, u64)>,
    pub pos: Position,
    pub bucket_bytes: usize,
    /// `gpukit profile train --gpus N`: rank 0 records its whole data-parallel run,
    /// communication included (threads of one process only: every rank stops at a barrier
    /// around the profiler's start and end, so none waits inside NCCL meanwhile).
    pub profile: Option<gpukit_cuda::profiler::TimingChoice>,
}

/// Threads of one process meet here before NCCL: a rank that failed to set up must not leave
/// the others waiting forever for it inside ncclCommInitRank.
/// This process's rank at gpukit's rendezvous with the launcher's others: rank 0's NCCL id
/// handed out, a lost process ending the others (NCCL's communicators aborted first).
pub(super) fn join_ranks(w: &World, timeout: std::time::Duration) -> Result<Session> {
    gpukit_ranks::before_exit(|| gpukit_cuda::nccl::exit_now(1));
    let options = gpukit_ranks::rendezvous::Options {
        timeout,
        on_lost: OnLost::Exit,
    };
    Ok(Session::join(w, options, || {
        UniqueId::new()
            .map(|id| id.to_bytes())
            .map_err(|e| e.to_string())
    })?)
}

pub(super) struct Meet<'a> {
    pub(super) barrier: &'a std::sync::Barrier,
    pub(super) failed: &'a std::sync::atomic::AtomicBool,
}

impl Meet<'_> {
    /// Every rank stops here while rank 0 runs `f` (no rank has work in flight), then all go
    /// on together; rank 0 returns what `f` gave, the others None; a failure of `f` fails
    /// every rank.
    fn around<T>(&self, rank: usize, f: impl FnOnce() -> Result<T>) -> Result<Option<T>> {
        use std::sync::atomic::Ordering;
        self.barrier.wait();
        let mine = (rank == 0).then(f);
        if matches!(mine, Some(Err(_))) {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        match mine {
            Some(r) => r.map(Some),
            None if self.failed.load(Ordering::SeqCst) => Err(Error::Failed(
                "rank 0 failed while the ranks waited for it (its error is reported)".into(),
            )),
            None => Ok(None),
        }
    }
}

fn rank_run(
    job: &Job<'_>,
    id: &UniqueId,
    shard: Shard,
    ordinal: usize,
    (meet, peers): (Option<Meet<'_>>, Option<&std::sync::Arc<DpPeers>>),
    progress: &mut dyn FnMut(&str),
) -> Result<RankRun> {
    let prepared = (|| -> Result<_> {
        let gpu = std::sync::Arc::new(Gpu::open(job.discovery, ordinal)?);
        let opts = GpuOptions {
            shard: Some(shard),
            // the exchange's copies need the ranks in one process
            dp_exchange: job.opts.dp_exchange && peers.is_some(),
            ..job.opts
        };
        let mut t = GpuTrainer::new(
            job.discovery,
            gpu.clone(),
            job.cfg,
            opts,
            job.train.clone(),
            job.eval.cloned(),
        )?;
        // the baseline: this rank's batches, no communication
        t.load(job.model, job.opt, job.scaler)?;
        let (alone, _) = t.run(job.pos, &mut |_| {})?;
        Ok((gpu, t, step_ms(&alone.epochs)))
    })();
    if let Some(m) = &meet {
        use std::sync::atomic::Ordering;
        if prepared.is_err() {
            m.failed.store(true, Ordering::SeqCst);
        }
        m.barrier.wait();
        if prepared.is_ok() && m.failed.load(Ordering::SeqCst) {
            return Err(Error::Failed(
                "another GPU's rank failed before training together (its error is reported)".into(),
            ));
        }
    }
    let (gpu, mut t, single_step_ms) = prepared?;
    // the same from the same weights, with the gradients averaged over the ranks
    let comm = Comm::init_rank_on(
        &gpu,
        gpu.new_priority_stream()?,
        id,
        shard.rank,
        shard.world,
    )?;
    if let Some(p) = peers {
        t.join_peers(p.clone());
    }
    t.attach(comm, job.bucket_bytes)?;
    t.load(job.model, job.opt, job.scaler)?;
    let rank = shard.rank;
    // rank 0's profiler starts and ends while every rank waits at a barrier (CUPTI must not
    // start or flush while a rank waits inside NCCL for rank 0)
    let profiler = match (job.profile, &meet) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(Error::BadInput(
                "profile train records the ranks of one process: use --gpus N outside a launcher"
                    .into(),
            ))
        }
        (Some(timing), Some(m)) => m.around(rank, || {
            gpukit_cuda::profiler::Profiler::start(&gpu, job.discovery, timing).map_err(Error::from)
        })?,
    };
    let (outcome, details) = t.run(job.pos, &mut |e: &EpochStats| {
        if rank == 0 {
            progress(&format!(
                "train data-parallel x{}: epoch {} loss {:.6}",
                shard.world, e.epoch, e.train_loss
            ))
        }
    })?;
    let recording = match (job.profile, &meet) {
        (Some(_), Some(m)) => m.around(rank, || match profiler {
            Some(p) => p.finish().map_err(Error::from),
            None => Err(Error::Failed("rank 0 has no profiler to finish".into())),
        })?,
        _ => None,
    };
    let model = if rank == 0 {
        let (mut m, mut o) = (job.model.clone(), job.opt.clone());
        t.store(&mut m, &mut o)?;
        Some((m, o))
    } else {
        None
    };
    Ok(RankRun {
        step_ms: step_ms(&outcome.epochs),
        outcome,
        details,
        single_step_ms,
        buckets: t.buckets(),
        grad_pieces: t.grad_pieces(),
        first_layer_exchanged: t.first_layer_exchanged(),
        weights_gathered_by_copies: t.weights_gathered_by_copies(),
        sharded_optimizer: t.sharded_optimizer(),
        unsharded_reason: t.unsharded_reason().map(str::to_string),
        comm_sms: t.comm_sms(),
        model,
        recording,
    })
}

/// A rank thread's result; a failure arms the hang guard (its siblings may be waiting for it
/// inside NCCL and could never be joined).
fn guarded(rank: usize, timeout: std::time::Duration, r: Result<RankRun>) -> Result<RankRun> {
    if let Err(e) = &r {
        crate::hang_guard::after_failure(timeout, format!("rank {rank} (cuda:{rank}): {e}"));
    }
    r
}

/// The run's result on rank 0 (None on the other ranks): the data-parallel outcome, rank 0's
/// GPU details, the final model and optimizer, the data-parallel figures, and rank 0's
/// recording when [`Job::profile`] asked for one.
pub type Outcome = Option<(
    RunOutcome,
    GpuDetails,
    Mlp<f32>,
    Optimizer<f32>,
    DataParallel,
    Option<gpukit_cuda::profiler::Recording>,
)>;

pub fn run(
    job: &Job<'_>,
    ranks: &Ranks,
    timeout: std::time::Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Outcome> {
    let count = gpukit_cuda::driver::probe(job.discovery)
        .map_err(|e| Error::Unavailable(format!("data-parallel training needs GPUs: {e}")))?
        .device_count;
    gpukit_cuda::nccl::require(job.discovery)
        .map_err(|e| Error::Unavailable(format!("data-parallel training needs NCCL: {e}")))?;
    let world = match ranks {
        Ranks::Threads(n) => *n,
        Ranks::Launched(w) => w.world_size,
    };
    // rank 0's run, every rank's (alone, data-parallel) step times, and how they were started
    let (first, times, started_by) = match ranks {
        Ranks::Threads(n) => {
            if *n > count {
                return Err(Error::BadInput(format!(
                    "--gpus {n}: this machine has {count} CUDA device(s)"
                )));
            }
            let id = UniqueId::new()?;
            let barrier = std::sync::Barrier::new(*n);
            let failed = std::sync::atomic::AtomicBool::new(false);
            let peers = DpPeers::new(*n, timeout);
            let results: Vec<Result<RankRun>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (1..*n)
                    .map(|rank| {
                        let id = id.clone();
                        let meet = Meet {
                            barrier: &barrier,
                            failed: &failed,
                        };
                        let peers = &peers;
                        scope.spawn(move || {
                            let r = rank_run(
                                job,
                                &id,
                                Shard { rank, world },
                                rank,
                                (Some(meet), Some(peers)),
                                &mut |_| {},
                            );
                            if r.is_err() {
                                // the others may wait for this rank's copies
                                peers.close();
                            }
                            guarded(rank, timeout, r)
                        })
                    })
                    .collect();
                let meet = Meet {
                    barrier: &barrier,
                    failed: &failed,
                };
                let r = rank_run(
                    job,
                    &id,
                    Shard { rank: 0, world },
                    0,
                    (Some(meet), Some(&peers)),
                    progress,
                );
                if r.is_err() {
                    peers.close();
                }
                let first = guarded(0, timeout, r);
                std::iter::once(first)
                    .chain(handles.into_iter().map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Failed("a training thread panicked".into()))
                        })
                    }))
                    .collect()
            });
            let mut runs = results.into_iter().collect::<Result<Vec<_>>>()?.into_iter();
            let Some(first) = runs.next() else {
                return Ok(None);
            };
            let times = std::iter::once(&first)
                .chain(runs.as_slice())
                .map(|r| (r.single_step_ms, r.step_ms))
                .collect();
            (first, times, "threads in one process".to_string())
        }
        Ranks::Launched(w) => {
            let session = join_ranks(w, timeout)?;
            let id = UniqueId::from_bytes(session.blob())?;
            let shard = Shard {
                rank: w.rank,
                world,
            };
            let mine = match rank_run(
                job,
                &id,
                shard,
                w.local_rank % count,
                (None, None),
                progress,
            ) {
                Ok(r) => r,
                Err(e) => {
                    session.abort(&e.to_string());
                    return Err(e);
                }
            };
            let times = serde_json::to_vec(&(mine.single_step_ms, mine.step_ms))
                .map_err(|e| Error::Failed(e.to_string()))?;
            let all = session.all_gather(&times)?;
            session.finish()?;
            if w.rank != 0 {
                return Ok(None);
            }
            let times = all
                .iter()
                .map(|b| serde_json::from_slice::<(f64, f64)>(b))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Failed(format!("a rank sent malformed timings: {e}")))?;
            (mine, times, w.launcher.to_string())
        }
    };
    let (single, dp): (Vec<f64>, Vec<f64>) = times.into_iter().unzip();
    let slowest = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let b = job.cfg.batch_size;
    let Some((model, opt)) = first.model else {
        return Ok(None);
    };
    let params: usize = model.parameters();
    let report = DataParallel {
        ranks: world,
        started_by,
        batch_per_gpu: b,
        combined_batch: b * world,
        buckets: first.buckets,
        bucket_mb: job.bucket_bytes as f64 / (1 << 20) as f64,
        grad_pieces: first.grad_pieces,
        first_layer_exchanged: first.first_layer_exchanged,
        weights_gathered_by_copies: first.weights_gathered_by_copies,
        grad_comm: job.opts.grad_comm.to_string(),
        sharded_optimizer: first.sharded_optimizer,
        unsharded_reason: first.unsharded_reason.clone(),
        comm_sms: first.comm_sms,
        gradient_mib: (params * 4) as f64 / (1 << 20) as f64,
        samples_per_s: (b * world) as f64 / (slowest(&dp) / 1e3),
        single_samples_per_s: b as f64 / (slowest(&single) / 1e3),
        scaling_efficiency: slowest(&single) / slowest(&dp),
        exposed_comm_ms: slowest(&dp) - slowest(&single),
        single_step_ms: single,
        step_ms: dp,
        pytorch: None,
    };
    Ok(Some((
        first.outcome,
        first.details,
        model,
        opt,
        report,
        first.recording,
    )))
}

/// PyTorch's DistributedDataParallel of the same model (torch.multiprocessing, one process a
/// GPU), measured the same way: one GPU alone, then all of them.
pub fn compare_ddp(
    cfg: &TrainConfig,
    precision: &str,
    dp: &DataParallel,
    steps: usize,
) -> Result<DdpPeer> {
    let dir = super::peer::handover_dir()?;
    let path = super::peer::write_config(dir.path(), cfg, precision, true)?;
    let mut args: Vec<String> = vec![
        "ddp".into(),
        "--config".into(),
        path.display().to_string(),
        "--nproc".into(),
        dp.ranks.to_string(),
        "--batch-per-gpu".into(),
        dp.batch_per_gpu.to_string(),
        "--steps".into(),
        steps.max(10).to_string(),
        "--bucket-mb".into(),
        format!("{}", dp.bucket_mb.round().max(1.0)),
    ];
    if dp.sharded_optimizer {
        args.push("--zero".into());
    }
    // PyTorch's fastest mode beside its eager one
    args.push("--compiled".into());
    let run = crate::peer::run_pytorch(&args)?;
    let d = &run.document;
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let zero = &d["ddp_zero"];
    let compiled = &d["ddp_compiled"];
    let peak = |mode: &serde_json::Value| mode["peak_allocated_bytes"].as_u64();
    Ok(DdpPeer {
        peaks: PeerPeaks {
            ddp: peak(&d["ddp"]),
            zero: peak(zero),
            compiled: peak(compiled),
        },
        compiled: compiled.is_object().then(|| CompiledPeer {
            single_samples_per_s: num(&compiled["single"]["samples_per_s"]),
            samples_per_s: num(&compiled["samples_per_s"]),
            scaling_efficiency: num(&compiled["scaling_efficiency"]),
        }),
        torch_version: run.torch_version.clone(),
        single_samples_per_s: num(&d["single"]["samples_per_s"]),
        samples_per_s: num(&d["ddp"]["samples_per_s"]),
        scaling_efficiency: num(&d["scaling_efficiency"]),
        zero: zero.is_object().then(|| {
            (
                num(&zero["samples_per_s"]),
                num(&zero["scaling_efficiency"]),
            )
        }),
    })
}
