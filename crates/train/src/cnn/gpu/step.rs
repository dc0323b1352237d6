//! One training step of a [`GpuResNet`] on its uploaded batch: each unit's convolution and
//! batch norm forward, the loss, backward through the blocks to the stem, and the update.

use super::memory::UnitSlots;
use super::ops::UnitOp;
use super::*;

impl GpuResNet {
    /// Convolution then training-mode batch norm of one unit from `x` into `maps` (its own, or
    /// where its block's stage recomputes them), then its ReLU (after adding `z`, the residual,
    /// for a block's last unit): by cuDNN when fused, else by gpukit's kernel. A recomputation
    /// (`move_running` off) leaves the running statistics as the forward left them.
    fn unit_forward(
        &self,
        (u, maps): (&GpuUnit, UnitSlots),
        x: View<'_>,
        z: Option<View<'_>>,
        move_running: bool,
    ) -> Result<()> {
        let ws = self.workspace.view();
        let op = self.op_unit(u, UnitOp::ConvForward);
        self.dnn.conv_train_forward(
            &u.conv,
            x,
            self.weight(u.spec.weight)?,
            self.at(maps.conv_out)?,
            ws,
        )?;
        drop(op);
        let _op = self.op_unit(u, UnitOp::NormForward);
        let (saved_mean, saved_invstd) = self.saved_stats(u)?;
        let fused = u.fused();
        let args = BnForward {
            x: self.at(maps.conv_out)?,
            z: z.filter(|_| fused),
            y: self.at(maps.bn_out)?,
            gamma: self.param(u.spec.gamma)?,
            beta: self.param(u.spec.beta)?,
            running_mean: self.stat(u.spec.mean)?,
            running_var: self.stat(u.spec.var)?,
            move_running,
            saved_mean,
            saved_invstd,
        };
        self.dnn
            .bn_forward_training(&u.bn, &args, ws, u.reserve.as_ref().map(|r| r.view()))?;
        if !fused {
            self.ck
                .add_relu(self.at(maps.bn_out)?, z, self.dtype(), u.output.elements())?;
        }
        Ok(())
    }

    /// One residual block's forward from its input `x`: its downsampling unit first (the
    /// shortcut the last norm adds), then the main path; the block's output returned. `again`:
    /// its backward stage recomputing its maps (activation checkpointing) where the plan keeps
    /// them for the stage, the running statistics left where the forward put them.
    fn block_forward<'a>(&'a self, b: &GpuBlock, x: View<'a>, again: bool) -> Result<View<'a>> {
        let maps = |u: &GpuUnit| match again {
            true => u.backward_maps(),
            false => u.maps,
        };
        let shortcut = match &b.down {
            Some(d) => {
                self.unit_forward((d, maps(d)), x, None, !again)?;
                self.at(maps(d).bn_out)?
            }
            None => x,
        };
        let mut src = x;
        for (i, u) in b.main.iter().enumerate() {
            let z = (i + 1 == b.main.len()).then_some(shortcut);
            self.unit_forward((u, maps(u)), src, z, !again)?;
            src = self.at(maps(u).bn_out)?;
        }
        Ok(src)
    }

    /// Backward through one unit's norm and what follows it, from the gradient of the unit's
    /// output in `dy` (overwritten when gpukit's kernels run the ReLU's backward) to the norm
    /// input's in `dx`, and for a block's last unit the residual's in `dz`; the norm's
    /// parameter gradients into the f32 gradients.
    fn norm_backward(
        &self,
        u: &GpuUnit,
        (dy, dx): (View<'_>, View<'_>),
        dz: Option<View<'_>>,
    ) -> Result<()> {
        let ws = self.workspace.view();
        let _op = self.op_unit(u, UnitOp::NormBackward);
        let fused = u.fused();
        let n = u.output.elements();
        if !fused {
            if u.role != BnOps::Bn {
                self.k
                    .relu_grad(dy, self.at(u.backward_maps().bn_out)?, self.dtype(), n)?;
            }
            if let Some(dz) = dz {
                self.gpu.copy_view(dz, dy, n * self.dtype().size_bytes())?;
            }
        }
        let (saved_mean, saved_invstd) = self.saved_stats(u)?;
        let args = BnBackward {
            x: self.at(u.backward_maps().conv_out)?,
            y: if fused && u.role != BnOps::Bn {
                Some(self.at(u.backward_maps().bn_out)?)
            } else {
                None
            },
            dy,
            dz: dz.filter(|_| fused),
            dx,
            gamma: self.param(u.spec.gamma)?,
            beta: self.param(u.spec.beta)?,
            dgamma: self.grad(u.spec.gamma)?,
            dbeta: self.grad(u.spec.beta)?,
            saved_mean,
            saved_invstd,
        };
        self.dnn.bn_backward(
            &u.bn,
            &args,
            ws,
            u.reserve.as_ref().map(|r| r.view()),
            false,
        )?;
        Ok(())
    }

