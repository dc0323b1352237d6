//! `gpukit train --model NAME --device cuda:0 --gpus N`: a convolutional network trained
//! data-parallel on cuda:0..N-1, a thread a GPU. Every rank builds the same network from the
//! same weights and trains its rows of each combined batch (`--batch-size` a GPU); the
//! gradients are averaged through NCCL in buckets while backward goes on (the train crate's
//! `cnn::gpu::parallel`).
//!
//! Before that, the ranks train the same batches without any communication: the one-GPU
//! baseline of exactly the work each GPU does. The scaling efficiency is that baseline's update
//! time over the data-parallel one (1.0: the averaging fully hidden).
//!
//! The loop is the one-GPU loop ([`gpukit_train::cnn::run::train`]) over the combined batches,
//! with [`Ranks`] as its stepper: each update hands every rank thread its shard and returns the
//! mean of their losses (the combined batch's) and the sum of their right answers.
//!
//! Under a launcher (`gpukit launch`, torchrun, srun, mpirun: [`Placement::Launched`]) each
//! process is one rank: it runs the same loop over the same combined batches (the same data
//! and order on every process), its one rank thread trains its own shard, and once joined the
//! thread sums the loss and right answers over every rank through NCCL. The processes meet at
//! gpukit's rendezvous (which also hands out NCCL's id) and exchange their timings, first
//! alone loss and final weights' digest there.

use crate::error::{Error, Result};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nccl::{Comm, UniqueId};
use gpukit_cuda::Gpu;
use gpukit_train::cnn::data::Images;
use gpukit_train::cnn::gpu::need::{device_need, HINT};
use gpukit_train::cnn::gpu::GpuResNet;
use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
use gpukit_train::cnn::resnet::ResNet;
use gpukit_train::cnn::run::{self, Batch, LoopConfig, LoopOutcome, Stepper, UpdateStats};
use gpukit_train::cnn::Tensor;
use gpukit_train::precision::Precision;
use serde::{Deserialize, Serialize};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

/// DistributedDataParallel's default `bucket_cap_mb`: PyTorch's side unless `--bucket-mb` is
/// given. gpukit's default is one bucket of every gradient, averaged after backward: on 2
/// H200 joined by NVLink, ResNet-50 bf16 at 256 a GPU scaled 0.976 so, 0.964 in buckets of 25
/// MiB, 0.950 of 5 and 0.933 of 2 (NCCL's kernels slowed the backward beside them by more than
/// they hid; run 96).
pub const DDP_BUCKET_MB: f64 = 25.0;

/// How long the other ranks may wait on a failed one inside NCCL before the process ends.
const HANG_TIMEOUT: Duration = Duration::from_secs(60);

/// What data-parallel training did, beside the run's own figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnDataParallel {
    pub ranks: usize,
    pub batch_per_gpu: usize,
    pub combined_batch: usize,
    pub buckets: usize,
    pub bucket_mb: f64,
    /// The type the gradients were averaged in: "f32", or "bf16", which rounds them.
    #[serde(default = "f32_name")]
    pub grad_comm: String,
    /// The f32 gradients averaged each update.
    pub gradient_mib: f64,
    /// The median update time (ms) of the ranks training the same batches alone, and
    /// data-parallel (updates after the first).
    pub single_step_ms: f64,
    pub step_ms: f64,
    /// Images a second of one GPU alone (its share) and of the whole world data-parallel.
    pub single_images_per_s: f64,
    pub images_per_s: f64,
    /// Baseline update time over data-parallel update time.
    pub scaling_efficiency: f64,
    /// PyTorch's DistributedDataParallel of the same network, when compared.
    #[serde(default)]
    pub ddp: Vec<DdpCnnRow>,
}

fn f32_name() -> String {
    "f32".into()
}

