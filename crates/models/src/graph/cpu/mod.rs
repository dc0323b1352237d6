//! The graph's CPU interpreter: every operator on row-major NCHW tensors, nodes run in order,
//! each value freed after its last reader (the memory plan). It runs in f32, the graph's own
//! type, or entirely in f64 (every constant and input widened, every operator computed in
//! f64): a reference for f32 results that is free of f32's own rounding.
//!
//! To use: `forward_cpu(&graph, &[Array::f32(shape, values)])` returns the graph's outputs in
//! order; `forward_cpu_f64` takes the same inputs and returns them in f64; `forward_cpu_tapped`
//! runs in f32 with a [`NodeTap`] that sees each node's float inputs and outputs and may hand
//! the node other inputs (the fp8 simulation's quantized copies); `forward_cpu_exact` runs in
//! f32 with chosen convolutions summed in f64 (`exact_convolutions` chooses them).
//!
//! The parts: `real` (the two float types, over which every operator is written once),
//! `conv` (convolutions, grouped and depthwise included, with their epilogue), `elementwise`
//! (activations, erf, broadcast arithmetic), `linalg` (Gemm, MatMul), `pool` (max, average,
//! global average), `norm` (batch and layer normalization, ReduceMean), `layout` (transpose,
//! concat, gather, and the copies that only relabel a shape).

mod conv;
mod elementwise;
mod exact;
mod layout;
mod linalg;
mod norm;
mod pool;
mod real;

use super::{DType, Data, Graph, GraphError, Node, Op, OutType};
pub use exact::{exact_convolutions, forward_cpu_exact};
use real::Real;
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

/// An output of [`forward_cpu_f64`]: its shape and row-major elements in f64 (an i64 output's
/// elements converted, exact up to 2^53).
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayF64 {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// A value's elements as a kernel reads them: floats in the type the interpreter runs in, or
/// i64 (shapes and indices).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Elems<'a, T> {
    Real(&'a [T]),
    I64(&'a [i64]),
}

impl<'a> Elems<'a, f32> {
    /// A graph's elements, as the f32 interpreter reads them.
    pub(crate) fn of(data: &'a Data) -> Self {
        match data {
            Data::F32(v) => Elems::Real(v),
            Data::I64(v) => Elems::I64(v),
        }
    }
}

/// A value while the interpreter runs: a graph constant or input (borrowed where the type is
/// the graph's own) or an operator's output (owned).
#[derive(Debug, Clone)]
pub(crate) enum Tensor<'a, T: Real> {
    Real(Cow<'a, [T]>),
    I64(Cow<'a, [i64]>),
}

impl<'a, T: Real> Tensor<'a, T> {
    /// A graph's elements in the type `T` ([`Real::adopt`]).
    fn of(data: &'a Data) -> Self {
        match data {
            Data::F32(v) => Tensor::Real(T::adopt(v)),
            Data::I64(v) => Tensor::I64(Cow::Borrowed(v)),
        }
    }

    fn elems(&self) -> Elems<'_, T> {
        match self {
            Tensor::Real(v) => Elems::Real(v),
            Tensor::I64(v) => Elems::I64(v),
        }
    }

    fn len(&self) -> usize {
        match self {
            Tensor::Real(v) => v.len(),
            Tensor::I64(v) => v.len(),
        }
    }

    /// The graph's type for it: `T` stands for the graph's F32.
    fn dtype(&self) -> DType {
        match self {
            Tensor::Real(_) => DType::F32,
            Tensor::I64(_) => DType::I64,
        }
    }

    fn is_owned(&self) -> bool {
        matches!(
            self,
            Tensor::Real(Cow::Owned(_)) | Tensor::I64(Cow::Owned(_))
        )
    }

    fn into_owned(self) -> Tensor<'static, T> {
        match self {
            Tensor::Real(v) => Tensor::Real(Cow::Owned(v.into_owned())),
            Tensor::I64(v) => Tensor::I64(Cow::Owned(v.into_owned())),
        }
    }
}

impl Tensor<'_, f32> {
    fn into_data(self) -> Data {
        match self {
            Tensor::Real(v) => Data::F32(v.into_owned()),
            Tensor::I64(v) => Data::I64(v.into_owned()),
        }
    }
}

/// An owned float output.
fn real<T: Real>(v: Vec<T>) -> Tensor<'static, T> {
    Tensor::Real(Cow::Owned(v))
}

