//! `--compare-pytorch` for `infer`: PyTorch's model at the same batch sizes, through
//! scripts/pytorch_reference.py in the same invocation. PyTorch's rows stand beside gpukit's
//! counterparts (eager fp32 beside fp32, channels_last fp16 beside fp16-nhwc, its CUDA graph beside
//! fp16-nhwc-graph, ...), PyTorch-only rows (torch.compile) are listed, and PyTorch's fp32 logits
//! on one shared input batch are checked against a reference of gpukit's side.
//!
//! [`compare`] is the built-in ResNet's: torchvision's ResNet with the same weights, its logits
//! against gpukit's CPU f32 forward pass. `infer --onnx --torchvision` (`onnx::peer`) runs
//! the script's rows with [`run_rows`] and sets them beside its own with [`comparison`].
//!
//! The parts: `run` (the script's runs, the files they share, the batch sizes they take) and
//! `resnet` (the built-in ResNet's comparison).

mod resnet;
mod run;
#[cfg(test)]
mod tests;

pub use resnet::compare;
pub(crate) use run::{batches_of, run_rows, temp_path, Cleanup, Head};

use super::{Agreement, InferRow};
use crate::report::{PeerFigure, RowStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// gpukit's strategy and the PyTorch strategy that does the same thing.
pub const COUNTERPARTS: [(&str, &str); 6] = [
    ("fp32", "eager_fp32"),
    ("tf32", "eager_tf32"),
    ("fp16", "eager_fp16"),
    ("fp16-nhwc", "channels_last_fp16"),
    ("bf16-nhwc", "channels_last_bf16"),
    ("fp16-nhwc-graph", "cuda_graph_fp16"),
];

/// Images in the batch whose logits are compared across the two frameworks.
pub(crate) const LOGITS_IMAGES: usize = 8;

/// What the built-in ResNet's logits check compares PyTorch's logits with.
pub const RESNET_LOGITS_REFERENCE: &str = "gpukit's CPU f32 forward pass with the same weights";

fn resnet_logits_reference() -> String {
    RESNET_LOGITS_REFERENCE.into()
}

/// One row PyTorch reported.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PytorchRow {
    pub strategy: String,
    pub device: String,
    pub batch: usize,
    /// "ok", "skipped" or "failed".
    pub status: String,
    pub reason: Option<String>,
    pub median_ms: Option<f64>,
    pub p10_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub images_per_s: Option<f64>,
    /// torch.cuda.max_memory_allocated over the row (weights included).
    pub peak_allocated_bytes: Option<u64>,
    /// torch.compile's first call, seconds.
    pub compile_s: Option<f64>,
}

/// The fastest fp16 row of each side at one batch size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BestFp16 {
    pub batch: usize,
    pub gpukit_strategy: String,
    pub gpukit_images_per_s: f64,
    pub pytorch_strategy: String,
    pub pytorch_images_per_s: f64,
    /// gpukit over PyTorch.
    pub ratio: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PytorchComparison {
    pub torch_version: String,
    pub torchvision: Option<String>,
    pub device_name: Option<String>,
    pub cudnn_benchmark: bool,
    pub rows: Vec<PytorchRow>,
    /// PyTorch's eager fp32 logits (TF32 off) against gpukit's CPU f32 forward pass on the
    /// same `logits_images` images.
    pub logits: Option<Agreement>,
    pub logits_images: usize,
    /// Why the logits were not compared, when they were not.
    pub logits_unavailable: Option<String>,
    /// What `logits` compares PyTorch's with.
    #[serde(default = "resnet_logits_reference")]
    pub logits_reference: String,
    /// `infer --onnx --torchvision`: how PyTorch's model was checked to be the file's.
    #[serde(default)]
    pub same_model: Option<SameModel>,
    /// Why PyTorch's CPU rows are missing, when its GPU rows are there.
    #[serde(default)]
    pub cpu_rows_failed: Option<String>,
    pub best_fp16: Vec<BestFp16>,
}

/// Layers a model computes with, counted alike in an ONNX graph and in PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layers {
    /// ONNX: Conv nodes; PyTorch: calls of F.conv1d/2d/3d in one forward pass.
    pub conv: usize,
    /// ONNX: Gemm and MatMul nodes with a constant operand (weights); PyTorch: calls of
    /// F.linear in one forward pass (nn.Linear's, and those on a module's weights).
    pub linear: usize,
}

/// What says PyTorch's model is the ONNX file's (`infer --onnx --torchvision`): the layers
/// and the output's shape, which must be equal (else the comparison is refused), and the logits
/// on one shared batch, which tell whether the weights are the same too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SameModel {
    /// torchvision's name of the model PyTorch ran (`mobilenet_v3_large`).
    pub torchvision: String,
    /// PyTorch's weights: `seeded` (torchvision's initialisation under seed 0, batch-norm
    /// statistics measured on random images, as scripts/export_torchvision.py makes them) or
    /// the state dict file.
    pub weights: String,
    /// Counted in the ONNX graph as imported, before gpukit's passes.
    pub onnx: Layers,
    /// Counted by PyTorch in one forward pass of one image.
    pub pytorch: Layers,
    /// One image's output shape, the same on both sides (`[1000]`).
    pub output_shape: Vec<usize>,
    /// PyTorch's parameter count.
    pub pytorch_parameters: u64,
    /// Largest max rel. diff of the logits for the weights to count as the same.
    pub logits_tolerance: f64,
    /// Whether the logits agreed within `logits_tolerance`; None where they were not compared.
    pub same_weights: Option<bool>,
}

