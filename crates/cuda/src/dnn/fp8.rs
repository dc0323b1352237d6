//! fp8 convolutions through cuDNN's backend API, the first step of the fp8 strategy (decision
//! 152): `y = conv(x, w) * scale` with `x` and `w` stored E4M3 (NHWC, filters KRSC), the sums in
//! f32, `scale` one f32 a filter (the input's per-tensor scale times the filter's own), `y` in
//! a 16-bit type or E4M3. The heuristic's configurations are timed on the real buffers as the other
//! graphs are (slow ones stopped early, the finalists confirmed in turns) and the fastest kept.
//! Not cached on disk yet: a planned fp8 convolution lives as long as its [`Fp8Conv`].
//!
//! To use: [`Dnn::plan_fp8_conv`] once per shape and buffers, then [`Dnn::fp8_forward`]
//! (enqueues only; capturable in a CUDA graph).

use super::cache::List;
use super::engines::{engine_facts, finalize_plan, plan_workspace, read_configs, Limits};
use super::graph::{build_fp8_graph, variant_pack, Desc, UID_S, UID_W, UID_X, UID_Y};
use super::{ok, Dnn, Search, Strict};
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cudnn::sys as dn;
use gpukit_types::{ConvShape, DType};
use std::ffi::c_void;

/// A finalized configuration: where it came from, its plan, its workspace.
type Candidate = ((List, usize), Desc, usize);

/// A planned fp8 convolution.
pub struct Fp8Conv {
    plan: Desc,
    /// The graph, its parts, configurations and heuristics, alive as long as the plan.
    _built_from: Vec<Desc>,
    pub shape: ConvShape,
    /// The output's type (f16, bf16 or E4M3).
    pub out: DType,
    pub workspace_bytes: usize,
    /// cuDNN's global index of the engine that won, and its configuration.
    pub engine: i64,
    pub pick: (List, usize),
    /// Candidates timed.
    pub timed: usize,
    /// Its confirmed device time when planned (ms).
    pub ms: f64,
}

impl Fp8Conv {
    /// Bytes of the E4M3 input, of the filters, and of the output.
    pub fn bytes(&self) -> (usize, usize, usize) {
        let sh = self.shape;
        let (p, q) = sh.out_hw();
        (
            sh.input_len(),
            sh.weight_len(),
            sh.n * sh.k * p * q * self.out.size_bytes(),
        )
    }

    fn check(&self, x: View<'_>, w: View<'_>, scale: View<'_>, y: View<'_>) -> Result<()> {
        let (xb, wb, yb) = self.bytes();
        x.require(xb, "fp8 conv x")?;
        w.require(wb, "fp8 conv w")?;
        scale.require(self.shape.k * 4, "fp8 conv scale")?;
        y.require(yb, "fp8 conv y")
    }
}

