//! Each pass on its own: what it rewrites (counted by operator), and the graph's outputs
//! before and after on random inputs from a fresh seed.

use super::*;
use crate::graph::{
    forward_cpu, Activation, Array, Binary, DType, Data, GraphBuilder, Op, Pattern,
};
use crate::onnx::{fixtures, import_model, ImportOptions};
use gpukit_tensor::random::{fresh_seed, uniform_f32};

fn import(model: &crate::onnx::ModelProto) -> Graph {
    let options = ImportOptions {
        batch: Some(2),
        dims: Vec::new(),
    };
    import_model(model, None, "fixture", &options).unwrap()
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| pred(&n.op)).count()
}

/// The outputs of `before` and `after` on the same random inputs, within `tol` (relative L2).
fn assert_same_outputs(before: &Graph, after: &Graph, tol: f64, what: &str) {
    after.check().unwrap_or_else(|e| panic!("{what}: {e}"));
    let seed = fresh_seed();
    let inputs: Vec<Array> = before
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let shape = &before.values[v].shape;
            Array::f32(shape, uniform_f32(shape.iter().product(), seed ^ i as u64))
        })
        .collect();
    let a = forward_cpu(before, &inputs).unwrap();
    let b = forward_cpu(after, &inputs).unwrap();
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.shape, y.shape, "{what}");
        let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
        let num: f64 = x
            .iter()
            .zip(y)
            .map(|(p, q)| (f64::from(*p) - f64::from(*q)).powi(2))
            .sum();
        let den: f64 = x
            .iter()
            .map(|p| f64::from(*p).powi(2))
            .sum::<f64>()
            .max(1e-30);
        let rel = (num / den).sqrt();
        assert!(rel <= tol, "{what}: relative error {rel} (seed {seed})");
    }
}

#[test]
fn constant_folding_removes_torchs_flatten_chain_and_constant_nodes() {
    let before = import(&fixtures::torch_flatten(fresh_seed()));
    let shape_ops = |op: &Op| {
        matches!(
            op,
            Op::Shape { .. }
                | Op::Gather { .. }
                | Op::Unsqueeze { .. }
                | Op::Concat { .. }
                | Op::Constant { .. }
        )
    };
    assert_eq!(count(&before, shape_ops), 7);
    let mut after = before.clone();
    assert_eq!(fold_constants(&mut after).unwrap(), 7);
    assert_eq!(count(&after, shape_ops), 0);
    assert_eq!(count(&after, |o| *o == Op::Reshape), 1);
    assert_same_outputs(&before, &after, 0.0, "fold");
    // the Reshape's target is now a constant
    let reshape = after.nodes.iter().find(|n| n.op == Op::Reshape).unwrap();
    assert_eq!(
        after.values[reshape.inputs[1]].constant,
        Some(Data::I64(vec![2, -1]))
    );
}

#[test]
fn dead_nodes_and_unused_values_are_removed_and_ids_compacted() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![2, 3]).unwrap();
    let unused_weight = b.constant("w", vec![3], Data::F32(vec![1.0; 3])).unwrap();
    let dead = b
        .node("dead", Op::Binary(Binary::Add), &[x, unused_weight], &["d"])
        .unwrap()[0];
    let _dead2 = b
        .node("dead2", Op::Activation(Activation::Relu), &[dead], &["d2"])
        .unwrap();
    let y = b
        .node("live", Op::Activation(Activation::Sigmoid), &[x], &["y"])
        .unwrap()[0];
    b.output(y);
    let before = b.finish().unwrap();
    let mut after = before.clone();
    assert_eq!(eliminate_dead_nodes(&mut after), 2);
    assert_eq!(after.nodes.len(), 1);
    assert_eq!(
        after
            .values
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        ["x", "y"]
    );
    assert_same_outputs(&before, &after, 0.0, "dead");
}

