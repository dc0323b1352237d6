//! `gpukit train --pipeline N`: the MLP's layers split across N GPUs of this machine (a
//! thread each), by the time their products take, each batch run as micro-batches in the 1F1B
//! schedule (the train crate's `gpu::pipeline`).
//!
//! What the run measures and checks, in this order:
//! - each layer's products timed on cuda:0; the split whose slowest stage is fastest;
//! - the whole model on one GPU, the same batches (when it fits, under --memory-fraction and
//!   then without it): its per-update losses are what the pipeline's must equal, its speed
//!   the figure beside;
//! - each stage alone: its micro-batches through its layers with no sends or receives (the
//!   busy time); then the stages together. The bubble is the share of the pipeline's update
//!   the slowest stage is not busy, set beside the schedule's (N - 1) / (M + N - 1).

use super::parallel::Meet;
use crate::error::{Error, Result};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nccl::{Comm, UniqueId};
use gpukit_cuda::Gpu;
use gpukit_train::budget::{device_need, DataShape, HINT};
use gpukit_train::checkpoint::Position;
use gpukit_train::data::Dataset;
use gpukit_train::gpu::feed::Loader;
use gpukit_train::gpu::links::Links;
use gpukit_train::gpu::pipeline::{layer_costs, split, split_rows, update_costs, Stage};
use gpukit_train::gpu::{GpuDetails, GpuOptions, GpuTrainer, Precision};
use gpukit_train::model::Mlp;
use gpukit_train::optim::Optimizer;
use gpukit_train::run::{RunOutcome, TrainConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What pipeline-parallel training did, beside the run's own figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pipeline {
    pub stages: usize,
    /// How the stages were started: threads in one process, or the launcher's processes.
    #[serde(default)]
    pub started_by: String,
    /// How activations and their gradients travel between the stages.
    #[serde(default)]
    pub transfers: String,
    pub micro_batches: usize,
    /// Rows of the largest micro-batch.
    pub micro_rows: usize,
    /// Each stage's layers `[first, end)`.
    pub layers: Vec<(usize, usize)>,
    /// The layers a stage came from `--pipeline-split` (not gpukit's choice).
    #[serde(default)]
    pub split_given: bool,
    /// Milliseconds of each layer's products on one micro-batch (what the split balances).
    pub layer_ms: Vec<f64>,
    /// Each layer's optimizer step, estimated from the bytes it moves (what the split weighs
    /// beside the products among near-equal splits).
    #[serde(default)]
    pub layer_update_ms: Vec<f64>,
    /// Each stage's update alone: its micro-batches, no sends or receives (median of epochs).
    pub alone_step_ms: Vec<f64>,
    /// Each stage's update in the pipeline.
    pub step_ms: Vec<f64>,
    /// Each stage's optimizer step alone. The first stage's is on every update's critical
    /// path: the others wait for its next forward while it updates (the flush).
    #[serde(default)]
    pub optimizer_ms: Vec<f64>,
    pub samples_per_s: f64,
    /// The share of the pipeline's update the busiest stage is idle: 1 - alone / pipeline.
    pub bubble: f64,
    /// The 1F1B schedule's idle share with equal stages: (N - 1) / (M + N - 1).
    pub bubble_schedule: f64,
    /// The bubble less the optimizer steps, which the schedule's fraction leaves out, on the
    /// busiest stage: see [`without_flush`].
    #[serde(default)]
    pub bubble_without_flush: f64,
    /// Peak device memory each stage's pool held.
    pub stage_peak_bytes: Vec<u64>,
    /// The whole model on one GPU: refused under --memory-fraction (why), and the run without
    /// the fraction beside.
    #[serde(default)]
    pub one_gpu_refused: Option<String>,
    #[serde(default)]
    pub one_gpu: Option<OneGpu>,
    /// Why the pipeline's losses are not the one-GPU run's (the report then fails).
    #[serde(default)]
    pub disagreement: Option<String>,
    /// torch.distributed.pipelining's Schedule1F1B on the same model, split and micro-batches,
    /// with --compare-pytorch.
    #[serde(default)]
    pub pytorch: Option<PipelinePeer>,
}

/// PyTorch's pipeline of the same MLP (a process a stage, the same layers each).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelinePeer {
    pub torch_version: String,
    /// The slowest stage's median update.
    pub step_ms: f64,
    pub per_stage_step_ms: Vec<f64>,
    pub samples_per_s: f64,
}

