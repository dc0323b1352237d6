//! `infer --onnx`'s GPU rows on the general engine (`gpukit_models::gpu::program`): any graph
//! the lowering takes, every strategy asked for at each batch size, each row's outputs checked
//! before its speed counts: fp32 rows against the float64 outputs of that batch (within 1e-5,
//! or as close as ONNX Runtime's f32), the other precisions against the f32 reference (ONNX
//! Runtime's on the same input, else gpukit's interpreter's). fp32 rows show their agreement
//! with that f32 reference too.

use super::rows::{judge_float64, judge_with, Float64, Outputs};
use crate::infer::report::{rate, row, InferRow};
use crate::infer::InferStrategy;
use crate::measure::{time_device, warm_device, Plan};
use crate::report::RowStatus;
use crate::workload::strategy::{GPU_WARM, GPU_WARM_PASSES};
use gpukit_cuda::loader::Discovery;
use gpukit_models::gpu::program::{Program, ProgramSession};
use gpukit_models::gpu::GpuContext;
use gpukit_models::graph::Graph;
use gpukit_tensor::DType;

/// What the GPU rows of one batch size check against.
pub(super) struct Reference<'a> {
    pub input: &'a [f32],
    pub outputs: &'a Outputs,
    /// `ONNX Runtime CPU on the same input`, ...
    pub label: &'a str,
    /// The float64 outputs on the same input, that fp32 rows are judged against (where they
    /// could be computed).
    pub float64: Option<&'a Float64>,
}

pub use crate::accuracy::graph_tolerance as general_tolerance;

