//! The time a stream sat idle between its kernels inside a window: the launch gaps that an
//! eager run leaves and a CUDA graph's replay removes.

use super::Span;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Idle {
    /// Microseconds of the window no kernel ran in.
    pub total_us: f64,
    /// Gaps between consecutive busy stretches (not counting before the first or after the last).
    pub gaps: usize,
    pub largest_us: f64,
    /// Busy time (kernels' union) over the window.
    pub busy_fraction: f64,
}

/// Idle time of one stream's kernels within `window`: spans are clipped to it and merged where
/// they overlap or touch (concurrent kernels of one stream count once).
pub fn idle(spans: &[Span], window: Span) -> Idle {
    let (lo, hi) = (window.start_us, window.end_us());
    let mut clipped: Vec<(f64, f64)> = spans
        .iter()
        .map(|s| (s.start_us.max(lo), s.end_us().min(hi)))
        .filter(|(a, b)| b > a)
        .collect();
    clipped.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64)> = Vec::new();
    for (a, b) in clipped {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let busy: f64 = merged.iter().map(|(a, b)| b - a).sum();
    let between: Vec<f64> = merged.windows(2).map(|w| w[1].0 - w[0].1).collect();
    let width = (hi - lo).max(0.0);
    Idle {
        total_us: (width - busy).max(0.0),
        gaps: between.len(),
        largest_us: between.iter().copied().fold(0.0, f64::max),
        busy_fraction: if width > 0.0 { busy / width } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start_us: f64, dur_us: f64) -> Span {
        Span { start_us, dur_us }
    }

    #[test]
    fn gaps_are_the_window_minus_the_union_of_kernels() {
        // kernels at 0-10, 5-12 (overlapping), 20-30; window 0-40
        let i = idle(&[s(20.0, 10.0), s(0.0, 10.0), s(5.0, 7.0)], s(0.0, 40.0));
        assert_eq!(i.gaps, 1);
        assert_eq!(i.largest_us, 8.0);
        assert_eq!(i.total_us, 40.0 - 22.0);
        assert!((i.busy_fraction - 22.0 / 40.0).abs() < 1e-12);
        // back-to-back kernels (a graph's replay) leave no gap
        let g = idle(&[s(0.0, 10.0), s(10.0, 10.0)], s(0.0, 20.0));
        assert_eq!((g.gaps, g.total_us), (0, 0.0));
        // kernels outside the window do not count
        let o = idle(&[s(-5.0, 10.0), s(50.0, 1.0)], s(0.0, 20.0));
        assert_eq!(o.total_us, 15.0);
        assert_eq!(idle(&[], s(0.0, 0.0)).busy_fraction, 0.0);
    }
}