/// The whole model on one GPU with the same batches.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OneGpu {
    pub step_ms: f64,
    pub samples_per_s: f64,
    /// Largest per-update loss difference from the pipeline's, relative.
    pub max_loss_rel_diff: f64,
    /// What the comparison allows for the precision.
    pub tolerance: f64,
    pub peak_bytes: u64,
    /// Whether it replayed CUDA graphs (its best mode; the pipeline launches eagerly).
    pub graph: bool,
    /// Its per-update losses (the pipeline's are the run's).
    #[serde(default)]
    pub step_losses: Vec<f64>,
}

/// Everything the stages share.
pub struct Job<'a> {
    pub discovery: &'a Discovery,
    pub cfg: &'a TrainConfig,
    pub precision: Precision,
    pub train: &'a Dataset,
    pub model: &'a Mlp<f32>,
    pub opt: &'a Optimizer<f32>,
    pub stages: usize,
    pub micro: usize,
    /// `--pipeline-split`: layers a stage, first to last (None: [`split`] chooses).
    pub split: Option<&'a [usize]>,
    pub memory_fraction: Option<f64>,
    pub timeout: std::time::Duration,
    /// Under a launcher: this process is the stage of its rank, on cuda:LOCAL_RANK.
    pub launched: Option<&'a gpukit_ranks::world::World>,
}

/// How the stages wait for one another: threads of this process, or launched processes at
/// gpukit's rendezvous.
enum Together<'a> {
    Threads(Meet<'a>),
    Session(&'a gpukit_ranks::rendezvous::Session),
}

impl Together<'_> {
    /// Every stage says whether it prepared; whether all did.
    fn prepared(&self, ok: bool) -> Result<bool> {
        use std::sync::atomic::Ordering;
        match self {
            Together::Threads(m) => {
                if !ok {
                    m.failed.store(true, Ordering::SeqCst);
                }
                m.barrier.wait();
                Ok(!m.failed.load(Ordering::SeqCst))
            }
            Together::Session(s) => Ok(s
                .all_gather(&[u8::from(ok)])?
                .iter()
                .all(|b| b.as_slice() == [1])),
        }
    }

    /// Returns once every stage is here.
    fn wait(&self) -> Result<()> {
        match self {
            Together::Threads(m) => {
                m.barrier.wait();
                Ok(())
            }
            Together::Session(s) => Ok(s.barrier()?),
        }
    }
}

/// A stage's figures, as it hands them to the report (through the rendezvous when launched).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StageFigures {
    alone_ms: f64,
    step_ms: f64,
    update_ms: f64,
    peak_bytes: u64,
    /// The last stage's outcome (its losses are the pipeline's) and details.
    last: Option<(RunOutcome, GpuDetails)>,
}

/// Median milliseconds an update over the run's epochs.
fn step_ms(o: &RunOutcome) -> f64 {
    super::parallel::step_ms(&o.epochs)
}

/// The per-update losses the pipeline must meet, relative: fp32 sums in another order only;
/// tf32 and 16-bit products round differently with the micro-batches' row counts.
fn tolerance(p: Precision) -> f64 {
    match p {
        Precision::Fp32 => 1e-5,
        Precision::Tf32 => 5e-3,
        Precision::Fp16 | Precision::Bf16 => 5e-2,
    }
}

/// One stage's part.
struct StageRun {
    outcome: RunOutcome,
    details: GpuDetails,
    alone_ms: f64,
    update_ms: f64,
    step_ms: f64,
    model: Mlp<f32>,
    opt: Optimizer<f32>,
}

fn opts(job: &Job<'_>, stage: Option<Stage>, fraction: Option<f64>) -> GpuOptions {
    GpuOptions {
        loader: Some(Loader::Resident),
        // a stage launches eagerly; one GPU takes its default (graphs)
        graph: stage.map(|_| false),
        stage,
        memory_fraction: fraction,
        ..GpuOptions::new(job.precision)
    }
}

/// Runs `t` from the start twice (the first warms the libraries and, in the pipeline, NCCL's
/// connections); the second's outcome. In the pipeline every stage starts each run together
/// (`together`): a stage that starts later would count in the others' times.
fn twice(
    t: &mut GpuTrainer,
    job: &Job<'_>,
    together: Option<&Together<'_>>,
) -> Result<(RunOutcome, GpuDetails)> {
    let mut run = || -> Result<(RunOutcome, GpuDetails)> {
        t.load(job.model, job.opt, None)?;
        if let Some(b) = together {
            b.wait()?;
        }
        Ok(t.run(Position::default(), &mut |_| {})?)
    };
    run()?;
    run()
}

