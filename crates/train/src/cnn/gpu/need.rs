//! The device memory [`super::GpuResNet::new`] allocates for a network, batch and image size,
//! counted from the shapes alone before anything is planned or allocated, so that a run too
//! large for the GPU is refused in milliseconds (exit 1, needed against available) instead of
//! failing part way through its allocations.
//!
//! To use: `device_need(ordinal, &model, batch, image, precision, &opt)?.check(Some(free),
//! HINT)`.

use super::layout::{FlatLayout, ALIGN};
use super::memory::plan_maps;
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

/// The device memory of training `model` on batches of `batch` images of `image` in
/// `precision` with `opt`, part by part (the convolution workspace at its limit).
pub fn device_need(
    ordinal: usize,
    model: &ResNet<f32>,
    batch: usize,
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
            device_need(0, &model, batch, (224, 224), Precision::Fp32, &sgd())
                .unwrap()
                .total()
                .unwrap()
        };
        let (b256, b32) = (total(256), total(32));
        assert!(b256 > 8 << 30 && b256 < 80 << 30, "{b256}");
        assert!(b32 < b256 / 4, "{b32} {b256}");
        let refused = device_need(0, &model, 256, (224, 224), Precision::Fp32, &sgd())
            .unwrap()
            .check(Some(4 << 30), HINT)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("resnet50"), "{refused}");
    }
}
