//! The live view of `gpukit monitor`: one panel per GPU drawn from the kept sampling rounds,
//! and the keys that steer it. The event loop and the terminal belong to the command.

use std::collections::VecDeque;

use gpukit_bench::monitor::{GpuSample, ProcessSample, Round};
use ratatui::crossterm::event::KeyCode;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, LineGauge, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

/// The last rounds sampled, oldest first, at most `capacity` of them.
#[derive(Debug, Clone)]
pub struct History {
    rounds: VecDeque<Round>,
    capacity: usize,
}

impl History {
    /// Keeps at most `capacity` rounds (at least one).
    pub fn new(capacity: usize) -> History {
        let capacity = capacity.max(1);
        History {
            rounds: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
        }
    }

    /// Adds the newest round, dropping the oldest when full.
    pub fn push(&mut self, round: Round) {
        if self.rounds.len() == self.capacity {
            self.rounds.pop_front();
        }
        self.rounds.push_back(round);
    }

    pub fn latest(&self) -> Option<&Round> {
        self.rounds.back()
    }

    /// GPUs in the newest round (what the digit keys can pick from).
    pub fn gpus(&self) -> usize {
        self.latest().map_or(0, Vec::len)
    }

    pub fn len(&self) -> usize {
        self.rounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rounds.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// One value per kept round for the GPU with NVML index `index`; None where the round lacks
    /// the GPU or the field.
    fn series(&self, index: u32, f: impl Fn(&GpuSample) -> Option<u64>) -> Vec<Option<u64>> {
        self.rounds
            .iter()
            .map(|r| r.iter().find(|g| g.index == index).and_then(&f))
            .collect()
    }

    /// Milliseconds between the oldest and newest kept reading of GPU `index`.
    fn span_ms(&self, index: u32) -> u64 {
        let mut times = self
            .rounds
            .iter()
            .filter_map(|r| r.iter().find(|g| g.index == index).map(|g| g.unix_ms));
        let first = times.next().unwrap_or(0);
        let last = times.next_back().unwrap_or(first);
        last.saturating_sub(first)
    }
}

/// What the user has chosen to see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewState {
    /// Position in the round of the GPU shown alone (NVML index when every GPU is sampled);
    /// None: all of them.
    pub selected: Option<usize>,
    /// The caller stops pushing rounds while paused; the view shows what it has.
    pub paused: bool,
    /// The sampling interval, shown in the footer.
    pub interval_ms: u64,
}

/// Applies one key press. Returns false when the view should close (q, Q, Esc).
/// p or space pauses and resumes; a digit picks that GPU when the round has it; a shows all;
/// Tab and Shift-Tab step through the GPUs (for more than ten).
pub fn handle_key(state: &mut ViewState, key: KeyCode, gpus: usize) -> bool {
    match key {
        KeyCode::Char('q' | 'Q') | KeyCode::Esc => return false,
        KeyCode::Char('p' | 'P' | ' ') => state.paused = !state.paused,
        KeyCode::Char('a' | 'A') => state.selected = None,
        KeyCode::Char(c) if c.is_ascii_digit() => {
            let i = c as usize - '0' as usize;
            if i < gpus {
                state.selected = Some(i);
            }
        }
        KeyCode::Tab if gpus > 0 => {
            state.selected = Some(match state.selected {
                Some(i) if i + 1 < gpus => i + 1,
                _ => 0,
            });
        }
        KeyCode::BackTab if gpus > 0 => {
            state.selected = Some(match state.selected {
                Some(i) if i > 0 && i <= gpus => i - 1,
                _ => gpus - 1,
            });
        }
        _ => {}
    }
    true
}

