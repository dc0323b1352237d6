//! The CPU rows of `infer --onnx` at one batch size: ONNX Runtime (the reference, timed when
//! its row was asked for), gpukit's graph interpreter checked against it, and once the passes'
//! own check (the graph as imported against it as optimized). Where fp32 GPU rows follow, the
//! float64 reference they are judged against.

use super::model::{float64_bytes, peak_activation_bytes, widest_f64_convolution_bytes, Prepared};
use crate::accuracy::{agreement, verdict, Agreement};
use crate::infer::report::{rate, row, Float64Check, InferRow};
use crate::measure::{time_host, Plan};
use crate::random::{fresh_seed, normal_f32};
use crate::report::RowStatus;
use crate::workload::strategy::ORT_ROW;
use gpukit_models::gpu::program::ExactSums;
use gpukit_models::graph::{
    exact_convolutions, forward_cpu, forward_cpu_exact, forward_cpu_f64, Array, Data,
};
use gpukit_models::ort_runner::OrtModel;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The row of gpukit's graph interpreter.
pub const GRAPH_CPU_ROW: &str = "gpukit graph f32";
/// Largest max |gpukit - ONNX Runtime| / max |ONNX Runtime| a row may show and pass (f32 both);
/// for fp32 GPU rows, the distance from float64 that passes whatever ONNX Runtime's own is.
pub const TOLERANCE: f64 = 1e-5;

/// The float64 reference of one batch size, as the report keeps it: the optimized graph run
/// entirely in f64 (`forward_cpu_f64`) on the input the GPU rows get, and how far ONNX
/// Runtime's f32 outputs are from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Float64Reference {
    pub batch: usize,
    /// ONNX Runtime's f32 outputs' max |diff| / max |float64| (the worst output's); None where
    /// ONNX Runtime gave no outputs.
    pub onnxruntime_max_rel: Option<f64>,
    /// Wall seconds of the float64 pass.
    pub seconds: Option<f64>,
    /// Why there is no float64 reference at this batch size: the fp32 rows are then judged
    /// against the f32 reference, as the other precisions are.
    pub unavailable: Option<String>,
}

/// The float64 outputs the fp32 rows of one batch size are judged against.
pub(super) struct Float64 {
    pub outputs: Vec<(Vec<usize>, Vec<f64>)>,
    /// ONNX Runtime's f32 outputs' distance from them ([`Float64Reference`]'s).
    pub onnxruntime_max_rel: Option<f64>,
}

/// The largest max rel. diff from float64 an fp32 row may show and pass: [`TOLERANCE`], or
/// ONNX Runtime f32's own distance from the same float64 outputs where that is larger (f32
/// itself cannot do better on such a model). Without ONNX Runtime's figure, [`TOLERANCE`].
pub fn float64_tolerance(onnxruntime_max_rel: Option<f64>) -> f64 {
    onnxruntime_max_rel
        .filter(|r| r.is_finite())
        .map_or(TOLERANCE, |r| r.max(TOLERANCE))
}

/// An fp32 row's outputs `got` against the float64 outputs: the check the row reports, and why
/// it fails (a shape that differs, a value not finite, or farther from float64 than
/// [`float64_tolerance`] allows, naming the row's and ONNX Runtime's distances).
pub(super) fn judge_float64(
    got: &[(Vec<usize>, Vec<f32>)],
    float64: &Float64,
    names: &[String],
) -> (Option<Float64Check>, Option<String>) {
    // shapes and finiteness; the distance is judged below
    let (worst, why) = judge_with(got, &float64.outputs, names, f64::INFINITY);
    let check = worst.map(|a| Float64Check {
        max_rel: a.max_rel,
        onnxruntime_max_rel: float64.onnxruntime_max_rel,
        tolerance: float64_tolerance(float64.onnxruntime_max_rel),
    });
    if why.is_some() {
        return (check, why);
    }
    let why = check
        .as_ref()
        .filter(|c| c.max_rel.is_nan() || c.max_rel > c.tolerance)
        .map(|c| {
            let ort = match c.onnxruntime_max_rel {
                Some(o) => format!(", and farther than ONNX Runtime's f32 ({o:.1e})"),
                None => " (no ONNX Runtime outputs to compare)".into(),
            };
            format!(
                "max rel. diff {:.1e} from float64: over {TOLERANCE:.0e}{ort}",
                c.max_rel
            )
        });
    (check, why)
}

