//! gpukit's tensors: where data lives ([`Device`]), what it is ([`DType`]), the CPU ops
//! (matrix multiply, convolution) that every GPU path is checked against, and the random inputs
//! benchmarks and tests use.

pub mod cpu;
pub mod device;
pub mod dtype;
pub mod random;
pub mod tensor;

pub use device::{Device, DeviceSelection, ParseDeviceError};
pub use dtype::{DType, ParseDTypeError};
pub use tensor::{check_same_device, Devices, Tensor, TensorError};
