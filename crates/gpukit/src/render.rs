//! Views of result structs: each result becomes [`Section`]s once, and the terminal and Markdown
//! renderers draw the same sections (one source of truth for what is shown).

use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};
use gpukit_bench::ceilings::{PeakSource, Peaks};
use gpukit_bench::check::{CheckReport, GpuFacts};
use gpukit_bench::matmul::{PeerFigure, RowStatus};

/// A titled table: with a header it is a grid, without one a list of key/value rows.
pub struct Section {
    pub title: String,
    pub header: Option<Vec<String>>,
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table.
    pub notes: Vec<String>,
}

impl Section {
    fn kv(title: impl Into<String>, rows: Vec<(&str, String)>) -> Section {
        Section {
            title: title.into(),
            header: None,
            rows: rows
                .into_iter()
                .map(|(k, v)| vec![k.to_string(), v])
                .collect(),
            notes: Vec::new(),
        }
    }
}

pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map(|x| format!("{x}{unit}"))
        .unwrap_or_else(|| "n/a".into())
}

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

fn tf(v: Option<f64>) -> String {
    v.map(|x| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else if x >= 1.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    })
    .unwrap_or_else(|| "none".into())
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

/// Draws sections as terminal tables.
pub fn to_terminal(sections: &[Section]) -> String {
    let mut out = String::new();
    for s in sections {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic);
        if let Some(h) = &s.header {
            t.set_header(h);
        }
        for r in &s.rows {
            t.add_row(r);
        }
        out.push_str(&format!("\n{}\n{t}\n", s.title));
        for n in &s.notes {
            out.push_str(&format!("  {n}\n"));
        }
    }
    out
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Draws sections as Markdown.
pub fn to_markdown(sections: &[Section], heading_level: usize) -> String {
    let hashes = "#".repeat(heading_level);
    let mut out = String::new();
    for s in sections {
        out.push_str(&format!("\n{hashes} {}\n\n", s.title));
        let header = s
            .header
            .clone()
            .unwrap_or_else(|| vec![String::new(), String::new()]);
        out.push_str(&format!(
            "| {} |\n|{}|\n",
            header
                .iter()
                .map(|c| md_cell(c))
                .collect::<Vec<_>>()
                .join(" | "),
            header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
        ));
        for r in &s.rows {
            out.push_str(&format!(
                "| {} |\n",
                r.iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | ")
            ));
        }
        for n in &s.notes {
            out.push_str(&format!("\n{n}\n"));
        }
    }
    out
}

fn status_cell(s: &RowStatus) -> Option<String> {
    match s {
        RowStatus::Ok => None,
        RowStatus::Failed(w) => Some(format!("FAILED: {w}")),
        RowStatus::Skipped(w) => Some(format!("skipped: {w}")),
    }
}

fn f1(v: Option<f64>) -> String {
    v.map(|x| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else if x >= 10.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    })
    .unwrap_or_default()
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0}%")).unwrap_or_default()
}

fn times(v: Option<f64>) -> String {
    v.map(|x| {
        if x >= 10.0 {
            format!("{x:.0}x")
        } else {
            format!("{x:.2}x")
        }
    })
    .unwrap_or_default()
}

/// How one kind of result row becomes table cells: the columns naming it, the measured ones,
/// and PyTorch's figure when the run compared.
struct Columns<'a, R> {
    naming: &'a [&'a str],
    measured: &'a [&'a str],
    /// "TFLOP/s" or "GB/s": the unit of the row's rate and of PyTorch's.
    rate_unit: &'a str,
    name: &'a dyn Fn(&R) -> Vec<String>,
    status: &'a dyn Fn(&R) -> &RowStatus,
    values: &'a dyn Fn(&R) -> Vec<String>,
    peer: &'a dyn Fn(&R) -> Option<&PeerFigure>,
}

/// The header and rows of a results table. A row that did not produce a figure shows why in
/// place of its measured columns.
fn results_table<R>(rows: &[R], c: Columns<'_, R>) -> (Vec<String>, Vec<Vec<String>>) {
    let compare = rows.iter().any(|r| (c.peer)(r).is_some());
    let mut header: Vec<String> = c
        .naming
        .iter()
        .chain(c.measured)
        .map(|s| s.to_string())
        .collect();
    if compare {
        header.push(format!("PyTorch {}", c.rate_unit));
        header.push("gpukit / PyTorch".to_string());
    }
    let body = rows
        .iter()
        .map(|r| {
            let mut cells = (c.name)(r);
            if let Some(s) = status_cell((c.status)(r)) {
                cells.push(s);
                cells.resize(header.len(), String::new());
                return cells;
            }
            cells.extend((c.values)(r));
            if compare {
                cells.push(f1((c.peer)(r).map(|p| p.rate)));
                cells.push(ratio_cell((c.peer)(r)));
            }
            cells
        })
        .collect();
    (header, body)
}

