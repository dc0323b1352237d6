//! Conv epilogues: an activation, and a residual Add (then an activation), that read a Conv's
//! output alone are fused into the Conv ([`Epilogue`](crate::graph::Epilogue)), the order a
//! cuDNN fused convolution applies them in (`act(conv + bias + residual)`). The fused node
//! takes the place of the last node it replaces, where all its inputs are computed.

use super::{other_input, Uses};
use crate::graph::{Binary, Graph, Op};

/// Fuses every fusable activation and residual; returns how many.
pub fn fuse_conv_epilogues(g: &mut Graph) -> usize {
    let mut fused = 0;
    while fuse_one(g) {
        fused += 1;
    }
    fused
}

fn fuse_one(g: &mut Graph) -> bool {
    let uses = Uses::new(g);
    for (ci, node) in g.nodes.iter().enumerate() {
        let Op::Conv(c) = &node.op else { continue };
        if c.epilogue.activation.is_some() {
            continue;
        }
        let y = node.outputs[0];
        let Some((ui, reader)) = uses.only_reader(g, y) else {
            continue;
        };
        match &reader.op {
            Op::Activation(a) => {
                let (a, out) = (*a, reader.outputs.clone());
                let conv = &mut g.nodes[ci];
                if let Op::Conv(c) = &mut conv.op {
                    c.epilogue.activation = Some(a);
                }
                conv.outputs = out;
                g.nodes.remove(ui);
                return true;
            }
            Op::Binary(Binary::Add) if !c.epilogue.residual => {
                let Some(r) = other_input(reader, y) else {
                    continue;
                };
                if g.values[r].shape != g.values[y].shape || g.values[r].dtype != g.values[y].dtype
                {
                    continue;
                }
                let mut conv = g.nodes[ci].clone();
                conv.inputs.push(r);
                conv.outputs = reader.outputs.clone();
                if let Op::Conv(c) = &mut conv.op {
                    c.epilogue.residual = true;
                }
                g.nodes[ui] = conv;
                g.nodes.remove(ci);
                return true;
            }
            _ => {}
        }
    }
    false
}
