//! What a [`GpuTrainer`] enqueues: a batch's forward, loss and backward, an update, an epoch
//! (replayed from a CUDA graph when asked), and the evaluation.

use super::batches::Batch;
use super::batches::{epoch_batches, graph_key, micro_batches};
use super::feed::{batch_bytes, copy_in, target_width, Loader, PinnedRing};
use super::kernels::{StepState, UpdateRule};
#[cfg(test)]
use super::parallel::Shard;
use super::pipeline::InputGrad;
use super::plan::InputEpilogue;
use super::{count_sum, GpuDetails, GpuTrainer, Input, Op, GROWTH_INTERVAL};
use crate::checkpoint::Position;
use crate::data::{batch_order, Targets};
use crate::error::{Error, Result};
use crate::loss::LossKind;
use crate::optim::{BETA1, BETA2};
use crate::run::{EpochStats, RunOutcome};
use gpukit_cuda::profiler::{self, Profiler};
use gpukit_cuda::{DeviceBuffer, Event, View};
use gpukit_tensor::codec::decode_f64;
use gpukit_types::DType;
use std::time::Instant;

fn sub(buf: &DeviceBuffer, elem: usize, offset: usize, len: usize) -> Result<View<'_>> {
    Ok(buf.view().sub(offset * elem, len * elem)?)
}

impl GpuTrainer {
    /// The batches of epoch `pos.epoch` from `pos.batch` on, stopping at the step limit (on a
    /// pipeline stage, each batch as its micro-batches).
    fn batches(&self, pos: &Position) -> Vec<Batch> {
        let batches = epoch_batches(&self.cfg, self.train.len(), pos, self.shard());
        match self.opts.stage {
            Some(stage) => micro_batches(&batches, stage.micro),
            None => batches,
        }
    }

    /// Where a batch's loss goes.
    fn loss_slot(&self, b: &Batch) -> usize {
        b.index * self.opts.stage.map_or(1, |s| s.micro) + b.micro
    }

    /// Enqueues one batch: its input, forward, loss (into its slot), backward, and the update
    /// when one follows.
    fn enqueue(&self, input: Input, b: Batch) -> Result<()> {
        let st = self.opts.precision.storage();
        let f = self.train.features;
        let tw = target_width(&self.train);
        let rows = b.rows;
        let layers = self.layout.layers();
        profiler::step(b.index);
        // the first layer's input and the targets
        let input_op = self.op_other("gather_batch", "input", rows * f);
        let x_in = self.maps().x_in.view();
        let (x0, targets): (View<'_>, View<'_>) = match input {
            Input::Resident { first_row } => {
                self.gather_batch(first_row, rows, true, true)?;
                (x_in, self.tgt.view())
            }
            Input::Staged { slot } => {
                let stage = &self.stage[slot];
                let x = stage.view().sub(0, rows * f * 4)?;
                let y = stage.view().sub(rows * f * 4, rows * tw * 4)?;
                if st == DType::F32 {
                    (x, y)
                } else {
                    self.k.cast(x, x_in, st, rows * f)?;
                    (x_in, y)
                }
            }
        };
        drop(input_op);
        self.forward(x0, 0..layers, rows, Op::Forward)?;
        self.enqueue_loss(targets, &b)?;
        self.enqueue_backward(x0, &b, None)?;
        Ok(())
    }

    /// Gathers a batch's rows of the resident data by the epoch's order: the inputs into the
    /// current maps' `x_in` and the targets into `tgt`, as asked.
    pub(super) fn gather_batch(
        &self,
        first_row: usize,
        rows: usize,
        inputs: bool,
        targets: bool,
    ) -> Result<()> {
        let st = self.opts.precision.storage();
        let (f, tw) = (self.train.features, target_width(&self.train));
        let (x, y, idx) = self
            .resident
            .as_ref()
            .ok_or_else(|| Error::Failed("no resident data".into()))?;
        let idx = idx.view().sub(first_row * 4, rows * 4)?;
        if inputs {
            self.k
                .gather_rows(x.view(), self.maps().x_in.view(), idx, st, (rows, f))?;
        }
        if targets {
            self.gather_targets(y.view(), idx, rows, tw)?;
        }
        Ok(())
    }