/// One PyTorch DistributedDataParallel mode's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DdpCnnRow {
    /// `ddp` (eager), `ddp_compile` (torch.compile of the DDP model) or `ddp_compile_fused`
    /// (with the fused optimizer).
    pub mode: String,
    pub failed: Option<String>,
    pub single_images_per_s: Option<f64>,
    pub images_per_s: Option<f64>,
    pub scaling_efficiency: Option<f64>,
    /// Its busiest GPU's peak of allocated memory (torch.cuda.max_memory_allocated over the
    /// run: model, gradients, optimizer state, activations and its one batch of images).
    #[serde(default)]
    pub peak_bytes: Option<u64>,
}

/// Where the ranks run.
#[derive(Clone, Copy)]
pub enum Placement<'a> {
    /// Every rank a thread of this process, rank r on cuda:r.
    Threads(usize),
    /// This process is one rank of a launched world, on cuda:`local_rank`.
    Launched(&'a gpukit_ranks::world::World),
}

impl Placement<'_> {
    /// How many ranks train together.
    pub fn world(&self) -> usize {
        match self {
            Placement::Threads(n) => *n,
            Placement::Launched(w) => w.world_size,
        }
    }

    /// This process's threads: each (rank, GPU ordinal).
    fn local(&self) -> Vec<(usize, usize)> {
        match self {
            Placement::Threads(n) => (0..*n).map(|r| (r, r)).collect(),
            Placement::Launched(w) => vec![(w.rank, w.local_rank)],
        }
    }
}

/// What every rank builds: the same network, weights and optimizer.
pub struct Setup<'a> {
    pub discovery: &'a Discovery,
    pub model: &'a ResNet<f32>,
    pub batch_per_gpu: usize,
    pub image: (usize, usize),
    pub precision: Precision,
    pub checkpoint: bool,
    pub opt: CnnOptimizerConfig,
    pub smoothing: f64,
    pub graph: bool,
    /// Gradient buckets of at least this many MiB.
    pub bucket_mb: f64,
    /// The type the gradients are averaged in (f32, or bf16 which rounds them).
    pub grad_comm: gpukit_types::DType,
    /// Micro-batches of `batch_per_gpu` an update sums on each rank (their sum averaged).
    pub accumulate: usize,
    /// The data set each rank keeps on its GPU where it fits ([`GpuResNet::keep_data`]); None:
    /// every batch from the host.
    pub data: Option<&'a Images>,
}

/// Why a data set of one batch is not kept on the GPU.
pub const ONE_BATCH: &str = "the data set is one batch, uploaded once";

/// The share of a GPU's free memory a data set kept there may take.
pub const DATA_SHARE: f64 = 0.25;

/// A rank's part of a micro-batch: its images' indices, their labels, and the images unless
/// the rank keeps the data set.
struct Shard {
    indices: Vec<usize>,
    images: Option<Tensor<f32>>,
    labels: Vec<u32>,
}

/// A rank thread's work.
enum Ask {
    /// Train a micro-batch: its shard (None: the one it holds).
    Step {
        shard: Option<Shard>,
        micro: (usize, usize),
    },
    /// Join the communicator of this id, then start again from the initial weights and a
    /// fresh optimizer.
    Join(UniqueId),
    /// Its figures.
    Figures,
}

/// Rank 0's trainer figures for the report.
#[derive(Debug, Clone, Default)]
pub struct RankFigures {
    pub peak_bytes: u64,
    pub step_launch: String,
    pub memory: Vec<(String, u64)>,
    pub conv_algorithms: Vec<String>,
    pub buckets: usize,
    /// [`GpuResNet::weights_digest`].
    pub weights: u64,
    /// Why the data set is not on the GPU (None: kept there).
    pub data_on_host: Option<String>,
}

enum Reply {
    /// Built; why the data set stays on the host (None: kept on the GPU).
    Ready(Option<String>),
    /// The step's loss and right answers: its own shard's, or (true) summed over every rank.
    Stepped(f64, usize, bool),
    Joined,
    Figures(RankFigures),
}

