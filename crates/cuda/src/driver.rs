//! The CUDA driver: whether it is usable at all, the devices it sees, their attributes and
//! contexts.
//!
//! To use:
//! 1. [`probe`] with the process's [`Discovery`]: it checks that libcuda was found, that the
//!    driver's CUDA version is new enough for this build (before any call that might need a newer
//!    symbol: cudarc resolves symbols lazily and panics on a missing one), and that a device exists.
//! 2. [`device_attributes`] reads a device's facts without creating a context (cheap).
//! 3. [`Gpu::open`] creates the context and stream for real work.

use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib, REQUIRED_DRIVER_API};
use crate::stream::{Graph, Stream};
use cudarc::driver::{result, sys, CudaContext, DriverError};
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::sync::{Arc, Mutex};

pub use crate::error::{fmt_api, Unavailable};

/// A usable driver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Driver {
    /// As `cuDriverGetVersion` reports it (13000 = CUDA 13.0).
    pub api_version: i32,
    pub device_count: usize,
}

/// Checks libcuda, the driver version and the device count, in that order.
pub fn probe(discovery: &Discovery) -> Result<Driver, Unavailable> {
    if !discovery.usable(Lib::Cuda) {
        return Err(Unavailable::NoDriver {
            hint: Lib::Cuda.install_hint(),
        });
    }
    let t = crate::trace::start();
    // SAFETY: only asks the loader whether one of cudarc's candidate names opens.
    let present = unsafe { sys::is_culib_present() };
    crate::trace::done("driver: open libcuda", t);
    if !present {
        return Err(Unavailable::NoDriver {
            hint: format!(
                "found at {} but it did not load",
                discovery
                    .found(Lib::Cuda)
                    .map(|f| f.path.display().to_string())
                    .unwrap_or_default()
            ),
        });
    }
    let mut api_version = 0;
    // SAFETY: cuDriverGetVersion exists in every driver and may be called before cuInit; the
    // pointer is to a live local.
    let rc = unsafe { sys::cuDriverGetVersion(&mut api_version) };
    if rc != sys::cudaError_enum::CUDA_SUCCESS {
        return Err(Unavailable::InitFailed {
            error: format!("cuDriverGetVersion: {rc:?}"),
        });
    }
    if api_version < REQUIRED_DRIVER_API {
        return Err(Unavailable::DriverTooOld {
            driver_api: api_version,
            required_api: REQUIRED_DRIVER_API,
        });
    }
    let t = crate::trace::start();
    let init = result::init();
    crate::trace::done("driver: cuInit", t);
    match init {
        Ok(()) => {}
        Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => {
            return Err(Unavailable::NoDevice {
                error: e.to_string(),
            })
        }
        Err(e) => {
            return Err(Unavailable::InitFailed {
                error: e.to_string(),
            })
        }
    }
    let count = result::device::get_count().map_err(|e| Unavailable::InitFailed {
        error: e.to_string(),
    })?;
    if count <= 0 {
        return Err(Unavailable::NoDevice {
            error: "cuDeviceGetCount returned 0".into(),
        });
    }
    Ok(Driver {
        api_version,
        device_count: count as usize,
    })
}

