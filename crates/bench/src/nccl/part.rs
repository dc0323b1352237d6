//! `bench nccl` under `gpukit all`.

use super::sweep::Collective;
use super::{run_nccl, NcclOptions, Place};
use crate::error::Result;
use crate::part::{Context, Outcome, Part};

/// `bench nccl` under `gpukit all`, where there are several GPUs and all are selected:
/// all_reduce, all_gather and reduce_scatter out of place, up to 64 MiB under `--quick` and
/// 1 GiB without.
pub struct NcclPart;

/// The NCCL part of `gpukit all`.
pub static PART: NcclPart = NcclPart;

impl Part for NcclPart {
    fn key(&self) -> &'static str {
        "nccl"
    }
    fn command(&self) -> &'static str {
        "bench nccl"
    }
    fn title(&self) -> &'static str {
        "Several GPUs: NCCL collectives"
    }
    fn wanted(&self, ctx: &Context<'_>) -> bool {
        ctx.several_gpus()
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let o = NcclOptions {
            ops: vec![
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ],
            places: vec![Place::Out],
            max_bytes: if ctx.quick { 64 << 20 } else { 1 << 30 },
            step_factor: 4,
            ..NcclOptions::default()
        };
        Ok(match run_nccl(ctx.discovery, &o, progress) {
            Ok(Some((r, _))) => Outcome::report(&r),
            Ok(None) => Outcome::default(),
            Err(e) => Outcome::skipped("bench nccl", e.to_string()),
        })
    }
}
