//! Dead-node elimination: nodes none of whose outputs reach a graph output are removed, then
//! values nothing refers to (their ids compacted, in order).

use crate::graph::{Graph, Pattern, ValueId};

/// Removes dead nodes and unused values; returns how many nodes.
pub fn eliminate_dead_nodes(g: &mut Graph) -> usize {
    let mut live = vec![false; g.values.len()];
    for &o in &g.outputs {
        live[o] = true;
    }
    let mut keep = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate().rev() {
        if node.outputs.iter().any(|&o| live[o]) {
            keep[i] = true;
            for &v in &node.inputs {
                live[v] = true;
            }
        }
    }
    let before = g.nodes.len();
    let mut flags = keep.into_iter();
    g.nodes.retain(|_| flags.next().unwrap_or(true));
    // values still referred to: graph inputs (the graph's interface), node inputs and outputs,
    // graph outputs, patterns
    let mut used = vec![false; g.values.len()];
    let patterns: Vec<ValueId> = g
        .patterns
        .iter()
        .flat_map(|p| match p {
            Pattern::SqueezeExcite(s) => [s.input, s.pooled, s.squeezed, s.gate, s.output],
        })
        .collect();
    for &v in g
        .inputs
        .iter()
        .chain(&g.outputs)
        .chain(
            g.nodes
                .iter()
                .flat_map(|n| n.inputs.iter().chain(&n.outputs)),
        )
        .chain(&patterns)
    {
        used[v] = true;
    }
    let mut remap = vec![usize::MAX; g.values.len()];
    let mut next = 0;
    for (old, &u) in used.iter().enumerate() {
        if u {
            remap[old] = next;
            next += 1;
        }
    }
    let mut flags = used.into_iter();
    g.values.retain(|_| flags.next().unwrap_or(true));
    let map = |v: &mut ValueId| *v = remap[*v];
    g.inputs.iter_mut().for_each(map);
    g.outputs.iter_mut().for_each(map);
    for n in &mut g.nodes {
        n.inputs
            .iter_mut()
            .chain(n.outputs.iter_mut())
            .for_each(map);
    }
    for p in &mut g.patterns {
        let Pattern::SqueezeExcite(s) = p;
        for v in [
            &mut s.input,
            &mut s.pooled,
            &mut s.squeezed,
            &mut s.gate,
            &mut s.output,
        ] {
            map(v);
        }
    }
    before - g.nodes.len()
}