/// Draws the newest round with its history: panels for the GPUs shown, and the footer.
pub fn draw(frame: &mut Frame, history: &History, state: &ViewState) {
    let area = frame.area();
    if area.width == 0 || area.height == 0 {
        return;
    }
    let body = Rect {
        height: area.height - 1,
        ..area
    };
    let footer = Rect {
        y: area.y + area.height - 1,
        height: 1,
        ..area
    };
    let round = history.latest().filter(|r| !r.is_empty());
    let shown: Vec<&GpuSample> = match (round, state.selected) {
        (None, _) => Vec::new(),
        (Some(r), Some(i)) if i < r.len() => vec![&r[i]],
        (Some(r), _) => r.iter().collect(),
    };
    frame.render_widget(
        Paragraph::new(footer_line(
            state,
            history,
            round.map_or(0, Vec::len),
            shown.len(),
        )),
        footer,
    );
    if shown.is_empty() {
        let why = if history.is_empty() {
            "no GPU sampled yet: waiting for the first round"
        } else {
            "no GPU sampled: NVML listed no device"
        };
        if body.height > 0 {
            let row = Rect {
                y: body.y + body.height / 2,
                height: 1,
                ..body
            };
            frame.render_widget(
                Paragraph::new(Line::from(why).centered())
                    .style(Style::new().add_modifier(Modifier::BOLD)),
                row,
            );
        }
        return;
    }
    for (g, cell) in shown.iter().zip(grid(body, shown.len())) {
        draw_panel(frame, cell, g, history);
    }
}

fn footer_line(
    state: &ViewState,
    history: &History,
    in_round: usize,
    shown: usize,
) -> Line<'static> {
    let key = Style::new().add_modifier(Modifier::BOLD);
    let mut spans = Vec::new();
    if state.paused {
        spans.push(Span::styled(
            " paused ",
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
    }
    let pause = if state.paused { " resume" } else { " pause" };
    for (k, what) in [("q", " quit"), ("p", pause), ("0-9", " GPU"), ("a", " all")] {
        spans.push(Span::raw(" "));
        spans.push(Span::styled(k, key));
        spans.push(Span::raw(what));
    }
    let which = match state.selected {
        Some(i) if shown == 1 && in_round > 1 => format!("showing {i} of {in_round}"),
        _ => format!("{in_round} GPU{}", if in_round == 1 { "" } else { "s" }),
    };
    spans.push(Span::styled(
        format!(
            "  │ {which} · every {} ms · {}/{} rounds",
            state.interval_ms,
            history.len(),
            history.capacity()
        ),
        Style::new().fg(Color::DarkGray),
    ));
    Line::from(spans)
}

/// Cells for `n` panels: the column count that keeps panels closest to a readable size
/// (about 50x20), no narrower than 38 columns unless one column is all there is.
fn grid(area: Rect, n: usize) -> Vec<Rect> {
    if n == 0 || area.width == 0 || area.height == 0 {
        return Vec::new();
    }
    let max_cols = (area.width as usize / 38).clamp(1, n);
    let score = |cols: usize| {
        let rows = n.div_ceil(cols);
        let w = area.width as f64 / cols as f64;
        let h = area.height as f64 / rows as f64;
        (w / 50.0).min(h / 20.0)
    };
    // Ties go to the layout with fewer empty cells.
    let empty = |cols: usize| n.div_ceil(cols) * cols - n;
    let cols = (1..=max_cols)
        .max_by(|a, b| {
            score(*a)
                .total_cmp(&score(*b))
                .then(empty(*b).cmp(&empty(*a)))
        })
        .unwrap_or(1);
    let rows = n.div_ceil(cols);
    let xs = split(area.x, area.width, cols);
    let ys = split(area.y, area.height, rows);
    (0..n)
        .map(|i| {
            let (x, w) = xs[i % cols];
            let (y, h) = ys[i / cols];
            Rect::new(x, y, w, h)
        })
        .collect()
}

/// `len` cells from `start` in `n` parts, the first ones a cell longer where it does not divide.
fn split(start: u16, len: u16, n: usize) -> Vec<(u16, u16)> {
    let n16 = n as u16;
    let (base, extra) = (len / n16, len % n16);
    let mut at = start;
    (0..n16)
        .map(|i| {
            let l = base + u16::from(i < extra);
            let part = (at, l);
            at += l;
            part
        })
        .collect()
}

fn draw_panel(frame: &mut Frame, area: Rect, g: &GpuSample, history: &History) {
    if area.width == 0 || area.height == 0 {
        return;
    }
    let title = title_line(g);
    let inner = if area.height >= 8 && area.width >= 24 {
        let block =
            Block::bordered()
                .title(title)
                .border_style(Style::new().fg(if g.throttled() {
                    Color::Red
                } else {
                    Color::DarkGray
                }));
        let inner = block.inner(area);
        frame.render_widget(block, area);
        inner
    } else {
        // Too small for borders: the title takes the first row, and the last column is left
        // blank to part the panel from its neighbour.
        let width = if area.width > 1 { area.width - 1 } else { 1 };
        frame.render_widget(
            Paragraph::new(title).style(Style::new().add_modifier(Modifier::REVERSED)),
            Rect {
                height: 1,
                width,
                ..area
            },
        );
        Rect {
            y: area.y + 1,
            height: area.height - 1,
            width,
            ..area
        }
    };
    if inner.width > 0 && inner.height > 0 {
        draw_contents(frame, inner, g, history);
    }
}

fn title_line(g: &GpuSample) -> Line<'static> {
    let name = if g.name.is_empty() { "n/a" } else { &g.name };
    let mut t = format!(" GPU {} · {name}", g.index);
    if !g.uuid.is_empty() {
        let prefix: String = g.uuid.chars().take(12).collect();
        t.push_str(&format!(" · {prefix}"));
    }
    t.push(' ');
    Line::from(Span::styled(t, Style::new().add_modifier(Modifier::BOLD)))
}

