//! Host <-> device and device <-> device copies: pinned host buffers, asynchronous copies on a
//! stream, and a double-buffered staging path for pageable host memory.
//!
//! To use: [`PinnedBytes::new`] for page-locked host memory; [`copy_h2d`], [`copy_d2h`],
//! [`copy_d2d`] queue one copy on a stream (asynchronous when the host side is pinned);
//! [`h2d_staged`] moves pageable memory through two pinned buffers so the host copy of one chunk
//! overlaps the DMA of the previous one.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, View};
use crate::stream::Stream;
use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;

/// Page-locked host memory, freed on drop.
pub struct PinnedBytes {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is plain host memory owned by this value; access goes through &/&mut.
unsafe impl Send for PinnedBytes {}
// SAFETY: shared access is read-only.
unsafe impl Sync for PinnedBytes {}

impl PinnedBytes {
    /// `len` bytes of pinned memory. `write_combined`: fast for the host to write and the GPU to
    /// read, very slow for the host to read, so only for host-to-device sources.
    pub fn new(gpu: &Gpu, len: usize, write_combined: bool) -> Result<PinnedBytes> {
        gpu.bind()?;
        let flags = if write_combined {
            sys::CU_MEMHOSTALLOC_WRITECOMBINED
        } else {
            0
        };
        // SAFETY: a plain allocation; the pointer is owned by the returned value.
        let ptr = unsafe { result::malloc_host(len.max(1), flags) }? as *mut u8;
        Ok(PinnedBytes {
            ptr,
            len,
            ctx: gpu.ctx().clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. The caller must not read them while a copy into them is in flight (synchronize
    /// the stream first); the borrow checker cannot see the device's side.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes (zero-length slices are fine too).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive host access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host in new(); no copy can be in flight once the owner
        // drops it (every user synchronizes its stream before letting go).
        unsafe {
            let _ = result::free_host(self.ptr as *mut std::ffi::c_void);
        }
    }
}

fn check_len(what: &'static str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::Invalid(format!(
            "{what}: buffer of {have} bytes is smaller than the {need} bytes to copy"
        )));
    }
    Ok(())
}

/// Queues `src` (host) -> `dst` (device) on `stream`. Pageable `src` makes the driver stage it
/// (and the call returns only when `src` may be reused); pinned `src` is a true async DMA, and
/// `src` must stay untouched until the stream has passed the copy.
pub fn copy_h2d(stream: &Stream, src: &[u8], dst: &mut DeviceBuffer) -> Result<()> {
    check_len("host->device", dst.len(), src.len())?;
    // SAFETY: dst holds at least src.len() bytes; src is live for the call (pageable) or kept
    // alive by the caller until the stream is synchronized (pinned).
    unsafe { result::memcpy_htod_async(dst.addr(), src, stream.cu()) }?;
    Ok(())
}

/// Queues the first `len` bytes of pinned `src` -> `dst` on `stream` (a true async DMA): `src`
/// must stay untouched until the stream has passed the copy (record an event and wait for it
/// before refilling).
pub fn copy_pinned_to(stream: &Stream, src: &PinnedBytes, len: usize, dst: View<'_>) -> Result<()> {
    check_len("pinned host->device source", src.len(), len)?;
    dst.require(len, "pinned host->device")?;
    // SAFETY: both sides hold `len` bytes (checked); the pinned buffer outlives the copy by the
    // caller's contract above.
    unsafe { result::memcpy_htod_async(dst.addr(), &src.as_slice()[..len], stream.cu()) }?;
    Ok(())
}

/// Queues bytes `from..from + len` of pinned `src` -> `dst` on `stream` (a true async DMA), under
/// [`copy_pinned_to`]'s contract.
pub fn copy_pinned_range_to(
    stream: &Stream,
    src: &PinnedBytes,
    from: usize,
    len: usize,
    dst: View<'_>,
) -> Result<()> {
    let end = from.saturating_add(len);
    check_len("pinned host->device source", src.len(), end)?;
    dst.require(len, "pinned host->device")?;
    // SAFETY: the range lies in the pinned buffer and dst holds `len` bytes (checked); the
    // pinned buffer outlives the copy by the caller's contract.
    unsafe { result::memcpy_htod_async(dst.addr(), &src.as_slice()[from..end], stream.cu()) }?;
    Ok(())
}

/// Queues the first `len` bytes of `src` (device) -> pinned `dst` on `stream` (a true async
/// DMA): `dst` must not be read or dropped before the stream has passed the copy.
pub fn copy_to_pinned(
    stream: &Stream,
    src: View<'_>,
    dst: &mut PinnedBytes,
    len: usize,
) -> Result<()> {
    check_len("device->pinned host destination", dst.len(), len)?;
    src.require(len, "device->pinned host")?;
    // SAFETY: both sides hold `len` bytes (checked); the pinned buffer outlives the copy by the
    // caller's contract above.
    unsafe { result::memcpy_dtoh_async(&mut dst.as_mut_slice()[..len], src.addr(), stream.cu()) }?;
    Ok(())
}

