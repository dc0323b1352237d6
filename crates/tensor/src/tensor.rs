//! Tensors: a buffer (host bytes, or a range of a CUDA device buffer with the [`Gpu`] it lives
//! on), a shape, strides in elements, a [`DType`] and the [`Device`] of the buffer. The CPU and
//! GPU inference engines take and give them, and the GPU engine's activations are tensors over
//! its arena.
//!
//! To use:
//! 1. Build on the CPU: [`Tensor::from_f32`], [`Tensor::from_f64`], [`Tensor::from_f32_as`]
//!    (f16/bf16 storage), [`Tensor::zeros`]; or on a GPU with [`Tensor::zeros_on`].
//! 2. Move between devices with [`Tensor::to`] and a [`Devices`] registry, which opens each GPU
//!    once and shares it between tensors, or with [`Tensor::to_gpu`] onto a GPU in hand.
//! 3. Read back with [`Tensor::to_vec_f32`] / [`Tensor::to_bytes`], from any device.
//! 4. Engines: [`Tensor::in_buffer`] makes a tensor over a range of a shared device buffer (an
//!    arena); [`Tensor::device_view`] hands its bytes to a library call; [`Tensor::write`]
//!    overwrites them from a CPU tensor.
//!
//! The golden rule: an op on tensors on different devices returns [`Error::DeviceMismatch`]
//! naming both devices. It never panics and never moves data on its own; the caller decides
//! where the data goes with [`Tensor::to`].
//!
//! Layouts: strides are in elements, and views ([`Tensor::permute`], [`Tensor::reshape`]) share
//! the buffer. [`Tensor::to_nhwc`] changes the physical layout of a 4-D tensor to channels-last
//! while the shape and the logical indexing stay `[n, c, h, w]`, as PyTorch's `channels_last`
//! does: only the strides say that the channel varies fastest in memory ([`Tensor::layout`]).
//!
//! Writes: ops return new tensors and never write their inputs. Only [`Tensor::write`] and the
//! engines (through [`Tensor::device_view`]) write a tensor's bytes, and clones share them.
//!
//! Speed: the copies of [`Tensor::to`] are plain uploads and downloads. [`Tensor::add`],
//! [`Tensor::matmul`] and the layout and dtype conversions of a CUDA tensor go through the host
//! today (download, compute on the CPU, upload the result): correct, not fast. The GPU's fast
//! paths are the engines' library calls and kernels.

use crate::codec::{decode_f32, decode_f64, encode_f32, encode_f64};
use crate::error::{check_same_device, Error, Result};
use crate::random::Distribution;
use crate::storage::Storage;
use crate::{DType, Device, Devices, Layout};
use gpukit_cuda::{DeviceBuffer, Gpu, View};
use std::fmt;
use std::sync::Arc;

#[cfg(test)]
mod tests;

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

/// The strides of `shape` in `layout` (channels-last only for 4-D shapes).
fn strides_for(shape: &[usize], layout: Layout) -> Vec<usize> {
    match layout {
        Layout::Nhwc => nhwc_strides(shape).unwrap_or_else(|| contiguous_strides(shape)),
        Layout::Nchw => contiguous_strides(shape),
    }
}

