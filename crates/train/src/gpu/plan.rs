//! How each layer's products run: the flat parameter layout, the epilogues cuBLASLt fuses for
//! every batch size the run meets, and the plans built once for them.

use super::{GpuTrainer, Op, PlanKey};
use crate::error::{Error, Result};
use crate::model::Mlp;
use gpukit_cuda::lt::{Epilogue, LtMatmul, MatmulSpec};
use gpukit_types::DType;
use std::collections::HashMap;

/// Offsets (in elements) of each layer's weight and bias in the flat parameter buffer,
/// aligned to 128 elements so every tensor starts 256-byte aligned in f32 and in 16-bit
/// copies (cuBLASLt's kernels assume it).
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) widths: Vec<usize>,
    pub(super) offsets: Vec<(usize, usize)>,
    pub(super) total: usize,
}

const ALIGN: usize = 128;

impl Layout {
    /// Elements of the flat gradient buffer that layers lo..=hi occupy: [start, end).
    pub(super) fn span(&self, lo: usize, hi: usize) -> (usize, usize) {
        let end = self.offsets.get(hi + 1).map_or(self.total, |&(w, _)| w);
        (self.offsets[lo].0, end)
    }

    pub(super) fn new(widths: &[usize]) -> Layout {
        Layout::aligned(widths, 1)
    }

    /// Every tensor starting at a multiple of 128 elements and of `multiple` (a sharded
    /// optimizer's ranks: each layer's span then splits into equal blocks, one a rank).
    pub(super) fn aligned(widths: &[usize], multiple: usize) -> Layout {
        let align = lcm(ALIGN, multiple.max(1));
        let mut offsets = Vec::new();
        let mut at = 0;
        for w in widths.windows(2) {
            let wo = at;
            at = (wo + w[0] * w[1]).next_multiple_of(align);
            let bo = at;
            at = (bo + w[1]).next_multiple_of(align);
            offsets.push((wo, bo));
        }
        Layout {
            widths: widths.to_vec(),
            offsets,
            total: at.max(align),
        }
    }

    pub(super) fn layers(&self) -> usize {
        self.offsets.len()
    }

    pub(super) fn io(&self, l: usize) -> (usize, usize) {
        (self.widths[l], self.widths[l + 1])
    }

    /// The model as one flat f32 vector.
    pub(super) fn pack(&self, model: &Mlp<f32>) -> Vec<f32> {
        let mut flat = vec![0f32; self.total];
        for (l, (wo, bo)) in self.offsets.iter().enumerate() {
            let layer = &model.layers[l];
            flat[*wo..wo + layer.weight.len()].copy_from_slice(&layer.weight);
            flat[*bo..bo + layer.bias.len()].copy_from_slice(&layer.bias);
        }
        flat
    }