/// An owned i64 output.
fn int<T: Real>(v: Vec<i64>) -> Tensor<'static, T> {
    Tensor::I64(Cow::Owned(v))
}

/// An operator's input as a kernel reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a, T = f32> {
    pub shape: &'a [usize],
    pub data: Elems<'a, T>,
}

impl<'a> View<'a, f32> {
    /// A graph value's shape and elements, as the f32 interpreter reads them.
    pub(crate) fn of(shape: &'a [usize], data: &'a Data) -> Self {
        View {
            shape,
            data: Elems::of(data),
        }
    }
}

impl<'a, T> View<'a, T> {
    /// How many elements it holds.
    fn len(&self) -> usize {
        match self.data {
            Elems::Real(v) => v.len(),
            Elems::I64(v) => v.len(),
        }
    }

    /// The float elements, or what the kernel expected.
    fn real(&self) -> Result<&'a [T], String> {
        match self.data {
            Elems::Real(v) => Ok(v),
            Elems::I64(_) => Err("an f32 input holds i64 elements".to_string()),
        }
    }
}

/// The output of a kernel that gives one float tensor.
fn real_out<T: Real>(v: Vec<T>) -> Result<Vec<Tensor<'static, T>>, String> {
    Ok(vec![real(v)])
}

/// Runs `op` on `inputs` in f32 (already checked against the operator by shape inference,
/// which gave `outs`): what constant folding and shape inference compute with.
pub(crate) fn run_op(op: &Op, inputs: &[View], outs: &[OutType]) -> Result<Vec<Data>, String> {
    Ok(run(op, inputs, outs)?
        .into_iter()
        .map(Tensor::into_data)
        .collect())
}

/// Runs `op` on `inputs` in `T`.
fn run<T: Real>(
    op: &Op,
    inputs: &[View<T>],
    outs: &[OutType],
) -> Result<Vec<Tensor<'static, T>>, String> {
    let out_shape = outs
        .first()
        .map(|(_, s)| s.as_slice())
        .ok_or("the operator gives no output")?;
    let first = inputs.first().copied();
    let x = || first.ok_or_else(|| "the operator needs an input".to_string());
    match op {
        Op::Constant { value, .. } => Ok(vec![Tensor::of(value).into_owned()]),
        Op::Conv(c) => real_out(conv::conv(c, inputs, out_shape)?),
        Op::Gemm(g) => real_out(linalg::gemm(g, inputs, out_shape)?),
        Op::MatMul => real_out(linalg::matmul(inputs, out_shape)?),
        Op::Activation(a) => real_out(elementwise::activation(*a, x()?.real()?)),
        Op::Erf => real_out(elementwise::erf(x()?.real()?)),
        Op::Binary(b) => Ok(vec![elementwise::binary(*b, inputs, out_shape)?]),
        Op::MaxPool(p) => real_out(pool::max_pool(p, x()?, out_shape)?),
        Op::AveragePool(p) => real_out(pool::average_pool(p, x()?, out_shape)?),
        Op::GlobalAveragePool => real_out(pool::global_average(x()?)?),
        Op::BatchNorm { epsilon } => real_out(norm::batch_norm(*epsilon, inputs)?),
        Op::LayerNorm { axis, epsilon } => real_out(norm::layer_norm(*axis, *epsilon, inputs)?),
        Op::ReduceMean { axes, .. } => real_out(norm::reduce_mean(axes, x()?, out_shape)?),
        Op::Flatten { .. }
        | Op::Reshape
        | Op::Identity
        | Op::Unsqueeze { .. }
        | Op::Squeeze { .. } => Ok(vec![match x()?.data {
            Elems::Real(v) => real(v.to_vec()),
            Elems::I64(v) => int(v.to_vec()),
        }]),
        Op::Transpose { perm } => Ok(vec![layout::transpose(x()?, perm)]),
        Op::Concat { axis } => Ok(vec![layout::concat(inputs, *axis)?]),
        Op::Gather { axis } => Ok(vec![layout::gather(inputs, *axis)?]),
        Op::Shape { start, end } => {
            let dims = x()?
                .shape
                .get(*start..*end)
                .ok_or("start and end out of range")?;
            Ok(vec![int(dims.iter().map(|&d| d as i64).collect())])
        }
    }
}

