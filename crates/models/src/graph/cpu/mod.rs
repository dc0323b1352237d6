//! The graph's f32 CPU interpreter: every operator on row-major NCHW tensors, nodes run in
//! order, each value freed after its last reader (the memory plan).
//!
//! To use: `forward_cpu(&graph, &[Array::f32(shape, values)])` returns the graph's outputs in
//! order.
//!
//! The parts: `conv` (convolutions, grouped and depthwise included, with their epilogue),
//! `elementwise` (activations, erf, broadcast arithmetic), `linalg` (Gemm, MatMul), `pool`
//! (max, average, global average), `norm` (batch and layer normalization, ReduceMean),
//! `layout` (transpose, concat, gather, and the copies that only relabel a shape).

mod conv;
mod elementwise;
mod layout;
mod linalg;
mod norm;
mod pool;

use super::{Data, Graph, GraphError, Op, OutType};
use std::borrow::Cow;

/// A tensor handed to or returned by [`forward_cpu`]: its shape and row-major elements.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Array {
    /// An f32 tensor.
    pub fn f32(shape: &[usize], values: Vec<f32>) -> Array {
        Array {
            shape: shape.to_vec(),
            data: Data::F32(values),
        }
    }

    /// The f32 elements, if that is the type.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.data.as_f32()
    }
}

/// An operator's input as a kernel reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub shape: &'a [usize],
    pub data: &'a Data,
}

impl<'a> View<'a> {
    /// The f32 elements, or what the kernel expected.
    fn f32(&self) -> Result<&'a [f32], String> {
        self.data
            .as_f32()
            .ok_or_else(|| "an f32 input holds i64 elements".to_string())
    }
}

/// The f32 outputs of a kernel that has only f32 inputs.
fn f32_out(v: Vec<f32>) -> Result<Vec<Data>, String> {
    Ok(vec![Data::F32(v)])
}

/// Runs `op` on `inputs` (already checked against the operator by shape inference, which gave
/// `outs`).
pub(crate) fn run_op(op: &Op, inputs: &[View], outs: &[OutType]) -> Result<Vec<Data>, String> {
    let out_shape = outs
        .first()
        .map(|(_, s)| s.as_slice())
        .ok_or("the operator gives no output")?;
    let first = inputs.first().copied();
    let x = || first.ok_or_else(|| "the operator needs an input".to_string());
    match op {
        Op::Constant { value, .. } => Ok(vec![value.clone()]),
        Op::Conv(c) => f32_out(conv::conv(c, inputs, out_shape)?),
        Op::Gemm(g) => f32_out(linalg::gemm(g, inputs, out_shape)?),
        Op::MatMul => f32_out(linalg::matmul(inputs, out_shape)?),
        Op::Activation(a) => f32_out(elementwise::activation(*a, x()?.f32()?)),
        Op::Erf => f32_out(elementwise::erf(x()?.f32()?)),
        Op::Binary(b) => Ok(vec![elementwise::binary(*b, inputs, out_shape)?]),
        Op::MaxPool(p) => f32_out(pool::max_pool(p, x()?, out_shape)?),
        Op::AveragePool(p) => f32_out(pool::average_pool(p, x()?, out_shape)?),
        Op::GlobalAveragePool => f32_out(pool::global_average(x()?)?),
        Op::BatchNorm { epsilon } => f32_out(norm::batch_norm(*epsilon, inputs)?),
        Op::LayerNorm { axis, epsilon } => f32_out(norm::layer_norm(*axis, *epsilon, inputs)?),
        Op::ReduceMean { axes, .. } => f32_out(norm::reduce_mean(axes, x()?, out_shape)?),
        Op::Flatten { .. }
        | Op::Reshape
        | Op::Identity
        | Op::Unsqueeze { .. }
        | Op::Squeeze { .. } => Ok(vec![x()?.data.clone()]),
        Op::Transpose { perm } => Ok(vec![layout::transpose(x()?, perm)]),
        Op::Concat { axis } => Ok(vec![layout::concat(inputs, *axis)?]),
        Op::Gather { axis } => Ok(vec![layout::gather(inputs, *axis)?]),
        Op::Shape { start, end } => {
            let dims = x()?
                .shape
                .get(*start..*end)
                .ok_or("start and end out of range")?;
            Ok(vec![Data::I64(dims.iter().map(|&d| d as i64).collect())])
        }
    }
}