/// Queues `src` (device) -> `dst` (host) on `stream`; `dst` must not be read before the stream
/// is synchronized.
pub fn copy_d2h(stream: &Stream, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
    check_len("device->host", src.len(), dst.len())?;
    // SAFETY: src holds at least dst.len() bytes; dst outlives the copy (caller synchronizes).
    unsafe { result::memcpy_dtoh_async(dst, src.addr(), stream.cu()) }?;
    Ok(())
}

/// Queues a device -> device copy of `bytes` bytes.
pub fn copy_d2d(
    stream: &Stream,
    src: &DeviceBuffer,
    dst: &mut DeviceBuffer,
    bytes: usize,
) -> Result<()> {
    check_len("device->device source", src.len(), bytes)?;
    check_len("device->device destination", dst.len(), bytes)?;
    // SAFETY: both buffers hold at least `bytes` bytes and live on this context.
    unsafe { result::memcpy_dtod_async(dst.addr(), src.addr(), bytes, stream.cu()) }?;
    Ok(())
}

/// Copies pageable `src` to `dst` through two pinned staging buffers: while the GPU pulls chunk
/// i from one buffer, `host_copy` fills the other with chunk i+1. Returns once the last chunk is
/// queued; synchronize `stream` before reading `dst` or reusing `staging`.
/// `host_copy(dst, src)` copies equal-length slices (the caller may spread it over threads).
pub fn h2d_staged(
    stream: &Stream,
    src: &[u8],
    dst: &mut DeviceBuffer,
    staging: &mut [PinnedBytes; 2],
    host_copy: &(dyn Fn(&mut [u8], &[u8]) + Sync),
) -> Result<()> {
    check_len("staged host->device", dst.len(), src.len())?;
    let chunk = staging[0].len().min(staging[1].len()).max(1);
    let raw = stream.raw();
    let ctx = raw.context().clone();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
    let mut done = [ctx.new_event(flags)?, ctx.new_event(flags)?];
    let mut used = [false, false];
    let base = dst.addr();
    for (i, piece) in src.chunks(chunk).enumerate() {
        let b = i % 2;
        if used[b] {
            // the DMA that last read this buffer must finish before the host overwrites it
            done[b].synchronize()?;
        }
        let buf = &mut staging[b].as_mut_slice()[..piece.len()];
        host_copy(buf, piece);
        let offset = (i * chunk) as u64;
        // SAFETY: dst holds src.len() bytes, so base + offset + piece.len() is in bounds; the
        // staging buffer stays untouched until `done[b]` has fired (checked above next time).
        unsafe { result::memcpy_htod_async(base + offset, &*buf, stream.cu()) }?;
        done[b] = raw.record_event(flags)?;
        used[b] = true;
    }
    Ok(())
}

/// Lets `from`'s kernels and copies reach `to`'s memory directly (over NVLink or PCIe peer to
/// peer). Returns false when the pair cannot (copies between them then go through the host);
/// enabling twice is not an error. gpukit's buffers come from `to`'s stream-ordered memory
/// pool, which keeps its own access list (peer access of the contexts does not reach it): the
/// pool is opened to `from` too, else the driver stages every peer copy through the host.
pub fn enable_peer_access(from: &Gpu, to: &Gpu) -> Result<bool> {
    if from.ordinal == to.ordinal {
        return Ok(true);
    }
    let mut can = 0;
    // SAFETY: both devices are valid handles of open contexts; `can` is a live local.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.cu_device(), to.cu_device()) }.result()?;
    if can == 0 {
        return Ok(false);
    }
    from.bind()?;
    // SAFETY: `to`'s context is live; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(to.ctx().cu_ctx(), 0) } {
        sys::cudaError_enum::CUDA_SUCCESS
        | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        rc => return Err(cudarc::driver::DriverError(rc).into()),
    }
    let pool = to.pool()?;
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: from.ordinal as i32,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is `to`'s live default pool; one descriptor is passed.
    unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }.result()?;
    Ok(true)
}

/// Queues a copy of `bytes` bytes from `src` (memory of `src_gpu`) to `dst` (memory of
/// `dst_gpu`) on `stream` (a stream of either device).
pub fn copy_peer(
    stream: &Stream,
    dst: View<'_>,
    dst_gpu: &Gpu,
    src: View<'_>,
    src_gpu: &Gpu,
    bytes: usize,
) -> Result<()> {
    check_len("peer copy source", src.bytes(), bytes)?;
    check_len("peer copy destination", dst.bytes(), bytes)?;
    // SAFETY: both views hold `bytes` bytes of their devices' memory and both contexts are live.
    unsafe {
        sys::cuMemcpyPeerAsync(
            dst.addr(),
            dst_gpu.ctx().cu_ctx(),
            src.addr(),
            src_gpu.ctx().cu_ctx(),
            bytes,
            stream.cu(),
        )
    }
    .result()?;
    Ok(())
}
