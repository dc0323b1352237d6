//! Command-line definitions.

use clap::{Args, Parser, Subcommand};
use gpukit_bench::infer::InferStrategy;
use gpukit_tensor::{DType, Device, DeviceSelection, Layout};
use std::path::PathBuf;

mod gpus;
mod profile;
mod stress;
mod train;
pub use gpus::{LaunchArgs, NcclArgs, P2pArgs};
pub use profile::{ProfileCommand, ProfileInferArgs, ProfileOptionArgs, ProfileTrainArgs};
pub use stress::StressArgs;
pub use train::TrainArgs;

/// The lessons asked for, one value to clap.
#[derive(Debug, Clone)]
pub struct LessonList(pub Vec<String>);

fn parse_lesson_list(s: &str) -> Result<LessonList, String> {
    gpukit_bench::lessons::parse_lessons(s).map(LessonList)
}

#[derive(Debug, Args)]
pub struct LessonsArgs {
    /// Which lessons: all, or numbers and names (0-8, streams, sync, graphs), comma-separated.
    #[arg(default_value = "all", value_name = "N|all", value_parser = parse_lesson_list)]
    pub lessons: LessonList,

    /// The device [default: cuda:0 when a GPU is usable, else the CPU, where the lessons that
    /// mean something on a CPU run].
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<Device>,

    /// Also run the notebook's own code in PyTorch (python3 with torch), timed the same way.
    #[arg(long)]
    pub compare_pytorch: bool,

    /// Timed samples per case (at least 3).
    #[arg(long, default_value = "15", value_parser = clap::value_parser!(u32).range(3..=1000))]
    pub samples: u32,

    /// Each sample lasts at least this many milliseconds (calls are batched until it does).
    #[arg(long, default_value = "2", value_name = "MS")]
    pub min_sample_ms: f64,
}

/// `--version`: gpukit's version and the CUDA major version this build binds, with the driver
/// it needs (the same binary runs without a GPU; GPU commands need that driver).
#[cfg(not(feature = "cuda-12"))]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (CUDA 13 build: GPU commands need an NVIDIA driver R580 or newer)"
);
#[cfg(feature = "cuda-12")]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (CUDA 12 build: GPU commands need an NVIDIA driver R525 or newer)"
);

/// GPU fundamentals, measured on your own machine.
#[derive(Debug, Parser)]
#[command(name = "gpukit", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// Print one JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Also write the JSON document to FILE (written whole or not at all).
    #[arg(long, global = true, value_name = "FILE")]
    pub save_json: Option<PathBuf>,

    /// Also write the report as one self-contained HTML page (charts and tables) to FILE.
    #[arg(long, global = true, value_name = "FILE")]
    pub html: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Which GPUs, driver and CUDA libraries are here, and what each GPU can do.
    Check(CheckArgs),
    /// How much faster the GPU is than the CPU: matmul, bandwidth, conv.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// ResNet inference per batch size: gpukit's GPU engine in each strategy, its CPU path and
    /// ONNX Runtime, every row's logits checked.
    Infer(InferArgs),
    /// Where GPU memory goes for ResNet inference at several batch sizes (allocated, reserved,
    /// peak, the CUDA context), a memory limit, and what to do on out-of-memory.
    Memory(MemoryArgs),
    /// Train a multilayer perceptron: the tutorials' two loops (--preset) or one described by
    /// flags; per-epoch losses, accuracy and throughput, checkpoints that resume exactly.
    Train(Box<TrainArgs>),
    /// Watch the GPUs: a live view, nvidia-smi-style CSV or JSON lines logs, Prometheus
    /// /metrics with the DCGM exporter's names, or what a command (`-- CMD ARGS`) did to them.
    Monitor(Box<MonitorArgs>),
    /// Where the time goes, op by op and kernel by kernel: a key-averages table (GPU time,
    /// launch time, FLOPs, bytes, the regime against the roofline), the GPU's idle gaps, and a
    /// Chrome trace (--trace) for Perfetto or chrome://tracing.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// The CUDA-101 notebook's lessons and the guides' stream, sync and graph patterns, measured
    /// on this GPU: each claim's bad and good versions, the regime of each, and a verdict
    /// (holds, holds weakly, does not hold) with the reason.
    Lessons(LessonsArgs),
    /// A burn-in with a verdict per GPU, every GPU at once: sustained bf16 and tf32 matmul (each
    /// result compared bit for bit with the first and checked against float64), a pattern test
    /// over 90% of the free memory, pinned copies against the PCIe link, NVML watched throughout
    /// (throttle reasons, clocks, temperature, power, ECC, remapped rows, XID). Exit 1 names
    /// each failing GPU and why.
    Stress(StressArgs),
    /// Run every command and write DIR/report.json, DIR/report.md and DIR/report.html.
    All(AllArgs),
    /// Print a shell completion script: `gpukit completions bash > ~/.local/share/bash-completion/completions/gpukit`.
    Completions(CompletionsArgs),
    /// Print gpukit's man page (roff), every command on one page: `gpukit man | man -l -`.
    Man,
    /// Start one process per GPU on this machine (like torchrun --standalone): `gpukit launch
    /// --nproc-per-node 2 -- gpukit bench nccl`.
    Launch(LaunchArgs),
    /// Compare two reports (any command's --save-json, or all's report.json): every figure in
    /// both, better or worse beyond a threshold and the runs' own spread.
    Compare(CompareArgs),
    /// Draw an `all` report (report.json) as one self-contained HTML page with charts, as
    /// `all --out` writes it.
    Html(HtmlArgs),
}

