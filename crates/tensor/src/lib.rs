//! gpukit's tensors: where data lives ([`Device`]), what it is ([`DType`]), and the CPU ops
//! (matrix multiply, convolution) that every GPU path is checked against.

pub mod cpu;
pub mod device;
pub mod dtype;

pub use device::{Device, DeviceSelection, ParseDeviceError};
pub use dtype::{DType, ParseDTypeError};