/// Runs `graph` on `inputs` (one per graph input, in order, of its shape and type) and returns
/// its outputs in order. Each intermediate value is dropped after the last node that reads it.
///
/// Checks the graph first ([`Graph::check`]), so a malformed graph is an error, never a panic.
pub fn forward_cpu(graph: &Graph, inputs: &[Array]) -> Result<Vec<Array>, GraphError> {
    graph.check()?;
    if inputs.len() != graph.inputs.len() {
        return Err(GraphError::Structure(format!(
            "the graph takes {} inputs, {} given",
            graph.inputs.len(),
            inputs.len()
        )));
    }
    let mut slots: Vec<Option<Cow<Data>>> = vec![None; graph.values.len()];
    for (&id, given) in graph.inputs.iter().zip(inputs) {
        let v = &graph.values[id];
        if given.shape != v.shape
            || given.data.dtype() != v.dtype
            || given.data.len() != graph.elements(id)
        {
            return Err(GraphError::Input {
                input: v.name.clone(),
                problem: format!(
                    "given {:?} {:?} with {} elements; the graph takes {:?} {:?}",
                    given.data.dtype(),
                    given.shape,
                    given.data.len(),
                    v.dtype,
                    v.shape
                ),
            });
        }
        slots[id] = Some(Cow::Borrowed(&given.data));
    }
    for (id, v) in graph.values.iter().enumerate() {
        if let Some(c) = &v.constant {
            slots[id] = Some(Cow::Borrowed(c));
        }
    }
    let last_use = last_uses(graph);
    for (i, node) in graph.nodes.iter().enumerate() {
        let fail = |problem: String| GraphError::Node {
            node: node.name.clone(),
            op: node.op.name().to_string(),
            problem,
        };
        // An operator that only relabels a shape takes its input's buffer when this is the
        // input's last reader, instead of copying it.
        let relabel = matches!(
            node.op,
            Op::Flatten { .. }
                | Op::Reshape
                | Op::Identity
                | Op::Squeeze { .. }
                | Op::Unsqueeze { .. }
        );
        if let (true, Some(&v), Some(&o)) = (relabel, node.inputs.first(), node.outputs.first()) {
            let last = last_use[v] == Some(i) && !node.inputs[1..].contains(&v);
            if last && matches!(slots[v], Some(Cow::Owned(_))) {
                slots[o] = slots[v].take();
                for &u in &node.inputs[1..] {
                    if last_use[u] == Some(i) && graph.values[u].constant.is_none() {
                        slots[u] = None;
                    }
                }
                continue;
            }
        }
        let views = node
            .inputs
            .iter()
            .map(|&v| {
                slots[v].as_deref().map(|data| View {
                    shape: &graph.values[v].shape,
                    data,
                })
            })
            .collect::<Option<Vec<View>>>()
            .ok_or_else(|| fail("an input was freed or never computed".into()))?;
        let outs: Vec<OutType> = node
            .outputs
            .iter()
            .map(|&o| (graph.values[o].dtype, graph.values[o].shape.clone()))
            .collect();
        let results = run_op(&node.op, &views, &outs).map_err(fail)?;
        for (&o, data) in node.outputs.iter().zip(results) {
            if data.len() != graph.elements(o) || data.dtype() != graph.values[o].dtype {
                return Err(fail(format!(
                    "computed {} elements for output {}",
                    data.len(),
                    graph.values[o].name
                )));
            }
            slots[o] = Some(Cow::Owned(data));
        }
        for &v in &node.inputs {
            if last_use[v] == Some(i) && graph.values[v].constant.is_none() {
                slots[v] = None;
            }
        }
    }
    graph
        .outputs
        .iter()
        .map(|&o| {
            let data = slots[o].clone().ok_or_else(|| {
                GraphError::Structure(format!("output {} was not computed", graph.values[o].name))
            })?;
            Ok(Array {
                shape: graph.values[o].shape.clone(),
                data: data.into_owned(),
            })
        })
        .collect()
}

/// The memory plan: for each value, the index of the last node that reads it, after which
/// its buffer can go; None for values no node reads and for graph outputs, which are kept.
/// (Constants are never freed either; a backend may place them apart.)
pub fn last_uses(graph: &Graph) -> Vec<Option<usize>> {
    let mut last_use = vec![None; graph.values.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        for &v in &node.inputs {
            if let Some(l) = last_use.get_mut(v) {
                *l = Some(i);
            }
        }
    }
    for &o in &graph.outputs {
        if let Some(l) = last_use.get_mut(o) {
            *l = None;
        }
    }
    last_use
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Strides for reading a tensor of `shape` broadcast to `out` (numpy rules, already checked):
/// 0 along the axes it repeats.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = strides(shape);
    let lead = out.len().saturating_sub(shape.len());
    (0..out.len())
        .map(|a| match a.checked_sub(lead) {
            Some(i) if shape[i] != 1 => own[i],
            _ => 0,
        })
        .collect()
}

#[cfg(test)]
mod tests;
