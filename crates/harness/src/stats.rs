//! Summary statistics of repeated measurements: what every gpukit figure is reported with.

use serde::{Deserialize, Serialize};

/// Order statistics and spread of a set of samples (milliseconds, or any unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// Coefficient of variation: standard deviation over mean (0.02 = 2%).
    pub cv: f64,
}

impl Summary {
    /// Summarises `samples`; None when empty or when any sample is not finite (a broken timer
    /// must not become a figure).
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let mean = s.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Some(Summary {
            count: n,
            median: quantile(&s, 0.5),
            p10: quantile(&s, 0.1),
            p90: quantile(&s, 0.9),
            min: s[0],
            max: s[n - 1],
            mean,
            cv: if mean != 0.0 { var.sqrt() / mean } else { 0.0 },
        })
    }
}

/// Linear interpolation between closest ranks (the same rule as numpy's default), on sorted data.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_numpy_linear_rule() {
        // numpy.percentile([1..=10], [10, 50, 90]) = 1.9, 5.5, 9.1
        let xs: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let s = Summary::of(&xs).unwrap();
        assert_eq!(s.count, 10);
        assert!((s.p10 - 1.9).abs() < 1e-12);
        assert!((s.median - 5.5).abs() < 1e-12);
        assert!((s.p90 - 9.1).abs() < 1e-12);
        assert_eq!((s.min, s.max), (1.0, 10.0));
        assert!((s.mean - 5.5).abs() < 1e-12);
        // sample std of 1..10 is 3.02765
        assert!((s.cv - 3.0276503540974917 / 5.5).abs() < 1e-12);
    }

    #[test]
    fn one_sample_has_no_spread() {
        let s = Summary::of(&[2.5]).unwrap();
        assert_eq!((s.median, s.p10, s.p90, s.cv), (2.5, 2.5, 2.5, 0.0));
    }

    #[test]
    fn empty_or_non_finite_gives_none() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
        assert!(Summary::of(&[f64::INFINITY]).is_none());
    }
}
