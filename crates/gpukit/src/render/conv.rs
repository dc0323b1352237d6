//! `gpukit bench conv`: one results table of convolution rates at every distinct convolution of
//! ResNet-50, each GPU row with the engine that won.

use super::fmt::{f1, pct, times};
use super::{check_cell, results_table, Columns, Section};
use gpukit_bench::conv::{ConvReport, ConvRow, PARITY_FLOOR};
use gpukit_tensor::Device;

/// The engine cell: what ran, and whether on tensor cores.
fn engine_cell(x: &ConvRow) -> String {
    let engine = x.engine.clone().unwrap_or_default();
    match x.tensor_cores {
        Some(true) => format!("{engine}, tensor cores"),
        _ => engine,
    }
}

pub fn conv_sections(r: &ConvReport) -> Vec<Section> {
    let mut batches: Vec<usize> = r.rows.iter().map(|x| x.shape.n).collect();
    batches.dedup();
    let several_batches = batches.len() > 1;
    let naming: &[&str] = if several_batches {
        &["convolution", "runs", "batch", "layout", "device", "dtype"]
    } else {
        &["convolution", "runs", "layout", "device", "dtype"]
    };
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming,
            measured: &[
                "median ms",
                "TFLOP/s",
                "% peak",
                "vs CPU",
                "check",
                "engine",
            ],
            rate_unit: "TFLOP/s",
            name: &|x: &ConvRow| {
                let mut cells = vec![x.name.clone(), format!("x{}", x.count)];
                if several_batches {
                    cells.push(x.shape.n.to_string());
                }
                cells.extend([
                    x.layout.label().to_string(),
                    x.device.to_string(),
                    x.dtype.to_string(),
                ]);
                cells
            },
            status: &|x| &x.status,
            values: &|x| {
                vec![
                    x.timing
                        .as_ref()
                        .map(|t| format!("{:.3} n={}", t.summary_ms.median, t.summary_ms.count))
                        .unwrap_or_default(),
                    f1(x.tflops),
                    pct(x.pct_of_peak),
                    times(x.speedup_vs_cpu),
                    if x.device == Device::Cpu {
                        "reference".into()
                    } else {
                        check_cell(x.verification.as_ref())
                    },
                    engine_cell(x),
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
            behind: Some(&|x| x.behind_pytorch),
        },
    );
    let batch_words = if several_batches {
        String::new()
    } else {
        format!(" at batch {}", batches.first().copied().unwrap_or(0))
    };
    let mut notes = vec![
        format!(
            "Every distinct convolution of a ResNet-50 forward pass{batch_words} (224 x 224 images), \
             named stage, filter/stride, channels in->out, @ input height; runs: how often one \
             pass runs it. GPU rows are checked against the CPU's f32 output from the same \
             stored inputs."
        ),
        "Each GPU row's engine is chosen as gpukit's inference engine chooses: cuDNN's legacy \
         algorithms and its backend engines, each timed on the same buffers, the fastest kept."
            .to_string(),
        "GPU rows are timed as replays of a CUDA graph of several convolutions (the figures \
         are per convolution): the GPU's time, not the host's launch rate."
            .to_string(),
        "TFLOP/s counts a direct convolution's 2*N*K*P*Q*C*R*S: WINOGRAD and FFT algorithms do \
         fewer multiplications, so their effective rate can pass the peak."
            .to_string(),
    ];
    if r.rows.iter().any(|x| x.pytorch.is_some()) {
        notes.push(format!(
            "BEHIND: gpukit under {PARITY_FLOOR}x PyTorch's rate on the same convolution."
        ));
    }
    let launched = r
        .rows
        .iter()
        .filter(|x| x.device != Device::Cpu && x.timing.is_some() && x.per_replay.is_none())
        .count();
    if launched > 0 {
        notes.push(format!(
            "{launched} GPU row(s) could not be captured in a graph and were timed as direct \
             launches."
        ));
    }
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("GPU rows skipped: {why}"));
    }
    vec![Section {
        title: "Convolution (ResNet-50, forward)".into(),
        header: Some(header),
        rows,
        notes,
    }]
}
