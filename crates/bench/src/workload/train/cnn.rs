//! `gpukit train --model resnet18|resnet34|resnet50`: a ResNet trained on images (a
//! safetensors file, or generated from the seed), from torchvision's initialisation or a
//! torchvision state dict, on the CPU (the reference path) or one GPU; every update's loss and
//! batch accuracy, the time to the first update and images per second after it, the GPU's
//! peak memory.
//!
//! Everything that can be checked before work is: the flags against each other, the data file
//! and the state dict against the model, the precision against the device, and the run's
//! memory against the GPU's (refused before any allocation).

use super::{cnn_parallel, cnn_peer};
use crate::error::{Error, Result};
use crate::report::Document;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::profiler::{Recording, TimingChoice};
use gpukit_tensor::{DType, Device};
use gpukit_train::cnn::data::{self, Images};
use gpukit_train::cnn::gpu::need::{device_need, unit_outputs, HINT};
use gpukit_train::cnn::gpu::GpuResNet;
use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
use gpukit_train::cnn::resnet::{Depth, ResNet};
use gpukit_train::cnn::run::{self, CpuResNet, LoopConfig, Stepper, UpdateStats};
use gpukit_train::gpu::Precision;
use gpukit_train::optim::OptimizerKind;
use gpukit_types::resources::{bytes, Need};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

/// What the user asked for; None takes the default.
#[derive(Debug, Clone)]
pub struct CnnTrainRequest {
    pub model: Depth,
    pub device: Device,
    pub batch_size: Option<usize>,
    pub steps: Option<u64>,
    pub epochs: Option<u64>,
    /// Height and width of generated images (a data file gives its own).
    pub image_size: Option<usize>,
    pub classes: Option<usize>,
    /// Images generated (with no --data).
    pub samples: Option<usize>,
    pub optimizer: Option<OptimizerKind>,
    pub lr: Option<f64>,
    pub momentum: Option<f64>,
    pub nesterov: bool,
    pub weight_decay: Option<f64>,
    pub label_smoothing: Option<f64>,
    pub seed: Option<u64>,
    pub init: Option<PathBuf>,
    pub data: Option<PathBuf>,
    pub precision: Option<DType>,
    pub save_losses: Option<PathBuf>,
    /// `gpukit profile train --model`: record this update (0-based) of a GPU run, and how.
    pub profile: Option<(u64, TimingChoice)>,
    /// GPU: replay each update as one CUDA graph (from the second) [default: on].
    pub graph: Option<bool>,
    /// Train the same model, weights, images and optimizer in PyTorch beside (GPU only).
    pub compare_pytorch: bool,
    /// Micro-batches of `batch_size` whose gradients an update sums (each loss divided by it).
    pub accumulate: Option<usize>,
    /// Data-parallel over cuda:0..N-1 (`batch_size` images on each).
    pub gpus: Option<usize>,
    /// Data-parallel under a launcher: this process is one rank of this world, on
    /// cuda:`local_rank` (`device` names it).
    pub launched: Option<gpukit_ranks::world::World>,
    /// Data-parallel: gradient buckets of at least this many MiB [default: one bucket].
    pub bucket_mb: Option<f64>,
    /// Data-parallel: the type gradients are averaged in [default f32; bf16 rounds them].
    pub grad_comm: Option<DType>,
    /// GPU: keep only each residual block's output through the forward, the block's other
    /// maps recomputed in its backward stage (less memory, one more forward of the blocks).
    pub checkpoint_activations: bool,
}