#[derive(Debug, Args)]
pub struct HtmlArgs {
    /// The report of `gpukit all` (DIR/report.json).
    #[arg(value_name = "REPORT.json")]
    pub report: PathBuf,

    /// Where to write the page.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct CompareArgs {
    /// The earlier report (JSON).
    #[arg(value_name = "OLD.json")]
    pub old: PathBuf,

    /// The later report (JSON).
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,

    /// A change smaller than this is "same": a percentage (5%) or a fraction (0.05). A larger
    /// one also has to be beyond the two runs' spread (their p10-p90 ranges apart).
    #[arg(
        long,
        default_value = "5%",
        value_name = "T",
        allow_hyphen_values = true,
        value_parser = gpukit_bench::compare::parse_threshold
    )]
    pub threshold: f64,

    /// Exit 1 when a figure is judged worse (beyond the threshold and the runs' spread, on enough
    /// repetitions) or a row that worked before fails now.
    #[arg(long)]
    pub fail_on_regression: bool,

    /// Also write the tables as Markdown to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

fn parse_model(s: &str) -> Result<gpukit_models::ResNet, String> {
    s.parse()
        .map_err(|e: gpukit_models::UnknownModel| e.to_string())
}

fn parse_fp8_calibration(s: &str) -> Result<gpukit_models::graph::fp8::Method, String> {
    use gpukit_models::graph::fp8::Method;
    match s.split_once(':') {
        None if s == "max" => Ok(Method::Max),
        Some(("percentile", p)) => match p.parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(Method::Percentile(p)),
            _ => Err(format!("percentile {p}: a number in (0, 100]")),
        },
        _ => Err(format!("'{s}': max, or percentile:P with 0 < P <= 100")),
    }
}

fn parse_torchvision(s: &str) -> Result<String, String> {
    gpukit_bench::infer::onnx::torchvision::check_name(s).map(str::to_string)
}

/// The largest batch size accepted on the command line.
const MAX_BATCH: usize = 1 << 24;

/// The largest image side accepted on the command line (memory decides what runs).
const MAX_IMAGE: usize = 1 << 16;

/// Parses a square image size: at least 32 (ResNet's five halvings need it).
fn parse_image_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n < 32 => Err(format!(
            "an image size of {n} is too small: ResNet needs at least 32"
        )),
        Ok(n) if n > MAX_IMAGE => Err(format!(
            "an image size of {n} is beyond any machine (at most {MAX_IMAGE})"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err("not an image size (a whole number of pixels, e.g. 224)".to_string()),
    }
}