/// gpukit over PyTorch; with turns, the lowest and highest round's ratio beside the median.
fn ratio_cell(p: Option<&PeerFigure>) -> String {
    let Some(p) = p else { return String::new() };
    let lo = p.turn_ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = p
        .turn_ratios
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    if p.turn_ratios.len() > 1 {
        format!("{} ({:.2}-{:.2})", times(Some(p.ratio)), lo, hi)
    } else {
        times(Some(p.ratio))
    }
}

fn check_cell(v: Option<&gpukit_bench::matmul::Verification>) -> String {
    v.map(|v| format!("ok {:.0e}", v.rel_err))
        .unwrap_or_default()
}

pub fn matmul_sections(r: &gpukit_bench::matmul::MatmulReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["device", "dtype", "size"],
            measured: &[
                "median ms (p10-p90)",
                "TFLOP/s",
                "% peak",
                "% best",
                "vs CPU",
                "check",
                "backend",
            ],
            rate_unit: "TFLOP/s",
            name: &|x: &gpukit_bench::matmul::MatmulRow| {
                vec![
                    x.device.to_string(),
                    x.dtype.to_string(),
                    x.size.to_string(),
                ]
            },
            status: &|x| &x.status,
            values: &|x| {
                let t = x.timing.as_ref().map(|t| &t.summary_ms);
                vec![
                    t.map(|s| format!("{:.3} ({:.3}-{:.3}) n={}", s.median, s.p10, s.p90, s.count))
                        .unwrap_or_default(),
                    f1(x.tflops),
                    pct(x.pct_of_peak),
                    pct(x.pct_of_best),
                    times(x.speedup_vs_cpu),
                    check_cell(x.verification.as_ref()),
                    match &x.computed_as {
                        Some(c) => format!("computed in {c}"),
                        None => x.backend.clone().unwrap_or_default(),
                    },
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
        },
    );
    let mut notes = vec![
        "check: sampled entries against a float64 product of the same stored inputs (relative error shown); a row that fails reports no figure.".to_string(),
        "% peak: of the GPU's dense peak for the dtype; % best: of the best rate measured in this run for the same device and dtype; vs CPU: GPU rate over the CPU's for the same dtype and size.".to_string(),
    ];
    if let Some(g) = &r.gpu {
        notes.push(format!(
            "GPU: {} ({})",
            g.name,
            match &g.peaks.source {
                PeakSource::Datasheet { part } => format!("peaks from the {part} datasheet"),
                PeakSource::Estimate { .. } => "peaks estimated from SMs x clock".into(),
            }
        ));
    }
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("GPU rows skipped: {why}"));
    }
    notes.push(format!(
        "CPU: {} with {} threads",
        r.cpu_model, r.cpu_threads
    ));
    vec![Section {
        title: format!(
            "Matrix multiply (C = A x B, square, random {} inputs)",
            r.inputs.describe()
        ),
        header: Some(header),
        rows,
        notes,
    }]
}

fn human_bytes(b: usize) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

pub fn bandwidth_sections(r: &gpukit_bench::bandwidth::BandwidthReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["copy", "size"],
            measured: &["median us", "GB/s", "% of link / memory", "check"],
            rate_unit: "GB/s",
            name: &|x: &gpukit_bench::bandwidth::BandwidthRow| {
                vec![x.kind.label().to_string(), human_bytes(x.bytes)]
            },
            status: &|x| &x.status,
            values: &|x| {
                vec![
                    f1(x.latency_us),
                    match (x.gbs, x.gbs_read_write) {
                        (Some(g), Some(rw)) => {
                            format!("{} ({} read+write)", f1(Some(g)), f1(Some(rw)))
                        }
                        (g, _) => f1(g),
                    },
                    if x.in_l2 {
                        "in L2".into()
                    } else {
                        pct(x.pct_of_link.or(x.pct_of_memory_peak))
                    },
                    if x.verified {
                        "byte-exact".into()
                    } else {
                        "MISMATCH".into()
                    },
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
        },
    );
    let mut notes = vec![format!(
        "PCIe link (one direction, max generation and width): {}; memory peak: {}. Device->device's % is of the memory peak, counting bytes read plus written; \"in L2\": source and destination fit in the {} L2 cache together, so the figure is the cache's, not memory's.",
        r.pcie_link_gbs.map(|g| format!("{g:.1} GB/s")).unwrap_or_else(|| "unknown".into()),
        r.memory_peak_gbs.map(|g| format!("{g:.0} GB/s")).unwrap_or_else(|| "unknown".into()),
        r.l2_cache_bytes.map(|b| human_bytes(b as usize)).unwrap_or_else(|| "unknown".into())
    )];
    notes.push(format!(
        "Staging: pageable memory copied by all CPU threads into two pinned {} buffers in turn, each sent while the other fills.",
        human_bytes(r.staging_chunk_bytes)
    ));
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("No GPU: {why}"));
    }
    vec![Section {
        title: "Data transfer".into(),
        header: Some(header),
        rows,
        notes,
    }]
}