pub(crate) fn counterpart(gpukit: &str) -> Option<&'static str> {
    COUNTERPARTS
        .iter()
        .find(|(g, _)| *g == gpukit)
        .map(|(_, p)| *p)
}

/// Reads the script's rows (missing numbers stay None).
pub fn parse_rows(results: &[Value], device: &str) -> Vec<PytorchRow> {
    results
        .iter()
        .filter_map(|r| {
            Some(PytorchRow {
                strategy: r["strategy"].as_str()?.to_string(),
                device: device.to_string(),
                batch: r["batch"].as_u64()? as usize,
                status: r["status"].as_str().unwrap_or("failed").to_string(),
                reason: r["reason"].as_str().map(str::to_string),
                median_ms: r["median_ms"].as_f64(),
                p10_ms: r["p10_ms"].as_f64(),
                p90_ms: r["p90_ms"].as_f64(),
                images_per_s: r["images_per_s"].as_f64(),
                peak_allocated_bytes: r["peak_allocated_bytes"].as_u64(),
                compile_s: r["compile_s"].as_f64(),
            })
        })
        .collect()
}

/// Puts PyTorch's figure beside each of gpukit's `ours` that has a counterpart (`cpu_row`, the
/// CPU row that PyTorch's eager fp32 CPU row stands beside), and finds the best fp16 row of each
/// side per batch size.
pub fn attach(ours: &mut [InferRow], cpu_row: &str, rows: &[PytorchRow]) -> Vec<BestFp16> {
    let find = |strategy: &str, device: &str, batch: usize| {
        rows.iter().find(|p| {
            p.strategy == strategy && p.batch == batch && p.device == device && p.status == "ok"
        })
    };
    for r in ours.iter_mut() {
        let (strategy, device) = if r.device == "cpu" {
            if r.strategy != cpu_row {
                continue;
            }
            ("eager_fp32", "cpu")
        } else {
            match counterpart(&r.strategy) {
                Some(p) => (p, "cuda"),
                None => continue,
            }
        };
        if let (Some(p), Some(ours)) = (find(strategy, device, r.batch), r.images_per_s) {
            if let (Some(ms), Some(rate)) = (p.median_ms, p.images_per_s) {
                r.pytorch = Some(PeerFigure::single(ms, rate, ours));
            }
        }
    }
    let mut batches: Vec<usize> = ours.iter().map(|r| r.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let mut best = Vec::new();
    for n in batches {
        let mine = ours
            .iter()
            .filter(|r| r.batch == n && r.device != "cpu" && r.strategy.starts_with("fp16"))
            .filter(|r| !crate::infer::is_one_at_a_time(r))
            .filter(|r| r.status == RowStatus::Ok)
            .filter_map(|r| Some((r, r.images_per_s?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let theirs = rows
            .iter()
            .filter(|p| p.batch == n && p.device == "cuda" && p.strategy.contains("fp16"))
            .filter(|p| p.status == "ok")
            .filter_map(|p| Some((p, p.images_per_s?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let (Some((o, orate)), Some((t, trate))) = (mine, theirs) {
            best.push(BestFp16 {
                batch: n,
                gpukit_strategy: o.strategy.clone(),
                gpukit_images_per_s: orate,
                pytorch_strategy: t.strategy.clone(),
                pytorch_images_per_s: trate,
                ratio: orate / trate,
            });
        }
    }
    best
}

/// PyTorch's logits on the shared batch against a reference of gpukit's side.
#[derive(Debug, Clone)]
pub(crate) struct LogitsCheck {
    pub agreement: Option<Agreement>,
    pub images: usize,
    pub unavailable: Option<String>,
    /// What the logits were compared with.
    pub reference: String,
}

/// The comparison: PyTorch's `rows` set beside `ours` (see [`attach`]), the best fp16 of each
/// side, the logits check and, for `infer --onnx`, what says the two models are the same.
pub(crate) fn comparison(
    head: Head,
    rows: Vec<PytorchRow>,
    ours: &mut [InferRow],
    cpu_row: &str,
    logits: LogitsCheck,
    same_model: Option<SameModel>,
    cpu_rows_failed: Option<String>,
) -> PytorchComparison {
    let best_fp16 = attach(ours, cpu_row, &rows);
    PytorchComparison {
        torch_version: head.torch_version,
        torchvision: head.torchvision,
        device_name: head.device_name,
        cudnn_benchmark: head.cudnn_benchmark,
        rows,
        logits: logits.agreement,
        logits_images: logits.images,
        logits_unavailable: logits.unavailable,
        logits_reference: logits.reference,
        same_model,
        cpu_rows_failed,
        best_fp16,
    }
}