fn parse_batch(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("a batch size must be at least 1".into()),
        // what fits is decided by the machine's memory when the run starts; this bound only
        // keeps every byte count far from overflowing
        Ok(n) if n > MAX_BATCH => Err(format!(
            "batch size {n} is beyond any machine (at most {MAX_BATCH})"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err("not a batch size (a whole number, e.g. 32)".to_string()),
    }
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct InferArgs {
    /// resnet18, resnet34, resnet50, resnet101 or resnet152.
    #[arg(long, default_value = "resnet50", value_parser = parse_model)]
    pub model_name: gpukit_models::ResNet,

    /// Batch sizes [default: 1,8,16,32; with --onnx, the model's own batch where its input
    /// fixes one].
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = parse_batch)]
    pub batch_sizes: Option<Vec<usize>>,

    /// Your own model: an ONNX file (torch.onnx.export's, opset 13 or later, one f32 input)
    /// run on the CPU by gpukit's graph interpreter after its passes, and by ONNX Runtime on
    /// the same random input. GPU strategies run it on gpukit's GPU engine. Every f32 row (the
    /// interpreter's, fp32 GPU rows) is checked against float64 outputs on the same input (the
    /// graph run in f64 on the CPU) and passes within 1e-5 of them (max rel. diff), or as close
    /// as ONNX Runtime's f32 is; tf32, fp16 and bf16 rows against ONNX Runtime's outputs.
    /// --batch-sizes fills a dynamic batch axis.
    #[arg(
        long,
        value_name = "MODEL.onnx",
        conflicts_with_all = ["model_name", "weights", "image_size", "input"]
    )]
    pub onnx: Option<PathBuf>,

    /// With --onnx --compare-pytorch: the torchvision classifier the file was exported from
    /// (mobilenet_v3_large, ...). PyTorch runs it beside gpukit (eager, CUDA graph,
    /// torch.compile), once checked to be the file's model: as many convolutions and linear
    /// layers, and the same output shape (else exit 2); its logits against the file's on one
    /// batch say whether the weights are the same too.
    #[arg(long, value_name = "NAME", value_parser = parse_torchvision, requires_all = ["onnx", "compare_pytorch"])]
    pub torchvision: Option<String>,

    /// With --torchvision: PyTorch's weights, the state dict as safetensors
    /// (scripts/export_torchvision.py writes NAME.safetensors beside NAME.onnx) [default: seeded,
    /// torchvision's initialisation under seed 0 with batch-norm statistics measured on random
    /// images, as scripts/export_torchvision.py exports them].
    #[arg(long, value_name = "FILE", requires = "torchvision")]
    pub torchvision_weights: Option<PathBuf>,

    /// With --onnx: sizes of the input's other named axes (`height=224,width=224`), where the
    /// model leaves them open.
    #[arg(long, value_name = "NAME=N,...", value_delimiter = ',', value_parser = parse_input_dim, requires = "onnx")]
    pub input_dims: Vec<(String, usize)>,

    /// With --onnx: run a model of torchvision's ResNet family on the hand-built ResNet engine
    /// (read back from the graph), not on the general engine every graph runs on.
    #[arg(long, requires = "onnx")]
    pub resnet_engine: bool,

    /// With --onnx: what fp8 (E4M3) would do to the model's answers, simulated on the CPU:
    /// every convolution's and matrix product's operands rounded to E4M3 (activations with
    /// scales calibrated on 64 generated rows, weights per output channel), then set beside
    /// f32 on 128 rows calibration never saw. Fails unless 99% keep their top class, naming
    /// the layer fp8 hurts most.
    #[arg(long, requires = "onnx")]
    pub fp8_check: bool,

    /// With --fp8-check: how an activation's scale is chosen: max (its largest magnitude in
    /// calibration) or percentile:P (the P-th percentile of its magnitudes, 0 < P <= 100)
    /// [default: max].
    #[arg(long, value_name = "METHOD", value_parser = parse_fp8_calibration, requires = "fp8_check")]
    pub fp8_calibration: Option<gpukit_models::graph::fp8::Method>,

    /// With --fp8-check: calibrate on these inputs instead of generated ones: a safetensors file
    /// with one f32 tensor (named as the model's input, or x) of [n, ...the input's shape]; the
    /// first half of its batches of 8 calibrates, the second half is judged.
    #[arg(long, value_name = "FILE", requires = "fp8_check")]
    pub calibrate: Option<PathBuf>,

    /// With --fp8-check: write the calibrated scales here (JSON: each node's input scale and its
    /// weight's per-channel scales).
    #[arg(long, value_name = "FILE", requires = "fp8_check")]
    pub save_fp8_scales: Option<PathBuf>,

    /// A torchvision state_dict saved as safetensors [default: seeded initialisation].
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,

    /// Square input size.
    #[arg(long, default_value = "224", value_parser = parse_image_size)]
    pub image_size: usize,

    /// Timed repetitions per CPU row (fewer if a row would pass 10 s).
    #[arg(long, default_value = "10", value_parser = parse_iterations)]
    pub iterations: usize,

    /// Timed repetitions per GPU row (CUDA events), after at least 100 ms of untimed ones.
    #[arg(long, default_value = "50", value_parser = parse_iterations)]
    pub gpu_iterations: usize,

    /// cpu, cuda:N or all (the CPU rows, plus cuda:0 when a GPU is usable).
    #[arg(long, default_value = "all", value_name = "DEVICE")]
    pub device: DeviceSelection,

    /// Rows to run: cpu (gpukit's f32 CPU path), onnxruntime, and GPU strategies
    /// PRECISION[-nhwc][-graph][-one-at-a-time], PRECISION one of fp32, tf32, fp16, bf16
    /// (-nhwc: NHWC activations, else NCHW; -graph: replayed as a CUDA graph, else launched call
    /// by call; -one-at-a-time: at each batch size N over 1, the N images as N batch-1 passes
    /// back to back, all on the batch's first image, against the batched row)
    /// [default: cpu,onnxruntime,fp32,fp32-graph,tf32,tf32-graph,tf32-nhwc,tf32-nhwc-graph,fp16,fp16-graph,fp16-nhwc,fp16-nhwc-graph,bf16-nhwc,bf16-nhwc-graph,fp16-nhwc-graph-one-at-a-time; those --device runs]
    #[arg(long, value_name = "NAME,...", value_delimiter = ',', value_parser = parse_strategy)]
    pub strategies: Option<Vec<InferStrategy>>,

    /// Run the same strategies through PyTorch (scripts/pytorch_reference.py) and show both
    /// (with --onnx, name the model with --torchvision).
    #[arg(long)]
    pub compare_pytorch: bool,

    /// Instead of timing: run the batch in FILE (safetensors, tensor "input", f32
    /// [n,3,h,w]) through every strategy once and judge the logits against the CPU's (a
    /// strategy over its tolerance fails the run). The batch and image size are the file's.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["batch_sizes", "image_size", "iterations", "gpu_iterations", "compare_pytorch"]
    )]
    pub input: Option<PathBuf>,

    /// With --input: write the logits there (safetensors: "logits" from the CPU f32 path,
    /// "logits_<strategy>" for each other strategy).
    #[arg(long, value_name = "FILE", requires = "input")]
    pub save_output: Option<PathBuf>,

    /// How each convolution's cuDNN engine is chosen: fast (the few best of cuDNN's ranking
    /// timed, about as long as PyTorch's cudnn.benchmark) or exhaustive (every suggested
    /// engine and algorithm timed: minutes). Choices are kept on disk either way.
    #[arg(long, default_value = "fast", value_name = "SEARCH", value_parser = parse_planning)]
    pub planning: gpukit_cuda::dnn::Search,
}

