//! Each GPU's verdict from what its tests found and what NVML saw: pass, or fail with every
//! reason. No GPU is needed here: the rules are tested on reports built by hand.
//!
//! A GPU fails on: a wrong result (a repeat that differs from the first product, a product off
//! its float64 reference, a memory word off its pattern, a copy that did not arrive intact); a
//! test that could not run; new uncorrected ECC errors or a failed row remapping; a critical XID;
//! a matmul rate below `of_best` of the best GPU of the same model in the machine, or below
//! `peak_floor` of the datasheet's peak; heat (NVML's sw_thermal or hw_thermal throttle reasons
//! seen). The power cap (sw_power_cap) is reported, never a failure: holding it is the point of
//! a long run.

use super::{GpuStress, MultiGpu};
use crate::ceilings::PeakSource;
use gpukit_tensor::DType;
use serde::{Deserialize, Serialize};

/// The thresholds of the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rules {
    /// A GPU's matmul rate must be at least this share of the best GPU of the same model.
    pub of_best: f64,
    /// ...and at least this share of the datasheet's dense peak, where gpukit knows it.
    pub peak_floor: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            of_best: 0.9,
            peak_floor: 0.6,
        }
    }
}

/// Why a GPU failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum FailReason {
    /// Results that should be identical or exact were not: `wrong` of `checked` units.
    WrongResult {
        test: String,
        wrong: u64,
        checked: u64,
        unit: String,
    },
    /// A product's sampled entries were off the float64 reference.
    OffReference {
        test: String,
        rel_err: f64,
        tolerance: f64,
    },
    /// A test could not run or stopped with an error.
    TestError { test: String, error: String },
    /// Uncorrected ECC errors counted during the run.
    EccErrors { uncorrected: u64 },
    /// NVML reports a row remapping that failed.
    RowRemapFailed,
    /// Critical XID events during the run (the XID number where NVML gave it).
    Xid { xids: Vec<Option<u64>> },
    /// Below `of_best` of the best GPU of the same model.
    BelowBest {
        dtype: DType,
        tflops: f64,
        best_tflops: f64,
        best_gpu: usize,
        of_best: f64,
    },
    /// Below `floor` of the datasheet's peak.
    BelowPeak {
        dtype: DType,
        tflops: f64,
        peak_tflops: f64,
        floor: f64,
    },
    /// Clocks held down for heat.
    Thermal { reasons: Vec<String> },
}

impl FailReason {
    /// One line, as the table and the failure message show it.
    pub fn describe(&self) -> String {
        match self {
            FailReason::WrongResult {
                test,
                wrong,
                checked,
                unit,
            } => format!("wrong result in {test}: {wrong} of {checked} {unit} differ"),
            FailReason::OffReference {
                test,
                rel_err,
                tolerance,
            } => format!(
                "wrong result in {test}: relative error {rel_err:.2e} against the float64 \
                 reference, over the tolerance {tolerance:.0e}"
            ),
            FailReason::TestError { test, error } => format!("{test} did not complete: {error}"),
            FailReason::EccErrors { uncorrected } => {
                format!("{uncorrected} uncorrected ECC error(s) during the run")
            }
            FailReason::RowRemapFailed => "a memory row remapping failed (NVML)".to_string(),
            FailReason::Xid { xids } => format!(
                "critical XID event(s) during the run: {}",
                xids.iter()
                    .map(|x| x.map_or("unknown".to_string(), |x| x.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            FailReason::BelowBest {
                dtype,
                tflops,
                best_tflops,
                best_gpu,
                of_best,
            } => format!(
                "{dtype} matmul at {tflops:.1} TFLOP/s is below {:.0}% of the best GPU of this \
                 model (cuda:{best_gpu}, {best_tflops:.1})",
                100.0 * of_best
            ),
            FailReason::BelowPeak {
                dtype,
                tflops,
                peak_tflops,
                floor,
            } => format!(
                "{dtype} matmul at {tflops:.1} TFLOP/s is below {:.0}% of the datasheet's \
                 {peak_tflops:.1}",
                100.0 * floor
            ),
            FailReason::Thermal { reasons } => {
                format!("clocks held down for heat ({})", reasons.join(", "))
            }
        }
    }
}

/// A GPU's verdict, with what was seen that does not fail it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Pass {
        warnings: Vec<String>,
    },
    Fail {
        reasons: Vec<FailReason>,
        warnings: Vec<String>,
    },
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict::Pass {
            warnings: Vec::new(),
        }
    }
}

