//! The training engine's errors: each names what is wrong (the file, the flag's value, the
//! tensor) and says its kind, so that the CLI exits 2 for bad input and 1 otherwise.

use gpukit_types::{ErrorKind, HasKind};
use std::path::PathBuf;

/// Why training could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A data, initial-weights or checkpoint file that cannot be used as it is.
    #[error("{}: {why}", .path.display())]
    File { path: PathBuf, why: String },
    /// A setting that cannot work (a batch of 0, a learning rate that is not positive, layers
    /// that do not fit the data, ...); the message names the flag.
    #[error("{0}")]
    Setting(String),
    /// Reading or writing a file failed at the operating-system level.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The run itself failed (a non-finite loss, a wrong result).
    #[error("{0}")]
    Failed(String),
    /// The GPU, a CUDA library or a device call failed (the message names it and, for a
    /// missing library, what to install).
    #[error("{0}")]
    Cuda(#[from] gpukit_cuda::Error),
    /// The run cannot fit in this machine's memory (refused before anything was allocated).
    #[error(transparent)]
    Refused(Box<gpukit_types::resources::Refusal>),
}

impl Error {
    /// A bad file, with the reason.
    pub fn file(path: &std::path::Path, why: impl Into<String>) -> Error {
        Error::File {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::File { .. } | Error::Setting(_) => ErrorKind::BadInput,
            // a file named that is missing, a directory or not this user's to read
            Error::Io { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound
                        | std::io::ErrorKind::IsADirectory
                        | std::io::ErrorKind::NotADirectory
                        | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                ErrorKind::BadInput
            }
            Error::Io { .. } | Error::Failed(_) => ErrorKind::Failed,
            Error::Cuda(e) => e.kind(),
            Error::Refused(e) => e.kind(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<gpukit_types::resources::Refusal> for Error {
    fn from(r: gpukit_types::resources::Refusal) -> Error {
        Error::Refused(Box::new(r))
    }
}