pub(crate) fn parse_planning(s: &str) -> Result<gpukit_cuda::dnn::Search, String> {
    match gpukit_cuda::dnn::Search::parse(s) {
        Some(gpukit_cuda::dnn::Search::Heuristic) | None => {
            Err("unknown planning (fast or exhaustive)".to_string())
        }
        Some(search) => Ok(search),
    }
}

/// `height=224`: an input axis's name and size.
pub(crate) fn parse_input_dim(s: &str) -> Result<(String, usize), String> {
    let (name, size) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=N (e.g. height=224)"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("{s:?} names no axis (NAME=N, e.g. height=224)"));
    }
    match size.trim().parse::<usize>() {
        Ok(0) => Err(format!("{name}: a size must be at least 1")),
        Ok(n) if n > MAX_BATCH => Err(format!(
            "{name}: {n} is beyond any machine (at most {MAX_BATCH})"
        )),
        Ok(n) => Ok((name.to_string(), n)),
        Err(_) => Err(format!("{name}: {size:?} is not a size (a whole number)")),
    }
}

fn parse_strategy(s: &str) -> Result<InferStrategy, String> {
    InferStrategy::parse(s).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Matrix multiply, CPU against GPU, every dtype, verified against float64.
    Matmul(MatmulArgs),
    /// Copies: host<->device (pageable, pinned, staged), device<->device, both directions.
    Bandwidth(BandwidthArgs),
    /// ResNet-50's convolutions, all of them: CPU im2col+gemm against cuDNN, f32/tf32/f16/bf16,
    /// NCHW and NHWC.
    Conv(ConvArgs),
    /// NCCL collectives over several GPUs as nccl-tests prints them (time, algbw, busbw,
    /// #wrong): one process driving every GPU, or one per GPU under a launcher (torchrun, srun,
    /// mpirun, gpukit launch).
    Nccl(NcclArgs),
    /// Copies between every pair of GPUs (one way, both ways, latency) beside the link NVML
    /// reports (NVLink or PCIe).
    P2p(P2pArgs),
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct ConvArgs {
    /// Batch sizes: every shape runs at each.
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        default_value = "32",
        value_parser = parse_batch
    )]
    pub batch: Vec<usize>,

    /// dtypes on the GPU: any of f32, tf32, f16, bf16 (the CPU runs f32).
    #[arg(
        long,
        value_name = "DTYPE,...",
        value_delimiter = ',',
        default_value = "f32,tf32,f16,bf16"
    )]
    pub dtype: Vec<DType>,

    /// Layouts: nchw, nhwc or both.
    #[arg(
        long,
        value_name = "LAYOUT,...",
        value_delimiter = ',',
        default_value = "nchw,nhwc"
    )]
    pub layout: Vec<Layout>,

    /// Timed repetitions per row.
    #[arg(long, default_value = "30", value_parser = parse_iterations)]
    pub iterations: usize,

    /// cpu, cuda:N or all.
    #[arg(long, default_value = "all", value_name = "DEVICE")]
    pub device: DeviceSelection,

    /// Run the same convolutions through PyTorch (cudnn.benchmark on) and show both.
    #[arg(long)]
    pub compare_pytorch: bool,

    /// How each row's cuDNN engine is chosen: fast or exhaustive (as for infer).
    #[arg(long, default_value = "fast", value_name = "SEARCH", value_parser = parse_planning)]
    pub planning: gpukit_cuda::dnn::Search,
}

