//! The device memory [`super::GpuResNet::new`] allocates for a network, batch and image size,
//! counted from the shapes alone before anything is planned or allocated, so that a run too
//! large for the GPU is refused in milliseconds (exit 1, needed against available) instead of
//! failing part way through its allocations.
//!
//! To use: `device_need(ordinal, &model, (batch, accumulate), image, precision, &opt)?.check(Some(free),
//! HINT)`.

use super::layout::{FlatLayout, ALIGN};
use super::memory::{plan_maps, BlockMaps, NetMaps};
use super::unit_shapes;
use crate::cnn::optim::CnnOptimizerConfig;
use crate::cnn::resnet::ResNet;
use crate::error::Result;
use crate::optim::OptimizerKind;
use crate::precision::Precision;
use gpukit_cuda::dnn::{pool_out, Maps, CONV_WORKSPACE_BYTES};
use gpukit_types::resources::{bytes, Need};

/// The flags that change a convolutional run's memory.
pub const HINT: &str = "lower --batch-size or --image-size (or train a smaller --model)";

/// The maps `model` makes of `input`.
pub fn net_maps(model: &ResNet<f32>, input: Maps) -> Result<NetMaps> {
    let (_, stem) = unit_shapes(model.stem(), input)?;
    let p = model.pool();
    let pooled = Maps {
        h: pool_out(stem.h, p.kernel, p.stride, p.padding),
        w: pool_out(stem.w, p.kernel, p.stride, p.padding),
        ..stem
    };
    let mut maps = pooled;
    let mut blocks = Vec::new();
    for b in model.blocks() {
        let input = maps;
        let mut main = Vec::new();
        for u in &b.main {
            maps = unit_shapes(u, maps)?.1;
            main.push(maps);
        }
        let down = match &b.down {
            Some(d) => Some(unit_shapes(d, input)?.1),
            None => None,
        };
        blocks.push(BlockMaps { input, main, down });
    }
    Ok(NetMaps {
        stem,
        pooled,
        blocks,
    })
}

/// The output maps of every convolution + norm unit in the order the trainer plans them (the
/// stem, then each block's main path and its downsampling), and the stem's pooled maps.
pub fn unit_outputs(model: &ResNet<f32>, input: Maps) -> Result<(Vec<Maps>, Maps)> {
    let net = net_maps(model, input)?;
    Ok((net.unit_outputs(), net.pooled))
}

/// The device memory of training `model` on batches of `batch` images of `image` (`accumulate`
/// of them an update; `checkpoint`: each block's maps but its output recomputed in backward) in
/// `precision` with `opt`, part by part (the convolution workspace at its limit).
pub fn device_need(
    ordinal: usize,
    model: &ResNet<f32>,
    (batch, accumulate, checkpoint): (usize, usize, bool),
    image: (usize, usize),
    precision: Precision,
    opt: &CnnOptimizerConfig,
) -> Result<Need> {
    let elem = precision.storage().size_bytes();
    let input = super::input_maps(precision, batch, image)?;
    let net = net_maps(model, input)?;
    let maps = plan_maps(
        &net,
        super::plan::pools_on_kernels(&net.stem, model.pool().kernel),
        checkpoint,
    )?;
    let outputs = net.unit_outputs();
    let params = FlatLayout::new(model.params.iter().map(|p| p.data.len())).total;
    let stats = FlatLayout::new(model.buffers.iter().map(|b| b.data.len())).total;
    let widest = model.params.iter().map(|p| p.data.len()).max().unwrap_or(0);
    let f32s = |n: usize| bytes(&[n], 4);
    let moments = match opt.kind {
        OptimizerKind::Sgd if opt.momentum == 0.0 => 0,
        OptimizerKind::Sgd => 1,
        OptimizerKind::Adam | OptimizerKind::AdamW => 2,
    };
    let saved: usize = outputs
        .iter()
        .map(|m| 2 * m.c.next_multiple_of(ALIGN))
        .sum();
    let (features, classes) = (model.head().0.inputs, model.classes);
    let mut need = Need::device(
        ordinal,
        format!(
            "training {} on the GPU (batch {batch}, {}x{} images, {})",
            model.depth.name(),
            image.0,
            image.1,
            precision.name()
        ),
    );
    need.add("fp32 weights and gradients", bytes(&[params, 2], 4))
        .add("optimizer state", bytes(&[params, moments], 4))
        .add(
            "gradient accumulator",
            bytes(&[params, usize::from(accumulate > 1)], 4),
        )
        .add(
            // the whole 16-bit copy, and one tensor's 16-bit gradient before it is widened
            "16-bit weights and a gradient",
            if precision.half() {
                bytes(&[params + widest], elem)
            } else {
                Some(0)
            },
        )
        .add("running and saved statistics", f32s(stats + saved))
        .add(
            // each unit's convolution and norm outputs and the gradients of the backward
            // stages, placed by their lifetimes
            "maps and their gradients (one plan)",
            Some(maps.total as u64),
        )
        .add(
            "images, labels, head and loss",
            sum(&[
                Some(input.bytes() as u64),
                bytes(&[batch], 4),
                bytes(&[batch, features, 2], 4),
                bytes(&[batch, classes, 2], 4),
            ]),
        )
        .add(
            "convolution and cuBLAS workspaces (at most)",
            Some((CONV_WORKSPACE_BYTES + gpukit_cuda::blas::WORKSPACE_BYTES) as u64),
        );
    Ok(need)
}

