//! Convolutions through cuDNN's backend (graph) API, planned and run: engine configurations from
//! cuDNN's heuristics for the graph `graph` builds, each finalized and timed on the real buffers,
//! the fastest kept. This reaches the engines (runtime-fused and Hopper-specific kernels) that
//! the legacy `cudnnConvolutionBiasActivationForward` does not.
//!
//! To use: [`Dnn::plan_graph`] once per convolution and set of buffers (the selection policy in
//! `select` does), then [`Dnn::graph_forward`] (enqueues only; capturable in a CUDA graph).

use super::cache::List;
use super::engines::{
    engine_facts, finalize_plan, plan_workspace, read_configs, Limits, FAST_FINALISTS,
    HEURISTIC_ENOUGH,
};
use super::graph::*;
use super::precompile::{GraphSpec, Handle, Kept};
use super::{ok, Act, Conv, Dnn, Search};
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cudnn::sys as dn;
use gpukit_types::DType;
use std::ffi::c_void;

/// A planned fused convolution: its execution plan and the tensor ids the variant pack binds.
pub struct GraphConv {
    plan: Desc,
    /// Every descriptor the plan was built from (tensors, operations, graph, heuristics, the
    /// engine configuration), alive as long as the plan: finalized descriptors refer to the
    /// ones they were set from (cuDNN's own frontend keeps them too), so destroying them
    /// early would leave the plan pointing at freed memory.
    _built_from: Vec<Desc>,
    /// For a plan a helper thread finalized: the descriptors and the cuDNN handle it was
    /// finalized from, alive as long as the plan (dropped after it: fields drop in order).
    _finalized_on: Option<Kept>,
    /// For a graph a helper read ahead: the handle its plans were finalized on, alive as long
    /// as the plan.
    _read_on: Option<std::sync::Arc<Handle>>,
    /// Variant packs by the addresses they bind: one plan serves every layer of its shape, and
    /// each layer passes the same buffers every time, so each pack is built once.
    packs: std::cell::RefCell<std::collections::HashMap<Vec<u64>, Desc>>,
    pub workspace_bytes: usize,
    pub residual: bool,
    pub has_bias: bool,
    /// The winning configuration: which of cuDNN's lists, at which index.
    pub pick: (List, usize),
    /// Which engine won (cuDNN's global engine index and heuristic rank), out of how many
    /// that finalized.
    pub choice: String,
    /// Whether cuDNN notes that the engine runs on tensor cores (None: it did not say).
    pub tensor_cores: Option<bool>,
    /// Median device time of the chosen configuration when planned (ms; 0 for a cached one).
    pub ms: f64,
    pub conv: Conv,
}

