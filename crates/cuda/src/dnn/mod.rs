//! Convolution on the GPU through cuDNN: the handle ([`Dnn`]), what a convolution is
//! ([`Conv`]), and how each one runs ([`ConvChoice`]), chosen by measurement.
//!
//! The module has four parts:
//! - `legacy`: the legacy API (`cudnnFindConvolutionForwardAlgorithmEx`,
//!   `cudnnConvolutionForward`, the fused `cudnnConvolutionBiasActivationForward`);
//! - `graph`: the backend (graph) API, whose engine configurations include the runtime-fused
//!   and Hopper-specific kernels the legacy API does not reach;
//! - `select`: the selection policy, the one place that decides how a convolution runs (every
//!   legacy algorithm and backend engine timed the same way, the fastest kept), used by the
//!   inference engine and by `bench conv` alike;
//! - `train`: what training adds (backward data and filter, batch norm forward-training and
//!   backward, max pooling forward and backward), on cuDNN's heuristic choices;
//! - `cache`: the measured choices, kept on disk per GPU model and cuDNN version so that a shape
//!   is measured once (`GPUKIT_REPLAN=1` measures again).
//!
//! To use: [`Dnn::new`] on an open [`Gpu`]; [`Dnn::plan_plain_best`] or
//! [`Dnn::plan_fused_best`] for each convolution on its real buffers; [`Dnn::run_choice`] (or the
//! forms for each choice) to enqueue it with a workspace of [`ConvChoice::workspace_bytes`].

mod backend;
mod cache;
mod engines;
mod fp8;
mod graph;
mod legacy;
mod precompile;
mod select;
mod timing;
mod train;

pub use backend::GraphConv;
pub use fp8::Fp8Conv;
pub use legacy::{ConvPlan, FusedConv};
pub use precompile::GraphSpec;
pub use train::{
    pool_out, BatchNorm, BnBackward, BnForward, BnMode, BnOps, Candidate, ConvTrain, Maps, MaxPool,
    Pass,
};

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use crate::memory::{DeviceBuffer, View};
use crate::stream::Stream;
use cudarc::cudnn::sys as dn;
use gpukit_types::{ConvShape, DType, Layout};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// An activation cuDNN's backend graphs apply after a convolution (and its bias and residual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    Relu,
    /// `x * sigmoid(x)` (SiLU).
    Swish,
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    Gelu,
    Sigmoid,
}

/// One convolution to run: its shape, the layout of its activations (and filters) and its
/// element type (`Tf32`: f32 storage on TF32 tensor cores; `F32`: strict f32, no tensor cores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Conv {
    pub shape: ConvShape,
    pub layout: Layout,
    pub dtype: DType,
}

impl Conv {
    fn elem(&self) -> usize {
        self.dtype.size_bytes()
    }

    pub fn input_bytes(&self) -> usize {
        self.shape.input_len().saturating_mul(self.elem())
    }

    pub fn filter_bytes(&self) -> usize {
        self.shape.weight_len().saturating_mul(self.elem())
    }

    pub fn output_bytes(&self) -> usize {
        self.shape.output_len().saturating_mul(self.elem())
    }

    /// An error unless the buffers hold the input, filter and output.
    fn check(&self, x: View<'_>, w: View<'_>, y: View<'_>) -> Result<()> {
        if !self.shape.groups_fit() {
            return Err(Error::Invalid(format!(
                "a convolution of {} groups over {} input and {} output channels",
                self.shape.groups, self.shape.c, self.shape.k
            )));
        }
        x.require(self.input_bytes(), "convolution input")?;
        w.require(self.filter_bytes(), "convolution filter")?;
        y.require(self.output_bytes(), "convolution output")
    }

    /// cuDNN's storage type of the dtype (its conversion at the library boundary).
    fn data_type(&self) -> Result<dn::cudnnDataType_t> {
        data_type(self.dtype)
    }

    /// The legacy API's math type: FMA_MATH forbids TF32 for strict f32 (cuDNN otherwise uses it
    /// on Ampere and newer); tensor-op math for the rest.
    fn math(&self) -> dn::cudnnMathType_t {
        match self.dtype {
            DType::F32 | DType::F64 => dn::cudnnMathType_t::CUDNN_FMA_MATH,
            _ => dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        }
    }

    fn format(&self) -> dn::cudnnTensorFormat_t {
        format(self.layout)
    }
}

