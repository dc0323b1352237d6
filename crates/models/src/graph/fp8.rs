//! fp8 (E4M3) inference simulated on the CPU: the reference an fp8 GPU strategy is judged
//! against, and the calibration it takes its scales from. Every convolution's and matrix
//! product's float operands are rounded to E4M3 with a scale, and the product is computed in
//! f32 from the rounded values, as TensorRT's explicit quantization (a quantize-dequantize
//! pair before each product) does:
//! - the input activation per tensor, with the scale calibration found;
//! - constant weights per output channel, from their own largest magnitude (a weight that is
//!   not a constant is calibrated per tensor like an activation).
//!
//! [`calibrate`] runs the graph in f32 on sample inputs and keeps, for each quantized node,
//! the largest magnitude its input reached ([`Method::Max`]) or a high percentile of the
//! magnitudes ([`Method::Percentile`]): the value E4M3's largest, 448, stands for.
//! [`forward_fp8`] runs the graph with those scales. [`judge`] sets the fp8 run beside the f32
//! one on inputs calibration did not see: top-1 agreement and the logits' relative error, and
//! each quantized node's own error (its output from quantized operands against f32's, both
//! from the f32 run's inputs, so upstream error is left out), worst first: the layer fp8 hurts
//! most is named.

use super::cpu::{forward_cpu, forward_cpu_tapped, run_op, Array, Elems, NodeTap, Seen, View};
use super::{Graph, GraphError, Node, Op, OutType};
use gpukit_tensor::codec::E4M3_MAX;
use serde::{Deserialize, Serialize};

/// How calibration turns an input's magnitudes into the value E4M3's largest stands for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Method {
    /// The largest magnitude seen (nothing saturates on the calibration data).
    Max,
    /// This percentile of the magnitudes seen, in (0, 100]: the few larger ones saturate, the
    /// rest keep more precision.
    Percentile(f64),
}

impl Method {
    pub fn name(&self) -> String {
        match self {
            Method::Max => "max (the largest magnitude seen)".into(),
            Method::Percentile(p) => format!("percentile {p} of the magnitudes seen"),
        }
    }
}

/// How a node's weight operand is scaled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WeightScales {
    /// One scale an output channel of a constant weight.
    PerChannel(Vec<f32>),
    /// One scale for the whole operand (a weight computed by the graph).
    PerTensor(f32),
}

/// One quantized node's scales: a real value x is stored as E4M3(x / scale).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeScales {
    pub node: String,
    pub input: f32,
    pub weight: WeightScales,
}

/// What calibration found, to be kept beside the weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fp8Scales {
    pub method: Method,
    /// Calibration batches run.
    pub batches: usize,
    pub nodes: Vec<NodeScales>,
}

/// The fp8 run against the f32 one on inputs calibration did not see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fp8Accuracy {
    /// Rows of the first output compared (its last axis is the classes).
    pub rows: usize,
    /// Rows whose largest logit is the same class in both runs.
    pub top1_agreement: f64,
    /// Over rows: |fp8 - f32| / |f32| of the row's logits (Euclidean norms).
    pub max_rel_error: f64,
    pub mean_rel_error: f64,
    /// Each quantized node's own relative error, worst first.
    pub layers: Vec<LayerError>,
}

/// A quantized node's output from quantized operands against f32's, from the same inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerError {
    pub node: String,
    pub rel_error: f64,
}

impl Fp8Accuracy {
    /// Ok, or why the row fails (top-1 agreement below `min_agreement`, or a logits error
    /// above `max_rel_error`), naming the node fp8 hurts most.
    pub fn verdict(&self, min_agreement: f64, max_rel_error: f64) -> Result<(), String> {
        let worst = self
            .layers
            .first()
            .map(|l| {
                format!(
                    "; the worst layer is {} ({:.3e} of its own output)",
                    l.node, l.rel_error
                )
            })
            .unwrap_or_default();
        if self.top1_agreement < min_agreement {
            return Err(format!(
                "fp8 agrees with f32 on the top class of {:.2}% of {} rows (needs {:.2}%){worst}",
                self.top1_agreement * 100.0,
                self.rows,
                min_agreement * 100.0
            ));
        }
        if self.max_rel_error > max_rel_error {
            return Err(format!(
                "fp8's logits are {:.3e} from f32's (allowed {max_rel_error:.1e}){worst}",
                self.max_rel_error
            ));
        }
        Ok(())
    }
}

