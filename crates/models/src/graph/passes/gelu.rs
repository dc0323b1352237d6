//! GELU recognised: `x * 0.5 * (1 + erf(x / sqrt 2))` (as torch.onnx writes nn.GELU before
//! opset 20, with the product in any of its three groupings, and `x * (1 / sqrt 2)` for the
//! division) becomes one Gelu activation. The chain's nodes are left for dead-node elimination
//! (they stay where something else reads them).

use super::{other_input, scalar, Uses};
use crate::graph::{Activation, Binary, Graph, Node, Op, ValueId};

/// Whether `v` is a one-element constant within f32 rounding of `want`.
fn is_const(g: &Graph, v: ValueId, want: f64) -> bool {
    scalar(g, v).is_some_and(|c| (f64::from(c) - want).abs() <= 1e-6 * want.abs())
}

fn is_binary(node: &Node, b: Binary) -> bool {
    node.op == Op::Binary(b)
}

/// The `x` of `u = x / sqrt 2` (or `x * (1 / sqrt 2)`).
fn scaled_input(g: &Graph, uses: &Uses, u: ValueId) -> Option<ValueId> {
    let (_, p) = uses.producer(g, u)?;
    let [a, b] = p.inputs[..] else { return None };
    if is_binary(p, Binary::Div) && is_const(g, b, std::f64::consts::SQRT_2) {
        return Some(a);
    }
    if is_binary(p, Binary::Mul) {
        let half = std::f64::consts::FRAC_1_SQRT_2;
        if is_const(g, b, half) {
            return Some(a);
        }
        if is_const(g, a, half) {
            return Some(b);
        }
    }
    None
}

/// The value computing `x * 0.5 * s` from `s = 1 + erf(..)`, and its node's index.
fn product_with(g: &Graph, uses: &Uses, s: ValueId, x: ValueId) -> Option<(usize, ValueId)> {
    let (mi, m1) = uses.only_reader(g, s)?;
    if !is_binary(m1, Binary::Mul) {
        return None;
    }
    let o = other_input(m1, s)?;
    let out1 = m1.outputs[0];
    // (x * s) * 0.5, or s * 0.5 then * x
    if o == x || is_const(g, o, 0.5) {
        let (m2i, m2) = uses.only_reader(g, out1)?;
        let want = if o == x { None } else { Some(x) };
        let last = other_input(m2, out1)?;
        let fits = match want {
            None => is_const(g, last, 0.5),
            Some(x) => last == x,
        };
        return (is_binary(m2, Binary::Mul) && fits).then_some((m2i, m2.outputs[0]));
    }
    // s * (x * 0.5)
    let (_, h) = uses.producer(g, o)?;
    let half_of_x =
        is_binary(h, Binary::Mul) && other_input(h, x).is_some_and(|c| is_const(g, c, 0.5));
    half_of_x.then_some((mi, out1))
}

/// Replaces every erf-form GELU by a Gelu node; returns how many.
pub fn recognize_gelu(g: &mut Graph) -> usize {
    let mut found = 0;
    loop {
        let uses = Uses::new(g);
        let hit = g.nodes.iter().find_map(|e| {
            if e.op != Op::Erf {
                return None;
            }
            let x = scaled_input(g, &uses, e.inputs[0])?;
            let (_, add) = uses.only_reader(g, e.outputs[0])?;
            let one = other_input(add, e.outputs[0])?;
            if !is_binary(add, Binary::Add) || !is_const(g, one, 1.0) {
                return None;
            }
            let (at, out) = product_with(g, &uses, add.outputs[0], x)?;
            Some((at, x, out))
        });
        let Some((at, x, out)) = hit else {
            return found;
        };
        let name = format!("{}_gelu", g.nodes[at].name);
        g.nodes[at] = Node {
            name,
            op: Op::Activation(Activation::Gelu),
            inputs: vec![x],
            outputs: vec![out],
        };
        found += 1;
    }
}
