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
/// A lone value on a linear axis not from 0 is padded by a tenth of itself, so that the ticks
/// around it read as different numbers.
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
        let pad = (lo.abs() * 0.1).max(0.5);
        (lo - pad, hi + pad)
    })
}

/// Just below `10^k`: plotters' log ticks start at the first power of ten at or above the
/// range's start, found through a logarithm that can round `10^k` itself up a decade.
fn power_of_ten_below(k: f64) -> f64 {
    10f64.powf(k) * (1.0 - 1e-9)
}

/// A log axis' range that shows labels: plotters ticks a log axis only from the first power
/// of ten in range, and [`log_label`] names only 1, 2 and 5 times a power of ten, so a narrow
/// range (one point, or points close together) may get no label at all. Such a range is
/// widened to the powers of ten around it; `from_power_of_ten` always starts it at one.
fn labelled_log_range((lo, hi): (f64, f64), from_power_of_ten: bool) -> (f64, f64) {
    let (lo, hi) = if from_power_of_ten {
        (power_of_ten_below(lo.log10().floor()), hi)
    } else {
        (lo, hi)
    };
    if labelled_log_ticks(lo, hi) >= 2 {
        return (lo, hi);
    }
    (
        power_of_ten_below(lo.log10().floor()),
        10f64.powf(hi.log10().ceil()),
    )
}

/// How many ticks of a log axis over `lo..hi` [`log_label`] names (1, 2 and 5 times a power of
/// ten, from the first power of ten in range).
fn labelled_log_ticks(lo: f64, hi: f64) -> usize {
    if !(lo > 0.0 && hi > lo) {
        return 0;
    }
    let first = lo.log10().ceil() as i32;
    let last = hi.log10().floor() as i32;
    (first..=last)
        .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k)))
        .filter(|v| *v <= hi * (1.0 + 1e-9))
        .count()
}

/// Series (or reference lines) with the same points draw over one another, leaving only the
/// last visible: each such group becomes one, its names joined ("f32 = tf32 = bf16"), in the
/// first one's colour.
fn merge_identical<T: Clone>(
    items: &[T],
    same: impl Fn(&T, &T) -> bool,
    name: impl Fn(&mut T) -> &mut String,
) -> Vec<T> {
    let mut merged: Vec<T> = Vec::new();
    for item in items {
        match merged.iter_mut().find(|m| same(m, item)) {
            Some(m) => {
                let mut joined = item.clone();
                let added = std::mem::take(name(&mut joined));
                let names = name(m);
                names.push_str(" = ");
                names.push_str(&added);
            }
            None => merged.push(item.clone()),
        }
    }
    merged
}

