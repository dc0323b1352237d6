//! The cuda crate's one error type: every call into the driver, cuBLAS, cuDNN, NVRTC or NVML
//! that fails becomes an [`Error`], with out-of-memory recognised where the status is read.

use crate::driver::Unavailable;
use cudarc::driver::{sys, DriverError};
use gpukit_types::{ErrorKind, HasKind};

/// A failed CUDA request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] DriverError),
    #[error("device cuda:{requested} does not exist: this machine has {count} CUDA device(s) (cuda:0..cuda:{})", count.saturating_sub(1))]
    NoSuchDevice { requested: usize, count: usize },
    #[error("{0}")]
    Unavailable(#[from] Unavailable),
    /// A library gpukit needs was not found or did not load; the message says what to install.
    #[error("{0}")]
    MissingLibrary(String),
    /// A request the caller got wrong (sizes that do not fit, overlapping buffers, ...).
    #[error("{0}")]
    Invalid(String),
    /// A cuBLAS, cuBLASLt or cuDNN call returned an error status.
    #[error("{library}: {call} failed: {status}")]
    Library {
        library: &'static str,
        call: &'static str,
        status: String,
        /// The status says that the library could not allocate memory.
        out_of_memory: bool,
    },
    #[error("cuDNN has no algorithm for this convolution ({0})")]
    NoAlgorithm(String),
    #[error("NVRTC could not compile gpukit's kernels: {0}")]
    Compile(String),
    #[error("NVML: {0}")]
    Nvml(String),
}

/// The cuda crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A library status, out-of-memory recognised from the status's own name (`*_ALLOC_FAILED`,
    /// `*_ALLOCATION_FAILED`).
    pub(crate) fn library(
        library: &'static str,
        call: &'static str,
        status: impl std::fmt::Debug,
    ) -> Error {
        let status = format!("{status:?}");
        Error::Library {
            library,
            call,
            out_of_memory: status.contains("ALLOC"),
            status,
        }
    }

    /// Whether the device (or a library on it) ran out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::Driver(d) => d.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY,
            Error::Library { out_of_memory, .. } => *out_of_memory,
            _ => false,
        }
    }
}

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::NoSuchDevice { .. } => ErrorKind::BadInput,
            Error::Unavailable(_) | Error::MissingLibrary(_) => ErrorKind::Unavailable,
            _ => ErrorKind::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_read_from_the_status() {
        assert!(
            Error::library("cuBLAS", "cublasCreate", "CUBLAS_STATUS_ALLOC_FAILED")
                .is_out_of_memory()
        );
        assert!(Error::library(
            "cuDNN",
            "cudnnFind",
            "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"
        )
        .is_out_of_memory());
        assert!(!Error::library("cuDNN", "cudnnFind", "CUDNN_STATUS_BAD_PARAM").is_out_of_memory());
        assert!(
            Error::Driver(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY))
                .is_out_of_memory()
        );
        assert_eq!(
            Error::NoSuchDevice {
                requested: 3,
                count: 1
            }
            .kind(),
            ErrorKind::BadInput
        );
        assert_eq!(
            Error::MissingLibrary("x".into()).kind(),
            ErrorKind::Unavailable
        );
    }
}
