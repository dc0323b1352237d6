//! Rewrites of the graph that keep its outputs: each pass returns how many rewrites it made,
//! and [`optimize`] runs them all in order.
//!
//! To use: `let stats = optimize(&mut graph)?;`, or the passes one by one (each leaves a graph
//! that [`Graph::check`] accepts; run [`eliminate_dead_nodes`] after the rewriting ones to drop
//! what they left unused).
//!
//! The passes: `fold` (constant folding: Constant nodes and anything computed from constants
//! only, the shape arithmetic before a Reshape included), `dead` (dead nodes and unused values),
//! `batch_norm` (BatchNormalization folded into the Conv before it), `gelu` (the erf form of
//! GELU as one operator), `silu` (`x * sigmoid(x)` as one operator), `conv_epilogue` (activation and residual Add fused into the Conv
//! before them), `squeeze_excite` (squeeze-and-excitation blocks recognised as [`Pattern`]s).
//!
//! [`Pattern`]: super::Pattern

mod batch_norm;
mod conv_epilogue;
mod dead;
mod fold;
mod gelu;
mod silu;
mod squeeze_excite;

pub use batch_norm::fold_batch_norms;
pub use conv_epilogue::fuse_conv_epilogues;
pub use dead::eliminate_dead_nodes;
pub use fold::fold_constants;
pub use gelu::recognize_gelu;
pub use silu::recognize_silu;
pub use squeeze_excite::annotate_squeeze_excite;

use super::{Graph, GraphError, Node, ValueId};

/// What [`optimize`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Nodes replaced by constants.
    pub folded_constants: usize,
    /// Batch norms folded into a convolution.
    pub folded_batch_norms: usize,
    /// GELU chains made one operator.
    pub gelus: usize,
    /// `x * sigmoid(x)` pairs made one SiLU.
    #[doc(alias = "swish")]
    pub silus: usize,
    /// Activations and residual Adds fused into convolutions.
    pub fused_epilogues: usize,
    /// Squeeze-and-excitation blocks recognised.
    pub squeeze_excites: usize,
    /// Nodes removed as dead (their outputs unused).
    pub dead_nodes: usize,
}

/// Every pass, in order, then a check of the result.
pub fn optimize(graph: &mut Graph) -> Result<PassStats, GraphError> {
    graph.check()?;
    let mut s = PassStats {
        folded_constants: fold_constants(graph)?,
        ..PassStats::default()
    };
    s.dead_nodes += eliminate_dead_nodes(graph);
    s.folded_batch_norms = fold_batch_norms(graph);
    s.gelus = recognize_gelu(graph);
    s.silus = recognize_silu(graph);
    s.dead_nodes += eliminate_dead_nodes(graph);
    s.fused_epilogues = fuse_conv_epilogues(graph);
    s.dead_nodes += eliminate_dead_nodes(graph);
    s.squeeze_excites = annotate_squeeze_excite(graph);
    graph.check()?;
    Ok(s)
}

/// What the pattern-matching passes look up: each value's producing node and readers.
pub(crate) struct Uses {
    producer: Vec<Option<usize>>,
    readers: Vec<Vec<usize>>,
    is_output: Vec<bool>,
}

impl Uses {
    pub fn new(g: &Graph) -> Uses {
        let n = g.values.len();
        let mut u = Uses {
            producer: vec![None; n],
            readers: vec![Vec::new(); n],
            is_output: vec![false; n],
        };
        for (i, node) in g.nodes.iter().enumerate() {
            for &o in &node.outputs {
                u.producer[o] = Some(i);
            }
            for &v in &node.inputs {
                u.readers[v].push(i);
            }
        }
        for &o in &g.outputs {
            u.is_output[o] = true;
        }
        u
    }

    /// The node computing `v`.
    pub fn producer<'g>(&self, g: &'g Graph, v: ValueId) -> Option<(usize, &'g Node)> {
        let i = (*self.producer.get(v)?)?;
        Some((i, &g.nodes[i]))
    }

    /// The one node reading `v`, when exactly one does and `v` is no graph output.
    pub fn only_reader<'g>(&self, g: &'g Graph, v: ValueId) -> Option<(usize, &'g Node)> {
        match self.readers.get(v)?.as_slice() {
            [i] if !self.is_output[v] => Some((*i, &g.nodes[*i])),
            _ => None,
        }
    }
}

/// The value of a one-element f32 constant.
pub(crate) fn scalar(g: &Graph, v: ValueId) -> Option<f32> {
    match g.values.get(v)?.constant.as_ref()?.as_f32()? {
        [x] => Some(*x),
        _ => None,
    }
}

/// The operand of a two-input node other than `v` (None when both are `v`).
pub(crate) fn other_input(node: &Node, v: ValueId) -> Option<ValueId> {
    match node.inputs.as_slice() {
        [a, b] if *a == v && *b != v => Some(*b),
        [a, b] if *b == v && *a != v => Some(*a),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
