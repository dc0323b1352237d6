//! cuDNN's legacy convolution API: descriptors, `cudnnFindConvolutionForwardAlgorithmEx` (which
//! runs every applicable algorithm on the real buffers) or cuDNN's heuristic ranking
//! (`cudnnGetConvolutionForwardAlgorithm_v7`, which runs nothing), the bare convolution and the fused
//! `y = act(conv(x) + bias + z)` of `cudnnConvolutionBiasActivationForward`.

use super::{ok, Conv, Dnn, Strict};
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cudnn::sys as dn;
use std::ffi::c_void;

/// How many of cuDNN's fastest algorithms for a convolution an exhaustive search times as the
/// fused call.
const FUSED_TRIALS: usize = 6;
/// How many of cuDNN's suggested legacy algorithms a fast search times.
const FAST_LEGACY_TRIALS: usize = 3;

/// The legacy forward algorithms, with the names the choice cache and the reports use.
pub(super) const FWD_ALGOS: [(&str, dn::cudnnConvolutionFwdAlgo_t); 8] = {
    use dn::cudnnConvolutionFwdAlgo_t as F;
    [
        ("IMPLICIT_GEMM", F::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM),
        (
            "IMPLICIT_PRECOMP_GEMM",
            F::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        ),
        ("GEMM", F::CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
        ("DIRECT", F::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT),
        ("FFT", F::CUDNN_CONVOLUTION_FWD_ALGO_FFT),
        ("FFT_TILING", F::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING),
        ("WINOGRAD", F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD),
        (
            "WINOGRAD_NONFUSED",
            F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        ),
    ]
};

/// The legacy math types, with the names the choice cache uses.
pub(super) const MATH_TYPES: [(&str, dn::cudnnMathType_t); 4] = {
    use dn::cudnnMathType_t as M;
    [
        ("DEFAULT", M::CUDNN_DEFAULT_MATH),
        ("TENSOR_OP", M::CUDNN_TENSOR_OP_MATH),
        (
            "TENSOR_OP_ALLOW_CONVERSION",
            M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        ),
        ("FMA", M::CUDNN_FMA_MATH),
    ]
};

pub(super) fn algo_name(algo: dn::cudnnConvolutionFwdAlgo_t) -> &'static str {
    FWD_ALGOS
        .iter()
        .find(|(_, a)| *a == algo)
        .map_or("unknown algorithm", |(n, _)| n)
}

pub(super) fn math_name(math: dn::cudnnMathType_t) -> &'static str {
    MATH_TYPES
        .iter()
        .find(|(_, m)| *m == math)
        .map_or("unknown math", |(n, _)| n)
}

/// A measured (or cached) row of cuDNN's algorithm search: algorithm, math type, workspace and
/// time (0 when it came from the cache).
#[derive(Clone, Copy)]
pub(super) struct AlgoRow {
    pub algo: dn::cudnnConvolutionFwdAlgo_t,
    pub math: dn::cudnnMathType_t,
    pub workspace_bytes: usize,
    pub ms: f32,
}

impl From<&dn::cudnnConvolutionFwdAlgoPerfStruct> for AlgoRow {
    fn from(r: &dn::cudnnConvolutionFwdAlgoPerfStruct) -> AlgoRow {
        AlgoRow {
            algo: r.algo,
            math: r.mathType,
            workspace_bytes: r.memory,
            ms: r.time,
        }
    }
}

/// Descriptors of one convolution and the algorithm chosen for it.
pub struct ConvPlan {
    pub(super) x: dn::cudnnTensorDescriptor_t,
    pub(super) w: dn::cudnnFilterDescriptor_t,
    pub(super) y: dn::cudnnTensorDescriptor_t,
    pub(super) desc: dn::cudnnConvolutionDescriptor_t,
    row: AlgoRow,
    pub conv: Conv,
    /// The chosen algorithm's name.
    pub algo_name: String,
}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: created in describe (null when creation never happened, which cuDNN's destroy
        // calls accept), destroyed only here.
        unsafe {
            dn::cudnnDestroyTensorDescriptor(self.x);
            dn::cudnnDestroyTensorDescriptor(self.y);
            dn::cudnnDestroyFilterDescriptor(self.w);
            dn::cudnnDestroyConvolutionDescriptor(self.desc);
        }
    }
}

