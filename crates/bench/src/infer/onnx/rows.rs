//! The CPU rows of `infer --onnx` at one batch size: ONNX Runtime (the reference, timed when
//! its row was asked for), gpukit's graph interpreter checked against it, and once the passes'
//! own check (the graph as imported against it as optimized).

use super::model::{peak_activation_bytes, Prepared};
use crate::accuracy::{agreement, verdict, Agreement};
use crate::infer::report::{rate, row, InferRow};
use crate::measure::{time_host, Plan};
use crate::random::{fresh_seed, normal_f32};
use crate::report::RowStatus;
use crate::workload::strategy::ORT_ROW;
use gpukit_models::graph::{forward_cpu, Array, Data};
use gpukit_models::ort_runner::OrtModel;
use serde::{Deserialize, Serialize};

/// The row of gpukit's graph interpreter.
pub const GRAPH_CPU_ROW: &str = "gpukit graph f32";
/// Largest max |gpukit - ONNX Runtime| / max |ONNX Runtime| a row may show and pass (f32 both).
pub const TOLERANCE: f64 = 1e-5;

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
        let mut optimized = None;
        let mut gpukit_rate = None;
        if self.cpu {
            progress(&format!("infer --onnx: {GRAPH_CPU_ROW} batch {n}"));
            let (r, outputs) = self.gpukit_row(n, p, &inputs, reference.as_ref());
            gpukit_rate = r.images_per_s;
            optimized = outputs;
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
    /// (a row that fails shows no speed); and those outputs.
    fn gpukit_row(
        &self,
        n: usize,
        p: &Prepared,
        inputs: &[Array],
        reference: Option<&Result<Outputs, String>>,
    ) -> (InferRow, Option<Outputs>) {
        let mut r = row(GRAPH_CPU_ROW, "cpu", n);
        let mut out = Vec::new();
        let timed = time_host(self.plan, || {
            out = forward_cpu(&p.optimized, inputs)?;
            Ok::<(), gpukit_models::Error>(())
        });
        let t = match timed {
            Ok(t) => t,
            Err(e) => {
                r.status = RowStatus::Failed(e.to_string());
                return (r, None);
            }
        };
        let got = as_f32(out);
        match reference {
            Some(Ok(want)) => {
                let (a, why) = judge(&got, want, self.outputs);
                r.agreement = a;
                r.compared_with = Some("ONNX Runtime CPU on the same input".into());
                r.tolerance = Some(TOLERANCE);
                if let Some(why) = why {
                    r.status = RowStatus::Failed(why);
                }
            }
            Some(Err(e)) => {
                r.compared_with = Some(format!("nothing: ONNX Runtime failed on this input ({e})"));
            }
            None => {}
        }
        if r.status == RowStatus::Ok {
            r.images_per_s = Some(rate(n, &t));
            r.speedup_vs_reference = Some(1.0);
            r.timing = Some(t);
        }
        (r, Some(got))
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

/// [`judge`] with another tolerance (a GPU precision's).
pub(super) fn judge_with(
    got: &[(Vec<usize>, Vec<f32>)],
    reference: &[(Vec<usize>, Vec<f32>)],
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
