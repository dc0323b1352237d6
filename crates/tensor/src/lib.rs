//! gpukit's tensors: where data lives ([`Device`]), what it is ([`DType`]), and the CPU ops
//! (matrix multiply, convolution) that every GPU path is checked against.

pub mod cpu;
pub mod device;
pub mod dtype;
pub mod tensor;

pub use device::{Device, DeviceSelection, ParseDeviceError};
pub use dtype::{DType, ParseDTypeError};
pub use tensor::{check_same_device, Devices, Tensor, TensorError};
