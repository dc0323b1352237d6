//! Activation memory planning: given every buffer a forward pass needs (its size and the steps
//! during which it must stay intact), place them in one arena so that buffers whose lifetimes
//! overlap never share bytes, and buffers whose lifetimes do not may. Greedy by size, lowest
//! fitting offset first: the classic offset-assignment heuristic of inference runtimes; on
//! ResNet it reaches the lower bound (the largest sum of simultaneously live buffers). The
//! inference engine plans its activations with it, the convolutional trainer its maps and their
//! gradients.

/// One buffer: `bytes` long, live from step `first` to step `last` inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
}

impl Lifetime {
    fn overlaps(&self, other: &Lifetime) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// Where each buffer lives in the arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Byte offset of each buffer, in the order given.
    pub offsets: Vec<usize>,
    /// Arena size.
    pub total: usize,
}

/// Alignment of every buffer (cuDNN and cuBLAS want at least 128 bytes; 256 matches the
/// driver's allocation granularity for small buffers).
pub const ALIGN: usize = 256;

fn align_up(v: usize) -> usize {
    v.div_ceil(ALIGN) * ALIGN
}

/// Places the buffers with reuse (see the module documentation).
pub fn plan_reuse(buffers: &[Lifetime]) -> MemoryPlan {
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    // largest first; ties by start so the plan is deterministic
    order.sort_by_key(|&i| (std::cmp::Reverse(buffers[i].bytes), buffers[i].first, i));
    let mut offsets = vec![0usize; buffers.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut total = 0;
    for &i in &order {
        let b = buffers[i];
        let mut conflicts: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| buffers[j].overlaps(&b))
            .map(|&j| (offsets[j], align_up(buffers[j].bytes)))
            .collect();
        conflicts.sort_unstable();
        let size = align_up(b.bytes);
        let mut at = 0;
        for (off, len) in conflicts {
            if at + size <= off {
                break;
            }
            at = at.max(off + len);
        }
        offsets[i] = at;
        total = total.max(at + size);
        placed.push(i);
    }
    MemoryPlan { offsets, total }
}

/// Every buffer its own bytes (what a framework without a plan does at its peak).
pub fn plan_no_reuse(buffers: &[Lifetime]) -> MemoryPlan {
    let mut offsets = Vec::with_capacity(buffers.len());
    let mut at = 0;
    for b in buffers {
        offsets.push(at);
        at += align_up(b.bytes);
    }
    MemoryPlan { offsets, total: at }
}

/// The largest total of buffers live at one step: no plan can use less.
pub fn lower_bound(buffers: &[Lifetime]) -> usize {
    let steps = buffers.iter().map(|b| b.last + 1).max().unwrap_or(0);
    (0..steps)
        .map(|s| {
            buffers
                .iter()
                .filter(|b| b.first <= s && s <= b.last)
                .map(|b| align_up(b.bytes))
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// An error naming two buffers that are live together and share bytes, if any.
pub fn check(buffers: &[Lifetime], plan: &MemoryPlan) -> Result<(), String> {
    for i in 0..buffers.len() {
        let (a, oa) = (buffers[i], plan.offsets[i]);
        if oa + a.bytes > plan.total {
            return Err(format!("buffer {i} runs past the arena"));
        }
        for (j, (&b, &ob)) in buffers.iter().zip(&plan.offsets).enumerate().skip(i + 1) {
            let share = oa < ob + b.bytes && ob < oa + a.bytes;
            if a.overlaps(&b) && share && a.bytes > 0 && b.bytes > 0 {
                return Err(format!(
                    "buffers {i} and {j} are live together and share bytes"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lt(bytes: usize, first: usize, last: usize) -> Lifetime {
        Lifetime { bytes, first, last }
    }

    #[test]
    fn a_chain_reuses_two_buffers() {
        // each step reads the previous buffer and writes the next: two live at a time
        let chain: Vec<Lifetime> = (0..10).map(|i| lt(1000, i, i + 1)).collect();
        let p = plan_reuse(&chain);
        check(&chain, &p).unwrap();
        assert_eq!(p.total, 2 * align_up(1000));
        assert_eq!(p.total, lower_bound(&chain));
        assert_eq!(plan_no_reuse(&chain).total, 10 * align_up(1000));
    }

    #[test]
    fn random_lifetimes_never_collide_and_stay_near_the_bound() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % m
        };
        for _ in 0..200 {
            let n = 1 + next(40) as usize;
            let bufs: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let first = next(30) as usize;
                    let len = next(8) as usize;
                    lt(1 + next(100_000) as usize, first, first + len)
                })
                .collect();
            let p = plan_reuse(&bufs);
            check(&bufs, &p).unwrap();
            assert!(p.total >= lower_bound(&bufs));
            assert!(p.total <= plan_no_reuse(&bufs).total);
        }
    }

    #[test]
    fn the_checker_catches_a_collision() {
        let bufs = [lt(100, 0, 2), lt(100, 1, 3)];
        let bad = MemoryPlan {
            offsets: vec![0, 50],
            total: 150,
        };
        assert!(check(&bufs, &bad).is_err());
    }
}
