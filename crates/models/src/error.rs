//! The models crate's one error type. File problems keep their own detailed enum
//! ([`WeightsError`], each message naming the file and key) as a variant; everything else is a
//! variant here, and the errors of the crates below convert with `?`.

use crate::weights::WeightsError;
use gpukit_types::{ErrorKind, HasKind};

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
            | Error::TooSmall { .. } => ErrorKind::BadInput,
            Error::Cuda(e) => e.kind(),
            Error::Tensor(e) => e.kind(),
            Error::OnnxRuntime(_) => ErrorKind::Unavailable,
            Error::OutOfMemory { .. } | Error::Invalid(_) => ErrorKind::Failed,
        }
    }
}