/// Rows a panel's history graphs need at the least: two of a title row and two graph rows.
const SPARKS_MIN: u16 = 6;

fn draw_contents(frame: &mut Frame, area: Rect, g: &GpuSample, history: &History) {
    let w = area.width as usize;
    let h = area.height;
    let gauges = gauge_rows(g);
    let others = other_items(g);
    let roomy_flow = flow(&others, w);
    let roomy_h = (gauges.len() + roomy_flow.len()) as u16;
    let mut y = area.y;
    let used = if w >= 30 && h >= roomy_h {
        for gauge in gauges {
            frame.render_widget(gauge, Rect::new(area.x, y, area.width, 1));
            y += 1;
        }
        let n = roomy_flow.len() as u16;
        frame.render_widget(
            Paragraph::new(roomy_flow),
            Rect::new(area.x, y, area.width, n),
        );
        y += n;
        roomy_h
    } else {
        let lines = flow(&compact_items(g), w);
        let n = (lines.len() as u16).min(h);
        frame.render_widget(Paragraph::new(lines), Rect::new(area.x, y, area.width, n));
        y += n;
        n
    };
    let rest = h - used;

    let procs = &g.processes;
    // Header and a row per process, or one line saying there are none.
    let proc_want = if procs.is_empty() {
        1
    } else {
        1 + procs.len() as u16
    };
    let show_sparks = rest >= SPARKS_MIN + proc_want.min(2);
    let mut proc_h = if show_sparks {
        proc_want.min(rest - SPARKS_MIN)
    } else {
        proc_want.min(rest)
    };
    if !procs.is_empty() && proc_h < 2 {
        proc_h = 0;
    }
    if show_sparks {
        let spark_total = rest - proc_h;
        let first = spark_total / 2;
        draw_sparks(
            frame,
            Rect::new(area.x, y, area.width, first),
            Rect::new(area.x, y + first, area.width, spark_total - first),
            g,
            history,
        );
        y += spark_total;
    }
    if proc_h > 0 {
        draw_processes(frame, Rect::new(area.x, y, area.width, proc_h), procs);
    }
}

fn dim() -> Style {
    Style::new().fg(Color::DarkGray)
}

fn level_style(ratio: Option<f64>) -> Style {
    match ratio {
        Some(r) if r >= 0.9 => Style::new().fg(Color::Red),
        Some(r) if r >= 0.7 => Style::new().fg(Color::Yellow),
        Some(_) => Style::new().fg(Color::Green),
        None => dim(),
    }
}

fn na<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

fn bytes(b: u64) -> String {
    if b as f64 >= GIB {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{:.0} MiB", b as f64 / MIB)
    }
}

fn memory_text(used: Option<u64>, total: Option<u64>) -> String {
    match (used, total) {
        (Some(u), Some(t)) if t as f64 >= GIB => {
            format!("{:.1}/{:.1} GiB", u as f64 / GIB, t as f64 / GIB)
        }
        (Some(u), Some(t)) => format!("{:.0}/{:.0} MiB", u as f64 / MIB, t as f64 / MIB),
        (u, t) => format!("{} / {}", na(u.map(bytes)), na(t.map(bytes))),
    }
}

