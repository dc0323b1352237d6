//! report.html of `gpukit all`: one self-contained page (inline CSS, inline SVG charts drawn with
//! plotters, no script, nothing fetched) with the machine and headline figures on top, then one
//! section per command: its charts above the same tables report.md shows.
//!
//! Only rows that produced a figure are drawn; failed and skipped rows appear in the tables as
//! such. Every piece of text from the report is escaped (names come from files).

use super::fmt::{grouped, human_bytes};
use super::{self as render, Section};
use gpukit_bench::all::AllReport;
use gpukit_bench::bandwidth::BandwidthReport;
use gpukit_bench::conv::ConvReport;
use gpukit_bench::infer::InferReport;
use gpukit_bench::matmul::MatmulReport;
use gpukit_bench::memory::MemoryReport;
use gpukit_bench::report::{Document, RowStatus};
use gpukit_bench::train::TrainReport;
use gpukit_tensor::Device;
use plotters::coord::ranged1d::{AsRangedCoord, SegmentValue, ValueFormatter};
use plotters::prelude::*;

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

/// The ids of the page's sections, in order (those with nothing to show are left out).
pub const SECTION_IDS: [&str; 9] = [
    "machine",
    "check",
    "matmul",
    "bandwidth",
    "conv",
    "infer",
    "memory",
    "train",
    "notes",
];

const CSS: &str = r#"
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

    section(&mut h, "machine", "Machine");
    h.push_str(&machine_html(r));
    h.push_str("<h3>Headline figures</h3>\n");
    h.push_str(&headline_html(r));

    section(&mut h, "check", "Check");
    h.push_str(&format!(
        "<p>{}</p>\n",
        escape(&render::check_headline(&r.check))
    ));
    h.push_str(&sections_to_html(&render::check_sections(&r.check)));

    section(&mut h, "matmul", "Matrix multiply");
    for c in matmul_charts(&r.matmul) {
        h.push_str(&c.render());
    }
    h.push_str(&sections_to_html(&render::matmul_sections(&r.matmul)));

    if let Some(b) = &r.bandwidth {
        section(&mut h, "bandwidth", "Data transfer");
        if let Some(c) = bandwidth_chart(b) {
            h.push_str(&c.render());
        }
        h.push_str(&sections_to_html(&render::bandwidth_sections(b)));
    }

    section(&mut h, "conv", "Convolution");
    if let Some(c) = conv_chart(&r.conv) {
        h.push_str(&c.render());
    }
    h.push_str(&sections_to_html(&render::conv_sections(&r.conv)));

    if let Some(i) = &r.infer {
        section(&mut h, "infer", "Inference");
        if let Some(c) = infer_chart(i) {
            h.push_str(&c.render());
        }
        h.push_str(&sections_to_html(&render::infer_sections(i)));
    }

    if let Some(m) = &r.memory {
        section(&mut h, "memory", "GPU memory");
        if let Some(c) = memory_chart(m) {
            h.push_str(&c.render());
        }
        h.push_str(&sections_to_html(&render::memory_sections(m)));
    }

    if !r.train.is_empty() {
        section(&mut h, "train", "Training");
        if let Some(c) = train_chart(&r.train) {
            h.push_str(&c.render());
        }
        for t in &r.train {
            h.push_str(&sections_to_html(&render::train_sections(t)));
        }
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
    debug_assert!(SECTION_IDS.contains(&id), "{id} is listed in SECTION_IDS");
    if h.contains("<section ") {
        h.push_str("</section>\n");
    }
    h.push_str(&format!(
        "<section id=\"{id}\">\n<h2>{}</h2>\n",
        escape(title)
    ));
}

