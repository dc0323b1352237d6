//! Lowering a network to one batch size: the op list with every activation's shape, each
//! activation's lifetime, and the memory plan that places them in one arena (buffers whose
//! contents are dead are reused; a block's last convolution may write over its shortcut). No
//! device is needed, so `gpukit memory` can size arenas without a GPU.

use crate::error::{Error, Result};
use crate::forward::{FoldedConv, FoldedResNet};
use crate::plan::{plan_no_reuse, plan_reuse, Lifetime, MemoryPlan};
use gpukit_cuda::dnn::{Conv, GraphSpec};
use gpukit_tensor::{ConvShape, DType, Layout};

/// An activation of the forward pass: per-image shape and element type (the batch size comes
/// with the session).
#[derive(Debug, Clone, Copy)]
pub(super) struct Activation {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub dtype: DType,
}

impl Activation {
    /// `[n, c, h, w]`.
    pub fn shape(&self, n: usize) -> [usize; 4] {
        [n, self.c, self.h, self.w]
    }

    /// Bytes at batch size `n`; an error when that overflows.
    pub fn bytes(&self, n: usize) -> Result<usize> {
        [n, self.c, self.h, self.w, self.dtype.size_bytes()]
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "an activation of {n} x {} x {} x {} is too large to address",
                    self.c, self.h, self.w
                ))
            })
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    /// f32 NCHW input -> activation type and layout.
    Convert {
        x: usize,
        y: usize,
    },
    /// `conv` index; `z` a residual; `relu`: bias and ReLU fused (every convolution but a
    /// projection, which is a plain convolution: its bias joined the next one's).
    Conv {
        conv: usize,
        x: usize,
        y: usize,
        z: Option<usize>,
        relu: bool,
    },
    MaxPool {
        x: usize,
        y: usize,
    },
    AvgPool {
        x: usize,
        y: usize,
    },
    Classifier {
        x: usize,
        y: usize,
    },
}

/// The tensor an op writes.
pub(super) fn y_of(op: Op) -> usize {
    match op {
        Op::Convert { y, .. }
        | Op::MaxPool { y, .. }
        | Op::AvgPool { y, .. }
        | Op::Classifier { y, .. }
        | Op::Conv { y, .. } => y,
    }
}

/// Whether an op is a convolution followed by ReLU (every one but a projection).
pub(super) fn relu_of(op: Op) -> bool {
    matches!(op, Op::Conv { relu: true, .. })
}

/// One convolution layer as the engine runs it: its filter geometry (input channels padded where
/// the layout wants); the batch and image size come with the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvLayer {
    pub k: usize,
    pub c: usize,
    pub r: usize,
    pub stride: usize,
    pub pad: usize,
}

impl ConvLayer {
    /// The layer's convolution on an `n x c x h x w` input.
    pub fn at(&self, n: usize, h: usize, w: usize) -> ConvShape {
        ConvShape {
            n,
            c: self.c,
            h,
            w,
            k: self.k,
            r: self.r,
            s: self.r,
            stride: self.stride,
            pad: self.pad,
            groups: 1,
        }
    }
}

/// What the op list and memory plan of a forward pass depend on: no device needed.
#[derive(Debug, Clone)]
pub struct NetShape {
    /// The dtype of the convolutions; activations are stored as its storage type.
    pub dtype: DType,
    pub layout: Layout,
    pub input_channels: usize,
    /// In the engine's order: the stem, then per block its main path and its projection.
    pub convs: Vec<ConvLayer>,
    pub blocks: Vec<(Vec<usize>, Option<usize>)>,
    pub num_classes: usize,
    pub features: usize,
}

impl NetShape {
    /// The shape [`super::GpuWeights::upload`] gives `model` in this dtype and layout.
    pub fn of(model: &FoldedResNet, dtype: DType, layout: Layout) -> Result<NetShape> {
        if !super::ENGINE_DTYPES.contains(&dtype) {
            return Err(Error::Invalid(format!(
                "the GPU engine runs f32, tf32, f16 and bf16, not {dtype}"
            )));
        }
        // NHWC's stem reads 8 channels (3 padded with zeros): tensor-core engines want them
        let input_channels = match layout {
            Layout::Nhwc => 8,
            Layout::Nchw => 3,
        };
        let meta = |c: &FoldedConv, ch: usize| ConvLayer {
            k: c.out_ch,
            c: ch,
            r: c.kernel,
            stride: c.stride,
            pad: c.pad,
        };
        let mut convs = vec![meta(&model.stem, input_channels)];
        let mut blocks = Vec::new();
        for block in &model.blocks {
            let mut main = Vec::new();
            for conv in &block.convs {
                convs.push(meta(conv, conv.in_ch));
                main.push(convs.len() - 1);
            }
            let proj = block.downsample.as_ref().map(|d| {
                convs.push(meta(d, d.in_ch));
                convs.len() - 1
            });
            blocks.push((main, proj));
        }
        Ok(NetShape {
            dtype,
            layout,
            input_channels,
            convs,
            blocks,
            num_classes: model.num_classes,
            features: model.fc_weight.len() / model.num_classes.max(1),
        })
    }

