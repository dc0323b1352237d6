//! The selection policy: how each convolution runs, decided by measurement in one place for the
//! inference engine and `bench conv` alike. Candidates (cuDNN's backend engine configurations,
//! its legacy algorithms, and for the fused form the bare convolution followed by an epilogue
//! kernel) are timed on the real buffers ([`Dnn::candidate_ms_within`], [`Dnn::call_ms`]), as
//! many as the [`Search`] asks for (fast by default: the best few of cuDNN's ranking;
//! exhaustive: all of them), and the fastest is kept and remembered on disk with the search
//! that found it.

use super::cache::{Choice, Key, Op};
use super::legacy::{ConvPlan, FusedConv};
use super::{Act, Conv, ConvChoice, Dnn, Epilogue, Search, Strict, CONV_WORKSPACE_BYTES};
use crate::error::{Error, Result};
use crate::memory::View;
use gpukit_types::DType;

impl Dnn {
    pub(super) fn key(&self, conv: Conv, op: Op, allow_graph: bool) -> Key {
        Key {
            conv,
            op,
            legacy_only: !allow_graph,
            workspace_limit: (self.workspace_limit() < CONV_WORKSPACE_BYTES)
                .then_some(self.workspace_limit()),
            exact_f32: self.strict(conv.dtype) == Strict::Exact,
        }
    }

    fn remember(&self, key: Key, choice: &ConvChoice) {
        let value = match choice {
            ConvChoice::Fused(f) => Choice::legacy(f.conv.row()),
            ConvChoice::Plain(p) => Choice::legacy(p.row()),
            ConvChoice::Graph(g) => Choice::Graph {
                list: g.pick.0,
                index: g.pick.1,
            },
            ConvChoice::Split(_) => Choice::Split,
        };
        self.choices.borrow_mut().put(key, value, self.search());
    }

    /// Gives `plan` the cached algorithm of `choice`; None when it no longer fits the
    /// workspace (or the cache names an algorithm this cuDNN lacks, or a math type the dtype
    /// must not run with).
    fn use_cached(&self, plan: &mut ConvPlan, choice: &Choice) -> Option<()> {
        let row = choice.legacy_row(self.strict(plan.conv.dtype))?;
        plan.apply(row).ok()?;
        let row = self.workspace_for(plan, row).ok()?;
        plan.apply(row).ok()
    }

    /// Counts a convolution planned, from the cache or measured now, and the time it took.
    fn planned(&self, started: std::time::Instant, cached: bool) {
        let seconds = started.elapsed().as_secs_f64();
        self.count(|s| {
            if cached {
                s.cached += 1;
            } else {
                s.measured += 1;
            }
            s.seconds += seconds;
        });
        crate::trace::note(|| {
            format!(
                "{:.2} ms planning a convolution ({})",
                seconds * 1e3,
                if cached { "cached" } else { "measured" }
            )
        });
    }

