//! `profile` under `gpukit all`. The profiler over a workload is itself a workload
//! ([`crate::workload::profile`]): `profile`, lesson 8 and `all` use it.

use crate::error::Result;
use crate::part::{Context, Outcome, Part};
use crate::workload::profile::table::GroupBy;
use crate::workload::profile::{profile_infer, profile_train, InferWorkload, ProfileOptions};
use crate::workload::train::{Preset, TrainRequest};
use gpukit_models::ResNet;

/// `profile` under `gpukit all`: `profile infer` (ResNet-50 fp16 NHWC at batch 32 on a GPU;
/// ResNet-18 at batch 1, 64 px on the CPU) and `profile train` (the seed-regression preset),
/// the top 10 ops of each.
pub struct ProfilePart;

/// The profile part of `gpukit all`.
pub static PART: ProfilePart = ProfilePart;

impl Part for ProfilePart {
    fn key(&self) -> &'static str {
        "profile"
    }
    fn command(&self) -> &'static str {
        "profile"
    }
    fn title(&self) -> &'static str {
        "Profile: where the time goes"
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let gpu = ctx.gpu;
        let device = ctx.device();
        let o = ProfileOptions {
            steps: if gpu { 10 } else { 2 },
            top: 10,
            group_by: GroupBy::Op,
            trace: None,
            timing: gpukit_cuda::profiler::TimingChoice::Auto,
        };
        let w = InferWorkload {
            model: if gpu { ResNet::R50 } else { ResNet::R18 },
            batch: if gpu { 32 } else { 1 },
            image_size: if gpu { 224 } else { 64 },
            weights: None,
            strategy: None,
            device: Some(device),
        };
        let mut reports = Vec::new();
        let mut skipped = Vec::new();
        match profile_infer(ctx.discovery, &w, &o, progress) {
            Ok(r) => reports.push(r),
            Err(e) => skipped.push(("profile infer", e.to_string())),
        }
        let request = TrainRequest {
            preset: Some(Preset::SeedRegression),
            device: Some(device),
            ..TrainRequest::default()
        };
        match profile_train(ctx.discovery, &request, &o, progress) {
            Ok(r) => reports.push(r),
            Err(e) => skipped.push(("profile train", e.to_string())),
        }
        let mut out = Outcome::report(&reports);
        for (part, reason) in skipped {
            out = out.with_skipped(part, reason);
        }
        Ok(out)
    }
}
