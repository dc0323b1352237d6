//! Writes a folded ResNet as an ONNX model (opset 17), so ONNX Runtime runs the very weights
//! gpukit runs. The few protobuf messages ONNX needs are encoded by hand: the format is small
//! (varints and length-prefixed fields) and a protobuf code generator would be a build step.

use crate::forward::{FoldedConv, FoldedResNet};

/// Protobuf wire types.
const VARINT: u64 = 0;
const LEN: u64 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u64, wire: u64) {
    varint(out, (field << 3) | wire);
}

fn int(out: &mut Vec<u8>, field: u64, v: i64) {
    key(out, field, VARINT);
    varint(out, v as u64);
}

fn bytes(out: &mut Vec<u8>, field: u64, data: &[u8]) {
    key(out, field, LEN);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn string(out: &mut Vec<u8>, field: u64, s: &str) {
    bytes(out, field, s.as_bytes());
}

/// ONNX AttributeProto with a list of ints (type INTS = 7).
fn attr_ints(name: &str, values: &[i64]) -> Vec<u8> {
    let mut a = Vec::new();
    string(&mut a, 1, name);
    for &v in values {
        int(&mut a, 8, v);
    }
    int(&mut a, 20, 7);
    a
}

/// ONNX AttributeProto with one int (type INT = 2).
fn attr_int(name: &str, value: i64) -> Vec<u8> {
    let mut a = Vec::new();
    string(&mut a, 1, name);
    int(&mut a, 3, value);
    int(&mut a, 20, 2);
    a
}

fn node(inputs: &[&str], output: &str, op: &str, attrs: &[Vec<u8>]) -> Vec<u8> {
    let mut n = Vec::new();
    for i in inputs {
        string(&mut n, 1, i);
    }
    string(&mut n, 2, output);
    string(&mut n, 3, output);
    string(&mut n, 4, op);
    for a in attrs {
        bytes(&mut n, 5, a);
    }
    n
}

/// TensorProto holding f32 values (data_type FLOAT = 1) as little-endian raw data.
fn initializer(name: &str, dims: &[usize], values: &[f32]) -> Vec<u8> {
    let mut t = Vec::new();
    for &d in dims {
        int(&mut t, 1, d as i64);
    }
    int(&mut t, 2, 1);
    string(&mut t, 8, name);
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    bytes(&mut t, 9, &raw);
    t
}

/// ValueInfoProto of a float tensor whose dims are numbers or named (symbolic) sizes.
fn value_info(name: &str, dims: &[Result<usize, &str>]) -> Vec<u8> {
    let mut shape = Vec::new();
    for d in dims {
        let mut dim = Vec::new();
        match d {
            Ok(v) => int(&mut dim, 1, *v as i64),
            Err(param) => string(&mut dim, 2, param),
        }
        bytes(&mut shape, 1, &dim);
    }
    let mut tensor = Vec::new();
    int(&mut tensor, 1, 1);
    bytes(&mut tensor, 2, &shape);
    let mut ty = Vec::new();
    bytes(&mut ty, 1, &tensor);
    let mut vi = Vec::new();
    string(&mut vi, 1, name);
    bytes(&mut vi, 2, &ty);
    vi
}

/// Builds the graph's nodes and initializers as it goes.
struct Graph {
    nodes: Vec<Vec<u8>>,
    inits: Vec<Vec<u8>>,
    count: usize,
}

impl Graph {
    fn fresh(&mut self, what: &str) -> String {
        self.count += 1;
        format!("{what}_{}", self.count)
    }

    /// conv(x) + bias, then Add(residual) and ReLU where asked; returns the output's name.
    fn conv(
        &mut self,
        name: &str,
        c: &FoldedConv,
        x: &str,
        residual: Option<&str>,
        relu: bool,
    ) -> String {
        let (w, b) = (format!("{name}.weight"), format!("{name}.bias"));
        self.inits.push(initializer(
            &w,
            &[c.out_ch, c.in_ch, c.kernel, c.kernel],
            &c.weight,
        ));
        self.inits.push(initializer(&b, &[c.out_ch], &c.bias));
        let k = c.kernel as i64;
        let p = c.pad as i64;
        let s = c.stride as i64;
        let mut out = self.fresh(name);
        self.nodes.push(node(
            &[x, &w, &b],
            &out,
            "Conv",
            &[
                attr_ints("kernel_shape", &[k, k]),
                attr_ints("strides", &[s, s]),
                attr_ints("pads", &[p, p, p, p]),
            ],
        ));
        if let Some(r) = residual {
            let sum = self.fresh("add");
            self.nodes.push(node(&[&out, r], &sum, "Add", &[]));
            out = sum;
        }
        if relu {
            let r = self.fresh("relu");
            self.nodes.push(node(&[&out], &r, "Relu", &[]));
            out = r;
        }
        out
    }
}

/// The ONNX model of `model`: input `input` [batch, 3, height, width] (symbolic sizes), output
/// `logits` [batch, classes]. Batch norm is already folded, so the graph is Conv/Add/Relu,
/// MaxPool, GlobalAveragePool, Flatten and Gemm.
pub fn export_resnet(model: &FoldedResNet) -> Vec<u8> {
    let mut g = Graph {
        nodes: Vec::new(),
        inits: Vec::new(),
        count: 0,
    };
    let stem = g.conv("conv1", &model.stem, "input", None, true);
    let pooled = g.fresh("maxpool");
    g.nodes.push(node(
        &[&stem],
        &pooled,
        "MaxPool",
        &[
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("strides", &[2, 2]),
            attr_ints("pads", &[1, 1, 1, 1]),
        ],
    ));
    let mut x = pooled;
    for (i, block) in model.blocks.iter().enumerate() {
        let identity = match &block.downsample {
            Some(d) => g.conv(&format!("block{i}.downsample"), d, &x, None, false),
            None => x.clone(),
        };
        let last = block.convs.len() - 1;
        let mut y = x.clone();
        for (j, conv) in block.convs.iter().enumerate() {
            let name = format!("block{i}.conv{}", j + 1);
            y = if j == last {
                g.conv(&name, conv, &y, Some(&identity), true)
            } else {
                g.conv(&name, conv, &y, None, true)
            };
        }
        x = y;
    }
    let gap = g.fresh("avgpool");
    g.nodes.push(node(&[&x], &gap, "GlobalAveragePool", &[]));
    let flat = g.fresh("flatten");
    g.nodes
        .push(node(&[&gap], &flat, "Flatten", &[attr_int("axis", 1)]));
    let features = model.fc_weight.len() / model.num_classes.max(1);
    g.inits.push(initializer(
        "fc.weight",
        &[model.num_classes, features],
        &model.fc_weight,
    ));
    g.inits
        .push(initializer("fc.bias", &[model.num_classes], &model.fc_bias));
    g.nodes.push(node(
        &[&flat, "fc.weight", "fc.bias"],
        "logits",
        "Gemm",
        &[attr_int("transB", 1)],
    ));

    let mut graph = Vec::new();
    for n in &g.nodes {
        bytes(&mut graph, 1, n);
    }
    string(&mut graph, 2, model.model.name());
    for t in &g.inits {
        bytes(&mut graph, 5, t);
    }
    bytes(
        &mut graph,
        11,
        &value_info("input", &[Err("batch"), Ok(3), Err("height"), Err("width")]),
    );
    bytes(
        &mut graph,
        12,
        &value_info("logits", &[Err("batch"), Ok(model.num_classes)]),
    );

    let mut m = Vec::new();
    int(&mut m, 1, 8); // ir_version 8 (ONNX 1.10+)
    string(&mut m, 2, "gpukit");
    string(&mut m, 3, env!("CARGO_PKG_VERSION"));
    bytes(&mut m, 7, &graph);
    let mut opset = Vec::new();
    string(&mut opset, 1, "");
    int(&mut opset, 2, 17);
    bytes(&mut m, 8, &opset);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_encode_like_protobuf() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        let mut k = Vec::new();
        key(&mut k, 11, LEN);
        assert_eq!(k, [0x5A]);
        let mut n = Vec::new();
        int(&mut n, 1, -1);
        assert_eq!(n.len(), 11, "negative int64 takes ten varint bytes");
    }

    #[test]
    fn export_has_every_weight_once() {
        let dict = crate::weights::seeded_init(crate::ResNet::R18, 10, 1, true);
        let folded = crate::forward::fold(&dict).unwrap();
        let bytes = export_resnet(&folded);
        let weights: usize = folded.stem.weight.len()
            + folded.stem.bias.len()
            + folded
                .blocks
                .iter()
                .flat_map(|b| b.convs.iter().chain(b.downsample.iter()))
                .map(|c| c.weight.len() + c.bias.len())
                .sum::<usize>()
            + folded.fc_weight.len()
            + folded.fc_bias.len();
        // raw data dominates: the file holds each weight once, plus a small graph
        assert!(
            bytes.len() >= weights * 4 && bytes.len() < weights * 4 + 64 * 1024,
            "{}",
            bytes.len()
        );
        let text = String::from_utf8_lossy(&bytes);
        for op in [
            "Conv",
            "MaxPool",
            "GlobalAveragePool",
            "Gemm",
            "logits",
            "batch",
        ] {
            assert!(text.contains(op), "{op}");
        }
    }
}
