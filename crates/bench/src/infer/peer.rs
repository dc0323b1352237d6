//! `infer --compare-pytorch`: torchvision's ResNet with the same weights, at the same batch
//! sizes, through scripts/pytorch_reference.py in the same invocation. PyTorch's rows stand
//! beside gpukit's counterparts (eager fp32 beside fp32, channels_last fp16 beside fp16-nhwc,
//! its CUDA graph beside fp16-nhwc-graph, ...), PyTorch-only rows (torch.compile) are listed,
//! and PyTorch's fp32 logits on one shared input batch are checked against gpukit's CPU f32
//! forward pass: same weights, same numbers.

use super::{agreement, Agreement, InferOptions, InferReport, CPU_ROW};
use crate::error::{Error, Result};
use crate::peer::{csv, run_pytorch};
use crate::random::{fresh_seed, uniform_f32};
use crate::report::{PeerFigure, RowStatus};
use gpukit_models::forward::fold;
use gpukit_models::weights::{load_tensor, save_safetensors, save_tensors, seeded_init};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

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
const LOGITS_IMAGES: usize = 8;

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
    pub best_fp16: Vec<BestFp16>,
}

fn counterpart(gpukit: &str) -> Option<&'static str> {
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

/// Puts PyTorch's figure beside each gpukit row that has a counterpart, and finds the best
/// fp16 row of each side per batch size.
pub fn attach(report: &mut InferReport, rows: &[PytorchRow]) -> Vec<BestFp16> {
    let find = |strategy: &str, device: &str, batch: usize| {
        rows.iter().find(|p| {
            p.strategy == strategy && p.batch == batch && p.device == device && p.status == "ok"
        })
    };
    for r in report.rows.iter_mut() {
        let (strategy, device) = if r.device == "cpu" {
            if r.strategy != CPU_ROW {
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
    let mut batches: Vec<usize> = report.rows.iter().map(|r| r.batch).collect();
    batches.dedup();
    let mut best = Vec::new();
    for n in batches {
        let ours = report
            .rows
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
        if let (Some((o, orate)), Some((t, trate))) = (ours, theirs) {
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

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "gpukit-infer-{tag}-{}-{}.safetensors",
        std::process::id(),
        fresh_seed() % 1_000_000
    ))
}

/// Removes the temporary files when dropped (also on an early return).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Runs the comparison; on success returns PyTorch's version for the one-line note and puts
/// the figures into `report`.
pub fn compare(report: &mut InferReport, opts: &InferOptions) -> Result<String> {
    let mut cleanup = Cleanup(Vec::new());
    // the weights gpukit ran: the user's file, or the seeded initialisation written out
    let dict = match &opts.weights {
        Some(p) => gpukit_models::weights::load_safetensors(p, opts.model, None)?,
        None => seeded_init(opts.model, 1000, 0, true),
    };
    let weights_path: PathBuf = match &opts.weights {
        Some(p) => p.clone(),
        None => {
            let p = temp_path("weights");
            cleanup.0.push(p.clone());
            save_safetensors(&dict, &p)?;
            p
        }
    };
    // one input batch for the logits check
    let s = opts.image_size;
    let n = LOGITS_IMAGES;
    let x = uniform_f32(n * 3 * s * s, fresh_seed());
    let input_path = temp_path("input");
    let output_path = temp_path("logits");
    cleanup.0.push(input_path.clone());
    cleanup.0.push(output_path.clone());
    save_tensors(&input_path, &[("input", &[n, 3, s, s], &x)])?;

    let gpu_batches: Vec<usize> = batches_of(report, false);
    let cpu_batches: Vec<usize> = batches_of(report, true);
    // the flags both of the script's runs share; `device` runs `batches`, with the logits
    // files when `io`
    let script_args = |device: &str, batches: &[usize], iterations: usize, io: bool| {
        let mut a: Vec<String> = vec![
            "infer".into(),
            "--model".into(),
            opts.model.name().into(),
            "--weights".into(),
            weights_path.display().to_string(),
            "--batch-sizes".into(),
            csv(batches),
            "--image-size".into(),
            s.to_string(),
            "--iterations".into(),
            iterations.to_string(),
            "--device".into(),
            device.into(),
        ];
        if io {
            a.extend([
                "--input".into(),
                input_path.display().to_string(),
                "--save-output".into(),
                output_path.display().to_string(),
            ]);
        }
        a
    };
    let mut rows = Vec::new();
    let mut head: Option<(String, Option<String>, Option<String>, bool)> = None;
    let mut logits_unavailable = None;
    if !gpu_batches.is_empty() {
        let mut args = script_args("cuda", &gpu_batches, opts.gpu_iterations, true);
        args.push("--benchmark-cudnn".into());
        let run = run_pytorch(&args)?;
        head = Some((
            run.torch_version.clone(),
            run.document["torchvision"].as_str().map(str::to_string),
            run.device_name.clone(),
            run.document["cudnn_benchmark"].as_bool().unwrap_or(false),
        ));
        rows.extend(parse_rows(&run.results, "cuda"));
    }
    if !cpu_batches.is_empty() {
        // without GPU rows, the CPU run computes the logits for the check
        let mut args = script_args("cpu", &cpu_batches, opts.iterations, gpu_batches.is_empty());
        args.extend(["--strategies".into(), "eager_fp32".into()]);
        match run_pytorch(&args) {
            Ok(run) => {
                if head.is_none() {
                    head = Some((
                        run.torch_version.clone(),
                        run.document["torchvision"].as_str().map(str::to_string),
                        run.device_name.clone(),
                        false,
                    ));
                }
                rows.extend(parse_rows(&run.results, "cpu"));
            }
            Err(e) if head.is_none() => return Err(e),
            Err(e) => logits_unavailable = Some(format!("PyTorch's CPU run failed: {e}")),
        }
    }
    let (torch_version, torchvision, device_name, cudnn_benchmark) =
        head.ok_or_else(|| Error::Peer("no rows to compare".into()))?;
    let logits = if gpu_batches.is_empty() && cpu_batches.is_empty() {
        None
    } else if logits_unavailable.is_none() {
        match logits_check(&dict, &x, n, s, &output_path) {
            Ok(a) => Some(a),
            Err(e) => {
                logits_unavailable = Some(e.to_string());
                None
            }
        }
    } else {
        None
    };
    let best_fp16 = attach(report, &rows);
    report.pytorch = Some(PytorchComparison {
        torch_version: torch_version.clone(),
        torchvision,
        device_name,
        cudnn_benchmark,
        rows,
        logits,
        logits_images: n,
        logits_unavailable,
        best_fp16,
    });
    Ok(torch_version)
}

fn batches_of(report: &InferReport, cpu: bool) -> Vec<usize> {
    let mut v: Vec<usize> = report
        .rows
        .iter()
        .filter(|r| (r.device == "cpu") == cpu)
        .map(|r| r.batch)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// PyTorch's fp32 logits against gpukit's CPU forward pass on the same images.
fn logits_check(
    dict: &gpukit_models::weights::StateDict,
    x: &[f32],
    n: usize,
    s: usize,
    output: &Path,
) -> Result<Agreement> {
    let (shape, theirs) = load_tensor(output, "logits")?;
    let folded = fold(dict)?;
    let images = gpukit_tensor::Tensor::from_f32(&[n, 3, s, s], x.to_vec())?;
    let ours = folded.forward_cpu(&images)?.to_vec_f32()?;
    if shape != [n, folded.num_classes] {
        return Err(Error::Peer(format!(
            "PyTorch's logits have shape {shape:?}, expected [{n}, {}]",
            folded.num_classes
        )));
    }
    Ok(agreement(&theirs, &ours, folded.num_classes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_parse_with_missing_figures() {
        let doc = json!([
            {"strategy": "eager_fp32", "batch": 8, "status": "ok", "median_ms": 2.0,
             "p10_ms": 1.9, "p90_ms": 2.2, "images_per_s": 4000.0, "peak_allocated_bytes": 123},
            {"strategy": "compile_fp16", "batch": 8, "status": "skipped", "reason": "no triton",
             "median_ms": null},
            {"batch": 1}
        ]);
        let rows = parse_rows(doc.as_array().unwrap(), "cuda");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].images_per_s, Some(4000.0));
        assert_eq!(rows[0].peak_allocated_bytes, Some(123));
        assert_eq!(rows[1].status, "skipped");
        assert_eq!(rows[1].reason.as_deref(), Some("no triton"));
        assert_eq!(rows[1].median_ms, None);
    }

    #[test]
    fn every_counterpart_is_a_gpukit_strategy_name() {
        for (g, _) in COUNTERPARTS {
            let s = gpukit_models::gpu::Strategy::parse(g).unwrap();
            assert_eq!(s.name(), g);
        }
    }
}
