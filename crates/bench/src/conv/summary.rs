//! What `bench conv`'s rows add up to: the whole network's convolution time per batch, dtype and
//! layout (each shape weighted by how often ResNet-50 runs it), against the CPU and PyTorch, the
//! row furthest behind PyTorch, and the notes under the table.

use super::{ConvReport, ConvRow, PARITY_FLOOR};
use crate::report::RowStatus;
use gpukit_tensor::{DType, Device, Layout};
use serde::{Deserialize, Serialize};

/// One batch x dtype x layout over every shape: times summed as the network runs them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvTotal {
    pub batch: usize,
    pub dtype: DType,
    pub layout: Layout,
    /// Convolutions in one forward pass (each shape counted as often as the network runs it).
    pub convolutions: usize,
    /// Distinct shapes, and how many of them have a verified GPU time.
    pub shapes: usize,
    pub shapes_measured: usize,
    /// Sum over shapes of count x median, when every shape was measured.
    pub gpu_ms: Option<f64>,
    /// The CPU's f32 time for the same set, when every shape's CPU row was timed.
    pub cpu_ms: Option<f64>,
    /// `cpu_ms / gpu_ms`: the GPU's speedup over the CPU on the whole set.
    pub speedup_vs_cpu: Option<f64>,
    /// PyTorch's time for the same set, when it gave a figure for every shape.
    pub pytorch_ms: Option<f64>,
    /// `pytorch_ms / gpu_ms`: above 1, gpukit is faster on the whole set.
    pub ratio_vs_pytorch: Option<f64>,
}

/// The GPU row with the lowest ratio to PyTorch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowestRow {
    pub name: String,
    pub batch: usize,
    pub dtype: DType,
    pub layout: Layout,
    pub engine: Option<String>,
    pub ratio: f64,
}

/// Sums `count x f(row)` over `rows`; None if any row lacks a figure.
fn weighted(rows: &[&ConvRow], f: impl Fn(&ConvRow) -> Option<f64>) -> Option<f64> {
    rows.iter()
        .map(|r| f(r).map(|ms| ms * r.count as f64))
        .sum()
}

/// Every batch x dtype x layout the GPU rows cover, in the order they first appear.
pub fn totals(rows: &[ConvRow]) -> Vec<ConvTotal> {
    let gpu_rows = || rows.iter().filter(|r| r.device != Device::Cpu);
    let mut keys = unique(gpu_rows().map(|r| (r.shape.n, r.dtype, r.layout)));
    // batch by batch, dtype by dtype, each in the order asked for (the sort is stable)
    let batches = unique(gpu_rows().map(|r| r.shape.n));
    let dtypes = unique(gpu_rows().map(|r| r.dtype));
    keys.sort_by_key(|&(b, d, _)| {
        let b = batches.iter().position(|y| *y == b);
        (b, dtypes.iter().position(|y| *y == d))
    });
    keys.into_iter()
        .map(|(batch, dtype, layout)| {
            let gpu: Vec<&ConvRow> = rows
                .iter()
                .filter(|r| r.device != Device::Cpu)
                .filter(|r| (r.shape.n, r.dtype, r.layout) == (batch, dtype, layout))
                .collect();
            let cpu: Vec<&ConvRow> = rows
                .iter()
                .filter(|r| r.device == Device::Cpu)
                .filter(|r| (r.shape.n, r.layout) == (batch, layout))
                .collect();
            let measured = gpu.iter().filter(|r| r.median_ms().is_some()).count();
            let gpu_ms = weighted(&gpu, ConvRow::median_ms);
            // the CPU set must be the same shapes as the GPU set
            let cpu_ms = (cpu.len() == gpu.len())
                .then(|| weighted(&cpu, ConvRow::median_ms))
                .flatten();
            let pytorch_ms = weighted(&gpu, |r| r.pytorch.as_ref().map(|p| p.median_ms));
            let over = |theirs: Option<f64>| Some(theirs? / gpu_ms.filter(|g| *g > 0.0)?);
            ConvTotal {
                batch,
                dtype,
                layout,
                convolutions: gpu.iter().map(|r| r.count).sum(),
                shapes: gpu.len(),
                shapes_measured: measured,
                gpu_ms,
                cpu_ms,
                speedup_vs_cpu: over(cpu_ms),
                pytorch_ms,
                ratio_vs_pytorch: over(pytorch_ms),
            }
        })
        .collect()
}

