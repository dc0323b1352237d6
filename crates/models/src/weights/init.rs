//! Deterministic initialisation in torchvision's manner, for runs without a weights file.

use super::{Param, StateDict};
use crate::resnet::ResNet;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

/// One key's values: a ChaCha8 stream of the seed, chosen by the key's name (its FNV-1a hash),
/// so a key's values do not depend on which other keys exist.
struct KeyStream(ChaCha8Rng);

impl KeyStream {
    fn new(seed: u64, key: &str) -> KeyStream {
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(hash);
        KeyStream(rng)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn uniforms(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (hi - lo) * self.unit()) as f32)
            .collect()
    }

    /// Box-Muller, both outputs of each pair used.
    fn normals(&mut self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            // 1 - u lies in (0, 1], keeping the logarithm away from 0
            let r = (-2.0 * libm::log(1.0 - self.unit())).sqrt();
            let t = std::f64::consts::TAU * self.unit();
            out.push((mean + std * r * libm::cos(t)) as f32);
            if out.len() < n {
                out.push((mean + std * r * libm::sin(t)) as f32);
            }
        }
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
    let mut params = BTreeMap::new();
    for spec in specs {
        let n: usize = spec.shape.iter().product();
        let mut rng = KeyStream::new(seed, &spec.name);
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
        params.insert(
            spec.name,
            Param {
                shape: spec.shape,
                data,
            },
        );
    }
    StateDict {
        model,
        num_classes,
        params,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pinned_and_normal() {
        // the values every machine draws for seed 7 and one key (a change here changes every
        // seeded model: do it on purpose only)
        let mut s = KeyStream::new(7, "conv1.weight");
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
