//! Deterministic initialisation in torchvision's manner, for runs without a weights file.

use super::{Param, StateDict};
use crate::resnet::ResNet;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// One key's values: a ChaCha8 stream of the seed, chosen by the key's name (its FNV-1a hash),
/// so a key's values do not depend on which other keys exist.
#[derive(Clone)]
struct KeyStream(ChaCha8Rng);

/// Values drawn per task when a key is drawn on several threads: each task seeks its stream to
/// where its first value's bits begin, so the values are those of one sequential draw.
const CHUNK: usize = 1 << 16;

impl KeyStream {
    fn new(seed: u64, key: &str) -> KeyStream {
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(hash);
        KeyStream(rng)
    }

    /// The stream moved on by `draws` 64-bit draws (two 32-bit words each).
    fn skipped(&self, draws: usize) -> KeyStream {
        let mut rng = self.0.clone();
        rng.set_word_pos(rng.get_word_pos() + 2 * draws as u128);
        KeyStream(rng)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `n` values uniform in [lo, hi): value i from draw i.
    fn uniforms(&self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        let mut out = vec![0f32; n];
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, chunk)| {
                let mut s = self.skipped(i * CHUNK);
                for v in chunk {
                    *v = (lo + (hi - lo) * s.unit()) as f32;
                }
            });
        out
    }

    /// `n` normal values by Box-Muller, both outputs of each pair used: pair j from draws 2j and
    /// 2j+1.
    fn normals(&self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        let mut out = vec![0f32; n];
        // CHUNK is even, so every chunk starts at a pair
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, chunk)| {
                let mut s = self.skipped(i * CHUNK);
                for pair in chunk.chunks_mut(2) {
                    // 1 - u lies in (0, 1], keeping the logarithm away from 0
                    let r = (-2.0 * libm::log(1.0 - s.unit())).sqrt();
                    let t = std::f64::consts::TAU * s.unit();
                    pair[0] = (mean + std * r * libm::cos(t)) as f32;
                    if let Some(second) = pair.get_mut(1) {
                        *second = (mean + std * r * libm::sin(t)) as f32;
                    }
                }
            });
        out
    }
}

/// Deterministic initialisation in torchvision's manner: convolution weights
/// kaiming_normal_(mode="fan_out", nonlinearity="relu") i.e. normal(0, sqrt(2 / (out*k*k)));
/// batch-norm weight 1, bias 0, running_mean 0, running_var 1; fc weight and bias uniform in
/// [-1/sqrt(in), 1/sqrt(in)] (PyTorch's Linear default). The same seed gives the same values on
/// every machine: ChaCha8 bits, and Box-Muller with `libm`'s logarithm and trigonometry (pure
/// Rust, so not the platform's libm, whose last bit differs between systems).
/// To make inference tests meaningful (torchvision's zero-init of the last BN in each residual
/// block is NOT used; all BN weights are 1) also perturb running_mean/running_var slightly when
/// `realistic_bn` is true: running_mean ~ normal(0, 0.1), running_var ~ uniform(0.5, 1.5),
/// bn weight ~ uniform(0.5, 1.5), bn bias ~ normal(0, 0.1), so that batch-norm folding is
/// actually exercised by tests.
///
/// Each key draws from its own stream (seeded from `seed` and the key's name), so a key's values
/// do not change when other keys are added or resized, e.g. with another `num_classes`.
pub fn seeded_init(model: ResNet, num_classes: usize, seed: u64, realistic_bn: bool) -> StateDict {
    let specs = model.state_dict(num_classes);
    let fc_in = specs
        .iter()
        .find(|s| s.name == "fc.weight")
        .and_then(|s| s.shape.get(1).copied())
        .unwrap_or(1);
    let fc_bound = 1.0 / (fc_in.max(1) as f64).sqrt();
    let drawn: Vec<(String, Param)> = specs
        .into_par_iter()
        .map(|spec| {
            let n: usize = spec.shape.iter().product();
            let rng = KeyStream::new(seed, &spec.name);
            let leaf = spec.name.rsplit('.').next().unwrap_or("");
            let data = match (spec.shape.as_slice(), leaf) {
                ([out, _, kh, kw], _) => {
                    let fan_out = (out * kh * kw).max(1) as f64;
                    rng.normals(n, 0.0, (2.0 / fan_out).sqrt())
                }
                _ if spec.name.starts_with("fc.") => rng.uniforms(n, -fc_bound, fc_bound),
                (_, "weight") if realistic_bn => rng.uniforms(n, 0.5, 1.5),
                (_, "bias") if realistic_bn => rng.normals(n, 0.0, 0.1),
                (_, "running_mean") if realistic_bn => rng.normals(n, 0.0, 0.1),
                (_, "running_var") if realistic_bn => rng.uniforms(n, 0.5, 1.5),
                (_, "weight" | "running_var") => vec![1.0; n],
                _ => vec![0.0; n],
            };
            (
                spec.name,
                Param {
                    shape: spec.shape,
                    data,
                },
            )
        })
        .collect();
    let params: BTreeMap<String, Param> = drawn.into_iter().collect();
    StateDict {
        model,
        num_classes,
        params,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draws of one thread in order: what the chunked draw must equal.
    fn sequential_normals(mut s: KeyStream, n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let r = (-2.0 * libm::log(1.0 - s.unit())).sqrt();
            let t = std::f64::consts::TAU * s.unit();
            out.push((r * libm::cos(t)) as f32);
            if out.len() < n {
                out.push((r * libm::sin(t)) as f32);
            }
        }
        out
    }

    #[test]
    fn chunked_draws_equal_one_sequential_draw() {
        // odd, and across several chunk boundaries
        let n = 3 * CHUNK + 12_345;
        let s = KeyStream::new(11, "layer4.0.conv2.weight");
        assert_eq!(s.normals(n, 0.0, 1.0), sequential_normals(s.clone(), n));
        let mut seq = s.clone();
        let uniform: Vec<f32> = (0..n).map(|_| (-1.0 + 2.0 * seq.unit()) as f32).collect();
        assert_eq!(s.uniforms(n, -1.0, 1.0), uniform);
    }

    #[test]
    fn streams_are_pinned_and_normal() {
        // the values every machine draws for seed 7 and one key (a change here changes every
        // seeded model: do it on purpose only)
        let s = KeyStream::new(7, "conv1.weight");
        let first: Vec<f32> = s.normals(4, 0.0, 1.0);
        let again: Vec<f32> = KeyStream::new(7, "conv1.weight").normals(4, 0.0, 1.0);
        assert_eq!(first, again);
        assert_ne!(first, KeyStream::new(7, "fc.weight").normals(4, 0.0, 1.0));
        assert_ne!(
            first,
            KeyStream::new(8, "conv1.weight").normals(4, 0.0, 1.0)
        );
        let v = KeyStream::new(1, "x").normals(100_000, 0.0, 1.0);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
        let u = KeyStream::new(1, "y").uniforms(10_000, 0.5, 1.5);
        assert!(u.iter().all(|x| (0.5..1.5).contains(x)));
    }
}
