//! cuDNN's legacy calls for training a convolutional network: the convolution's three passes
//! (forward, backward data, backward filter) with algorithms from cuDNN's heuristic ranking,
//! batch normalisation in training mode with its backward (the `Ex` forms, whose fused ReLU and
//! add + ReLU ops cuDNN runs where it supports them), and max pooling forward and backward.
//!
//! To use: [`Dnn::plan_conv_train`] once a convolution shape (the plan is kept on the handle, so
//! a network's repeated shapes are planned once), then [`Dnn::conv_train_forward`],
//! [`Dnn::conv_backward_data`] and [`Dnn::conv_backward_filter`] with a workspace of
//! [`ConvTrain::workspace_bytes`]; [`Dnn::batch_norm`] once a norm, then
//! [`Dnn::bn_forward_training`] and [`Dnn::bn_backward`]; [`Dnn::max_pool`] then
//! [`Dnn::max_pool_forward`] / [`Dnn::max_pool_backward`].
//!
//! Strict f32 ([`DType::F32`]) stays off tensor cores in every pass: the convolution's math type
//! is `CUDNN_FMA_MATH` (cuDNN's default math lets Ampere and newer run f32 as TF32) and only
//! algorithms cuDNN lists under FMA or default math are kept. The element type and layout are
//! parameters throughout, so channels-last bf16 (`SPATIAL_PERSISTENT` batch norm) takes the
//! same calls.

use super::legacy::{ConvPlan, FWD_ALGOS};
use super::{data_type, format, ok, Conv, Dnn};
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cudnn::sys as dn;
use gpukit_types::{DType, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::rc::Rc;

/// One of a convolution's three computations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx = conv_transposed(dy, w)`.
    BackwardData,
    /// `dw = correlation of x with dy`.
    BackwardFilter,
}

impl Pass {
    pub const ALL: [Pass; 3] = [Pass::Forward, Pass::BackwardData, Pass::BackwardFilter];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::BackwardData => "backward data",
            Pass::BackwardFilter => "backward filter",
        }
    }

    fn index(self) -> usize {
        match self {
            Pass::Forward => 0,
            Pass::BackwardData => 1,
            Pass::BackwardFilter => 2,
        }
    }
}

/// The legacy backward-data algorithms with the names reports use.
const DATA_ALGOS: [(&str, dn::cudnnConvolutionBwdDataAlgo_t); 6] = {
    use dn::cudnnConvolutionBwdDataAlgo_t as D;
    [
        ("ALGO_0", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0),
        ("ALGO_1", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1),
        ("FFT", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT),
        ("FFT_TILING", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING),
        ("WINOGRAD", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD),
        (
            "WINOGRAD_NONFUSED",
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        ),
    ]
};

/// The legacy backward-filter algorithms with the names reports use.
const FILTER_ALGOS: [(&str, dn::cudnnConvolutionBwdFilterAlgo_t); 7] = {
    use dn::cudnnConvolutionBwdFilterAlgo_t as F;
    [
        ("ALGO_0", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0),
        ("ALGO_1", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1),
        ("FFT", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT),
        ("ALGO_3", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3),
        ("WINOGRAD", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD),
        (
            "WINOGRAD_NONFUSED",
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        ),
        (
            "FFT_TILING",
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        ),
    ]
};

