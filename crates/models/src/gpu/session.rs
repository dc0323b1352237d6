//! One batch size prepared for one [`GpuWeights`]: the arena with every activation as a tensor
//! over it, each convolution's chosen engine, the workspace they need, and (after
//! [`Session::capture`]) a CUDA graph of the whole pass.

use super::kernels::BLAS_ROWS;
use super::lower::{lower, relu_of, spec_of, y_of, Activation, Lowered, Op};
use super::{GpuContext, GpuWeights};
use crate::error::{Error, Result};
use crate::plan::MemoryPlan;
use gpukit_cuda::dnn::{Conv, ConvChoice, Epilogue, GraphSpec};
use gpukit_cuda::{DeviceBuffer, Graph, View};
use gpukit_tensor::{DType, Layout, Tensor};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

mod profile;

/// Values the in-place check draws before repeating them (a prime: see `check_in_place`).
const IN_PLACE_PERIOD: usize = 1_000_003;

/// Memory of one prepared batch.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct SessionMemory {
    /// The activation arena (input batch and logits included).
    pub arena_bytes: usize,
    /// What the same activations take without reuse.
    pub arena_bytes_without_plan: usize,
    /// The input batch alone (f32).
    pub input_bytes: usize,
    /// Most workspace any chosen convolution algorithm uses (the session's own workspace).
    pub conv_workspace_bytes: usize,
    pub weights_bytes: usize,
    /// Whether each block's last convolution writes its output over the block's shortcut
    /// (checked per convolution shape at planning; see [`Session::new`]).
    #[serde(default)]
    pub in_place: bool,
}

impl SessionMemory {
    /// What the engine holds for this batch size: weights + arena + the largest workspace.
    pub fn total(&self) -> usize {
        self.weights_bytes + self.arena_bytes + self.conv_workspace_bytes
    }
}

/// A batch size prepared for one [`GpuWeights`]: arena, plans and (after [`Session::capture`])
/// a CUDA graph.
pub struct Session<'a> {
    ctx: &'a GpuContext,
    weights: &'a GpuWeights,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    /// Every activation, a tensor over the arena at its planned offset.
    tensors: Vec<Tensor>,
    /// Their per-image shapes, as lowered.
    shapes: Vec<Activation>,
    ops: Vec<Op>,
    /// Per op, its convolution choice; layers of one shape share one (planned once).
    runs: Vec<Option<Rc<ConvChoice>>>,
    /// The convolutions' workspace: what the chosen algorithms need, no more.
    workspace: DeviceBuffer,
    plan: MemoryPlan,
    /// Ops whose output is written over their residual input.
    in_place: Vec<usize>,
    /// Why outputs are not written over their residual inputs, when the check failed.
    pub in_place_note: Option<String>,
    /// Per tensor, the first and last op that touch it.
    spans: Vec<(usize, usize)>,
    /// A barrier kernel after each projection.
    barrier_after_projection: bool,
    input: usize,
    logits: usize,
    graph: Option<Graph>,
    /// Whether convolutions may use the backend API's engines (else legacy calls only).
    try_graph: bool,
    pub memory: SessionMemory,
    /// The engine chosen for each convolution (name), in network order.
    pub algorithms: Vec<String>,
    /// torchvision's name of each convolution, by the weights' conv index.
    layer_names: Vec<String>,
}

