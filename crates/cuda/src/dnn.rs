//! Convolution on the GPU through cuDNN, with the algorithm chosen by measurement
//! (`cudnnFindConvolutionForwardAlgorithmEx` runs every applicable algorithm on the real buffers).
//!
//! To use: [`Dnn::new`] on an open [`Gpu`]; [`Dnn::plan_conv`] describes one convolution and
//! measures its algorithms; [`Dnn::conv_forward`] runs the chosen one. The `*_views` forms take
//! [`View`]s into larger buffers (an inference engine's activation arena), and
//! [`Dnn::fused_forward`] runs `y = act(conv(x) + bias + z)` in one cuDNN call
//! (`cudnnConvolutionBiasActivationForward`).

use crate::blas::DeviceBytes;
use crate::driver::{CudaError, Gpu};
use crate::loader::{Discovery, Lib};
use crate::mem::View;
use cudarc::cudnn::sys as dn;
use cudarc::driver::CudaStream;
use std::ffi::c_void;
use std::sync::Arc;

/// Element type and arithmetic of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvType {
    /// f32 storage, f32 arithmetic (no tensor cores).
    F32,
    /// f32 storage, TF32 tensor cores allowed.
    Tf32,
    /// f16 storage, f32 accumulation, tensor cores.
    F16,
    /// bf16 storage, f32 accumulation, tensor cores.
    Bf16,
}

impl ConvType {
    pub fn elem_bytes(self) -> usize {
        match self {
            ConvType::F32 | ConvType::Tf32 => 4,
            ConvType::F16 | ConvType::Bf16 => 2,
        }
    }

    fn data_type(self) -> dn::cudnnDataType_t {
        match self {
            ConvType::F32 | ConvType::Tf32 => dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ConvType::F16 => dn::cudnnDataType_t::CUDNN_DATA_HALF,
            ConvType::Bf16 => dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        }
    }

    fn math(self) -> dn::cudnnMathType_t {
        match self {
            // FMA_MATH forbids TF32, which cuDNN otherwise uses for f32 on Ampere and newer
            ConvType::F32 => dn::cudnnMathType_t::CUDNN_FMA_MATH,
            ConvType::Tf32 | ConvType::F16 | ConvType::Bf16 => {
                dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            }
        }
    }
}

/// A 2-D convolution's shape: input N,C,H,W; filter K,C,R,S; no dilation, one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvDims {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub stride: usize,
    pub pad: usize,
    /// NHWC activations and KRSC filters; NCHW and KCRS otherwise.
    pub nhwc: bool,
}

