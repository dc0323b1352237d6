//! The models crate's one error type. File problems keep their own detailed enum
//! ([`WeightsError`], each message naming the file and key) as a variant; everything else is a
//! variant here, and the errors of the crates below convert with `?`.

use crate::resnet::ResNet;
use gpukit_types::{ErrorKind, HasKind};
use safetensors::tensor::SafeTensorError;
use std::path::PathBuf;

/// Why a model could not be loaded, folded, exported or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// A state dict that does not fold (a key is absent or has another shape than the model's).
    #[error("state dict cannot be folded: {0}")]
    Fold(String),
    /// An input the model cannot take.
    #[error("input has {got} values; a batch of {n} RGB {h}x{w} images needs {want}")]
    InputLength {
        got: usize,
        want: usize,
        n: usize,
        h: usize,
        w: usize,
    },
    #[error("input images must be at least 32x32 for a ResNet (got {h}x{w})")]
    TooSmall { h: usize, w: usize },
    #[error("{0}")]
    Cuda(#[from] gpukit_cuda::Error),
    #[error("{0}")]
    Tensor(#[from] gpukit_tensor::Error),
    /// Out of memory: the driver or a library refused, or the memory limit
    /// (`--memory-fraction`) would be passed. The figures are MiB.
    #[error(
        "out of GPU memory: {what} needs {requested_mib:.1} MiB more; {free_mib:.1} MiB of \
         {total_mib:.1} MiB are free on the device, {reserved_mib:.1} MiB are held by gpukit's \
         memory pool{}",
        limit_mib.map(|l| format!(", and gpukit may use at most {l:.1} MiB (the memory limit)"))
            .unwrap_or_default()
    )]
    OutOfMemory {
        what: String,
        requested_mib: f64,
        free_mib: f64,
        total_mib: f64,
        reserved_mib: f64,
        limit_mib: Option<f64>,
    },
    /// ONNX Runtime is missing, failed to load, or failed to run.
    #[error("{0}")]
    OnnxRuntime(String),
    /// A request the engine cannot serve (a batch of 0, a dtype it has no kernels for, ...).
    #[error("{0}")]
    Invalid(String),
    /// An ONNX model that cannot be imported (each message names the file and, where there is
    /// one, the node, its operator and the input or attribute).
    #[error(transparent)]
    Onnx(Box<OnnxError>),
    /// A graph that is not well formed, or inputs it cannot take.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

impl From<OnnxError> for Error {
    fn from(e: OnnxError) -> Self {
        Error::Onnx(Box::new(e))
    }
}

/// The models crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is running out of GPU memory: the engine's own check, or a driver, cuDNN or
    /// cuBLAS allocation that failed inside a call.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::OutOfMemory { .. } => true,
            Error::Cuda(e) => e.is_out_of_memory(),
            Error::Tensor(gpukit_tensor::Error::Cuda { source, .. }) => source.is_out_of_memory(),
            _ => false,
        }
    }
}

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Weights(_)
            | Error::Fold(_)
            | Error::InputLength { .. }
            | Error::TooSmall { .. }
            | Error::Onnx(_)
            | Error::Graph(_) => ErrorKind::BadInput,
            Error::Cuda(e) => e.kind(),
            Error::Tensor(e) => e.kind(),
            Error::OnnxRuntime(_) => ErrorKind::Unavailable,
            Error::OutOfMemory { .. } | Error::Invalid(_) => ErrorKind::Failed,
        }
    }
}

/// Why a weights file could not be loaded or saved; every message names the file and, where
/// there is one, the key, so that a bad checkpoint can be fixed without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file could not be read (absent, unreadable).
    #[error("weights file {}: cannot be read: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file (or its temporary sibling) could not be written, synced or renamed.
    #[error("weights file {}: cannot be written: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The bytes are not safetensors: truncated, corrupt, or another format altogether.
    #[error("weights file {}: is not a valid safetensors file: {source}", .path.display())]
    Format {
        path: PathBuf,
        source: SafeTensorError,
    },
    /// The safetensors library refused to encode the state dict.
    #[error("weights file {}: cannot be encoded as safetensors: {source}", .path.display())]
    Encode {
        path: PathBuf,
        source: SafeTensorError,
    },
    /// A key of the model's state dict is absent from the file.
    #[error("weights file {}: missing key {key}", .path.display())]
    MissingKey { path: PathBuf, key: String },
    /// The file holds a key the model does not have.
    #[error(
        "weights file {}: unexpected key {key} (is this a {} state_dict?)",
        .path.display(),
        .model.name()
    )]
    UnexpectedKey {
        path: PathBuf,
        key: String,
        model: ResNet,
    },
    /// A key's shape differs from the model's; `expected` is written as torchvision would
    /// (`[64, 3, 7, 7]`, or `[classes, 512]` where the class count could not be inferred).
    #[error(
        "weights file {}: key {key} has shape {found:?}, {} expects {expected}",
        .path.display(),
        .model.name()
    )]
    Shape {
        path: PathBuf,
        key: String,
        model: ResNet,
        found: Vec<usize>,
        expected: String,
    },
    /// A key's element type is not a floating-point type this loader converts.
    #[error(
        "weights file {}: key {key} has dtype {dtype}; expected F32, F16, BF16 or F64",
        .path.display()
    )]
    Dtype {
        path: PathBuf,
        key: String,
        dtype: String,
    },
    /// A key's data holds a non-finite value (after conversion to f32, so F64 values beyond
    /// f32's range count as Inf).
    #[error(
        "weights file {}: key {key} holds NaN or Inf (first at element {index})",
        .path.display()
    )]
    NonFinite {
        path: PathBuf,
        key: String,
        index: usize,
    },
    /// A stored tensor's byte length does not fit its shape and dtype.
    #[error(
        "weights file {}: key {key} has {found} bytes of data, but shape {shape:?} as {dtype} needs {expected}",
        .path.display()
    )]
    ByteLength {
        path: PathBuf,
        key: String,
        shape: Vec<usize>,
        dtype: String,
        found: usize,
        expected: usize,
    },
    /// A `Param` handed to `save_safetensors` has a value count that does not fit its shape.
    #[error(
        "weights file {}: key {key} has {found} values, but shape {shape:?} needs {expected}",
        .path.display()
    )]
    ValueCount {
        path: PathBuf,
        key: String,
        shape: Vec<usize>,
        found: usize,
        expected: usize,
    },
    /// A tensor file (an input batch, not weights) could not be read.
    #[error("{}: cannot be read: {source}", .path.display())]
    TensorRead {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A tensor file (an input batch, not weights) is not safetensors.
    #[error("{}: is not a valid safetensors file: {source}", .path.display())]
    TensorFormat {
        path: PathBuf,
        source: SafeTensorError,
    },
    /// A file of single tensors lacks the one asked for.
    #[error(
        "{}: has no tensor named {name:?} ({})",
        .path.display(),
        holding(.names)
    )]
    NoTensor {
        path: PathBuf,
        name: String,
        names: Vec<String>,
    },
    /// The class count is zero, which no classifier has; usually an empty `fc.weight`.
    #[error(
        "weights file {}: num_classes is 0 (fc.weight needs at least one row)",
        .path.display()
    )]
    NoClasses { path: PathBuf },
    /// A header names one tensor twice: the file's writer is broken, and which of the two a
    /// reader keeps is arbitrary.
    #[error("weights file {}: key {key} appears twice in the header", .path.display())]
    DuplicateKey { path: PathBuf, key: String },
}

