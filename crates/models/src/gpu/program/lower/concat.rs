//! Concatenations lowered. Each input is copied into its slice of the output, except where a
//! concatenation extends an earlier one along the same axis: DenseNet's layers each
//! concatenate every feature before them (`[x0]`, `[x0, x1]`, `[x0, x1, x2]`, ... as
//! torch.onnx writes them, or `concat(concat(x0, x1), x2)`). Such a chain shares one slot of
//! its last concatenation's size: each is a prefix view of it, and each input is copied once,
//! by the first concatenation that holds it (a block of n layers: n copies, not n(n+1)/2).

use super::{Lowered, Lowering, Step, Tref};
use crate::graph::{Graph, Node, Op, ValueId};
use std::collections::HashMap;

/// The concatenations that extend one another.
#[derive(Debug, Default)]
pub(super) struct Chains {
    /// Per concatenation's output: its chain, and how many of its inputs are in the chain's
    /// slot already (written by earlier members).
    member: HashMap<ValueId, (usize, usize)>,
    /// Per chain, its last member's output (whose dims size the slot).
    last: Vec<ValueId>,
}

impl Chains {
    /// The chains of `g`, in node order: a concatenation joins the chain whose last member has
    /// the same axis and whose inputs (or output) begin its own inputs.
    pub(super) fn of(g: &Graph) -> Chains {
        let mut chains = Chains::default();
        // per chain: axis, the last member's inputs
        let mut open: Vec<(usize, Vec<ValueId>)> = Vec::new();
        for n in &g.nodes {
            let Op::Concat { axis } = n.op else { continue };
            let out = n.outputs[0];
            let distinct = n
                .inputs
                .iter()
                .enumerate()
                .all(|(i, v)| !n.inputs[..i].contains(v));
            let found = distinct
                .then(|| {
                    open.iter().enumerate().find_map(|(k, (a, inputs))| {
                        if *a != axis {
                            return None;
                        }
                        let last = chains.last[k];
                        if n.inputs.len() > inputs.len() && n.inputs.starts_with(inputs) {
                            Some((k, inputs.len()))
                        } else if n.inputs.len() > 1 && n.inputs[0] == last {
                            Some((k, 1))
                        } else {
                            None
                        }
                    })
                })
                .flatten();
            let (k, copied) = found.unwrap_or_else(|| {
                open.push((axis, Vec::new()));
                chains.last.push(out);
                (open.len() - 1, 0)
            });
            open[k].1 = n.inputs.clone();
            chains.last[k] = out;
            chains.member.insert(out, (k, copied));
        }
        chains
    }
}

impl Lowering<'_> {
    /// A concatenation: its output a new slot, or a prefix of its chain's; the inputs not in
    /// that slot yet copied into their slices.
    pub(super) fn concat(&mut self, node: &Node, axis: usize) -> Lowered<()> {
        let out = node.outputs[0];
        let name = node.name.clone();
        let dims = self.dims(out)?;
        let axis4 = 4 - self.g.value(out).shape.len() + axis;
        let (y, copied) = match self.chains.member.get(&out).copied() {
            Some((k, copied)) => {
                let base = match self.chain_slot.get(&k) {
                    Some(&t) => t,
                    None => {
                        let last = self.chains.last[k];
                        let ld = self.dims(last)?;
                        let want = self.default_layout(last, ld);
                        let t = self.new_view(want, &name);
                        self.chain_slot.insert(k, t);
                        t
                    }
                };
                let mut s = base.s;
                s.dims[axis4] = dims[axis4];
                if s.dims != dims {
                    return self.fail("concatenations of one chain differ off the axis");
                }
                (Tref { s, ..base }, copied)
            }
            None => {
                let want = self.default_layout(out, dims);
                (self.new_view(want, &name), 0)
            }
        };
        let mut start = 0;
        for (j, &i) in node.inputs.iter().enumerate() {
            let x = self.get(i)?;
            let len = x.s.dims[axis4];
            if j >= copied {
                let mut s = y.s;
                s.dims[axis4] = len;
                let part = Tref {
                    offset: y.offset + start * y.s.strides[axis4],
                    s,
                    ..y
                };
                self.push(Step::Pointwise {
                    a: x,
                    b: None,
                    c: None,
                    act: None,
                    y: part,
                });
            }
            start += len;
        }
        self.set(out, y);
        Ok(())
    }
}
