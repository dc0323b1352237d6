//! The profiler's arithmetic, independent of how the records were taken: what one op or kernel
//! record holds, the key-averages table (calls, GPU total and self, average, % of the step,
//! CPU launch time, FLOPs, bytes, achieved rates, arithmetic intensity and the regime against
//! the chip's roofline), the idle gaps between a stream's kernels (what CUDA graphs remove),
//! and the Chrome trace (with the format's rules checked, [`trace::validate`]).
//!
//! To use: collect [`OpRecord`]s (every op an engine launched, with its CPU launch interval and
//! GPU interval) and [`KernelRecord`]s (every kernel the GPU ran, each correlated to its op),
//! then [`table::key_averages`], [`gaps::idle`] and [`trace::chrome_trace`]. The recording
//! itself (CUDA events around ops, CUPTI's activity records) is the cuda crate's
//! `gpukit_cuda::profiler`, the engines name their ops; [`records`] turns a recording into
//! these records and [`run`] runs `gpukit profile infer|train`.

pub mod gaps;
pub mod records;
pub mod run;
pub mod table;
pub mod trace;

pub use run::{
    profile_cnn_train, profile_infer, profile_onnx, profile_train, InferWorkload, ProfileOptions,
    ProfileReport,
};

use serde::{Deserialize, Serialize};

/// A span of time in microseconds from the profile's start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub start_us: f64,
    pub dur_us: f64,
}

impl Span {
    pub fn end_us(&self) -> f64 {
        self.start_us + self.dur_us
    }
}

/// One op gpukit launched: its names, the work it describes, and when it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// `conv`, `matmul`, `max_pool`, ...
    pub name: String,
    /// The model's name for where it sits (`layer3.1.conv2`), when it has one.
    pub layer: Option<String>,
    /// Shapes and types in words (`32x256x14x14 f16 NHWC, 3x3`).
    pub detail: String,
    /// The library call or kernel behind it (`cuDNN backend engine 12`, `cuBLASLt`, `NVRTC`).
    pub library: String,
    /// The stream it was queued on.
    pub stream: u32,
    /// The host's time launching it.
    pub cpu: Span,
    /// The GPU's time on it: from its kernels' records, or from events around it.
    pub gpu: Option<Span>,
    pub flops: f64,
    /// Bytes it must move at least (inputs read once, outputs written once).
    pub bytes: f64,
    /// The element type its rate is set against (`f16`, `tf32`, ...).
    pub dtype: String,
}

/// One kernel the GPU ran (CUPTI's activity record), with the op that launched it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRecord {
    pub name: String,
    pub stream: u32,
    pub gpu: Span,
    /// Index of the launching op in the op records; None for a kernel no op claims.
    pub op: Option<usize>,
}