#[test]
fn batch_norms_fold_into_the_convolution_before_them_only() {
    let before = import(&fixtures::tiny_resnet(fresh_seed()));
    let bn = |op: &Op| matches!(op, Op::BatchNorm { .. });
    assert_eq!(count(&before, bn), 6);
    let mut after = before.clone();
    assert_eq!(fold_batch_norms(&mut after), 6);
    assert_eq!(count(&after, bn), 0);
    assert_same_outputs(&before, &after, 1e-5, "batch norm, ResNet");
    // DenseNet: the first convolution also feeds a Concat, and five batch norms follow a
    // Concat or a pooling, so only the three after a convolution of their own fold
    let before = import(&fixtures::densenet(fresh_seed()));
    let mut after = before.clone();
    assert_eq!(count(&before, bn), 8);
    assert_eq!(fold_batch_norms(&mut after), 3);
    assert_same_outputs(&before, &after, 1e-5, "batch norm, DenseNet");
}

/// `x` through GELU's erf chain, the product grouped as `grouping` says.
fn gelu_graph(grouping: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![4, 5]).unwrap();
    let c =
        |b: &mut GraphBuilder, n: &str, v: f32| b.constant(n, vec![1], Data::F32(vec![v])).unwrap();
    let (one, half) = (c(&mut b, "one", 1.0), c(&mut b, "half", 0.5));
    let mul = Op::Binary(Binary::Mul);
    let u = if grouping == 1 {
        let r = c(&mut b, "rsqrt2", std::f32::consts::FRAC_1_SQRT_2);
        b.node("scale", mul.clone(), &[r, x], &["u"]).unwrap()[0]
    } else {
        let s = c(&mut b, "sqrt2", std::f32::consts::SQRT_2);
        b.node("scale", Op::Binary(Binary::Div), &[x, s], &["u"])
            .unwrap()[0]
    };
    let e = b.node("erf", Op::Erf, &[u], &["e"]).unwrap()[0];
    let s = b
        .node("plus1", Op::Binary(Binary::Add), &[one, e], &["s"])
        .unwrap()[0];
    let y = match grouping {
        0 => {
            let m = b.node("m1", mul.clone(), &[x, s], &["m"]).unwrap()[0];
            b.node("m2", mul, &[m, half], &["y"]).unwrap()[0]
        }
        1 => {
            let h = b.node("h", mul.clone(), &[half, x], &["h"]).unwrap()[0];
            b.node("m", mul, &[s, h], &["y"]).unwrap()[0]
        }
        _ => {
            let m = b.node("m1", mul.clone(), &[s, half], &["m"]).unwrap()[0];
            b.node("m2", mul, &[x, m], &["y"]).unwrap()[0]
        }
    };
    b.output(y);
    b.finish().unwrap()
}

#[test]
fn gelu_chains_become_one_operator_in_every_grouping() {
    for grouping in 0..3 {
        let before = gelu_graph(grouping);
        let mut after = before.clone();
        assert_eq!(recognize_gelu(&mut after), 1, "grouping {grouping}");
        eliminate_dead_nodes(&mut after);
        assert_eq!(after.nodes.len(), 1, "grouping {grouping}");
        assert_eq!(after.nodes[0].op, Op::Activation(Activation::Gelu));
        assert_same_outputs(&before, &after, 1e-6, &format!("gelu grouping {grouping}"));
    }
    let before = import(&fixtures::convnext(fresh_seed()));
    let mut after = before.clone();
    assert_eq!(recognize_gelu(&mut after), 1);
    eliminate_dead_nodes(&mut after);
    assert_eq!(count(&after, |o| *o == Op::Erf), 0);
    assert_same_outputs(&before, &after, 1e-5, "gelu, ConvNeXt");
    // a chain with another constant is left alone
    let mut other = gelu_graph(0);
    let half = other.values.iter().position(|v| v.name == "half").unwrap();
    other.values[half].constant = Some(Data::F32(vec![0.25]));
    assert_eq!(recognize_gelu(&mut other), 0);
}