pub fn conv_sections(r: &gpukit_bench::conv::ConvReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["shape", "layout", "device", "dtype"],
            measured: &[
                "median ms",
                "TFLOP/s",
                "% peak",
                "vs CPU",
                "check",
                "algorithm",
            ],
            rate_unit: "TFLOP/s",
            name: &|x: &gpukit_bench::conv::ConvRow| {
                vec![
                    format!(
                        "{} ({})",
                        x.name,
                        gpukit_bench::conv::shape_string(&x.shape)
                    ),
                    format!("{:?}", x.layout).to_uppercase(),
                    x.device.to_string(),
                    x.dtype.to_string(),
                ]
            },
            status: &|x| &x.status,
            values: &|x| {
                vec![
                    x.timing
                        .as_ref()
                        .map(|t| format!("{:.3} n={}", t.summary_ms.median, t.summary_ms.count))
                        .unwrap_or_default(),
                    f1(x.tflops),
                    pct(x.pct_of_peak),
                    times(x.speedup_vs_cpu),
                    if x.device == gpukit_tensor::Device::Cpu {
                        "reference".into()
                    } else {
                        check_cell(x.verification.as_ref())
                    },
                    x.algorithm.clone().unwrap_or_default(),
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
        },
    );
    let mut notes = vec![
        "Shapes: NxCxHxW:KxRxS:s<stride>p<pad>. GPU rows are checked against the CPU's f32 output from the same stored inputs; cuDNN's algorithm is chosen by running each candidate (cudnnFind).".to_string(),
        "TFLOP/s counts a direct convolution's 2*N*K*P*Q*C*R*S: WINOGRAD and FFT algorithms do fewer multiplications, so their effective rate can pass the peak.".to_string(),
    ];
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("GPU rows skipped: {why}"));
    }
    vec![Section {
        title: "Convolution (ResNet-50 shapes)".into(),
        header: Some(header),
        rows,
        notes,
    }]
}

