//! One reading of one GPU, as every part of `gpukit monitor` sees it (the live view, the CSV and
//! JSON lines logs, the Prometheus exporter, a command's footprint). Fields NVML could not give
//! are None, never zero.

pub use gpukit_cuda::nvml::{GpuSample, ProcessSample};

/// Every GPU at one moment (one sampling round).
pub type Round = Vec<GpuSample>;