    /// The dtype activations are stored as (tf32 is f32 storage).
    /// torchvision's name of each convolution, by index: `conv1`, `layer3.1.conv2`,
    /// `layer2.0.downsample.0` (a stage starts at the first block and at each block with a
    /// projection).
    pub fn conv_names(&self) -> Vec<String> {
        let mut names = vec![String::from("conv"); self.convs.len()];
        if let Some(first) = names.first_mut() {
            *first = "conv1".into();
        }
        let (mut stage, mut index) = (0, 0);
        for (b, (main, proj)) in self.blocks.iter().enumerate() {
            if b == 0 || proj.is_some() {
                stage += 1;
                index = 0;
            } else {
                index += 1;
            }
            for (j, &c) in main.iter().enumerate() {
                if let Some(n) = names.get_mut(c) {
                    *n = format!("layer{stage}.{index}.conv{}", j + 1);
                }
            }
            if let Some(n) = proj.and_then(|p| names.get_mut(p)) {
                *n = format!("layer{stage}.{index}.downsample.0");
            }
        }
        names
    }

    pub fn activation_dtype(&self) -> DType {
        self.dtype.storage()
    }
}

/// The op list of a forward pass at one batch size and where each tensor lives.
pub(super) struct Lowered {
    /// Per tensor, the first and last op that touch it.
    pub spans: Vec<(usize, usize)>,
    /// Convolutions whose output shares its residual input's bytes (op indices).
    pub in_place: Vec<usize>,
    pub tensors: Vec<Activation>,
    pub ops: Vec<Op>,
    pub logits: usize,
    pub plan: MemoryPlan,
    /// Arena bytes without reuse.
    pub without: usize,
    pub input_bytes: usize,
}

