//! Windows into device memory. An inference engine keeps every activation in one arena and hands
//! each operation a [`View`] of it (a bounds-checked address range borrowed from the buffer that
//! owns the memory), so that buffers can be reused by a memory plan without copying.
//!
//! Device memory is not Rust memory: two views may overlap and a kernel may write through a
//! shared view. What the borrow guarantees is that the owning buffer outlives every view.

use crate::blas::DeviceBytes;
use crate::driver::{CudaError, Gpu};
use cudarc::driver::{result, sys, CudaStream, DevicePtr};
use std::marker::PhantomData;

/// A range of device memory: `bytes` bytes from device address `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    _owner: PhantomData<&'a DeviceBytes>,
}

impl<'a> View<'a> {
    /// The whole of `buf`.
    pub fn of(buf: &'a DeviceBytes, stream: &CudaStream) -> View<'a> {
        // Event tracking is disabled on every gpukit context (driver::Gpu::open), so the guard
        // returned beside the address records nothing and may be dropped at once.
        let (ptr, _guard) = buf.device_ptr(stream);
        View {
            ptr,
            bytes: buf.len(),
            _owner: PhantomData,
        }
    }

    /// `bytes` bytes from `offset`; an error when that runs past the end.
    pub fn sub(&self, offset: usize, bytes: usize) -> Result<View<'a>, CudaError> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => Ok(View {
                ptr: self.ptr + offset as u64,
                bytes,
                _owner: PhantomData,
            }),
            _ => Err(CudaError::Invalid(format!(
                "device view of {bytes} bytes at offset {offset} runs past a buffer of {} bytes",
                self.bytes
            ))),
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device address (for FFI calls inside this crate).
    pub(crate) fn addr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// An error unless the view holds at least `need` bytes (`what` names it in the message).
    pub fn require(&self, need: usize, what: &str) -> Result<(), CudaError> {
        if self.bytes < need {
            Err(CudaError::Invalid(format!(
                "{what}: device buffer of {} bytes, needs {need}",
                self.bytes
            )))
        } else {
            Ok(())
        }
    }
}

impl Gpu {
    /// Copies `src` into the start of `dst` and waits for the copy.
    pub fn upload_into(&self, dst: View<'_>, src: &[u8]) -> Result<(), CudaError> {
        dst.require(src.len(), "upload")?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the destination holds src.len() bytes (checked); the host slice lives until
        // the synchronize below returns.
        unsafe { result::memcpy_htod_async(dst.addr(), src, self.stream.cu_stream()) }?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// Copies the first `len` bytes of `src` to the host.
    pub fn download_from(&self, src: View<'_>, len: usize) -> Result<Vec<u8>, CudaError> {
        src.require(len, "download")?;
        self.ctx.bind_to_thread()?;
        let mut out = vec![0u8; len];
        // SAFETY: the source holds `len` bytes (checked); `out` lives until the synchronize.
        unsafe { result::memcpy_dtoh_async(&mut out, src.addr(), self.stream.cu_stream()) }?;
        self.stream.synchronize()?;
        Ok(out)
    }
}

/// The device's default stream-ordered memory pool: every gpukit device allocation comes from it
/// (`cuMemAllocAsync`), so it is gpukit's caching allocator. "used" is what live buffers hold,
/// "reserved" what the pool holds from the driver (used + cached), "high" the peak since the
/// last [`Gpu::reset_pool_peaks`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    pub used: u64,
    pub used_high: u64,
    pub reserved: u64,
    pub reserved_high: u64,
}

impl Gpu {
    fn pool(&self) -> Result<sys::CUmemoryPool, CudaError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the context's own device.
        Ok(unsafe { result::device::get_default_mem_pool(self.ctx.cu_device()) }?)
    }

    fn pool_attr(&self, attr: sys::CUmemPool_attribute) -> Result<u64, CudaError> {
        let pool = self.pool()?;
        let mut v: u64 = 0;
        // SAFETY: these attributes are cuuint64_t values; `v` is a live u64.
        unsafe { result::mem_pool::get_attribute(pool, attr, &mut v as *mut u64 as *mut _) }?;
        Ok(v)
    }

    /// The pool's figures now.
    pub fn pool_stats(&self) -> Result<PoolStats, CudaError> {
        use sys::CUmemPool_attribute as A;
        Ok(PoolStats {
            used: self.pool_attr(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: self.pool_attr(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved: self.pool_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: self.pool_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Starts the peaks again from the current figures.
    pub fn reset_pool_peaks(&self) -> Result<(), CudaError> {
        use sys::CUmemPool_attribute as A;
        let pool = self.pool()?;
        for attr in [
            A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: the high-water attributes may only be set to 0 (a cuuint64_t).
            unsafe {
                result::mem_pool::set_attribute(pool, attr, &mut zero as *mut u64 as *mut _)
            }?;
        }
        Ok(())
    }

    /// `empty_cache`: waits for queued work, then hands every cached byte back to the driver.
    pub fn empty_cache(&self) -> Result<(), CudaError> {
        self.stream.synchronize()?;
        let pool = self.pool()?;
        // SAFETY: a live pool; trimming only releases memory no allocation holds.
        unsafe { result::mem_pool::trim_to(pool, 0) }?;
        Ok(())
    }
}
