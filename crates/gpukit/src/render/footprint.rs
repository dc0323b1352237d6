//! `gpukit monitor -- CMD`: what the command did to the GPUs, as tables.

use super::Section;
use gpukit_bench::monitor::run::Footprint;

/// What a command did to the GPUs, as tables.
pub fn footprint_sections(f: &Footprint) -> Vec<Section> {
    let mib =
        |b: Option<u64>| b.map_or("n/a".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
    let num = |v: Option<f64>, unit: &str| v.map_or("n/a".into(), |v| format!("{v:.1} {unit}"));
    let mut head = Section::kv(
        format!("Footprint of `{}`", f.command.join(" ")),
        vec![
            ("exit code", f.exit_code.to_string()),
            ("duration", format!("{:.3} s", f.seconds)),
            ("sampled every", format!("{} ms", f.interval_ms)),
        ],
    );
    if let Some(why) = &f.not_sampled {
        head.notes.push(format!("GPUs not sampled: {why}"));
    }
    let mut sections = vec![head];
    if !f.gpus.is_empty() {
        let rows = f
            .gpus
            .iter()
            .map(|g| {
                let throttled = if g.throttled_seconds.is_empty() {
                    "none".to_string()
                } else {
                    g.throttled_seconds
                        .iter()
                        .map(|(r, s)| format!("{r} {s:.1} s"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                vec![
                    format!("{} {}", g.index, g.name),
                    g.samples.to_string(),
                    mib(g.peak_memory_bytes),
                    format!(
                        "{} / {}",
                        num(g.mean_utilization_pct, "%"),
                        g.max_utilization_pct
                            .map_or("n/a".into(), |u| format!("{u} %"))
                    ),
                    format!(
                        "{} / {} (limit {})",
                        num(g.mean_power_w, "W"),
                        num(g.max_power_w, "W"),
                        num(g.power_limit_w, "W")
                    ),
                    num(g.energy_j, "J"),
                    match &g.power_for_energy {
                        Some(w) => format!("{} ({w})", num(g.energy_from_power_j, "J")),
                        None => num(g.energy_from_power_j, "J"),
                    },
                    throttled,
                ]
            })
            .collect();
        sections.push(Section {
            title: "GPUs while it ran".into(),
            header: Some(
                [
                    "GPU",
                    "samples",
                    "peak memory",
                    "utilisation mean / max",
                    "power mean / max",
                    "energy (counter)",
                    "power over time",
                    "throttled",
                ]
                .map(String::from)
                .to_vec(),
            ),
            rows,
            notes: vec![
                "energy (counter): NVML's energy counter, last reading minus first; power over time checks it: the readings integrated between samples, instantaneous ones where the driver has them (the averaged reading trails a change of load by about a second)".into(),
            ],
        });
    }
    if !f.processes.is_empty() {
        sections.push(Section {
            title: "Processes on the GPUs".into(),
            header: Some(
                ["GPU", "pid", "name", "peak memory"]
                    .map(String::from)
                    .to_vec(),
            ),
            rows: f
                .processes
                .iter()
                .map(|p| {
                    vec![
                        p.gpu.to_string(),
                        p.pid.to_string(),
                        p.name.clone(),
                        mib(Some(p.peak_memory_bytes)),
                    ]
                })
                .collect(),
            notes: Vec::new(),
        });
    }
    sections
}
