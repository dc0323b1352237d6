//! `gpukit lessons`: per lesson, the claim, each version's time (with PyTorch's beside it), its
//! regime, and the verdict with its evidence.

use super::Section;
use gpukit_bench::lessons::{Case, Lesson, LessonsReport, Regime, Verdict};

fn ms(v: f64) -> String {
    if v < 0.1 {
        format!("{:.1} us", v * 1e3)
    } else {
        format!("{v:.3} ms")
    }
}

fn spread(c: &Case) -> String {
    format!("{} ({}-{})", ms(c.ms.median), ms(c.ms.p10), ms(c.ms.p90))
}

fn rate(c: &Case) -> String {
    // memory-bound work is read in bytes a second, the rest in FLOPs
    let bytes_first = c.regime != Some(Regime::Compute) || c.tflops.is_none();
    if let (true, Some(g)) = (bytes_first, c.gbs) {
        return if g >= 1.0 {
            format!("{g:.0} GB/s")
        } else {
            format!("{:.0} MB/s", g * 1e3)
        };
    }
    match (c.tflops, c.gbs) {
        (Some(t), _) if t >= 1.0 => format!("{t:.1} TFLOP/s"),
        (Some(t), _) if t >= 0.01 => format!("{:.0} GFLOP/s", t * 1e3),
        (_, Some(g)) if g >= 1.0 => format!("{g:.0} GB/s"),
        (_, Some(g)) => format!("{:.0} MB/s", g * 1e3),
        _ => "-".into(),
    }
}

fn case_rows(l: &Lesson) -> Vec<Vec<String>> {
    l.cases
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                spread(c),
                rate(c),
                c.peak_mib.map_or("-".into(), |m| format!("{m:.0} MiB")),
                c.regime.map_or("-", |r| r.name()).to_string(),
                c.pytorch.map_or("-".into(), |p| ms(p.median_ms)),
                c.vs_pytorch.map_or("-".into(), |r| format!("{r:.2}x")),
            ]
        })
        .collect()
}

fn verdict_word(v: Verdict) -> String {
    v.name().to_uppercase()
}

pub fn lessons_sections(r: &LessonsReport) -> Vec<Section> {
    let mut out = vec![Section::kv(
        "Lessons",
        vec![
            ("Device", r.device.clone()),
            ("Timing", r.method.clone()),
            (
                "PyTorch",
                r.pytorch
                    .clone()
                    .unwrap_or_else(|| "not run (add --compare-pytorch)".into()),
            ),
        ],
    )];
    for l in &r.lessons {
        let title = format!("Lesson {}: {}", l.id, l.title);
        if l.verdict == Verdict::Skipped {
            // nothing was measured: a table would be empty, the reason is all there is to say
            out.push(Section {
                title,
                header: None,
                rows: Vec::new(),
                notes: vec![format!("Skipped: {}", l.reason)],
            });
            continue;
        }
        let mut notes = Vec::new();
        if !l.claim.is_empty() {
            notes.push(format!("Claim: {}", l.claim));
        }
        if let Some(n) = &l.notebook {
            notes.push(format!("The notebook printed: {n}"));
        }
        for c in &l.comparisons {
            notes.push(format!(
                "{} over {}: {:.2}x{}",
                c.good,
                c.bad,
                c.speedup,
                c.pytorch_speedup
                    .map(|p| format!(" (PyTorch {p:.2}x)"))
                    .unwrap_or_default()
            ));
        }
        notes.push(format!(
            "Verdict: {}: {}",
            verdict_word(l.verdict),
            l.reason
        ));
        notes.extend(l.evidence.iter().map(|e| format!("- {e}")));
        notes.extend(l.pytorch_notes.iter().map(|e| format!("- {e}")));
        if !l.cases.is_empty() {
            out.push(Section {
                title,
                header: Some(
                    [
                        "case",
                        "gpukit (p10-p90)",
                        "rate",
                        "peak",
                        "regime",
                        "PyTorch",
                        "vs PyTorch",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                rows: case_rows(l),
                notes,
            });
        } else if !l.overlaps.is_empty() {
            let rows = l
                .overlaps
                .iter()
                .map(|o| {
                    vec![
                        o.name.clone(),
                        ms(o.serial_ms),
                        ms(o.overlapped_ms),
                        format!("{:.2}x", o.serial_ms / o.overlapped_ms),
                        ms(o.overlap_ms),
                        o.pytorch_serial_ms.map_or("-".into(), ms),
                        o.pytorch_overlapped_ms.map_or("-".into(), ms),
                    ]
                })
                .collect();
            let mut notes = notes;
            for o in &l.overlaps {
                let spans: Vec<String> = o
                    .intervals_ms
                    .iter()
                    .map(|(n, b, e)| format!("{n} {b:.2}-{e:.2}"))
                    .collect();
                notes.push(format!(
                    "- {} spans from the start event (ms): {}",
                    o.name,
                    spans.join(", ")
                ));
            }
            out.push(Section {
                title,
                header: Some(
                    [
                        "pattern",
                        "serial",
                        "overlapped",
                        "speedup",
                        "overlap",
                        "PyTorch serial",
                        "PyTorch overlapped",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                rows,
                notes,
            });
        } else if !l.profile.is_empty() {
            let rows = l
                .profile
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        p.calls.to_string(),
                        format!("{:.1} us", p.gpu_total_us),
                        format!("{:.1}%", p.pct),
                    ]
                })
                .collect();
            out.push(Section {
                title,
                header: Some(
                    [
                        "op",
                        "calls",
                        "time (GPU, or host without one)",
                        "% of step",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                rows,
                notes,
            });
        } else {
            out.push(Section {
                title,
                header: None,
                rows: Vec::new(),
                notes,
            });
        }
    }
    out
}
