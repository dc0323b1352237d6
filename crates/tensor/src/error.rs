//! The tensor crate's one error type: every user error of a tensor operation is one of these,
//! never a panic.

use crate::{DType, Device};
use gpukit_types::{ErrorKind, HasKind};

/// Why a tensor operation failed. Every user error is one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The golden rule: operands must be on one device; nothing is moved implicitly.
    #[error(
        "{op}: tensors are on different devices ({left} and {right}): move one with .to(...) first"
    )]
    DeviceMismatch {
        op: &'static str,
        left: Device,
        right: Device,
    },
    #[error("{op}: shapes {left:?} and {right:?} do not fit ({expected})")]
    ShapeMismatch {
        op: &'static str,
        left: Vec<usize>,
        right: Vec<usize>,
        /// What the op needs, in words (`"equal shapes"`, `"[m, k] and [k, n]"`).
        expected: &'static str,
    },
    #[error("{op}: dtypes differ ({left} and {right}): convert one with .to_dtype(...) first")]
    DTypeMismatch {
        op: &'static str,
        left: DType,
        right: DType,
    },
    #[error("{op}: dtype {dtype} is not supported (supported: {supported})")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        supported: &'static str,
    },
    #[error("shape {shape:?} holds {expected} elements but {got} were given")]
    DataLength {
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("shape {shape:?} of {dtype} needs {expected} bytes but the buffer holds {got}")]
    ByteLength {
        shape: Vec<usize>,
        dtype: DType,
        expected: usize,
        got: usize,
    },
    #[error("shape {shape:?} of {dtype} is too large to address")]
    TooLarge { shape: Vec<usize>, dtype: DType },
    #[error("{op}: the tensor is not contiguous (shape {shape:?}, strides {strides:?}): call .contiguous() first")]
    NotContiguous {
        op: &'static str,
        shape: Vec<usize>,
        strides: Vec<usize>,
    },
    #[error("reshape: shape {from:?} ({from_numel} elements) cannot become {to:?} ({to_numel} elements)")]
    ReshapeNumel {
        from: Vec<usize>,
        to: Vec<usize>,
        from_numel: usize,
        to_numel: usize,
    },
    #[error("{op}: needs a {expected}-D tensor, got shape {shape:?}")]
    Rank {
        op: &'static str,
        expected: usize,
        shape: Vec<usize>,
    },
    #[error("{op}: axis {axis} does not exist in a {rank}-D tensor (0..{rank})")]
    Axis {
        op: &'static str,
        axis: usize,
        rank: usize,
    },
    #[error(
        "permute: {dims:?} is not a permutation of the {rank} dimensions (0..{rank}, each once)"
    )]
    InvalidPermutation { dims: Vec<usize>, rank: usize },
    #[error("{device} is not available: {reason}")]
    NoGpu { device: Device, reason: String },
    #[error("{op} on {device}: {source}")]
    Cuda {
        op: &'static str,
        device: Device,
        #[source]
        source: gpukit_cuda::Error,
    },
    #[error("{op}: the tensor is not on a CUDA device ({device})")]
    NotOnGpu { op: &'static str, device: Device },
    #[error("{op}: the tensor is not laid out densely (shape {shape:?}, strides {strides:?}): call .contiguous() or .to_nhwc() first")]
    NotDense {
        op: &'static str,
        shape: Vec<usize>,
        strides: Vec<usize>,
    },
    #[error("a view of {bytes} bytes at offset {offset} runs past a device buffer of {buffer_bytes} bytes")]
    ViewPastBuffer {
        offset: usize,
        bytes: usize,
        buffer_bytes: usize,
    },
    /// A broken internal invariant (a bug in this module), reported instead of panicking.
    #[error("tensor storage of {storage_bytes} bytes is smaller than its view needs ({needed} bytes); this is a bug in gpukit-tensor")]
    StorageTooSmall { storage_bytes: usize, needed: usize },
}

/// The tensor crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::NoGpu { .. } => ErrorKind::Unavailable,
            Error::Cuda { source, .. } => source.kind(),
            Error::StorageTooSmall { .. } => ErrorKind::Failed,
            _ => ErrorKind::BadInput,
        }
    }
}

/// `Ok` when both operands are on one device, else [`Error::DeviceMismatch`] naming both.
pub fn check_same_device(op: &'static str, left: Device, right: Device) -> Result<()> {
    if left == right {
        Ok(())
    } else {
        Err(Error::DeviceMismatch { op, left, right })
    }
}
