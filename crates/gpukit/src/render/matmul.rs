//! `gpukit bench matmul`: one results table of matrix-multiply rates, with what the figures mean.

use super::fmt::{f1, pct, times};
use super::{check_cell, results_table, Columns, Section};
use gpukit_bench::ceilings::PeakSource;

pub fn matmul_sections(r: &gpukit_bench::matmul::MatmulReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["device", "dtype", "size"],
            measured: &[
                "median ms (p10-p90)",
                "TFLOP/s",
                "% peak",
                "% best",
                "vs CPU",
                "check",
                "backend",
            ],
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
                vec![
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
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
            behind: None,
        },
    );
    let mut notes = vec![
        "check: sampled entries against a float64 product of the same stored inputs (relative error shown); a row that fails reports no figure.".to_string(),
        "% peak: of the GPU's dense peak for the dtype; % best: of the best rate measured in this run for the same device and dtype; vs CPU: GPU rate over the CPU's for the same dtype and size.".to_string(),
    ];
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
