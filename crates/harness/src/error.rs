//! The bench crate's one error type. Errors of the crates below convert with `?`; the rest say
//! what kind of failure they are, which decides the exit code (see [`gpukit_types::ErrorKind`]).

use gpukit_types::{ErrorKind, HasKind};
use std::path::PathBuf;

/// Why a command could not measure (a row that failed is not an error: it is reported in its
/// row, see `RowStatus`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cuda(#[from] gpukit_cuda::Error),
    #[error(transparent)]
    Tensor(#[from] gpukit_tensor::Error),
    #[error(transparent)]
    Model(#[from] gpukit_models::Error),
    #[error(transparent)]
    Train(#[from] gpukit_train::Error),
    #[error(transparent)]
    Dist(#[from] gpukit_ranks::Error),
    /// The work cannot fit in this machine's memory (the resource guard's refusal, before
    /// anything was allocated).
    #[error(transparent)]
    Refused(Box<gpukit_types::resources::Refusal>),
    /// The arguments or an input file are wrong: nothing was measured.
    #[error("{0}")]
    BadInput(String),
    /// A GPU, driver or library the request needs cannot be used; the message names what to
    /// install or fix.
    #[error("{0}")]
    Unavailable(String),
    /// The PyTorch reference could not run or answered with an error.
    #[error("{0}")]
    Peer(String),
    /// A file could not be read or written.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The timer produced no usable sample (an empty or non-finite series).
    #[error("the timer produced no usable sample")]
    NoSamples,
    /// Work that was being measured failed.
    #[error("{0}")]
    Failed(String),
    /// `monitor -- CMD`: no such program (the CLI exits 127, as shells do).
    #[error("{0}: command not found")]
    CommandNotFound(String),
}

/// The bench crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the device ran out of memory somewhere below.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::Cuda(e) => e.is_out_of_memory(),
            Error::Model(e) => e.is_out_of_memory(),
            Error::Tensor(gpukit_tensor::Error::Cuda { source, .. }) => source.is_out_of_memory(),
            _ => false,
        }
    }
}

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Cuda(e) => e.kind(),
            Error::Tensor(e) => e.kind(),
            Error::Model(e) => e.kind(),
            Error::Train(e) => e.kind(),
            Error::Dist(e) => e.kind(),
            Error::Refused(e) => e.kind(),
            Error::BadInput(_) | Error::CommandNotFound(_) => ErrorKind::BadInput,
            Error::Io { .. } => ErrorKind::BadInput,
            Error::Peer(_) | Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::NoSamples | Error::Failed(_) => ErrorKind::Failed,
        }
    }
}

impl From<gpukit_types::resources::Refusal> for Error {
    fn from(r: gpukit_types::resources::Refusal) -> Error {
        Error::Refused(Box::new(r))
    }
}