fn power_text(draw: Option<f64>, limit: Option<f64>) -> String {
    match (draw, limit) {
        (Some(d), Some(l)) => format!("{d:.0}/{l:.0} W"),
        (d, l) => format!(
            "{} / {}",
            na(d.map(|d| format!("{d:.0} W"))),
            na(l.map(|l| format!("{l:.0} W")))
        ),
    }
}

fn pct_text(p: Option<u32>) -> String {
    na(p.map(|p| format!("{p}%")))
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some((n / d).clamp(0.0, 1.0)),
        _ => None,
    }
}

/// SM utilisation, memory bandwidth, memory and power: (label, value, fill).
fn gauge_values(g: &GpuSample) -> [(&'static str, String, Option<f64>); 4] {
    [
        (
            "SM",
            pct_text(g.utilization_gpu_pct),
            ratio(g.utilization_gpu_pct.map(f64::from), Some(100.0)),
        ),
        (
            "mem bw",
            pct_text(g.utilization_memory_pct),
            ratio(g.utilization_memory_pct.map(f64::from), Some(100.0)),
        ),
        (
            "memory",
            memory_text(g.memory_used_bytes, g.memory_total_bytes),
            ratio(
                g.memory_used_bytes.map(|b| b as f64),
                g.memory_total_bytes.map(|b| b as f64),
            ),
        ),
        (
            "power",
            power_text(g.power_draw_w, g.power_limit_w),
            ratio(g.power_draw_w, g.power_limit_w),
        ),
    ]
}

fn gauge_rows(g: &GpuSample) -> Vec<LineGauge<'static>> {
    gauge_values(g)
        .into_iter()
        .map(|(label, value, fill)| {
            LineGauge::default()
                .label(Line::from(vec![
                    Span::styled(format!("{label:<7}"), dim()),
                    Span::styled(format!("{value:>15}"), level_style(fill)),
                ]))
                .ratio(fill.unwrap_or(0.0))
                .filled_symbol("━")
                .unfilled_symbol("─")
                .filled_style(level_style(fill))
                .unfilled_style(dim())
        })
        .collect()
}

/// An item of flowed text: spans that stay on one line.
type Item = Vec<Span<'static>>;

fn item(label: &str, value: String, style: Style) -> Item {
    vec![
        Span::styled(format!("{label} "), dim()),
        Span::styled(value, style),
    ]
}

/// Every figure in few columns, for panels too small for gauges.
fn compact_items(g: &GpuSample) -> Vec<Item> {
    let [sm, bw, mem, power] = gauge_values(g);
    let (temp, temp_style) = temp_value(g);
    let clocks = match (g.sm_clock_mhz, g.memory_clock_mhz) {
        (None, None) => "n/a".to_string(),
        (sm, mem) => format!("{}/{} MHz", na(sm), na(mem)),
    };
    let (throttle, throttle_style) = throttle_value(g);
    vec![
        item("SM", sm.1, level_style(sm.2)),
        item("bw", bw.1, level_style(bw.2)),
        item("mem", mem.1, level_style(mem.2)),
        item("pwr", power.1, level_style(power.2)),
        item("temp", temp, temp_style),
        item("clk", clocks, Style::new()),
        item("PCIe", pcie_value(g), Style::new()),
        item("thr", throttle, throttle_style),
        item("ECC", na(g.ecc_uncorrected), ecc_style(g)),
        item("procs", g.processes.len().to_string(), Style::new()),
    ]
}

fn temp_value(g: &GpuSample) -> (String, Style) {
    let style = match g.temperature_c {
        Some(t) if t >= 85 => Style::new().fg(Color::Red),
        Some(t) if t >= 75 => Style::new().fg(Color::Yellow),
        Some(_) => Style::new(),
        None => dim(),
    };
    (na(g.temperature_c.map(|t| format!("{t} °C"))), style)
}

fn pcie_value(g: &GpuSample) -> String {
    let mbs = |v: Option<u64>| na(v.map(|v| format!("{:.1}", v as f64 / 1e6)));
    match (g.pcie_tx_bytes_per_s, g.pcie_rx_bytes_per_s) {
        (None, None) => "n/a".to_string(),
        (tx, rx) => format!("tx {} rx {} MB/s", mbs(tx), mbs(rx)),
    }
}

