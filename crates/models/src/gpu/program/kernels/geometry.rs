//! How a launch's geometry reaches the engine's kernels: the pooling window, the codes of
//! activations and binary operations, the order of a view's axes in memory, and the `Dims`
//! struct's values (with the magic numbers that replace divisions).

use super::super::Strided;
use crate::graph::{Activation, Binary};

/// A pooling window, as the pool kernel takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    /// top, left, bottom, right.
    pub pads: [usize; 4],
    pub max: bool,
    pub count_include_pad: bool,
}

/// The code of an activation in the kernels, and its two parameters.
pub(super) fn activation_code(a: Option<Activation>) -> (i32, f32, f32) {
    match a {
        None => (0, 0.0, 0.0),
        Some(Activation::Relu) => (1, 0.0, 0.0),
        Some(Activation::Sigmoid) => (2, 0.0, 0.0),
        Some(Activation::HardSigmoid { alpha, beta }) => (3, alpha, beta),
        Some(Activation::HardSwish) => (4, 0.0, 0.0),
        Some(Activation::Gelu) => (5, 0.0, 0.0),
        Some(Activation::Silu) => (6, 0.0, 0.0),
    }
}

/// The code of a binary operation in the pointwise kernel.
pub(super) fn binary_code(b: Binary) -> i32 {
    match b {
        Binary::Add => 1,
        Binary::Sub => 2,
        Binary::Mul => 3,
        Binary::Div => 4,
    }
}

/// The axes of `s` from its largest stride to its smallest (size-1 axes first, in order): the
/// order a kernel visits elements in to touch memory consecutively.
pub(super) fn memory_order(s: &Strided) -> [usize; 4] {
    let mut order = [0usize, 1, 2, 3];
    order.sort_by_key(|&i| (s.dims[i] != 1, std::cmp::Reverse(s.strides[i]), i));
    order
}

/// The bytes of a `Dims` argument.
pub(super) fn dims_bytes(v: &[i64; 32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// The magic number of `n / d` by a multiply and a shift for `n < 2^31` (`fdiv` in the
/// kernels): m in the low 32 bits, the shift above.
pub(super) fn fast_divisor(d: usize) -> i64 {
    let d = d.max(1) as u128;
    let shift = 128 - (d - 1).leading_zeros(); // ceil(log2 d)
    let m = ((1u128 << 32) * ((1u128 << shift) - d)) / d + 1;
    (m as u32) as i64 | (i64::from(shift) << 32)
}

/// Puts the magic numbers of `divisors` at `at` and, after them, whether indices below
/// `total` fit 31 bits (else the kernels divide).
pub(super) fn put_divisors(v: &mut [i64; 32], at: usize, divisors: [usize; 3], total: usize) {
    for (i, d) in divisors.into_iter().enumerate() {
        v[at + i] = fast_divisor(d);
    }
    v[at + 3] = i64::from(total < (1 << 31) && divisors.iter().all(|&d| d < (1 << 31)));
}

pub(super) fn put(v: &mut [i64; 32], at: usize, values: &[usize]) {
    for (i, &x) in values.iter().enumerate() {
        v[at + i] = x as i64;
    }
}