/// cuDNN's storage type of a dtype (its conversion at the library boundary).
fn data_type(dtype: DType) -> Result<dn::cudnnDataType_t> {
    match dtype {
        DType::F32 | DType::Tf32 => Ok(dn::cudnnDataType_t::CUDNN_DATA_FLOAT),
        DType::F16 => Ok(dn::cudnnDataType_t::CUDNN_DATA_HALF),
        DType::Bf16 => Ok(dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::F64 => Err(Error::NoAlgorithm(
            "gpukit runs convolutions in f32, tf32, f16 and bf16, not f64".into(),
        )),
        DType::F8E4M3 => Err(Error::NoAlgorithm(
            "gpukit runs convolutions in f32, tf32, f16 and bf16, not fp8 (a matmul-only type)"
                .into(),
        )),
    }
}

/// cuDNN's name of a layout.
fn format(layout: Layout) -> dn::cudnnTensorFormat_t {
    match layout {
        Layout::Nhwc => dn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        Layout::Nchw => dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
    }
}

pub(crate) fn ok(call: &'static str, status: dn::cudnnStatus_t) -> Result<()> {
    if status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::library("cuDNN", call, status))
    }
}

/// Largest workspace an algorithm may use.
pub const CONV_WORKSPACE_BYTES: usize = 256 << 20;

/// Which convolution kernels an f32 (or f64) convolution may run: tensor-core types take any;
/// strict f32 leaves out TF32 tensor cores; exact f32 also leaves out Winograd and FFT transforms,
/// reduced-precision sums and inputs converted down ([`Dnn::set_exact_f32`]), so that a deep
/// model's f32 output stays as near float64 as other frameworks' f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strict {
    Any,
    NoTensorCores,
    Exact,
}

impl Strict {
    pub fn f32(self) -> bool {
        self != Strict::Any
    }
}

/// How hard the selection policy searches for each convolution's fastest way to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Search {
    /// cuDNN's first suggestion that runs, untimed: for a reference pass whose speed is not
    /// reported (nothing is measured; the pick is kept for the next heuristic search only).
    Heuristic,
    /// The few best of cuDNN's heuristic ranking timed on the real buffers, the finalists
    /// confirmed in interleaved rounds: the default, planning in about the time PyTorch's
    /// cudnn.benchmark takes.
    Fast,
    /// Every engine configuration cuDNN suggests (and its fallback list, and every legacy
    /// algorithm) timed: minutes for a whole network, for those who want every candidate.
    Exhaustive,
}

impl Search {
    pub const ALL: [Search; 3] = [Search::Heuristic, Search::Fast, Search::Exhaustive];

    pub fn name(self) -> &'static str {
        match self {
            Search::Heuristic => "heuristic",
            Search::Fast => "fast",
            Search::Exhaustive => "exhaustive",
        }
    }

    pub fn parse(s: &str) -> Option<Search> {
        Search::ALL
            .into_iter()
            .find(|m| m.name() == s.trim().to_ascii_lowercase())
    }
}

/// What planning has done since the handle was made: how many convolutions were measured or
/// taken from the cache, how many candidates were timed and how long it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanStats {
    /// Convolutions whose choice was made now (timed, or untimed by a heuristic search).
    pub measured: usize,
    /// Convolutions whose choice came from the cache.
    pub cached: usize,
    /// Candidates timed (legacy algorithms and backend engines).
    pub candidates_timed: usize,
    /// Wall seconds spent choosing (measuring and rebuilding cached plans).
    pub seconds: f64,
    /// Plans of engines that compile at run time which helper threads finalized ahead of the
    /// planner ([`Dnn::precompile`]).
    #[serde(default)]
    pub finalized_ahead: usize,
}

/// How one convolution runs: the legacy fused call, the legacy bare convolution, or a
/// backend-API graph (fused or bare).
pub enum ConvChoice {
    Fused(FusedConv),
    Plain(ConvPlan),
    Graph(GraphConv),
    /// The bare convolution (a `Plain` or bare `Graph` choice), then the caller's epilogue
    /// kernel `y = relu(y + bias (+ z))`: two launches, sometimes faster than any fused engine.
    Split(Box<ConvChoice>),
}