    /// Per-tensor vectors in [`Mlp::named`] order from a flat vector.
    pub(super) fn unpack(&self, flat: &[f32]) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for (l, (wo, bo)) in self.offsets.iter().enumerate() {
            let (i, o) = self.io(l);
            out.push(flat[*wo..wo + i * o].to_vec());
            out.push(flat[*bo..bo + o].to_vec());
        }
        out
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

/// Pieces of a layer's outputs (`ranges`, ending at its last output) moved so that each piece
/// of `inputs`-wide rows but the last holds a multiple of `world` elements: a sharded
/// optimizer splits each piece into equal blocks, one a rank (the last piece runs to the
/// layer's end, which the layout aligns). Pieces left empty are dropped.
pub(super) fn split_for_blocks(
    ranges: Vec<(usize, usize)>,
    inputs: usize,
    world: usize,
) -> Vec<(usize, usize)> {
    if world < 2 {
        return ranges;
    }
    let q = world / gcd(inputs, world);
    let last = ranges.last().map_or(0, |r| r.1);
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (_, b) in ranges {
        let end = if b == last { b } else { b / q * q };
        let start = out.last().map_or(0, |&(_, e)| e);
        if end > start {
            out.push((start, end));
        }
    }
    out
}

/// `n` split into `count` consecutive ranges as even as they go (at most `n`, at least one).
pub(super) fn split(n: usize, count: usize) -> Vec<(usize, usize)> {
    let count = count.clamp(1, n.max(1));
    (0..count)
        .map(|p| (p * n / count, (p + 1) * n / count))
        .collect()
}

/// The first layer's rows in one piece a rank, where the exchange applies: `world` ranks of a
/// sharded optimizer, f32 gradients, `outputs` a multiple of `world`. None elsewhere.
pub(super) fn exchange_pieces(
    outputs: usize,
    world: usize,
    sharded: bool,
    grad_comm: DType,
) -> Option<Vec<(usize, usize)>> {
    let fits = world >= 2 && sharded && grad_comm == DType::F32 && outputs.is_multiple_of(world);
    fits.then(|| {
        let c = outputs / world;
        (0..world).map(|q| (q * c, (q + 1) * c)).collect()
    })
}

/// The gradients' buckets: runs of whole layers from the last (backward's first) down to
/// layer `first`, each closed once it holds `bytes` or more, as DDP's bucket_cap_mb.
/// `(lo, hi)`: layers lo..=hi, in the order backward completes them.
pub(super) fn buckets(layout: &Layout, bytes: usize, first: usize) -> Vec<(usize, usize)> {
    let layers = layout.layers();
    let mut out = Vec::new();
    let mut hi = None;
    for l in (first..layers).rev() {
        let top = *hi.get_or_insert(l);
        let (lo_off, hi_end) = layout.span(l, top);
        if (hi_end - lo_off) * 4 >= bytes || l == first {
            out.push((l, top));
            hi = None;
        }
    }
    out
}

/// Elements of the flat gradient buffer that the first layer's weight-gradient pieces occupy
/// (`pieces`: ranges of its outputs, the weight stored [outputs, inputs]); the last piece
/// also takes the layer's bias and the padding after it, so that the pieces and the buckets
/// of the layers above cover the buffer.
pub(super) fn piece_spans(layout: &Layout, pieces: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let (i, _) = layout.io(0);
    let (wo, _) = layout.offsets[0];
    let end = layout.span(0, 0).1;
    pieces
        .iter()
        .enumerate()
        .map(|(p, &(a, b))| {
            let hi = if p + 1 == pieces.len() {
                end
            } else {
                wo + b * i
            };
            (wo + a * i, hi)
        })
        .collect()
}

/// How a layer's input-gradient product applies the previous layer's ReLU and bias gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum InputEpilogue {
    /// cuBLASLt masks by the forward's ReLU bits and sums the bias gradient.
    DreluBgrad,
    /// cuBLASLt masks; gpukit's kernel sums the bias gradient.
    Drelu,
    /// gpukit's kernels do both.
    #[default]
    Plain,
}

/// Which of a layer's epilogues cuBLASLt fuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Fusion {
    /// Forward bias (+ReLU, with its bits) fused, the bias in this type; None: gpukit's kernel.
    pub(super) forward: Option<DType>,
    /// The same for evaluation (no bits kept).
    pub(super) eval: Option<DType>,
    /// The last layer's bias gradient taken in its weight-gradient product.
    pub(super) bgrad_b: bool,
    /// This layer's input-gradient product (layers after the first).
    pub(super) input: InputEpilogue,
}

/// The product `op` of a layer of `(inputs, outputs)` on `rows` rows, in `p`, with its
/// epilogue and the bias's type.
pub(super) fn product_spec(
    (i, o): (usize, usize),
    p: super::Precision,
    op: Op,
    rows: usize,
    (epilogue, bias): (Epilogue, DType),
) -> MatmulSpec {
    let (m, n, k, ta, tb, out) = match op {
        Op::Forward | Op::ForwardEval => (o, rows, i, true, false, p.storage()),
        Op::WeightGrad => (i, o, rows, false, true, DType::F32),
        // rows [a, a + n) of the output gradient's transpose: B a block of it, ld o
        Op::WeightGradPiece(n) => (i, n, rows, false, true, DType::F32),
        Op::InputGrad => (i, rows, o, false, false, p.storage()),
    };
    MatmulSpec {
        m,
        n,
        k,
        trans_a: ta,
        trans_b: tb,
        inputs: p.inputs(),
        output: out,
        epilogue,
        bias_type: bias,
        b_ld: matches!(op, Op::WeightGradPiece(_)).then_some(o),
        sm_count_target: None,
    }
}

