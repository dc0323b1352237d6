//! `bench nccl` under `gpukit all`.

use super::sweep::Collective;
use super::{run_nccl, NcclOptions, Place};
use crate::error::Result;
use crate::figures::*;
use crate::part::{Context, Outcome, Part};
use serde_json::Value;

/// `bench nccl` under `gpukit all`, where there are several GPUs and all are selected:
/// all_reduce, all_gather and reduce_scatter out of place, up to 64 MiB under `--quick` and
/// 1 GiB without.
pub struct NcclPart;

/// The NCCL part of `gpukit all`.
pub static PART: NcclPart = NcclPart;

impl Part for NcclPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        nccl_figures(section, out)
    }
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

// `gpukit compare`'s figures of this command's section.
/// `bench nccl`: busbw per collective, dtype, reduction, root, size and place, under the run's
/// ranks (and processes when more than one), CUDA graph and NCCL_* settings (they choose
/// algorithms, protocols and transports). A row's figure is the mean over ranks of each rank's
/// median block; no spread is kept.
fn nccl_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "nccl",
        unit: "GB/s busbw",
        better: Better::Higher,
        timed: false,
        exact: false,
    };
    let setup = nccl_setup(section);
    for row in rows(section) {
        let (Some(op), Some(dtype), Some(bytes)) = (
            text(row, "op"),
            text(row, "dtype"),
            row.get("bytes").and_then(Value::as_u64),
        ) else {
            continue;
        };
        let redop = text(row, "redop")
            .map(|r| format!(" {r}"))
            .unwrap_or_default();
        let root = text(row, "root")
            .map(|r| format!(" root {r}"))
            .unwrap_or_default();
        for (place, field) in [("out-of-place", "out_of_place"), ("in-place", "in_place")] {
            let Some(fig) = row.get(field).filter(|f| !f.is_null()) else {
                continue;
            };
            let key = format!(
                "{op} {dtype}{redop}{root} {} {place}{setup}",
                bytes_name(bytes)
            );
            match problem(row) {
                Some(_) => out.extend(row_figure(&spec, key, row, "busbw_gbs")),
                None => out.extend(plain_figure(&spec, key, fig.get("busbw_gbs"))),
            }
        }
    }
}

/// " 2 ranks", then " in 2 processes", " graph" and each NCCL_* variable that changes what
/// NCCL does (its logging ones do not) when they apply.
fn nccl_setup(section: &Value) -> String {
    let mut out = String::new();
    if let Some(n) = text(section, "ranks") {
        out.push_str(&format!(" {n} ranks"));
    }
    if let Some(p) = section
        .get("processes")
        .and_then(Value::as_u64)
        .filter(|p| *p > 1)
    {
        out.push_str(&format!(" in {p} processes"));
    }
    if section.get("graph").and_then(Value::as_bool) == Some(true) {
        out.push_str(" graph");
    }
    let env = section.get("nccl_env").and_then(Value::as_array);
    for pair in env.map(Vec::as_slice).unwrap_or(&[]) {
        let (Some(name), Some(value)) = (
            pair.get(0).and_then(Value::as_str),
            pair.get(1).and_then(Value::as_str),
        ) else {
            continue;
        };
        if !name.starts_with("NCCL_DEBUG") {
            out.push_str(&format!(" {name}={value}"));
        }
    }
    out
}