    /// Backward through one unit's convolution from its output's gradient `dy`: into `dx` when
    /// given (added to what it holds when its flag says so), and the filter's gradient (a
    /// strided 1x1 convolution's product over `x`'s pixels gathered into `gathered`).
    fn conv_backward(
        &self,
        u: &GpuUnit,
        (x, dy): (View<'_>, View<'_>),
        dx: Option<(View<'_>, bool)>,
        gathered: Option<View<'_>>,
    ) -> Result<()> {
        let ws = self.workspace.view();
        let i = u.spec.weight;
        if let Some((dx, accumulate)) = dx {
            let _op = self.op_unit(u, UnitOp::ConvBackwardData);
            self.dnn
                .conv_backward_data(&u.conv, (self.weight(i)?, dy, dx), ws, accumulate)?;
        }
        let _op = self.op_unit(u, UnitOp::ConvBackwardFilter);
        if u.gemm_filter {
            // dW [k, c] = dY^T [k, pixels] X [pixels, c] (a channels-last 1x1 filter; a strided
            // one's pixels gathered first)
            let (s, arithmetic) = (u.conv.conv().shape, u.conv.conv().dtype);
            let (oh, ow) = s.out_hw();
            let x = match (s.stride, gathered) {
                (1, _) => x,
                (_, Some(g)) => {
                    self.ck.subsample_nhwc(
                        (x, g),
                        self.dtype(),
                        (s.n, s.h, s.w, s.c),
                        (oh, ow),
                        s.stride,
                    )?;
                    g
                }
                (_, None) => {
                    return Err(Error::Failed(
                        "a strided 1x1 filter gradient without its gathered pixels".into(),
                    ))
                }
            };
            self.blas.gemm_batched(
                arithmetic,
                (dy, x, self.product_grad(i)?),
                (1, s.k, s.c, s.n * oh * ow),
                (true, false),
            )?;
        } else {
            self.dnn
                .conv_backward_filter(&u.conv, (x, dy, self.product_grad(i)?), ws, false)?;
        }
        self.widen_grad(i)
    }

    pub(super) fn forward(&self) -> Result<()> {
        let dt = self.dtype();
        let stem = &self.stem;
        self.unit_forward((stem, stem.maps), self.images.view(), None, true)?;
        let (stem_out, pooled) = (self.at(stem.maps.bn_out)?, self.at(self.maps_plan.pooled)?);
        let (x, y) = (self.pool.input, self.pool.output);
        match self.maps_plan.pool_index {
            Some(at) => {
                // the stem's ReLU and pool in one pass (its norm ran bare)
                let _op = self.op_other(
                    "relu + max pool forward",
                    "maxpool",
                    stem.output.elements(),
                    "NVRTC",
                );
                self.ck.max_pool_relu_nhwc(
                    (stem_out, pooled, self.at(at)?),
                    dt,
                    (x.n, x.h, x.w, x.c),
                    (y.h, y.w),
                    self.pool_window,
                )?;
            }
            None => {
                let _op = self.op_other(
                    "max pool forward",
                    "maxpool",
                    stem.output.elements(),
                    "cuDNN",
                );
                self.dnn.max_pool_forward(&self.pool, stem_out, pooled)?;
            }
        }
        let mut x = self.at(self.maps_plan.pooled)?;
        for b in &self.blocks {
            x = self.block_forward(b, x, false)?;
        }
        let (fc, w, bias) = self.head;
        let (n, c) = (self.batch, self.last.c);
        let plane = self.last.h * self.last.w;
        let op = self.op_other("average pool forward", "avgpool", n * c * plane, "NVRTC");
        match self.last.layout {
            Layout::Nchw => self
                .ck
                .avg_pool(x, self.features.view(), dt, (n * c, plane))?,
            Layout::Nhwc => {
                self.ck
                    .avg_pool_nhwc(x, self.features.view(), dt, (n * c, plane, c))?
            }
        }
        drop(op);
        let op = self.op_head("linear+bias forward", (n, fc.outputs, fc.inputs));
        self.blas.gemm_batched(
            self.precision.inputs(),
            (self.features.view(), self.weight(w)?, self.logits.view()),
            (1, n, fc.outputs, fc.inputs),
            (false, true),
        )?;
        self.k.bias_act(
            self.logits.view(),
            self.param(bias)?,
            dt,
            (fc.outputs, n),
            false,
        )?;
        drop(op);
        let _op = self.op_other("cross entropy", "loss", n * fc.outputs, "NVRTC");
        // fp16: the loss's gradient times the loss scale
        let state = self.precision.scaled().then(|| self.state.view());
        // a block a row: one thread a row took 0.24 ms at batch 256 (run 94)
        self.k.cross_entropy_rows(
            (
                self.logits.view(),
                self.labels.view(),
                Some(self.dlogits.view()),
            ),
            dt,
            (n, fc.outputs),
            state,
            // an update of k micro-batches: each loss over k
            (1.0 / self.accumulate as f32, self.smoothing),
            self.loss_rows.view(),
            (self.loss.view(), self.correct.view()),
        )?;
        Ok(())
    }

    pub(super) fn backward(&self) -> Result<()> {
        let dt = self.dtype();
        let (fc, w, bias) = self.head;
        let (n, c) = (self.batch, self.last.c);
        let op = self.op_head("linear weight+bias grad", (fc.outputs, fc.inputs, n));
        self.blas.gemm_batched(
            self.precision.inputs(),
            (
                self.dlogits.view(),
                self.features.view(),
                self.product_grad(w)?,
            ),
            (1, fc.outputs, fc.inputs, n),
            (true, false),
        )?;
        self.widen_grad(w)?;
        self.k.bias_grad(
            self.dlogits.view(),
            self.grad(bias)?,
            dt,
            (fc.outputs, n),
            0.0,
        )?;
        drop(op);
        let op = self.op_head("linear input grad", (n, fc.inputs, fc.outputs));
        self.blas.gemm_batched(
            self.precision.inputs(),
            (self.dlogits.view(), self.weight(w)?, self.dfeatures.view()),
            (1, n, fc.inputs, fc.outputs),
            (false, false),
        )?;
        drop(op);
        // data-parallel: the head's gradients are done (the first backward group)
        self.group_done(0)?;
        let plan = &self.maps_plan;
        // o: the gradient of the current block's output; p: the stage's temporary; q: the
        // gradient of the block's input (its residual's first), the previous block's o
        let mut o = self.at(plan.grad_out)?;
        let plane = self.last.h * self.last.w;
        let op = self.op_other("average pool backward", "avgpool", n * c * plane, "NVRTC");
        match self.last.layout {
            Layout::Nchw => self
                .ck
                .avg_pool_back(self.dfeatures.view(), o, dt, (n * c, plane))?,
            Layout::Nhwc => {
                self.ck
                    .avg_pool_back_nhwc(self.dfeatures.view(), o, dt, (n * c, plane, c))?
            }
        }
        drop(op);
        let pool_out = self.at(plan.pooled)?;
        let no_units = || Error::Failed("a residual block without units".into());
        for (bi, (b, slots)) in self.blocks.iter().zip(&plan.blocks).enumerate().rev() {
            let (p, q) = (self.at(slots.temp)?, self.at(slots.grad_in)?);
            let block_in = match bi {
                0 => pool_out,
                _ => self.at(self.blocks[bi - 1]
                    .main
                    .last()
                    .ok_or_else(no_units)?
                    .maps
                    .bn_out)?,
            };
            let last = b.main.last().ok_or_else(no_units)?;
            if slots.recompute.is_some() {
                // checkpointed: the block's maps again, from its input
                self.block_forward(b, block_in, true)?;
            }
            // the last norm: its input's gradient into p, the residual's into q
            self.norm_backward(last, (o, p), Some(q))?;
            if let Some(d) = &b.down {
                // the shortcut's norm and convolution: the block input's gradient into q
                self.norm_backward(d, (q, o), None)?;
                let gathered = slots.down_input.map(|g| self.at(g)).transpose()?;
                self.conv_backward(d, (block_in, o), Some((q, false)), gathered)?;
            }
            // the main path from the last unit's norm-input gradient in p; each earlier unit's
            // output gradient in o; the first unit adds its input's gradient to q
            for (i, u) in b.main.iter().enumerate().rev() {
                if i + 1 < b.main.len() {
                    self.norm_backward(u, (o, p), None)?;
                }
                let (x, dx) = match i {
                    0 => (block_in, (q, true)),
                    _ => (self.at(b.main[i - 1].backward_maps().bn_out)?, (o, false)),
                };
                self.conv_backward(u, (x, p), Some(dx), None)?;
            }
            self.group_done(self.blocks.len() - bi)?;
            o = q;
        }
        let (p, q) = (self.at(plan.stem_grads.0)?, self.at(plan.stem_grads.1)?);
        let stem = &self.stem;
        let (x, y) = (self.pool.input, self.pool.output);
        match plan.pool_index {
            Some(at) => {
                // gpukit's kernel from the pool's positions: the gradient of the stem norm's
                // output before its ReLU (cuDNN's channel-last backward ran at 483 GB/s, run 94;
                // gpukit's earlier kernel, which searched each window again, at 563, run 95)
                let _op = self.op_other(
                    "relu + max pool backward",
                    "maxpool",
                    stem.output.elements(),
                    "NVRTC",
                );
                self.ck.max_pool_relu_back_nhwc(
                    (self.at(at)?, pool_out, o, p),
                    dt,
                    (x.n, x.h, x.w, x.c),
                    (y.h, y.w),
                    self.pool_window,
                )?;
            }
            None => {
                let _op = self.op_other(
                    "max pool backward",
                    "maxpool",
                    stem.output.elements(),
                    "cuDNN",
                );
                let stem_out = self.at(stem.maps.bn_out)?;
                self.dnn
                    .max_pool_backward(&self.pool, (stem_out, pool_out), o, p)?;
            }
        }
        self.norm_backward(stem, (p, q), None)?;
        self.conv_backward(stem, (self.images.view(), q), None, None)?;
        self.group_done(self.blocks.len() + 1)?;
        Ok(())
    }

    /// Micro-batch `i` of `k` of an update on the batch uploaded: forward, backward, the
    /// gradients copied (the first) or added (the others) into the accumulator when `k > 1`,
    /// and after the last the optimizer's step.
    pub(super) fn micro(&self, (i, k): (usize, usize)) -> Result<()> {
        let last = i + 1 >= k;
        self.last_micro.set(last);
        self.forward()?;
        self.backward()?;
        if let Some(acc) = &self.acc {
            let n = self.params_layout.total;
            if i == 0 {
                self.gpu.copy_view(acc.view(), self.grads.view(), n * 4)?;
            } else if !(last && self.dp.is_some()) {
                // (data-parallel, the last micro-batch's gradients were added bucket by
                // bucket as backward finished them, each bucket then averaged)
                self.k.axpy(acc.view(), self.grads.view(), n)?;
            }
        }
        if i + 1 >= k {
            self.update()?;
        }
        Ok(())
    }

    /// The optimizer's step over every parameter at once (writing the 16-bit copy when there
    /// is one; fp16: after the scaler's overflow check, unscaling, skipped on an overflow),
    /// then the step state advanced.
    pub(super) fn update(&self) -> Result<()> {
        let c = self.opt;
        let n = self.params_layout.total;
        let scaled = self.precision.scaled();
        // several micro-batches: their summed gradients
        let g = self.acc.as_ref().unwrap_or(&self.grads).view();
        let (p, st) = (self.params.view(), self.state.view());
        let half = self.half.as_ref().map(|h| h.weights.view());
        let dt = self.dtype();
        let _op = self.op_update();
        self.gradients_averaged()?;
        if scaled {
            self.k.check_finite(g, n, st)?;
        }
        let rule = UpdateRule {
            kind: c.kind,
            lr: c.lr,
            weight_decay: c.weight_decay,
            momentum: c.momentum,
            nesterov: c.nesterov,
        };
        let (m, v) = (self.m.as_ref(), self.v.as_ref());
        self.k.optimizer_step(
            rule,
            (p, g, m.map(|m| m.view()), v.map(|v| v.view())),
            half,
            dt,
            n,
            st,
            scaled,
        )?;
        self.k
            .advance(st, scaled, (c.lr, BETA1, BETA2), GROWTH_INTERVAL)?;
        Ok(())
    }
}

/// How updates are launched: op by op, or replayed from captured graphs, one micro-batch at a
/// time.
impl GpuResNet {
    /// Updates replay captured CUDA graphs from the second on (`on`; one graph an update, or one
    /// a kind of micro-batch with accumulation), or launch every kernel eagerly (a new
    /// trainer's default; `train --model` turns graphs on).
    pub fn use_graph(&mut self, on: bool) {
        self.graph_on = on;
        if !on {
            self.graphs = [None, None, None];
        }
    }

