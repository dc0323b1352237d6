//! gpukit's shared vocabulary, at the bottom of the workspace so that every crate above speaks
//! it: what an element is ([`DType`]), how a 4-D activation is laid out ([`Layout`]), where data
//! lives ([`Device`]), the shape of a 2-D convolution ([`ConvShape`]) and what kind of failure an
//! error is ([`ErrorKind`], which decides the process's exit code).
//!
//! To use: depend on `gpukit-types` (or on `gpukit-tensor`, which re-exports all of it); convert
//! to a library's own enums only at that library's boundary (cuBLAS, cuDNN, NVRTC: in the cuda
//! crate).
#![forbid(unsafe_code)]

pub mod conv;
pub mod device;
pub mod dtype;
pub mod error;
pub mod files;
pub mod layout;

pub use conv::ConvShape;
pub use device::{Device, DeviceSelection, ParseDeviceError};
pub use dtype::{DType, ParseDTypeError};
pub use error::{ErrorKind, HasKind};
pub use layout::{Layout, ParseLayoutError};