/// Why a graph is not well formed, or cannot run on the inputs given: the node (its name and
/// operator) or graph input at fault, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    /// A node whose inputs, attributes or outputs do not fit together.
    #[error("node {node} ({op}): {problem}")]
    Node {
        node: String,
        op: String,
        problem: String,
    },
    /// A graph input that is missing, or of another shape or type than the graph's.
    #[error("input {input}: {problem}")]
    Input { input: String, problem: String },
    /// The graph's own structure: a value used before it is computed, an id out of range.
    #[error("graph: {0}")]
    Structure(String),
}

/// Why an ONNX model cannot be imported: the file (or `<bytes>`), then what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("ONNX model {file}: {problem}")]
pub struct OnnxError {
    /// The model's path as given, or `<bytes>` for a model read from memory.
    pub file: String,
    pub problem: OnnxProblem,
}

/// What is wrong with an ONNX model; [`OnnxError`] adds the file.
#[derive(Debug, thiserror::Error)]
pub enum OnnxProblem {
    /// The file could not be read.
    #[error("cannot be read: {0}")]
    Read(std::io::Error),
    /// The bytes are not a ModelProto (truncated, corrupt, another format).
    #[error("is not a valid ONNX protobuf: {0}")]
    Decode(String),
    /// The model has no graph.
    #[error("has no graph")]
    NoGraph,
    /// The model imports no version of the default domain's operators.
    #[error("imports no opset of the default domain (ai.onnx)")]
    NoOpset,
    /// The default domain's opset version is outside what gpukit reads.
    #[error("imports opset {version} of the default domain; gpukit reads opsets {min} to {max}")]
    Opset { version: i64, min: i64, max: i64 },
    /// A node gpukit cannot take as it is.
    #[error("node {node} ({op}): {problem}")]
    Node {
        node: String,
        op: String,
        problem: NodeProblem,
    },
    /// An initializer or constant tensor whose data cannot be read.
    #[error("tensor {tensor}: {problem}")]
    Tensor { tensor: String, problem: String },
    /// A tensor's external data file is missing, unreadable or too short.
    #[error("tensor {tensor}: external data file {}: {problem}", .file.display())]
    ExternalData {
        tensor: String,
        file: PathBuf,
        problem: String,
    },
    /// A graph input or output gpukit cannot take (type, unresolved size).
    #[error("{role} {name}: {problem}")]
    Value {
        role: &'static str,
        name: String,
        problem: String,
    },
    /// The graph built from the model is not well formed (shapes that do not fit).
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// What is wrong with one node of an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum NodeProblem {
    /// An operator gpukit does not implement.
    #[error("operator {op} is not supported; gpukit supports {supported}")]
    UnsupportedOp { op: String, supported: String },
    /// An operator of another domain than ONNX's default one.
    #[error("domain {domain:?} is not supported; gpukit reads the default domain (ai.onnx) only")]
    Domain { domain: String },
    /// A required attribute is absent.
    #[error("attribute {attribute} is required")]
    MissingAttribute { attribute: String },
    /// An attribute gpukit does not implement for this operator, or a value it does not take.
    #[error("attribute {attribute}: {problem}")]
    Attribute { attribute: String, problem: String },
    /// An input that is absent, unknown or not what the operator takes.
    #[error("input {input}: {problem}")]
    Input { input: String, problem: String },
    /// The node's inputs or outputs are not as many as the operator takes.
    #[error("{0}")]
    Arity(String),
}

/// What a file of single tensors holds, for the message that the asked-for one is absent: at
/// most eight names, then how many more.
fn holding(names: &[String]) -> String {
    const SHOWN: usize = 8;
    match names.len() {
        0 => "it holds no tensors".to_string(),
        n if n <= SHOWN => format!("it has: {}", names.join(", ")),
        n => format!(
            "it has: {}, and {} more",
            names[..SHOWN].join(", "),
            n - SHOWN
        ),
    }
}