/// The epilogue a split plan runs after the bare convolution: `(y, bias, z)`.
pub type Epilogue<'e> = &'e dyn Fn(View<'_>, View<'_>, Option<View<'_>>) -> Result<()>;

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

    /// Which API ran it: `legacy` or `backend`.
    pub fn api(&self) -> &'static str {
        match self {
            ConvChoice::Fused(_) | ConvChoice::Plain(_) => "legacy",
            ConvChoice::Graph(_) => "backend",
            ConvChoice::Split(c) => c.api(),
        }
    }

    pub fn workspace_bytes(&self) -> usize {
        match self {
            ConvChoice::Fused(f) => f.conv.workspace_bytes(),
            ConvChoice::Plain(p) => p.workspace_bytes(),
            ConvChoice::Graph(g) => g.workspace_bytes,
            ConvChoice::Split(c) => c.workspace_bytes(),
        }
    }

    /// Whether the chosen kernel runs on tensor cores: the legacy algorithm's math type, or the
    /// backend engine's own numerical note. None where cuDNN did not say.
    pub fn tensor_cores(&self) -> Option<bool> {
        match self {
            ConvChoice::Fused(f) => Some(f.conv.tensor_cores()),
            ConvChoice::Plain(p) => Some(p.tensor_cores()),
            ConvChoice::Graph(g) => g.tensor_cores,
            ConvChoice::Split(c) => c.tensor_cores(),
        }
    }

    /// Median device milliseconds measured when it was chosen (None for a cached choice).
    pub fn measured_ms(&self) -> Option<f64> {
        match self {
            ConvChoice::Fused(f) => f.conv.measured_ms(),
            ConvChoice::Plain(p) => p.measured_ms(),
            ConvChoice::Graph(g) => (g.ms > 0.0).then_some(g.ms),
            ConvChoice::Split(_) => None,
        }
    }
}

/// A cuDNN handle on one stream. Planning borrows a workspace of [`CONV_WORKSPACE_BYTES`]
/// (allocated on first use, given back by [`Dnn::release_workspace`]); running a plan takes the
/// caller's workspace, sized to what the plan needs (see [`ConvChoice::workspace_bytes`]).
pub struct Dnn {
    gpu_stream: Stream,
    handle: dn::cudnnHandle_t,
    workspace: RefCell<Option<Rc<DeviceBuffer>>>,
    /// The most workspace a chosen algorithm may use ([`Dnn::set_workspace_limit`]).
    workspace_limit: Cell<usize>,
    choices: RefCell<cache::Choices>,
    /// When a candidate was last timed: a GPU idle longer than [`IDLE_CLOCKS_DOWN`] is warmed
    /// before the next one ([`Dnn::candidate_ms_within`]).
    last_timed: Cell<Option<std::time::Instant>>,
    search: Cell<Search>,
    /// Whether strict f32 convolutions planned from now on must be exact ([`Strict::Exact`]).
    exact_f32: Cell<bool>,
    stats: Cell<PlanStats>,
    /// The GPU's context, for helper threads ([`Dnn::precompile`]).
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    precompiler: RefCell<Option<precompile::Precompiler>>,
    /// Training plans by convolution ([`Dnn::plan_conv_train`]): a shape is planned once.
    train_plans: RefCell<HashMap<Conv, Rc<ConvTrain>>>,
}

impl Dnn {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Dnn> {
        if !discovery.usable(Lib::Cudnn) {
            return Err(Error::MissingLibrary(discovery.missing_message(Lib::Cudnn)));
        }
        // SAFETY: asks the loader only.
        if !unsafe { dn::is_culib_present() } {
            return Err(Error::MissingLibrary(
                "cuDNN was found but did not load".into(),
            ));
        }
        gpu.bind()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        ok("cudnnCreate", unsafe { dn::cudnnCreate(&mut handle) })?;
        // SAFETY: live handle; the stream outlives it (kept in self).
        if let Err(e) = ok("cudnnSetStream", unsafe {
            dn::cudnnSetStream(handle, gpu.stream().cu() as _)
        }) {
            // SAFETY: created above.
            unsafe { dn::cudnnDestroy(handle) };
            return Err(e);
        }
        Ok(Dnn {
            gpu_stream: gpu.stream().clone(),
            handle,
            workspace: Default::default(),
            workspace_limit: Cell::new(CONV_WORKSPACE_BYTES),
            choices: RefCell::new(cache::Choices::open(gpu)),
            last_timed: Cell::new(None),
            search: Cell::new(Search::Fast),
            exact_f32: Cell::new(false),
            stats: Cell::new(PlanStats::default()),
            ctx: gpu.ctx().clone(),
            precompiler: RefCell::new(None),
            train_plans: RefCell::new(HashMap::new()),
        })
    }

