//! NVML: what nvidia-smi shows, read through nvml-wrapper (which returns errors, never panics).
//!
//! To use: [`NvmlSession::open`] with the process's discovery, then [`NvmlSession::device`] by
//! UUID (CUDA and NVML number devices differently; the UUID is the same in both).

use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_POWER_INSTANT,
};
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

mod health;
pub use health::{HealthCounters, XidWait, XidWatch};

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
                name: process_name(p.pid),
                used_memory_bytes: used_bytes(&p.used_gpu_memory),
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
    /// NVML's power reading (nvidia-smi's power.draw): on recent chips an average over about
    /// a second, so it lags a change of load.
    pub power_draw_w: Option<f64>,
    /// The instantaneous reading (nvidia-smi's power.draw.instant), where the driver has one.
    #[serde(default)]
    pub power_instant_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    /// PCIe throughput over NVML's last 20 ms window, bytes a second.
    pub pcie_tx_bytes_per_s: Option<u64>,
    pub pcie_rx_bytes_per_s: Option<u64>,
    /// The driver's PCIe byte counters, where it has them (the rates come from their change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_tx_counter: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_rx_counter: Option<u64>,
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
        self.throttle_reasons.iter().any(|r| throttling(r))
    }
}

impl NvmlSession {
    /// One reading of every GPU, in NVML's order. `previous` is the last round (empty at the
    /// start): per-process SM utilisation covers the time since it, and PCIe rates are the
    /// byte counters' change since it.
    /// `what` picks the costly readings: the processes, and the energy counter (about 4 ms of
    /// CPU a read on an H100, when every other reading costs microseconds).
    pub fn sample_all(&self, previous: &[GpuSample], what: Readings) -> Result<Vec<GpuSample>> {
        self.each_device(|d| Self::sample(d, previous, what))
    }

    /// Reads only what a sample shows: every call here is cheap (no 20 ms PCIe window where
    /// the driver has byte counters), so sampling costs less CPU than nvidia-smi's loop.
    fn sample(d: &nvml_wrapper::Device<'_>, previous: &[GpuSample], what: Readings) -> GpuSample {
        let processes = what.processes;
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_millis() as u64)
            .unwrap_or(0);
        let index = d.index().unwrap_or(0);
        let prev = previous.iter().find(|p| p.index == index);
        let sm_util: std::collections::HashMap<u32, u32> = if processes {
            d.process_utilization_stats(prev.map(|p| p.unix_ms * 1000))
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.pid, p.sm_util))
                .collect()
        } else {
            Default::default()
        };
        let [instant, tx, rx] = fields(
            d,
            [
                NVML_FI_DEV_POWER_INSTANT,
                NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
            ],
        );
        // bytes a second from the counters' change since the previous round; the driver's
        // 20 ms throughput window where it has no counters
        let rate = |now: Option<f64>, before: Option<u64>, counter| match (now, prev) {
            (Some(n), Some(p)) => {
                let dt = unix_ms.saturating_sub(p.unix_ms);
                before
                    .filter(|&b| dt > 0 && n as u64 >= b)
                    .map(|b| (n as u64 - b) * 1000 / dt)
            }
            (Some(_), None) => None,
            (None, _) => d.pcie_throughput(counter).ok().map(|k| u64::from(k) * 1024),
        };
        let mem = d.memory_info().ok();
        let util = d.utilization_rates().ok();
        let running = if processes {
            d.running_compute_processes().unwrap_or_default()
        } else {
            Vec::new()
        };
        let processes = running
            .into_iter()
            .map(|p| ProcessSample {
                sm_util_pct: sm_util.get(&p.pid).copied(),
                pid: p.pid,
                name: process_name(p.pid),
                used_memory_bytes: used_bytes(&p.used_gpu_memory),
            })
            .collect();
        GpuSample {
            unix_ms,
            index,
            uuid: d.uuid().unwrap_or_default(),
            name: d.name().unwrap_or_default(),
            pci_bus_id: d
                .pci_info()
                .map(|p| p.bus_id.to_ascii_uppercase())
                .unwrap_or_default(),
            utilization_gpu_pct: util.as_ref().map(|u| u.gpu),
            utilization_memory_pct: util.as_ref().map(|u| u.memory),
            memory_used_bytes: mem.as_ref().map(|m| m.used),
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_draw_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            power_instant_w: instant.filter(|&mw| mw > 0.0).map(|mw| mw / 1000.0),
            power_limit_w: d
                .enforced_power_limit()
                .ok()
                .map(|mw| f64::from(mw) / 1000.0),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            memory_clock_mhz: d.clock_info(Clock::Memory).ok(),
            pcie_tx_bytes_per_s: rate(
                tx,
                prev.and_then(|p| p.pcie_tx_counter),
                PcieUtilCounter::Send,
            ),
            pcie_rx_bytes_per_s: rate(
                rx,
                prev.and_then(|p| p.pcie_rx_counter),
                PcieUtilCounter::Receive,
            ),
            pcie_tx_counter: tx.map(|v| v as u64),
            pcie_rx_counter: rx.map(|v| v as u64),
            energy_mj: what
                .energy
                .then(|| d.total_energy_consumption().ok())
                .flatten(),
            throttle_reasons: throttle_names(d),
            ecc_uncorrected: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
            processes,
        }
    }
}

