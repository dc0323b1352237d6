//! `gpukit bench matmul`: one results table of matrix-multiply rates, with what the figures mean.

use super::fmt::{f1, pct, times};
use super::power::{any_power, power_cells, power_header, power_note};
use super::{check_cell, results_table, Columns, Section};
use gpukit_bench::ceilings::PeakSource;

pub fn matmul_sections(r: &gpukit_bench::matmul::MatmulReport) -> Vec<Section> {
    let power = any_power(r.rows.iter().map(|x| x.power.as_ref()));
    let power_header = power_header("TFLOP");
    let mut measured = vec![
        "median ms (p10-p90)",
        "TFLOP/s",
        "% peak",
        "% best",
        "vs CPU",
        "check",
        "backend",
    ];
    if power {
        measured.extend(power_header.iter().map(String::as_str));
    }
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["device", "dtype", "size"],
            measured: &measured,
            rate_unit: "TFLOP/s",
            name: &|x: &gpukit_bench::matmul::MatmulRow| {
                vec![
                    x.device.to_string(),
                    x.dtype.to_string(),
                    x.size.to_string(),
                ]
            },
            status: &|x| &x.status,
            values: &|x| {
                let t = x.timing.as_ref().map(|t| &t.summary_ms);
                let mut cells = vec![
                    t.map(|s| format!("{:.3} ({:.3}-{:.3}) n={}", s.median, s.p10, s.p90, s.count))
                        .unwrap_or_default(),
                    f1(x.tflops),
                    pct(x.pct_of_peak),
                    pct(x.pct_of_best),
                    times(x.speedup_vs_cpu),
                    check_cell(x.verification.as_ref()),
                    match &x.computed_as {
                        Some(c) => format!("computed in {c}"),
                        None => x.backend.clone().unwrap_or_default(),
                    },
                ];
                if power {
                    let theirs = x
                        .pytorch_power
                        .as_ref()
                        .zip(x.pytorch.as_ref().map(|p| p.rate));
                    cells.extend(power_cells(x.power.as_ref(), theirs, x.tflops));
                }
                cells
            },
            peer: &|x| x.pytorch.as_ref(),
            behind: None,
        },
    );
    let mut notes = vec![
        "check: sampled entries against a float64 product of the same stored inputs (relative error shown); a row that fails reports no figure.".to_string(),
        "% peak: of the GPU's dense peak for the dtype; % best: of the best rate measured in this run for the same device and dtype; vs CPU: GPU rate over the CPU's for the same dtype and size.".to_string(),
    ];
    if power {
        notes.push(power_note(
            "TFLOP",
            r.rows.iter().any(|x| x.pytorch_power.is_some()),
            "during gpukit's timed blocks (blank: blocks too short to read)",
        ));
    }
    if let Some(g) = &r.gpu {
        notes.push(format!(
            "GPU: {} ({})",
            g.name,
            match &g.peaks.source {
                PeakSource::Datasheet { part } => format!("peaks from the {part} datasheet"),
                PeakSource::Estimate { .. } => "peaks estimated from SMs x clock".into(),
            }
        ));
    }
    if !r.achievable.is_empty() {
        notes.push(format!(
            "achievable ceiling (bench matmul --search on this GPU, driver and cuBLASLt): {}",
            r.achievable
                .iter()
                .map(|b| format!(
                    "{} {} TFLOP/s at {}x{}x{}",
                    b.dtype,
                    f1(Some(b.tflops)),
                    b.m,
                    b.n,
                    b.k
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("GPU rows skipped: {why}"));
    }
    notes.push(format!(
        "CPU: {} with {} threads",
        r.cpu_model, r.cpu_threads
    ));
    vec![Section {
        title: format!(
            "Matrix multiply (C = A x B, square, random {} inputs)",
            r.inputs.describe()
        ),
        header: Some(header),
        rows,
        notes,
    }]
}

/// `gpukit bench matmul --search`: the best shape and rate per dtype with the spread over the
/// grid, then every shape.
pub fn matmul_search_sections(r: &gpukit_bench::matmul::search::SearchReport) -> Vec<Section> {
    let summary_rows = r
        .dtypes
        .iter()
        .map(|d| {
            let best = d.best.as_ref();
            vec![
                d.dtype.to_string(),
                f1(best.map(|b| b.tflops)),
                best.map(|b| format!("{}x{}x{}", b.m, b.n, b.k))
                    .unwrap_or_else(|| "nothing measured".into()),
                pct(best
                    .map(|b| b.tflops)
                    .zip(d.peak_tflops)
                    .map(|(t, p)| 100.0 * t / p)),
                match (d.median_tflops, d.p10_tflops, d.p90_tflops) {
                    (Some(m), Some(lo), Some(hi)) => {
                        format!("{} ({}-{})", f1(Some(m)), f1(Some(lo)), f1(Some(hi)))
                    }
                    _ => String::new(),
                },
                d.shapes_measured.to_string(),
            ]
        })
        .collect();
    let mut notes = Vec::new();
    if let Some(g) = &r.gpu {
        notes.push(format!(
            "GPU: {} ({})",
            g.name,
            match &g.peaks.source {
                PeakSource::Datasheet { part } => format!("% peak of the {part} datasheet"),
                PeakSource::Estimate { .. } => "% peak of a peak estimated from SMs x clock".into(),
            }
        ));
    }
    match (&r.kept_in, &r.not_kept) {
        (Some(p), _) => notes.push(format!(
            "kept as this GPU's achievable ceiling (this driver and cuBLASLt) in {p}"
        )),
        (None, Some(why)) => notes.push(format!("not kept: {why}")),
        (None, None) => {}
    }
    let summary = Section {
        title: "Matrix multiply: the highest rate over the grid of shapes".into(),
        header: Some(
            [
                "dtype",
                "best TFLOP/s",
                "at M x N x K",
                "% peak",
                "TFLOP/s over the grid: median (p10-p90)",
                "shapes",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows: summary_rows,
        notes,
    };
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["dtype", "M x N x K"],
            measured: &["median ms", "TFLOP/s", "check", "backend"],
            rate_unit: "TFLOP/s",
            name: &|x: &gpukit_bench::matmul::search::SearchRow| {
                vec![x.dtype.to_string(), format!("{}x{}x{}", x.m, x.n, x.k)]
            },
            status: &|x| &x.status,
            values: &|x| {
                vec![
                    x.median_ms.map(|m| format!("{m:.3}")).unwrap_or_default(),
                    f1(x.tflops),
                    check_cell(x.verification.as_ref()),
                    x.backend.clone().unwrap_or_default(),
                ]
            },
            peer: &|_| None,
            behind: None,
        },
    );
    let shapes = Section {
        title: "Every shape (random normal inputs, one operand set each)".into(),
        header: Some(header),
        rows,
        notes: vec![
            "each shape: cuBLAS's default and cuBLASLt's heuristic candidates timed in three \
             interleaved rounds, the fastest timed again (median of CUDA-event times), then its \
             result checked against a float64 product on sampled entries; a shape that fails \
             gives no figure."
                .into(),
        ],
    };
    vec![summary, shapes]
}
