//! `gpukit profile`'s arguments: the workload (infer's or train's flags) and what is done with
//! the recording (table, grouping, trace, timing).

use super::{parse_batch, parse_count, parse_image_size, parse_model, parse_strategy, TrainArgs};
use clap::{Args, Subcommand};
use gpukit_bench::infer::InferStrategy;
use gpukit_tensor::Device;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// ResNet inference on gpukit's engine (one strategy, one batch size), or on the CPU.
    Infer(ProfileInferArgs),
    /// A training run (train's flags): its second epoch recorded, op by op.
    Train(Box<ProfileTrainArgs>),
}

/// What `profile` does with what it records, whatever the workload.
#[derive(Debug, Args)]
pub struct ProfileOptionArgs {
    /// Rows of the table shown (the JSON has every row).
    #[arg(long, default_value = "15")]
    pub top: usize,

    /// op (name and shapes), kernel (what the GPU ran; needs CUPTI) or layer.
    #[arg(long, default_value = "op", value_parser = parse_group_by)]
    pub group_by: gpukit_bench::workload::profile::table::GroupBy,

    /// Write a Chrome trace (JSON) there: host launches, one track a stream for kernels and for
    /// ops, launch-to-kernel arrows and the memory pool.
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,

    /// auto (CUPTI when found, else CUDA events), cupti or events.
    #[arg(long, default_value = "auto", value_parser = parse_timing)]
    pub timing: gpukit_cuda::profiler::TimingChoice,
}

#[derive(Debug, Args)]
pub struct ProfileInferArgs {
    /// resnet18, resnet34, resnet50, resnet101 or resnet152.
    #[arg(long, default_value = "resnet50", value_parser = parse_model)]
    pub model_name: gpukit_models::ResNet,

    /// Your own model: an ONNX file, profiled on gpukit's general GPU engine, each step named
    /// by the ONNX node it comes from.
    #[arg(long, value_name = "MODEL.onnx", conflicts_with_all = ["weights", "image_size"])]
    pub onnx: Option<PathBuf>,

    /// With --onnx: sizes of the input's other named axes (`height=224,width=224`).
    #[arg(long, value_name = "NAME=N,...", value_delimiter = ',', value_parser = crate::cli::parse_input_dim, requires = "onnx")]
    pub input_dims: Vec<(String, usize)>,

    /// Batch size.
    #[arg(long, default_value = "32", value_parser = parse_batch)]
    pub batch_size: usize,

    /// A torchvision state_dict saved as safetensors [default: seeded initialisation].
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,

    /// Square input size.
    #[arg(long, default_value = "224", value_parser = parse_image_size)]
    pub image_size: usize,

    /// cpu, or a GPU strategy as infer names it (fp16-nhwc, fp16-nhwc-graph, tf32, ...)
    /// [default: fp16-nhwc on a GPU, else cpu].
    #[arg(long, value_parser = parse_strategy)]
    pub strategy: Option<InferStrategy>,

    /// cpu or cuda:N [default: cuda:0 when a GPU is usable, else cpu].
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<Device>,

    /// Forward passes recorded, after warm-up.
    #[arg(long, default_value = "10", value_parser = parse_count)]
    pub steps: usize,

    #[command(flatten)]
    pub profile: ProfileOptionArgs,
}

#[derive(Debug, Args)]
pub struct ProfileTrainArgs {
    #[command(flatten)]
    pub train: TrainArgs,

    #[command(flatten)]
    pub profile: ProfileOptionArgs,
}

fn parse_group_by(s: &str) -> Result<gpukit_bench::workload::profile::table::GroupBy, String> {
    gpukit_bench::workload::profile::table::GroupBy::parse(s)
        .ok_or_else(|| "unknown grouping (op, kernel or layer)".to_string())
}

fn parse_timing(s: &str) -> Result<gpukit_cuda::profiler::TimingChoice, String> {
    use gpukit_cuda::profiler::TimingChoice;
    match s.trim() {
        "auto" => Ok(TimingChoice::Auto),
        "cupti" => Ok(TimingChoice::Cupti),
        "events" => Ok(TimingChoice::Events),
        _ => Err("unknown timing (auto, cupti or events)".to_string()),
    }
}
