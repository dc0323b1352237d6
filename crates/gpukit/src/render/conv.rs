//! `gpukit bench conv`: one results table of convolution rates at ResNet-50's shapes.

use super::fmt::{f1, pct, times};
use super::{check_cell, results_table, Columns, Section};

pub fn conv_sections(r: &gpukit_bench::conv::ConvReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["shape", "layout", "device", "dtype"],
            measured: &[
                "median ms",
                "TFLOP/s",
                "% peak",
                "vs CPU",
                "check",
                "algorithm",
            ],
            rate_unit: "TFLOP/s",
            name: &|x: &gpukit_bench::conv::ConvRow| {
                vec![
                    format!(
                        "{} ({})",
                        x.name,
                        gpukit_bench::conv::shape_string(&x.shape)
                    ),
                    format!("{:?}", x.layout).to_uppercase(),
                    x.device.to_string(),
                    x.dtype.to_string(),
                ]
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
                    if x.device == gpukit_tensor::Device::Cpu {
                        "reference".into()
                    } else {
                        check_cell(x.verification.as_ref())
                    },
                    x.algorithm.clone().unwrap_or_default(),
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
        },
    );
    let mut notes = vec![
        "Shapes: NxCxHxW:KxRxS:s<stride>p<pad>. GPU rows are checked against the CPU's f32 output from the same stored inputs; cuDNN's algorithm is chosen by running each candidate (cudnnFind).".to_string(),
        "TFLOP/s counts a direct convolution's 2*N*K*P*Q*C*R*S: WINOGRAD and FFT algorithms do fewer multiplications, so their effective rate can pass the peak.".to_string(),
    ];
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("GPU rows skipped: {why}"));
    }
    vec![Section {
        title: "Convolution (ResNet-50 shapes)".into(),
        header: Some(header),
        rows,
        notes,
    }]
}