#[test]
fn activations_and_residuals_fuse_into_the_convolution_epilogue() {
    let before = import(&fixtures::tiny_resnet(fresh_seed()));
    let mut after = before.clone();
    fold_batch_norms(&mut after);
    // 3 ReLUs right after a convolution, 2 residual Adds, the 2 ReLUs after those
    assert_eq!(fuse_conv_epilogues(&mut after), 7);
    assert_eq!(
        count(&after, |o| matches!(o, Op::Activation(_) | Op::Binary(_))),
        0
    );
    let residual = after.nodes.iter().filter(|n| matches!(&n.op, Op::Conv(c) if c.epilogue.residual && c.epilogue.activation == Some(Activation::Relu))).count();
    assert_eq!(residual, 2);
    assert_same_outputs(&before, &after, 1e-5, "epilogues, ResNet");
    // MobileNetV3: HardSwish, ReLU and HardSigmoid fuse; the residual Add has no convolution
    // of a single reader before it on the identity side, but the projection's side fuses
    let before = import(&fixtures::mobilenet_v3_block(fresh_seed()));
    let mut after = before.clone();
    fold_batch_norms(&mut after);
    assert!(fuse_conv_epilogues(&mut after) >= 10);
    assert_same_outputs(&before, &after, 1e-5, "epilogues, MobileNetV3");
}

#[test]
fn squeeze_excitation_blocks_are_recognised_before_and_after_fusion() {
    for (fixture, blocks, gate) in [
        (fixtures::mobilenet_v3_block(fresh_seed()), 2, "HardSigmoid"),
        (fixtures::efficientnet_se(fresh_seed()), 1, "Sigmoid"),
        (fixtures::tiny_resnet(fresh_seed()), 0, ""),
    ] {
        let mut g = import(&fixture);
        assert_eq!(annotate_squeeze_excite(&mut g), blocks);
        let mut optimized = g.clone();
        assert_eq!(optimize(&mut optimized).unwrap().squeeze_excites, blocks);
        for p in &optimized.patterns {
            let Pattern::SqueezeExcite(se) = p;
            assert_eq!(se.gate_activation.name(), gate);
            let (x, gv) = (&optimized.values[se.input], &optimized.values[se.gate]);
            assert_eq!(gv.shape, [x.shape[0], x.shape[1], 1, 1]);
        }
        assert_same_outputs(&g, &optimized, 1e-5, "squeeze-excitation");
    }
}

#[test]
fn optimize_keeps_every_fixtures_outputs() {
    let seed = fresh_seed();
    for f in fixtures::all(seed) {
        let before = import(&f.model);
        let mut after = before.clone();
        let stats = optimize(&mut after).unwrap();
        assert!(
            after.nodes.len() < before.nodes.len(),
            "{}: {stats:?}",
            f.name
        );
        assert_eq!(
            count(&after, |o| matches!(
                o,
                Op::Constant { .. } | Op::Shape { .. }
            )),
            0,
            "{}",
            f.name
        );
        assert_same_outputs(&before, &after, 1e-5, f.name);
    }
}

#[test]
fn x_times_its_sigmoid_becomes_one_silu_and_gates_stay() {
    let before = import(&fixtures::efficientnet_se(fresh_seed()));
    let sigmoids = |g: &Graph| count(g, |o| *o == Op::Activation(Activation::Sigmoid));
    let mut after = before.clone();
    // the stem's, the depthwise convolution's and the squeeze's SiLU; the gate's sigmoid
    // multiplies another value
    assert_eq!(recognize_silu(&mut after), 3);
    assert_eq!(sigmoids(&after), 1);
    assert_eq!(count(&after, |o| *o == Op::Activation(Activation::Silu)), 3);
    assert_same_outputs(&before, &after, 1e-6, "silu, EfficientNet");
    // a sigmoid read twice stays: the Mul is not its only reader
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![2, 3]).unwrap();
    let s = b
        .node("s", Op::Activation(Activation::Sigmoid), &[x], &["s"])
        .unwrap()[0];
    let m = b
        .node("m", Op::Binary(Binary::Mul), &[x, s], &["m"])
        .unwrap()[0];
    b.output(m);
    b.output(s);
    let mut g = b.finish().unwrap();
    assert_eq!(recognize_silu(&mut g), 0);
    // and the whole pipeline fuses the SiLUs into their convolutions
    let mut all = before.clone();
    let stats = optimize(&mut all).unwrap();
    assert_eq!(stats.silus, 3);
    assert_eq!(count(&all, |o| *o == Op::Activation(Activation::Silu)), 0);
    assert_same_outputs(&before, &all, 1e-5, "optimized EfficientNet");
}
