//! ONNX: gpukit's own reader and writer of `.onnx` models.
//!
//! To use:
//! 1. export a folded ResNet for ONNX Runtime with [`export_resnet`];
//! 2. (later parts) import a model into gpukit's graph.
//!
//! The parts: `proto` (the `onnx.proto` messages, prost derives) and `export` (a folded
//! ResNet as a ModelProto).

mod export;
pub mod proto;

pub use export::{export_model, export_resnet};
pub use proto::ModelProto;
