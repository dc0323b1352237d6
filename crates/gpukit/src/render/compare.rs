//! `gpukit compare`: a headline (the two files, their machines, the rule, the verdict counts,
//! and what could not be judged), the counts per section, then one table per section, worst
//! figure first.

use super::fmt::{grouped, mib};
use super::{to_markdown, Section};
use gpukit_bench::compare::{
    newly_failed, Better, CompareReport, Compared, Machine, Reading, SectionSummary, Side, Verdict,
};
use gpukit_bench::report::Document;

/// How many keys found in one report only are named under a section's table.
const NAMED_ONLY: usize = 5;

/// `gpukit compare`.
pub fn compare_sections(r: &CompareReport) -> Vec<Section> {
    let mut summary = per_section(r);
    let mut tables = Vec::new();
    for s in &r.sections {
        let table = section_table(r, s);
        if table.rows.is_empty() {
            // nothing in common: an empty grid says less than the keys each side has
            summary
                .notes
                .push(format!("{}: no figure in common", s.section));
            summary
                .notes
                .extend(table.notes.iter().map(|n| format!("  {n}")));
        } else {
            tables.push(table);
        }
    }
    let mut out = vec![headline(r), summary];
    out.extend(tables);
    out
}

/// The Markdown file `--markdown` writes: the warnings first (they change what the figures
/// mean), the sections, then the document's failure.
pub fn compare_markdown(doc: &Document<CompareReport>, sections: &[Section]) -> String {
    let mut md = format!(
        "# gpukit compare\n\ngpukit {}: {} against {}\n",
        doc.gpukit_version, doc.result.new.path, doc.result.old.path
    );
    if !doc.notes.is_empty() {
        md.push('\n');
        for n in &doc.notes {
            md.push_str(&format!("- {n}\n"));
        }
    }
    md.push_str(&to_markdown(sections, 2));
    if let Some(f) = &doc.failure {
        md.push_str(&format!("\n**failed**: {f}\n"));
    }
    md
}

/// The files, the machines, the rule and the counts over every section; under it, what could
/// not be judged and what would let it be.
fn headline(r: &CompareReport) -> Section {
    let t = &r.total;
    let threshold = percent(r.threshold);
    let counts = format!(
        "{} better, {} worse, {} same ({} of them within the runs' spread), {} not judged (too \
         few repetitions), {} not measured (failed or skipped); {} only in old, {} only in new",
        t.better,
        t.worse,
        t.same,
        t.within_noise,
        t.not_judged,
        t.not_measured,
        t.only_old,
        t.only_new
    );
    let verdicts = if r.too_noisy {
        format!("too noisy to judge as a whole (see below); per figure: {counts}")
    } else {
        counts
    };
    let mut section = Section::kv(
        "gpukit compare",
        vec![
            ("Old", side(&r.old)),
            ("New", side(&r.new)),
            ("Old machine", machine(&r.old.machine)),
            ("New machine", machine(&r.new.machine)),
            (
                "Rule",
                format!(
                    "better or worse when the change is beyond {threshold} AND both runs' \
                     p10-p90 ranges, of at least {} repetitions each, are apart; not judged on \
                     fewer; else same (bytes and batch sizes: beyond {threshold} alone)",
                    r.min_samples
                ),
            ),
            ("Verdicts", verdicts),
            ("Geometric mean gain", gain_text(t.geomean_gain)),
        ],
    );
    section.notes = r.caveats.clone();
    section
}

/// "report.json (all, gpukit 0.9.0)".
fn side(s: &Side) -> String {
    format!(
        "{} ({}, gpukit {})",
        s.path,
        s.command,
        s.gpukit_version.as_deref().unwrap_or("version unknown")
    )
}