/// The name of `algo` in `table`.
fn named<A: PartialEq + Copy>(table: &[(&'static str, A)], algo: A) -> &'static str {
    table
        .iter()
        .find(|(_, a)| *a == algo)
        .map_or("unknown algorithm", |(n, _)| n)
}

/// An algorithm of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algo {
    Fwd(dn::cudnnConvolutionFwdAlgo_t),
    Data(dn::cudnnConvolutionBwdDataAlgo_t),
    Filter(dn::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    fn name(self) -> &'static str {
        match self {
            Algo::Fwd(a) => named(&FWD_ALGOS, a),
            Algo::Data(a) => named(&DATA_ALGOS, a),
            Algo::Filter(a) => named(&FILTER_ALGOS, a),
        }
    }
}

/// One row of cuDNN's heuristic ranking, whatever the pass.
#[derive(Debug, Clone, Copy)]
struct Ranked {
    algo: Algo,
    math: dn::cudnnMathType_t,
    supported: bool,
    deterministic: bool,
}

/// Whether a ranked algorithm may run `conv`: supported, and for strict f32 listed under FMA or
/// default math (the descriptor's FMA math type then keeps it off tensor cores).
fn usable(conv: &Conv, math: dn::cudnnMathType_t, supported: bool) -> bool {
    use dn::cudnnMathType_t as M;
    supported
        && (conv.dtype.uses_tensor_cores()
            || matches!(math, M::CUDNN_FMA_MATH | M::CUDNN_DEFAULT_MATH))
}

/// One way cuDNN can run a pass, with the workspace it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    algo: Algo,
    /// The algorithm's name (cuDNN's enum without its prefix).
    pub name: &'static str,
    pub workspace_bytes: usize,
    /// Whether cuDNN says the algorithm gives the same bits on every run.
    pub deterministic: bool,
}

/// A convolution's descriptors and, for each pass, cuDNN's ranked algorithms that fit the
/// workspace limit (heuristic order) and which of them runs: the first unless
/// [`ConvTrain::choose`] picked another (a timed search may do that).
pub struct ConvTrain {
    plan: ConvPlan,
    candidates: [Vec<Candidate>; 3],
    chosen: Cell<[usize; 3]>,
}

impl ConvTrain {
    pub fn conv(&self) -> Conv {
        self.plan.conv
    }

    /// The pass's usable algorithms, cuDNN's heuristic order.
    pub fn candidates(&self, pass: Pass) -> &[Candidate] {
        &self.candidates[pass.index()]
    }

    /// The algorithm that runs the pass.
    pub fn chosen(&self, pass: Pass) -> Result<Candidate> {
        let i = self.chosen.get()[pass.index()];
        self.candidates(pass).get(i).copied().ok_or_else(|| {
            Error::NoAlgorithm(format!("{:?}: no {} algorithm", self.conv(), pass.name()))
        })
    }

    /// Runs the pass with its candidate `index` from now on.
    pub fn choose(&self, pass: Pass, index: usize) -> Result<()> {
        let n = self.candidates(pass).len();
        if index >= n {
            return Err(Error::Invalid(format!(
                "{} algorithm {index} of {n} candidates",
                pass.name()
            )));
        }
        let mut c = self.chosen.get();
        c[pass.index()] = index;
        self.chosen.set(c);
        Ok(())
    }

    /// The workspace every chosen algorithm fits in.
    pub fn workspace_bytes(&self) -> usize {
        Pass::ALL
            .iter()
            .filter_map(|&p| self.chosen(p).ok())
            .map(|c| c.workspace_bytes)
            .max()
            .unwrap_or(0)
    }
}

/// cuDNN's heuristic ranking of one pass's algorithms: the `_v7` query into as many result
/// slots as cuDNN has algorithms for the pass, each row converted to a [`Ranked`].
macro_rules! ranking {
    ($handle:expr, $max:ident, $query:ident, $perf:ty, $variant:ident, ($($desc:expr),*)) => {{
        let mut max = 0;
        // SAFETY: live handle, out-pointer to a local.
        ok(stringify!($max), unsafe { dn::$max($handle, &mut max) })?;
        // SAFETY: zeroed POD structs, overwritten by cuDNN.
        let mut perf: Vec<$perf> = vec![unsafe { std::mem::zeroed() }; max.max(1) as usize];
        let mut returned = 0;
        // SAFETY: live handle and descriptors; `perf` holds as many structs as asked for.
        ok(stringify!($query), unsafe {
            dn::$query($handle, $($desc,)* perf.len() as i32, &mut returned, perf.as_mut_ptr())
        })?;
        perf.truncate(returned.max(0) as usize);
        perf.iter()
            .map(|r| Ranked {
                algo: Algo::$variant(r.algo),
                math: r.mathType,
                supported: r.status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
                deterministic: r.determinism == dn::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
            })
            .collect::<Vec<Ranked>>()
    }};
}

impl Dnn {
    /// The training plan of `conv`: its descriptors and each pass's usable algorithms, from
    /// cuDNN's heuristic ranking (nothing is run), within the workspace limit. Kept on the
    /// handle: the same shape asked again gets the same plan.
    pub fn plan_conv_train(&self, conv: Conv) -> Result<Rc<ConvTrain>> {
        if let Some(plan) = self.train_plans.borrow().get(&conv) {
            return Ok(plan.clone());
        }
        if !conv.shape.groups_fit() {
            return Err(Error::Invalid(format!(
                "a convolution of {} groups over {} input and {} output channels",
                conv.shape.groups, conv.shape.c, conv.shape.k
            )));
        }
        let plan = ConvPlan::describe(conv)?;
        let mut candidates: [Vec<Candidate>; 3] = Default::default();
        for pass in Pass::ALL {
            let list = &mut candidates[pass.index()];
            for row in self.ranking(&plan, pass)? {
                if !usable(&conv, row.math, row.supported)
                    || list.iter().any(|c| c.algo == row.algo)
                {
                    continue;
                }
                // an algorithm whose size cuDNN will not give (not supported after all) is
                // skipped like one over the limit
                let Ok(bytes) = self.pass_workspace(&plan, row.algo) else {
                    continue;
                };
                if bytes <= self.workspace_limit() {
                    list.push(Candidate {
                        algo: row.algo,
                        name: row.algo.name(),
                        workspace_bytes: bytes,
                        deterministic: row.deterministic,
                    });
                }
            }
            if list.is_empty() {
                return Err(Error::NoAlgorithm(format!(
                    "{conv:?}: cuDNN suggests no {} algorithm within {} bytes of workspace{}",
                    pass.name(),
                    self.workspace_limit(),
                    if conv.dtype.uses_tensor_cores() {
                        ""
                    } else {
                        " off tensor cores"
                    }
                )));
            }
        }
        let plan = Rc::new(ConvTrain {
            plan,
            candidates,
            chosen: Cell::new([0; 3]),
        });
        self.train_plans.borrow_mut().insert(conv, plan.clone());
        Ok(plan)
    }

    /// cuDNN's heuristic ranking of `pass` for the plan's descriptors.
    fn ranking(&self, plan: &ConvPlan, pass: Pass) -> Result<Vec<Ranked>> {
        let h = self.handle();
        Ok(match pass {
            Pass::Forward => ranking!(
                h,
                cudnnGetConvolutionForwardAlgorithmMaxCount,
                cudnnGetConvolutionForwardAlgorithm_v7,
                dn::cudnnConvolutionFwdAlgoPerfStruct,
                Fwd,
                (plan.x, plan.w, plan.desc, plan.y)
            ),
            Pass::BackwardData => ranking!(
                h,
                cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
                cudnnGetConvolutionBackwardDataAlgorithm_v7,
                dn::cudnnConvolutionBwdDataAlgoPerfStruct,
                Data,
                (plan.w, plan.y, plan.desc, plan.x)
            ),
            Pass::BackwardFilter => ranking!(
                h,
                cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
                cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                dn::cudnnConvolutionBwdFilterAlgoPerfStruct,
                Filter,
                (plan.x, plan.y, plan.desc, plan.w)
            ),
        })
    }

    /// The workspace `algo` needs for the plan, asked of cuDNN.
    fn pass_workspace(&self, plan: &ConvPlan, algo: Algo) -> Result<usize> {
        let mut bytes = 0;
        let h = self.handle();
        // SAFETY: live handle and descriptors; out-pointer to a local.
        unsafe {
            match algo {
                Algo::Fwd(a) => ok(
                    "cudnnGetConvolutionForwardWorkspaceSize",
                    dn::cudnnGetConvolutionForwardWorkspaceSize(
                        h, plan.x, plan.w, plan.desc, plan.y, a, &mut bytes,
                    ),
                ),
                Algo::Data(a) => ok(
                    "cudnnGetConvolutionBackwardDataWorkspaceSize",
                    dn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                        h, plan.w, plan.y, plan.desc, plan.x, a, &mut bytes,
                    ),
                ),
                Algo::Filter(a) => ok(
                    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                    dn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                        h, plan.x, plan.y, plan.desc, plan.w, a, &mut bytes,
                    ),
                ),
            }
        }?;
        Ok(bytes)
    }

    /// `y = conv(x, w)` with the plan's chosen forward algorithm.
    pub fn conv_train_forward(
        &self,
        plan: &ConvTrain,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        let (p, c) = (&plan.plan, plan.chosen(Pass::Forward)?);
        p.conv.check(x, w, y)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        let Algo::Fwd(algo) = c.algo else {
            return Err(wrong_pass(Pass::Forward));
        };
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked against the descriptors; f32 scalars for float/half/bf16 data;
        // the workspace holds what the algorithm asked for.
        ok("cudnnConvolutionForward", unsafe {
            dn::cudnnConvolutionForward(
                self.handle(),
                scalar(&alpha),
                p.x,
                x.addr() as *const c_void,
                p.w,
                w.addr() as *const c_void,
                p.desc,
                algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
                scalar(&beta),
                p.y,
                y.addr() as *mut c_void,
            )
        })
    }

    /// `dx = conv^T(dy, w)` (added to what `dx` holds when `accumulate`), the chosen
    /// backward-data algorithm.
    pub fn conv_backward_data(
        &self,
        plan: &ConvTrain,
        (w, dy, dx): (View<'_>, View<'_>, View<'_>),
        ws: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        let (p, c) = (&plan.plan, plan.chosen(Pass::BackwardData)?);
        p.conv.check(dx, w, dy)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        let Algo::Data(algo) = c.algo else {
            return Err(wrong_pass(Pass::BackwardData));
        };
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        // SAFETY: as conv_train_forward; dx and dy have the input's and output's descriptors.
        ok("cudnnConvolutionBackwardData", unsafe {
            dn::cudnnConvolutionBackwardData(
                self.handle(),
                scalar(&alpha),
                p.w,
                w.addr() as *const c_void,
                p.y,
                dy.addr() as *const c_void,
                p.desc,
                algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
                scalar(&beta),
                p.x,
                dx.addr() as *mut c_void,
            )
        })
    }

    /// `dw = x (*) dy` (added to what `dw` holds when `accumulate`), the chosen
    /// backward-filter algorithm.
    pub fn conv_backward_filter(
        &self,
        plan: &ConvTrain,
        (x, dy, dw): (View<'_>, View<'_>, View<'_>),
        ws: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        let (p, c) = (&plan.plan, plan.chosen(Pass::BackwardFilter)?);
        p.conv.check(x, dw, dy)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        let Algo::Filter(algo) = c.algo else {
            return Err(wrong_pass(Pass::BackwardFilter));
        };
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        // SAFETY: as conv_train_forward; dw has the filter's descriptor.
        ok("cudnnConvolutionBackwardFilter", unsafe {
            dn::cudnnConvolutionBackwardFilter(
                self.handle(),
                scalar(&alpha),
                p.x,
                x.addr() as *const c_void,
                p.y,
                dy.addr() as *const c_void,
                p.desc,
                algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
                scalar(&beta),
                p.w,
                dw.addr() as *mut c_void,
            )
        })
    }
}

fn wrong_pass(pass: Pass) -> Error {
    Error::Invalid(format!(
        "the plan's {} candidate is another pass's algorithm",
        pass.name()
    ))
}

/// A host f32 scalar as cuDNN takes it (alpha and beta for float, half and bf16 data).
fn scalar(v: &f32) -> *const c_void {
    v as *const f32 as *const c_void
}

/// A batch of feature maps as cuDNN sees them: (n, c, h, w) in a layout and an element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Maps {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub layout: Layout,
    pub dtype: DType,
}

