//! The GPU rows of `gpukit infer`: every (dtype, layout) uploaded once, every batch size
//! prepared once per pair, each strategy timed (eager, then replayed as a CUDA graph) and its
//! logits checked, the fp32 NCHW eager logits first as the batch's reference (checked against
//! gpukit's CPU forward); and the one-at-a-time rows.

use super::report::{one_at_a_time_reps, rate, row, InferRow};
use crate::accuracy::{agreement, tolerance, verdict};
use crate::measure::{time_device, warm_device, Plan};
use crate::power::{PowerMeter, STRETCH_MS};
use crate::random::uniform_f32;
use crate::report::RowStatus;
use crate::workload::strategy::{InferStrategy, CPU_CHECK_IMAGES, GPU_WARM, GPU_WARM_PASSES};
use gpukit_models::forward::FoldedResNet;
use gpukit_models::gpu::{GpuContext, GpuWeights, Session, Strategy};
use gpukit_models::Error as EngineError;
use gpukit_tensor::{DType, Layout, Tensor};
use std::collections::BTreeMap;

/// Whether an engine error is the device running out of memory (a limit, not a bug).
pub(super) fn is_oom(e: &EngineError) -> bool {
    e.is_out_of_memory()
}

/// Out of memory skips a row (with the numbers); anything else fails it.
pub(super) fn engine_status(what: &str, e: &EngineError) -> RowStatus {
    if is_oom(e) {
        RowStatus::Skipped(format!("{what}: {e}"))
    } else {
        RowStatus::Failed(format!("{what}: {e}"))
    }
}

/// Whether the GPU has the arithmetic for `p` (unknown capability: assume it does).
fn supported(cc: Option<(u32, u32)>, d: DType) -> std::result::Result<(), String> {
    match cc.and_then(|cc| crate::gpu::gpu_lacks(cc, d)) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// The (dtype, layout) whose eager logits are the GPU reference.
const REFERENCE_PAIR: (DType, Layout) = (DType::F32, Layout::Nchw);

/// What a GPU strategy's logits are checked against at one batch size.
struct Reference {
    logits: Vec<f32>,
    /// How many images (the first of the batch) `logits` covers.
    images: usize,
    /// Shown in each row's `compared_with`.
    label: String,
}

/// The reference at one batch size: ready, or the status the rows that needed it get.
enum RefState {
    Ready(Reference),
    /// Skipped (it did not fit, or the fp32 rows already carry the failure) or Failed (the
    /// fp32 engine is wrong and no fp32 row says so).
    Unavailable(RowStatus),
}

/// The status of rows whose reference could not be made: a limit (out of memory) skips them;
/// an error fails them unless the fp32 rows (`fp32_rows`) already carry it.
pub(super) fn dependent_status(why: String, limit: bool, fp32_rows: bool) -> RowStatus {
    let why = format!("not verifiable: {why}");
    if limit || fp32_rows {
        RowStatus::Skipped(why)
    } else {
        RowStatus::Failed(why)
    }
}

/// The (precision, layout) pairs to upload, the reference's first, then in the order the
/// strategies name them.
pub(super) fn pairs(strategies: &[Strategy]) -> Vec<(DType, Layout)> {
    let mut v = vec![REFERENCE_PAIR];
    for s in strategies {
        if !v.contains(&(s.dtype, s.layout)) {
            v.push((s.dtype, s.layout));
        }
    }
    v
}

/// `fp16 NHWC`: how progress lines and messages name a (dtype, layout) pair.
fn pair_name(dtype: DType, layout: Layout) -> String {
    format!(
        "{} {}",
        dtype.precision_name(),
        layout.name().to_ascii_uppercase()
    )
}

/// `n` RGB images of `s x s` from `x` (its first `n` images) as a CPU tensor.
fn images(x: &[f32], n: usize, s: usize) -> gpukit_tensor::Result<Tensor> {
    Tensor::from_f32(&[n, 3, s, s], x[..n * 3 * s * s].to_vec())
}

/// The logits of a tensor as values (an error where they cannot be read).
fn values(logits: gpukit_models::Result<Tensor>) -> gpukit_models::Result<Vec<f32>> {
    Ok(logits?.to_vec_f32()?)
}

/// The batch-1 Session the one-at-a-time rows of one (precision, layout) share across batch
/// sizes, or why it could not be made; and its CUDA graph's capture, once tried.
struct Single<'w> {
    session: Result<Session<'w>, RowStatus>,
    graph: Option<Result<(), String>>,
}

