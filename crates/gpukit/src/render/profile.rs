//! `gpukit profile`: the step beside its unprofiled time, the key-averages table (top rows)
//! and the idle gaps a CUDA graph removes.

use super::Section;
use gpukit_bench::workload::profile::table::Regime;
use gpukit_bench::workload::profile::ProfileReport;

fn ms(v: f64) -> String {
    format!("{v:.3} ms")
}

fn us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} ms", v / 1e3)
    } else {
        format!("{v:.1} us")
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn regime(r: Option<Regime>) -> &'static str {
    match r {
        Some(Regime::LaunchOverhead) => "launch",
        Some(Regime::Memory) => "memory",
        Some(Regime::Compute) => "compute",
        Some(Regime::HostAndTransfer) => "host",
        None => "-",
    }
}

/// Cuts a long kernel name to `max` characters (the JSON keeps it whole).
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let head: String = s.chars().take(max.saturating_sub(1)).collect();
        format!("{head}…")
    }
}

pub fn profile_sections(r: &ProfileReport) -> Vec<Section> {
    let mut summary = vec![
        ("Workload", r.workload.clone()),
        ("Device", r.device.clone()),
        ("Timing", r.timing_note.clone()),
        ("Steps recorded", r.steps.to_string()),
    ];
    if let Some(s) = &r.step_ms {
        summary.push((
            "Step without profiler",
            format!(
                "{} median (p10 {:.3}, p90 {:.3}, {} runs)",
                ms(s.median),
                s.p10,
                s.p90,
                s.count
            ),
        ));
    }
    if let Some(p) = r.profiled_step_ms {
        let over = r
            .overhead_pct
            .map(|o| format!(" ({o:+.1}% from profiling)"))
            .unwrap_or_default();
        summary.push(("Step while profiled", format!("{}{over}", ms(p))));
    }
    let what = if r.host_only {
        "Host time recorded a step"
    } else if r.kernels > 0 {
        "Kernel time a step"
    } else {
        "Op (event) time a step"
    };
    let coverage = r
        .coverage
        .map(|c| format!(" = {:.1}% of the step without profiler", 100.0 * c))
        .unwrap_or_default();
    summary.push((what, format!("{}{coverage}", ms(r.recorded_ms_per_step))));
    if r.kernels > 0 {
        summary.push((
            "Kernels",
            format!(
                "{} recorded, {} without an op, {} without a layer{}",
                r.kernels,
                r.unattributed_kernels,
                r.without_layer,
                if r.dropped > 0 {
                    format!(", {} records dropped by CUPTI", r.dropped)
                } else {
                    String::new()
                }
            ),
        ));
    }
    if let Some(i) = &r.idle {
        summary.push((
            "GPU idle between kernels",
            format!(
                "{} a step in {:.1} gaps (largest {}), busy {:.1}% of the window",
                us(i.idle_us_per_step),
                i.gaps_per_step,
                us(i.largest_gap_us),
                100.0 * i.busy_fraction
            ),
        ));
    }
    if let Some(i) = &r.eager_idle {
        summary.push((
            "Same pass launched op by op",
            format!(
                "{} idle a step in {:.1} gaps: what the graph removes",
                us(i.idle_us_per_step),
                i.gaps_per_step
            ),
        ));
    }
    summary.push(("Output checked", r.verified.clone()));
    let mut head = Section::kv(format!("Profile: {}", r.workload), summary);
    if let Some(f) = &r.fallback {
        head.notes.push(format!("CUPTI not used: {f}"));
    }
    if let Some(a) = &r.attribution {
        head.notes.push(format!("Graph: {a}."));
    }
    if r.nvtx {
        head.notes
            .push("NVTX ranges name every op (Nsight Systems shows gpukit's names).".into());
    }
    if let Some(t) = &r.trace {
        head.notes
            .push(gpukit_bench::workload::profile::run::trace_note(t));
    }
    let time = if r.host_only { "host" } else { "GPU" };
    let by = match r.group_by {
        gpukit_bench::workload::profile::table::GroupBy::Op => "op",
        gpukit_bench::workload::profile::table::GroupBy::Kernel => "kernel",
        gpukit_bench::workload::profile::table::GroupBy::Layer => "layer",
    };
    let header: Vec<String> = [
        by,
        "calls",
        &format!("{time} total"),
        &format!("{time} avg"),
        "% of steps",
        "CPU launch",
        "TFLOP/s",
        "GB/s",
        "FLOP/B",
        "bound by",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = r
        .rows
        .iter()
        .take(r.top)
        .map(|row| {
            vec![
                cut(&row.key, 60),
                row.calls.to_string(),
                us(row.gpu_total_us),
                us(row.gpu_avg_us),
                format!("{:.1}", row.pct_of_step),
                us(row.cpu_launch_us),
                opt(row.tflops, |v| format!("{v:.1}")),
                opt(row.gbs, |v| format!("{v:.0}")),
                // An elementwise op does well under 1 FLOP a byte: "0" would read as none.
                opt(row.intensity, |v| {
                    if v < 10.0 {
                        format!("{v:.2}")
                    } else {
                        format!("{v:.0}")
                    }
                }),
                regime(row.regime).to_string(),
            ]
        })
        .collect();
    let mut table = Section {
        title: format!(
            "Top {} by {time} time, grouped by {by} ({} rows in all)",
            r.top.min(r.rows.len()),
            r.rows.len()
        ),
        header: Some(header),
        rows,
        notes: Vec::new(),
    };
    table.notes.push(
        "bound by: launch = under 5 us a call (launch overhead sets its time); memory or \
         compute = its FLOPs a byte against the chip's ridge point (datasheet peaks)."
            .into(),
    );
    vec![head, table]
}
