//! Views that draw a whole document: the lines above `check`'s tables, `all`'s report.md
//! (every command's sections, then the notes) and the lines `all` prints when it is done.

use super::parts::drawn_parts;
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
