//! SiLU recognised: `x * sigmoid(x)` (as torch.onnx writes nn.SiLU: a Sigmoid and a Mul that
//! reads both its input and its output) becomes one Silu activation, so that the convolution
//! before it can take it as its epilogue. A squeeze-and-excitation gate (`x * sigmoid(conv(..))`)
//! multiplies by the sigmoid of another value and is left alone.

use super::{other_input, Uses};
use crate::graph::{Activation, Binary, Graph, Node, Op};

/// Replaces every `Mul(x, Sigmoid(x))` whose sigmoid nothing else reads; returns how many.
pub fn recognize_silu(g: &mut Graph) -> usize {
    let mut found = 0;
    loop {
        let uses = Uses::new(g);
        let hit = g.nodes.iter().enumerate().find_map(|(si, s)| {
            if s.op != Op::Activation(Activation::Sigmoid) {
                return None;
            }
            let x = s.inputs[0];
            let (mi, m) = uses.only_reader(g, s.outputs[0])?;
            let is_mul = m.op == Op::Binary(Binary::Mul);
            (is_mul && other_input(m, s.outputs[0]) == Some(x)).then_some((si, mi, x))
        });
        let Some((si, mi, x)) = hit else {
            return found;
        };
        let name = format!("{}_silu", g.nodes[mi].name);
        let out = g.nodes[mi].outputs.clone();
        // the Mul's place: every input is computed before it
        g.nodes[mi] = Node {
            name,
            op: Op::Activation(Activation::Silu),
            inputs: vec![x],
            outputs: out,
        };
        g.nodes.remove(si);
        found += 1;
    }
}