impl GpuTrainer {
    /// The batch sizes a run meets: the full one and the last, partial one of an epoch (and
    /// of the evaluation).
    pub(super) fn row_counts(&self) -> Vec<usize> {
        let b = self.cfg.batch_size;
        let mut rows = vec![b.min(self.train.len())];
        let tail = self.train.len() % b;
        if tail != 0 {
            rows.push(tail);
        }
        // a data-parallel rank's share of the last, partial combined batch
        if let Some(shard) = self.opts.shard {
            let combined = b * shard.world;
            let m = self.train.len() % combined;
            if m != 0 {
                rows.push(shard.rows(m, b).1.max(1));
            }
        }
        if let Some((e, ..)) = &self.eval {
            rows.push(b.min(e.len()));
            if e.len() % b != 0 {
                rows.push(e.len() % b);
            }
        }
        // a pipeline stage runs micro-batches
        if let Some(stage) = self.opts.stage {
            rows = rows
                .iter()
                .flat_map(|&r| super::stage::split_rows(r, stage.micro))
                .collect();
        }
        rows.sort_unstable();
        rows.dedup();
        rows
    }

    fn spec(&self, l: usize, op: Op, rows: usize, epilogue: Epilogue, bias: DType) -> MatmulSpec {
        MatmulSpec {
            sm_count_target: self.sm_target,
            ..product_spec(
                self.layout.io(l),
                self.opts.precision,
                op,
                rows,
                (epilogue, bias),
            )
        }
    }

