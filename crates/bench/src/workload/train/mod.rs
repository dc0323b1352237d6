//! `gpukit train`: the tutorials' training loops (two presets) or one described by flags, on
//! gpukit's training engine; per-epoch losses, accuracy and throughput, checkpoints and
//! resuming, per-step losses to a file.
//!
//! A request names every setting as optional: a preset fills those not given (the seed
//! regression loop when none is named), a data file gives the features and targets.

use crate::error::{Error, Result};
use crate::report::Document;
use gpukit_cuda::loader::Discovery;
use gpukit_tensor::{DType, Device};
use gpukit_train::budget::{device_need, host_need, DataShape, HostUse, HINT};
use gpukit_train::checkpoint::{self, Meta, Position};
use gpukit_train::data::{self, Dataset, Task};
use gpukit_train::gpu::feed::Loader;
use gpukit_train::gpu::{GpuDetails, GpuOptions, GpuTrainer, Precision};
use gpukit_train::loss::LossKind;
use gpukit_train::model::Mlp;
use gpukit_train::optim::{Optimizer, OptimizerConfig, OptimizerKind};
use gpukit_train::run::{train_cpu, EpochStats, MemoryUse, RunOutcome, TrainConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub mod cnn;
pub mod cnn_parallel;
pub mod cnn_peer;
pub mod parallel;
mod peer;
pub mod pipeline;
mod request;

pub use request::check_request;
pub(crate) use request::file_need;
use request::{check_left_to_train, resolve_steps};

pub use peer::{
    peer_tolerance, TrainPeer, PEER_EARLY_UPDATES, PEER_FINAL_TOLERANCE, PEER_LOSS_TOLERANCE,
    PEER_REPEATS,
};

/// The tutorials' two loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// 1024 x 16 standard normal, target standard normal, MLP 16-64-1, MSE, Adam 1e-3, batch
    /// 64 shuffled, 3 epochs.
    SeedRegression,
    /// 100 x 3 standard normal, labels 0/1, MLP 3-10-2, cross-entropy, SGD 0.01, full batch,
    /// 5 epochs.
    SeedClassification,
}

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::SeedRegression => "seed-regression",
            Preset::SeedClassification => "seed-classification",
        }
    }

    pub fn parse(s: &str) -> Option<Preset> {
        [Preset::SeedRegression, Preset::SeedClassification]
            .into_iter()
            .find(|p| p.name() == s.trim())
    }
}

