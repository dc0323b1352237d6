//! `gpukit monitor`: GPUs sampled through NVML at a fixed interval, written as nvidia-smi-style
//! CSV or JSON lines, served to Prometheus with the DCGM exporter's names, drawn live, and
//! summed into a command's footprint.

pub mod log;
pub mod prometheus;
pub mod run;
pub mod sample;

pub use sample::{GpuSample, ProcessSample, Round};