    /// The plans of one product of layer `l` for every batch size, or None when cuBLASLt has
    /// no algorithm for one of them.
    fn plans_for(
        &self,
        l: usize,
        op: Op,
        epilogue: Epilogue,
        bias: DType,
    ) -> Result<Option<Vec<(PlanKey, LtMatmul)>>> {
        let mut out = Vec::new();
        for rows in self.row_counts() {
            match self
                .blas
                .lt_matmul(self.spec(l, op, rows, epilogue, bias))?
            {
                Some(plan) => out.push(((l, op, rows), plan)),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// Chooses each layer's epilogues, fused where cuBLASLt can (for every batch size), and
    /// builds every product's plan. The forward's bias is f32 where cuBLASLt takes it with
    /// 16-bit outputs, else the weights' 16-bit copy (as autocast does); with a sharded
    /// optimizer the 16-bit copy first (a sharded rank keeps only its blocks of the f32
    /// weights current, the 16-bit copy whole). A backward that needs the forward's ReLU bits
    /// uses them only where the forward fused.
    pub(super) fn plan_all(&mut self) -> Result<()> {
        let st = self.opts.precision.storage();
        let fuse = self.opts.fuse;
        let mut bias_types = vec![DType::F32];
        if st != DType::F32 {
            let sharded = self.opts.shard_optimizer && self.opts.shard.is_some_and(|s| s.world > 1);
            bias_types.insert(usize::from(!sharded), st);
        }
        let layers = self.layout.layers();
        let mut fusion: Vec<Fusion> = Vec::new();
        let mut plans = HashMap::new();
        for l in 0..layers {
            let hidden = self.hidden(l);
            let mut f = Fusion::default();
            for (op, fused_epi) in [
                (
                    Op::Forward,
                    if hidden {
                        Epilogue::ReluAuxBias
                    } else {
                        Epilogue::Bias
                    },
                ),
                (
                    Op::ForwardEval,
                    if hidden {
                        Epilogue::ReluBias
                    } else {
                        Epilogue::Bias
                    },
                ),
            ] {
                let mut chosen = None;
                if fuse {
                    for &bt in &bias_types {
                        if let Some(ps) = self.plans_for(l, op, fused_epi, bt)? {
                            plans.extend(ps);
                            chosen = Some(bt);
                            break;
                        }
                    }
                }
                if chosen.is_none() {
                    let ps = self.plans_for(l, op, Epilogue::None, DType::F32)?;
                    plans.extend(ps.ok_or_else(|| self.no_algorithm(l, op))?);
                }
                match op {
                    Op::Forward => f.forward = chosen,
                    _ => f.eval = chosen,
                }
            }
            let bgrad = if fuse && !hidden {
                self.plans_for(l, Op::WeightGrad, Epilogue::BgradB, DType::F32)?
            } else {
                None
            };
            f.bgrad_b = bgrad.is_some();
            match bgrad {
                Some(ps) => plans.extend(ps),
                None => plans.extend(
                    self.plans_for(l, Op::WeightGrad, Epilogue::None, DType::F32)?
                        .ok_or_else(|| self.no_algorithm(l, Op::WeightGrad))?,
                ),
            }
            // a pipeline stage after the first also sends its first layer's input gradient
            if l > 0 || self.opts.stage.is_some_and(|s| !s.first()) {
                let mask = l
                    .checked_sub(1)
                    .and_then(|below| fusion.get(below))
                    .is_some_and(|p| p.forward.is_some());
                let mut input = InputEpilogue::Plain;
                if fuse && mask {
                    for (epi, kind) in [
                        (Epilogue::DreluBgrad, InputEpilogue::DreluBgrad),
                        (Epilogue::Drelu, InputEpilogue::Drelu),
                    ] {
                        if let Some(ps) = self.plans_for(l, Op::InputGrad, epi, DType::F32)? {
                            plans.extend(ps);
                            input = kind;
                            break;
                        }
                    }
                }
                if input == InputEpilogue::Plain {
                    plans.extend(
                        self.plans_for(l, Op::InputGrad, Epilogue::None, DType::F32)?
                            .ok_or_else(|| self.no_algorithm(l, Op::InputGrad))?,
                    );
                }
                f.input = input;
            }
            gpukit_cuda::trace::note(|| format!("train: layer {l} epilogues {f:?}"));
            fusion.push(f);
        }
        // data-parallel: the first layer's weight gradient in pieces, each averaged once done
        let pieces = self.piece_ranges();
        if pieces.len() > 1 {
            let mut widths: Vec<usize> = pieces.iter().map(|(a, b)| b - a).collect();
            widths.dedup();
            for n in widths {
                let op = Op::WeightGradPiece(n);
                plans.extend(
                    self.plans_for(0, op, Epilogue::None, DType::F32)?
                        .ok_or_else(|| self.no_algorithm(0, op))?,
                );
            }
        }
        self.grad_pieces = if pieces.len() > 1 { pieces } else { Vec::new() };
        self.plans = plans;
        self.fusion = fusion;
        Ok(())
    }

    /// The first layer's outputs in the pieces its weight gradient is computed in (one range
    /// when whole): data-parallel only, for a model of two or more layers; `grad_pieces` many,
    /// or (0) four where the layer's weights take 16 MiB or more (the 4096-wide MLP's 64 MiB
    /// gradient was backward's last product, its averaging left after backward whole) and
    /// the optimizer is not sharded (sharded, the pieces' smaller reduce-scatters beside the
    /// products measured slower than one after backward: 0.85-0.88 against 0.92).
    fn piece_ranges(&self) -> Vec<(usize, usize)> {
        let (i, o) = self.layout.io(0);
        let count = match self.opts.grad_pieces {
            _ if self.opts.shard.is_none() || self.layout.layers() < 2 => 1,
            0 if i * o * 4 >= 16 << 20 && !self.opts.shard_optimizer => 4,
            0 => 1,
            n => n,
        };
        let world = match self.opts.shard {
            Some(s) if self.opts.shard_optimizer => s.world,
            _ => 1,
        };
        // the exchange's pieces where gpukit chooses them (not when asked for a count, or to
        // leave multiprocessors to NCCL's kernels)
        let auto = self.opts.grad_pieces == 0 && self.opts.comm_sms == 0;
        if self.opts.dp_exchange
            && auto
            && self.opts.graph != Some(true)
            && self.layout.layers() >= 2
        {
            let sharded = self.opts.shard_optimizer;
            if let Some(p) = exchange_pieces(o, world, sharded, self.opts.grad_comm) {
                return p;
            }
        }
        split_for_blocks(split(o, count), i, world)
    }

    fn no_algorithm(&self, l: usize, op: Op) -> Error {
        Error::Failed(format!(
            "cuBLASLt has no algorithm for layer {l}'s {op:?} product in {}",
            self.opts.precision.name()
        ))
    }

    /// Whether every epilogue ran fused in cuBLASLt.
    pub(super) fn all_fused(&self) -> bool {
        let layers = self.fusion.len();
        self.fusion.iter().enumerate().all(|(l, f)| {
            f.forward.is_some()
                && f.eval.is_some()
                && (l + 1 < layers || f.bgrad_b)
                && (l == 0 || f.input == InputEpilogue::DreluBgrad)
        })
    }

    /// Each layer's epilogues, in words.
    pub(super) fn epilogue_notes(&self) -> Vec<String> {
        let layers = self.fusion.len();
        (0..layers)
            .map(|l| {
                let f = self.fusion[l];
                let act = if l + 1 < layers { "+ReLU" } else { "" };
                let fwd = match f.forward {
                    Some(t) => format!("bias{act} fused (bias {t})"),
                    None => format!("bias{act} by gpukit's kernel"),
                };
                // a hidden layer's gradients go through the next layer's input product
                let back = if l + 1 == layers {
                    if f.bgrad_b {
                        "bias gradient fused"
                    } else {
                        "bias gradient by gpukit's kernel"
                    }
                } else {
                    match self.fusion[l + 1].input {
                        InputEpilogue::DreluBgrad => "ReLU and bias gradients fused",
                        InputEpilogue::Drelu => {
                            "ReLU gradient fused, bias gradient by gpukit's kernel"
                        }
                        InputEpilogue::Plain => "ReLU and bias gradients by gpukit's kernels",
                    }
                };
                format!("layer {l}: forward {fwd}; backward {back}")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buckets_cover_every_layer_once_from_the_last() {
        let layout = Layout::new(&[16, 64, 64, 64, 1]);
        // one layer a bucket
        let each = buckets(&layout, 1, 0);
        assert_eq!(each, vec![(3, 3), (2, 2), (1, 1), (0, 0)]);
        // everything in one
        assert_eq!(buckets(&layout, usize::MAX, 0), vec![(0, 3)]);
        // a hidden layer holds 64x64 weights (16 KiB in f32): 20 KiB closes a bucket once it
        // has two of them (the small last layer rides with the first)
        let b = buckets(&layout, 20 << 10, 0);
        assert_eq!(b, vec![(1, 3), (0, 0)]);
        let (a, e) = layout.span(0, 3);
        assert_eq!((a, e), (0, layout.total));
        // consecutive buckets meet
        let (_, end_low) = layout.span(0, 1);
        let (start_high, _) = layout.span(2, 3);
        assert_eq!(end_low, start_high);
    }

    #[test]
    fn the_first_layers_pieces_and_the_buckets_above_cover_the_gradients_once() {
        let layout = Layout::new(&[48, 64, 64, 10]);
        for count in [1, 2, 3, 4, 7, 64] {
            let pieces = split(64, count);
            assert_eq!(pieces.len(), count.min(64));
            let spans = piece_spans(&layout, &pieces);
            let mut all: Vec<(usize, usize)> = buckets(&layout, 1, 1)
                .iter()
                .map(|&(lo, hi)| layout.span(lo, hi))
                .chain(spans.iter().copied())
                .collect();
            all.sort_unstable();
            // consecutive, from 0 to the end, nothing twice
            let mut at = 0;
            for (a, b) in &all {
                assert_eq!(*a, at, "{count} pieces: {all:?}");
                assert!(b > a);
                at = *b;
            }
            assert_eq!(at, layout.total);
            // each piece but the last holds whole rows of the weight (48 inputs a row)
            for &(a, b) in &spans[..spans.len() - 1] {
                assert_eq!((b - a) % 48, 0);
            }
        }
        assert_eq!(split(10, 3), vec![(0, 3), (3, 6), (6, 10)]);
        assert_eq!(split(2, 5), vec![(0, 1), (1, 2)]);
    }

    use super::*;

    #[test]
    fn pieces_split_the_rows_evenly_where_the_exchange_applies() {
        assert_eq!(
            exchange_pieces(4096, 2, true, DType::F32),
            Some(vec![(0, 2048), (2048, 4096)])
        );
        assert_eq!(exchange_pieces(4096, 2, false, DType::F32), None);
        assert_eq!(exchange_pieces(4096, 2, true, DType::Bf16), None);
        assert_eq!(exchange_pieces(4095, 2, true, DType::F32), None);
        assert_eq!(exchange_pieces(4096, 1, true, DType::F32), None);
        assert_eq!(
            exchange_pieces(96, 3, true, DType::F32).map(|p| p.len()),
            Some(3)
        );
    }
}