fn sum(parts: &[Option<u64>]) -> Option<u64> {
    parts.iter().try_fold(0u64, |a, p| a.checked_add((*p)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cnn::resnet::Depth;

    fn sgd() -> CnnOptimizerConfig {
        CnnOptimizerConfig {
            kind: OptimizerKind::Sgd,
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// ResNet-50 at batch 256 of 224x224 needs more than 8 GiB and less than 80 in fp32 (PyTorch
    /// holds about 22 GiB of activations there); the need grows with the batch.
    #[test]
    fn resnet50s_need_is_counted_from_its_shapes() {
        let model = ResNet::<f32>::new(Depth::ResNet50, 1000, 0);
        let total = |batch| {
            device_need(
                0,
                &model,
                (batch, 1, false),
                (224, 224),
                Precision::Fp32,
                &sgd(),
            )
            .unwrap()
            .total()
            .unwrap()
        };
        let (b256, b32) = (total(256), total(32));
        assert!(b256 > 8 << 30 && b256 < 80 << 30, "{b256}");
        assert!(b32 < b256 / 4, "{b32} {b256}");
        let refused = device_need(
            0,
            &model,
            (256, 1, false),
            (224, 224),
            Precision::Fp32,
            &sgd(),
        )
        .unwrap()
        .check(Some(4 << 30), HINT)
        .unwrap_err()
        .to_string();
        assert!(refused.contains("resnet50"), "{refused}");
    }
}

#[cfg(test)]
mod arena_tests {
    use super::*;
    use crate::cnn::gpu::memory::{plan_maps, MapsPlan, Slot};
    use crate::cnn::resnet::{Depth, ResNet};

    fn slots(p: &MapsPlan) -> Vec<Slot> {
        let mut v: Vec<Slot> = p.pool_index.into_iter().collect();
        v.extend([
            p.stem.conv_out,
            p.stem.bn_out,
            p.pooled,
            p.grad_out,
            p.stem_grads.0,
            p.stem_grads.1,
        ]);
        for b in &p.blocks {
            for u in b.main.iter().chain(b.down.as_ref()) {
                v.extend([u.conv_out, u.bn_out]);
            }
            v.extend([b.temp, b.grad_in]);
            v.extend(b.down_input);
            if let Some(r) = &b.recompute {
                for u in r.main.iter().chain(r.down.as_ref()) {
                    v.extend([u.conv_out, u.bn_out]);
                }
            }
        }
        v
    }

    /// Activation checkpointing: ResNet-50's maps at batch 256 of 224x224 in bf16 and
    /// ResNet-18's in fp32 take a smaller arena (a block's maps but its output recomputed in
    /// its stage), still at the lower bound with every buffer inside it; the recomputed maps
    /// have the forward's sizes, the last unit's norm output is the kept block output, and
    /// what the stage reads beside them (its output's gradient, the block's input) never
    /// shares their bytes.
    #[test]
    fn checkpointing_shrinks_the_arena() {
        let share =
            |a: Slot, b: Slot| a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
        for (depth, precision, batch) in [
            (Depth::ResNet50, crate::precision::Precision::Bf16, 256),
            (Depth::ResNet18, crate::precision::Precision::Fp32, 8),
        ] {
            let model = ResNet::<f32>::new(depth, 1000, 0);
            let input = crate::cnn::gpu::input_maps(precision, batch, (224, 224)).unwrap();
            let net = net_maps(&model, input).unwrap();
            let kernels = precision != crate::precision::Precision::Fp32;
            let kept = plan_maps(&net, kernels, false).unwrap();
            let p = plan_maps(&net, kernels, true).unwrap();
            assert_eq!(p.total, p.lower_bound);
            for s in slots(&p) {
                assert!(s.offset + s.bytes <= p.total, "{s:?}");
            }
            // measured here: ResNet-50 bf16 b256 3,675 of 10,020 MiB; ResNet-18 fp32 b8 110
            // of 154 (its stem's two 112x112 maps, kept for the stem's backward, are most)
            let most = match depth {
                Depth::ResNet50 => 0.4,
                _ => 0.75,
            };
            assert!(
                (p.total as f64) < most * kept.total as f64,
                "{depth:?}: {} of {}",
                p.total,
                kept.total
            );
            assert!(kept.blocks.iter().all(|b| b.recompute.is_none()));
            for (bi, b) in p.blocks.iter().enumerate() {
                let r = b.recompute.as_ref().expect("recomputed maps");
                assert_eq!(r.main.len(), b.main.len());
                for (x, y) in r.main.iter().zip(&b.main) {
                    assert_eq!(
                        (x.conv_out.bytes, x.bn_out.bytes),
                        (y.conv_out.bytes, y.bn_out.bytes)
                    );
                }
                assert_eq!(r.main.last().unwrap().bn_out, b.main.last().unwrap().bn_out);
                let input = match bi {
                    0 => p.pooled,
                    _ => p.blocks[bi - 1].main.last().unwrap().bn_out,
                };
                let grad_out = match p.blocks.get(bi + 1) {
                    Some(next) => next.grad_in,
                    None => p.grad_out,
                };
                // the recomputed shortcut lives only until the last unit adds it
                let through_stage = r.main.iter().flat_map(|u| [u.conv_out, u.bn_out]);
                let through_stage = through_stage
                    .chain(r.down.map(|u| u.conv_out))
                    .filter(|&m| m != b.main.last().unwrap().bn_out);
                for m in through_stage {
                    assert!(!share(m, b.temp) && !share(m, b.grad_in), "block {bi}");
                }
                for u in r.main.iter().chain(r.down.as_ref()) {
                    for m in [u.conv_out, u.bn_out] {
                        if m != b.main.last().unwrap().bn_out {
                            assert!(!share(m, input) && !share(m, grad_out), "block {bi}");
                        }
                    }
                }
            }
        }
    }

    /// ResNet-50's maps at batch 256 of 224x224 in bf16: the plan reaches its lower bound,
    /// keeps every buffer inside the arena, and is smaller than two maps a unit plus three
    /// gradient buffers of the largest (the layout before it) by the downsampling outputs and
    /// the gradient buffers, less the last stage's three small gradients (live beside every
    /// map when backward starts).
    #[test]
    fn resnet50s_maps_and_gradients_share_one_arena() {
        let model = ResNet::<f32>::new(Depth::ResNet50, 1000, 0);
        let input = crate::cnn::gpu::input_maps(crate::precision::Precision::Bf16, 256, (224, 224))
            .unwrap();
        let net = net_maps(&model, input).unwrap();
        let p = plan_maps(&net, true, false).unwrap();
        assert_eq!(p.total, p.lower_bound);
        for s in slots(&p) {
            assert!(s.offset + s.bytes <= p.total, "{s:?}");
            assert_eq!(s.offset % 256, 0);
        }
        let maps: usize = net
            .blocks
            .iter()
            .flat_map(|b| b.main.iter().chain(b.down.as_ref()))
            .chain([&net.stem])
            .map(|m| 2 * m.bytes())
            .sum::<usize>()
            + net.pooled.bytes();
        let before = maps + 3 * net.stem.bytes();
        // the stem norm's output lives only until the pool: not at the peak
        let kept = plan_maps(&net, false, false).unwrap();
        assert_eq!(kept.total, kept.lower_bound);
        assert!(
            p.total + net.stem.bytes() <= kept.total + net.pooled.elements(),
            "{} {}",
            p.total,
            kept.total
        );
        let downs: usize = net
            .blocks
            .iter()
            .filter_map(|b| b.down)
            .map(|m| m.bytes())
            .sum();
        let last = p.blocks.last().unwrap();
        let first_stage = p.grad_out.bytes + last.temp.bytes + last.grad_in.bytes;
        assert!(
            p.total + downs + 3 * net.stem.bytes() <= before + first_stage,
            "{} {before}",
            p.total
        );
        assert!(p.without_reuse > p.total);
    }

    /// The large gradients of the stem's stage and the first blocks lie on bytes whose maps
    /// are dead by then, never on a map still to be read.
    #[test]
    fn a_gradient_never_shares_bytes_with_a_map_read_after_it() {
        let model = ResNet::<f32>::new(Depth::ResNet18, 10, 0);
        let input =
            crate::cnn::gpu::input_maps(crate::precision::Precision::Fp32, 8, (64, 64)).unwrap();
        let p = plan_maps(&net_maps(&model, input).unwrap(), false, false).unwrap();
        let share =
            |a: Slot, b: Slot| a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
        // the stem's stage reads the stem's maps and the pooled maps
        for g in [p.stem_grads.0, p.stem_grads.1, p.blocks[0].grad_in] {
            for m in [p.stem.conv_out, p.stem.bn_out, p.pooled] {
                assert!(!share(g, m), "{g:?} {m:?}");
            }
        }
        // block 0's stage reads its own maps and the pooled ones; its gradients avoid them
        let b0 = &p.blocks[0];
        for g in [b0.temp, b0.grad_in, p.blocks[1].grad_in] {
            for u in &b0.main {
                assert!(
                    !share(g, u.conv_out) && !share(g, u.bn_out),
                    "{g:?} {u:?} {:?}",
                    p.blocks
                );
            }
            assert!(!share(g, p.pooled));
        }
    }
}
