//! One GPU's facts for figures to be placed against (name, memory, clocks, peaks), from CUDA
//! and NVML; whether it is idle; and which dtypes its arithmetic has. `check` reports them and
//! every benchmark reads them.

use crate::ceilings::{
    datasheet_peaks, estimated_peaks, pcie_gbs, theoretical_bandwidth_gbs, Peaks,
};
use crate::error::Result;
use gpukit_cuda::driver::{self, DeviceAttributes};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::{NvmlDevice, NvmlSession};
use gpukit_types::DType;
use serde::{Deserialize, Serialize};

/// One GPU, from CUDA (when started) and NVML; each fact from the best source that has it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuFacts {
    /// The CUDA ordinal (`cuda:N`), or NVML's index with `--quick` (PCI order).
    pub index: usize,
    pub name: String,
    pub uuid: String,
    /// As nvidia-smi prints it.
    pub pci_bus_id: String,
    pub compute_capability: Option<(u32, u32)>,
    pub sm_count: Option<u32>,
    /// What CUDA can allocate (the board's memory less the firmware's share).
    pub memory_usable_bytes: Option<u64>,
    /// The board's memory, as nvidia-smi counts it.
    pub memory_board_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub l2_cache_bytes: Option<u64>,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_memory_clock_mhz: Option<u32>,
    pub memory_bus_width_bits: Option<u32>,
    pub theoretical_bandwidth_gbs: Option<f64>,
    /// One direction of the PCIe link at its maximum generation and width.
    pub pcie_max_gbs: Option<f64>,
    pub peaks: Peaks,
    /// Everything CUDA's device attributes said (absent with `--quick`).
    pub cuda: Option<DeviceAttributes>,
    pub nvml: Option<NvmlDevice>,
    pub nvml_error: Option<String>,
}

/// NVML's utilisation (percent, its last sample) above which a GPU counts as busy.
const BUSY_PCT: u32 = 5;

/// Why timings on GPU `ordinal` may not be trusted now, as a warning: other processes hold it,
/// or it was busy when gpukit looked. None when neither, or when NVML cannot say.
pub fn busy_gpu(discovery: &Discovery, ordinal: usize) -> Option<String> {
    let d = driver::probe(discovery).ok()?;
    let a = driver::device_attributes(ordinal, d.device_count).ok()?;
    let nv = NvmlSession::open(discovery)
        .and_then(|n| n.device(&a.uuid))
        .ok()?;
    busy_reason(&nv, std::process::id(), ordinal)
}

/// [`busy_gpu`]'s judgement of what NVML said, leaving out this process.
fn busy_reason(nv: &NvmlDevice, own_pid: u32, ordinal: usize) -> Option<String> {
    let others: Vec<String> = nv
        .processes
        .iter()
        .filter(|p| p.pid != own_pid)
        .map(|p| {
            let name = if p.name.is_empty() { "?" } else { &p.name };
            match p.used_memory_bytes {
                Some(b) => format!("{name} (pid {}, {} MiB)", p.pid, b >> 20),
                None => format!("{name} (pid {})", p.pid),
            }
        })
        .collect();
    let busy = nv.utilization_gpu_pct.filter(|u| *u > BUSY_PCT);
    let mut why = Vec::new();
    if !others.is_empty() {
        why.push(format!(
            "{} other process(es) on it: {}",
            others.len(),
            others.join(", ")
        ));
    }
    if let Some(u) = busy {
        why.push(format!("{u}% utilised before gpukit started"));
    }
    (!why.is_empty()).then(|| {
        format!(
            "warning: cuda:{ordinal} is not idle ({}): its figures here may be lower and noisier \
             than the GPU can give",
            why.join("; ")
        )
    })
}

