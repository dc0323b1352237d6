//! What `gpukit infer` reports: one row per strategy and batch size, and the questions asked of
//! the rows (which GPU row was fastest, whether any GPU row gave a figure).

use crate::accuracy::Agreement;
use crate::measure::Measurement;
use crate::report::{PeerFigure, RowStatus};
use crate::workload::strategy::{ONE_AT_A_TIME, ONE_AT_A_TIME_MAX_PASSES, ONE_AT_A_TIME_MIN_REPS};
use gpukit_models::gpu::SessionMemory;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[cfg(doc)]
use crate::workload::strategy::{CPU_ROW, ORT_ROW};
#[cfg(doc)]
use gpukit_models::gpu::Strategy;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferRow {
    /// CPU rows: [`CPU_ROW`] or [`ORT_ROW`]; GPU rows: [`Strategy::name`] (`fp16-nhwc-graph`).
    pub strategy: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub batch: usize,
    pub status: RowStatus,
    pub timing: Option<Measurement>,
    pub images_per_s: Option<f64>,
    /// Over gpukit's f32 CPU path at the same batch size (None where that row did not run).
    pub speedup_vs_reference: Option<f64>,
    /// GPU rows: over gpukit's fp32 eager GPU row at the same batch size (None where that row
    /// was not timed: not requested, or it failed).
    #[serde(default)]
    pub speedup_vs_fp32_eager: Option<f64>,
    /// GPU rows: device memory the engine itself accounts for at this batch size: weights +
    /// activation arena (input and logits included) + the largest convolution workspace (the
    /// general engine's: also its branches' workspace, its own kernels' filters and scratch).
    /// The engine's own accounting ([`SessionMemory`]), not the driver's: the CUDA context,
    /// library handles and a captured graph's memory are not included.
    #[serde(default)]
    pub gpu_memory_bytes: Option<u64>,
    /// GPU rows: the parts of `gpu_memory_bytes`, and the arena's size without the memory plan.
    #[serde(default)]
    pub gpu_memory: Option<SessionMemory>,
    /// Against `compared_with`, on the logits of the last timed pass.
    pub agreement: Option<Agreement>,
    /// What `agreement` compares with: "gpukit's f32 CPU forward", "gpukit's GPU fp32 eager
    /// logits (whole batch)", ... None for the CPU reference row itself.
    #[serde(default)]
    pub compared_with: Option<String>,
    /// Largest `agreement.max_rel` the row may show and pass (None where the row is judged by
    /// `float64` instead, or not at all).
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// fp32 rows of `infer --onnx`: how far the row is from float64 outputs on the same input,
    /// what it was judged by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float64: Option<Float64Check>,
    /// PyTorch's figure for the same strategy (`--compare-pytorch`).
    #[serde(default)]
    pub pytorch: Option<PeerFigure>,
    /// One-at-a-time rows: the batched row's images/s (the same strategy, one pass over the
    /// batch) over this row's: what batching gains. None where either row did not pass.
    #[serde(default)]
    pub batching_gain: Option<f64>,
    /// GPU rows: what the chip drew during the timed passes (power, clock, throttling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<crate::power::RowPower>,
}

/// An fp32 row against float64 outputs (the graph run in f64 on the same input): it passes
/// within [`Float64Check::tolerance`], the larger of 1e-5 and ONNX Runtime f32's own distance
/// from the same float64 outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Float64Check {
    /// The row's max |diff| / max |float64| (its worst output's).
    pub max_rel: f64,
    /// ONNX Runtime's f32 outputs' on the same input, the same way; None where it gave none.
    pub onnxruntime_max_rel: Option<f64>,
    /// Largest `max_rel` the row may show and pass.
    pub tolerance: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferReport {
    pub model: String,
    pub parameters: usize,
    pub weights: String,
    pub image_size: usize,
    pub cpu_threads: usize,
    /// How the CPU rows' convolutions are computed (`packed AVX-512 kernel`, `im2col + gemm`).
    #[serde(default)]
    pub cpu_kernel: String,
    /// By batch size, then the CPU rows, then the GPU rows in the order strategies were asked.
    pub rows: Vec<InferRow>,
    /// Why ONNX Runtime's rows are absent, when they are.
    pub onnxruntime_unavailable: Option<String>,
    /// The GPU the GPU rows ran on: `cuda:0 NVIDIA H100 80GB HBM3`.
    #[serde(default)]
    pub gpu_device: Option<String>,
    /// Why the GPU rows are absent, when the selection included a GPU and none could be used.
    #[serde(default)]
    pub gpu_unavailable: Option<String>,
    /// `--compare-pytorch`: PyTorch's rows, the logits check and the best fp16 of each side.
    #[serde(default)]
    pub pytorch: Option<super::peer::PytorchComparison>,
    /// Whether TensorRT's libnvinfer is on this machine ([`tensorrt_status`]); gpukit runs no
    /// TensorRT strategy. None where no GPU strategy was asked for.
    #[serde(default)]
    pub tensorrt: Option<String>,
    /// How each GPU session's convolutions were planned, and how long it took.
    #[serde(default)]
    pub planning: Vec<Planning>,
    /// Why the cuDNN choice cache on disk was not used, when it could not be read.
    #[serde(default)]
    pub cache_note: Option<String>,
}