/// Builds the op list (with shapes) and plans its memory; see [`super::Session::new`].
pub(super) fn lower(
    net: &NetShape,
    n: usize,
    h: usize,
    w: usize,
    reuse: bool,
    in_place: bool,
) -> Result<Lowered> {
    let elem = net.activation_dtype();
    let mut tensors = vec![Activation {
        c: 3,
        h,
        w,
        dtype: DType::F32,
    }];
    let mut ops = Vec::new();
    let new = |tensors: &mut Vec<Activation>, t: Activation| {
        tensors.push(t);
        tensors.len() - 1
    };
    // the stem reads the f32 input directly when nothing needs converting
    let mut x = 0;
    if elem != DType::F32 || net.layout == Layout::Nhwc || net.input_channels != 3 {
        let y = new(
            &mut tensors,
            Activation {
                c: net.input_channels,
                h,
                w,
                dtype: elem,
            },
        );
        ops.push(Op::Convert { x, y });
        x = y;
    }
    let conv_out = |tensors: &Vec<Activation>, x: usize, c: &ConvLayer| -> Activation {
        let t = tensors[x];
        let (h, w) = c.at(1, t.h, t.w).out_hw();
        Activation {
            c: c.k,
            h,
            w,
            dtype: elem,
        }
    };
    let t = conv_out(&tensors, x, &net.convs[0]);
    let y = new(&mut tensors, t);
    ops.push(Op::Conv {
        conv: 0,
        x,
        y,
        z: None,
        relu: true,
    });
    let s = tensors[y];
    let pooled = new(
        &mut tensors,
        Activation {
            h: (s.h + 2 - 3) / 2 + 1,
            w: (s.w + 2 - 3) / 2 + 1,
            ..s
        },
    );
    ops.push(Op::MaxPool { x: y, y: pooled });
    x = pooled;
    for (main, proj) in &net.blocks {
        // The projection runs just before the convolution that adds it, so that its output is
        // not live beside the main path's first two outputs (this lowers the peak of
        // ResNet-50's layer2).
        let mut cur = x;
        let mut projected = None;
        for (i, &ci) in main.iter().enumerate() {
            let last = i + 1 == main.len();
            if let (true, Some(p)) = (last, proj) {
                let t = conv_out(&tensors, x, &net.convs[*p]);
                let y = new(&mut tensors, t);
                ops.push(Op::Conv {
                    conv: *p,
                    x,
                    y,
                    z: None,
                    relu: false,
                });
                projected = Some(y);
            }
            let shortcut = projected.unwrap_or(x);
            let t = conv_out(&tensors, cur, &net.convs[ci]);
            let y = new(&mut tensors, t);
            ops.push(Op::Conv {
                conv: ci,
                x: cur,
                y,
                z: last.then_some(shortcut),
                relu: true,
            });
            cur = y;
        }
        x = cur;
    }
    let f = tensors[x];
    let feats = new(
        &mut tensors,
        Activation {
            c: f.c,
            h: 1,
            w: 1,
            dtype: DType::F32,
        },
    );
    ops.push(Op::AvgPool { x, y: feats });
    let logits = new(
        &mut tensors,
        Activation {
            c: net.num_classes,
            h: 1,
            w: 1,
            dtype: DType::F32,
        },
    );
    ops.push(Op::Classifier {
        x: feats,
        y: logits,
    });
    if f.c != net.features {
        return Err(Error::Invalid(format!(
            "the classifier expects {} features, the network gives {}",
            net.features, f.c
        )));
    }

    // lifetimes: from the op that writes a tensor to the last op that reads it; the input
    // and the logits live throughout (the input is uploaded before, the logits read after)
    let mut life: Vec<Lifetime> = tensors
        .iter()
        .map(|t| {
            Ok(Lifetime {
                bytes: t.bytes(n)?,
                first: usize::MAX,
                last: 0,
            })
        })
        .collect::<Result<_>>()?;
    let steps = ops.len();
    for (step, op) in ops.iter().enumerate() {
        let (reads, write): (Vec<usize>, usize) = match *op {
            Op::Convert { x, y }
            | Op::MaxPool { x, y }
            | Op::AvgPool { x, y }
            | Op::Classifier { x, y } => (vec![x], y),
            Op::Conv { x, y, z, .. } => (std::iter::once(x).chain(z).collect(), y),
        };
        for r in reads {
            life[r].last = life[r].last.max(step);
        }
        life[write].first = life[write].first.min(step);
        life[write].last = life[write].last.max(step);
    }
    life[0].first = 0;
    life[0].last = steps;
    life[logits].last = steps;
    let spans: Vec<(usize, usize)> = life.iter().map(|l| (l.first, l.last)).collect();
    let without = plan_no_reuse(&life).total;
    // In place: a block's last convolution may write its output over its shortcut when nothing
    // reads the shortcut afterwards (the output then takes the shortcut's bytes, and the pair is
    // planned as one buffer). Whether each chosen cuDNN engine computes correctly so is checked
    // when the session is planned.
    let mut alias: Vec<Option<usize>> = vec![None; tensors.len()];
    let mut done_in_place = Vec::new();
    if reuse && in_place {
        for (step, op) in ops.iter().enumerate() {
            if let Op::Conv { y, z: Some(z), .. } = *op {
                let root = alias[z].unwrap_or(z);
                if life[z].last == step && life[y].bytes == life[root].bytes && z != 0 {
                    alias[y] = Some(root);
                    life[root].last = life[root].last.max(life[y].last);
                    life[y].bytes = 0;
                    done_in_place.push(step);
                }
            }
        }
    }
    let mut plan = if reuse {
        plan_reuse(&life)
    } else {
        plan_no_reuse(&life)
    };
    for (t, root) in alias.iter().enumerate() {
        if let Some(root) = *root {
            plan.offsets[t] = plan.offsets[root];
        }
    }
    if let Err(e) = crate::plan::check(&life, &plan) {
        return Err(Error::Invalid(format!("internal: memory plan: {e}")));
    }
    Ok(Lowered {
        spans,
        in_place: done_in_place,
        input_bytes: life[0].bytes,
        tensors,
        ops,
        logits,
        plan,
        without,
    })
}

/// Bytes of the activation arena for `net` at this batch size (with or without the memory
/// plan), computed without a device.
pub fn arena_bytes(net: &NetShape, n: usize, h: usize, w: usize, reuse: bool) -> Result<usize> {
    Ok(lower(net, n, h, w, reuse, reuse)?.plan.total)
}

