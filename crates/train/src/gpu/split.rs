//! How a pipeline's layers are split across its stages: first the split whose slowest stage
//! is fastest (the layers' products timed on a micro-batch), then, among the splits whose
//! slowest stage is within [`NEAR`] of that one (timing noise cannot tell them apart), the one
//! whose update the 1F1B schedule finishes first ([`schedule_ms`]). That schedule counts what
//! the slowest stage alone does not: the stages before it filling the pipeline, the stages
//! after it draining it, and the optimizer steps on the way (the first stage's step holds
//! every later stage's next forward). A model of equal layers split in two is the case it
//! decides: both halves cost the same, and the one that puts the extra layer first is faster.

use crate::error::{Error, Result};

/// Splits whose slowest stage is this much slower than the best are not considered.
pub const NEAR: f64 = 0.03;

/// Estimates within this fraction of the best are ties: the estimate leaves out the
/// transfers and each layer's epilogue and bias kernels, and ranked 4 | 5 1% ahead of 5 | 4
/// where measured 5 | 4 was 1% faster with the smaller bubble (runs 119, 125).
pub const TIE: f64 = 0.025;

/// Splits enumerated at most (beyond, the balanced split alone is taken).
const MAX_CANDIDATES: usize = 100_000;

/// Consecutive layers for each of `stages` stages, the largest stage's cost as small as it
/// goes (every stage at least one layer).
pub fn partition(costs: &[f64], stages: usize) -> Result<Vec<(usize, usize)>> {
    let n = costs.len();
    if stages == 0 || stages > n {
        return Err(Error::Setting(format!(
            "{stages} pipeline stages need at least as many layers; the model has {n}"
        )));
    }
    let prefix = prefix_sums(costs);
    let sum = |a: usize, b: usize| prefix[b] - prefix[a];
    // best[k][j]: the smallest largest stage cost of layers [0, j) in k stages; cut[k][j] the
    // start of the last of them
    let mut best = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    let mut cut = vec![vec![0usize; n + 1]; stages + 1];
    best[0][0] = 0.0;
    for k in 1..=stages {
        for j in k..=n {
            for a in (k - 1)..j {
                let v = best[k - 1][a].max(sum(a, j));
                if v < best[k][j] {
                    best[k][j] = v;
                    cut[k][j] = a;
                }
            }
        }
    }
    let mut spans = Vec::new();
    let mut end = n;
    for k in (1..=stages).rev() {
        let a = cut[k][end];
        spans.push((a, end));
        end = a;
    }
    spans.reverse();
    Ok(spans)
}

fn prefix_sums(v: &[f64]) -> Vec<f64> {
    std::iter::once(0.0)
        .chain(v.iter().scan(0.0, |s, &c| {
            *s += c;
            Some(*s)
        }))
        .collect()
}

/// One stage's costs in milliseconds: a micro-batch's forward and backward, and its
/// optimizer step once an update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageCost {
    pub forward: f64,
    pub backward: f64,
    pub update: f64,
}