/// The report of `gpukit train --model`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CnnTrainReport {
    pub model: String,
    pub device: String,
    /// The GPU's name, when one trained.
    #[serde(default)]
    pub gpu_name: Option<String>,
    pub precision: String,
    pub parameters: usize,
    pub classes: usize,
    /// (height, width).
    pub image_size: (usize, usize),
    pub batch_size: usize,
    /// Micro-batches of `batch_size` an update sums the gradients of.
    #[serde(default = "one")]
    pub accumulate: usize,
    /// Activation checkpointing: each residual block's maps but its output recomputed in its
    /// backward stage.
    #[serde(default)]
    pub checkpoint_activations: bool,
    pub optimizer: CnnOptimizerConfig,
    pub label_smoothing: f64,
    pub seed: u64,
    /// Where the images came from: the file, or the generator and seed.
    pub data: String,
    pub images: usize,
    pub initial_weights: String,
    pub updates: Vec<UpdateStats>,
    /// A GPU run's convolutions: each unit's forward / backward data / backward filter
    /// algorithm (`*`: not deterministic), its norm's form, and where cuBLAS takes the filter
    /// gradient.
    #[serde(default)]
    pub conv_algorithms: Vec<String>,
    /// Seconds before the first update: the model built, the GPU's convolutions planned and
    /// its buffers allocated, the data read or generated.
    pub setup_seconds: f64,
    /// The first update's seconds (reported apart from the rate).
    pub first_step_seconds: f64,
    /// Images a second over the updates after the first.
    pub images_per_s: Option<f64>,
    /// The most bytes of the GPU's memory pool the run held.
    pub peak_gpu_bytes: Option<u64>,
    /// How a GPU run's updates were launched: one CUDA graph replayed, or kernel by kernel.
    #[serde(default)]
    pub step_launch: Option<String>,
    /// Where a GPU run's batches came from: the data set kept on the GPU, or the host (why).
    #[serde(default)]
    pub batches_from: Option<String>,
    /// What the GPU trainer allocated, part by part (name, bytes).
    #[serde(default)]
    pub gpu_memory: Vec<(String, u64)>,
    /// fp16: the loss scale at the end (GradScaler's rules from 65536).
    #[serde(default)]
    pub loss_scale: Option<f32>,
    /// fp16: updates skipped because a scaled gradient overflowed (their losses are reported;
    /// the weights did not move).
    #[serde(default)]
    pub skipped_updates: u32,
    /// `--compare-pytorch`: PyTorch's modes on the same run, and how its losses compare.
    #[serde(default)]
    pub pytorch: Option<cnn_peer::CnnPeer>,
    /// `--gpus N`: the data-parallel figures (and PyTorch's DDP beside, when compared).
    #[serde(default)]
    pub data_parallel: Option<cnn_parallel::CnnDataParallel>,
    /// Why the run stopped early at a non-finite loss (the report then fails).
    pub diverged: Option<String>,
    pub saved_losses: Option<PathBuf>,
    /// `gpukit profile train --model`'s recording (not part of train's own report).
    #[serde(skip)]
    pub recording: Option<Recording>,
}

fn one() -> usize {
    1
}

/// The defaults: a GPU trains torchvision's 224x224 images, the CPU small ones.
fn defaults(device: Device) -> (usize, usize) {
    match device {
        Device::Cpu => (32, 8),
        Device::Cuda(_) => (224, 64),
    }
}

/// Updates when neither --steps nor --epochs is given and the images are generated.
const DEFAULT_STEPS: u64 = 10;

/// The precision a request trains in, or why the device cannot.
fn precision_of(r: &CnnTrainRequest) -> Result<Precision> {
    let Some(dtype) = r.precision else {
        return Ok(Precision::Fp32);
    };
    let name = dtype.precision_name();
    match (Precision::of(dtype), r.device) {
        (Some(Precision::Fp32), _) => Ok(Precision::Fp32),
        (Some(p @ (Precision::Tf32 | Precision::Bf16 | Precision::Fp16)), Device::Cpu) => {
            Err(Error::BadInput(format!(
                "--precision {}: the CPU trains convolutional networks in fp32 (tf32, bf16 and \
                 fp16 are GPU precisions: add --device cuda:0)",
                p.name()
            )))
        }
        // tf32: f32 maps multiplied on tensor cores; 16-bit: channels-last maps over fp32
        // master weights; the GPU's own support is checked once it is open (check_precision_on)
        (Some(p), Device::Cuda(_)) => Ok(p),
        (None, _) => Err(Error::BadInput(format!(
            "--precision {name}: convolutional networks train in fp32, tf32, bf16 or fp16"
        ))),
    }
}

