//! `gpukit check`: the headline, then per GPU its facts and peak rates, the peer-access matrix,
//! the CUDA libraries and the host.

use super::fmt::{gib, mib, opt, tf};
use super::Section;
use gpukit_bench::ceilings::{PeakSource, Peaks};
use gpukit_bench::check::CheckReport;
use gpukit_bench::gpu::GpuFacts;

/// The headline: whether a GPU is usable, and why not.
pub fn check_headline(r: &CheckReport) -> String {
    match (&r.driver, r.available) {
        (Some(d), true) => format!(
            "GPU available: {} device(s) shown; driver {} (CUDA {} driver API); gpukit built for CUDA {}{}",
            r.gpus.len(),
            d.version.as_deref().unwrap_or("version unknown"),
            d.cuda_api,
            r.build_cuda,
            if r.cuda_initialized { "" } else { " (--quick: NVML only, CUDA not started)" }
        ),
        _ => format!(
            "No GPU available: {}",
            r.reason.as_deref().unwrap_or("no device selected")
        ),
    }
}

pub fn check_sections(r: &CheckReport) -> Vec<Section> {
    let mut out = Vec::new();
    for g in &r.gpus {
        out.push(gpu_section(g));
        out.push(peaks_section(g));
    }
    if let Some(m) = &r.peer_access {
        let n = m.len();
        let mut header = vec!["from \\ to".to_string()];
        header.extend((0..n).map(|j| format!("cuda:{j}")));
        out.push(Section {
            title: "Peer access (direct GPU-to-GPU reads and writes)".into(),
            header: Some(header),
            rows: m
                .iter()
                .enumerate()
                .map(|(i, row)| {
                    let mut cells = vec![format!("cuda:{i}")];
                    cells.extend(row.iter().enumerate().map(|(j, &ok)| {
                        if i == j {
                            "-".into()
                        } else if ok {
                            "yes".into()
                        } else {
                            "no".into()
                        }
                    }));
                    cells
                })
                .collect(),
            notes: vec![],
        });
    }
    out.push(libraries_section(r));
    out.push(host_section(r));
    out
}