/// What one-at-a-time rows at one batch size are checked and compared against.
struct Checks<'c> {
    /// Per batched strategy that passed: its logits of the batch's first image.
    firsts: &'c [(Strategy, Vec<f32>)],
    /// The batch's reference, for strategies without a passing batched row.
    reference: &'c RefState,
    /// The batched rows of the same (precision, layout) at this batch size.
    batched: &'c [InferRow],
    /// The fp32 eager GPU rate at this batch size.
    fp32_eager: Option<f64>,
}

/// One GPU's part of the report.
pub(super) struct GpuRun<'a> {
    pub ctx: &'a GpuContext,
    pub folded: &'a FoldedResNet,
    /// `cuda:N`.
    pub device: String,
    pub image: usize,
    pub plan: Plan,
    /// gpukit's f32 CPU rate per batch size, where that row ran.
    pub cpu_rates: BTreeMap<usize, f64>,
    pub compute_capability: Option<(u32, u32)>,
    /// Samples the GPU's power while rows are timed (None without NVML).
    pub meter: Option<PowerMeter>,
    /// How each session was planned, in order.
    pub planning: std::cell::RefCell<Vec<super::report::Planning>>,
    /// How far each precision may be from the fp32 reference (`InferOptions::tolerance`).
    pub tolerance: fn(DType) -> f64,
}