    /// The loss of the last layer's output against `targets` (into the batch's slot) and its
    /// gradient (times the batch's share of its update and the loss scale) into dz[0].
    pub(super) fn enqueue_loss(&self, targets: View<'_>, b: &Batch) -> Result<()> {
        let st = self.opts.precision.storage();
        let rows = b.rows;
        let layers = self.layout.layers();
        let out = self.act(layers - 1);
        let width = self.cfg.widths[layers];
        let loss = self.losses.view().sub(self.loss_slot(b) * 8, 8)?;
        let micro = self.opts.stage.map_or(self.cfg.accumulate, |s| s.micro);
        let mult = b.weight / micro as f32;
        let state = Some(self.state.view());
        let _loss_op = self.op_other(
            match self.cfg.loss {
                LossKind::Mse => "mse_loss+grad",
                LossKind::CrossEntropy => "cross_entropy+grad",
            },
            "loss",
            rows * width,
        );
        match self.cfg.loss {
            LossKind::Mse => self.k.mse(
                out,
                targets,
                Some(self.dz[0].view()),
                st,
                rows * width,
                state,
                mult,
                loss,
            )?,
            LossKind::CrossEntropy => self.k.cross_entropy(
                out,
                targets,
                Some(self.dz[0].view()),
                st,
                (rows, width),
                state,
                (mult, 0.0),
                loss,
                self.correct.view().sub(self.loss_slot(b) * 4, 4)?,
            )?,
        }
        Ok(())
    }

