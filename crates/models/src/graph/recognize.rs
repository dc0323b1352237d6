//! The other way round from [`super::resnet::resnet_graph`]: a graph that is a ResNet of
//! torchvision's family (after the passes: batch norm folded, ReLUs and residual Adds fused into
//! the convolutions) read back as a [`FoldedResNet`], so that an imported model of that family
//! runs on the engines built for it (the packed CPU path and the GPU engine). Anything else is
//! refused with the first place it departs from the family, for a message that says why.

use super::{Activation, Conv, Data, Graph, Node, Op, ValueId};
use crate::forward::{block_name, CpuPack, FoldedBlock, FoldedConv, FoldedResNet};
use crate::resnet::ResNet;
use std::collections::HashMap;

/// Reads `graph` (after [`super::passes::optimize`]) as a ResNet: torchvision's stem (7x7/2
/// convolution, ReLU, 3x3/2 max pooling), residual blocks (2 or 3 convolutions, the last with
/// the shortcut and ReLU fused; a 1x1 projection where the shape changes), global average
/// pooling, flatten and the classifier; every convolution's shape as torchvision's ResNet-18,
/// 34, 50, 101 or 152 has it. Err: where and how it differs.
pub fn as_resnet(graph: &Graph) -> Result<FoldedResNet, String> {
    let mut r = Reader { graph, at: 0 };
    let [input] = graph.inputs[..] else {
        return Err(format!("{} inputs (a ResNet has one)", graph.inputs.len()));
    };
    match graph.value(input).shape[..] {
        [_, 3, h, w] if h >= 32 && w >= 32 => {}
        ref s => return Err(format!("input of shape {s:?}, not [batch, 3, >=32, >=32]")),
    }
    let (stem, x) = r.conv(input, Fused::Relu)?;
    if (stem.kernel, stem.stride, stem.pad) != (7, 2, 3) {
        return Err("the first convolution is not the 7x7/2 stem".into());
    }
    let mut x = r.max_pool(x)?;
    let mut blocks = Vec::new();
    while matches!(r.peek().map(|n| &n.op), Some(Op::Conv(_))) {
        let (block, y) = r.block(x)?;
        blocks.push(block);
        x = y;
    }
    let (num_classes, fc_weight, fc_bias) = r.head(x)?;
    if let Some(n) = r.peek() {
        return Err(format!(
            "node {} ({}) after the classifier",
            n.name,
            n.op.name()
        ));
    }
    let model = family(&blocks)?;
    let folded = FoldedResNet {
        model,
        num_classes,
        stem,
        blocks,
        fc_weight,
        fc_bias,
        cpu_pack: CpuPack::default(),
    };
    check_shapes(&folded)?;
    Ok(folded)
}

/// What a convolution's epilogue must be.
#[derive(Clone, Copy, PartialEq)]
enum Fused {
    /// bias only (a projection)
    None,
    /// bias and ReLU
    Relu,
    /// bias, the shortcut and ReLU
    ResidualRelu,
}

