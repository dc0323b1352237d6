//! Tensors: a buffer (host bytes, or a CUDA device buffer with the [`Gpu`] it lives on), a shape,
//! strides in elements, a [`DType`] and the [`Device`] of the buffer.
//!
//! To use:
//! 1. Build on the CPU: [`Tensor::from_f32`], [`Tensor::from_f64`], [`Tensor::from_f32_as`]
//!    (f16/bf16 storage), [`Tensor::zeros`]; or on a GPU with [`Tensor::zeros_on`].
//! 2. Move between devices with [`Tensor::to`] and a [`Devices`] registry, which opens each GPU
//!    once and shares it between tensors.
//! 3. Read back with [`Tensor::to_vec_f32`] / [`Tensor::to_bytes`], from any device.
//!
//! The golden rule: an op on tensors on different devices returns
//! [`TensorError::DeviceMismatch`] naming both devices. It never panics and never moves data on
//! its own; the caller decides where the data goes with [`Tensor::to`].
//!
//! Layouts: strides are in elements, and views ([`Tensor::permute`], [`Tensor::reshape`]) share
//! the buffer. [`Tensor::to_nhwc`] changes the physical layout of a 4-D tensor to channels-last
//! while the shape and the logical indexing stay `[n, c, h, w]`, as PyTorch's `channels_last`
//! does: only the strides say that the channel varies fastest in memory.
//!
//! Speed: the copies of [`Tensor::to`] are plain uploads and downloads. Every other operation on
//! a CUDA tensor ([`Tensor::add`], [`Tensor::matmul`], [`Tensor::contiguous`],
//! [`Tensor::to_nhwc`], [`Tensor::to_dtype`]) goes through the host today: download, compute on
//! the CPU, upload the result to the GPU of the (left) operand. That is correct, not fast; the
//! GPU kernels of gpukit live in the engine (gpukit-models), not here.

use crate::{DType, Device};
use gpukit_cuda::blas::DeviceBytes;
use gpukit_cuda::driver::{CudaError, Gpu};
use gpukit_cuda::loader::Discovery;
use half::{bf16, f16};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Why a tensor operation failed. Every user error is one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
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
        source: CudaError,
    },
    /// A broken internal invariant (a bug in this module), reported instead of panicking.
    #[error("tensor storage of {storage_bytes} bytes is smaller than its view needs ({needed} bytes); this is a bug in gpukit-tensor")]
    StorageTooSmall { storage_bytes: usize, needed: usize },
}

/// `Ok` when both operands are on one device, else [`TensorError::DeviceMismatch`] naming both.
pub fn check_same_device(op: &'static str, left: Device, right: Device) -> Result<(), TensorError> {
    if left == right {
        Ok(())
    } else {
        Err(TensorError::DeviceMismatch { op, left, right })
    }
}

/// Row-major ("contiguous") strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    strides
}

/// Channels-last strides of a 4-D `[n, c, h, w]` shape: `[h*w*c, 1, w*c, c]`; None for other ranks.
pub fn nhwc_strides(shape: &[usize]) -> Option<Vec<usize>> {
    match *shape {
        [_, c, h, w] => Some(vec![
            h.saturating_mul(w).saturating_mul(c),
            1,
            w.saturating_mul(c),
            c,
        ]),
        _ => None,
    }
}

fn numel_of(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Elements count and byte size of a contiguous `shape` of `dtype`, or `TooLarge`.
fn sizes(shape: &[usize], dtype: DType) -> Result<(usize, usize), TensorError> {
    numel_of(shape)
        .and_then(|n| Some((n, n.checked_mul(dtype.size_bytes())?)))
        .ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
            dtype,
        })
}

/// Elements of storage a strided view reaches: 1 + the largest offset (0 when empty).
fn span(shape: &[usize], strides: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().zip(strides).try_fold(1usize, |acc, (&d, &s)| {
        acc.checked_add((d - 1).checked_mul(s)?)
    })
}

/// Where a tensor's bytes are.
#[derive(Clone)]
enum Storage {
    Host(Arc<Vec<u8>>),
    Cuda {
        gpu: Arc<Gpu>,
        buf: Arc<DeviceBytes>,
        /// Bytes that belong to the tensor (the buffer has at least one, as CUDA allocates no
        /// empty buffers).
        len: usize,
    },
}

impl Storage {
    /// The storage's bytes on the host (a download for CUDA storage).
    fn host(&self) -> Result<Cow<'_, [u8]>, TensorError> {
        match self {
            Storage::Host(v) => Ok(Cow::Borrowed(v.as_slice())),
            Storage::Cuda { gpu, buf, len } => {
                if *len == 0 {
                    return Ok(Cow::Owned(Vec::new()));
                }
                let mut bytes = gpu.download(buf).map_err(|source| TensorError::Cuda {
                    op: "download",
                    device: Device::Cuda(gpu.ordinal),
                    source,
                })?;
                if bytes.len() < *len {
                    return Err(TensorError::StorageTooSmall {
                        storage_bytes: bytes.len(),
                        needed: *len,
                    });
                }
                bytes.truncate(*len);
                Ok(Cow::Owned(bytes))
            }
        }
    }

    /// New storage holding `bytes`, on the host or on `gpu`.
    fn upload(gpu: Arc<Gpu>, bytes: &[u8]) -> Result<Storage, TensorError> {
        let device = Device::Cuda(gpu.ordinal);
        let buf = if bytes.is_empty() {
            gpu.alloc(1)
        } else {
            gpu.upload(bytes)
        }
        .map_err(|source| TensorError::Cuda {
            op: "upload",
            device,
            source,
        })?;
        Ok(Storage::Cuda {
            gpu,
            buf: Arc::new(buf),
            len: bytes.len(),
        })
    }

    /// New storage on the same device as `self`, holding `bytes`.
    fn alike(&self, bytes: Vec<u8>) -> Result<Storage, TensorError> {
        match self {
            Storage::Host(_) => Ok(Storage::Host(Arc::new(bytes))),
            Storage::Cuda { gpu, .. } => Storage::upload(gpu.clone(), &bytes),
        }
    }
}

/// Opens each GPU once (from the process's [`Discovery`]) and shares it between tensors.
pub struct Devices {
    discovery: Option<Discovery>,
    open: Mutex<BTreeMap<usize, Arc<Gpu>>>,
}

