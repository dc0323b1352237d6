//! `bench conv` under `gpukit all`.

use super::{resnet50_shapes, run_conv, ConvOptions};
use crate::error::Result;
use crate::part::{row_statuses, Context, Outcome, Part};
use crate::report::RowStatus;

/// `bench conv` under `gpukit all`: ResNet-50's convolutions at one batch size (8 under
/// `--quick`, 32 without; 2 on the CPU).
pub struct ConvPart;

/// The conv part of `gpukit all`.
pub static PART: ConvPart = ConvPart;

impl Part for ConvPart {
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
            iterations: if quick || !gpu { 3 } else { 20 },
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
