//! The cuda crate's one error type: every call into the driver, cuBLAS, cuDNN, NVRTC or NVML
//! that fails becomes an [`Error`], with out-of-memory recognised where the status is read.

use cudarc::driver::{sys, DriverError};
use gpukit_types::{ErrorKind, HasKind};
use serde::{Deserialize, Serialize};

/// Why no GPU can be used, in words a user can act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unavailable {
    #[error("no NVIDIA driver found (libcuda.so.1 is not on this machine): {hint}")]
    NoDriver { hint: String },
    #[error("the NVIDIA driver supports CUDA {}, but this gpukit was built for CUDA {} (needs a driver of {}); rebuild with `cargo build --release --no-default-features --features cuda-12`, or update the driver", fmt_api(*driver_api), fmt_api(*required_api), if *required_api >= 13000 { "R580 or newer" } else { "R525 or newer" })]
    DriverTooOld { driver_api: i32, required_api: i32 },
    #[error("the NVIDIA driver is installed but reports no CUDA device (cuInit: {error})")]
    NoDevice { error: String },
    #[error("the NVIDIA driver failed to start: {error}")]
    InitFailed { error: String },
}

/// `13000` -> `13.0`.
pub fn fmt_api(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

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
    /// A kernel launch (or module) the typed kernel API refused (boxed: it is rare, and keeps
    /// every result of this crate small).
    #[error(transparent)]
    Kernel(Box<KernelError>),
}

impl From<KernelError> for Error {
    fn from(e: KernelError) -> Error {
        Error::Kernel(Box::new(e))
    }
}

/// A launch or a module the kernel API refused, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("kernel {kernel}: {reason}")]
    Signature { kernel: String, reason: String },
    #[error("kernel {kernel} takes {declared} arguments, {given} given")]
    Count {
        kernel: String,
        declared: usize,
        given: usize,
    },
    #[error("kernel {kernel}: argument {index} ({param}) is {declared}, {given} given")]
    Kind {
        kernel: String,
        index: usize,
        param: String,
        declared: String,
        given: String,
    },
    #[error("kernel {kernel}: argument {index} ({param}) = {value} does not fit {declared}")]
    Range {
        kernel: String,
        index: usize,
        param: String,
        value: String,
        declared: String,
    },
    #[error("kernel {kernel}: argument {index} ({param}) is struct {name} of {declared} bytes, {given} given")]
    StructSize {
        kernel: String,
        index: usize,
        param: String,
        name: String,
        declared: usize,
        given: usize,
    },
    #[error("kernel {kernel}: argument {index} ({param}) is memory of cuda:{memory}, the module is loaded on cuda:{module}")]
    Device {
        kernel: String,
        index: usize,
        param: String,
        memory: usize,
        module: usize,
    },
    #[error(
        "kernel {kernel}: the stream is on cuda:{stream}, the module is loaded on cuda:{module}"
    )]
    Stream {
        kernel: String,
        stream: usize,
        module: usize,
    },
    #[error("kernel {kernel}: {grid:?} blocks of {block:?} threads: {reason}")]
    Shape {
        kernel: String,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        reason: String,
    },
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