    pub(crate) fn handle(&self) -> dn::cudnnHandle_t {
        self.handle
    }

    /// The planning workspace (the workspace limit: the most any plan may use), allocated on
    /// first use and kept until [`Dnn::release_workspace`].
    pub(crate) fn planning_workspace(&self) -> Result<Rc<DeviceBuffer>> {
        let mut slot = self.workspace.borrow_mut();
        let bytes = self.workspace_limit().max(256);
        if let Some(ws) = slot.as_ref().filter(|ws| ws.len() == bytes) {
            return Ok(ws.clone());
        }
        let ws = Rc::new(DeviceBuffer::new(
            self.gpu_stream.raw().alloc_zeros::<u8>(bytes)?,
        ));
        *slot = Some(ws.clone());
        Ok(ws)
    }

    /// Limits the workspace of the algorithms chosen from now on (at most
    /// [`CONV_WORKSPACE_BYTES`]; 0: only algorithms that need none). Choices made under a limit
    /// are cached apart from the unlimited ones.
    pub fn set_workspace_limit(&self, bytes: usize) {
        self.workspace_limit.set(bytes.min(CONV_WORKSPACE_BYTES));
    }

    /// Makes the f32 convolutions planned from now on exact: no Winograd or FFT transforms, no
    /// reduced-precision sums, no inputs converted down (besides no TF32). For programs whose f32
    /// output is judged against float64; `bench conv` keeps every f32 algorithm PyTorch's
    /// cudnn.benchmark may pick. Choices made so are cached apart.
    pub fn set_exact_f32(&self, on: bool) {
        self.exact_f32.set(on);
    }

    /// What a `dtype` convolution planned now may run ([`Strict`]).
    pub(super) fn strict(&self, dtype: DType) -> Strict {
        match (dtype.uses_tensor_cores(), self.exact_f32.get()) {
            (true, _) => Strict::Any,
            (false, false) => Strict::NoTensorCores,
            (false, true) => Strict::Exact,
        }
    }

    /// See [`Dnn::set_workspace_limit`].
    pub fn workspace_limit(&self) -> usize {
        self.workspace_limit.get()
    }

    /// Gives the planning workspace back to the memory pool (stream-ordered: work already
    /// queued that uses it completes first). Planning again allocates it again.
    pub fn release_workspace(&self) {
        self.workspace.borrow_mut().take();
    }

    /// How the choices made from now on are searched for ([`Search::Fast`] unless set).
    pub fn set_search(&self, search: Search) {
        self.search.set(search);
    }

    /// See [`Dnn::set_search`].
    pub fn search(&self) -> Search {
        self.search.get()
    }

    /// What planning has done so far with this handle.
    pub fn stats(&self) -> PlanStats {
        self.stats.get()
    }

    fn count(&self, change: impl FnOnce(&mut PlanStats)) {
        let mut s = self.stats.get();
        change(&mut s);
        self.stats.set(s);
    }

    /// Why the choices file on disk was not used, when it could not be read (it is measured
    /// again and rewritten): a note for the report.
    pub fn cache_note(&self) -> Option<String> {
        self.choices.borrow().note()
    }

    /// Whether the choice for `conv` (fused with or without a residual, or bare when None) is
    /// in the cache for the current search: planning it will not time anything.
    pub fn has_choice(&self, conv: Conv, fused: Option<bool>, allow_graph: bool) -> bool {
        let op = match fused {
            Some(residual) => cache::Op::Fused { residual },
            None => cache::Op::Plain,
        };
        let key = self.key(conv, op, allow_graph);
        self.search() == Search::Heuristic
            || self.choices.borrow().get(&key, self.search()).is_some()
    }

    /// Writes the measured choices to disk (also done when the handle is dropped).
    pub fn save_choices(&self) {
        self.choices.borrow_mut().save();
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.finish_precompile();
        self.choices.borrow_mut().save();
        // SAFETY: created in new(), destroyed only here, after queued work finished.
        unsafe {
            let _ = self.gpu_stream.synchronize();
            dn::cudnnDestroy(self.handle);
        }
    }
}