impl Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass { .. })
    }

    pub fn warnings(&self) -> &[String] {
        match self {
            Verdict::Pass { warnings } | Verdict::Fail { warnings, .. } => warnings,
        }
    }

    pub fn reasons(&self) -> &[FailReason] {
        match self {
            Verdict::Pass { .. } => &[],
            Verdict::Fail { reasons, .. } => reasons,
        }
    }
}

/// Throttle reasons that fail a GPU (heat).
const THERMAL: [&str; 2] = ["sw_thermal", "hw_thermal"];
/// Throttle reasons reported as warnings: a hardware slowdown or power brake can come from the
/// board or the system's power supply as well as the GPU.
const HARDWARE: [&str; 2] = ["hw_slowdown", "hw_power_brake"];

/// Judges every GPU, in place: the rate rules compare GPUs of the same model; a test between
/// GPUs that went wrong counts against every GPU it involved.
pub fn judge(gpus: &mut [GpuStress], multi: Option<&MultiGpu>, rules: &Rules) {
    let verdicts: Vec<Verdict> = gpus
        .iter()
        .map(|g| judge_one(g, gpus, multi, rules))
        .collect();
    for (g, v) in gpus.iter_mut().zip(verdicts) {
        g.verdict = v;
    }
}

/// What the tests between GPUs say of GPU `ordinal`.
fn between_gpus(
    ordinal: usize,
    m: &MultiGpu,
    reasons: &mut Vec<FailReason>,
    warnings: &mut Vec<String>,
) {
    for c in m
        .peer_copies
        .iter()
        .filter(|c| c.from == ordinal || c.to == ordinal)
    {
        let test = format!("peer copy cuda:{} -> cuda:{}", c.from, c.to);
        if let Some(e) = &c.error {
            reasons.push(FailReason::TestError {
                test,
                error: e.clone(),
            });
        } else if !c.verified {
            reasons.push(FailReason::WrongResult {
                test,
                wrong: c.bytes_wrong.max(1),
                checked: c.bytes,
                unit: "bytes".into(),
            });
        } else if !c.peer_access && c.from == ordinal {
            warnings.push(format!(
                "no peer access cuda:{} -> cuda:{}: the copy went through the host",
                c.from, c.to
            ));
        }
    }
    let Some(r) = &m.all_reduce else { return };
    let Some(i) = r.gpus.iter().position(|&g| g == ordinal) else {
        return;
    };
    if let Some(e) = &r.error {
        reasons.push(FailReason::TestError {
            test: "NCCL all-reduce".into(),
            error: e.clone(),
        });
    }
    if let Some(&wrong) = r.wrong.get(i).filter(|w| **w > 0) {
        reasons.push(FailReason::WrongResult {
            test: "NCCL all-reduce".into(),
            wrong,
            checked: r.count * r.rounds,
            unit: "elements".into(),
        });
    }
}