impl Maps {
    /// Fully packed NCHW f32 maps.
    pub fn nchw_f32(n: usize, c: usize, h: usize, w: usize) -> Maps {
        Maps {
            n,
            c,
            h,
            w,
            layout: Layout::Nchw,
            dtype: DType::F32,
        }
    }

    pub fn elements(&self) -> usize {
        [self.n, self.c, self.h, self.w]
            .iter()
            .fold(1usize, |a, &v| a.saturating_mul(v))
    }

    pub fn bytes(&self) -> usize {
        self.elements().saturating_mul(self.dtype.size_bytes())
    }
}

/// How far one axis of `len` positions pools to with a window, stride and padding (floor mode,
/// as PyTorch); 0 for a window larger than the padded input or a stride of 0.
pub fn pool_out(len: usize, window: usize, stride: usize, pad: usize) -> usize {
    if stride == 0 {
        return 0;
    }
    (len + 2 * pad)
        .checked_sub(window)
        .map_or(0, |span| span / stride + 1)
}

fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Invalid(format!("{what} = {v} exceeds cuDNN's int")))
}

/// A cuDNN tensor descriptor, destroyed on drop.
struct TensorDesc(dn::cudnnTensorDescriptor_t);

impl TensorDesc {
    fn empty() -> Result<TensorDesc> {
        let mut d = TensorDesc(std::ptr::null_mut());
        // SAFETY: writes a descriptor that `d` owns.
        ok("cudnnCreateTensorDescriptor", unsafe {
            dn::cudnnCreateTensorDescriptor(&mut d.0)
        })?;
        Ok(d)
    }

