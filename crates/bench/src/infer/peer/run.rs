//! The script's runs for a comparison: the temporary files they share, the batch sizes of
//! gpukit's rows they run at, and what the script says of itself.

use super::{parse_rows, PytorchRow};
use crate::error::Result;
use crate::infer::InferRow;
use crate::peer::{csv, run_pytorch, PeerRun};
use crate::random::fresh_seed;
use crate::report::RowStatus;
use std::path::{Path, PathBuf};

/// A fresh path in the temporary directory for one of the files the script reads or writes.
pub(crate) fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "gpukit-infer-{tag}-{}-{}.safetensors",
        std::process::id(),
        fresh_seed() % 1_000_000
    ))
}

/// Removes the temporary files when dropped (also on an early return).
pub(crate) struct Cleanup(pub Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What the script says of itself and where it ran.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub torch_version: String,
    pub torchvision: Option<String>,
    pub device_name: Option<String>,
    pub cudnn_benchmark: bool,
}

impl Head {
    pub fn of(run: &PeerRun) -> Head {
        Head {
            torch_version: run.torch_version.clone(),
            torchvision: run.document["torchvision"].as_str().map(str::to_string),
            device_name: run.device_name.clone(),
            cudnn_benchmark: run.document["cudnn_benchmark"].as_bool().unwrap_or(false),
        }
    }
}

/// PyTorch's rows of one comparison.
pub(crate) struct PeerRows {
    pub rows: Vec<PytorchRow>,
    /// The first run's (None when no batch size was run).
    pub head: Option<Head>,
    /// Why the CPU run gave no rows, when the GPU run did.
    pub cpu_failed: Option<String>,
}

/// The batch sizes of gpukit's rows PyTorch runs beside: the GPU rows' (`cpu` false) or those
/// of `cpu_row` (`cpu` true); skipped rows have nothing to stand beside.
pub(crate) fn batches_of(ours: &[InferRow], cpu_row: &str, cpu: bool) -> Vec<usize> {
    let mut v: Vec<usize> = ours
        .iter()
        .filter(|r| !matches!(r.status, RowStatus::Skipped(_)))
        .filter(|r| {
            if cpu {
                r.device == "cpu" && r.strategy == cpu_row
            } else {
                r.device != "cpu"
            }
        })
        .map(|r| r.batch)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Runs the script's `infer` for the model `model` names (`--model NAME`, `--weights FILE`):
/// every strategy on cuda at `gpu.0` batch sizes (`gpu.1` timed repetitions, cudnn.benchmark
/// on), eager fp32 on cpu at `cpu.0`; `logits` (input file, output file) go to the first run.
/// The GPU run's failure is the comparison's; the CPU run's is noted when the GPU run gave rows.
/// `only`: the GPU strategies to run, where not every one is wanted.
pub(crate) fn run_rows(
    model: &[String],
    image_size: usize,
    only: Option<&[&str]>,
    gpu: (&[usize], usize),
    cpu: (&[usize], usize),
    logits: Option<(&Path, &Path)>,
) -> Result<PeerRows> {
    let args = |device: &str, batches: &[usize], iterations: usize, io: bool| {
        let mut a: Vec<String> = vec!["infer".into()];
        a.extend(model.iter().cloned());
        a.extend([
            "--batch-sizes".into(),
            csv(batches),
            "--image-size".into(),
            image_size.to_string(),
            "--iterations".into(),
            iterations.to_string(),
            "--device".into(),
            device.into(),
        ]);
        if let (true, Some((input, output))) = (io, logits) {
            a.extend([
                "--input".into(),
                input.display().to_string(),
                "--save-output".into(),
                output.display().to_string(),
            ]);
        }
        a
    };
    let mut out = PeerRows {
        rows: Vec::new(),
        head: None,
        cpu_failed: None,
    };
    if !gpu.0.is_empty() {
        let mut a = args("cuda", gpu.0, gpu.1, true);
        a.push("--benchmark-cudnn".into());
        if let Some(only) = only {
            a.extend(["--strategies".into(), only.join(",")]);
        }
        let run = run_pytorch(&a)?;
        out.head = Some(Head::of(&run));
        out.rows.extend(parse_rows(&run.results, "cuda"));
    }
    if !cpu.0.is_empty() {
        // without GPU rows, the CPU run computes the logits
        let mut a = args("cpu", cpu.0, cpu.1, out.head.is_none());
        a.extend(["--strategies".into(), "eager_fp32".into()]);
        match run_pytorch(&a) {
            Ok(run) => {
                if out.head.is_none() {
                    out.head = Some(Head::of(&run));
                }
                out.rows.extend(parse_rows(&run.results, "cpu"));
            }
            Err(e) if out.head.is_none() => return Err(e),
            Err(e) => out.cpu_failed = Some(format!("PyTorch's CPU run failed: {e}")),
        }
    }
    Ok(out)
}
