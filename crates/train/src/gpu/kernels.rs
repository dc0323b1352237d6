//! The training engine's own GPU kernels (CUDA C compiled by NVRTC once per device and cached,
//! launched through `gpukit_cuda::kernel`): batch gathering and casting, MSE and cross-entropy
//! with their gradients, the optimizers over one flat parameter buffer (one launch updates
//! every parameter), the loss scaler, and the epilogue kernels used where cuBLASLt has no fused
//! epilogue for a shape or type.
//!
//! Everything a step needs that changes from step to step (Adam's bias corrections, the loss
//! scale, whether the gradients overflowed) lives in a small device-side [`STATE_BYTES`] block
//! that the kernels read and [`TrainKernels::advance`] updates, so a whole step, or many, can
//! be captured once as a CUDA graph and replayed.
//!
//! To use: [`TrainKernels::new`], then the launch methods (all enqueue on the GPU's stream and
//! return at once). Element types: `F32`, `F16`, `Bf16` (`Tf32` is f32 storage). The kernel API
//! checks each launch's arguments against the kernel's declared parameters; the sizes of the
//! buffers the kernels index are checked here, before each launch.

use gpukit_cuda::kernel::{
    grid_for, tag, Arg, KernelModule, KernelSource, Launch, BLOCK, HALF, PART,
};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};
use gpukit_types::DType;

pub use super::state::{StepState, STATE_BYTES};

mod source;
use source::{PARTS, SOURCE};

/// The module's name in the kernel cache.
const STEM: &str = "train-kernels";

/// The element types every typed kernel is instantiated for.
const TAGS: [&str; 3] = ["f32", "f16", "bf16"];

/// The training kernels' module: its name in the cache, its whole CUDA C source and the
/// kernels loaded from it (also what `gpukit all` compiles ahead).
pub fn kernel_source() -> KernelSource {
    let mut names: Vec<String> = [
        "gather_u32",
        "axpy_f32",
        "check_finite",
        "advance",
        "cross_entropy_total",
    ]
    .map(String::from)
    .to_vec();
    for t in TAGS {
        for k in [
            "gather_rows",
            "cast",
            "widen",
            "mse",
            "cross_entropy",
            "cross_entropy_row",
            "bias_act",
            "relu_grad",
            "bias_grad",
            "relu_bias_grad",
            "adam",
            "sgd",
        ] {
            names.push(format!("{k}_{t}"));
        }
    }
    KernelSource {
        stem: STEM,
        source: format!("{HALF}{SOURCE}{PART}{}", PARTS.join(PART)),
        names,
    }
}

/// Adam's or AdamW's constants for [`TrainKernels::adam`].
#[derive(Debug, Clone, Copy)]
pub struct AdamArgs {
    pub weight_decay: f32,
    /// 1 - lr * weight_decay (AdamW's decoupled decay).
    pub decay: f32,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f32,
    pub adamw: bool,
}

/// An optimizer's update rule as [`TrainKernels::optimizer_step`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct UpdateRule {
    pub kind: crate::optim::OptimizerKind,
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub nesterov: bool,
}

/// The loaded training kernels of one device.
pub struct TrainKernels {
    stream: Stream,
    module: KernelModule,
}