pub(crate) fn numel_of(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Elements count and byte size of a dense `shape` of `dtype`, or `TooLarge`.
pub(crate) fn sizes(shape: &[usize], dtype: DType) -> Result<(usize, usize)> {
    if dtype.matmul_only() {
        // fp8 is bytes for cuBLASLt's products (gpukit_tensor::codec encodes them), no tensor
        return Err(Error::UnsupportedDType {
            op: "tensor",
            dtype,
            supported: "f64, f32, tf32, f16, bf16 (fp8 is a matmul input type only)",
        });
    }
    numel_of(shape)
        .and_then(|n| Some((n, n.checked_mul(dtype.size_bytes())?)))
        .ok_or_else(|| Error::TooLarge {
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

/// The elements of a strided view of `src`, in logical (row-major) order.
pub(crate) fn gather(
    src: &[u8],
    shape: &[usize],
    strides: &[usize],
    elem: usize,
) -> Result<Vec<u8>> {
    let too_small = |needed| Error::StorageTooSmall {
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

/// Writes `values` (logical, row-major order) into the elements of a strided view of `dst`:
/// [`gather`]'s inverse.
fn scatter(
    dst: &mut [u8],
    values: &[u8],
    shape: &[usize],
    strides: &[usize],
    elem: usize,
) -> Result<()> {
    let needed = span(shape, strides)
        .and_then(|s| s.checked_mul(elem))
        .unwrap_or(usize::MAX);
    let numel = numel_of(shape).unwrap_or(usize::MAX);
    if numel == 0 {
        return Ok(());
    }
    if dst.len() < needed || values.len() < numel.saturating_mul(elem) {
        return Err(Error::StorageTooSmall {
            storage_bytes: dst.len(),
            needed,
        });
    }
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0usize;
    for value in values.chunks_exact(elem).take(numel) {
        dst[offset * elem..offset * elem + elem].copy_from_slice(value);
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
    Ok(())
}

/// An n-dimensional array on a device. Cloning is cheap: clones and views share the buffer.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Storage,
    pub(crate) shape: Vec<usize>,
    /// In elements; one per dimension.
    pub(crate) strides: Vec<usize>,
    pub(crate) dtype: DType,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("dtype", &self.dtype)
            .field("device", &self.device())
            .finish()
    }
}

impl Tensor {
    // ---- construction ----

    /// A contiguous CPU tensor of `dtype` from its bytes (machine byte order, row-major).
    pub fn from_bytes(shape: &[usize], dtype: DType, bytes: Vec<u8>) -> Result<Tensor> {
        let (_, expected) = sizes(shape, dtype)?;
        if bytes.len() != expected {
            return Err(Error::ByteLength {
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
        })
    }

    fn check_len(shape: &[usize], dtype: DType, got: usize) -> Result<()> {
        let (expected, _) = sizes(shape, dtype)?;
        if got == expected {
            Ok(())
        } else {
            Err(Error::DataLength {
                shape: shape.to_vec(),
                expected,
                got,
            })
        }
    }

    /// An f32 CPU tensor; `data` is in row-major order and must hold exactly `numel` values.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        Tensor::from_f32_as(shape, &data, DType::F32)
    }

    /// An f64 CPU tensor (for references); `data` must hold exactly `numel` values.
    pub fn from_f64(shape: &[usize], data: Vec<f64>) -> Result<Tensor> {
        Tensor::from_f64_as(shape, &data, DType::F64)
    }

    /// A CPU tensor stored as `dtype` from f32 values, each rounded to nearest (f16, bf16).
    pub fn from_f32_as(shape: &[usize], data: &[f32], dtype: DType) -> Result<Tensor> {
        Tensor::check_len(shape, dtype, data.len())?;
        Tensor::from_bytes(shape, dtype, encode_f32(data, dtype))
    }

    /// A CPU tensor stored as `dtype` from f64 values, each rounded once to nearest.
    pub fn from_f64_as(shape: &[usize], data: &[f64], dtype: DType) -> Result<Tensor> {
        Tensor::check_len(shape, dtype, data.len())?;
        Tensor::from_bytes(shape, dtype, encode_f64(data, dtype))
    }

    /// A CPU tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let (_, bytes) = sizes(shape, dtype)?;
        Tensor::from_bytes(shape, dtype, vec![0; bytes])
    }

    /// A tensor of zeros on `device` (allocated there: nothing is uploaded).
    pub fn zeros_on(
        shape: &[usize],
        dtype: DType,
        device: Device,
        devices: &Devices,
    ) -> Result<Tensor> {
        let Device::Cuda(ordinal) = device else {
            return Tensor::zeros(shape, dtype);
        };
        let (_, bytes) = sizes(shape, dtype)?;
        Ok(Tensor {
            storage: Storage::zeros_on(devices.gpu(ordinal)?, bytes)?,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            dtype,
        })
    }

    /// Random values on `device`, drawn there (a GPU draws them with a kernel: nothing is
    /// uploaded): standard normal (as `torch.randn`) or uniform in [-1, 1), the same for the
    /// same seed. The CPU and a GPU draw from different generators.
    pub fn random(
        shape: &[usize],
        dtype: DType,
        device: Device,
        devices: &Devices,
        seed: u64,
        dist: Distribution,
    ) -> Result<Tensor> {
        if let Device::Cuda(ordinal) = device {
            return Tensor::cuda_random(&devices.gpu(ordinal)?, shape, dtype, seed, dist);
        }
        let (n, _) = sizes(shape, dtype)?;
        let bytes = match (dtype, dist) {
            (DType::F64, _) => {
                let mut v = vec![0f64; n];
                match dist {
                    Distribution::Normal => crate::random::fill_normal_f64(&mut v, seed),
                    Distribution::Uniform => crate::random::fill_uniform_f64(&mut v, seed),
                }
                encode_f64(&v, dtype)
            }
            _ => {
                let mut v = vec![0f32; n];
                match dist {
                    Distribution::Normal => crate::random::fill_normal_f32(&mut v, seed),
                    Distribution::Uniform => crate::random::fill_uniform_f32(&mut v, seed),
                }
                encode_f32(&v, dtype)
            }
        };
        Tensor::from_bytes(shape, dtype, bytes)
    }

    /// Random values on the GPU in hand (see [`Tensor::random`]).
    pub fn random_on(
        gpu: &Arc<Gpu>,
        shape: &[usize],
        dtype: DType,
        seed: u64,
        dist: Distribution,
    ) -> Result<Tensor> {
        Tensor::cuda_random(gpu, shape, dtype, seed, dist)
    }

    /// A dense tensor in `layout` over the bytes of `buffer` from `offset`, sharing the buffer
    /// with every other tensor made over it (an engine's arena). Its bytes must fit in the
    /// buffer.
    pub fn in_buffer(
        gpu: &Arc<Gpu>,
        buffer: &Arc<DeviceBuffer>,
        offset: usize,
        shape: &[usize],
        dtype: DType,
        layout: Layout,
    ) -> Result<Tensor> {
        let (_, bytes) = sizes(shape, dtype)?;
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > buffer.len())
        {
            return Err(Error::ViewPastBuffer {
                offset,
                bytes,
                buffer_bytes: buffer.len(),
            });
        }
        Ok(Tensor {
            storage: Storage::Cuda {
                gpu: gpu.clone(),
                buf: buffer.clone(),
                offset,
                len: bytes,
            },
            shape: shape.to_vec(),
            strides: strides_for(shape, layout),
            dtype,
        })
    }

    /// A tensor on the same device as `self` from logical-order bytes, with these strides.
    pub(crate) fn alike(
        &self,
        bytes: Vec<u8>,
        shape: Vec<usize>,
        strides: Vec<usize>,
        dtype: DType,
    ) -> Result<Tensor> {
        Ok(Tensor {
            storage: self.storage.alike(bytes)?,
            shape,
            strides,
            dtype,
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
        self.storage.device()
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

    /// The memory layout, when the tensor is dense in one: `Nchw` for row-major (any rank),
    /// `Nhwc` for a channels-last 4-D tensor; None for other strides (a permuted view).
    pub fn layout(&self) -> Option<Layout> {
        if self.is_contiguous() {
            Some(Layout::Nchw)
        } else if self.is_nhwc() {
            Some(Layout::Nhwc)
        } else {
            None
        }
    }

    // ---- reading back ----

    /// The elements' bytes in logical (row-major) order, from any device.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let storage = self.storage.host()?;
        let elem = self.dtype.size_bytes();
        if self.is_contiguous() {
            let n = self.bytes();
            // a download: these bytes are this call's own, no copy needed
            let storage = match storage {
                std::borrow::Cow::Owned(mut bytes) if bytes.len() >= n => {
                    bytes.truncate(n);
                    return Ok(bytes);
                }
                s => s,
            };
            return storage
                .get(..n)
                .map(<[u8]>::to_vec)
                .ok_or(Error::StorageTooSmall {
                    storage_bytes: storage.len(),
                    needed: n,
                });
        }
        gather(&storage, &self.shape, &self.strides, elem)
    }

    /// The values as f32 in logical order, from any device and dtype (f64 rounds to nearest).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        if matches!(self.dtype, DType::F32 | DType::Tf32) && self.is_contiguous() {
            // straight into the result: one buffer, no second pass over the bytes
            let mut out = vec![0f32; self.numel()];
            self.storage.read_into(bytemuck::cast_slice_mut(&mut out))?;
            return Ok(out);
        }
        Ok(decode_f32(&self.to_bytes()?, self.dtype))
    }

    /// The values as f32 in logical order, borrowed when the tensor is a contiguous f32 tensor
    /// in host memory (no copy), else converted as [`Tensor::to_vec_f32`] does.
    pub fn f32_values(&self) -> Result<std::borrow::Cow<'_, [f32]>> {
        if let (Some(host), DType::F32 | DType::Tf32, true) =
            (self.host_storage(), self.dtype, self.is_contiguous())
        {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(&host[..self.bytes()]) {
                return Ok(std::borrow::Cow::Borrowed(values));
            }
        }
        Ok(std::borrow::Cow::Owned(self.to_vec_f32()?))
    }

    /// The values as f64 in logical order (exact for every dtype).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(decode_f64(&self.to_bytes()?, self.dtype))
    }

    // ---- moving ----

    /// This tensor on `device`, layout (strides) kept. The same device gives a cheap clone that
    /// shares the buffer; cpu -> cuda uploads, cuda -> cpu downloads, cuda:a -> cuda:b goes
    /// through the host.
    pub fn to(&self, device: Device, devices: &Devices) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        match device {
            Device::Cpu => self.to_host(),
            Device::Cuda(ordinal) => self.to_gpu(&devices.gpu(ordinal)?),
        }
    }

    /// This tensor on `gpu` (a copy, layout kept; a clone when it is already there).
    pub fn to_gpu(&self, gpu: &Arc<Gpu>) -> Result<Tensor> {
        if self.gpu().is_some_and(|g| Arc::ptr_eq(g, gpu)) {
            return Ok(self.clone());
        }
        let bytes = self.storage.host()?;
        Ok(Tensor {
            storage: Storage::upload(gpu.clone(), &bytes)?,
            ..self.clone()
        })
    }

    /// This tensor in host memory (a download for CUDA tensors, layout kept).
    pub fn to_host(&self) -> Result<Tensor> {
        if self.device() == Device::Cpu {
            return Ok(self.clone());
        }
        let bytes = self.storage.host()?.into_owned();
        Ok(Tensor {
            storage: Storage::Host(Arc::new(bytes)),
            ..self.clone()
        })
    }

    /// Item `index` along the first dimension (`x[i]`): the shape without its first dimension.
    /// On a GPU a view sharing this tensor's bytes (writing it writes them); on the CPU a copy
    /// (host storage has no offsets).
    pub fn select(&self, index: usize) -> Result<Tensor> {
        let (Some(&first), Some(&stride)) = (self.shape.first(), self.strides.first()) else {
            return Err(Error::Rank {
                op: "select",
                expected: 1,
                shape: self.shape.clone(),
            });
        };
        if index >= first {
            return Err(Error::Axis {
                op: "select",
                axis: index,
                rank: first,
            });
        }
        let skip = index * stride * self.dtype.size_bytes();
        let storage = match &self.storage {
            Storage::Host(v) => {
                // host tensors own their bytes from 0: a view copies the rest (cheap, rare)
                Storage::Host(Arc::new(v.get(skip..).unwrap_or_default().to_vec()))
            }
            Storage::Cuda {
                gpu,
                buf,
                offset,
                len,
            } => Storage::Cuda {
                gpu: gpu.clone(),
                buf: buf.clone(),
                offset: offset + skip,
                len: len.saturating_sub(skip),
            },
        };
        Ok(Tensor {
            storage,
            shape: self.shape[1..].to_vec(),
            strides: self.strides[1..].to_vec(),
            dtype: self.dtype,
        })
    }

    /// The tensors (one shape and dtype, one device) stacked along a new first dimension, as
    /// `torch.stack`: a new contiguous tensor.
    pub fn stack(items: &[Tensor]) -> Result<Tensor> {
        let Some(first) = items.first() else {
            return Err(Error::Rank {
                op: "stack",
                expected: 1,
                shape: Vec::new(),
            });
        };
        let mut shape = vec![items.len()];
        shape.extend_from_slice(&first.shape);
        let mut out = match first.gpu() {
            Some(gpu) => Tensor::uninit_on(gpu, &shape, first.dtype)?,
            None => Tensor::zeros(&shape, first.dtype)?,
        };
        if out.gpu().is_some() {
            for (i, t) in items.iter().enumerate() {
                check_same_device("stack", first.device(), t.device())?;
                out.select(i)?.write(t)?;
            }
            return Ok(out);
        }
        let mut bytes = Vec::with_capacity(out.bytes());
        for t in items {
            check_same_device("stack", first.device(), t.device())?;
            if t.shape != first.shape || t.dtype != first.dtype {
                return Err(Error::ShapeMismatch {
                    op: "stack",
                    left: first.shape.clone(),
                    right: t.shape.clone(),
                    expected: "one shape and dtype",
                });
            }
            bytes.extend(t.to_bytes()?);
        }
        out.storage = Storage::Host(Arc::new(bytes));
        Ok(out)
    }

    // ---- for engines ----

    /// The device bytes of a dense CUDA tensor (row-major or channels-last), for a library
    /// call or kernel to read or write.
    pub fn device_view(&self) -> Result<View<'_>> {
        if self.layout().is_none() {
            return Err(Error::NotDense {
                op: "device_view",
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            });
        }
        self.storage.view("device_view")
    }

    /// Overwrites this tensor's elements with `src`'s (same shape and dtype; any device and
    /// layout on either side: the values are copied in logical order into this tensor's
    /// layout). Clones of a CUDA tensor share its bytes and see the new values; a CPU tensor
    /// copies on write, so its clones keep the old ones.
    pub fn write(&mut self, src: &Tensor) -> Result<()> {
        if let (Some(mine), Some(theirs)) = (self.gpu().cloned(), src.gpu()) {
            if mine.ordinal == theirs.ordinal && src.shape == self.shape && src.dtype == self.dtype
            {
                // on one GPU: a copy kernel, in stream order, nothing through the host
                return self.cuda_copy_from(&mine, "write", src);
            }
        }
        if src.shape != self.shape {
            return Err(Error::ShapeMismatch {
                op: "write",
                left: self.shape.clone(),
                right: src.shape.clone(),
                expected: "equal shapes",
            });
        }
        if src.dtype != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "write",
                left: self.dtype,
                right: src.dtype,
            });
        }
        let bytes = match self.layout() {
            Some(Layout::Nchw) => src.to_bytes()?,
            Some(Layout::Nhwc) => src.permute(&[0, 2, 3, 1])?.to_bytes()?,
            None => {
                // a strided view of host memory: each element to its own place
                if let Storage::Host(v) = &mut self.storage {
                    let values = src.to_bytes()?;
                    return scatter(
                        Arc::make_mut(v).as_mut_slice(),
                        &values,
                        &self.shape,
                        &self.strides,
                        self.dtype.size_bytes(),
                    );
                }
                return Err(Error::NotDense {
                    op: "write",
                    shape: self.shape.clone(),
                    strides: self.strides.clone(),
                });
            }
        };
        self.storage.write(&bytes)
    }
}