    /// Updates sum the gradients of `k` micro-batches (each loss over `k`), as PyTorch's
    /// accumulation: an f32 accumulator of every parameter when `k > 1`.
    pub fn set_accumulate(&mut self, k: usize) -> Result<()> {
        if k == 0 {
            return Err(Error::Setting("--accumulate 0: must be at least 1".into()));
        }
        self.acc = match k {
            1 => None,
            _ => Some(self.gpu.alloc(self.params_layout.total * 4)?),
        };
        self.accumulate = k;
        self.graphs = [None, None, None];
        Ok(())
    }

    /// How the steps ran: "CUDA graph", "eager", or why a capture failed.
    pub fn step_launch(&self) -> String {
        match (
            self.graphs.iter().any(Option::is_some),
            &self.graph_failed,
            self.graph_on,
        ) {
            (true, _, _) => "CUDA graph (from the second update)".into(),
            (false, Some(why), _) => format!("eager (the graph's capture failed: {why})"),
            _ => "eager".into(),
        }
    }

    /// One update on the batch last uploaded (see [`GpuResNet::train_step`]; a trainer of one
    /// micro-batch an update).
    pub fn step_uploaded(&mut self) -> Result<(f64, usize)> {
        if self.accumulate != 1 {
            return Err(Error::Failed(format!(
                "a whole update of a trainer of {} micro-batches an update",
                self.accumulate
            )));
        }
        self.step_on_device(false, (0, 1))
    }