    /// Packed maps in their layout and type.
    fn of(m: &Maps) -> Result<TensorDesc> {
        let d = TensorDesc::empty()?;
        let dt = data_type(m.dtype)?;
        // SAFETY: a live descriptor; the dimensions are positive ints (checked by int()).
        ok("cudnnSetTensor4dDescriptor", unsafe {
            dn::cudnnSetTensor4dDescriptor(
                d.0,
                format(m.layout),
                dt,
                int(m.n, "batch")?,
                int(m.c, "channels")?,
                int(m.h, "height")?,
                int(m.w, "width")?,
            )
        })?;
        Ok(d)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created in empty(), destroyed only here.
            unsafe { dn::cudnnDestroyTensorDescriptor(self.0) };
        }
    }
}

/// A cuDNN ReLU activation descriptor, destroyed on drop.
struct ReluDesc(dn::cudnnActivationDescriptor_t);

impl ReluDesc {
    fn new() -> Result<ReluDesc> {
        let mut d = ReluDesc(std::ptr::null_mut());
        // SAFETY: writes a descriptor that `d` owns, then sets it.
        unsafe {
            ok(
                "cudnnCreateActivationDescriptor",
                dn::cudnnCreateActivationDescriptor(&mut d.0),
            )?;
            ok(
                "cudnnSetActivationDescriptor",
                dn::cudnnSetActivationDescriptor(
                    d.0,
                    dn::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                    dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    0.0,
                ),
            )?;
        }
        Ok(d)
    }
}

impl Drop for ReluDesc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created in new(), destroyed only here.
            unsafe { dn::cudnnDestroyActivationDescriptor(self.0) };
        }
    }
}

/// What batch norm computes after normalising: nothing, ReLU, or adding a second input `z`
/// then ReLU (a residual block's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BnOps {
    Bn,
    BnRelu,
    BnAddRelu,
}

impl BnOps {
    fn cudnn(self) -> dn::cudnnBatchNormOps_t {
        use dn::cudnnBatchNormOps_t as O;
        match self {
            BnOps::Bn => O::CUDNN_BATCHNORM_OPS_BN,
            BnOps::BnRelu => O::CUDNN_BATCHNORM_OPS_BN_ACTIVATION,
            BnOps::BnAddRelu => O::CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
        }
    }
}

/// cuDNN's batch-norm kernels: `Spatial` (statistics over n, h, w; any layout and type) or
/// `SpatialPersistent` (faster, channels-last 16-bit data; may overflow on extreme inputs,
/// cuDNN warns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BnMode {
    Spatial,
    SpatialPersistent,
}

impl BnMode {
    fn cudnn(self) -> dn::cudnnBatchNormMode_t {
        match self {
            BnMode::Spatial => dn::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
            BnMode::SpatialPersistent => {
                dn::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL_PERSISTENT
            }
        }
    }
}

/// One training-mode batch norm: its descriptors, the op fused after it and the workspace and
/// reserve space cuDNN asked for. The forward's reserve space must reach the backward intact.
pub struct BatchNorm {
    x: TensorDesc,
    param: TensorDesc,
    relu: Option<ReluDesc>,
    pub maps: Maps,
    pub ops: BnOps,
    pub mode: BnMode,
    /// Added to the variance before its square root (PyTorch's 1e-5).
    pub eps: f64,
    /// How far the running statistics move toward the batch's (PyTorch's momentum, 0.1; cuDNN's
    /// exponential average factor). The running variance moves toward the unbiased variance,
    /// as PyTorch's does.
    pub momentum: f64,
    forward_ws: usize,
    backward_ws: usize,
    reserve: usize,
}

impl BatchNorm {
    /// The workspace both passes fit in.
    pub fn workspace_bytes(&self) -> usize {
        self.forward_ws.max(self.backward_ws)
    }

