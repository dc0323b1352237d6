//! PyTorch taking turns with gpukit row by row (`--compare-pytorch`): blocks of each side in
//! both orders, lengthened on the GPU to whole passes over the operand sets, and PyTorch's
//! figure from its samples.

use super::MatmulOptions;
use crate::error::Result;
pub(super) use crate::measure::{block_reps, TurnShape};
use crate::measure::{both_orders, tflops, Clock, Measurement, PeerSamples, Plan};
use crate::peer::PeerServer;
use crate::power::{PowerMeter, RowPower, Windows};
use crate::report::PeerFigure;
use gpukit_tensor::DType;

/// PyTorch taking turns with gpukit row by row (`--compare-pytorch`), and the rows it gave
/// no figure for.
pub(super) struct Turns {
    pub server: Option<PeerServer>,
    pub missed: Vec<String>,
    /// Samples the GPU's power while GPU rows are timed (None without NVML).
    pub meter: Option<PowerMeter>,
}

/// What the GPU drew during each side's timed blocks (GPU rows with a meter).
#[derive(Default)]
pub(super) struct Powers {
    pub ours: Option<RowPower>,
    pub theirs: Option<RowPower>,
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
    ) -> (Result<Measurement>, Option<PeerSamples>, Powers) {
        let summarise =
            |p: Plan, s: Result<Vec<f64>>| s.and_then(|s| Measurement::of(clock, p, &s));
        // the GPU's power during each side's blocks (a CPU row's blocks say nothing of it)
        let meter = self.meter.as_ref().filter(|_| clock == Clock::CudaEvents);
        let (mut ours_w, mut theirs_w) = (Windows::default(), Windows::default());
        let mut ours = |p: Plan| match meter {
            Some(m) => m.timed(&mut ours_w, || ours(p)),
            None => ours(p),
        };
        // gpukit's PyTorch peer multiplies no fp8 (torch's fp8 product is a scaled one with
        // its own rules): fp8 rows run alone, and say so
        if dtype.matmul_only() && self.server.is_some() {
            self.missed.push(format!(
                "{device} {dtype} {n}: no PyTorch turn (the peer runs no fp8 product)"
            ));
        }
        let server = if dtype.matmul_only() {
            None
        } else {
            self.server.as_mut()
        };
        let Some(server) = server else {
            let mine = summarise(plan, ours(plan));
            let powers = Powers {
                ours: meter.and_then(|m| m.during(&ours_w)),
                theirs: None,
            };
            return (mine, None, powers);
        };
        let rounds = opts.rounds.max(1);
        let reps = block_reps(plan.reps.div_ceil(rounds), shape, opts.block_ms);
        let budget = plan.max_seconds / rounds as f64;
        // the first block of each side warms up as asked; later ones briefly (GPU) or not at
        // all (CPU, where one repetition can take a second)
        let first = Plan::new(plan.warmup, reps).with_budget(budget);
        let later = Plan::new(if clock == Clock::Host { 0 } else { 2 }, reps).with_budget(budget);
        let mut block = |p: Plan| {
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
        let mut theirs = |p: Plan| match meter {
            Some(m) => m.timed(&mut theirs_w, || block(p)),
            None => block(p),
        };
        let soak = if clock == Clock::Host {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(opts.soak_ms / 1e3)
        };
        let run = both_orders(rounds, (first, later), soak, &mut ours, &mut theirs);
        let powers = Powers {
            ours: meter.and_then(|m| m.during(&ours_w)),
            theirs: meter.and_then(|m| m.during(&theirs_w)),
        };
        let mine = match run.ours {
            Ok(m) => m,
            Err(e) => return (Err(e), None, powers),
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
        (summarise(overall, Ok(mine)), theirs, powers)
    }
}

/// PyTorch's figure for a row from its samples, beside ours (TFLOP/s of `flops`).
pub(super) fn peer_figure(
    theirs: Option<PeerSamples>,
    flops: f64,
    ours_tflops: f64,
) -> Option<PeerFigure> {
    PeerFigure::from_turns(theirs, |ms| tflops(flops, ms), ours_tflops)
}
