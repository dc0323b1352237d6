//! The multilayer perceptron: linear layers with ReLU between them (none after the last), as
//! PyTorch's `nn.Sequential(nn.Linear, nn.ReLU, ..., nn.Linear)` and with its state-dict
//! names (`0.weight`, `0.bias`, `2.weight`, ...). Forward keeps each layer's output for the
//! backward pass; backward gives every parameter's gradient through three products a layer
//! (`x W^T`, `dy^T x`, `dy W`) on the gemm crate.

use crate::error::{Error, Result};
use crate::real::Real;
use gpukit_tensor::cpu::gemm_t;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One linear layer: `y = x W^T + b`, W stored as PyTorch stores it (outputs x inputs).
#[derive(Debug, Clone, PartialEq)]
pub struct Linear<T> {
    pub inputs: usize,
    pub outputs: usize,
    /// outputs x inputs, row-major.
    pub weight: Vec<T>,
    /// outputs values.
    pub bias: Vec<T>,
}

/// Linear layers with ReLU between.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp<T> {
    pub layers: Vec<Linear<T>>,
}

/// What forward keeps for backward: the input and every layer's output (after its ReLU; the
/// last layer's raw output is the model's output).
#[derive(Debug, Default, Clone)]
pub struct Activations<T> {
    /// Rows of the batch.
    pub n: usize,
    /// outs[0] is the input batch; outs[i + 1] is layer i's output (with checkpointing only
    /// every segment-th and the last are kept; the others are empty).
    pub outs: Vec<Vec<T>>,
    /// Layers a checkpointed segment spans; None: every output kept.
    pub segment: Option<usize>,
    /// Checkpointed forward's running buffer.
    recompute: Vec<T>,
    /// Backward's recomputed inputs of one segment.
    segment_inputs: Vec<Vec<T>>,
}

impl<T: Real> Activations<T> {
    /// The model's output: n x outputs of the last layer.
    pub fn output(&self) -> &[T] {
        self.outs.last().map_or(&[], Vec::as_slice)
    }
}

/// Gradients of every parameter, shaped like the model's.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads<T> {
    pub weight: Vec<Vec<T>>,
    pub bias: Vec<Vec<T>>,
}

impl<T: Real> Grads<T> {
    /// Zeros for every parameter of `model`.
    pub fn zeros(model: &Mlp<T>) -> Grads<T> {
        Grads {
            weight: model
                .layers
                .iter()
                .map(|l| vec![T::ZERO; l.weight.len()])
                .collect(),
            bias: model
                .layers
                .iter()
                .map(|l| vec![T::ZERO; l.bias.len()])
                .collect(),
        }
    }

    /// Sets every gradient to zero (kept allocated).
    pub fn clear(&mut self) {
        for g in self.weight.iter_mut().chain(self.bias.iter_mut()) {
            g.fill(T::ZERO);
        }
    }
}

/// Parses `--layers`: widths separated by commas, at least an input and an output, each at
/// least 1.
pub fn parse_widths(s: &str) -> Result<Vec<usize>> {
    let widths: Vec<usize> = s
        .split(',')
        .map(|w| {
            w.trim()
                .parse::<usize>()
                .ok()
                .filter(|&w| w >= 1)
                .ok_or_else(|| {
                    Error::Setting(format!(
                        "--layers {s:?}: {w:?} is not a layer width (a whole number, at least 1)"
                    ))
                })
        })
        .collect::<Result<_>>()?;
    if widths.len() < 2 {
        return Err(Error::Setting(format!(
            "--layers {s:?}: needs at least two widths (inputs, outputs), e.g. 16,64,1"
        )));
    }
    Ok(widths)
}