impl ConvPlan {
    /// The descriptors of a convolution (no algorithm chosen yet).
    pub(super) fn describe(conv: Conv) -> Result<ConvPlan> {
        let dt = conv.data_type()?;
        let fmt = conv.format();
        let sh = conv.shape;
        let (p, q) = sh.out_hw();
        let i = |v: usize| {
            i32::try_from(v).map_err(|_| Error::Invalid(format!("{v} exceeds cuDNN's int")))
        };
        let mut plan = ConvPlan {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            desc: std::ptr::null_mut(),
            row: AlgoRow {
                algo: dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                math: conv.math(),
                workspace_bytes: 0,
                ms: 0.0,
            },
            conv,
            algo_name: String::new(),
        };
        // SAFETY: each create writes a descriptor that `plan` owns and destroys on drop (also on
        // an early return, since the fields are set as they are created).
        unsafe {
            ok(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut plan.x),
            )?;
            ok(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut plan.y),
            )?;
            ok(
                "cudnnCreateFilterDescriptor",
                dn::cudnnCreateFilterDescriptor(&mut plan.w),
            )?;
            ok(
                "cudnnCreateConvolutionDescriptor",
                dn::cudnnCreateConvolutionDescriptor(&mut plan.desc),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(
                    plan.x,
                    fmt,
                    dt,
                    i(sh.n)?,
                    i(sh.c)?,
                    i(sh.h)?,
                    i(sh.w)?,
                ),
            )?;
            ok(
                "cudnnSetFilter4dDescriptor",
                dn::cudnnSetFilter4dDescriptor(
                    plan.w,
                    dt,
                    fmt,
                    i(sh.k)?,
                    i(sh.group_channels())?,
                    i(sh.r)?,
                    i(sh.s)?,
                ),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(plan.y, fmt, dt, i(sh.n)?, i(sh.k)?, i(p)?, i(q)?),
            )?;
            ok(
                "cudnnSetConvolution2dDescriptor",
                dn::cudnnSetConvolution2dDescriptor(
                    plan.desc,
                    i(sh.pad)?,
                    i(sh.pad)?,
                    i(sh.stride)?,
                    i(sh.stride)?,
                    1,
                    1,
                    dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
            )?;
            ok(
                "cudnnSetConvolutionMathType",
                dn::cudnnSetConvolutionMathType(plan.desc, conv.math()),
            )?;
            if sh.groups != 1 {
                ok(
                    "cudnnSetConvolutionGroupCount",
                    dn::cudnnSetConvolutionGroupCount(plan.desc, i(sh.groups)?),
                )?;
            }
        }
        Ok(plan)
    }

    /// Makes `row` (one of cuDNN's measured rows, or a cached one) this plan's algorithm.
    pub(super) fn apply(&mut self, row: AlgoRow) -> Result<()> {
        self.row = row;
        self.algo_name = algo_name(row.algo).to_string();
        // SAFETY: live descriptor; the row's math type is what it was measured with.
        ok("cudnnSetConvolutionMathType", unsafe {
            dn::cudnnSetConvolutionMathType(self.desc, row.math)
        })
    }

    pub(super) fn row(&self) -> AlgoRow {
        self.row
    }

    /// Bytes this plan's algorithm needs as workspace.
    pub fn workspace_bytes(&self) -> usize {
        self.row.workspace_bytes
    }

    /// Whether the algorithm runs with tensor-op math.
    pub fn tensor_cores(&self) -> bool {
        matches!(
            self.row.math,
            dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                | dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
        )
    }

    /// cuDNN's own time for the algorithm when it was measured.
    pub fn measured_ms(&self) -> Option<f64> {
        (self.row.ms > 0.0).then_some(f64::from(self.row.ms))
    }

    /// Bytes of the output tensor.
    pub fn output_bytes(&self) -> usize {
        self.conv.output_bytes()
    }
}

