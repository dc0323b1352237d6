//! `gpukit monitor --prometheus ADDR`: one sampling round as Prometheus text (exposition format
//! 0.0.4) under the DCGM exporter's metric names, types and labels, so Grafana dashboards built
//! for dcgm-exporter work unchanged, plus gpukit's per-process metrics; and a small HTTP server
//! that answers GET /metrics between samples.
//!
//! The text is written by hand, not through the `prometheus-client` crate: that crate writes
//! OpenMetrics text (`# EOF`, its own content type) and appends `_total` to every counter's
//! name, so `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` could not keep dcgm-exporter's name; it also
//! keeps metrics in a registry, while here each scrape renders the latest round from scratch.

use super::sample::GpuSample;
use crate::error::{Error, Result};
use std::fmt::{self, Write as _};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const MIB: u64 = 1 << 20;

/// A sample's value as written: integers exactly, floats only when finite.
#[derive(Debug, Clone, Copy)]
enum Value {
    Int(u64),
    Float(f64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

fn int<T: Into<u64>>(v: Option<T>) -> Option<Value> {
    v.map(|v| Value::Int(v.into()))
}

/// A non-finite reading is no reading.
fn float(v: Option<f64>) -> Option<Value> {
    v.filter(|v| v.is_finite()).map(Value::Float)
}

/// One DCGM metric family: name, Prometheus type, help text (dcgm-exporter's where it has one)
/// and how to read it from a sample.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&GpuSample) -> Option<Value>,
}

/// dcgm-exporter's types: its default counters list ECC_DBE_VOL_TOTAL as a counter too.
/// PCIE_TX/RX_THROUGHPUT are KB/s rates (NVML's 20 ms window), so they are gauges here, where
/// dcgm-exporter calls them counters; the type does not change any PromQL query.
const FAMILIES: &[Family] = &[
    Family {
        name: "DCGM_FI_DEV_SM_CLOCK",
        kind: "gauge",
        help: "SM clock frequency (in MHz).",
        value: |g| int(g.sm_clock_mhz),
    },
    Family {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        kind: "gauge",
        help: "Memory clock frequency (in MHz).",
        value: |g| int(g.memory_clock_mhz),
    },
    Family {
        name: "DCGM_FI_DEV_GPU_TEMP",
        kind: "gauge",
        help: "GPU temperature (in C).",
        value: |g| int(g.temperature_c),
    },
    Family {
        name: "DCGM_FI_DEV_POWER_USAGE",
        kind: "gauge",
        help: "Power draw (in W).",
        value: |g| float(g.power_draw_w),
    },
    Family {
        name: "DCGM_FI_DEV_POWER_USAGE_INSTANT",
        kind: "gauge",
        help: "Current instantaneous power usage (in W).",
        value: |g| float(g.power_instant_w),
    },
    Family {
        name: "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        kind: "gauge",
        help: "Power management limit (in W).",
        value: |g| float(g.power_limit_w),
    },
    Family {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        kind: "counter",
        help: "Total energy consumption since the driver loaded (in mJ).",
        value: |g| int(g.energy_mj),
    },
    Family {
        name: "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        kind: "gauge",
        help: "PCIe TX throughput (in KB/s) via NVML.",
        value: |g| int(g.pcie_tx_bytes_per_s.map(|b| b / 1024)),
    },
    Family {
        name: "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        kind: "gauge",
        help: "PCIe RX throughput (in KB/s) via NVML.",
        value: |g| int(g.pcie_rx_bytes_per_s.map(|b| b / 1024)),
    },
    Family {
        name: "DCGM_FI_DEV_GPU_UTIL",
        kind: "gauge",
        help: "GPU utilization (in %).",
        value: |g| int(g.utilization_gpu_pct),
    },
    Family {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        kind: "gauge",
        help: "Memory utilization (in %).",
        value: |g| int(g.utilization_memory_pct),
    },
    Family {
        name: "DCGM_FI_DEV_FB_FREE",
        kind: "gauge",
        help: "Framebuffer memory free (in MiB).",
        value: |g| match (g.memory_total_bytes, g.memory_used_bytes) {
            (Some(total), Some(used)) => int(total.checked_sub(used).map(|b| b / MIB)),
            _ => None,
        },
    },
    Family {
        name: "DCGM_FI_DEV_FB_USED",
        kind: "gauge",
        help: "Framebuffer memory used (in MiB).",
        value: |g| int(g.memory_used_bytes.map(|b| b / MIB)),
    },
    Family {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        kind: "counter",
        help: "Total number of double-bit volatile ECC errors.",
        value: |g| int(g.ecc_uncorrected),
    },
    Family {
        name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        kind: "gauge",
        help: "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
        value: |g| int(throttle_mask(&g.throttle_reasons)),
    },
];

/// NVML's bitmask for the reason names; None when a name has no known bit (the mask would
/// be wrong).
fn throttle_mask(reasons: &[String]) -> Option<u64> {
    reasons.iter().try_fold(0u64, |mask, reason| {
        gpukit_types::throttle::by_name(reason).map(|r| mask | r.bit)
    })
}

/// Appends a label value escaped as the exposition format requires (`\\`, `\"`, `\n`).
fn push_escaped(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends `name="value"`, with a comma before it unless it is the first label.
fn push_label(out: &mut String, name: &str, value: &str) {
    if !out.is_empty() {
        out.push(',');
    }
    out.push_str(name);
    out.push_str("=\"");
    push_escaped(out, value);
    out.push('"');
}

/// dcgm-exporter's labels for a GPU, in its order.
fn gpu_labels(g: &GpuSample, hostname: &str) -> String {
    let mut labels = String::new();
    push_label(&mut labels, "gpu", &g.index.to_string());
    push_label(&mut labels, "UUID", &g.uuid);
    push_label(&mut labels, "pci_bus_id", &g.pci_bus_id);
    push_label(&mut labels, "device", &format!("nvidia{}", g.index));
    push_label(&mut labels, "modelName", &g.name);
    push_label(&mut labels, "Hostname", hostname);
    labels
}

fn push_header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one family: its HELP and TYPE lines and one sample per labelled value, or nothing
/// when no GPU has a value.
fn push_family<'a>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a str, Value)>,
) {
    let mut header = false;
    for (labels, value) in samples {
        if !header {
            push_header(out, name, kind, help);
            header = true;
        }
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// One round as Prometheus text (exposition format 0.0.4): the DCGM families with
/// dcgm-exporter's labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`),
/// then `gpukit_process_gpu_memory_used_bytes` and `gpukit_process_sm_util_percent` labelled
/// `gpu`, `UUID`, `pid`, `process`. A field that is None is left out for that GPU; a family no
/// GPU has is left out whole, so an empty round gives an empty text. A GPU or process listed
/// twice is written once (Prometheus rejects repeated series).
pub fn exposition(round: &[GpuSample], hostname: &str) -> String {
    let mut gpus: Vec<(&GpuSample, String)> = Vec::with_capacity(round.len());
    for g in round {
        if !gpus
            .iter()
            .any(|(s, _)| s.index == g.index && s.uuid == g.uuid)
        {
            gpus.push((g, gpu_labels(g, hostname)));
        }
    }
    let mut out = String::new();
    for f in FAMILIES {
        let samples = gpus
            .iter()
            .filter_map(|(g, labels)| (f.value)(g).map(|v| (labels.as_str(), v)));
        push_family(&mut out, f.name, f.kind, f.help, samples);
    }

    // Per-process labels, and each process's values, once per GPU and pid.
    let mut processes: Vec<(String, Option<u64>, Option<u32>)> = Vec::new();
    for (g, _) in &gpus {
        let mut pids: Vec<u32> = Vec::new();
        for p in &g.processes {
            if pids.contains(&p.pid) {
                continue;
            }
            pids.push(p.pid);
            let mut labels = String::new();
            push_label(&mut labels, "gpu", &g.index.to_string());
            push_label(&mut labels, "UUID", &g.uuid);
            push_label(&mut labels, "pid", &p.pid.to_string());
            push_label(&mut labels, "process", &p.name);
            processes.push((labels, p.used_memory_bytes, p.sm_util_pct));
        }
    }
    push_family(
        &mut out,
        "gpukit_process_gpu_memory_used_bytes",
        "gauge",
        "GPU memory used by a process (in bytes), from NVML.",
        processes
            .iter()
            .filter_map(|(labels, mem, _)| int(*mem).map(|v| (labels.as_str(), v))),
    );
    push_family(
        &mut out,
        "gpukit_process_sm_util_percent",
        "gauge",
        "SM utilization of a process over NVML's last sampling period (in %).",
        processes
            .iter()
            .filter_map(|(labels, _, sm)| int(*sm).map(|v| (labels.as_str(), v))),
    );
    out
}

/// This machine's name for the `Hostname` label: the kernel's hostname, "" when unreadable.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// An HTTP server for /metrics, driven by the sampling loop: [`Exporter::serve_one`] answers at
/// most one request per call, so the caller serves between samples without a thread of its own.
pub struct Exporter {
    server: tiny_http::Server,
    addr: SocketAddr,
}

impl Exporter {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free one). Refuses an address that is not
    /// loopback unless `allow_remote`: the metrics name the machine, its GPUs and its processes.
    /// An address that cannot be resolved or bound is [`Error::BadInput`] naming it and the
    /// operating system's reason.
    pub fn bind(addr: &str, allow_remote: bool) -> Result<Exporter> {
        let cannot = |reason: &dyn fmt::Display| {
            Error::BadInput(format!(
                "cannot serve Prometheus metrics on {addr}: {reason}"
            ))
        };
        let resolved: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| cannot(&e))?.collect();
        if resolved.is_empty() {
            return Err(cannot(&"it resolves to no address"));
        }
        if !allow_remote {
            if let Some(remote) = resolved.iter().find(|a| !a.ip().is_loopback()) {
                return Err(Error::BadInput(format!(
                    "refusing to serve Prometheus metrics on {addr}: {} is not a loopback \
                     address, so other machines could read them; use 127.0.0.1:PORT, or allow \
                     remote addresses explicitly (--allow-remote)",
                    remote.ip()
                )));
            }
        }
        let listener = TcpListener::bind(&resolved[..]).map_err(|e| cannot(&e))?;
        let local = listener.local_addr().map_err(|e| cannot(&e))?;
        let server = tiny_http::Server::from_listener(listener, None).map_err(|e| cannot(&e))?;
        Ok(Exporter {
            server,
            addr: local,
        })
    }

    /// The address being served, `IP:PORT` (the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> String {
        self.addr.to_string()
    }

    /// Waits up to `timeout` for one request and answers it: GET /metrics gets 200 with
    /// `current()` as [`CONTENT_TYPE`], anything else 404. Returns whether a request came.
    /// A client that hangs up before the answer is not an error; a failing listener is.
    pub fn serve_one(&self, timeout: Duration, current: &dyn Fn() -> String) -> Result<bool> {
        let request = match self.server.recv_timeout(timeout) {
            Ok(Some(request)) => request,
            Ok(None) => return Ok(false),
            Err(e) => {
                return Err(Error::Failed(format!(
                    "the Prometheus endpoint on {} failed: {e}",
                    self.addr
                )))
            }
        };
        let path = request.url().split('?').next().unwrap_or_default();
        let response = if *request.method() == tiny_http::Method::Get && path == "/metrics" {
            let response = tiny_http::Response::from_string(current());
            match tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE) {
                Ok(header) => response.with_header(header),
                Err(()) => response,
            }
        } else {
            tiny_http::Response::from_string("gpukit serves GET /metrics\n").with_status_code(404)
        };
        // Content-Length always, never chunked: the simplest answer for any scraper.
        let _ = request.respond(response.with_chunked_threshold(usize::MAX));
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
