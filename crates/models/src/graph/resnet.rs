//! gpukit's hand-built ResNet ([`FoldedResNet`]) as a graph, so that it is one graph among
//! others: the same convolutions (batch norm folded, torchvision's names), max pooling,
//! residual Adds, ReLUs, global average pooling, Flatten and the classifier as Gemm. Run
//! through the passes, its ReLUs and residual Adds become Conv epilogues, the fusions the
//! hand-built CPU and GPU paths make.

use super::{
    Conv, DType, Data, Epilogue, Gemm, Graph, GraphBuilder, GraphError, Op, Pool, ValueId,
};
use crate::forward::{block_name, FoldedConv, FoldedResNet};

/// Adds `conv` (named `name`, torchvision's key without `.weight`) on `x`; returns its output.
fn conv(
    b: &mut GraphBuilder,
    name: &str,
    c: &FoldedConv,
    x: ValueId,
) -> Result<ValueId, GraphError> {
    let w = b.constant(
        &format!("{name}.weight"),
        vec![c.out_ch, c.in_ch, c.kernel, c.kernel],
        Data::F32(c.weight.clone()),
    )?;
    let bias = b.constant(
        &format!("{name}.bias"),
        vec![c.out_ch],
        Data::F32(c.bias.clone()),
    )?;
    let op = Op::Conv(Conv {
        kernel: [c.kernel, c.kernel],
        strides: [c.stride, c.stride],
        pads: [c.pad; 4],
        dilations: [1, 1],
        groups: 1,
        bias: true,
        epilogue: Epilogue::default(),
    });
    Ok(b.node(name, op, &[x, w, bias], &[name])?[0])
}

fn relu(b: &mut GraphBuilder, name: &str, x: ValueId) -> Result<ValueId, GraphError> {
    Ok(b.node(name, Op::Activation(super::Activation::Relu), &[x], &[name])?[0])
}

/// The graph of `model` on `batch` NCHW RGB images of `height x width`: input `input`
/// `[batch, 3, height, width]`, output `logits` `[batch, classes]`.
pub fn resnet_graph(
    model: &FoldedResNet,
    batch: usize,
    height: usize,
    width: usize,
) -> Result<Graph, GraphError> {
    let mut b = GraphBuilder::new();
    let x = b.input("input", DType::F32, vec![batch, 3, height, width])?;
    let y = conv(&mut b, "conv1", &model.stem, x)?;
    let y = relu(&mut b, "relu", y)?;
    let pool = Pool {
        kernel: [3, 3],
        strides: [2, 2],
        pads: [1; 4],
        ceil_mode: false,
        count_include_pad: false,
    };
    let mut x = b.node("maxpool", Op::MaxPool(pool), &[y], &["maxpool"])?[0];
    let stages = model.model.blocks();
    for (i, block) in model.blocks.iter().enumerate() {
        let name = block_name(&stages, i);
        let identity = match &block.downsample {
            Some(d) => conv(&mut b, &format!("{name}.downsample.0"), d, x)?,
            None => x,
        };
        let mut y = x;
        for (j, c) in block.convs.iter().enumerate() {
            y = conv(&mut b, &format!("{name}.conv{}", j + 1), c, y)?;
            if j + 1 == block.convs.len() {
                y = b.node(
                    &format!("{name}.add"),
                    Op::Binary(super::Binary::Add),
                    &[y, identity],
                    &[&format!("{name}.add")],
                )?[0];
            }
            y = relu(&mut b, &format!("{name}.relu{}", j + 1), y)?;
        }
        x = y;
    }
    let pooled = b.node("avgpool", Op::GlobalAveragePool, &[x], &["avgpool"])?[0];
    let flat = b.node("flatten", Op::Flatten { axis: 1 }, &[pooled], &["flatten"])?[0];
    let features = model.fc_weight.len() / model.num_classes.max(1);
    let w = b.constant(
        "fc.weight",
        vec![model.num_classes, features],
        Data::F32(model.fc_weight.clone()),
    )?;
    let bias = b.constant(
        "fc.bias",
        vec![model.num_classes],
        Data::F32(model.fc_bias.clone()),
    )?;
    let gemm = Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let logits = b.node("fc", Op::Gemm(gemm), &[flat, w, bias], &["logits"])?[0];
    b.output(logits);
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{forward_cpu, passes, Array};
    use crate::weights::seeded_init;
    use crate::ResNet;
    use gpukit_tensor::random::{fresh_seed, uniform_f32};

    #[test]
    fn resnet_graph_equals_the_hand_built_forward_pass_before_and_after_the_passes() {
        let seed = fresh_seed();
        for (model, n) in [(ResNet::R18, 2), (ResNet::R50, 1)] {
            let folded = crate::forward::fold(&seed_dict(model, seed)).unwrap();
            let (h, w) = (32, 32);
            let x = uniform_f32(n * 3 * h * w, seed);
            let want = folded
                .forward_cpu(&gpukit_tensor::Tensor::from_f32(&[n, 3, h, w], x.clone()).unwrap())
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let graph = resnet_graph(&folded, n, h, w).unwrap();
            let mut fused = graph.clone();
            let stats = passes::optimize(&mut fused).unwrap();
            let convs = fused
                .nodes
                .iter()
                .filter(|n| matches!(n.op, Op::Conv(_)))
                .count();
            // every ReLU and residual Add is now a convolution's epilogue
            assert_eq!(fused.nodes.len(), convs + 4, "{model:?}: {stats:?}");
            for g in [&graph, &fused] {
                let got = forward_cpu(g, &[Array::f32(&[n, 3, h, w], x.clone())]).unwrap();
                let got = got[0].as_f32().unwrap();
                let num: f64 = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                    .sum();
                let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
                let rel = (num / den).sqrt();
                assert!(rel <= 1e-5, "{model:?}: relative error {rel} (seed {seed})");
            }
        }
    }

    fn seed_dict(model: ResNet, seed: u64) -> crate::weights::StateDict {
        seeded_init(model, 10, seed, true)
    }
}