    /// The reserve space the forward fills and the backward reads (0: none).
    pub fn reserve_bytes(&self) -> usize {
        self.reserve
    }

    fn relu_desc(&self) -> dn::cudnnActivationDescriptor_t {
        self.relu.as_ref().map_or(std::ptr::null_mut(), |r| r.0)
    }

    /// The descriptor of `z` (and `dz`): the input's when the op adds, else none.
    fn z_desc(&self) -> dn::cudnnTensorDescriptor_t {
        if self.ops == BnOps::BnAddRelu {
            self.x.0
        } else {
            std::ptr::null_mut()
        }
    }
}

/// The buffers of a training-mode batch-norm forward. `gamma`, `beta`, the running and saved
/// statistics are f32, one a channel; `z` is given exactly when the op is [`BnOps::BnAddRelu`].
#[derive(Clone, Copy, Debug)]
pub struct BnForward<'a> {
    pub x: View<'a>,
    pub z: Option<View<'a>>,
    pub y: View<'a>,
    pub gamma: View<'a>,
    pub beta: View<'a>,
    pub running_mean: View<'a>,
    pub running_var: View<'a>,
    /// The batch's mean, written for the backward.
    pub saved_mean: View<'a>,
    /// The batch's 1 / sqrt(biased variance + eps), written for the backward.
    pub saved_invstd: View<'a>,
}

/// The buffers of a batch-norm backward: `y` (the forward's output) is given when a ReLU was
/// fused, `dz` (the gradient of the added input, written) exactly when the op adds.
#[derive(Clone, Copy, Debug)]
pub struct BnBackward<'a> {
    pub x: View<'a>,
    pub y: Option<View<'a>>,
    pub dy: View<'a>,
    pub dz: Option<View<'a>>,
    pub dx: View<'a>,
    pub gamma: View<'a>,
    pub beta: View<'a>,
    pub dgamma: View<'a>,
    pub dbeta: View<'a>,
    pub saved_mean: View<'a>,
    pub saved_invstd: View<'a>,
}

/// An error unless `given` is there exactly when the op needs it, and large enough.
fn optional(
    given: Option<View<'_>>,
    needed: bool,
    bytes: usize,
    what: &str,
    ops: BnOps,
) -> Result<()> {
    match (given, needed) {
        (Some(v), true) => v.require(bytes, what),
        (None, false) => Ok(()),
        (None, true) => Err(Error::Invalid(format!(
            "batch norm with {ops:?} needs {what}"
        ))),
        (Some(_), false) => Err(Error::Invalid(format!(
            "batch norm with {ops:?} takes no {what}"
        ))),
    }
}

/// The size checks of a forward: every map holds `maps`, every statistic one f32 a channel,
/// `z` exactly with the add.
fn check_forward(maps: &Maps, ops: BnOps, a: &BnForward<'_>) -> Result<()> {
    let (bytes, stat) = (maps.bytes(), maps.c.saturating_mul(4));
    a.x.require(bytes, "batch norm input")?;
    a.y.require(bytes, "batch norm output")?;
    optional(
        a.z,
        ops == BnOps::BnAddRelu,
        bytes,
        "z (the added input)",
        ops,
    )?;
    for (v, what) in [
        (a.gamma, "batch norm weight"),
        (a.beta, "batch norm bias"),
        (a.running_mean, "running mean"),
        (a.running_var, "running variance"),
        (a.saved_mean, "saved mean"),
        (a.saved_invstd, "saved inverse std"),
    ] {
        v.require(stat, what)?;
    }
    Ok(())
}

/// The size checks of a backward, as [`check_forward`]'s.
fn check_backward(maps: &Maps, ops: BnOps, a: &BnBackward<'_>) -> Result<()> {
    let (bytes, stat) = (maps.bytes(), maps.c.saturating_mul(4));
    a.x.require(bytes, "batch norm input")?;
    a.dy.require(bytes, "batch norm output gradient")?;
    a.dx.require(bytes, "batch norm input gradient")?;
    optional(
        a.y,
        ops != BnOps::Bn,
        bytes,
        "y (the forward's output)",
        ops,
    )?;
    optional(
        a.dz,
        ops == BnOps::BnAddRelu,
        bytes,
        "dz (the added input's gradient)",
        ops,
    )?;
    for (v, what) in [
        (a.gamma, "batch norm weight"),
        (a.beta, "batch norm bias"),
        (a.dgamma, "batch norm weight gradient"),
        (a.dbeta, "batch norm bias gradient"),
        (a.saved_mean, "saved mean"),
        (a.saved_invstd, "saved inverse std"),
    ] {
        v.require(stat, what)?;
    }
    Ok(())
}

/// The address of an optional view (null when absent).
fn addr_or_null(v: Option<View<'_>>) -> *mut c_void {
    v.map_or(std::ptr::null_mut(), |v| v.addr() as *mut c_void)
}