/// The optimizer the flags describe (SGD: momentum 0.9 unless given, as torchvision's recipe).
fn optimizer_of(r: &CnnTrainRequest) -> Result<CnnOptimizerConfig> {
    let kind = r.optimizer.unwrap_or(OptimizerKind::Sgd);
    let config = CnnOptimizerConfig {
        kind,
        lr: r.lr.unwrap_or(match kind {
            OptimizerKind::Sgd => 0.1,
            _ => 1e-3,
        }),
        momentum: r.momentum.unwrap_or(match kind {
            OptimizerKind::Sgd => 0.9,
            _ => 0.0,
        }),
        nesterov: r.nesterov,
        weight_decay: r.weight_decay.unwrap_or(match kind {
            OptimizerKind::Sgd => 1e-4,
            _ => 0.01,
        }),
    };
    config.check()?;
    Ok(config)
}

/// Refuses, before any work, flags that contradict each other or cannot be met.
pub fn check_request(r: &CnnTrainRequest) -> Result<()> {
    if r.data.is_some() && (r.image_size.is_some() || r.samples.is_some()) {
        return Err(Error::BadInput(
            "--image-size and --samples describe generated images; with --data the file gives \
             them"
                .into(),
        ));
    }
    if r.accumulate == Some(0) {
        return Err(Error::BadInput("--accumulate 0: must be at least 1".into()));
    }
    if r.compare_pytorch && r.accumulate.is_some_and(|k| k > 1) {
        return Err(Error::BadInput(
            "--compare-pytorch with --accumulate: PyTorch's side of a convolutional network \
             takes one batch an update (drop one of the two)"
                .into(),
        ));
    }
    if r.compare_pytorch && r.device == Device::Cpu {
        return Err(Error::BadInput(
            "--compare-pytorch: PyTorch's side trains on the GPU; give --device cuda:N".into(),
        ));
    }
    if let Some(n) = r.gpus {
        if n == 0 {
            return Err(Error::BadInput("--gpus 0: must be at least 1".into()));
        }
        if r.device != Device::Cuda(0) {
            return Err(Error::BadInput(format!(
                "--gpus {n}: data-parallel training runs on cuda:0..{}; give --device cuda:0",
                n - 1
            )));
        }
        if n > 1 && r.profile.is_some() {
            return Err(Error::BadInput(
                "--gpus: profile records one GPU's update; leave --gpus out".into(),
            ));
        }
    }
    if let Some(w) = &r.launched {
        let refused = [
            (r.gpus.is_some_and(|n| n > 1), "--gpus drives several GPUs from one process; under a launcher every process is one rank (leave --gpus out)"),
            (r.compare_pytorch, "--compare-pytorch: PyTorch's DistributedDataParallel is started from one process; run gpukit with --gpus N instead of under a launcher"),
            (r.profile.is_some(), "profile records one GPU's update; run it outside a launcher"),
        ];
        if let Some((_, why)) = refused.iter().find(|(bad, _)| *bad) {
            return Err(Error::BadInput((*why).into()));
        }
        if r.device != Device::Cuda(w.local_rank) {
            return Err(Error::BadInput(format!(
                "rank {} trains on cuda:{} (its LOCAL_RANK), not {}",
                w.rank, w.local_rank, r.device
            )));
        }
    }
    let world = r
        .launched
        .as_ref()
        .map_or(r.gpus.unwrap_or(1), |w| w.world_size);
    if r.bucket_mb
        .is_some_and(|mb| mb.is_nan() || mb.is_infinite() || mb <= 0.0)
    {
        return Err(Error::BadInput(
            "--bucket-mb: must be a positive number of MiB".into(),
        ));
    }
    if world < 2 && (r.grad_comm.is_some() || r.bucket_mb.is_some()) {
        return Err(Error::BadInput(
            "--grad-comm and --bucket-mb: say how data-parallel ranks average their gradients; \
             give --gpus N (2 or more)"
                .into(),
        ));
    }
    if let Some(t) = r
        .grad_comm
        .filter(|t| ![DType::F32, DType::Bf16].contains(t))
    {
        return Err(Error::BadInput(format!(
            "--grad-comm {}: gradients are averaged in f32 or bf16",
            t.name()
        )));
    }
    if r.checkpoint_activations && r.device == Device::Cpu {
        return Err(Error::BadInput(
            "--checkpoint-activations: the CPU path keeps every map (convolutional networks \
             recompute them on the GPU); give --device cuda:N"
                .into(),
        ));
    }
    if r.graph == Some(true) && r.device == Device::Cpu {
        return Err(Error::BadInput(
            "--graph: CUDA graphs replay GPU work; give --device cuda:N".into(),
        ));
    }
    if let Some(s) = r.label_smoothing {
        if !(s.is_finite() && (0.0..1.0).contains(&s)) {
            return Err(Error::BadInput(format!(
                "--label-smoothing {s}: must be at least 0 and below 1"
            )));
        }
    }
    for (flag, v) in [
        ("--batch-size", r.batch_size),
        ("--image-size", r.image_size),
        ("--classes", r.classes),
        ("--samples", r.samples),
    ] {
        if v == Some(0) {
            return Err(Error::BadInput(format!("{flag} 0: must be at least 1")));
        }
    }
    if let Some(p) = &r.save_losses {
        gpukit_types::files::check_writable_file(p).map_err(|source| Error::Io {
            what: "--save-losses",
            path: p.clone(),
            source,
        })?;
    }
    precision_of(r)?;
    optimizer_of(r)?;
    Ok(())
}

