//! Squeeze-and-excitation recognised: `x * gate(conv(act(conv(pool(x)))))`, with the pool a
//! GlobalAveragePool (or a ReduceMean over the spatial axes, kept), the activations separate
//! nodes or fused into the convolutions, SiLU written as `t * sigmoid(t)`, and the gate a
//! Sigmoid or HardSigmoid. Recorded as [`Pattern::SqueezeExcite`]; the nodes stay.

use super::{other_input, Uses};
use crate::graph::{Activation, Binary, Graph, Op, Pattern, SqueezeExcite, ValueId};

/// The input of the Conv computing `v`, through its activation (`act`: whether one must be
/// applied), and that activation.
fn conv_input(g: &Graph, uses: &Uses, v: ValueId) -> Option<(ValueId, Option<Activation>)> {
    let (_, node) = uses.producer(g, v)?;
    match &node.op {
        Op::Conv(c) if !c.epilogue.residual && c.kernel == [1, 1] => {
            Some((node.inputs[0], c.epilogue.activation))
        }
        Op::Activation(a) => {
            let (x, inner) = conv_input(g, uses, node.inputs[0])?;
            inner.is_none().then_some((x, Some(*a)))
        }
        // SiLU: t * sigmoid(t)
        Op::Binary(Binary::Mul) => {
            let [a, b] = node.inputs[..] else { return None };
            let silu_of = |t: ValueId, s: ValueId| {
                let (_, sn) = uses.producer(g, s)?;
                (sn.op == Op::Activation(Activation::Sigmoid) && sn.inputs[0] == t).then_some(t)
            };
            let t = silu_of(a, b).or_else(|| silu_of(b, a))?;
            let (x, inner) = conv_input(g, uses, t)?;
            inner.is_none().then_some((x, Some(Activation::Sigmoid)))
        }
        _ => None,
    }
}

/// Whether `pooled` is the spatial mean of `x`.
fn is_pool_of(g: &Graph, uses: &Uses, pooled: ValueId, x: ValueId) -> bool {
    uses.producer(g, pooled).is_some_and(|(_, n)| {
        n.inputs.first() == Some(&x)
            && match &n.op {
                Op::GlobalAveragePool => true,
                Op::ReduceMean { axes, keep_dims } => *keep_dims && axes == &[2, 3],
                _ => false,
            }
    })
}

/// Records every squeeze-and-excitation block (replacing earlier records); returns how many.
pub fn annotate_squeeze_excite(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let mut found = Vec::new();
    for node in &g.nodes {
        if node.op != Op::Binary(Binary::Mul) {
            continue;
        }
        let out = node.outputs[0];
        for &x in &node.inputs {
            let Some(gate) = other_input(node, x) else {
                continue;
            };
            if g.values[x].shape.len() != 4 || g.values[out].shape != g.values[x].shape {
                continue;
            }
            let Some((squeezed, gate_act)) = conv_input(g, &uses, gate) else {
                continue;
            };
            let gate_activation = match gate_act {
                Some(a @ (Activation::Sigmoid | Activation::HardSigmoid { .. })) => a,
                _ => continue,
            };
            let Some((pooled, _)) = conv_input(g, &uses, squeezed) else {
                continue;
            };
            if is_pool_of(g, &uses, pooled, x) {
                found.push(Pattern::SqueezeExcite(SqueezeExcite {
                    input: x,
                    pooled,
                    squeezed,
                    gate,
                    gate_activation,
                    output: out,
                }));
                break;
            }
        }
    }
    g.patterns = found;
    g.patterns.len()
}