/// Facts (and peaks) of one CUDA device, for benchmarks to place their figures against.
pub fn describe_gpu(discovery: &Discovery, ordinal: usize) -> Result<GpuFacts> {
    let d = driver::probe(discovery).map_err(gpukit_cuda::Error::from)?;
    let a = driver::device_attributes(ordinal, d.device_count)?;
    let (nv, err) = match NvmlSession::open(discovery).and_then(|n| n.device(&a.uuid)) {
        Ok(n) => (Some(n), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(gpu_facts(Some(a), nv, err))
}

pub fn gpu_facts(
    cuda: Option<DeviceAttributes>,
    nv: Option<NvmlDevice>,
    nvml_error: Option<String>,
) -> GpuFacts {
    let c = cuda.as_ref();
    let n = nv.as_ref();
    let nz = |v: u32| (v > 0).then_some(v);
    let max_sm = n
        .and_then(|n| n.max_sm_clock_mhz)
        .or(c.and_then(|a| nz(a.sm_clock_khz / 1000)));
    let max_mem = n
        .and_then(|n| n.max_memory_clock_mhz)
        .or(c.and_then(|a| nz(a.memory_clock_khz / 1000)));
    let bus = n
        .and_then(|n| n.memory_bus_width_bits)
        .or(c.and_then(|a| nz(a.memory_bus_width_bits)));
    let cc = c
        .map(|a| a.compute_capability)
        .or(n.and_then(|n| n.compute_capability));
    let sm_count = c.map(|a| a.sm_count).or(n.and_then(|n| n.sm_count));
    let name = c
        .map(|a| a.name.clone())
        .or(n.map(|n| n.name.clone()))
        .unwrap_or_default();
    let theoretical = max_mem
        .zip(bus)
        .and_then(|(m, b)| theoretical_bandwidth_gbs(m, b));
    let pcie_max_gbs = n.and_then(|n| pcie_gbs(n.pcie_gen_max?, n.pcie_width_max?));
    let peaks = datasheet_peaks(&name).unwrap_or_else(|| {
        estimated_peaks(
            cc.unwrap_or((0, 0)),
            sm_count.unwrap_or(0),
            max_sm.unwrap_or(0),
            max_mem.unwrap_or(0),
            bus.unwrap_or(0),
        )
    });
    GpuFacts {
        index: c
            .map(|a| a.ordinal)
            .or(n.map(|n| n.index as usize))
            .unwrap_or(0),
        name,
        uuid: c
            .map(|a| a.uuid.clone())
            .or(n.map(|n| n.uuid.clone()))
            .unwrap_or_default(),
        pci_bus_id: c
            .map(|a| a.pci_bus_id.clone())
            .or(n.map(|n| n.pci_bus_id.clone()))
            .unwrap_or_default(),
        compute_capability: cc,
        sm_count,
        memory_usable_bytes: c.map(|a| a.total_memory_bytes),
        memory_board_bytes: n.and_then(|n| n.memory_total_bytes),
        memory_free_bytes: n.and_then(|n| n.memory_free_bytes),
        l2_cache_bytes: c.map(|a| a.l2_cache_bytes),
        max_sm_clock_mhz: max_sm,
        max_memory_clock_mhz: max_mem,
        memory_bus_width_bits: bus,
        theoretical_bandwidth_gbs: theoretical,
        pcie_max_gbs,
        peaks,
        cuda,
        nvml: nv,
        nvml_error,
    }
}

/// Why a GPU of this compute capability lacks the arithmetic for `d` (f16 from 5.3, bf16 and
/// tf32 from 8.0, fp8 from 8.9), or None when it has it.
pub fn gpu_lacks(cc: (u32, u32), d: DType) -> Option<String> {
    let need = match d {
        DType::F64 | DType::F32 => (0, 0),
        DType::F16 => (5, 3),
        DType::Tf32 | DType::Bf16 => (8, 0),
        // fp8 tensor cores: Ada (8.9) and Hopper (9.0) onward
        DType::F8E4M3 => (8, 9),
    };
    if cc >= need {
        None
    } else {
        Some(format!(
            "{d} needs compute capability {}.{} or newer; this GPU is {}.{}",
            need.0, need.1, cc.0, cc.1
        ))
    }
}

/// The device memory this process holds on the GPU `uuid`, as NVML counts it.
pub fn process_used(nvml: Option<&NvmlSession>, uuid: &str) -> Option<u64> {
    let me = std::process::id();
    nvml?
        .device(uuid)
        .ok()?
        .processes
        .iter()
        .find(|p| p.pid == me)
        .and_then(|p| p.used_memory_bytes)
}

/// The device memory in use on the GPU `uuid` by every process, as NVML counts it.
pub fn device_used(nvml: Option<&NvmlSession>, uuid: &str) -> Option<u64> {
    nvml?.device(uuid).ok()?.memory_used_bytes
}

#[cfg(test)]
mod tests {
    #[test]
    fn fp8_needs_ada_or_hopper() {
        assert_eq!(gpu_lacks((9, 0), DType::F8E4M3), None);
        assert_eq!(gpu_lacks((8, 9), DType::F8E4M3), None);
        let a100 = gpu_lacks((8, 0), DType::F8E4M3).unwrap();
        assert_eq!(
            a100,
            "f8e4m3 needs compute capability 8.9 or newer; this GPU is 8.0"
        );
        assert_eq!(gpu_lacks((8, 0), DType::Bf16), None);
    }

    use super::*;
    use gpukit_cuda::nvml::GpuProcess;

    #[test]
    fn a_gpu_with_other_processes_or_load_is_not_idle_and_ours_does_not_count() {
        let process = |pid, name: &str| GpuProcess {
            pid,
            name: name.into(),
            used_memory_bytes: Some(3 << 30),
        };
        let mut nv = NvmlDevice {
            utilization_gpu_pct: Some(0),
            processes: vec![process(42, "gpukit")],
            ..NvmlDevice::default()
        };
        assert_eq!(busy_reason(&nv, 42, 0), None);
        nv.processes.push(process(7, "python3"));
        let w = busy_reason(&nv, 42, 1).unwrap();
        assert!(w.starts_with("warning: cuda:1 is not idle"), "{w}");
        assert!(
            w.contains("1 other process(es) on it: python3 (pid 7, 3072 MiB)"),
            "{w}"
        );
        nv.processes.truncate(1);
        nv.utilization_gpu_pct = Some(5);
        assert_eq!(busy_reason(&nv, 42, 0), None);
        nv.utilization_gpu_pct = Some(63);
        assert!(busy_reason(&nv, 42, 0).unwrap().contains("63% utilised"));
    }
}