impl Dnn {
    /// A training-mode batch norm over `maps` with the op `ops` fused after it, in `mode`,
    /// `eps` and `momentum` as PyTorch's. An error naming the configuration when cuDNN does not
    /// run it (the fused ops are not available in every layout, type and mode).
    pub fn batch_norm(
        &self,
        maps: Maps,
        ops: BnOps,
        mode: BnMode,
        (eps, momentum): (f64, f64),
    ) -> Result<BatchNorm> {
        if !(eps > 0.0 && (0.0..=1.0).contains(&momentum)) {
            return Err(Error::Invalid(format!(
                "batch norm eps {eps} (must be positive), momentum {momentum} (0 to 1)"
            )));
        }
        let x = TensorDesc::of(&maps)?;
        let param = TensorDesc::empty()?;
        // SAFETY: both descriptors are live; x is set.
        ok("cudnnDeriveBNTensorDescriptor", unsafe {
            dn::cudnnDeriveBNTensorDescriptor(param.0, x.0, mode.cudnn())
        })?;
        let relu = if ops == BnOps::Bn {
            None
        } else {
            Some(ReluDesc::new()?)
        };
        let mut bn = BatchNorm {
            x,
            param,
            relu,
            maps,
            ops,
            mode,
            eps,
            momentum,
            forward_ws: 0,
            backward_ws: 0,
            reserve: 0,
        };
        let unsupported = |e: Error| {
            Error::NoAlgorithm(format!(
                "cuDNN runs no training batch norm with {ops:?} in {mode:?} mode on {} {:?} maps {}x{}x{}x{}: {e}",
                maps.layout.name(), maps.dtype, maps.n, maps.c, maps.h, maps.w
            ))
        };
        let (h, m, o) = (self.handle(), mode.cudnn(), ops.cudnn());
        let (xd, zd, pd, act) = (bn.x.0, bn.z_desc(), bn.param.0, bn.relu_desc());
        // SAFETY: live handle and descriptors (z and the activation null where the op has
        // none, as cuDNN allows); out-pointers to the plan's own fields.
        unsafe {
            ok(
                "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                dn::cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                    h,
                    m,
                    o,
                    xd,
                    zd,
                    xd,
                    pd,
                    act,
                    &mut bn.forward_ws,
                ),
            )
            .map_err(unsupported)?;
            ok(
                "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
                dn::cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                    h,
                    m,
                    o,
                    xd,
                    // y's shape whatever the op (as PyTorch asks); the call passes y only
                    // with a fused ReLU
                    xd,
                    xd,
                    zd,
                    xd,
                    pd,
                    act,
                    &mut bn.backward_ws,
                ),
            )
            .map_err(unsupported)?;
            ok(
                "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                dn::cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
                    h,
                    m,
                    o,
                    act,
                    xd,
                    &mut bn.reserve,
                ),
            )
            .map_err(unsupported)?;
        }
        Ok(bn)
    }

    /// Training-mode forward: `y = op(gamma (x - mean) invstd + beta [, z])` with the batch's
    /// statistics, which are saved for the backward and move the running ones.
    pub fn bn_forward_training(
        &self,
        bn: &BatchNorm,
        a: &BnForward<'_>,
        ws: View<'_>,
        reserve: Option<View<'_>>,
    ) -> Result<()> {
        check_forward(&bn.maps, bn.ops, a)?;
        ws.require(bn.forward_ws, "batch norm workspace")?;
        let reserve = self.reserve_of(bn, reserve)?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked above against the maps and channel count; descriptors live;
        // optional pointers null exactly where the op takes none.
        ok("cudnnBatchNormalizationForwardTrainingEx", unsafe {
            dn::cudnnBatchNormalizationForwardTrainingEx(
                self.handle(),
                bn.mode.cudnn(),
                bn.ops.cudnn(),
                scalar(&alpha),
                scalar(&beta),
                bn.x.0,
                a.x.addr() as *const c_void,
                bn.z_desc(),
                addr_or_null(a.z),
                bn.x.0,
                a.y.addr() as *mut c_void,
                bn.param.0,
                a.gamma.addr() as *const c_void,
                a.beta.addr() as *const c_void,
                bn.momentum,
                a.running_mean.addr() as *mut c_void,
                a.running_var.addr() as *mut c_void,
                bn.eps,
                a.saved_mean.addr() as *mut c_void,
                a.saved_invstd.addr() as *mut c_void,
                bn.relu_desc(),
                ws.addr() as *mut c_void,
                bn.forward_ws,
                addr_or_null(reserve),
                bn.reserve,
            )
        })
    }

    /// Backward from `dy`: `dx`, and `dgamma`, `dbeta` (added to what they hold when
    /// `accumulate_params`), `dz` for the added input; from the forward's saved statistics
    /// and reserve space.
    pub fn bn_backward(
        &self,
        bn: &BatchNorm,
        a: &BnBackward<'_>,
        ws: View<'_>,
        reserve: Option<View<'_>>,
        accumulate_params: bool,
    ) -> Result<()> {
        check_backward(&bn.maps, bn.ops, a)?;
        ws.require(bn.backward_ws, "batch norm workspace")?;
        let reserve = self.reserve_of(bn, reserve)?;
        let (one, zero) = (1f32, 0f32);
        let beta_param = if accumulate_params { one } else { zero };
        let y_desc = if bn.ops == BnOps::Bn {
            std::ptr::null_mut()
        } else {
            bn.x.0
        };
        // SAFETY: as bn_forward_training.
        ok("cudnnBatchNormalizationBackwardEx", unsafe {
            dn::cudnnBatchNormalizationBackwardEx(
                self.handle(),
                bn.mode.cudnn(),
                bn.ops.cudnn(),
                scalar(&one),
                scalar(&zero),
                scalar(&one),
                scalar(&beta_param),
                bn.x.0,
                a.x.addr() as *const c_void,
                y_desc,
                addr_or_null(a.y),
                bn.x.0,
                a.dy.addr() as *const c_void,
                bn.z_desc(),
                addr_or_null(a.dz),
                bn.x.0,
                a.dx.addr() as *mut c_void,
                bn.param.0,
                a.gamma.addr() as *const c_void,
                a.beta.addr() as *const c_void,
                a.dgamma.addr() as *mut c_void,
                a.dbeta.addr() as *mut c_void,
                bn.eps,
                a.saved_mean.addr() as *const c_void,
                a.saved_invstd.addr() as *const c_void,
                bn.relu_desc(),
                ws.addr() as *mut c_void,
                bn.backward_ws,
                addr_or_null(reserve),
                bn.reserve,
            )
        })
    }

    /// The reserve space view to pass: required (and large enough) when cuDNN asked for one.
    fn reserve_of<'a>(
        &self,
        bn: &BatchNorm,
        reserve: Option<View<'a>>,
    ) -> Result<Option<View<'a>>> {
        match reserve {
            Some(r) => {
                r.require(bn.reserve, "batch norm reserve space")?;
                Ok(Some(r))
            }
            None if bn.reserve == 0 => Ok(None),
            None => Err(Error::Invalid(format!(
                "batch norm needs a reserve space of {} bytes",
                bn.reserve
            ))),
        }
    }
}

