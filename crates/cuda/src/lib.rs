//! gpukit's only crate with unsafe code and FFI: finding CUDA libraries, the driver, devices,
//! memory, streams and graphs, cuBLAS(Lt), cuDNN, NCCL, NVML, device timing, NVRTC and the typed
//! kernel API ([`kernel`]) through which the other crates launch their own CUDA C. cudarc
//! stays inside: everything above this crate uses its own types ([`Gpu`], [`Stream`],
//! [`DeviceBuffer`], [`View`], [`Graph`]) and one error type ([`Error`]).
//!
//! To use:
//! 1. `let discovery = gpukit_cuda::loader::prepare_process();` first thing in `main`.
//! 2. `gpukit_cuda::driver::probe(&discovery)` says whether a GPU can be used and why not.
//! 3. `gpukit_cuda::Gpu::open(&discovery, 0)` for work; `timing::time_on_stream` to time it.

pub mod blas;
pub mod dnn;
pub mod driver;
pub mod error;
pub mod exit;
pub mod kernel;
pub mod libs;
pub mod loader;
pub mod lt;
pub mod memory;
pub mod nccl;
pub mod nvml;
mod nvrtc;
pub mod pattern;
pub mod profiler;
pub mod stream;
pub mod testing;
pub mod timing;
pub mod trace;
pub mod transfer;

pub use driver::Gpu;
pub use error::{Error, Result};
pub use memory::{DeviceBuffer, PoolStats, View};
pub use stream::{CapturePoint, Event, Graph, Stream};