impl GpuRun<'_> {
    fn row(&self, s: &Strategy, n: usize, status: RowStatus) -> InferRow {
        let mut r = row(&s.name(), &self.device, n);
        r.status = status;
        r
    }

    /// Every strategy at every batch size, and each of `singles` one image at a time at every
    /// batch size over 1. The reference pair runs first, at every batch size, so each other
    /// strategy finds its batch's reference ready.
    pub fn rows(
        &self,
        strategies: &[Strategy],
        singles: &[Strategy],
        batches: &[(usize, u64)],
        progress: &mut dyn FnMut(&str),
    ) -> Vec<InferRow> {
        let mut rows = Vec::new();
        let mut refs: Vec<RefState> = batches
            .iter()
            .map(|_| {
                RefState::Unavailable(RowStatus::Skipped("the fp32 reference did not run".into()))
            })
            .collect();
        let mut fp32_eager: Vec<Option<f64>> = vec![None; batches.len()];
        let all: Vec<Strategy> = strategies.iter().chain(singles).copied().collect();
        for (dtype, layout) in pairs(&all) {
            // eager before graph: the graph is captured once, after the eager rows are timed
            let of_pair = |list: &[Strategy]| -> Vec<Strategy> {
                let mut v: Vec<Strategy> = list
                    .iter()
                    .copied()
                    .filter(|s| (s.dtype, s.layout) == (dtype, layout))
                    .collect();
                v.sort_by_key(|s| s.graph);
                v
            };
            let here = of_pair(strategies);
            let here_single = of_pair(singles);
            let is_ref = (dtype, layout) == REFERENCE_PAIR;
            // the rows of this pair at one batch size, all with one status
            let all_rows = |n: usize, status: &RowStatus| -> Vec<InferRow> {
                let mut v: Vec<InferRow> = here
                    .iter()
                    .map(|s| self.row(s, n, status.clone()))
                    .collect();
                if n > 1 {
                    v.extend(here_single.iter().map(|s| {
                        let mut r = row(&InferStrategy::OneAtATime(*s).name(), &self.device, n);
                        r.status = status.clone();
                        r
                    }));
                }
                v
            };
            // tf32 and bf16 need Ampere or newer: a limit of the GPU, not an error
            if let Err(why) = supported(self.compute_capability, dtype) {
                for &(n, _) in batches {
                    rows.extend(all_rows(n, &RowStatus::Skipped(why.clone())));
                }
                continue;
            }
            progress(&format!(
                "infer {}: uploading {} weights",
                self.device,
                pair_name(dtype, layout)
            ));
            let weights = match GpuWeights::upload(self.ctx, self.folded, dtype, layout) {
                Ok(w) => w,
                Err(e) => {
                    let what = format!("uploading the {} weights", pair_name(dtype, layout));
                    for (bi, &(n, _)) in batches.iter().enumerate() {
                        if is_ref {
                            refs[bi] = RefState::Unavailable(dependent_status(
                                format!("no GPU fp32 reference: {what}: {e}"),
                                is_oom(&e),
                                !here.is_empty(),
                            ));
                        }
                        rows.extend(all_rows(n, &engine_status(&what, &e)));
                    }
                    continue;
                }
            };
            // the one-at-a-time rows' batch-1 Session, made at the first batch size over 1
            let mut single: Option<Single<'_>> = None;
            for (bi, &(n, seed)) in batches.iter().enumerate() {
                let x = uniform_f32(n * 3 * self.image * self.image, seed);
                let mut firsts = Vec::new();
                // a pair asked for only one image at a time needs no Session at batch n
                let batched = if here.is_empty() && !is_ref {
                    Vec::new()
                } else {
                    self.at_batch(
                        &weights,
                        &here,
                        is_ref,
                        n,
                        &x,
                        &mut refs[bi],
                        &mut fp32_eager[bi],
                        &mut firsts,
                        progress,
                    )
                };
                if n > 1 && !here_single.is_empty() {
                    let single = single.get_or_insert_with(|| {
                        progress(&format!(
                            "infer {} {} batch 1 (one image at a time): planning",
                            self.device,
                            pair_name(dtype, layout)
                        ));
                        Single {
                            session: Session::new(
                                self.ctx, &weights, 1, self.image, self.image, true,
                            )
                            .map_err(|e| engine_status("preparing batch 1", &e)),
                            graph: None,
                        }
                    });
                    let image = images(&x, 1, self.image);
                    let singles_rows = self.one_at_a_time(
                        single,
                        &here_single,
                        n,
                        image.as_ref(),
                        Checks {
                            firsts: &firsts,
                            reference: &refs[bi],
                            batched: &batched,
                            fp32_eager: fp32_eager[bi],
                        },
                        progress,
                    );
                    rows.extend(batched);
                    rows.extend(singles_rows);
                } else {
                    rows.extend(batched);
                }
            }
        }
        rows
    }

    /// The one-at-a-time rows of one (precision, layout) at batch `n` (over 1): `n` batch-1
    /// passes back to back (eager calls, or replays of the captured graph), timed together with
    /// CUDA events. Every pass runs on the batch's first image, uploaded once before the timed
    /// passes and resident on the GPU: the time is the engine's alone, no per-image upload.
    /// The last pass's logits are checked against the same strategy's batched logits of that
    /// image, or the batch's reference where the batched row did not pass.
    fn one_at_a_time(
        &self,
        single: &mut Single<'_>,
        strategies: &[Strategy],
        n: usize,
        image: Result<&Tensor, &gpukit_tensor::Error>,
        checks: Checks<'_>,
        progress: &mut dyn FnMut(&str),
    ) -> Vec<InferRow> {
        let classes = self.folded.num_classes;
        let mut rows = Vec::new();
        for &st in strategies {
            let name = InferStrategy::OneAtATime(st).name();
            let mut r = row(&name, &self.device, n);
            let tol = (self.tolerance)(st.dtype);
            r.tolerance = Some(tol);
            let resident = "every timed pass runs on that one image, resident on the GPU";
            let (expected, label) = match checks.firsts.iter().find(|(s, _)| *s == st) {
                Some((_, l)) => (
                    l.as_slice(),
                    format!("{} at batch {n}, its first image ({resident})", st.name()),
                ),
                None => match checks.reference {
                    RefState::Ready(re) => (
                        &re.logits[..classes],
                        format!(
                            "{}, its first image; no passing batched {} row ({resident})",
                            re.label,
                            st.name()
                        ),
                    ),
                    RefState::Unavailable(status) => {
                        r.status = status.clone();
                        rows.push(r);
                        continue;
                    }
                },
            };
            let session = match &mut single.session {
                Ok(session) => session,
                Err(status) => {
                    r.status = status.clone();
                    rows.push(r);
                    continue;
                }
            };
            let mem = session.memory;
            r.gpu_memory = Some(mem);
            r.gpu_memory_bytes = Some(mem.total() as u64);
            if st.graph {
                let captured = single
                    .graph
                    .get_or_insert_with(|| session.capture().map_err(|e| e.to_string()));
                if let Err(e) = captured {
                    r.status = RowStatus::Failed(format!("capturing the CUDA graph: {e}"));
                    rows.push(r);
                    continue;
                }
            }
            let set = match image {
                Ok(image) => session.set_input(image),
                Err(e) => Err(gpukit_models::Error::Invalid(e.to_string())),
            };
            if let Err(e) = set {
                r.status = engine_status("uploading the image", &e);
                rows.push(r);
                continue;
            }
            progress(&format!(
                "infer {} {name} batch {n}: {n} batch-1 passes",
                self.device
            ));
            let plan = Plan::new(self.plan.warmup, one_at_a_time_reps(self.plan.reps, n));
            let session = &*session;
            let timed = time_device(
                self.ctx.gpu.stream(),
                plan,
                || -> Result<(), EngineError> {
                    for _ in 0..n {
                        if st.graph {
                            session.replay()?;
                        } else {
                            session.enqueue()?;
                        }
                    }
                    Ok(())
                },
            );
            let t = match timed {
                Ok(t) => t,
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    rows.push(r);
                    continue;
                }
            };
            let got = match values(session.logits()) {
                Ok(l) => l,
                Err(e) => {
                    r.status = RowStatus::Failed(format!("reading the logits: {e}"));
                    rows.push(r);
                    continue;
                }
            };
            let a = agreement(&got, expected, classes);
            let judged = verdict(&got, &a, tol);
            r.agreement = Some(a);
            r.compared_with = Some(label);
            if let Some(why) = judged {
                r.status = RowStatus::Failed(why);
                rows.push(r);
                continue;
            }
            let rate = rate(n, &t);
            r.images_per_s = Some(rate);
            r.speedup_vs_fp32_eager = checks.fp32_eager.map(|f| rate / f);
            r.speedup_vs_reference = self.cpu_rates.get(&n).map(|c| rate / c);
            r.batching_gain = checks
                .batched
                .iter()
                .find(|b| b.strategy == st.name() && b.status == RowStatus::Ok)
                .and_then(|b| b.images_per_s)
                .map(|b| b / rate);
            r.timing = Some(t);
            rows.push(r);
        }
        rows
    }

    /// One (precision, layout) at one batch size: its Session, one verification pass, then
    /// each strategy timed (eager, then the captured graph) and its last pass's logits checked.
    /// For the reference pair it also sets the batch's reference. Each strategy that passes
    /// leaves its logits of the first image in `firsts`.
    #[allow(clippy::too_many_arguments)]
    fn at_batch(
        &self,
        weights: &GpuWeights,
        here: &[Strategy],
        is_ref: bool,
        n: usize,
        x: &[f32],
        reference: &mut RefState,
        fp32_eager: &mut Option<f64>,
        firsts: &mut Vec<(Strategy, Vec<f32>)>,
        progress: &mut dyn FnMut(&str),
    ) -> Vec<InferRow> {
        let s = self.image;
        if !is_ref {
            if let RefState::Unavailable(status) = &*reference {
                return here
                    .iter()
                    .map(|st| self.row(st, n, status.clone()))
                    .collect();
            }
        }
        let fp32_rows = !here.is_empty();
        // the GPU reference's own check: gpukit's CPU forward on the first images, on other
        // cores while the GPU's session is planned
        std::thread::scope(|scope| {
            let cpu_check = is_ref.then(|| {
                let k = n.min(CPU_CHECK_IMAGES);
                progress(&format!(
                    "infer cpu: checking logits for {k} image(s) of batch {n}"
                ));
                let folded = self.folded;
                scope.spawn(move || {
                    images(x, k, s)
                        .map_err(gpukit_models::Error::from)
                        .and_then(|t| values(folded.forward_cpu(&t)))
                        .map(|logits| Reference {
                            logits,
                            images: k,
                            label: format!(
                                "gpukit's f32 CPU forward (first {k} image(s) of the batch)"
                            ),
                        })
                        .map_err(|e| e.to_string())
                })
            });
            let cpu_check = cpu_check.map(|job| {
                move || {
                    job.join()
                        .unwrap_or_else(|_| Err("gpukit's CPU forward stopped".to_string()))
                }
            });
            self.planned_batch(
                weights,
                (here, is_ref, fp32_rows),
                (n, x),
                reference,
                fp32_eager,
                firsts,
                progress,
                cpu_check,
            )
        })
    }

    /// [`Self::at_batch`] once the CPU's check (for the reference pair) is under way:
    /// `cpu_check` waits for it.
    #[allow(clippy::too_many_arguments)]
    fn planned_batch(
        &self,
        weights: &GpuWeights,
        (here, is_ref, fp32_rows): (&[Strategy], bool, bool),
        (n, x): (usize, &[f32]),
        reference: &mut RefState,
        fp32_eager: &mut Option<f64>,
        firsts: &mut Vec<(Strategy, Vec<f32>)>,
        progress: &mut dyn FnMut(&str),
        cpu_check: Option<impl FnOnce() -> Result<Reference, String>>,
    ) -> Vec<InferRow> {
        let s = self.image;
        let classes = self.folded.num_classes;
        let all = |status: RowStatus| -> Vec<InferRow> {
            here.iter()
                .map(|st| self.row(st, n, status.clone()))
                .collect()
        };
        let pair = pair_name(weights.dtype, weights.layout);
        // the reference of rows that are not fp32 is only checked against, never reported: its
        // speed does not matter, so cuDNN's first suggestion plans it, untimed
        let search = self.ctx.dnn.search();
        if is_ref && !fp32_rows {
            self.ctx.dnn.set_search(gpukit_cuda::dnn::Search::Heuristic);
        }
        let what = format!("infer {} {pair} batch {n}", self.device);
        let (before, started) = (self.ctx.dnn.stats(), std::time::Instant::now());
        let made = Session::new_observed(self.ctx, weights, n, s, s, true, &mut |line| {
            progress(&format!("{what}: {line}"))
        });
        let after = self.ctx.dnn.stats();
        self.planning.borrow_mut().push(super::report::Planning {
            what: format!("{pair} batch {n}"),
            search: self.ctx.dnn.search(),
            measured: after.measured - before.measured,
            cached: after.cached - before.cached,
            candidates_timed: after.candidates_timed - before.candidates_timed,
            seconds: started.elapsed().as_secs_f64(),
        });
        self.ctx.dnn.set_search(search);
        let mut session = match made {
            Ok(session) => session,
            Err(e) => {
                if let Some(check) = cpu_check {
                    *reference = match check() {
                        // too big for fp32: smaller precisions may fit; check them on the CPU's
                        Ok(mut r) if is_oom(&e) => {
                            r.label.push_str(": the GPU fp32 reference did not fit");
                            RefState::Ready(r)
                        }
                        _ => RefState::Unavailable(dependent_status(
                            format!("the GPU fp32 reference could not run at batch {n}: {e}"),
                            is_oom(&e),
                            fp32_rows,
                        )),
                    };
                }
                return all(engine_status(&format!("preparing batch {n}"), &e));
            }
        };
        let first = match images(x, n, s)
            .map_err(gpukit_models::Error::from)
            .and_then(|x| values(session.run(&x)))
        {
            Ok(l) => l,
            Err(e) => {
                if is_ref {
                    *reference = RefState::Unavailable(dependent_status(
                        format!("the GPU fp32 reference failed at batch {n}: {e}"),
                        is_oom(&e),
                        fp32_rows,
                    ));
                }
                return all(engine_status("the verification pass", &e));
            }
        };
        // the reference pair: its rows show the CPU check; the reference is its first pass
        let mut cpu_agreement = None;
        if let Some(check) = cpu_check {
            let cpu = match check() {
                Ok(c) => c,
                Err(e) => {
                    *reference = RefState::Unavailable(dependent_status(
                        format!("gpukit's CPU forward: {e}"),
                        false,
                        fp32_rows,
                    ));
                    return all(RowStatus::Failed(format!("gpukit's CPU forward: {e}")));
                }
            };
            let a = agreement(&first[..cpu.images * classes], &cpu.logits, classes);
            if let Some(why) = verdict(&first, &a, tolerance(DType::F32)) {
                *reference = RefState::Unavailable(dependent_status(
                    format!("the GPU fp32 logits differ from gpukit's CPU forward ({why})"),
                    false,
                    fp32_rows,
                ));
                let mut rows = all(RowStatus::Failed(format!(
                    "against gpukit's CPU forward: {why}"
                )));
                for r in &mut rows {
                    r.agreement = Some(a.clone());
                    r.compared_with = Some(cpu.label.clone());
                    r.tolerance = Some(tolerance(DType::F32));
                }
                return rows;
            }
            cpu_agreement = Some((a, cpu.label));
            *reference = RefState::Ready(Reference {
                logits: first,
                images: n,
                label: "gpukit's GPU fp32 eager logits (whole batch)".into(),
            });
        }
        let RefState::Ready(reference) = &*reference else {
            return all(RowStatus::Skipped("no reference to verify against".into()));
        };
        let tol = (self.tolerance)(weights.dtype);
        let mem = session.memory;
        let mut rows = Vec::new();
        let mut captured = false;
        for st in here {
            let mut r = self.row(st, n, RowStatus::Ok);
            r.gpu_memory = Some(mem);
            r.gpu_memory_bytes = Some(mem.total() as u64);
            r.tolerance = Some(tol);
            if st.graph && !captured {
                if let Err(e) = session.capture() {
                    r.status = RowStatus::Failed(format!("capturing the CUDA graph: {e}"));
                    rows.push(r);
                    continue;
                }
                captured = true;
            }
            progress(&format!("infer {} {} batch {n}", self.device, st.name()));
            let stream = self.ctx.gpu.stream();
            let time = |plan: Plan| {
                if st.graph {
                    time_device(stream, plan, || session.replay())
                } else {
                    time_device(stream, plan, || session.enqueue())
                }
            };
            let pass = || match st.graph {
                true => session.replay(),
                false => session.enqueue(),
            };
            let timed =
                warm_device(stream, GPU_WARM, GPU_WARM_PASSES, pass).and_then(|_| time(self.plan));
            // the timed passes are too short to read the power (tens of ms): the same passes
            // again, untimed, in stretches until the draw settles, with the meter reading
            if let (Some(m), Ok(t)) = (&self.meter, &timed) {
                let reps = (STRETCH_MS / t.summary_ms.median.max(1e-3)).ceil() as usize;
                r.power = m.steady(|| time(Plan::new(0, reps.clamp(1, 100_000))).map(|_| ()));
            }
            let t = match timed {
                Ok(t) => t,
                Err(e) => {
                    r.status = RowStatus::Failed(e.to_string());
                    rows.push(r);
                    continue;
                }
            };
            // the last timed pass's logits (same input as the verification pass)
            let got = match values(session.logits()) {
                Ok(l) => l,
                Err(e) => {
                    r.status = RowStatus::Failed(format!("reading the logits: {e}"));
                    rows.push(r);
                    continue;
                }
            };
            let a = agreement(
                &got[..reference.images * classes],
                &reference.logits,
                classes,
            );
            let judged = verdict(&got, &a, tol);
            match &cpu_agreement {
                // fp32 NCHW: the timed passes must repeat the verified one; the CPU check shows
                Some((cpu, label)) => {
                    r.agreement = Some(cpu.clone());
                    r.compared_with = Some(label.clone());
                    if let Some(why) = judged {
                        r.status = RowStatus::Failed(format!(
                            "the timed passes differ from the verified one: {why}"
                        ));
                    }
                }
                None => {
                    r.agreement = Some(a);
                    r.compared_with = Some(reference.label.clone());
                    if let Some(why) = judged {
                        r.status = RowStatus::Failed(why);
                    }
                }
            }
            if r.status == RowStatus::Ok {
                firsts.push((*st, got[..classes].to_vec()));
                let rate = rate(n, &t);
                if is_ref && !st.graph {
                    *fp32_eager = Some(rate);
                }
                r.images_per_s = Some(rate);
                r.speedup_vs_fp32_eager = fp32_eager.map(|f| rate / f);
                r.speedup_vs_reference = self.cpu_rates.get(&n).map(|c| rate / c);
                r.timing = Some(t);
            }
            rows.push(r);
        }
        rows
    }
}
