//! gpukit's models: the ResNet family as torchvision defines it (block layout, state-dict names
//! and counts), its weights (safetensors, checked key by key, or a seeded initialisation), CPU
//! inference with batch norm folded (the reference), gpukit's GPU inference engine, ONNX export
//! and ONNX Runtime as a peer.
#![forbid(unsafe_code)]

pub mod error;
pub mod forward;
pub mod gpu;
pub mod graph;
pub mod onnx;
pub mod ort_runner;
pub use gpukit_types::arena as plan;
pub mod resnet;
pub mod sums;
pub mod weights;

pub use error::{Error, Result};
pub use resnet::{ResNet, UnknownModel};