/// Sections as HTML tables (a key/value list when a section has no header), notes under each.
/// Rows that failed or were skipped are marked so (class `failed` / `skipped`).
pub fn sections_to_html(sections: &[Section]) -> String {
    let mut out = String::new();
    for s in sections {
        out.push_str(&format!(
            "<h3>{}</h3>\n<div class=\"table-wrap\"><table>\n",
            escape(&s.title)
        ));
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

fn machine_name(r: &AllReport) -> String {
    match r.check.gpus.first() {
        Some(g) => g.name.clone(),
        None => r.check.host.cpu_model.clone(),
    }
}

fn machine_html(r: &AllReport) -> String {
    let c = &r.check;
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

fn headline_html(r: &AllReport) -> String {
    let mut cards = String::new();
    // matmul: best per dtype on the GPU (the CPU's when no GPU row measured)
    let gpu_rows = r
        .matmul
        .rows
        .iter()
        .any(|x| x.device != Device::Cpu && x.status == RowStatus::Ok && x.tflops.is_some());
    let mut dtypes: Vec<String> = Vec::new();
    for x in &r.matmul.rows {
        let d = x.dtype.to_string();
        if !dtypes.contains(&d) {
            dtypes.push(d);
        }
    }
    for d in &dtypes {
        let best = r
            .matmul
            .rows
            .iter()
            .filter(|x| (x.device != Device::Cpu) == gpu_rows && x.dtype.to_string() == *d)
            .filter(|x| x.status == RowStatus::Ok)
            .filter_map(|x| x.tflops.map(|t| (t, x)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let Some((t, x)) = best else { continue };
        let peak = r.matmul.gpu.as_ref().and_then(|g| g.peaks.for_dtype(d));
        let sub = match (gpu_rows, peak) {
            (true, Some(p)) => format!("{:.0}% of the {p:.1} peak, at {}", 100.0 * t / p, x.size),
            _ => format!("on {} at {}", x.device, x.size),
        };
        cards.push_str(&card(
            &format!("matmul {d}"),
            &format!("{t:.1} TFLOP/s"),
            &sub,
        ));
    }
    if let Some(b) = &r.bandwidth {
        use gpukit_bench::bandwidth::CopyKind;
        let best = |d2d: bool| {
            b.rows
                .iter()
                .filter(|x| x.status == RowStatus::Ok && (x.kind == CopyKind::D2d) == d2d)
                .filter(|x| x.kind != CopyKind::Bidirectional)
                .filter_map(|x| x.gbs.map(|g| (g, x)))
                .max_by(|a, b| a.0.total_cmp(&b.0))
        };
        if let Some((g, x)) = best(false) {
            let sub = match b.pcie_link_gbs {
                Some(l) => format!(
                    "{}, {}; link {l:.1} GB/s",
                    x.kind.label(),
                    human_bytes(x.bytes)
                ),
                None => format!("{}, {}", x.kind.label(), human_bytes(x.bytes)),
            };
            cards.push_str(&card(
                "best host-device copy",
                &format!("{g:.1} GB/s"),
                &sub,
            ));
        }
        if let Some((g, x)) = best(true) {
            let sub = match b.memory_peak_gbs {
                Some(m) => format!("{}; memory peak {m:.0} GB/s", human_bytes(x.bytes)),
                None => human_bytes(x.bytes),
            };
            cards.push_str(&card(
                "best device-device copy",
                &format!("{g:.0} GB/s"),
                &sub,
            ));
        }
    }
    if let Some(i) = &r.infer {
        let best = i
            .rows
            .iter()
            .filter(|x| x.status == RowStatus::Ok)
            .filter_map(|x| x.images_per_s.map(|v| (v, x)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((v, x)) = best {
            cards.push_str(&card(
                &format!("best inference ({})", i.model),
                &format!("{} images/s", grouped(v.round())),
                &format!("{} on {}, batch {}", x.strategy, x.device, x.batch),
            ));
        }
    }
    if let Some(m) = &r.memory {
        if let Some(mb) = &m.max_batch {
            cards.push_str(&card(
                "largest batch that fits",
                &grouped(mb.batch as f64),
                &format!("{} {} {}", m.model, m.precision, m.layout),
            ));
        }
    }
    if cards.is_empty() {
        return "<p>No figure was measured.</p>\n".into();
    }
    format!("<div class=\"cards\">\n{cards}</div>\n")
}

// ---------------------------------------------------------------------------------------------
// Charts

/// Tableau 10.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "sans-serif";
const WIDTH: u32 = 1000;

/// A line through measured points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub color: usize,
    pub dashed: bool,
}

/// A horizontal reference line (a peak), drawn dashed across the chart.
#[derive(Debug, Clone)]
pub struct HLine {
    pub name: String,
    pub y: f64,
    pub color: usize,
}

/// A chart of lines against a numeric x.
pub struct LineChart {
    pub caption: String,
    pub x_desc: String,
    pub y_desc: String,
    pub x_log: bool,
    pub y_log: bool,
    pub x_bytes: bool,
    pub series: Vec<Series>,
    pub hlines: Vec<HLine>,
    /// Where the legend goes: where the lines leave room.
    pub legend: Legend,
}

#[derive(Debug, Clone, Copy)]
pub enum Legend {
    UpperLeft,
    UpperRight,
    LowerRight,
}

impl Legend {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::UpperRight => SeriesLabelPosition::UpperRight,
            Legend::LowerRight => SeriesLabelPosition::LowerRight,
        }
    }
}

/// A dot plot: one row per category, a value axis (log) across.
pub struct DotPlot {
    pub caption: String,
    pub x_desc: String,
    pub categories: Vec<String>,
    /// (name, one value per category, hollow marker)
    pub series: Vec<(String, Vec<Option<f64>>, bool)>,
}

/// Stacked bars: one bar per category, layers bottom up.
pub struct StackedBars {
    pub caption: String,
    pub y_desc: String,
    pub categories: Vec<String>,
    /// (name, one value per category)
    pub layers: Vec<(String, Vec<f64>)>,
}

pub enum Chart {
    Lines(LineChart),
    Dots(DotPlot),
    Stacked(StackedBars),
}

impl Chart {
    fn caption(&self) -> &str {
        match self {
            Chart::Lines(c) => &c.caption,
            Chart::Dots(c) => &c.caption,
            Chart::Stacked(c) => &c.caption,
        }
    }

    /// `<figure>` with the SVG, or a line saying why the chart could not be drawn.
    pub fn render(&self) -> String {
        let svg = match self {
            Chart::Lines(c) => draw_line_chart(c),
            Chart::Dots(c) => draw_dot_plot(c),
            Chart::Stacked(c) => draw_stacked(c),
        };
        match svg {
            Ok(svg) => format!(
                "<figure class=\"chart\">\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
                strip_xml_prolog(&svg),
                escape(self.caption())
            ),
            Err(e) => format!(
                "<p class=\"chart-error\">chart not drawn ({}): {}</p>\n",
                escape(self.caption()),
                escape(&e)
            ),
        }
    }
}

fn strip_xml_prolog(svg: &str) -> &str {
    match svg.find("<svg") {
        Some(i) => &svg[i..],
        None => svg,
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Compact number for axis labels.
fn short(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .replace(".M", "M")
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// On a log axis only 1, 2 and 5 times a power of ten are labelled (plotters offers every
/// tick of the decade; labelling them all crowds the top of each decade).
/// Over more than `DECADES_ALL` decades only the powers of ten are.
fn log_label(v: f64, (lo, hi): (f64, f64), label: impl Fn(f64) -> String) -> String {
    const DECADES_ALL: f64 = 3.2;
    if v <= 0.0 {
        return String::new();
    }
    let m = v / 10f64.powf(v.log10().floor());
    let marks: &[f64] = if (hi / lo).log10() > DECADES_ALL {
        &[1.0, 10.0]
    } else {
        &[1.0, 2.0, 5.0, 10.0]
    };
    if marks.iter().any(|n| (m - n).abs() < 1e-6 * n) {
        label(v)
    } else {
        String::new()
    }
}

/// Decimal units: the log axis' ticks fall on powers of ten.
fn bytes_label(v: f64) -> String {
    let units = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")];
    match units.iter().find(|(u, _)| v >= *u) {
        Some((u, name)) => format!("{} {name}", short(v / u)),
        None => format!("{} B", short(v)),
    }
}

/// The axis range of values: padded, from 0 on a linear axis, by a factor on a log one.
fn axis_range(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Option<(f64, f64)> {
    let vs: Vec<f64> = values
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    let lo = vs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if vs.is_empty() {
        return None;
    }
    Some(if log {
        (lo / 1.6, hi * 1.6)
    } else if from_zero {
        (0.0_f64.min(lo), if hi > 0.0 { hi * 1.08 } else { 1.0 })
    } else if hi > lo {
        let pad = (hi - lo) * 0.04;
        (lo - pad, hi + pad)
    } else {
        (lo - 0.5, hi + 0.5)
    })
}

fn draw_line_chart(c: &LineChart) -> Result<String, String> {
    let xs = c.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x0, x1) = axis_range(xs, c.x_log, false).ok_or("no points")?;
    let (x0, x1) = if c.x_log {
        (x0 * 1.6 / 1.25, x1 / 1.6 * 1.25)
    } else {
        (x0, x1)
    };
    let ys = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(c.hlines.iter().map(|h| h.y));
    let (y0, y1) = axis_range(ys, c.y_log, true).ok_or("no points")?;
    // plotters' log ticks start at the first power of ten in range: start at one
    let y0 = if c.y_log {
        10f64.powf(y0.log10().floor())
    } else {
        y0
    };
    let r = ((x0, x1), (y0, y1));
    match (c.x_log, c.y_log) {
        (false, false) => lines_on(c, x0..x1, y0..y1, r),
        (true, false) => lines_on(c, (x0..x1).log_scale(), y0..y1, r),
        (false, true) => lines_on(c, x0..x1, (y0..y1).log_scale(), r),
        (true, true) => lines_on(c, (x0..x1).log_scale(), (y0..y1).log_scale(), r),
    }
}

type Ranges = ((f64, f64), (f64, f64));

fn lines_on<X, Y>(c: &LineChart, x: X, y: Y, (xr, yr): Ranges) -> Result<String, String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let height = 440;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        let x_plain = |v: f64| {
            if c.x_bytes {
                bytes_label(v)
            } else {
                short(v)
            }
        };
        let x_fmt = |v: &f64| {
            if c.x_log {
                log_label(*v, xr, x_plain)
            } else {
                x_plain(*v)
            }
        };
        let y_fmt = |v: &f64| {
            if c.y_log {
                log_label(*v, yr, short)
            } else {
                short(*v)
            }
        };
        chart
            .configure_mesh()
            .x_labels(if c.x_log { 60 } else { 10 })
            .y_labels(if c.y_log { 60 } else { 10 })
            .x_desc(c.x_desc.as_str())
            .y_desc(c.y_desc.as_str())
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(220, 224, 230))
            .draw()
            .map_err(err)?;
        for h in &c.hlines {
            let col = color(h.color);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(xr.0, h.y), (xr.1, h.y)],
                    7,
                    5,
                    col.stroke_width(2),
                ))
                .map_err(err)?
                .label(h.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 8, y)], col.stroke_width(2))
                });
        }
        for s in &c.series {
            let col = color(s.color);
            if s.dashed {
                chart
                    .draw_series(DashedLineSeries::new(
                        s.points.clone(),
                        6,
                        4,
                        col.stroke_width(2),
                    ))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 8, y)], col.stroke_width(2))
                    });
            } else {
                let marker = s.points.len() <= 40;
                chart
                    .draw_series(LineSeries::new(s.points.clone(), col.stroke_width(2)))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2))
                    });
                if marker {
                    chart
                        .draw_series(s.points.iter().map(|p| Circle::new(*p, 3, col.filled())))
                        .map_err(err)?;
                }
            }
        }
        chart
            .configure_series_labels()
            .position(c.legend.position())
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 205, 212))
            .label_font((FONT, 12))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn draw_dot_plot(c: &DotPlot) -> Result<String, String> {
    let n = c.categories.len();
    if n == 0 {
        return Err("no categories".into());
    }
    let values = c.series.iter().flat_map(|s| s.1.iter().flatten().copied());
    let (x0, x1) = axis_range(values, true, false).ok_or("no points")?;
    let longest = c
        .categories
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(1);
    let label_area = (longest as u32 * 7 + 16).clamp(80, 360);
    let height = 90 + 26 * n as u32 + 18 * c.series.len().div_ceil(4) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let top = n as i32 - 1;
        let mut chart = ChartBuilder::on(&root)
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(label_area)
            .build_cartesian_2d((x0..x1).log_scale(), (0..top).into_segmented())
            .map_err(err)?;
        // the first category on top
        let row = |i: usize| SegmentValue::CenterOf(top - i as i32);
        let y_fmt = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(k) | SegmentValue::Exact(k) => c
                .categories
                .get((top - *k) as usize)
                .cloned()
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        };
        let x_fmt = |v: &f64| log_label(*v, (x0, x1), short);
        chart
            .configure_mesh()
            .x_labels(60)
            .x_desc(c.x_desc.as_str())
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .y_labels(n)
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 14))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 228, 234))
            .draw()
            .map_err(err)?;
        for (k, (name, vals, hollow)) in c.series.iter().enumerate() {
            let col = color(k);
            let style = if *hollow {
                col.stroke_width(2)
            } else {
                col.filled()
            };
            let pts: Vec<(f64, SegmentValue<i32>)> = vals
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.map(|v| (v, row(i))))
                .collect();
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 5, style)))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| Circle::new((x + 6, y), 5, style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 205, 212))
            .label_font((FONT, 12))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn draw_stacked(c: &StackedBars) -> Result<String, String> {
    let n = c.categories.len();
    if n == 0 {
        return Err("no bars".into());
    }
    let totals: Vec<f64> = (0..n)
        .map(|i| {
            c.layers
                .iter()
                .map(|l| l.1.get(i).copied().unwrap_or(0.0))
                .sum()
        })
        .collect();
    let (_, y1) = axis_range(totals.iter().copied(), false, true).ok_or("no bars")?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let top = n as i32 - 1;
        let mut chart = ChartBuilder::on(&root)
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d((0..top).into_segmented(), 0.0..y1 * 1.15)
            .map_err(err)?;
        let x_fmt = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(k) => c.categories.get(*k as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        let y_fmt = |v: &f64| short(*v);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(c.y_desc.as_str())
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .x_labels(n)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 228, 234))
            .draw()
            .map_err(err)?;
        let (w, _) = chart.plotting_area().dim_in_pixel();
        let gap = ((w as f64 / (n as f64 + 1.0)) * 0.18) as u32;
        let mut base = vec![0.0; n];
        for (k, (name, vals)) in c.layers.iter().enumerate() {
            let col = color(k);
            let bars: Vec<Rectangle<(SegmentValue<i32>, f64)>> = (0..n)
                .filter_map(|i| {
                    let v = vals.get(i).copied().unwrap_or(0.0);
                    if v <= 0.0 {
                        return None;
                    }
                    let right = if i + 1 == n {
                        SegmentValue::Last
                    } else {
                        SegmentValue::Exact(i as i32 + 1)
                    };
                    let mut r = Rectangle::new(
                        [
                            (SegmentValue::Exact(i as i32), base[i]),
                            (right, base[i] + v),
                        ],
                        col.filled(),
                    );
                    r.set_margin(0, 0, gap, gap);
                    base[i] += v;
                    Some(r)
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 205, 212))
            .label_font((FONT, 12))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

// ---------------------------------------------------------------------------------------------
// What each command draws: only rows that produced a figure.

/// Groups `(key, point)` by key in order of first appearance.
fn group<K: PartialEq + Clone>(
    items: impl Iterator<Item = (K, (f64, f64))>,
) -> Vec<(K, Vec<(f64, f64)>)> {
    let mut out: Vec<(K, Vec<(f64, f64)>)> = Vec::new();
    for (k, p) in items {
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(p),
            None => out.push((k, vec![p])),
        }
    }
    for (_, v) in &mut out {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// TFLOP/s against size per device and dtype: the GPU's (with its peaks, log y) and the CPU's.
pub fn matmul_charts(r: &MatmulReport) -> Vec<Chart> {
    let mut charts = Vec::new();
    for gpu in [true, false] {
        let groups = group(
            r.rows
                .iter()
                .filter(|x| (x.device != Device::Cpu) == gpu && x.status == RowStatus::Ok)
                .filter_map(|x| {
                    x.tflops.filter(|t| t.is_finite() && *t > 0.0).map(|t| {
                        (
                            (x.device.to_string(), x.dtype.to_string()),
                            (x.size as f64, t),
                        )
                    })
                }),
        );
        if groups.is_empty() {
            continue;
        }
        let several_devices = groups.iter().any(|((d, _), _)| *d != groups[0].0 .0);
        let mut series = Vec::new();
        let mut hlines = Vec::new();
        for (i, ((device, dtype), points)) in groups.into_iter().enumerate() {
            if gpu {
                if let Some(p) = r.gpu.as_ref().and_then(|g| g.peaks.for_dtype(&dtype)) {
                    if !hlines
                        .iter()
                        .any(|h: &HLine| h.name == format!("{dtype} peak"))
                    {
                        hlines.push(HLine {
                            name: format!("{dtype} peak"),
                            y: p,
                            color: i,
                        });
                    }
                }
            }
            series.push(Series {
                name: if several_devices {
                    format!("{device} {dtype}")
                } else {
                    dtype
                },
                points,
                color: i,
                dashed: false,
            });
        }
        let caption = if gpu {
            format!(
                "Matrix multiply on the GPU{}: TFLOP/s against matrix size (log scales); dashed: each dtype's dense peak",
                r.gpu.as_ref().map(|g| format!(" ({})", g.name)).unwrap_or_default()
            )
        } else {
            format!(
                "Matrix multiply on the CPU ({}, {} threads): TFLOP/s against matrix size",
                r.cpu_model, r.cpu_threads
            )
        };
        charts.push(Chart::Lines(LineChart {
            caption,
            x_desc: "matrix size (n x n)".into(),
            y_desc: "TFLOP/s".into(),
            x_log: true,
            y_log: gpu,
            x_bytes: false,
            series,
            hlines,
            legend: if gpu {
                Legend::UpperLeft
            } else {
                Legend::LowerRight
            },
        }));
    }
    charts
}

/// GB/s against size per copy (log-log), with the PCIe link and the memory peak.
pub fn bandwidth_chart(r: &BandwidthReport) -> Option<Chart> {
    let groups = group(
        r.rows
            .iter()
            .filter(|x| x.status == RowStatus::Ok)
            .filter_map(|x| {
                x.gbs
                    .filter(|g| g.is_finite() && *g > 0.0)
                    .map(|g| (x.kind.label(), (x.bytes as f64, g)))
            }),
    );
    if groups.is_empty() {
        return None;
    }
    let n = groups.len();
    let series = groups
        .into_iter()
        .enumerate()
        .map(|(i, (k, points))| Series {
            name: k.to_string(),
            points,
            color: i,
            dashed: false,
        })
        .collect();
    let mut hlines = Vec::new();
    if let Some(l) = r.pcie_link_gbs {
        hlines.push(HLine {
            name: format!("PCIe link {l:.1} GB/s"),
            y: l,
            color: n,
        });
    }
    if let Some(m) = r.memory_peak_gbs {
        hlines.push(HLine {
            name: format!("memory peak {m:.0} GB/s"),
            y: m,
            color: n + 1,
        });
    }
    Some(Chart::Lines(LineChart {
        caption: "Copy rate against copy size (log-log); dashed: one direction of the PCIe link, and the GPU memory's peak".into(),
        x_desc: "bytes copied".into(),
        y_desc: "GB/s".into(),
        x_log: true,
        y_log: true,
        x_bytes: true,
        series,
        hlines,
        legend: Legend::UpperLeft,
    }))
}

/// Whole-set times (ResNet-50's convolutions) per dtype and layout.
pub fn conv_chart(r: &ConvReport) -> Option<Chart> {
    let totals: Vec<_> = r
        .totals
        .iter()
        .filter(|t| t.gpu_ms.is_some() || t.cpu_ms.is_some() || t.pytorch_ms.is_some())
        .collect();
    if totals.is_empty() {
        return None;
    }
    let several_batches = totals.iter().any(|t| t.batch != totals[0].batch);
    let categories = totals
        .iter()
        .map(|t| {
            if several_batches {
                format!("{} {} (batch {})", t.dtype, t.layout, t.batch)
            } else {
                format!("{} {}", t.dtype, t.layout)
            }
        })
        .collect();
    let mut series = vec![(
        "gpukit GPU".to_string(),
        totals.iter().map(|t| t.gpu_ms).collect::<Vec<_>>(),
        false,
    )];
    if totals.iter().any(|t| t.pytorch_ms.is_some()) {
        series.push((
            "PyTorch".into(),
            totals.iter().map(|t| t.pytorch_ms).collect(),
            true,
        ));
    }
    if totals.iter().any(|t| t.cpu_ms.is_some()) {
        series.push((
            "CPU (f32)".into(),
            totals.iter().map(|t| t.cpu_ms).collect(),
            false,
        ));
    }
    Some(Chart::Dots(DotPlot {
        caption: format!(
            "Convolution: time of the whole set (every convolution of a forward pass, batch {}) per dtype and layout; lower is better (log scale)",
            totals[0].batch
        ),
        x_desc: "ms for the whole set".into(),
        categories,
        series,
    }))
}

/// Images/s per strategy at each batch size (log), PyTorch's beside (hollow) when present.
pub fn infer_chart(r: &InferReport) -> Option<Chart> {
    let ok: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.status == RowStatus::Ok && x.images_per_s.is_some_and(|v| v > 0.0))
        .collect();
    if ok.is_empty() {
        return None;
    }
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut batches: Vec<usize> = Vec::new();
    for x in &ok {
        let k = (x.strategy.clone(), x.device.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
        if !batches.contains(&x.batch) {
            batches.push(x.batch);
        }
    }
    batches.sort_unstable();
    let mut series = Vec::new();
    for &b in &batches {
        let value = |k: &(String, String), peer: bool| {
            ok.iter()
                .find(|x| x.batch == b && x.strategy == k.0 && x.device == k.1)
                .and_then(|x| {
                    if peer {
                        x.pytorch.as_ref().map(|p| p.rate).filter(|v| *v > 0.0)
                    } else {
                        x.images_per_s
                    }
                })
        };
        series.push((
            format!("batch {b}"),
            keys.iter().map(|k| value(k, false)).collect::<Vec<_>>(),
            false,
        ));
        let peer: Vec<_> = keys.iter().map(|k| value(k, true)).collect();
        if peer.iter().any(Option::is_some) {
            series.push((format!("PyTorch, batch {b}"), peer, true));
        }
    }
    // a peer series takes the colour after its own: keep batch colours apart by order
    Some(Chart::Dots(DotPlot {
        caption: format!(
            "Inference ({}, {}x{}): images/s per strategy at each batch size (log scale); hollow: PyTorch for the same workload",
            r.model, r.image_size, r.image_size
        ),
        x_desc: "images/s".into(),
        categories: keys
            .iter()
            .map(|(s, d)| format!("{s} [{d}]"))
            .collect(),
        series,
    }))
}

/// Per batch size, the pool's peak split into weights, input, activations and workspace (MiB).
pub fn memory_chart(r: &MemoryReport) -> Option<Chart> {
    let ok: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.status == RowStatus::Ok)
        .collect();
    if ok.is_empty() {
        return None;
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    Some(Chart::Stacked(StackedBars {
        caption: format!(
            "GPU memory of {} {} {} per batch size: the pool's peak split into weights, input, activations (arena) and convolution workspace",
            r.model, r.precision, r.layout
        ),
        y_desc: "MiB".into(),
        categories: ok.iter().map(|x| format!("batch {}", x.batch)).collect(),
        layers: vec![
            ("weights".into(), ok.iter().map(|x| mib(x.weights_bytes)).collect()),
            ("input".into(), ok.iter().map(|x| mib(x.input_bytes)).collect()),
            (
                "activations (arena)".into(),
                ok.iter().map(|x| mib(x.arena_bytes)).collect(),
            ),
            (
                "conv workspace".into(),
                ok.iter().map(|x| mib(x.conv_workspace_bytes)).collect(),
            ),
        ],
    }))
}

/// Loss against update for each run; PyTorch's, when it ran beside, dashed.
pub fn train_chart(runs: &[TrainReport]) -> Option<Chart> {
    let mut series = Vec::new();
    for (i, t) in runs.iter().enumerate() {
        let name = t
            .preset
            .map(|p| p.name().to_string())
            .unwrap_or_else(|| format!("run {}", i + 1));
        let points = |l: &[f64]| {
            l.iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(k, v)| (k as f64 + 1.0, *v))
                .collect::<Vec<_>>()
        };
        let p = points(&t.step_losses);
        if !p.is_empty() {
            series.push(Series {
                name: name.clone(),
                points: p,
                color: i,
                dashed: false,
            });
        }
        if let Some(peer) = &t.pytorch {
            let p = points(&peer.step_losses);
            if !p.is_empty() {
                series.push(Series {
                    name: format!("{name} (PyTorch)"),
                    points: p,
                    color: i,
                    dashed: true,
                });
            }
        }
    }
    if series.is_empty() {
        return None;
    }
    Some(Chart::Lines(LineChart {
        caption: "Training: loss of each update, per preset".into(),
        x_desc: "update".into(),
        y_desc: "loss".into(),
        x_log: false,
        y_log: false,
        x_bytes: false,
        series,
        hlines: Vec::new(),
        legend: Legend::UpperRight,
    }))
}