    /// A micro-batch's work enqueued ([`GpuResNet::micro`]): replayed from its kind's graph
    /// when graphs are on and `eager` is not asked, else launched op by op. The first of each
    /// kind runs op by op (libraries initialise lazily), then it is captured once, its cost
    /// that micro-batch's, so that every later one is a replay.
    fn enqueue_step(&mut self, eager: bool, (i, k): (usize, usize)) -> Result<()> {
        let kind = match (i, k) {
            (0, _) => 0,
            _ if i + 1 >= k => 2,
            _ => 1,
        };
        let wanted = self.graph_on && !eager;
        if let (Some(graph), true) = (&self.graphs[kind], wanted) {
            return Ok(graph.launch()?);
        }
        self.micro((i, k))?;
        if wanted && self.graphs[kind].is_none() && self.graph_failed.is_none() {
            // the capture waits for the work just enqueued, then records without running
            let this = &*self;
            match self.gpu.capture(|| this.micro((i, k))) {
                Ok(graph) => self.graphs[kind] = Some(graph),
                Err(e) => self.graph_failed = Some(e.to_string()),
            }
        }
        Ok(())
    }

    pub(super) fn step_on_device(
        &mut self,
        eager: bool,
        micro: (usize, usize),
    ) -> Result<(f64, usize)> {
        if !self.uploaded {
            return Err(Error::Failed("a step before any batch was uploaded".into()));
        }
        let g = self.gpu.clone();
        self.enqueue_step(eager, micro)?;
        self.batches_tracked += 1;
        let op = self.op_other("read the loss", "loss", 3, "copy");
        let loss = g.download_from(self.loss.view(), 8)?;
        let correct = g.download_from(self.correct.view(), 4)?;
        drop(op);
        let loss = f64::from_ne_bytes(
            loss.try_into()
                .map_err(|_| Error::Failed("the loss is not 8 bytes".into()))?,
        );
        let correct = u32::from_ne_bytes(
            correct
                .try_into()
                .map_err(|_| Error::Failed("the count is not 4 bytes".into()))?,
        );
        Ok((loss, correct as usize))
    }
}
