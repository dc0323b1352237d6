//! How the selection policy times a candidate on the real buffers: a backend engine
//! configuration captured once as a CUDA graph and replayed, a legacy algorithm as direct calls
//! (its host work counts: the eager pass pays it), each stopped early when it cannot win, and
//! the finalists timed again in interleaved rounds.
//!
//! A replay calls no library: a lock that another thread holds inside cuDNN (a helper
//! finalizing a plan that compiles at run time, see `precompile`) cannot stretch the timed runs,
//! and the launches follow one another without the host's gaps. Timed as direct calls while
//! helpers compiled, candidates on an H100 measured up to 15 times their speed, and the
//! fastest engine of a 1x1 convolution lost to one half as fast.

use super::Dnn;
use crate::error::{Error, Result};

/// A GPU idle this long may have lowered its clocks.
const IDLE_CLOCKS_DOWN: std::time::Duration = std::time::Duration::from_millis(50);
/// Launches in a row when finalists are timed as a graph ([`Dnn::confirm_finalists`]).
const BACK_TO_BACK: usize = 8;
/// How long a candidate runs, untimed, on a GPU that was idle: long enough for the clocks to
/// come up (the first candidates of a selection were timed up to 2x slow without it, and lost).
const WARM_UP: std::time::Duration = std::time::Duration::from_millis(30);
/// Launches of a candidate in the graph its timing replays ([`Dnn::candidate_ms_within`]).
const IN_GRAPH: usize = 3;
/// Interleaved rounds in which the finalists are timed again ([`Dnn::confirm_finalists`]).
const CONFIRM_ROUNDS: usize = 3;
/// A finalist whose first score is this many times the best first score keeps it, untimed
/// again ([`Dnn::confirm_finalists`]): the rounds' spread is a few percent, and re-timing such
/// finalists was a sixth of `gpukit all`'s planning (an 11 ms finalist beside a 0.4 ms best).
const CONFIRM_FACTOR: f64 = 1.5;
/// Finalists within this fraction of the best after the rounds are near-ties
/// ([`Dnn::confirm_finalists`]).
const NEAR_TIE: f64 = 0.03;
/// Near-ties are timed again as replays of about this long ([`steady_launches`]): a row of
/// `bench conv` replays some 50 launches of an 8 us convolution, where configurations of one
/// engine that timed alike in graphs of 8 launches ran 8.45 and 9.1 us.
const STEADY_REPLAY_MS: f64 = 0.25;
/// The most launches in one of those replays.
const MOST_LAUNCHES: usize = 64;
/// A candidate whose first run takes this many times the best time so far is not timed
/// further ([`Dnn::candidate_ms_within`]): past a cold GPU's clock ramp (under 2x), it cannot
/// win. A backend engine's first run is one direct call ([`Dnn::direct_run_ms`]).
const PROBE_FACTOR: f64 = 3.0;

impl Dnn {
    /// Median device milliseconds of one run of `work`, a backend engine configuration:
    /// captured as a graph of [`IN_GRAPH`] runs and timed over 5 replays after 2 warm-up ones
    /// (as direct calls when it cannot be captured). See [`Dnn::timed_within`].
    pub(crate) fn candidate_ms_within(
        &self,
        beat: Option<f64>,
        work: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        self.timed_within(true, beat, work)
    }

    /// Median device milliseconds of one call of `work`, a legacy algorithm, timed as direct
    /// calls (5 after 2 warm-up ones): as the eager pass makes them, host work included. A
    /// legacy call may build a plan on the host at every call (cuDNN 9's fused legacy call
    /// does): timed by replays, three residual convolutions of ResNet-50 chose it and the eager
    /// pass at batch 32 ran at 40-60% of its speed with backend engines.
    pub(crate) fn call_ms_within(
        &self,
        beat: Option<f64>,
        work: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        self.timed_within(false, beat, work)
    }

    /// [`Dnn::call_ms_within`] with nothing to beat: timed in full.
    pub(crate) fn call_ms(&self, work: impl FnMut() -> Result<()>) -> Result<f64> {
        self.timed_within(false, None, work)
    }