fn gpu_section(g: &GpuFacts) -> Section {
    let nv = g.nvml.as_ref();
    let memory = {
        let mut parts = Vec::new();
        if let Some(u) = g.memory_usable_bytes {
            parts.push(format!("{} usable by CUDA", gib(u)));
        }
        if let Some(b) = g.memory_board_bytes {
            parts.push(format!(
                "{} on the board ({} MiB, as nvidia-smi counts)",
                gib(b),
                b >> 20
            ));
        }
        if let Some(f) = g.memory_free_bytes {
            parts.push(format!("{} free", gib(f)));
        }
        if parts.is_empty() {
            "n/a".to_string()
        } else {
            parts.join(", ")
        }
    };
    let mut rows = vec![
        ("UUID", g.uuid.clone()),
        ("PCI bus id", g.pci_bus_id.clone()),
        ("Memory", memory),
        (
            "Compute capability",
            format!(
                "{} ({} SMs)",
                g.compute_capability
                    .map(|(a, b)| format!("{a}.{b}"))
                    .unwrap_or_else(|| "n/a".into()),
                opt(g.sm_count, "")
            ),
        ),
        (
            "Max clocks",
            format!(
                "SM {}, memory {}",
                opt(g.max_sm_clock_mhz, " MHz"),
                opt(g.max_memory_clock_mhz, " MHz")
            ),
        ),
        (
            "Memory bus",
            format!(
                "{}, {} theoretical",
                opt(g.memory_bus_width_bits, "-bit"),
                opt(
                    g.theoretical_bandwidth_gbs.map(|b| format!("{b:.0}")),
                    " GB/s"
                )
            ),
        ),
        (
            "L2 cache",
            g.l2_cache_bytes
                .map(mib)
                .unwrap_or_else(|| "n/a (needs CUDA: run without --quick)".into()),
        ),
    ];
    if let Some(n) = nv {
        rows.push((
            "PCIe",
            format!(
                "Gen{} x{} now, Gen{} x{} max ({} per direction)",
                opt(n.pcie_gen_current, ""),
                opt(n.pcie_width_current, ""),
                opt(n.pcie_gen_max, ""),
                opt(n.pcie_width_max, ""),
                opt(g.pcie_max_gbs.map(|b| format!("{b:.1}")), " GB/s")
            ),
        ));
        rows.push((
            "Power",
            format!(
                "{} of {} limit",
                opt(n.power_draw_w.map(|w| format!("{w:.0}")), " W"),
                opt(n.power_limit_w.map(|w| format!("{w:.0}")), " W")
            ),
        ));
        rows.push(("Temperature", opt(n.temperature_c, " °C")));
        rows.push((
            "Utilization",
            format!(
                "GPU {}, memory {}",
                opt(n.utilization_gpu_pct, "%"),
                opt(n.utilization_memory_pct, "%")
            ),
        ));
        rows.push((
            "Processes",
            if n.processes.is_empty() {
                "none".into()
            } else {
                n.processes
                    .iter()
                    .map(|p| {
                        format!(
                            "{} {} ({})",
                            p.pid,
                            if p.name.is_empty() { "?" } else { &p.name },
                            p.used_memory_bytes.map(mib).unwrap_or_else(|| "n/a".into())
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ));
    }
    let label = if g.cuda.is_some() {
        "cuda"
    } else {
        "NVML index"
    };
    let mut s = Section::kv(format!("GPU {label} {} · {}", g.index, g.name), rows);
    if let Some(e) = &g.nvml_error {
        s.notes.push(format!(
            "NVML: {e} (clocks, PCIe, power and processes not shown)"
        ));
    }
    s
}

fn peaks_section(g: &GpuFacts) -> Section {
    let p: &Peaks = &g.peaks;
    let source =
        match &p.source {
            PeakSource::Datasheet { part } => format!("datasheet, {part}, dense"),
            PeakSource::Estimate {
                sm_count,
                sm_clock_mhz,
            } => format!(
            "estimate: {sm_count} SMs x {sm_clock_mhz} MHz x per-SM rate of compute capability {}",
            g.compute_capability.map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|| "?".into())
        ),
        };
    Section {
        title: format!("Peak rates of GPU {} ({source})", g.index),
        header: Some(
            ["f64", "f32", "tf32", "f16", "bf16", "fp8", "memory"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        rows: vec![vec![
            tf(p.f64_tflops),
            tf(p.f32_tflops),
            tf(p.tf32_tflops),
            tf(p.f16_tflops),
            tf(p.bf16_tflops),
            tf(p.fp8_tflops),
            p.memory_gbs
                .map(|b| format!("{b:.0} GB/s"))
                .unwrap_or_else(|| "n/a".into()),
        ]],
        notes: vec![
            "TFLOP/s of dense matrix math; benchmarks report their figures as a fraction of these."
                .into(),
        ],
    }
}

fn libraries_section(r: &CheckReport) -> Section {
    let rows = r
        .libraries
        .iter()
        .map(|l| {
            vec![
                l.name.clone(),
                if l.found {
                    "found".into()
                } else {
                    "MISSING".into()
                },
                l.version
                    .clone()
                    .unwrap_or_else(|| if l.found { "?".into() } else { "-".into() }),
                l.source.map(|s| s.label().to_string()).unwrap_or_default(),
                match (&l.path, &l.install) {
                    (Some(p), _) => p.display().to_string(),
                    (None, Some(i)) => i.clone(),
                    (None, None) => String::new(),
                },
                l.used_for.clone(),
            ]
        })
        .collect();
    let mut notes = Vec::new();
    if !r.loader_path_added.is_empty() {
        notes.push(format!(
            "gpukit added to the loader path for this run: {}",
            r.loader_path_added
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        ));
    }
    for l in r
        .libraries
        .iter()
        .filter_map(|l| l.note.as_ref().map(|n| (l, n)))
    {
        notes.push(format!("{}: {}", l.0.name, l.1));
    }
    Section {
        title: "CUDA libraries".into(),
        header: Some(
            [
                "library",
                "status",
                "version",
                "found in",
                "path / what to install",
                "used for",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ),
        rows,
        notes,
    }
}

fn host_section(r: &CheckReport) -> Section {
    let h = &r.host;
    Section::kv(
        "Host",
        vec![
            ("CPU", h.cpu_model.clone()),
            (
                "Cores",
                format!(
                    "{} usable threads, {} physical cores, {} socket(s)",
                    h.logical_cores,
                    opt(h.physical_cores, ""),
                    opt(h.sockets, "")
                ),
            ),
            (
                "Memory",
                match (h.memory_total_bytes, h.memory_available_bytes) {
                    (Some(t), Some(a)) => format!("{} total, {} available", gib(t), gib(a)),
                    (Some(t), None) => format!("{} total", gib(t)),
                    _ => "n/a".into(),
                },
            ),
            (
                "SIMD",
                format!("{} ({})", h.simd, h.simd_features.join(", ")),
            ),
            ("OS", format!("{} ({})", h.os, h.arch)),
        ],
    )
}