impl ConvDims {
    pub fn out_hw(&self) -> (usize, usize) {
        (
            (self.h + 2 * self.pad - self.r) / self.stride + 1,
            (self.w + 2 * self.pad - self.s) / self.stride + 1,
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DnnError {
    #[error("{0}")]
    Cuda(#[from] CudaError),
    #[error("{call} failed: {status:?}")]
    Status {
        call: &'static str,
        status: dn::cudnnStatus_t,
    },
    #[error("cuDNN has no algorithm for this convolution ({0})")]
    NoAlgorithm(String),
}

fn ok(call: &'static str, status: dn::cudnnStatus_t) -> Result<(), DnnError> {
    if status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(DnnError::Status { call, status })
    }
}

/// How many of cuDNN's fastest algorithms for a convolution are timed as the fused call.
const FUSED_TRIALS: usize = 6;

/// Largest workspace an algorithm may use.
pub const CONV_WORKSPACE_BYTES: usize = 256 << 20;

/// A cuDNN handle on one stream. Planning borrows a workspace of [`CONV_WORKSPACE_BYTES`]
/// (allocated on first use, given back by [`Dnn::release_workspace`]); running a plan takes the
/// caller's workspace, sized to what the plan needs (see [`ConvChoice::workspace_bytes`]).
pub struct Dnn {
    stream: Arc<CudaStream>,
    handle: dn::cudnnHandle_t,
    workspace: std::cell::RefCell<Option<std::rc::Rc<DeviceBytes>>>,
    /// The most workspace a chosen algorithm may use ([`Dnn::set_workspace_limit`]).
    workspace_limit: std::cell::Cell<usize>,
    choices: std::cell::RefCell<Choices>,
}

/// Algorithm choices measured before, by convolution: kept on disk per GPU model and cuDNN
/// version so that a shape is measured once, not at every run (`GPUKIT_REPLAN=1` measures
/// again and overwrites them).
#[derive(Default)]
struct Choices {
    path: Option<std::path::PathBuf>,
    map: std::collections::BTreeMap<String, String>,
    dirty: bool,
    replan: bool,
}

impl Choices {
    fn open(gpu: &Gpu) -> Choices {
        let name = gpu.ctx.name().unwrap_or_default();
        let (major, minor) = gpu.ctx.compute_capability().unwrap_or((0, 0));
        // SAFETY: cuDNN is loaded (checked by the caller); no handle needed.
        let version = unsafe { dn::cudnnGetVersion() };
        let tag: String = format!("{name}-sm{major}{minor}-cudnn{version}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = crate::loader::cache_dir().map(|d| d.join(format!("cudnn-choices-{tag}.txt")));
        let mut map = std::collections::BTreeMap::new();
        if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            for line in text.lines() {
                if let Some((k, v)) = line.split_once('\t') {
                    map.insert(k.to_string(), v.to_string());
                }
            }
        }
        Choices {
            path,
            map,
            dirty: false,
            replan: std::env::var("GPUKIT_REPLAN").is_ok_and(|v| v == "1"),
        }
    }

    fn get(&self, key: &str) -> Option<String> {
        if self.replan {
            return None;
        }
        self.map.get(key).cloned()
    }

    fn put(&mut self, key: String, value: String) {
        if self.map.get(&key) != Some(&value) {
            self.map.insert(key, value);
            self.dirty = true;
        }
    }

    /// Writes the file whole, then renames it: a reader never sees half of it.
    fn save(&mut self) {
        let Some(path) = &self.path else { return };
        if !self.dirty {
            return;
        }
        let text: String = self
            .map
            .iter()
            .map(|(k, v)| format!("{k}\t{v}\n"))
            .collect();
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_ok() {
            self.dirty = false;
        }
    }
}

const FWD_ALGOS: [dn::cudnnConvolutionFwdAlgo_t; 8] = [
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
    dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
];

const MATH_TYPES: [dn::cudnnMathType_t; 4] = [
    dn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
    dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
    dn::cudnnMathType_t::CUDNN_FMA_MATH,
];

/// A measured row rebuilt from `ConvPlan::choice_text` (time unknown: 0).
fn parse_legacy(text: &str) -> Option<dn::cudnnConvolutionFwdAlgoPerfStruct> {
    let mut parts = text.split(' ');
    if parts.next()? != "legacy" {
        return None;
    }
    let algo_name = parts.next()?;
    let math_name = parts.next()?;
    let algo = FWD_ALGOS
        .into_iter()
        .find(|a| format!("{a:?}") == algo_name)?;
    let math = MATH_TYPES
        .into_iter()
        .find(|m| format!("{m:?}") == math_name)?;
    // SAFETY: a plain C struct; every field is then set or zero is valid for it.
    let mut r: dn::cudnnConvolutionFwdAlgoPerfStruct = unsafe { std::mem::zeroed() };
    r.algo = algo;
    r.mathType = math;
    r.status = dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
    Some(r)
}

/// How one convolution runs: the legacy fused call, the legacy bare convolution, or a
/// backend-API graph (fused or bare).
pub enum ConvChoice {
    Fused(FusedConv),
    Plain(ConvPlan),
    Graph(crate::dnn_graph::GraphConv),
    /// The bare convolution (a `Plain` or bare `Graph` choice), then the caller's epilogue
    /// kernel `y = relu(y + bias (+ z))`: two launches, sometimes faster than any fused engine.
    Split(Box<ConvChoice>),
}

/// The epilogue a split plan runs after the bare convolution: `(y, bias, z)`.
pub type Epilogue<'e> = &'e dyn Fn(View<'_>, View<'_>, Option<View<'_>>) -> Result<(), DnnError>;

impl ConvChoice {
    /// The algorithm or engine, for reports.
    pub fn name(&self) -> String {
        match self {
            ConvChoice::Fused(f) => format!("{} (fused call)", f.conv.algo_name),
            ConvChoice::Plain(p) => p.algo_name.clone(),
            ConvChoice::Graph(g) => g.choice.clone(),
            ConvChoice::Split(c) => format!("{} + epilogue kernel", c.name()),
        }
    }

    pub fn workspace_bytes(&self) -> usize {
        match self {
            ConvChoice::Fused(f) => f.conv.workspace_bytes,
            ConvChoice::Plain(p) => p.workspace_bytes,
            ConvChoice::Graph(g) => g.workspace_bytes,
            ConvChoice::Split(c) => c.workspace_bytes(),
        }
    }
}

/// Descriptors of one convolution and the algorithm measured fastest for it.
pub struct ConvPlan {
    x: dn::cudnnTensorDescriptor_t,
    w: dn::cudnnFilterDescriptor_t,
    y: dn::cudnnTensorDescriptor_t,
    conv: dn::cudnnConvolutionDescriptor_t,
    algo: dn::cudnnConvolutionFwdAlgo_t,
    math: dn::cudnnMathType_t,
    workspace_bytes: usize,
    pub dims: ConvDims,
    pub ty: ConvType,
    /// The chosen algorithm's name and cuDNN's own time for it (ms).
    pub algo_name: String,
    pub algo_ms: f32,
}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: created in plan_conv, destroyed only here.
        unsafe {
            dn::cudnnDestroyTensorDescriptor(self.x);
            dn::cudnnDestroyTensorDescriptor(self.y);
            dn::cudnnDestroyFilterDescriptor(self.w);
            dn::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

impl Dnn {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Dnn, DnnError> {
        if !discovery.usable(Lib::Cudnn) {
            return Err(CudaError::MissingLibrary(discovery.missing_message(Lib::Cudnn)).into());
        }
        // SAFETY: asks the loader only.
        if !unsafe { dn::is_culib_present() } {
            return Err(
                CudaError::MissingLibrary("cuDNN was found but did not load".into()).into(),
            );
        }
        gpu.ctx.bind_to_thread().map_err(CudaError::from)?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        ok("cudnnCreate", unsafe { dn::cudnnCreate(&mut handle) })?;
        // SAFETY: live handle; the stream outlives it (kept in self).
        if let Err(e) = ok("cudnnSetStream", unsafe {
            dn::cudnnSetStream(handle, gpu.stream.cu_stream() as _)
        }) {
            // SAFETY: created above.
            unsafe { dn::cudnnDestroy(handle) };
            return Err(e);
        }
        Ok(Dnn {
            stream: gpu.stream.clone(),
            handle,
            workspace: Default::default(),
            workspace_limit: std::cell::Cell::new(CONV_WORKSPACE_BYTES),
            choices: std::cell::RefCell::new(Choices::open(gpu)),
        })
    }

    /// Describes the convolution and measures cuDNN's algorithms on the given buffers (which it
    /// overwrites: `y`), keeping the fastest one that succeeded.
    pub fn plan_conv(
        &self,
        dims: ConvDims,
        ty: ConvType,
        x: &DeviceBytes,
        w: &DeviceBytes,
        y: &mut DeviceBytes,
    ) -> Result<ConvPlan, DnnError> {
        let s = &self.stream;
        let (x, w, y) = (View::of(x, s), View::of(w, s), View::of(y, s));
        // a benchmark measures every time: no cached choice
        let mut plan = Self::describe(dims, ty)?;
        plan.check(x, w, y)?;
        self.find(&mut plan, x, w, y)?;
        Ok(plan)
    }

    /// The descriptors of a convolution (no algorithm chosen yet).
    fn describe(dims: ConvDims, ty: ConvType) -> Result<ConvPlan, DnnError> {
        let dt = ty.data_type();
        let fmt = if dims.nhwc {
            dn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
        };
        let (p, q) = dims.out_hw();
        let i = |v: usize| v as i32;
        let mut plan = ConvPlan {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            math: ty.math(),
            workspace_bytes: 0,
            dims,
            ty,
            algo_name: String::new(),
            algo_ms: 0.0,
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
                dn::cudnnCreateConvolutionDescriptor(&mut plan.conv),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(
                    plan.x,
                    fmt,
                    dt,
                    i(dims.n),
                    i(dims.c),
                    i(dims.h),
                    i(dims.w),
                ),
            )?;
            ok(
                "cudnnSetFilter4dDescriptor",
                dn::cudnnSetFilter4dDescriptor(
                    plan.w,
                    dt,
                    fmt,
                    i(dims.k),
                    i(dims.c),
                    i(dims.r),
                    i(dims.s),
                ),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(plan.y, fmt, dt, i(dims.n), i(dims.k), i(p), i(q)),
            )?;
            ok(
                "cudnnSetConvolution2dDescriptor",
                dn::cudnnSetConvolution2dDescriptor(
                    plan.conv,
                    i(dims.pad),
                    i(dims.pad),
                    i(dims.stride),
                    i(dims.stride),
                    1,
                    1,
                    dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
            )?;
            ok(
                "cudnnSetConvolutionMathType",
                dn::cudnnSetConvolutionMathType(plan.conv, ty.math()),
            )?;
        }
        Ok(plan)
    }

    /// Runs every algorithm cuDNN has for `plan` on these buffers and keeps the fastest.
    fn find(
        &self,
        plan: &mut ConvPlan,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
    ) -> Result<(), DnnError> {
        let best = self
            .candidates(plan, x, w, y)?
            .into_iter()
            .next()
            .ok_or_else(|| DnnError::NoAlgorithm(format!("{:?} {:?}", plan.dims, plan.ty)))?;
        plan.apply(&best)
    }

    /// cuDNN's measurement of every algorithm for `plan` on these buffers: those that ran, fit
    /// the workspace and (for f32) stayed off tensor cores, fastest first.
    fn candidates(
        &self,
        plan: &ConvPlan,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
    ) -> Result<Vec<dn::cudnnConvolutionFwdAlgoPerfStruct>, DnnError> {
        let ty = plan.ty;
        let mut max = 0;
        // SAFETY: live handle, out-pointer to a local.
        ok("cudnnGetConvolutionForwardAlgorithmMaxCount", unsafe {
            dn::cudnnGetConvolutionForwardAlgorithmMaxCount(self.handle, &mut max)
        })?;
        // SAFETY: zeroed POD structs, overwritten by cuDNN.
        let mut perf: Vec<dn::cudnnConvolutionFwdAlgoPerfStruct> =
            vec![unsafe { std::mem::zeroed() }; max.max(1) as usize];
        let mut returned = 0;
        let wsb = self.planning_workspace()?;
        let ws = View::of(&wsb, &self.stream);
        // SAFETY: descriptors match the buffers (sizes checked by the caller); the workspace is
        // ours.
        ok("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
            dn::cudnnFindConvolutionForwardAlgorithmEx(
                self.handle,
                plan.x,
                x.addr() as *const c_void,
                plan.w,
                w.addr() as *const c_void,
                plan.conv,
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
        // cuDNN sorts by time; f32 must also not have slipped onto tensor cores
        Ok(perf
            .into_iter()
            .filter(|r| r.status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            .filter(|r| r.memory <= ws.bytes())
            .filter(|r| {
                ty != ConvType::F32 || r.mathType != dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            })
            .collect())
    }

    /// y = conv(x, w) with the plan's algorithm.
    pub fn conv_forward(
        &self,
        plan: &ConvPlan,
        x: &DeviceBytes,
        w: &DeviceBytes,
        y: &mut DeviceBytes,
    ) -> Result<(), DnnError> {
        let s = &self.stream;
        let wsb = self.planning_workspace()?;
        let ws = View::of(&wsb, s);
        self.conv_forward_views(plan, View::of(x, s), View::of(w, s), View::of(y, s), ws)
    }

    /// As [`Dnn::conv_forward`], on views, with the workspace `ws` (at least what the plan
    /// needs).
    pub fn conv_forward_views(
        &self,
        plan: &ConvPlan,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<(), DnnError> {
        plan.check(x, w, y)?;
        ws.require(plan.workspace_bytes, "convolution workspace")?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: buffer sizes checked against the plan's descriptors; scalars are f32 as cuDNN
        // wants for float/half data; the workspace holds what the algorithm asked for (it was
        // measured with this workspace).
        ok("cudnnConvolutionForward", unsafe {
            dn::cudnnConvolutionForward(
                self.handle,
                &alpha as *const f32 as *const c_void,
                plan.x,
                x.addr() as *const c_void,
                plan.w,
                w.addr() as *const c_void,
                plan.conv,
                plan.algo,
                ws.addr() as *mut c_void,
                plan.workspace_bytes,
                &beta as *const f32 as *const c_void,
                plan.y,
                y.addr() as *mut c_void,
            )
        })
    }

    /// Plans `y = act(conv(x, w) + bias [+ z])` (act: ReLU or identity) on these buffers. With
    /// ReLU, every algorithm cuDNN can run for the convolution is timed *as the fused call*
    /// (cuDNN's own search times the bare convolution, and an algorithm that is fast alone may
    /// not fuse), and the fastest is kept. With identity cuDNN fuses only IMPLICIT_PRECOMP_GEMM,
    /// which is then used.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_fused(
        &self,
        dims: ConvDims,
        ty: ConvType,
        relu: bool,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
    ) -> Result<FusedConv, DnnError> {
        let mut fused = Self::fused_base(dims, ty, relu)?;
        fused.conv.check(x, w, y)?;
        self.select_fused(&mut fused, x, w, bias, z, y)?;
        Ok(fused)
    }

    /// The descriptors of a fused convolution, no algorithm chosen.
    fn fused_base(dims: ConvDims, ty: ConvType, relu: bool) -> Result<FusedConv, DnnError> {
        let conv = Self::describe(dims, ty)?;
        let mut fused = FusedConv {
            conv,
            bias: std::ptr::null_mut(),
            act: std::ptr::null_mut(),
            relu,
        };
        let fmt = if dims.nhwc {
            dn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
        };
        // SAFETY: each create writes a descriptor that `fused` owns and destroys on drop.
        unsafe {
            ok(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut fused.bias),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(
                    fused.bias,
                    fmt,
                    ty.data_type(),
                    1,
                    dims.k as i32,
                    1,
                    1,
                ),
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

    /// Times the candidate algorithms as the fused call (ReLU) or takes the one cuDNN fuses
    /// (identity); see [`Dnn::plan_fused`].
    fn select_fused(
        &self,
        fused: &mut FusedConv,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
    ) -> Result<(), DnnError> {
        let (dims, ty) = (fused.conv.dims, fused.conv.ty);
        if fused.relu {
            let candidates = self.candidates(&fused.conv, x, w, y)?;
            let wsb = self.planning_workspace()?;
            let ws = View::of(&wsb, &self.stream);
            let mut best: Option<(f64, usize)> = None;
            for (i, c) in candidates.iter().enumerate().take(FUSED_TRIALS) {
                fused.conv.apply(c)?;
                // an algorithm that cannot run fused is skipped, not fatal
                let Ok(median) =
                    self.candidate_ms(|| self.fused_forward(fused, x, w, bias, z, y, ws))
                else {
                    continue;
                };
                if best.is_none_or(|(t, _)| median < t) {
                    best = Some((median, i));
                }
            }
            let (ms, i) =
                best.ok_or_else(|| DnnError::NoAlgorithm(format!("{dims:?} {ty:?} fused")))?;
            fused.conv.apply(&candidates[i])?;
            fused.conv.algo_ms = ms as f32;
        } else {
            let algo =
                dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
            let mut bytes = 0;
            // SAFETY: live handle and descriptors; out-pointer to a local.
            ok("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
                dn::cudnnGetConvolutionForwardWorkspaceSize(
                    self.handle,
                    fused.conv.x,
                    fused.conv.w,
                    fused.conv.conv,
                    fused.conv.y,
                    algo,
                    &mut bytes,
                )
            })?;
            if bytes > self.workspace_limit() {
                return Err(DnnError::NoAlgorithm(format!(
                    "{dims:?} {ty:?}: IMPLICIT_PRECOMP_GEMM needs {bytes} bytes of workspace"
                )));
            }
            fused.conv.algo = algo;
            fused.conv.workspace_bytes = bytes;
            fused.conv.algo_name = "IMPLICIT_PRECOMP_GEMM".into();
        }
        Ok(())
    }

    /// Makes a cached choice `r` the plan's algorithm (its workspace asked of cuDNN again).
    fn use_cached(
        &self,
        plan: &mut ConvPlan,
        mut r: dn::cudnnConvolutionFwdAlgoPerfStruct,
    ) -> Result<(), DnnError> {
        plan.apply(&r)?;
        let mut bytes = 0;
        // SAFETY: live handle and descriptors (math type set by apply); out-pointer to a local.
        ok("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
            dn::cudnnGetConvolutionForwardWorkspaceSize(
                self.handle,
                plan.x,
                plan.w,
                plan.conv,
                plan.y,
                r.algo,
                &mut bytes,
            )
        })?;
        if bytes > self.workspace_limit() {
            return Err(DnnError::NoAlgorithm(
                "cached algorithm needs more workspace".into(),
            ));
        }
        r.memory = bytes;
        plan.apply(&r)
    }

    /// Chooses how `y = relu(conv(x, w) + bias [+ z])` runs: the legacy fused call or (when
    /// `allow_graph` and not strict f32) a backend-API graph, whichever measured faster. The
    /// choice is measured once per shape and kept on disk; later plans of the shape only build
    /// the chosen one.
    ///
    /// With `split`, the bare convolution followed by that epilogue is a candidate too (not
    /// when `z` is `y` itself: the bare convolution would overwrite the residual first).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_fused_best(
        &self,
        dims: ConvDims,
        ty: ConvType,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
        allow_graph: bool,
        split: Option<Epilogue<'_>>,
    ) -> Result<ConvChoice, DnnError> {
        let split = split.filter(|_| z.is_none_or(|z| z.addr() != y.addr()));
        // a legacy-only or workspace-limited choice is kept apart: it must never stand in for
        // the measured best of both APIs in a later run (run 16 caught that)
        let key = format!(
            "fused {dims:?} {ty:?} residual={}{}",
            z.is_some(),
            self.key_suffix(allow_graph)
        );
        let cached = self.choices.borrow().get(&key);
        if let Some(text) = cached {
            if let Some(r) = parse_legacy(&text) {
                let mut f = Self::fused_base(dims, ty, true)?;
                f.conv.check(x, w, y)?;
                if self.use_cached(&mut f.conv, r).is_ok() {
                    return Ok(ConvChoice::Fused(f));
                }
            } else if let Some(rank) = text.strip_prefix("graph ").and_then(|r| r.parse().ok()) {
                if allow_graph {
                    let g =
                        self.plan_graph_ranked(dims, ty, x, w, Some(bias), z, true, y, Some(rank));
                    if let Ok(g) = g {
                        return Ok(ConvChoice::Graph(g));
                    }
                }
            } else if text == "split" && split.is_some() {
                if let Ok(bare) = self.plan_plain_best(dims, ty, x, w, y, allow_graph) {
                    return Ok(ConvChoice::Split(Box::new(bare)));
                }
            }
        }
        let legacy = self.plan_fused(dims, ty, true, x, w, bias, z, y)?;
        let graph = if allow_graph && ty != ConvType::F32 {
            self.plan_graph(dims, ty, x, w, bias, z, y).ok()
        } else {
            None
        };
        let mut best_ms = f64::from(legacy.conv.algo_ms);
        let mut choice = ConvChoice::Fused(legacy);
        if let Some(g) = graph {
            if g.ms < best_ms {
                best_ms = g.ms;
                choice = ConvChoice::Graph(g);
            }
        }
        if let Some(epilogue) = split {
            // timed like the others: the bare convolution and the epilogue, back to back
            let bare = self.plan_plain_best(dims, ty, x, w, y, allow_graph)?;
            let wsb = self.planning_workspace()?;
            let ws = View::of(&wsb, &self.stream);
            let ms = self.candidate_ms(|| {
                self.bare_forward(&bare, x, w, y, ws)?;
                epilogue(y, bias, z)
            });
            if let Ok(ms) = ms {
                if ms < best_ms {
                    choice = ConvChoice::Split(Box::new(bare));
                }
            }
        }
        self.remember(key, &choice);
        Ok(choice)
    }

    /// Runs a bare convolution choice (`Plain`, or a `Graph` planned without epilogue).
    pub fn bare_forward(
        &self,
        choice: &ConvChoice,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<(), DnnError> {
        match choice {
            ConvChoice::Plain(p) => self.conv_forward_views(p, x, w, y, ws),
            ConvChoice::Graph(g) => self.graph_forward(g, x, w, None, None, y, ws),
            _ => Err(DnnError::NoAlgorithm(
                "not a bare convolution choice".into(),
            )),
        }
    }

    fn remember(&self, key: String, choice: &ConvChoice) {
        let value = match choice {
            ConvChoice::Fused(f) => f.conv.choice_text(),
            ConvChoice::Plain(p) => p.choice_text(),
            ConvChoice::Graph(g) => format!("graph {}", g.rank),
            ConvChoice::Split(_) => "split".to_string(),
        };
        self.choices.borrow_mut().put(key, value);
    }

    /// Chooses how the bare convolution `y = conv(x, w)` runs: cuDNN's fastest legacy
    /// algorithm or (when `allow_graph` and not strict f32) a backend-API graph, each timed the
    /// same way; measured once per shape and kept on disk like [`Dnn::plan_fused_best`].
    #[allow(clippy::too_many_arguments)]
    pub fn plan_plain_best(
        &self,
        dims: ConvDims,
        ty: ConvType,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        allow_graph: bool,
    ) -> Result<ConvChoice, DnnError> {
        let key = format!("plain {dims:?} {ty:?}{}", self.key_suffix(allow_graph));
        let cached = self.choices.borrow().get(&key);
        if let Some(text) = cached {
            if let Some(r) = parse_legacy(&text) {
                let mut plan = Self::describe(dims, ty)?;
                plan.check(x, w, y)?;
                if self.use_cached(&mut plan, r).is_ok() {
                    return Ok(ConvChoice::Plain(plan));
                }
            } else if let Some(rank) = text.strip_prefix("graph ").and_then(|r| r.parse().ok()) {
                if allow_graph {
                    let g =
                        self.plan_graph_ranked(dims, ty, x, w, None, None, false, y, Some(rank));
                    if let Ok(g) = g {
                        return Ok(ConvChoice::Graph(g));
                    }
                }
            }
        }
        let mut legacy = Self::describe(dims, ty)?;
        legacy.check(x, w, y)?;
        self.find(&mut legacy, x, w, y)?;
        // timed like the graph candidates (cuDNN's own figure comes from another method)
        let wsb = self.planning_workspace()?;
        let ws = View::of(&wsb, &self.stream);
        let legacy_ms = self.candidate_ms(|| self.conv_forward_views(&legacy, x, w, y, ws))?;
        let graph = if allow_graph && ty != ConvType::F32 {
            self.plan_graph_ranked(dims, ty, x, w, None, None, false, y, None)
                .ok()
        } else {
            None
        };
        let choice = match graph {
            Some(g) if g.ms < legacy_ms => ConvChoice::Graph(g),
            _ => ConvChoice::Plain(legacy),
        };
        self.remember(key, &choice);
        Ok(choice)
    }

    /// Median device milliseconds of `work` over 5 runs after 2 warm-up runs: how every
    /// candidate (legacy algorithm or backend engine) is timed, so that they compare.
    pub(crate) fn candidate_ms(
        &self,
        work: impl FnMut() -> Result<(), DnnError>,
    ) -> Result<f64, DnnError> {
        let mut times =
            crate::timing::time_on_stream(&self.stream, 2, 5, work).map_err(|e| match e {
                crate::timing::TimingError::Cuda(c) => DnnError::Cuda(c),
                crate::timing::TimingError::Work(w) => w,
            })?;
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Writes the measured choices to disk (also done when the handle is dropped).
    pub fn save_choices(&self) {
        self.choices.borrow_mut().save();
    }

    /// Runs a fused convolution: `y = act(conv(x, w) + bias + z)`, or without `z` when None,
    /// with the workspace `ws` (at least what the plan needs). `z` must have `y`'s shape and
    /// type; it may be `y` itself only where the engine checked that (see
    /// `models::gpu::Session`).
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
    ) -> Result<(), DnnError> {
        let c = &plan.conv;
        c.check(x, w, y)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        bias.require(c.dims.k * c.ty.elem_bytes(), "convolution bias")
            .map_err(DnnError::from)?;
        if let Some(z) = z {
            z.require(y.bytes().min(c.output_bytes()), "residual input")
                .map_err(DnnError::from)?;
        }
        let alpha1 = 1f32;
        let alpha2 = if z.is_some() { 1f32 } else { 0f32 };
        // with alpha2 = 0 cuDNN does not read z, but it still wants a valid pointer
        let zp = z.unwrap_or(y).addr();
        // SAFETY: sizes checked against the descriptors; z has y's descriptor; scalars are f32
        // for float/half/bf16 data; the workspace is ours and large enough (checked at plan).
        ok("cudnnConvolutionBiasActivationForward", unsafe {
            dn::cudnnConvolutionBiasActivationForward(
                self.handle,
                &alpha1 as *const f32 as *const c_void,
                c.x,
                x.addr() as *const c_void,
                c.w,
                w.addr() as *const c_void,
                c.conv,
                c.algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
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

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn handle(&self) -> dn::cudnnHandle_t {
        self.handle
    }

    /// The planning workspace ([`CONV_WORKSPACE_BYTES`]: the most any plan may use),
    /// allocated on first use and kept until [`Dnn::release_workspace`].
    pub(crate) fn planning_workspace(&self) -> Result<std::rc::Rc<DeviceBytes>, DnnError> {
        let mut slot = self.workspace.borrow_mut();
        let bytes = self.workspace_limit().max(256);
        if let Some(ws) = slot.as_ref().filter(|ws| ws.len() == bytes) {
            return Ok(ws.clone());
        }
        let ws = std::rc::Rc::new(
            self.stream
                .alloc_zeros::<u8>(bytes)
                .map_err(CudaError::from)?,
        );
        *slot = Some(ws.clone());
        Ok(ws)
    }

    /// Limits the workspace of the algorithms chosen from now on (at most
    /// [`CONV_WORKSPACE_BYTES`]; 0: only algorithms that need none). Choices made under a limit
    /// are cached apart from the unlimited ones.
    pub fn set_workspace_limit(&self, bytes: usize) {
        self.workspace_limit.set(bytes.min(CONV_WORKSPACE_BYTES));
    }

    /// See [`Dnn::set_workspace_limit`].
    pub fn workspace_limit(&self) -> usize {
        self.workspace_limit.get()
    }

    /// The suffix of a cached choice's key: what, besides the shape, the choice depended on.
    fn key_suffix(&self, allow_graph: bool) -> String {
        let mut suffix = String::new();
        if !allow_graph {
            suffix.push_str(" legacy-only");
        }
        if self.workspace_limit() < CONV_WORKSPACE_BYTES {
            suffix.push_str(&format!(" workspace<={}", self.workspace_limit()));
        }
        suffix
    }

    /// Gives the planning workspace back to the memory pool (stream-ordered: work already
    /// queued that uses it completes first). Planning again allocates it again.
    pub fn release_workspace(&self) {
        self.workspace.borrow_mut().take();
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
        // SAFETY: created in plan_fused (null when creation never happened), destroyed here.
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

impl ConvPlan {
    fn choice_text(&self) -> String {
        format!("legacy {:?} {:?}", self.algo, self.math)
    }

    /// Makes `r` (one of cuDNN's measured rows) this plan's algorithm.
    fn apply(&mut self, r: &dn::cudnnConvolutionFwdAlgoPerfStruct) -> Result<(), DnnError> {
        self.algo = r.algo;
        self.math = r.mathType;
        self.workspace_bytes = r.memory;
        self.algo_ms = r.time;
        self.algo_name = format!("{:?}", r.algo)
            .trim_start_matches("CUDNN_CONVOLUTION_FWD_ALGO_")
            .to_string();
        // SAFETY: live descriptor; the row's math type is what it was measured with.
        ok("cudnnSetConvolutionMathType", unsafe {
            dn::cudnnSetConvolutionMathType(self.conv, r.mathType)
        })
    }

    /// Bytes of the output tensor.
    pub fn output_bytes(&self) -> usize {
        let (p, q) = self.dims.out_hw();
        self.dims.n * self.dims.k * p * q * self.ty.elem_bytes()
    }

    /// Bytes this plan's algorithm needs as workspace.
    pub fn workspace_needed(&self) -> usize {
        self.workspace_bytes
    }

    fn check(&self, x: View<'_>, w: View<'_>, y: View<'_>) -> Result<(), DnnError> {
        let d = self.dims;
        let e = self.ty.elem_bytes();
        x.require(d.n * d.c * d.h * d.w * e, "convolution input")?;
        w.require(d.k * d.c * d.r * d.s * e, "convolution filter")?;
        y.require(self.output_bytes(), "convolution output")?;
        Ok(())
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.choices.borrow_mut().save();
        // SAFETY: created in new(), destroyed only here, after queued work finished.
        unsafe {
            let _ = self.stream.synchronize();
            dn::cudnnDestroy(self.handle);
        }
    }
}