/// The planning of one GPU session (a precision and layout at one batch size): how many
/// distinct convolutions it had, how many were measured now and how many came from the choice
/// cache, the candidates timed and the wall time of the whole preparation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Planning {
    /// `fp16 NHWC batch 32`.
    pub what: String,
    pub search: gpukit_cuda::dnn::Search,
    pub measured: usize,
    pub cached: usize,
    pub candidates_timed: usize,
    /// Wall seconds from asking for the session to having it (lowering, memory, planning).
    pub seconds: f64,
}

/// The report's TensorRT line, from where libnvinfer was found
/// ([`gpukit_cuda::loader::find_extra_library`]), if anywhere.
pub fn tensorrt_status(libnvinfer: Option<&Path>) -> String {
    match libnvinfer {
        Some(p) => format!(
            "libnvinfer found at {}; gpukit has no TensorRT strategy yet",
            p.display()
        ),
        None => "unavailable: libnvinfer not found (install TensorRT, e.g. pip install tensorrt, \
                 to compare)"
            .into(),
    }
}

pub fn is_gpu_row(r: &InferRow) -> bool {
    r.device != "cpu"
}

/// Whether the row is a strategy run one image at a time ([`InferStrategy::OneAtATime`]).
pub fn is_one_at_a_time(r: &InferRow) -> bool {
    is_gpu_row(r) && r.strategy.ends_with(ONE_AT_A_TIME)
}

/// Timed repetitions of a one-at-a-time row at batch `n`: `reps`, fewer where they would pass
/// [`ONE_AT_A_TIME_MAX_PASSES`] batch-1 passes, but at least [`ONE_AT_A_TIME_MIN_REPS`].
pub fn one_at_a_time_reps(reps: usize, n: usize) -> usize {
    reps.min((ONE_AT_A_TIME_MAX_PASSES / n.max(1)).max(ONE_AT_A_TIME_MIN_REPS))
        .max(1)
}

/// [`sort_rows`] with the GPU rows in the order `wanted` names their strategies.
pub(crate) fn sort_rows_as_asked(rows: &mut [InferRow], wanted: &[super::InferStrategy]) {
    let order: Vec<String> = wanted
        .iter()
        .filter(|s| !s.on_cpu())
        .map(super::InferStrategy::name)
        .collect();
    sort_rows(rows, &order);
}

/// Orders rows by batch size, then the CPU rows (in the order they came), then the GPU rows in
/// the order of `gpu_order` (strategy names).
pub fn sort_rows(rows: &mut [InferRow], gpu_order: &[String]) {
    rows.sort_by_key(|r| {
        (
            r.batch,
            is_gpu_row(r),
            gpu_order
                .iter()
                .position(|s| *s == r.strategy)
                .unwrap_or(usize::MAX),
        )
    });
}

/// Per batch size (ascending): the GPU row that passed with the most images/s. One-at-a-time
/// rows are not candidates: they show what the batch would cost without batching.
pub fn best_gpu_rows(rows: &[InferRow]) -> Vec<&InferRow> {
    let mut best: BTreeMap<usize, &InferRow> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| is_gpu_row(r) && !is_one_at_a_time(r) && r.status == RowStatus::Ok)
    {
        let Some(rate) = r.images_per_s else { continue };
        let better = best
            .get(&r.batch)
            .is_none_or(|b| b.images_per_s.is_none_or(|x| rate > x));
        if better {
            best.insert(r.batch, r);
        }
    }
    best.into_values().collect()
}

/// Why the command must fail though no row failed: GPU rows were asked for and ran into limits
/// (out of memory at every batch size, say), so none produced a figure.
pub fn gpu_rows_without_figure(report: &InferReport) -> Option<String> {
    let gpu: Vec<&InferRow> = report.rows.iter().filter(|r| is_gpu_row(r)).collect();
    if gpu.is_empty() || gpu.iter().any(|r| r.status == RowStatus::Ok) {
        return None;
    }
    let first = gpu.iter().find_map(|r| match &r.status {
        RowStatus::Skipped(w) | RowStatus::Failed(w) => {
            Some(format!("{} at batch {}: {w}", r.strategy, r.batch))
        }
        RowStatus::Ok => None,
    });
    Some(format!(
        "none of the {} GPU row(s) produced a figure; the first: {}",
        gpu.len(),
        first.unwrap_or_default()
    ))
}

pub fn row(strategy: &str, device: &str, batch: usize) -> InferRow {
    InferRow {
        strategy: strategy.to_string(),
        device: device.to_string(),
        batch,
        status: RowStatus::Ok,
        timing: None,
        images_per_s: None,
        speedup_vs_reference: None,
        speedup_vs_fp32_eager: None,
        gpu_memory_bytes: None,
        gpu_memory: None,
        agreement: None,
        compared_with: None,
        tolerance: None,
        float64: None,
        pytorch: None,
        batching_gain: None,
        power: None,
    }
}

pub(super) fn rate(n: usize, t: &Measurement) -> f64 {
    n as f64 / (t.summary_ms.median / 1e3)
}
