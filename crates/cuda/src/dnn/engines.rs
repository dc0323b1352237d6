//! Which of cuDNN's engine configurations a search tries for one operation graph: the lists
//! its heuristics suggest, how many of each a search reads ([`Limits`]), what each engine says
//! of itself (global index, tensor cores, run-time compilation), and finalizing one into an
//! execution plan. Shared by the planner on the calling thread (`graph`) and the helper
//! threads that finalize the slow configurations ahead of it (`precompile`).

use super::cache::List;
use super::graph::Desc;
use super::{ok, Search, Strict};
use crate::error::Result;
use cudarc::cudnn::sys as dn;
use dn::cudnnBackendAttributeName_t as A;
use dn::cudnnBackendAttributeType_t as T;
use dn::cudnnBackendDescriptorType_t as D;
use std::ffi::c_void;

/// How many of the heuristic's engine configurations are finalized and timed: all of them up
/// to this bound (cuDNN 9.19 suggests 33 for a bf16 1x1 convolution on an H100), as PyTorch's
/// cudnn.benchmark times its whole list; with only the first 16, a faster engine ranked lower
/// was never tried. Planning is measured once per convolution and kept on disk.
pub(super) const GRAPH_TRIALS: usize = 64;
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

/// A fast search reads this many of the heuristic's ranking and [`FAST_FALLBACK`] of the
/// fallback engines, times at most [`FAST_TIMED`] candidates that finalize (stopping a
/// candidate's timing when it cannot win), finalizes at most [`FAST_RUNTIME_COMPILED`] engine
/// configurations that compile their kernel at run time (helper threads finalize them while
/// the planner times the others), and confirms [`FAST_FINALISTS`] finalists in interleaved
/// rounds. Precompiled engines finalize in milliseconds and time in fractions of one, so
/// reading past the first few costs little. On an H100 the winners of an exhaustive search sat
/// up to 12th in the ranking and in the fallback list, and the residual-fused convolutions of
/// ResNet-50 have almost only runtime-compiled configurations, whose best was the 10th: with
/// one of them finalized a convolution, batch 32 ran 6% slower than the exhaustive choice.
const FAST_LIST: usize = 16;
const FAST_FALLBACK: usize = 4;
const FAST_TIMED: usize = 20;
pub(super) const FAST_FINALISTS: usize = 6;
const FAST_RUNTIME_COMPILED: usize = 8;
/// A heuristic search reads the fallback list only when fewer than this many of the
/// heuristic's suggestions finalized.
pub(super) const HEURISTIC_ENOUGH: usize = 1;

/// How many configurations of each list a search reads, how many that finalize it times, and
/// how many that compile at run time it finalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    pub heuristic: usize,
    pub fallback: usize,
    pub timed: usize,
    /// At most this many configurations that compile their kernel at run time.
    pub runtime_compiled: usize,
    /// The one configuration wanted (a choice measured before), if any.
    pub only: Option<(List, usize)>,
    /// Which engines the convolution may run.
    pub strict: Strict,
}

impl Limits {
    /// The candidates, by the search asked for: an exhaustive search reads cuDNN's whole
    /// heuristic list (mode A) and its fallback list and times every configuration that
    /// finalizes (what PyTorch's cudnn.benchmark times); a fast one finalizes the first few of
    /// the heuristic's ranking and of the fallback list; a heuristic one takes the first that
    /// finalizes, untimed. Strict f32 reads longer lists to find engines without tensor cores
    /// (the heuristic ranks tensor-core ones first).
    pub fn of(search: Search, strict: Strict, only: Option<(List, usize)>) -> Limits {
        let (heuristic, fallback, timed) = match (only, search, strict.f32()) {
            (Some((List::Heuristic, i)), _, _) => (i + 1, 0, 1),
            (Some((List::Fallback, i)), _, _) => (0, i + 1, 1),
            (None, Search::Exhaustive, true) => (STRICT_F32_LIST, STRICT_F32_LIST, GRAPH_TRIALS),
            (None, Search::Exhaustive, false) => (GRAPH_TRIALS, GRAPH_FALLBACK_TRIALS, usize::MAX),
            (None, Search::Fast, true) => (STRICT_F32_LIST, STRICT_F32_LIST, FAST_TIMED),
            (None, Search::Fast, false) => (FAST_LIST, FAST_FALLBACK, FAST_TIMED),
            (None, Search::Heuristic, true) => (STRICT_F32_LIST, STRICT_F32_LIST, 1),
            (None, Search::Heuristic, false) => (FAST_LIST, FAST_FALLBACK, 1),
        };
        // a fast search compiles a bounded number of kernels (each costs a fifth of a second of
        // a core); a cached choice is built whatever it is
        let runtime_compiled = match (only, search) {
            (Some(_), _) | (None, Search::Exhaustive) => usize::MAX,
            (None, _) => FAST_RUNTIME_COMPILED,
        };
        Limits {
            heuristic,
            fallback,
            timed,
            runtime_compiled,
            only,
            strict,
        }
    }

