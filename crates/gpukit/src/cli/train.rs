//! `gpukit train`'s arguments (`profile train` takes the same) and their parsers.

use super::{parse_batch, parse_count, parse_real};
use clap::Args;
use gpukit_tensor::{DType, Device};
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// seed-regression (1024x16 normal data, MLP 16-64-1, MSE, Adam 1e-3, batch 64, 3 epochs)
    /// or seed-classification (100x3, labels 0/1, MLP 3-10-2, cross-entropy, SGD 0.01, full
    /// batch, 5 epochs); other flags override its settings [default: seed-regression].
    #[arg(long, value_parser = parse_preset)]
    pub preset: Option<gpukit_bench::workload::train::Preset>,

    /// Train a convolutional network instead of an MLP: resnet18, resnet34 or resnet50 (as
    /// torchvision builds them), on images from --data or generated from --seed.
    #[arg(long, value_parser = parse_cnn)]
    pub model: Option<gpukit_train::cnn::resnet::Depth>,

    /// --model: height and width of generated images [default: 224 on a GPU, 32 on the CPU].
    #[arg(long, value_parser = parse_count)]
    pub image_size: Option<usize>,

    /// --model: classes the network outputs (labels must be below it) [default: 1000].
    #[arg(long, value_parser = parse_count)]
    pub classes: Option<usize>,

    /// --model: SGD with Nesterov momentum.
    #[arg(long)]
    pub nesterov: bool,

    /// --model: label smoothing of the cross-entropy, in [0, 1) [default: 0].
    #[arg(long, value_parser = parse_real)]
    pub label_smoothing: Option<f64>,

    /// Layer widths, inputs first, outputs last, ReLU between (e.g. 16,64,1).
    #[arg(long, value_name = "N,N,...", value_parser = parse_layers)]
    pub layers: Option<Layers>,

    /// Samples of generated data.
    #[arg(long, value_parser = parse_count)]
    pub samples: Option<usize>,

    /// Features of generated data.
    #[arg(long, value_parser = parse_count)]
    pub features: Option<usize>,

    /// Samples a batch.
    #[arg(long, value_parser = parse_batch)]
    pub batch_size: Option<usize>,

    /// Passes over the training data (in all, when resuming).
    #[arg(long, value_parser = parse_count_u64)]
    pub epochs: Option<u64>,

    /// Stop after this many optimizer updates in all.
    #[arg(long, value_parser = parse_count_u64)]
    pub steps: Option<u64>,

    /// sgd, adam or adamw.
    #[arg(long, value_parser = parse_optimizer)]
    pub optimizer: Option<gpukit_train::optim::OptimizerKind>,

    /// Learning rate.
    #[arg(long, value_parser = parse_real)]
    pub lr: Option<f64>,

    /// SGD momentum, in [0, 1).
    #[arg(long, value_parser = parse_real)]
    pub momentum: Option<f64>,

    /// Weight decay (L2 for sgd and adam, decoupled for adamw).
    #[arg(long, value_parser = parse_real)]
    pub weight_decay: Option<f64>,

    /// mse or cross-entropy [default: the preset's, or what the data's targets are].
    #[arg(long, value_parser = parse_loss)]
    pub loss: Option<gpukit_train::loss::LossKind>,

    /// Fraction of the samples held out (the last ones) to evaluate after each epoch.
    #[arg(long, value_parser = parse_real)]
    pub eval_fraction: Option<f64>,

    /// Seed of the generated data, the initial weights and the batch order [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,

    /// Data file: safetensors with tensors x [n, features] and y, or CSV with a header whose
    /// last column is the target.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,

    /// Initial weights: safetensors with PyTorch nn.Sequential names (0.weight, 0.bias,
    /// 2.weight, ...).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,

    /// Batches in data order instead of a seeded shuffle each epoch.
    #[arg(long)]
    pub no_shuffle: bool,

    /// Sum the gradients of K batches (each loss divided by K) before each update.
    #[arg(long, value_name = "K", value_parser = parse_count)]
    pub accumulate: Option<usize>,

    /// Write a checkpoint (weights, optimizer state, position) there at the end.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    /// Continue from a checkpoint written by --save.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,

    /// Write every update's loss there (CSV: step,loss).
    #[arg(long, value_name = "FILE")]
    pub save_losses: Option<PathBuf>,

    /// fp32, tf32, fp16 (with a dynamic loss scale) or bf16; the CPU trains in fp32.
    #[arg(long, value_parser = super::parse_precision)]
    pub precision: Option<DType>,

    /// cpu or cuda:N [default: cpu; with --gpus or under a launcher, the ranks' GPUs].
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<Device>,

    /// How batches reach the GPU: plain (pageable copies), pinned (worker-filled pinned
    /// buffers), prefetch (pinned, copied on their own stream while the previous batch
    /// computes) or resident (the data set on the GPU) [default: resident when it fits].
    #[arg(long, value_parser = parse_loader)]
    pub loader: Option<gpukit_train::gpu::feed::Loader>,

    /// Capture each epoch's steps once as a CUDA graph and replay it (needs resident data)
    /// [default: on with resident data]; with --model, each update is one graph, replayed
    /// from the second update [default: on].
    #[arg(long, conflicts_with = "no_graph")]
    pub graph: bool,

    /// Launch every step's kernels one by one instead (to compare with --graph).
    #[arg(long)]
    pub no_graph: bool,

    /// Run the same loop in PyTorch (same data, initial weights and batch order), compare the
    /// per-update losses and the times; with --model (GPU): eager, torch.compile, and
    /// torch.compile with CUDA graphs and the fused optimizer.
    #[arg(long)]
    pub compare_pytorch: bool,

    /// Keep only some layer outputs in the forward pass and recompute the rest in backward
    /// (less activation memory for one more forward pass); with --model on a GPU, each
    /// residual block keeps only its output.
    #[arg(long)]
    pub checkpoint_activations: bool,

    /// Train data-parallel on this many GPUs of this machine (cuda:0..N-1, a thread each):
    /// each takes --batch-size rows of every combined batch and the gradients are averaged
    /// through NCCL (with --model: while backward goes on, beside the ranks training alone;
    /// without it, the MLP's steps are launched op by op unless --graph: that timed faster
    /// on two GPUs than replaying CUDA graphs, and with the optimizer sharded each gradient
    /// block goes to the GPU that updates it by the GPUs' copy engines instead, no
    /// communication kernel beside the products; GPUKIT_DP_EXCHANGE=0 keeps NCCL).
    /// Under torchrun, srun, mpirun or `gpukit launch`, every process is one rank on its
    /// LOCAL_RANK's GPU and --gpus is left out (the MLP loop only).
    #[arg(long, value_parser = parse_count, value_name = "N")]
    pub gpus: Option<usize>,

    /// Data-parallel: gradients are averaged in buckets of about this many MiB, each as soon as
    /// backward has finished its layers (PyTorch DDP's bucket_cap_mb) [default: 25; with
    /// --model all of them in one bucket after backward, which timed faster on NVLink than
    /// averaging during backward]
    #[arg(long, value_parser = parse_real, value_name = "MIB")]
    pub bucket_mb: Option<f64>,

    /// Data-parallel: compute the first layer's weight gradient (backward's last product) in
    /// this many pieces, each averaged as soon as it is done (0: four where that layer's
    /// weights take 16 MiB or more and the optimizer is not sharded, else whole; 1: whole).
    #[arg(long, value_parser = clap::value_parser!(usize), value_name = "N")]
    pub grad_pieces: Option<usize>,

    /// Data-parallel: average gradients in f32 (the default: one GPU's updates up to the order
    /// of sums) or bf16 (half the bytes; every averaged gradient rounded to bf16).
    #[arg(long, value_parser = parse_grad_comm, value_name = "TYPE")]
    pub grad_comm: Option<gpukit_types::DType>,

    /// Data-parallel: shard the optimizer over the GPUs (as ZeRO stage 2): gradients are
    /// reduce-scattered, each GPU keeps the optimizer's moments of 1/N of the parameters and
    /// updates those, and the updated weights are gathered while the next part is updated. The same updates as averaging every gradient;
    /// the default except in fp16 (its overflow check reads every gradient).
    #[arg(long, conflicts_with = "no_shard_optimizer")]
    pub shard_optimizer: bool,
    /// Data-parallel: every GPU updates every parameter from all-reduced gradients, as DDP.
    #[arg(long)]
    pub no_shard_optimizer: bool,

    /// Data-parallel: leave this many multiprocessors to communication: cuBLASLt plans the
    /// products for the rest, so NCCL's kernels run beside them rather than after them (the
    /// baseline alone keeps every multiprocessor) [default: 0].
    #[arg(long, value_parser = clap::value_parser!(u32), value_name = "N")]
    pub comm_sms: Option<u32>,

    /// Train pipeline-parallel on this many GPUs of this machine (cuda:0..N-1, a thread each):
    /// the MLP's layers split by the time their products take, each batch cut into
    /// micro-batches run in the 1F1B schedule, activations passed by the GPUs' copy engines
    /// (NCCL under a launcher); beside the whole model on one GPU with the same batches (its
    /// losses must be the pipeline's).
    #[arg(long, value_parser = parse_count, value_name = "N")]
    pub pipeline: Option<usize>,
    /// --pipeline: micro-batches a batch is cut into [default: 4 a stage].
    #[arg(long, value_parser = parse_count, value_name = "M")]
    pub micro_batches: Option<usize>,
    /// --pipeline: how many layers each stage takes, first to last (e.g. 5,4), instead of the
    /// split gpukit chooses from the layers' timed products and the 1F1B schedule.
    #[arg(long, value_delimiter = ',', value_parser = parse_count, value_name = "L,L,...")]
    pub pipeline_split: Option<Vec<usize>>,
    /// The most of a GPU's memory the run may plan to use, as a fraction in (0, 1]: a run that
    /// needs more is refused before allocating (with --pipeline, each stage's own share).
    #[arg(long, value_name = "F", value_parser = super::parse_fraction)]
    pub memory_fraction: Option<f64>,
    /// Data-parallel under a launcher: seconds to wait for every rank, and for a silent peer.
    #[arg(long, default_value = "60", value_parser = parse_count, value_name = "SECONDS")]
    pub timeout: usize,
}

