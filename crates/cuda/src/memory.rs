//! Device memory: owned buffers ([`DeviceBuffer`]), bounds-checked windows into them ([`View`])
//! and the statistics of the stream-ordered memory pool every gpukit allocation comes from.
//!
//! To use: [`Gpu::alloc`] / [`Gpu::upload`] make a buffer; [`DeviceBuffer::view`] and
//! [`View::sub`] hand an operation the bytes it works on (an inference engine keeps every
//! activation in one arena and gives each operation a view of it); [`Gpu::upload_into`] and
//! [`Gpu::download_from`] copy through views.
//!
//! Device memory is not Rust memory: two views may overlap and a kernel may write through a
//! shared view. What the borrow guarantees is that the owning buffer outlives every view.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys, CudaSlice, DevicePtr};
use std::marker::PhantomData;

/// Bytes of device memory owned by this value, freed (stream-ordered) on drop.
pub struct DeviceBuffer {
    slice: CudaSlice<u8>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.len())
    }
}

impl DeviceBuffer {
    pub(crate) fn new(slice: CudaSlice<u8>) -> DeviceBuffer {
        DeviceBuffer { slice }
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// The whole buffer as a view.
    pub fn view(&self) -> View<'_> {
        View {
            ptr: self.addr(),
            bytes: self.len(),
            device: self.slice.context().ordinal(),
            _owner: PhantomData,
        }
    }

    pub(crate) fn addr(&self) -> sys::CUdeviceptr {
        // Event tracking is disabled on every gpukit context (driver::Gpu::open), so the guard
        // returned beside the address records nothing and may be dropped at once.
        let (ptr, _guard) = self.slice.device_ptr(self.slice.stream());
        ptr
    }
}

/// A range of device memory: `bytes` bytes from a device address, borrowed from the
/// [`DeviceBuffer`] that owns them.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    /// The ordinal of the device whose memory this is (gpukit uses each device's primary
    /// context, so the ordinal names the context too).
    device: usize,
    _owner: PhantomData<&'a DeviceBuffer>,
}

impl<'a> View<'a> {
    /// `bytes` bytes from `offset`; an error when that runs past the end.
    pub fn sub(&self, offset: usize, bytes: usize) -> Result<View<'a>> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => Ok(View {
                ptr: self.ptr + offset as u64,
                bytes,
                device: self.device,
                _owner: PhantomData,
            }),
            _ => Err(Error::Invalid(format!(
                "device view of {bytes} bytes at offset {offset} runs past a buffer of {} bytes",
                self.bytes
            ))),
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the view's first byte is at a multiple of `align` bytes.
    pub fn is_aligned(&self, align: usize) -> bool {
        align != 0 && self.ptr.is_multiple_of(align as u64)
    }

    /// The ordinal of the device the bytes are on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// A view of no buffer, for the kernel API's checks in tests without a GPU.
    #[cfg(test)]
    pub(crate) fn fake(ptr: u64, bytes: usize, device: usize) -> View<'static> {
        View {
            ptr,
            bytes,
            device,
            _owner: PhantomData,
        }
    }

    /// The device address (for FFI calls inside this crate).
    pub(crate) fn addr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Whether the two views share a byte.
    pub fn overlaps(&self, other: &View<'_>) -> bool {
        self.ptr < other.ptr + other.bytes as u64 && other.ptr < self.ptr + self.bytes as u64
    }

    /// Whether both views start at the same address.
    pub fn same_start(&self, other: &View<'_>) -> bool {
        self.ptr == other.ptr
    }

    /// An error unless the view holds at least `need` bytes (`what` names it in the message).
    pub fn require(&self, need: usize, what: &str) -> Result<()> {
        if self.bytes < need {
            Err(Error::Invalid(format!(
                "{what}: device buffer of {} bytes, needs {need}",
                self.bytes
            )))
        } else {
            Ok(())
        }
    }
}

impl Gpu {
    /// A device buffer of `n` bytes, zeroed.
    pub fn alloc(&self, n: usize) -> Result<DeviceBuffer> {
        self.retry_after_trim(|| Ok(DeviceBuffer::new(self.stream().raw().alloc_zeros::<u8>(n)?)))
    }

