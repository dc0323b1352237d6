//! `infer --input X.safetensors --save-output Y.safetensors`: one given batch through every
//! requested strategy, the logits saved for checking numerics across frameworks. "logits" is
//! gpukit's CPU f32 forward pass; "logits_<strategy>" each other strategy's, compared with it.

use super::{agreement, Agreement, InferOptions, InferStrategy};
use crate::accuracy::{tolerance, verdict};
use crate::error::{Error, Result};
use crate::report::{judge_rows, RowStatus};
use gpukit_cuda::loader::Discovery;
use gpukit_models::forward::fold;
use gpukit_models::gpu::{GpuContext, GpuWeights, Session};
use gpukit_models::weights::{load_safetensors, load_tensor, save_tensors, seeded_init};
use gpukit_tensor::{DType, Device, DeviceSelection};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedLogits {
    /// The tensor name in the output file (empty where nothing was computed).
    pub tensor: String,
    pub strategy: String,
    /// Against gpukit's CPU f32 logits (None for those themselves).
    pub agreement: Option<Agreement>,
    /// The largest `agreement.max_rel` this strategy's precision may show.
    pub tolerance: Option<f64>,
    /// Failed: the logits are not finite, or differ from the CPU's beyond the tolerance (they
    /// are still written to the output file), or the strategy could not run.
    pub status: RowStatus,
}

/// Where the CPU's f32 pass first went past fp16's largest value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overflow {
    /// torchvision's module name, e.g. `layer3.4.conv2`.
    pub layer: String,
    /// The largest magnitude of that layer's output on the CPU (f32).
    pub peak: f32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InputRun {
    pub input: String,
    pub shape: Vec<usize>,
    pub output: Option<String>,
    pub logits: Vec<SavedLogits>,
    /// The largest magnitude any layer's output reached on the CPU's f32 pass.
    pub largest_activation: f32,
    /// The first layer whose output passed fp16's range (65504) on the CPU, if any: an fp16
    /// run of this input overflows there.
    pub fp16_overflow: Option<Overflow>,
}

/// fp16's largest finite value.
const F16_MAX: f32 = 65504.0;

/// The JSON document of `infer --input`: failed when any strategy's logits failed.
pub fn document(run: InputRun) -> crate::report::Document<InputRun> {
    let failure = judge_rows(run.logits.iter().map(|l| &l.status));
    let mut notes = Vec::new();
    if let Some(o) = &run.fp16_overflow {
        notes.push(format!(
            "the CPU's f32 pass reaches {:.3e} at {}, beyond fp16's largest value (65504): \
             fp16 strategies overflow there on this input; bf16 and fp32 keep the range",
            o.peak, o.layer
        ));
    }
    crate::report::Document::new("infer --input", run, failure).with_notes(notes)
}

/// Why `x` cannot be an input, if it holds a value that is not finite.
fn non_finite(x: &[f32], file: &Path) -> Option<Error> {
    let first = x.iter().position(|v| !v.is_finite())?;
    let count = x.iter().filter(|v| !v.is_finite()).count();
    Some(Error::BadInput(format!(
        "{}: tensor input holds {count} value(s) that are not finite (NaN or infinite), the \
         first at index {first}",
        file.display()
    )))
}

/// The judgement of one strategy's logits against the CPU's: the failure names fp16 overflow
/// (and the layer) when the CPU's pass shows it.
fn judge(
    logits: &[f32],
    reference: &[f32],
    classes: usize,
    dtype: DType,
    overflow: Option<&Overflow>,
) -> (Agreement, f64, RowStatus) {
    let a = agreement(logits, reference, classes);
    let tol = tolerance(dtype);
    let status = match verdict(logits, &a, tol) {
        None => RowStatus::Ok,
        Some(why) => RowStatus::Failed(match overflow.filter(|_| dtype == DType::F16) {
            Some(o) => format!(
                "{why}: fp16 overflow, the CPU's f32 pass reaches {:.3e} at {} (fp16's largest \
                 value is 65504); use bf16 or fp32",
                o.peak, o.layer
            ),
            None => why,
        }),
    };
    (a, tol, status)
}

