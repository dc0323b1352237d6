//! `bench conv` under `gpukit all`.

use super::{resnet50_shapes, run_conv, ConvOptions};
use crate::error::Result;
use crate::figures::*;
use crate::part::{row_statuses, Context, Outcome, Part};
use crate::report::RowStatus;
use gpukit_tensor::DType;
use serde_json::Value;

/// `bench conv` under `gpukit all`: ResNet-50's convolutions at one batch size (8 under
/// `--quick`, 32 without; 2 on the CPU); under `--quick` on a GPU, tf32 and f16 only.
pub struct ConvPart;

/// The conv part of `gpukit all`.
pub static PART: ConvPart = ConvPart;

impl Part for ConvPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        conv_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "conv"
    }
    fn command(&self) -> &'static str {
        "bench conv"
    }
    fn title(&self) -> &'static str {
        "Convolution"
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let (gpu, quick) = (ctx.gpu, ctx.quick);
        let o = ConvOptions {
            batches: vec![match (gpu, quick) {
                (false, _) => 2,
                (true, true) => 8,
                (true, false) => 32,
            }],
            ordinal: gpu.then(|| ctx.ordinal()),
            // a quick tour shows the tensor-core paths of each precision family (tf32 for
            // 32-bit data, f16 for 16-bit); f32 on CUDA cores and bf16 (f16's speed on this
            // hardware) wait for the full run
            dtypes: if quick && gpu {
                vec![DType::Tf32, DType::F16]
            } else {
                ConvOptions::default().dtypes
            },
            iterations: if quick || !gpu { 3 } else { 20 },
            // the CPU rows at 20 repetitions were 10 s of a cold `all` on an H100 (16 cores)
            cpu_iterations: Some(if quick || !gpu { 3 } else { 5 }),
            cpu_budget_s: if quick || !gpu { 1.0 } else { 3.0 },
            ..ConvOptions::default()
        };
        let mut r = run_conv(ctx.discovery, &resnet50_shapes(1), &o, progress);
        if r.gpu_unavailable.is_none() {
            r.gpu_unavailable.clone_from(&ctx.no_gpu);
        }
        Ok(Outcome::report(&r))
    }
    fn statuses(&self, report: &serde_json::Value) -> Vec<RowStatus> {
        row_statuses(report)
    }
}

// `gpukit compare`'s figures of this command's section.
/// `bench conv`: TFLOP/s per shape (kernel, stride, channels, input size, padding), layout,
/// dtype, batch and device, and a CPU row's threads; and the whole network's
/// convolutions in ms per dtype, layout and batch on the GPU and the CPU (its totals), when the
/// report has them.
fn conv_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "conv",
        unit: "TFLOP/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    for row in rows(section) {
        let batch = row
            .get("shape")
            .and_then(|s| s.get("n"))
            .map(|n| n.to_string());
        let (Some(shape), Some(layout), Some(dtype), Some(batch), Some(dev)) = (
            conv_shape(row).or_else(|| text(row, "name")),
            text(row, "layout"),
            text(row, "dtype"),
            batch,
            device(row),
        ) else {
            continue;
        };
        let key = format!(
            "{shape} {} {dtype} batch {batch} {dev}{}",
            layout.to_ascii_uppercase(),
            threads(section, &dev)
        );
        out.extend(row_figure(&spec, key, row, "tflops"));
    }
    let totals = Spec {
        section: "conv",
        unit: "ms",
        better: Better::Lower,
        timed: false,
        exact: false,
    };
    let gpu = gpu_device(section).unwrap_or_else(|| "gpu".into());
    let cpu = format!("cpu{}", threads(section, "cpu"));
    let list = section.get("totals").and_then(Value::as_array);
    for t in list.map(Vec::as_slice).unwrap_or(&[]) {
        let (Some(dtype), Some(layout), Some(batch)) =
            (text(t, "dtype"), text(t, "layout"), text(t, "batch"))
        else {
            continue;
        };
        let what = format!(
            "total {dtype} {} batch {batch}",
            layout.to_ascii_uppercase()
        );
        out.extend(plain_figure(
            &totals,
            format!("{what} {gpu}"),
            t.get("gpu_ms"),
        ));
        out.extend(plain_figure(
            &totals,
            format!("{what} {cpu}"),
            t.get("cpu_ms"),
        ));
    }
}

/// A convolution's shape as its row names it, "1x1 64->256 @56" (kernel, /stride past 1,
/// channels in and out, input size; the padding when not the kernel's half), from the shape's
/// fields rather than the row's name: a shape is what was measured, and its name changed from
/// version to version ("layer1 1x1 expand", then "layer1 1x1 64->256 @56").
fn conv_shape(row: &Value) -> Option<String> {
    let shape = row.get("shape")?;
    let field = |f: &str| shape.get(f).and_then(Value::as_u64);
    let (c, k, h, w) = (field("c")?, field("k")?, field("h")?, field("w")?);
    let (r, s, stride, pad) = (field("r")?, field("s")?, field("stride")?, field("pad")?);
    let mut out = format!("{r}x{s}");
    if stride != 1 {
        out.push_str(&format!("/{stride}"));
    }
    out.push_str(&format!(" {c}->{k} @{h}"));
    if w != h {
        out.push_str(&format!("x{w}"));
    }
    if pad != r / 2 || r != s {
        out.push_str(&format!(" pad {pad}"));
    }
    Some(out)
}