/// A convolution with bias, optional residual and activation fused into one cuDNN call.
pub struct FusedConv {
    pub conv: ConvPlan,
    bias: dn::cudnnTensorDescriptor_t,
    act: dn::cudnnActivationDescriptor_t,
    pub relu: bool,
}

impl Drop for FusedConv {
    fn drop(&mut self) {
        // SAFETY: created in fused_base (null when creation never happened), destroyed here.
        unsafe {
            if !self.bias.is_null() {
                dn::cudnnDestroyTensorDescriptor(self.bias);
            }
            if !self.act.is_null() {
                dn::cudnnDestroyActivationDescriptor(self.act);
            }
        }
    }
}

impl FusedConv {
    /// The descriptors of a fused convolution, no algorithm chosen.
    pub(super) fn describe(conv: Conv, relu: bool) -> Result<FusedConv> {
        let plan = ConvPlan::describe(conv)?;
        let dt = conv.data_type()?;
        let mut fused = FusedConv {
            conv: plan,
            bias: std::ptr::null_mut(),
            act: std::ptr::null_mut(),
            relu,
        };
        let k = i32::try_from(conv.shape.k)
            .map_err(|_| Error::Invalid("output channels exceed cuDNN's int".into()))?;
        // SAFETY: each create writes a descriptor that `fused` owns and destroys on drop.
        unsafe {
            ok(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut fused.bias),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(fused.bias, conv.format(), dt, 1, k, 1, 1),
            )?;
            ok(
                "cudnnCreateActivationDescriptor",
                dn::cudnnCreateActivationDescriptor(&mut fused.act),
            )?;
            let mode = if relu {
                dn::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU
            } else {
                dn::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY
            };
            ok(
                "cudnnSetActivationDescriptor",
                dn::cudnnSetActivationDescriptor(
                    fused.act,
                    mode,
                    dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    0.0,
                ),
            )?;
        }
        Ok(fused)
    }
}