/// This process's rank threads, as one stepper of the combined batches.
pub struct Ranks {
    asks: Vec<Sender<Ask>>,
    replies: Vec<Receiver<Result<Reply>>>,
    batch_per_gpu: usize,
    /// Each thread's (rank, GPU ordinal).
    local: Vec<(usize, usize)>,
    /// Ranks in all (on every process).
    world: usize,
    /// Whether each thread's rank keeps the data set on its GPU.
    resident: Vec<bool>,
}

impl Ranks {
    fn gone(&self, i: usize) -> Error {
        let (rank, ordinal) = self.local[i];
        Error::Failed(format!("the thread of rank {rank} (cuda:{ordinal}) ended"))
    }

    fn send(&self, i: usize, ask: Ask) -> Result<()> {
        self.asks[i].send(ask).map_err(|_| self.gone(i))
    }

    /// Every rank's reply, in rank order; the first failure arms the hang guard (the others may
    /// wait for the failed rank inside NCCL) and is returned.
    fn gather(&self) -> Result<Vec<Reply>> {
        let mut out = Vec::with_capacity(self.replies.len());
        for (i, rx) in self.replies.iter().enumerate() {
            match rx.recv().map_err(|_| self.gone(i)).and_then(|r| r) {
                Ok(r) => out.push(r),
                Err(e) => {
                    let (rank, ordinal) = self.local[i];
                    crate::hang_guard::after_failure(
                        HANG_TIMEOUT,
                        format!("rank {rank} (cuda:{ordinal}): {e}"),
                    );
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Joins every rank of this process to the communicator of `id` (every process's ranks
    /// join the same one), each starting again from the initial weights.
    pub fn join(&self, id: &UniqueId) -> Result<()> {
        for i in 0..self.asks.len() {
            self.send(i, Ask::Join(id.clone()))?;
        }
        self.gather().map(|_| ())
    }

    /// Rank 0's figures, once every rank is seen to hold the same weights (each applied the
    /// same averaged gradients to the same start: a difference is a broken average).
    pub fn figures(&self) -> Result<RankFigures> {
        for i in 0..self.asks.len() {
            self.send(i, Ask::Figures)?;
        }
        let mut all = Vec::new();
        for reply in self.gather()? {
            match reply {
                Reply::Figures(f) => all.push(f),
                _ => return Err(Error::Failed("a rank answered out of turn".into())),
            }
        }
        if let Some(rank) = all.iter().position(|f| f.weights != all[0].weights) {
            return Err(Error::Failed(format!(
                "after training, rank {rank}'s weights differ from rank 0's: the gradients were \
                 not averaged alike"
            )));
        }
        all.into_iter()
            .next()
            .ok_or_else(|| Error::Failed("no rank".into()))
    }
}

/// `values` copied on every core (a rank's share of a ResNet batch is over 100 MB: one thread's
/// copy is a step's time).
fn copied(values: &[f32]) -> Vec<f32> {
    use rayon::prelude::*;
    const PART: usize = 1 << 16;
    let mut out = vec![0f32; values.len()];
    out.par_chunks_mut(PART)
        .zip(values.par_chunks(PART))
        .for_each(|(o, v)| o.copy_from_slice(v));
    out
}

/// Rows `[first, first + n)` of a batch.
fn rows(
    (images, labels): (&Tensor<f32>, &[u32]),
    first: usize,
    n: usize,
) -> (Tensor<f32>, Vec<u32>) {
    let [_, c, h, w] = images.shape;
    let per = c * h * w;
    (
        Tensor {
            shape: [n, c, h, w],
            data: copied(&images.data[first * per..(first + n) * per]),
        },
        labels[first..first + n].to_vec(),
    )
}

impl Stepper for Ranks {
    fn step(
        &mut self,
        batch: Batch<'_>,
        fresh: bool,
        micro: (usize, usize),
    ) -> gpukit_train::Result<(f64, usize)> {
        let (world, here) = (self.world, self.asks.len());
        let b = self.batch_per_gpu;
        let labels = batch.labels;
        if labels.len() != world * b || batch.indices.len() != world * b {
            return Err(gpukit_train::Error::Failed(format!(
                "a combined batch of {} images for {world} ranks of {b}",
                labels.len()
            )));
        }
        let fail = |e: Error| gpukit_train::Error::Failed(e.to_string());
        for (i, &(rank, _)) in self.local.iter().enumerate() {
            let shard = if fresh {
                let at = rank * b;
                let images = match (self.resident[i], batch.images) {
                    (true, _) => None,
                    (false, Some(images)) => Some(rows((images, labels), at, b).0),
                    (false, None) => {
                        return Err(gpukit_train::Error::Failed(
                            "a batch without its images for a rank that keeps no data set".into(),
                        ))
                    }
                };
                Some(Shard {
                    indices: batch.indices[at..at + b].to_vec(),
                    images,
                    labels: labels[at..at + b].to_vec(),
                })
            } else {
                None
            };
            self.send(i, Ask::Step { shard, micro }).map_err(fail)?;
        }
        Ok(combine(self.gather().map_err(fail)?, world, here))
    }

    fn resident(&self) -> bool {
        !self.resident.is_empty() && self.resident.iter().all(|&r| r)
    }
}

/// The combined batch's loss and right answers from this process's threads' replies: a reply
/// summed over every rank (a launched rank once joined) is the whole; else the mean of the
/// threads' losses and the sum of their answers (every rank of a world of threads, or a
/// launched rank's own shard before it joins).
fn combine(replies: Vec<Reply>, world: usize, here: usize) -> (f64, usize) {
    let (mut loss, mut correct) = (0.0, 0);
    for reply in replies {
        match reply {
            Reply::Stepped(l, c, true) => return (l / world as f64, c),
            Reply::Stepped(l, c, false) => {
                loss += l / here as f64;
                correct += c;
            }
            _ => {}
        }
    }
    (loss, correct)
}

/// One rank's thread: builds its trainer on cuda:`ordinal` (its memory checked first), answers
/// Ready, then serves asks until the channel closes or one fails. With `sums`, a joined rank's
/// step answers its loss and right answers summed over every rank (through NCCL).
fn rank_thread(
    setup: &Setup<'_>,
    (rank, ordinal, world): (usize, usize, usize),
    sums: bool,
    asks: Receiver<Ask>,
    replies: Sender<Result<Reply>>,
) {
    let built = (|| -> Result<(std::sync::Arc<Gpu>, GpuResNet, Option<String>)> {
        let gpu = std::sync::Arc::new(Gpu::open(setup.discovery, ordinal)?);
        let (free, _) = gpu.mem_info()?;
        device_need(
            ordinal,
            setup.model,
            (setup.batch_per_gpu, setup.accumulate, setup.checkpoint),
            setup.image,
            setup.precision,
            &setup.opt,
        )?
        .check(Some(free), HINT)?;
        let mut net = GpuResNet::new(
            setup.discovery,
            gpu.clone(),
            setup.model,
            setup.batch_per_gpu,
            setup.image,
            (setup.precision, setup.checkpoint),
            setup.opt,
            setup.smoothing,
        )?;
        net.use_graph(setup.graph);
        net.set_accumulate(setup.accumulate)?;
        let on_host = match setup.data {
            Some(data) => net.keep_data(data, DATA_SHARE)?,
            None => Some(ONE_BATCH.into()),
        };
        Ok((gpu, net, on_host))
    })();
    let (gpu, mut net, on_host) = match built {
        Ok(b) => b,
        Err(e) => {
            let _ = replies.send(Err(e));
            return;
        }
    };
    if replies.send(Ok(Reply::Ready(on_host.clone()))).is_err() {
        return;
    }
    let mut held: Option<Shard> = None;
    for ask in asks {
        let reply = match ask {
            Ask::Step { shard, micro } => (|| {
                let fresh = shard.is_some();
                if let Some(s) = shard {
                    held = Some(s);
                }
                let s = held
                    .as_ref()
                    .ok_or_else(|| Error::Failed("a step before any batch".into()))?;
                let batch = Batch {
                    indices: &s.indices,
                    images: s.images.as_ref(),
                    labels: &s.labels,
                };
                let (l, c) = net.step(batch, fresh, micro)?;
                if sums && net.has_peers() {
                    let all = net.sum_over_ranks(&[l, c as f64])?;
                    return Ok(Reply::Stepped(all[0], all[1].round() as usize, true));
                }
                Ok(Reply::Stepped(l, c, false))
            })(),
            Ask::Join(id) => (|| {
                let comm = Comm::init_rank_on(&gpu, gpu.new_priority_stream()?, &id, rank, world)?;
                net.attach(
                    comm,
                    (setup.bucket_mb * f64::from(1 << 20)) as usize,
                    setup.grad_comm,
                )?;
                net.load(setup.model)?;
                net.load_optimizer(&CnnOptimizer::new(setup.opt))?;
                held = None;
                Ok(Reply::Joined)
            })(),
            Ask::Figures => (|| {
                Ok(Reply::Figures(RankFigures {
                    peak_bytes: net.peak_bytes()?,
                    step_launch: net.step_launch(),
                    memory: net.memory_parts(),
                    conv_algorithms: net.conv_algorithms(),
                    buckets: net.buckets(),
                    weights: net.weights_digest()?,
                    data_on_host: on_host.clone(),
                }))
            })(),
        };
        let failed = reply.is_err();
        if replies.send(reply).is_err() || failed {
            return;
        }
    }
}

/// Trains the ranks of `placement` (`setup` on each) over `images` by `cfg` (its batch the
/// combined one): first each rank alone on its shards, then together from the initial weights.
/// Returns the seconds from `started` to the first update, the data-parallel loop's outcome,
/// rank 0's figures (this process's first rank's, launched) and the data-parallel figures (no
/// PyTorch rows yet; the slowest rank's update times); an error when the first data-parallel
/// loss is not the ranks' first alone loss (the same weights and shards) or the ranks' weights
/// differ at the end.
pub fn train(
    setup: &Setup<'_>,
    placement: Placement<'_>,
    (images, cfg): (&Images, &LoopConfig),
    started: Instant,
    progress: &mut dyn FnMut(&str),
) -> Result<(f64, LoopOutcome, RankFigures, CnnDataParallel)> {
    let world = placement.world();
    let (setup_seconds, alone, out, figures, exchanged) = with_ranks(setup, placement, |ranks| {
        // launched: the processes meet (rank 0 hands out NCCL's id) before training alone
        let session = match placement {
            Placement::Launched(w) => Some(meet(w)?),
            Placement::Threads(_) => None,
        };
        let run = (|| -> Result<_> {
            let setup_seconds = started.elapsed().as_secs_f64();
            let alone = run::train(ranks, images, cfg, &mut |u| {
                progress(&format!(
                    "each GPU alone, update {}: {:.1} ms",
                    u.step,
                    u.seconds * 1e3
                ))
            })?;
            let id = match &session {
                Some(s) => UniqueId::from_bytes(s.blob())?,
                None => UniqueId::new()?,
            };
            ranks.join(&id)?;
            let out = run::train(ranks, images, cfg, &mut |u| {
                progress(&format!(
                    "data-parallel x{world}, update {}: loss {:.6} ({:.1} ms)",
                    u.step,
                    u.loss,
                    u.seconds * 1e3
                ))
            })?;
            let figures = ranks.figures()?;
            let exchanged = match &session {
                Some(s) => Some(exchange(s, &alone, &out, figures.weights)?),
                None => None,
            };
            Ok((setup_seconds, alone, out, figures, exchanged))
        })();
        match (session, run) {
            (Some(s), Ok(done)) => {
                s.finish()?;
                Ok(done)
            }
            (Some(s), Err(e)) => {
                s.abort(&e.to_string());
                Err(e)
            }
            (None, run) => run,
        }
    })?;
    let mine = (
        alone.updates.first().map(|u| u.loss),
        median_step_ms(&alone.updates),
        median_step_ms(&out.updates),
    );
    // both phases start from the same weights on the same shards: the same first loss (a
    // launched rank's alone loss is its own shard's: the ranks' mean is the combined batch's)
    let (first_alone, single, together) = match &exchanged {
        Some(e) => e.combined()?,
        None => mine,
    };
    if let (Some(a), Some(d)) = (first_alone, out.updates.first()) {
        let apart = (a - d.loss).abs() / a.abs().max(1e-30);
        if apart.is_nan() || apart > 1e-5 {
            return Err(Error::Failed(format!(
                "the first data-parallel loss {} is not the ranks' alone {a} ({apart:.1e} \
                 apart): the shards or the weights differ",
                d.loss
            )));
        }
    }
    let batch = setup.batch_per_gpu;
    let dp = CnnDataParallel {
        ranks: world,
        batch_per_gpu: batch,
        combined_batch: cfg.batch_size,
        buckets: figures.buckets,
        bucket_mb: setup.bucket_mb,
        grad_comm: setup.grad_comm.name().into(),
        gradient_mib: (setup.model.parameter_count() * 4) as f64 / f64::from(1 << 20),
        single_step_ms: single,
        step_ms: together,
        // an update trains `accumulate` micro-batches
        single_images_per_s: (batch * cfg.accumulate) as f64 / (single / 1e3),
        images_per_s: (cfg.batch_size * cfg.accumulate) as f64 / (together / 1e3),
        scaling_efficiency: single / together,
        ddp: Vec::new(),
    };
    Ok((setup_seconds, out, figures, dp))
}

/// A launched rank at gpukit's rendezvous: every process arrives (or the run ends with a
/// message), rank 0's NCCL id handed to all; a process that stops later ends the others.
fn meet(w: &gpukit_ranks::world::World) -> Result<gpukit_ranks::rendezvous::Session> {
    super::parallel::join_ranks(w, HANG_TIMEOUT)
}

/// What each launched rank told the others after training: its first alone loss, its median
/// update times alone and together, its final weights' digest (in rank order).
struct Exchanged(Vec<RankSays>);

/// One launched rank's first alone loss, median update times alone and together (ms), and
/// final weights' digest.
type RankSays = (Option<f64>, f64, f64, u64);

impl Exchanged {
    /// The ranks' mean first alone loss (the combined batch's) and the slowest rank's update
    /// times; an error when a rank's final weights differ from rank 0's.
    fn combined(&self) -> Result<(Option<f64>, f64, f64)> {
        let all = &self.0;
        if let Some(rank) = all.iter().position(|r| r.3 != all[0].3) {
            return Err(Error::Failed(format!(
                "after training, rank {rank}'s weights differ from rank 0's: the gradients were \
                 not averaged alike"
            )));
        }
        let firsts: Option<Vec<f64>> = all.iter().map(|r| r.0).collect();
        let first = firsts.map(|f| f.iter().sum::<f64>() / f.len().max(1) as f64);
        let slowest = |f: fn(&RankSays) -> f64| all.iter().map(f).fold(f64::NAN, f64::max);
        Ok((first, slowest(|r| r.1), slowest(|r| r.2)))
    }
}

/// Every launched rank's figures, through the rendezvous (one exchange after training).
fn exchange(
    session: &gpukit_ranks::rendezvous::Session,
    alone: &LoopOutcome,
    out: &LoopOutcome,
    weights: u64,
) -> Result<Exchanged> {
    let mine = (
        alone.updates.first().map(|u| u.loss),
        median_step_ms(&alone.updates),
        median_step_ms(&out.updates),
        weights,
    );
    let bytes = serde_json::to_vec(&mine).map_err(|e| Error::Failed(e.to_string()))?;
    let all = session
        .all_gather(&bytes)?
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Failed(format!("a rank sent malformed figures: {e}")))?;
    Ok(Exchanged(all))
}

/// What PyTorch's DistributedDataParallel is asked to train: the run's network, precision
/// and optimizer.
pub struct DdpRequest<'a> {
    /// torchvision's name (`resnet50`).
    pub model: &'a str,
    pub classes: usize,
    /// Square images of this side.
    pub image: usize,
    pub precision: Precision,
    pub opt: CnnOptimizerConfig,
    pub smoothing: f64,
    pub checkpoint: bool,
    /// Averaging in bf16: DDP's bf16 compression hook.
    pub bf16_comm: bool,
}

/// PyTorch's modes (eager DDP, torch.compile of the DDP model), each one GPU alone and then
/// `world` ranks of `batch` images (the reference script's `ddp-cnn`, buckets of `bucket_mb`),
/// `steps` timed updates after 5.
pub fn compare_ddp(
    r: &DdpRequest<'_>,
    (world, batch, bucket_mb): (usize, usize, f64),
    steps: u64,
) -> Result<Vec<DdpCnnRow>> {
    use gpukit_train::optim::OptimizerKind;
    let o = r.opt;
    let mut args: Vec<String> = [
        "ddp-cnn",
        "--model",
        r.model,
        "--classes",
        &r.classes.to_string(),
        "--image-size",
        &r.image.to_string(),
        "--nproc",
        &world.to_string(),
        "--batch-per-gpu",
        &batch.to_string(),
        "--precision",
        r.precision.name(),
        "--optimizer",
        match o.kind {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam | OptimizerKind::AdamW => "adamw",
        },
        "--lr",
        &o.lr.to_string(),
        "--momentum",
        &o.momentum.to_string(),
        "--weight-decay",
        &o.weight_decay.to_string(),
        "--label-smoothing",
        &r.smoothing.to_string(),
        "--steps",
        &steps.max(10).to_string(),
        "--bucket-mb",
        &bucket_mb.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if o.nesterov {
        args.push("--nesterov".into());
    }
    if r.checkpoint {
        args.push("--checkpoint".into());
    }
    if r.bf16_comm {
        args.extend(["--grad-comm".into(), "bf16".into()]);
    }
    let run = crate::peer::run_pytorch(&args)?;
    Ok(run
        .results
        .iter()
        .map(|v| DdpCnnRow {
            mode: v["mode"].as_str().unwrap_or("?").to_string(),
            failed: (v["status"] != "ok")
                .then(|| v["reason"].as_str().unwrap_or("failed").to_string()),
            single_images_per_s: v["single"]["images_per_s"].as_f64(),
            images_per_s: v["ddp"]["images_per_s"].as_f64(),
            scaling_efficiency: v["scaling_efficiency"].as_f64(),
            peak_bytes: v["ddp"]["peak_allocated_bytes"].as_u64(),
        })
        .collect())
}

/// The median of the update times after the first (ms).
pub fn median_step_ms(updates: &[UpdateStats]) -> f64 {
    let mut v: Vec<f64> = updates.iter().skip(1).map(|u| u.seconds * 1e3).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Starts a thread per rank of this process (`placement`), each with its trainer built, and
/// hands `work` the ranks as a stepper; the threads end when `work` returns.
pub fn with_ranks<T>(
    setup: &Setup<'_>,
    placement: Placement<'_>,
    work: impl FnOnce(&mut Ranks) -> Result<T>,
) -> Result<T> {
    let world = placement.world();
    let local = placement.local();
    let sums = matches!(placement, Placement::Launched(_));
    std::thread::scope(|scope| {
        let mut asks = Vec::new();
        let mut replies = Vec::new();
        for &(rank, ordinal) in &local {
            let (ask_tx, ask_rx) = channel();
            let (reply_tx, reply_rx) = channel();
            asks.push(ask_tx);
            replies.push(reply_rx);
            scope.spawn(move || rank_thread(setup, (rank, ordinal, world), sums, ask_rx, reply_tx));
        }
        let mut ranks = Ranks {
            asks,
            replies,
            batch_per_gpu: setup.batch_per_gpu,
            local,
            world,
            resident: Vec::new(),
        };
        ranks.resident = ranks
            .gather()?
            .into_iter()
            .map(|r| matches!(r, Reply::Ready(None)))
            .collect();
        // the threads end when their channels close, whatever `work` returned
        work(&mut ranks)
    })
}

/// A launched world as a launcher's environment describes it: rank `rank` of `size`, on
/// cuda:`local` (for tests).
#[cfg(test)]
pub(super) fn launched_world(rank: usize, size: usize, local: usize) -> gpukit_ranks::world::World {
    let env = |k: &str| match k {
        "RANK" => Some(rank.to_string()),
        "WORLD_SIZE" => Some(size.to_string()),
        "LOCAL_RANK" => Some(local.to_string()),
        "MASTER_ADDR" => Some("127.0.0.1".to_string()),
        "MASTER_PORT" => Some("29500".to_string()),
        _ => None,
    };
    gpukit_ranks::world::from_env(&env)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("a launcher's environment for rank {rank} of {size}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_the_rows_of_each_rank() {
        let images = Tensor {
            shape: [4, 1, 1, 2],
            data: (0..8).map(|v| v as f32).collect(),
        };
        let labels = [0, 1, 2, 3];
        let (x, y) = rows((&images, &labels), 2, 2);
        assert_eq!(x.shape, [2, 1, 1, 2]);
        assert_eq!(x.data, vec![4.0, 5.0, 6.0, 7.0]);
        assert_eq!(y, vec![2, 3]);
    }

    #[test]
    fn a_combined_step_is_the_mean_of_the_shards_or_the_ranks_sum() {
        // a world of threads: every shard's loss here
        let threads = vec![Reply::Stepped(1.0, 3, false), Reply::Stepped(3.0, 5, false)];
        assert_eq!(combine(threads, 2, 2), (2.0, 8));
        // a launched rank once joined: its thread answers the sum over all 4 ranks
        assert_eq!(
            combine(vec![Reply::Stepped(10.0, 40, true)], 4, 1),
            (2.5, 40)
        );
        // a launched rank alone: its own shard's
        assert_eq!(combine(vec![Reply::Stepped(0.7, 2, false)], 4, 1), (0.7, 2));
    }

    #[test]
    fn launched_ranks_figures_combine_into_the_slowest_and_the_mean_first_loss() {
        let e = Exchanged(vec![(Some(1.0), 10.0, 12.0, 7), (Some(3.0), 11.0, 11.5, 7)]);
        assert_eq!(e.combined().unwrap(), (Some(2.0), 11.0, 12.0));
        let apart = Exchanged(vec![(Some(1.0), 1.0, 1.0, 7), (Some(1.0), 1.0, 1.0, 8)]);
        let err = apart.combined().unwrap_err().to_string();
        assert!(err.contains("rank 1's weights differ"), "{err}");
        let none = Exchanged(vec![(None, 1.0, 1.0, 7), (Some(1.0), 1.0, 1.0, 7)]);
        assert_eq!(none.combined().unwrap().0, None);
    }

    #[test]
    fn placements_name_this_processs_ranks_and_gpus() {
        assert_eq!(Placement::Threads(3).local(), vec![(0, 0), (1, 1), (2, 2)]);
        let w = launched_world(3, 4, 1);
        let p = Placement::Launched(&w);
        assert_eq!((p.world(), p.local()), (4, vec![(3, 1)]));
    }

    #[test]
    fn the_median_leaves_the_first_update_out() {
        let u = |s| UpdateStats {
            step: 1,
            loss: 0.0,
            accuracy: 0.0,
            seconds: s,
        };
        assert_eq!(median_step_ms(&[u(9.0), u(0.001), u(0.003), u(0.002)]), 2.0);
        assert!(median_step_ms(&[u(1.0)]).is_nan());
    }
}