fn throttle_value(g: &GpuSample) -> (String, Style) {
    if g.throttle_reasons.is_empty() {
        ("none".to_string(), Style::new())
    } else if g.throttled() {
        (g.throttle_reasons.join(","), Style::new().fg(Color::Red))
    } else {
        (g.throttle_reasons.join(","), Style::new().fg(Color::Yellow))
    }
}

fn ecc_style(g: &GpuSample) -> Style {
    match g.ecc_uncorrected {
        Some(n) if n > 0 => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        _ => Style::new(),
    }
}

fn other_items(g: &GpuSample) -> Vec<Item> {
    let mhz = |v: Option<u32>| na(v.map(|v| format!("{v} MHz")));
    let (temp, temp_style) = temp_value(g);
    let (throttle, throttle_style) = throttle_value(g);
    vec![
        item("temp", temp, temp_style),
        item("SM clock", mhz(g.sm_clock_mhz), Style::new()),
        item("mem clock", mhz(g.memory_clock_mhz), Style::new()),
        item("PCIe", pcie_value(g), Style::new()),
        item("throttle", throttle, throttle_style),
        item("ECC uncorr.", na(g.ecc_uncorrected), ecc_style(g)),
        item("procs", g.processes.len().to_string(), Style::new()),
    ]
}

/// Packs items into lines `width` wide, two spaces apart, each into the first line with room
/// (fewer lines than keeping their order); an item wider than a line gets one of its own.
fn flow(items: &[Item], width: usize) -> Vec<Line<'static>> {
    let mut lines: Vec<(usize, Vec<Span<'static>>)> = Vec::new();
    for it in items {
        let w: usize = it.iter().map(Span::width).sum();
        match lines.iter_mut().find(|(at, _)| at + 2 + w <= width) {
            Some((at, line)) => {
                line.push(Span::raw("  "));
                line.extend(it.iter().cloned());
                *at += 2 + w;
            }
            None => lines.push((w, it.clone())),
        }
    }
    lines.into_iter().map(|(_, l)| Line::from(l)).collect()
}

/// `points` squeezed into at most `width` columns, each the mean of its share (None where its
/// share has no value).
fn fit(points: &[Option<u64>], width: usize) -> Vec<Option<u64>> {
    if points.len() <= width {
        return points.to_vec();
    }
    (0..width)
        .map(|i| {
            let part = &points[i * points.len() / width..(i + 1) * points.len() / width];
            let vals: Vec<u64> = part.iter().flatten().copied().collect();
            (!vals.is_empty()).then(|| vals.iter().sum::<u64>() / vals.len() as u64)
        })
        .collect()
}

