//! report.html's headline cards: each command's best figure, written by the same function as
//! the table it comes from (a card that rounds otherwise reads as a different figure). A card
//! is `(what, figure, detail)`.

use super::super::fmt::{f1, grouped, human_bytes};
use gpukit_bench::bandwidth::{BandwidthReport, CopyKind};
use gpukit_bench::infer::InferReport;
use gpukit_bench::matmul::MatmulReport;
use gpukit_bench::memory::MemoryReport;
use gpukit_bench::report::RowStatus;
use gpukit_tensor::Device;

type Card = (String, String, String);

/// The best rate per dtype on the GPU (the CPU's when no GPU row measured), against the peak.
pub fn matmul_cards(r: &MatmulReport) -> Vec<Card> {
    let gpu_rows = r
        .rows
        .iter()
        .any(|x| x.device != Device::Cpu && x.status == RowStatus::Ok && x.tflops.is_some());
    let mut dtypes: Vec<String> = Vec::new();
    for x in &r.rows {
        let d = x.dtype.to_string();
        if !dtypes.contains(&d) {
            dtypes.push(d);
        }
    }
    let mut cards = Vec::new();
    for d in &dtypes {
        let best = r
            .rows
            .iter()
            .filter(|x| (x.device != Device::Cpu) == gpu_rows && x.dtype.to_string() == *d)
            .filter(|x| x.status == RowStatus::Ok)
            .filter_map(|x| x.tflops.map(|t| (t, x)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let Some((t, x)) = best else { continue };
        let peak = r.gpu.as_ref().and_then(|g| g.peaks.for_dtype(d));
        let sub = match (gpu_rows, peak) {
            (true, Some(p)) => format!("{:.0}% of the {p:.1} peak, at {}", 100.0 * t / p, x.size),
            _ => format!("on {} at {}", x.device, x.size),
        };
        cards.push((
            format!("matmul {d}"),
            format!("{} TFLOP/s", f1(Some(t))),
            sub,
        ));
    }
    cards
}

/// The best host-device and device-device copies, against the link and the memory's peak.
pub fn bandwidth_cards(b: &BandwidthReport) -> Vec<Card> {
    let best = |d2d: bool| {
        b.rows
            .iter()
            .filter(|x| x.status == RowStatus::Ok && (x.kind == CopyKind::D2d) == d2d)
            .filter(|x| x.kind != CopyKind::Bidirectional)
            .filter_map(|x| x.gbs.map(|g| (g, x)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let mut cards = Vec::new();
    if let Some((g, x)) = best(false) {
        let sub = match b.pcie_link_gbs {
            Some(l) => format!(
                "{}, {}; link {l:.1} GB/s",
                x.kind.label(),
                human_bytes(x.bytes)
            ),
            None => format!("{}, {}", x.kind.label(), human_bytes(x.bytes)),
        };
        cards.push((
            "best host-device copy".into(),
            format!("{} GB/s", f1(Some(g))),
            sub,
        ));
    }
    if let Some((g, x)) = best(true) {
        let sub = match b.memory_peak_gbs {
            Some(m) => format!("{}; memory peak {m:.0} GB/s", human_bytes(x.bytes)),
            None => human_bytes(x.bytes),
        };
        cards.push((
            "best device-device copy".into(),
            format!("{} GB/s", f1(Some(g))),
            sub,
        ));
    }
    cards
}

/// The most images a second any row delivered.
pub fn infer_cards(i: &InferReport) -> Vec<Card> {
    i.rows
        .iter()
        .filter(|x| x.status == RowStatus::Ok)
        .filter_map(|x| x.images_per_s.map(|v| (v, x)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(v, x)| {
            (
                format!("best inference ({})", i.model),
                format!("{} images/s", grouped(v)),
                format!("{} on {}, batch {}", x.strategy, x.device, x.batch),
            )
        })
        .into_iter()
        .collect()
}

/// The largest batch that fits, where it was searched for.
pub fn memory_cards(m: &MemoryReport) -> Vec<Card> {
    m.max_batch
        .as_ref()
        .map(|mb| {
            (
                "largest batch that fits".to_string(),
                mb.batch.to_string(),
                format!("{} {} {}", m.model, m.precision, m.layout),
            )
        })
        .into_iter()
        .collect()
}
