//! Views of result structs: each result becomes [`Section`]s once, and the terminal and Markdown
//! renderers draw the same sections (one source of truth for what is shown).
//!
//! Each command's sections are built in its own file; this one draws sections and holds the
//! results table the benchmark commands share.

mod bandwidth;
mod check;
mod compare;
mod conv;
mod fmt;
mod footprint;
pub mod html;
mod infer;
mod infer_onnx;
mod infer_pytorch;
mod lessons;
mod man;
mod matmul;
mod memory;
pub mod monitor;
mod nccl;
pub mod parts;
mod power;
mod profile;
mod stress;
#[cfg(test)]
mod tests;
mod train;
mod train_cnn;
mod views;

pub use bandwidth::bandwidth_sections;
pub use check::{check_headline, check_sections};
pub use compare::{compare_markdown, compare_sections};
pub use conv::conv_sections;
pub use footprint::footprint_sections;
pub use infer::{infer_sections, input_run_section};
pub use infer_onnx::onnx_run_sections;
pub use lessons::lessons_sections;
pub use man::man_page;
pub use matmul::{matmul_search_sections, matmul_sections};
pub use memory::memory_sections;
pub use nccl::{nccl_sections, p2p_sections};
pub use profile::profile_sections;
pub use stress::stress_sections;
pub use train::train_sections;
pub use train_cnn::cnn_train_sections;
pub use views::{all_done, all_html, all_markdown, check_head};

use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};
use fmt::{f1, times};
use gpukit_bench::report::{PeerFigure, RowStatus};

/// A titled table: with a header it is a grid, without one a list of key/value rows. Without
/// either (no header, no rows) it is its title and notes alone: no empty table is drawn.
pub struct Section {
    pub title: String,
    pub header: Option<Vec<String>>,
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table.
    pub notes: Vec<String>,
}

impl Section {
    /// Whether there is a table to draw (a header or a row).
    pub(crate) fn has_table(&self) -> bool {
        self.header.is_some() || !self.rows.is_empty()
    }

    pub(crate) fn kv(title: impl Into<String>, rows: Vec<(&str, String)>) -> Section {
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

/// Draws sections as terminal tables, wrapped to the terminal's width when stdout is one.
pub fn to_terminal(sections: &[Section]) -> String {
    draw_terminal(sections, true)
}

/// `fit_terminal: false` draws every table unwrapped, as when stdout is not a terminal: tests
/// take that path so that their text does not depend on the terminal that runs them.
fn draw_terminal(sections: &[Section], fit_terminal: bool) -> String {
    let mut out = String::new();
    for s in sections {
        if !s.has_table() {
            out.push_str(&format!("\n{}\n", s.title));
            for n in &s.notes {
                out.push_str(&format!("  {n}\n"));
            }
            continue;
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic);
        if !fit_terminal {
            t.force_no_tty();
        }
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
        if !s.has_table() {
            out.push_str(&s.notes.join("\n\n"));
            out.push('\n');
            continue;
        }
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
    /// Rows flagged as behind PyTorch beyond the method's noise (their ratio cell says BEHIND).
    behind: Option<&'a dyn Fn(&R) -> bool>,
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
                let mut ratio = ratio_cell((c.peer)(r));
                if c.behind.is_some_and(|behind| behind(r)) {
                    ratio.push_str(" BEHIND");
                }
                cells.push(ratio);
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

fn check_cell(v: Option<&gpukit_bench::report::Verification>) -> String {
    v.map(|v| format!("ok {:.0e}", v.rel_err))
        .unwrap_or_default()
}