/// What the user asked for; None takes the preset's value.
#[derive(Debug, Clone, Default)]
pub struct TrainRequest {
    pub preset: Option<Preset>,
    pub layers: Option<Vec<usize>>,
    pub samples: Option<usize>,
    pub features: Option<usize>,
    pub batch_size: Option<usize>,
    pub epochs: Option<u64>,
    pub optimizer: Option<OptimizerKind>,
    pub lr: Option<f64>,
    pub momentum: Option<f64>,
    pub weight_decay: Option<f64>,
    pub loss: Option<LossKind>,
    pub seed: Option<u64>,
    pub eval_fraction: Option<f64>,
    pub data: Option<PathBuf>,
    pub init: Option<PathBuf>,
    pub no_shuffle: bool,
    pub accumulate: Option<usize>,
    pub steps: Option<u64>,
    pub save: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub save_losses: Option<PathBuf>,
    /// fp32 (the CPU's), tf32, fp16 or bf16.
    /// The element type products are computed in (None: fp32).
    pub precision: Option<DType>,
    pub device: Option<Device>,
    /// How batches reach the GPU (None: resident when the data fits).
    pub loader: Option<Loader>,
    /// Replay each epoch's steps from a CUDA graph (None: when the data is resident).
    pub graph: Option<bool>,
    /// Run the same loop in PyTorch (same data, weights and batch order) and compare.
    pub compare_pytorch: bool,
    pub checkpoint_activations: bool,
    /// Data-parallel over several GPUs: threads of this process, or a launcher's ranks.
    pub parallel: Option<crate::workload::train::parallel::Ranks>,
    /// Gradient bucket size for data-parallel runs (None: 25 MiB, as DDP).
    pub bucket_mb: Option<f64>,
    /// Data-parallel: pieces of the first layer's weight gradient (None or 0: chosen from its
    /// size; 1: whole).
    pub grad_pieces: Option<usize>,
    /// Data-parallel: the type gradients are averaged in (None: f32).
    pub grad_comm: Option<gpukit_types::DType>,
    /// Data-parallel: each GPU updates its share of the parameters (gradients reduce-scattered,
    /// weights all-gathered). None: sharded unless in fp16.
    pub shard_optimizer: Option<bool>,
    /// Data-parallel: multiprocessors the products leave to communication (None: 0).
    pub comm_sms: Option<u32>,
    /// How long a launched rank waits for its peers (None: 60 s).
    pub timeout: Option<std::time::Duration>,
    /// Pipeline-parallel over this many GPUs of this machine.
    pub pipeline: Option<usize>,
    /// Pipeline-parallel: micro-batches a batch is cut into (None: four a stage).
    pub micro_batches: Option<usize>,
    /// Pipeline-parallel: layers a stage, first to last (None: gpukit's split).
    pub pipeline_split: Option<Vec<usize>>,
    /// The most of a GPU's memory the run may plan to use, as a fraction of it.
    pub memory_fraction: Option<f64>,
    /// `gpukit profile train`: record this epoch (0-based) of a GPU run, or every epoch of a
    /// CPU run, with this timing.
    pub profile: Option<(u64, gpukit_cuda::profiler::TimingChoice)>,
}

/// The report of `gpukit train`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainReport {
    pub preset: Option<Preset>,
    pub device: String,
    pub precision: String,
    pub config: TrainConfig,
    pub parameters: usize,
    /// Where the data came from: the preset's generator and seed, or the file.
    pub data: String,
    pub samples: usize,
    pub features: usize,
    pub eval_samples: usize,
    pub initial_weights: String,
    pub resumed_from: Option<PathBuf>,
    pub resumed_at: Option<Position>,
    pub epochs: Vec<EpochStats>,
    pub step_losses: Vec<f64>,
    /// Why the run stopped early with a non-finite loss (the report then fails).
    #[serde(default)]
    pub diverged: Option<String>,
    pub final_position: Position,
    pub seconds: f64,
    /// Host memory the engine held (peaks of its buffers).
    pub memory: MemoryUse,
    pub saved_checkpoint: Option<PathBuf>,
    pub saved_losses: Option<PathBuf>,
    /// PyTorch beside, with --compare-pytorch.
    #[serde(default)]
    pub pytorch: Option<TrainPeer>,
    /// The GPU run's precision, loader, graph, fused epilogues, loss scaler and set-up time.
    #[serde(default)]
    pub gpu: Option<GpuDetails>,
    /// Data-parallel training's figures (ranks, scaling, communication), when it ran.
    #[serde(default)]
    pub data_parallel: Option<crate::workload::train::parallel::DataParallel>,
    /// Pipeline-parallel training's figures (stages, bubble, the one-GPU run beside).
    #[serde(default)]
    pub pipeline: Option<pipeline::Pipeline>,
    /// `gpukit profile train`'s recording (not part of train's own report).
    #[serde(skip)]
    pub recording: Option<gpukit_cuda::profiler::Recording>,
}

/// The settings a request resolves to, before any work.
struct Plan {
    cfg: TrainConfig,
    samples: usize,
    features: usize,
    eval_fraction: f64,
}

