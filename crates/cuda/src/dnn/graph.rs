//! Convolutions through cuDNN's backend (graph) API: one operation graph
//! `y = relu(conv(x, w) + bias [+ z])`, or the bare convolution (f32 arithmetic inside, the
//! storage type outside),
//! engine configurations from cuDNN's heuristics, each finalized and timed on the real buffers,
//! the fastest kept. This reaches the engines (runtime-fused and Hopper-specific kernels) that
//! the legacy `cudnnConvolutionBiasActivationForward` does not.
//!
//! To use: [`Dnn::plan_graph`] once per convolution and set of buffers (the selection policy in
//! `select` does), then [`Dnn::graph_forward`] (enqueues only; capturable in a CUDA graph).

use super::cache::List;
use super::{ok, Conv, Dnn, Search};
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cudnn::sys as dn;
use dn::cudnnBackendAttributeName_t as A;
use dn::cudnnBackendAttributeType_t as T;
use dn::cudnnBackendDescriptorType_t as D;
use gpukit_types::{DType, Layout};
use std::ffi::c_void;

/// An owned backend descriptor.
struct Desc(dn::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by cudnnBackendCreateDescriptor, destroyed only here.
            unsafe { dn::cudnnBackendDestroyDescriptor(self.0) };
        }
    }
}

