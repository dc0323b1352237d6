//! gpukit's training engine: a multilayer perceptron (linear layers with ReLU between) trained
//! forward and backward, MSE and cross-entropy losses, SGD / Adam / AdamW with PyTorch's
//! update rules, data (the tutorials' presets, safetensors and CSV files, seeded shuffling,
//! a held-out part) and checkpoints that resume bit for bit. The CPU path runs on the gemm
//! crate; the GPU path ([`gpu`]) on cuBLASLt and gpukit's own kernels, from the same
//! definitions. [`cnn`] holds the CPU convolutional networks (torchvision's ResNet-18/34/50,
//! batch norm, smoothed cross-entropy, SGD with Nesterov and AdamW), the reference a GPU path
//! is to be tested against.

#![forbid(unsafe_code)]

pub mod budget;
pub mod checkpoint;
pub mod cnn;
pub mod data;
pub mod error;
pub mod export;
pub mod gpu;
pub mod loss;
pub mod model;
pub mod optim;
pub mod precision;
pub mod real;
pub mod run;

pub use error::{Error, Result};
