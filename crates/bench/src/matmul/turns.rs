//! PyTorch taking turns with gpukit row by row (`--compare-pytorch`): blocks of each side in
//! both orders, lengthened on the GPU to whole passes over the operand sets, and PyTorch's
//! figure from its samples.

use super::MatmulOptions;
use crate::error::Result;
use crate::harness::{both_orders, tflops, Clock, Measurement, PeerSamples, Plan};
use crate::peer::PeerServer;
use crate::report::PeerFigure;
use gpukit_tensor::DType;

/// PyTorch taking turns with gpukit row by row (`--compare-pytorch`), and the rows it gave
/// no figure for.
pub(super) struct Turns {
    pub server: Option<PeerServer>,
    pub missed: Vec<String>,
}

impl Turns {
    /// Times `ours` and PyTorch's same product in alternating blocks (`harness::interleave`);
    /// without a server, `ours` alone runs `plan`. `shape`, when known, lengthens blocks to
    /// `opts.block_ms` and rounds them to whole passes over the operand sets (`block_reps`).
    /// Returns our measurement and PyTorch's samples, if it gave any.
    pub fn time(
        &mut self,
        clock: Clock,
        (device, dtype, n): (&str, DType, usize),
        opts: &MatmulOptions,
        plan: Plan,
        shape: Option<TurnShape>,
        ours: &mut dyn FnMut(Plan) -> Result<Vec<f64>>,
    ) -> (Result<Measurement>, Option<PeerSamples>) {
        let summarise =
            |p: Plan, s: Result<Vec<f64>>| s.and_then(|s| Measurement::of(clock, p, &s));
        let Some(server) = self.server.as_mut() else {
            return (summarise(plan, ours(plan)), None);
        };
        let rounds = opts.rounds.max(1);
        let reps = block_reps(plan.reps.div_ceil(rounds), shape, opts.block_ms);
        let budget = plan.max_seconds / rounds as f64;
        // the first block of each side warms up as asked; later ones briefly (GPU) or not at
        // all (CPU, where one repetition can take a second)
        let first = Plan::new(plan.warmup, reps).with_budget(budget);
        let later = Plan::new(if clock == Clock::Host { 0 } else { 2 }, reps).with_budget(budget);
        let mut theirs = |p: Plan| {
            server.matmul_block(
                device,
                dtype.name(),
                n,
                opts.init.name(),
                p.warmup,
                p.reps,
                p.max_seconds,
            )
        };
        let soak = if clock == Clock::Host {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(opts.soak_ms / 1e3)
        };
        let run = both_orders(rounds, (first, later), soak, ours, &mut theirs);
        let mine = match run.ours {
            Ok(m) => m,
            Err(e) => return (Err(e), None),
        };
        let theirs = match run.theirs {
            Err(e) => {
                self.missed.push(format!("{device} {dtype} {n}: {e}"));
                None
            }
            Ok(p) if p.samples.is_empty() => None,
            Ok(p) => Some(p),
        };
        let overall = Plan::new(plan.warmup, reps * rounds).with_budget(plan.max_seconds);
        (summarise(overall, Ok(mine)), theirs)
    }
}

/// What a GPU row's turns are cut to: the time of one repetition, and how many operand sets the
/// repetitions rotate over.
#[derive(Debug, Clone, Copy)]
pub(super) struct TurnShape {
    pub per_rep_ms: f64,
    pub sets: usize,
}

/// Repetitions per turn: `reps`, or as many as fill `block_ms` at `shape.per_rep_ms` each (at
/// most `MAX_BLOCK_REPS`), rounded up to whole passes over `shape.sets` so that every turn
/// multiplies each operand set equally often. Between two blocks the chip idles while the sides
/// hand over (PyTorch's blocks follow one or two pipe round trips, ours none or one), and on a
/// power-capped chip idle time buys clock; longer turns make it a smaller share of each turn.
/// Its effect on a ratio was not measured on its own (runs 45-46 changed more than this).
pub(super) fn block_reps(reps: usize, shape: Option<TurnShape>, block_ms: f64) -> usize {
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
pub(super) const MAX_BLOCK_REPS: usize = 2000;

/// PyTorch's figure for a row from its samples, beside ours. The ratio comes from the
/// per-round ratios when there are any (pooled medians of two bimodal, throttled series can
/// each land on either mode): the geometric mean of the two orders' medians, so that what the
/// opener gains cancels, or the median of one order's rounds.
pub(super) fn peer_figure(
    theirs: Option<PeerSamples>,
    flops: f64,
    ours_tflops: f64,
) -> Option<PeerFigure> {
    let theirs = theirs?;
    let s = crate::stats::Summary::of(&theirs.samples)?;
    let rate = tflops(flops, s.median);
    let ratio = theirs.ratio().unwrap_or(ours_tflops / rate);
    Some(PeerFigure {
        median_ms: s.median,
        rate,
        ratio,
        turn_ratios: theirs.turn_ratios,
        by_opener: theirs.by_opener,
    })
}