/// The passes' own check: the imported graph against the optimized one, on one input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassesCheck {
    pub batch: usize,
    /// The worst output's.
    pub agreement: Option<Agreement>,
    pub tolerance: f64,
    pub status: RowStatus,
}

/// Outputs as shapes and f32 values.
pub(super) type Outputs = Vec<(Vec<usize>, Vec<f32>)>;

/// What every batch size's rows share.
pub(super) struct Bench<'a> {
    pub plan: Plan,
    /// The graph input's name (ONNX Runtime's input is named).
    pub input: &'a str,
    /// The graph outputs' names, in order.
    pub outputs: &'a [String],
    /// gpukit's row asked for.
    pub cpu: bool,
    /// ONNX Runtime's row asked for (it runs untimed as the reference otherwise).
    pub ort: bool,
    /// GPU rows follow: keep the input and a reference output (ONNX Runtime's, else the
    /// interpreter's, run untimed when its row was not asked for).
    pub keep_reference: bool,
    /// An f32 row is judged here (gpukit's CPU row, or fp32 GPU rows that follow): compute the
    /// float64 reference too.
    pub float64: bool,
}

/// What one batch size gave: its rows (gpukit's, then ONNX Runtime's) and, where asked, the
/// passes' check.
pub(super) struct AtBatch {
    pub rows: Vec<InferRow>,
    pub passes_check: Option<PassesCheck>,
    /// With [`Bench::keep_reference`]: the input, and the outputs the GPU rows are checked
    /// against with what they are.
    pub input: Vec<f32>,
    pub reference: Option<(Outputs, String)>,
    /// With [`Bench::float64`]: the float64 outputs on that input, and the report's account.
    pub float64: Option<Float64>,
    pub float64_reference: Option<Float64Reference>,
}

