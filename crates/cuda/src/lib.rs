//! gpukit's only crate with unsafe code and FFI: finding CUDA libraries, the driver, devices,
//! NVML, library versions and device timing. Everything above it is safe Rust.
//!
//! To use:
//! 1. `let discovery = gpukit_cuda::loader::prepare_process();` first thing in `main`.
//! 2. `gpukit_cuda::driver::probe(&discovery)` says whether a GPU can be used and why not.
//! 3. `gpukit_cuda::driver::Gpu::open(&discovery, 0)` for work; `timing::time_on_stream` to time it.

pub mod blas;
pub mod dnn;
pub mod dnn_graph;
pub mod driver;
pub mod kernels;
pub mod libs;
pub mod loader;
pub mod mem;
pub mod nvml;
pub mod testing;
pub mod timing;
pub mod trace;
pub mod transfer;

pub use cudarc;