struct Reader<'a> {
    graph: &'a Graph,
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<&'a Node> {
        self.graph.nodes.get(self.at)
    }

    fn next(&mut self, what: &str) -> Result<&'a Node, String> {
        let node = self
            .peek()
            .ok_or_else(|| format!("the graph ends where {what} should come"))?;
        self.at += 1;
        Ok(node)
    }

    fn constant(
        &self,
        id: ValueId,
        what: &str,
        node: &Node,
    ) -> Result<(&'a [usize], &'a [f32]), String> {
        let v = self.graph.value(id);
        match &v.constant {
            Some(Data::F32(d)) => Ok((&v.shape, d)),
            _ => Err(format!(
                "the {what} of {} is not a constant f32 tensor",
                node.name
            )),
        }
    }

    /// The next node, a convolution of `x` with epilogue `fused`: its weights, and its output.
    fn conv_node(
        &mut self,
        x: ValueId,
        fused: Fused,
    ) -> Result<(FoldedConv, ValueId, Option<ValueId>), String> {
        let node = self.next("a convolution")?;
        let Op::Conv(c) = &node.op else {
            return Err(format!(
                "{} is {}, not a convolution",
                node.name,
                node.op.name()
            ));
        };
        if node.inputs.first() != Some(&x) {
            return Err(format!("{} does not read the tensor before it", node.name));
        }
        let residual = c.residual_input().and_then(|i| node.inputs.get(i).copied());
        let want = match fused {
            Fused::None => (false, None),
            Fused::Relu => (false, Some(Activation::Relu)),
            Fused::ResidualRelu => (true, Some(Activation::Relu)),
        };
        if (c.epilogue.residual, c.epilogue.activation) != want {
            return Err(format!(
                "{}: its epilogue is not what a ResNet block has there ({:?})",
                node.name, c.epilogue
            ));
        }
        let conv = self.folded(node, c)?;
        Ok((conv, node.outputs[0], residual))
    }

    fn conv(&mut self, x: ValueId, fused: Fused) -> Result<(FoldedConv, ValueId), String> {
        let (c, y, _) = self.conv_node(x, fused)?;
        Ok((c, y))
    }

    fn folded(&self, node: &Node, c: &Conv) -> Result<FoldedConv, String> {
        let square = c.kernel[0] == c.kernel[1];
        let even = c.strides[0] == c.strides[1] && c.pads.iter().all(|&p| p == c.pads[0]);
        if !square || !even || c.groups != 1 || c.dilations != [1, 1] {
            return Err(format!(
                "{}: not a square, evenly padded, ungrouped, undilated convolution",
                node.name
            ));
        }
        let (shape, weight) = self.constant(node.inputs[1], "weight", node)?;
        let [k, ch, r, s] = shape[..] else {
            return Err(format!("{}: weight of shape {shape:?}", node.name));
        };
        if (r, s) != (c.kernel[0], c.kernel[1]) {
            return Err(format!("{}: weight of shape {shape:?}", node.name));
        }
        let bias = match c.bias {
            true => {
                let (bshape, b) = self.constant(node.inputs[2], "bias", node)?;
                if bshape != [k] {
                    return Err(format!("{}: bias of shape {bshape:?}", node.name));
                }
                b.to_vec()
            }
            false => vec![0.0; k],
        };
        Ok(FoldedConv {
            out_ch: k,
            in_ch: ch,
            kernel: r,
            stride: c.strides[0],
            pad: c.pads[0],
            weight: weight.to_vec(),
            bias,
        })
    }

    fn max_pool(&mut self, x: ValueId) -> Result<ValueId, String> {
        let node = self.next("max pooling")?;
        match &node.op {
            Op::MaxPool(p)
                if node.inputs.first() == Some(&x)
                    && p.kernel == [3, 3]
                    && p.strides == [2, 2]
                    && p.pads == [1; 4]
                    && !p.ceil_mode =>
            {
                Ok(node.outputs[0])
            }
            op => Err(format!(
                "{} ({}) where the stem's 3x3/2 max pooling should be",
                node.name,
                op.name()
            )),
        }
    }

    /// One residual block on `x`: its main path (2 or 3 convolutions from `x`) and a projection
    /// of `x` where the shape changes; the sum and the ReLU are fused into the main path's last
    /// convolution, or into the projection (the passes fuse the sum into whichever convolution
    /// comes first), which computes the same.
    fn block(&mut self, x: ValueId) -> Result<(FoldedBlock, ValueId), String> {
        let mut downsample: Option<(FoldedConv, ValueId)> = None;
        let mut convs: Vec<FoldedConv> = Vec::new();
        // the main path's last convolution when the projection takes the sum
        let mut bare_last: Option<ValueId> = None;
        let mut y = x;
        loop {
            let node = self
                .peek()
                .ok_or("the graph ends inside a residual block")?;
            let Op::Conv(c) = &node.op else {
                return Err(format!(
                    "{} ({}) inside a residual block",
                    node.name,
                    node.op.name()
                ));
            };
            let reads = node.inputs.first().copied();
            let (residual, relu) = (c.epilogue.residual, c.epilogue.activation.is_some());
            let done = |convs: Vec<FoldedConv>, downsample: Option<FoldedConv>| {
                if (2..=3).contains(&convs.len()) {
                    Ok(FoldedBlock { convs, downsample })
                } else {
                    Err(format!("a residual block of {} convolutions", convs.len()))
                }
            };
            let projection = reads == Some(x)
                && downsample.is_none()
                && match (residual, relu) {
                    // a bare projection
                    (false, false) => true,
                    // the projection with the sum, after the main path's bare last one
                    (true, true) => bare_last.is_some(),
                    _ => false,
                };
            if projection {
                if residual {
                    // the projection with the sum: its residual is the main path's last output
                    let (d, out, r) = self.conv_node(x, Fused::ResidualRelu)?;
                    if r != bare_last {
                        return Err(format!(
                            "{}: its residual is not the main path's",
                            node.name
                        ));
                    }
                    return Ok((done(convs, Some(d))?, out));
                }
                downsample = Some(self.conv(x, Fused::None)?);
                continue;
            }
            if reads != Some(y) || bare_last.is_some() {
                return Err(format!(
                    "{}: not a convolution of a residual block",
                    node.name
                ));
            }
            match (residual, relu) {
                (true, true) => {
                    let (last, out, r) = self.conv_node(y, Fused::ResidualRelu)?;
                    let shortcut = downsample.as_ref().map_or(x, |(_, d)| *d);
                    if r != Some(shortcut) {
                        return Err(format!(
                            "{}: its residual is not the block's shortcut",
                            node.name
                        ));
                    }
                    convs.push(last);
                    return Ok((done(convs, downsample.map(|(d, _)| d))?, out));
                }
                (false, true) => {
                    let (c, out) = self.conv(y, Fused::Relu)?;
                    convs.push(c);
                    y = out;
                }
                (false, false) => {
                    let (c, out) = self.conv(y, Fused::None)?;
                    convs.push(c);
                    bare_last = Some(out);
                }
                (true, false) => {
                    return Err(format!("{}: a sum without its ReLU", node.name));
                }
            }
        }
    }

    /// Global average pooling, flatten, the classifier: (classes, classes x features weight,
    /// bias).
    fn head(&mut self, x: ValueId) -> Result<(usize, Vec<f32>, Vec<f32>), String> {
        let pool = self.next("global average pooling")?;
        if pool.op != Op::GlobalAveragePool || pool.inputs.first() != Some(&x) {
            return Err(format!(
                "{} ({}) where global average pooling should be",
                pool.name,
                pool.op.name()
            ));
        }
        let flat = self.next("flatten")?;
        let flat_ok = matches!(flat.op, Op::Flatten { axis: 1 } | Op::Reshape)
            && flat.inputs.first() == Some(&pool.outputs[0])
            && self.graph.value(flat.outputs[0]).shape.len() == 2;
        if !flat_ok {
            return Err(format!(
                "{} ({}) where flatten should be",
                flat.name,
                flat.op.name()
            ));
        }
        let fc = self.next("the classifier")?;
        let Op::Gemm(g) = &fc.op else {
            return Err(format!(
                "{} ({}) where the classifier should be",
                fc.name,
                fc.op.name()
            ));
        };
        if (g.alpha, g.beta, g.trans_a, g.trans_b) != (1.0, 1.0, false, true)
            || fc.inputs.first() != Some(&flat.outputs[0])
            || fc.inputs.len() != 3
        {
            return Err(format!("{}: not y = x W^T + b", fc.name));
        }
        let (wshape, w) = self.constant(fc.inputs[1], "weight", fc)?;
        let (bshape, b) = self.constant(fc.inputs[2], "bias", fc)?;
        let [classes, _] = wshape[..] else {
            return Err(format!("{}: weight of shape {wshape:?}", fc.name));
        };
        if bshape != [classes] {
            return Err(format!("{}: bias of shape {bshape:?}", fc.name));
        }
        if self.graph.outputs != [fc.outputs[0]] {
            return Err("the classifier's output is not the graph's one output".into());
        }
        Ok((classes, w.to_vec(), b.to_vec()))
    }
}