/// `v` rounded to the nearest E4M3 value (ties to even), a magnitude of 448 or more
/// saturating to 448, NaN kept: what `e4m3_to_f64(e4m3_from_f64(v))` gives, on f32's bits.
pub fn e4m3_round(v: f32) -> f32 {
    let a = v.abs();
    if a.is_nan() {
        return v;
    }
    let r = if a >= E4M3_MAX as f32 {
        E4M3_MAX as f32
    } else if a < 2f32.powi(-6) {
        // subnormal E4M3: multiples of 2^-9 (exact in f32)
        (a * 512.0).round_ties_even() / 512.0
    } else {
        // keep 3 of f32's 23 mantissa bits, to nearest with ties to even (a carry moves the
        // exponent up, as it should)
        let bits = a.to_bits();
        let half = (1u32 << 19) - 1 + ((bits >> 20) & 1);
        f32::from_bits((bits + half) & !((1u32 << 20) - 1))
    };
    r.copysign(v)
}

/// Elements from which [`fake_quant`] splits the work over the CPU's threads.
const PARALLEL_FROM: usize = 1 << 16;

/// `values` rounded to E4M3 with `scale` and back: scale x E4M3(x / scale), a magnitude
/// beyond 448 x scale saturating.
pub fn fake_quant(values: &[f32], scale: f32) -> Vec<f32> {
    use rayon::prelude::*;
    let q = |&v: &f32| e4m3_round(v / scale) * scale;
    if values.len() >= PARALLEL_FROM {
        values.par_iter().map(q).collect()
    } else {
        values.iter().map(q).collect()
    }
}

/// The scale that maps `amax` to E4M3's largest value (1 for an all-zero operand).
fn scale_for(amax: f64) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        (amax / E4M3_MAX) as f32
    } else {
        1.0
    }
}

/// Whether node `node` is quantized: a convolution, Gemm or MatMul.
fn quantized(node: &Node) -> bool {
    matches!(node.op, Op::Conv(_) | Op::Gemm(_) | Op::MatMul)
}

/// Output channels of a constant weight of `shape` for `op`, and for element i its channel:
/// (channel count, rows (true: the channel is the leading axis; false: the last)).
fn channel_layout(op: &Op, shape: &[usize]) -> Option<(usize, bool)> {
    match op {
        Op::Conv(_) => shape.first().map(|&k| (k, true)),
        Op::Gemm(g) if shape.len() == 2 => Some(if g.trans_b {
            (shape[0], true)
        } else {
            (shape[1], false)
        }),
        Op::MatMul => shape.last().map(|&n| (n, false)),
        _ => None,
    }
}

/// The channel of element `i` of a weight with `channels` along its leading axis (`rows`) or
/// its last axis.
fn channel_of(i: usize, len: usize, channels: usize, rows: bool) -> usize {
    if rows {
        i / (len / channels).max(1)
    } else {
        i % channels
    }
}

/// Per-channel scales of a constant weight.
fn weight_scales(values: &[f32], channels: usize, rows: bool) -> Vec<f32> {
    let mut amax = vec![0f64; channels];
    for (i, &v) in values.iter().enumerate() {
        let c = channel_of(i, values.len(), channels, rows);
        amax[c] = amax[c].max(f64::from(v).abs());
    }
    amax.into_iter().map(scale_for).collect()
}

/// A constant weight rounded with its per-channel scales.
fn quantize_per_channel(values: &[f32], scales: &[f32], rows: bool) -> Vec<f32> {
    let channels = scales.len();
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = scales[channel_of(i, values.len(), channels, rows)];
            e4m3_round(v / s) * s
        })
        .collect()
}

/// Most magnitudes a node keeps for a percentile (every k-th element beyond that).
const KEPT: usize = 1 << 20;

/// What calibration gathers of one operand: the largest magnitude, and for a percentile an
/// even sample of the magnitudes (every `stride`-th, the stride doubling whenever the sample
/// reaches twice [`KEPT`]).
struct Magnitudes {
    max: f64,
    kept: Vec<f32>,
    seen: usize,
    stride: usize,
}

impl Default for Magnitudes {
    fn default() -> Self {
        Magnitudes {
            max: 0.0,
            kept: Vec::new(),
            seen: 0,
            stride: 1,
        }
    }
}

