//! Pipeline-parallel training (`train --pipeline N`): the layers split across N GPUs, each
//! batch cut into micro-batches that flow through the stages in the 1F1B schedule (Narayanan
//! et al., PipeDream-Flush, as Megatron-LM runs it): a stage starts with as many forwards as
//! stages follow it, then alternates one forward and one backward, then finishes the
//! backwards. Activations go forward and their gradients back through NCCL sends and
//! receives on the stage's own compute stream, each send paired with the receive it meets in a
//! group so that neither side waits for the other. A stage keeps at most `stages - index`
//! micro-batches' maps.
//!
//! Every stage sums its layers' gradients over the micro-batches (each micro-batch's loss
//! gradient weighted by its share of the batch's rows) and updates its own layers once a
//! batch, so an update is the one-GPU update on the same combined batch, up to the order of
//! sums.
//!
//! To use: build each stage's [`GpuTrainer`] with [`super::GpuOptions::stage`] set (the whole
//! model's config and weights; it keeps its own layers), then
//! [`GpuTrainer::attach_pipeline`] a communicator of the stages made on the trainer's own
//! stream ([`GpuTrainer::stream`]), or [`GpuTrainer::attach_pipeline_links`] the stage's
//! [`super::links::StageLinks`]. Before that, [`GpuTrainer::run`] runs the stage alone: its
//! micro-batches through its layers with no sends or receives, the busy time the pipeline's
//! bubble is measured against.

use super::batches::Batch;
use super::links::StageLinks;
use super::plan::{product_spec, Layout};
pub use super::split::{partition, split};
pub use super::stage::{split_rows, Stage};
use super::{GpuTrainer, Op, Precision};
use crate::error::{Error, Result};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::lt::Epilogue;
use gpukit_cuda::nccl::{self, Comm};
use gpukit_cuda::{Gpu, View};
use gpukit_types::DType;
use std::sync::Arc;

/// A send or receive of a stage: the buffer, its elements and the peer stage.
type Transfer<'a> = Option<(View<'a>, usize, usize)>;

/// What a stage after the first does with its input gradient's dz buffer once computed:
/// sends it at once (the copy engines), or nothing (the send is queued after the backward).
pub(super) type InputGrad<'a> = Option<&'a dyn Fn(usize) -> Result<()>>;

/// How a stage reaches the stages beside it.
pub(super) enum Pipe {
    /// NCCL sends and receives on the work stream.
    Nccl(Comm),
    /// The copy engines, into mailboxes on the receiving GPU.
    Copies(StageLinks),
}

impl GpuTrainer {
    /// Whether layer `l` (of this trainer's layers) is followed by a ReLU: every layer but
    /// the model's last.
    pub(super) fn hidden(&self, l: usize) -> bool {
        l + 1 < self.layout.layers() || self.opts.stage.is_some_and(|s| !s.last())
    }

    /// The model's layers this trainer holds.
    pub(super) fn own_layers(&self) -> (usize, usize) {
        self.opts
            .stage
            .map_or((0, self.layout.layers()), |s| s.layers)
    }

    /// The stream the trainer's work is queued on (a pipeline's communicator is made on it).
    pub fn stream(&self) -> gpukit_cuda::Stream {
        self.gpu.stream().clone()
    }

    /// Joins the pipeline: `comm` holds every stage (rank = stage index) and queues on the
    /// trainer's own stream. Until then the stage runs alone.
    pub fn attach_pipeline(&mut self, comm: Comm) -> Result<()> {
        let Some(stage) = self.opts.stage else {
            return Err(Error::Setting("not a pipeline stage".into()));
        };
        if comm.size != stage.count || comm.rank != stage.index {
            return Err(Error::Setting(format!(
                "stage {} of {} given rank {} of {}",
                stage.index, stage.count, comm.rank, comm.size
            )));
        }
        self.pipe = Some(Pipe::Nccl(comm));
        Ok(())
    }

    /// Joins the pipeline through the copy engines ([`super::links::Links::connect`], called
    /// with [`GpuTrainer::pipeline_inbox_bytes`]). Until then the stage runs alone.
    pub fn attach_pipeline_links(&mut self, links: StageLinks) -> Result<()> {
        self.stage()?;
        self.pipe = Some(Pipe::Copies(links));
        Ok(())
    }