fn duration_text(ms: u64) -> String {
    let s = ms / 1000;
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

fn draw_sparks(frame: &mut Frame, util: Rect, power: Rect, g: &GpuSample, history: &History) {
    let w = util.width as usize;
    let span = duration_text(history.span_ms(g.index));
    let util_series = fit(
        &history.series(g.index, |s| s.utilization_gpu_pct.map(u64::from)),
        w,
    );
    let power_series = fit(
        &history.series(g.index, |s| s.power_draw_w.map(|p| p.round() as u64)),
        w,
    );
    let power_max = g
        .power_limit_w
        .map(|l| l.round() as u64)
        .or_else(|| power_series.iter().flatten().copied().max())
        .unwrap_or(1)
        .max(1);
    let graphs = [
        (
            util,
            format!("SM util {} · last {span}", pct_text(g.utilization_gpu_pct)),
            util_series,
            100,
            Color::Green,
        ),
        (
            power,
            format!(
                "power {} · last {span}",
                power_text(g.power_draw_w, g.power_limit_w)
            ),
            power_series,
            power_max,
            Color::Yellow,
        ),
    ];
    for (area, title, data, max, color) in graphs {
        if area.height < 2 {
            continue;
        }
        let block = Block::new().title(Line::styled(title, dim()));
        frame.render_widget(
            Sparkline::default()
                .block(block)
                .data(data)
                .max(max)
                .absent_value_symbol(" ")
                .style(Style::new().fg(color)),
            area,
        );
    }
}

fn draw_processes(frame: &mut Frame, area: Rect, procs: &[ProcessSample]) {
    if procs.is_empty() {
        frame.render_widget(
            Paragraph::new(Line::styled("no processes listed", dim())),
            Rect { height: 1, ..area },
        );
        return;
    }
    let mut sorted: Vec<&ProcessSample> = procs.iter().collect();
    sorted.sort_by_key(|p| std::cmp::Reverse(p.used_memory_bytes.unwrap_or(0)));
    let room = area.height.saturating_sub(1) as usize;
    // When they do not all fit, the last row counts the others.
    let (listed, more) = if sorted.len() > room && room >= 2 {
        (room - 1, sorted.len() - (room - 1))
    } else {
        (room.min(sorted.len()), 0)
    };
    let mut rows: Vec<Row> = sorted[..listed]
        .iter()
        .map(|p| {
            Row::new(vec![
                p.pid.to_string(),
                if p.name.is_empty() {
                    "n/a".to_string()
                } else {
                    p.name.clone()
                },
                na(p.used_memory_bytes.map(bytes)),
                pct_text(p.sm_util_pct),
            ])
        })
        .collect();
    if more > 0 {
        rows.push(Row::new(vec![String::new(), format!("+{more} more")]).style(dim()));
    }
    let widths = [
        Constraint::Length(8),
        Constraint::Fill(1),
        Constraint::Length(10),
        Constraint::Length(5),
    ];
    let table = Table::new(rows, widths).header(
        Row::new(vec!["PID", "process", "memory", "SM%"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    );
    frame.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    const H100: &str = "NVIDIA H100 80GB HBM3";
    const A100: &str = "NVIDIA A100-SXM4-40GB";

    /// GPU `i` at round `t`: even GPUs are H100s at the power cap with two processes, odd ones
    /// A100s that NVML tells less about (no ECC, PCIe or temperature).
    fn gpu(i: u32, t: u64) -> GpuSample {
        let even = i.is_multiple_of(2);
        GpuSample {
            unix_ms: 1_700_000_000_000 + t * 500,
            index: i,
            uuid: format!("GPU-{i}a2b3c4d-0000-1111-2222-333344445555"),
            name: if even { H100 } else { A100 }.to_string(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
            utilization_gpu_pct: Some(((t * 7 + u64::from(i) * 13) % 101) as u32),
            utilization_memory_pct: Some(42),
            memory_used_bytes: Some(12 * (1 << 30) + (1 << 29)),
            memory_total_bytes: Some(if even { 80 } else { 40 } * (1 << 30)),
            temperature_c: even.then_some(65),
            power_draw_w: Some(if even {
                699.6
            } else {
                250.0 + (t % 100) as f64
            }),
            power_limit_w: Some(if even { 700.0 } else { 400.0 }),
            sm_clock_mhz: Some(1980),
            memory_clock_mhz: Some(2619),
            pcie_tx_bytes_per_s: even.then_some(12_300_000),
            pcie_rx_bytes_per_s: even.then_some(4_500_000),
            energy_mj: Some(1_000_000 + t),
            throttle_reasons: if even {
                vec!["sw_power_cap".to_string()]
            } else {
                Vec::new()
            },
            ecc_uncorrected: even.then_some(0),
            processes: if even {
                vec![
                    ProcessSample {
                        pid: 4242,
                        name: "python3".to_string(),
                        used_memory_bytes: Some(10 * (1 << 30)),
                        sm_util_pct: Some(80),
                    },
                    ProcessSample {
                        pid: 777,
                        name: "gpukit".to_string(),
                        used_memory_bytes: Some(512 << 20),
                        sm_util_pct: None,
                    },
                ]
            } else {
                Vec::new()
            },
        }
    }

    fn state(interval_ms: u64) -> ViewState {
        ViewState {
            selected: None,
            paused: false,
            interval_ms,
        }
    }

    fn history(gpus: u32, rounds: u64) -> History {
        let mut h = History::new(600);
        for t in 0..rounds {
            h.push((0..gpus).map(|i| gpu(i, t)).collect());
        }
        h
    }

    fn render(w: u16, h: u16, history: &History, state: &ViewState) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| draw(f, history, state)).unwrap();
        let buf = term.backend().buffer();
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol()).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn monitor_view_zero_gpus() {
        let state = state(500);
        for (w, h) in [(80, 24), (200, 50)] {
            let empty = render(w, h, &History::new(10), &state);
            assert!(empty.contains("no GPU sampled yet"), "{empty}");
            let none = render(w, h, &history(0, 3), &state);
            assert!(none.contains("no GPU sampled"), "{none}");
            assert!(!none.contains("GPU 0"));
        }
    }

    #[test]
    fn monitor_view_one_gpu() {
        let state = state(500);
        for (w, h) in [(80, 24), (200, 50)] {
            let text = render(w, h, &history(1, 40), &state);
            assert!(
                text.contains("GPU 0 · NVIDIA H100 80GB HBM3 · GPU-0a2b3c4d"),
                "{text}"
            );
            assert!(text.contains("700/700 W"), "{text}");
            assert!(text.contains("12.5/80.0 GiB"), "{text}");
            assert!(text.contains("sw_power_cap"), "{text}");
            assert!(text.contains("65 °C"), "{text}");
            assert!(text.contains("1980 MHz"), "{text}");
            assert!(text.contains("tx 12.3 rx 4.5 MB/s"), "{text}");
            assert!(text.contains("python3") && text.contains("4242"), "{text}");
            assert!(text.contains("10.0 GiB"), "{text}");
            // SM% of gpukit's process is unknown.
            assert!(text.contains("n/a"), "{text}");
            assert!(
                text.contains("SM util") && text.contains("last 19s"),
                "{text}"
            );
            assert!(
                text.contains("q quit") && text.contains("p pause"),
                "{text}"
            );
            assert!(!text.contains("paused"), "{text}");
        }
    }

    #[test]
    fn monitor_view_none_fields_show_na() {
        let mut g = gpu(1, 0);
        g.utilization_gpu_pct = None;
        g.power_draw_w = None;
        g.memory_used_bytes = None;
        g.sm_clock_mhz = None;
        let mut h = History::new(10);
        h.push(vec![g]);
        for (w, rows) in [(80, 24), (200, 50), (40, 6)] {
            let text = render(w, rows, &h, &state(500));
            assert!(text.contains("temp n/a"), "{text}");
            assert!(text.contains("PCIe n/a"), "{text}");
            assert!(
                text.contains("SM n/a") || text.contains("SM util n/a"),
                "{text}"
            );
            assert!(
                text.contains("ECC uncorr. n/a") || text.contains("ECC n/a"),
                "{text}"
            );
            assert!(
                text.contains("SM clock n/a") || text.contains("clk n/a/2619 MHz"),
                "{text}"
            );
            assert!(text.contains("n/a / 400 W"), "{text}");
            assert!(text.contains("n/a / 40.0 GiB"), "{text}");
            assert!(
                !text.contains("0 °C") && !text.contains("0/400 W"),
                "{text}"
            );
        }
    }

    #[test]
    fn monitor_view_eight_gpus() {
        let h = history(8, 700);
        let state = state(500);
        let small = render(80, 24, &h, &state);
        for i in 0..8 {
            assert!(small.contains(&format!("GPU {i} ")), "GPU {i}:\n{small}");
        }
        assert!(small.contains(H100) && small.contains(A100), "{small}");
        assert!(small.contains("q quit"), "{small}");
        assert!(small.contains("8 GPUs"), "{small}");
        let large = render(200, 50, &h, &state);
        for i in 0..8 {
            assert!(large.contains(&format!("GPU {i} ")), "GPU {i}:\n{large}");
        }
        assert!(
            large.contains("700/700 W") && large.contains("/400 W"),
            "{large}"
        );
        assert!(
            large.contains("PID") && large.contains("python3"),
            "{large}"
        );
        assert!(
            large.contains("SM util") && large.contains("last 4m59s"),
            "{large}"
        );
        assert!(large.contains("throttle none"), "{large}");
        assert!(large.contains("600/600 rounds"), "{large}");
    }

    #[test]
    fn monitor_view_paused_marker() {
        let mut state = state(500);
        state.paused = true;
        for (w, h) in [(80, 24), (200, 50)] {
            for gpus in [0, 1, 8] {
                let text = render(w, h, &history(gpus, 5), &state);
                assert!(
                    text.contains("paused") && text.contains("p resume"),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn monitor_view_selected_gpu_alone() {
        let h = history(8, 20);
        let mut state = state(500);
        state.selected = Some(3);
        for (w, rows) in [(80, 24), (200, 50)] {
            let text = render(w, rows, &h, &state);
            assert!(text.contains("GPU 3 · NVIDIA A100"), "{text}");
            for j in (0..8).filter(|j| *j != 3) {
                assert!(!text.contains(&format!("GPU {j} ")), "GPU {j}:\n{text}");
            }
            assert!(text.contains("showing 3 of 8"), "{text}");
        }
        // A GPU that left the round: all are shown.
        state.selected = Some(9);
        let text = render(200, 50, &h, &state);
        assert!(text.contains("GPU 0 ") && text.contains("GPU 7 "), "{text}");
    }

    #[test]
    fn monitor_view_any_size_no_panic() {
        let mut full = history(8, 50);
        // Power above its limit and an empty name must not upset the gauges.
        let mut odd = gpu(8, 50);
        odd.power_draw_w = Some(900.0);
        odd.name.clear();
        odd.memory_total_bytes = Some(0);
        full.push((0..8).map(|i| gpu(i, 51)).chain([odd]).collect());
        for gpus in [full, history(1, 3), history(0, 1)] {
            for w in [
                1, 2, 5, 10, 20, 29, 30, 37, 38, 39, 40, 41, 60, 79, 80, 81, 120, 200, 250,
            ] {
                for h in [1, 2, 3, 4, 5, 7, 8, 9, 10, 16, 23, 24, 25, 50, 60] {
                    render(w, h, &gpus, &state(100));
                }
            }
        }
    }

    #[test]
    fn monitor_view_history_is_bounded() {
        let mut h = History::new(4);
        for t in 0..10 {
            h.push(vec![gpu(0, t)]);
        }
        assert_eq!(h.len(), 4);
        assert_eq!(h.gpus(), 1);
        assert_eq!(h.latest().unwrap()[0].unix_ms, gpu(0, 9).unix_ms);
        assert_eq!(h.series(0, |g| Some(g.unix_ms)).len(), 4);
        assert_eq!(h.span_ms(0), 3 * 500);
        assert_eq!(History::new(0).capacity(), 1);
    }

    #[test]
    fn monitor_view_fit_averages_buckets() {
        let points: Vec<Option<u64>> = (0..1000).map(|i| Some(i / 100)).collect();
        assert_eq!(fit(&points, 10), (0..10).map(Some).collect::<Vec<_>>());
        assert_eq!(fit(&[None, None, Some(4), Some(6)], 2), vec![None, Some(5)]);
        assert_eq!(fit(&[Some(1)], 10), vec![Some(1)]);
    }

    #[test]
    fn monitor_view_keys() {
        let mut s = state(500);
        assert!(!handle_key(&mut s, KeyCode::Char('q'), 8));
        assert!(!handle_key(&mut s, KeyCode::Esc, 8));
        assert!(handle_key(&mut s, KeyCode::Char('p'), 8));
        assert!(s.paused);
        assert!(handle_key(&mut s, KeyCode::Char('p'), 8));
        assert!(!s.paused);
        assert!(handle_key(&mut s, KeyCode::Char('7'), 8));
        assert_eq!(s.selected, Some(7));
        assert!(handle_key(&mut s, KeyCode::Char('8'), 8));
        assert_eq!(s.selected, Some(7), "GPU 8 does not exist");
        assert!(handle_key(&mut s, KeyCode::Char('a'), 8));
        assert_eq!(s.selected, None);
        assert!(handle_key(&mut s, KeyCode::Char('0'), 0));
        assert_eq!(s.selected, None, "no GPU to pick");
        assert!(handle_key(&mut s, KeyCode::Char('0'), 1));
        assert_eq!(s.selected, Some(0));
        handle_key(&mut s, KeyCode::Tab, 2);
        assert_eq!(s.selected, Some(1));
        handle_key(&mut s, KeyCode::Tab, 2);
        assert_eq!(s.selected, Some(0));
        handle_key(&mut s, KeyCode::BackTab, 2);
        assert_eq!(s.selected, Some(1));
        assert!(handle_key(&mut s, KeyCode::Char('x'), 2));
        assert_eq!(
            s,
            ViewState {
                selected: Some(1),
                paused: false,
                interval_ms: 500
            }
        );
    }
}