fn judge_one(g: &GpuStress, all: &[GpuStress], multi: Option<&MultiGpu>, rules: &Rules) -> Verdict {
    let mut reasons = Vec::new();
    let mut warnings = Vec::new();
    if let Some(m) = multi {
        between_gpus(g.ordinal, m, &mut reasons, &mut warnings);
    }
    for e in &g.errors {
        reasons.push(FailReason::TestError {
            test: "the GPU".into(),
            error: e.clone(),
        });
    }
    let mut ran_anything = false;
    for m in &g.matmul {
        let dtype = m.dtype.map_or("?".to_string(), |d| d.to_string());
        let test = format!("matmul {dtype}");
        if let Some(e) = &m.error {
            reasons.push(FailReason::TestError {
                test: test.clone(),
                error: e.clone(),
            });
        }
        if m.products > 0 {
            ran_anything = true;
        }
        for v in [&m.reference_first, &m.reference_last]
            .into_iter()
            .flatten()
        {
            if !v.passed {
                reasons.push(FailReason::OffReference {
                    test: test.clone(),
                    rel_err: v.rel_err,
                    tolerance: v.tolerance,
                });
            }
        }
        if m.repeat_words_differing > 0 {
            reasons.push(FailReason::WrongResult {
                test: format!("{test} (repeats against the first product)"),
                wrong: m.repeat_words_differing,
                checked: m.words_per_result * m.products.saturating_sub(1),
                unit: "words".into(),
            });
        }
    }
    if let Some(mem) = &g.memory {
        if let Some(e) = &mem.error {
            reasons.push(FailReason::TestError {
                test: "memory".into(),
                error: e.clone(),
            });
        }
        if !mem.passes.is_empty() {
            ran_anything = true;
        }
        if mem.words_wrong() > 0 {
            reasons.push(FailReason::WrongResult {
                test: "memory".into(),
                wrong: mem.words_wrong(),
                checked: mem.checked_bytes() / 4,
                unit: "words".into(),
            });
        }
    }
    for c in &g.copies {
        let test = format!("copy {}", c.direction);
        if let Some(e) = &c.error {
            reasons.push(FailReason::TestError {
                test: test.clone(),
                error: e.clone(),
            });
        } else if !c.verified {
            reasons.push(FailReason::WrongResult {
                test,
                wrong: c.bytes_wrong.max(1),
                checked: c.bytes,
                unit: "bytes".into(),
            });
        }
    }
    if !ran_anything && reasons.is_empty() {
        reasons.push(FailReason::TestError {
            test: "stress".into(),
            error: "no test ran".into(),
        });
    }
    health(g, &mut reasons, &mut warnings);
    let w = &g.watched;
    if !w.xid_events.is_empty() {
        reasons.push(FailReason::Xid {
            xids: w.xid_events.clone(),
        });
    }
    let seen = |names: &[&str]| -> Vec<String> {
        w.throttle_seen
            .iter()
            .filter(|t| names.contains(&t.name.as_str()))
            .map(|t| t.name.clone())
            .collect()
    };
    let thermal = seen(&THERMAL);
    if !thermal.is_empty() {
        reasons.push(FailReason::Thermal { reasons: thermal });
    }
    let hardware = seen(&HARDWARE);
    if !hardware.is_empty() {
        warnings.push(format!(
            "hardware clock slowdown seen ({}): check the board's power supply and cooling",
            hardware.join(", ")
        ));
    }
    rates(g, all, rules, &mut reasons);
    for m in &g.matmul {
        if m.products == 0 && m.error.is_none() {
            if let Some(d) = m.dtype {
                warnings.push(format!("{d} matmul not run"));
            }
        }
    }
    if reasons.is_empty() {
        Verdict::Pass { warnings }
    } else {
        Verdict::Fail { reasons, warnings }
    }
}

/// ECC counts and remapped rows, from NVML's counters before and after the run.
fn health(g: &GpuStress, reasons: &mut Vec<FailReason>, warnings: &mut Vec<String>) {
    let (Some(before), Some(after)) = (&g.health_before, &g.health_after) else {
        return;
    };
    let grew = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    if let Some(n) = grew(
        before.ecc_volatile_uncorrected,
        after.ecc_volatile_uncorrected,
    ) {
        reasons.push(FailReason::EccErrors { uncorrected: n });
    }
    if let Some(n) = grew(before.ecc_volatile_corrected, after.ecc_volatile_corrected) {
        warnings.push(format!("{n} corrected ECC error(s) during the run"));
    }
    if after.remapped_rows_failed == Some(true) {
        reasons.push(FailReason::RowRemapFailed);
    }
    if after.remapped_rows_pending == Some(true) {
        warnings.push("a row remapping is pending: reset the GPU to apply it".into());
    }
    if after.retired_pages_pending == Some(true) {
        warnings.push("a page retirement is pending: reload the driver to apply it".into());
    }
}

/// The rate rules: the best GPU of the same model, and the datasheet's floor.
fn rates(g: &GpuStress, all: &[GpuStress], rules: &Rules, reasons: &mut Vec<FailReason>) {
    for m in &g.matmul {
        let (Some(dtype), Some(tflops)) = (m.dtype, m.tflops) else {
            continue;
        };
        let best = all
            .iter()
            .filter(|o| o.name == g.name)
            .filter_map(|o| o.tflops(dtype).map(|t| (t, o.ordinal)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((best_tflops, best_gpu)) = best {
            if tflops < rules.of_best * best_tflops {
                reasons.push(FailReason::BelowBest {
                    dtype,
                    tflops,
                    best_tflops,
                    best_gpu,
                    of_best: rules.of_best,
                });
            }
        }
        // fp8 is held to the best GPU of its model only, not yet to a share of its datasheet
        // peak: no sustained fp8 rate of a healthy GPU has been measured to set a floor by
        // (bf16's floor already judges the same tensor cores)
        let datasheet = g
            .peaks
            .as_ref()
            .filter(|_| dtype != DType::F8E4M3)
            .filter(|p| matches!(p.source, PeakSource::Datasheet { .. }))
            .and_then(|p| p.for_dtype(dtype.name()));
        if let Some(peak) = datasheet {
            if tflops < rules.peak_floor * peak {
                reasons.push(FailReason::BelowPeak {
                    dtype,
                    tflops,
                    peak_tflops: peak,
                    floor: rules.peak_floor,
                });
            }
        }
    }
}