/// A cuDNN pooling descriptor, destroyed on drop.
struct PoolDesc(dn::cudnnPoolingDescriptor_t);

impl Drop for PoolDesc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created in Dnn::max_pool, destroyed only here.
            unsafe { dn::cudnnDestroyPoolingDescriptor(self.0) };
        }
    }
}

/// Max pooling of square windows: descriptors of the pooling, its input and its output.
pub struct MaxPool {
    desc: PoolDesc,
    x: TensorDesc,
    y: TensorDesc,
    pub input: Maps,
    pub output: Maps,
}

impl Dnn {
    /// Max pooling of `input` by `window` x `window` windows every `stride` positions, `pad`
    /// padding positions (never chosen) on each side, floor mode. cuDNN's deterministic max
    /// pooling: its backward gives each output's gradient to one input of its window.
    pub fn max_pool(
        &self,
        input: Maps,
        window: usize,
        stride: usize,
        pad: usize,
    ) -> Result<MaxPool> {
        let (oh, ow) = (
            pool_out(input.h, window, stride, pad),
            pool_out(input.w, window, stride, pad),
        );
        if oh == 0 || ow == 0 || pad >= window {
            return Err(Error::Invalid(format!(
                "max pooling {window}x{window} stride {stride} padding {pad} over {}x{} maps",
                input.h, input.w
            )));
        }
        let output = Maps {
            h: oh,
            w: ow,
            ..input
        };
        let mut desc = PoolDesc(std::ptr::null_mut());
        // SAFETY: writes a descriptor that `desc` owns, then sets it.
        unsafe {
            ok(
                "cudnnCreatePoolingDescriptor",
                dn::cudnnCreatePoolingDescriptor(&mut desc.0),
            )?;
            ok(
                "cudnnSetPooling2dDescriptor",
                dn::cudnnSetPooling2dDescriptor(
                    desc.0,
                    dn::cudnnPoolingMode_t::CUDNN_POOLING_MAX_DETERMINISTIC,
                    dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    int(window, "pool window")?,
                    int(window, "pool window")?,
                    int(pad, "pool padding")?,
                    int(pad, "pool padding")?,
                    int(stride, "pool stride")?,
                    int(stride, "pool stride")?,
                ),
            )?;
        }
        Ok(MaxPool {
            desc,
            x: TensorDesc::of(&input)?,
            y: TensorDesc::of(&output)?,
            input,
            output,
        })
    }

    /// `y = maxpool(x)`.
    pub fn max_pool_forward(&self, p: &MaxPool, x: View<'_>, y: View<'_>) -> Result<()> {
        x.require(p.input.bytes(), "pool input")?;
        y.require(p.output.bytes(), "pool output")?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked against the descriptors.
        ok("cudnnPoolingForward", unsafe {
            dn::cudnnPoolingForward(
                self.handle(),
                p.desc.0,
                scalar(&alpha),
                p.x.0,
                x.addr() as *const c_void,
                scalar(&beta),
                p.y.0,
                y.addr() as *mut c_void,
            )
        })
    }

