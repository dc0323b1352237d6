//! A small writer of ONNX models, for tests and fixtures: inputs, weights (raw f32, or seeded
//! random ones), i64 constants, nodes with their attributes, outputs.
//!
//! To use:
//! 1. `let mut m = ModelBuilder::new(17, seed);`
//! 2. `let x = m.input("input", &[Dim::Named("batch"), Dim::Fixed(3), ...]);`
//! 3. `let y = m.node("Relu", &[&x], vec![]);` (each node's output gets a fresh name);
//! 4. `m.output(&y); let bytes = m.bytes();`

use super::proto::{
    attribute_type, data_type, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

/// One dimension of a graph input or output.
#[derive(Debug, Clone, Copy)]
pub enum Dim<'a> {
    Fixed(usize),
    /// A symbolic size (`dim_param`), such as "batch".
    Named(&'a str),
}

/// An INT attribute.
pub fn attr_int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: Some(value),
        r#type: attribute_type::INT,
        ..AttributeProto::default()
    }
}

/// An INTS attribute.
pub fn attr_ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: values.to_vec(),
        r#type: attribute_type::INTS,
        ..AttributeProto::default()
    }
}

/// A FLOAT attribute.
pub fn attr_float(name: &str, value: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f: Some(value),
        r#type: attribute_type::FLOAT,
        ..AttributeProto::default()
    }
}

/// A STRING attribute.
pub fn attr_string(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: Some(value.as_bytes().to_vec()),
        r#type: attribute_type::STRING,
        ..AttributeProto::default()
    }
}

/// A TENSOR attribute.
pub fn attr_tensor(name: &str, value: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        t: Some(value),
        r#type: attribute_type::TENSOR,
        ..AttributeProto::default()
    }
}

/// An f32 tensor with its values as raw little-endian data.
pub fn f32_tensor(name: &str, dims: &[usize], values: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: data_type::FLOAT,
        name: name.into(),
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..TensorProto::default()
    }
}

/// An i64 tensor with its values in `int64_data`.
pub fn i64_tensor(name: &str, dims: &[usize], values: &[i64]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: data_type::INT64,
        name: name.into(),
        int64_data: values.to_vec(),
        ..TensorProto::default()
    }
}

fn value_info(name: &str, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(v) => Dimension {
                dim_value: Some(*v as i64),
                dim_param: None,
            },
            Dim::Named(p) => Dimension {
                dim_value: None,
                dim_param: Some(p.to_string()),
            },
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

/// Builds a ModelProto node by node.
#[derive(Debug, Clone)]
pub struct ModelBuilder {
    graph: GraphProto,
    opset: i64,
    count: usize,
    seed: u64,
}

impl ModelBuilder {
    /// An empty model of default-domain opset `opset`; `seed` draws its random weights.
    pub fn new(opset: i64, seed: u64) -> Self {
        ModelBuilder {
            graph: GraphProto {
                name: "gpukit-fixture".into(),
                ..GraphProto::default()
            },
            opset,
            count: 0,
            seed,
        }
    }

    /// A fresh name from `base`.
    pub fn fresh(&mut self, base: &str) -> String {
        self.count += 1;
        format!("{base}_{}", self.count)
    }

    /// Adds an f32 graph input.
    pub fn input(&mut self, name: &str, dims: &[Dim]) -> String {
        self.graph.input.push(value_info(name, dims));
        name.to_string()
    }

    /// Adds an initializer and returns its name.
    pub fn initializer(&mut self, tensor: TensorProto) -> String {
        let name = tensor.name.clone();
        self.graph.initializer.push(tensor);
        name
    }

    /// Adds an f32 weight of `values` under a fresh name from `base`.
    pub fn weight(&mut self, base: &str, dims: &[usize], values: &[f32]) -> String {
        let name = self.fresh(base);
        self.initializer(f32_tensor(&name, dims, values))
    }

    /// Adds a weight of uniform values in `[center - scale, center + scale)`.
    pub fn random(&mut self, base: &str, dims: &[usize], center: f32, scale: f32) -> String {
        self.count += 1;
        let count = dims.iter().product();
        let values: Vec<f32> = gpukit_tensor::random::uniform_f32(
            count,
            self.seed ^ (self.count as u64 * 0x9E37_79B9),
        )
        .into_iter()
        .map(|v| center + scale * v)
        .collect();
        self.weight(base, dims, &values)
    }

    /// Adds an i64 initializer under a fresh name from `base`.
    pub fn ints(&mut self, base: &str, dims: &[usize], values: &[i64]) -> String {
        let name = self.fresh(base);
        self.initializer(i64_tensor(&name, dims, values))
    }

    /// Adds a node of `op` and returns its (one) output's name.
    pub fn node(&mut self, op: &str, inputs: &[&str], attribute: Vec<AttributeProto>) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.graph.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.clone()],
            name: format!("{out}_node"),
            op_type: op.into(),
            attribute,
            domain: String::new(),
        });
        out
    }

    /// Marks `name` as a graph output of `dims`.
    pub fn output(&mut self, name: &str, dims: &[Dim]) {
        self.graph.output.push(value_info(name, dims));
    }

    /// Renames the value `from` (a node output) to `to` everywhere, e.g. to give the final
    /// output a fixed name.
    pub fn rename(&mut self, from: &str, to: &str) {
        for n in &mut self.graph.node {
            for s in n.input.iter_mut().chain(n.output.iter_mut()) {
                if s == from {
                    *s = to.to_string();
                }
            }
        }
    }

    /// The model.
    pub fn model(self) -> ModelProto {
        ModelProto {
            ir_version: 8,
            producer_name: "gpukit-tests".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            graph: Some(self.graph),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: self.opset,
            }],
        }
    }

    /// The model's bytes.
    pub fn bytes(self) -> Vec<u8> {
        self.model().encode_to_vec()
    }
}
