//! The measuring harness every command uses: warm-up, repetitions, device or host clocks, and
//! a [`Measurement`] that serializes to JSON.

use crate::stats::Summary;
use gpukit_cuda::cudarc::driver::CudaStream;
use gpukit_cuda::timing::{time_on_stream, TimingError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which clock produced a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// CUDA events on the stream: device time only.
    CudaEvents,
    /// A monotonic host clock around synchronous work.
    Host,
}

/// How many times to run, and for how long at most.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub warmup: usize,
    pub reps: usize,
    /// Host timing stops adding repetitions once this much time is spent (at least one runs);
    /// long CPU runs stay bounded and the smaller count is reported.
    pub max_seconds: f64,
}

impl Plan {
    pub fn new(warmup: usize, reps: usize) -> Plan {
        Plan {
            warmup,
            reps: reps.max(1),
            max_seconds: f64::INFINITY,
        }
    }

    pub fn with_budget(mut self, seconds: f64) -> Plan {
        self.max_seconds = seconds;
        self
    }
}

/// Timings of one workload, in milliseconds per repetition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub clock: Clock,
    pub warmup: usize,
    /// Repetitions asked for; `summary.count` says how many ran (fewer when a budget cut in).
    pub reps_planned: usize,
    pub summary_ms: Summary,
}

/// Errors of a timed run.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{0}")]
    Work(String),
    #[error("{0}")]
    Cuda(String),
    #[error("the timer produced no usable sample")]
    NoSamples,
}

/// Times host work with a monotonic clock. `work` must finish its work before returning
/// (synchronize first if it launched device work).
pub fn time_host<E: std::fmt::Display>(
    plan: Plan,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<Measurement, HarnessError> {
    let budget = Duration::from_secs_f64(plan.max_seconds.min(1e9));
    let started = Instant::now();
    for _ in 0..plan.warmup {
        work().map_err(|e| HarnessError::Work(e.to_string()))?;
        if started.elapsed() > budget {
            break;
        }
    }
    let timed_start = Instant::now();
    let mut samples = Vec::with_capacity(plan.reps);
    for _ in 0..plan.reps {
        let t = Instant::now();
        work().map_err(|e| HarnessError::Work(e.to_string()))?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        if timed_start.elapsed() > budget {
            break;
        }
    }
    Ok(Measurement {
        clock: Clock::Host,
        warmup: plan.warmup,
        reps_planned: plan.reps,
        summary_ms: Summary::of(&samples).ok_or(HarnessError::NoSamples)?,
    })
}

/// Times device work queued on `stream` with CUDA events around each repetition.
pub fn time_device<E: std::fmt::Display>(
    stream: &Arc<CudaStream>,
    plan: Plan,
    work: impl FnMut() -> Result<(), E>,
) -> Result<Measurement, HarnessError> {
    let samples = time_on_stream(stream, plan.warmup, plan.reps, work).map_err(|e| match e {
        TimingError::Cuda(c) => HarnessError::Cuda(c.to_string()),
        TimingError::Work(w) => HarnessError::Work(w.to_string()),
    })?;
    Ok(Measurement {
        clock: Clock::CudaEvents,
        warmup: plan.warmup,
        reps_planned: plan.reps,
        summary_ms: Summary::of(&samples).ok_or(HarnessError::NoSamples)?,
    })
}

/// Rates derived from a time: one place computes them, every view shows them.
pub fn tflops(flops: f64, ms: f64) -> f64 {
    flops / (ms * 1e-3) / 1e12
}

/// Gigabytes (1e9) per second.
pub fn gbs(bytes: f64, ms: f64) -> f64 {
    bytes / (ms * 1e-3) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_timing_counts_reps_and_sees_the_work() {
        let mut calls = 0;
        let m = time_host(Plan::new(2, 5), || {
            calls += 1;
            std::thread::sleep(Duration::from_millis(2));
            Ok::<(), String>(())
        })
        .unwrap();
        assert_eq!(calls, 7);
        assert_eq!(m.summary_ms.count, 5);
        assert!(m.summary_ms.min >= 2.0, "{:?}", m.summary_ms);
        assert_eq!(m.clock, Clock::Host);
    }

    #[test]
    fn host_budget_bounds_long_runs() {
        let m = time_host(Plan::new(0, 1000).with_budget(0.02), || {
            std::thread::sleep(Duration::from_millis(5));
            Ok::<(), String>(())
        })
        .unwrap();
        assert!(m.summary_ms.count < 1000 && m.summary_ms.count >= 1);
        assert_eq!(m.reps_planned, 1000);
    }

    #[test]
    fn work_errors_are_reported_not_timed() {
        let r = time_host(Plan::new(0, 3), || Err::<(), _>("bad output"));
        assert!(matches!(r, Err(HarnessError::Work(ref s)) if s == "bad output"));
    }

    #[test]
    fn rates() {
        assert!((tflops(2.0 * 8192f64.powi(3), 1.0) - 1099.511627776).abs() < 1e-6);
        assert!((gbs(1e9, 1000.0) - 1.0).abs() < 1e-12);
    }
}