/// The GPU rows of `graph` (optimized, at batch `n`) for `wanted` (GPU strategies), timed by
/// `plan`; `ctx`: the opened device or why it could not open.
#[allow(clippy::too_many_arguments)]
pub(super) fn rows_at(
    ctx: Result<&GpuContext, &str>,
    discovery: &Discovery,
    device: &str,
    graph: &Graph,
    n: usize,
    wanted: &[InferStrategy],
    reference: Option<Reference<'_>>,
    plan: Plan,
    steps: &mut Vec<ProgramSteps>,
    progress: &mut dyn FnMut(&str),
) -> Vec<InferRow> {
    let strategies: Vec<_> = wanted
        .iter()
        .filter_map(|s| match s {
            InferStrategy::Gpu(g) => Some(*g),
            _ => None,
        })
        .collect();
    // one image at a time is the ResNet engine's: its rows say so
    let mut rows: Vec<InferRow> = wanted
        .iter()
        .filter(|s| matches!(s, InferStrategy::OneAtATime(_)) && n > 1)
        .map(|s| {
            let mut r = row(&s.name(), device, n);
            r.status = RowStatus::Skipped(
                "one image at a time runs on the ResNet engine only, so far".into(),
            );
            r
        })
        .collect();
    let skipped = |why: &str| -> Vec<InferRow> {
        strategies
            .iter()
            .map(|s| {
                let mut r = row(&s.name(), device, n);
                r.status = RowStatus::Skipped(why.to_string());
                r
            })
            .collect()
    };
    let ctx = match ctx {
        Ok(c) => c,
        Err(why) => {
            rows.extend(skipped(why));
            return rows;
        }
    };
    let Some(reference) = reference else {
        rows.extend(skipped(
            "no reference output to check against at this batch size",
        ));
        return rows;
    };
    let mut fp32_eager = None;
    // one program and session per dtype and layout; its eager and graph rows share it
    let mut pairs: Vec<(DType, gpukit_tensor::Layout)> = Vec::new();
    for s in &strategies {
        if !pairs.contains(&(s.dtype, s.layout)) {
            pairs.push((s.dtype, s.layout));
        }
    }
    for (dtype, layout) in pairs {
        let here: Vec<_> = strategies
            .iter()
            .filter(|s| (s.dtype, s.layout) == (dtype, layout))
            .copied()
            .collect();
        let fail_all = |status: RowStatus| -> Vec<InferRow> {
            here.iter()
                .map(|s| {
                    let mut r = row(&s.name(), device, n);
                    r.status = status.clone();
                    r
                })
                .collect()
        };
        let cc = ctx.gpu.compute_capability().unwrap_or((0, 0));
        let program = match Program::lower_for(graph, dtype, layout, cc) {
            Ok(p) => p,
            Err(e) => {
                rows.extend(fail_all(RowStatus::Skipped(format!(
                    "the GPU engine cannot run this graph yet: {e}"
                ))));
                continue;
            }
        };
        let what = format!("infer --onnx {device} {}", here[0].name());
        let made = ProgramSession::new(ctx, discovery, &program, &mut |line| {
            progress(&format!("{what} batch {n}: {line}"))
        });
        let mut session = match made {
            Ok(s) => s,
            Err(e) => {
                rows.extend(fail_all(RowStatus::Failed(format!(
                    "preparing batch {n}: {e}"
                ))));
                continue;
            }
        };
        // the report's line: what planning chose, from the first session of each program
        let label = program_label(dtype, layout);
        match steps.iter_mut().find(|p| p.0 == label) {
            Some(p) if !p.2 => *p = (label.clone(), session.step_counts(), true),
            Some(_) => {}
            None => steps.push((label.clone(), session.step_counts(), true)),
        }
        if let Err(e) = session.run(&[reference.input]) {
            rows.extend(fail_all(RowStatus::Failed(format!("the first pass: {e}"))));
            continue;
        }
        let tol = general_tolerance(dtype);
        let mut captured = false;
        for st in &here {
            let mut r = row(&st.name(), device, n);
            r.tolerance = Some(tol);
            r.gpu_memory_bytes = Some(session.memory_bytes() as u64);
            r.compared_with = Some(reference.label.to_string());
            if st.graph && !captured {
                if let Err(e) = session.capture() {
                    r.status = RowStatus::Failed(format!("capturing the CUDA graph: {e}"));
                    rows.push(r);
                    continue;
                }
                captured = true;
                // the report's line: where the graph runs its branches beside their blocks
                let beside = format!("branches beside the steps before them at batch {n}");
                match steps.iter_mut().find(|p| p.0 == label) {
                    Some(p) if session.graph_branched() => {
                        p.1.push((beside, session.branch_count()))
                    }
                    _ => {}
                }
            }
            progress(&format!("infer --onnx {device} {} batch {n}", st.name()));
            let stream = ctx.gpu.stream();
            let pass = || match st.graph {
                true => session.replay(),
                false => session.enqueue(),
            };
            let timed = warm_device(stream, GPU_WARM, GPU_WARM_PASSES, pass)
                .and_then(|_| time_device(stream, plan, pass));
            let t = match timed {
                Ok(t) => t,
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    rows.push(r);
                    continue;
                }
            };
            // the last timed pass's outputs, on the reference's input
            let got = match session.outputs() {
                Ok(o) => o,
                Err(e) => {
                    r.status = RowStatus::Failed(format!("reading the outputs: {e}"));
                    rows.push(r);
                    continue;
                }
            };
            let got: Outputs = got
                .into_iter()
                .zip(reference.outputs)
                .map(|(v, (shape, _))| (shape.clone(), v))
                .collect();
            let names: Vec<String> = (0..got.len()).map(|i| format!("#{i}")).collect();
            let why = match reference.float64.filter(|_| dtype == DType::F32) {
                Some(float64) => {
                    // the f32 reference's figure is shown, float64's judged
                    let (a, mismatch) = judge_with(&got, reference.outputs, &names, f64::INFINITY);
                    r.agreement = a;
                    r.tolerance = None;
                    let (check, why) = judge_float64(&got, float64, &names);
                    r.float64 = check;
                    mismatch.or(why)
                }
                None => {
                    let (a, why) = judge_with(&got, reference.outputs, &names, tol);
                    r.agreement = a;
                    why
                }
            };
            if let Some(why) = why {
                r.status = RowStatus::Failed(why);
            } else {
                let rate = rate(n, &t);
                if dtype == DType::F32 && !st.graph {
                    fp32_eager = Some(rate);
                }
                r.images_per_s = Some(rate);
                r.speedup_vs_fp32_eager = fp32_eager.map(|f| rate / f);
                r.timing = Some(t);
            }
            rows.push(r);
        }
    }
    rows
}

/// A program's label (precision and layout), its steps by kind and whether those are what
/// planning chose on the device (else the steps as lowered, where no session was made).
pub(super) type ProgramSteps = (String, Vec<(String, usize)>, bool);

/// The label of the program of `dtype` and `layout` in the report's line.
pub(super) fn program_label(dtype: DType, layout: gpukit_tensor::Layout) -> String {
    format!("{} {}", dtype.name(), layout.name())
}

/// What runs the GPU rows, for the report: the engine, the opened device and each program's
/// steps by kind (one a precision and layout).
pub(super) fn describe(programs: Option<&[ProgramSteps]>, device: &str) -> String {
    let steps = programs
        .unwrap_or_default()
        .iter()
        .map(|(label, counts, planned)| {
            let counts = counts
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", ");
            match planned {
                true => format!("{label}: {counts}"),
                false => format!("{label} (as lowered, not planned): {counts}"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!("gpukit's general GPU engine on {device}; {steps}")
}

/// Opens the device the GPU rows run on, or why it could not.
pub(super) fn open(discovery: &Discovery, ordinal: usize) -> Result<GpuContext, String> {
    let ctx = GpuContext::open(discovery, ordinal).map_err(|e| e.to_string())?;
    // Gemm and MatMul nodes run on cuBLASLt, opened while the weights upload; where it is
    // missing, the first product that needs it says so
    let _ = ctx.blas.open_ahead();
    Ok(ctx)
}
