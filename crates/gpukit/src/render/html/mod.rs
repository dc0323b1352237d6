//! report.html of `gpukit all`: one self-contained page (inline CSS, inline SVG charts drawn with
//! plotters, no script, nothing fetched) with the machine and headline figures on top, then one
//! section per command: its charts above the same tables report.md shows.
//!
//! Only rows that produced a figure are drawn; failed and skipped rows appear in the tables as
//! such. Every piece of text from the report is escaped (names come from files).

use super::Section;

mod cards;
mod charts;
mod figures;

pub use cards::{bandwidth_cards, infer_cards, matmul_cards, memory_cards};
pub use charts::Chart;
pub use figures::{
    bandwidth_chart, conv_chart, infer_chart, matmul_charts, memory_chart, train_chart,
};

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The ids of the page's sections, in order (those with nothing to show are left out): the
/// machine, each part of `all` by its key, the notes.
pub fn section_ids() -> Vec<&'static str> {
    let mut ids = vec!["machine"];
    ids.extend(gpukit_bench::parts().iter().map(|p| p.key()));
    ids.push("notes");
    ids
}

pub(crate) const CSS: &str = r#"
:root { --fg: #1d2330; --muted: #5b6473; --line: #d9dee7; --bg: #ffffff; --head: #f3f5f9; --bad: #b3261e; --warn: #8a5a00; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: var(--fg); background: var(--bg); margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 6px; }
.meta { color: var(--muted); font-size: 13px; margin: 0 0 16px; word-break: break-word; }
.banner { padding: 10px 14px; border-radius: 6px; margin: 12px 0; font-weight: 600; }
.banner.bad { background: #fdecea; color: var(--bad); border: 1px solid #f5c2bd; }
.banner.good { background: #e9f6ec; color: #1e6b34; border: 1px solid #bfe3c8; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(250px, 1fr)); gap: 10px; margin: 10px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; background: #fbfcfe; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card .v { font-size: 15px; font-weight: 600; }
.card .s { color: var(--muted); font-size: 12px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; word-break: break-word; }
figure.chart { margin: 12px 0; }
figure.chart svg { max-width: 100%; height: auto; display: block; }
figure.chart figcaption { color: var(--muted); font-size: 12px; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 4px; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; }
thead th { background: var(--head); position: sticky; top: 0; }
tbody th { background: var(--head); font-weight: 600; }
tr.failed td { color: var(--bad); background: #fdf3f2; }
tr.skipped td { color: var(--warn); background: #fdf9ef; }
ul.notes { color: var(--muted); font-size: 12.5px; margin: 4px 0 10px; padding-left: 20px; }
p.chart-error { color: var(--bad); }
@media print {
  body { font-size: 11px; }
  main { max-width: none; padding: 0; }
  h2 { break-after: avoid; page-break-after: avoid; }
  figure.chart, table, .cards { break-inside: avoid; page-break-inside: avoid; }
  thead th { position: static; }
  .table-wrap { overflow: visible; }
}
"#;

/// The page of one command (`--html FILE`): the same head and style as report.html, the
/// command's charts, then its tables and notes.
pub fn command_html<T>(
    doc: &gpukit_bench::report::Document<T>,
    command_line: &str,
    charts: &[Chart],
    sections: &[Section],
) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    h.push_str(&format!("<title>gpukit {}</title>\n", escape(&doc.command)));
    h.push_str(&format!("<style>{CSS}</style>\n</head>\n<body>\n<main>\n"));
    h.push_str(&format!("<h1>gpukit {}</h1>\n", escape(&doc.command)));
    h.push_str(&format!(
        "<p class=\"meta\">gpukit {} · <code>{}</code></p>\n",
        escape(&doc.gpukit_version),
        escape(command_line)
    ));
    if let Some(f) = &doc.failure {
        h.push_str(&format!(
            "<div class=\"banner bad\">Run failed: {}</div>\n",
            escape(f)
        ));
    }
    for c in charts {
        h.push_str(&c.render());
    }
    h.push_str(&sections_to_html(sections));
    if !doc.notes.is_empty() {
        h.push_str("<ul class=\"notes\">\n");
        for n in &doc.notes {
            h.push_str(&format!("<li>{}</li>\n", escape(n)));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</main>\n</body>\n</html>\n");
    h
}

/// Rows that failed or were skipped are marked so (class `failed` / `skipped`).
pub fn sections_to_html(sections: &[Section]) -> String {
    let mut out = String::new();
    for s in sections {
        out.push_str(&format!("<h3>{}</h3>\n", escape(&s.title)));
        if !s.has_table() {
            for n in &s.notes {
                out.push_str(&format!("<p>{}</p>\n", escape(n)));
            }
            continue;
        }
        out.push_str("<div class=\"table-wrap\"><table>\n");
        if let Some(header) = &s.header {
            out.push_str("<thead><tr>");
            for c in header {
                out.push_str(&format!("<th>{}</th>", escape(c)));
            }
            out.push_str("</tr></thead>\n");
        }
        out.push_str("<tbody>\n");
        for r in &s.rows {
            // results tables say "FAILED: why" / "skipped: why"; memory's shows the status itself
            let class = if r
                .iter()
                .any(|c| c.starts_with("FAILED") || c.starts_with("Failed("))
            {
                " class=\"failed\""
            } else if r
                .iter()
                .any(|c| c.starts_with("skipped") || c.starts_with("Skipped("))
            {
                " class=\"skipped\""
            } else {
                ""
            };
            out.push_str(&format!("<tr{class}>"));
            for (i, c) in r.iter().enumerate() {
                if s.header.is_none() && i == 0 {
                    out.push_str(&format!("<th>{}</th>", escape(c)));
                } else {
                    out.push_str(&format!("<td>{}</td>", escape(c)));
                }
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody></table></div>\n");
        if !s.notes.is_empty() {
            out.push_str("<ul class=\"notes\">\n");
            for n in &s.notes {
                out.push_str(&format!("<li>{}</li>\n", escape(n)));
            }
            out.push_str("</ul>\n");
        }
    }
    out
}
