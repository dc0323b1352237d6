//! Writes a folded ResNet as an ONNX model (opset 17), so ONNX Runtime runs the very weights
//! gpukit runs.

use super::proto::{
    attribute_type, data_type, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto,
};
use crate::forward::{FoldedConv, FoldedResNet};
use prost::Message;

/// `AttributeProto.AttributeType`: INT.
const ATTRIBUTE_INT: i32 = attribute_type::INT;
/// `AttributeProto.AttributeType`: INTS.
const ATTRIBUTE_INTS: i32 = attribute_type::INTS;
/// `TensorProto.DataType`: FLOAT.
const FLOAT: i32 = data_type::FLOAT;

fn attr_ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: None,
        ints: values.to_vec(),
        r#type: ATTRIBUTE_INTS,
        ..AttributeProto::default()
    }
}

fn attr_int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: Some(value),
        ints: Vec::new(),
        r#type: ATTRIBUTE_INT,
        ..AttributeProto::default()
    }
}

fn node(inputs: &[&str], output: &str, op: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: output.into(),
        op_type: op.into(),
        attribute,
        domain: String::new(),
    }
}

/// A float tensor's values as raw data.
fn initializer(name: &str, dims: &[usize], values: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: FLOAT,
        name: name.into(),
        raw_data: gpukit_tensor::codec::bytes_of(values).to_vec(),
        ..TensorProto::default()
    }
}

/// A float tensor's name and shape, its dims numbers or named (symbolic) sizes.
fn value_info(name: &str, dims: &[Result<usize, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Ok(v) => Dimension {
                dim_value: Some(*v as i64),
                dim_param: None,
            },
            Err(param) => Dimension {
                dim_value: None,
                dim_param: Some(param.to_string()),
            },
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: FLOAT,
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

/// Builds the graph's nodes and initializers as it goes.
struct Graph {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
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
        let (k, p, s) = (c.kernel as i64, c.pad as i64, c.stride as i64);
        let mut out = self.fresh(name);
        self.nodes.push(node(
            &[x, &w, &b],
            &out,
            "Conv",
            vec![
                attr_ints("kernel_shape", &[k, k]),
                attr_ints("strides", &[s, s]),
                attr_ints("pads", &[p, p, p, p]),
            ],
        ));
        if let Some(r) = residual {
            let sum = self.fresh("add");
            self.nodes.push(node(&[&out, r], &sum, "Add", Vec::new()));
            out = sum;
        }
        if relu {
            let r = self.fresh("relu");
            self.nodes.push(node(&[&out], &r, "Relu", Vec::new()));
            out = r;
        }
        out
    }
}

/// The ONNX model of `model`: input `input` [batch, 3, height, width] (symbolic sizes), output
/// `logits` [batch, classes]. Batch norm is already folded, so the graph is Conv/Add/Relu,
/// MaxPool, GlobalAveragePool, Flatten and Gemm.
pub fn export_model(model: &FoldedResNet) -> ModelProto {
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
        vec![
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
            let residual = (j == last).then_some(identity.as_str());
            y = g.conv(&name, conv, &y, residual, true);
        }
        x = y;
    }
    let gap = g.fresh("avgpool");
    g.nodes
        .push(node(&[&x], &gap, "GlobalAveragePool", Vec::new()));
    let flat = g.fresh("flatten");
    g.nodes
        .push(node(&[&gap], &flat, "Flatten", vec![attr_int("axis", 1)]));
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
        vec![attr_int("transB", 1)],
    ));
    ModelProto {
        ir_version: 8, // ONNX 1.10+
        producer_name: "gpukit".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        graph: Some(GraphProto {
            node: g.nodes,
            name: model.model.name().into(),
            initializer: g.inits,
            input: vec![value_info(
                "input",
                &[Err("batch"), Ok(3), Err("height"), Err("width")],
            )],
            output: vec![value_info("logits", &[Err("batch"), Ok(model.num_classes)])],
            value_info: Vec::new(),
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
    }
}

/// [`export_model`], encoded as the bytes of a `.onnx` file.
pub fn export_resnet(model: &FoldedResNet) -> Vec<u8> {
    export_model(model).encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_decodes_to_the_graph_with_every_weight_once() {
        let dict = crate::weights::seeded_init(crate::ResNet::R18, 10, 1, true);
        let folded = crate::forward::fold(&dict).unwrap();
        let bytes = export_resnet(&folded);
        let m = ModelProto::decode(bytes.as_slice()).unwrap();
        assert_eq!(m, export_model(&folded));
        assert_eq!((m.ir_version, m.opset_import[0].version), (8, 17));
        let g = m.graph.unwrap();
        let convs = 1 + folded
            .blocks
            .iter()
            .map(|b| b.convs.len() + usize::from(b.downsample.is_some()))
            .sum::<usize>();
        let count = |op: &str| g.node.iter().filter(|n| n.op_type == op).count();
        assert_eq!(count("Conv"), convs);
        assert_eq!(count("Add"), folded.blocks.len());
        assert_eq!((count("MaxPool"), count("Gemm")), (1, 1));
        // each weight once, as raw f32
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
        let raw: usize = g.initializer.iter().map(|t| t.raw_data.len()).sum();
        assert_eq!(raw, weights * 4);
        let stem = &g.initializer[0];
        assert_eq!(
            (stem.name.as_str(), stem.dims.as_slice()),
            ("conv1.weight", &[64, 3, 7, 7][..])
        );
        assert_eq!(
            gpukit_tensor::codec::decode_f32(&stem.raw_data, gpukit_tensor::DType::F32),
            folded.stem.weight
        );
        let input = &g.input[0]
            .r#type
            .as_ref()
            .unwrap()
            .tensor_type
            .as_ref()
            .unwrap();
        let dims = &input.shape.as_ref().unwrap().dim;
        assert_eq!(dims[0].dim_param.as_deref(), Some("batch"));
        assert_eq!(dims[1].dim_value, Some(3));
        assert_eq!(g.output[0].name, "logits");
    }

    #[test]
    fn repeated_ints_are_written_unpacked_as_proto2_does() {
        let a = attr_ints("pads", &[1, 2]).encode_to_vec();
        // name (field 1), then 8:varint 1 and 8:varint 2, then type (field 20) = 7
        assert_eq!(
            a,
            [0x0A, 4, b'p', b'a', b'd', b's', 0x40, 1, 0x40, 2, 0xA0, 0x01, 7]
        );
    }
}