/// The updates a run makes: --steps, or --epochs over the data's whole batches, or one epoch
/// of a data file, or [`DEFAULT_STEPS`]; --epochs ending before --steps is a contradiction.
/// The report's line on where a GPU run's batches came from.
fn batches_from(
    on_host: Option<&str>,
    (images, combined): (&Images, usize),
    ranks: usize,
) -> String {
    match on_host {
        _ if images.len() <= combined => cnn_parallel::ONE_BATCH.to_string(),
        None => format!(
            "the data set kept on {} GPU ({} images, converted once), each batch gathered there",
            if ranks > 1 { "each" } else { "the" },
            images.len()
        ),
        Some(why) => format!("the host, converted on every core and copied each batch: {why}"),
    }
}

/// The updates of a run: `--steps`, or `--epochs` of the data's batches (`accumulate` batches an
/// update, at least one update), or one epoch of a data file, else the default.
fn updates(r: &CnnTrainRequest, per_epoch: u64, accumulate: u64) -> Result<u64> {
    let k = accumulate.max(1);
    let of_epochs = |e: u64| (e.saturating_mul(per_epoch) / k).max(1);
    match (r.steps, r.epochs) {
        (Some(s), Some(e)) if of_epochs(e) < s => Err(Error::BadInput(format!(
            "--steps {s} needs {} epochs of {per_epoch} batches{}, but --epochs {e} ends after {}",
            s.saturating_mul(k).div_ceil(per_epoch),
            if k > 1 {
                format!(" ({k} an update)")
            } else {
                String::new()
            },
            if k > 1 {
                format!("{} updates", of_epochs(e))
            } else {
                of_epochs(e).to_string()
            }
        ))),
        (Some(s), _) => Ok(s),
        (None, Some(e)) => Ok(of_epochs(e)),
        (None, None) if r.data.is_some() => Ok(of_epochs(1)),
        (None, None) => Ok(DEFAULT_STEPS),
    }
}

/// Host memory of the run: the images, the model's weights, gradients and optimizer state,
/// and on the CPU a batch's activations (each unit keeps its input, its convolution's output
/// and its norm's cache: about four copies of its output maps).
fn host_need(
    model: &ResNet<f32>,
    images: usize,
    image: (usize, usize),
    batch: usize,
    gpu: bool,
) -> Result<Need> {
    let input = gpukit_cuda::dnn::Maps::nchw_f32(batch, 3, image.0, image.1);
    let (outputs, pooled) = unit_outputs(model, input)?;
    let activations: u64 = outputs
        .iter()
        .chain([&pooled])
        .map(|m| m.bytes() as u64)
        .sum();
    let mut need = Need::host(format!(
        "training {} (batch {batch}, {}x{} images)",
        model.depth.name(),
        image.0,
        image.1
    ));
    need.add("the images", bytes(&[images, 3, image.0, image.1], 4))
        .add("a batch gathered", bytes(&[batch, 3, image.0, image.1], 4))
        // a 16-bit GPU run converts each batch into pinned memory, 8 channels of 2 bytes a
        // pixel (counted for every GPU run: fp32 uploads from the gathered batch instead)
        .add(
            "the batch's pinned copy for the GPU",
            bytes(&[batch, image.0, image.1, 8], if gpu { 2 } else { 0 }),
        )
        .add(
            "weights, gradients and optimizer state",
            bytes(&[model.parameter_count(), 4], 4),
        )
        .add(
            "a batch's activations",
            if gpu {
                Some(0)
            } else {
                activations.checked_mul(4)
            },
        );
    Ok(need)
}

