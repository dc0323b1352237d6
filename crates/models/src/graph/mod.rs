//! gpukit's general inference graph: values with static shapes (NCHW for images; layout is a
//! backend's choice) and an element type, nodes with a typed operator, weights as constants.
//! The ONNX importer builds it, the passes rewrite it, the CPU interpreter runs it, and a GPU
//! backend lowers it.
//!
//! To use:
//! 1. build a graph with [`GraphBuilder`] (inputs, constants, nodes: each node's output shapes
//!    are inferred as it is added), or import one with `crate::onnx::import_bytes`;
//! 2. optimize it with [`passes::optimize`] (constant folding, batch norm folding, GELU, conv
//!    epilogues, squeeze-excitation, dead nodes), or with the passes one by one;
//! 3. run it with [`forward_cpu`] (or [`forward_cpu_f64`], the same computation in f64).
//!
//! The parts: `op` (the operators), `infer` (shape inference), `builder` (the builder and
//! the graph check), `cpu` (the interpreter, in f32 or f64, one file per operator family),
//! `passes`, `resnet` (gpukit's ResNet as a graph).

mod builder;
pub mod cpu;
pub mod fp8;
mod infer;
pub mod op;
pub mod passes;
pub mod recognize;
pub mod resnet;

/// An output's type and shape.
pub(crate) type OutType = (DType, Vec<usize>);

pub use crate::error::GraphError;
pub use builder::GraphBuilder;
pub use cpu::{
    exact_convolutions, forward_cpu, forward_cpu_exact, forward_cpu_f64, forward_cpu_f64_rounded,
    last_uses, Array, ArrayF64,
};
pub use infer::MAX_ELEMENTS;
pub use op::{Activation, Binary, Conv, Epilogue, Gemm, Op, Pool};

/// A value's index in [`Graph::values`].
pub type ValueId = usize;

/// The element types a value can have: f32 for data, i64 for shapes and indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    I64,
}

/// The elements of a tensor, row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Data {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::I64(_) => DType::I64,
        }
    }

    /// The element count.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The f32 elements, if that is the type.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Data::F32(v) => Some(v),
            Data::I64(_) => None,
        }
    }

    /// The i64 elements, if that is the type.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self {
            Data::I64(v) => Some(v),
            Data::F32(_) => None,
        }
    }
}

/// One value of the graph: a graph input, a constant (weights) or a node's output.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// The name it had in the model (unique within a graph).
    pub name: String,
    pub dtype: DType,
    /// Static, every dimension known.
    pub shape: Vec<usize>,
    /// The elements, for a constant.
    pub constant: Option<Data>,
}

/// One operation: reads `inputs`, writes `outputs` (value ids).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The model's node name (unique within a graph; made up where the model had none).
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A squeeze-and-excitation block: `output = input * gate(conv(act(conv(gap(input)))))`, the
/// values at each step, for a backend that runs it as one kernel. The CPU interpreter runs its
/// nodes one by one.
#[derive(Debug, Clone, PartialEq)]
pub struct SqueezeExcite {
    /// The block's input `[n, c, h, w]`.
    pub input: ValueId,
    /// Its global average `[n, c, 1, 1]`.
    pub pooled: ValueId,
    /// The squeezed activation (after the first convolution and its activation).
    pub squeezed: ValueId,
    /// The gate `[n, c, 1, 1]` (after the second convolution and the sigmoid).
    pub gate: ValueId,
    /// The gate's activation (Sigmoid or HardSigmoid).
    pub gate_activation: Activation,
    /// `input * gate`.
    pub output: ValueId,
}

/// A group of nodes a pass recognised, by the values at its boundaries.
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    SqueezeExcite(SqueezeExcite),
}

/// A graph: nodes in an order where every value is computed before it is read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// What the passes recognised (see [`Pattern`]).
    pub patterns: Vec<Pattern>,
}

impl Graph {
    /// The value `id`.
    ///
    /// # Panics
    ///
    /// If `id` is not a value of this graph.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id]
    }

    /// The index of the node that computes `id`, if a node does.
    pub fn producer(&self, id: ValueId) -> Option<usize> {
        self.nodes.iter().position(|n| n.outputs.contains(&id))
    }

    /// How many times each value is read: by node inputs, plus one for each graph output.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0usize; self.values.len()];
        for &v in self
            .nodes
            .iter()
            .flat_map(|n| &n.inputs)
            .chain(&self.outputs)
        {
            if let Some(u) = uses.get_mut(v) {
                *u += 1;
            }
        }
        uses
    }

    /// The element count of value `id` (shapes were checked against [`MAX_ELEMENTS`]).
    pub fn elements(&self, id: ValueId) -> usize {
        self.values[id].shape.iter().product()
    }

    /// A value name not yet in the graph, built from `base`.
    pub fn fresh_name(&self, base: &str) -> String {
        let taken: std::collections::HashSet<&str> =
            self.values.iter().map(|v| v.name.as_str()).collect();
        if !taken.contains(base) {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| !taken.contains(n.as_str()))
            .unwrap_or_default()
    }

    /// Adds a constant value (no node computes it) and returns its id.
    pub fn push_constant(&mut self, base_name: &str, shape: Vec<usize>, data: Data) -> ValueId {
        let name = self.fresh_name(base_name);
        self.values.push(Value {
            name,
            dtype: data.dtype(),
            shape,
            constant: Some(data),
        });
        self.values.len() - 1
    }

    /// Checks the graph is well formed: ids in range, every value computed once before it is
    /// read, constants holding as many elements as their shape, and every node's outputs of
    /// the shapes and types its operator gives on its inputs.
    pub fn check(&self) -> Result<(), GraphError> {
        builder::check(self)
    }
}