/// How the stages reach one another: NCCL (its id), or the copy engines (threads of this
/// process whose GPUs reach each other's memory).
enum Transport {
    Nccl(UniqueId),
    Copies(Links),
}

/// The transfers' name in the report.
const COPIES: &str = "the GPUs' copy engines (peer copies, no kernel on either stage)";
const NCCL: &str = "NCCL send/receive on each stage's work stream";

/// Whether stages 0..n of this process can use the copy engines: every neighbouring pair
/// reaches each other's memory, and `GPUKIT_PIPE_NCCL` is unset (it forces NCCL, for A/B).
fn copies_between(n: usize) -> bool {
    if std::env::var_os("GPUKIT_PIPE_NCCL").is_some_and(|v| !v.is_empty() && v != "0") {
        return false;
    }
    gpukit_cuda::driver::peer_access_matrix(n)
        .is_ok_and(|m| (1..n).all(|i| m[i - 1][i] && m[i][i - 1]))
}

fn stage_run(
    job: &Job<'_>,
    transport: &Transport,
    (stage, ordinal): (Stage, usize),
    together: &Together<'_>,
) -> Result<StageRun> {
    let prepared = (|| -> Result<_> {
        let gpu = Arc::new(Gpu::open(job.discovery, ordinal)?);
        let mut t = GpuTrainer::new(
            job.discovery,
            gpu.clone(),
            job.cfg,
            opts(job, Some(stage), job.memory_fraction),
            job.train.clone(),
            None,
        )?;
        let (alone, _) = twice(&mut t, job, None)?;
        let update_ms = t.time_update()?;
        Ok((gpu, t, step_ms(&alone), update_ms))
    })();
    let all = together.prepared(prepared.is_ok())?;
    if prepared.is_ok() && !all {
        return Err(Error::Failed(
            "another stage failed before the pipeline started (its error is reported)".into(),
        ));
    }
    let (gpu, mut t, alone_ms, update_ms) = prepared?;
    match transport {
        Transport::Nccl(id) => {
            let comm = Comm::init_rank_on(&gpu, t.stream(), id, stage.index, stage.count)?;
            t.attach_pipeline(comm)?;
        }
        Transport::Copies(links) => {
            let mine = links.connect(stage.index, &gpu, t.pipeline_inbox_bytes())?;
            t.attach_pipeline_links(mine)?;
        }
    }
    let (outcome, details) = twice(&mut t, job, Some(together))?;
    if let Some(line) = t.pipeline_trace()? {
        gpukit_cuda::trace::note(|| format!("pipeline stage {}: {line}", stage.index));
    }
    let (mut model, mut opt) = (job.model.clone(), job.opt.clone());
    t.store(&mut model, &mut opt)?;
    Ok(StageRun {
        step_ms: step_ms(&outcome),
        outcome,
        details,
        alone_ms,
        update_ms,
        model,
        opt,
    })
}

/// The whole model on cuda:0: refused under the memory fraction (the refusal, in words), and
/// run without it when it fits the GPU.
/// Why one GPU refused the model under the fraction, and the run without it (when it fits).
type OneGpuRun = (Option<String>, Option<(RunOutcome, GpuDetails)>);

fn one_gpu(job: &Job<'_>, ordinal: usize) -> Result<OneGpuRun> {
    let gpu = Arc::new(Gpu::open(job.discovery, ordinal)?);
    let (free, total) = gpu.mem_info()?;
    let shape = DataShape {
        train: job.train.len(),
        eval: 0,
        features: job.train.features,
        target_width: job.train.target_width(),
    };
    let need = device_need(0, job.cfg, &shape, job.precision, Loader::Resident);
    let refused = job.memory_fraction.and_then(|f| {
        let limit = free.min((total as f64 * f) as u64);
        need.check(Some(limit), HINT).err().map(|r| r.to_string())
    });
    if need.check(Some(free), HINT).is_err() {
        return Ok((refused, None));
    }
    let mut t = GpuTrainer::new(
        job.discovery,
        gpu,
        job.cfg,
        opts(job, None, None),
        job.train.clone(),
        None,
    )?;
    Ok((refused, Some(twice(&mut t, job, None)?)))
}