/// Runs `graph` on `inputs` (one per graph input, in order, of its shape and type) and returns
/// its outputs in order. Each intermediate value is dropped after the last node that reads it.
///
/// Checks the graph first ([`Graph::check`]), so a malformed graph is an error, never a panic.
pub fn forward_cpu(graph: &Graph, inputs: &[Array]) -> Result<Vec<Array>, GraphError> {
    Ok(forward::<f32>(graph, inputs)?
        .into_iter()
        .map(|(shape, t)| Array {
            shape,
            data: t.into_data(),
        })
        .collect())
}

/// [`forward_cpu`] entirely in f64: the f32 inputs and every f32 constant widened, every
/// operator computed in f64, the outputs in f64. A reference for f32 results (gpukit's, or
/// another runtime's) that carries none of f32's rounding: only the weights' and inputs' own.
///
/// Takes twice [`forward_cpu`]'s memory for weights and activations, and runs at the speed of
/// f64 products (half of f32's or less).
pub fn forward_cpu_f64(graph: &Graph, inputs: &[Array]) -> Result<Vec<ArrayF64>, GraphError> {
    Ok(forward::<f64>(graph, inputs)?
        .into_iter()
        .map(|(shape, t)| ArrayF64 {
            shape,
            data: match t {
                Tensor::Real(v) => v.into_owned(),
                Tensor::I64(v) => v.iter().map(|&i| i as f64).collect(),
            },
        })
        .collect())
}

/// [`forward_cpu_f64`]'s outputs rounded to f32 (i64 outputs as their values): what an f32
/// result is judged against where the f32 interpreter's own sums are too far from exact
/// (2e-5 on deep networks, against the 1e-5 an f32 row is judged by).
pub fn forward_cpu_f64_rounded(graph: &Graph, inputs: &[Array]) -> Result<Vec<Array>, GraphError> {
    Ok(forward_cpu_f64(graph, inputs)?
        .into_iter()
        .map(|a| Array::f32(&a.shape, a.data.iter().map(|&x| x as f32).collect()))
        .collect())
}

/// A node's float input or output as a [`NodeTap`] sees it (None for i64 values).
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub shape: &'a [usize],
    pub values: Option<&'a [f32]>,
}