impl Dnn {
    /// The legacy algorithms for `plan`, best first, that fit the workspace and (for strict
    /// f32) stay off tensor cores. An exhaustive search has cuDNN run every algorithm on these
    /// buffers (`cudnnFindConvolutionForwardAlgorithmEx`, ordered by its times); the others take
    /// cuDNN's heuristic ranking (`cudnnGetConvolutionForwardAlgorithm_v7`), which runs
    /// nothing, and time the first few themselves.
    pub(super) fn legacy_candidates(
        &self,
        plan: &ConvPlan,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
    ) -> Result<Vec<AlgoRow>> {
        if self.search() != super::Search::Exhaustive {
            return self.suggested_rows(plan);
        }
        plan.conv.check(x, w, y)?;
        let mut perf = self.perf_slots()?;
        let mut returned = 0;
        let wsb = self.planning_workspace()?;
        let ws = wsb.view();
        // SAFETY: descriptors match the buffers (sizes checked above); the workspace is ours.
        ok("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
            dn::cudnnFindConvolutionForwardAlgorithmEx(
                self.handle(),
                plan.x,
                x.addr() as *const c_void,
                plan.w,
                w.addr() as *const c_void,
                plan.desc,
                plan.y,
                y.addr() as *mut c_void,
                perf.len() as i32,
                &mut returned,
                perf.as_mut_ptr(),
                ws.addr() as *mut c_void,
                ws.bytes(),
            )
        })?;
        perf.truncate(returned.max(0) as usize);
        // cuDNN sorts by time
        Ok(usable(self.strict(plan.conv.dtype), &perf)
            .filter(|r| r.workspace_bytes <= ws.bytes())
            .collect())
    }

    /// As many empty result slots as cuDNN has legacy forward algorithms.
    fn perf_slots(&self) -> Result<Vec<dn::cudnnConvolutionFwdAlgoPerfStruct>> {
        let mut max = 0;
        // SAFETY: live handle, out-pointer to a local.
        ok("cudnnGetConvolutionForwardAlgorithmMaxCount", unsafe {
            dn::cudnnGetConvolutionForwardAlgorithmMaxCount(self.handle(), &mut max)
        })?;
        // SAFETY: zeroed POD structs, overwritten by cuDNN.
        Ok(vec![unsafe { std::mem::zeroed() }; max.max(1) as usize])
    }

    /// cuDNN's heuristic ranking of the legacy algorithms for `plan` (nothing is run): those
    /// it supports, within the workspace limit and (strict f32) off tensor cores.
    fn suggested_rows(&self, plan: &ConvPlan) -> Result<Vec<AlgoRow>> {
        let mut perf = self.perf_slots()?;
        let mut returned = 0;
        // SAFETY: live handle and descriptors; `perf` holds as many structs as asked for.
        ok("cudnnGetConvolutionForwardAlgorithm_v7", unsafe {
            dn::cudnnGetConvolutionForwardAlgorithm_v7(
                self.handle(),
                plan.x,
                plan.w,
                plan.desc,
                plan.y,
                perf.len() as i32,
                &mut returned,
                perf.as_mut_ptr(),
            )
        })?;
        perf.truncate(returned.max(0) as usize);
        Ok(usable(self.strict(plan.conv.dtype), &perf)
            // a suggestion carries no time of its own
            .map(|row| AlgoRow { ms: 0.0, ..row })
            .filter_map(|row| self.workspace_for(plan, row).ok())
            .collect())
    }

    /// The workspace `row`'s algorithm needs for `plan` (asked of cuDNN), or an error when it
    /// is over the workspace limit.
    pub(super) fn workspace_for(&self, plan: &ConvPlan, mut row: AlgoRow) -> Result<AlgoRow> {
        let mut bytes = 0;
        // SAFETY: live handle and descriptors; out-pointer to a local.
        ok("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
            dn::cudnnGetConvolutionForwardWorkspaceSize(
                self.handle(),
                plan.x,
                plan.w,
                plan.desc,
                plan.y,
                row.algo,
                &mut bytes,
            )
        })?;
        if bytes > self.workspace_limit() {
            return Err(Error::NoAlgorithm(format!(
                "{} needs {bytes} bytes of workspace, over the limit of {}",
                algo_name(row.algo),
                self.workspace_limit()
            )));
        }
        row.workspace_bytes = bytes;
        Ok(row)
    }

    /// The bare legacy convolution with cuDNN's fastest measured algorithm on these buffers.
    pub(super) fn plan_legacy(
        &self,
        conv: Conv,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        beat: Option<f64>,
    ) -> Result<ConvPlan> {
        let mut plan = ConvPlan::describe(conv)?;
        let candidates = self.legacy_candidates(&plan, x, w, y)?;
        let best = match self.search() {
            // cuDNN's own timing ordered them; its first suggestion stands untimed
            super::Search::Exhaustive | super::Search::Heuristic => candidates.first().copied(),
            super::Search::Fast => {
                let wsb = self.planning_workspace()?;
                let ws = wsb.view();
                let mut best: Option<AlgoRow> = None;
                for &row in candidates.iter().take(FAST_LEGACY_TRIALS) {
                    plan.apply(row)?;
                    self.count(|s| s.candidates_timed += 1);
                    let to_beat = best.map(|b| f64::from(b.ms)).or(beat);
                    let timing = std::time::Instant::now();
                    let timed =
                        self.call_ms_within(to_beat, || self.conv_forward(&plan, x, w, y, ws));
                    trace_legacy(conv, row, &timed, timing);
                    let Ok(ms) = timed else {
                        continue;
                    };
                    if best.is_none_or(|b| ms < f64::from(b.ms)) {
                        best = Some(AlgoRow {
                            ms: ms as f32,
                            ..row
                        });
                    }
                }
                best
            }
        }
        .ok_or_else(|| Error::NoAlgorithm(format!("{conv:?}")))?;
        plan.apply(best)?;
        Ok(plan)
    }

    /// The fused legacy call `y = act(conv(x, w) + bias [+ z])`. With ReLU, cuDNN's fastest
    /// algorithms for the convolution are timed *as the fused call* (cuDNN's own search times
    /// the bare convolution, and an algorithm that is fast alone may not fuse) and the fastest
    /// is kept. With identity cuDNN fuses only IMPLICIT_PRECOMP_GEMM, which is then used.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_fused_legacy(
        &self,
        conv: Conv,
        relu: bool,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
        beat: Option<f64>,
    ) -> Result<FusedConv> {
        let mut fused = FusedConv::describe(conv, relu)?;
        if !relu {
            let row = AlgoRow {
                algo:
                    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                math: conv.math(),
                workspace_bytes: 0,
                ms: 0.0,
            };
            let row = self.workspace_for(&fused.conv, row)?;
            fused.conv.apply(row)?;
            return Ok(fused);
        }
        let candidates = self.legacy_candidates(&fused.conv, x, w, y)?;
        let wsb = self.planning_workspace()?;
        let ws = wsb.view();
        let mut best: Option<(f64, AlgoRow)> = None;
        let search = self.search();
        let trials = match search {
            super::Search::Exhaustive => FUSED_TRIALS,
            _ => FAST_LEGACY_TRIALS,
        };
        for &row in candidates.iter().take(trials) {
            fused.conv.apply(row)?;
            // a heuristic search takes the first suggestion that runs fused, untimed
            if search == super::Search::Heuristic {
                if self.fused_forward(&fused, x, w, bias, z, y, ws).is_ok() {
                    best = Some((0.0, row));
                    break;
                }
                continue;
            }
            // an algorithm that cannot run fused is skipped, not fatal; a fast search stops
            // timing one that cannot win
            self.count(|s| s.candidates_timed += 1);
            let to_beat = match search {
                super::Search::Fast => best.map(|(t, _)| t).or(beat),
                _ => None,
            };
            let timing = std::time::Instant::now();
            let timed =
                self.call_ms_within(to_beat, || self.fused_forward(&fused, x, w, bias, z, y, ws));
            trace_legacy(conv, row, &timed, timing);
            let Ok(median) = timed else {
                continue;
            };
            if best.is_none_or(|(t, _)| median < t) {
                best = Some((median, row));
            }
        }
        let (ms, row) = best.ok_or_else(|| Error::NoAlgorithm(format!("{conv:?} fused")))?;
        fused.conv.apply(AlgoRow {
            ms: ms as f32,
            ..row
        })?;
        Ok(fused)
    }

    /// y = conv(x, w) with the plan's algorithm and the workspace `ws` (at least what the plan
    /// needs).
    pub fn conv_forward(
        &self,
        plan: &ConvPlan,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        plan.conv.check(x, w, y)?;
        ws.require(plan.workspace_bytes(), "convolution workspace")?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: buffer sizes checked against the plan's descriptors; scalars are f32 as cuDNN
        // wants for float/half data; the workspace holds what the algorithm asked for.
        ok("cudnnConvolutionForward", unsafe {
            dn::cudnnConvolutionForward(
                self.handle(),
                &alpha as *const f32 as *const c_void,
                plan.x,
                x.addr() as *const c_void,
                plan.w,
                w.addr() as *const c_void,
                plan.desc,
                plan.row.algo,
                ws.addr() as *mut c_void,
                plan.workspace_bytes(),
                &beta as *const f32 as *const c_void,
                plan.y,
                y.addr() as *mut c_void,
            )
        })
    }

    /// Runs a fused convolution: `y = act(conv(x, w) + bias + z)`, or without `z` when None,
    /// with the workspace `ws` (at least what the plan needs). `z` must have `y`'s shape and
    /// type; it may be `y` itself only where the caller checked that the engine allows it.
    #[allow(clippy::too_many_arguments)]
    pub fn fused_forward(
        &self,
        plan: &FusedConv,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        let c = &plan.conv;
        c.conv.check(x, w, y)?;
        ws.require(c.workspace_bytes(), "convolution workspace")?;
        bias.require(
            c.conv.shape.k * c.conv.dtype.size_bytes(),
            "convolution bias",
        )?;
        if let Some(z) = z {
            z.require(c.output_bytes(), "residual input")?;
        }
        let alpha1 = 1f32;
        let alpha2 = if z.is_some() { 1f32 } else { 0f32 };
        // with alpha2 = 0 cuDNN does not read z, but it still wants a valid pointer
        let zp = z.unwrap_or(y).addr();
        // SAFETY: sizes checked against the descriptors; z has y's descriptor; scalars are f32
        // for float/half/bf16 data; the workspace is large enough (checked above).
        ok("cudnnConvolutionBiasActivationForward", unsafe {
            dn::cudnnConvolutionBiasActivationForward(
                self.handle(),
                &alpha1 as *const f32 as *const c_void,
                c.x,
                x.addr() as *const c_void,
                c.w,
                w.addr() as *const c_void,
                c.desc,
                c.row.algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes(),
                &alpha2 as *const f32 as *const c_void,
                c.y,
                zp as *const c_void,
                plan.bias,
                bias.addr() as *const c_void,
                plan.act,
                c.y,
                y.addr() as *mut c_void,
            )
        })
    }
}