impl Desc {
    fn new(ty: D) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        ok("cudnnBackendCreateDescriptor", unsafe {
            dn::cudnnBackendCreateDescriptor(ty, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Sets an attribute to `values` (`T` must be the C type that `ty` names).
    fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<&Self> {
        // SAFETY: `values` is a live slice of the element type `ty` names (each caller pairs
        // them); cuDNN copies the values before returning.
        ok("cudnnBackendSetAttribute", unsafe {
            dn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        })?;
        Ok(self)
    }

    fn set_desc(&self, name: A, other: &[&Desc]) -> Result<&Self> {
        let raw: Vec<dn::cudnnBackendDescriptor_t> = other.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn finalize(&self) -> Result<()> {
        // SAFETY: a live descriptor with its required attributes set.
        ok("cudnnBackendFinalize", unsafe {
            dn::cudnnBackendFinalize(self.0)
        })
    }
}

/// A planned fused convolution: its execution plan and the tensor ids the variant pack binds.
pub struct GraphConv {
    plan: Desc,
    /// Every descriptor the plan was built from (tensors, operations, graph, heuristics, the
    /// engine configuration), alive as long as the plan: finalized descriptors refer to the
    /// ones they were set from (cuDNN's own frontend keeps them too), so destroying them
    /// early would leave the plan pointing at freed memory.
    _built_from: Vec<Desc>,
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

const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_B: i64 = 3;
const UID_Z: i64 = 4;
const UID_Y: i64 = 5;
const UID_CONV: i64 = 10;
const UID_BIASED: i64 = 11;

/// How many of the heuristic's engine configurations are finalized and timed: all of them up
/// to this bound (cuDNN 9.19 suggests 33 for a bf16 1x1 convolution on an H100), as PyTorch's
/// cudnn.benchmark times its whole list; with only the first 16, a faster engine ranked lower
/// was never tried. Planning is measured once per convolution and kept on disk.
const GRAPH_TRIALS: usize = 64;
/// Then this many of cuDNN's fallback engines (after the heuristic's list).
const GRAPH_FALLBACK_TRIALS: usize = 16;
/// Strict f32 reads this many of each list, of which it times at most [`GRAPH_TRIALS`]
/// engines without tensor cores.
const STRICT_F32_LIST: usize = 64;

/// Up to `limit` engine configurations cuDNN's heuristics in `mode` suggest for `graph`, best
/// first, with the heuristics descriptor they came from (to be kept alive beside them).
fn heuristic_configs(
    graph: &Desc,
    mode: dn::cudnnBackendHeurMode_t,
    limit: usize,
) -> Result<(Vec<Desc>, Desc)> {
    let started = std::time::Instant::now();
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?
        .set(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[mode],
        )?;
    heur.finalize()?;
    let mut count = 0i64;
    // SAFETY: asks for the number of results only (no array).
    ok("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    })?;
    let wanted = (count.max(0) as usize).min(limit);
    let mut configs: Vec<Desc> = (0..wanted)
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<_, _>>()?;
    let mut raw: Vec<dn::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.0).collect();
    let mut got = 0i64;
    if wanted > 0 {
        // SAFETY: `raw` holds `wanted` created engine-config descriptors for cuDNN to fill.
        ok("cudnnBackendGetAttribute", unsafe {
            dn::cudnnBackendGetAttribute(
                heur.0,
                A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                wanted as i64,
                &mut got,
                raw.as_mut_ptr() as *mut c_void,
            )
        })?;
    }
    configs.truncate(got.clamp(0, wanted as i64) as usize);
    if crate::trace::on() {
        eprintln!(
            "trace: cuDNN heuristics {mode:?}: {count} configurations, {} read in {:.2} ms",
            configs.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok((configs, heur))
}

fn tensor(
    uid: i64,
    dims: [usize; 4],
    layout: Layout,
    dt: dn::cudnnDataType_t,
    is_virtual: bool,
) -> Result<Desc> {
    let strides = layout.strides(dims).map(|v| v as i64);
    let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[dt],
    )?
    .set(
        A::CUDNN_ATTR_TENSOR_DIMENSIONS,
        T::CUDNN_TYPE_INT64,
        &dims.map(|v| v as i64),
    )?
    .set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?
    .set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[uid])?
    .set(
        A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        T::CUDNN_TYPE_INT64,
        &[16i64],
    )?
    .set(
        A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
        T::CUDNN_TYPE_BOOLEAN,
        &[is_virtual],
    )?;
    d.finalize()?;
    Ok(d)
}

fn pointwise(mode: dn::cudnnPointwiseMode_t) -> Result<Desc> {
    let d = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
    d.set(
        A::CUDNN_ATTR_POINTWISE_MODE,
        T::CUDNN_TYPE_POINTWISE_MODE,
        &[mode],
    )?
    .set(
        A::CUDNN_ATTR_POINTWISE_MATH_PREC,
        T::CUDNN_TYPE_DATA_TYPE,
        &[dn::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?;
    d.finalize()?;
    Ok(d)
}

fn pointwise_op(pw: &Desc, x: &Desc, b: Option<&Desc>, y: &Desc) -> Result<Desc> {
    let d = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    d.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[pw])?
        .set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?
        .set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
    if let Some(b) = b {
        d.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
    }
    d.finalize()?;
    Ok(d)
}

/// cuDNN's global index of the engine behind an engine configuration, and whether its
/// numerical notes say it runs on tensor cores.
fn engine_facts(cfg: &Desc) -> Result<(i64, Option<bool>)> {
    let engine = engine_of(cfg)?;
    let mut n = 0i64;
    let mut index = -1i64;
    // SAFETY: one INT64 into a local.
    ok("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            engine.0,
            A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
            T::CUDNN_TYPE_INT64,
            1,
            &mut n,
            &mut index as *mut i64 as *mut c_void,
        )
    })?;
    let tensor_cores = notes(
        &engine,
        A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
        T::CUDNN_TYPE_NUMERICAL_NOTE,
        dn::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
    )
    .map(|n| n.contains(&dn::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_TENSOR_CORE));
    Ok((index, tensor_cores))
}

/// An engine's notes of one kind (`ty` names the C enum `N`); None when cuDNN does not say.
fn notes<N: Copy>(engine: &Desc, attr: A, ty: T, empty: N) -> Option<Vec<N>> {
    let mut notes = [empty; 16];
    let mut count = 0i64;
    // SAFETY: an array of 16 notes of the enum `ty` names; cuDNN writes at most that many and
    // says how many.
    let read = ok("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            engine.0,
            attr,
            ty,
            notes.len() as i64,
            &mut count,
            notes.as_mut_ptr() as *mut c_void,
        )
    });
    read.ok()
        .map(|()| notes[..count.clamp(0, notes.len() as i64) as usize].to_vec())
}

/// The engine of an engine configuration.
fn engine_of(cfg: &Desc) -> Result<Desc> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut n = 0i64;
    let mut raw = engine.0;
    // SAFETY: one descriptor, created above, for cuDNN to fill with the configuration's engine.
    ok("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            cfg.0,
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            &mut n,
            &mut raw as *mut dn::cudnnBackendDescriptor_t as *mut c_void,
        )
    })?;
    Ok(engine)
}

