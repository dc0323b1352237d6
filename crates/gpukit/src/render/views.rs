//! Views that draw a whole document: the lines above `check`'s tables, `all`'s report.md
//! (every command's sections, then the notes) and report.html (the machine and headline figures
//! on top, then each part's charts above its tables), and the lines `all` prints when done.

use super::html::{escape, section_ids, sections_to_html, CSS};
use super::parts::{drawn_parts, Drawn};
use super::{self as render, to_markdown};
use gpukit_bench::all::AllReport;
use gpukit_bench::check::CheckReport;
use gpukit_bench::report::Document;
use std::path::PathBuf;

/// The lines `check` prints above its tables: the build, then whether a GPU is usable.
pub fn check_head(r: &CheckReport) -> Vec<String> {
    vec![
        format!(
            "gpukit {} (built for CUDA {}: needs a driver with CUDA {} or newer)",
            r.gpukit_version, r.build_cuda, r.build_requires_driver_api
        ),
        render::check_headline(r),
    ]
}

/// report.md of `gpukit all`: each part's sections under its heading, then the notes.
pub fn all_markdown(doc: &Document<AllReport>) -> String {
    let r = &doc.result;
    let mut md = format!(
        "# gpukit report\n\ngpukit {} · `{}` · {:.1} s ({})\n",
        doc.gpukit_version,
        r.command_line.join(" "),
        r.total_seconds,
        r.seconds
            .iter()
            .map(|(n, s)| format!("{n} {s:.1} s"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    for (_, title, d) in drawn_parts(r) {
        md.push_str(&format!("\n## {title}\n"));
        if let Some(lead) = &d.lead {
            md.push_str(&format!("\n{lead}\n"));
        }
        md.push_str(&to_markdown(&d.sections, 3));
    }
    if !doc.notes.is_empty() || doc.failure.is_some() {
        md.push_str("\n## Notes\n\n");
        if let Some(f) = &doc.failure {
            md.push_str(&format!("- **failed**: {f}\n"));
        }
        for n in &doc.notes {
            md.push_str(&format!("- {n}\n"));
        }
    }
    md
}

/// What `gpukit all` prints on the terminal once its reports are written.
#[derive(Debug, Clone, PartialEq)]
pub struct AllDone {
    /// Above everything else: the check's headline, then the files written and how long it took.
    pub head: Vec<String>,
    /// The very last line, after the notes: the page to open. Minutes of progress and notes
    /// scroll the "wrote" line away; this one is what stays in view.
    pub last: Option<String>,
}

/// The lines `all` prints around its notes, from the files it wrote (report.html among them).
pub fn all_done(doc: &Document<AllReport>, written: &[PathBuf]) -> AllDone {
    let check: Option<CheckReport> = doc.result.part("check");
    let head = check
        .map(|c| render::check_headline(&c))
        .into_iter()
        .chain([format!(
            "wrote {} in {:.1} s",
            written
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            doc.result.total_seconds
        )])
        .collect();
    let last = written
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == "report.html"))
        .map(|p| format!("open {}", p.display()));
    AllDone { head, last }
}

/// report.html of `gpukit all`.
pub fn all_html(doc: &Document<AllReport>) -> String {
    let r = &doc.result;
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    h.push_str(&format!(
        "<title>gpukit report: {}</title>\n",
        escape(&machine_name(r))
    ));
    h.push_str(&format!("<style>{CSS}</style>\n</head>\n<body>\n<main>\n"));
    h.push_str("<h1>gpukit report</h1>\n");
    h.push_str(&format!(
        "<p class=\"meta\">gpukit {} · <code>{}</code> · {:.1} s ({})</p>\n",
        escape(&doc.gpukit_version),
        escape(&r.command_line.join(" ")),
        r.total_seconds,
        escape(
            &r.seconds
                .iter()
                .map(|(n, s)| format!("{n} {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    ));
    match &doc.failure {
        Some(f) => h.push_str(&format!(
            "<div class=\"banner bad\">Run failed: {}</div>\n",
            escape(f)
        )),
        None => {
            h.push_str("<div class=\"banner good\">Every measured row passed its check.</div>\n")
        }
    }

    let drawn = drawn_parts(r);
    section(&mut h, "machine", "Machine");
    h.push_str(&machine_html(r));
    h.push_str("<h3>Headline figures</h3>\n");
    h.push_str(&headline_html(&drawn));

    for (key, title, d) in &drawn {
        section(&mut h, key, title);
        if let Some(lead) = &d.lead {
            h.push_str(&format!("<p>{}</p>\n", escape(lead)));
        }
        for c in &d.charts {
            h.push_str(&c.render());
        }
        h.push_str(&sections_to_html(&d.sections));
    }

    if !doc.notes.is_empty() || doc.failure.is_some() {
        section(&mut h, "notes", "Notes");
        h.push_str("<ul>\n");
        if let Some(f) = &doc.failure {
            h.push_str(&format!(
                "<li><strong>failed</strong>: {}</li>\n",
                escape(f)
            ));
        }
        for n in &doc.notes {
            h.push_str(&format!("<li>{}</li>\n", escape(n)));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</section>\n</main>\n</body>\n</html>\n");
    h
}

fn section(h: &mut String, id: &str, title: &str) {
    debug_assert!(section_ids().contains(&id), "{id} is a section id");
    if h.contains("<section ") {
        h.push_str("</section>\n");
    }
    h.push_str(&format!(
        "<section id=\"{id}\">\n<h2>{}</h2>\n",
        escape(title)
    ));
}

/// Sections as HTML tables (a key/value list when a section has no header), notes under each;
/// a section with no table is its title and its notes as paragraphs.
/// The check's report: the page's machine facts come from it.
fn check_of(r: &AllReport) -> Option<CheckReport> {
    r.part("check")
}

fn machine_name(r: &AllReport) -> String {
    match check_of(r) {
        Some(c) => match c.gpus.first() {
            Some(g) => g.name.clone(),
            None => c.host.cpu_model.clone(),
        },
        None => "unknown machine".into(),
    }
}

fn machine_html(r: &AllReport) -> String {
    let Some(c) = check_of(r) else {
        return "<p>The check did not run.</p>\n".into();
    };
    let mut rows: Vec<(String, String)> = Vec::new();
    if c.gpus.is_empty() {
        rows.push((
            "GPU".into(),
            c.reason.clone().unwrap_or_else(|| "none found".into()),
        ));
    }
    for g in &c.gpus {
        let mut v = g.name.clone();
        if let Some((a, b)) = g.compute_capability {
            v.push_str(&format!(", compute {a}.{b}"));
        }
        if let Some(sm) = g.sm_count {
            v.push_str(&format!(", {sm} SMs"));
        }
        if let Some(m) = g.memory_usable_bytes {
            v.push_str(&format!(", {:.1} GiB", m as f64 / (1u64 << 30) as f64));
        }
        rows.push((format!("GPU {}", g.index), v));
    }
    if let Some(d) = &c.driver {
        rows.push((
            "Driver".into(),
            format!(
                "{} (CUDA {})",
                d.version
                    .clone()
                    .unwrap_or_else(|| "version unknown".into()),
                d.cuda_api
            ),
        ));
    }
    let found: Vec<String> = c
        .libraries
        .iter()
        .filter(|l| l.found)
        .map(|l| match &l.version {
            Some(v) => format!("{} {v}", l.name),
            None => l.name.clone(),
        })
        .collect();
    let missing: Vec<String> = c
        .libraries
        .iter()
        .filter(|l| !l.found)
        .map(|l| l.name.clone())
        .collect();
    rows.push((
        "CUDA libraries found".into(),
        if found.is_empty() {
            "none".into()
        } else {
            found.join(", ")
        },
    ));
    if !missing.is_empty() {
        rows.push(("Not found".into(), missing.join(", ")));
    }
    let host = &c.host;
    rows.push((
        "CPU".into(),
        format!(
            "{}, {} threads{}, {}",
            host.cpu_model,
            host.logical_cores,
            host.physical_cores
                .map(|p| format!(" ({p} cores)"))
                .unwrap_or_default(),
            host.simd
        ),
    ));
    if let Some(m) = host.memory_total_bytes {
        rows.push((
            "Host memory".into(),
            format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64),
        ));
    }
    rows.push(("OS".into(), format!("{} ({})", host.os, host.arch)));
    let mut out = String::from("<dl class=\"facts\">\n");
    for (k, v) in rows {
        out.push_str(&format!("<dt>{}</dt><dd>{}</dd>\n", escape(&k), escape(&v)));
    }
    out.push_str("</dl>\n");
    out
}

fn card(k: &str, v: &str, s: &str) -> String {
    format!(
        "<div class=\"card\"><div class=\"k\">{}</div><div class=\"v\">{}</div><div class=\"s\">{}</div></div>\n",
        escape(k),
        escape(v),
        escape(s)
    )
}

/// The cards above the sections: each part's best figures, in the parts' order.
fn headline_html(drawn: &[(&str, &str, Drawn)]) -> String {
    let cards: String = drawn
        .iter()
        .flat_map(|(_, _, d)| d.cards.iter())
        .map(|(k, v, s)| card(k, v, s))
        .collect();
    if cards.is_empty() {
        return "<p>No figure was measured.</p>\n".into();
    }
    format!("<div class=\"cards\">\n{cards}</div>\n")
}