/// A process's name from /proc ("" when it is not visible: another container).
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn used_bytes(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(*b),
        UsedGpuMemory::Unavailable => None,
    }
}

/// NVML field values by id, as numbers (None where the driver does not report one).
fn fields<const N: usize>(d: &nvml_wrapper::Device<'_>, ids: [u32; N]) -> [Option<f64>; N] {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let mut out = [None; N];
    let Ok(values) = d.field_values_for(&ids.map(FieldId)) else {
        return out;
    };
    for (slot, v) in out.iter_mut().zip(values) {
        *slot = v.ok().and_then(|v| v.value.ok()).map(|v| match v {
            SampleValue::U32(x) => f64::from(x),
            SampleValue::U64(x) => x as f64,
            SampleValue::I64(x) => x as f64,
            SampleValue::F64(x) => x,
        });
    }
    out
}

/// The instantaneous board power in watts, where the driver reports it.
fn instant_power_w(d: &nvml_wrapper::Device<'_>) -> Option<f64> {
    let [mw] = fields(d, [NVML_FI_DEV_POWER_INSTANT]);
    mw.filter(|&mw| mw > 0.0).map(|mw| mw / 1000.0)
}

/// The throttle reasons in force now, by gpukit's names (empty when unreadable).
fn throttle_names(d: &nvml_wrapper::Device<'_>) -> Vec<String> {
    d.current_throttle_reasons()
        .map(|r| gpukit_types::throttle::names(r.bits()))
        .unwrap_or_default()
}

/// The readings of a sample that cost more than microseconds, asked for only where shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readings {
    /// The processes on each GPU, with their memory and SM utilisation.
    pub processes: bool,
    /// NVML's energy counter.
    pub energy: bool,
}

impl Readings {
    pub const ALL: Readings = Readings {
        processes: true,
        energy: true,
    };
}

/// What a sampler beside timed work reads: cheap enough to take every few milliseconds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PowerReading {
    /// The instantaneous power where the driver has it, else the averaged reading.
    pub power_w: Option<f64>,
    /// Whether `power_w` is the instantaneous reading.
    pub instant: bool,
    pub sm_clock_mhz: Option<u32>,
    pub throttle_reasons: Vec<String>,
    /// The processes holding memory on the device, when asked for.
    pub pids: Option<Vec<u32>>,
}

/// Whether a throttle reason holds the chip down for power or heat.
pub use gpukit_types::throttle::throttling;

impl NvmlSession {
    /// NVML's index of the device with this UUID.
    pub fn index_of(&self, uuid: &str) -> Result<u32> {
        self.nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.index())
            .map_err(|e| Error::Nvml(format!("no device {uuid}: {e}")))
    }

    /// The enforced power limit of device `index`, in watts.
    pub fn power_limit_w(&self, index: u32) -> Option<f64> {
        let d = self.nvml.device_by_index(index).ok()?;
        d.enforced_power_limit()
            .ok()
            .map(|mw| f64::from(mw) / 1000.0)
    }

    /// A light reading of device `index` (the running processes only when `processes`).
    pub fn power_reading(&self, index: u32, processes: bool) -> Result<PowerReading> {
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| Error::Nvml(format!("device {index}: {e}")))?;
        let instant = instant_power_w(&d);
        Ok(PowerReading {
            instant: instant.is_some(),
            power_w: instant.or_else(|| d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0)),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            throttle_reasons: throttle_names(&d),
            pids: processes.then(|| {
                d.running_compute_processes()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|p| p.pid)
                    .collect()
            }),
        })
    }
}

/// How two GPUs are connected, as NVML reports it (what `nvidia-smi topo -m` prints).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerLink {
    /// Active NVLinks from the first GPU whose far end is the second GPU.
    pub nvlinks_direct: u32,
    /// Active NVLinks from the first GPU to something that is not a GPU of this pair (an
    /// NVSwitch, on machines where every GPU reaches every other through switches).
    pub nvlinks_other: u32,
    /// NVLink generation (4 on Hopper), when a link reports it.
    pub nvlink_version: Option<u32>,
    /// The nearest common PCIe ancestor (`same board`, `one PCIe switch`, `several PCIe
    /// switches`, `host bridge`, `NUMA node`, `across CPUs`), when NVML says.
    pub pcie_path: Option<String>,
}