/// Whether a legacy algorithm sums the products as written: not through Winograd's or FFT's
/// transforms, whose rounding puts deep models' f32 outputs farther from float64 than other f32
/// frameworks' (exact f32 leaves them out).
pub(super) fn exact_f32_algo(algo: dn::cudnnConvolutionFwdAlgo_t) -> bool {
    use dn::cudnnConvolutionFwdAlgo_t as F;
    !matches!(
        algo,
        F::CUDNN_CONVOLUTION_FWD_ALGO_FFT
            | F::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING
            | F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD
            | F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
    )
}

/// The results cuDNN reports as supported, as rows; for strict f32 only those with FMA math
/// (default math permits TF32 tensor cores on Ampere and newer; the cache keeps the same rule),
/// for exact f32 also off Winograd and FFT transforms ([`exact_f32_algo`]).
fn usable(
    strict: Strict,
    perf: &[dn::cudnnConvolutionFwdAlgoPerfStruct],
) -> impl Iterator<Item = AlgoRow> + '_ {
    perf.iter()
        .filter(|r| r.status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
        .filter(move |r| !strict.f32() || r.mathType == dn::cudnnMathType_t::CUDNN_FMA_MATH)
        .filter(move |r| strict != Strict::Exact || exact_f32_algo(r.algo))
        .map(AlgoRow::from)
}

/// With `GPUKIT_TRACE=1`: a legacy algorithm timed by a fast search, and the host time it took.
fn trace_legacy(conv: Conv, row: AlgoRow, timed: &Result<f64>, started: std::time::Instant) {
    crate::trace::note(|| {
        let t = timed
            .as_ref()
            .map(|ms| format!("{ms:.4} ms"))
            .unwrap_or_else(|e| e.to_string());
        format!(
            "{conv:?} legacy {}: {t} (timed in {:.1} ms)",
            algo_name(row.algo),
            started.elapsed().as_secs_f64() * 1e3
        )
    });
}
