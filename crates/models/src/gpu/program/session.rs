//! A [`Program`] on a device: its constants uploaded, its arena allocated at the planned
//! offsets, every convolution planned by measurement (once per distinct shape), and after
//! [`ProgramSession::capture`] a CUDA graph of the whole pass.

use super::kernels::gemm::SmallGemm;
use super::kernels::ProgramKernels;
use super::lower::{Buf, ConvStep, Step, Tref};
use super::Program;
use super::Strided;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::graph::{Activation, Binary};
use gpukit_cuda::dnn::{Act, Conv, ConvChoice, Epilogue, GraphSpec};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::profiler::OpInfo;
use gpukit_cuda::{DeviceBuffer, Graph, View};
use gpukit_tensor::{DType, Layout};
use std::collections::HashMap;
use std::rc::Rc;

mod branches;
mod choice;
mod depthwise;
mod exact;
mod matvec;
mod own_conv;
mod products;
mod stem;
pub use branches::Branching;
use choice::{lt_candidates, lt_epilogue, lt_spec, pick_gemm, time_candidates};
pub use exact::{ExactSums, EXACT_MARGIN};
pub use own_conv::OwnConvs;
use products::GemmRun;

/// A program prepared on a device.
pub struct ProgramSession<'a> {
    ctx: &'a GpuContext,
    program: &'a Program,
    kernels: ProgramKernels,
    arena: DeviceBuffer,
    weights: DeviceBuffer,
    /// Byte offset of each constant in `weights`.
    const_at: Vec<usize>,
    /// Per step, its convolution's plan.
    runs: Vec<Option<Rc<ConvChoice>>>,
    /// Per step, its matrix product's plan.
    gemms: Vec<Option<GemmRun>>,
    /// gpukit's kernel for products of few rows, where a 16-bit program has a product it
    /// takes on a GPU that runs it (compute capability 8.0 and later).
    small_gemm: Option<SmallGemm>,
    /// Per step, what runs its convolution instead of cuDNN's plan (gpukit's kernel or
    /// cuBLASLt's product), where something does.
    conv_alts: Vec<Option<own_conv::ConvAlt>>,
    /// Per depthwise step, the kernel timed fastest where it is not the launcher's choice.
    dw_kernels: Vec<Option<String>>,
    /// Per step, whether it is a convolution that may sum in f64; whether every such step
    /// does (no cuDNN plan is made for them); what those that do share.
    exact_candidates: Vec<bool>,
    exact_forced: bool,
    exact: Option<exact::ExactScratch>,
    /// gpukit's stem-and-pool kernel, where the program has such a step.
    stem: Option<super::kernels::stem::StemPool>,
    workspace: DeviceBuffer,
    /// Per step, whether it runs as a branch beside the steps before it in the CUDA graph
    /// (the program's branches whose runner shares no scratch with those steps); such
    /// convolutions take `branch_workspace`.
    branch: Vec<bool>,
    branch_workspace: DeviceBuffer,
    graph: Option<Graph>,
    /// Whether `graph` runs the branches beside the steps before them.
    graph_branched: bool,
    /// Most workspace a chosen convolution algorithm uses.
    pub workspace_bytes: usize,
    /// The engine chosen for each convolution step, in order.
    pub algorithms: Vec<String>,
}