/// Trains the request's network (`discovery` finds the CUDA libraries); `progress` hears of
/// every update.
pub fn run_cnn_train(
    r: &CnnTrainRequest,
    discovery: &Discovery,
    progress: &mut dyn FnMut(&str),
) -> Result<CnnTrainReport> {
    check_request(r)?;
    if r.compare_pytorch {
        // a missing PyTorch is said before minutes of gpukit's side
        crate::peer::torch_version()?;
    }
    let started = Instant::now();
    let precision = precision_of(r)?;
    let opt = optimizer_of(r)?;
    let (default_image, default_batch) = defaults(r.device);
    let batch = r.batch_size.unwrap_or(default_batch);
    let classes = r.classes.unwrap_or(1000);
    let seed = r.seed.unwrap_or(0);
    let smoothing = r.label_smoothing.unwrap_or(0.0);
    if let Some(path) = &r.data {
        super::file_need(path).check_host("give a smaller --data file")?;
    }
    let file = r
        .data
        .as_deref()
        .map(|p| data::load(p, classes))
        .transpose()?;
    let image = file.as_ref().map_or_else(
        || {
            let s = r.image_size.unwrap_or(default_image);
            (s, s)
        },
        |f| f.size,
    );
    // data-parallel: each update trains a combined batch, `batch` on each GPU
    let world = r
        .launched
        .as_ref()
        .map_or(r.gpus.unwrap_or(1), |w| w.world_size);
    let combined = batch * world;
    let count = file
        .as_ref()
        .map_or(r.samples.unwrap_or(combined), Images::len);
    let accumulate = r.accumulate.unwrap_or(1);
    let cfg = LoopConfig {
        batch_size: combined,
        steps: 0,
        accumulate,
        seed,
    };
    let cfg = LoopConfig {
        steps: updates(r, cfg.batches_per_epoch(count)?, accumulate as u64)?,
        ..cfg
    };
    let mut model = ResNet::<f32>::new(r.model, classes, seed);
    let on_gpu = matches!(r.device, Device::Cuda(_));
    let mut gpu_name = None;
    let mut conv_algorithms = Vec::new();
    host_need(&model, count, image, batch, on_gpu)?.check_host(HINT)?;
    let gpu = match r.device {
        Device::Cpu => None,
        Device::Cuda(n) => {
            let gpu = std::sync::Arc::new(gpukit_cuda::Gpu::open(discovery, n)?);
            check_precision_on(&gpu, precision)?;
            gpu_name = gpu.name().ok();
            let (free, _) = gpu.mem_info()?;
            device_need(
                n,
                &model,
                (batch, accumulate, r.checkpoint_activations),
                image,
                precision,
                &opt,
            )?
            .check(Some(free), HINT)?;
            Some(gpu)
        }
    };
    let initial_weights = match &r.init {
        Some(path) => {
            gpukit_train::cnn::init::load_state_dict(path, &mut model)?;
            path.display().to_string()
        }
        None => format!("torchvision's initialisation, seed {seed}"),
    };
    let (images, origin) = match file {
        Some(f) => (f, r.data.as_ref().map(|p| p.display().to_string())),
        None => (data::generated(count, image, classes, seed)?, None),
    };
    let origin = origin.unwrap_or_else(|| {
        format!("generated: pixels ~ N(0,1), labels uniform over {classes} classes, seed {seed}")
    });
    let parameters = model.parameter_count();
    let initial = r.compare_pytorch.then(|| model.clone());
    let mut gpu_net = None;
    let mut cpu_net = None;
    let mut data_parallel = None;
    let mut data_on_host = None;
    let (setup_seconds, out, rank0) = if world > 1 {
        // the rank threads open their own GPUs
        drop(gpu);
        progress(&format!(
            "planning {} on {world} GPUs (batch {batch} each, {}x{})",
            r.model.name(),
            image.0,
            image.1
        ));
        // one bucket of every gradient unless asked (cnn_parallel::DDP_BUCKET_MB says why)
        let gradient_mib = (model.parameter_count() * 4) as f64 / f64::from(1 << 20);
        let setup = cnn_parallel::Setup {
            discovery,
            model: &model,
            batch_per_gpu: batch,
            image,
            precision,
            checkpoint: r.checkpoint_activations,
            opt,
            smoothing,
            graph: r.graph.unwrap_or(true),
            bucket_mb: r.bucket_mb.unwrap_or(gradient_mib),
            grad_comm: r.grad_comm.unwrap_or(DType::F32),
            accumulate,
            data: (images.len() > cfg.batch_size).then_some(&images),
        };
        let placement = match &r.launched {
            Some(w) => cnn_parallel::Placement::Launched(w),
            None => cnn_parallel::Placement::Threads(world),
        };
        let (setup_seconds, out, figures, dp) =
            cnn_parallel::train(&setup, placement, (&images, &cfg), started, progress)?;
        data_parallel = Some(dp);
        conv_algorithms = figures.conv_algorithms.clone();
        (setup_seconds, out, Some(figures))
    } else {
        let stepper: &mut dyn Stepper = match gpu {
            Some(gpu) => {
                progress(&format!(
                    "planning {} on the GPU (batch {batch}, {}x{})",
                    r.model.name(),
                    image.0,
                    image.1
                ));
                let net = gpu_net.insert(GpuResNet::new(
                    discovery,
                    gpu,
                    &model,
                    batch,
                    image,
                    (precision, r.checkpoint_activations),
                    opt,
                    smoothing,
                )?);
                if let Some((at, timing)) = r.profile {
                    net.profile_update(at, discovery, timing);
                }
                net.use_graph(r.graph.unwrap_or(true));
                net.set_accumulate(accumulate)?;
                conv_algorithms = net.conv_algorithms();
                data_on_host = if images.len() > cfg.batch_size {
                    net.keep_data(&images, cnn_parallel::DATA_SHARE)?
                } else {
                    Some(cnn_parallel::ONE_BATCH.into())
                };
                net
            }
            None => cpu_net.insert(CpuResNet::new(model, CnnOptimizer::new(opt), smoothing)),
        };
        let setup_seconds = started.elapsed().as_secs_f64();
        let out = run::train(stepper, &images, &cfg, &mut |u| {
            progress(&format!(
                "update {}: loss {:.6}, accuracy {:.3} ({:.1} ms)",
                u.step,
                u.loss,
                u.accuracy,
                u.seconds * 1e3
            ))
        })?;
        (setup_seconds, out, None)
    };
    let peak_gpu_bytes = match &rank0 {
        Some(f) => Some(f.peak_bytes),
        None => gpu_net.as_ref().map(GpuResNet::peak_bytes).transpose()?,
    };
    if let Some(f) = &rank0 {
        data_on_host = f.data_on_host.clone();
    }
    let batches_from =
        on_gpu.then(|| batches_from(data_on_host.as_deref(), (&images, cfg.batch_size), world));
    let step_launch = match &rank0 {
        Some(f) => Some(f.step_launch.clone()),
        None => gpu_net.as_ref().map(GpuResNet::step_launch),
    };
    let gpu_memory = match &rank0 {
        Some(f) => f.memory.clone(),
        None => gpu_net
            .as_ref()
            .map(GpuResNet::memory_parts)
            .unwrap_or_default(),
    };
    let recording = gpu_net.as_mut().and_then(GpuResNet::take_recording);
    let scaler = gpu_net
        .as_ref()
        .filter(|n| n.precision.scaled())
        .map(GpuResNet::scaler)
        .transpose()?;
    // under a launcher rank 0 writes what the run leaves (every rank holds the same losses)
    let writes = r.launched.as_ref().is_none_or(|w| w.rank == 0);
    if let Some(path) = r.save_losses.as_ref().filter(|_| writes) {
        let mut csv = String::from("step,loss\n");
        for u in &out.updates {
            csv.push_str(&format!("{},{:e}\n", u.step, u.loss));
        }
        gpukit_types::files::write_atomically(path, csv.as_bytes()).map_err(|source| {
            Error::Io {
                what: "--save-losses",
                path: path.clone(),
                source,
            }
        })?;
    }
    // the GPU's memory goes back to the driver before PyTorch takes its own
    drop(gpu_net.take());
    drop(cpu_net.take());
    if let (Some(dp), true, None) = (&mut data_parallel, r.compare_pytorch, &out.diverged) {
        progress("PyTorch: DistributedDataParallel of the same network");
        dp.ddp = cnn_parallel::compare_ddp(
            &cnn_parallel::DdpRequest {
                model: r.model.name(),
                classes,
                image: image.0,
                precision,
                opt,
                smoothing,
                checkpoint: r.checkpoint_activations,
                bf16_comm: r.grad_comm == Some(DType::Bf16),
            },
            (
                world,
                batch,
                r.bucket_mb.unwrap_or(cnn_parallel::DDP_BUCKET_MB),
            ),
            cfg.steps,
        )?;
    }
    let pytorch = match (&initial, &out.diverged, world) {
        (Some(initial), None, 1) => {
            progress("PyTorch: the same model, weights, images and optimizer");
            let losses: Vec<f64> = out.updates.iter().map(|u| u.loss).collect();
            let handed = cnn_peer::Handover {
                model: r.model.name(),
                initial,
                images: &images,
                cfg: &cfg,
                precision,
                opt,
                smoothing,
                checkpoint: r.checkpoint_activations,
            };
            Some(cnn_peer::compare(&handed, &losses)?)
        }
        _ => None,
    };
    Ok(CnnTrainReport {
        model: r.model.name().into(),
        device: r.device.to_string(),
        gpu_name,
        precision: precision.name().into(),
        parameters,
        classes,
        image_size: image,
        batch_size: batch,
        accumulate,
        checkpoint_activations: r.checkpoint_activations,
        optimizer: opt,
        label_smoothing: smoothing,
        seed,
        data: origin,
        images: images.len(),
        initial_weights,
        updates: out.updates,
        conv_algorithms,
        setup_seconds,
        first_step_seconds: out.first_step_seconds,
        images_per_s: out.images_per_s,
        peak_gpu_bytes,
        gpu_memory,
        step_launch,
        batches_from,
        loss_scale: scaler.map(|s| s.scale),
        skipped_updates: scaler.map_or(0, |s| s.skipped),
        pytorch,
        data_parallel,
        diverged: out.diverged,
        saved_losses: r.save_losses.clone(),
        recording,
    })
}