    /// Backward from the output gradient in dz[0] down to the first layer, whose input was
    /// `x0`, and the update when one follows (not on a pipeline stage: its 1F1B schedule
    /// queues the update after its last send). On a pipeline stage after the first,
    /// `input_grad` also computes the first layer's input gradient (plain: its ReLU and bias
    /// belong to the stage before), before that layer's weight gradient, and hands the dz
    /// buffer holding it to `input_grad`'s `sent`, when given, at once (the stage before
    /// waits for it); returns that buffer.
    pub(super) fn enqueue_backward(
        &self,
        x0: View<'_>,
        b: &Batch,
        input_grad: Option<InputGrad<'_>>,
    ) -> Result<usize> {
        let st = self.opts.precision.storage();
        let es = st.size_bytes();
        let rows = b.rows;
        let layers = self.layout.layers();
        let beta = if b.first_micro { 0.0 } else { 1.0 };
        let weights = self.half.as_deref().unwrap_or(&self.params);
        let wes = if self.half.is_some() { es } else { 4 };
        let grads_bias = |l: usize| {
            sub(
                &self.grads,
                4,
                self.layout.offsets[l].1,
                self.layout.io(l).1,
            )
        };
        // a fused epilogue overwrites its bias gradient: straight into the gradients on an
        // update's first batch, else into scratch, added after
        let epilogue_bias = |l: usize| -> Result<View<'_>> {
            if b.first_micro {
                grads_bias(l)
            } else {
                Ok(self.bias_scratch[l].view())
            }
        };
        let add_scratch = |l: usize| -> Result<()> {
            if !b.first_micro {
                let o = self.layout.io(l).1;
                self.k
                    .axpy(grads_bias(l)?, self.bias_scratch[l].view(), o)?;
            }
            Ok(())
        };
        let mut cur = 0;
        for l in (0..layers).rev() {
            // checkpointed: entering a segment from its end, recompute the outputs inside it
            // from the kept output before it (the ReLU bits are rewritten with the same values)
            if let Some(seg) = self.segment {
                let first = l / seg * seg;
                if l == (first + seg).min(layers) - 1 && l > first {
                    let from = if first == 0 { x0 } else { self.act(first - 1) };
                    self.forward(from, first..l, rows, Op::Forward)?;
                }
            }
            let (i, o) = self.layout.io(l);
            let (wo, _) = self.layout.offsets[l];
            let hidden = self.hidden(l);
            let fusion = self.fusion[l];
            let input = if l == 0 { x0 } else { self.act(l - 1) };
            let dy = self.dz[cur].view();
            let bgrad_b = !hidden && fusion.bgrad_b;
            if l == 0 && !self.grad_pieces.is_empty() && self.dp.is_some() {
                // data-parallel: the first layer's weight gradient in pieces of its outputs
                // (rows of the weight), each averaged while the next is computed (before a
                // communicator is attached, as in the one-GPU baseline, the product is whole)
                for p in self.piece_order() {
                    let (first, end) = self.grad_pieces[p];
                    let op = Op::WeightGradPiece(end - first);
                    let _piece_op = self.op_product(0, op, rows);
                    self.blas.run_lt(
                        self.plan(0, op, rows)?,
                        input,
                        dy.sub(first * es, dy.bytes() - first * es)?,
                        sub(&self.grads, 4, wo + first * i, (end - first) * i)?,
                        beta,
                        None,
                        None,
                    )?;
                    if b.update {
                        self.piece_done(p)?;
                    }
                }
                continue;
            }
            if let (0, Some(sent)) = (l, input_grad) {
                // the gradient the stage before continues from, first: it waits for it
                let input_op = self.op_product(l, Op::InputGrad, rows);
                self.blas.run_lt(
                    self.plan(l, Op::InputGrad, rows)?,
                    sub(weights, wes, wo, i * o)?,
                    dy,
                    self.dz[1 - cur].view(),
                    0.0,
                    None,
                    None,
                )?;
                drop(input_op);
                cur = 1 - cur;
                if let Some(sent) = sent {
                    sent(cur)?;
                }
            }
            let weight_op = self.op_product(l, Op::WeightGrad, rows);
            self.blas.run_lt(
                self.plan(l, Op::WeightGrad, rows)?,
                input,
                dy,
                sub(&self.grads, 4, wo, i * o)?,
                beta,
                bgrad_b.then(|| epilogue_bias(l)).transpose()?,
                None,
            )?;
            if bgrad_b {
                add_scratch(l)?;
            } else if !hidden {
                self.k.bias_grad(dy, grads_bias(l)?, st, (o, rows), beta)?;
            }
            drop(weight_op);
            // layer l's gradients are complete (a hidden layer's bias gradient came with the
            // layer above's input gradient): its bucket may start averaging while the input
            // gradient below is computed
            if b.update {
                self.layer_done(l)?;
            }
            if l > 0 {
                let dx = self.dz[1 - cur].view();
                let mask = self.maps().masks[l - 1].as_ref().map(DeviceBuffer::view);
                let _input_op = self.op_product(l, Op::InputGrad, rows);
                let (bias, mask) = match fusion.input {
                    InputEpilogue::DreluBgrad => (Some(epilogue_bias(l - 1)?), mask),
                    InputEpilogue::Drelu => (None, mask),
                    InputEpilogue::Plain => (None, None),
                };
                self.blas.run_lt(
                    self.plan(l, Op::InputGrad, rows)?,
                    sub(weights, wes, wo, i * o)?,
                    dy,
                    dx,
                    0.0,
                    bias,
                    mask,
                )?;
                match fusion.input {
                    InputEpilogue::DreluBgrad => add_scratch(l - 1)?,
                    InputEpilogue::Drelu => {
                        self.k
                            .bias_grad(dx, grads_bias(l - 1)?, st, (i, rows), beta)?
                    }
                    InputEpilogue::Plain => self.k.relu_bias_grad(
                        (dx, self.act(l - 1)),
                        grads_bias(l - 1)?,
                        st,
                        (i, rows),
                        beta,
                    )?,
                }
                cur = 1 - cur;
            }
        }
        if b.update && self.opts.stage.is_none() {
            self.enqueue_update()?;
        }
        Ok(cur)
    }

    fn plan(&self, l: usize, op: Op, rows: usize) -> Result<&gpukit_cuda::lt::LtMatmul> {
        self.plans.get(&(l, op, rows)).ok_or_else(|| {
            Error::Failed(format!("no product planned for layer {l} {op:?} x{rows}"))
        })
    }

    fn gather_targets(&self, y: View<'_>, idx: View<'_>, rows: usize, tw: usize) -> Result<()> {
        match self.train.y {
            Targets::Values { .. } => {
                self.k
                    .gather_rows(y, self.tgt.view(), idx, DType::F32, (rows, tw))?
            }
            Targets::Classes { .. } => self.k.gather_u32(y, self.tgt.view(), idx, (rows, 1))?,
        }
        Ok(())
    }

    /// The maps the next ops use.
    pub(super) fn maps(&self) -> &super::Maps {
        &self.maps[self.slot.get()]
    }

    /// Layer l's output buffer (shared by recomputed layers when checkpointing).
    pub(super) fn act(&self, l: usize) -> View<'_> {
        self.maps().acts[self.act_of[l]].view()
    }

    /// Layers `range` forward from `x0`, the first one's input (train: keeping ReLU masks;
    /// eval: not).
    pub(super) fn forward(
        &self,
        x0: View<'_>,
        range: std::ops::Range<usize>,
        rows: usize,
        op: Op,
    ) -> Result<()> {
        let st = self.opts.precision.storage();
        let weights = self.half.as_deref().unwrap_or(&self.params);
        let wes = if self.half.is_some() {
            st.size_bytes()
        } else {
            4
        };
        let first = range.start;
        for l in range {
            // a sharded optimizer's gathered weights of the last update
            self.weights_ready(l)?;
            let (i, o) = self.layout.io(l);
            let (wo, bo) = self.layout.offsets[l];
            let hidden = self.hidden(l);
            let input = if l == first { x0 } else { self.act(l - 1) };
            let fused = match op {
                Op::Forward => self.fusion[l].forward,
                _ => self.fusion[l].eval,
            };
            // the bias in the type the epilogue reads: f32, or the 16-bit copy
            let bias = match fused {
                Some(t) if t != DType::F32 => sub(weights, wes, bo, o)?,
                _ => sub(&self.params, 4, bo, o)?,
            };
            let _op = self.op_product(l, op, rows);
            let mask = if fused.is_some() && op == Op::Forward {
                self.maps().masks[l].as_ref().map(DeviceBuffer::view)
            } else {
                None
            };
            self.blas.run_lt(
                self.plan(l, op, rows)?,
                sub(weights, wes, wo, i * o)?,
                input,
                self.act(l),
                0.0,
                fused.map(|_| bias),
                mask,
            )?;
            if fused.is_none() {
                self.k.bias_act(
                    self.act(l),
                    sub(&self.params, 4, bo, o)?,
                    st,
                    (o, rows),
                    hidden,
                )?;
            }
        }
        Ok(())
    }

    /// The update: the scaler's overflow check (fp16: over every gradient, once all are
    /// averaged), the optimizer over the parameters (in one launch, or a launch a bucket as
    /// each bucket's averaging ends: [`GpuTrainer::update_in_pieces`]), then the step state
    /// advanced.
    pub(super) fn enqueue_update(&self) -> Result<()> {
        let _op = self.op_update();
        let p = self.opts.precision;
        let scaled = p.scaled();
        let n = self.layout.total;
        let c = self.cfg.optimizer;
        let state = self.state.view();
        let dtype = if self.half.is_some() {
            p.storage()
        } else {
            DType::F32
        };
        let es = dtype.size_bytes();
        fn f32s(buf: &DeviceBuffer, a: usize, b: usize) -> Result<View<'_>> {
            sub(buf, 4, a, b - a)
        }
        let update = |a: usize, b: usize, also: Option<(View<'_>, f32)>| -> Result<()> {
            let half = self
                .half
                .as_ref()
                .map(|h| sub(h, es, a, b - a))
                .transpose()?;
            let (params, grads) = (self.params_span((a, b))?, f32s(&self.grads, a, b)?);
            let m = self
                .m
                .as_ref()
                .map(|m| self.state_span(m, (a, b)))
                .transpose()?;
            let v = self
                .v
                .as_ref()
                .map(|v| self.state_span(v, (a, b)))
                .transpose()?;
            let rule = UpdateRule {
                kind: c.kind,
                lr: c.lr,
                weight_decay: c.weight_decay,
                momentum: c.momentum,
                nesterov: false,
            };
            self.k.averaging_step(
                rule,
                (params, grads, m, v),
                also,
                half,
                (dtype, b - a),
                state,
                scaled,
            )?;
            Ok(())
        };
        if scaled {
            // the overflow check reads every gradient: one update after every bucket
            self.gradients_averaged()?;
            self.k.check_finite(self.grads.view(), n, state)?;
            update(0, n, None)?;
        } else {
            self.update_in_pieces(update)?;
        }
        self.k
            .advance(state, scaled, (c.lr, BETA1, BETA2), GROWTH_INTERVAL)?;
        Ok(())
    }

    /// Runs the epoch's batches through the loader; returns when all are enqueued.
    fn enqueue_epoch(&mut self, order: &[usize], batches: &[Batch]) -> Result<()> {
        let stream = self.gpu.stream().clone();
        if self.opts.stage.is_some() {
            // a pipeline stage: each update's micro-batches in the 1F1B schedule
            for update in batches.split_inclusive(|b| b.update) {
                self.one_f_one_b(update)?;
            }
            return Ok(());
        }
        match self.loader {
            Loader::Resident => {
                let key = graph_key(batches);
                if self.opts.graph == Some(true) {
                    if let Some(g) = self.graphs.get(&key) {
                        let _op = self.op_other("epoch graph replay", "graph", batches.len());
                        g.launch()?;
                        return Ok(());
                    }
                }
                for b in batches {
                    self.enqueue(
                        Input::Resident {
                            first_row: b.first_row,
                        },
                        *b,
                    )?;
                }
            }
            Loader::Plain => {
                let mut host = Vec::new();
                for b in batches {
                    let idx = &order[b.first_row..b.first_row + b.rows];
                    batch_bytes(&self.train, idx, &mut host);
                    gpukit_cuda::transfer::copy_h2d(&stream, &host, &mut self.stage[0])?;
                    self.enqueue(Input::Staged { slot: 0 }, *b)?;
                }
            }
            Loader::Pinned | Loader::Prefetch => {
                let lists: Vec<Vec<usize>> = batches
                    .iter()
                    .map(|b| order[b.first_row..b.first_row + b.rows].to_vec())
                    .collect();
                let capacity = self.stage[0].len();
                let mut ring = PinnedRing::start(&self.gpu, self.train.clone(), lists, capacity)?;
                let mut released: [Option<Event>; 2] = [None, None];
                for (j, b) in batches.iter().enumerate() {
                    let (buf, len) = ring.next()?;
                    let slot = if self.loader == Loader::Prefetch {
                        j % 2
                    } else {
                        0
                    };
                    let copy_stream = self.copies.as_ref().unwrap_or(&stream);
                    if let Some(e) = &released[slot] {
                        copy_stream.wait(e)?;
                    }
                    let copied = copy_in(copy_stream, &buf, len, self.stage[slot].view())?;
                    ring.give_back(buf, copied);
                    if self.copies.is_some() {
                        stream.wait(&copy_stream.record()?)?;
                    }
                    self.enqueue(Input::Staged { slot }, *b)?;
                    if self.copies.is_some() {
                        released[slot] = Some(stream.record()?);
                    }
                }
            }
        }
        // the last update's weight gathers (sharded optimizer) end with the epoch's work
        self.gathers_joined()
    }

    /// Captures the epoch's batches as a graph (resident data), once per range of batches.
    fn capture(&mut self, batches: &[Batch]) -> Result<()> {
        let key = graph_key(batches);
        if self.graphs.contains_key(&key) || batches.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let this = &*self;
        let graph = this.gpu.capture(|| -> Result<()> {
            for b in batches {
                this.enqueue(
                    Input::Resident {
                        first_row: b.first_row,
                    },
                    *b,
                )?;
            }
            this.gathers_joined()
        })?;
        self.graphs.insert(key, graph);
        self.setup_seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Trains from `pos` to the end of the configured epochs (or the step limit), evaluating
    /// after each complete epoch; `progress` hears about each epoch.
    pub fn run(
        &mut self,
        mut pos: Position,
        progress: &mut dyn FnMut(&EpochStats),
    ) -> Result<(RunOutcome, GpuDetails)> {
        let n = self.train.len();
        let per_epoch = n.div_ceil(self.cfg.batch_size * self.shard().world) as u64;
        let classes = matches!(self.train.y, Targets::Classes { .. });
        let mut out = RunOutcome {
            epochs: Vec::new(),
            step_losses: Vec::new(),
            position: pos,
            seconds: 0.0,
            memory: self.memory,
            diverged: None,
        };
        self.gpu.reset_pool_peaks()?;
        let at_limit = |p: &Position, m: Option<u64>| m.is_some_and(|m| p.step >= m);
        'epochs: while pos.epoch < self.cfg.epochs && !at_limit(&pos, self.cfg.max_steps) {
            let order = batch_order(n, pos.epoch, self.cfg.seed, self.cfg.shuffle);
            let batches = self.batches(&pos);
            if let Some((_, _, idx)) = &self.resident {
                let order32: Vec<u32> = order.iter().map(|&i| i as u32).collect();
                self.gpu.upload_into(
                    idx.view(),
                    gpukit_tensor::codec::bytes_of(order32.as_slice()),
                )?;
                if self.opts.graph == Some(true) {
                    self.capture(&batches)?;
                }
            }
            let profiler = match &self.profile_at {
                Some((epoch, discovery, timing)) if *epoch == pos.epoch => {
                    Some(Profiler::start(&self.gpu, discovery, *timing)?)
                }
                _ => None,
            };
            let started = Instant::now();
            self.enqueue_epoch(&order, &batches)?;
            // the recording ends with the epoch's work (finish waits for it), before the
            // losses are read back
            if let Some(p) = profiler {
                self.recording = Some(p.finish()?);
            }
            let count = batches.len();
            let first = batches.first().map_or(0, |b| b.index);
            let first_slot = batches.first().map_or(0, |b| self.loss_slot(b));
            let losses = self.gpu.download_from(
                self.losses.view().sub(first_slot * 8, count * 8)?,
                count * 8,
            )?;
            let seconds = started.elapsed().as_secs_f64();
            let losses = decode_f64(&losses, DType::F64);
            let correct: usize = if classes {
                count_sum(&self.gpu.download_from(
                    self.correct.view().sub(first_slot * 4, count * 4)?,
                    count * 4,
                )?)
            } else {
                0
            };
            // data-parallel: each combined batch's loss is the mean over its rows, so each
            // rank's share counts by its rows; the correct answers add up
            let (losses, correct) = if self.dp.is_some() {
                let world = self.shard().world as f64;
                let mut mine: Vec<f64> = losses
                    .iter()
                    .zip(&batches)
                    .map(|(l, b)| l * f64::from(b.weight) / world)
                    .collect();
                mine.push(correct as f64);
                let mut all = self.sum_over_ranks(&mine)?;
                let correct = all.pop().unwrap_or(0.0).round() as usize;
                (all, correct)
            } else {
                (losses, correct)
            };
            // per-update losses: the mean of each update's batches (a pipeline's micro-batches
            // weighted by their rows)
            let (mut micro, mut steps, mut seen) = (Vec::new(), 0u64, 0usize);
            for (b, loss) in batches.iter().zip(&losses) {
                seen += if self.opts.stage.is_some() {
                    b.rows
                } else {
                    b.combined
                };
                if !loss.is_finite() {
                    let at = Position {
                        step: pos.step + steps,
                        ..pos
                    };
                    let advice = if self.opts.precision == super::Precision::Fp16 {
                        " or train in bf16 (fp16's range was exceeded in the forward pass)"
                    } else {
                        ""
                    };
                    out.diverged = Some(crate::run::diverged(*loss, &at, b.index as u64, advice));
                    pos.step += steps;
                    out.position = pos;
                    out.seconds += seconds;
                    break 'epochs;
                }
                micro.push(match self.opts.stage {
                    Some(stage) => loss * f64::from(b.weight) / stage.micro as f64,
                    None => *loss,
                });
                if b.update {
                    let mean = match self.opts.stage {
                        Some(_) => micro.iter().sum::<f64>(),
                        None => micro.iter().sum::<f64>() / micro.len() as f64,
                    };
                    out.step_losses.push(mean);
                    micro.clear();
                    steps += 1;
                }
            }
            pos.step += steps;
            pos.batch = batches.last().map_or(pos.batch, |b| b.index as u64 + 1);
            let count = if self.opts.stage.is_some() {
                batches.iter().filter(|b| b.update).count()
            } else {
                count
            };
            out.seconds += seconds;
            let complete = first == 0 && pos.batch == per_epoch;
            let (eval_loss, eval_accuracy) = if pos.batch == per_epoch && self.eval.is_some() {
                let (l, a) = self.evaluate()?;
                (Some(l), a)
            } else {
                (None, None)
            };
            let stats = EpochStats {
                epoch: pos.epoch + 1,
                complete,
                batches: count as u64,
                steps,
                train_loss: if self.opts.stage.is_some() {
                    let recent = &out.step_losses[out.step_losses.len() - steps as usize..];
                    recent.iter().sum::<f64>() / recent.len().max(1) as f64
                } else {
                    losses.iter().sum::<f64>() / count.max(1) as f64
                },
                train_accuracy: classes.then(|| correct as f64 / seen.max(1) as f64),
                eval_loss,
                eval_accuracy,
                seconds,
                samples_per_s: seen as f64 / seconds.max(1e-9),
            };
            progress(&stats);
            out.epochs.push(stats);
            if pos.batch == per_epoch {
                pos.epoch += 1;
                pos.batch = 0;
            }
        }
        // a sharded optimizer's ranks each hold their blocks of the f32 weights and moments
        self.gather_shards()?;
        out.position = pos;
        let st = StepState::from_bytes(&self.gpu.download(&self.state)?)?;
        let pool = self.gpu.pool_stats()?;
        out.memory.pool_peak = Some(pool.used_high);
        let details = GpuDetails {
            precision: self.opts.precision,
            loader: self.loader,
            graph: self.opts.graph == Some(true),
            fused_epilogues: self.all_fused(),
            epilogues: self.epilogue_notes(),
            scaler: self
                .opts
                .precision
                .scaled()
                .then_some((f64::from(st.scale), u64::from(st.growth))),
            skipped_updates: u64::from(st.skipped),
            setup_seconds: self.setup_seconds,
            pool_peak_bytes: pool.used_high,
            device_name: self.gpu.name().unwrap_or_default(),
        };
        Ok((out, details))
    }

    /// Mean loss (weighted by samples) and, for classes, accuracy on the held-out data,
    /// forward only, in batches of the training batch size.
    pub fn evaluate(&self) -> Result<(f64, Option<f64>)> {
        let Some((e, x, y, idx)) = &self.eval else {
            return Err(Error::Failed("no held-out data to evaluate".into()));
        };
        let st = self.opts.precision.storage();
        let (n, bs, f, tw) = (e.len(), self.cfg.batch_size, e.features, target_width(e));
        let width = self.cfg.widths[self.layout.layers()];
        let mut rows_of = Vec::new();
        for (j, lo) in (0..n).step_by(bs).enumerate() {
            let rows = bs.min(n - lo);
            rows_of.push(rows);
            let ix = idx.view().sub(lo * 4, rows * 4)?;
            self.k
                .gather_rows(x.view(), self.maps().x_in.view(), ix, st, (rows, f))?;
            match e.y {
                Targets::Values { .. } => {
                    self.k
                        .gather_rows(y.view(), self.tgt.view(), ix, DType::F32, (rows, tw))?
                }
                Targets::Classes { .. } => {
                    self.k
                        .gather_u32(y.view(), self.tgt.view(), ix, (rows, 1))?
                }
            }
            self.forward(
                self.maps().x_in.view(),
                0..self.layout.layers(),
                rows,
                Op::ForwardEval,
            )?;
            let out = self.act(self.layout.layers() - 1);
            let loss = self.losses.view().sub(j * 8, 8)?;
            match self.cfg.loss {
                LossKind::Mse => self.k.mse(
                    out,
                    self.tgt.view(),
                    None,
                    st,
                    rows * width,
                    None,
                    1.0,
                    loss,
                )?,
                LossKind::CrossEntropy => self.k.cross_entropy(
                    out,
                    self.tgt.view(),
                    None,
                    st,
                    (rows, width),
                    None,
                    (1.0, 0.0),
                    loss,
                    self.correct.view().sub(j * 4, 4)?,
                )?,
            }
        }
        let count = rows_of.len();
        let losses = decode_f64(
            &self.gpu.download_from(self.losses.view(), count * 8)?,
            DType::F64,
        );
        let total: f64 = losses
            .iter()
            .zip(&rows_of)
            .map(|(l, &r)| l * r as f64)
            .sum();
        let accuracy = match e.y {
            Targets::Classes { .. } => {
                let right = count_sum(&self.gpu.download_from(self.correct.view(), count * 4)?);
                Some(right as f64 / n.max(1) as f64)
            }
            Targets::Values { .. } => None,
        };
        Ok((total / n.max(1) as f64, accuracy))
    }
}

mod ops;
#[cfg(test)]
mod tests;