fn parse_grad_comm(s: &str) -> Result<gpukit_types::DType, String> {
    match s {
        "f32" | "fp32" => Ok(gpukit_types::DType::F32),
        "bf16" => Ok(gpukit_types::DType::Bf16),
        _ => Err(format!("gradients are averaged in f32 or bf16, not '{s}'")),
    }
}

fn parse_cnn(s: &str) -> Result<gpukit_train::cnn::resnet::Depth, String> {
    gpukit_train::cnn::resnet::Depth::parse(s).map_err(|_| {
        let names: Vec<&str> = gpukit_train::cnn::resnet::Depth::ALL
            .iter()
            .map(|d| d.name())
            .collect();
        format!("unknown model (one of {})", names.join(", "))
    })
}

fn parse_loader(s: &str) -> Result<gpukit_train::gpu::feed::Loader, String> {
    gpukit_train::gpu::feed::Loader::parse(s)
        .ok_or_else(|| "unknown loader (plain, pinned, prefetch or resident)".to_string())
}

fn parse_preset(s: &str) -> Result<gpukit_bench::workload::train::Preset, String> {
    gpukit_bench::workload::train::Preset::parse(s)
        .ok_or_else(|| "unknown preset (seed-regression or seed-classification)".to_string())
}

/// `--layers`' widths, one value to clap (a `Vec` would be taken as a list of values).
#[derive(Debug, Clone)]
pub struct Layers(pub Vec<usize>);