/// The run's result: the pipeline's outcome (the last stage's losses), its GPU details, the
/// trained model and optimizer (every stage's layers), and the pipeline's figures.
pub type Outcome = (RunOutcome, GpuDetails, Mlp<f32>, Optimizer<f32>, Pipeline);

/// The pipeline's run; under a launcher only rank 0 gets it (the others None).
pub fn run(job: &Job<'_>, progress: &mut dyn FnMut(&str)) -> Result<Option<Outcome>> {
    let n = job.stages;
    let count = gpukit_cuda::driver::probe(job.discovery)
        .map_err(|e| Error::Unavailable(format!("pipeline-parallel training needs GPUs: {e}")))?
        .device_count;
    let local = job.launched.map_or(n, |_| 1);
    if local > count {
        return Err(Error::BadInput(format!(
            "--pipeline {n}: this machine has {count} CUDA device(s)"
        )));
    }
    let copies = job.launched.is_none() && copies_between(n);
    if !copies {
        gpukit_cuda::nccl::require(job.discovery).map_err(|e| {
            Error::Unavailable(format!("pipeline-parallel training needs NCCL: {e}"))
        })?;
    }
    match job.launched {
        None => run_threads(job, copies, progress).map(Some),
        Some(w) => run_launched(job, w, progress),
    }
}

/// Milliseconds of each layer's products on a micro-batch, and of its optimizer step.
type LayerTimes = (Vec<f64>, Vec<f64>);

/// Each layer's products timed on cuda:`ordinal`, on a micro-batch's rows, and each layer's
/// optimizer step estimated there.
fn time_layers(job: &Job<'_>, ordinal: usize, micro_rows: usize) -> Result<LayerTimes> {
    let gpu = Arc::new(Gpu::open(job.discovery, ordinal)?);
    let products = layer_costs(
        job.discovery,
        &gpu,
        &job.cfg.widths,
        micro_rows,
        job.precision,
    )?;
    let updates = update_costs(&gpu, &job.cfg.widths, job.precision, &job.cfg.optimizer)?;
    Ok((products, updates))
}

