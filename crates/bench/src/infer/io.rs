//! `infer --input X.safetensors --save-output Y.safetensors`: one given batch through every
//! requested strategy, the logits saved for checking numerics across frameworks. "logits" is
//! gpukit's CPU f32 forward pass; "logits_<strategy>" each other strategy's, compared with it.

use super::{agreement, Agreement, InferOptions, InferStrategy};
use crate::error::{Error, Result};
use gpukit_cuda::loader::Discovery;
use gpukit_models::forward::fold;
use gpukit_models::gpu::{GpuContext, GpuWeights, Session};
use gpukit_models::weights::{load_safetensors, load_tensor, save_tensors, seeded_init};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedLogits {
    /// The tensor name in the output file.
    pub tensor: String,
    pub strategy: String,
    /// Against gpukit's CPU f32 logits (None for those themselves).
    pub agreement: Option<Agreement>,
    /// Why this strategy has no logits, when it has none.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InputRun {
    pub input: String,
    pub shape: Vec<usize>,
    pub output: Option<String>,
    pub logits: Vec<SavedLogits>,
}

/// The JSON document of `infer --input`.
pub fn document(run: InputRun) -> crate::report::Document<InputRun> {
    crate::report::Document::new("infer --input", run, None)
}

/// Runs the batch in `input` (tensor "input", f32 [n, 3, h, w]) through `opts.strategies`
/// (ONNX Runtime excepted) and writes every strategy's logits to `output`.
pub fn run_on_input(
    discovery: &Discovery,
    opts: &InferOptions,
    input: &Path,
    output: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<InputRun> {
    let (shape, x) = load_tensor(input, "input")?;
    let [n, c, h, w] = shape[..] else {
        return Err(Error::BadInput(format!(
            "{}: tensor input has shape {shape:?}; [batch, 3, height, width] expected",
            input.display()
        )));
    };
    if c != 3 || n == 0 || h < 32 || w < 32 {
        return Err(Error::BadInput(format!(
            "{}: tensor input has shape {shape:?}; a batch of RGB images of at least 32x32 expected",
            input.display()
        )));
    }
    let dict = match &opts.weights {
        Some(p) => load_safetensors(p, opts.model, None)?,
        None => seeded_init(opts.model, 1000, 0, true),
    };
    let folded = fold(&dict)?;
    progress("infer --input: gpukit CPU f32 forward (the reference)");
    let images = gpukit_tensor::Tensor::from_f32(&[n, c, h, w], x)?;
    let reference = folded.forward_cpu(&images)?.to_vec_f32()?;
    let classes = folded.num_classes;
    let mut saved: Vec<(String, Vec<f32>)> = vec![("logits".into(), reference.clone())];
    let mut report = vec![SavedLogits {
        tensor: "logits".into(),
        strategy: "cpu".into(),
        agreement: None,
        error: None,
    }];
    let gpu: Vec<_> = opts
        .strategies
        .iter()
        .filter_map(|s| match s {
            InferStrategy::Gpu(g) if !g.graph => Some(*g),
            _ => None,
        })
        .collect();
    if !gpu.is_empty() {
        let ordinal = match opts.selection {
            gpukit_tensor::DeviceSelection::One(gpukit_tensor::Device::Cuda(k)) => k,
            _ => 0,
        };
        match GpuContext::open(discovery, ordinal) {
            Ok(ctx) => {
                for s in gpu {
                    let name = s.name();
                    progress(&format!("infer --input: {name}"));
                    let logits = GpuWeights::upload(&ctx, &folded, s.dtype, s.layout)
                        .and_then(|wts| Session::new(&ctx, &wts, n, h, w, true)?.run(&images))
                        .and_then(|l| Ok(l.to_vec_f32()?));
                    let tensor = format!("logits_{}", name.replace('-', "_"));
                    match logits {
                        Ok(l) => {
                            report.push(SavedLogits {
                                tensor: tensor.clone(),
                                strategy: name,
                                agreement: Some(agreement(&l, &reference, classes)),
                                error: None,
                            });
                            saved.push((tensor, l));
                        }
                        Err(e) => report.push(SavedLogits {
                            tensor,
                            strategy: name,
                            agreement: None,
                            error: Some(e.to_string()),
                        }),
                    }
                }
            }
            Err(e) => report.push(SavedLogits {
                tensor: String::new(),
                strategy: "GPU strategies".into(),
                agreement: None,
                error: Some(e.to_string()),
            }),
        }
    }
    if let Some(out) = output {
        let shape = [n, classes];
        let tensors: Vec<(&str, &[usize], &[f32])> = saved
            .iter()
            .map(|(k, v)| (k.as_str(), &shape[..], v.as_slice()))
            .collect();
        save_tensors(out, &tensors)?;
    }
    Ok(InputRun {
        input: input.display().to_string(),
        shape,
        output: output.map(|p| p.display().to_string()),
        logits: report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::InferOptions;
    use gpukit_models::ResNet;

    #[test]
    fn cpu_logits_are_saved_and_bad_inputs_are_named() {
        let dir = std::env::temp_dir().join(format!("gpukit-infer-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (input, output) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
        let x: Vec<f32> = (0..2 * 3 * 32 * 32)
            .map(|i| (i % 17) as f32 / 17.0)
            .collect();
        save_tensors(&input, &[("input", &[2, 3, 32, 32], &x)]).unwrap();
        let mut opts = InferOptions::cpu_only(ResNet::R18, vec![2]);
        opts.strategies = vec![InferStrategy::Cpu];
        let d = gpukit_cuda::loader::discover();
        let r = run_on_input(&d, &opts, &input, Some(&output), &mut |_| {}).unwrap();
        assert_eq!(r.shape, vec![2, 3, 32, 32]);
        let (shape, logits) = load_tensor(&output, "logits").unwrap();
        assert_eq!(shape, vec![2, 1000]);
        let folded = fold(&seeded_init(ResNet::R18, 1000, 0, true)).unwrap();
        let images = gpukit_tensor::Tensor::from_f32(&[2, 3, 32, 32], x.clone()).unwrap();
        assert_eq!(
            logits,
            folded.forward_cpu(&images).unwrap().to_vec_f32().unwrap()
        );
        save_tensors(
            &input,
            &[("input", &[2, 4, 32, 32], &vec![0.0; 2 * 4 * 32 * 32])],
        )
        .unwrap();
        let e = run_on_input(&d, &opts, &input, None, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("[2, 4, 32, 32]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