impl Devices {
    /// A registry that opens GPUs on first use.
    pub fn new(discovery: Discovery) -> Devices {
        Devices {
            discovery: Some(discovery),
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// A registry without CUDA: asking it for a GPU is a [`TensorError::NoGpu`] (unless one was
    /// [`adopt`](Devices::adopt)ed).
    pub fn cpu_only() -> Devices {
        Devices {
            discovery: None,
            open: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Arc<Gpu>>> {
        // The map stays consistent even if a holder panicked: entries are inserted whole.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a GPU opened elsewhere, so tensors moved to its ordinal use it. Returns the GPU
    /// registered for that ordinal (an earlier one is kept).
    pub fn adopt(&self, gpu: Arc<Gpu>) -> Arc<Gpu> {
        self.lock().entry(gpu.ordinal).or_insert(gpu).clone()
    }

    /// The GPU `cuda:<ordinal>`, opened on first use.
    pub fn gpu(&self, ordinal: usize) -> Result<Arc<Gpu>, TensorError> {
        let device = Device::Cuda(ordinal);
        let mut open = self.lock();
        if let Some(g) = open.get(&ordinal) {
            return Ok(g.clone());
        }
        let Some(discovery) = &self.discovery else {
            return Err(TensorError::NoGpu {
                device,
                reason: "this registry was made with Devices::cpu_only(); make it with Devices::new(discovery)".into(),
            });
        };
        let gpu = Arc::new(
            Gpu::open(discovery, ordinal).map_err(|source| TensorError::Cuda {
                op: "open",
                device,
                source,
            })?,
        );
        open.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    /// The ordinals opened (or adopted) so far.
    pub fn open_ordinals(&self) -> Vec<usize> {
        self.lock().keys().copied().collect()
    }
}

impl fmt::Debug for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Devices")
            .field("cuda", &self.discovery.is_some())
            .field("open", &self.open_ordinals())
            .finish()
    }
}

/// An n-dimensional array on a device. Cloning is cheap: clones and views share the buffer,
/// which is never written after it is made (every op returns a new tensor).
#[derive(Clone)]
pub struct Tensor {
    storage: Storage,
    shape: Vec<usize>,
    /// In elements; one per dimension.
    strides: Vec<usize>,
    dtype: DType,
    device: Device,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .finish()
    }
}

// Element encoding. Bytes are in the machine's order, which is what the GPU reads.

fn bytes_of<const N: usize>(c: &[u8]) -> [u8; N] {
    c.try_into().unwrap_or([0; N])
}

/// Values of `dtype` storage as f64 (exact for every dtype).
fn decode_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    let es = dtype.size_bytes();
    let chunks = bytes.chunks_exact(es);
    match dtype {
        DType::F64 => chunks.map(|c| f64::from_ne_bytes(bytes_of(c))).collect(),
        DType::F32 | DType::Tf32 => chunks
            .map(|c| f64::from(f32::from_ne_bytes(bytes_of(c))))
            .collect(),
        DType::F16 => chunks
            .map(|c| f16::from_bits(u16::from_ne_bytes(bytes_of(c))).to_f64())
            .collect(),
        DType::Bf16 => chunks
            .map(|c| bf16::from_bits(u16::from_ne_bytes(bytes_of(c))).to_f64())
            .collect(),
    }
}

/// Values of `dtype` storage as f32 (f64 rounded to nearest).
fn decode_f32(bytes: &[u8], dtype: DType) -> Vec<f32> {
    let es = dtype.size_bytes();
    let chunks = bytes.chunks_exact(es);
    match dtype {
        DType::F64 => chunks
            .map(|c| f64::from_ne_bytes(bytes_of(c)) as f32)
            .collect(),
        DType::F32 | DType::Tf32 => chunks.map(|c| f32::from_ne_bytes(bytes_of(c))).collect(),
        DType::F16 => chunks
            .map(|c| f16::from_bits(u16::from_ne_bytes(bytes_of(c))).to_f32())
            .collect(),
        DType::Bf16 => chunks
            .map(|c| bf16::from_bits(u16::from_ne_bytes(bytes_of(c))).to_f32())
            .collect(),
    }
}

/// `v` rounded to f32 "to odd": exact values stay, inexact ones become the neighbour whose last
/// bit is odd. Rounding that to nearest in a format of at most 22 significant bits (f16, bf16)
/// gives the correctly rounded value of `v` itself; half's own f64 conversions do not (they
/// drop the low mantissa bits or round through f32 first).
fn f64_to_f32_round_odd(v: f64) -> f32 {
    let r = v as f32;
    if v.is_nan() || f64::from(r) == v || r.to_bits() & 1 == 1 {
        return r;
    }
    // r is the even neighbour: step one unit of the magnitude toward v (an infinity steps to
    // the largest finite value, a zero to the smallest subnormal, signs kept).
    let bits = if f64::from(r).abs() > v.abs() {
        r.to_bits() - 1
    } else {
        r.to_bits() + 1
    };
    f32::from_bits(bits)
}

/// `values` stored as `dtype`, each rounded once to nearest (ties to even).
fn encode_f64(values: &[f64], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F64 => values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::F32 | DType::Tf32 => values
            .iter()
            .flat_map(|&v| (v as f32).to_ne_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| {
                f16::from_f32(f64_to_f32_round_odd(v))
                    .to_bits()
                    .to_ne_bytes()
            })
            .collect(),
        DType::Bf16 => values
            .iter()
            .flat_map(|&v| {
                bf16::from_f32(f64_to_f32_round_odd(v))
                    .to_bits()
                    .to_ne_bytes()
            })
            .collect(),
    }
}

fn encode_f32(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F64 => values
            .iter()
            .flat_map(|&v| f64::from(v).to_ne_bytes())
            .collect(),
        DType::F32 | DType::Tf32 => values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_ne_bytes())
            .collect(),
        DType::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_bits().to_ne_bytes())
            .collect(),
    }
}