    /// `dx` from `dy`, given the forward's input `x` and output `y`.
    pub fn max_pool_backward(
        &self,
        p: &MaxPool,
        (x, y): (View<'_>, View<'_>),
        dy: View<'_>,
        dx: View<'_>,
    ) -> Result<()> {
        x.require(p.input.bytes(), "pool input")?;
        dx.require(p.input.bytes(), "pool input gradient")?;
        y.require(p.output.bytes(), "pool output")?;
        dy.require(p.output.bytes(), "pool output gradient")?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked against the descriptors.
        ok("cudnnPoolingBackward", unsafe {
            dn::cudnnPoolingBackward(
                self.handle(),
                p.desc.0,
                scalar(&alpha),
                p.y.0,
                y.addr() as *const c_void,
                p.y.0,
                dy.addr() as *const c_void,
                p.x.0,
                x.addr() as *const c_void,
                scalar(&beta),
                p.x.0,
                dx.addr() as *mut c_void,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_extents_are_floor_mode() {
        // the ResNet stem's pool: 3x3 stride 2 padding 1
        assert_eq!(pool_out(112, 3, 2, 1), 56);
        assert_eq!(pool_out(16, 3, 2, 1), 8);
        assert_eq!(pool_out(7, 3, 2, 1), 4);
        assert_eq!(pool_out(1, 3, 2, 1), 1);
        assert_eq!(pool_out(1, 3, 2, 0), 0);
        assert_eq!(pool_out(5, 2, 0, 0), 0);
    }

    #[test]
    fn maps_count_elements_and_bytes() {
        let m = Maps::nchw_f32(4, 64, 16, 16);
        assert_eq!(m.elements(), 4 * 64 * 256);
        assert_eq!(m.bytes(), 4 * 4 * 64 * 256);
        let h = Maps {
            dtype: DType::Bf16,
            layout: Layout::Nhwc,
            ..m
        };
        assert_eq!(h.bytes(), 2 * 4 * 64 * 256);
        let huge = Maps::nchw_f32(usize::MAX, 2, 2, 2);
        assert_eq!(huge.bytes(), usize::MAX);
    }

    #[test]
    fn algorithm_names_cover_every_enum_value() {
        assert_eq!(
            Algo::Data(dn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1).name(),
            "ALGO_1"
        );
        assert_eq!(
            Algo::Filter(
                dn::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING
            )
            .name(),
            "FFT_TILING"
        );
        assert_eq!(
            Algo::Fwd(dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD).name(),
            "WINOGRAD"
        );
        assert_eq!(
            Algo::Data(dn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT)
                .name(),
            "unknown algorithm"
        );
    }

    #[test]
    fn strict_f32_keeps_only_fma_and_default_math() {
        use dn::cudnnMathType_t as M;
        let mut conv = Conv {
            shape: gpukit_types::ConvShape {
                n: 1,
                c: 3,
                h: 8,
                w: 8,
                k: 4,
                r: 3,
                s: 3,
                stride: 1,
                pad: 1,
                groups: 1,
            },
            layout: Layout::Nchw,
            dtype: DType::F32,
        };
        assert!(usable(&conv, M::CUDNN_FMA_MATH, true));
        assert!(usable(&conv, M::CUDNN_DEFAULT_MATH, true));
        assert!(!usable(&conv, M::CUDNN_TENSOR_OP_MATH, true));
        assert!(!usable(
            &conv,
            M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            true
        ));
        assert!(!usable(&conv, M::CUDNN_FMA_MATH, false));
        conv.dtype = DType::Bf16;
        assert!(usable(&conv, M::CUDNN_TENSOR_OP_MATH, true));
    }

    fn forward_args(
        x: View<'static>,
        z: Option<View<'static>>,
        stat: View<'static>,
    ) -> BnForward<'static> {
        BnForward {
            x,
            z,
            y: x,
            gamma: stat,
            beta: stat,
            running_mean: stat,
            running_var: stat,
            saved_mean: stat,
            saved_invstd: stat,
        }
    }

    #[test]
    fn batch_norm_arguments_are_checked_before_cudnn() {
        let maps = Maps::nchw_f32(2, 8, 4, 4);
        let x = View::fake(1 << 20, maps.bytes(), 0);
        let stat = View::fake(1 << 24, 8 * 4, 0);
        let short = View::fake(1 << 24, 7 * 4, 0);
        assert!(check_forward(&maps, BnOps::Bn, &forward_args(x, None, stat)).is_ok());
        assert!(check_forward(&maps, BnOps::BnRelu, &forward_args(x, None, stat)).is_ok());
        let e = check_forward(&maps, BnOps::BnAddRelu, &forward_args(x, None, stat))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs z (the added input)"), "{e}");
        assert!(check_forward(&maps, BnOps::BnAddRelu, &forward_args(x, Some(x), stat)).is_ok());
        let e = check_forward(&maps, BnOps::Bn, &forward_args(x, Some(x), stat))
            .unwrap_err()
            .to_string();
        assert!(e.contains("takes no z"), "{e}");
        let e = check_forward(&maps, BnOps::Bn, &forward_args(x, None, short))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch norm weight"), "{e}");
        let small = View::fake(1 << 20, maps.bytes() - 1, 0);
        assert!(check_forward(&maps, BnOps::Bn, &forward_args(small, None, stat)).is_err());

        let back = |y: Option<View<'static>>, dz: Option<View<'static>>| BnBackward {
            x,
            y,
            dy: x,
            dz,
            dx: x,
            gamma: stat,
            beta: stat,
            dgamma: stat,
            dbeta: stat,
            saved_mean: stat,
            saved_invstd: stat,
        };
        assert!(check_backward(&maps, BnOps::Bn, &back(None, None)).is_ok());
        assert!(check_backward(&maps, BnOps::BnRelu, &back(None, None)).is_err());
        assert!(check_backward(&maps, BnOps::BnRelu, &back(Some(x), None)).is_ok());
        assert!(check_backward(&maps, BnOps::BnAddRelu, &back(Some(x), None)).is_err());
        assert!(check_backward(&maps, BnOps::BnAddRelu, &back(Some(x), Some(x))).is_ok());
    }
}