    /// Runs an allocation; when it runs out of memory and the work stream is not being captured,
    /// waits for queued work, hands the pool's cached bytes back to the driver and tries once
    /// more (the pool keeps what it caches: [`Gpu::keep_pool_cache`]).
    fn retry_after_trim<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        match f() {
            Err(e) if e.is_out_of_memory() && !self.capturing() => {
                self.empty_cache()?;
                f()
            }
            r => r,
        }
    }

    /// Whether the work stream is capturing a graph (synchronising would break the capture).
    fn capturing(&self) -> bool {
        !matches!(
            self.stream().raw().capture_status(),
            Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        )
    }

    /// A device buffer of `n` bytes left as the pool hands it out (not zeroed), for ops that
    /// write every byte before anything reads it.
    pub fn alloc_uninit(&self, n: usize) -> Result<DeviceBuffer> {
        // SAFETY: the bytes are device memory nobody reads before the caller's op writes them
        // (the contract of this function); reading them first would read stale values, never
        // memory outside the buffer.
        self.retry_after_trim(|| {
            Ok(DeviceBuffer::new(unsafe {
                self.stream().raw().alloc::<u8>(n.max(1))
            }?))
        })
    }

    /// Copies host bytes to a new device buffer (synchronously with respect to the host).
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer> {
        let d = self.stream().raw().clone_htod(bytes)?;
        self.synchronize()?;
        Ok(DeviceBuffer::new(d))
    }

    /// Copies a whole device buffer back to the host.
    pub fn download(&self, d: &DeviceBuffer) -> Result<Vec<u8>> {
        self.download_from(d.view(), d.len())
    }

    /// Copies `src` into the start of `dst` and waits for the copy.
    pub fn upload_into(&self, dst: View<'_>, src: &[u8]) -> Result<()> {
        dst.require(src.len(), "upload")?;
        self.bind()?;
        // SAFETY: the destination holds src.len() bytes (checked); the host slice lives until
        // the synchronize below returns.
        unsafe { result::memcpy_htod_async(dst.addr(), src, self.stream().cu()) }?;
        self.synchronize()
    }

    /// Queues a copy of the first `bytes` bytes of `src` into `dst` on the work stream (the
    /// driver's device-to-device copy; the views must not overlap).
    pub fn copy_view(&self, dst: View<'_>, src: View<'_>, bytes: usize) -> Result<()> {
        src.require(bytes, "device copy source")?;
        dst.require(bytes, "device copy destination")?;
        if dst.overlaps(&src) {
            return Err(Error::Invalid(
                "a device copy between overlapping views".into(),
            ));
        }
        self.bind()?;
        // SAFETY: both views hold `bytes` bytes of this context's memory and do not overlap.
        unsafe { result::memcpy_dtod_async(dst.addr(), src.addr(), bytes, self.stream().cu()) }?;
        Ok(())
    }

    /// Repeats the first `period` bytes of `dst` over the rest of it, on the GPU (doubling
    /// copies: a handful however large `dst` is), and waits: a periodic fill of a large buffer
    /// from one small upload.
    pub fn repeat_prefix(&self, dst: View<'_>, period: usize) -> Result<()> {
        if period == 0 {
            return Err(Error::Invalid("repeat_prefix: an empty period".into()));
        }
        self.bind()?;
        let total = dst.bytes();
        // [0, done) holds whole periods; copying it to [done, ..) keeps the period
        let mut done = period.min(total);
        while done < total {
            let take = done.min(total - done);
            // SAFETY: [0, take) and [done, done + take) lie inside the view and do not overlap
            // (take <= done).
            unsafe {
                result::memcpy_dtod_async(
                    dst.addr() + done as u64,
                    dst.addr(),
                    take,
                    self.stream().cu(),
                )
            }?;
            done += take;
        }
        self.synchronize()
    }

    /// Copies the first `len` bytes of `src` to the host.
    pub fn download_from(&self, src: View<'_>, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        self.download_into(src, &mut out)?;
        Ok(out)
    }

    /// Copies the first `out.len()` bytes of `src` into `out` and waits for the copy.
    pub fn download_into(&self, src: View<'_>, out: &mut [u8]) -> Result<()> {
        src.require(out.len(), "download")?;
        self.bind()?;
        // SAFETY: the source holds out.len() bytes (checked); `out` lives until the synchronize.
        unsafe { result::memcpy_dtoh_async(out, src.addr(), self.stream().cu()) }?;
        self.synchronize()
    }

    /// Sets every byte of `dst` to `byte` and waits (poisoning outputs before a check).
    pub fn fill(&self, dst: View<'_>, byte: u8) -> Result<()> {
        self.bind()?;
        // SAFETY: the view's bytes are live device memory of this context.
        unsafe { result::memset_d8_async(dst.addr(), byte, dst.bytes(), self.stream().cu()) }?;
        self.synchronize()
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
    pub(crate) fn pool(&self) -> Result<sys::CUmemoryPool> {
        self.bind()?;
        // SAFETY: the context's own device.
        Ok(unsafe { result::device::get_default_mem_pool(self.cu_device()) }?)
    }

    fn pool_attr(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let pool = self.pool()?;
        let mut v: u64 = 0;
        // SAFETY: these attributes are cuuint64_t values; `v` is a live u64.
        unsafe { result::mem_pool::get_attribute(pool, attr, &mut v as *mut u64 as *mut _) }?;
        Ok(v)
    }

    /// The pool's figures now.
    pub fn pool_stats(&self) -> Result<PoolStats> {
        use sys::CUmemPool_attribute as A;
        Ok(PoolStats {
            used: self.pool_attr(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: self.pool_attr(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved: self.pool_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: self.pool_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Starts the peaks again from the current figures.
    pub fn reset_pool_peaks(&self) -> Result<()> {
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

    /// Makes the pool a cache: freed memory stays with the process until [`Gpu::empty_cache`].
    /// The pool's default release threshold (0) hands every unused byte back to the driver at
    /// each synchronization, so the next large allocation maps fresh pages again.
    pub(crate) fn keep_pool_cache(&self) -> Result<()> {
        let pool = self.pool()?;
        let mut max: u64 = u64::MAX;
        // SAFETY: the release threshold is a cuuint64_t; `max` is a live u64.
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut max as *mut u64 as *mut _,
            )
        }?;
        Ok(())
    }

    /// `empty_cache`: waits for queued work, then hands every cached byte back to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.synchronize()?;
        let pool = self.pool()?;
        // SAFETY: a live pool; trimming only releases memory no allocation holds.
        unsafe { result::mem_pool::trim_to(pool, 0) }?;
        Ok(())
    }
}
