//! gpukit's models. Today: the ResNet family's architecture as torchvision defines it (block
//! layout, parameter names and counts), which the inference engine and memory planner build on.

pub mod resnet;

pub use resnet::{ResNet, UnknownModel};
