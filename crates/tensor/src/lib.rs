//! gpukit's tensors: where data lives ([`Device`]), what it is ([`DType`]), how it is laid out
//! ([`Layout`]), the [`Tensor`] the engines take and give, the codec between values and a
//! dtype's bytes, the CPU kernels (matrix multiply, convolution) every GPU path is checked
//! against, and the random inputs benchmarks and tests use.
//!
//! Unsafe code is allowed only in [`cpu`], the CPU kernels' module (SIMD and split outputs
//! written by several threads); everything else here is safe Rust.
#![deny(unsafe_code)]

pub mod codec;
pub mod cpu;
mod cuda_ops;
pub mod error;
pub mod kernels;
mod ops;
pub mod random;
mod storage;
pub mod tensor;

pub use error::{check_same_device, Error, Result};
pub use gpukit_types::{
    ConvShape, DType, Device, DeviceSelection, ErrorKind, HasKind, Layout, ParseDTypeError,
    ParseDeviceError, ParseLayoutError,
};
pub use storage::Devices;
pub use tensor::Tensor;
