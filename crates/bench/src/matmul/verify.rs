//! The check every matmul row passes before its figure is reported: sampled entries against a
//! float64 product of the same stored inputs.

use super::tolerance;
use crate::report::Verification;
use gpukit_tensor::codec::element_f64;
use gpukit_tensor::DType;

/// Host copies of one pair of inputs, in their storage type.
pub(super) struct HostPair {
    pub a: Vec<u8>,
    pub b: Vec<u8>,
}

/// Checks `c` (row-major n x n, storage `ty`) against a float64 product of the stored inputs on
/// a grid of sampled rows and columns. NaN anywhere in the sample fails.
pub(super) fn verify_square(
    ty: DType,
    dtype: DType,
    pair: &HostPair,
    c: &[u8],
    n: usize,
    seed: u64,
) -> Verification {
    let picks = 16.min(n);
    let mut s = seed | 1;
    let mut pick = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut rows: Vec<usize> = (0..picks).map(|_| pick()).collect();
    let mut cols: Vec<usize> = (0..picks).map(|_| pick()).collect();
    // the corners catch edge-tile bugs at sizes that are not multiples of the tile
    rows[0] = n - 1;
    cols[0] = n - 1;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let mut nan = false;
    for &i in &rows {
        let arow: Vec<f64> = (0..n)
            .map(|p| element_f64(&pair.a, ty, i * n + p))
            .collect();
        for &j in &cols {
            let r: f64 = (0..n)
                .map(|p| arow[p] * element_f64(&pair.b, ty, p * n + j))
                .sum();
            let got = element_f64(c, ty, i * n + j);
            nan |= !got.is_finite();
            num += (got - r).powi(2);
            den += r * r;
        }
    }
    let rel_err = if nan {
        f64::INFINITY
    } else {
        (num / den.max(f64::MIN_POSITIVE)).sqrt()
    };
    let tolerance = tolerance(dtype);
    Verification {
        samples: rows.len() * cols.len(),
        rel_err,
        tolerance,
        passed: rel_err <= tolerance,
    }
}
