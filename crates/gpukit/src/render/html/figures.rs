//! What each command draws in report.html: only rows that produced a figure (failed and
//! skipped rows stay in the tables).

use super::charts::{Chart, DotPlot, HLine, Legend, LineChart, Series, StackedBars};
use gpukit_bench::bandwidth::BandwidthReport;
use gpukit_bench::conv::ConvReport;
use gpukit_bench::infer::InferReport;
use gpukit_bench::matmul::MatmulReport;
use gpukit_bench::memory::MemoryReport;
use gpukit_bench::report::RowStatus;
use gpukit_bench::workload::train::TrainReport;
use gpukit_tensor::Device;

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
