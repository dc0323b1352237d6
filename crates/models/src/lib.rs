//! gpukit's models: the ResNet family as torchvision defines it (block layout, state-dict names
//! and counts), its weights (safetensors, checked key by key, or a seeded initialisation), and
//! CPU inference with batch norm folded, the reference for the GPU strategies to come.

pub mod forward;
pub mod gpu;
pub mod onnx;
pub mod ort_runner;
pub mod plan;
pub mod resnet;
pub mod weights;

pub use resnet::{ResNet, UnknownModel};
