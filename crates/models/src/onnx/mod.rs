//! ONNX: gpukit's own reader and writer of `.onnx` models.
//!
//! To use:
//! 1. export a folded ResNet for ONNX Runtime with [`export_resnet`];
//! 2. import any supported model into gpukit's graph with [`import_file`] or [`import_bytes`]
//!    ([`ImportOptions`] gives the batch and other open sizes).
//!
//! The parts: `proto` (the `onnx.proto` messages, prost derives), `export` (a folded ResNet as
//! a ModelProto), `import` (ModelProto -> `crate::graph::Graph`), and for tests `builder` (a
//! small ONNX writer) and `fixtures` (models of the families the importer targets).

pub mod builder;
mod export;
pub mod fixtures;
mod import;
pub mod proto;

pub use export::{export_model, export_resnet};
pub use import::{
    import_bytes, import_file, import_model, ImportOptions, MAX_OPSET, MIN_OPSET, SUPPORTED_OPS,
};
pub use proto::ModelProto;