/// The GPU row with the lowest ratio to PyTorch, if PyTorch gave any figure.
pub fn slowest(rows: &[ConvRow]) -> Option<SlowestRow> {
    rows.iter()
        .filter(|r| r.status == RowStatus::Ok)
        .filter_map(|r| r.pytorch.as_ref().map(|p| (r, p.ratio)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(r, ratio)| SlowestRow {
            name: r.name.clone(),
            batch: r.shape.n,
            dtype: r.dtype,
            layout: r.layout,
            engine: r.engine.clone(),
            ratio,
        })
}

/// The distinct items in the order they first appear.
fn unique<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// `f16 NCHW 41x, NHWC 52x` for one dtype's totals, from `figure`.
fn per_layout(totals: &[&ConvTotal], figure: impl Fn(&ConvTotal) -> Option<f64>) -> String {
    totals
        .iter()
        .map(|t| match figure(t) {
            Some(x) if x >= 10.0 => format!("{} {x:.0}x", t.layout.label()),
            Some(x) => format!("{} {x:.2}x", t.layout.label()),
            None => format!("{} n/a", t.layout.label()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line per batch of `figure` over the totals, dtype by dtype (None when no total has it).
fn headline(
    report: &ConvReport,
    figure: impl Fn(&ConvTotal) -> Option<f64> + Copy,
) -> Vec<(usize, String)> {
    unique(report.totals.iter().map(|t| t.batch))
        .into_iter()
        .filter_map(|b| {
            let of_batch: Vec<&ConvTotal> = report.totals.iter().filter(|t| t.batch == b).collect();
            if !of_batch.iter().any(|t| figure(t).is_some()) {
                return None;
            }
            let parts: Vec<String> = unique(of_batch.iter().map(|t| t.dtype))
                .into_iter()
                .map(|d| {
                    let of_dtype: Vec<&ConvTotal> =
                        of_batch.iter().copied().filter(|t| t.dtype == d).collect();
                    format!("{d} {}", per_layout(&of_dtype, figure))
                })
                .collect();
            Some((b, parts.join("; ")))
        })
        .collect()
}

/// The notes under the table: the speedup over the CPU on the whole set, how the whole set and
/// the slowest row compare with PyTorch, and how the turns were run.
pub fn notes(report: &ConvReport, with_pytorch: bool) -> Vec<String> {
    let mut notes = Vec::new();
    let convolutions = report.totals.first().map_or(0, |t| t.convolutions);
    for (batch, line) in headline(report, |t| t.speedup_vs_cpu) {
        notes.push(format!(
            "GPU over CPU on all {convolutions} convolutions of a ResNet-50 forward pass at batch \
             {batch} (time-weighted, CPU f32 {}): {line}",
            report.cpu_method
        ));
    }
    let incomplete: Vec<String> = report
        .totals
        .iter()
        .filter(|t| t.shapes_measured < t.shapes)
        .map(|t| {
            format!(
                "{} {} batch {}: {} of {} shapes",
                t.dtype,
                t.layout.label(),
                t.batch,
                t.shapes_measured,
                t.shapes
            )
        })
        .collect();
    if !incomplete.is_empty() {
        notes.push(format!(
            "no whole-network figure where a shape has no verified time: {}",
            incomplete.join("; ")
        ));
    }
    if let Some(p) = &report.planning {
        let s = &p.stats;
        notes.push(format!(
            "planning ({} search): {} engine choices made now ({} candidates timed), {} from the \
             cache, {:.2} s",
            p.search.name(),
            s.measured,
            s.candidates_timed,
            s.cached,
            s.seconds
        ));
        notes.extend(p.cache_note.iter().map(|n| format!("warning: {n}")));
    }
    if !with_pytorch {
        return notes;
    }
    for (batch, line) in headline(report, |t| t.ratio_vs_pytorch) {
        notes.push(format!(
            "gpukit / PyTorch (cudnn.benchmark) on the whole set at batch {batch}, \
             time-weighted: {line}"
        ));
    }
    if let Some(s) = &report.slowest {
        let behind = report.rows.iter().filter(|r| r.behind_pytorch).count();
        let flagged = match behind {
            0 => format!("no row under {PARITY_FLOOR}x"),
            n => format!("{n} row(s) under {PARITY_FLOOR}x, marked BEHIND"),
        };
        notes.push(format!(
            "slowest against PyTorch: {} batch {} {} {} at {:.2}x ({}); {flagged}",
            s.name,
            s.batch,
            s.layout.label(),
            s.dtype,
            s.ratio,
            s.engine.as_deref().unwrap_or("no engine named"),
        ));
    }
    notes.push(format!(
        "turns: gpukit and PyTorch timed each GPU row in {} alternating blocks, gpukit opening \
         half of the rounds and PyTorch the other half; gpukit / PyTorch is the geometric mean \
         of the two halves' median round ratios. Both replay a CUDA graph of the same number \
         of convolutions, so both figures are GPU time (PyTorch's eager calls would add \
         Python's launch cost, which on the smaller convolutions exceeds the convolution). \
         PyTorch picks its algorithm with cudnn.benchmark before capturing; gpukit's engine is \
         the inference engine's choice (cuDNN's legacy algorithms and backend engines, each \
         timed on the same buffers)",
        report.rounds
    ));
    notes
}