impl PeerLink {
    /// The direct NVLinks' bandwidth each way (the datasheet's: 25 GB/s a link each way for
    /// NVLink 2-4, 50 for NVLink 5); None without direct links or a known version.
    pub fn nvlink_gbs_each_way(&self) -> Option<f64> {
        let per_link = match self.nvlink_version? {
            2..=4 => 25.0,
            5 => 50.0,
            _ => return None,
        };
        (self.nvlinks_direct > 0).then(|| per_link * f64::from(self.nvlinks_direct))
    }

    /// `NV18`, `NV18 (NVLink 4)`, `PCIe (host bridge)`: like nvidia-smi topo's cells.
    pub fn label(&self) -> String {
        if self.nvlinks_direct > 0 {
            let v = self
                .nvlink_version
                .map(|v| format!(" (NVLink {v})"))
                .unwrap_or_default();
            format!("NV{}{v}", self.nvlinks_direct)
        } else if self.nvlinks_other > 0 {
            format!("NVSwitch, {} links", self.nvlinks_other)
        } else {
            match &self.pcie_path {
                Some(p) => format!("PCIe ({p})"),
                None => "PCIe".to_string(),
            }
        }
    }
}

/// How many NVLinks a device may have (NVML_NVLINK_MAX_LINKS on current drivers).
const MAX_NVLINKS: u32 = 18;

impl NvmlSession {
    /// The links between the GPUs with these UUIDs, as seen from the first.
    pub fn peer_link(&self, from_uuid: &str, to_uuid: &str) -> Result<PeerLink> {
        use nvml_wrapper::enum_wrappers::device::TopologyLevel as T;
        let dev = |u: &str| {
            self.nvml
                .device_by_uuid(u)
                .map_err(|e| Error::Nvml(format!("no device {u}: {e}")))
        };
        let (a, b) = (dev(from_uuid)?, dev(to_uuid)?);
        let far_bus = b
            .pci_info()
            .map_err(|e| Error::Nvml(format!("PCI info of {to_uuid}: {e}")))?
            .bus_id
            .to_ascii_uppercase();
        let mut link = PeerLink::default();
        for i in 0..MAX_NVLINKS {
            let l = a.link_wrapper_for(i);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            // NVML's NVLINK_VERSION enum: 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1,
            // 6 = 4.0, 7 = 5.0
            let generation = l.version().ok().and_then(|v| match v {
                1 => Some(1),
                2 | 3 => Some(2),
                4 | 5 => Some(3),
                6 => Some(4),
                7 => Some(5),
                _ => None,
            });
            link.nvlink_version = link.nvlink_version.or(generation);
            match l.remote_pci_info() {
                Ok(p) if p.bus_id.to_ascii_uppercase() == far_bus => link.nvlinks_direct += 1,
                _ => link.nvlinks_other += 1,
            }
        }
        // In a virtual machine the links' far ends carry the host's PCI ids, not the guest's:
        // NVML's NVLink peer status (what nvidia-smi topo reads) says whether the pair talks
        // over NVLink, and then every active link serves it (directly or through switches).
        use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
        if link.nvlinks_direct == 0
            && matches!(
                a.p2p_status(&b, P2pCapabilitiesIndex::NvLink),
                Ok(P2pStatus::Ok)
            )
        {
            link.nvlinks_direct = link.nvlinks_other;
            link.nvlinks_other = 0;
        }
        link.pcie_path = a.topology_common_ancestor(b).ok().map(|t| {
            match t {
                T::Internal => "same board",
                T::Single => "one PCIe switch",
                T::Multiple => "several PCIe switches",
                T::HostBridge => "host bridge",
                T::Node => "NUMA node",
                T::System => "across CPUs",
            }
            .to_string()
        });
        Ok(link)
    }
}

#[cfg(test)]
mod peer_link_tests {
    use super::PeerLink;

    #[test]
    fn labels_read_like_nvidia_smi_topo() {
        let nv = PeerLink {
            nvlinks_direct: 18,
            nvlink_version: Some(4),
            ..Default::default()
        };
        assert_eq!(nv.label(), "NV18 (NVLink 4)");
        assert_eq!(nv.nvlink_gbs_each_way(), Some(450.0));
        let pcie = PeerLink {
            pcie_path: Some("host bridge".into()),
            ..Default::default()
        };
        assert_eq!(pcie.label(), "PCIe (host bridge)");
        let sw = PeerLink {
            nvlinks_other: 18,
            ..Default::default()
        };
        assert_eq!(sw.label(), "NVSwitch, 18 links");
    }
}
