//! `infer --compare-pytorch` on the built-in ResNet: torchvision's ResNet with gpukit's
//! weights (the user's file, or the seeded initialisation written out), its logits on one shared
//! batch against gpukit's CPU f32 forward pass.

use super::{
    batches_of, comparison, run_rows, temp_path, Cleanup, LogitsCheck, LOGITS_IMAGES,
    RESNET_LOGITS_REFERENCE,
};
use crate::error::{Error, Result};
use crate::infer::{agreement, Agreement, InferOptions, InferReport, CPU_ROW};
use crate::random::{fresh_seed, uniform_f32};
use gpukit_models::forward::fold;
use gpukit_models::weights::{load_tensor, save_safetensors, save_tensors, seeded_init};
use std::path::{Path, PathBuf};

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

    let model = [
        "--model".to_string(),
        opts.model.name().to_string(),
        "--weights".into(),
        weights_path.display().to_string(),
    ];
    let ran = run_rows(
        &model,
        s,
        None,
        (
            &batches_of(&report.rows, CPU_ROW, false),
            opts.gpu_iterations,
        ),
        (&batches_of(&report.rows, CPU_ROW, true), opts.iterations),
        Some((&input_path, &output_path)),
    )?;
    let head = ran
        .head
        .ok_or_else(|| Error::Peer("no rows to compare".into()))?;
    let (agreement, unavailable) = match logits_check(&dict, &x, n, s, &output_path) {
        Ok(a) => (Some(a), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let logits = LogitsCheck {
        agreement,
        images: n,
        unavailable,
        reference: RESNET_LOGITS_REFERENCE.into(),
    };
    let version = head.torch_version.clone();
    report.pytorch = Some(comparison(
        head,
        ran.rows,
        &mut report.rows,
        CPU_ROW,
        logits,
        None,
        ran.cpu_failed,
    ));
    Ok(version)
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