/// What [`forward_cpu_tapped`] calls around each node it computes (nodes that only relabel a
/// shape, run in place, are not shown).
pub trait NodeTap {
    /// Node `index`'s inputs before it runs: the inputs to replace (the same length), by
    /// position; an empty vector (the default) keeps them all.
    fn inputs(&mut self, index: usize, node: &Node, inputs: &[Seen<'_>]) -> Vec<Option<Vec<f32>>> {
        let _ = (index, node, inputs);
        Vec::new()
    }

    /// Node `index`'s outputs once computed.
    fn outputs(&mut self, index: usize, node: &Node, outputs: &[Seen<'_>]) {
        let _ = (index, node, outputs);
    }
}

/// [`forward_cpu`] with `tap` called around every node.
pub fn forward_cpu_tapped(
    graph: &Graph,
    inputs: &[Array],
    tap: &mut dyn NodeTap,
) -> Result<Vec<Array>, GraphError> {
    let mut f32_tap = F32Tap(tap);
    Ok(forward_with::<f32>(graph, inputs, &mut f32_tap)?
        .into_iter()
        .map(|(shape, t)| Array {
            shape,
            data: t.into_data(),
        })
        .collect())
}

/// The interpreter's side of a tap, in the type it runs in.
trait Tap<T: Real> {
    fn inputs(&mut self, index: usize, node: &Node, inputs: &[View<'_, T>]) -> Vec<Option<Vec<T>>>;
    fn outputs(
        &mut self,
        index: usize,
        node: &Node,
        shapes: &[&[usize]],
        outputs: &[&Tensor<'_, T>],
    );
    /// Whether node `index`, a convolution, sums in f64 (each output rounded once).
    fn sums_in_f64(&self, index: usize) -> bool {
        let _ = index;
        false
    }
}

/// No tap.
struct Untapped;

impl<T: Real> Tap<T> for Untapped {
    fn inputs(&mut self, _: usize, _: &Node, _: &[View<'_, T>]) -> Vec<Option<Vec<T>>> {
        Vec::new()
    }
    fn outputs(&mut self, _: usize, _: &Node, _: &[&[usize]], _: &[&Tensor<'_, T>]) {}
}

/// A caller's [`NodeTap`] on the f32 interpreter.
struct F32Tap<'t>(&'t mut dyn NodeTap);

impl Tap<f32> for F32Tap<'_> {
    fn inputs(
        &mut self,
        index: usize,
        node: &Node,
        inputs: &[View<'_, f32>],
    ) -> Vec<Option<Vec<f32>>> {
        let seen: Vec<Seen> = inputs
            .iter()
            .map(|v| Seen {
                shape: v.shape,
                values: match v.data {
                    Elems::Real(r) => Some(r),
                    Elems::I64(_) => None,
                },
            })
            .collect();
        self.0.inputs(index, node, &seen)
    }

    fn outputs(
        &mut self,
        index: usize,
        node: &Node,
        shapes: &[&[usize]],
        outputs: &[&Tensor<'_, f32>],
    ) {
        let seen: Vec<Seen> = shapes
            .iter()
            .zip(outputs)
            .map(|(shape, t)| Seen {
                shape,
                values: match t {
                    Tensor::Real(r) => Some(r),
                    Tensor::I64(_) => None,
                },
            })
            .collect();
        self.0.outputs(index, node, &seen);
    }
}

/// An output of the interpreter: its shape and elements.
type Output<T> = (Vec<usize>, Tensor<'static, T>);

/// The interpreter in `T`: the graph's outputs in order.
fn forward<T: Real>(graph: &Graph, inputs: &[Array]) -> Result<Vec<Output<T>>, GraphError> {
    forward_with(graph, inputs, &mut Untapped)
}

/// [`forward`] with `tap` around each computed node.
fn forward_with<T: Real>(
    graph: &Graph,
    inputs: &[Array],
    tap: &mut dyn Tap<T>,
) -> Result<Vec<Output<T>>, GraphError> {
    graph.check()?;
    if inputs.len() != graph.inputs.len() {
        return Err(GraphError::Structure(format!(
            "the graph takes {} inputs, {} given",
            graph.inputs.len(),
            inputs.len()
        )));
    }
    let mut slots: Vec<Option<Tensor<T>>> = vec![None; graph.values.len()];
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
        slots[id] = Some(Tensor::of(&given.data));
    }
    for (id, v) in graph.values.iter().enumerate() {
        if let Some(c) = &v.constant {
            slots[id] = Some(Tensor::of(c));
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
            if last && slots[v].as_ref().is_some_and(Tensor::is_owned) {
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
                slots[v].as_ref().map(|t| View {
                    shape: &graph.values[v].shape,
                    data: t.elems(),
                })
            })
            .collect::<Option<Vec<View<T>>>>()
            .ok_or_else(|| fail("an input was freed or never computed".into()))?;
        let replaced = tap.inputs(i, node, &views);
        if !replaced.is_empty() && replaced.len() != views.len() {
            return Err(fail(format!(
                "a tap replaced {} inputs of {}",
                replaced.len(),
                views.len()
            )));
        }
        let views: Vec<View<T>> = views
            .iter()
            .enumerate()
            .map(|(k, v)| match replaced.get(k) {
                Some(Some(data)) if data.len() == v.len() => Ok(View {
                    shape: v.shape,
                    data: Elems::Real(data.as_slice()),
                }),
                Some(Some(data)) => Err(fail(format!(
                    "a tap gave input {k} {} elements for {}",
                    data.len(),
                    v.len()
                ))),
                _ => Ok(*v),
            })
            .collect::<Result<_, _>>()?;
        let outs: Vec<OutType> = node
            .outputs
            .iter()
            .map(|&o| (graph.values[o].dtype, graph.values[o].shape.clone()))
            .collect();
        let results = match (&node.op, tap.sums_in_f64(i), outs.first()) {
            (Op::Conv(c), true, Some((_, shape))) => {
                conv::conv_exact(c, &views, shape).map(|v| vec![real(v)])
            }
            _ => run(&node.op, &views, &outs),
        }
        .map_err(fail)?;
        let shapes: Vec<&[usize]> = node
            .outputs
            .iter()
            .map(|&o| graph.values[o].shape.as_slice())
            .collect();
        tap.outputs(i, node, &shapes, &results.iter().collect::<Vec<_>>());
        for (&o, data) in node.outputs.iter().zip(results) {
            if data.len() != graph.elements(o) || data.dtype() != graph.values[o].dtype {
                return Err(fail(format!(
                    "computed {} elements for output {}",
                    data.len(),
                    graph.values[o].name
                )));
            }
            slots[o] = Some(data);
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
            Ok((graph.values[o].shape.clone(), data.into_owned()))
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
mod f64_tests;
#[cfg(test)]
mod tests;