/// `12345.6` -> `12,346`; below 1000 as [`f1`] does.
fn grouped(x: f64) -> String {
    if !x.is_finite() || x.abs() < 1000.0 {
        return f1(Some(x));
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// "best at batch 32: fp16-nhwc-graph 12,345 img/s, 3.1x fp32 eager, 250x CPU f32".
pub fn infer_best_line(b: &gpukit_bench::infer::InferRow) -> String {
    let mut line = format!(
        "best at batch {}: {} {} img/s",
        b.batch,
        b.strategy,
        grouped(b.images_per_s.unwrap_or(0.0))
    );
    if let Some(x) = b.speedup_vs_fp32_eager {
        line.push_str(&format!(", {} fp32 eager", times(Some(x))));
    }
    if let Some(x) = b.speedup_vs_reference {
        line.push_str(&format!(", {} gpukit's CPU f32", times(Some(x))));
    }
    line
}

/// "one image at a time at batch 32: fp16-nhwc-graph as 32 batch-1 graph replays, 1,234 img/s;
/// batched, 8.00x the images/s" (a one-at-a-time row that passed).
pub fn infer_one_at_a_time_line(r: &gpukit_bench::infer::InferRow) -> String {
    let batched = r
        .strategy
        .strip_suffix(gpukit_bench::infer::ONE_AT_A_TIME)
        .unwrap_or(&r.strategy);
    let passes = if batched.ends_with("-graph") {
        "graph replays"
    } else {
        "eager passes"
    };
    let mut line = format!(
        "one image at a time at batch {0}: {batched} as {0} batch-1 {passes}, {1} img/s",
        r.batch,
        grouped(r.images_per_s.unwrap_or(0.0))
    );
    if let Some(g) = r.batching_gain {
        line.push_str(&format!("; batched, {} the images/s", times(Some(g))));
    }
    line
}

fn infer_setup(r: &gpukit_bench::infer::InferReport, gpu_rows: bool) -> Section {
    use gpukit_bench::infer::{is_one_at_a_time, CPU_CHECK_IMAGES, GPU_WARMUP};
    let gpu = match (&r.gpu_device, &r.gpu_unavailable) {
        (Some(d), _) => d.clone(),
        (None, Some(why)) => format!("GPU rows absent: {why}"),
        (None, None) if gpu_rows => "?".into(),
        (None, None) => "not selected".into(),
    };
    let mut rows = vec![
        (
            "Model",
            format!(
                "{} ({} parameters), weights: {}",
                r.model,
                grouped(r.parameters as f64),
                r.weights
            ),
        ),
        (
            "Input",
            format!(
                "{0}x{0} random RGB images in [-1, 1); every strategy at one batch size gets the same batch",
                r.image_size
            ),
        ),
        (
            "CPU",
            format!(
                "{} threads; ONNX Runtime {}",
                r.cpu_threads,
                match &r.onnxruntime_unavailable {
                    Some(why) => format!("rows skipped: {why}"),
                    None => "on the same weights (exported to ONNX)".into(),
                }
            ),
        ),
        ("GPU", gpu),
    ];
    if let Some(t) = &r.tensorrt {
        rows.push(("TensorRT", t.clone()));
    }
    let singles = r.rows.iter().any(is_one_at_a_time);
    let mut checks =
        "ONNX Runtime against gpukit's f32 CPU path (max rel. diff <= 1e-3 and the same top-1)"
            .to_string();
    if gpu_rows {
        checks.push_str(&format!(
            "; GPU fp32 NCHW eager against gpukit's CPU forward on the first {CPU_CHECK_IMAGES} images (<= 1e-4), every other GPU strategy against those GPU fp32 logits on the whole batch (fp32 1e-4, tf32 1e-2, fp16 1e-2, bf16 5e-2). A row over its tolerance fails and shows no speed; top-1 agreement is shown, not judged (random weights give close logits)"
        ));
        let mut timing = format!(
            "CPU rows: host clock; GPU rows: CUDA events around each pass (after {GPU_WARMUP} warm-up passes), eager = call by call, graph = one CUDA graph launch. GPU memory: the engine's own accounting (weights + activation arena + largest cuDNN workspace)"
        );
        if singles {
            timing.push_str(&format!(
                ". {} rows: the batch's N images as N batch-1 passes back to back (eager, or N graph replays), timed together; every pass runs on the batch's first image, uploaded once and resident on the GPU; images/s = N / their time; GPU memory at batch 1",
                gpukit_bench::infer::ONE_AT_A_TIME.trim_start_matches('-')
            ));
            checks.push_str(
                "; one-at-a-time rows: the last pass's logits against the same strategy's batched logits of that first image (its tolerance)",
            );
        }
        rows.push(("Timing", timing));
    }
    rows.push(("Checks", checks));
    Section::kv(format!("Inference: {}", r.model), rows)
}

/// A setup list, then one table per batch size with the best GPU strategy under it.
pub fn infer_sections(r: &gpukit_bench::infer::InferReport) -> Vec<Section> {
    use gpukit_bench::infer::{best_gpu_rows, is_gpu_row, is_one_at_a_time, InferRow};
    let gpu = r.rows.iter().any(is_gpu_row);
    let mut out = vec![infer_setup(r, gpu)];
    let mut batches: Vec<usize> = r.rows.iter().map(|x| x.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let best = best_gpu_rows(&r.rows);
    let measured: &[&str] = if gpu {
        &[
            "median ms (p10-p90)",
            "images/s",
            "vs fp32 eager",
            "vs CPU f32",
            "GPU memory",
            "max rel. diff (tolerance)",
            "top-1 agree",
        ]
    } else {
        &[
            "median ms (p10-p90)",
            "images/s",
            "vs CPU f32",
            "max rel. diff (tolerance)",
            "top-1 agree",
        ]
    };
    for n in batches {
        let rows: Vec<&InferRow> = r.rows.iter().filter(|x| x.batch == n).collect();
        let (header, body) = results_table(
            &rows,
            Columns {
                naming: &["strategy", "device"],
                measured,
                rate_unit: "images/s",
                name: &|x: &&InferRow| vec![x.strategy.clone(), x.device.clone()],
                status: &|x| &x.status,
                values: &|x| {
                    let mut cells = vec![
                        x.timing
                            .as_ref()
                            .map(|t| {
                                let s = &t.summary_ms;
                                format!("{:.3} ({:.3}-{:.3}) n={}", s.median, s.p10, s.p90, s.count)
                            })
                            .unwrap_or_default(),
                        x.images_per_s.map(grouped).unwrap_or_default(),
                    ];
                    if gpu {
                        cells.push(times(x.speedup_vs_fp32_eager));
                    }
                    cells.push(times(x.speedup_vs_reference));
                    if gpu {
                        cells.push(x.gpu_memory_bytes.map(mib).unwrap_or_default());
                    }
                    cells.push(match (&x.agreement, x.tolerance) {
                        (Some(a), Some(t)) => format!("{:.1e} ({t:.0e})", a.max_rel),
                        (Some(a), None) => format!("{:.1e}", a.max_rel),
                        (None, _) => "reference".into(),
                    });
                    cells.push(
                        x.agreement
                            .as_ref()
                            .map(|a| format!("{:.0}%", a.top1 * 100.0))
                            .unwrap_or_default(),
                    );
                    cells
                },
                peer: &|x| x.pytorch.as_ref(),
            },
        );
        let notes = best
            .iter()
            .filter(|b| b.batch == n)
            .map(|b| infer_best_line(b))
            .chain(
                rows.iter()
                    .filter(|x| is_one_at_a_time(x) && x.status == RowStatus::Ok)
                    .map(|x| infer_one_at_a_time_line(x)),
            )
            .collect();
        out.push(Section {
            title: format!("Inference at batch {n}"),
            header: Some(header),
            rows: body,
            notes,
        });
    }
    if let Some(p) = &r.pytorch {
        out.push(pytorch_infer_section(p));
    }
    out
}

/// `infer --input`: each strategy's logits against the CPU's.
pub fn input_run_section(r: &gpukit_bench::infer::io::InputRun) -> Section {
    let rows = r
        .logits
        .iter()
        .map(|l| {
            vec![
                l.strategy.clone(),
                l.tensor.clone(),
                match (&l.agreement, &l.error) {
                    (Some(a), _) => format!("{:.1e}", a.max_rel),
                    (None, Some(e)) => format!("failed: {e}"),
                    (None, None) => "reference".into(),
                },
                l.agreement
                    .as_ref()
                    .map(|a| format!("{:.0}%", a.top1 * 100.0))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    Section {
        title: format!("Logits for {} {:?}", r.input, r.shape),
        header: Some(
            [
                "strategy",
                "tensor",
                "max rel. diff vs CPU f32",
                "top-1 agree",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: r.output.iter().map(|o| format!("written to {o}")).collect(),
    }
}

/// PyTorch's own rows (`infer --compare-pytorch`), the logits check and best fp16 against best.
fn pytorch_infer_section(p: &gpukit_bench::infer::peer::PytorchComparison) -> Section {
    let rows = p
        .rows
        .iter()
        .map(|x| {
            let figure = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_default();
            vec![
                x.strategy.clone(),
                x.device.clone(),
                x.batch.to_string(),
                if x.status == "ok" {
                    figure(x.median_ms, &|m| {
                        format!(
                            "{m:.3} ({:.3}-{:.3})",
                            x.p10_ms.unwrap_or(m),
                            x.p90_ms.unwrap_or(m)
                        )
                    })
                } else {
                    format!("{}: {}", x.status, x.reason.clone().unwrap_or_default())
                },
                figure(x.images_per_s, &grouped),
                x.peak_allocated_bytes.map(mib).unwrap_or_default(),
                figure(x.compile_s, &|c| format!("{c:.1} s")),
            ]
        })
        .collect();
    let mut notes = Vec::new();
    match (&p.logits, &p.logits_unavailable) {
        (Some(a), _) => notes.push(format!(
            "PyTorch's eager fp32 logits (TF32 off) against gpukit's CPU f32 forward on the same \
             {} images and weights: max rel. diff {:.1e}, top-1 agreement {:.0}%",
            p.logits_images,
            a.max_rel,
            a.top1 * 100.0
        )),
        (None, Some(why)) => notes.push(format!("logits not compared: {why}")),
        (None, None) => {}
    }
    for b in &p.best_fp16 {
        notes.push(format!(
            "best fp16 at batch {}: gpukit {} {} img/s, PyTorch {} {} img/s: {:.2}x",
            b.batch,
            b.gpukit_strategy,
            grouped(b.gpukit_images_per_s),
            b.pytorch_strategy,
            grouped(b.pytorch_images_per_s),
            b.ratio
        ));
    }
    Section {
        title: format!(
            "PyTorch {} (torchvision {}, cudnn.benchmark {}) on {}",
            p.torch_version,
            p.torchvision
                .as_deref()
                .unwrap_or("absent: the script's own ResNet"),
            p.cudnn_benchmark,
            p.device_name.as_deref().unwrap_or("?")
        ),
        header: Some(
            [
                "strategy",
                "device",
                "batch",
                "median ms (p10-p90)",
                "images/s",
                "peak allocated",
                "compile",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes,
    }
}

/// `gpukit memory`.
pub fn memory_sections(r: &gpukit_bench::memory::MemoryReport) -> Vec<Section> {
    let opt = |v: Option<u64>| v.map(mib).unwrap_or_else(|| "-".into());
    let c = &r.context;
    let mut setup = Section::kv(
        format!(
            "GPU memory: {} {} {} on {}",
            r.model, r.precision, r.layout, r.device
        ),
        vec![
            (
                "Device",
                format!(
                    "{} total{}",
                    mib(r.total_bytes),
                    r.limit_bytes
                        .map(|l| format!(", gpukit limited to {} (--memory-fraction)", mib(l)))
                        .unwrap_or_default()
                ),
            ),
            (
                "CUDA context",
                format!(
                    "device used {} before, {} after opening; this process: {} = {} for the \
                     context, loaded kernels and driver state + {} of library workspaces \
                     (cuDNN, cuBLAS) from the pool",
                    opt(c.device_used_before),
                    opt(c.device_used_after),
                    opt(c.process_used),
                    opt(c.context_and_code),
                    mib(c.pool_used)
                ),
            ),
            (
                "Algorithms",
                match r.max_workspace_bytes {
                    Some(b) => format!(
                        "the fastest cuDNN algorithms that need at most {} of workspace \
                         (--max-workspace)",
                        mib(b)
                    ),
                    None => {
                        "the fastest cuDNN algorithms (up to 256 MiB of workspace each)".to_string()
                    }
                },
            ),
            (
                "Baseline",
                format!(
                    "pool used {} / reserved {} after the weights and cuBLAS's workspace",
                    mib(r.baseline_used),
                    mib(r.baseline_reserved)
                ),
            ),
        ],
    );
    setup.notes.push(
        "The context and kernels are not allocations: an allocator's counter (PyTorch's \
         memory_allocated) cannot see them; NVML's per-process figure can."
            .into(),
    );
    let rows = r
        .rows
        .iter()
        .map(|x| {
            let status = match &x.status {
                gpukit_bench::matmul::RowStatus::Ok => "ok".to_string(),
                other => format!("{other:?}"),
            };
            vec![
                if x.batch == x.batch_requested {
                    x.batch.to_string()
                } else {
                    format!("{} (asked {})", x.batch, x.batch_requested)
                },
                mib(x.weights_bytes),
                mib(x.input_bytes),
                format!(
                    "{} ({} without plan{})",
                    mib(x.arena_bytes),
                    mib(x.arena_without_plan_bytes),
                    if x.in_place { "; in place" } else { "" }
                ),
                mib(x.conv_workspace_bytes),
                mib(x.planning_used_peak),
                mib(x.pool_used_peak),
                mib(x.pool_reserved_peak),
                opt(x.process_used),
                x.ms_per_batch
                    .map(|m| format!("{m:.2} ms"))
                    .unwrap_or_default(),
                format!("{} ({:+} B)", mib(x.pool_reserved_after), x.leak_bytes),
                status,
            ]
        })
        .collect();
    let mut notes: Vec<String> = r.rows.iter().filter_map(|x| x.note.clone()).collect();
    notes.push(
        "pool peak used: the most the pool held while running the batch (weights, input, \
         activations, workspaces; what PyTorch's max_memory_allocated counts); planning peak: \
         the same while choosing algorithms (a 256 MiB search workspace, the in-place check), \
         given back before running. \"in place\": each block writes its output over its \
         shortcut, checked per convolution shape against the output written elsewhere."
            .into(),
    );
    if let Some(m) = &r.max_batch {
        notes.push(format!(
            "largest batch that fits: {} ({}; {} attempts in {:.1} s; pool reserved after: {}, {})",
            m.batch,
            m.first_failure
                .map(|f| format!("{f} did not"))
                .unwrap_or_else(|| "the search cap was reached".into()),
            m.attempts,
            m.seconds,
            mib(m.pool_reserved_after),
            if m.back_to_baseline {
                "back at the baseline"
            } else {
                "NOT back at the baseline"
            }
        ));
    }
    let mut sections = vec![
        setup,
        Section {
            title: "Per batch size".into(),
            header: Some(
                [
                    "batch",
                    "weights",
                    "input",
                    "activations (planned)",
                    "cuDNN workspace",
                    "planning peak",
                    "pool peak used",
                    "pool peak reserved",
                    "NVML process",
                    "per batch",
                    "after (vs baseline)",
                    "status",
                ]
                .map(String::from)
                .to_vec(),
            ),
            rows,
            notes,
        },
    ];
    if let Some(p) = &r.pinned {
        sections.push(Section {
            title: format!("Host memory for uploads ({} each)", mib(p.bytes)),
            header: Some(
                [
                    "host memory",
                    "allocate + first touch",
                    "free",
                    "host->device",
                ]
                .map(String::from)
                .to_vec(),
            ),
            rows: vec![
                vec![
                    "pageable (a Vec)".into(),
                    format!("{:.1} ms", p.pageable_alloc_ms),
                    String::new(),
                    format!("{:.1} GB/s", p.pageable_h2d_gb_s),
                ],
                vec![
                    "pinned (cuMemHostAlloc)".into(),
                    format!("{:.1} ms", p.pinned_alloc_ms),
                    format!("{:.1} ms", p.pinned_free_ms),
                    format!("{:.1} GB/s", p.pinned_h2d_gb_s),
                ],
            ],
            notes: vec![
                "Pinned memory copies at the link's speed and asynchronously, but costs more to \
                 allocate and free and is taken from the host's RAM for good: allocate it once \
                 and reuse it (a DataLoader's pin_memory). Every copy checked byte-exact; \
                 median of 5. All sizes and directions: gpukit bench bandwidth."
                    .into(),
            ],
        });
    }
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_report_shows_rows_workspace_cap_and_pinned_memory() {
        use gpukit_bench::memory::{ContextCost, MemoryReport, MemoryRow, PinnedHost};
        let row = MemoryRow {
            batch_requested: 128,
            batch: 128,
            status: gpukit_bench::matmul::RowStatus::Ok,
            note: None,
            weights_bytes: 100 << 20,
            input_bytes: 70 << 20,
            arena_bytes: 700 << 20,
            arena_without_plan_bytes: 5600 << 20,
            conv_workspace_bytes: 0,
            pool_used_peak: 810 << 20,
            pool_reserved_peak: 840 << 20,
            planning_used_peak: 900 << 20,
            in_place: true,
            process_used: None,
            pool_reserved_after: 96 << 20,
            leak_bytes: 0,
            ms_per_batch: Some(30.0),
            images_per_s: Some(4266.0),
        };
        let report = MemoryReport {
            model: "resnet50".into(),
            precision: "fp32".into(),
            layout: "NCHW".into(),
            device: "cuda:0 test".into(),
            total_bytes: 80 << 30,
            limit_bytes: None,
            max_workspace_bytes: Some(0),
            context: ContextCost {
                device_used_before: None,
                device_used_after: None,
                process_used: None,
                pool_used: 0,
                context_and_code: None,
            },
            baseline_used: 100 << 20,
            baseline_reserved: 128 << 20,
            rows: vec![row],
            max_batch: None,
            pinned: Some(PinnedHost {
                bytes: 256 << 20,
                pageable_alloc_ms: 40.0,
                pinned_alloc_ms: 90.0,
                pinned_free_ms: 30.0,
                pageable_h2d_gb_s: 9.5,
                pinned_h2d_gb_s: 55.0,
            }),
        };
        let text = to_terminal(&memory_sections(&report));
        assert!(text.contains("at most 0.0 MiB of workspace"), "{text}");
        assert!(text.contains("in place"), "{text}");
        assert!(
            text.contains("810.0 MiB") && text.contains("900.0 MiB"),
            "{text}"
        );
        assert!(
            text.contains("pinned (cuMemHostAlloc)") && text.contains("55.0 GB/s"),
            "{text}"
        );
    }

    fn infer_row(
        strategy: &str,
        device: &str,
        batch: usize,
        rate: f64,
    ) -> gpukit_bench::infer::InferRow {
        use gpukit_bench::harness::{Clock, Measurement};
        gpukit_bench::infer::InferRow {
            strategy: strategy.into(),
            device: device.into(),
            batch,
            status: RowStatus::Ok,
            timing: Some(Measurement {
                clock: Clock::CudaEvents,
                warmup: 3,
                reps_planned: 1,
                summary_ms: gpukit_bench::stats::Summary::of(&[batch as f64 / rate * 1e3]).unwrap(),
            }),
            images_per_s: Some(rate),
            speedup_vs_reference: None,
            speedup_vs_fp32_eager: None,
            gpu_memory_bytes: (device != "cpu").then_some(300 << 20),
            gpu_memory: None,
            agreement: Some(gpukit_bench::infer::Agreement {
                max_abs: 1e-3,
                max_rel: 2e-4,
                top1: 1.0,
            }),
            compared_with: None,
            tolerance: Some(1e-2),
            pytorch: None,
            batching_gain: None,
        }
    }

    fn infer_report(
        rows: Vec<gpukit_bench::infer::InferRow>,
        gpu_unavailable: Option<&str>,
    ) -> gpukit_bench::infer::InferReport {
        gpukit_bench::infer::InferReport {
            model: "resnet50".into(),
            parameters: 25_557_032,
            weights: "seeded".into(),
            image_size: 224,
            cpu_threads: 16,
            rows,
            onnxruntime_unavailable: None,
            gpu_device: gpu_unavailable
                .is_none()
                .then(|| "cuda:0 Test GPU".to_string()),
            gpu_unavailable: gpu_unavailable.map(str::to_string),
            pytorch: None,
            tensorrt: None,
        }
    }

    #[test]
    fn infer_has_a_table_per_batch_and_the_best_gpu_strategy_under_it() {
        use gpukit_bench::infer::CPU_ROW;
        let mut cpu = infer_row(CPU_ROW, "cpu", 32, 40.0);
        cpu.agreement = None;
        cpu.tolerance = None;
        let mut fp32 = infer_row("fp32", "cuda:0", 32, 4000.0);
        fp32.speedup_vs_fp32_eager = Some(1.0);
        let mut fast = infer_row("fp16-nhwc-graph", "cuda:0", 32, 12_345.0);
        fast.speedup_vs_fp32_eager = Some(3.09);
        fast.speedup_vs_reference = Some(308.6);
        let mut broken = infer_row("bf16-nhwc", "cuda:0", 32, 99_999.0);
        broken.status = RowStatus::Failed("logits differ".into());
        let rows = vec![
            infer_row("fp32", "cuda:0", 1, 500.0),
            cpu,
            fp32,
            fast,
            broken,
        ];
        let sections = infer_sections(&infer_report(rows, None));
        let titles: Vec<&str> = sections.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "Inference: resnet50",
                "Inference at batch 1",
                "Inference at batch 32"
            ]
        );
        let b32 = &sections[2];
        assert_eq!(b32.rows.len(), 4);
        assert_eq!(
            b32.notes,
            ["best at batch 32: fp16-nhwc-graph 12,345 img/s, 3.09x fp32 eager, 309x gpukit's CPU f32"]
        );
        let text = to_terminal(&sections);
        assert!(text.contains("FAILED: logits differ"), "{text}");
        assert!(
            text.contains("reference") && text.contains("300.0 MiB"),
            "{text}"
        );
        assert!(
            text.contains("cuda:0 Test GPU") && text.contains("25,557,032"),
            "{text}"
        );
    }

    #[test]
    fn infer_shows_one_image_at_a_time_under_the_best_line() {
        let batched = infer_row("fp16-nhwc-graph", "cuda:0", 32, 12_000.0);
        let mut single = infer_row("fp16-nhwc-graph-one-at-a-time", "cuda:0", 32, 1_500.0);
        single.batching_gain = Some(8.0);
        let mut eager = infer_row("fp16-one-at-a-time", "cuda:0", 32, 500.0);
        eager.batching_gain = None;
        let mut failed = infer_row("fp32-one-at-a-time", "cuda:0", 32, 99_999.0);
        failed.status = RowStatus::Failed("logits differ".into());
        let mut report = infer_report(vec![batched, single, eager, failed], None);
        report.tensorrt = Some(gpukit_bench::infer::tensorrt_status(None));
        let sections = infer_sections(&report);
        let b32 = &sections[1];
        assert_eq!(b32.rows.len(), 4);
        assert_eq!(
            b32.notes,
            [
                "best at batch 32: fp16-nhwc-graph 12,000 img/s",
                "one image at a time at batch 32: fp16-nhwc-graph as 32 batch-1 graph replays, 1,500 img/s; batched, 8.00x the images/s",
                "one image at a time at batch 32: fp16 as 32 batch-1 eager passes, 500 img/s",
            ],
            "the one-at-a-time rows are never the best; the failed one has no line"
        );
        let text = to_terminal(&sections);
        assert!(
            text.contains("TensorRT") && text.contains("libnvinfer not found"),
            "{text}"
        );
        assert!(text.contains("N batch-1 passes back to back"), "{text}");
        // no one-at-a-time rows, no TensorRT field: neither is mentioned
        let plain = to_terminal(&infer_sections(&infer_report(
            vec![infer_row("fp16", "cuda:0", 8, 10.0)],
            None,
        )));
        assert!(
            !plain.contains("TensorRT") && !plain.contains("batch-1 passes"),
            "{plain}"
        );
    }

    #[test]
    fn infer_without_a_gpu_says_why_and_keeps_cpu_columns() {
        let rows = vec![infer_row(gpukit_bench::infer::CPU_ROW, "cpu", 1, 20.0)];
        let sections = infer_sections(&infer_report(rows, Some("no NVIDIA driver found")));
        let text = to_terminal(&sections);
        assert!(
            text.contains("GPU rows absent: no NVIDIA driver found"),
            "{text}"
        );
        assert!(
            !text.contains("GPU memory") && !text.contains("best at"),
            "{text}"
        );
    }

    #[test]
    fn grouped_thousands() {
        assert_eq!(grouped(12_345.4), "12,345");
        assert_eq!(grouped(1_000.0), "1,000");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(25_557_032.0), "25,557,032");
        assert_eq!(grouped(12.34), "12.3");
    }

    #[test]
    fn markdown_escapes_pipes_and_keeps_shape() {
        let s = Section {
            title: "T".into(),
            header: Some(vec!["a".into(), "b".into()]),
            rows: vec![vec!["x|y".into(), "z".into()]],
            notes: vec!["note".into()],
        };
        let md = to_markdown(&[s], 2);
        assert!(md.contains("## T"));
        assert!(md.contains("| a | b |\n|---|---|\n| x\\|y | z |"), "{md}");
        assert!(md.contains("\nnote\n"));
    }
}