/// Milliseconds between the starts of two updates of stages with these costs in the 1F1B
/// schedule over `micro` micro-batches, transfers taken as free: every stage runs its
/// operations in 1F1B order, each as soon as the stage is free and its input (a forward from
/// the stage before, a backward from the stage after) is done; a stage starts its next update
/// at the same offset as this one's first forward, once its optimizer step is done.
pub fn schedule_ms(costs: &[StageCost], micro: usize) -> f64 {
    let n = costs.len();
    if n == 0 || micro == 0 {
        return 0.0;
    }
    // done[s][i]: when stage s finished micro-batch i's forward (fwd) / backward (bwd)
    let mut fwd = vec![vec![f64::NAN; micro]; n];
    let mut bwd = vec![vec![f64::NAN; micro]; n];
    let orders: Vec<Vec<(bool, usize)>> = (0..n).map(|s| order(s, n, micro)).collect();
    let mut next = vec![0usize; n];
    let mut free = vec![0.0f64; n];
    let mut first = vec![f64::NAN; n];
    // run any stage whose next operation's input is done, until all are
    loop {
        let mut moved = false;
        for s in 0..n {
            while let Some(&(is_fwd, i)) = orders[s].get(next[s]) {
                let input = if is_fwd {
                    if s == 0 {
                        0.0
                    } else {
                        fwd[s - 1][i]
                    }
                } else if s + 1 == n {
                    fwd[s][i]
                } else {
                    bwd[s + 1][i]
                };
                if input.is_nan() {
                    break;
                }
                let start = free[s].max(input);
                if first[s].is_nan() {
                    first[s] = start;
                }
                let c = &costs[s];
                free[s] = start + if is_fwd { c.forward } else { c.backward };
                if is_fwd {
                    fwd[s][i] = free[s];
                } else {
                    bwd[s][i] = free[s];
                }
                next[s] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    (0..n)
        .map(|s| free[s] + costs[s].update - first[s])
        .fold(0.0, f64::max)
}

/// Stage `s` of `n`'s operations in the 1F1B order: (forward?, micro-batch).
fn order(s: usize, n: usize, micro: usize) -> Vec<(bool, usize)> {
    let warm = (n - s - 1).min(micro);
    let mut ops: Vec<(bool, usize)> = (0..warm).map(|i| (true, i)).collect();
    let (mut f, mut b) = (warm, 0);
    while f < micro {
        ops.push((true, f));
        ops.push((false, b));
        f += 1;
        b += 1;
    }
    ops.extend((b..micro).map(|i| (false, i)));
    ops
}

/// The split of `products` (each layer's three products on a micro-batch, ms) and `updates`
/// (each layer's optimizer step, ms) over `stages` stages with `micro` micro-batches: among
/// the splits whose slowest stage is within [`NEAR`] of [`partition`]'s and whose
/// [`schedule_ms`] estimate is within [`TIE`] of the fastest, the one with the heaviest stages
/// first (compared stage by stage from the first).
pub fn split(
    products: &[f64],
    updates: &[f64],
    stages: usize,
    micro: usize,
) -> Result<Vec<(usize, usize)>> {
    let balanced = partition(products, stages)?;
    if updates.len() != products.len() {
        return Err(Error::Setting(format!(
            "{} layers' products but {} optimizer steps",
            products.len(),
            updates.len()
        )));
    }
    let (pp, pu) = (prefix_sums(products), prefix_sums(updates));
    let costs = |spans: &[(usize, usize)]| -> Vec<StageCost> {
        spans
            .iter()
            .map(|&(a, b)| {
                let p = pp[b] - pp[a];
                // of a layer's three products, one is forward's
                StageCost {
                    forward: p / 3.0,
                    backward: 2.0 * p / 3.0,
                    update: pu[b] - pu[a],
                }
            })
            .collect()
    };
    let worst = |spans: &[(usize, usize)]| {
        spans
            .iter()
            .map(|&(a, b)| pp[b] - pp[a])
            .fold(0.0, f64::max)
    };
    let limit = worst(&balanced) * (1.0 + NEAR);
    let mut candidates = Vec::new();
    let mut spans = Vec::new();
    enumerate(
        products.len(),
        stages,
        0,
        &pp,
        limit,
        &mut spans,
        &mut candidates,
    );
    if candidates.len() > MAX_CANDIDATES {
        return Ok(balanced);
    }
    let mut scored = vec![(schedule_ms(&costs(&balanced), micro), balanced)];
    for c in candidates {
        if c != scored[0].1 {
            scored.push((schedule_ms(&costs(&c), micro), c));
        }
    }
    // among the ties the heaviest stages first (each stage drains after the one behind it and
    // the first stage's optimizer step ends every update, so the busiest stage then idles only
    // while the pipeline fills); then the estimate; the balanced split (first) on equal terms
    let fastest = scored.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    let front = |spans: &[(usize, usize)]| -> Vec<f64> {
        spans.iter().map(|&(a, b)| pp[b] - pp[a]).collect()
    };
    let mut best: Option<&(f64, Vec<(usize, usize)>)> = None;
    for s in scored.iter().filter(|s| s.0 <= fastest * (1.0 + TIE)) {
        let better = match best {
            None => true,
            Some(b) => {
                let (x, y) = (front(&s.1), front(&b.1));
                match x.partial_cmp(&y) {
                    Some(std::cmp::Ordering::Greater) => true,
                    Some(std::cmp::Ordering::Equal) => s.0 < b.0 * (1.0 - 1e-9),
                    _ => false,
                }
            }
        };
        if better {
            best = Some(s);
        }
    }
    Ok(best.map_or_else(|| scored[0].1.clone(), |b| b.1.clone()))
}

/// Every split of layers `[from, layers)` into `stages` consecutive non-empty runs whose cost
/// stays within `limit`, appended to `out` after `spans` (stops growing past the cap).
fn enumerate(
    layers: usize,
    stages: usize,
    from: usize,
    prefix: &[f64],
    limit: f64,
    spans: &mut Vec<(usize, usize)>,
    out: &mut Vec<Vec<(usize, usize)>>,
) {
    if out.len() > MAX_CANDIDATES {
        return;
    }
    if stages == 1 {
        if prefix[layers] - prefix[from] <= limit {
            spans.push((from, layers));
            out.push(spans.clone());
            spans.pop();
        }
        return;
    }
    // leave at least one layer for each stage after this one
    for end in from + 1..=layers - (stages - 1) {
        if prefix[end] - prefix[from] > limit {
            break;
        }
        spans.push((from, end));
        enumerate(layers, stages - 1, end, prefix, limit, spans, out);
        spans.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_balances_consecutive_layers() {
        assert_eq!(
            partition(&[1.0, 1.0, 1.0, 1.0], 2).unwrap(),
            vec![(0, 2), (2, 4)]
        );
        // a heavy first layer takes a stage to itself
        assert_eq!(
            partition(&[5.0, 1.0, 1.0, 1.0, 1.0], 2).unwrap(),
            vec![(0, 1), (1, 5)]
        );
        assert_eq!(
            partition(&[1.0, 2.0, 3.0, 4.0, 5.0], 3).unwrap(),
            vec![(0, 3), (3, 4), (4, 5)]
        );
        let spans = partition(&[1.0; 7], 7).unwrap();
        assert_eq!(spans.len(), 7);
        assert!(partition(&[1.0; 2], 3).is_err());
        assert!(partition(&[1.0; 2], 0).is_err());
    }

    fn cost(forward: f64, backward: f64, update: f64) -> StageCost {
        StageCost {
            forward,
            backward,
            update,
        }
    }

    #[test]
    fn one_stage_takes_its_micro_batches_and_its_step() {
        let ms = schedule_ms(&[cost(1.0, 2.0, 0.5)], 4);
        assert!((ms - (4.0 * 3.0 + 0.5)).abs() < 1e-12, "{ms}");
    }

    #[test]
    fn equal_stages_idle_for_the_textbook_fraction() {
        // N equal stages, M micro-batches, no optimizer step: the update takes
        // (M + N - 1) micro-batch times, so the idle share is (N - 1) / (M + N - 1)
        for (n, m) in [(2, 8), (4, 8), (3, 5), (2, 1)] {
            let ms = schedule_ms(&vec![cost(1.0, 2.0, 0.0); n], m);
            let want = (m + n - 1) as f64 * 3.0;
            assert!(
                (ms - want).abs() < 1e-9,
                "{n} stages {m} micro: {ms} vs {want}"
            );
        }
    }

    #[test]
    fn the_first_stages_step_holds_the_next_update() {
        // two equal stages: the first stage's step adds to the update, the last's overlaps
        // the first stage's last backward
        let base = schedule_ms(&[cost(1.0, 2.0, 0.0), cost(1.0, 2.0, 0.0)], 4);
        let first = schedule_ms(&[cost(1.0, 2.0, 1.0), cost(1.0, 2.0, 0.0)], 4);
        let last = schedule_ms(&[cost(1.0, 2.0, 0.0), cost(1.0, 2.0, 1.0)], 4);
        assert!((first - base - 1.0).abs() < 1e-9, "{base} {first}");
        assert!(last < first, "{last} {first}");
    }

    #[test]
    fn equal_layers_put_the_extra_layer_first() {
        // nine layers, the outer two light (as the 1024-4096x8-16 model): 5 | 4 and 4 | 5
        // cost the same; with each layer's step on the way the heavier first stage wins
        let products = [
            0.035, 0.089, 0.089, 0.089, 0.089, 0.089, 0.089, 0.089, 0.036,
        ];
        let updates = [0.02, 0.085, 0.085, 0.085, 0.085, 0.085, 0.085, 0.085, 0.001];
        let b = partition(&products, 2).unwrap();
        assert!(
            b == vec![(0, 5), (5, 9)] || b == vec![(0, 4), (4, 9)],
            "{b:?}"
        );
        assert_eq!(
            split(&products, &updates, 2, 8).unwrap(),
            vec![(0, 5), (5, 9)]
        );
        // timing noise that makes 4 | 5 the balanced split by 0.1%: the schedule still wins
        let mut noisy = products;
        noisy[1] = 0.0905;
        assert_eq!(partition(&noisy, 2).unwrap(), vec![(0, 4), (4, 9)]);
        assert_eq!(split(&noisy, &updates, 2, 8).unwrap(), vec![(0, 5), (5, 9)]);
    }

    #[test]
    fn near_ties_put_the_heavier_stage_first() {
        // run 125's measured costs of the 1024-4096x8-16 model on 512 rows: the estimate puts
        // 4 | 5 under 1% ahead, measured 5 | 4 was as fast with the smaller bubble
        let mut products = [0.0911; 9];
        products[0] = 0.0411;
        products[8] = 0.0378;
        let mut updates = [0.1051; 9];
        updates[0] = 0.0263;
        updates[8] = 0.0004;
        assert_eq!(partition(&products, 2).unwrap(), vec![(0, 4), (4, 9)]);
        for micro in [4, 8, 16] {
            assert_eq!(
                split(&products, &updates, 2, micro).unwrap(),
                vec![(0, 5), (5, 9)],
                "{micro} micro-batches"
            );
        }
    }

    #[test]
    fn a_clear_estimate_beats_the_heavier_first_stage() {
        // the middle layer's optimizer step is long: on the first stage it ends every update
        let products = [1.0; 5];
        let updates = [0.0, 0.0, 8.0, 0.0, 0.0];
        assert_eq!(
            split(&products, &updates, 2, 8).unwrap(),
            vec![(0, 2), (2, 5)]
        );
    }

    #[test]
    fn a_clearly_unbalanced_split_is_never_taken() {
        // the balanced split's slowest stage is far ahead of any other: kept whatever the steps
        let products = [1.0, 1.0, 1.0, 1.0];
        let updates = [5.0, 0.0, 0.0, 0.0];
        assert_eq!(
            split(&products, &updates, 2, 8).unwrap(),
            vec![(0, 2), (2, 4)]
        );
        assert!(split(&products, &[1.0], 2, 8).is_err());
    }

    #[test]
    fn splits_are_enumerated_within_the_limit_only() {
        let prefix = prefix_sums(&[1.0; 6]);
        let mut out = Vec::new();
        enumerate(6, 3, 0, &prefix, 2.0, &mut Vec::new(), &mut out);
        assert_eq!(out, vec![vec![(0, 2), (2, 4), (4, 6)]]);
        let mut all = Vec::new();
        enumerate(6, 2, 0, &prefix, 6.0, &mut Vec::new(), &mut all);
        assert_eq!(all.len(), 5);
        for s in &all {
            assert_eq!(s.first().unwrap().0, 0);
            assert_eq!(s.last().unwrap().1, 6);
            assert!(s.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1));
        }
    }
}
