//! Where a [`super::GpuResNet`]'s maps and their gradients live: one arena, every buffer placed
//! by its lifetime over the step ([`gpukit_types::arena`], the inference engine's planner).
//!
//! A step's timeline, in the order the trainer runs it: the stem's unit, the max pool, each
//! block's units (its downsampling first), the head; then backward a block at a time from the
//! last, and the stem last. A buffer lives from the op that writes it to the last stage that
//! reads it:
//! - a unit's convolution output (its norm's input) until its block's backward;
//! - a unit's norm output (after ReLU or add + ReLU) until its block's backward (the next
//!   unit's filter gradient and its own ReLU's; a block's last unit's is also the next block's
//!   input, read in that block's stage, which comes first); a downsampling unit's only until its
//!   block's last unit has added it (nothing reads it backward);
//! - the gradients a block's backward passes on: the gradient of the block's input, made in
//!   its stage and read in the previous block's; a stage's temporary for its norms' inputs; and
//!   (channel-last) the pixels a strided 1x1 downsampling reads, gathered in its stage.
//!
//! With activation checkpointing a block's forward keeps only its output: each of its other
//! maps lives from the op that writes it to the next unit's op, and the block's stage begins
//! with a recomputation of its forward (from its input, kept as the previous block's output)
//! into buffers that live through the stage; a recomputed downsampling output only until the
//! block's last unit has added it. The running statistics do not move twice
//! (`BnForward::move_running`).
//!
//! So the gradients of the first blocks' large maps reuse the bytes of the last blocks' maps,
//! dead by then, and the downsampling outputs share with what comes after them: the arena is the
//! largest set of buffers live at once (the lower bound is reported beside it), where three
//! gradient buffers of the largest map beside every map each held its own bytes before.

use crate::error::{Error, Result};
use gpukit_cuda::dnn::Maps;
use gpukit_types::arena::{check, lower_bound, plan_no_reuse, plan_reuse, Lifetime};

/// A block's maps: its input, each main unit's output and its downsampling unit's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMaps {
    pub input: Maps,
    pub main: Vec<Maps>,
    pub down: Option<Maps>,
}

/// A network's maps for one batch: the stem's output, the max pool's, each block's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetMaps {
    pub stem: Maps,
    pub pooled: Maps,
    pub blocks: Vec<BlockMaps>,
}

impl NetMaps {
    /// Every unit's output in the order the trainer plans them (the stem, then each block's
    /// main path and its downsampling).
    pub fn unit_outputs(&self) -> Vec<Maps> {
        std::iter::once(self.stem)
            .chain(
                self.blocks
                    .iter()
                    .flat_map(|b| b.main.iter().copied().chain(b.down)),
            )
            .collect()
    }
}

/// A buffer's place in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub offset: usize,
    pub bytes: usize,
}

/// A unit's two kept maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitSlots {
    /// The convolution's output, the norm's input.
    pub conv_out: Slot,
    /// The norm's output after what follows it.
    pub bn_out: Slot,
}

/// A block's maps and the gradients its backward stage makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSlots {
    pub main: Vec<UnitSlots>,
    pub down: Option<UnitSlots>,
    /// The stage's temporary: each main unit's norm-input gradient.
    pub temp: Slot,
    /// The gradient of the block's input (written in its stage; its residual's gradient passes
    /// through it first), read by the previous block's stage as its output's gradient.
    pub grad_in: Slot,
    /// Channel-last maps with a strided 1x1 downsampling: the block input's pixels it reads,
    /// gathered in the stage for its filter gradient as one product.
    pub down_input: Option<Slot>,
    /// With activation checkpointing, where the stage recomputes the block's maps (the last
    /// unit's norm output is the block's output, kept from the forward: its own slot).
    pub recompute: Option<Recompute>,
}

/// The maps a checkpointed block's stage recomputes, unit by unit as [`BlockSlots`] holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recompute {
    pub main: Vec<UnitSlots>,
    pub down: Option<UnitSlots>,
}

