//! The f32 interpreter with chosen convolutions summed in f64 (decision 183, as the GPU engine
//! does): which ones by the accuracy budget of [`crate::sums`] - on one random input, the
//! outputs with none summed in f64 against those with every convolution so; while they are
//! more than [`SUM_BUDGET`] apart, the earliest convolutions move to f64 (bisection).

use super::{forward_with, Array, Tap, Tensor, View};
use crate::graph::{Graph, GraphError, Node, Op};
use crate::sums::{fewest_within, largest_distance, SUM_BUDGET};
use gpukit_tensor::random::{fresh_seed, normal_f32};

/// A tap that only says which nodes sum in f64.
struct SumsIn<'a>(&'a [bool]);

impl Tap<f32> for SumsIn<'_> {
    fn inputs(&mut self, _: usize, _: &Node, _: &[View<'_, f32>]) -> Vec<Option<Vec<f32>>> {
        Vec::new()
    }
    fn outputs(&mut self, _: usize, _: &Node, _: &[&[usize]], _: &[&Tensor<'_, f32>]) {}
    fn sums_in_f64(&self, index: usize) -> bool {
        self.0.get(index).copied().unwrap_or(false)
    }
}

/// [`super::forward_cpu`] with the convolutions `exact` marks (a flag a node) summed in f64.
pub fn forward_cpu_exact(
    graph: &Graph,
    inputs: &[Array],
    exact: &[bool],
) -> Result<Vec<Array>, GraphError> {
    Ok(forward_with::<f32>(graph, inputs, &mut SumsIn(exact))?
        .into_iter()
        .map(|(shape, t)| Array {
            shape,
            data: t.into_data(),
        })
        .collect())
}

/// Which convolutions of `graph` the f32 interpreter sums in f64 (a flag a node), by the
/// budget on one random input of the graph's shapes; and the distance with none of them, and
/// how many moved.
pub fn exact_convolutions(graph: &Graph) -> Result<(Vec<bool>, f64, usize), GraphError> {
    let convs: Vec<usize> = (0..graph.nodes.len())
        .filter(|&i| matches!(graph.nodes[i].op, Op::Conv(_)))
        .collect();
    let none = vec![false; graph.nodes.len()];
    if convs.is_empty() {
        return Ok((none, 0.0, 0));
    }
    let inputs: Vec<Array> = graph
        .inputs
        .iter()
        .map(|&i| {
            let shape = graph.value(i).shape.clone();
            Array::f32(&shape, normal_f32(shape.iter().product(), fresh_seed()))
        })
        .collect();
    let first = |j: usize| {
        let mut flags = none.clone();
        for &i in &convs[..j] {
            flags[i] = true;
        }
        flags
    };
    let values = |outputs: Vec<Array>| -> Vec<Vec<f32>> {
        outputs
            .into_iter()
            .map(|a| a.as_f32().map(<[f32]>::to_vec).unwrap_or_default())
            .collect()
    };
    let reference = values(forward_cpu_exact(graph, &inputs, &first(convs.len()))?);
    let mut distance = |j: usize| -> Result<f64, GraphError> {
        let got = values(forward_cpu_exact(graph, &inputs, &first(j))?);
        let pairs = got.iter().zip(&reference);
        Ok(largest_distance(pairs.map(|(g, r)| (&g[..], &r[..]))))
    };
    let (before, moved) = fewest_within(convs.len(), SUM_BUDGET, &mut distance)?;
    Ok((first(moved), before, moved))
}
