//! Constant folding: every node whose inputs are all constants (ONNX Constant nodes, weight
//! arithmetic, the Shape/Gather/Unsqueeze/Concat chains exporters write before a Reshape, since
//! shapes are static) is run once and its outputs become constants.

use crate::graph::cpu::{run_op, View};
use crate::graph::{Graph, GraphError, Op};

/// Folds every node computable before running; returns how many.
pub fn fold_constants(g: &mut Graph) -> Result<usize, GraphError> {
    let mut keep = Vec::with_capacity(g.nodes.len());
    let mut folded = 0;
    for node in std::mem::take(&mut g.nodes) {
        let constant_inputs = node.inputs.iter().all(|&v| g.values[v].constant.is_some());
        // a Shape needs only its input's (static) shape
        if !(constant_inputs || matches!(node.op, Op::Shape { .. })) {
            keep.push(node);
            continue;
        }
        let outs: Vec<_> = node
            .outputs
            .iter()
            .map(|&o| (g.values[o].dtype, g.values[o].shape.clone()))
            .collect();
        // a Shape reads no elements: an empty stand-in for its input's
        let empty = crate::graph::Data::F32(Vec::new());
        let views: Vec<View> = node
            .inputs
            .iter()
            .map(|&v| {
                View::of(
                    &g.values[v].shape,
                    g.values[v].constant.as_ref().unwrap_or(&empty),
                )
            })
            .collect();
        let results = run_op(&node.op, &views, &outs).map_err(|problem| GraphError::Node {
            node: node.name.clone(),
            op: node.op.name().to_string(),
            problem,
        })?;
        for (&o, data) in node.outputs.iter().zip(results) {
            g.values[o].constant = Some(data);
        }
        folded += 1;
    }
    g.nodes = keep;
    Ok(folded)
}
