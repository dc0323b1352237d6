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
mod tests;