/// The stages as threads of this process, on cuda:0..N-1.
fn run_threads(job: &Job<'_>, copies: bool, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
    let n = job.stages;
    let micro_rows = micro_rows(job);
    progress(&format!(
        "pipeline x{n}: timing each layer's products on {micro_rows} rows"
    ));
    let (layer_ms, update_ms) = time_layers(job, 0, micro_rows)?;
    let spans = stage_spans(job, (&layer_ms, &update_ms))?;
    progress("pipeline: the whole model on one GPU, the same batches");
    let single = one_gpu(job, 0)?;
    progress(&split_line(n, &spans));
    let transport = if copies {
        Transport::Copies(Links::new(n, job.timeout))
    } else {
        Transport::Nccl(UniqueId::new()?)
    };
    let barrier = std::sync::Barrier::new(n);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let runs: Vec<Result<StageRun>> = std::thread::scope(|scope| {
        let handles: Vec<_> = spans
            .iter()
            .enumerate()
            .map(|(index, &layers)| {
                let stage = Stage {
                    index,
                    count: n,
                    layers,
                    micro: job.micro,
                };
                let (transport, together) = (
                    &transport,
                    Together::Threads(Meet {
                        barrier: &barrier,
                        failed: &failed,
                    }),
                );
                scope.spawn(move || {
                    let r = stage_run(job, transport, (stage, index), &together);
                    if let Err(e) = &r {
                        crate::hang_guard::after_failure(
                            job.timeout,
                            format!("pipeline stage {index} (cuda:{index}): {e}"),
                        );
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Failed("a pipeline thread panicked".into())))
            })
            .collect()
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>>>()?;
    // every stage's layers, and their optimizer state, into one model
    let (mut model, mut opt) = (job.model.clone(), job.opt.clone());
    for (r, &(a, b)) in runs.iter().zip(&spans) {
        model.layers[a..b].clone_from_slice(&r.model.layers[a..b]);
        opt.step = r.opt.step;
        for (all, mine) in [(&mut opt.m, &r.opt.m), (&mut opt.v, &r.opt.v)] {
            if !mine.is_empty() {
                all.resize(mine.len(), Vec::new());
                all[2 * a..2 * b].clone_from_slice(&mine[2 * a..2 * b]);
            }
        }
    }
    let last = runs.last().ok_or(Error::NoSamples)?;
    let figures: Vec<StageFigures> = runs.iter().map(StageRun::figures).collect();
    let (outcome, details, report) = assemble(
        job,
        (micro_rows, spans, (layer_ms, update_ms)),
        &figures,
        (&last.outcome, &last.details),
        single,
        ("threads in one process", if copies { COPIES } else { NCCL }),
    );
    Ok((outcome, details, model, opt, report))
}

/// This process as the stage of its rank (cuda:LOCAL_RANK), the others at gpukit's rendezvous:
/// rank 0 times the layers and hands the split out (every stage splits alike); after the
/// pipeline each stage hands rank 0 its figures, the last its losses; then rank 0 alone runs
/// the whole model on its GPU for the comparison. Rank 0 returns the run (its own stage's
/// layers trained; the others stay in their processes), the others None.
fn run_launched(
    job: &Job<'_>,
    w: &gpukit_ranks::world::World,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<Outcome>> {
    let n = job.stages;
    if w.world_size != n {
        return Err(Error::BadInput(format!(
            "--pipeline {n} under a launcher of {} processes: each process is one stage",
            w.world_size
        )));
    }
    let session = super::parallel::join_ranks(w, job.timeout)?;
    let micro_rows = micro_rows(job);
    let staged = (|| -> Result<Staged> {
        let mine = if w.rank == 0 {
            progress(&format!(
                "pipeline x{n}: timing each layer's products on {micro_rows} rows"
            ));
            json(&time_layers(job, w.local_rank, micro_rows)?)?
        } else {
            Vec::new()
        };
        let all = session.all_gather(&mine)?;
        let (layer_ms, update_ms): LayerTimes = unjson(&all[0], "the layers' times")?;
        let spans = stage_spans(job, (&layer_ms, &update_ms))?;
        progress(&split_line(n, &spans));
        let id = UniqueId::from_bytes(session.blob())?;
        let stage = Stage {
            index: w.rank,
            count: n,
            layers: spans[w.rank],
            micro: job.micro,
        };
        let run = stage_run(
            job,
            &Transport::Nccl(id),
            (stage, w.local_rank),
            &Together::Session(&session),
        )?;
        let mut mine = run.figures();
        if w.rank != n - 1 {
            mine.last = None;
        }
        let figures = session
            .all_gather(&json(&mine)?)?
            .iter()
            .map(|b| unjson::<StageFigures>(b, "a stage's figures"))
            .collect::<Result<Vec<_>>>()?;
        Ok((spans, (layer_ms, update_ms), run, figures))
    })();
    let (spans, times, run, figures) = match staged {
        Ok(done) => {
            session.finish()?;
            done
        }
        Err(e) => {
            session.abort(&e.to_string());
            return Err(e);
        }
    };
    if w.rank != 0 {
        return Ok(None);
    }
    progress("pipeline: the whole model on one GPU, the same batches");
    let single = one_gpu(job, w.local_rank)?;
    let (outcome, details) = figures
        .last()
        .and_then(|f| f.last.clone())
        .ok_or_else(|| Error::Failed("the last stage sent no losses".into()))?;
    let (outcome, mut details, report) = assemble(
        job,
        (micro_rows, spans, times),
        &figures,
        (&outcome, &details),
        single,
        (&w.launcher.to_string(), NCCL),
    );
    details.device_name = run.details.device_name.clone();
    Ok(Some((outcome, details, run.model, run.opt, report)))
}

/// A launched stage's part: the split, the layers' times, its own run and every stage's figures.
type Staged = (Vec<(usize, usize)>, LayerTimes, StageRun, Vec<StageFigures>);

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::Failed(e.to_string()))
}

fn unjson<T: serde::de::DeserializeOwned>(b: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(b)
        .map_err(|e| Error::Failed(format!("a stage sent malformed {what}: {e}")))
}

/// Rows of the largest micro-batch.
fn micro_rows(job: &Job<'_>) -> usize {
    split_rows(job.cfg.batch_size.min(job.train.len()), job.micro)[0]
}

/// The stages' layers: as `--pipeline-split` gave them (checked against the model), or as
/// [`split`] chooses from the layers' times and the 1F1B schedule.
fn stage_spans(
    job: &Job<'_>,
    (layer_ms, update_ms): (&[f64], &[f64]),
) -> Result<Vec<(usize, usize)>> {
    match job.split {
        Some(counts) => given_spans(counts, layer_ms.len()),
        None => Ok(split(layer_ms, update_ms, job.stages, job.micro)?),
    }
}

/// Consecutive spans of `counts` layers each, which must take the model's `layers` exactly.
fn given_spans(counts: &[usize], layers: usize) -> Result<Vec<(usize, usize)>> {
    let total: usize = counts.iter().sum();
    if total != layers || counts.contains(&0) {
        return Err(Error::BadInput(format!(
            "--pipeline-split {}: gives {total} layer(s) in stages of at least one; the model has {layers}",
            counts.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        )));
    }
    let mut at = 0;
    Ok(counts
        .iter()
        .map(|&c| {
            at += c;
            (at - c, at)
        })
        .collect())
}

fn split_line(n: usize, spans: &[(usize, usize)]) -> String {
    format!(
        "pipeline x{n}: layers {}",
        spans
            .iter()
            .map(|(a, b)| format!("{a}..{b}"))
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

impl StageRun {
    fn figures(&self) -> StageFigures {
        StageFigures {
            alone_ms: self.alone_ms,
            step_ms: self.step_ms,
            update_ms: self.update_ms,
            peak_bytes: self.details.pool_peak_bytes,
            last: Some((self.outcome.clone(), self.details.clone())),
        }
    }
}

/// The pipeline's figures from every stage's (`figures`), the last stage's outcome and
/// details, and the whole model on one GPU (`single`): the run's outcome (the last stage's),
/// its details (the largest stage's memory) and the report.
fn assemble(
    job: &Job<'_>,
    (micro_rows, spans, (layer_ms, layer_update_ms)): (usize, Vec<(usize, usize)>, LayerTimes),
    figures: &[StageFigures],
    (last, last_details): (&RunOutcome, &GpuDetails),
    (one_gpu_refused, single): OneGpuRun,
    (started_by, transfers): (&str, &str),
) -> (RunOutcome, GpuDetails, Pipeline) {
    let n = job.stages;
    let rows = job.cfg.batch_size.min(job.train.len());
    let slowest = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let alone: Vec<f64> = figures.iter().map(|r| r.alone_ms).collect();
    let steps: Vec<f64> = figures.iter().map(|r| r.step_ms).collect();
    let tol = tolerance(job.precision);
    let (one_gpu, disagreement) = match &single {
        Some((o, d)) => {
            let (worst, at) = o
                .step_losses
                .iter()
                .zip(&last.step_losses)
                .enumerate()
                .map(|(i, (a, b))| ((a - b).abs() / a.abs().max(1e-12), i))
                .fold((0.0f64, 0usize), |m, x| if x.0 > m.0 { x } else { m });
            let lengths = o.step_losses.len() != last.step_losses.len();
            let disagreement = if lengths {
                Some(format!(
                    "the pipeline made {} updates, one GPU {}",
                    last.step_losses.len(),
                    o.step_losses.len()
                ))
            } else {
                (worst > tol || !worst.is_finite()).then(|| {
                    format!(
                        "update {}'s loss differs from one GPU's by {worst:.2e} (relative), more \
                         than {tol:.0e}: the pipeline is not the same training",
                        at + 1
                    )
                })
            };
            let ms = step_ms(o);
            (
                Some(OneGpu {
                    step_ms: ms,
                    samples_per_s: rows as f64 / (ms / 1e3),
                    max_loss_rel_diff: worst,
                    tolerance: tol,
                    peak_bytes: d.pool_peak_bytes,
                    graph: d.graph,
                    step_losses: o.step_losses.clone(),
                }),
                disagreement,
            )
        }
        None => (None, None),
    };
    // the busiest stage alone, and its step; the first stage's step, which the pipeline waits
    // for at every flush
    let busiest = alone
        .iter()
        .enumerate()
        .fold(0, |b, (i, &a)| if a > alone[b] { i } else { b });
    let updates: Vec<f64> = figures.iter().map(|r| r.update_ms).collect();
    let flush = updates.first().copied().unwrap_or(0.0);
    let report = Pipeline {
        bubble_without_flush: without_flush(
            alone[busiest],
            updates[busiest],
            slowest(&steps),
            flush,
        ),
        optimizer_ms: updates.clone(),
        stages: n,
        started_by: started_by.into(),
        transfers: transfers.into(),
        micro_batches: job.micro,
        micro_rows,
        layers: spans,
        split_given: job.split.is_some(),
        layer_ms,
        layer_update_ms,
        bubble: 1.0 - slowest(&alone) / slowest(&steps),
        bubble_schedule: (n - 1) as f64 / (job.micro + n - 1) as f64,
        samples_per_s: rows as f64 / (slowest(&steps) / 1e3),
        alone_step_ms: alone,
        step_ms: steps,
        stage_peak_bytes: figures.iter().map(|r| r.peak_bytes).collect(),
        one_gpu_refused,
        one_gpu,
        disagreement,
        pytorch: None,
    };
    let mut details = last_details.clone();
    details.pool_peak_bytes = report.stage_peak_bytes.iter().copied().max().unwrap_or(0);
    (last.clone(), details, report)
}

/// torch.distributed.pipelining's Schedule1F1B on the same MLP, split and micro-batches (a
/// process a stage, torch.multiprocessing), timed as gpukit times its stages.
pub fn compare(
    cfg: &TrainConfig,
    precision: Precision,
    p: &Pipeline,
    steps: usize,
) -> Result<PipelinePeer> {
    let dir = super::peer::handover_dir()?;
    let path = super::peer::write_config(dir.path(), cfg, precision.name(), true)?;
    let spans: Vec<String> = p.layers.iter().map(|(a, b)| format!("{a}:{b}")).collect();
    let run = crate::peer::run_pytorch(&[
        "pipeline".into(),
        "--config".into(),
        path.display().to_string(),
        "--spans".into(),
        spans.join(","),
        "--micro-batches".into(),
        p.micro_batches.to_string(),
        "--batch".into(),
        cfg.batch_size.to_string(),
        "--steps".into(),
        steps.max(10).to_string(),
    ])?;
    let d = &run.document;
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    Ok(PipelinePeer {
        torch_version: run.torch_version.clone(),
        step_ms: num(&d["step_ms"]["median_ms"]),
        per_stage_step_ms: d["per_rank_step_ms"]
            .as_array()
            .map(|v| v.iter().map(num).collect())
            .unwrap_or_default(),
        samples_per_s: num(&d["samples_per_s"]),
    })
}

/// The busiest stage's idle share of the update without the optimizer steps: its micro-batches
/// alone (`alone` less its own step, `own`) over the pipeline's update less the flush, the
/// first stage's step (`flush`) that every stage waits for, or the busiest stage's own where
/// that is longer (it runs during the flush): both sides without the same phase.
pub fn without_flush(alone: f64, own: f64, pipeline: f64, flush: f64) -> f64 {
    1.0 - (alone - own) / (pipeline - flush.max(own))
}

#[cfg(test)]
mod flush_tests {
    use super::without_flush;

    #[test]
    fn the_bubble_without_the_flush_takes_the_same_phase_off_both_sides() {
        // the first stage the busiest: its own step is the flush
        let first = without_flush(10.0, 1.0, 12.0, 1.0);
        assert!((first - (1.0 - 9.0 / 11.0)).abs() < 1e-12);
        // a later stage the busiest, its step longer than the flush: its own step off both
        // sides (it is busy all through the flush), not its step off one and the flush off
        // the other
        let later = without_flush(150.0, 13.0, 155.8, 12.2);
        assert!((later - (1.0 - 137.0 / 142.8)).abs() < 1e-12);
        assert!(later < 1.0 - 137.0 / 143.6);
        // its step shorter than the flush: it idles for the rest of the flush
        let short = without_flush(140.0, 5.0, 155.8, 12.2);
        assert!((short - (1.0 - 135.0 / 143.6)).abs() < 1e-12);
    }
}

#[cfg(test)]
mod split_tests {
    use super::given_spans;
    use crate::error::Error;

    #[test]
    fn a_given_split_takes_consecutive_layers_and_must_cover_the_model() {
        assert_eq!(given_spans(&[5, 4], 9).unwrap(), vec![(0, 5), (5, 9)]);
        assert_eq!(
            given_spans(&[1, 2, 3], 6).unwrap(),
            vec![(0, 1), (1, 3), (3, 6)]
        );
        for (counts, layers) in [(&[5, 5][..], 9), (&[4, 4][..], 9), (&[9, 0][..], 9)] {
            match given_spans(counts, layers) {
                Err(Error::BadInput(m)) => assert!(m.contains("--pipeline-split"), "{m}"),
                other => panic!("{counts:?} of {layers}: {other:?}"),
            }
        }
    }
}