impl Bench<'_> {
    /// The rows at batch `n` of the graphs in `p`, on one fresh random input; the passes'
    /// check too when `check_passes`. Work that cannot fit in memory gives skipped rows.
    pub fn rows_at(
        &self,
        n: usize,
        p: &Prepared,
        ort: Option<&mut OrtModel>,
        check_passes: bool,
        progress: &mut dyn FnMut(&str),
    ) -> AtBatch {
        let mut at = AtBatch {
            rows: Vec::new(),
            passes_check: None,
            input: Vec::new(),
            reference: None,
            float64: None,
            float64_reference: None,
        };
        let names: Vec<&str> = [
            (self.cpu, GRAPH_CPU_ROW),
            (self.ort && ort.is_some(), ORT_ROW),
        ]
        .iter()
        .filter(|(wanted, _)| *wanted)
        .map(|(_, name)| *name)
        .collect();
        let shape = p
            .optimized
            .inputs
            .first()
            .and_then(|&id| p.optimized.values.get(id))
            .map(|v| v.shape.clone())
            .unwrap_or_default();
        let guard = gpukit_types::resources::Need::host(format!(
            "the graph interpreter at batch {n} of {}",
            self.input
        ))
        .with(
            "input and live activations",
            peak_activation_bytes(&p.optimized),
        )
        .with(
            "one convolution's f64 copies, where it sums in f64",
            match self.cpu {
                true => widest_f64_convolution_bytes(&p.optimized),
                false => Some(0),
            },
        )
        .with(
            "the graph as imported, for the passes' check",
            if check_passes {
                peak_activation_bytes(&p.imported)
            } else {
                Some(0)
            },
        )
        .check_host("lower --batch-sizes");
        if let Err(refused) = guard {
            for name in names {
                let mut r = row(name, "cpu", n);
                r.status = RowStatus::Skipped(refused.to_string());
                at.rows.push(r);
            }
            return at;
        }
        let x = normal_f32(shape.iter().product(), fresh_seed());
        let inputs = [Array::f32(&shape, x)];
        let x = inputs[0].as_f32().unwrap_or_default();

        let (reference, ort_row) = match ort {
            Some(m) => {
                progress(&format!("infer --onnx: onnxruntime batch {n}"));
                self.reference(m, n, &shape, x)
            }
            None => (None, None),
        };
        if self.float64 {
            progress(&format!("infer --onnx: the float64 reference, batch {n}"));
            let ort = match &reference {
                Some(Ok(r)) => Some(r),
                _ => None,
            };
            let (outputs, account) = float64_reference(p, &inputs, ort, self.outputs, n);
            at.float64 = outputs;
            at.float64_reference = Some(account);
        }
        let mut optimized = None;
        let mut gpukit_rate = None;
        // the passes' check compares the two graphs in plain f32: the row's outputs serve it
        // only where no convolution summed in f64
        let mut plain = true;
        if self.cpu {
            progress(&format!("infer --onnx: {GRAPH_CPU_ROW} batch {n}"));
            let (r, outputs, f64_sums) =
                self.gpukit_row(n, p, &inputs, reference.as_ref(), at.float64.as_ref());
            gpukit_rate = r.images_per_s;
            optimized = outputs;
            plain = !f64_sums;
            at.rows.push(r);
        }
        if let Some(mut r) = ort_row {
            r.speedup_vs_reference = match (r.images_per_s, gpukit_rate) {
                (Some(o), Some(g)) => Some(o / g),
                _ => None,
            };
            at.rows.push(r);
        }
        if self.keep_reference {
            at.input = x.to_vec();
            at.reference = match (&reference, &optimized) {
                (Some(Ok(r)), _) => Some((r.clone(), "ONNX Runtime CPU on the same input".into())),
                (_, Some(o)) => Some((
                    o.clone(),
                    format!("{GRAPH_CPU_ROW} (CPU) on the same input"),
                )),
                _ => {
                    progress(&format!("infer --onnx: the reference outputs, batch {n}"));
                    forward_cpu(&p.optimized, &inputs).ok().map(|o| {
                        (
                            as_f32(o),
                            format!("{GRAPH_CPU_ROW} (CPU) on the same input"),
                        )
                    })
                }
            };
        }
        if check_passes {
            progress(&format!(
                "infer --onnx: the graph as imported, batch {n} (the passes' check)"
            ));
            let optimized = optimized.filter(|_| plain);
            at.passes_check = Some(passes_check(p, &inputs, optimized, self.outputs, n));
        }
        at
    }

    /// ONNX Runtime's outputs on `x` (or why it failed), timed as its row when that was asked
    /// for.
    fn reference(
        &self,
        m: &mut OrtModel,
        n: usize,
        shape: &[usize],
        x: &[f32],
    ) -> (Option<Result<Outputs, String>>, Option<InferRow>) {
        let mut out = Vec::new();
        let mut once = || -> Result<(), gpukit_models::Error> {
            out = m.run_named(self.input, shape, x, self.outputs)?;
            Ok(())
        };
        if !self.ort {
            let reference = once().map_err(|e| e.to_string());
            return (Some(reference.map(|()| out)), None);
        }
        let mut r = row(ORT_ROW, "cpu", n);
        let timed = time_host(self.plan, &mut once);
        let reference = match timed {
            Ok(t) => {
                r.images_per_s = Some(rate(n, &t));
                r.timing = Some(t);
                Ok(out)
            }
            Err(e) => {
                r.status = RowStatus::Failed(e.to_string());
                Err(e.to_string())
            }
        };
        (Some(reference), Some(r))
    }

    /// gpukit's row: the optimized graph timed, its last outputs judged against `reference`
    /// (a row that fails shows no speed); those outputs, and whether any convolution summed
    /// in f64.
    fn gpukit_row(
        &self,
        n: usize,
        p: &Prepared,
        inputs: &[Array],
        reference: Option<&Result<Outputs, String>>,
        float64: Option<&Float64>,
    ) -> (InferRow, Option<Outputs>, bool) {
        let mut r = row(GRAPH_CPU_ROW, "cpu", n);
        // the convolutions that sum in f64, chosen by the accuracy budget (as the GPU engine's
        // f32 programs do): none on most models, ResNet-50's earliest; GPUKIT_EXACT_SUMS=off:
        // none
        let off = ExactSums::from_env() == ExactSums::Off;
        let chosen = match off {
            true => Ok((vec![false; p.optimized.nodes.len()], 0.0, 0)),
            false => exact_convolutions(&p.optimized),
        };
        let exact = match chosen {
            Ok((flags, _, _)) => flags,
            Err(e) => {
                r.status = RowStatus::Failed(format!("choosing the f64 sums: {e}"));
                return (r, None, false);
            }
        };
        let f64_sums = exact.contains(&true);
        let mut out = Vec::new();
        let timed = time_host(self.plan, || {
            out = forward_cpu_exact(&p.optimized, inputs, &exact)?;
            Ok::<(), gpukit_models::Error>(())
        });
        let t = match timed {
            Ok(t) => t,
            Err(e) => {
                r.status = RowStatus::Failed(e.to_string());
                return (r, None, f64_sums);
            }
        };
        let got = as_f32(out);
        match (reference, float64) {
            // judged as the fp32 GPU rows are: against float64, ONNX Runtime's figure shown
            (reference, Some(f)) => {
                let mut mismatch = None;
                match reference {
                    Some(Ok(want)) => {
                        let (a, m) = judge_with(&got, want, self.outputs, f64::INFINITY);
                        r.agreement = a;
                        mismatch = m;
                        r.compared_with = Some("ONNX Runtime CPU on the same input".into());
                    }
                    Some(Err(e)) => {
                        r.compared_with = Some(format!("float64 only: ONNX Runtime failed ({e})"));
                    }
                    None => r.compared_with = Some("float64 only".into()),
                }
                let (check, why) = judge_float64(&got, f, self.outputs);
                r.float64 = check;
                if let Some(why) = mismatch.or(why) {
                    r.status = RowStatus::Failed(why);
                }
            }
            (Some(Ok(want)), None) => {
                let (a, why) = judge(&got, want, self.outputs);
                r.agreement = a;
                r.compared_with = Some("ONNX Runtime CPU on the same input".into());
                r.tolerance = Some(TOLERANCE);
                if let Some(why) = why {
                    r.status = RowStatus::Failed(why);
                }
            }
            (Some(Err(e)), None) => {
                r.compared_with = Some(format!("nothing: ONNX Runtime failed on this input ({e})"));
            }
            (None, None) => {}
        }
        if r.status == RowStatus::Ok {
            r.images_per_s = Some(rate(n, &t));
            r.speedup_vs_reference = Some(1.0);
            r.timing = Some(t);
        }
        (r, Some(got), f64_sums)
    }
}

