//! Cross-entropy with label smoothing as PyTorch defines it (`nn.CrossEntropyLoss(
//! label_smoothing=eps)`, mean over the batch): for logits z of a sample with class y over C
//! classes, `loss = (1 - eps) (-log p_y) + eps mean_j(-log p_j)`, p = softmax(z). Its
//! gradient is `(p - q) / n` with `q = (1 - eps) onehot(y) + eps / C`.

use crate::real::Real;

/// The mean smoothed cross-entropy of `logits` (n rows of `classes`) against `labels`, its
/// gradient with respect to the logits written to `grad`, and how many rows' largest logit is
/// the label.
///
/// # Panics
///
/// If a label is not below `classes` or the sizes disagree.
pub fn cross_entropy_smoothed<T: Real>(
    logits: &[T],
    classes: usize,
    labels: &[u32],
    smoothing: f64,
    grad: &mut Vec<T>,
) -> (f64, usize) {
    assert_eq!(logits.len(), labels.len() * classes, "logits and labels");
    grad.clear();
    grad.resize(logits.len(), T::ZERO);
    let n = labels.len().max(1) as f64;
    let off = smoothing / classes as f64;
    let (mut total, mut correct) = (0.0, 0);
    for ((row, g), &label) in logits
        .chunks_exact(classes)
        .zip(grad.chunks_exact_mut(classes))
        .zip(labels)
    {
        let label = label as usize;
        assert!(label < classes, "label {label} of {classes} classes");
        let (arg, max, sum) = crate::loss::exp_row(row, g);
        correct += usize::from(arg == label);
        // log p_j = z_j - max - log(sum)
        let lse = sum.ln().to_f64() + max.to_f64();
        let nll = lse - row[label].to_f64();
        let mean_neg_logp = row.iter().map(|&v| lse - v.to_f64()).sum::<f64>() / classes as f64;
        total += (1.0 - smoothing) * nll + smoothing * mean_neg_logp;
        for (j, gj) in g.iter_mut().enumerate() {
            let q = off + if j == label { 1.0 - smoothing } else { 0.0 };
            *gj = T::from_f64(((*gj / sum).to_f64() - q) / n);
        }
    }
    (total / n, correct)
}