    /// Chooses how the bare convolution `y = conv(x, w)` runs: cuDNN's fastest legacy
    /// algorithm or (when `allow_graph`) a backend engine (for strict f32 only those without
    /// tensor cores), each timed the same way, as thoroughly as [`Dnn::search`] says; kept on
    /// disk. A heuristic search takes cuDNN's first legacy suggestion, untimed.
    pub fn plan_plain_best(
        &self,
        conv: Conv,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        allow_graph: bool,
    ) -> Result<ConvChoice> {
        conv.check(x, w, y)?;
        let started = std::time::Instant::now();
        let search = self.search();
        let key = self.key(conv, Op::Plain, allow_graph);
        let cached = self.choices.borrow().get(&key, search);
        match &cached {
            Some(c @ Choice::Legacy { .. }) => {
                let mut plan = ConvPlan::describe(conv)?;
                if self.use_cached(&mut plan, c).is_some() {
                    trace_cached(conv, c);
                    self.planned(started, true);
                    return Ok(ConvChoice::Plain(plan));
                }
            }
            Some(c @ Choice::Graph { list, index }) if allow_graph => {
                let only = Some((*list, *index));
                if let Ok(g) = self.plan_graph(conv, x, w, None, None, None, y, only) {
                    trace_cached(conv, c);
                    self.planned(started, true);
                    return Ok(ConvChoice::Graph(g));
                }
            }
            _ => {}
        }
        if search == Search::Heuristic {
            if let Ok(legacy) = self.plan_legacy(conv, x, w, y, None) {
                let choice = ConvChoice::Plain(legacy);
                // kept as a heuristic pick: the next reference plan asks cuDNN nothing
                self.remember(key, &choice);
                self.planned(started, false);
                return Ok(choice);
            }
        }
        // the backend engines first: they win almost everywhere, and their time lets a fast
        // search stop timing legacy algorithms that cannot beat it
        let graph = if allow_graph && backend_reaches(conv, false) {
            self.plan_graph(conv, x, w, None, None, None, y, None).ok()
        } else {
            None
        };
        let legacy = self.plan_legacy(conv, x, w, y, graph.as_ref().map(|g| g.ms));
        // timed like the graph candidates (cuDNN's own figure comes from another method)
        let legacy_ms = match (&legacy, search) {
            (Ok(l), Search::Exhaustive) => {
                let wsb = self.planning_workspace()?;
                let ws = wsb.view();
                self.count(|s| s.candidates_timed += 1);
                self.call_ms(|| self.conv_forward(l, x, w, y, ws))?
            }
            (Ok(l), _) => l.measured_ms().unwrap_or(f64::INFINITY),
            (Err(_), _) => f64::INFINITY,
        };
        if crate::trace::on() {
            eprintln!("trace: {conv:?} legacy candidate: {legacy_ms:.4} ms");
        }
        let choice = match (graph, legacy) {
            (Some(g), _) if g.ms < legacy_ms => ConvChoice::Graph(g),
            (_, Ok(legacy)) => ConvChoice::Plain(legacy),
            (Some(g), Err(_)) => ConvChoice::Graph(g),
            (None, Err(e)) => return Err(e),
        };
        self.remember(key, &choice);
        self.planned(started, false);
        Ok(choice)
    }