/// One block of 1024 threads: the losses reduce in one block (reproducible sums).
/// The cross-entropy kernels' arguments checked: the smoothing in [0, 1), every buffer large
/// enough for `rows x width` logits of `dtype`.
fn check_cross_entropy(
    (out, classes, grad): (View<'_>, View<'_>, Option<View<'_>>),
    dtype: DType,
    (rows, width): (usize, usize),
    smoothing: f32,
    (loss, correct): (View<'_>, View<'_>),
) -> Result<()> {
    if !(0.0..1.0).contains(&smoothing) {
        return Err(Error::Invalid(format!(
            "label smoothing {smoothing}: must be in [0, 1)"
        )));
    }
    let bytes = rows * width * dtype.size_bytes();
    out.require(bytes, "cross_entropy out")?;
    classes.require(rows * 4, "cross_entropy classes")?;
    if let Some(g) = grad {
        g.require(bytes, "cross_entropy grad")?;
    }
    loss.require(8, "cross_entropy loss")?;
    correct.require(4, "cross_entropy correct")
}

/// Threads of a `cross_entropy_row` block (CE_THREADS in the source).
const CE_THREADS: u32 = 256;

fn one_block() -> Launch {
    Launch::new((1, 1, 1), (1024, 1, 1))
}

impl TrainKernels {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<TrainKernels> {
        let module = KernelModule::load(discovery, gpu, &kernel_source())?;
        Ok(TrainKernels {
            stream: gpu.stream().clone(),
            module,
        })
    }

    fn run(&self, name: &str, launch: Launch, args: &[Arg<'_>]) -> Result<()> {
        self.module.launch(name, &self.stream, launch, args)
    }

    /// The typed kernel `{stem}_{tag}` of `dtype`.
    fn typed(&self, stem: &str, dtype: DType, launch: Launch, args: &[Arg<'_>]) -> Result<()> {
        self.run(&format!("{stem}_{}", tag(dtype)), launch, args)
    }

    /// `dst[r] = src[idx[r]]` for `rows` rows of `cols` f32 values, converted to `dtype`.
    pub fn gather_rows(
        &self,
        src: View<'_>,
        dst: View<'_>,
        idx: View<'_>,
        dtype: DType,
        (rows, cols): (usize, usize),
    ) -> Result<()> {
        dst.require(rows * cols * dtype.size_bytes(), "gather dst")?;
        idx.require(rows * 4, "gather idx")?;
        // the indices are below the source's row count (the caller's order)
        let args = [
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::Ptr(idx),
            Arg::Size(rows),
            Arg::Size(cols),
        ];
        // a row's columns over x (four a thread), rows over y
        let x = cols.div_ceil(4 * BLOCK as usize).clamp(1, 1024) as u32;
        let y = rows.clamp(1, 65_535) as u32;
        self.typed(
            "gather_rows",
            dtype,
            Launch::new((x, y, 1), (BLOCK, 1, 1)),
            &args,
        )
    }

    /// As [`TrainKernels::gather_rows`] for u32 values (class labels).
    pub fn gather_u32(
        &self,
        src: View<'_>,
        dst: View<'_>,
        idx: View<'_>,
        (rows, cols): (usize, usize),
    ) -> Result<()> {
        dst.require(rows * cols * 4, "gather dst")?;
        idx.require(rows * 4, "gather idx")?;
        let args = [
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::Ptr(idx),
            Arg::Size(rows),
            Arg::Size(cols),
        ];
        self.run("gather_u32", grid_for(rows * cols), &args)
    }

    /// `dst = src` converted from f32 to `dtype`, `n` values.
    pub fn cast(&self, src: View<'_>, dst: View<'_>, dtype: DType, n: usize) -> Result<()> {
        src.require(n * 4, "cast src")?;
        dst.require(n * dtype.size_bytes(), "cast dst")?;
        let args = [Arg::Ptr(src), Arg::Ptr(dst), Arg::Size(n)];
        self.typed("cast", dtype, grid_for(n), &args)
    }

    /// `dst = src` (of `dtype`) widened to f32, `n` values.
    pub fn widen(&self, src: View<'_>, dst: View<'_>, dtype: DType, n: usize) -> Result<()> {
        src.require(n * dtype.size_bytes(), "widen src")?;
        dst.require(n * 4, "widen dst")?;
        let args = [Arg::Ptr(src), Arg::Ptr(dst), Arg::Size(n)];
        self.typed("widen", dtype, grid_for(n), &args)
    }

    /// MSE of `n` outputs against f32 targets into `loss` (one f64); the gradient (times
    /// `mult` and the state's loss scale when `state` is given) into `grad` when given.
    #[allow(clippy::too_many_arguments)]
    pub fn mse(
        &self,
        out: View<'_>,
        target: View<'_>,
        grad: Option<View<'_>>,
        dtype: DType,
        n: usize,
        state: Option<View<'_>>,
        mult: f32,
        loss: View<'_>,
    ) -> Result<()> {
        out.require(n * dtype.size_bytes(), "mse out")?;
        target.require(n * 4, "mse target")?;
        if let Some(g) = grad {
            g.require(n * dtype.size_bytes(), "mse grad")?;
        }
        loss.require(8, "mse loss")?;
        let args = [
            Arg::Ptr(out),
            Arg::Ptr(target),
            Arg::opt(grad),
            Arg::Size(n),
            Arg::opt(state),
            Arg::F32(mult),
            Arg::Ptr(loss),
        ];
        self.typed("mse", dtype, one_block(), &args)
    }

    /// Cross-entropy of `rows x width` logits against u32 classes (each below `width`, the
    /// caller's check), label smoothing `smoothing` (0: none), into `loss`, the count of right
    /// answers into `correct`; the gradient (times `mult` and the state's loss scale) into
    /// `grad` when given.
    #[allow(clippy::too_many_arguments)]
    pub fn cross_entropy(
        &self,
        out: View<'_>,
        classes: View<'_>,
        grad: Option<View<'_>>,
        dtype: DType,
        (rows, width): (usize, usize),
        state: Option<View<'_>>,
        (mult, smoothing): (f32, f32),
        loss: View<'_>,
        correct: View<'_>,
    ) -> Result<()> {
        check_cross_entropy(
            (out, classes, grad),
            dtype,
            (rows, width),
            smoothing,
            (loss, correct),
        )?;
        let args = [
            Arg::Ptr(out),
            Arg::Ptr(classes),
            Arg::opt(grad),
            Arg::Size(rows),
            Arg::Size(width),
            Arg::opt(state),
            Arg::F32(mult),
            Arg::F32(smoothing),
            Arg::Ptr(loss),
            Arg::Ptr(correct),
        ];
        self.typed("cross_entropy", dtype, one_block(), &args)
    }

    /// [`TrainKernels::cross_entropy`] with a block of threads a row, for wide rows (a
    /// thousand classes): `part` holds each row's term and hit (16 bytes a row) before they
    /// are summed in a fixed order.
    #[allow(clippy::too_many_arguments)]
    pub fn cross_entropy_rows(
        &self,
        (out, classes, grad): (View<'_>, View<'_>, Option<View<'_>>),
        dtype: DType,
        (rows, width): (usize, usize),
        state: Option<View<'_>>,
        (mult, smoothing): (f32, f32),
        part: View<'_>,
        (loss, correct): (View<'_>, View<'_>),
    ) -> Result<()> {
        check_cross_entropy(
            (out, classes, grad),
            dtype,
            (rows, width),
            smoothing,
            (loss, correct),
        )?;
        part.require(rows * 16, "cross_entropy part")?;
        let blocks = u32::try_from(rows)
            .map_err(|_| Error::Invalid(format!("{rows} rows: too many for one launch")))?;
        let args = [
            Arg::Ptr(out),
            Arg::Ptr(classes),
            Arg::opt(grad),
            Arg::Size(rows),
            Arg::Size(width),
            Arg::opt(state),
            Arg::F32(mult),
            Arg::F32(smoothing),
            Arg::Ptr(part),
        ];
        self.typed(
            "cross_entropy_row",
            dtype,
            Launch::new((blocks.max(1), 1, 1), (CE_THREADS, 1, 1)),
            &args,
        )?;
        let args = [
            Arg::Ptr(part),
            Arg::Size(rows),
            Arg::Ptr(loss),
            Arg::Ptr(correct),
        ];
        self.run("cross_entropy_total", one_block(), &args)
    }

    /// `y (m x n, column-major) += bias[row]`, then ReLU when `relu`.
    pub fn bias_act(
        &self,
        y: View<'_>,
        bias: View<'_>,
        dtype: DType,
        (m, n): (usize, usize),
        relu: bool,
    ) -> Result<()> {
        y.require(m * n * dtype.size_bytes(), "bias_act y")?;
        bias.require(m * 4, "bias_act bias")?;
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(bias),
            Arg::Size(m),
            Arg::Size(n),
            Arg::Bool(relu),
        ];
        self.typed("bias_act", dtype, grid_for(m * n), &args)
    }

    /// `dx = h > 0 ? dx : 0` over `n` values.
    pub fn relu_grad(&self, dx: View<'_>, h: View<'_>, dtype: DType, n: usize) -> Result<()> {
        dx.require(n * dtype.size_bytes(), "relu_grad dx")?;
        h.require(n * dtype.size_bytes(), "relu_grad h")?;
        let args = [Arg::Ptr(dx), Arg::Ptr(h), Arg::Size(n)];
        self.typed("relu_grad", dtype, grid_for(n), &args)
    }

    /// `db = beta db + row sums of dy (m x n, column-major)`, f32.
    pub fn bias_grad(
        &self,
        dy: View<'_>,
        db: View<'_>,
        dtype: DType,
        (m, n): (usize, usize),
        beta: f32,
    ) -> Result<()> {
        dy.require(m * n * dtype.size_bytes(), "bias_grad dy")?;
        db.require(m * 4, "bias_grad db")?;
        let args = [
            Arg::Ptr(dy),
            Arg::Ptr(db),
            Arg::Size(m),
            Arg::Size(n),
            Arg::F32(beta),
        ];
        // the kernel is written for this 32 x 32 block shape: 32 rows a block
        let blocks = u32::try_from(m.div_ceil(32))
            .map_err(|_| Error::Invalid(format!("bias_grad: {m} rows is too many blocks")))?;
        let launch = Launch::new((blocks, 1, 1), (32, 32, 1));
        self.typed("bias_grad", dtype, launch, &args)
    }

    /// [`TrainKernels::relu_grad`] of `dy` by `h`, then [`TrainKernels::bias_grad`] of it, in
    /// one pass (the same bits).
    pub fn relu_bias_grad(
        &self,
        (dy, h): (View<'_>, View<'_>),
        db: View<'_>,
        dtype: DType,
        (m, n): (usize, usize),
        beta: f32,
    ) -> Result<()> {
        dy.require(m * n * dtype.size_bytes(), "relu_bias_grad dy")?;
        h.require(m * n * dtype.size_bytes(), "relu_bias_grad h")?;
        db.require(m * 4, "relu_bias_grad db")?;
        let args = [
            Arg::Ptr(dy),
            Arg::Ptr(h),
            Arg::Ptr(db),
            Arg::Size(m),
            Arg::Size(n),
            Arg::F32(beta),
        ];
        // bias_grad's 32 x 32 block shape: 32 rows a block
        let blocks = u32::try_from(m.div_ceil(32))
            .map_err(|_| Error::Invalid(format!("relu_bias_grad: {m} rows is too many blocks")))?;
        let launch = Launch::new((blocks, 1, 1), (32, 32, 1));
        self.typed("relu_bias_grad", dtype, launch, &args)
    }

    /// `y += x`, `n` f32 values.
    pub fn axpy(&self, y: View<'_>, x: View<'_>, n: usize) -> Result<()> {
        y.require(n * 4, "axpy y")?;
        x.require(n * 4, "axpy x")?;
        let args = [Arg::Ptr(y), Arg::Ptr(x), Arg::Size(n)];
        self.run("axpy_f32", grid_for(n), &args)
    }

    /// Marks `state` when any of `n` f32 gradients is inf or NaN.
    pub fn check_finite(&self, grads: View<'_>, n: usize, state: View<'_>) -> Result<()> {
        grads.require(n * 4, "check_finite grads")?;
        state.require(STATE_BYTES, "check_finite state")?;
        let args = [Arg::Ptr(grads), Arg::Size(n), Arg::Ptr(state)];
        self.run("check_finite", grid_for(n), &args)
    }

    /// One Adam/AdamW update of `n` parameters (skipped when the state says the gradients
    /// overflowed); `half` receives the new weights in `dtype` when given.
    #[allow(clippy::too_many_arguments)]
    pub fn adam(
        &self,
        (p, g, m, v): (View<'_>, View<'_>, View<'_>, View<'_>),
        also: Option<(View<'_>, f32)>,
        half: Option<View<'_>>,
        dtype: DType,
        n: usize,
        state: View<'_>,
        args: AdamArgs,
        scaled: bool,
    ) -> Result<()> {
        for (x, what) in [(p, "adam p"), (g, "adam g"), (m, "adam m"), (v, "adam v")] {
            x.require(n * 4, what)?;
        }
        if let Some(h) = half {
            h.require(n * dtype.size_bytes(), "adam half")?;
        }
        state.require(STATE_BYTES, "adam state")?;
        let (b1c, b2, b2c) = (
            (1.0 - args.beta1) as f32,
            args.beta2 as f32,
            (1.0 - args.beta2) as f32,
        );
        if let Some((g2, _)) = also {
            g2.require(n * 4, "adam g2")?;
        }
        let a = [
            Arg::Ptr(p),
            Arg::Ptr(g),
            Arg::opt(also.map(|a| a.0)),
            Arg::F32(also.map_or(1.0, |a| a.1)),
            Arg::Ptr(m),
            Arg::Ptr(v),
            Arg::opt(half),
            Arg::Size(n),
            Arg::Ptr(state),
            Arg::F32(args.weight_decay),
            Arg::F32(args.decay),
            Arg::F32(b1c),
            Arg::F32(b2),
            Arg::F32(b2c),
            Arg::F32(args.eps),
            Arg::Bool(args.adamw),
            Arg::Bool(scaled),
        ];
        self.typed("adam", dtype, grid_for(n), &a)
    }

    /// One update of `n` parameters by `rule`: SGD (momentum, Nesterov, weight decay; `m` its
    /// momentum buffer) or Adam / AdamW (`m`, `v` their moments), writing the 16-bit copy
    /// `half` when given; with `scaled`, unscaled by the step state's loss scale and skipped on
    /// its overflow flag.
    #[allow(clippy::too_many_arguments)]
    pub fn optimizer_step(
        &self,
        rule: UpdateRule,
        tensors: (View<'_>, View<'_>, Option<View<'_>>, Option<View<'_>>),
        half: Option<View<'_>>,
        dtype: DType,
        n: usize,
        state: View<'_>,
        scaled: bool,
    ) -> Result<()> {
        self.averaging_step(rule, tensors, None, half, (dtype, n), state, scaled)
    }

    /// [`TrainKernels::optimizer_step`] on the average of two gradients: with `also` =
    /// (`g2`, `s`), the update reads `(g + g2) * s` where it read `g` (another rank's block of
    /// the same gradients, `s` = 1 / ranks), in the same pass over the parameters.
    #[allow(clippy::too_many_arguments)]
    pub fn averaging_step(
        &self,
        rule: UpdateRule,
        (p, g, m, v): (View<'_>, View<'_>, Option<View<'_>>, Option<View<'_>>),
        also: Option<(View<'_>, f32)>,
        half: Option<View<'_>>,
        (dtype, n): (DType, usize),
        state: View<'_>,
        scaled: bool,
    ) -> Result<()> {
        use crate::optim::{OptimizerKind, BETA1, BETA2, EPS};
        let r = rule;
        match r.kind {
            OptimizerKind::Sgd => {
                let hyper = (
                    r.lr as f32,
                    r.weight_decay as f32,
                    r.momentum as f32,
                    r.nesterov,
                );
                self.sgd((p, g, m), also, half, dtype, n, state, hyper, scaled)
            }
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                let (Some(m), Some(v)) = (m, v) else {
                    return Err(Error::Invalid("Adam without its moments".into()));
                };
                let args = AdamArgs {
                    weight_decay: r.weight_decay as f32,
                    decay: (1.0 - r.lr * r.weight_decay) as f32,
                    beta1: BETA1,
                    beta2: BETA2,
                    eps: EPS as f32,
                    adamw: r.kind == OptimizerKind::AdamW,
                };
                self.adam((p, g, m, v), also, half, dtype, n, state, args, scaled)
            }
        }
    }

    /// One SGD update (momentum buffer `m` when given; Nesterov's step when `nesterov`).
    #[allow(clippy::too_many_arguments)]
    pub fn sgd(
        &self,
        (p, g, m): (View<'_>, View<'_>, Option<View<'_>>),
        also: Option<(View<'_>, f32)>,
        half: Option<View<'_>>,
        dtype: DType,
        n: usize,
        state: View<'_>,
        (lr, wd, momentum, nesterov): (f32, f32, f32, bool),
        scaled: bool,
    ) -> Result<()> {
        p.require(n * 4, "sgd p")?;
        g.require(n * 4, "sgd g")?;
        if let Some(m) = m {
            m.require(n * 4, "sgd m")?;
        }
        if let Some(h) = half {
            h.require(n * dtype.size_bytes(), "sgd half")?;
        }
        state.require(STATE_BYTES, "sgd state")?;
        if let Some((g2, _)) = also {
            g2.require(n * 4, "sgd g2")?;
        }
        let args = [
            Arg::Ptr(p),
            Arg::Ptr(g),
            Arg::opt(also.map(|a| a.0)),
            Arg::F32(also.map_or(1.0, |a| a.1)),
            Arg::opt(m),
            Arg::opt(half),
            Arg::Size(n),
            Arg::Ptr(state),
            Arg::F32(lr),
            Arg::F32(wd),
            Arg::F32(momentum),
            Arg::Bool(nesterov),
            Arg::Bool(scaled),
        ];
        self.typed("sgd", dtype, grid_for(n), &args)
    }

    /// Counts the update (or its skip), moves the loss scale (halved on overflow, doubled
    /// after `growth_interval` clean updates) and prepares Adam's next bias corrections.
    pub fn advance(
        &self,
        state: View<'_>,
        scaled: bool,
        (lr, beta1, beta2): (f64, f64, f64),
        growth_interval: u32,
    ) -> Result<()> {
        state.require(STATE_BYTES, "advance state")?;
        let args = [
            Arg::Ptr(state),
            Arg::Bool(scaled),
            Arg::F64(lr),
            Arg::F64(beta1),
            Arg::F64(beta2),
            Arg::Size(growth_interval as usize),
        ];
        // one thread: the kernel reads and writes the one step state without a thread guard, so
        // more threads would race on it (the count could move by more than one)
        self.run("advance", Launch::new((1, 1, 1), (1, 1, 1)), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        let expected = [
            ("gather_rows_", "p p p i i"),
            ("cast_", "p p l"),
            ("widen_", "p p l"),
            ("mse_", "p p p i p f p"),
            ("cross_entropy_", "p p p i i p f f p p"),
            ("cross_entropy_row_", "p p p i i p f f p"),
            ("cross_entropy_total", "p i p p"),
            ("bias_act_", "p p i i i"),
            ("relu_grad_", "p p l"),
            ("bias_grad_", "p p i i f"),
            ("relu_bias_grad_", "p p p i i f"),
            ("adam_", "p p p f p p p l p f f f f f f i i"),
            ("sgd_", "p p p f p p l p f f f i i"),
            ("gather_u32", "p p p i i"),
            ("axpy_f32", "p p l"),
            ("check_finite", "p l p"),
            ("advance", "p i d d d i"),
        ];
        let differences = kernel_source().signature_differences(&expected, &TAGS);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn step_state_round_trips_through_its_bytes() {
        let st = StepState {
            scale: 65536.0,
            step_size: 1e-3,
            bc2_sqrt: 0.5,
            found_inf: true,
            step: 7,
            growth: 3,
            skipped: 1,
        };
        assert_eq!(StepState::from_bytes(&st.to_bytes()).unwrap(), st);
        assert!(StepState::from_bytes(&[0; STATE_BYTES - 1]).is_err());
    }
}
