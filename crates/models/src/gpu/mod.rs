//! ResNet inference on the GPU: gpukit's own engine.
//!
//! - Batch norm is folded into the convolutions at load ([`crate::forward::fold`]); each
//!   convolution runs as one cuDNN call with its bias, the residual add and the ReLU fused
//!   where a fused engine is fastest. A projection shortcut's bias is added into the bias of the
//!   convolution it joins, so the projection itself is a plain convolution.
//! - How each convolution runs is chosen by measurement once per shape (cuDNN's selection
//!   policy, shared with `bench conv`), when a batch size is prepared ([`Session`]).
//! - Input conversion, max pooling and global average pooling are gpukit's NVRTC kernels; the
//!   classifier is one f32 kernel of gpukit's too (its product and bias), on cuBLAS from
//!   [`kernels::BLAS_ROWS`] rows where cuBLAS opens.
//! - Every activation is a [`Tensor`] over one arena laid out by a memory plan
//!   ([`crate::plan`]) that reuses bytes whose contents are dead; the input batch and the
//!   logits are never overwritten.
//! - A forward pass is one stream of asynchronous calls with no host synchronisation, so it can
//!   be captured once as a CUDA graph and replayed.
//!
//! The parts: [`strategy`] (named ways of running), `weights` (the model on the device),
//! `lower` (the op list and memory plan of one batch size, no device needed) and `session`
//! (one batch size prepared and run).
//!
//! To use: [`GpuContext::open`], [`GpuWeights::upload`] for a dtype and layout, then
//! [`Session::new`] per batch size and [`Session::run`] (or [`Session::enqueue`] /
//! [`Session::capture`] + [`Session::replay`] to time it).

pub mod kernels;
mod lower;
pub mod program;
mod session;
pub mod strategy;
mod weights;

pub use kernels::Kernels;
pub use lower::{arena_bytes, graph_specs, ConvLayer, NetShape};
pub use session::{Session, SessionMemory};
pub use strategy::{Strategy, ENGINE_DTYPES};
pub use weights::GpuWeights;

use crate::error::{Error, Result};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::dnn::Dnn;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu};
use std::sync::Arc;

#[cfg(doc)]
use gpukit_tensor::Tensor;

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// The device and the libraries the engine uses on it, opened once.
pub struct GpuContext {
    pub gpu: Arc<Gpu>,
    pub dnn: Dnn,
    pub blas: LazyBlas,
    pub kernels: Kernels,
    /// Most bytes of the memory pool the engine may use (None: what the device has).
    pub limit: Option<u64>,
}

/// cuBLAS (the products of imported graphs' Gemm and MatMul nodes, and ResNet's classifier at
/// large batches), opened only when something needs it: on a thread of its own while the engine
/// uploads its weights and plans its convolutions ([`LazyBlas::open_ahead`]), or at its first
/// use. Below [`kernels::BLAS_ROWS`] rows ResNet's classifier is a kernel of gpukit's: loading
/// cuBLAS held up the first upload of a warm single-row `infer` by about 270 ms on an H100
/// (the loader's lock), and such a run needs no other product.
pub struct LazyBlas {
    discovery: Discovery,
    gpu: Arc<Gpu>,
    /// cuBLAS, or why it did not open (the message, and whether a library was missing).
    ready: std::cell::OnceCell<std::result::Result<Blas, (String, bool)>>,
    opening: std::cell::RefCell<Option<std::thread::JoinHandle<gpukit_cuda::Result<Blas>>>>,
}

impl LazyBlas {
    fn new(discovery: &Discovery, gpu: &Arc<Gpu>) -> LazyBlas {
        LazyBlas {
            discovery: discovery.clone(),
            gpu: gpu.clone(),
            ready: std::cell::OnceCell::new(),
            opening: std::cell::RefCell::new(None),
        }
    }

    fn open_now(discovery: &Discovery, gpu: &Arc<Gpu>) -> gpukit_cuda::Result<Blas> {
        let t = gpukit_cuda::trace::start();
        // one small GEMM per node and pass: a 4 MiB workspace is plenty
        let blas = Blas::with_workspace(discovery, gpu, 4 << 20);
        gpukit_cuda::trace::done("gpu context: cuBLAS", t);
        blas
    }

    /// Starts opening cuBLAS on a thread of its own (once); a missing library is refused at
    /// once.
    pub fn open_ahead(&self) -> Result<()> {
        Blas::require(&self.discovery)?;
        if self.ready.get().is_some() || self.opening.borrow().is_some() {
            return Ok(());
        }
        let (d, g) = (self.discovery.clone(), self.gpu.clone());
        let opening = std::thread::Builder::new()
            .name("gpukit-cublas".into())
            .spawn(move || LazyBlas::open_now(&d, &g))
            .map_err(|e| Error::Invalid(format!("starting the thread that opens cuBLAS: {e}")))?;
        *self.opening.borrow_mut() = Some(opening);
        Ok(())
    }