    /// With a time to beat, one run is timed first (a backend engine's as one direct call, then
    /// one replay), and a candidate over [`PROBE_FACTOR`] times that time is not timed further
    /// (that run's time is its score):
    /// some legacy algorithms take tens of milliseconds a call where the winner takes tens of
    /// microseconds, and without the probe their repetitions cost seconds a convolution. A GPU
    /// that sat idle first runs the candidate untimed for [`WARM_UP`].
    fn timed_within(
        &self,
        replayed: bool,
        beat: Option<f64>,
        mut work: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        let graph = replayed
            .then(|| {
                self.gpu_stream
                    .capture(|| {
                        for _ in 0..IN_GRAPH {
                            work()?;
                        }
                        Ok::<(), Error>(())
                    })
                    .ok()
            })
            .flatten();
        // a slow candidate is stopped after one direct run, not a replay of IN_GRAPH runs (the
        // fallback engines that take 7-15 ms a run were a quarter of a cold plan's time)
        if let (Some(_), Some(beat)) = (&graph, beat.filter(|b| b.is_finite())) {
            let gpu_ms = self.direct_run_ms(&mut work)?;
            if gpu_ms > beat * PROBE_FACTOR {
                return Ok(gpu_ms);
            }
        }
        let (mut replay, runs): (Box<dyn FnMut() -> Result<()>>, usize) = match &graph {
            Some(g) => (Box::new(|| g.launch()), IN_GRAPH),
            None => (Box::new(&mut work), 1),
        };
        if let Some(beat) = beat.filter(|b| b.is_finite()) {
            let first = crate::timing::time_on_stream(&self.gpu_stream, 0, 1, &mut replay)?;
            let probe = first.first().copied().unwrap_or(f64::INFINITY) / runs as f64;
            if probe > beat * PROBE_FACTOR {
                return Ok(probe);
            }
        }
        let idle = self
            .last_timed
            .get()
            .is_none_or(|t| t.elapsed() > IDLE_CLOCKS_DOWN);
        if idle {
            let started = std::time::Instant::now();
            while started.elapsed() < WARM_UP {
                for _ in 0..8 {
                    replay()?;
                }
                self.gpu_stream.synchronize()?;
            }
        }
        let mut times = crate::timing::time_on_stream(&self.gpu_stream, 2, 5, &mut replay)?;
        self.last_timed.set(Some(std::time::Instant::now()));
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2] / runs as f64)
    }

    /// One direct call of `work`: its device time less the host's time enqueueing it, a lower
    /// bound of the GPU's own time (the GPU, idle at the start, may have waited for the host:
    /// a call held up by a lock another thread holds inside cuDNN reads short, never long).
    /// Called after the graph of `work` was captured, so its kernels are loaded already.
    fn direct_run_ms(&self, work: &mut impl FnMut() -> Result<()>) -> Result<f64> {
        self.gpu_stream.synchronize()?;
        let start = self.gpu_stream.record_timed()?;
        let host = std::time::Instant::now();
        work()?;
        let host_ms = host.elapsed().as_secs_f64() * 1e3;
        let end = self.gpu_stream.record_timed()?;
        end.synchronize()?;
        Ok((start.elapsed_ms(&end)? - host_ms).max(0.0))
    }

    /// Times each finalist again, as a graph of [`BACK_TO_BACK`] launches, in
    /// [`CONFIRM_ROUNDS`] interleaved rounds (A B C, A B C, ...), and sets each one's score to
    /// the median of its rounds: a clock or a neighbour that changes during the rounds touches
    /// every finalist alike, so the same convolution is not won by one engine in one run and
    /// another in the next. A finalist that cannot be captured, or whose first score is
    /// [`CONFIRM_FACTOR`] times the best one or more, keeps its first score. Finalists then
    /// within [`NEAR_TIE`] of the best are timed once more the same way in replays of about
    /// [`STEADY_REPLAY_MS`] ([`steady_launches`]; short kernels only).
    pub(crate) fn confirm_finalists<T>(
        &self,
        finalists: &mut [(f64, T)],
        run: impl Fn(&T) -> Result<()>,
    ) -> Result<()> {
        let best = finalists
            .iter()
            .map(|(score, _)| *score)
            .fold(f64::INFINITY, f64::min);
        let contends = |score: f64| score < best * CONFIRM_FACTOR;
        if finalists
            .iter()
            .filter(|(score, _)| contends(*score))
            .count()
            < 2
        {
            return Ok(());
        }
        let chosen: Vec<bool> = finalists.iter().map(|(s, _)| contends(*s)).collect();
        self.time_in_rounds(finalists, &chosen, BACK_TO_BACK, &run)?;
        // near-ties of short kernels: timed again in replays as long as a steady stream of
        // them, where a configuration's start-up and its overlap with the next launch weigh as
        // they do in a long run
        let best = finalists
            .iter()
            .map(|(score, _)| *score)
            .fold(f64::INFINITY, f64::min);
        let launches = steady_launches(best);
        let ties: Vec<bool> = finalists
            .iter()
            .zip(&chosen)
            .map(|((score, _), c)| *c && *score <= best * (1.0 + NEAR_TIE))
            .collect();
        if launches > BACK_TO_BACK && ties.iter().filter(|t| **t).count() >= 2 {
            self.time_in_rounds(finalists, &ties, launches, &run)?;
        }
        Ok(())
    }

    /// Times the `chosen` finalists as graphs of `launches` launches in [`CONFIRM_ROUNDS`]
    /// interleaved rounds and sets each one's score to the median of its rounds (one that cannot
    /// be captured keeps its score).
    fn time_in_rounds<T>(
        &self,
        finalists: &mut [(f64, T)],
        chosen: &[bool],
        launches: usize,
        run: &impl Fn(&T) -> Result<()>,
    ) -> Result<()> {
        let graphs: Vec<Option<crate::stream::Graph>> = finalists
            .iter()
            .zip(chosen)
            .map(|((_, item), chosen)| {
                if !*chosen {
                    return None;
                }
                self.gpu_stream
                    .capture(|| {
                        for _ in 0..launches {
                            run(item)?;
                        }
                        Ok::<(), Error>(())
                    })
                    .ok()
            })
            .collect();
        let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); finalists.len()];
        for _ in 0..CONFIRM_ROUNDS {
            for (i, graph) in graphs.iter().enumerate() {
                let Some(graph) = graph else { continue };
                let mut replay = || graph.launch();
                let mut times = crate::timing::time_on_stream(&self.gpu_stream, 1, 3, &mut replay)?;
                times.sort_by(f64::total_cmp);
                rounds[i].push(times[times.len() / 2] / launches as f64);
            }
        }
        self.last_timed.set(Some(std::time::Instant::now()));
        for ((score, _), mut r) in finalists.iter_mut().zip(rounds) {
            if !r.is_empty() {
                r.sort_by(f64::total_cmp);
                *score = r[r.len() / 2];
            }
        }
        Ok(())
    }
}

/// Launches in a replay of about [`STEADY_REPLAY_MS`] of a kernel taking `ms`: at least
/// [`BACK_TO_BACK`], at most [`MOST_LAUNCHES`].
fn steady_launches(ms: f64) -> usize {
    if ms.is_nan() || ms <= 0.0 {
        return BACK_TO_BACK;
    }
    ((STEADY_REPLAY_MS / ms).ceil() as usize).clamp(BACK_TO_BACK, MOST_LAUNCHES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_ties_of_short_kernels_are_replayed_longer() {
        // an 8.4 us convolution: about 30 launches a replay; a millisecond one stays at 8
        assert_eq!(steady_launches(0.0084), 30);
        assert_eq!(steady_launches(1.0), BACK_TO_BACK);
        assert_eq!(steady_launches(0.0001), MOST_LAUNCHES);
        assert_eq!(steady_launches(f64::NAN), BACK_TO_BACK);
        assert_eq!(steady_launches(0.0), BACK_TO_BACK);
    }
}