/// Each output as f32 (int64 outputs converted, as ONNX Runtime's are).
pub(super) fn as_f32(outputs: Vec<Array>) -> Outputs {
    outputs
        .into_iter()
        .map(|a| {
            let values = match a.data {
                Data::F32(v) => v,
                Data::I64(v) => v.into_iter().map(|i| i as f32).collect(),
            };
            (a.shape, values)
        })
        .collect()
}

/// The float64 outputs of the optimized graph on `inputs` (at batch `n`), and how far ONNX
/// Runtime's outputs `ort` are from them; None, and why, where they cannot be computed.
fn float64_reference(
    p: &Prepared,
    inputs: &[Array],
    ort: Option<&Outputs>,
    names: &[String],
    n: usize,
) -> (Option<Float64>, Float64Reference) {
    let mut account = Float64Reference {
        batch: n,
        onnxruntime_max_rel: None,
        seconds: None,
        unavailable: None,
    };
    let guard = gpukit_types::resources::Need::host(format!("the float64 reference at batch {n}"))
        .with(
            "activations and weights in f64",
            float64_bytes(&p.optimized),
        )
        .check_host("lower --batch-sizes");
    if let Err(refused) = guard {
        account.unavailable = Some(refused.to_string());
        return (None, account);
    }
    let start = Instant::now();
    let outputs: Vec<(Vec<usize>, Vec<f64>)> = match forward_cpu_f64(&p.optimized, inputs) {
        Ok(o) => o.into_iter().map(|a| (a.shape, a.data)).collect(),
        Err(e) => {
            account.unavailable = Some(e.to_string());
            return (None, account);
        }
    };
    account.seconds = Some(start.elapsed().as_secs_f64());
    // ONNX Runtime's figure counts only where its outputs are comparable at all
    account.onnxruntime_max_rel =
        ort.and_then(|o| match judge_with(o, &outputs, names, f64::INFINITY) {
            (Some(a), None) => Some(a.max_rel),
            _ => None,
        });
    let float64 = Float64 {
        outputs,
        onnxruntime_max_rel: account.onnxruntime_max_rel,
    };
    (Some(float64), account)
}