/// bf16 needs an Ampere or newer GPU (compute capability 8.0), fp16 training's tensor-op
/// convolutions Volta (7.0): an older one is bad input, named before any work.
fn check_precision_on(gpu: &gpukit_cuda::Gpu, precision: Precision) -> Result<()> {
    let (major, minor) = gpu.compute_capability()?;
    let needs = match precision {
        Precision::Bf16 => (8, "bf16"),
        Precision::Tf32 => (8, "tf32"),
        Precision::Fp16 => (7, "fp16"),
        Precision::Fp32 => return Ok(()),
    };
    if major < needs.0 {
        return Err(Error::BadInput(format!(
            "--precision {}: {} (compute capability {major}.{minor}) does not train in it; it \
             needs compute capability {}.0 or newer (use --precision fp32)",
            needs.1,
            gpu.name().unwrap_or_else(|_| "this GPU".into()),
            needs.0
        )));
    }
    Ok(())
}

/// The JSON document of `gpukit train --model`: a diverged run fails, and one whose first
/// loss is not PyTorch's on the same weights and images.
pub fn document(report: CnnTrainReport) -> Document<CnnTrainReport> {
    let failure = report.diverged.clone().or_else(|| {
        report
            .pytorch
            .as_ref()
            .and_then(cnn_peer::CnnPeer::disagreement)
    });
    Document::new("train", report, failure)
}

#[cfg(test)]
#[path = "cnn_tests.rs"]
mod tests;
