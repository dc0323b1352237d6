//! PyTorch's own rows beside `infer` and `infer --onnx` (`--compare-pytorch`): the rows, what
//! says PyTorch's model is gpukit's (the logits; for `--onnx`, the layers too) and the best fp16
//! of each side.

use super::fmt::{grouped, mib};
use super::Section;
use gpukit_bench::infer::peer::{PytorchComparison, SameModel};

/// What says the two models are the same, as far as it was checked: `--onnx`'s layers line,
/// and the logits line (with its verdict on the weights under `--onnx`).
fn same_model_notes(p: &PytorchComparison) -> Vec<String> {
    let mut notes: Vec<String> = p.same_model.iter().map(layers_line).collect();
    let verdict = match &p.same_model {
        Some(s) if s.same_weights == Some(true) => {
            format!(": the same weights (<= {:.0e})", s.logits_tolerance)
        }
        Some(s) => format!(
            " (over {:.0e}): other weights, so PyTorch's times are for the same layers, not the \
             same numbers",
            s.logits_tolerance
        ),
        None => String::new(),
    };
    match (&p.logits, &p.logits_unavailable) {
        (Some(a), _) => notes.push(format!(
            "PyTorch's eager fp32 logits (TF32 off) against {} on the same {} images: max rel. \
             diff {:.1e}, top-1 agreement {:.0}%{}",
            p.logits_reference,
            p.logits_images,
            a.max_rel,
            a.top1 * 100.0,
            verdict
        )),
        (None, Some(why)) => notes.push(format!(
            "logits not compared: {why}{}",
            if p.same_model.is_some() {
                "; the model is the same by its layers only"
            } else {
                ""
            }
        )),
        (None, None) => {}
    }
    notes
}

/// `--onnx`'s structural check, as it was made.
fn layers_line(s: &SameModel) -> String {
    format!(
        "the same model by its layers: the file has {} Conv and {} Gemm/MatMul node(s) on \
         constant weights (as imported, before gpukit's passes), PyTorch's {} calls {} \
         convolution(s) and {} linear layer(s) in one forward; one output of {:?} per image on \
         both; PyTorch's weights: {} ({} parameters)",
        s.onnx.conv,
        s.onnx.linear,
        s.torchvision,
        s.pytorch.conv,
        s.pytorch.linear,
        s.output_shape,
        s.weights,
        grouped(s.pytorch_parameters as f64)
    )
}

/// PyTorch's own rows, what says the model is the same and best fp16 against best.
pub(super) fn pytorch_infer_section(p: &PytorchComparison) -> Section {
    let rows = p
        .rows
        .iter()
        .map(|x| {
            let figure = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_default();
            vec![
                x.strategy.clone(),
                x.device.clone(),
                x.batch.to_string(),
                if x.status == "ok" {
                    figure(x.median_ms, &|m| {
                        format!(
                            "{m:.3} ({:.3}-{:.3})",
                            x.p10_ms.unwrap_or(m),
                            x.p90_ms.unwrap_or(m)
                        )
                    })
                } else {
                    format!("{}: {}", x.status, x.reason.clone().unwrap_or_default())
                },
                figure(x.images_per_s, &grouped),
                x.peak_allocated_bytes.map(mib).unwrap_or_default(),
                figure(x.compile_s, &|c| format!("{c:.1} s")),
            ]
        })
        .collect();
    let mut notes = same_model_notes(p);
    notes.extend(
        p.cpu_rows_failed
            .iter()
            .map(|why| format!("PyTorch's CPU rows are missing: {why}")),
    );
    for b in &p.best_fp16 {
        notes.push(format!(
            "best fp16 at batch {}: gpukit {} {} img/s, PyTorch {} {} img/s: {:.2}x",
            b.batch,
            b.gpukit_strategy,
            grouped(b.gpukit_images_per_s),
            b.pytorch_strategy,
            grouped(b.pytorch_images_per_s),
            b.ratio
        ));
    }
    Section {
        title: format!(
            "PyTorch {} (torchvision {}, cudnn.benchmark {}) on {}",
            p.torch_version,
            p.torchvision
                .as_deref()
                .unwrap_or("absent: the script's own ResNet"),
            p.cudnn_benchmark,
            p.device_name.as_deref().unwrap_or("?")
        ),
        // the check alone where no timed row ran (`--onnx` with no row to stand beside)
        header: (!p.rows.is_empty()).then(|| {
            [
                "strategy",
                "device",
                "batch",
                "median ms (p10-p90)",
                "images/s",
                "peak allocated",
                "compile",
            ]
            .map(String::from)
            .to_vec()
        }),
        rows,
        notes,
    }
}