/// Parses one square matrix size.
fn parse_size(t: &str) -> Result<usize, String> {
    let t = t.trim();
    let n: usize = t
        .parse()
        .map_err(|_| "not a matrix size (a whole number, e.g. 4096)".to_string())?;
    if n == 0 {
        return Err("a matrix size must be at least 1".to_string());
    }
    if n > 200_000 {
        return Err(format!(
            "{n} is too large: a {n}x{n} f32 matrix alone needs {:.0} GB",
            (n as f64).powi(2) * 4.0 / 1e9
        ));
    }
    Ok(n)
}

/// Parses a byte count: 4096, 64K, 16M, 1G.
pub fn parse_byte_size(t: &str) -> Result<usize, String> {
    let t = t.trim();
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| "not a size in bytes (e.g. 4096, 64K, 16M, 1G)".to_string())?;
    n.checked_mul(mult)
        .filter(|&b| b > 0 && b <= 64 << 30)
        .ok_or_else(|| "out of range: sizes go from 1 byte to 64G".to_string())
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct MemoryArgs {
    /// resnet18, resnet34, resnet50, resnet101 or resnet152.
    #[arg(long, default_value = "resnet50", value_parser = parse_model)]
    pub model_name: gpukit_models::ResNet,

    /// Batch sizes.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', default_value = "16,32,64,128", value_parser = parse_batch)]
    pub batch_sizes: Vec<usize>,

    /// fp32, tf32, fp16 or bf16.
    #[arg(long, default_value = "fp32", value_parser = parse_precision)]
    pub precision: DType,

    /// nchw or nhwc activations [default: NCHW for fp32/tf32, NHWC for fp16/bf16].
    #[arg(long)]
    pub layout: Option<Layout>,

    /// Most of the device's memory gpukit may use, as a fraction in (0, 1].
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    pub memory_fraction: Option<f64>,

    /// What to do when a batch does not fit: fail (the default) or halve it until it fits.
    #[arg(long, value_name = "ACTION", default_value = "fail", value_parser = ["fail", "halve"])]
    pub on_oom: String,

    /// Also find the largest batch that fits (found on paper, confirmed by allocation).
    #[arg(long)]
    pub find_max_batch: bool,

    /// Most workspace a chosen cuDNN algorithm may use, in MiB (0 to 256; 0: only algorithms
    /// that need none) [default: 256, the fastest algorithms]. Less memory, maybe less speed:
    /// the table shows both.
    #[arg(long, value_name = "MIB", value_parser = parse_workspace_mib)]
    pub max_workspace: Option<usize>,

    /// Square input size.
    #[arg(long, default_value = "224", value_parser = parse_image_size)]
    pub image_size: usize,

    /// A torchvision state_dict saved as safetensors [default: seeded initialisation].
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,

    /// The GPU (cuda:N) [default: cuda:0].
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<Device>,
}