    /// Whether cuBLAS opened (asked for with [`LazyBlas::get`] before).
    pub fn is_open(&self) -> bool {
        matches!(self.ready.get(), Some(Ok(_)))
    }

    /// cuBLAS, once open: waits for the thread opening it, or opens it here when nothing did.
    /// The first call after a failure returns its own error; later ones its message, a missing
    /// library still as one.
    pub fn get(&self) -> Result<&Blas> {
        if self.ready.get().is_none() {
            let t = gpukit_cuda::trace::start();
            let opened = match self.opening.borrow_mut().take() {
                Some(h) => h.join().unwrap_or_else(|_| {
                    Err(gpukit_cuda::Error::Invalid(
                        "the thread opening cuBLAS panicked".into(),
                    ))
                }),
                None => Blas::require(&self.discovery)
                    .and_then(|()| LazyBlas::open_now(&self.discovery, &self.gpu)),
            };
            gpukit_cuda::trace::done("waited for cuBLAS", t);
            match opened {
                Ok(blas) => {
                    let _ = self.ready.set(Ok(blas));
                }
                Err(e) => {
                    let missing = matches!(e, gpukit_cuda::Error::MissingLibrary(_));
                    let _ = self.ready.set(Err((e.to_string(), missing)));
                    return Err(e.into());
                }
            }
        }
        match self.ready.get() {
            Some(Ok(blas)) => Ok(blas),
            Some(Err((why, true))) => Err(gpukit_cuda::Error::MissingLibrary(why.clone()).into()),
            Some(Err((why, false))) => Err(Error::Invalid(format!("opening cuBLAS: {why}"))),
            None => Err(Error::Invalid("cuBLAS was not opened".into())),
        }
    }
}

impl Drop for LazyBlas {
    fn drop(&mut self) {
        // cuBLAS is closed before the device it was opened on
        if let Some(h) = self.opening.get_mut().take() {
            let _ = h.join();
        }
    }
}

impl GpuContext {
    pub fn open(discovery: &Discovery, ordinal: usize) -> Result<GpuContext> {
        use gpukit_cuda::trace;
        let t = trace::start();
        let gpu = Arc::new(Gpu::open(discovery, ordinal)?);
        trace::done("gpu context: the device", t);
        let t = trace::start();
        let dnn = Dnn::new(discovery, &gpu)?;
        trace::done("gpu context: cuDNN", t);
        // the engine's f32 outputs are judged against float64: no Winograd or FFT transforms
        // (bench conv, which sets cuDNN beside PyTorch's cudnn.benchmark, keeps them)
        dnn.set_exact_f32(true);
        let t = trace::start();
        let kernels = Kernels::new(discovery, &gpu)?;
        trace::done("gpu context: gpukit's kernels", t);
        let blas = LazyBlas::new(discovery, &gpu);
        Ok(GpuContext {
            gpu,
            dnn,
            blas,
            kernels,
            limit: None,
        })
    }

    /// The out-of-memory error for `bytes` more, with the device's and the pool's figures.
    fn out_of_memory(&self, bytes: usize, what: &str) -> Error {
        let (free, total) = self.gpu.mem_info().unwrap_or((0, 0));
        let reserved = self.gpu.pool_stats().map(|p| p.reserved).unwrap_or(0);
        Error::OutOfMemory {
            what: what.to_string(),
            requested_mib: mib(bytes),
            free_mib: mib(free as usize),
            total_mib: mib(total as usize),
            reserved_mib: mib(reserved as usize),
            limit_mib: self.limit.map(|l| mib(l as usize)),
        }
    }

    /// Allocates `bytes` and frees them at once: whether that much fits now.
    pub fn try_alloc(&self, bytes: usize, what: &str) -> Result<()> {
        let buf = self.alloc(bytes, what)?;
        drop(buf);
        self.gpu.synchronize()?;
        Ok(())
    }

    /// An error when allocating `bytes` more would pass the memory limit.
    pub fn check_limit(&self, bytes: usize, what: &str) -> Result<()> {
        if let Some(limit) = self.limit {
            let used = self.gpu.pool_stats()?.used;
            if used.saturating_add(bytes as u64) > limit {
                return Err(self.out_of_memory(bytes, what));
            }
        }
        Ok(())
    }

    /// Allocates `bytes`, turning out-of-memory into [`Error::OutOfMemory`].
    fn alloc(&self, bytes: usize, what: &str) -> Result<DeviceBuffer> {
        self.check_limit(bytes, what)?;
        self.gpu.alloc(bytes).map_err(|e| {
            if e.is_out_of_memory() {
                self.out_of_memory(bytes, what)
            } else {
                e.into()
            }
        })
    }
}
