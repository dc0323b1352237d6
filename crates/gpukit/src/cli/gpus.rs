//! The several-GPU commands' arguments: `bench nccl`, `bench p2p` and `launch`.

use super::{parse_byte_size, parse_count, parse_iterations};
use clap::Args;
use gpukit_tensor::DType;

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct NcclArgs {
    /// GPUs this one process drives (default: every visible GPU). Under a launcher each process
    /// drives one GPU (its LOCAL_RANK) and --gpus is left out.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub gpus: Option<usize>,

    /// Collectives: any of all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall.
    #[arg(
        long,
        value_name = "OP,...",
        value_delimiter = ',',
        default_value = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall",
        value_parser = parse_collective
    )]
    pub ops: Vec<gpukit_bench::nccl::sweep::Collective>,

    /// Element types: any of f32, bf16, f16.
    #[arg(
        long,
        value_name = "DTYPE,...",
        value_delimiter = ',',
        default_value = "f32"
    )]
    pub dtype: Vec<DType>,

    /// Reductions (for all_reduce, reduce_scatter, reduce): any of sum, max, min.
    #[arg(
        long,
        value_name = "OP,...",
        value_delimiter = ',',
        default_value = "sum",
        value_parser = parse_redop
    )]
    pub redop: Vec<gpukit_cuda::nccl::RedOp>,

    /// Smallest size (bytes per rank buffer, as nccl-tests counts them): 8, 512K, 1M, 1G.
    #[arg(long, default_value = "8", value_parser = parse_byte_size, value_name = "SIZE")]
    pub min_bytes: usize,

    /// Largest size.
    #[arg(long, default_value = "1G", value_parser = parse_byte_size, value_name = "SIZE")]
    pub max_bytes: usize,

    /// Each size is the previous one times this.
    #[arg(long, default_value = "2", value_parser = parse_count, value_name = "N")]
    pub step_factor: usize,

    /// Timed collectives per row (back to back, between two events).
    #[arg(long, default_value = "20", value_parser = parse_iterations)]
    pub iterations: usize,

    /// Timed blocks of --iterations per row; each rank's figure is its median block.
    #[arg(long, default_value = "5", value_parser = parse_count, value_name = "N")]
    pub repeats: usize,

    /// Untimed collectives per row before timing (and, as nccl-tests does, at the largest size
    /// before each collective's sweep).
    #[arg(long, default_value = "5", value_parser = parse_count_or_zero, value_name = "N")]
    pub warmup: usize,

    /// Where results go: out (separate buffers), in (in place) or both.
    #[arg(long, default_value = "both", value_parser = parse_place, value_name = "out|in|both")]
    pub place: Places,

    /// Root rank of broadcast and reduce.
    #[arg(long, default_value = "0", value_parser = parse_count_or_zero, value_name = "RANK")]
    pub root: usize,

    /// Capture the timed collectives as a CUDA graph and replay it (nccl-tests' -G).
    #[arg(long)]
    pub graph: bool,

    /// Seconds to wait for every rank to arrive, and for a silent peer, before every process
    /// exits with a message.
    #[arg(long, default_value = "60", value_parser = parse_count, value_name = "SECONDS")]
    pub timeout: usize,

    /// Run the same sweep through torch.distributed (its own processes, one per GPU) and show
    /// both.
    #[arg(long)]
    pub compare_pytorch: bool,
}

/// Which places a sweep measures.
#[derive(Debug, Clone)]
pub struct Places(pub Vec<gpukit_bench::nccl::Place>);

fn parse_place(s: &str) -> Result<Places, String> {
    use gpukit_bench::nccl::Place;
    match s.trim() {
        "out" => Ok(Places(vec![Place::Out])),
        "in" => Ok(Places(vec![Place::In])),
        "both" => Ok(Places(vec![Place::Out, Place::In])),
        _ => Err("one of out, in, both".into()),
    }
}

fn parse_collective(s: &str) -> Result<gpukit_bench::nccl::sweep::Collective, String> {
    gpukit_bench::nccl::sweep::Collective::parse(s).ok_or_else(|| {
        "one of all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall".into()
    })
}

fn parse_redop(s: &str) -> Result<gpukit_cuda::nccl::RedOp, String> {
    gpukit_cuda::nccl::RedOp::parse(s.trim()).ok_or_else(|| "one of sum, max, min".into())
}

fn parse_count_or_zero(s: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| "not a whole number (0 or more)".to_string())
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct P2pArgs {
    /// Bytes of one copy.
    #[arg(long, default_value = "256M", value_parser = parse_byte_size, value_name = "SIZE")]
    pub bytes: usize,

    /// Copies per timed sample.
    #[arg(long, default_value = "10", value_parser = parse_iterations)]
    pub iterations: usize,

    /// Run the same copies through PyTorch (tensor.to(other GPU)) and show both.
    #[arg(long)]
    pub compare_pytorch: bool,
}

/// Start N copies of a command on this machine, one per GPU, as torchrun's standalone mode does
/// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set for each).
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Processes to start on this machine (one per GPU).
    #[arg(long, value_parser = parse_count, value_name = "N")]
    pub nproc_per_node: usize,

    /// Machines in the job.
    #[arg(long, default_value = "1", value_parser = parse_count, value_name = "N")]
    pub nnodes: usize,

    /// This machine's place among them (0 runs rank 0).
    #[arg(long, default_value = "0", value_parser = parse_count_or_zero, value_name = "N")]
    pub node_rank: usize,

    /// Where rank 0 listens (this machine's address when --nnodes is more than 1).
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    pub master_addr: String,

    /// Rank 0's port (default: a free one; give it when --nnodes is more than 1).
    #[arg(long, value_name = "PORT")]
    pub master_port: Option<u16>,

    /// Seconds a failed rank's peers get to exit on their own before they are stopped.
    #[arg(long, default_value = "60", value_parser = parse_count, value_name = "SECONDS")]
    pub timeout: usize,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}