impl Magnitudes {
    fn add(&mut self, values: &[f32], keep: bool) {
        for &v in values {
            let a = v.abs();
            self.max = self.max.max(f64::from(a));
            if keep && self.seen.is_multiple_of(self.stride) {
                self.kept.push(a);
                if self.kept.len() >= 2 * KEPT {
                    self.kept = self.kept.iter().step_by(2).copied().collect();
                    self.stride *= 2;
                }
            }
            self.seen += 1;
        }
    }

    fn amax(&mut self, method: Method) -> f64 {
        match method {
            Method::Max => self.max,
            Method::Percentile(p) => {
                if self.kept.is_empty() {
                    return self.max;
                }
                let n = self.kept.len();
                let at = ((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1;
                let (_, v, _) = self.kept.select_nth_unstable_by(at, f32::total_cmp);
                f64::from(*v)
            }
        }
    }
}

/// Calibration's tap: each quantized node's input (and a computed weight's) magnitudes.
struct Calibrating {
    method: Method,
    seen: Vec<Option<[Magnitudes; 2]>>,
}

impl NodeTap for Calibrating {
    fn inputs(&mut self, index: usize, _: &Node, inputs: &[Seen<'_>]) -> Vec<Option<Vec<f32>>> {
        let keep = matches!(self.method, Method::Percentile(_));
        if let Some(Some(m)) = self.seen.get_mut(index) {
            for (k, operand) in inputs.iter().take(2).enumerate() {
                if let Some(v) = operand.values {
                    m[k].add(v, keep);
                }
            }
        }
        Vec::new()
    }
}

/// Runs `graph` in f32 on each of `batches` (one input set each) and returns every quantized
/// node's scales by `method`.
pub fn calibrate(
    graph: &Graph,
    batches: &[Vec<Array>],
    method: Method,
) -> Result<Fp8Scales, GraphError> {
    if let Method::Percentile(p) = method {
        if !(p > 0.0 && p <= 100.0) {
            return Err(GraphError::Structure(format!(
                "calibration percentile {p}: must be in (0, 100]"
            )));
        }
    }
    if batches.is_empty() {
        return Err(GraphError::Structure(
            "calibration needs at least one batch of inputs".into(),
        ));
    }
    let mut tap = Calibrating {
        method,
        seen: graph
            .nodes
            .iter()
            .map(|n| quantized(n).then(Default::default))
            .collect(),
    };
    for inputs in batches {
        forward_cpu_tapped(graph, inputs, &mut tap)?;
    }
    let mut nodes = Vec::new();
    for (node, seen) in graph.nodes.iter().zip(tap.seen.iter_mut()) {
        let Some([x, w]) = seen else { continue };
        let weight = node.inputs.get(1).map(|&id| &graph.values[id]);
        let weight = match weight.and_then(|v| Some((v, v.constant.as_ref()?.as_f32()?))) {
            Some((v, values)) => match channel_layout(&node.op, &v.shape) {
                Some((channels, rows)) if channels > 0 => {
                    WeightScales::PerChannel(weight_scales(values, channels, rows))
                }
                _ => WeightScales::PerTensor(scale_for(
                    values.iter().fold(0f64, |m, &a| m.max(f64::from(a).abs())),
                )),
            },
            None => WeightScales::PerTensor(scale_for(w.amax(method))),
        };
        nodes.push(NodeScales {
            node: node.name.clone(),
            input: scale_for(x.amax(method)),
            weight,
        });
    }
    Ok(Fp8Scales {
        method,
        batches: batches.len(),
        nodes,
    })
}

/// For each node of the graph, its quantized operands' recipe: the input's scale, and the
/// weight already rounded (a constant) or its per-tensor scale.
enum Recipe {
    Plain,
    Quantized { input: f32, weight: QuantizedWeight },
}

enum QuantizedWeight {
    Rounded(Vec<f32>),
    PerTensor(f32),
}

fn recipes(graph: &Graph, scales: &Fp8Scales) -> Result<Vec<Recipe>, GraphError> {
    recipes_keeping(graph, scales, &[])
}

/// [`recipes`] with the nodes named in `kept` left out of fp8.
fn recipes_keeping(
    graph: &Graph,
    scales: &Fp8Scales,
    kept: &[String],
) -> Result<Vec<Recipe>, GraphError> {
    let by_name: std::collections::HashMap<&str, &NodeScales> =
        scales.nodes.iter().map(|n| (n.node.as_str(), n)).collect();
    graph
        .nodes
        .iter()
        .map(|node| {
            if !quantized(node) || kept.contains(&node.name) {
                return Ok(Recipe::Plain);
            }
            let s = by_name
                .get(node.name.as_str())
                .ok_or_else(|| GraphError::Node {
                    node: node.name.clone(),
                    op: node.op.name().to_string(),
                    problem:
                        "the fp8 scales have none for this node (calibrated on another graph?)"
                            .into(),
                })?;
            let weight = match &s.weight {
                WeightScales::PerTensor(t) => QuantizedWeight::PerTensor(*t),
                WeightScales::PerChannel(per) => {
                    let v = node.inputs.get(1).map(|&id| &graph.values[id]);
                    let values = v.and_then(|v| v.constant.as_ref()?.as_f32());
                    let layout = v.and_then(|v| channel_layout(&node.op, &v.shape));
                    match (values, layout) {
                        (Some(values), Some((channels, rows))) if channels == per.len() => {
                            QuantizedWeight::Rounded(quantize_per_channel(values, per, rows))
                        }
                        _ => {
                            return Err(GraphError::Node {
                                node: node.name.clone(),
                                op: node.op.name().to_string(),
                                problem: format!(
                                    "{} per-channel weight scales do not fit its weight",
                                    per.len()
                                ),
                            })
                        }
                    }
                }
            };
            Ok(Recipe::Quantized {
                input: s.input,
                weight,
            })
        })
        .collect()
}

/// The operands a quantized node runs on: its input and weight rounded (None where kept).
fn rounded(recipe: &Recipe, inputs: &[Seen<'_>]) -> Vec<Option<Vec<f32>>> {
    let Recipe::Quantized { input, weight } = recipe else {
        return Vec::new();
    };
    let mut out: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
    if let Some(x) = inputs.first().and_then(|s| s.values) {
        out[0] = Some(fake_quant(x, *input));
    }
    if let Some(w) = inputs.get(1).and_then(|s| s.values) {
        out[1] = Some(match weight {
            QuantizedWeight::Rounded(r) => r.clone(),
            QuantizedWeight::PerTensor(t) => fake_quant(w, *t),
        });
    }
    out
}

/// The fp8 run's tap: every quantized node's operands rounded.
struct Rounding(Vec<Recipe>);

impl NodeTap for Rounding {
    fn inputs(&mut self, index: usize, _: &Node, inputs: &[Seen<'_>]) -> Vec<Option<Vec<f32>>> {
        self.0
            .get(index)
            .map_or_else(Vec::new, |r| rounded(r, inputs))
    }
}

/// Runs `graph` with every convolution's and matrix product's operands rounded to E4M3 by
/// `scales`, the rest in f32.
pub fn forward_fp8(
    graph: &Graph,
    scales: &Fp8Scales,
    inputs: &[Array],
) -> Result<Vec<Array>, GraphError> {
    forward_fp8_keeping(graph, scales, &[], inputs)
}

/// [`forward_fp8`] with the nodes named in `kept` left out of fp8 (their operands as they come).
pub fn forward_fp8_keeping(
    graph: &Graph,
    scales: &Fp8Scales,
    kept: &[String],
    inputs: &[Array],
) -> Result<Vec<Array>, GraphError> {
    let mut tap = Rounding(recipes_keeping(graph, scales, kept)?);
    forward_cpu_tapped(graph, inputs, &mut tap)
}

/// Rows of a first output compared: how many keep their top class, and each row's relative
/// error (Euclidean norms), the rows being runs of `classes` values.
fn compare_rows(reference: &[f32], fp8: &[f32], classes: usize) -> (usize, Vec<f64>) {
    let top = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
    };
    let mut agree = 0;
    let mut rels = Vec::new();
    for (a, b) in reference.chunks(classes).zip(fp8.chunks(classes)) {
        agree += usize::from(top(a) == top(b));
        let d: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum();
        let n: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum();
        rels.push(if n > 0.0 { (d / n).sqrt() } else { d.sqrt() });
    }
    (agree, rels)
}

/// A graph's first output as f32 rows of its last axis.
fn first_output(outputs: &[Array]) -> Result<(&[f32], usize), GraphError> {
    let first = outputs
        .first()
        .ok_or_else(|| GraphError::Structure("the graph has no output".into()))?;
    let values = first
        .as_f32()
        .ok_or_else(|| GraphError::Structure("the graph's first output is not f32".into()))?;
    Ok((values, first.shape.last().copied().unwrap_or(1).max(1)))
}

/// Layers to keep out of fp8 so that `min_agreement` of the rows keep their top class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rescue {
    /// The layers kept out (the ones fp8 hurts most, worst first).
    pub kept: Vec<String>,
    /// The rows' top-1 agreement with them kept out.
    pub top1_agreement: f64,
    /// Whether that meets the agreement asked for (false: even `kept`, the most tried, fall
    /// short).
    pub enough: bool,
}

/// The fewest of `worst` (layers, worst first, as [`judge`] orders them) to keep out of fp8 so
/// that `min_agreement` of `batches`' rows keep f32's top class, trying at most `most`: counts
/// 1, 2, 4, ... until one is enough, then halving between the last two (agreement grows with
/// the layers kept out, nearly always: a count found this way is the fewest under that
/// assumption). Judged on the rows given: pass rows other than the ones chosen on to confirm.
pub fn rescue(
    graph: &Graph,
    scales: &Fp8Scales,
    batches: &[Vec<Array>],
    worst: &[LayerError],
    min_agreement: f64,
    most: usize,
) -> Result<Rescue, GraphError> {
    let references = batches
        .iter()
        .map(|inputs| forward_cpu(graph, inputs))
        .collect::<Result<Vec<_>, _>>()?;
    let most = most.min(worst.len());
    let names = |k: usize| -> Vec<String> { worst[..k].iter().map(|l| l.node.clone()).collect() };
    let agreement = |k: usize| -> Result<f64, GraphError> {
        let kept = names(k);
        let (mut agree, mut rows) = (0, 0);
        for (inputs, reference) in batches.iter().zip(&references) {
            let fp8 = forward_fp8_keeping(graph, scales, &kept, inputs)?;
            let (r, classes) = first_output(reference)?;
            let (q, _) = first_output(&fp8)?;
            let (a, rels) = compare_rows(r, q, classes);
            agree += a;
            rows += rels.len();
        }
        Ok(agree as f64 / rows.max(1) as f64)
    };
    if most == 0 {
        let a = agreement(0)?;
        return Ok(Rescue {
            kept: Vec::new(),
            top1_agreement: a,
            enough: a >= min_agreement,
        });
    }
    let (mut below, mut k) = (0, 1);
    let mut found: Option<(usize, f64)> = None;
    let mut last = (0, 0.0);
    while k <= most {
        let a = agreement(k)?;
        last = (k, a);
        if a >= min_agreement {
            found = Some((k, a));
            break;
        }
        below = k;
        if k == most {
            break;
        }
        k = (k * 2).min(most);
    }
    let Some((mut hi, mut hi_a)) = found else {
        return Ok(Rescue {
            kept: names(last.0),
            top1_agreement: last.1,
            enough: false,
        });
    };
    while hi - below > 1 {
        let mid = (below + hi) / 2;
        let a = agreement(mid)?;
        if a >= min_agreement {
            (hi, hi_a) = (mid, a);
        } else {
            below = mid;
        }
    }
    Ok(Rescue {
        kept: names(hi),
        top1_agreement: hi_a,
        enough: true,
    })
}

/// Each quantized node's own error during an f32 run: its output from rounded operands
/// (computed beside) against the f32 output, as sums of squares.
struct LocalError {
    recipes: Vec<Recipe>,
    outs: Vec<Vec<OutType>>,
    pending: Option<(usize, Vec<f32>)>,
    /// (sum of (fp8 - f32)^2, sum of f32^2) a node.
    sums: Vec<(f64, f64)>,
    error: Option<String>,
}

impl NodeTap for LocalError {
    fn inputs(&mut self, index: usize, node: &Node, inputs: &[Seen<'_>]) -> Vec<Option<Vec<f32>>> {
        let replaced = rounded(&self.recipes[index], inputs);
        // the products' operands are all floats; a node with another input is left out
        if replaced.is_empty() || inputs.iter().any(|s| s.values.is_none()) {
            return Vec::new();
        }
        let views: Vec<View> = inputs
            .iter()
            .zip(&replaced)
            .map(|(s, r)| View {
                shape: s.shape,
                data: Elems::Real(match (r, s.values) {
                    (Some(r), _) => r.as_slice(),
                    (None, v) => v.unwrap_or(&[]),
                }),
            })
            .collect();
        match run_op(&node.op, &views, &self.outs[index]) {
            Ok(mut out) => {
                if let Some(first) = out
                    .drain(..)
                    .next()
                    .and_then(|d| d.as_f32().map(<[f32]>::to_vec))
                {
                    self.pending = Some((index, first));
                }
            }
            Err(e) => {
                self.error.get_or_insert(format!("{}: {e}", node.name));
            }
        }
        Vec::new()
    }

    fn outputs(&mut self, index: usize, _: &Node, outputs: &[Seen<'_>]) {
        let Some((at, fp8)) = self.pending.take() else {
            return;
        };
        if at != index {
            return;
        }
        if let Some(reference) = outputs.first().and_then(|s| s.values) {
            let s = &mut self.sums[index];
            for (&a, &b) in fp8.iter().zip(reference) {
                let d = f64::from(a) - f64::from(b);
                s.0 += d * d;
                s.1 += f64::from(b) * f64::from(b);
            }
        }
    }
}

/// The fp8 run beside the f32 one on each of `batches` (inputs calibration did not see): the
/// first output's rows (its last axis the classes) compared, and every quantized node's own
/// error.
pub fn judge(
    graph: &Graph,
    scales: &Fp8Scales,
    batches: &[Vec<Array>],
) -> Result<Fp8Accuracy, GraphError> {
    let mut local = LocalError {
        recipes: recipes(graph, scales)?,
        outs: graph
            .nodes
            .iter()
            .map(|n| {
                n.outputs
                    .iter()
                    .map(|&o| (graph.values[o].dtype, graph.values[o].shape.clone()))
                    .collect()
            })
            .collect(),
        pending: None,
        sums: vec![(0.0, 0.0); graph.nodes.len()],
        error: None,
    };
    let (mut rows, mut agree, mut max_rel, mut sum_rel) = (0usize, 0usize, 0f64, 0f64);
    for inputs in batches {
        let reference = forward_cpu_tapped(graph, inputs, &mut local)?;
        if let Some(e) = local.error.take() {
            return Err(GraphError::Structure(format!("fp8 operands of {e}")));
        }
        let fp8 = forward_fp8(graph, scales, inputs)?;
        let (r, classes) = first_output(&reference)?;
        let (q, _) = first_output(&fp8)?;
        let (a, rels) = compare_rows(r, q, classes);
        agree += a;
        rows += rels.len();
        for rel in rels {
            max_rel = max_rel.max(rel);
            sum_rel += rel;
        }
    }
    let mut layers: Vec<LayerError> = graph
        .nodes
        .iter()
        .zip(&local.sums)
        .filter(|(n, _)| quantized(n))
        .map(|(n, &(d, r))| LayerError {
            node: n.name.clone(),
            rel_error: if r > 0.0 { (d / r).sqrt() } else { d.sqrt() },
        })
        .collect();
    layers.sort_by(|a, b| b.rel_error.total_cmp(&a.rel_error));
    Ok(Fp8Accuracy {
        rows,
        top1_agreement: agree as f64 / rows.max(1) as f64,
        max_rel_error: max_rel,
        mean_rel_error: sum_rel / rows.max(1) as f64,
        layers,
    })
}

/// Sample inputs from a safetensors file's bytes: the f32 tensor named `input` (the model's
/// input), or named `x`, or the file's only tensor, of shape `[n, row...]`. Returns n and the
/// values; anything else is why not.
pub fn samples_from_safetensors(
    bytes: &[u8],
    input: &str,
    row: &[usize],
) -> Result<(usize, Vec<f32>), String> {
    use safetensors::tensor::{Dtype, SafeTensors};
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let names = file.names();
    let name = if names.contains(&input) {
        input.to_string()
    } else if names.contains(&"x") {
        "x".to_string()
    } else if let [only] = names.as_slice() {
        (*only).to_string()
    } else {
        return Err(format!(
            "holds {} tensors ({}) and none is named {input} (the model's input) or x",
            names.len(),
            names
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let t = file
        .tensor(&name)
        .map_err(|e| format!("tensor {name}: {e}"))?;
    if t.dtype() != Dtype::F32 {
        return Err(format!("tensor {name} is {:?}; samples are F32", t.dtype()));
    }
    match t.shape().split_first() {
        Some((&n, rest)) if rest == row && n > 0 => {
            let values = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Ok((n, values))
        }
        _ => Err(format!(
            "tensor {name} has shape {:?}; the model's input takes [n, {}]",
            t.shape(),
            row.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
#[path = "fp8_tests.rs"]
mod tests;
