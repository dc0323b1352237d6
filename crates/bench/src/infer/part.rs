//! `infer` under `gpukit all`.

use super::{gpu_rows_without_figure, run_infer, InferOptions, InferStrategy};
use crate::error::Result;
use crate::figures::*;
use crate::part::{row_statuses, Context, Outcome, Part};
use crate::report::RowStatus;
use gpukit_models::gpu::Strategy;
use gpukit_models::ResNet;
use gpukit_tensor::{Device, DeviceSelection};
use serde_json::Value;

/// `infer` under `gpukit all`: ResNet-50 at batch 1 and 32 (and 8 without `--quick`); under
/// `--quick` the CPU, ONNX Runtime and three GPU strategies, else every default strategy.
pub struct InferPart;

/// The infer part of `gpukit all`.
pub static PART: InferPart = InferPart;

fn options(ctx: &Context<'_>) -> InferOptions {
    let (gpu, quick) = (ctx.gpu, ctx.quick);
    let strategies = if gpu && quick {
        let mut v = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
        v.extend(
            ["fp32", "fp16-nhwc", "fp16-nhwc-graph"]
                .iter()
                .filter_map(|s| Strategy::parse(s).ok())
                .map(InferStrategy::Gpu),
        );
        v
    } else {
        InferStrategy::defaults()
    };
    InferOptions {
        model: ResNet::R50,
        batch_sizes: match (gpu, quick) {
            (false, _) => vec![1],
            (true, true) => vec![1, 32],
            (true, false) => vec![1, 8, 32],
        },
        iterations: if quick { 2 } else { 5 },
        weights: None,
        image_size: 224,
        budget_s: 5.0,
        selection: if gpu {
            ctx.selection
        } else {
            DeviceSelection::One(Device::Cpu)
        },
        strategies,
        gpu_iterations: if quick { 20 } else { 50 },
        // the CPU rows at large batches take minutes: the GPU rows' comparison is enough
        cpu_max_batch: Some(if quick { 1 } else { 8 }),
        search: gpukit_cuda::dnn::Search::Fast,
        tolerance: crate::accuracy::tolerance,
    }
}

impl Part for InferPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        infer_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "infer"
    }
    fn command(&self) -> &'static str {
        "infer"
    }
    fn title(&self) -> &'static str {
        "Inference"
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let mut r = match run_infer(ctx.discovery, &options(ctx), progress) {
            Ok(r) => r,
            Err(e) => return Ok(Outcome::skipped("infer", e.to_string())),
        };
        if r.gpu_unavailable.is_none() {
            r.gpu_unavailable.clone_from(&ctx.no_gpu);
        }
        let gpu_skipped = r
            .gpu_unavailable
            .clone()
            .or_else(|| gpu_rows_without_figure(&r));
        let mut o = Outcome::report(&r);
        // (without a GPU the general entry says it already)
        if let Some(reason) = gpu_skipped.filter(|_| ctx.no_gpu.is_none()) {
            o = o.with_skipped("infer's GPU rows", reason);
        }
        Ok(o)
    }
    fn statuses(&self, report: &serde_json::Value) -> Vec<RowStatus> {
        row_statuses(report)
    }
}

// `gpukit compare`'s figures of this command's section.
/// `infer`: images/s per model, image size, strategy, device (a CPU row's threads) and batch.
fn infer_figures(section: &Value, out: &mut Vec<Figure>) {
    let model = model_and_size(section, text(section, "image_size"));
    rate_figures("infer", &model, section, out);
}

/// Each row's images/s in `section_name`, keyed `{model}{strategy} {device} batch {batch}`
/// (`model` ends with a space where it is not empty; a CPU row's device names its threads).
pub(super) fn rate_figures(
    section_name: &str,
    model: &str,
    section: &Value,
    out: &mut Vec<Figure>,
) {
    let spec = Spec {
        section: section_name,
        unit: "images/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    for row in rows(section) {
        let (Some(strategy), Some(dev), Some(batch)) =
            (text(row, "strategy"), device(row), text(row, "batch"))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!(
                "{model}{strategy} {dev}{} batch {batch}",
                threads(section, &dev)
            ),
            row,
            "images_per_s",
        ));
    }
}