    /// Whether `cfg` (from `list`) is a candidate, given how many configurations that compile
    /// at run time were taken before it: None when it is not (strict f32: an engine that may
    /// use TF32 tensor cores, or does not say; one compiled kernel too many; or, in a fast
    /// search, a fallback engine that compiles at run time), else whether it compiles at run
    /// time.
    pub fn wants(&self, (list, cfg): (List, &Desc), compiled_before: usize) -> Option<bool> {
        let admitted = match self.strict {
            Strict::Any => true,
            Strict::NoTensorCores => matches!(engine_facts(cfg), Ok((_, Some(false)))),
            Strict::Exact => exact_f32_engine(cfg),
        };
        if !admitted {
            return None;
        }
        let compiled = compiles_at_run_time(cfg);
        let bounded = self.runtime_compiled != usize::MAX;
        // the fallback list's runtime-compiled engines ran 50 to 300 times slower than the
        // winner on every ResNet-50 convolution of an H100 (an exhaustive search timed them)
        if compiled
            && (compiled_before >= self.runtime_compiled || bounded && list == List::Fallback)
        {
            return None;
        }
        Some(compiled)
    }
}

/// An engine configuration, with the list it came from and its index there.
pub(super) type Candidate = (List, usize, Desc);

/// The configurations the limits read from cuDNN's heuristic list (mode A), then its fallback
/// list, each with its list and index, and the heuristics descriptors they came from (to be kept
/// alive beside them).
pub(super) fn read_configs(graph: &Desc, limits: Limits) -> Result<(Vec<Candidate>, Vec<Desc>)> {
    let mut configs = Vec::new();
    let mut heurs = Vec::new();
    for (list, mode, limit) in [
        (
            List::Heuristic,
            dn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
            limits.heuristic,
        ),
        (
            List::Fallback,
            dn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
            limits.fallback,
        ),
    ] {
        if limit == 0 {
            continue;
        }
        let (found, heur) = heuristic_configs(graph, mode, limit)?;
        configs.extend(found.into_iter().enumerate().map(|(i, c)| (list, i, c)));
        heurs.push(heur);
    }
    Ok((configs, heurs))
}

/// Finalizes the execution plan of `cfg` on `handle`; None when the configuration does not
/// support the graph (cuDNN refuses to finalize it).
pub(super) fn finalize_plan(
    handle: dn::cudnnHandle_t,
    cfg: &Desc,
    (list, index): (List, usize),
    compiled: bool,
) -> Result<Option<Desc>> {
    let finalizing = std::time::Instant::now();
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set(
        A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?
    .set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
    let finalized = plan.finalize().is_ok();
    crate::trace::note(|| {
        format!(
            "{:.2} ms finalizing {list:?} #{index}{}{}{}",
            finalizing.elapsed().as_secs_f64() * 1e3,
            if compiled {
                " (compiled at run time)"
            } else {
                ""
            },
            if finalized { "" } else { ": not supported" },
            match std::thread::current().name() {
                Some(name) if name != "main" => format!(" on {name}"),
                _ => String::new(),
            }
        )
    });
    Ok(finalized.then_some(plan))
}

/// The workspace a finalized plan needs, in bytes.
pub(super) fn plan_workspace(plan: &Desc) -> Result<usize> {
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
    Ok(ws.max(0) as usize)
}

/// cuDNN's global index of the engine behind an engine configuration, and whether its
/// numerical notes say it runs on tensor cores.
pub(super) fn engine_facts(cfg: &Desc) -> Result<(i64, Option<bool>)> {
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

/// Whether an engine computes strict f32 as its sums are written: its numerical notes known,
/// and none of tensor cores, Winograd or FFT transforms, reduced-precision sums or inputs
/// converted down. Winograd's transforms put ResNet-50's f32 logits 2.0-2.3e-5 from float64,
/// farther than ONNX Runtime's f32 (1.4-1.7e-5).
pub(super) fn exact_f32_engine(cfg: &Desc) -> bool {
    use dn::cudnnBackendNumericalNote_t as N;
    let Ok(engine) = engine_of(cfg) else {
        return false;
    };
    let inexact = [
        N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13,
        N::CUDNN_NUMERICAL_NOTE_FFT,
        N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
    ];
    notes(
        &engine,
        A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
        T::CUDNN_TYPE_NUMERICAL_NOTE,
        N::CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
    )
    .is_some_and(|n| !n.iter().any(|x| inexact.contains(x)))
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
pub(super) fn compiles_at_run_time(cfg: &Desc) -> bool {
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
