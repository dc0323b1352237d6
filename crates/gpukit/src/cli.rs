//! Command-line definitions.

use clap::{Args, Parser, Subcommand};
use gpukit_tensor::DeviceSelection;
use std::path::PathBuf;

/// GPU fundamentals, measured on your own machine.
#[derive(Debug, Parser)]
#[command(name = "gpukit", version, about, long_about = None)]
pub struct Cli {
    /// Print one JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Which GPUs, driver and CUDA libraries are here, and what each GPU can do.
    Check(CheckArgs),
    /// Run every command and write DIR/report.json and DIR/report.md.
    All(AllArgs),
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
}
