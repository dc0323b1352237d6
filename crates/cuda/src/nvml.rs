//! NVML: what nvidia-smi shows, read through nvml-wrapper (which returns errors, never panics).
//!
//! To use: [`NvmlSession::open`] with the process's discovery, then [`NvmlSession::device`] by
//! UUID (CUDA and NVML number devices differently; the UUID is the same in both).

use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
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
        self.each_device(Self::facts)
    }

    /// `read` applied to every device, in NVML's order.
    fn each_device<T>(&self, read: impl Fn(&nvml_wrapper::Device<'_>) -> T) -> Result<Vec<T>> {
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
                Ok(read(&d))
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

// ---- sampling (gpukit monitor) ----

/// A process holding memory on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ProcessSample {
    pub pid: u32,
    /// From /proc/PID/comm ("" when it cannot be read).
    pub name: String,
    pub used_memory_bytes: Option<u64>,
    /// The process's SM utilisation over the last sampling period, when NVML reports it.
    pub sm_util_pct: Option<u32>,
}

/// One GPU at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GpuSample {
    /// Milliseconds since the Unix epoch when the reading was taken.
    pub unix_ms: u64,
    /// NVML's index (nvidia-smi's numbering).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: String,
    /// Percent of the last period in which a kernel ran (nvidia-smi's utilization.gpu).
    pub utilization_gpu_pct: Option<u32>,
    /// Percent of the last period in which memory was read or written (utilization.memory).
    pub utilization_memory_pct: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_draw_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    /// PCIe throughput over NVML's last 20 ms window, bytes a second.
    pub pcie_tx_bytes_per_s: Option<u64>,
    pub pcie_rx_bytes_per_s: Option<u64>,
    /// Energy since the driver loaded, millijoules (NVML's counter; Volta and later).
    pub energy_mj: Option<u64>,
    /// Why the clocks are held down now (NVML's throttle reasons), by name: "sw_power_cap",
    /// "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake", "sync_boost",
    /// "display_clocks", "applications_clocks", "gpu_idle". Empty: running free.
    pub throttle_reasons: Vec<String>,
    /// Uncorrected ECC errors since the driver loaded (volatile count).
    pub ecc_uncorrected: Option<u64>,
    pub processes: Vec<ProcessSample>,
}

impl GpuSample {
    /// Whether the chip is held below its clocks for power or heat (not idling, not a
    /// user-set application clock).
    pub fn throttled(&self) -> bool {
        self.throttle_reasons.iter().any(|r| {
            matches!(
                r.as_str(),
                "sw_power_cap" | "hw_slowdown" | "sw_thermal" | "hw_thermal" | "hw_power_brake"
            )
        })
    }
}

/// NVML's throttle-reason bits and gpukit's names for them.
const REASONS: [(ThrottleReasons, &str); 9] = [
    (ThrottleReasons::GPU_IDLE, "gpu_idle"),
    (
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
        "applications_clocks",
    ),
    (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal"),
    (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
    (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display_clocks"),
];

impl NvmlSession {
    /// One reading of every GPU, in NVML's order. `since_us` is the previous round's time
    /// (microseconds since the epoch) for per-process SM utilisation over the period.
    pub fn sample_all(&self, since_us: Option<u64>) -> Result<Vec<GpuSample>> {
        self.each_device(|d| Self::sample(d, since_us))
    }

    fn sample(d: &nvml_wrapper::Device<'_>, since_us: Option<u64>) -> GpuSample {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_millis() as u64)
            .unwrap_or(0);
        let facts = Self::facts(d);
        let sm_util: std::collections::HashMap<u32, u32> = d
            .process_utilization_stats(since_us)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.pid, p.sm_util))
            .collect();
        let kb = |c| d.pcie_throughput(c).ok().map(|k| u64::from(k) * 1024);
        GpuSample {
            unix_ms,
            index: facts.index,
            uuid: facts.uuid,
            name: facts.name,
            pci_bus_id: facts.pci_bus_id,
            utilization_gpu_pct: facts.utilization_gpu_pct,
            utilization_memory_pct: facts.utilization_memory_pct,
            memory_used_bytes: facts.memory_used_bytes,
            memory_total_bytes: facts.memory_total_bytes,
            temperature_c: facts.temperature_c,
            power_draw_w: facts.power_draw_w,
            power_limit_w: facts.power_limit_w,
            sm_clock_mhz: facts.sm_clock_mhz,
            memory_clock_mhz: d.clock_info(Clock::Memory).ok(),
            pcie_tx_bytes_per_s: kb(PcieUtilCounter::Send),
            pcie_rx_bytes_per_s: kb(PcieUtilCounter::Receive),
            energy_mj: d.total_energy_consumption().ok(),
            throttle_reasons: d
                .current_throttle_reasons()
                .map(|r| {
                    REASONS
                        .iter()
                        .filter(|(bit, _)| r.contains(*bit))
                        .map(|(_, name)| name.to_string())
                        .collect()
                })
                .unwrap_or_default(),
            ecc_uncorrected: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
            processes: facts
                .processes
                .into_iter()
                .map(|p| ProcessSample {
                    sm_util_pct: sm_util.get(&p.pid).copied(),
                    pid: p.pid,
                    name: p.name,
                    used_memory_bytes: p.used_memory_bytes,
                })
                .collect(),
        }
    }
}