fn parse_layers(s: &str) -> Result<Layers, String> {
    gpukit_train::model::parse_widths(s)
        .map(Layers)
        .map_err(|e| e.to_string())
}

/// The most epochs or updates a run may ask for (the GPU path counts updates in 32 bits).
const MAX_UPDATES: u64 = u32::MAX as u64;

fn parse_count_u64(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) if n > MAX_UPDATES => Err(format!(
            "{n} is more than a run can count (at most {MAX_UPDATES})"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err("not a whole number".into()),
    }
}

fn parse_optimizer(s: &str) -> Result<gpukit_train::optim::OptimizerKind, String> {
    use gpukit_train::optim::OptimizerKind::*;
    [Sgd, Adam, AdamW]
        .into_iter()
        .find(|k| k.name() == s.trim().to_ascii_lowercase())
        .ok_or_else(|| "unknown optimizer (sgd, adam or adamw)".to_string())
}

fn parse_loss(s: &str) -> Result<gpukit_train::loss::LossKind, String> {
    use gpukit_train::loss::LossKind::*;
    [Mse, CrossEntropy]
        .into_iter()
        .find(|k| k.name() == s.trim().to_ascii_lowercase())
        .ok_or_else(|| "unknown loss (mse or cross-entropy)".to_string())
}
