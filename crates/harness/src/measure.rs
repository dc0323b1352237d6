//! The measuring harness every command uses: warm-up, repetitions, device or host clocks, and
//! a [`Measurement`] that serializes to JSON.

use crate::error::{Error, Result};
use crate::stats::Summary;
use gpukit_cuda::timing::time_on_stream;
use gpukit_cuda::Stream;
use serde::{Deserialize, Serialize};
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

/// Times host work with a monotonic clock. `work` must finish its work before returning
/// (synchronize first if it launched device work).
pub fn time_host<E: Into<Error>>(
    plan: Plan,
    work: impl FnMut() -> Result<(), E>,
) -> Result<Measurement> {
    Measurement::of(Clock::Host, plan, &host_samples(plan, work)?)
}

/// `time_host`'s samples (ms per repetition), unsummarised.
pub fn host_samples<E: Into<Error>>(
    plan: Plan,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<Vec<f64>> {
    let budget = Duration::from_secs_f64(plan.max_seconds.min(1e9));
    let started = Instant::now();
    for _ in 0..plan.warmup {
        work().map_err(Into::into)?;
        if started.elapsed() > budget {
            break;
        }
    }
    let timed_start = Instant::now();
    let mut samples = Vec::with_capacity(plan.reps);
    for _ in 0..plan.reps {
        let t = Instant::now();
        work().map_err(Into::into)?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        if timed_start.elapsed() > budget {
            break;
        }
    }
    Ok(samples)
}

/// Times device work queued on `stream` with CUDA events around each repetition.
pub fn time_device<E: Into<Error>>(
    stream: &Stream,
    plan: Plan,
    work: impl FnMut() -> Result<(), E>,
) -> Result<Measurement> {
    Measurement::of(
        Clock::CudaEvents,
        plan,
        &device_samples(stream, plan, work)?,
    )
}

/// Runs device work queued on `stream` untimed until at least `at_least` has passed on the host
/// clock with the stream drained (a GPU that sat idle, while CPU rows ran, clocks up meanwhile:
/// a handful of sub-millisecond passes do not reach its steady clocks), at most `most_passes`
/// passes; returns how many ran.
pub fn warm_device<E: Into<Error>>(
    stream: &Stream,
    at_least: Duration,
    most_passes: usize,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<usize> {
    let started = Instant::now();
    let mut passes = 0;
    while passes < most_passes {
        for _ in 0..8.min(most_passes - passes) {
            work().map_err(Into::into)?;
            passes += 1;
        }
        stream.synchronize()?;
        if started.elapsed() >= at_least {
            break;
        }
    }
    Ok(passes)
}

/// `time_device`'s samples (ms per repetition), unsummarised.
pub fn device_samples<E: Into<Error>>(
    stream: &Stream,
    plan: Plan,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<Vec<f64>> {
    time_on_stream(stream, plan.warmup, plan.reps, || {
        work().map_err(Into::into)
    })
}

impl Measurement {
    /// Summarises samples taken under `plan`.
    pub fn of(clock: Clock, plan: Plan, samples: &[f64]) -> Result<Measurement> {
        Ok(Measurement {
            clock,
            warmup: plan.warmup,
            reps_planned: plan.reps,
            summary_ms: Summary::of(samples).ok_or(Error::NoSamples)?,
        })
    }
}

/// A timed block: `Plan` in, samples (ms per repetition) out.
pub type Block<'a> = &'a mut dyn FnMut(Plan) -> Result<Vec<f64>>;

/// What `interleave` measured: each side's samples, block by block (one block per round).
#[derive(Debug)]
pub struct Interleaved {
    pub ours: Result<Vec<Vec<f64>>>,
    /// Err once the peer failed (it is not asked again; ours go on).
    pub theirs: Result<Vec<Vec<f64>>>,
}

impl Interleaved {
    /// Per round, our block's median time over theirs (below 1: ours faster), for the rounds
    /// both sides completed. Each pair shared the chip's state, so their spread is the
    /// comparison's own uncertainty.
    pub fn paired_time_ratios(&self) -> Vec<f64> {
        let (Ok(ours), Ok(theirs)) = (&self.ours, &self.theirs) else {
            return Vec::new();
        };
        ours.iter()
            .zip(theirs)
            .filter_map(|(a, b)| Some(Summary::of(a)?.median / Summary::of(b)?.median))
            .filter(|r| r.is_finite() && *r > 0.0)
            .collect()
    }
}

/// Alternates our timed blocks with a peer's in ABBA order (ours first in even rounds, theirs
/// first in odd ones; the reverse with `peer_opens`) for `rounds` rounds, `first` plans the
/// opening block of each side and `later` the rest. On a power-capped GPU a figure depends on
/// what ran in the last few hundred milliseconds (either side moved by 7% from one invocation
/// to the next), so two figures are comparable only when both sides took turns on the same
/// chip.
///
/// Before the first round the peer runs one untimed block under `first`: its first request
/// builds operands and initialises libraries while the chip idles, and an idle chip runs the
/// next block faster (the first round's ratio read 0.86-0.91 where the others read
/// 0.96-1.01). Then, until `soak` has passed, both sides take further untimed turns (ours,
/// theirs): a GPU that starts working after an idle spell swings in clock for the next half
/// second or so (rounds 2-3 of a row read 0.80-0.93 or 1.07-1.18 where the others
/// read 0.98-1.03). Every timed block follows a full block of the other side or its own.
///
/// Ours open the timed rounds (ABBA...), or theirs do with `peer_opens` (BAAB...). The side
/// that opens gained 1-6% in A/A tests, so a fair comparison runs both orders
/// (`matmul::Turns::time`).
pub fn interleave(
    rounds: usize,
    (first, later): (Plan, Plan),
    soak: Duration,
    peer_opens: bool,
    ours: Block,
    theirs: Block,
) -> Interleaved {
    let mut mine = Vec::new();
    let started = Instant::now();
    let mut peer: Result<Vec<Vec<f64>>> = theirs(first).map(|_| Vec::new());
    while peer.is_ok() && started.elapsed() < soak {
        if let Err(e) = ours(first) {
            return Interleaved {
                ours: Err(e),
                theirs: peer,
            };
        }
        if let Err(e) = theirs(first) {
            peer = Err(e);
        }
    }
    for round in 0..rounds.max(1) {
        let plan = if round == 0 { first } else { later };
        for side in if (round % 2 == 0) != peer_opens {
            [0, 1]
        } else {
            [1, 0]
        } {
            if side == 0 {
                match ours(plan) {
                    Ok(s) => mine.push(s),
                    Err(e) => {
                        return Interleaved {
                            ours: Err(e),
                            theirs: peer,
                        }
                    }
                }
            } else if let Ok(all) = &mut peer {
                match theirs(plan) {
                    Ok(s) => all.push(s),
                    Err(e) => peer = Err(e),
                }
            }
        }
    }
    Interleaved {
        ours: Ok(mine),
        theirs: peer,
    }
}

/// A peer's samples from `both_orders` (pooled), the per-round rate ratios (ours over theirs)
/// and, per order (ours opening, then theirs), the median of its rounds.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PeerSamples {
    pub samples: Vec<f64>,
    pub turn_ratios: Vec<f64>,
    pub by_opener: Vec<f64>,
}

impl PeerSamples {
    /// Our rate over theirs: the geometric mean of the two orders' medians, so that what the
    /// opener gains cancels to first order, or the one order's median (None without rounds).
    pub fn ratio(&self) -> Option<f64> {
        match self.by_opener[..] {
            [a, b] => Some((a * b).sqrt()),
            [a] => Some(a),
            _ => None,
        }
    }
}

/// What `both_orders` measured: our samples, and the peer's (Err once it failed).
#[derive(Debug)]
pub struct Paired {
    pub ours: Result<Vec<f64>>,
    pub theirs: Result<PeerSamples>,
}

/// `interleave` twice: ours open the first `rounds.div_ceil(2)` rounds and theirs the other
/// `rounds / 2`, each sequence after its own opening turn and soak. The side that opens gained
/// 1-6% in A/A tests; running both orders cancels it.
pub fn both_orders(
    rounds: usize,
    plans: (Plan, Plan),
    soak: Duration,
    ours: Block,
    theirs: Block,
) -> Paired {
    let rounds = rounds.max(1);
    let orders: &[(bool, usize)] = if rounds >= 2 {
        &[(false, rounds.div_ceil(2)), (true, rounds / 2)]
    } else {
        &[(false, 1)]
    };
    let mut mine = Vec::new();
    let mut peer = Ok(PeerSamples::default());
    for &(peer_opens, r) in orders {
        // a peer that failed in the first order is not asked again: ours go on alone
        let mut dropped = |_: Plan| Err(Error::Peer("dropped after an earlier failure".into()));
        let theirs_now: Block = if peer.is_err() {
            &mut dropped
        } else {
            &mut *theirs
        };
        let run = interleave(r, plans, soak, peer_opens, ours, theirs_now);
        // rate ratios: ours over theirs is their time over ours
        let ratios: Vec<f64> = run.paired_time_ratios().iter().map(|t| 1.0 / t).collect();
        match run.ours {
            Ok(b) => mine.extend(b.concat()),
            Err(e) => {
                return Paired {
                    ours: Err(e),
                    theirs: peer,
                }
            }
        }
        match (&mut peer, run.theirs) {
            (Ok(p), Ok(t)) => {
                p.samples.extend(t.concat());
                if let Some(m) = Summary::of(&ratios) {
                    p.by_opener.push(m.median);
                }
                p.turn_ratios.extend(ratios);
            }
            (Ok(_), Err(e)) => peer = Err(e),
            (Err(_), _) => {}
        }
    }
    Paired {
        ours: Ok(mine),
        theirs: peer,
    }
}

/// What a GPU row's turns are cut to: the time of one repetition, and how many operand sets the
/// repetitions rotate over.
#[derive(Debug, Clone, Copy)]
pub struct TurnShape {
    pub per_rep_ms: f64,
    pub sets: usize,
}

/// Repetitions per turn: `reps`, or as many as fill `block_ms` at `shape.per_rep_ms` each (at
/// most `MAX_BLOCK_REPS`), rounded up to whole passes over `shape.sets` so that every turn
/// multiplies each operand set equally often. Between two blocks the chip idles while the sides
/// hand over (PyTorch's blocks follow one or two pipe round trips, ours none or one), and on a
/// power-capped chip idle time buys clock; longer turns make it a smaller share of each turn.
/// Its effect on a ratio was not measured on its own (the runs that brought it in changed
/// more than this).
pub fn block_reps(reps: usize, shape: Option<TurnShape>, block_ms: f64) -> usize {
    let Some(shape) = shape else {
        return reps;
    };
    let t = shape.per_rep_ms;
    let reps = if t > 0.0 && block_ms > 0.0 {
        reps.max((block_ms / t).ceil().min(MAX_BLOCK_REPS as f64) as usize)
    } else {
        reps
    };
    reps.next_multiple_of(shape.sets.max(1))
}

/// The most repetitions one turn is lengthened to.
pub const MAX_BLOCK_REPS: usize = 2000;

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
            Ok::<(), Error>(())
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
            Ok::<(), Error>(())
        })
        .unwrap();
        assert!(m.summary_ms.count < 1000 && m.summary_ms.count >= 1);
        assert_eq!(m.reps_planned, 1000);
    }

    #[test]
    fn work_errors_are_reported_not_timed() {
        let r = time_host(Plan::new(0, 3), || {
            Err::<(), _>(Error::Failed("bad output".into()))
        });
        assert!(matches!(r, Err(Error::Failed(ref s)) if s == "bad output"));
    }

    #[test]
    fn interleaving_alternates_abba_and_pools_the_samples() {
        let order = std::cell::RefCell::new(String::new());
        let first = Plan::new(5, 3);
        let later = Plan::new(1, 3);
        let mut ours = |p: Plan| {
            order.borrow_mut().push('a');
            Ok(vec![p.warmup as f64; p.reps])
        };
        let mut theirs = |p: Plan| {
            order.borrow_mut().push('b');
            Ok(vec![10.0 + p.warmup as f64; p.reps])
        };
        let r = interleave(
            4,
            (first, later),
            Duration::ZERO,
            false,
            &mut ours,
            &mut theirs,
        );
        // the peer's untimed opening block, then ABBA
        assert_eq!(*order.borrow(), "babbaabba");
        // ours: 5 (warm-up of the first plan) then 1; theirs 15 then 11
        assert_eq!(
            r.paired_time_ratios(),
            vec![5.0 / 15.0, 1.0 / 11.0, 1.0 / 11.0, 1.0 / 11.0]
        );
        let ours = r.ours.unwrap();
        assert_eq!(ours.len(), 4);
        assert!(ours.iter().all(|b| b.len() == 3));
        // the first block of each side ran with the first plan's warm-up, the rest with later's
        assert_eq!(ours[0], vec![5.0; 3]);
        assert_eq!(ours[1], vec![1.0; 3]);
        assert_eq!(r.theirs.unwrap()[0], vec![15.0; 3]);
    }

    #[test]
    fn both_orders_split_the_rounds_and_average_the_openers() {
        let order = std::cell::RefCell::new(String::new());
        let mut ours = |p: Plan| {
            order.borrow_mut().push('a');
            Ok(vec![1.0; p.reps])
        };
        let mut theirs = |p: Plan| {
            order.borrow_mut().push('b');
            Ok(vec![2.0; p.reps])
        };
        let plan = Plan::new(0, 1);
        let r = both_orders(4, (plan, plan), Duration::ZERO, &mut ours, &mut theirs);
        // each sequence: the peer's untimed opening turn, then 2 rounds; ours open the first
        // (AB BA), theirs the second (BA AB); ratios stay ours over theirs either way
        assert_eq!(*order.borrow(), "babbabbaab");
        let p = r.theirs.unwrap();
        assert_eq!(p.turn_ratios, vec![2.0; 4]);
        assert_eq!(p.by_opener, vec![2.0, 2.0]);
        assert_eq!(r.ours.unwrap().len(), 4);
        // an opener that gains 10% either way cancels in the geometric mean
        let gained = PeerSamples {
            by_opener: vec![1.1, 1.0 / 1.1],
            ..PeerSamples::default()
        };
        assert!((gained.ratio().unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(PeerSamples::default().ratio(), None);
        // one round: one order, ours opening
        order.borrow_mut().clear();
        let r = both_orders(1, (plan, plan), Duration::ZERO, &mut ours, &mut theirs);
        assert_eq!(*order.borrow(), "bab");
        assert_eq!(r.theirs.unwrap().by_opener, vec![2.0]);
        // a peer that fails is asked once, and ours still run every round of both orders
        let mut calls = 0;
        let mut failing = |_: Plan| {
            calls += 1;
            Err(Error::Peer("torch crashed".into()))
        };
        let r = both_orders(4, (plan, plan), Duration::ZERO, &mut ours, &mut failing);
        assert_eq!(r.theirs.unwrap_err().to_string(), "torch crashed");
        assert_eq!(r.ours.unwrap().len(), 4);
        assert_eq!(calls, 1);
    }

    #[test]
    fn both_sides_soak_untimed_before_the_rounds() {
        let order = std::cell::RefCell::new(String::new());
        let mut ours = |p: Plan| {
            order.borrow_mut().push('a');
            std::thread::sleep(Duration::from_millis(4));
            Ok(vec![1.0; p.reps])
        };
        let mut theirs = |p: Plan| {
            order.borrow_mut().push('b');
            std::thread::sleep(Duration::from_millis(4));
            Ok(vec![2.0; p.reps])
        };
        let plan = Plan::new(0, 2);
        let soak = Duration::from_millis(30);
        let r = interleave(2, (plan, plan), soak, false, &mut ours, &mut theirs);
        let order = order.into_inner();
        // untimed: b, then (a, b) pairs until 30 ms passed; timed: abba
        let (untimed, timed) = order.split_at(order.len() - 4);
        assert_eq!(timed, "abba");
        assert!(untimed.len() >= 3 && untimed.len() % 2 == 1, "{order}");
        assert!(untimed
            .chars()
            .enumerate()
            .all(|(i, c)| c == if i % 2 == 0 { 'b' } else { 'a' }));
        // only the timed blocks are kept
        assert_eq!(r.ours.unwrap().len(), 2);
        assert_eq!(r.theirs.unwrap().len(), 2);
    }

    #[test]
    fn a_failing_peer_is_dropped_and_ours_go_on() {
        let mut calls = 0;
        let mut ours = |p: Plan| Ok(vec![1.0; p.reps]);
        let mut theirs = |_: Plan| {
            calls += 1;
            Err(Error::Peer("torch crashed".into()))
        };
        let r = interleave(
            3,
            (Plan::new(0, 2), Plan::new(0, 2)),
            Duration::ZERO,
            false,
            &mut ours,
            &mut theirs,
        );
        assert!(r.paired_time_ratios().is_empty());
        assert_eq!(r.ours.unwrap().concat().len(), 6);
        assert_eq!(r.theirs.unwrap_err().to_string(), "torch crashed");
        // it failed in its untimed opening block and was not asked again
        assert_eq!(calls, 1);
        let mut bad = |_: Plan| Err(Error::Failed("no GPU".into()));
        let mut fine = |p: Plan| Ok(vec![1.0; p.reps]);
        assert!(interleave(
            3,
            (Plan::new(0, 2), Plan::new(0, 2)),
            Duration::ZERO,
            false,
            &mut bad,
            &mut fine
        )
        .ours
        .is_err());
    }

    #[test]
    fn rates() {
        assert!((tflops(2.0 * 8192f64.powi(3), 1.0) - 1099.511627776).abs() < 1e-6);
        assert!((gbs(1e9, 1000.0) - 1.0).abs() < 1e-12);
    }
}