impl Dnn {
    /// Plans `y = conv(x, w) * scale` for `shape` with E4M3 `x` and `w` and `out` (f16, bf16,
    /// or E4M3 as cuDNN's own sample writes it: the output's 1/scale then folded into `scale`)
    /// `y`, timing cuDNN's configurations on these buffers (a fast search: the heuristic's
    /// best few and its fallback list's first).
    pub fn plan_fp8_conv(
        &self,
        shape: ConvShape,
        out: DType,
        (x, w, scale, y): (View<'_>, View<'_>, View<'_>, View<'_>),
    ) -> Result<Fp8Conv> {
        let out_type = match out {
            DType::F16 => dn::cudnnDataType_t::CUDNN_DATA_HALF,
            DType::Bf16 => dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            DType::F8E4M3 => dn::cudnnDataType_t::CUDNN_DATA_FP8_E4M3,
            other => {
                return Err(Error::Invalid(format!(
                    "an fp8 convolution writes f16, bf16 or E4M3, not {other}"
                )))
            }
        };
        if shape.groups != 1 || !shape.c.is_multiple_of(16) || !shape.k.is_multiple_of(16) {
            return Err(Error::NoAlgorithm(format!(
                "{shape:?}: fp8 convolutions take ungrouped filters with channels a multiple of 16"
            )));
        }
        let built = build_fp8_graph(self.handle(), shape, out_type)?;
        let limits = Limits::of(Search::Fast, Strict::Any, None);
        let (configs, heurs) = read_configs(&built.graph, limits)?;
        let wsb = self.planning_workspace()?;
        let planning = wsb.view();
        let mut timed: Vec<(f64, Candidate)> = Vec::new();
        let mut runtime_compiled = 0;
        let mut count = 0;
        for (list, index, cfg) in &configs {
            if count >= limits.timed {
                break;
            }
            let Some(compiled) = limits.wants((*list, cfg), runtime_compiled) else {
                continue;
            };
            runtime_compiled += usize::from(compiled);
            let pick = (*list, *index);
            let Some(plan) = finalize_plan(self.handle(), cfg, pick, compiled)? else {
                continue;
            };
            let ws = plan_workspace(&plan)?;
            if ws > self.workspace_limit() {
                continue;
            }
            count += 1;
            let beat = timed.iter().map(|(ms, _)| *ms).reduce(f64::min);
            let run = || self.execute_fp8(&plan, (x, w, scale, y), planning);
            let measured = self.candidate_ms_within(beat, run);
            crate::trace::note(|| {
                let t = measured
                    .as_ref()
                    .map(|ms| format!("{ms:.4} ms"))
                    .unwrap_or_else(|e| e.to_string());
                format!("fp8 {shape:?} candidate {list:?} #{index} workspace {ws} B: {t}")
            });
            if let Ok(ms) = measured {
                timed.push((ms, (pick, plan, ws)));
            }
        }
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        timed.truncate(super::engines::FAST_FINALISTS);
        let run = |(_, plan, _): &Candidate| self.execute_fp8(plan, (x, w, scale, y), planning);
        self.confirm_finalists(&mut timed, run)?;
        let (ms, (pick, plan, ws)) = timed
            .into_iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .ok_or_else(|| {
                Error::NoAlgorithm(format!(
                    "{shape:?}: no engine runs an fp8 convolution ({} suggested)",
                    configs.len()
                ))
            })?;
        let engine = configs
            .iter()
            .find(|(l, i, _)| (*l, *i) == pick)
            .map(|(_, _, c)| engine_facts(c).map_or(-1, |(e, _)| e))
            .unwrap_or(-1);
        let built_from = built.kept_with(configs.into_iter().map(|(_, _, c)| c), heurs);
        Ok(Fp8Conv {
            plan,
            _built_from: built_from,
            shape,
            out,
            workspace_bytes: ws,
            engine,
            pick,
            timed: count,
            ms,
        })
    }

    /// Enqueues a planned fp8 convolution on these buffers with the workspace `ws` (at least
    /// [`Fp8Conv::workspace_bytes`]).
    pub fn fp8_forward(
        &self,
        conv: &Fp8Conv,
        x: View<'_>,
        w: View<'_>,
        scale: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        conv.check(x, w, scale, y)?;
        ws.require(conv.workspace_bytes, "fp8 conv workspace")?;
        self.execute_fp8(&conv.plan, (x, w, scale, y), ws)
    }

    /// Runs `plan` with a variant pack built for these buffers (the buffers checked by the
    /// caller against the planned shape).
    fn execute_fp8(
        &self,
        plan: &Desc,
        (x, w, scale, y): (View<'_>, View<'_>, View<'_>, View<'_>),
        ws: View<'_>,
    ) -> Result<()> {
        let uids = [UID_X, UID_W, UID_S, UID_Y];
        let ptrs: Vec<*mut c_void> = [x, w, scale, y]
            .iter()
            .map(|v| v.addr() as *mut c_void)
            .collect();
        let pack = variant_pack(&uids, &ptrs, ws.addr() as *mut c_void)?;
        // SAFETY: the plan was finalized for these shapes and types; the pointers are device
        // memory the callers checked against them; the workspace holds what the plan needs.
        ok("cudnnBackendExecute", unsafe {
            dn::cudnnBackendExecute(self.handle(), plan.0, pack.0)
        })
    }
}