/// Facts the driver gives without a context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceAttributes {
    pub ordinal: usize,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-...`, as nvidia-smi prints it.
    pub uuid: String,
    /// `00000000:19:00.0`, as nvidia-smi prints it.
    pub pci_bus_id: String,
    pub total_memory_bytes: u64,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    /// From the driver attribute; 0 where the driver no longer reports it.
    pub sm_clock_khz: u32,
    pub memory_clock_khz: u32,
    pub memory_bus_width_bits: u32,
    pub l2_cache_bytes: u64,
    pub max_shared_memory_per_block_optin_bytes: u64,
    pub max_threads_per_sm: u32,
    pub ecc_enabled: bool,
    pub integrated: bool,
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32, DriverError> {
    // SAFETY: dev came from cuDeviceGet after a successful cuInit.
    unsafe { result::device::get_attribute(dev, a) }
}

/// Reads [`DeviceAttributes`] for `ordinal` (the driver must have been [`probe`]d).
pub fn device_attributes(ordinal: usize, count: usize) -> Result<DeviceAttributes> {
    if ordinal >= count {
        return Err(Error::NoSuchDevice {
            requested: ordinal,
            count,
        });
    }
    use sys::CUdevice_attribute as A;
    let dev = result::device::get(ordinal as i32)?;
    let name = result::device::get_name(dev)?;
    let uuid = fmt_uuid(&result::device::get_uuid(dev)?.bytes);
    // SAFETY: dev is valid (above).
    let total = unsafe { result::device::total_mem(dev) }? as u64;
    let mut bus = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer is 32 bytes and its length is passed; the driver writes a NUL-terminated id.
    unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) }.result()?;
    // SAFETY: NUL-terminated by the driver within the buffer (zero-initialised as a fallback).
    let pci_bus_id =
        nvidia_smi_bus_id(&unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy());
    let u = |a| attr(dev, a).map(|v| v.max(0) as u32);
    Ok(DeviceAttributes {
        ordinal,
        name,
        uuid,
        pci_bus_id,
        total_memory_bytes: total,
        compute_capability: (
            u(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            u(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: u(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        sm_clock_khz: u(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE).unwrap_or(0),
        memory_clock_khz: u(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0),
        memory_bus_width_bits: u(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0),
        l2_cache_bytes: u64::from(u(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?),
        max_shared_memory_per_block_optin_bytes: u64::from(
            u(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).unwrap_or(0),
        ),
        max_threads_per_sm: u(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR).unwrap_or(0),
        ecc_enabled: u(A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED).unwrap_or(0) != 0,
        integrated: u(A::CU_DEVICE_ATTRIBUTE_INTEGRATED).unwrap_or(0) != 0,
    })
}

/// CUDA writes `0000:00:06.0`; nvidia-smi and NVML write the domain with 8 digits.
fn nvidia_smi_bus_id(cuda: &str) -> String {
    match cuda.split_once(':') {
        Some((domain, rest)) if domain.len() < 8 => {
            format!("{domain:0>8}:{rest}").to_ascii_uppercase()
        }
        _ => cuda.to_ascii_uppercase(),
    }
}

/// Formats a CUDA UUID as nvidia-smi and NVML do.
pub fn fmt_uuid(b: &[std::ffi::c_char; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{:02x}", *x as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// `matrix[i][j]`: device i can read and write device j's memory directly.
pub fn peer_access_matrix(count: usize) -> Result<Vec<Vec<bool>>> {
    let mut m = vec![vec![false; count]; count];
    for (i, row) in m.iter_mut().enumerate() {
        for (j, cell) in row.iter_mut().enumerate() {
            if i == j {
                *cell = true;
                continue;
            }
            let (a, b) = (
                result::device::get(i as i32)?,
                result::device::get(j as i32)?,
            );
            let mut can = 0;
            // SAFETY: both devices are valid handles; `can` is a live local.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) }.result()?;
            *cell = can != 0;
        }
    }
    Ok(m)
}

/// A device opened for work: its primary context and a non-default work stream.
pub struct Gpu {
    pub ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Stream,
    /// What was found at open (the libraries later calls load from).
    discovery: Discovery,
    /// What crates above keep per opened device (the tensor ops' kernels and cuBLAS handle):
    /// one value of each type, made on first use, dropped with the device.
    extensions: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Gpu {
    /// Opens `cuda:<ordinal>` after checking that the driver is usable and the device exists.
    pub fn open(discovery: &Discovery, ordinal: usize) -> Result<Gpu> {
        let driver = probe(discovery)?;
        if ordinal >= driver.device_count {
            return Err(Error::NoSuchDevice {
                requested: ordinal,
                count: driver.device_count,
            });
        }
        let ctx = CudaContext::new(ordinal)?;
        // gpukit orders its streams itself (events where two meet); cudarc's automatic
        // per-buffer events would add work to every call and break graph capture.
        // SAFETY: every buffer gpukit makes is used on the stream that made it, or ordered by
        // explicit events/synchronization where it is not.
        unsafe { ctx.disable_event_tracking() };
        let stream = Stream::new(ctx.new_stream()?);
        let gpu = Gpu {
            ordinal,
            ctx,
            stream,
            discovery: discovery.clone(),
            extensions: Mutex::new(Vec::new()),
        };
        gpu.keep_pool_cache()?;
        Ok(gpu)
    }

    /// The work stream: everything gpukit enqueues on this device goes here unless it makes
    /// another with [`Gpu::new_stream`].
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// A second stream on this device (work on it may overlap the work stream's).
    pub fn new_stream(&self) -> Result<Stream> {
        Ok(Stream::new(self.ctx.new_stream()?))
    }

    /// A second stream at the device's highest priority: as SMs free up, its kernels' blocks
    /// are scheduled before those of kernels already waiting on normal streams (for
    /// communication that must overlap the work stream's products).
    pub fn new_priority_stream(&self) -> Result<Stream> {
        self.bind()?;
        let (_, greatest) = cudarc::driver::result::stream::get_priority_range()?;
        Ok(Stream::new(self.ctx.new_stream_with_priority(greatest)?))
    }

    /// The libraries found when this device was opened.
    pub fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    /// This device's value of type `T`, made by `make` on the first call for the type and
    /// shared after (until the device is dropped); a failure is not kept, so a later call tries
    /// again. Crates above keep their per-device state here (the tensor crate its kernels and
    /// cuBLAS handle): one value for each opened device, without this crate knowing its type.
    /// `make` runs under the lock of these values, so it must not ask for another.
    pub fn extension<T: Any + Send + Sync>(
        &self,
        make: impl FnOnce(&Gpu) -> Result<T>,
    ) -> Result<Arc<T>> {
        let mut values = self.extensions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = values.iter().find_map(|v| v.clone().downcast::<T>().ok()) {
            return Ok(found);
        }
        let value = Arc::new(make(self)?);
        values.push(value.clone());
        Ok(value)
    }

    /// Runs `enqueue` with the work stream in capture mode and returns what it queued as a
    /// graph, uploaded and ready to launch. The capture is ended whatever `enqueue` returns, so
    /// the stream stays usable after an error.
    pub fn capture<E: From<Error>>(
        &self,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<Graph, E> {
        self.stream().capture(enqueue)
    }

    /// Waits for everything queued on the work stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }

    /// (free, total) bytes of device memory, as the driver sees them now.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info()?;
        Ok((free as u64, total as u64))
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> Result<String> {
        Ok(self.ctx.name()?)
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        let (major, minor) = self.ctx.compute_capability()?;
        Ok((major.max(0) as u32, minor.max(0) as u32))
    }

    /// Makes this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        Ok(self.ctx.bind_to_thread()?)
    }

    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(crate) fn cu_device(&self) -> sys::CUdevice {
        self.ctx.cu_device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_formats_like_nvidia_smi() {
        let mut b = [0 as std::ffi::c_char; 16];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u8 * 17) as std::ffi::c_char;
        }
        assert_eq!(fmt_uuid(&b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn bus_id_formats_like_nvidia_smi() {
        assert_eq!(nvidia_smi_bus_id("0000:19:00.0"), "00000000:19:00.0");
        assert_eq!(nvidia_smi_bus_id("0000:9a:00.0"), "00000000:9A:00.0");
        assert_eq!(nvidia_smi_bus_id("00000000:00:06.0"), "00000000:00:06.0");
    }

    #[test]
    fn driver_too_old_names_both_versions_and_the_fix() {
        let e = Unavailable::DriverTooOld {
            driver_api: 12040,
            required_api: 13000,
        };
        let s = e.to_string();
        assert!(s.contains("CUDA 12.4"), "{s}");
        assert!(s.contains("CUDA 13.0"), "{s}");
        assert!(s.contains("--features cuda-12"), "{s}");
    }
}