fn parse_precision(s: &str) -> Result<DType, String> {
    gpukit_models::gpu::ENGINE_DTYPES
        .into_iter()
        .find(|p| p.precision_name() == s.trim().to_ascii_lowercase())
        .ok_or_else(|| "unknown precision (fp32, tf32, fp16 or bf16)".to_string())
}

pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        Ok(f) => Err(format!("{f} is not a fraction above 0 and at most 1")),
        Err(_) => Err("not a number (a fraction such as 0.5)".to_string()),
    }
}

fn parse_workspace_mib(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n <= 256 => Ok(n),
        Ok(n) => Err(format!(
            "{n} MiB is over the 256 MiB the algorithm search may use"
        )),
        Err(_) => Err("not a number of MiB (0 to 256)".to_string()),
    }
}

fn parse_turns(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=100).contains(&n) => Ok(n),
        Ok(_) => Err("turns must be between 1 and 100".into()),
        Err(_) => Err("not a number of turns".to_string()),
    }
}

fn parse_lt_candidates(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n <= 64 => Ok(n),
        Ok(_) => Err("at most 64 cuBLASLt candidates".into()),
        Err(_) => Err("not a number of candidates".to_string()),
    }
}

/// The most timed repetitions a row may ask for: far past where the median stops moving, and
/// each keeps a sample in memory.
const MAX_ITERATIONS: usize = 1_000_000;