/// Runs the batch in `input` (tensor "input", f32 [n, 3, h, w]) through `opts.strategies`
/// (ONNX Runtime excepted), judges every strategy's logits against the CPU's and writes them
/// all to `output` (failed ones too: the report marks them).
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
    if let Some(e) = non_finite(&x, input) {
        return Err(e);
    }
    let dict = match &opts.weights {
        Some(p) => load_safetensors(p, opts.model, None)?,
        None => seeded_init(opts.model, 1000, 0, true),
    };
    let folded = fold(&dict)?;
    gpukit_types::resources::Need::host(format!(
        "the CPU reference pass over {} ({shape:?})",
        input.display()
    ))
    .with("input and activations", folded.cpu_forward_bytes(n, h, w))
    .check_host("give fewer or smaller images")?;
    progress("infer --input: gpukit CPU f32 forward (the reference)");
    let images = gpukit_tensor::Tensor::from_f32(&[n, c, h, w], x)?;
    let (reference, peaks) = folded.forward_cpu_probed(&images)?;
    let reference = reference.to_vec_f32()?;
    let fp16_overflow = peaks.first_over(F16_MAX).map(|(layer, peak)| Overflow {
        layer: layer.to_string(),
        peak,
    });
    let classes = folded.num_classes;
    let mut saved: Vec<(String, Vec<f32>)> = vec![("logits".into(), reference.clone())];
    let mut report = vec![SavedLogits {
        tensor: "logits".into(),
        strategy: "cpu".into(),
        agreement: None,
        tolerance: None,
        status: match peaks.first_over(f32::MAX) {
            None => RowStatus::Ok,
            Some((layer, _)) => RowStatus::Failed(format!(
                "the CPU's f32 logits are not finite: values pass f32's range at {layer} (the \
                 weights or the input are far outside what the network was trained on)"
            )),
        },
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
            DeviceSelection::One(Device::Cuda(k)) => k,
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
                            let (a, tol, status) =
                                judge(&l, &reference, classes, s.dtype, fp16_overflow.as_ref());
                            report.push(SavedLogits {
                                tensor: tensor.clone(),
                                strategy: name,
                                agreement: Some(a),
                                tolerance: Some(tol),
                                status,
                            });
                            saved.push((tensor, l));
                        }
                        Err(e) => report.push(SavedLogits {
                            tensor: String::new(),
                            strategy: name,
                            agreement: None,
                            tolerance: None,
                            status: RowStatus::Failed(e.to_string()),
                        }),
                    }
                }
            }
            // `--device all` without a usable GPU runs what it can; a named GPU must run
            Err(e) => report.push(SavedLogits {
                tensor: String::new(),
                strategy: "GPU strategies".into(),
                agreement: None,
                tolerance: None,
                status: match opts.selection {
                    DeviceSelection::All => RowStatus::Skipped(format!("no GPU: {e}")),
                    _ => RowStatus::Failed(e.to_string()),
                },
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
        largest_activation: peaks.max(),
        fp16_overflow,
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

    #[test]
    fn the_judgement_fails_nan_inf_and_differences_and_names_fp16_overflow() {
        let reference = [1.0f32, 2.0, 3.0, 4.0];
        let overflow = Overflow {
            layer: "layer3.4.conv2".into(),
            peak: 1.5e5,
        };
        // within the tolerance
        let close = [1.0f32, 2.0, 3.0, 4.0001];
        let (_, tol, st) = judge(&close, &reference, 2, DType::F16, None);
        assert_eq!((st, tol), (RowStatus::Ok, tolerance(DType::F16)));
        // over it
        let far = [1.0f32, 2.0, 3.0, 4.5];
        let (a, _, st) = judge(&far, &reference, 2, DType::Bf16, None);
        assert!(a.max_rel > tolerance(DType::Bf16));
        assert!(
            matches!(&st, RowStatus::Failed(w) if w.contains("over the tolerance")),
            "{st:?}"
        );
        // not finite, with and without an overflow to name
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let got = [1.0f32, bad, 3.0, 4.0];
            let (_, _, st) = judge(&got, &reference, 2, DType::F32, Some(&overflow));
            assert!(
                matches!(&st, RowStatus::Failed(w) if w.contains("not finite") && !w.contains("fp16")),
                "{st:?}"
            );
            let (_, _, st) = judge(&got, &reference, 2, DType::F16, Some(&overflow));
            assert!(
                matches!(&st, RowStatus::Failed(w) if w.contains("fp16 overflow")
                    && w.contains("layer3.4.conv2") && w.contains("bf16")),
                "{st:?}"
            );
        }
        // an fp16 run that passes is not failed by an overflow elsewhere
        let (_, _, st) = judge(&close, &reference, 2, DType::F16, Some(&overflow));
        assert_eq!(st, RowStatus::Ok);
    }

    #[test]
    fn an_input_with_nan_is_refused_as_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("nan.safetensors");
        let mut x = vec![0.5f32; 3 * 32 * 32];
        x[7] = f32::NAN;
        x[9] = f32::INFINITY;
        save_tensors(&input, &[("input", &[1, 3, 32, 32], &x)]).unwrap();
        let mut opts = InferOptions::cpu_only(ResNet::R18, vec![1]);
        opts.strategies = vec![InferStrategy::Cpu];
        let d = gpukit_cuda::loader::discover();
        let e = run_on_input(&d, &opts, &input, None, &mut |_| {}).unwrap_err();
        assert!(matches!(e, Error::BadInput(_)), "{e:?}");
        assert!(
            e.to_string().contains("2 value(s) that are not finite")
                && e.to_string().contains("index 7"),
            "{e}"
        );
    }

    #[test]
    fn weights_that_overflow_fp16_are_named_with_their_layer() {
        let dir = tempfile::tempdir().unwrap();
        let (input, weights) = (
            dir.path().join("in.safetensors"),
            dir.path().join("w.safetensors"),
        );
        let x =
            gpukit_tensor::random::uniform_f32(3 * 32 * 32, gpukit_tensor::random::fresh_seed());
        save_tensors(&input, &[("input", &[1, 3, 32, 32], &x)]).unwrap();
        // the stem's batch-norm scale made huge: its output passes fp16's range
        let mut dict = seeded_init(ResNet::R18, 1000, 0, true);
        let scale = dict
            .params
            .get_mut("bn1.weight")
            .expect("the stem's batch norm");
        scale.data.iter_mut().for_each(|v| *v = 1e6);
        gpukit_models::weights::save_safetensors(&dict, &weights).unwrap();
        let mut opts = InferOptions::cpu_only(ResNet::R18, vec![1]);
        opts.strategies = vec![InferStrategy::Cpu];
        opts.weights = Some(weights);
        let d = gpukit_cuda::loader::discover();
        let run = run_on_input(&d, &opts, &input, None, &mut |_| {}).unwrap();
        let o = run.fp16_overflow.clone().expect("an overflow");
        assert_eq!(o.layer, "conv1");
        assert!(o.peak > F16_MAX && run.largest_activation >= o.peak);
        let doc = document(run);
        assert!(
            doc.notes
                .iter()
                .any(|n| n.contains("conv1") && n.contains("65504")),
            "{:?}",
            doc.notes
        );
        // the CPU row itself is finite and passes
        assert!(doc.failure.is_none(), "{:?}", doc.failure);
    }
}
