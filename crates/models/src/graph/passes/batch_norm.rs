//! BatchNormalization folded into the Conv before it: `w' = w * a`, `b' = (b - mean) * a +
//! beta` with `a = gamma / sqrt(var + eps)` per output channel, in f64. Only where the Conv's
//! output feeds the batch norm alone, the Conv has no epilogue yet, and every parameter is a
//! constant. A batch norm after anything else (DenseNet's) stays.

use super::Uses;
use crate::graph::{Data, Graph, Op};

/// Folds every foldable batch norm; returns how many.
pub fn fold_batch_norms(g: &mut Graph) -> usize {
    let mut folded = 0;
    let mut bn_index = 0;
    while bn_index < g.nodes.len() {
        if let Some(()) = fold_one(g, bn_index) {
            folded += 1;
        } else {
            bn_index += 1;
        }
    }
    folded
}

/// Folds the batch norm at `at` into its Conv (removing it), if it can be.
fn fold_one(g: &mut Graph, at: usize) -> Option<()> {
    let Op::BatchNorm { epsilon } = g.nodes[at].op else {
        return None;
    };
    let uses = Uses::new(g);
    let bn = &g.nodes[at];
    let y = bn.inputs[0];
    let (ci, conv) = uses.producer(g, y)?;
    let Op::Conv(c) = &conv.op else {
        return None;
    };
    uses.only_reader(g, y)?;
    if c.epilogue != Default::default() {
        return None;
    }
    let constant = |v: usize| g.values[v].constant.as_ref().and_then(Data::as_f32);
    let [scale, beta, mean, var] = [1, 2, 3, 4].map(|i| constant(bn.inputs[i]));
    let (scale, beta, mean, var) = (scale?, beta?, mean?, var?);
    let w = constant(conv.inputs[1])?;
    let k = scale.len();
    let bias = match c.bias {
        true => constant(conv.inputs[2])?.to_vec(),
        false => vec![0.0; k],
    };
    let per_out = w.len() / k.max(1);
    let a: Vec<f64> = (0..k)
        .map(|o| f64::from(scale[o]) / (f64::from(var[o]) + f64::from(epsilon)).sqrt())
        .collect();
    let new_w: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, &x)| (f64::from(x) * a[i / per_out]) as f32)
        .collect();
    let new_b: Vec<f32> = (0..k)
        .map(|o| ((f64::from(bias[o]) - f64::from(mean[o])) * a[o] + f64::from(beta[o])) as f32)
        .collect();
    let (w_shape, out) = (g.values[conv.inputs[1]].shape.clone(), bn.outputs.clone());
    let (w_name, bn_name) = (format!("{}.weight", conv.name), bn.name.clone());
    let w_id = g.push_constant(&w_name, w_shape, Data::F32(new_w));
    let b_id = g.push_constant(
        &format!("{}.bias", g.nodes[ci].name),
        vec![k],
        Data::F32(new_b),
    );
    let conv = &mut g.nodes[ci];
    conv.inputs = vec![conv.inputs[0], w_id, b_id];
    conv.outputs = out;
    conv.name = format!("{}+{bn_name}", conv.name);
    if let Op::Conv(c) = &mut conv.op {
        c.bias = true;
    }
    g.nodes.remove(at);
    Some(())
}