/// Every operation graph a session of `net` at batch `n` and `h` x `w` images plans, in the
/// order of its layers (layers of one shape repeat; the planner plans each once): what
/// [`gpukit_cuda::dnn::Dnn::precompile`] takes, so helper threads can compile the engines of
/// sessions before they are prepared.
pub fn graph_specs(net: &NetShape, n: usize, h: usize, w: usize) -> Result<Vec<GraphSpec>> {
    let lowered = lower(net, n, h, w, true, false)?;
    Ok(lowered
        .ops
        .iter()
        .filter_map(|op| spec_of(net, &lowered.tensors, n, *op))
        .collect())
}

/// The operation graph of convolution op `op` (None for the other ops).
pub(super) fn spec_of(
    net: &NetShape,
    tensors: &[Activation],
    n: usize,
    op: Op,
) -> Option<GraphSpec> {
    let Op::Conv {
        conv, x, z, relu, ..
    } = op
    else {
        return None;
    };
    let a = tensors.get(x)?;
    let conv = Conv {
        shape: net.convs.get(conv)?.at(n, a.h, a.w),
        layout: net.layout,
        dtype: net.dtype,
    };
    Some(match relu {
        true => GraphSpec::fused(conv, z.is_some()),
        false => GraphSpec::plain(conv),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::fold;
    use crate::weights::seeded_init;
    use crate::ResNet;

    #[test]
    fn resnet50_arena_is_its_largest_live_set() {
        let folded = fold(&seeded_init(ResNet::R50, 1000, 0, false)).unwrap();
        let net = NetShape::of(&folded, DType::F32, Layout::Nchw).unwrap();
        let n = 128;
        let with = arena_bytes(&net, n, 224, 224, true).unwrap();
        let without = arena_bytes(&net, n, 224, 224, false).unwrap();
        // the peak by hand, beside the input batch (3x224x224), all f32: layer2's first block
        // at its second convolution holds the block's input (256x56x56, read later by the
        // projection), the first intermediate (128x56x56) and the second (128x28x28); a
        // layer1 block holds less (256x56x56 + 2 x 64x56x56); each block's last convolution
        // writes its output over the shortcut
        let f = |c: usize, hw: usize| n * c * hw * hw * 4;
        let layer1 = f(256, 56) + 2 * f(64, 56);
        let layer2 = f(256, 56) + f(128, 56) + f(128, 28);
        let peak = f(3, 224) + layer1.max(layer2);
        assert_eq!(with, peak, "{with} vs {peak}");
        assert!(with * 7 < without, "{with} vs {without}");
        // without writing in place, the last convolution holds the shortcut and its output
        let apart = lower(&net, n, 224, 224, true, false).unwrap();
        assert_eq!(apart.plan.total, f(3, 224) + 2 * f(256, 56) + f(64, 56));
        assert!(with * 10 < apart.plan.total * 8);
        assert!(apart.in_place.is_empty());
        // every one of ResNet-50's 16 blocks writes in place
        let inplace = lower(&net, n, 224, 224, true, true).unwrap();
        assert_eq!(inplace.in_place.len(), 16);
        for &i in &inplace.in_place {
            let Op::Conv { y, z: Some(z), .. } = inplace.ops[i] else {
                panic!("op {i} is not a residual convolution")
            };
            assert_eq!(inplace.plan.offsets[y], inplace.plan.offsets[z]);
        }
        // f16 NHWC: half the bytes, except the stem's input conversion (8 channels)
        let half = arena_bytes(
            &NetShape::of(&folded, DType::F16, Layout::Nhwc).unwrap(),
            n,
            224,
            224,
            true,
        );
        assert!(half.unwrap() * 10 < with * 6);
        // f64 is not an engine dtype, and absurd sizes are errors, not panics
        assert!(NetShape::of(&folded, DType::F64, Layout::Nchw).is_err());
        assert!(arena_bytes(&net, usize::MAX / 2, 224, 224, true).is_err());
    }

    #[test]
    fn convolutions_carry_torchvisions_names() {
        for model in [ResNet::R18, ResNet::R50] {
            let folded = fold(&seeded_init(model, 10, 0, false)).unwrap();
            let net = NetShape::of(&folded, DType::F32, Layout::Nchw).unwrap();
            let expected: Vec<String> = model
                .convolutions(224)
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            assert_eq!(net.conv_names(), expected, "{model:?}");
        }
    }
}
