//! NVML: what nvidia-smi shows, read through nvml-wrapper (which returns errors, never panics).
//!
//! To use: [`NvmlSession::open`] with the process's discovery, then [`NvmlSession::device`] by
//! UUID (CUDA and NVML number devices differently; the UUID is the same in both).

use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

/// An initialised NVML.
pub struct NvmlSession {
    nvml: Nvml,
}

/// One process holding GPU memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// From /proc; empty when the process is not visible (another container).
    pub name: String,
    pub used_memory_bytes: Option<u64>,
}

/// What NVML says of one device; each field is None when the device or driver does not report it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlDevice {
    /// NVML's index (PCI order; CUDA_VISIBLE_DEVICES does not apply).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub pci_bus_id: String,
    pub compute_capability: Option<(u32, u32)>,
    /// NVML reports it on recent drivers (device attributes); None where it does not.
    pub sm_count: Option<u32>,
    pub memory_total_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_memory_clock_mhz: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_bus_width_bits: Option<u32>,
    pub pcie_gen_current: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_current: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub power_draw_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub temperature_c: Option<u32>,
    pub utilization_gpu_pct: Option<u32>,
    pub utilization_memory_pct: Option<u32>,
    pub processes: Vec<GpuProcess>,
}

impl NvmlSession {
    /// Opens NVML from the path discovery found; the error says what is missing.
    pub fn open(discovery: &Discovery) -> Result<NvmlSession> {
        let found = discovery
            .found(Lib::Nvml)
            .ok_or_else(|| Error::MissingLibrary(discovery.missing_message(Lib::Nvml)))?;
        let nvml = Nvml::builder()
            .lib_path(found.path.as_os_str())
            .init()
            .map_err(|e| {
                Error::Nvml(format!(
                    "the library at {} failed to start: {e}",
                    found.path.display()
                ))
            })?;
        Ok(NvmlSession { nvml })
    }

    /// The driver's version string, e.g. `580.159.04`.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// The CUDA driver API version the driver supports (13000 = 13.0), without starting CUDA.
    pub fn cuda_driver_version(&self) -> Option<i32> {
        self.nvml.sys_cuda_driver_version().ok()
    }

    /// Every device NVML sees, in its (PCI) order.
    pub fn devices(&self) -> Result<Vec<NvmlDevice>> {
        let n = self
            .nvml
            .device_count()
            .map_err(|e| Error::Nvml(format!("device count: {e}")))?;
        (0..n)
            .map(|i| {
                let d = self
                    .nvml
                    .device_by_index(i)
                    .map_err(|e| Error::Nvml(format!("device {i}: {e}")))?;
                Ok(Self::facts(&d))
            })
            .collect()
    }

    /// Facts for the device with this UUID (`GPU-...`).
    pub fn device(&self, uuid: &str) -> Result<NvmlDevice> {
        let d = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(|e| Error::Nvml(format!("no device {uuid}: {e}")))?;
        Ok(Self::facts(&d))
    }

    fn facts(d: &nvml_wrapper::Device<'_>) -> NvmlDevice {
        let mem = d.memory_info().ok();
        let processes = d
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                name: std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        let util = d.utilization_rates().ok();
        NvmlDevice {
            index: d.index().unwrap_or(0),
            name: d.name().unwrap_or_default(),
            uuid: d.uuid().unwrap_or_default(),
            pci_bus_id: d
                .pci_info()
                .map(|p| p.bus_id.to_ascii_uppercase())
                .unwrap_or_default(),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| (c.major as u32, c.minor as u32)),
            sm_count: d
                .attributes()
                .ok()
                .map(|a| a.multiprocessor_count)
                .filter(|&n| n > 0),
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            memory_free_bytes: mem.as_ref().map(|m| m.free),
            memory_used_bytes: mem.as_ref().map(|m| m.used),
            max_sm_clock_mhz: d.max_clock_info(Clock::SM).ok(),
            max_memory_clock_mhz: d.max_clock_info(Clock::Memory).ok(),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            memory_bus_width_bits: d.memory_bus_width().ok(),
            pcie_gen_current: d.current_pcie_link_gen().ok(),
            pcie_gen_max: d.max_pcie_link_gen().ok(),
            pcie_width_current: d.current_pcie_link_width().ok(),
            pcie_width_max: d.max_pcie_link_width().ok(),
            power_draw_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            power_limit_w: d
                .enforced_power_limit()
                .ok()
                .map(|mw| f64::from(mw) / 1000.0),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            utilization_gpu_pct: util.as_ref().map(|u| u.gpu),
            utilization_memory_pct: util.as_ref().map(|u| u.memory),
            processes,
        }
    }
}