/// "NVIDIA H100 80GB HBM3 GPU-6144c1d5-..., driver 580.159.04, CPU Xeon".
fn machine(m: &Machine) -> String {
    let mut parts = Vec::new();
    if let Some(g) = &m.gpu {
        parts.push(match &m.gpu_uuid {
            Some(u) => format!("{g} ({u})"),
            None => g.clone(),
        });
    }
    if let Some(d) = &m.driver {
        parts.push(format!("driver {d}"));
    }
    if let Some(c) = &m.cpu {
        parts.push(format!("CPU {c}"));
    }
    if parts.is_empty() {
        "not recorded".into()
    } else {
        parts.join(", ")
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// A gain as the tables show it: "1.03x (new better)".
fn gain_text(g: Option<f64>) -> String {
    match g {
        Some(g) if g >= 1.0 => format!("{g:.3}x (above 1: new better)"),
        Some(g) => format!("{g:.3}x (below 1: new worse)"),
        None => "none (no figure measured in both)".into(),
    }
}

/// The counts of each section.
fn per_section(r: &CompareReport) -> Section {
    let rows = r
        .sections
        .iter()
        .map(|s| {
            vec![
                s.section.clone(),
                s.better.to_string(),
                s.worse.to_string(),
                s.same.to_string(),
                s.not_judged.to_string(),
                s.not_measured.to_string(),
                s.only_old.to_string(),
                s.only_new.to_string(),
                s.geomean_gain
                    .map(|g| format!("{g:.3}x"))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    Section {
        title: "Per section".into(),
        header: Some(
            [
                "section",
                "better",
                "worse",
                "same",
                "not judged",
                "not measured",
                "only old",
                "only new",
                "geomean gain",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: vec![
            "gain: new over old for rates (TFLOP/s, GB/s, images/s), old over new for ms and \
             bytes, so that above 1 is always better."
                .into(),
        ],
    }
}

/// One section's figures, worst first, and the keys only one report has.
fn section_table(r: &CompareReport, s: &SectionSummary) -> Section {
    let prefix = format!("{} ", s.section);
    let rows = r
        .figures
        .iter()
        .filter(|c| c.section == s.section)
        .map(|c| figure_row(c, &prefix))
        .collect();
    let mut notes = problems(r.figures.iter().filter(|c| c.section == s.section));
    for (which, keys) in [("old", &r.only_old), ("new", &r.only_new)] {
        let mine: Vec<&str> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(&prefix))
            .collect();
        if let Some(line) = only_line(which, &mine) {
            notes.push(line);
        }
    }
    Section {
        title: format!("{} (new/old; p10-p90 in brackets)", s.section),
        header: Some(
            ["figure", "unit", "old", "new", "new/old", "verdict"]
                .map(String::from)
                .to_vec(),
        ),
        rows,
        notes,
    }
}

/// Why rows were not measured, each reason once with how many figures it stopped (the cells
/// only say "failed" or "skipped").
fn problems<'a>(figures: impl Iterator<Item = &'a Compared>) -> Vec<String> {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for c in figures {
        for (which, r) in [("old", &c.old), ("new", &c.new)] {
            let Some(p) = &r.problem else { continue };
            let line = format!("{which} {p}");
            match seen.iter_mut().find(|(l, _)| *l == line) {
                Some((_, n)) => *n += 1,
                None => seen.push((line, 1)),
            }
        }
    }
    seen.into_iter()
        .map(|(line, n)| format!("{line} ({n} figure(s))"))
        .collect()
}

/// "only in old (3): a, b, c" naming the first few.
fn only_line(which: &str, keys: &[&str]) -> Option<String> {
    if keys.is_empty() {
        return None;
    }
    let shown: Vec<&str> = keys.iter().take(NAMED_ONLY).copied().collect();
    let more = keys.len().saturating_sub(NAMED_ONLY);
    Some(format!(
        "only in {which} ({}): {}{}",
        keys.len(),
        shown.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    ))
}

fn figure_row(c: &Compared, prefix: &str) -> Vec<String> {
    let arrow = match c.better {
        Better::Higher => "↑",
        Better::Lower => "↓",
    };
    vec![
        c.key.strip_prefix(prefix).unwrap_or(&c.key).to_string(),
        format!("{} {arrow}", c.unit),
        reading(&c.old, &c.unit),
        reading(&c.new, &c.unit),
        c.ratio.map(|x| format!("{x:.3}")).unwrap_or_default(),
        verdict(c),
    ]
}

/// A value with its spread, or why there is none.
fn reading(r: &Reading, unit: &str) -> String {
    match (r.value, &r.problem) {
        (Some(v), _) => match r.spread {
            Some([lo, hi]) => format!(
                "{} ({}-{})",
                value(v, unit),
                value(lo, unit),
                value(hi, unit)
            ),
            None => value(v, unit),
        },
        // the reason is in the notes under the table
        (None, Some(p)) => p.split(':').next().unwrap_or(p).to_string(),
        (None, None) => "-".into(),
    }
}

/// A value in its unit's usual precision (bytes as MiB).
fn value(v: f64, unit: &str) -> String {
    if unit == "bytes" {
        // a byte count is whole; `as` saturates, it does not wrap
        return mib(v.round() as u64);
    }
    if v >= 1000.0 {
        grouped(v)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// "worse -20.0%", "same (noise) +8.1%", "not judged (n=3) -20.0%", "not measured".
fn verdict(c: &Compared) -> String {
    let change = c
        .gain
        .map(|g| format!(" {:+.1}%", (g - 1.0) * 100.0))
        .unwrap_or_default();
    match c.verdict {
        Verdict::Better => format!("better{change}"),
        Verdict::Worse => format!("worse{change}"),
        Verdict::Same if c.within_noise => format!("same (noise){change}"),
        Verdict::Same => format!("same{change}"),
        Verdict::TooFewSamples => format!("not judged ({}){change}", repetitions(c)),
        Verdict::NotMeasured if newly_failed(c) => "FAILED now".into(),
        Verdict::NotMeasured => "not measured".into(),
    }
}

/// The fewer repetitions of the two sides, "n=3", or "no spread" when a side has no count.
fn repetitions(c: &Compared) -> String {
    let counted = |r: &Reading| r.spread.and(r.samples);
    match (counted(&c.old), counted(&c.new)) {
        (Some(a), Some(b)) => format!("n={}", a.min(b)),
        _ => "no spread".into(),
    }
}
