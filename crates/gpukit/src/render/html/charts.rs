//! The charts of report.html, as SVG drawn by plotters: lines against a numeric x (log or
//! linear, with dashed reference lines), dot plots by category and stacked bars.

use super::escape;
use plotters::coord::ranged1d::{AsRangedCoord, SegmentValue, ValueFormatter};
use plotters::prelude::*;

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

/// The legend every chart draws, in the corner `position` leaves free.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 205, 212))
        .label_font((FONT, 12))
        .draw()
        .map_err(err)
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
        legend(&mut chart, c.legend.position())?;
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
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
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
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
