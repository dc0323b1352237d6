//! `bench matmul` under `gpukit all`.

use super::{run_matmul, MatmulOptions};
use crate::error::Result;
use crate::figures::*;
use crate::part::{row_statuses, Context, Outcome, Part};
use crate::report::RowStatus;
use gpukit_tensor::{Device, DeviceSelection};
use serde_json::Value;

/// `bench matmul` under `gpukit all`: two or three sizes on the GPU; without one, the CPU at
/// sizes a small machine does in seconds.
pub struct MatmulPart;

/// The matmul part of `gpukit all`.
pub static PART: MatmulPart = MatmulPart;

fn options(ctx: &Context<'_>) -> MatmulOptions {
    let quick = ctx.quick;
    if !ctx.gpu {
        return MatmulOptions {
            sizes: vec![256, 1024],
            selection: DeviceSelection::One(Device::Cpu),
            iterations: 5,
            cpu_budget_s: if quick { 2.0 } else { 5.0 },
            cpu_max_size: Some(1024),
            ..MatmulOptions::default()
        };
    }
    MatmulOptions {
        sizes: if quick {
            vec![1024, 4096]
        } else {
            vec![1024, 4096, 8192]
        },
        selection: ctx.selection,
        iterations: if quick { 10 } else { 30 },
        cpu_budget_s: if quick { 2.0 } else { 5.0 },
        // the CPU's rows at 4096 took 4-6 s each (f32, f64, f16): `bench matmul` has them
        cpu_max_size: Some(1024),
        // a cuBLASLt winner is confirmed against cuBLAS in 8 turns of half this: 400 ms a row
        // at the default, most of a quick row's time
        block_ms: if quick {
            40.0
        } else {
            MatmulOptions::default().block_ms
        },
        ..MatmulOptions::default()
    }
}

impl Part for MatmulPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        matmul_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "matmul"
    }
    fn command(&self) -> &'static str {
        "bench matmul"
    }
    fn title(&self) -> &'static str {
        "Matrix multiply"
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let mut r = run_matmul(ctx.discovery, &options(ctx), progress);
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
/// `bench matmul`: TFLOP/s per device, dtype and size; a CPU row's thread count; the inputs'
/// distribution when not the default normal (a power-capped GPU clocks by the bits that
/// toggle).
fn matmul_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "matmul",
        unit: "TFLOP/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let inputs = match text(section, "inputs") {
        Some(d) if d != "normal" => format!(" {d} inputs"),
        _ => String::new(),
    };
    for row in rows(section) {
        let (Some(dev), Some(dtype), Some(size)) =
            (device(row), text(row, "dtype"), text(row, "size"))
        else {
            continue;
        };
        let threads = threads(section, &dev);
        out.extend(row_figure(
            &spec,
            format!("{dev} {dtype} {size}{threads}{inputs}"),
            row,
            "tflops",
        ));
    }
}