/// Candidates timed a second time before the fastest backend engine is chosen.
const FINALISTS: usize = 4;
impl Dnn {
    /// Builds the operation graph `y = relu(conv(x, w) + bias [+ z])` (or, without bias,
    /// residual and ReLU, the bare convolution), finalizes up to [`GRAPH_TRIALS`] of the
    /// heuristic's engine configurations, times each on these buffers and keeps the fastest;
    /// with `only` set, builds only that heuristic rank (a choice measured before). For strict
    /// f32 only engines whose numerical notes say they do not use tensor cores are tried (the
    /// backend's float engines may compute in TF32), as PyTorch does without TF32.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_graph(
        &self,
        conv: Conv,
        x: View<'_>,
        w: View<'_>,
        bias: Option<View<'_>>,
        z: Option<View<'_>>,
        act: Option<Act>,
        y: View<'_>,
        only: Option<(List, usize)>,
    ) -> Result<GraphConv> {
        if conv.dtype == DType::F64 {
            return Err(Error::NoAlgorithm(
                "f64 stays on the legacy API".to_string(),
            ));
        }
        conv.check(x, w, y)?;
        let sh = conv.shape;
        let e = conv.dtype.size_bytes();
        if let Some(bias) = bias {
            bias.require(sh.k * e, "graph conv bias")?;
        }
        if let Some(z) = z {
            z.require(conv.output_bytes(), "graph conv residual")?;
        }
        let search = self.search();
        let limits = Limits::of(search, self.strict(conv.dtype), only);
        let spec = GraphSpec {
            conv,
            bias: bias.is_some(),
            residual: z.is_some(),
            act,
        };
        // the graph and its configurations as a helper read them ahead (its plans finalized on
        // the handle they were read on), or read here
        let (built, configs, heurs, read_on) = match self.read_ahead(spec, limits) {
            Some(r) => {
                crate::trace::note(|| {
                    format!("{conv:?}: {} configurations read ahead", r.configs.len())
                });
                (r.built, r.configs, r.heurs, Some(r.handle))
            }
            None => {
                let built = build_graph(self.handle(), conv, bias.is_some(), z.is_some(), act)?;
                let (configs, heurs) = read_configs(&built.graph, limits)?;
                (built, configs, heurs, None)
            }
        };
        let finalize_on = read_on.as_ref().map_or(self.handle(), |h| h.0);
        let count = configs.len();
        let wsb = self.planning_workspace()?;
        let planning = wsb.view();
        let mut timed_all: Vec<(f64, GraphConv)> = Vec::new();
        let mut finalized = 0;
        let mut timed = 0;
        let mut runtime_compiled = 0;
        for (list, index, cfg) in &configs {
            let pick = (*list, *index);
            if only.is_some_and(|o| o != pick) {
                continue;
            }
            // a heuristic search reads the fallback list only when the heuristic's own
            // suggestions did not finalize
            if *list == List::Fallback
                && only.is_none()
                && search == Search::Heuristic
                && finalized >= HEURISTIC_ENOUGH
            {
                break;
            }
            if timed >= limits.timed {
                break;
            }
            let Some(compiled) = limits.wants((*list, cfg), runtime_compiled) else {
                continue;
            };
            runtime_compiled += usize::from(compiled);
            // finalized by a helper thread meanwhile, or here; a configuration that does not
            // support this graph fails to finalize: skip it
            let ahead = compiled
                .then(|| self.precompiled(spec, pick, cfg))
                .flatten();
            let (plan, kept) = match ahead {
                Some(done) => {
                    self.count(|s| s.finalized_ahead += 1);
                    (done.plan, done.kept)
                }
                None => (finalize_plan(finalize_on, cfg, pick, compiled)?, None),
            };
            let Some(plan) = plan else {
                continue;
            };
            let ws = plan_workspace(&plan)?;
            if ws > self.workspace_limit() {
                continue;
            }
            finalized += 1;
            let candidate = GraphConv {
                plan,
                _built_from: Vec::new(),
                _finalized_on: kept,
                _read_on: read_on.clone(),
                packs: Default::default(),
                workspace_bytes: ws,
                residual: z.is_some(),
                has_bias: bias.is_some(),
                pick,
                choice: String::new(),
                tensor_cores: None,
                ms: 0.0,
                conv,
            };
            // a cached or heuristic pick is not timed: the first that finalizes is the one
            if only.is_some() || search == Search::Heuristic {
                timed_all.push((0.0, candidate));
                break;
            }
            timed += 1;
            let run = || self.graph_forward(&candidate, x, w, bias, z, y, planning);
            // a fast search stops timing a candidate that cannot win; an exhaustive one times
            // every candidate in full
            let beat = timed_all
                .iter()
                .map(|(ms, _)| *ms)
                .reduce(f64::min)
                .filter(|_| search == Search::Fast);
            let timing = std::time::Instant::now();
            let measured = self.candidate_ms_within(beat, run);
            self.count(|s| s.candidates_timed += 1);
            if crate::trace::on() {
                let engine = engine_facts(cfg).map(|(e, _)| e).unwrap_or(-1);
                let t = measured
                    .as_ref()
                    .map(|ms| format!("{ms:.4} ms"))
                    .unwrap_or_else(|e| e.to_string());
                eprintln!(
                    "trace: {conv:?} candidate {list:?} #{index} engine {engine} workspace {ws} \
                     B: {t} (timed in {:.1} ms)",
                    timing.elapsed().as_secs_f64() * 1e3
                );
            }
            let Ok(median) = measured else { continue };
            timed_all.push((median, candidate));
        }
        // the fastest few timed again, on a GPU now warm, as graphs of launches back to back
        // (how the engines run: one kernel's start may overlap the previous one's end) in
        // interleaved rounds: one noisy first measurement does not decide alone
        timed_all.sort_by(|a, b| a.0.total_cmp(&b.0));
        timed_all.truncate(match search {
            Search::Exhaustive => FINALISTS,
            Search::Fast | Search::Heuristic => FAST_FINALISTS,
        });
        if only.is_none() && search != Search::Heuristic {
            let run = |c: &GraphConv| self.graph_forward(c, x, w, bias, z, y, planning);
            self.confirm_finalists(&mut timed_all, run)?;
            if crate::trace::on() {
                for (ms, c) in &timed_all {
                    eprintln!(
                        "trace: {conv:?} finalist {:?} #{} back to back: {ms:.4} ms",
                        c.pick.0, c.pick.1
                    );
                }
            }
        }
        let best = timed_all
            .into_iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(ms, c)| (ms, c.pick, c.plan, c.workspace_bytes, c._finalized_on));
        let (ms, pick, plan, ws, kept) = best.ok_or_else(|| {
            Error::NoAlgorithm(format!(
                "{conv:?}: no engine of the backend API runs the graph \
                 ({count} suggested, {finalized} finalized)"
            ))
        })?;
        let (engine, tensor_cores) = configs
            .iter()
            .find(|(l, i, _)| (*l, *i) == pick)
            .map(|(_, _, c)| engine_facts(c))
            .transpose()?
            .unwrap_or((-1, None));
        let built_from = built.kept_with(configs.into_iter().map(|(_, _, c)| c), heurs);
        Ok(GraphConv {
            plan,
            _built_from: built_from,
            _finalized_on: kept,
            _read_on: read_on,
            packs: Default::default(),
            workspace_bytes: ws,
            residual: z.is_some(),
            has_bias: bias.is_some(),
            pick,
            choice: match (only, search) {
                (Some(_), _) => format!(
                    "backend engine {engine} ({:?} #{}, chosen in an earlier run)",
                    pick.0, pick.1
                ),
                (None, Search::Heuristic) => {
                    format!("backend engine {engine} (cuDNN's first suggestion, untimed)")
                }
                (None, _) => format!(
                    "backend engine {engine} ({:?} #{}, fastest of {timed} timed)",
                    pick.0, pick.1
                ),
            },
            tensor_cores,
            ms,
            conv,
        })
    }

    /// Enqueues a planned fused convolution (the same buffers' shapes as at planning) with the
    /// workspace `ws` (at least what the plan needs).
    #[allow(clippy::too_many_arguments)]
    pub fn graph_forward(
        &self,
        conv: &GraphConv,
        x: View<'_>,
        w: View<'_>,
        bias: Option<View<'_>>,
        z: Option<View<'_>>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        ws.require(conv.workspace_bytes, "graph conv workspace")?;
        let c = conv.conv;
        c.check(x, w, y)?;
        let mut uids = vec![UID_X, UID_W, UID_Y];
        let mut ptrs: Vec<*mut c_void> = vec![
            x.addr() as *mut c_void,
            w.addr() as *mut c_void,
            y.addr() as *mut c_void,
        ];
        match (conv.has_bias, bias) {
            (true, Some(b)) => {
                b.require(c.shape.k * c.dtype.size_bytes(), "graph conv bias")?;
                uids.push(UID_B);
                ptrs.push(b.addr() as *mut c_void);
            }
            (false, None) => {}
            _ => {
                return Err(Error::Invalid(
                    "bias given to a graph planned without one (or missing)".into(),
                ))
            }
        }
        match (conv.residual, z) {
            (true, Some(z)) => {
                z.require(c.output_bytes(), "graph conv residual")?;
                uids.push(UID_Z);
                ptrs.push(z.addr() as *mut c_void);
            }
            (false, None) => {}
            _ => {
                return Err(Error::Invalid(
                    "residual given to a graph planned without one (or missing)".into(),
                ))
            }
        }
        let mut key: Vec<u64> = ptrs.iter().map(|p| *p as u64).collect();
        key.push(ws.addr());
        let mut packs = conv.packs.borrow_mut();
        if !packs.contains_key(&key) {
            let pack = variant_pack(&uids, &ptrs, ws.addr() as *mut c_void)?;
            packs.insert(key.clone(), pack);
        }
        let Some(pack) = packs.get(&key) else {
            return Err(Error::Invalid("variant pack missing".into()));
        };
        // SAFETY: the plan was finalized for these shapes; every pointer is checked device
        // memory of the planned size; the workspace holds what the plan asked for (checked at
        // planning against the same workspace).
        ok("cudnnBackendExecute", unsafe {
            dn::cudnnBackendExecute(self.handle(), conv.plan.0, pack.0)
        })
    }
}