/// Every map and gradient of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsPlan {
    pub stem: UnitSlots,
    /// The max pool's output (the first block's input).
    pub pooled: Slot,
    /// Where each pooled value was taken in its window, a byte each (gpukit's pool kernels).
    pub pool_index: Option<Slot>,
    pub blocks: Vec<BlockSlots>,
    /// The gradient of the last block's output (from the average pool's backward).
    pub grad_out: Slot,
    /// The stem's stage: the max pool's input gradient, then the stem norm's input gradient.
    pub stem_grads: (Slot, Slot),
    /// The arena's bytes.
    pub total: usize,
    /// The largest total of buffers live at one step: no placement uses less.
    pub lower_bound: usize,
    /// Every buffer its own bytes.
    pub without_reuse: usize,
}

/// Collects lifetimes and hands back each buffer's index.
struct Timeline {
    buffers: Vec<Lifetime>,
}

impl Timeline {
    fn add(&mut self, bytes: usize, first: usize, last: usize) -> usize {
        self.buffers.push(Lifetime { bytes, first, last });
        self.buffers.len() - 1
    }
}

/// Plans the arena of a network's maps (from their shapes alone: [`super::need`] counts it
/// before anything is allocated, [`super::GpuResNet::new`] allocates it).
///
/// `pool_kernels`: the stem's ReLU and max pool run as gpukit's kernels
/// ([`super::kernels::CnnKernels::max_pool_relu_nhwc`]): the stem norm's output is read only
/// by the pool (its backward takes the pool's positions, a byte an output, and outputs), else
/// it is kept for cuDNN's pooling and ReLU backward. `checkpoint`: each block's maps but its
/// output are recomputed in its stage (the module's note).
pub fn plan_maps(net: &NetMaps, pool_kernels: bool, checkpoint: bool) -> Result<MapsPlan> {
    let at = |m: &Maps| m.bytes();
    let blocks = &net.blocks;
    if blocks.is_empty() || blocks.iter().any(|b| b.main.is_empty()) {
        return Err(Error::Failed(
            "a network without blocks, or a block without units".into(),
        ));
    }
    // forward times: 0 the stem, 1 the pool, then each unit; the head; then one backward stage
    // a block from the last, the stem's stage last
    let mut t = 2;
    let mut fwd = Vec::with_capacity(blocks.len());
    for b in blocks {
        let down = b.down.map(|_| {
            t += 1;
            t - 1
        });
        let main: Vec<usize> = (0..b.main.len()).map(|i| t + i).collect();
        t += b.main.len();
        fwd.push((main, down));
    }
    let head = t;
    let last = blocks.len() - 1;
    // the stage of block bi, and where it recomputes the block's maps: the step before it
    // with checkpointing (the average pool's backward, which writes the last block's output
    // gradient, counts as the last block's), else the stage itself
    let per_stage = if checkpoint { 2 } else { 1 };
    let stage = |bi: usize| head + per_stage * (last - bi + 1);
    let recompute_at = |bi: usize| stage(bi) + 1 - per_stage;
    let stem_stage = stage(0) + 1;
    let mut tl = Timeline {
        buffers: Vec::new(),
    };
    let stem = (
        tl.add(at(&net.stem), 0, stem_stage),
        tl.add(at(&net.stem), 0, if pool_kernels { 1 } else { stem_stage }),
    );
    let pooled = tl.add(at(&net.pooled), 1, stem_stage);
    let pool_index = pool_kernels.then(|| tl.add(net.pooled.elements(), 1, stem_stage));
    // what the stage of block bi needs of o (its output's gradient, then each main unit's) and
    // of q (its residual's gradient, then its input's)
    let largest_main = |bi: usize| blocks[bi].main.iter().map(at).max().unwrap_or(0);
    let o_need = |bi: usize| largest_main(bi);
    let q_need = |bi: usize| {
        let out = blocks[bi].main.last().map_or(0, at);
        out.max(at(&blocks[bi].input))
    };
    let mut units = Vec::with_capacity(blocks.len());
    for (bi, b) in blocks.iter().enumerate() {
        let (main_t, down_t) = &fwd[bi];
        let added = *main_t.last().unwrap_or(&0);
        let n = b.main.len();
        // kept: a main unit's norm output is read by its block's stage (the next unit's filter
        // gradient, its own ReLU's backward), a last unit's also by the next block's, earlier.
        // checkpointed: each lives until the next unit reads it, the block's output as kept
        let main: Vec<(usize, usize)> = b
            .main
            .iter()
            .zip(main_t)
            .enumerate()
            .map(|(i, (m, &f))| match (checkpoint, i + 1 == n) {
                (false, _) => (tl.add(at(m), f, stage(bi)), tl.add(at(m), f, stage(bi))),
                (true, false) => (tl.add(at(m), f, f), tl.add(at(m), f, f + 1)),
                (true, true) => (tl.add(at(m), f, f), tl.add(at(m), f, stage(bi))),
            })
            .collect();
        let down = match (b.down, *down_t) {
            (Some(m), Some(f)) => {
                let conv_until = if checkpoint { f } else { stage(bi) };
                Some((tl.add(at(&m), f, conv_until), tl.add(at(&m), f, added)))
            }
            _ => None,
        };
        // the stage's recomputation: through the stage, a downsampling output only until the
        // last unit adds it
        let (r, s) = (recompute_at(bi), stage(bi));
        let recompute = checkpoint.then(|| {
            let main: Vec<(usize, usize)> = b
                .main
                .iter()
                .zip(&main)
                .enumerate()
                .map(|(i, (m, kept))| {
                    let conv_out = tl.add(at(m), r, s);
                    match i + 1 == n {
                        true => (conv_out, kept.1),
                        false => (conv_out, tl.add(at(m), r, s)),
                    }
                })
                .collect();
            let down = b.down.map(|m| (tl.add(at(&m), r, s), tl.add(at(&m), r, r)));
            (main, down)
        });
        let temp = tl.add(largest_main(bi), s, s);
        let down_input = b
            .down
            .filter(|d| {
                d.layout == gpukit_types::Layout::Nhwc && (d.h, d.w) != (b.input.h, b.input.w)
            })
            .map(|d| {
                let bytes = d.n * d.h * d.w * b.input.c * d.dtype.size_bytes();
                tl.add(bytes, s, s)
            });
        let (grad_in, read_until) = match bi {
            0 => (q_need(0).max(at(&net.pooled)), stem_stage),
            _ => (q_need(bi).max(o_need(bi - 1)), stage(bi - 1)),
        };
        let grad_in = tl.add(grad_in, s, read_until);
        units.push((main, down, temp, grad_in, down_input, recompute));
    }
    let grad_out = tl.add(o_need(last), recompute_at(last), stage(last));
    let stem_grads = (
        tl.add(at(&net.stem), stem_stage, stem_stage),
        tl.add(at(&net.stem), stem_stage, stem_stage),
    );
    let plan = plan_reuse(&tl.buffers);
    check(&tl.buffers, &plan).map_err(|e| Error::Failed(format!("the maps' plan: {e}")))?;
    let slot = |i: usize| Slot {
        offset: plan.offsets[i],
        bytes: tl.buffers[i].bytes,
    };
    let pair = |(c, b): (usize, usize)| UnitSlots {
        conv_out: slot(c),
        bn_out: slot(b),
    };
    Ok(MapsPlan {
        stem: pair(stem),
        pooled: slot(pooled),
        pool_index: pool_index.map(slot),
        blocks: units
            .into_iter()
            .map(
                |(main, down, temp, grad_in, down_input, recompute)| BlockSlots {
                    main: main.into_iter().map(pair).collect(),
                    down: down.map(pair),
                    temp: slot(temp),
                    down_input: down_input.map(slot),
                    grad_in: slot(grad_in),
                    recompute: recompute.map(|(main, down)| Recompute {
                        main: main.into_iter().map(pair).collect(),
                        down: down.map(pair),
                    }),
                },
            )
            .collect(),
        grad_out: slot(grad_out),
        stem_grads: (slot(stem_grads.0), slot(stem_grads.1)),
        total: plan.total,
        lower_bound: lower_bound(&tl.buffers),
        without_reuse: plan_no_reuse(&tl.buffers).total,
    })
}
