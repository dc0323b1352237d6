//! `gpukit stress`: the verdict per GPU first, then what each test measured (matmul, memory,
//! copies) and what NVML saw; a reading NVML could not give says "not readable", never 0.

use super::fmt::{f1, gib, pct};
use super::Section;
use gpukit_bench::stress::{GpuStress, StressReport, Verdict};
use gpukit_cuda::nvml::HealthCounters;

const NOT_READABLE: &str = "not readable";

pub fn stress_sections(r: &StressReport) -> Vec<Section> {
    vec![
        verdicts(r),
        matmul(r),
        memory(r),
        copies(r),
        watched(r),
        health(r),
        between(r),
        not_run(r),
    ]
}

fn gpu_cell(g: &GpuStress) -> String {
    format!("cuda:{}", g.ordinal)
}

fn verdicts(r: &StressReport) -> Section {
    let rows = r
        .gpus
        .iter()
        .map(|g| {
            let (verdict, why) = match &g.verdict {
                Verdict::Pass { .. } => ("PASS".to_string(), String::new()),
                Verdict::Fail { reasons, .. } => (
                    "FAIL".to_string(),
                    reasons
                        .iter()
                        .map(|x| x.describe())
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
            };
            let warnings = g.verdict.warnings().join("; ");
            vec![gpu_cell(g), g.name.clone(), verdict, why, warnings]
        })
        .collect();
    let mut notes = vec![format!(
        "level {}: {:.0} s per GPU, all GPUs at once ({:.0} s bf16 matmul, {:.0} s fp8 matmul \
         (bf16's on a GPU without fp8), {:.0} s tf32 matmul, {:.0} s memory patterns, {:.0} s \
         copies, the rest setup); the run took {:.0} s.",
        r.level,
        r.duration_s,
        r.budget.matmul_bf16_s,
        r.budget.matmul_fp8_s,
        r.budget.matmul_tf32_s,
        r.budget.memory_s,
        r.budget.copies_s,
        r.elapsed_s
    )];
    notes.push(format!(
        "a GPU fails on a wrong result, a test that did not complete, new uncorrected ECC errors, \
         a failed row remapping, a critical XID, heat (sw_thermal or hw_thermal seen), a matmul \
         rate below {:.0}% of the best GPU of the same model or below {:.0}% of the datasheet's \
         peak. The power cap (sw_power_cap) is reported, not a failure.",
        100.0 * r.rules.of_best,
        100.0 * r.rules.peak_floor
    ));
    Section {
        title: "Stress test: verdict".into(),
        header: Some(
            ["GPU", "name", "verdict", "why", "seen, not failing"]
                .map(String::from)
                .to_vec(),
        ),
        rows,
        notes,
    }
}

fn matmul(r: &StressReport) -> Section {
    let mut rows = Vec::new();
    for g in &r.gpus {
        for m in &g.matmul {
            let dtype = m.dtype.map(|d| d.to_string()).unwrap_or_default();
            let size = format!("{0}x{0}x{0}", m.size);
            if let Some(why) = &m.skipped {
                rows.push(vec![gpu_cell(g), dtype, size, format!("not run: {why}")]);
                continue;
            }
            let repeats = match m.products {
                0 => String::new(),
                p if m.repeat_words_differing == 0 => format!("{p}, all identical"),
                p => format!(
                    "{p}, {} of {} words DIFFER",
                    m.repeat_words_differing,
                    m.words_per_result * (p - 1)
                ),
            };
            let check = |v: &Option<gpukit_bench::report::Verification>| match v {
                Some(v) if v.passed => format!("ok {:.0e}", v.rel_err),
                Some(v) => format!("WRONG {:.1e}", v.rel_err),
                None => "not run".into(),
            };
            let rate = match (m.tflops, m.tflops_min, m.tflops_max) {
                (Some(t), Some(lo), Some(hi)) => {
                    format!("{} ({}-{})", f1(Some(t)), f1(Some(lo)), f1(Some(hi)))
                }
                _ => m
                    .error
                    .clone()
                    .map_or("none".into(), |e| format!("error: {e}")),
            };
            rows.push(vec![
                gpu_cell(g),
                dtype,
                size,
                rate,
                pct(m.pct_of_peak),
                pct(m.pct_of_achievable),
                repeats,
                format!(
                    "{} / {}",
                    check(&m.reference_first),
                    check(&m.reference_last)
                ),
            ]);
        }
    }
    let notes = vec![
        "TFLOP/s: the median of half-second blocks of back-to-back products (slowest-fastest \
         block), CUDA events around each product; shown only when every check passed."
            .to_string(),
        "products: each result compared word for word on the GPU with the first (same inputs, \
         same algorithm: the bits must match); check: the first and the last against a float64 \
         product of the same inputs on sampled entries (relative error)."
            .to_string(),
        "% datasheet: of the dense peak where gpukit knows the part; % searched: of the best \
         rate `gpukit bench matmul --search` found on this GPU under this driver and cuBLASLt \
         (blank: no search kept)."
            .to_string(),
    ];
    Section {
        title: "Sustained matrix multiply (random normal inputs)".into(),
        header: Some(
            [
                "GPU",
                "dtype",
                "size",
                "TFLOP/s (min-max)",
                "% datasheet",
                "% searched",
                "products",
                "check first / last",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes,
    }
}

fn memory(r: &StressReport) -> Section {
    let rows = r
        .gpus
        .iter()
        .filter_map(|g| {
            let m = g.memory.as_ref()?;
            let passes: u64 = m.passes.iter().map(|p| p.passes).sum();
            let wrong = m.words_wrong();
            let result = match (&m.error, wrong) {
                (Some(e), _) => format!("error: {e}"),
                (None, 0) if passes > 0 => "0 wrong".into(),
                (None, 0) => "not run".into(),
                (None, w) => format!(
                    "{w} WRONG ({})",
                    m.passes
                        .iter()
                        .filter(|p| p.words_wrong > 0)
                        .map(|p| format!("{}: {}", p.pattern.name(), p.words_wrong))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            Some(vec![
                gpu_cell(g),
                format!("{} of {} free", gib(m.tested_bytes), gib(m.free_bytes)),
                passes.to_string(),
                format!("{:.0} GB", m.checked_bytes() as f64 / 1e9),
                result,
                m.shortfall.clone().unwrap_or_default(),
            ])
        })
        .collect();
    Section {
        title: "Device memory patterns".into(),
        header: Some(
            [
                "GPU",
                "tested",
                "passes",
                "written and read",
                "words off pattern",
                "note",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: vec![
            "each pass writes one pattern (address-dependent, walking ones, walking zeros, \
             seeded random; the seed moves every round) over the tested memory, then counts on \
             the GPU the 32-bit words that differ."
                .into(),
        ],
    }
}

fn copies(r: &StressReport) -> Section {
    let mut rows = Vec::new();
    for g in &r.gpus {
        for c in &g.copies {
            let checked = match (&c.error, c.verified) {
                (Some(e), _) => format!("error: {e}"),
                (None, true) => "byte-exact".into(),
                (None, false) => format!("{} bytes DIFFER", c.bytes_wrong),
            };
            rows.push(vec![
                gpu_cell(g),
                c.direction.clone(),
                c.copies.to_string(),
                f1(c.gbs),
                match (c.pct_of_link, g.pcie_link_gbs) {
                    (Some(p), Some(l)) => format!("{} of {:.1}", pct(Some(p)), l),
                    _ => String::new(),
                },
                checked,
            ]);
        }
    }
    Section {
        title: "Copies, pinned host memory, 256 MiB each".into(),
        header: Some(
            [
                "GPU",
                "direction",
                "copies",
                "GB/s",
                "% of PCIe link GB/s",
                "check",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: vec![
            "GB/s: the median copy; the link's figure is one direction at its maximum \
             generation and width; the last copy each way is compared byte for byte."
                .into(),
        ],
    }
}

fn readable<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or(NOT_READABLE.to_string(), |x| format!("{x}{unit}"))
}

fn watched(r: &StressReport) -> Section {
    let rows = r
        .gpus
        .iter()
        .map(|g| {
            let w = &g.watched;
            if let Some(why) = &w.unreadable {
                return vec![gpu_cell(g), format!("{NOT_READABLE}: {why}")];
            }
            let clocks = match (
                w.sm_clock_min_mhz,
                w.sm_clock_median_mhz,
                w.sm_clock_max_mhz,
            ) {
                (Some(lo), Some(mid), Some(hi)) => format!("{mid} ({lo}-{hi})"),
                _ => NOT_READABLE.into(),
            };
            let throttle = if w.throttle_seen.is_empty() {
                "none".to_string()
            } else {
                w.throttle_seen
                    .iter()
                    .map(|t| format!("{} {:.0}%", t.name, 100.0 * t.share))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let xid = match (&w.xid_unreadable, w.xid_events.is_empty()) {
                (_, false) => w
                    .xid_events
                    .iter()
                    .map(|x| x.map_or("unknown".into(), |x| x.to_string()))
                    .collect::<Vec<_>>()
                    .join(", "),
                (Some(why), true) => format!("{NOT_READABLE}: {why}"),
                (None, true) => "none".into(),
            };
            vec![
                gpu_cell(g),
                w.samples.to_string(),
                readable(w.max_temperature_c, " C"),
                readable(w.max_power_w.map(|p| format!("{p:.0}")), " W"),
                readable(w.power_limit_w.map(|p| format!("{p:.0}")), " W"),
                clocks,
                throttle,
                xid,
            ]
        })
        .collect();
    Section {
        title: "What NVML saw during the run".into(),
        header: Some(
            [
                "GPU",
                "readings",
                "max temp",
                "max power",
                "power limit",
                "SM MHz median (min-max)",
                "throttle reasons (share of readings)",
                "critical XID",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: vec!["read about four times a second through the whole run, setup included.".into()],
    }
}

/// `before -> after`, or what could not be read.
fn change(
    before: Option<&HealthCounters>,
    after: Option<&HealthCounters>,
    f: fn(&HealthCounters) -> Option<u64>,
) -> String {
    match (before.and_then(f), after.and_then(f)) {
        (Some(a), Some(b)) if a == b => format!("{b}"),
        (Some(a), Some(b)) => format!("{a} -> {b}"),
        (None, Some(b)) => format!("{b} (before: {NOT_READABLE})"),
        _ => NOT_READABLE.into(),
    }
}

fn health(r: &StressReport) -> Section {
    let rows = r
        .gpus
        .iter()
        .map(|g| {
            let (b, a) = (g.health_before.as_ref(), g.health_after.as_ref());
            let ecc = match a.and_then(|h| h.ecc_enabled) {
                Some(true) => "on",
                Some(false) => "off",
                None => NOT_READABLE,
            };
            let flags = a
                .map(|h| {
                    let mut f = Vec::new();
                    if h.remapped_rows_pending == Some(true) {
                        f.push("remapping pending");
                    }
                    if h.remapped_rows_failed == Some(true) {
                        f.push("REMAPPING FAILED");
                    }
                    if h.retired_pages_pending == Some(true) {
                        f.push("retirement pending");
                    }
                    if f.is_empty() {
                        "none".to_string()
                    } else {
                        f.join(", ")
                    }
                })
                .unwrap_or_else(|| NOT_READABLE.to_string());
            vec![
                gpu_cell(g),
                ecc.to_string(),
                change(b, a, |h| h.ecc_volatile_uncorrected),
                change(b, a, |h| h.ecc_volatile_corrected),
                change(b, a, |h| h.ecc_aggregate_uncorrected),
                change(b, a, |h| h.remapped_rows_uncorrectable),
                change(b, a, |h| h.remapped_rows_correctable),
                change(b, a, |h| {
                    h.retired_pages_double_bit
                        .zip(h.retired_pages_single_bit)
                        .map(|(d, s)| d + s)
                }),
                flags,
            ]
        })
        .collect();
    Section {
        title: "Memory health (NVML counters before -> after)".into(),
        header: Some(
            [
                "GPU",
                "ECC",
                "uncorrected (since driver load)",
                "corrected (since driver load)",
                "uncorrected (lifetime)",
                "rows remapped, uncorrectable",
                "rows remapped, correctable",
                "pages retired",
                "pending",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: Vec::new(),
    }
}

fn between(r: &StressReport) -> Section {
    let Some(m) = &r.multi_gpu else {
        return Section {
            title: "Between GPUs".into(),
            header: None,
            rows: Vec::new(),
            notes: vec![format!(
                "not run (not passed): {}",
                r.multi_gpu_not_run.as_deref().unwrap_or("no reason given")
            )],
        };
    };
    let mut rows: Vec<Vec<String>> = m
        .peer_copies
        .iter()
        .map(|c| {
            let checked = match (&c.error, c.verified) {
                (Some(e), _) => format!("error: {e}"),
                (None, true) => "byte-exact".into(),
                (None, false) => format!("{} bytes DIFFER", c.bytes_wrong),
            };
            vec![
                format!("copy cuda:{} -> cuda:{}", c.from, c.to),
                format!(
                    "{}{}",
                    c.link.clone().unwrap_or_else(|| "link not readable".into()),
                    if c.peer_access {
                        ""
                    } else {
                        ", no peer access"
                    }
                ),
                c.gbs
                    .map(|g| format!("{} GB/s", f1(Some(g))))
                    .unwrap_or_default(),
                pct(c.pct_of_link),
                checked,
            ]
        })
        .collect();
    if let Some(a) = &m.all_reduce {
        let wrong: u64 = a.wrong.iter().sum();
        let checked = match (&a.error, wrong) {
            (Some(e), _) => format!("error: {e}"),
            (None, 0) => format!("{} rounds exact", a.rounds),
            (None, _) => format!(
                "WRONG: {}",
                a.gpus
                    .iter()
                    .zip(&a.wrong)
                    .filter(|(_, w)| **w > 0)
                    .map(|(g, w)| format!("cuda:{g} {w}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        rows.push(vec![
            format!(
                "NCCL all-reduce over {}",
                a.gpus
                    .iter()
                    .map(|g| format!("cuda:{g}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            format!("{} x {} {}", a.gpus.len(), a.count, a.dtype),
            a.busbw_gbs
                .map(|g| format!("{} GB/s bus", f1(Some(g))))
                .unwrap_or_default(),
            String::new(),
            checked,
        ]);
    }
    Section {
        title: "Between GPUs".into(),
        header: Some(
            ["test", "link / elements", "rate", "% of NVLink", "check"]
                .map(String::from)
                .to_vec(),
        ),
        rows,
        notes: vec![
            "copies: 64 MiB one way on the source's stream (median of 10), the last compared byte \
             for byte; % of NVLink: of the direct links' datasheet rate one way. all-reduce: a \
             sum of each GPU's small integers (exact in f32), every element of every GPU's \
             result counted against the exact sum, 5 rounds; bus GB/s as nccl-tests counts it."
                .into(),
        ],
    }
}

fn not_run(r: &StressReport) -> Section {
    let mut notes = Vec::new();
    if r.gpus.len() == 1 {
        notes.push(
            "one GPU: the rule against the best GPU of the same model had none to compare with."
                .into(),
        );
    }
    if let Some(p) = &r.planted {
        notes.push(format!(
            "a fault was planted on cuda:{} for tests (GPUKIT_STRESS_PLANT_FAULT): this run \
             says nothing of the hardware.",
            p.gpu
        ));
    }
    notes.push(format!("{}.", r.fp8_not_run));
    Section {
        title: "Not covered".into(),
        header: None,
        rows: Vec::new(),
        notes,
    }
}
