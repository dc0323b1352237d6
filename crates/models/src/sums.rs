//! Summing in f64 where f32's rounding grows: what the GPU engine's and the CPU interpreter's
//! f32 programs share to decide which convolutions sum in f64 (decision 183). An f32 row is
//! judged by 1e-5 from float64; on deep networks the f32 sums of the early convolutions, grown
//! through the blocks after them, take it past that (ResNet-50: 2e-5 and more).

/// How far (relative, max |a - b| / max |b| over each output) a program's outputs may be from
/// those with every candidate convolution summed in f64, on one random input, before the
/// earliest convolutions left on f32 sums move to f64 too. The all-f64 programs of run 117
/// sat at 0.1-2.6e-6 from float64.
pub const SUM_BUDGET: f64 = 4e-6;

/// `distance(0)` and the smallest `j` in `0..=count` with `distance(j) <= budget`, by
/// bisection: `distance(count)` is taken to be within (everything moved), and `distance` to
/// fall as `j` grows.
pub fn fewest_within<E>(
    count: usize,
    budget: f64,
    distance: &mut impl FnMut(usize) -> Result<f64, E>,
) -> Result<(f64, usize), E> {
    let before = distance(0)?;
    if before <= budget {
        return Ok((before, 0));
    }
    let (mut bad, mut good) = (0, count);
    while good - bad > 1 {
        let mid = (bad + good) / 2;
        match distance(mid)? <= budget {
            true => good = mid,
            false => bad = mid,
        }
    }
    Ok((before, good))
}

/// max |got - want| / max |want| (infinite where `got` has a value that is not finite, or the
/// lengths differ).
pub fn relative(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let diff = got.iter().zip(want).fold(0f64, |m, (a, b)| {
        m.max((f64::from(*a) - f64::from(*b)).abs())
    });
    diff / scale.max(f64::MIN_POSITIVE)
}

/// The largest [`relative`] distance over outputs taken in pairs.
pub fn largest_distance<'a>(pairs: impl Iterator<Item = (&'a [f32], &'a [f32])>) -> f64 {
    pairs.map(|(g, w)| relative(g, w)).fold(0f64, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_moves_within_the_budget_are_found_in_few_runs() {
        // distance after moving j of 24: 2.25e-5 falling by 1e-6 a move (4.5e-6 at 18, 3.5e-6 at 19)
        let mut runs = 0;
        let mut d = |j: usize| -> Result<f64, ()> {
            runs += 1;
            Ok(2.25e-5 - 1e-6 * j as f64)
        };
        let (before, j) = fewest_within(24, 4e-6, &mut d).unwrap();
        assert_eq!((before, j), (2.25e-5, 19));
        assert!(runs <= 1 + 5, "{runs} runs");
        // within already: nothing moves, one run
        let mut within = |_: usize| -> Result<f64, ()> { Ok(1e-6) };
        assert_eq!(fewest_within(10, 4e-6, &mut within).unwrap(), (1e-6, 0));
        // never within until everything moves
        let mut far = |j: usize| -> Result<f64, ()> { Ok(if j < 7 { 1.0 } else { 0.0 }) };
        assert_eq!(fewest_within(7, 4e-6, &mut far).unwrap().1, 7);
    }

    #[test]
    fn distances_are_relative_to_the_largest_value_and_infinite_for_nan() {
        assert_eq!(relative(&[1.0, 2.0], &[1.0, 4.0]), 0.5);
        assert_eq!(relative(&[1.0, f32::NAN], &[1.0, 4.0]), f64::INFINITY);
        assert_eq!(relative(&[1.0], &[1.0, 4.0]), f64::INFINITY);
        let (a, b) = (vec![1.0f32, 2.0], vec![1.0f32, 4.0]);
        let (c, d) = (vec![3.0f32], vec![4.0f32]);
        let pairs = [(&a[..], &b[..]), (&c[..], &d[..])];
        assert_eq!(largest_distance(pairs.into_iter()), 0.5);
    }
}
