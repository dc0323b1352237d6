//! The logs: CSV with nvidia-smi's `--query-gpu` field names (as `--format=csv,nounits` writes
//! them, "[N/A]" where a value is missing), and JSON lines (one GpuSample a line).

use super::GpuSample;

/// The CSV columns: nvidia-smi's names and units where it has the field, gpukit's otherwise.
pub const CSV_HEADER: &str = "timestamp, index, name, uuid, pci.bus_id, utilization.gpu [%], \
utilization.memory [%], memory.used [MiB], memory.total [MiB], temperature.gpu, \
power.draw [W], power.draw.instant [W], power.limit [W], clocks.current.sm [MHz], clocks.current.memory [MHz], \
clocks_event_reasons.active, pcie.tx [MB/s], pcie.rx [MB/s], \
ecc.errors.uncorrected.volatile.total";

fn na<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "[N/A]".to_string(), |v| v.to_string())
}

fn mib(v: Option<u64>) -> String {
    na(v.map(|b| b / (1024 * 1024)))
}

fn watts(v: Option<f64>) -> String {
    na(v.map(|w| format!("{w:.2}")))
}

/// nvidia-smi's timestamp form: `2026/11/23 16:50:01.123` (UTC here).
pub fn timestamp(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil date from days since 1970-01-01 (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    )
}

/// NVML's throttle-reason bitmask of the named reasons, as nvidia-smi prints it (0x...).
pub fn reasons_mask(reasons: &[String]) -> u64 {
    gpukit_types::throttle::mask(reasons)
}

/// One CSV line (no newline); names with a comma are quoted.
pub fn csv_line(s: &GpuSample) -> String {
    let quote = |t: &str| {
        if t.contains([',', '"', '\n']) {
            format!("\"{}\"", t.replace('"', "\"\""))
        } else {
            t.to_string()
        }
    };
    let mbps = |v: Option<u64>| na(v.map(|b| format!("{:.1}", b as f64 / 1e6)));
    [
        timestamp(s.unix_ms),
        s.index.to_string(),
        quote(&s.name),
        s.uuid.clone(),
        s.pci_bus_id.clone(),
        na(s.utilization_gpu_pct),
        na(s.utilization_memory_pct),
        mib(s.memory_used_bytes),
        mib(s.memory_total_bytes),
        na(s.temperature_c),
        watts(s.power_draw_w),
        watts(s.power_instant_w),
        watts(s.power_limit_w),
        na(s.sm_clock_mhz),
        na(s.memory_clock_mhz),
        format!("0x{:016X}", reasons_mask(&s.throttle_reasons)),
        mbps(s.pcie_tx_bytes_per_s),
        mbps(s.pcie_rx_bytes_per_s),
        na(s.ecc_uncorrected),
    ]
    .join(", ")
}

/// One JSON line (no newline).
pub fn jsonl_line(s: &GpuSample) -> String {
    serde_json::to_string(s).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests;