fn parse_iterations(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("iterations must be at least 1".into()),
        Ok(n) if n > MAX_ITERATIONS => Err(format!(
            "{n} repetitions is more than a row can use (at most {MAX_ITERATIONS})"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err("not a number of iterations".to_string()),
    }
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct MatmulArgs {
    /// One square size (the seed script's flag); same as --sizes N.
    #[arg(long, value_name = "N", value_parser = parse_size, conflicts_with = "sizes")]
    pub matrix_size: Option<usize>,

    /// Square sizes to sweep [default: 1000,1023,1024,2048,4096,8192].
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Option<Vec<usize>>,

    /// dtypes: any of f64, f32, tf32, f16, bf16, fp8 (E4M3 inputs, bf16 output; GPUs of compute
    /// capability 8.9 and newer) [default: all the device supports].
    #[arg(long, value_name = "DTYPE,...", value_delimiter = ',')]
    pub dtype: Option<Vec<DType>>,

    /// Timed repetitions per row (after warm-up; CPU rows stop early past --cpu-seconds).
    #[arg(long, default_value = "50", value_parser = parse_iterations)]
    pub iterations: usize,

    /// cpu, cuda:N or all.
    #[arg(long, default_value = "all", value_name = "DEVICE")]
    pub device: DeviceSelection,

    /// Longest a CPU row may run, in seconds.
    #[arg(long, default_value = "10")]
    pub cpu_seconds: f64,

    /// Input distribution: normal (as torch.randn) or uniform in [-1, 1). A power-capped GPU
    /// runs large products at clocks that depend on the data.
    #[arg(long, default_value = "normal", value_name = "DIST")]
    pub init: gpukit_bench::matmul::Init,

    /// cuBLASLt heuristic algorithms timed against cuBLAS per GPU row, 0 to 64 (0: cuBLAS only).
    #[arg(long, default_value = "8", value_name = "N", value_parser = parse_lt_candidates)]
    pub lt_candidates: usize,

    /// Run the same workloads through PyTorch (scripts/pytorch_reference.py), taking turns
    /// with it on every row, and show both.
    #[arg(long)]
    pub compare_pytorch: bool,

    /// With --compare-pytorch: blocks each side runs per row, alternating (the iterations are
    /// split between them); gpukit opens the first half of the rounds and PyTorch the rest.
    #[arg(long, default_value = "6", value_parser = parse_turns, value_name = "N")]
    pub turns: usize,

    /// Instead of square sizes: the highest rate over a grid of 26 shapes (M, N, K from 2048
    /// to 16384, with mamf-finder's flat, deep ones such as 2048x2048x13312), per dtype
    /// [--dtype default: bf16], every shape's result checked. The best is kept in gpukit's
    /// cache folder for this GPU, driver and cuBLASLt; `stress` shows rates against it.
    #[arg(long, conflicts_with_all = ["sizes", "matrix_size", "compare_pytorch"])]
    pub search: bool,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct BandwidthArgs {
    /// Copy sizes [default: 4K,64K,1M,16M,256M,1G].
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',', value_parser = parse_byte_size)]
    pub sizes: Option<Vec<usize>>,

    /// Timed repetitions for large copies (copies up to 1M get ten times as many).
    #[arg(long, default_value = "20", value_parser = parse_iterations)]
    pub iterations: usize,

    /// cuda:N.
    #[arg(long, default_value = "cuda:0", value_name = "DEVICE")]
    pub device: Device,

    /// Run the same copies through PyTorch and show both.
    #[arg(long)]
    pub compare_pytorch: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Which devices to describe: all, cpu, cuda:N.
    #[arg(long, default_value = "all", value_name = "DEVICE")]
    pub device: DeviceSelection,

    /// Also open libraries whose version their file names don't tell (slower: cuBLAS and cuDNN
    /// map hundreds of megabytes).
    #[arg(long)]
    pub library_versions: bool,

    /// Ask NVML only: no CUDA start-up (cuInit takes 0.1-0.2 s on some machines), so nothing
    /// confirms CUDA works, and L2 size, usable memory and peer access are not shown.
    #[arg(long)]
    pub quick: bool,
}

#[derive(Debug, Args)]
pub struct AllArgs {
    /// Directory for report.json and report.md (created if missing).
    #[arg(long, value_name = "DIR", default_value = "gpukit-report")]
    pub out: PathBuf,

    /// Which devices to run on: all, cpu, cuda:N.
    #[arg(long, default_value = "all", value_name = "DEVICE")]
    pub device: DeviceSelection,

    /// Shorter benchmarks (fewer sizes and repetitions): a tour, not a measurement campaign.
    #[arg(long)]
    pub quick: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_reject_nonsense() {
        assert_eq!(parse_size(" 1023"), Ok(1023));
        assert!(parse_size("0").unwrap_err().contains("at least 1"));
        // clap quotes the value itself; the reason says what a size is
        assert!(parse_size("-5").unwrap_err().contains("not a matrix size"));
        assert!(parse_size("abc").unwrap_err().contains("not a matrix size"));
        assert!(parse_size("1000000").unwrap_err().contains("too large"));
    }

    #[test]
    fn batch_and_image_sizes_name_their_bounds() {
        assert_eq!(parse_batch("14474"), Ok(14474));
        assert!(parse_batch("0").unwrap_err().contains("at least 1"));
        assert!(parse_batch("99999999999")
            .unwrap_err()
            .contains("beyond any machine"));
        assert!(parse_batch("x").unwrap_err().contains("not a batch size"));
        assert_eq!(parse_image_size("224"), Ok(224));
        assert!(parse_image_size("0").unwrap_err().contains("at least 32"));
        assert!(parse_image_size("31").unwrap_err().contains("at least 32"));
        assert!(parse_image_size("100000")
            .unwrap_err()
            .contains("beyond any machine"));
        assert!(parse_image_size("big")
            .unwrap_err()
            .contains("not an image size"));
    }

    #[test]
    fn byte_sizes_take_suffixes() {
        assert_eq!(parse_byte_size("4K"), Ok(4096));
        assert_eq!(parse_byte_size("1G"), Ok(1 << 30));
        assert_eq!(parse_byte_size("100"), Ok(100));
        assert!(parse_byte_size("0").is_err());
        assert!(parse_byte_size("12X").is_err());
        assert!(parse_byte_size("100G")
            .unwrap_err()
            .contains("out of range"));
    }

    #[test]
    fn turns_and_candidates_are_bounded() {
        assert!(parse_turns("0").is_err());
        assert!(parse_turns("101").is_err());
        assert!(parse_turns("x")
            .unwrap_err()
            .contains("not a number of turns"));
        assert_eq!(parse_turns("5"), Ok(5));
        assert_eq!(parse_lt_candidates("0"), Ok(0));
        assert!(parse_lt_candidates("65").is_err());
        assert!(parse_lt_candidates("-1").is_err());
    }

    #[test]
    fn iterations_must_be_positive() {
        assert!(parse_iterations("0").is_err());
        assert!(parse_iterations("99999999999").is_err_and(|e| e.contains("at most 1000000")));
        assert_eq!(parse_iterations("7"), Ok(7));
    }

    #[test]
    fn infer_help_lists_the_default_strategies() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("infer")
            .unwrap()
            .render_long_help()
            .to_string();
        let squeezed: String = help.split_whitespace().collect();
        let names: Vec<String> = InferStrategy::defaults()
            .iter()
            .map(InferStrategy::name)
            .collect();
        assert!(
            squeezed.contains(&format!("[default:{}", names.join(","))),
            "{help}"
        );
        let cli = Cli::try_parse_from(["gpukit", "infer", "--strategies", "cpu,fp16-nhwc-graph"])
            .unwrap();
        match cli.command {
            Command::Infer(a) => {
                assert_eq!(a.device, DeviceSelection::All);
                assert_eq!(
                    a.strategies.unwrap(),
                    vec![
                        InferStrategy::Cpu,
                        InferStrategy::parse("fp16-nhwc-graph").unwrap()
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "gpukit",
            "bench",
            "matmul",
            "--sizes",
            "1000,1023",
            "--dtype",
            "f16,bf16",
        ])
        .unwrap();
        match cli.command {
            Command::Bench(BenchCommand::Matmul(m)) => {
                assert_eq!(m.sizes, Some(vec![1000, 1023]));
                assert_eq!(m.dtype, Some(vec![DType::F16, DType::Bf16]));
            }
            other => panic!("{other:?}"),
        }
        let cli =
            Cli::try_parse_from(["gpukit", "bench", "bandwidth", "--sizes", "4K,1M"]).unwrap();
        match cli.command {
            Command::Bench(BenchCommand::Bandwidth(b)) => {
                assert_eq!(b.sizes, Some(vec![4096, 1 << 20]))
            }
            other => panic!("{other:?}"),
        }
    }
}

#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// Milliseconds between samples.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u64,

    /// One CSV line a GPU a sample, nvidia-smi's field names, to FILE or `-` (stdout).
    #[arg(long, value_name = "FILE|-")]
    pub csv: Option<String>,

    /// One JSON object a GPU a sample, to FILE or `-` (stdout).
    #[arg(long, value_name = "FILE|-")]
    pub jsonl: Option<String>,

    /// Stop after N samples.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,

    /// Serve Prometheus /metrics (the DCGM exporter's names) at ADDR, e.g. 127.0.0.1:9400.
    #[arg(long, value_name = "ADDR")]
    pub prometheus: Option<String>,

    /// Let --prometheus bind an address other than the loopback one.
    #[arg(long)]
    pub allow_remote: bool,

    /// A command to run and measure: `gpukit monitor -- CMD ARGS...` (its exit code passes
    /// through).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) if n > MAX_BATCH => Err(format!(
            "{n} is beyond what this flag allows (at most {MAX_BATCH})"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err("not a whole number".into()),
    }
}

fn parse_real(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(v) => Err(format!("{v} is not a finite number")),
        Err(_) => Err("not a number".into()),
    }
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}