/// The elements of a strided view of `src`, in logical (row-major) order.
fn gather(
    src: &[u8],
    shape: &[usize],
    strides: &[usize],
    elem: usize,
) -> Result<Vec<u8>, TensorError> {
    let too_small = |needed| TensorError::StorageTooSmall {
        storage_bytes: src.len(),
        needed,
    };
    let numel = numel_of(shape).ok_or_else(|| too_small(usize::MAX))?;
    let needed = span(shape, strides)
        .and_then(|s| s.checked_mul(elem))
        .ok_or_else(|| too_small(usize::MAX))?;
    if src.len() < needed || shape.len() != strides.len() {
        return Err(too_small(needed));
    }
    let mut out = Vec::with_capacity(numel.saturating_mul(elem));
    if numel == 0 {
        return Ok(out);
    }
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0usize;
    for _ in 0..numel {
        let start = offset * elem;
        let bytes = src
            .get(start..start + elem)
            .ok_or_else(|| too_small(start + elem))?;
        out.extend_from_slice(bytes);
        // Next index, last dimension fastest; `offset` stays sum(index * strides).
        for ((i, &d), &s) in index.iter_mut().zip(shape).zip(strides).rev() {
            *i += 1;
            offset += s;
            if *i < d {
                break;
            }
            offset -= s * d;
            *i = 0;
        }
    }
    Ok(out)
}

impl Tensor {
    // ---- construction ----

    /// A contiguous CPU tensor of `dtype` from its bytes (machine byte order, row-major).
    pub fn from_bytes(
        shape: &[usize],
        dtype: DType,
        bytes: Vec<u8>,
    ) -> Result<Tensor, TensorError> {
        let (_, expected) = sizes(shape, dtype)?;
        if bytes.len() != expected {
            return Err(TensorError::ByteLength {
                shape: shape.to_vec(),
                dtype,
                expected,
                got: bytes.len(),
            });
        }
        Ok(Tensor {
            storage: Storage::Host(Arc::new(bytes)),
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            dtype,
            device: Device::Cpu,
        })
    }

    fn check_len(shape: &[usize], dtype: DType, got: usize) -> Result<(), TensorError> {
        let (expected, _) = sizes(shape, dtype)?;
        if got == expected {
            Ok(())
        } else {
            Err(TensorError::DataLength {
                shape: shape.to_vec(),
                expected,
                got,
            })
        }
    }