/// Which of torchvision's ResNets has these blocks (by count and kind).
fn family(blocks: &[FoldedBlock]) -> Result<ResNet, String> {
    let bottleneck = blocks.first().is_some_and(|b| b.convs.len() == 3);
    let same = blocks.iter().all(|b| (b.convs.len() == 3) == bottleneck);
    let total = blocks.len();
    [
        ResNet::R18,
        ResNet::R34,
        ResNet::R50,
        ResNet::R101,
        ResNet::R152,
    ]
    .into_iter()
    .find(|m| same && m.bottleneck() == bottleneck && m.blocks().iter().sum::<usize>() == total)
    .ok_or_else(|| {
        format!(
            "{total} {} blocks: not one of torchvision's ResNet-18, 34, 50, 101 or 152",
            if bottleneck { "bottleneck" } else { "basic" }
        )
    })
}

/// Every convolution and the classifier against the shapes torchvision's model has.
fn check_shapes(m: &FoldedResNet) -> Result<(), String> {
    let spec: HashMap<String, Vec<usize>> = m
        .model
        .state_dict(m.num_classes)
        .into_iter()
        .map(|p| (p.name, p.shape))
        .collect();
    let check = |name: String, c: &FoldedConv| -> Result<(), String> {
        let got = vec![c.out_ch, c.in_ch, c.kernel, c.kernel];
        match spec.get(&name) {
            Some(want) if *want == got => Ok(()),
            Some(want) => Err(format!(
                "{name}: {got:?} where {} has {want:?}",
                m.model.name()
            )),
            None => Err(format!(
                "{name}: {} has no such convolution",
                m.model.name()
            )),
        }
    };
    check("conv1.weight".into(), &m.stem)?;
    let stages = m.model.blocks();
    for (i, block) in m.blocks.iter().enumerate() {
        let name = block_name(&stages, i);
        for (j, c) in block.convs.iter().enumerate() {
            check(format!("{name}.conv{}.weight", j + 1), c)?;
        }
        match (
            &block.downsample,
            spec.contains_key(&format!("{name}.downsample.0.weight")),
        ) {
            (Some(d), _) => check(format!("{name}.downsample.0.weight"), d)?,
            (None, true) => return Err(format!("{name}: the projection is missing")),
            (None, false) => {}
        }
    }
    match spec.get("fc.weight") {
        Some(want) if want[..] == [m.num_classes, m.fc_weight.len() / m.num_classes.max(1)] => {
            Ok(())
        }
        _ => Err("the classifier's shape is not torchvision's".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::passes::optimize;
    use crate::graph::resnet::resnet_graph;
    use crate::onnx::{export_resnet, import_bytes, ImportOptions};
    use crate::weights::seeded_init;
    use gpukit_tensor::random::fresh_seed;

    fn folded(model: ResNet, seed: u64) -> FoldedResNet {
        crate::forward::fold(&seeded_init(model, 10, seed, true)).unwrap()
    }

    #[test]
    fn a_resnet_reads_back_as_the_same_weights_from_its_graph_and_its_onnx_export() {
        let seed = fresh_seed();
        for model in [ResNet::R18, ResNet::R34, ResNet::R50] {
            let want = folded(model, seed);
            let mut graph = resnet_graph(&want, 2, 64, 64).unwrap();
            // the projection after the main path (as torchvision's export orders a block): the
            // passes fuse the sum into the main path's last convolution; in resnet_graph's
            // order (the projection first) they fuse it into the projection
            let mut late = resnet_graph(&want, 2, 64, 64).unwrap();
            while let Some(i) = late.nodes.iter().enumerate().position(|(i, n)| {
                n.name.ends_with(".downsample.0")
                    && late
                        .nodes
                        .get(i + 1)
                        .is_some_and(|m| !m.name.ends_with(".add"))
            }) {
                let node = late.nodes.remove(i);
                let block = node.name.trim_end_matches(".downsample.0").to_string();
                let add = late
                    .nodes
                    .iter()
                    .position(|n| n.name == format!("{block}.add"))
                    .unwrap();
                late.nodes.insert(add, node);
            }
            late.check().unwrap();
            for g in [&mut graph, &mut late] {
                optimize(g).unwrap();
                assert_eq!(as_resnet(g).unwrap(), want, "{model:?} (seed {seed})");
            }
            let fused_projection = |g: &Graph| {
                g.nodes.iter().any(|n| {
                    n.name.ends_with(".downsample.0")
                        && matches!(&n.op, Op::Conv(c) if c.epilogue.residual)
                })
            };
            assert!(
                fused_projection(&graph) && !fused_projection(&late),
                "{model:?}"
            );
            // gpukit's own ONNX export, imported and optimized, is the same model again
            let options = ImportOptions {
                batch: Some(2),
                dims: vec![("height".into(), 64), ("width".into(), 64)],
            };
            let mut imported = import_bytes(&export_resnet(&want), &options).unwrap();
            optimize(&mut imported).unwrap();
            assert_eq!(as_resnet(&imported).unwrap(), want, "{model:?} via ONNX");
        }
    }

    #[test]
    fn other_graphs_are_refused_with_where_they_differ() {
        let seed = fresh_seed();
        // fixtures that are not ResNets: each refused, none panics
        for fixture in crate::onnx::fixtures::all(seed) {
            let Ok(mut g) = crate::onnx::import_model(
                &fixture.model,
                None,
                "fixture",
                &ImportOptions::default(),
            ) else {
                continue;
            };
            optimize(&mut g).unwrap();
            let why = as_resnet(&g).expect_err(fixture.name);
            assert!(!why.is_empty());
        }
        // a ResNet with one block cut out is no torchvision ResNet
        let mut m = folded(ResNet::R18, seed);
        m.blocks.remove(1);
        let mut g = resnet_graph(&m, 1, 64, 64).unwrap();
        optimize(&mut g).unwrap();
        let why = as_resnet(&g).unwrap_err();
        assert!(why.contains("7 basic blocks"), "{why}");
        // a stem padded otherwise than torchvision's
        let mut m = folded(ResNet::R18, seed);
        m.stem.pad = 2;
        let mut g = resnet_graph(&m, 1, 64, 64).unwrap();
        optimize(&mut g).unwrap();
        assert!(as_resnet(&g).unwrap_err().contains("stem"));
    }
}
