//! Fresh random inputs for every benchmark: uniform in [-1, 1) or standard normal, generated
//! in parallel, never zeros (zeros hide unwritten outputs and run faster than real data on some
//! chips).

//!
//! Each chunk of the output draws from its own stream of one ChaCha8 generator (the seed picks
//! the generator, the chunk's index its stream), so the values depend on the seed alone, not on
//! how many threads drew them.

pub use crate::kernels::Distribution;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution as _, StandardNormal, Uniform};
use rayon::prelude::*;

/// A seed that differs between runs (drawn from the operating system's generator), so every run
/// checks new inputs.
pub fn fresh_seed() -> u64 {
    rand::rng().random()
}

const CHUNK: usize = 1 << 16;

/// Fills `out` chunk by chunk, each chunk from its own stream of the seed's generator.
fn fill<T: Send>(out: &mut [T], seed: u64, draw: impl Fn(&mut ChaCha8Rng) -> T + Sync) {
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(i as u64);
            for x in chunk {
                *x = draw(&mut rng);
            }
        });
}

/// Fills `out` with uniform values in [-1, 1); the same seed gives the same values.
pub fn fill_uniform_f32(out: &mut [f32], seed: u64) {
    let d = Uniform::new(-1.0f32, 1.0).expect("a finite, non-empty range");
    fill(out, seed, |r| d.sample(r));
}

/// Fills `out` with uniform f64 values in [-1, 1) (all 53 bits random).
pub fn fill_uniform_f64(out: &mut [f64], seed: u64) {
    let d = Uniform::new(-1.0f64, 1.0).expect("a finite, non-empty range");
    fill(out, seed, |r| d.sample(r));
}

/// `n` uniform values in [-1, 1).
pub fn uniform_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut v = vec![0f32; n];
    fill_uniform_f32(&mut v, seed);
    v
}

/// Fills `out` with standard normal values (mean 0, deviation 1, as `torch.randn` draws); the
/// same seed gives the same values.
pub fn fill_normal_f32(out: &mut [f32], seed: u64) {
    fill(out, seed, |r| StandardNormal.sample(r));
}

/// `fill_normal_f32` at full f64 precision (all 53 bits of the mantissa random), so an f64
/// benchmark multiplies real f64 data, not f32 values widened.
pub fn fill_normal_f64(out: &mut [f64], seed: u64) {
    fill(out, seed, |r| StandardNormal.sample(r));
}

/// `n` standard normal values.
pub fn normal_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut v = vec![0f32; n];
    fill_normal_f32(&mut v, seed);
    v
}

/// `n` standard normal values at full f64 precision.
pub fn normal_f64(n: usize, seed: u64) -> Vec<f64> {
    let mut v = vec![0f64; n];
    fill_normal_f64(&mut v, seed);
    v
}

/// `n` uniform values in [-1, 1) at full f64 precision.
pub fn uniform_f64(n: usize, seed: u64) -> Vec<f64> {
    let mut v = vec![0f64; n];
    fill_uniform_f64(&mut v, seed);
    v
}

/// Fills `out` with fp8 E4M3 bytes: uniform values in [-2, 2), or standard normal ones, each
/// rounded to the nearest E4M3 value (so the stored inputs are the values drawn, rounded once);
/// the same seed gives the same bytes.
pub fn fill_e4m3(out: &mut [u8], seed: u64, dist: Distribution) {
    match dist {
        Distribution::Uniform => {
            let d = Uniform::new(-2.0f32, 2.0).expect("a finite, non-empty range");
            fill(out, seed, |r| {
                crate::codec::e4m3_from_f64(f64::from(d.sample(r)))
            });
        }
        Distribution::Normal => fill(out, seed, |r| {
            let v: f32 = StandardNormal.sample(r);
            crate::codec::e4m3_from_f64(f64::from(v))
        }),
    }
}

/// Random bytes (for copy benchmarks).
pub fn fill_bytes(out: &mut [u8], seed: u64) {
    out.par_chunks_mut(CHUNK * 8)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(i as u64);
            rng.fill(chunk);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_draws_stay_in_range_and_spread_over_it() {
        let mut v = vec![0u8; 100_000];
        fill_e4m3(&mut v, 7, Distribution::Uniform);
        let x: Vec<f64> = v.iter().map(|&b| crate::codec::e4m3_to_f64(b)).collect();
        assert!(
            x.iter().all(|&x| (-2.0..=2.0).contains(&x)),
            "out of [-2, 2]"
        );
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|x| x * x).sum::<f64>() / x.len() as f64;
        // uniform on [-2, 2): mean 0, variance 4/3 (rounding to E4M3 moves it little)
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 4.0 / 3.0).abs() < 0.03, "variance {var}");
        let mut w = vec![0u8; 100_000];
        fill_e4m3(&mut w, 7, Distribution::Uniform);
        assert_eq!(v, w, "the same seed gives the same bytes");
        fill_e4m3(&mut w, 7, Distribution::Normal);
        assert!(w.iter().all(|&b| b & 0x7f != 0x7f), "no NaN");
        assert_ne!(v, w);
    }

    #[test]
    fn normal_values_have_unit_deviation_and_gaussian_tails() {
        let v = normal_f32(200_001, fresh_seed());
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        // six standard errors each (a fresh seed fails a right generator about once in 10^9
        // runs): the mean's is 1/sqrt(n), the variance's sqrt(2/n)
        assert!(mean.abs() < 6.0 / n.sqrt(), "mean {mean}");
        assert!((var - 1.0).abs() < 6.0 * (2.0 / n).sqrt(), "variance {var}");
        // P(|x| > 2) = 4.55% for a standard normal; a uniform or a constant fails this
        let beyond = v.iter().filter(|x| x.abs() > 2.0).count() as f64 / n;
        assert!(
            (beyond - 0.0455).abs() < 0.004,
            "share beyond 2 sigma {beyond}"
        );
        assert!(v.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn f64_draws_use_the_whole_mantissa() {
        // an f32 widened to f64 has its low 29 mantissa bits zero; real f64 data does not
        let low_bits_zero = |v: &[f64]| {
            v.iter()
                .filter(|x| x.to_bits() & ((1 << 29) - 1) == 0)
                .count()
        };
        let n = normal_f64(100_000, fresh_seed());
        let u = uniform_f64(10_000, fresh_seed());
        assert!(low_bits_zero(&n) < 10 && low_bits_zero(&u) < 10);
        assert!(u.iter().all(|x| (-1.0..1.0).contains(x)));
        let len = n.len() as f64;
        let mean = n.iter().sum::<f64>() / len;
        let var = n.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / len;
        // six standard errors each, as above
        assert!(
            mean.abs() < 6.0 / len.sqrt() && (var - 1.0).abs() < 6.0 * (2.0 / len).sqrt(),
            "{mean} {var}"
        );
    }

    #[test]
    fn uniform_values_cover_the_range_and_are_not_constant() {
        let v = uniform_f32(100_000, fresh_seed());
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        let zeros = v.iter().filter(|&&x| x == 0.0).count();
        assert!(zeros < 10);
        assert!(v.iter().any(|&x| x < -0.9) && v.iter().any(|&x| x > 0.9));
    }

    #[test]
    fn seeds_reproduce_and_differ() {
        assert_eq!(uniform_f32(1000, 7), uniform_f32(1000, 7));
        assert_ne!(uniform_f32(1000, 7), uniform_f32(1000, 8));
        assert_ne!(fresh_seed(), fresh_seed());
        let mut a = vec![0u8; 1 << 20];
        fill_bytes(&mut a, 3);
        let distinct: std::collections::HashSet<u8> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