    /// Bytes the largest transfer from the stage before (a micro-batch's input) and from the
    /// stage after (its output's gradient) takes, at most.
    pub fn pipeline_inbox_bytes(&self) -> (usize, usize) {
        let x_in = self.maps.first().map_or(0, |m| m.x_in.len());
        (x_in, self.dz[0].len())
    }

    /// The copy-engine links, when the stage has them.
    fn links(&self) -> Option<&StageLinks> {
        match &self.pipe {
            Some(Pipe::Copies(l)) => Some(l),
            _ => None,
        }
    }

    /// Milliseconds one optimizer step over the stage's parameters takes (timed over a few;
    /// they change the weights and the step count: load again before training).
    pub fn time_update(&self) -> Result<f64> {
        const REPS: usize = 5;
        let stream = self.gpu.stream();
        self.enqueue_update()?;
        let start = stream.record_timed()?;
        for _ in 0..REPS {
            self.enqueue_update()?;
        }
        let end = stream.record_timed()?;
        end.synchronize()?;
        Ok(start.elapsed_ms(&end)? / REPS as f64)
    }

    fn stage(&self) -> Result<Stage> {
        self.opts
            .stage
            .ok_or_else(|| Error::Failed("not a pipeline stage".into()))
    }

    /// The maps slot of micro-batch `b`.
    fn slot_of(&self, b: &Batch) -> Result<usize> {
        Ok(b.micro % self.stage()?.slots())
    }

    /// One update's micro-batches through this stage in the 1F1B order.
    pub(super) fn one_f_one_b(&self, group: &[Batch]) -> Result<()> {
        let stage = self.stage()?;
        let m = group.len();
        let warm = (stage.count - stage.index - 1).min(m);
        let (mut f, mut bw) = (0, 0);
        self.pipe_marks.borrow_mut().clear();
        self.mark('<', 0)?;
        for _ in 0..warm {
            self.exchange(None, self.recv_input(&group[f])?)?;
            self.stage_forward(&group[f])?;
            self.exchange(self.send_output(&group[f])?, None)?;
            f += 1;
        }
        if f < m {
            self.exchange(None, self.recv_input(&group[f])?)?;
        }
        while f < m {
            self.stage_forward(&group[f])?;
            self.exchange(self.send_output(&group[f])?, self.recv_grad(&group[bw])?)?;
            f += 1;
            let send = self.stage_backward(&group[bw])?;
            let next = if f < m {
                self.recv_input(&group[f])?
            } else {
                None
            };
            self.exchange(send, next)?;
            bw += 1;
        }
        while bw < m {
            self.exchange(None, self.recv_grad(&group[bw])?)?;
            let send = self.stage_backward(&group[bw])?;
            self.exchange(send, None)?;
            bw += 1;
        }
        // the update after the last send: the stage before need not wait for it
        if group.last().is_some_and(|b| b.update) {
            self.mark('U', 0)?;
            self.enqueue_update()?;
            self.mark('u', 0)?;
        }
        Ok(())
    }

    /// With `GPUKIT_TRACE=1` on a pipeline, a timed mark on the work stream: `F`/`B` before a
    /// micro-batch's forward / backward, `f`/`b` after it, `U`/`u` around the update, `<` at
    /// an update's start.
    fn mark(&self, what: char, micro: usize) -> Result<()> {
        if self.pipe.is_some() && gpukit_cuda::trace::on() {
            let e = self.gpu.stream().record_timed()?;
            self.pipe_marks.borrow_mut().push((what, micro, e));
        }
        Ok(())
    }

    /// With `GPUKIT_TRACE=1`, the stage's last update as its work stream ran it: each
    /// forward, backward and the optimizer step (`U0`) from the update's start, in
    /// microseconds, and the time the stream spent between them (waiting for a transfer, or
    /// on the transfers' local copies). Call once the run is over.
    pub fn pipeline_trace(&self) -> Result<Option<String>> {
        let marks = self.pipe_marks.borrow();
        let Some((_, _, start)) = marks.first() else {
            return Ok(None);
        };
        let (mut line, mut idle, mut last_end) = (String::new(), 0.0, 0.0);
        for pair in marks[1..].chunks(2) {
            let [(op, micro, a), (_, _, b)] = pair else {
                break;
            };
            let (t0, t1) = (start.elapsed_ms(a)? * 1e3, start.elapsed_ms(b)? * 1e3);
            idle += t0 - last_end;
            line.push_str(&format!(
                " {op}{micro} {t0:.0}+{:.0} (gap {:.0})",
                t1 - t0,
                t0 - last_end
            ));
            last_end = t1;
        }
        Ok(Some(format!(
            "update {last_end:.0} us, {idle:.0} us between operations:{line}"
        )))
    }