fn plan(r: &TrainRequest, data: Option<&Dataset>) -> Plan {
    let preset = r.preset.unwrap_or(Preset::SeedRegression);
    let (samples, features, hidden, batch, epochs, kind, lr, loss) = match preset {
        Preset::SeedRegression => (
            1024,
            16,
            64,
            64,
            3,
            OptimizerKind::Adam,
            1e-3,
            LossKind::Mse,
        ),
        Preset::SeedClassification => (
            100,
            3,
            10,
            100,
            5,
            OptimizerKind::Sgd,
            0.01,
            LossKind::CrossEntropy,
        ),
    };
    let features = data.map_or(r.features.unwrap_or(features), |d| d.features);
    let samples = data.map_or(r.samples.unwrap_or(samples), Dataset::len);
    let loss = r.loss.unwrap_or(match data.map(Dataset::task) {
        Some(Task::Classification) => LossKind::CrossEntropy,
        Some(Task::Regression) => LossKind::Mse,
        None => loss,
    });
    let outputs = data.map_or(
        match loss {
            LossKind::Mse => 1,
            LossKind::CrossEntropy => 2,
        },
        Dataset::outputs,
    );
    let widths = r
        .layers
        .clone()
        .unwrap_or_else(|| vec![features, hidden, outputs]);
    Plan {
        cfg: TrainConfig {
            widths,
            loss,
            optimizer: OptimizerConfig {
                kind: r.optimizer.unwrap_or(kind),
                lr: r.lr.unwrap_or(lr),
                momentum: r.momentum.unwrap_or(0.0),
                weight_decay: r.weight_decay.unwrap_or(0.0),
            },
            batch_size: r.batch_size.unwrap_or(batch),
            epochs: r.epochs.unwrap_or(epochs),
            seed: r.seed.unwrap_or(0),
            shuffle: !r.no_shuffle,
            accumulate: r.accumulate.unwrap_or(1),
            max_steps: r.steps,
            checkpoint_activations: r.checkpoint_activations,
        },
        samples,
        features,
        eval_fraction: r.eval_fraction.unwrap_or(0.0),
    }
}

/// Runs the request on the CPU or a GPU (`discovery` finds the CUDA libraries); `progress`
/// hears about each finished epoch.
pub fn run_train(
    r: &TrainRequest,
    discovery: &Discovery,
    progress: &mut dyn FnMut(&str),
) -> Result<TrainReport> {
    run_train_ranked(r, discovery, progress)?
        .ok_or_else(|| Error::Failed("this process is not rank 0: rank 0 reports the run".into()))
}