impl<'a> Session<'a> {
    /// Builds the op list, plans memory, allocates the arena and chooses how every convolution
    /// runs at this batch size (by measurement, or from the choices measured before).
    pub fn new(
        ctx: &'a GpuContext,
        weights: &'a GpuWeights,
        n: usize,
        h: usize,
        w: usize,
        reuse: bool,
    ) -> Result<Session<'a>> {
        Self::new_observed(ctx, weights, n, h, w, reuse, &mut |_| {})
    }

    /// [`Session::new`], telling `progress` how planning goes: a line for each convolution
    /// planned ("planning convolutions: 5 of 21, 16 to measure, about 1.2 s left").
    pub fn new_observed(
        ctx: &'a GpuContext,
        weights: &'a GpuWeights,
        n: usize,
        h: usize,
        w: usize,
        reuse: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Session<'a>> {
        if n == 0 {
            return Err(Error::Invalid("batch size must be at least 1".into()));
        }
        if h < 32 || w < 32 {
            return Err(Error::TooSmall { h, w });
        }
        // a large batch's classifier runs on cuBLAS: opened beside the planning
        if n >= BLAS_ROWS {
            let _ = ctx.blas.open_ahead();
        }
        let try_graph = true;
        // NCHW below f32 tries split plans (bare convolution, then an epilogue kernel), which
        // cannot write over their residual: there speed goes first, as NCHW's fused engines
        // are few and often slow
        let split_plans = weights.layout == Layout::Nchw && weights.dtype.uses_tensor_cores();
        let in_place = reuse && !split_plans;
        let mut session = Self::prepare(
            ctx,
            weights,
            (n, h, w),
            reuse,
            in_place,
            try_graph,
            progress,
        )?;
        if !session.in_place.is_empty() {
            if let Err(why) = session.check_in_place() {
                // an engine that cannot write over its residual: plan again without that
                drop(session);
                session =
                    Self::prepare(ctx, weights, (n, h, w), reuse, false, try_graph, progress)?;
                session.in_place_note = Some(why);
            }
        }
        ctx.dnn.release_workspace();
        if n >= BLAS_ROWS {
            // joined now, not inside a graph's capture (where cuBLAS missing, or failing to
            // open, leaves the classifier on gpukit's kernel)
            let _ = ctx.blas.get();
        }
        Ok(session)
    }

    /// Whether the classifier runs on cuBLAS (a batch of [`BLAS_ROWS`] or more, cuBLAS open).
    pub(super) fn classifier_on_blas(&self) -> bool {
        self.n >= BLAS_ROWS && self.ctx.blas.is_open()
    }

    /// Lays out and allocates the arena, plans every convolution and allocates the workspace
    /// the chosen algorithms need.
    fn prepare(
        ctx: &'a GpuContext,
        weights: &'a GpuWeights,
        (n, h, w): (usize, usize, usize),
        reuse: bool,
        in_place: bool,
        try_graph: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Session<'a>> {
        let Lowered {
            spans,
            in_place,
            tensors: shapes,
            ops,
            logits,
            plan,
            without,
            input_bytes,
        } = lower(&weights.shape, n, h, w, reuse, in_place)?;
        let arena = Arc::new(ctx.alloc(plan.total, "activation arena")?);
        let layout = weights.layout;
        let tensors = shapes
            .iter()
            .zip(&plan.offsets)
            .enumerate()
            .map(|(i, (a, &offset))| {
                // the input batch and the pooled features and logits are NCHW f32 always
                let l = if i == 0 || a.h * a.w == 1 {
                    Layout::Nchw
                } else {
                    layout
                };
                Tensor::in_buffer(&ctx.gpu, &arena, offset, &a.shape(n), a.dtype, l)
            })
            .collect::<gpukit_tensor::Result<Vec<_>>>()?;
        let mut session = Session {
            ctx,
            weights,
            n,
            h,
            w,
            tensors,
            shapes,
            ops,
            runs: Vec::new(),
            workspace: ctx.alloc(256, "convolution workspace")?,
            plan,
            input: 0,
            logits,
            graph: None,
            try_graph,
            memory: SessionMemory {
                arena_bytes: 0,
                arena_bytes_without_plan: without,
                input_bytes,
                conv_workspace_bytes: 0,
                weights_bytes: weights.bytes,
                in_place: !in_place.is_empty(),
            },
            in_place_note: None,
            in_place,
            spans,
            barrier_after_projection: true,
            algorithms: Vec::new(),
            layer_names: weights.shape.conv_names(),
        };
        session.memory.arena_bytes = session.plan.total;
        session.plan_convolutions(progress)?;
        let need = session.memory.conv_workspace_bytes;
        if need > session.workspace.len() {
            session.workspace = ctx.alloc(need, "convolution workspace")?;
        }
        Ok(session)
    }

    /// The input batch: `[n, 3, h, w]` f32, NCHW.
    pub fn input(&self) -> &Tensor {
        &self.tensors[self.input]
    }

    fn view(&self, t: usize) -> Result<View<'_>> {
        Ok(self.tensors[t].device_view()?)
    }

    /// Checks every convolution that writes over its residual input: on fresh random inputs,
    /// its in-place output must match its output written elsewhere (same engine). An engine
    /// that writes parts of its output before it has read the matching residual would fail.
    fn check_in_place(&mut self) -> std::result::Result<(), String> {
        let mut checked: Vec<*const ConvChoice> = Vec::new();
        for i in self.in_place.clone() {
            let (
                Op::Conv {
                    x, y, z: Some(z), ..
                },
                Some(run),
            ) = (self.ops[i], self.runs[i].clone())
            else {
                continue;
            };
            if checked.contains(&Rc::as_ptr(&run)) {
                continue;
            }
            checked.push(Rc::as_ptr(&run));
            let fail = |e: &dyn std::fmt::Display| format!("in-place check of {}: {e}", run.name());
            let seed = gpukit_tensor::random::fresh_seed();
            // random values, whatever the layout: a block drawn once, uploaded and repeated on
            // the GPU at a prime period (no layout's dimensions align with it); drawing and
            // uploading every element took seconds at batch 256
            let fill = |t: usize, seed: u64| -> Result<()> {
                let view = self.view(t)?;
                let dtype = self.tensors[t].dtype();
                let values = IN_PLACE_PERIOD.min(view.bytes() / dtype.size_bytes());
                let block = gpukit_tensor::codec::encode_f32(
                    &gpukit_tensor::random::uniform_f32(values, seed),
                    dtype,
                );
                self.ctx.gpu.upload_into(view, &block)?;
                Ok(self.ctx.gpu.repeat_prefix(view, block.len())?)
            };
            fill(x, seed).map_err(|e| fail(&e))?;
            fill(z, seed ^ 0x9e37).map_err(|e| fail(&e))?;
            let elsewhere = self
                .ctx
                .alloc(self.tensors[y].bytes(), "in-place check")
                .map_err(|e| fail(&e))?;
            let (xv, zv) = (
                self.view(x).map_err(|e| fail(&e))?,
                self.view(z).map_err(|e| fail(&e))?,
            );
            self.conv_call(i, xv, Some(zv), elsewhere.view())
                .map_err(|e| fail(&e))?;
            self.conv_call(i, xv, Some(zv), zv).map_err(|e| fail(&e))?;
            // the same kernel on the same inputs usually gives the same bits: compared on the
            // GPU first, copied and decoded only when they differ
            let same = self
                .ctx
                .kernels
                .equal_bytes(&self.ctx.gpu, elsewhere.view(), zv, elsewhere.len())
                .map_err(|e| fail(&e))?;
            if same {
                continue;
            }
            // both read in memory order, whatever the layout
            let dtype = self.tensors[y].dtype();
            let decode = |bytes: Vec<u8>| gpukit_tensor::codec::decode_f32(&bytes, dtype);
            let gpu = &self.ctx.gpu;
            let want_bytes = gpu.download(&elsewhere).map_err(|e| fail(&e))?;
            let got_bytes = gpu
                .download_from(zv, elsewhere.len())
                .map_err(|e| fail(&e))?;
            let (want, got) = (decode(want_bytes), decode(got_bytes));
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            let worst = want
                .iter()
                .zip(&got)
                .map(|(a, b)| {
                    if a.is_finite() && b.is_finite() {
                        (a - b).abs()
                    } else {
                        f32::INFINITY
                    }
                })
                .fold(0f32, f32::max);
            if worst / scale > 1e-2 {
                return Err(format!(
                    "{} wrote over its residual input gave a max difference of {:.1e} of the \
                     output's scale: outputs are written apart from their residuals",
                    run.name(),
                    worst / scale
                ));
            }
        }
        Ok(())
    }

    /// Convolution `conv` of the network on activation `x`.
    fn conv_of(&self, conv: usize, x: usize) -> Conv {
        let a = self.shapes[x];
        Conv {
            shape: self.weights.convs[conv].layer.at(self.n, a.h, a.w),
            layout: self.weights.layout,
            dtype: self.weights.dtype,
        }
    }

    /// The distinct convolutions to plan (one plan serves every layer of the same shape and
    /// epilogue), and how many of them the choice cache already holds.
    fn convolutions_to_plan(&self) -> (usize, usize) {
        let mut seen = std::collections::HashSet::new();
        let mut cached = 0;
        for op in &self.ops {
            if let Op::Conv {
                conv, x, z, relu, ..
            } = *op
            {
                let spec = self.conv_of(conv, x);
                if seen.insert((spec, z.is_some(), relu)) {
                    let fused = relu.then_some(z.is_some());
                    cached += usize::from(self.ctx.dnn.has_choice(spec, fused, self.try_graph));
                }
            }
        }
        (seen.len(), cached)
    }

    fn plan_convolutions(&mut self, progress: &mut dyn FnMut(&str)) -> Result<()> {
        let mut runs: Vec<Option<Rc<ConvChoice>>> = vec![None; self.ops.len()];
        let mut names: Vec<Option<String>> = vec![None; self.ops.len()];
        let mut workspace = 0;
        let mut planned: HashMap<(Conv, bool, bool), Rc<ConvChoice>> = HashMap::new();
        let (total, cached) = self.convolutions_to_plan();
        let started = std::time::Instant::now();
        let before = self.ctx.dnn.stats();
        let say = |progress: &mut dyn FnMut(&str), done: usize| {
            let measured = self.ctx.dnn.stats().measured - before.measured;
            let to_measure = total - cached;
            let left = match (measured, to_measure.saturating_sub(measured)) {
                (_, 0) => String::new(),
                (0, _) => String::new(),
                (m, rest) => format!(
                    ", about {:.1} s left",
                    started.elapsed().as_secs_f64() / m as f64 * rest as f64
                ),
            };
            progress(&format!(
                "planning convolutions: {done} of {total} ({to_measure} to measure, {cached} \
                 cached{left})"
            ));
        };
        say(progress, 0);
        // helper threads finalize the engines that compile at run time while this thread
        // times the others
        let specs: Vec<GraphSpec> = self
            .ops
            .iter()
            .filter_map(|op| spec_of(&self.weights.shape, &self.shapes, self.n, *op))
            .collect();
        // (helpers started earlier for these graphs, by the caller, go on as they are)
        self.ctx.dnn.precompile(&specs, self.try_graph);
        // the convolutions with a residual input last: their engines are almost all compiled at
        // run time, and the helpers compile them while this thread times the others
        let order: Vec<usize> = (0..self.ops.len())
            .filter(|&i| matches!(self.ops[i], Op::Conv { z: None, .. }))
            .chain(
                (0..self.ops.len()).filter(|&i| matches!(self.ops[i], Op::Conv { z: Some(_), .. })),
            )
            .collect();
        for i in order {
            let Op::Conv {
                conv,
                x,
                y,
                z,
                relu,
            } = self.ops[i]
            else {
                continue;
            };
            let spec = self.conv_of(conv, x);
            if let Some(run) = planned.get(&(spec, z.is_some(), relu)) {
                names[i] = Some(run.name());
                runs[i] = Some(Rc::clone(run));
                continue;
            }
            let c = &self.weights.convs[conv];
            let (wv, bv) = (c.weight.device_view()?, c.bias.device_view()?);
            let (xv, yv) = (self.view(x)?, self.view(y)?);
            let zv = z.map(|z| self.view(z)).transpose()?;
            // NCHW also tries the bare convolution and the epilogue kernel: its fused engines
            // are few and often slow
            let (dtype, layout) = (spec.dtype.storage(), spec.layout);
            let (p, q) = spec.shape.out_hw();
            let kernels = &self.ctx.kernels;
            let epilogue = |y: View<'_>, b: View<'_>, z: Option<View<'_>>| {
                kernels.bias_relu(y, b, z, dtype, layout, (spec.shape.n, spec.shape.k, p * q))
            };
            let split: Option<Epilogue<'_>> =
                (layout == Layout::Nchw && spec.dtype.uses_tensor_cores()).then_some(&epilogue);
            let dnn = &self.ctx.dnn;
            let run = if relu {
                dnn.plan_fused_best(spec, xv, wv, bv, zv, yv, self.try_graph, split)?
            } else {
                dnn.plan_plain_best(spec, xv, wv, yv, self.try_graph)?
            };
            workspace = workspace.max(run.workspace_bytes());
            names[i] = Some(run.name());
            let run = Rc::new(run);
            planned.insert((spec, z.is_some(), relu), run.clone());
            runs[i] = Some(run);
            say(progress, planned.len());
        }
        // helpers started for more sessions than this one go on for the others
        self.ctx.dnn.finish_precompile_of(&specs);
        gpukit_cuda::trace::note(|| {
            let after = self.ctx.dnn.stats();
            format!(
                "{:.2} ms planning {total} convolutions: {} measured, {} plans finalized ahead \
                 by helper threads",
                started.elapsed().as_secs_f64() * 1e3,
                after.measured - before.measured,
                after.finalized_ahead - before.finalized_ahead
            )
        });
        self.ctx.dnn.save_choices();
        self.runs = runs;
        // in the order of the layers
        self.algorithms = names.into_iter().flatten().collect();
        self.memory.conv_workspace_bytes = workspace;
        Ok(())
    }

    /// Enqueues one forward pass on the GPU's stream (no synchronisation): the input must have
    /// been set ([`Session::set_input`]); the logits are read with [`Session::logits`].
    pub fn enqueue(&self) -> Result<()> {
        for i in 0..self.ops.len() {
            self.enqueue_op(i)?;
        }
        Ok(())
    }

    fn enqueue_op(&self, i: usize) -> Result<()> {
        let _op = gpukit_cuda::profiler::op(|| self.op_info(i));
        let ctx = self.ctx;
        let layout = self.weights.layout;
        let shape = |t: usize| self.shapes[t].shape(self.n);
        match (self.ops[i], self.runs[i].as_deref()) {
            (Op::Convert { x, y }, _) => {
                let [n, c, h, w] = shape(y);
                ctx.kernels.convert_input(
                    self.view(x)?,
                    self.view(y)?,
                    self.shapes[y].dtype,
                    layout,
                    (n, 3, h, w),
                    c,
                )?;
            }
            (Op::Conv { x, y, z, .. }, Some(_)) => {
                let zv = z.map(|z| self.view(z)).transpose()?;
                self.conv_call(i, self.view(x)?, zv, self.view(y)?)?;
                if !relu_of(self.ops[i]) && self.barrier_after_projection {
                    ctx.kernels.barrier()?;
                }
            }
            (Op::MaxPool { x, y }, _) => {
                let [n, c, h, w] = shape(x);
                let dtype = self.shapes[x].dtype;
                ctx.kernels
                    .max_pool(self.view(x)?, self.view(y)?, dtype, layout, (n, c, h, w))?;
            }
            (Op::AvgPool { x, y }, _) => {
                let [n, c, h, w] = shape(x);
                let dtype = self.shapes[x].dtype;
                ctx.kernels
                    .avg_pool(self.view(x)?, self.view(y)?, dtype, layout, (n, c, h, w))?;
            }
            (Op::Classifier { x, y }, _) => {
                let (classes, features) =
                    (self.weights.shape.num_classes, self.weights.shape.features);
                let (xv, yv) = (self.view(x)?, self.view(y)?);
                let (w, b) = (
                    self.weights.fc_weight.device_view()?,
                    self.weights.fc_bias.device_view()?,
                );
                if self.classifier_on_blas() {
                    let dims = (1, self.n, classes, features);
                    ctx.blas
                        .get()?
                        .gemm_batched(DType::F32, (xv, w, yv), dims, (false, true))?;
                    ctx.kernels.add_bias(yv, b, self.n, classes)?;
                } else {
                    ctx.kernels
                        .classify(xv, w, b, yv, (self.n, classes, features))?;
                }
            }
            (Op::Conv { .. }, None) => {
                return Err(Error::Invalid("convolution without a plan".into()))
            }
        }
        Ok(())
    }

    /// Enqueues convolution op `i` on these buffers with the session's workspace.
    fn conv_call(&self, i: usize, x: View<'_>, z: Option<View<'_>>, y: View<'_>) -> Result<()> {
        let (Op::Conv { conv, .. }, Some(run)) = (self.ops[i], self.runs[i].as_deref()) else {
            return Err(Error::Invalid(format!(
                "op {i} is not a planned convolution"
            )));
        };
        let ctx = self.ctx;
        let c = &self.weights.convs[conv];
        let (wv, bv) = (c.weight.device_view()?, c.bias.device_view()?);
        let ws = self.workspace.view();
        // the projection (no ReLU) has no bias: it joined the next convolution's
        let bias = relu_of(self.ops[i]).then_some(bv);
        match run {
            ConvChoice::Fused(f) => ctx.dnn.fused_forward(f, x, wv, bv, z, y, ws)?,
            ConvChoice::Graph(g) => ctx.dnn.graph_forward(g, x, wv, bias, z, y, ws)?,
            ConvChoice::Plain(p) => ctx.dnn.conv_forward(p, x, wv, y, ws)?,
            ConvChoice::Split(bare) => {
                ctx.dnn.bare_forward(bare, x, wv, y, ws)?;
                let t = self.shapes[y_of(self.ops[i])];
                ctx.kernels.bias_relu(
                    y,
                    bv,
                    z,
                    t.dtype,
                    self.weights.layout,
                    (self.n, t.c, t.h * t.w),
                )?;
            }
        }
        Ok(())
    }

    /// A diagnostic: runs one forward pass op by op and, around each op, compares every tensor
    /// that must stay intact across it (live before and after, not the op's output) byte for
    /// byte. Returns one line per op that changed such a tensor (an out-of-bounds write or an
    /// overlap in the memory plan). The input must have been set. Slow; for debugging.
    pub fn find_clobbers(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for (step, op) in self.ops.iter().enumerate() {
            let out = y_of(*op);
            let out_at = self.plan.offsets[out];
            let keep: Vec<usize> = (0..self.tensors.len())
                .filter(|&t| {
                    let (first, last) = self.spans[t];
                    first < step && last >= step && t != out && self.plan.offsets[t] != out_at
                })
                .collect();
            let mut before = Vec::new();
            for &t in &keep {
                before.push(self.tensors[t].to_bytes()?);
            }
            self.enqueue_op(step)?;
            self.ctx.gpu.synchronize()?;
            for (&t, was) in keep.iter().zip(&before) {
                let now = self.tensors[t].to_bytes()?;
                if &now != was {
                    let first = now.iter().zip(was).position(|(a, b)| a != b).unwrap_or(0);
                    let what = match (op, self.runs[step].as_deref()) {
                        (Op::Conv { .. }, Some(run)) => run.name(),
                        _ => format!("{op:?}"),
                    };
                    found.push(format!(
                        "op {step} ({what}) changed tensor {t} (live ops {:?}, {} bytes at arena \
                         offset {}; first changed byte {first}; the op writes tensor {out} at \
                         offset {out_at}, {} bytes)",
                        self.spans[t],
                        self.tensors[t].bytes(),
                        self.plan.offsets[t],
                        self.tensors[out].bytes()
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Copies a batch of images (`[n, 3, h, w]` f32, any device and layout) into the input.
    pub fn set_input(&mut self, images: &Tensor) -> Result<()> {
        let want = [self.n, 3, self.h, self.w];
        if images.shape() != want || images.dtype() != DType::F32 {
            return Err(Error::InputLength {
                got: images.numel(),
                want: want.iter().product(),
                n: self.n,
                h: self.h,
                w: self.w,
            });
        }
        let input = self.input;
        self.tensors[input].write(images)?;
        Ok(())
    }

    /// The logits of the last forward pass (waits for it): a CPU tensor `[n, classes]` f32.
    pub fn logits(&self) -> Result<Tensor> {
        let logits = &self.tensors[self.logits];
        Ok(logits
            .reshape(&[self.n, self.weights.shape.num_classes])?
            .to_host()?)
    }

    /// Sets `images` as the input, runs one forward pass and returns the logits.
    pub fn run(&mut self, images: &Tensor) -> Result<Tensor> {
        self.set_input(images)?;
        self.enqueue()?;
        self.logits()
    }

    /// Records one forward pass as a CUDA graph (replaced if there was one).
    pub fn capture(&mut self) -> Result<()> {
        let graph = self.ctx.gpu.capture(|| self.enqueue())?;
        self.graph = Some(graph);
        Ok(())
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
}