    /// An f32 CPU tensor; `data` is in row-major order and must hold exactly `numel` values.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor, TensorError> {
        Tensor::from_f32_as(shape, &data, DType::F32)
    }

    /// An f64 CPU tensor (for references); `data` must hold exactly `numel` values.
    pub fn from_f64(shape: &[usize], data: Vec<f64>) -> Result<Tensor, TensorError> {
        Tensor::from_f64_as(shape, &data, DType::F64)
    }

    /// A CPU tensor stored as `dtype` from f32 values, each rounded to nearest (f16, bf16).
    pub fn from_f32_as(shape: &[usize], data: &[f32], dtype: DType) -> Result<Tensor, TensorError> {
        Tensor::check_len(shape, dtype, data.len())?;
        Tensor::from_bytes(shape, dtype, encode_f32(data, dtype))
    }

    /// A CPU tensor stored as `dtype` from f64 values, each rounded once to nearest.
    pub fn from_f64_as(shape: &[usize], data: &[f64], dtype: DType) -> Result<Tensor, TensorError> {
        Tensor::check_len(shape, dtype, data.len())?;
        Tensor::from_bytes(shape, dtype, encode_f64(data, dtype))
    }

    /// A CPU tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor, TensorError> {
        let (_, bytes) = sizes(shape, dtype)?;
        Tensor::from_bytes(shape, dtype, vec![0; bytes])
    }

    /// A tensor of zeros on `device` (allocated there: nothing is uploaded).
    pub fn zeros_on(
        shape: &[usize],
        dtype: DType,
        device: Device,
        devices: &Devices,
    ) -> Result<Tensor, TensorError> {
        let Device::Cuda(ordinal) = device else {
            return Tensor::zeros(shape, dtype);
        };
        let (_, bytes) = sizes(shape, dtype)?;
        let gpu = devices.gpu(ordinal)?;
        let buf = gpu
            .alloc(bytes.max(1))
            .map_err(|source| TensorError::Cuda {
                op: "alloc",
                device,
                source,
            })?;
        Ok(Tensor {
            storage: Storage::Cuda {
                gpu,
                buf: Arc::new(buf),
                len: bytes,
            },
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            dtype,
            device,
        })
    }

    /// A contiguous tensor over a device buffer made elsewhere on `gpu` (for example by a
    /// kernel). The buffer must hold at least the tensor's bytes.
    pub fn from_device_bytes(
        gpu: Arc<Gpu>,
        buf: DeviceBytes,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor, TensorError> {
        let (_, expected) = sizes(shape, dtype)?;
        if buf.len() < expected {
            return Err(TensorError::ByteLength {
                shape: shape.to_vec(),
                dtype,
                expected,
                got: buf.len(),
            });
        }
        let device = Device::Cuda(gpu.ordinal);
        Ok(Tensor {
            storage: Storage::Cuda {
                gpu,
                buf: Arc::new(buf),
                len: expected,
            },
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            dtype,
            device,
        })
    }

    /// A tensor on the same device as `self`, contiguous unless `strides` says otherwise.
    fn alike(
        &self,
        bytes: Vec<u8>,
        shape: Vec<usize>,
        strides: Vec<usize>,
        dtype: DType,
    ) -> Result<Tensor, TensorError> {
        Ok(Tensor {
            storage: self.storage.alike(bytes)?,
            shape,
            strides,
            dtype,
            device: self.device,
        })
    }

    // ---- facts ----

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a 0-D tensor).
    pub fn numel(&self) -> usize {
        // Checked at construction; shapes only change by permutation or equal-numel reshape.
        numel_of(&self.shape).unwrap_or(usize::MAX)
    }

    /// Bytes of the elements (numel * element size), whatever the layout.
    pub fn bytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size_bytes())
    }

    /// The GPU the buffer lives on, for CUDA tensors.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        match &self.storage {
            Storage::Cuda { gpu, .. } => Some(gpu),
            Storage::Host(_) => None,
        }
    }

    /// The device buffer, for CUDA tensors (read it through [`Tensor::strides`]).
    pub fn device_buffer(&self) -> Option<&DeviceBytes> {
        match &self.storage {
            Storage::Cuda { buf, .. } => Some(buf),
            Storage::Host(_) => None,
        }
    }

    /// The host buffer, for CPU tensors (read it through [`Tensor::strides`]).
    pub fn host_storage(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Host(v) => Some(v),
            Storage::Cuda { .. } => None,
        }
    }

    /// Row-major with no gaps (dimensions of size 1 may have any stride, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let want = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(&self.strides)
            .zip(&want)
            .all(|((&d, &s), &w)| d == 1 || s == w)
    }

    /// A 4-D tensor in channels-last layout: strides exactly `[h*w*c, 1, w*c, c]`.
    pub fn is_nhwc(&self) -> bool {
        nhwc_strides(&self.shape).is_some_and(|s| s == self.strides)
    }

    // ---- reading back ----

    /// The elements' bytes in logical (row-major) order, from any device.
    pub fn to_bytes(&self) -> Result<Vec<u8>, TensorError> {
        let storage = self.storage.host()?;
        let elem = self.dtype.size_bytes();
        if self.is_contiguous() {
            let n = self.bytes();
            return storage
                .get(..n)
                .map(<[u8]>::to_vec)
                .ok_or(TensorError::StorageTooSmall {
                    storage_bytes: storage.len(),
                    needed: n,
                });
        }
        gather(&storage, &self.shape, &self.strides, elem)
    }

    /// The values as f32 in logical order, from any device and dtype (f64 rounds to nearest).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>, TensorError> {
        Ok(decode_f32(&self.to_bytes()?, self.dtype))
    }

    /// The values as f64 in logical order (exact for every dtype).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>, TensorError> {
        Ok(decode_f64(&self.to_bytes()?, self.dtype))
    }

    // ---- moving and converting ----

    /// This tensor on `device`, layout (strides) kept. The same device gives a cheap clone that
    /// shares the buffer; cpu -> cuda uploads, cuda -> cpu downloads, cuda:a -> cuda:b goes
    /// through the host.
    pub fn to(&self, device: Device, devices: &Devices) -> Result<Tensor, TensorError> {
        if device == self.device {
            return Ok(self.clone());
        }
        let bytes = self.storage.host()?;
        let storage = match device {
            Device::Cpu => Storage::Host(Arc::new(bytes.into_owned())),
            Device::Cuda(ordinal) => Storage::upload(devices.gpu(ordinal)?, &bytes)?,
        };
        Ok(Tensor {
            storage,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            dtype: self.dtype,
            device,
        })
    }

    /// This tensor stored as `dtype` on the same device, each value rounded once to nearest.
    /// f32 <-> tf32 only relabels (tf32 is f32 storage). The result is contiguous.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor, TensorError> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        let storage_alike = |d: DType| matches!(d, DType::F32 | DType::Tf32);
        if storage_alike(dtype) && storage_alike(self.dtype) {
            return Ok(Tensor {
                dtype,
                ..self.clone()
            });
        }
        sizes(&self.shape, dtype)?;
        let bytes = encode_f64(&self.to_vec_f64()?, dtype);
        self.alike(
            bytes,
            self.shape.clone(),
            contiguous_strides(&self.shape),
            dtype,
        )
    }

    // ---- layouts ----

    /// A contiguous (row-major) tensor with the same values: `self` when already contiguous,
    /// else a copy on the same device.
    pub fn contiguous(&self) -> Result<Tensor, TensorError> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let bytes = self.to_bytes()?;
        self.alike(
            bytes,
            self.shape.clone(),
            contiguous_strides(&self.shape),
            self.dtype,
        )
    }

    /// A view with the dimensions reordered: dimension `i` of the result is `dims[i]` of `self`.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor, TensorError> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        let valid = dims.len() == rank
            && dims.iter().all(|&d| match seen.get_mut(d) {
                Some(s) if !*s => {
                    *s = true;
                    true
                }
                _ => false,
            });
        if !valid {
            return Err(TensorError::InvalidPermutation {
                dims: dims.to_vec(),
                rank,
            });
        }
        let pick = |v: &[usize]| dims.iter().filter_map(|&d| v.get(d).copied()).collect();
        Ok(Tensor {
            shape: pick(&self.shape),
            strides: pick(&self.strides),
            ..self.clone()
        })
    }

    /// A view with a new shape of the same number of elements; the tensor must be contiguous
    /// (call [`Tensor::contiguous`] first otherwise).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let from_numel = self.numel();
        let to_numel = numel_of(shape).ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
            dtype: self.dtype,
        })?;
        if from_numel != to_numel {
            return Err(TensorError::ReshapeNumel {
                from: self.shape.clone(),
                to: shape.to_vec(),
                from_numel,
                to_numel,
            });
        }
        if !self.is_contiguous() {
            return Err(TensorError::NotContiguous {
                op: "reshape",
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            ..self.clone()
        })
    }

    fn require_rank(&self, op: &'static str, expected: usize) -> Result<(), TensorError> {
        if self.rank() == expected {
            Ok(())
        } else {
            Err(TensorError::Rank {
                op,
                expected,
                shape: self.shape.clone(),
            })
        }
    }

    /// The 4-D `[n, c, h, w]` tensor laid out channels-last in memory: shape and logical
    /// indexing unchanged, strides `[h*w*c, 1, w*c, c]`. `self` when already so; else a copy
    /// on the same device.
    pub fn to_nhwc(&self) -> Result<Tensor, TensorError> {
        self.require_rank("to_nhwc", 4)?;
        if self.is_nhwc() {
            return Ok(self.clone());
        }
        // [n, h, w, c] in logical order is NHWC in memory.
        let bytes = self.permute(&[0, 2, 3, 1])?.to_bytes()?;
        let strides = nhwc_strides(&self.shape).unwrap_or_default();
        self.alike(bytes, self.shape.clone(), strides, self.dtype)
    }

    /// The 4-D tensor laid out NCHW (row-major) in memory: [`Tensor::contiguous`] for 4-D.
    pub fn to_nchw(&self) -> Result<Tensor, TensorError> {
        self.require_rank("to_nchw", 4)?;
        self.contiguous()
    }

    // ---- ops ----

    fn check_binary(&self, op: &'static str, other: &Tensor) -> Result<(), TensorError> {
        check_same_device(op, self.device, other.device)?;
        if self.dtype != other.dtype {
            return Err(TensorError::DTypeMismatch {
                op,
                left: self.dtype,
                right: other.dtype,
            });
        }
        Ok(())
    }

    /// Elementwise `self + other`: same device, dtype and shape; any layouts. Each sum is
    /// rounded once to the dtype (computed in f64, which is exact before that rounding for
    /// f32/f16/bf16 operands, so results equal native addition). Contiguous result on the
    /// device of the operands (CUDA operands go through the host; see the module docs).
    pub fn add(&self, other: &Tensor) -> Result<Tensor, TensorError> {
        self.check_binary("add", other)?;
        if self.shape != other.shape {
            return Err(TensorError::ShapeMismatch {
                op: "add",
                left: self.shape.clone(),
                right: other.shape.clone(),
                expected: "equal shapes",
            });
        }
        let a = self.to_vec_f64()?;
        let b = other.to_vec_f64()?;
        let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        self.alike(
            encode_f64(&sum, self.dtype),
            self.shape.clone(),
            contiguous_strides(&self.shape),
            self.dtype,
        )
    }

    /// `self (m x k) * other (k x n)` for 2-D f64, f32 or tf32 tensors (tf32 computes in full
    /// f32 here), through the CPU reference matmul ([`crate::cpu`]). Same device and dtype
    /// required; CUDA operands go through the host (see the module docs).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor, TensorError> {
        self.check_binary("matmul", other)?;
        let (&[m, k], &[k2, n]) = (self.shape.as_slice(), other.shape.as_slice()) else {
            let bad = if self.rank() != 2 { self } else { other };
            return Err(TensorError::Rank {
                op: "matmul",
                expected: 2,
                shape: bad.shape.clone(),
            });
        };
        if k != k2 {
            return Err(TensorError::ShapeMismatch {
                op: "matmul",
                left: self.shape.clone(),
                right: other.shape.clone(),
                expected: "[m, k] and [k, n]",
            });
        }
        let out_shape = vec![m, n];
        let (mn, _) = sizes(&out_shape, self.dtype)?;
        let bytes = match self.dtype {
            DType::F64 => {
                let mut c = vec![0f64; mn];
                if mn > 0 && k > 0 {
                    let (a, b) = (self.to_vec_f64()?, other.to_vec_f64()?);
                    crate::cpu::matmul_f64(&a, &b, &mut c, m, n, k);
                }
                encode_f64(&c, DType::F64)
            }
            DType::F32 | DType::Tf32 => {
                let mut c = vec![0f32; mn];
                if mn > 0 && k > 0 {
                    let (a, b) = (self.to_vec_f32()?, other.to_vec_f32()?);
                    crate::cpu::matmul_f32(&a, &b, &mut c, m, n, k);
                }
                encode_f32(&c, DType::F32)
            }
            dtype => {
                return Err(TensorError::UnsupportedDType {
                    op: "matmul",
                    dtype,
                    supported: "f64, f32, tf32",
                })
            }
        };
        let strides = contiguous_strides(&out_shape);
        self.alike(bytes, out_shape, strides, self.dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::{fresh_seed, uniform_f32 as random};

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn construction_checks_lengths() {
        let t = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.strides(), &[3, 1]);
        assert_eq!((t.numel(), t.bytes(), t.rank()), (6, 24, 2));
        assert_eq!(t.device(), Device::Cpu);
        assert_eq!(t.dtype(), DType::F32);
        assert!(t.is_contiguous());

        let e = Tensor::from_f32(&[2, 3], iota(5)).unwrap_err();
        assert!(matches!(
            e,
            TensorError::DataLength {
                expected: 6,
                got: 5,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "shape [2, 3] holds 6 elements but 5 were given"
        );
        let e = Tensor::from_bytes(&[2], DType::F16, vec![0; 3]).unwrap_err();
        assert!(e.to_string().contains("needs 4 bytes"), "{e}");
        let e = Tensor::zeros(&[usize::MAX, 2], DType::F32).unwrap_err();
        assert!(matches!(e, TensorError::TooLarge { .. }), "{e}");
        let e = Tensor::from_f64(&[1 << 62, 4], vec![]).unwrap_err();
        assert!(matches!(e, TensorError::TooLarge { .. }), "{e}");

        // 0-D and empty tensors
        let s = Tensor::from_f64(&[], vec![2.5]).unwrap();
        assert_eq!((s.numel(), s.to_vec_f32().unwrap()), (1, vec![2.5]));
        let z = Tensor::zeros(&[0, 3], DType::Bf16).unwrap();
        assert_eq!((z.numel(), z.bytes()), (0, 0));
        assert!(z.to_vec_f32().unwrap().is_empty());
        assert!(z.permute(&[1, 0]).unwrap().contiguous().is_ok());
        let zz = Tensor::zeros(&[2, 2], DType::F64).unwrap();
        assert_eq!(zz.to_vec_f64().unwrap(), vec![0.0; 4]);
    }

    #[test]
    fn nhwc_and_nchw_strides() {
        let (n, c, h, w) = (2, 3, 4, 5);
        let t = Tensor::from_f32(&[n, c, h, w], iota(n * c * h * w)).unwrap();
        assert_eq!(t.strides(), &[60, 20, 5, 1]);
        assert!(t.is_contiguous() && !t.is_nhwc());
        let l = t.to_nhwc().unwrap();
        assert_eq!(l.shape(), &[2, 3, 4, 5]);
        assert_eq!(l.strides(), &[h * w * c, 1, w * c, c]);
        assert_eq!(l.strides(), &[60, 1, 15, 3]);
        assert!(l.is_nhwc() && !l.is_contiguous());
        assert_eq!(nhwc_strides(&[1, 2, 3]), None);
        // to_nhwc of an NHWC tensor is itself; to_nchw goes back
        assert_eq!(l.to_nhwc().unwrap().strides(), l.strides());
        let back = l.to_nchw().unwrap();
        assert!(back.is_contiguous());
        assert_eq!(back.host_storage(), t.host_storage());
        let e = Tensor::zeros(&[2, 3], DType::F32)
            .unwrap()
            .to_nhwc()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "to_nhwc: needs a 4-D tensor, got shape [2, 3]"
        );
    }

    #[test]
    fn to_nhwc_keeps_logical_values_and_moves_memory() {
        let seed = fresh_seed();
        let (n, c, h, w) = (2, 3, 5, 7);
        let x = random(n * c * h * w, seed);
        let t = Tensor::from_f32(&[n, c, h, w], x.clone()).unwrap();
        let l = t.to_nhwc().unwrap();
        assert_eq!(l.to_vec_f32().unwrap(), x, "seed {seed}");
        // memory is NHWC: element (ni, ci, hi, wi) at ((ni*h + hi)*w + wi)*c + ci
        let mem = decode_f32(l.host_storage().unwrap(), DType::F32);
        for ni in 0..n {
            for ci in 0..c {
                for hi in 0..h {
                    for wi in 0..w {
                        let logical = ((ni * c + ci) * h + hi) * w + wi;
                        let physical = ((ni * h + hi) * w + wi) * c + ci;
                        assert_eq!(mem[physical], x[logical], "seed {seed}");
                    }
                }
            }
        }
        // ops on channels-last tensors read them logically
        let s = l.add(&t).unwrap();
        let want: Vec<f32> = x.iter().map(|v| v + v).collect();
        assert_eq!(s.to_vec_f32().unwrap(), want);
    }

    #[test]
    fn contiguous_of_a_permuted_tensor_matches_a_hand_computed_result() {
        // [[0, 1, 2], [3, 4, 5]] transposed
        let t = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
        let p = t.permute(&[1, 0]).unwrap();
        assert_eq!(p.shape(), &[3, 2]);
        assert_eq!(p.strides(), &[1, 3]);
        assert!(!p.is_contiguous());
        assert_eq!(
            p.host_storage(),
            t.host_storage(),
            "a view shares the buffer"
        );
        let c = p.contiguous().unwrap();
        assert!(c.is_contiguous());
        assert_eq!(c.strides(), &[2, 1]);
        assert_eq!(c.to_vec_f32().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(
            decode_f32(c.host_storage().unwrap(), DType::F32),
            vec![0., 3., 1., 4., 2., 5.]
        );

        // [2, 3, 2] with element (i, j, k) = 6i + 2j + k, permuted to (k, i, j)
        let t = Tensor::from_f32(&[2, 3, 2], iota(12)).unwrap();
        let p = t.permute(&[2, 0, 1]).unwrap();
        assert_eq!(p.shape(), &[2, 2, 3]);
        assert_eq!(p.strides(), &[1, 6, 2]);
        assert_eq!(
            p.contiguous().unwrap().to_vec_f32().unwrap(),
            vec![0., 2., 4., 6., 8., 10., 1., 3., 5., 7., 9., 11.]
        );
        // permuting back is the original, without a copy
        let q = p.permute(&[1, 2, 0]).unwrap();
        assert!(q.is_contiguous());
        assert_eq!(q.to_vec_f32().unwrap(), iota(12));
    }

    #[test]
    fn permute_and_reshape_reject_bad_input() {
        let t = Tensor::from_f32(&[2, 3, 4], iota(24)).unwrap();
        for bad in [&[0, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 3]] {
            let e = t.permute(bad).unwrap_err();
            assert!(
                matches!(&e, TensorError::InvalidPermutation { rank: 3, dims } if dims == bad),
                "{e}"
            );
        }
        let r = t.reshape(&[6, 4]).unwrap();
        assert_eq!((r.shape(), r.strides()), (&[6, 4][..], &[4, 1][..]));
        assert_eq!(r.to_vec_f32().unwrap(), iota(24));
        let e = t.reshape(&[5, 5]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "reshape: shape [2, 3, 4] (24 elements) cannot become [5, 5] (25 elements)"
        );
        let p = t.permute(&[2, 1, 0]).unwrap();
        let e = p.reshape(&[24]).unwrap_err();
        assert!(matches!(
            e,
            TensorError::NotContiguous { op: "reshape", .. }
        ));
        assert!(e.to_string().contains(".contiguous()"), "{e}");
        assert!(t.reshape(&[usize::MAX, 3]).is_err());
        // size-1 dimensions do not break contiguity
        let one = t.reshape(&[2, 1, 12]).unwrap().permute(&[1, 0, 2]).unwrap();
        assert!(one.is_contiguous());
        assert_eq!(one.reshape(&[24]).unwrap().to_vec_f32().unwrap(), iota(24));
    }

    #[test]
    fn dtype_round_trips_within_precision() {
        let seed = fresh_seed();
        let x: Vec<f32> = random(1000, seed).iter().map(|v| v * 100.0).collect();
        let t = Tensor::from_f32(&[10, 100], x.clone()).unwrap();
        for (dtype, rel) in [
            (DType::F16, 2f32.powi(-11)),
            (DType::Bf16, 2f32.powi(-8)),
            (DType::F64, 0.0),
            (DType::Tf32, 0.0),
            (DType::F32, 0.0),
        ] {
            let h = t.to_dtype(dtype).unwrap();
            assert_eq!(h.dtype(), dtype);
            assert_eq!(h.bytes(), 1000 * dtype.size_bytes());
            let back = h.to_vec_f32().unwrap();
            for (b, v) in back.iter().zip(&x) {
                // f16 subnormals (below 2^-14) are spaced 2^-24 apart
                let abs = if dtype == DType::F16 {
                    2f32.powi(-25)
                } else {
                    0.0
                };
                assert!(
                    (b - v).abs() <= v.abs() * rel + abs,
                    "{dtype}: {v} came back as {b} (seed {seed})"
                );
            }
            // from_f32_as stores what half's conversion gives
            let direct = Tensor::from_f32_as(&[10, 100], &x, dtype).unwrap();
            assert_eq!(direct.host_storage(), h.host_storage(), "{dtype}");
            // and values the dtype holds exactly come back exactly
            let exact = [0.0f32, 1.0, -2.5, 0.375, 1024.0];
            let e = Tensor::from_f32_as(&[5], &exact, dtype).unwrap();
            assert_eq!(e.to_vec_f32().unwrap(), exact, "{dtype}");
            assert_eq!(
                e.to_dtype(DType::F32)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .host_storage(),
                e.host_storage()
            );
        }
        let f16_bits = Tensor::from_f32_as(&[1], &[1.0], DType::F16).unwrap();
        assert_eq!(
            f16_bits.host_storage().unwrap(),
            &0x3c00u16.to_ne_bytes()[..]
        );
        let bf16_bits = Tensor::from_f32_as(&[1], &[1.0], DType::Bf16).unwrap();
        assert_eq!(
            bf16_bits.host_storage().unwrap(),
            &0x3f80u16.to_ne_bytes()[..]
        );
        // f64 -> f16 rounds once: 1 + 2^-11 + 2^-40 rounds up, not to even
        let t = Tensor::from_f64(&[1], vec![1.0 + 2f64.powi(-11) + 2f64.powi(-40)]).unwrap();
        assert_eq!(
            t.to_dtype(DType::F16).unwrap().to_vec_f64().unwrap(),
            vec![1.0 + 2f64.powi(-10)]
        );
        let t = Tensor::from_f64(&[1], vec![1.0 + 2f64.powi(-8) + 2f64.powi(-40)]).unwrap();
        assert_eq!(
            t.to_dtype(DType::Bf16).unwrap().to_vec_f64().unwrap(),
            vec![1.0 + 2f64.powi(-7)]
        );
        // a permuted tensor converts in logical order
        let p = Tensor::from_f32(&[2, 3], iota(6))
            .unwrap()
            .permute(&[1, 0])
            .unwrap()
            .to_dtype(DType::Bf16)
            .unwrap();
        assert!(p.is_contiguous());
        assert_eq!(p.to_vec_f32().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
    }

    /// The f16/bf16 value nearest to a positive finite `v` (ties to the even one), by search.
    fn nearest_half(v: f64, to_f64: fn(u16) -> f64) -> u16 {
        let mut best = 0u16;
        let (mut lo, mut hi) = (0u16, 0x7f80u16);
        // the largest bit pattern whose value is <= v (positive patterns are ordered; those
        // past infinity are NaN, never <= v)
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if to_f64(mid) <= v {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let mut best_err = f64::INFINITY;
        for b in [lo, lo + 1] {
            let err = (to_f64(b) - v).abs();
            if err < best_err || (err == best_err && b % 2 == 0) {
                (best, best_err) = (b, err);
            }
        }
        best
    }

    #[test]
    fn f64_to_half_rounds_once() {
        let seed = fresh_seed();
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let f16_of = |b: u16| f16::from_bits(b).to_f64();
        let bf16_of = |b: u16| bf16::from_bits(b).to_f64();
        for (dtype, to_f64, exps, max) in [
            (
                DType::F16,
                f16_of as fn(u16) -> f64,
                -26..16,
                f16::MAX.to_f64(),
            ),
            (DType::Bf16, bf16_of, -135..127, bf16::MAX.to_f64()),
        ] {
            let mut values = Vec::new();
            for e in exps {
                for _ in 0..40 {
                    values
                        .push(f64::from_bits(next() >> 12 | 0x3ff0_0000_0000_0000) * 2f64.powi(e));
                }
                // exactly halfway between two representable values, and either side of it
                let a = to_f64(nearest_half(2f64.powi(e), to_f64));
                let b = to_f64(nearest_half(2f64.powi(e), to_f64) + 1);
                let mid = (a + b) / 2.0;
                values.extend([
                    mid,
                    mid * (1.0 + 2f64.powi(-50)),
                    mid * (1.0 - 2f64.powi(-50)),
                ]);
            }
            for v in values.into_iter().filter(|v| *v > 0.0 && *v < max) {
                let got = encode_f64(&[v, -v], dtype);
                let want = nearest_half(v, to_f64);
                let pos = u16::from_ne_bytes([got[0], got[1]]);
                let neg = u16::from_ne_bytes([got[2], got[3]]);
                assert_eq!(pos, want, "{dtype}: {v:e} (seed {seed})");
                assert_eq!(neg, want | 0x8000, "{dtype}: -{v:e} (seed {seed})");
            }
        }
        // beyond the range: infinity; NaN stays NaN
        let big = decode_f64(&encode_f64(&[1e300, -1e300, 7e4], DType::F16), DType::F16);
        assert_eq!(big, vec![f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY]);
        let big = decode_f64(&encode_f64(&[1e300, 3.3e38], DType::Bf16), DType::Bf16);
        assert_eq!(big[0], f64::INFINITY);
        assert!(big[1].is_finite());
        for dtype in DType::ALL {
            let nan = decode_f64(&encode_f64(&[f64::NAN], dtype), dtype);
            assert!(nan[0].is_nan(), "{dtype}");
        }
        assert_eq!(f64_to_f32_round_odd(1e-300), f32::from_bits(1));
        assert_eq!(f64_to_f32_round_odd(-1e300), -f32::MAX);
    }

    #[test]
    fn add_matches_native_addition() {
        let seed = fresh_seed();
        let shape = [3, 4, 5];
        let a = random(60, seed);
        let b = random(60, seed ^ 0x9e37_79b9);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let ta = Tensor::from_f32(&shape, a.clone()).unwrap();
        let tb = Tensor::from_f32(&shape, b.clone()).unwrap();
        assert_eq!(
            ta.add(&tb).unwrap().to_vec_f32().unwrap(),
            want,
            "seed {seed}"
        );

        let want64: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * 3.0 + f64::from(*y) / 7.0)
            .collect();
        let a64: Vec<f64> = a.iter().map(|x| f64::from(*x) * 3.0).collect();
        let b64: Vec<f64> = b.iter().map(|y| f64::from(*y) / 7.0).collect();
        let s = Tensor::from_f64(&shape, a64)
            .unwrap()
            .add(&Tensor::from_f64(&shape, b64).unwrap())
            .unwrap();
        assert_eq!(s.dtype(), DType::F64);
        assert_eq!(s.to_vec_f64().unwrap(), want64, "seed {seed}");

        for dtype in [DType::F16, DType::Bf16] {
            let ha = Tensor::from_f32_as(&shape, &a, dtype).unwrap();
            let hb = Tensor::from_f32_as(&shape, &b, dtype).unwrap();
            let got = ha.add(&hb).unwrap();
            assert_eq!(got.dtype(), dtype);
            let (va, vb) = (ha.to_vec_f32().unwrap(), hb.to_vec_f32().unwrap());
            let want: Vec<f32> = va
                .iter()
                .zip(&vb)
                .map(|(x, y)| match dtype {
                    DType::F16 => (f16::from_f32(*x) + f16::from_f32(*y)).to_f32(),
                    _ => (bf16::from_f32(*x) + bf16::from_f32(*y)).to_f32(),
                })
                .collect();
            assert_eq!(got.to_vec_f32().unwrap(), want, "{dtype} seed {seed}");
        }

        // strided operands are read logically
        let pa = ta.permute(&[2, 0, 1]).unwrap();
        let pb = tb.permute(&[2, 0, 1]).unwrap().contiguous().unwrap();
        let got = pa.add(&pb).unwrap().permute(&[1, 2, 0]).unwrap();
        assert_eq!(got.to_vec_f32().unwrap(), want, "seed {seed}");
    }

    #[test]
    fn add_rejects_mismatched_shapes_and_dtypes() {
        let a = Tensor::zeros(&[2, 3], DType::F32).unwrap();
        let e = a
            .add(&Tensor::zeros(&[3, 2], DType::F32).unwrap())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "add: shapes [2, 3] and [3, 2] do not fit (equal shapes)"
        );
        let e = a
            .add(&Tensor::zeros(&[2, 3], DType::F16).unwrap())
            .unwrap_err();
        assert!(matches!(
            e,
            TensorError::DTypeMismatch {
                op: "add",
                left: DType::F32,
                right: DType::F16
            }
        ));
        assert_eq!(
            e.to_string(),
            "add: dtypes differ (f32 and f16): convert one with .to_dtype(...) first"
        );
    }

    fn naive_matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn matmul_matches_a_simple_loop() {
        let seed = fresh_seed();
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (17, 9, 33), (4, 6, 0), (0, 3, 2)] {
            let a = random(m * k, seed ^ (m as u64));
            let b = random(k * n, seed ^ 0xabcd ^ (n as u64));
            let a64: Vec<f64> = a.iter().map(|v| f64::from(*v)).collect();
            let b64: Vec<f64> = b.iter().map(|v| f64::from(*v)).collect();
            let want = naive_matmul(&a64, &b64, m, n, k);

            let c = Tensor::from_f64(&[m, k], a64.clone())
                .unwrap()
                .matmul(&Tensor::from_f64(&[k, n], b64.clone()).unwrap())
                .unwrap();
            assert_eq!((c.shape(), c.dtype()), (&[m, n][..], DType::F64));
            for (g, w) in c.to_vec_f64().unwrap().iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-12 * (k as f64 + 1.0),
                    "{m}x{n}x{k} seed {seed}"
                );
            }

            let c = Tensor::from_f32(&[m, k], a.clone())
                .unwrap()
                .matmul(&Tensor::from_f32(&[k, n], b.clone()).unwrap())
                .unwrap();
            assert_eq!(c.to_vec_f32().unwrap().len(), m * n);
            for (g, w) in c.to_vec_f32().unwrap().iter().zip(&want) {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-5 * (k as f64 + 1.0),
                    "{m}x{n}x{k} seed {seed}"
                );
            }
        }
        // a transposed (strided) operand is read logically
        let a = Tensor::from_f64(&[3, 2], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let at = a.permute(&[1, 0]).unwrap(); // [[1, 3, 5], [2, 4, 6]]
        let c = at.matmul(&a).unwrap();
        assert_eq!(c.to_vec_f64().unwrap(), vec![35., 44., 44., 56.]);
    }

    #[test]
    fn matmul_rejects_bad_input() {
        let a = Tensor::zeros(&[2, 3], DType::F32).unwrap();
        let e = a
            .matmul(&Tensor::zeros(&[2, 3], DType::F32).unwrap())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: shapes [2, 3] and [2, 3] do not fit ([m, k] and [k, n])"
        );
        let e = a
            .matmul(&Tensor::zeros(&[3], DType::F32).unwrap())
            .unwrap_err();
        assert!(matches!(&e, TensorError::Rank { expected: 2, shape, .. } if shape == &[3]));
        let h = Tensor::zeros(&[2, 2], DType::F16).unwrap();
        let e = h.matmul(&h).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: dtype f16 is not supported (supported: f64, f32, tf32)"
        );
        let e = a
            .matmul(&Tensor::zeros(&[3, 2], DType::F64).unwrap())
            .unwrap_err();
        assert!(matches!(e, TensorError::DTypeMismatch { .. }));
    }

    #[test]
    fn device_mismatch_names_both_devices() {
        assert!(check_same_device("add", Device::Cpu, Device::Cpu).is_ok());
        assert!(check_same_device("add", Device::Cuda(1), Device::Cuda(1)).is_ok());
        let e = check_same_device("add", Device::Cpu, Device::Cuda(0)).unwrap_err();
        assert!(matches!(
            e,
            TensorError::DeviceMismatch {
                op: "add",
                left: Device::Cpu,
                right: Device::Cuda(0)
            }
        ));
        assert_eq!(
            e.to_string(),
            "add: tensors are on different devices (cpu and cuda:0): move one with .to(...) first"
        );
        let e = check_same_device("matmul", Device::Cuda(0), Device::Cuda(1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: tensors are on different devices (cuda:0 and cuda:1): move one with .to(...) first"
        );
    }

    #[test]
    fn moving_without_a_gpu_is_a_typed_error() {
        let devices = Devices::cpu_only();
        let t = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
        let e = t.to(Device::Cuda(0), &devices).unwrap_err();
        assert!(
            matches!(
                e,
                TensorError::NoGpu {
                    device: Device::Cuda(0),
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().starts_with("cuda:0 is not available"), "{e}");
        let e = Tensor::zeros_on(&[2], DType::F32, Device::Cuda(3), &devices).unwrap_err();
        assert!(e.to_string().starts_with("cuda:3 is not available"), "{e}");
        // the same device is a cheap clone sharing the buffer
        let same = t.to(Device::Cpu, &devices).unwrap();
        assert_eq!(
            same.host_storage().map(<[u8]>::as_ptr),
            t.host_storage().map(<[u8]>::as_ptr)
        );
        let z = Tensor::zeros_on(&[2], DType::F32, Device::Cpu, &devices).unwrap();
        assert_eq!(z.to_vec_f32().unwrap(), vec![0.0, 0.0]);
        assert!(t.gpu().is_none() && t.device_buffer().is_none());
        assert!(format!("{devices:?}").contains("cuda: false"));
        assert!(format!("{t:?}").contains("Cpu"));
    }

    #[test]
    fn gather_refuses_views_past_the_storage() {
        let e = gather(&[0; 7], &[2], &[1], 4).unwrap_err();
        assert!(matches!(
            e,
            TensorError::StorageTooSmall {
                storage_bytes: 7,
                needed: 8
            }
        ));
        assert_eq!(
            gather(&[1, 2, 3, 4], &[2, 2], &[1, 2], 1).unwrap(),
            vec![1, 3, 2, 4]
        );
    }
}