/// As [`run_train`]; under a launcher only rank 0 gets a report (the others None).
pub fn run_train_ranked(
    r: &TrainRequest,
    discovery: &Discovery,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<TrainReport>> {
    check_request(r)?;
    let task = match r.loss {
        Some(LossKind::CrossEntropy) => Task::Classification,
        Some(LossKind::Mse) => Task::Regression,
        None if r.preset == Some(Preset::SeedClassification) => Task::Classification,
        None => Task::Regression,
    };
    if r.compare_pytorch {
        crate::peer::torch_version()?;
    }
    if let Some(path) = &r.data {
        file_need(path).check_host("give a smaller --data file")?;
    }
    let file_data = r.data.as_deref().map(|p| data::load(p, task)).transpose()?;
    let mut p = plan(r, file_data.as_ref());
    // a checkpoint carries the seed that orders the batches (and made generated data)
    let resumed = match &r.resume {
        Some(path) => Some(checkpoint::load(path, &p.cfg.widths)?),
        None => None,
    };
    if let Some((_, _, meta)) = &resumed {
        if r.seed.is_some_and(|s| s != meta.seed) {
            return Err(Error::BadInput(format!(
                "--seed {}: the checkpoint was trained with seed {} (leave --seed out to resume)",
                r.seed.unwrap_or_default(),
                meta.seed
            )));
        }
        p.cfg.seed = meta.seed;
        p.cfg.optimizer = meta.optimizer;
    }
    p.cfg.check()?;
    // a pipeline's stages train one batch together; data-parallel ranks a batch each
    let world = match &r.parallel {
        _ if r.pipeline.is_some() => 1,
        Some(crate::workload::train::parallel::Ranks::Threads(g)) => *g,
        Some(crate::workload::train::parallel::Ranks::Launched(w)) => w.world_size,
        None => 1,
    };
    let held = data::held_out(p.samples, p.eval_fraction);
    let shape = DataShape {
        train: p.samples - held,
        eval: held,
        features: p.features,
        target_width: file_data.as_ref().map_or(1, Dataset::target_width),
    };
    resolve_steps(r, &mut p.cfg, shape.train, world)?;
    if let Some((_, _, meta)) = &resumed {
        check_left_to_train(&p.cfg, &meta.position)?;
    }
    // the resource guard: refused here, before the data is generated or a buffer allocated
    let usage = HostUse {
        gpu: matches!(r.device, Some(Device::Cuda(_)))
            || r.parallel.is_some()
            || r.pipeline.is_some(),
        compare_pytorch: r.compare_pytorch,
        world,
        ranks_here: match (&r.parallel, r.pipeline) {
            (Some(crate::workload::train::parallel::Ranks::Threads(g)), _) => *g,
            // each stage holds its own copy of the data (a launched stage, in its process)
            (Some(crate::workload::train::parallel::Ranks::Launched(_)), Some(_)) => 1,
            (_, Some(stages)) => stages,
            _ => 1,
        },
        data_loaded: file_data.is_some(),
    };
    host_need(&p.cfg, &shape, &usage).check_host(HINT)?;
    // check_request refused what has no training mode: none is taken for another here
    let precision = match r.precision.map(Precision::of) {
        None => Precision::Fp32,
        Some(Some(p)) => p,
        Some(None) => {
            return Err(Error::BadInput(
                "--precision: gpukit trains in fp32, tf32, fp16 or bf16".into(),
            ))
        }
    };
    let gpu = match r.device {
        Some(Device::Cuda(n)) if r.parallel.is_none() && r.pipeline.is_none() => {
            let gpu = std::sync::Arc::new(gpukit_cuda::Gpu::open(discovery, n)?);
            let (free, total) = gpu.mem_info()?;
            let free = r
                .memory_fraction
                .map_or(free, |f| free.min((total as f64 * f) as u64));
            let loader = r
                .loader
                .unwrap_or_else(|| gpukit_train::budget::default_loader(&shape, free));
            device_need(n, &p.cfg, &shape, precision, loader).check(Some(free), HINT)?;
            Some(gpu)
        }
        _ => None,
    };
    let (full, origin) = match file_data {
        Some(d) => {
            let name = r.data.as_ref().map(|p| p.display().to_string());
            (d, name.unwrap_or_default())
        }
        None => {
            let d = match p.cfg.loss {
                LossKind::CrossEntropy => {
                    data::classification_preset(p.samples, p.features, p.cfg.seed)
                }
                LossKind::Mse => data::regression_preset(p.samples, p.features, p.cfg.seed),
            };
            let what = match p.cfg.loss {
                LossKind::CrossEntropy => "labels 0/1",
                LossKind::Mse => "target N(0,1)",
            };
            (
                d,
                format!("generated: x ~ N(0,1), {what}, seed {}", p.cfg.seed),
            )
        }
    };
    let (train, eval) = full.split(p.eval_fraction)?;
    p.cfg.check_data(&train)?;
    let scaler_in = resumed.as_ref().and_then(|(_, _, meta)| meta.scaler);
    let (mut model, mut opt, pos, initial) = match resumed {
        Some((m, o, meta)) => (m, o, meta.position, "from the checkpoint".to_string()),
        None => {
            let (m, how) = match &r.init {
                Some(path) => (
                    checkpoint::load_init(path, &p.cfg.widths)?,
                    format!("{}", path.display()),
                ),
                None => (
                    Mlp::new(&p.cfg.widths, p.cfg.seed),
                    format!("PyTorch's nn.Linear scheme, seed {}", p.cfg.seed),
                ),
            };
            (m, Optimizer::new(p.cfg.optimizer), Position::default(), how)
        }
    };
    // the comparison starts PyTorch from the weights gpukit started from
    let initial_model = r.compare_pytorch.then(|| model.clone());
    let mut data_parallel = None;
    let mut pipelined = None;
    let mut recording = None;
    let mut trainer = match gpu {
        None => None,
        Some(gpu) => {
            let opts = GpuOptions {
                loader: r.loader,
                graph: r.graph,
                memory_fraction: r.memory_fraction,
                ..GpuOptions::new(precision)
            };
            Some(GpuTrainer::new(
                discovery,
                gpu,
                &p.cfg,
                opts,
                train.clone(),
                eval.clone(),
            )?)
        }
    };
    let device = match r.device {
        Some(Device::Cuda(n)) => format!("cuda:{n}"),
        _ => "cpu".to_string(),
    };
    let (outcome, gpu): (RunOutcome, Option<GpuDetails>) = match trainer.as_mut() {
        _ if r.pipeline.is_some() => {
            let stages = r.pipeline.unwrap_or(2);
            let job = pipeline::Job {
                discovery,
                cfg: &p.cfg,
                precision,
                train: &train,
                model: &model,
                opt: &opt,
                stages,
                micro: r.micro_batches.unwrap_or(4 * stages),
                split: r.pipeline_split.as_deref(),
                memory_fraction: r.memory_fraction,
                timeout: r.timeout.unwrap_or(std::time::Duration::from_secs(60)),
                launched: match &r.parallel {
                    Some(crate::workload::train::parallel::Ranks::Launched(w)) => Some(w),
                    _ => None,
                },
            };
            // under a launcher only rank 0 reports
            let Some((o, d, m, op, mut report)) = pipeline::run(&job, progress)? else {
                return Ok(None);
            };
            if r.compare_pytorch {
                progress(
                    "PyTorch: torch.distributed.pipelining's 1F1B on the same model and split",
                );
                report.pytorch = Some(pipeline::compare(
                    &p.cfg,
                    precision,
                    &report,
                    o.step_losses.len(),
                )?);
            }
            model = m;
            opt = op;
            pipelined = Some(report);
            (o, Some(d))
        }
        _ if r.parallel.is_some() => {
            let job = crate::workload::train::parallel::Job {
                discovery,
                cfg: &p.cfg,
                opts: GpuOptions {
                    loader: r.loader,
                    grad_pieces: r.grad_pieces.unwrap_or(0),
                    grad_comm: r.grad_comm.unwrap_or(gpukit_types::DType::F32),
                    // measured on two GPUs (decision 133): sharded 0.92 scaling efficiency
                    // against 0.85 averaging every gradient; fp16's overflow check needs
                    // every gradient on every GPU
                    shard_optimizer: r.shard_optimizer.unwrap_or(precision != Precision::Fp16),
                    comm_sms: r.comm_sms.unwrap_or(0),
                    // eager launches: 0.92 against 0.88 replayed as a CUDA graph
                    graph: r.graph.or(Some(false)),
                    ..GpuOptions::new(precision)
                },
                train: &train,
                eval: eval.as_ref(),
                model: &model,
                opt: &opt,
                scaler: scaler_in,
                pos,
                bucket_bytes: (r.bucket_mb.unwrap_or(25.0) * (1 << 20) as f64) as usize,
                profile: r.profile.map(|(_, timing)| timing),
            };
            let ranks = r.parallel.as_ref().ok_or(Error::NoSamples)?;
            let timeout = r.timeout.unwrap_or(std::time::Duration::from_secs(60));
            let Some((o, d, m, op, mut dp, rec)) =
                crate::workload::train::parallel::run(&job, ranks, timeout, progress)?
            else {
                return Ok(None);
            };
            recording = rec;
            if r.compare_pytorch {
                let steps = o.step_losses.len();
                progress("PyTorch: DistributedDataParallel of the same model");
                dp.pytorch = Some(crate::workload::train::parallel::compare_ddp(
                    &p.cfg,
                    precision.name(),
                    &dp,
                    steps,
                )?);
            }
            model = m;
            opt = op;
            data_parallel = Some(dp);
            (o, Some(d))
        }
        Some(t) => {
            t.load(&model, &opt, scaler_in)?;
            if let Some((epoch, timing)) = r.profile {
                t.profile_epoch(epoch, discovery, timing);
            }
            let (o, d) = t.run(pos, &mut |e: &EpochStats| {
                progress(&format!(
                    "train {device}: epoch {} loss {:.6}",
                    e.epoch, e.train_loss
                ))
            })?;
            t.store(&mut model, &mut opt)?;
            recording = t.take_recording();
            (o, Some(d))
        }
        None => {
            let profiler = r
                .profile
                .map(|_| gpukit_cuda::profiler::Profiler::host_only())
                .transpose()?;
            let o = train_cpu(
                &p.cfg,
                &mut model,
                &mut opt,
                pos,
                &train,
                eval.as_ref(),
                &mut |e: &EpochStats| {
                    progress(&format!(
                        "train cpu: epoch {} loss {:.6}",
                        e.epoch, e.train_loss
                    ))
                },
            )?;
            recording = profiler.map(|p| p.finish()).transpose()?;
            (o, None)
        }
    };
    // a diverged run's weights are not worth a checkpoint (and would replace a good one)
    if let Some(path) = r.save.as_ref().filter(|_| outcome.diverged.is_none()) {
        let meta = Meta {
            format: 0,
            widths: p.cfg.widths.clone(),
            optimizer: p.cfg.optimizer,
            position: outcome.position,
            seed: p.cfg.seed,
            scaler: gpu.as_ref().and_then(|g| g.scaler),
        };
        checkpoint::save(path, &model, &opt, &meta)?;
    }
    if let Some(path) = &r.save_losses {
        let first = pos.step;
        let mut csv = String::from("step,loss\n");
        for (i, l) in outcome.step_losses.iter().enumerate() {
            csv.push_str(&format!("{},{l:e}\n", first + i as u64 + 1));
        }
        gpukit_types::files::write_atomically(path, csv.as_bytes()).map_err(|source| {
            Error::Io {
                what: "--save-losses",
                path: path.clone(),
                source,
            }
        })?;
    }
    let pytorch = initial_model
        .filter(|_| r.parallel.is_none() && r.pipeline.is_none() && outcome.diverged.is_none())
        .map(|initial| {
            let skipped = gpu.as_ref().map_or(0, |g| g.skipped_updates);
            peer::compare(
                &p.cfg,
                &train,
                &initial,
                &outcome,
                trainer.as_mut(),
                precision,
                skipped,
            )
        })
        .transpose()?;
    let device = match (&gpu, &data_parallel, &pipelined) {
        (Some(g), Some(dp), _) => format!(
            "{} GPUs, data-parallel ({}, {})",
            dp.ranks, g.device_name, dp.started_by
        ),
        (Some(g), None, Some(pp)) => format!(
            "{} GPUs, pipeline-parallel ({}, {})",
            pp.stages, g.device_name, pp.started_by
        ),
        (Some(g), None, None) => format!("{device} ({})", g.device_name),
        (None, ..) => device,
    };
    let saved_checkpoint = r.save.clone().filter(|_| outcome.diverged.is_none());
    Ok(Some(TrainReport {
        data_parallel,
        pipeline: pipelined,
        recording,
        pytorch,
        // the default preset names the run only where its task is the run's: generated data
        // trained with cross-entropy is not the regression tutorial's
        preset:
            r.preset
                .or((r.data.is_none() && p.cfg.loss == LossKind::Mse)
                    .then_some(Preset::SeedRegression)),
        device,
        precision: precision.name().into(),
        gpu,
        parameters: model.parameters(),
        data: origin,
        samples: train.len(),
        features: train.features,
        eval_samples: eval.as_ref().map_or(0, Dataset::len),
        initial_weights: initial,
        resumed_from: r.resume.clone(),
        resumed_at: r.resume.as_ref().map(|_| pos),
        diverged: outcome.diverged,
        epochs: outcome.epochs,
        step_losses: outcome.step_losses,
        final_position: outcome.position,
        memory: outcome.memory,
        seconds: outcome.seconds,
        saved_checkpoint,
        saved_losses: r.save_losses.clone(),
        config: p.cfg,
    }))
}

/// The JSON document of `gpukit train` (a run that returned trained to the end: a diverged
/// one is an error, not a report). Compared with PyTorch, a run that is not the same training
/// ([`TrainPeer::disagreement`]) fails.
pub fn document(report: TrainReport) -> Document<TrainReport> {
    let failure = report
        .diverged
        .clone()
        .or_else(|| report.pytorch.as_ref().and_then(TrainPeer::disagreement))
        .or_else(|| {
            report
                .pipeline
                .as_ref()
                .and_then(|p| p.disagreement.clone())
        });
    Document::new("train", report, failure)
}

/// Whether the targets are classes (accuracy is reported).
pub fn classifies(report: &TrainReport) -> bool {
    report.config.loss == LossKind::CrossEntropy
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A curve apart by more than the tolerance fails the document (exit 1), one within passes.
    #[test]
    fn a_run_whose_losses_differ_from_pytorchs_fails() {
        let mut report = run_train(
            &TrainRequest {
                steps: Some(4),
                ..TrainRequest::default()
            },
            &gpukit_cuda::loader::discover(),
            &mut |_| {},
        )
        .unwrap();
        let peer = |early: f64, last: f64| TrainPeer {
            torch_version: "2.11".into(),
            device_name: None,
            step_losses: vec![1.0; 4],
            seconds: vec![0.01],
            seconds_median: 0.01,
            gpukit_seconds: vec![0.001],
            gpukit_seconds_median: 0.001,
            max_relative_difference: early.max(last),
            at_update: 2,
            early_difference: early,
            tolerance: PEER_LOSS_TOLERANCE,
            final_difference: last,
            final_tolerance: PEER_FINAL_TOLERANCE,
            peak_bytes: None,
            gpukit_peak_bytes: None,
            skipped_updates: None,
        };
        report.pytorch = Some(peer(1e-7, 1e-7));
        assert!(document(report.clone()).failure.is_none());
        // drift later in the run, the ends close: the same training
        report.pytorch = Some(peer(1e-7, 3e-4));
        assert!(document(report.clone()).failure.is_none());
        report.pytorch = Some(peer(3e-3, 3e-3));
        let f = document(report.clone()).failure.unwrap();
        assert!(
            f.contains("3.0e-3") && f.contains("first 10 updates"),
            "{f}"
        );
        report.pytorch = Some(peer(1e-7, 0.05));
        let f = document(report.clone()).failure.unwrap();
        assert!(f.contains("final loss"), "{f}");
        report.pytorch = Some(peer(f64::NAN, 0.0));
        assert!(document(report).failure.is_some(), "NaN must fail");
    }

    #[test]
    fn requests_that_cannot_run_are_refused_before_work() {
        let cases = [
            (
                TrainRequest {
                    compare_pytorch: true,
                    resume: Some("x".into()),
                    ..TrainRequest::default()
                },
                "--compare-pytorch",
            ),
            (
                TrainRequest {
                    graph: Some(true),
                    ..TrainRequest::default()
                },
                "--graph",
            ),
            (
                TrainRequest {
                    device: Some(Device::Cuda(0)),
                    precision: Some(DType::F64),
                    ..TrainRequest::default()
                },
                "--precision fp64",
            ),
            (
                // fp8 is a matmul input type only: no training mode
                TrainRequest {
                    device: Some(Device::Cuda(0)),
                    precision: Some(DType::F8E4M3),
                    ..TrainRequest::default()
                },
                "--precision fp8: gpukit trains in fp32, tf32, fp16 or bf16",
            ),
            (
                TrainRequest {
                    precision: Some(DType::Bf16),
                    ..TrainRequest::default()
                },
                "--precision bf16",
            ),
        ];
        for (r, fragment) in cases {
            let e = check_request(&r).unwrap_err().to_string();
            assert!(e.contains(fragment), "{fragment}: {e}");
        }
    }
}
