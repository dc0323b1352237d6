//! ONNX: gpukit's own reader and writer of `.onnx` models.
//!
//! To use:
//! 1. export a folded ResNet for ONNX Runtime with [`export_resnet`];
//! 2. import any supported model into gpukit's graph with [`import_file`] or [`import_bytes`]
//!    ([`ImportOptions`] gives the batch and other open sizes);
//! 3. or read a user's file once with [`ModelFile::read`] (its bytes for ONNX Runtime, what it
//!    declares for a report) and import it at each batch size with [`ModelFile::import`].
//!
//! The parts: `proto` (the `onnx.proto` messages, prost derives), `export` (a folded ResNet as
//! a ModelProto), `import` (ModelProto -> `crate::graph::Graph`), `file` (a model file read
//! once), and for tests `builder` (a small ONNX writer) and `fixtures` (models of the families
//! the importer targets). The last two are public, not behind `cfg(test)`: other crates' tests
//! write them to files; they are small, and a binary that does not call them links none of it.

pub mod builder;
mod export;
mod file;
pub mod fixtures;
mod import;
pub mod proto;

pub use export::{export_model, export_resnet};
pub use file::{DeclaredValue, ModelFile};
pub use import::{
    import_bytes, import_file, import_model, ImportOptions, MAX_OPSET, MIN_OPSET, SUPPORTED_OPS,
};
pub use proto::ModelProto;
