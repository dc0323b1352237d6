//! Losses with their gradients, as PyTorch defines them with `reduction="mean"`:
//! `MSELoss` averages over every element, `CrossEntropyLoss` over the samples (log-softmax
//! computed stably, by subtracting each row's largest logit).

use crate::real::Real;

/// The loss a run minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    Mse,
    CrossEntropy,
}

impl LossKind {
    pub fn name(self) -> &'static str {
        match self {
            LossKind::Mse => "mse",
            LossKind::CrossEntropy => "cross-entropy",
        }
    }
}

/// The targets of one batch, as the loss reads them.
#[derive(Debug, Clone, Copy)]
pub enum BatchTargets<'a, T> {
    /// n x width values (MSE).
    Values(&'a [T]),
    /// One class index a sample (cross-entropy).
    Classes(&'a [u32]),
}

/// The loss of `out` (n x width) against `targets` (values: MSE; classes: cross-entropy, the
/// pairing `LossKind` chose when the data was read), and its gradient with respect to `out`
/// times `scale` written to `grad` (`scale` is 1/K under gradient accumulation over K
/// batches: PyTorch's tutorial divides the loss by K). Returns the unscaled mean loss, and for
/// classes the number of samples whose largest logit is the target's.
pub fn loss_and_grad<T: Real>(
    out: &[T],
    width: usize,
    targets: BatchTargets<'_, T>,
    scale: f64,
    grad: &mut Vec<T>,
) -> (f64, Option<usize>) {
    grad.resize(out.len(), T::ZERO);
    match targets {
        BatchTargets::Values(t) => (mse(out, t, scale, grad), None),
        BatchTargets::Classes(c) => {
            let (loss, correct) = cross_entropy(out, width, c, scale, grad);
            (loss, Some(correct))
        }
    }
}

/// mean((out - t)^2); d/d out = 2 (out - t) / count.
fn mse<T: Real>(out: &[T], t: &[T], scale: f64, grad: &mut [T]) -> f64 {
    let count = out.len().max(1) as f64;
    let k = T::from_f64(2.0 * scale / count);
    let mut sum = 0.0;
    for ((g, &o), &t) in grad.iter_mut().zip(out).zip(t) {
        let d = o - t;
        sum += (d * d).to_f64();
        *g = k * d;
    }
    sum / count
}

/// mean over samples of (logsumexp(row) - row[target]); d/d row = (softmax(row) - onehot) / n.
fn cross_entropy<T: Real>(
    out: &[T],
    width: usize,
    classes: &[u32],
    scale: f64,
    grad: &mut [T],
) -> (f64, usize) {
    let n = classes.len().max(1) as f64;
    let k = T::from_f64(scale / n);
    let (mut sum, mut correct) = (0.0, 0);
    for ((row, g), &c) in out
        .chunks_exact(width)
        .zip(grad.chunks_exact_mut(width))
        .zip(classes)
    {
        let c = c as usize;
        let (arg, max, total) = exp_row(row, g);
        correct += usize::from(arg == c);
        sum += (total.ln() + max - row[c]).to_f64();
        for (j, gj) in g.iter_mut().enumerate() {
            let p = *gj / total;
            *gj = k * if j == c { p - T::from_f64(1.0) } else { p };
        }
    }
    (sum / n, correct)
}

/// One row of logits' softmax numerators, computed stably: `g_j = exp(z_j - max)`; the first
/// largest logit's index, the largest logit and the numerators' sum.
pub(crate) fn exp_row<T: Real>(row: &[T], g: &mut [T]) -> (usize, T, T) {
    let mut max = row[0];
    let mut arg = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > max {
            max = v;
            arg = j;
        }
    }
    let mut total = T::ZERO;
    for (gj, &v) in g.iter_mut().zip(row) {
        *gj = (v - max).exp();
        total += *gj;
    }
    (arg, max, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The float64 losses straight from their definitions, on fresh random inputs.
    #[test]
    fn losses_match_their_definitions() {
        let seed = gpukit_tensor::random::fresh_seed();
        let (n, w) = (7, 5);
        let out = gpukit_tensor::random::normal_f64(n * w, seed);
        let t = gpukit_tensor::random::normal_f64(n * w, seed ^ 1);
        let mut g = Vec::new();
        let (l, _) = loss_and_grad(&out, w, BatchTargets::Values(&t), 1.0, &mut g);
        let want: f64 = out
            .iter()
            .zip(&t)
            .map(|(o, t)| (o - t).powi(2))
            .sum::<f64>()
            / 35.0;
        assert!((l - want).abs() < 1e-12, "{seed}: {l} vs {want}");
        let classes: Vec<u32> = (0..n as u32).map(|i| (i * 3) % w as u32).collect();
        let (l, correct) = loss_and_grad(&out, w, BatchTargets::Classes(&classes), 1.0, &mut g);
        let mut want = 0.0;
        let mut want_correct = 0;
        for (row, &c) in out.chunks(w).zip(&classes) {
            let z: f64 = row.iter().map(|v| v.exp()).sum();
            want += z.ln() - row[c as usize];
            let arg = (0..w).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            want_correct += usize::from(arg == c as usize);
        }
        assert!((l - want / n as f64).abs() < 1e-12, "{seed}: {l}");
        assert_eq!(correct, Some(want_correct));
    }

    /// Each gradient against central differences of the loss itself, in float64.
    #[test]
    fn gradients_match_finite_differences() {
        let seed = gpukit_tensor::random::fresh_seed();
        let (n, w) = (4, 3);
        let out = gpukit_tensor::random::normal_f64(n * w, seed);
        let t = gpukit_tensor::random::normal_f64(n * w, seed ^ 2);
        let classes = [0u32, 2, 1, 2];
        for targets in [
            BatchTargets::Values(&t[..]),
            BatchTargets::Classes(&classes[..]),
        ] {
            let mut g = Vec::new();
            loss_and_grad(&out, w, targets, 0.5, &mut g);
            let mut scratch = Vec::new();
            for i in 0..out.len() {
                let h = 1e-6;
                let mut p = out.clone();
                p[i] += h;
                let up = loss_and_grad(&p, w, targets, 1.0, &mut scratch).0;
                p[i] -= 2.0 * h;
                let down = loss_and_grad(&p, w, targets, 1.0, &mut scratch).0;
                // scale 0.5 halves the gradient, not the loss
                let fd = 0.5 * (up - down) / (2.0 * h);
                assert!(
                    (g[i] - fd).abs() < 1e-8,
                    "{seed} {targets:?} [{i}]: {} vs {fd}",
                    g[i]
                );
            }
        }
    }
}