/// Whether the configuration's engine compiles its kernel at run time (cuDNN's behaviour
/// note): finalizing such a plan runs NVRTC, about half a second each, where a precompiled
/// engine's takes milliseconds. False when cuDNN does not say.
fn compiles_at_run_time(cfg: &Desc) -> bool {
    let Ok(engine) = engine_of(cfg) else {
        return false;
    };
    notes(
        &engine,
        A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
        T::CUDNN_TYPE_BEHAVIOR_NOTE,
        dn::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_TYPE_COUNT,
    )
    .is_some_and(|n| {
        n.contains(&dn::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)
    })
}

/// Candidates timed a second time before the fastest backend engine is chosen.
const FINALISTS: usize = 4;
/// A fast search reads this many of the heuristic's ranking and [`FAST_FALLBACK`] of the
/// fallback engines, times at most [`FAST_TIMED`] candidates that finalize (stopping a
/// candidate's timing when it cannot win), finalizes at most [`FAST_RUNTIME_COMPILED`] engine
/// that compiles its kernel at run time, and confirms [`FAST_FINALISTS`] finalists in
/// interleaved rounds. Precompiled engines finalize in milliseconds and time in fractions of
/// one, so reading past the first few costs little; the winners of an exhaustive search on an
/// H100 sat up to 12th in the ranking, and in the fallback list.
const FAST_LIST: usize = 16;
const FAST_FALLBACK: usize = 4;
const FAST_TIMED: usize = 20;
const FAST_FINALISTS: usize = 4;
const FAST_RUNTIME_COMPILED: usize = 1;
/// A heuristic search reads the fallback list only when fewer than this many of the
/// heuristic's suggestions finalized.
const HEURISTIC_ENOUGH: usize = 1;

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
        relu: bool,
        y: View<'_>,
        only: Option<(List, usize)>,
    ) -> Result<GraphConv> {
        if conv.dtype == DType::F64 {
            return Err(Error::NoAlgorithm(
                "f64 stays on the legacy API".to_string(),
            ));
        }
        let strict_f32 = !conv.dtype.uses_tensor_cores();
        conv.check(x, w, y)?;
        let sh = conv.shape;
        let e = conv.dtype.size_bytes();
        if let Some(bias) = bias {
            bias.require(sh.k * e, "graph conv bias")?;
        }
        if let Some(z) = z {
            z.require(conv.output_bytes(), "graph conv residual")?;
        }
        let dt = conv.data_type()?;
        let f32t = dn::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let layout = conv.layout;
        let (p, q) = sh.out_hw();
        let out = [sh.n, sh.k, p, q];
        let tx = tensor(UID_X, [sh.n, sh.c, sh.h, sh.w], layout, dt, false)?;
        let tw = tensor(UID_W, [sh.k, sh.c, sh.r, sh.s], layout, dt, false)?;
        // the epilogue in order: +bias, +residual, ReLU; the conv's own output is a virtual f32
        // tensor unless nothing follows it
        let epilogue = usize::from(bias.is_some()) + usize::from(z.is_some()) + usize::from(relu);
        let ty_out = tensor(UID_Y, out, layout, dt, false)?;
        let tconv = if epilogue == 0 {
            None
        } else {
            Some(tensor(UID_CONV, out, layout, f32t, true)?)
        };
        let tb = match bias {
            Some(_) => Some(tensor(UID_B, [1, sh.k, 1, 1], layout, dt, false)?),
            None => None,
        };
        let tz = match z {
            Some(_) => Some(tensor(UID_Z, out, layout, dt, false)?),
            None => None,
        };
        let mut virtuals = Vec::new();
        for i in 0..epilogue.saturating_sub(1) {
            virtuals.push(tensor(UID_BIASED + i as i64, out, layout, f32t, true)?);
        }

        let desc = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        let two = |v: usize| [v as i64, v as i64];
        desc.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[f32t],
        )?
        .set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?
        .set(
            A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
            T::CUDNN_TYPE_INT64,
            &[2i64],
        )?
        .set(
            A::CUDNN_ATTR_CONVOLUTION_DILATIONS,
            T::CUDNN_TYPE_INT64,
            &two(1),
        )?
        .set(
            A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
            T::CUDNN_TYPE_INT64,
            &two(sh.stride),
        )?
        .set(
            A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
            T::CUDNN_TYPE_INT64,
            &two(sh.pad),
        )?
        .set(
            A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
            T::CUDNN_TYPE_INT64,
            &two(sh.pad),
        )?;
        desc.finalize()?;

        let conv_op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
        conv_op
            .set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[&tx])?
            .set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[&tw])?
            .set_desc(
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                &[tconv.as_ref().unwrap_or(&ty_out)],
            )?
            .set_desc(
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                &[&desc],
            )?
            .set(
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                T::CUDNN_TYPE_FLOAT,
                &[1f32],
            )?
            .set(
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                T::CUDNN_TYPE_FLOAT,
                &[0f32],
            )?;
        conv_op.finalize()?;

        let add = pointwise(dn::cudnnPointwiseMode_t::CUDNN_POINTWISE_ADD)?;
        let relu_pw = pointwise(dn::cudnnPointwiseMode_t::CUDNN_POINTWISE_RELU_FWD)?;
        let mut ops = vec![conv_op];
        if let Some(first) = &tconv {
            // each step reads the previous output; the last writes the real output tensor
            let outputs: Vec<&Desc> = virtuals.iter().chain(std::iter::once(&ty_out)).collect();
            let mut cur = first;
            let mut step = 0;
            for (pw, operand) in [(&add, tb.as_ref()), (&add, tz.as_ref())] {
                if let Some(b) = operand {
                    ops.push(pointwise_op(pw, cur, Some(b), outputs[step])?);
                    cur = outputs[step];
                    step += 1;
                }
            }
            if relu {
                ops.push(pointwise_op(&relu_pw, cur, None, outputs[step])?);
            }
        }

        let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        let op_refs: Vec<&Desc> = ops.iter().collect();
        graph
            .set_desc(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &op_refs)?
            .set(
                A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[self.handle()],
            )?;
        graph.finalize()?;

        // the candidates, by the search asked for: an exhaustive search reads cuDNN's whole
        // heuristic list (mode A) and its fallback list and times every configuration that
        // finalizes (what PyTorch's cudnn.benchmark times); a fast one finalizes the first few
        // of the heuristic's ranking and the fallback list only when those are too few; a
        // heuristic one takes the first that finalizes, untimed. Strict f32 reads longer lists
        // to find engines without tensor cores (the heuristic ranks tensor-core ones first).
        let search = self.search();
        let (list_a, list_fallback, timed_at_most) = match (only, search, strict_f32) {
            (Some((List::Heuristic, i)), _, _) => (i + 1, 0, 1),
            (Some((List::Fallback, i)), _, _) => (0, i + 1, 1),
            (None, Search::Exhaustive, true) => (STRICT_F32_LIST, STRICT_F32_LIST, GRAPH_TRIALS),
            (None, Search::Exhaustive, false) => (GRAPH_TRIALS, GRAPH_FALLBACK_TRIALS, usize::MAX),
            (None, Search::Fast, true) => (STRICT_F32_LIST, STRICT_F32_LIST, FAST_TIMED),
            (None, Search::Fast, false) => (FAST_LIST, FAST_FALLBACK, FAST_TIMED),
            (None, Search::Heuristic, true) => (STRICT_F32_LIST, STRICT_F32_LIST, 1),
            (None, Search::Heuristic, false) => (FAST_LIST, FAST_FALLBACK, 1),
        };
        let mut configs: Vec<(List, usize, Desc)> = Vec::new();
        let mut heurs = Vec::new();
        let mut count = 0;
        for (list, mode, limit) in [
            (
                List::Heuristic,
                dn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
                list_a,
            ),
            (
                List::Fallback,
                dn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
                list_fallback,
            ),
        ] {
            if limit == 0 {
                continue;
            }
            let (found, heur) = heuristic_configs(&graph, mode, limit)?;
            count += found.len();
            configs.extend(found.into_iter().enumerate().map(|(i, c)| (list, i, c)));
            heurs.push(heur);
        }
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
            if timed >= timed_at_most {
                break;
            }
            // strict f32: an engine that may use TF32 tensor cores (or does not say) is not a
            // candidate
            if strict_f32 && !matches!(engine_facts(cfg), Ok((_, Some(false)))) {
                continue;
            }
            // a fast search compiles few kernels: each costs more than timing every
            // precompiled candidate
            let compiled =
                only.is_none() && search != Search::Exhaustive && compiles_at_run_time(cfg);
            if compiled && runtime_compiled >= FAST_RUNTIME_COMPILED {
                continue;
            }
            runtime_compiled += usize::from(compiled);
            let finalizing = std::time::Instant::now();
            let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[self.handle()],
            )?
            .set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
            // a configuration that does not support this graph fails here: skip it
            let finalized_ok = plan.finalize().is_ok();
            crate::trace::note(|| {
                format!(
                    "{:.2} ms finalizing {list:?} #{index}{}{}",
                    finalizing.elapsed().as_secs_f64() * 1e3,
                    if compiled {
                        " (compiled at run time)"
                    } else {
                        ""
                    },
                    if finalized_ok { "" } else { ": not supported" }
                )
            });
            if !finalized_ok {
                continue;
            }
            let mut ws = 0i64;
            let mut n = 0i64;
            // SAFETY: one INT64 into a local.
            ok("cudnnBackendGetAttribute", unsafe {
                dn::cudnnBackendGetAttribute(
                    plan.0,
                    A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                    T::CUDNN_TYPE_INT64,
                    1,
                    &mut n,
                    &mut ws as *mut i64 as *mut c_void,
                )
            })?;
            let ws = ws.max(0) as usize;
            if ws > self.workspace_limit() {
                continue;
            }
            finalized += 1;
            let candidate = GraphConv {
                plan,
                _built_from: Vec::new(),
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
                     B: {t}"
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
            .map(|(ms, c)| (ms, c.pick, c.plan, c.workspace_bytes));
        let (ms, pick, plan, ws) = best.ok_or_else(|| {
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
        let mut built_from: Vec<Desc> = configs.into_iter().map(|(_, _, c)| c).collect();
        built_from.extend([tx, tw, ty_out, desc, add, relu_pw, graph]);
        built_from.extend(heurs);
        built_from.extend(tconv);
        built_from.extend(tb);
        built_from.extend(tz);
        built_from.extend(virtuals);
        built_from.extend(ops);
        Ok(GraphConv {
            plan,
            _built_from: built_from,
            packs: Default::default(),
            workspace_bytes: ws,
            residual: z.is_some(),
            has_bias: bias.is_some(),
            pick,
            choice: match (only, search) {
                (Some(_), _) => format!("backend engine {engine} (chosen in an earlier run)"),
                (None, Search::Heuristic) => {
                    format!("backend engine {engine} (cuDNN's first suggestion, untimed)")
                }
                (None, _) => format!("backend engine {engine} (fastest of {timed} timed)"),
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
            let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
            pack.set(
                A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                T::CUDNN_TYPE_INT64,
                &uids,
            )?
            .set(
                A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                T::CUDNN_TYPE_VOID_PTR,
                &ptrs,
            )?
            .set(
                A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                T::CUDNN_TYPE_VOID_PTR,
                &[ws.addr() as *mut c_void],
            )?;
            pack.finalize()?;
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