/// `got` against `reference`, output by output: the worst agreement, and why it fails (a
/// shape that differs, a value not finite, or a difference over [`TOLERANCE`]), naming the
/// output.
pub(super) fn judge(
    got: &[(Vec<usize>, Vec<f32>)],
    reference: &[(Vec<usize>, Vec<f32>)],
    names: &[String],
) -> (Option<Agreement>, Option<String>) {
    judge_with(got, reference, names, TOLERANCE)
}

/// [`judge`] with another tolerance (a GPU precision's), against f32 or float64 outputs.
pub(super) fn judge_with<R: Copy + Into<f64>>(
    got: &[(Vec<usize>, Vec<f32>)],
    reference: &[(Vec<usize>, Vec<R>)],
    names: &[String],
    tolerance: f64,
) -> (Option<Agreement>, Option<String>) {
    if got.len() != reference.len() {
        return (
            None,
            Some(format!(
                "{} outputs against the reference's {}",
                got.len(),
                reference.len()
            )),
        );
    }
    let mut worst: Option<Agreement> = None;
    for (i, ((gs, g), (rs, r))) in got.iter().zip(reference).enumerate() {
        let name = names.get(i).map_or("?", String::as_str);
        if gs != rs || g.len() != r.len() {
            return (
                worst,
                Some(format!(
                    "output {name} has shape {gs:?}, the reference's is {rs:?}"
                )),
            );
        }
        // one "sample" per batch item for the top-1 figure
        let per_item = gs.iter().skip(1).product::<usize>().max(1);
        let a = agreement(g, r, per_item);
        if let Some(why) = verdict(g, &a, tolerance) {
            return (Some(a), Some(format!("output {name}: {why}")));
        }
        if worst.as_ref().is_none_or(|w| a.max_rel > w.max_rel) {
            worst = Some(a);
        }
    }
    (worst, None)
}

/// The imported graph against the optimized one on `inputs` (the optimized outputs run again
/// where gpukit's row did not give them).
fn passes_check(
    p: &Prepared,
    inputs: &[Array],
    optimized: Option<Outputs>,
    names: &[String],
    n: usize,
) -> PassesCheck {
    let mut check = PassesCheck {
        batch: n,
        agreement: None,
        tolerance: TOLERANCE,
        status: RowStatus::Ok,
    };
    let optimized = match optimized {
        Some(o) => Ok(o),
        None => forward_cpu(&p.optimized, inputs).map(as_f32),
    };
    let imported = forward_cpu(&p.imported, inputs).map(as_f32);
    match (imported, optimized) {
        (Ok(before), Ok(after)) => {
            let (a, why) = judge(&after, &before, names);
            check.agreement = a;
            if let Some(why) = why {
                check.status = RowStatus::Failed(format!("optimized against imported: {why}"));
            }
        }
        (Err(e), _) | (_, Err(e)) => check.status = RowStatus::Failed(e.to_string()),
    }
    check
}
