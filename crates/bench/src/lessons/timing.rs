//! The one timing method of the lessons, shared with scripts/pytorch_lessons.py: the notebook's
//! `benchmark_operation` (calls in a loop, one synchronize at the end, wall time over calls),
//! repeated to give a spread.

use crate::error::{Error, Result};
use crate::stats::Summary;
use std::time::Instant;

/// Warm-up: at least this many calls ...
const WARMUP_CALLS: usize = 3;
/// ... and until this much time has passed ...
const WARMUP_MS: f64 = 50.0;
/// ... but never more calls than this.
const WARMUP_MAX: usize = 200;
/// Most calls in one sample.
const MAX_CALLS: usize = 1000;

/// Calls per sample so that a sample lasts at least `min_ms`, from one call's time.
pub fn calls_per_sample(one_call_ms: f64, min_ms: f64) -> usize {
    if one_call_ms.is_nan() || one_call_ms <= 0.0 || !one_call_ms.is_finite() {
        return MAX_CALLS;
    }
    ((min_ms / one_call_ms).ceil() as usize).clamp(1, MAX_CALLS)
}

/// Times `call` (which enqueues work) with `sync` (which waits for it): returns the per-call
/// times of `samples` samples and the calls per sample.
pub fn time_case(
    samples: usize,
    min_sample_ms: f64,
    sync: &dyn Fn() -> Result<()>,
    call: &mut dyn FnMut() -> Result<()>,
) -> Result<(Summary, usize)> {
    let start = Instant::now();
    let mut n = 0;
    while n < WARMUP_CALLS || (start.elapsed().as_secs_f64() * 1e3 < WARMUP_MS && n < WARMUP_MAX) {
        call()?;
        n += 1;
    }
    sync()?;
    let t = Instant::now();
    call()?;
    sync()?;
    let k = calls_per_sample(t.elapsed().as_secs_f64() * 1e3, min_sample_ms);
    let mut per_call = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..k {
            call()?;
        }
        sync()?;
        per_call.push(t.elapsed().as_secs_f64() * 1e3 / k as f64);
    }
    Ok((Summary::of(&per_call).ok_or(Error::NoSamples)?, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_per_sample_reaches_the_minimum() {
        assert_eq!(calls_per_sample(0.5, 2.0), 4);
        assert_eq!(calls_per_sample(0.3, 2.0), 7);
        assert_eq!(calls_per_sample(5.0, 2.0), 1);
        assert_eq!(calls_per_sample(0.000_001, 2.0), MAX_CALLS);
        assert_eq!(calls_per_sample(0.0, 2.0), MAX_CALLS);
    }

    #[test]
    fn time_case_counts_calls_and_waits() {
        use std::cell::Cell;
        let calls = Cell::new(0usize);
        let syncs = Cell::new(0usize);
        let mut call = || {
            calls.set(calls.get() + 1);
            std::thread::sleep(std::time::Duration::from_micros(300));
            Ok(())
        };
        let sync = || {
            syncs.set(syncs.get() + 1);
            Ok(())
        };
        let (s, k) = time_case(4, 1.0, &sync, &mut call).unwrap();
        assert_eq!(s.count, 4);
        // each call sleeps 0.3 ms: at least 0.3 ms a call, and k calls make a 1 ms sample
        assert!(s.min >= 0.3, "{s:?}");
        assert!((1..=4).contains(&k), "k = {k}");
        // one sync after the warm-up, one after the calibration call, one per sample
        assert_eq!(syncs.get(), 2 + 4);
        assert!(calls.get() >= WARMUP_CALLS + 1 + 4 * k);
    }
}