impl<T: Real> Mlp<T> {
    /// The model of `widths` (inputs, hidden..., outputs) initialised as PyTorch's nn.Linear
    /// does by default: weight and bias uniform in (-1/sqrt(inputs), 1/sqrt(inputs)), here from
    /// a seeded ChaCha8 stream (the values differ from PyTorch's generator; `--init` loads
    /// PyTorch's own).
    pub fn new(widths: &[usize], seed: u64) -> Mlp<T> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let layers = widths
            .windows(2)
            .map(|w| {
                let (inputs, outputs) = (w[0], w[1]);
                let bound = 1.0 / (inputs as f64).sqrt();
                let mut draw = |count: usize| -> Vec<T> {
                    (0..count)
                        .map(|_| T::from_f64(rng.random_range(-bound..bound)))
                        .collect()
                };
                let weight = draw(outputs * inputs);
                let bias = draw(outputs);
                Linear {
                    inputs,
                    outputs,
                    weight,
                    bias,
                }
            })
            .collect();
        Mlp { layers }
    }

    /// inputs, hidden widths, outputs.
    pub fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.layers.iter().map(|l| l.inputs).collect();
        w.extend(self.layers.last().map(|l| l.outputs));
        w
    }

    /// The number of parameters (weights and biases).
    pub fn parameters(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.weight.len() + l.bias.len())
            .sum()
    }

    /// PyTorch's state-dict name of layer `i`'s weight or bias in an nn.Sequential with ReLU
    /// between the linear layers: the linear layers sit at indices 0, 2, 4, ...
    pub fn name(i: usize, what: &str) -> String {
        format!("{}.{what}", 2 * i)
    }

    /// Every parameter with its state-dict name and shape, weights then bias per layer.
    pub fn named(&self) -> Vec<(String, Vec<usize>, &[T])> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                [
                    (
                        Self::name(i, "weight"),
                        vec![l.outputs, l.inputs],
                        l.weight.as_slice(),
                    ),
                    (Self::name(i, "bias"), vec![l.outputs], l.bias.as_slice()),
                ]
            })
            .collect()
    }

    /// Runs the batch `x` (n x inputs) through the model, keeping what backward needs in
    /// `acts` (its buffers are reused between calls).
    pub fn forward(&self, x: &[T], n: usize, acts: &mut Activations<T>) {
        acts.n = n;
        acts.segment = None;
        acts.outs.resize_with(self.layers.len() + 1, Vec::new);
        acts.outs[0].clear();
        acts.outs[0].extend_from_slice(x);
        for i in 0..self.layers.len() {
            let (done, rest) = acts.outs.split_at_mut(i + 1);
            self.layer_forward(i, &done[i], n, &mut rest[0]);
        }
    }

    /// Forward with activation checkpointing: keeps only every `segment`-th layer's input
    /// (and the output); [`Mlp::backward`] recomputes the others, one segment at a time. About
    /// `layers / segment + segment` layer outputs are held instead of `layers`, for one more
    /// forward pass of compute. The outputs and gradients are the same, bit for bit.
    pub fn forward_checkpointed(
        &self,
        x: &[T],
        n: usize,
        segment: usize,
        acts: &mut Activations<T>,
    ) {
        let segment = segment.max(1);
        let layers = self.layers.len();
        acts.n = n;
        acts.segment = Some(segment);
        acts.outs.resize_with(layers + 1, Vec::new);
        acts.outs[0].clear();
        acts.outs[0].extend_from_slice(x);
        let mut h = std::mem::take(&mut acts.recompute);
        let mut z = Vec::new();
        h.clear();
        h.extend_from_slice(x);
        for i in 0..layers {
            self.layer_forward(i, &h, n, &mut z);
            std::mem::swap(&mut h, &mut z);
            let keep = i + 1 == layers || (i + 1) % segment == 0;
            if keep {
                acts.outs[i + 1].clear();
                acts.outs[i + 1].extend_from_slice(&h);
            } else {
                // not kept: its memory goes back
                acts.outs[i + 1] = Vec::new();
            }
        }
        acts.recompute = h;
    }

    /// Layer `i` on the batch `h` (n x inputs) into `z` (n x outputs): `h W^T + b`, then ReLU
    /// unless it is the last layer.
    fn layer_forward(&self, i: usize, h: &[T], n: usize, z: &mut Vec<T>) {
        let l = &self.layers[i];
        let last = i + 1 == self.layers.len();
        z.resize(n * l.outputs, T::ZERO);
        gemm_t((false, true), (n, l.outputs, l.inputs), h, &l.weight, z);
        for row in z.chunks_exact_mut(l.outputs) {
            for (v, &b) in row.iter_mut().zip(&l.bias) {
                *v += b;
                // ReLU; a NaN stays NaN (comparisons with it are false), so a diverged run
                // shows as a non-finite loss instead of being masked to zero
                if !last && *v < T::ZERO {
                    *v = T::ZERO;
                }
            }
        }
    }

    /// Adds to `grads` the gradient of the loss whose gradient with respect to the model's
    /// output is `dy` (n x outputs), for the batch whose forward pass left `acts` (either
    /// forward: a checkpointed one's missing layer inputs are recomputed here, a segment at a
    /// time). `scratch` holds the running gradients between layers (reused between calls).
    pub fn backward(
        &self,
        acts: &mut Activations<T>,
        dy: &[T],
        grads: &mut Grads<T>,
        scratch: &mut Backward<T>,
    ) {
        let n = acts.n;
        scratch.g.clear();
        scratch.g.extend_from_slice(dy);
        let layers = self.layers.len();
        let segment = acts.segment.unwrap_or(1).max(1);
        // segments [start, end) of layers, last first; with every output kept each is a layer
        let mut end = layers;
        while end > 0 {
            let start = (end - 1) / segment * segment;
            // the inputs of layers start+1 .. end-1, recomputed from the kept input of `start`
            let mut inputs = std::mem::take(&mut acts.segment_inputs);
            inputs.resize_with(end - start, Vec::new);
            if acts.segment.is_some() {
                for i in start..end - 1 {
                    let (done, rest) = inputs.split_at_mut(i - start + 1);
                    let h = if i == start {
                        &acts.outs[start]
                    } else {
                        &done[i - start]
                    };
                    self.layer_forward(i, h, n, &mut rest[0]);
                }
            }
            for i in (start..end).rev() {
                let h = if acts.segment.is_none() || i == start {
                    &acts.outs[i]
                } else {
                    &inputs[i - start]
                };
                self.layer_backward(i, h, n, grads, scratch);
            }
            acts.segment_inputs = inputs;
            end = start;
        }
    }

    /// One layer's backward: its weight and bias gradients from the running gradient
    /// `scratch.g` and its input `h`, then (but for the first layer) the running gradient with
    /// respect to `h`, through the ReLU that made `h`.
    fn layer_backward(
        &self,
        i: usize,
        h: &[T],
        n: usize,
        grads: &mut Grads<T>,
        scratch: &mut Backward<T>,
    ) {
        let l = &self.layers[i];
        // dW = dy^T h: (outputs x n) (n x inputs)
        scratch.dw.resize(l.weight.len(), T::ZERO);
        gemm_t(
            (true, false),
            (l.outputs, l.inputs, n),
            &scratch.g,
            h,
            &mut scratch.dw,
        );
        for (a, &d) in grads.weight[i].iter_mut().zip(&scratch.dw) {
            *a += d;
        }
        for row in scratch.g.chunks_exact(l.outputs) {
            for (a, &d) in grads.bias[i].iter_mut().zip(row) {
                *a += d;
            }
        }
        if i == 0 {
            return;
        }
        // dh = dy W: (n x outputs) (outputs x inputs), then through the ReLU that made h
        scratch.prev.resize(n * l.inputs, T::ZERO);
        gemm_t(
            (false, false),
            (n, l.inputs, l.outputs),
            &scratch.g,
            &l.weight,
            &mut scratch.prev,
        );
        // ReLU's gradient: through where its output was positive, zero elsewhere (NaN too)
        for (d, &hv) in scratch.prev.iter_mut().zip(h) {
            if hv.partial_cmp(&T::ZERO) != Some(std::cmp::Ordering::Greater) {
                *d = T::ZERO;
            }
        }
        std::mem::swap(&mut scratch.g, &mut scratch.prev);
    }
}

/// Buffers backward reuses between calls.
#[derive(Debug, Default, Clone)]
pub struct Backward<T> {
    g: Vec<T>,
    prev: Vec<T>,
    dw: Vec<T>,
}

impl<T> Backward<T> {
    /// Bytes its buffers hold (their capacity: the largest use so far).
    pub fn bytes(&self) -> usize {
        (self.g.capacity() + self.prev.capacity() + self.dw.capacity()) * std::mem::size_of::<T>()
    }
}

impl<T> Activations<T> {
    /// Bytes the kept layer outputs and the recomputation buffers hold (their capacity: the
    /// largest batch so far).
    pub fn bytes(&self) -> usize {
        let kept: usize = self.outs.iter().map(Vec::capacity).sum();
        let recomputed: usize = self.segment_inputs.iter().map(Vec::capacity).sum();
        (kept + recomputed + self.recompute.capacity()) * std::mem::size_of::<T>()
    }
}

#[cfg(test)]
mod tests;