    /// Chooses how `y = relu(conv(x, w) + bias [+ z])` runs: the legacy fused call or (when
    /// `allow_graph` and the dtype runs on tensor cores: [`backend_reaches`]) a backend-API
    /// graph, whichever measured faster, as thoroughly as [`Dnn::search`] says; kept on disk.
    /// A heuristic search takes the legacy fused call with cuDNN's first suggestion that runs,
    /// untimed.
    ///
    /// With `split`, the bare convolution followed by that epilogue is a candidate too (not
    /// when `z` is `y` itself: the bare convolution would overwrite the residual first).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_fused_best(
        &self,
        conv: Conv,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
        allow_graph: bool,
        split: Option<Epilogue<'_>>,
    ) -> Result<ConvChoice> {
        conv.check(x, w, y)?;
        let started = std::time::Instant::now();
        let search = self.search();
        let split = split.filter(|_| z.is_none_or(|z| !z.same_start(&y)));
        let key = self.key(
            conv,
            Op::Fused {
                residual: z.is_some(),
            },
            allow_graph,
        );
        let cached = self.choices.borrow().get(&key, search);
        match &cached {
            Some(c @ Choice::Legacy { .. }) => {
                let mut fused = FusedConv::describe(conv, true)?;
                if self.use_cached(&mut fused.conv, c).is_some() {
                    trace_cached(conv, c);
                    self.planned(started, true);
                    return Ok(ConvChoice::Fused(fused));
                }
            }
            Some(c) => {
                let ops = (x, w, bias, z, y);
                let act = Some(Act::Relu);
                if let Some(run) = self.cached_graph_or_split(conv, ops, act, c, allow_graph, split)
                {
                    self.planned(started, true);
                    return Ok(run);
                }
            }
            None => {}
        }
        if search == Search::Heuristic {
            let legacy = self.plan_fused_legacy(conv, true, x, w, bias, z, y, None)?;
            let choice = ConvChoice::Fused(legacy);
            self.remember(key, &choice);
            self.planned(started, false);
            return Ok(choice);
        }
        // the backend engines first: their time lets a fast search stop timing legacy
        // algorithms that cannot beat it (some take milliseconds a call fused with a residual)
        let graph = if allow_graph && backend_reaches(conv, true) {
            self.plan_graph(conv, x, w, Some(bias), z, Some(Act::Relu), y, None)
                .ok()
        } else {
            None
        };
        let legacy =
            self.plan_fused_legacy(conv, true, x, w, bias, z, y, graph.as_ref().map(|g| g.ms));
        let (best_ms, mut choice) = match (legacy, graph) {
            (Ok(l), g) => {
                let legacy_ms = l.conv.measured_ms().unwrap_or(f64::INFINITY);
                match g {
                    Some(g) if g.ms < legacy_ms => (g.ms, ConvChoice::Graph(g)),
                    _ => (legacy_ms, ConvChoice::Fused(l)),
                }
            }
            (Err(_), Some(g)) => (g.ms, ConvChoice::Graph(g)),
            (Err(e), None) => return Err(e),
        };
        if let Some(epilogue) = split {
            let ops = (x, w, bias, z, y);
            if let Some(faster) = self.split_if_faster(conv, ops, allow_graph, epilogue, best_ms)? {
                choice = faster;
            }
        }
        self.remember(key, &choice);
        self.planned(started, false);
        Ok(choice)
    }

    /// Chooses how `y = act(conv(x, w) + bias [+ z])` runs for an activation other than ReLU,
    /// or none (ReLU is [`Dnn::plan_fused_best`]'s): a backend-API graph holding the whole
    /// epilogue (where [`backend_reaches`] a fused graph), or the bare convolution followed by
    /// `split` (gpukit's epilogue kernel), whichever measured faster; kept on disk. A
    /// heuristic search takes the split, else cuDNN's first graph that finalizes.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_epilogue_best(
        &self,
        conv: Conv,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        act: Option<Act>,
        y: View<'_>,
        allow_graph: bool,
        split: Option<Epilogue<'_>>,
    ) -> Result<ConvChoice> {
        conv.check(x, w, y)?;
        let started = std::time::Instant::now();
        let search = self.search();
        let split = split.filter(|_| z.is_none_or(|z| !z.same_start(&y)));
        let residual = z.is_some();
        let key = self.key(conv, Op::Epilogue { residual, act }, allow_graph);
        let reaches = allow_graph && backend_reaches(conv, true);
        let cached = self.choices.borrow().get(&key, search);
        if let Some(c) = &cached {
            let ops = (x, w, bias, z, y);
            if let Some(run) = self.cached_graph_or_split(conv, ops, act, c, reaches, split) {
                self.planned(started, true);
                return Ok(run);
            }
        }
        // a heuristic pick (a reference's plan, never timed) takes the split where there is
        // one: cuDNN's first fused graph is often an engine NVRTC compiles (50-170 ms each,
        // and a kept graph pick is compiled again in every process)
        let graph = (reaches && !(search == Search::Heuristic && split.is_some()))
            .then(|| {
                self.plan_graph(conv, x, w, Some(bias), z, act, y, None)
                    .ok()
            })
            .flatten();
        let choice = match (graph, split) {
            (Some(g), Some(epilogue)) if search != Search::Heuristic => {
                let ops = (x, w, bias, z, y);
                match self.split_if_faster(conv, ops, allow_graph, epilogue, g.ms)? {
                    Some(split) => split,
                    None => ConvChoice::Graph(g),
                }
            }
            (Some(g), _) => ConvChoice::Graph(g),
            (None, Some(_)) => ConvChoice::Split(Box::new(self.plan_plain_best(
                conv,
                x,
                w,
                y,
                allow_graph,
            )?)),
            (None, None) => {
                return Err(Error::NoAlgorithm(format!(
                    "{conv:?} with its epilogue ({act:?}, residual {residual}): no backend graph \
                     finalized and no epilogue kernel was given"
                )))
            }
        };
        self.remember(key, &choice);
        self.planned(started, false);
        Ok(choice)
    }

    /// A cached backend-graph or split choice for `act(conv + bias [+ z])`, planned again
    /// without timing; None when the cache holds another kind of choice or it no longer plans.
    fn cached_graph_or_split(
        &self,
        conv: Conv,
        (x, w, bias, z, y): Operands<'_>,
        act: Option<Act>,
        cached: &Choice,
        allow_graph: bool,
        split: Option<Epilogue<'_>>,
    ) -> Option<ConvChoice> {
        let run = match cached {
            Choice::Graph { list, index } if allow_graph => {
                let only = Some((*list, *index));
                ConvChoice::Graph(
                    self.plan_graph(conv, x, w, Some(bias), z, act, y, only)
                        .ok()?,
                )
            }
            Choice::Split if split.is_some() => ConvChoice::Split(Box::new(
                self.plan_plain_best(conv, x, w, y, allow_graph).ok()?,
            )),
            _ => return None,
        };
        trace_cached(conv, cached);
        Some(run)
    }

    /// The bare convolution followed by `epilogue`, timed as the other candidates are (back to
    /// back): Some when it beats `best_ms`.
    fn split_if_faster(
        &self,
        conv: Conv,
        (x, w, bias, z, y): Operands<'_>,
        allow_graph: bool,
        epilogue: Epilogue<'_>,
        best_ms: f64,
    ) -> Result<Option<ConvChoice>> {
        let bare = self.plan_plain_best(conv, x, w, y, allow_graph)?;
        let wsb = self.planning_workspace()?;
        let ws = wsb.view();
        self.count(|s| s.candidates_timed += 1);
        let ms = self.call_ms(|| {
            self.bare_forward(&bare, x, w, y, ws)?;
            epilogue(y, bias, z)
        });
        Ok(ms
            .is_ok_and(|ms| ms < best_ms)
            .then(|| ConvChoice::Split(Box::new(bare))))
    }

    /// Runs a bare convolution choice (`Plain`, or a `Graph` planned without epilogue).
    pub fn bare_forward(
        &self,
        choice: &ConvChoice,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        match choice {
            ConvChoice::Plain(p) => self.conv_forward(p, x, w, y, ws),
            ConvChoice::Graph(g) => self.graph_forward(g, x, w, None, None, y, ws),
            _ => Err(Error::Invalid("not a bare convolution choice".into())),
        }
    }
}

/// A fused convolution's buffers: x, w, bias, the residual z, y.
type Operands<'v> = (View<'v>, View<'v>, View<'v>, Option<View<'v>>, View<'v>);

/// Whether the selection policy tries cuDNN's backend engines for `conv` (fused with bias and
/// ReLU, or bare): a fused graph only on tensor cores (strict f32 stays on the legacy fused
/// call: with backend graphs allowed there, an f32 NHWC strided 1x1 projection found no
/// engine), a bare one for every dtype but f64.
pub(super) fn backend_reaches(conv: Conv, fused: bool) -> bool {
    match fused {
        true => conv.dtype.uses_tensor_cores(),
        false => conv.dtype != DType::F64,
    }
}

/// With `GPUKIT_TRACE=1`: a convolution planned from the disk cache, without timing anything.
fn trace_cached(conv: Conv, choice: &Choice) {
    if crate::trace::on() {
        eprintln!("trace: {conv:?} cached choice {choice:?}");
    }
}
