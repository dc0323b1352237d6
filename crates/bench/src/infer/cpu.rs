//! The CPU rows of `gpukit infer`: gpukit's own f32 forward pass (the CPU reference) and ONNX
//! Runtime's CPU provider on the same weights, checked against it.

use super::report::{rate, row, InferRow};
use super::InferOptions;
use crate::accuracy::agreement;
use crate::measure::{time_host, Plan};
use crate::random::uniform_f32;
use crate::report::RowStatus;
use crate::workload::strategy::{CPU_ROW, ORT_ROW};
use gpukit_models::forward::FoldedResNet;
use gpukit_models::ort_runner::OrtModel;
use gpukit_tensor::Tensor;

/// gpukit's f32 CPU row (when `want_cpu`; untimed as ONNX Runtime's reference otherwise) and
/// ONNX Runtime's, at each batch size.
pub(super) fn cpu_rows(
    folded: &FoldedResNet,
    opts: &InferOptions,
    batches: &[(usize, u64)],
    want_cpu: bool,
    mut ort: Option<&mut OrtModel>,
    progress: &mut dyn FnMut(&str),
) -> Vec<InferRow> {
    let classes = folded.num_classes;
    let s = opts.image_size;
    let plan = Plan::new(1, opts.iterations).with_budget(opts.budget_s);
    let mut rows = Vec::new();
    let mut ws = gpukit_models::forward::Workspace::default();
    for &(n, seed) in batches {
        let guard = gpukit_types::resources::Need::host(format!(
            "the CPU forward pass at batch {n} of {s}x{s}"
        ))
        .with("input and activations", folded.cpu_forward_bytes(n, s, s))
        .check_host("lower --batch-sizes");
        if let Err(refused) = guard {
            let names = [(want_cpu, CPU_ROW), (ort.is_some(), ORT_ROW)];
            for (_, name) in names.iter().filter(|(wanted, _)| *wanted) {
                let mut r = row(name, "cpu", n);
                r.status = RowStatus::Skipped(refused.to_string());
                rows.push(r);
            }
            continue;
        }
        let x = uniform_f32(n * 3 * s * s, seed);
        let images = match Tensor::from_f32(&[n, 3, s, s], x.clone()) {
            Ok(t) => t,
            Err(e) => {
                let mut r = row(CPU_ROW, "cpu", n);
                r.status = RowStatus::Failed(e.to_string());
                rows.push(r);
                continue;
            }
        };
        let mut reference = Vec::new();
        let mut reference_rate = None;
        let computed = if want_cpu {
            progress(&format!("infer cpu gpukit f32 batch {n}"));
            let mut r = row(CPU_ROW, "cpu", n);
            let timed = time_host(plan, || {
                reference = folded.forward_cpu_with(&images, &mut ws)?.to_vec_f32()?;
                Ok::<(), gpukit_models::Error>(())
            });
            let ok = match timed {
                Ok(t) => {
                    r.images_per_s = Some(rate(n, &t));
                    r.speedup_vs_reference = Some(1.0);
                    r.timing = Some(t);
                    reference_rate = r.images_per_s;
                    Ok(())
                }
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    Err(e.to_string())
                }
            };
            rows.push(r);
            ok
        } else if ort.is_some() {
            progress(&format!(
                "infer cpu gpukit f32 batch {n} (reference, untimed)"
            ));
            folded
                .forward_cpu_with(&images, &mut ws)
                .and_then(|l| Ok(l.to_vec_f32()?))
                .map(|l| reference = l)
                .map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        let Some(m) = ort.as_deref_mut() else {
            continue;
        };
        progress(&format!("infer cpu onnxruntime batch {n}"));
        let mut r = row(ORT_ROW, "cpu", n);
        if let Err(e) = computed {
            r.status = RowStatus::Skipped(format!("no CPU reference to check it with: {e}"));
            rows.push(r);
            continue;
        }
        let mut out = Vec::new();
        match time_host(plan, || {
            out = m.run(&x, n, s, s)?;
            Ok::<(), gpukit_models::Error>(())
        }) {
            Ok(t) => {
                let a = agreement(&out, &reference, classes);
                r.compared_with = Some("gpukit's f32 CPU forward".into());
                r.tolerance = Some(1e-3);
                if a.max_rel > 1e-3 || a.top1 < 1.0 {
                    r.status = RowStatus::Failed(format!(
                        "logits differ from gpukit's: max relative {:.1e}, top-1 agreement {:.0}%",
                        a.max_rel,
                        a.top1 * 100.0
                    ));
                } else {
                    let rate = rate(n, &t);
                    r.images_per_s = Some(rate);
                    r.speedup_vs_reference = reference_rate.map(|g| rate / g);
                    r.timing = Some(t);
                }
                r.agreement = Some(a);
            }
            Err(e) => r.status = RowStatus::Failed(e.to_string()),
        }
        rows.push(r);
    }
    rows
}