fn draw_line_chart(c: &LineChart) -> Result<String, String> {
    let xs = c.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x0, x1) = axis_range(xs, c.x_log, false).ok_or("no points")?;
    let (x0, x1) = if c.x_log {
        labelled_log_range((x0 * 1.6 / 1.25, x1 / 1.6 * 1.25), false)
    } else {
        (x0, x1)
    };
    let ys = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(c.hlines.iter().map(|h| h.y));
    let (y0, y1) = axis_range(ys, c.y_log, true).ok_or("no points")?;
    let (y0, y1) = if c.y_log {
        labelled_log_range((y0, y1), true)
    } else {
        (y0, y1)
    };
    let shown = LineChart {
        caption: c.caption.clone(),
        x_desc: c.x_desc.clone(),
        y_desc: c.y_desc.clone(),
        series: merge_identical(
            &c.series,
            |a, b| a.points == b.points && a.dashed == b.dashed,
            |s| &mut s.name,
        ),
        hlines: merge_identical(&c.hlines, |a, b| a.y == b.y, |h| &mut h.name),
        ..*c
    };
    let c = &shown;
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
            // one point makes no line: its marker and its value show it
            if let [p] = s.points[..] {
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at(p)
                            + Circle::new((0, 0), 4, col.filled())
                            + Text::new(short(p.1), (7, -16), (FONT, 13).into_font().color(&col)),
                    ))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| Circle::new((x + 6, y), 4, col.filled()));
            } else if s.dashed {
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
    let (x0, x1) = labelled_log_range((x0, x1), false);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every `<text>` element of an SVG, trimmed, empty ones left out.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>'))
            .map(|(_, rest)| rest.split('<').next().unwrap_or("").trim().to_string())
            .filter(|t| !t.is_empty())
            .collect()
    }

    fn series(name: &str, points: &[(f64, f64)], color: usize) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
            color,
            dashed: false,
        }
    }

    fn lines(x_log: bool, y_log: bool, series: Vec<Series>, hlines: Vec<HLine>) -> LineChart {
        LineChart {
            caption: "caption".into(),
            x_desc: "matrix size".into(),
            y_desc: "TFLOP/s".into(),
            x_log,
            y_log,
            x_bytes: false,
            series,
            hlines,
            legend: Legend::UpperLeft,
        }
    }

    #[test]
    fn a_series_of_one_point_shows_its_value_and_labelled_axes() {
        struct OnePoint {
            x_log: bool,
            y_log: bool,
            point: (f64, f64),
            /// The axis labels that must be there: x's, then y's.
            labels: &'static [&'static str],
        }
        let cases = [
            OnePoint {
                x_log: true,
                y_log: false,
                point: (4096.0, 1.23),
                labels: &["1000", "2000", "5000", "0", "1"],
            },
            OnePoint {
                x_log: true,
                y_log: true,
                point: (4096.0, 782.4),
                labels: &["1000", "2000", "5000", "100", "500"],
            },
            OnePoint {
                x_log: true,
                y_log: true,
                point: (3000.0, 0.0456),
                labels: &["1000", "2000", "5000", "0.01", "0.02"],
            },
            OnePoint {
                x_log: false,
                y_log: false,
                point: (4096.0, 34.6),
                labels: &["4000", "4200", "0", "30"],
            },
        ];
        for OnePoint {
            x_log,
            y_log,
            point,
            labels,
        } in cases
        {
            let chart = lines(x_log, y_log, vec![series("f32", &[point], 0)], Vec::new());
            let svg = draw_line_chart(&chart).expect("one point draws");
            let t = texts(&svg);
            let what = format!("x log {x_log}, y log {y_log}, {point:?}: {t:?}");
            assert!(t.contains(&short(point.1)), "the point's value: {what}");
            for label in labels {
                assert!(t.iter().any(|s| s == label), "label {label}: {what}");
            }
            assert!(t.iter().any(|s| s == "f32"), "the legend: {what}");
        }
    }

    #[test]
    fn a_dashed_series_of_one_point_is_still_drawn() {
        let mut s = series("PyTorch", &[(4096.0, 12.5)], 1);
        s.dashed = true;
        let svg = draw_line_chart(&lines(true, false, vec![s], Vec::new())).expect("draws");
        assert!(svg.contains("<circle"), "a marker for the point");
        assert!(texts(&svg).contains(&"12.5".to_string()));
    }

    #[test]
    fn a_dot_plot_of_one_value_has_axis_labels() {
        let plot = DotPlot {
            caption: "caption".into(),
            x_desc: "images/s".into(),
            categories: vec!["fp16".into()],
            series: vec![("batch 1".into(), vec![Some(34.6)], false)],
        };
        let t = texts(&draw_dot_plot(&plot).expect("draws"));
        for label in ["10", "20", "50", "100"] {
            assert!(t.iter().any(|s| s == label), "label {label}: {t:?}");
        }
    }

    #[test]
    fn series_with_the_same_points_share_one_legend_entry_naming_them_all() {
        let points = [(256.0, 0.5), (1024.0, 0.9), (4096.0, 1.1)];
        let chart = lines(
            true,
            false,
            vec![
                series("f32", &points, 0),
                series("tf32", &points, 1),
                series("f64", &[(256.0, 0.2), (1024.0, 0.4)], 2),
                series("bf16", &points, 3),
            ],
            vec![
                HLine {
                    name: "f16 peak".into(),
                    y: 2.0,
                    color: 4,
                },
                HLine {
                    name: "bf16 peak".into(),
                    y: 2.0,
                    color: 5,
                },
            ],
        );
        let svg = draw_line_chart(&chart).expect("draws");
        let t = texts(&svg);
        assert!(t.iter().any(|s| s == "f32 = tf32 = bf16"), "{t:?}");
        assert!(t.iter().any(|s| s == "f64"), "{t:?}");
        assert!(t.iter().any(|s| s == "f16 peak = bf16 peak"), "{t:?}");
        for alone in ["f32", "tf32", "bf16", "f16 peak", "bf16 peak"] {
            assert!(!t.iter().any(|s| s == alone), "{alone} drawn alone: {t:?}");
        }
        // drawn once, in the first one's colour: tf32's, bf16's and the second peak's are unused
        for unused in ["#FF7F0E", "#D62728", "#8C564B"] {
            assert!(!svg.contains(unused), "{unused} drawn");
        }
        assert!(svg.contains("#1F77B4") && svg.contains("#9467BD"));
    }

    #[test]
    fn series_that_differ_anywhere_keep_their_own_entries() {
        let chart = lines(
            true,
            false,
            vec![
                series("f32", &[(256.0, 0.5), (1024.0, 0.9)], 0),
                series("tf32", &[(256.0, 0.5), (1024.0, 0.8)], 1),
            ],
            Vec::new(),
        );
        let t = texts(&draw_line_chart(&chart).expect("draws"));
        assert!(
            t.iter().any(|s| s == "f32") && t.iter().any(|s| s == "tf32"),
            "{t:?}"
        );
    }
}
