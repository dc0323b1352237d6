//! Where a tensor's bytes are: host memory, or a range of a device buffer on one GPU (a whole
//! buffer the tensor owns, or a range of one shared with other tensors, as an inference
//! engine's activation arena is), and the registry that opens each GPU once.

use crate::error::{Error, Result};
use crate::Device;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu, View};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A tensor's bytes.
#[derive(Clone)]
pub(crate) enum Storage {
    Host(Arc<Vec<u8>>),
    Cuda {
        gpu: Arc<Gpu>,
        buf: Arc<DeviceBuffer>,
        /// Where the tensor's bytes start in `buf`.
        offset: usize,
        /// Bytes that belong to the tensor (CUDA allocates no empty buffers, so `buf` has at
        /// least one byte even when this is 0).
        len: usize,
    },
}

pub(crate) fn cuda_err(op: &'static str, gpu: &Gpu) -> impl FnOnce(gpukit_cuda::Error) -> Error {
    let device = Device::Cuda(gpu.ordinal);
    move |source| Error::Cuda { op, device, source }
}

impl Storage {
    pub fn device(&self) -> Device {
        match self {
            Storage::Host(_) => Device::Cpu,
            Storage::Cuda { gpu, .. } => Device::Cuda(gpu.ordinal),
        }
    }

    /// The storage's bytes on the host (a download for CUDA storage).
    pub fn host(&self) -> Result<Cow<'_, [u8]>> {
        match self {
            Storage::Host(v) => Ok(Cow::Borrowed(v.as_slice())),
            Storage::Cuda { len: 0, .. } => Ok(Cow::Owned(Vec::new())),
            Storage::Cuda { gpu, len, .. } => {
                let view = self.view("download")?;
                let bytes = gpu
                    .download_from(view, *len)
                    .map_err(cuda_err("download", gpu))?;
                Ok(Cow::Owned(bytes))
            }
        }
    }

    /// Copies the storage's first `out.len()` bytes into `out` (a download for CUDA storage).
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        match self {
            Storage::Host(v) => {
                let src = v.get(..out.len()).ok_or(Error::StorageTooSmall {
                    storage_bytes: v.len(),
                    needed: out.len(),
                })?;
                out.copy_from_slice(src);
                Ok(())
            }
            Storage::Cuda { gpu, .. } => {
                if out.is_empty() {
                    return Ok(());
                }
                let view = self.view("download")?;
                gpu.download_into(view, out)
                    .map_err(cuda_err("download", gpu))
            }
        }
    }

    /// The device bytes of CUDA storage.
    pub fn view(&self, op: &'static str) -> Result<View<'_>> {
        match self {
            Storage::Host(_) => Err(Error::NotOnGpu {
                op,
                device: Device::Cpu,
            }),
            Storage::Cuda {
                buf, offset, len, ..
            } => buf
                .view()
                .sub(*offset, *len)
                .map_err(|_| Error::ViewPastBuffer {
                    offset: *offset,
                    bytes: *len,
                    buffer_bytes: buf.len(),
                }),
        }
    }

    /// New storage on `gpu` holding `bytes`.
    pub fn upload(gpu: Arc<Gpu>, bytes: &[u8]) -> Result<Storage> {
        let buf = if bytes.is_empty() {
            gpu.alloc(1)
        } else {
            gpu.upload(bytes)
        }
        .map_err(cuda_err("upload", &gpu))?;
        Ok(Storage::Cuda {
            gpu,
            buf: Arc::new(buf),
            offset: 0,
            len: bytes.len(),
        })
    }

    /// New zeroed storage of `len` bytes on `gpu`.
    pub fn zeros_on(gpu: Arc<Gpu>, len: usize) -> Result<Storage> {
        let buf = gpu.alloc(len.max(1)).map_err(cuda_err("alloc", &gpu))?;
        Ok(Storage::Cuda {
            gpu,
            buf: Arc::new(buf),
            offset: 0,
            len,
        })
    }

    /// New storage of `len` bytes on `gpu` that the caller's op writes in full before anything
    /// reads it (not zeroed).
    pub fn uninit_on(gpu: Arc<Gpu>, len: usize) -> Result<Storage> {
        let buf = gpu.alloc_uninit(len).map_err(cuda_err("alloc", &gpu))?;
        Ok(Storage::Cuda {
            gpu,
            buf: Arc::new(buf),
            offset: 0,
            len,
        })
    }

    /// New storage on the same device as `self`, holding `bytes`.
    pub fn alike(&self, bytes: Vec<u8>) -> Result<Storage> {
        match self {
            Storage::Host(_) => Ok(Storage::Host(Arc::new(bytes))),
            Storage::Cuda { gpu, .. } => Storage::upload(gpu.clone(), &bytes),
        }
    }

    /// Overwrites the storage's first `bytes.len()` bytes (waits for the copy).
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Storage::Host(v) => {
                let v = Arc::make_mut(v);
                let storage_bytes = v.len();
                let dst = v.get_mut(..bytes.len()).ok_or(Error::StorageTooSmall {
                    storage_bytes,
                    needed: bytes.len(),
                })?;
                dst.copy_from_slice(bytes);
                Ok(())
            }
            Storage::Cuda { gpu, .. } => {
                let gpu = gpu.clone();
                let view = self.view("write")?;
                gpu.upload_into(view, bytes)
                    .map_err(cuda_err("upload", &gpu))
            }
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

    /// A registry without CUDA: asking it for a GPU is an [`Error::NoGpu`] (unless one was
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
    pub fn gpu(&self, ordinal: usize) -> Result<Arc<Gpu>> {
        let device = Device::Cuda(ordinal);
        let mut open = self.lock();
        if let Some(g) = open.get(&ordinal) {
            return Ok(g.clone());
        }
        let Some(discovery) = &self.discovery else {
            return Err(Error::NoGpu {
                device,
                reason: "this registry was made with Devices::cpu_only(); make it with Devices::new(discovery)".into(),
            });
        };
        let gpu = Arc::new(Gpu::open(discovery, ordinal).map_err(|source| Error::Cuda {
            op: "open",
            device,
            source,
        })?);
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