    /// A micro-batch's forward through the stage's layers (the first stage gathers its
    /// inputs; the last computes its loss).
    fn stage_forward(&self, b: &Batch) -> Result<()> {
        self.mark('F', b.micro)?;
        self.forward_micro(b)?;
        self.mark('f', b.micro)
    }

    fn forward_micro(&self, b: &Batch) -> Result<()> {
        let stage = self.stage()?;
        self.slot.set(self.slot_of(b)?);
        if let Some(l) = self.links() {
            l.before_forward(&self.gpu, self.slot.get())?;
            if stage.last() {
                // the loss's gradient lands in dz[0], which the input gradient sent last may
                // still be read from
                l.before_backward(&self.gpu)?;
            }
        }
        gpukit_cuda::profiler::step(b.index);
        if stage.first() || stage.last() {
            self.gather_batch(b.first_row, b.rows, stage.first(), stage.last())?;
        }
        let x0 = self.maps().x_in.view();
        self.forward(x0, 0..self.layout.layers(), b.rows, Op::Forward)?;
        if stage.last() {
            self.enqueue_loss(self.tgt.view(), b)?;
        }
        Ok(())
    }

    /// A micro-batch's backward through the stage's layers from the output gradient in dz[0]
    /// (the loss's, or received: a stage before the last applies its top layer's ReLU and
    /// takes its bias gradient first). Through the copy engines the input gradient leaves as
    /// soon as it is computed, before the first layer's weight gradient; else the send to
    /// queue after the backward is returned.
    fn stage_backward(&self, b: &Batch) -> Result<Transfer<'_>> {
        self.mark('B', b.micro)?;
        let early = |dx: usize| self.exchange(self.send_grad(b, dx)?, None);
        let dx = self.backward_micro(b, self.links().map(|_| &early as &dyn Fn(usize) -> _))?;
        self.mark('b', b.micro)?;
        if self.links().is_some() {
            return Ok(None);
        }
        self.send_grad(b, dx)
    }

    fn backward_micro(&self, b: &Batch, sent: InputGrad<'_>) -> Result<usize> {
        let stage = self.stage()?;
        self.slot.set(self.slot_of(b)?);
        if let Some(l) = self.links() {
            l.before_backward(&self.gpu)?;
        }
        let st = self.opts.precision.storage();
        if !stage.last() {
            let top = self.layout.layers() - 1;
            let o = self.layout.io(top).1;
            let dy = self.dz[0].view();
            self.k.relu_grad(dy, self.act(top), st, b.rows * o)?;
            let db = self
                .grads
                .view()
                .sub(self.layout.offsets[top].1 * 4, o * 4)?;
            let beta = if b.first_micro { 0.0 } else { 1.0 };
            self.k.bias_grad(dy, db, st, (o, b.rows), beta)?;
        }
        let x0 = self.maps().x_in.view();
        self.enqueue_backward(x0, b, (!stage.first()).then_some(sent))
    }

    /// The micro-batch's input from the stage before (none on the first stage).
    fn recv_input(&self, b: &Batch) -> Result<Transfer<'_>> {
        let stage = self.stage()?;
        Ok((!stage.first()).then(|| {
            let n = b.rows * self.layout.io(0).0;
            (
                self.maps[b.micro % stage.slots()].x_in.view(),
                n,
                stage.index - 1,
            )
        }))
    }

    /// The micro-batch's output to the stage after (none on the last stage).
    fn send_output(&self, b: &Batch) -> Result<Transfer<'_>> {
        let stage = self.stage()?;
        let top = self.layout.layers() - 1;
        Ok((!stage.last()).then(|| {
            let n = b.rows * self.layout.io(top).1;
            let maps = &self.maps[b.micro % stage.slots()];
            (maps.acts[self.act_of[top]].view(), n, stage.index + 1)
        }))
    }

    /// The gradient of the micro-batch's output, from the stage after, into dz[0].
    fn recv_grad(&self, b: &Batch) -> Result<Transfer<'_>> {
        let stage = self.stage()?;
        let top = self.layout.layers() - 1;
        Ok((!stage.last()).then(|| {
            (
                self.dz[0].view(),
                b.rows * self.layout.io(top).1,
                stage.index + 1,
            )
        }))
    }

    /// The gradient of the micro-batch's input (in dz[`at`]) to the stage before.
    fn send_grad(&self, b: &Batch, at: usize) -> Result<Transfer<'_>> {
        let stage = self.stage()?;
        Ok((!stage.first()).then(|| {
            (
                self.dz[at].view(),
                b.rows * self.layout.io(0).0,
                stage.index - 1,
            )
        }))
    }

    /// A send and a receive: one NCCL group, or a copy queued and one taken (nothing before
    /// the pipeline is attached).
    fn exchange(&self, send: Transfer<'_>, recv: Transfer<'_>) -> Result<()> {
        let Some(pipe) = &self.pipe else {
            return Ok(());
        };
        if send.is_none() && recv.is_none() {
            return Ok(());
        }
        let dtype = self.opts.precision.storage();
        let index = self.stage()?.index;
        let comm = match pipe {
            Pipe::Nccl(comm) => comm,
            Pipe::Copies(links) => {
                let bytes = |n: usize| n * dtype.size_bytes();
                if let Some((buf, n, peer)) = send {
                    let slot = self.slot.get();
                    links.send(&self.gpu, peer > index, slot, buf, bytes(n))?;
                }
                if let Some((buf, n, peer)) = recv {
                    links.recv(&self.gpu, peer > index, buf, bytes(n))?;
                }
                return Ok(());
            }
        };
        nccl::group(|| {
            if let Some((buf, n, peer)) = send {
                comm.send(buf, n, dtype, peer)?;
            }
            if let Some((buf, n, peer)) = recv {
                comm.recv(buf, n, dtype, peer)?;
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Milliseconds each layer's three products (forward, weight gradient, input gradient) take on
/// `rows` rows in `precision`, timed on `gpu` (each shape once, on zeroed operands): the cost
/// the layers are split by.
pub fn layer_costs(
    discovery: &Discovery,
    gpu: &Arc<Gpu>,
    widths: &[usize],
    rows: usize,
    precision: Precision,
) -> Result<Vec<f64>> {
    let blas = Blas::new(discovery, gpu)?;
    let layout = Layout::new(widths);
    let st = precision.storage().size_bytes();
    let mut timed: Vec<((usize, usize), f64)> = Vec::new();
    let mut costs = Vec::new();
    for l in 0..layout.layers() {
        let io = layout.io(l);
        if let Some((_, ms)) = timed.iter().find(|(shape, _)| *shape == io) {
            costs.push(*ms);
            continue;
        }
        let (i, o) = io;
        let zeroed = |n: usize| -> Result<gpukit_cuda::DeviceBuffer> {
            let b = gpu.alloc(n.max(4))?;
            gpu.fill(b.view(), 0)?;
            Ok(b)
        };
        let (w, x, y, dw, dx) = (
            zeroed(i * o * st)?,
            zeroed(rows * i * st)?,
            zeroed(rows * o * st)?,
            zeroed(i * o * 4)?,
            zeroed(rows * i * st)?,
        );
        let plan = |op: Op| -> Result<gpukit_cuda::lt::LtMatmul> {
            let spec = product_spec(io, precision, op, rows, (Epilogue::None, DType::F32));
            blas.lt_matmul(spec)?.ok_or_else(|| {
                Error::Failed(format!(
                    "cuBLASLt has no algorithm for a {i}x{o} layer's {op:?}"
                ))
            })
        };
        let (fwd, wgrad, igrad) = (
            plan(Op::Forward)?,
            plan(Op::WeightGrad)?,
            plan(Op::InputGrad)?,
        );
        let products = || -> Result<()> {
            blas.run_lt(&fwd, w.view(), x.view(), y.view(), 0.0, None, None)?;
            blas.run_lt(&wgrad, x.view(), y.view(), dw.view(), 0.0, None, None)?;
            blas.run_lt(&igrad, w.view(), y.view(), dx.view(), 0.0, None, None)?;
            Ok(())
        };
        products()?;
        const REPS: usize = 10;
        let stream = gpu.stream();
        let start = stream.record_timed()?;
        for _ in 0..REPS {
            products()?;
        }
        let end = stream.record_timed()?;
        end.synchronize()?;
        let ms = start.elapsed_ms(&end)? / REPS as f64;
        timed.push((io, ms));
        costs.push(ms);
    }
    Ok(costs)
}

/// Milliseconds each layer's optimizer step is estimated to take on `gpu` (what the split
/// weighs beside the products, [`split`]): the bytes the step moves a parameter (the f32
/// weight read and written, its f32 gradient read, each f32 moment read and written, the
/// 16-bit copy written in mixed precision) over the bandwidth a 64 MiB device copy reaches.
pub fn update_costs(
    gpu: &Gpu,
    widths: &[usize],
    precision: Precision,
    optimizer: &crate::optim::OptimizerConfig,
) -> Result<Vec<f64>> {
    use crate::optim::OptimizerKind;
    const BYTES: usize = 64 << 20;
    const REPS: usize = 5;
    let (a, b) = (gpu.alloc(BYTES)?, gpu.alloc(BYTES)?);
    let times = gpukit_cuda::timing::time_on_stream(gpu.stream(), 1, REPS, || {
        gpu.copy_view(b.view(), a.view(), BYTES)
    })?;
    let ms: f64 = times.iter().sum();
    // a copy reads and writes each byte
    let bytes_per_ms = (2 * BYTES * REPS) as f64 / ms.max(1e-6);
    let moments = match optimizer.kind {
        OptimizerKind::Sgd if optimizer.momentum == 0.0 => 0,
        OptimizerKind::Sgd => 1,
        _ => 2,
    };
    let half = if precision.storage() == DType::F32 {
        0
    } else {
        precision.storage().size_bytes()
    };
    let per_param = (8 + 4 + 8 * moments + half) as f64;
    let layout = Layout::new(widths);
    Ok((0..layout.layers())
        .map(|l| {
            let (i, o) = layout.io(l);
            (i * o + o) as f64 * per_param / bytes_per_ms
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_into_near_equal_micro_batches() {
        assert_eq!(split_rows(8, 4), vec![2, 2, 2, 2]);
        assert_eq!(split_rows(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(split_rows(3, 8), vec![1, 1, 1]);
        for (rows, micro) in [(1, 1), (7, 3), (4096, 8), (1000, 7)] {
            let parts = split_rows(rows, micro);
            assert_eq!(parts.iter().sum::<usize>(), rows);
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
        }
    }

    fn batch(index: usize, first_row: usize, rows: usize) -> Batch {
        Batch {
            index,
            micro: 0,
            first_row,
            rows,
            first_micro: true,
            update: true,
            combined: rows,
            weight: 1.0,
        }
    }

    use super::super::batches::micro_batches;

    #[test]
    fn micro_batches_cover_each_batch_once_and_weigh_by_rows() {
        let batches = [batch(0, 0, 10), batch(1, 10, 3)];
        let micro = micro_batches(&batches, 4);
        assert_eq!(micro.len(), 4 + 3);
        for b in &batches {
            let mine: Vec<_> = micro.iter().filter(|m| m.index == b.index).collect();
            let mut row = b.first_row;
            for (j, m) in mine.iter().enumerate() {
                assert_eq!((m.micro, m.first_row), (j, row));
                assert_eq!(m.first_micro, j == 0);
                assert_eq!(m.update, j + 1 == mine.len());
                row += m.rows;
            }
            assert_eq!(row, b.first_row + b.rows);
            // the loss gradients' multipliers (weight / micro) sum to the batch's one
            let share: f32 = mine.iter().map(|m| m.weight / 4.0).sum();
            assert!((share - 1.0).abs() < 1e-6, "{share}");
        }
    }

    #[test]
    fn stages_hold_the_maps_1f1b_keeps_in_flight() {
        let s = |index, micro| Stage {
            index,
            count: 4,
            layers: (index, index + 1),
            micro,
        };
        assert_eq!(s(0, 8).slots(), 4);
        assert_eq!(s(3, 8).slots(), 1);
        assert_eq!(s(0, 2).slots(), 2);
    }
}