impl<'a> ProgramSession<'a> {
    /// Uploads the constants, allocates the arena and plans every convolution (by measurement,
    /// or from the choices measured before); `progress` hears how planning goes.
    pub fn new(
        ctx: &'a GpuContext,
        discovery: &Discovery,
        program: &'a Program,
        progress: &mut dyn FnMut(&str),
    ) -> Result<ProgramSession<'a>> {
        Self::with_own_convs(ctx, discovery, program, progress, OwnConvs::from_env())
    }

    /// [`ProgramSession::new`] with gpukit's convolution kernel used as `own` says.
    pub fn with_own_convs(
        ctx: &'a GpuContext,
        discovery: &Discovery,
        program: &'a Program,
        progress: &mut dyn FnMut(&str),
        own: OwnConvs,
    ) -> Result<ProgramSession<'a>> {
        let exact = ExactSums::from_env();
        Self::with_options(ctx, discovery, program, progress, own, exact)
    }

    /// [`ProgramSession::with_own_convs`] with an f32 program's convolutions summed in f64 as
    /// `exact` says.
    pub fn with_options(
        ctx: &'a GpuContext,
        discovery: &Discovery,
        program: &'a Program,
        progress: &mut dyn FnMut(&str),
        own: OwnConvs,
        exact: ExactSums,
    ) -> Result<ProgramSession<'a>> {
        let kernels = ProgramKernels::new(discovery, &ctx.gpu)?;
        let small_gemm = Self::small_gemm(ctx, discovery, program, own);
        own_conv::loaded_where_needed(program, small_gemm.is_some())?;
        let storage = program.dtype.storage();
        // the constants, each at an aligned offset of one buffer
        let mut const_at = Vec::with_capacity(program.consts.len());
        let mut bytes = Vec::new();
        for c in &program.consts {
            const_at.push(bytes.len());
            bytes.extend(gpukit_tensor::codec::encode_f32(&c.values, storage));
            bytes.resize(
                bytes.len().div_ceil(crate::plan::ALIGN) * crate::plan::ALIGN,
                0,
            );
        }
        ctx.check_limit(bytes.len() + program.plan.total, "weights and activations")?;
        let weights = ctx.alloc(bytes.len().max(256), "weights")?;
        ctx.gpu.upload_into(weights.view(), &bytes)?;
        let arena = ctx.alloc(program.plan.total.max(256), "activation arena")?;
        let mut session = ProgramSession {
            ctx,
            program,
            kernels,
            arena,
            weights,
            const_at,
            runs: vec![None; program.steps.len()],
            gemms: Vec::new(),
            small_gemm,
            conv_alts: Vec::new(),
            dw_kernels: Vec::new(),
            exact_candidates: exact::exact_candidates(program, exact),
            exact_forced: exact == ExactSums::All,
            exact: None,
            stem: stem::load(ctx, discovery, program)?,
            workspace: ctx.alloc(256, "convolution workspace")?,
            branch: vec![false; program.steps.len()],
            branch_workspace: ctx.alloc(256, "branch convolution workspace")?,
            graph: None,
            graph_branched: false,
            workspace_bytes: 0,
            algorithms: Vec::new(),
        };
        session.plan_convolutions(progress)?;
        session.plan_gemms(own)?;
        if session.workspace_bytes > session.workspace.len() {
            session.workspace = ctx.alloc(session.workspace_bytes, "convolution workspace")?;
        }
        session.plan_own_convs(own)?;
        session.plan_exact_convs(discovery, exact)?;
        session.plan_depthwise()?;
        session.plan_branches()?;
        ctx.dnn.release_workspace();
        Ok(session)
    }

    /// Bytes of the element type `t` is stored in.
    fn elem_bytes(&self, t: &Tref) -> usize {
        match t.buf {
            Buf::Slot(s) if self.is_f32_slot(s) => 4,
            _ => self.program.dtype.storage().size_bytes(),
        }
    }

    /// The graph's inputs and outputs are f32 slots.
    fn is_f32_slot(&self, s: usize) -> bool {
        let p = self.program;
        p.inputs
            .iter()
            .chain(&p.outputs)
            .any(|(_, _, slot)| *slot == s)
    }

    /// The device bytes of view `t` (from its first element to one past its last).
    fn view(&self, t: &Tref) -> Result<View<'_>> {
        let e = self.elem_bytes(t);
        let (base, at) = match t.buf {
            Buf::Slot(s) => (self.arena.view(), self.program.plan.offsets[s]),
            Buf::Const(c) => (self.weights.view(), self.const_at[c]),
        };
        Ok(base.sub(at + t.offset * e, t.s.span().max(1) * e)?)
    }

    fn conv_of(&self, c: &ConvStep) -> Conv {
        Conv {
            shape: c.shape,
            layout: self.program.layout,
            dtype: self.program.dtype,
        }
    }

    fn const_view(&self, c: usize) -> Result<View<'_>> {
        let e = self.program.dtype.storage().size_bytes();
        let len = self.program.consts[c].values.len() * e;
        Ok(self.weights.view().sub(self.const_at[c], len.max(1))?)
    }

    fn plan_convolutions(&mut self, progress: &mut dyn FnMut(&str)) -> Result<()> {
        let steps = &self.program.steps;
        let spec = |c: &ConvStep| {
            let conv = self.conv_of(c);
            match (c.fused, library_act(c.act)) {
                (false, _) => GraphSpec::plain(conv),
                (true, Some(Act::Relu)) => GraphSpec::fused(conv, c.z.is_some()),
                (true, act) => GraphSpec::epilogue(conv, c.z.is_some(), act),
            }
        };
        // convolutions summed in f64 untimed have no cuDNN plan
        let exact =
            |i: usize| self.exact_forced && self.exact_candidates.get(i).copied().unwrap_or(false);
        let specs: Vec<GraphSpec> = steps
            .iter()
            .enumerate()
            .filter_map(|(i, (_, s))| match s {
                Step::Conv(c) if !exact(i) => Some(spec(c)),
                _ => None,
            })
            .collect();
        self.ctx.dnn.precompile(&specs, true);
        let mut planned: HashMap<GraphSpec, Rc<ConvChoice>> = HashMap::new();
        let total = {
            let mut seen = std::collections::HashSet::new();
            steps
                .iter()
                .enumerate()
                .filter(|(i, (_, s))| match s {
                    Step::Conv(c) if !exact(*i) => seen.insert(spec(c)),
                    _ => false,
                })
                .count()
        };
        let mut runs = vec![None; steps.len()];
        let mut names = Vec::new();
        let mut workspace = 0;
        let layout = self.program.layout;
        for (i, (_, step)) in steps.iter().enumerate() {
            let Step::Conv(c) = step else { continue };
            if exact(i) {
                names.push(own_conv::EXACT_ALGORITHM.to_string());
                continue;
            }
            let conv = self.conv_of(c);
            let key = spec(c);
            if let Some(run) = planned.get(&key) {
                names.push(run.name());
                runs[i] = Some(Rc::clone(run));
                continue;
            }
            progress(&format!(
                "planning convolutions: {} of {total}",
                planned.len() + 1
            ));
            let (xv, yv, wv) = (self.view(&c.x)?, self.view(&c.y)?, self.const_view(c.w)?);
            let dnn = &self.ctx.dnn;
            let run = match c.bias {
                Some(b) if c.fused && !c.fused_relu() => {
                    let bv = self.const_view(b)?;
                    let zv = c.z.as_ref().map(|z| self.view(z)).transpose()?;
                    let epilogue = |y: View<'_>, b: View<'_>, z: Option<View<'_>>| {
                        self.split_epilogue(c, y, Some(b), z)
                    };
                    let act = library_act(c.act);
                    dnn.plan_epilogue_best(conv, xv, wv, bv, zv, act, yv, true, Some(&epilogue))?
                }
                Some(b) if c.fused => {
                    let bv = self.const_view(b)?;
                    let zv = c.z.as_ref().map(|z| self.view(z)).transpose()?;
                    let (dtype, (p, q)) = (conv.dtype.storage(), conv.shape.out_hw());
                    let kernels = &self.ctx.kernels;
                    let epilogue = |y: View<'_>, b: View<'_>, z: Option<View<'_>>| {
                        kernels.bias_relu(
                            y,
                            b,
                            z,
                            dtype,
                            layout,
                            (conv.shape.n, conv.shape.k, p * q),
                        )
                    };
                    let split: Option<Epilogue<'_>> = (layout == Layout::Nchw
                        && conv.dtype.uses_tensor_cores())
                    .then_some(&epilogue);
                    dnn.plan_fused_best(conv, xv, wv, bv, zv, yv, true, split)?
                }
                _ => dnn.plan_plain_best(conv, xv, wv, yv, true)?,
            };
            workspace = usize::max(workspace, run.workspace_bytes());
            names.push(run.name());
            let run = Rc::new(run);
            planned.insert(key, Rc::clone(&run));
            runs[i] = Some(run);
        }
        self.ctx.dnn.finish_precompile_of(&specs);
        self.ctx.dnn.save_choices();
        self.runs = runs;
        self.algorithms = names;
        self.workspace_bytes = workspace;
        Ok(())
    }

    /// `y = act(y (+ bias) (+ z))` on the element-wise kernel: the epilogue of convolution step
    /// `c` when it runs apart from the bare convolution.
    fn split_epilogue(
        &self,
        c: &ConvStep,
        y: View<'_>,
        bias: Option<View<'_>>,
        z: Option<View<'_>>,
    ) -> gpukit_cuda::Result<()> {
        let dims = c.y.s.dims;
        let bs = Strided::row_major([1, dims[1], 1, 1])
            .broadcast_to(dims)
            .ok_or_else(|| gpukit_cuda::Error::Invalid("a bias that does not broadcast".into()))?;
        let zs = match (z, &c.z) {
            (Some(v), Some(t)) => Some((v, &t.s)),
            _ => None,
        };
        self.kernels.pointwise(
            self.program.dtype.storage(),
            (y, &c.y.s),
            bias.map(|b| (b, &bs, Binary::Add)),
            zs,
            c.act,
            (y, &c.y.s),
        )
    }

    /// Copies the graph's inputs (f32, row-major, in the graph's order) into the arena.
    pub fn set_inputs(&mut self, inputs: &[&[f32]]) -> Result<()> {
        let p = self.program;
        if inputs.len() != p.inputs.len() {
            return Err(Error::Invalid(format!(
                "{} inputs given, the program takes {}",
                inputs.len(),
                p.inputs.len()
            )));
        }
        for ((name, shape, slot), x) in p.inputs.iter().zip(inputs) {
            let want: usize = shape.iter().product();
            if x.len() != want {
                return Err(Error::Invalid(format!(
                    "input {name} has {} values; its shape {shape:?} holds {want}",
                    x.len()
                )));
            }
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let at = p.plan.offsets[*slot];
            self.ctx
                .gpu
                .upload_into(self.arena.view().sub(at, bytes.len().max(1))?, &bytes)?;
        }
        Ok(())
    }

    /// Enqueues one pass (no synchronisation).
    pub fn enqueue(&self) -> Result<()> {
        for i in 0..self.program.steps.len() {
            self.enqueue_step(i)?;
        }
        Ok(())
    }

    fn enqueue_step(&self, i: usize) -> Result<()> {
        let (name, step) = &self.program.steps[i];
        let _op = gpukit_cuda::profiler::op(|| self.op_info(i));
        let k = &self.kernels;
        let dt = self.program.dtype.storage();
        let v = |t: &Tref| self.view(t);
        match step {
            Step::ConvertImage { x, y, c, cout } => {
                let [n, _, h, w] = y.s.dims;
                self.ctx.kernels.convert_input(
                    v(x)?,
                    v(y)?,
                    dt,
                    self.program.layout,
                    (n, *c, h, w),
                    *cout,
                )?;
            }
            Step::ConvertBlocks { x, y, blocks: b } => {
                let [n, c, h, w] = x.s.dims;
                self.ctx.kernels.convert_blocks(
                    v(x)?,
                    v(y)?,
                    dt,
                    (n, c, h, w),
                    b.side,
                    (b.rows.before, b.cols.before),
                    (b.rows.blocks, b.cols.blocks),
                    b.channels,
                )?;
            }
            Step::FromF32 { x, y } => k.from_f32(dt, v(x)?, (v(y)?, &y.s))?,
            Step::ToF32 { x, y } => k.to_f32(dt, (v(x)?, &x.s), v(y)?)?,
            Step::Pointwise { a, b, c, act, y } => {
                let bv = match b {
                    Some((t, op)) => Some((v(t)?, &t.s, *op)),
                    None => None,
                };
                let cv = match c {
                    Some(t) => Some((v(t)?, &t.s)),
                    None => None,
                };
                k.pointwise(dt, (v(a)?, &a.s), bv, cv, *act, (v(y)?, &y.s))?;
            }
            Step::Pool { x, y, win } => k.pool(dt, (v(x)?, &x.s), (v(y)?, &y.s), win)?,
            Step::GlobalAverage { x, y } => k.global_average(dt, (v(x)?, &x.s), (v(y)?, &y.s))?,
            Step::LayerNorm {
                x,
                gamma,
                beta,
                y,
                rows,
                cols,
                eps,
            } => {
                let bv = beta.as_ref().map(&v).transpose()?;
                k.layer_norm(dt, v(x)?, v(gamma)?, bv, v(y)?, (*rows, *cols), *eps)?;
            }
            Step::Gemm(g) => self.enqueue_gemm(i, g)?,
            Step::MatVec(m) => k.matvec(
                dt,
                v(&m.x)?,
                self.const_view(m.w)?,
                m.bias.map(|b| self.const_view(b)).transpose()?,
                m.z.as_ref().map(&v).transpose()?,
                m.act,
                v(&m.y)?,
                (m.n, m.k, m.c),
            )?,
            Step::Depthwise(d) => self.enqueue_depthwise(i, d)?,
            Step::OwnConv(o) => self.run_own_step(o)?,
            Step::StemPool(sp) => self.run_stem_pool(sp)?,
            Step::Conv(c) if self.conv_alts.get(i).is_some_and(Option::is_some) => {
                if let Some(Some(alt)) = self.conv_alts.get(i) {
                    self.run_conv_alt(c, alt)?;
                }
            }
            Step::Conv(c) => {
                let Some(run) = self.runs[i].as_deref() else {
                    return Err(Error::Invalid(format!(
                        "{name}: a convolution without a plan"
                    )));
                };
                let ctx = self.ctx;
                let (x, y, w) = (v(&c.x)?, v(&c.y)?, self.const_view(c.w)?);
                let ws = match self.branch[i] {
                    true => self.branch_workspace.view(),
                    false => self.workspace.view(),
                };
                let z = c.z.as_ref().map(&v).transpose()?;
                match (run, c.bias) {
                    (ConvChoice::Fused(f), Some(b)) => {
                        ctx.dnn
                            .fused_forward(f, x, w, self.const_view(b)?, z, y, ws)?
                    }
                    (ConvChoice::Graph(g), b) => {
                        let b = b.map(|b| self.const_view(b)).transpose()?;
                        ctx.dnn.graph_forward(g, x, w, b, z, y, ws)?
                    }
                    (ConvChoice::Plain(p), _) => ctx.dnn.conv_forward(p, x, w, y, ws)?,
                    (ConvChoice::Split(bare), Some(b)) if !c.fused_relu() => {
                        ctx.dnn.bare_forward(bare, x, w, y, ws)?;
                        self.split_epilogue(c, y, Some(self.const_view(b)?), z)?;
                    }
                    (ConvChoice::Split(bare), Some(b)) => {
                        ctx.dnn.bare_forward(bare, x, w, y, ws)?;
                        let [n, kk, p, q] = c.y.s.dims;
                        ctx.kernels.bias_relu(
                            y,
                            self.const_view(b)?,
                            z,
                            dt,
                            self.program.layout,
                            (n, kk, p * q),
                        )?;
                    }
                    _ => {
                        return Err(Error::Invalid(format!(
                            "{name}: a plan that does not fit the step"
                        )))
                    }
                }
                // a bare convolution straight before another library convolution that may read
                // its output: a barrier keeps the two from overlapping (as the ResNet engine
                // does after its projections; cuDNN's kernels may start before the one before
                // them has finished)
                let next_is_conv =
                    matches!(self.program.steps.get(i + 1), Some((_, Step::Conv(_))));
                if !c.fused && next_is_conv {
                    ctx.kernels.barrier()?;
                }
            }
        }
        Ok(())
    }

    /// What step `i` is, for the profiler: its kind, the node it comes from, its output's
    /// shape, the library behind it and its work.
    pub fn op_info(&self, i: usize) -> OpInfo {
        let (name, step) = &self.program.steps[i];
        let (reads, write) = step.operands();
        let bytes: usize = reads
            .iter()
            .chain(Some(&write))
            .map(|t| t.s.len() * self.elem_bytes(t))
            .sum();
        let d = write.s.dims;
        let alt = self.conv_alts.get(i).and_then(Option::as_ref);
        let (flops, library) = match step {
            Step::Conv(c) => (c.shape.flops(), alt.map_or("cuDNN", |a| a.library())),
            Step::OwnConv(o) => {
                let (m, n, kw) = o.g.product();
                (2.0 * (m * n * kw) as f64, "NVRTC")
            }
            Step::Depthwise(d) => (d.shape.flops(), "NVRTC"),
            Step::StemPool(sp) => (sp.conv.shape.flops(), "NVRTC"),
            Step::MatVec(m) => (2.0 * (m.n * m.k * m.c) as f64, "NVRTC"),
            Step::Gemm(g) => match self.gemms.get(i) {
                Some(Some(GemmRun::Own { .. } | GemmRun::MatVec)) => {
                    (2.0 * (g.m * g.n * g.k) as f64, "NVRTC")
                }
                _ => (2.0 * (g.m * g.n * g.k) as f64, "cuBLASLt"),
            },
            _ => (0.0, "NVRTC"),
        };
        let kind = match (step, self.gemms.get(i), alt) {
            (Step::Gemm(_), Some(Some(GemmRun::Own { .. })), _) => "gemm (gpukit)",
            (Step::Gemm(_), Some(Some(GemmRun::MatVec)), _) => "gemm (gpukit matrix-vector)",
            (Step::Gemm(_), _, _) => "gemm (cuBLASLt)",
            (Step::Conv(c), _, Some(a)) => a.kind(c.fused),
            _ => step.kind(),
        };
        OpInfo {
            name: kind.to_string(),
            layer: Some(name.clone()),
            detail: format!(
                "{}x{}x{}x{} {} {}",
                d[0],
                d[1],
                d[2],
                d[3],
                self.program.dtype.storage().name(),
                self.program.layout.name()
            ),
            library: library.to_string(),
            flops,
            bytes: bytes as f64,
            dtype: self.program.dtype.name().to_string(),
        }
    }

    /// A replay of the captured graph, for the profiler: one op holding every step's work.
    fn graph_info(&self) -> OpInfo {
        let ops = self.op_infos();
        OpInfo {
            name: "graph replay".into(),
            layer: None,
            detail: format!("{} steps", ops.len()),
            library: "CUDA graph".into(),
            flops: ops.iter().map(|o| o.flops).sum(),
            bytes: ops.iter().map(|o| o.bytes).sum(),
            dtype: self.program.dtype.name().to_string(),
        }
    }

    /// The steps by what runs them, as planning chose (a convolution on cuDNN, on cuBLASLt's
    /// product, summed in f64, ...), in order of first appearance.
    pub fn step_counts(&self) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for i in 0..self.program.steps.len() {
            let kind = self.op_info(i).name;
            match counts.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => counts.push((kind, 1)),
            }
        }
        counts
    }

    /// Every step's [`OpInfo`], in order.
    pub fn op_infos(&self) -> Vec<OpInfo> {
        (0..self.program.steps.len())
            .map(|i| self.op_info(i))
            .collect()
    }

    /// Sets the inputs, runs one pass and returns the outputs.
    pub fn run(&mut self, inputs: &[&[f32]]) -> Result<Vec<Vec<f32>>> {
        self.set_inputs(inputs)?;
        self.enqueue()?;
        self.outputs()
    }

    /// The outputs of the last pass (waits for it): f32, row-major, in the graph's order.
    pub fn outputs(&self) -> Result<Vec<Vec<f32>>> {
        let p = self.program;
        let mut out = Vec::new();
        for (_, shape, slot) in &p.outputs {
            let len: usize = shape.iter().product();
            let at = p.plan.offsets[*slot];
            let bytes = self
                .ctx
                .gpu
                .download_from(self.arena.view().sub(at, (len * 4).max(1))?, len * 4)?;
            out.push(gpukit_tensor::codec::decode_f32(&bytes, DType::F32));
        }
        Ok(out)
    }

    /// Records one pass as a CUDA graph, each branch attached where its inputs were written
    /// and the step after it where both it and the steps beside it end (where that replays
    /// no slower than the pass in step order: both are timed).
    pub fn capture(&mut self) -> Result<()> {
        self.capture_as(Branching::from_env())
    }

    /// [`ProgramSession::capture`] with every step after the one before it (the order
    /// `enqueue` runs them in; a profile ties each replayed kernel to its step by that order).
    pub fn capture_in_order(&mut self) -> Result<()> {
        self.capture_as(Branching::Off)
    }

    /// [`ProgramSession::capture`] with its branches as `how` says.
    pub fn capture_as(&mut self, how: Branching) -> Result<()> {
        let (graph, branched) = self.capture_pass(how)?;
        self.graph = Some(graph);
        self.graph_branched = branched;
        Ok(())
    }

    /// Whether the captured pass runs its branches beside the steps before them.
    pub fn graph_branched(&self) -> bool {
        self.graph_branched
    }

    /// Fills the activation arena with all-ones bytes (NaN in every float type), inputs too:
    /// a pass that reads what it did not write shows in its outputs.
    pub fn poison_arena(&self) -> Result<()> {
        Ok(self.ctx.gpu.fill(self.arena.view(), 0xff)?)
    }

    /// Steps that may run as branches in a captured pass (see `capture`).
    pub fn branch_count(&self) -> usize {
        self.branch.iter().filter(|&&b| b).count()
    }

    /// Launches the captured graph (no synchronisation).
    pub fn replay(&self) -> Result<()> {
        let graph = self
            .graph
            .as_ref()
            .ok_or_else(|| Error::Invalid("no graph captured".into()))?;
        let _op = gpukit_cuda::profiler::op(|| self.graph_info());
        Ok(graph.launch()?)
    }

    /// Bytes the session holds: weights, arena, the workspaces (the branches' too), the f64
    /// sums' filters and scratch, gpukit's convolution kernel's filters (laid out anew) and
    /// its scratch.
    pub fn memory_bytes(&self) -> usize {
        let exact = self.exact.as_ref().map_or(0, |e| e.bytes);
        let workspaces = self.workspace.len() + self.branch_workspace.len();
        let own: usize = self
            .conv_alts
            .iter()
            .map(|a| match a {
                Some(own_conv::ConvAlt::Own(o)) => o.weights.len(),
                _ => 0,
            })
            .sum();
        let small = self.small_gemm.as_ref().map_or(0, SmallGemm::scratch_bytes);
        self.weights.len() + self.arena.len() + workspaces + exact + own + small
    }
}

/// cuDNN's form of an epilogue's activation (None: no activation, or one cuDNN lacks: the
/// lowering leaves those to the element-wise kernel).
fn library_act(a: Option<Activation>) -> Option<Act> {
    match a? {
        Activation::Relu => Some(Act::Relu),
        Activation::Silu => Some(Act::Swish),
        Activation::Gelu => Some(Act::Gelu),
        Activation::Sigmoid => Some(Act::Sigmoid),
        Activation::HardSwish | Activation::HardSigmoid { .. } => None,
    }
}
