//! gpukit's tensors: where data lives ([`Device`]) and what it is ([`DType`]). Buffers, shapes and
//! ops on CPU and CUDA build on these.

pub mod device;
pub mod dtype;

pub use device::{Device, DeviceSelection, ParseDeviceError};
pub use dtype::{DType, ParseDTypeError};
