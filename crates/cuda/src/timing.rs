//! Device timing with CUDA events: the only honest clock for asynchronous GPU work.

use crate::error::Error;
use crate::stream::Stream;
use cudarc::driver::sys;

/// Runs `work` `warmup` times untimed, then `reps` times, each between two events recorded on
/// `stream`; returns each repetition's device milliseconds. Synchronizes once at the end, so
/// repetitions queue back to back and launch gaps between them are not counted.
pub fn time_on_stream<E: From<Error>>(
    stream: &Stream,
    warmup: usize,
    reps: usize,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<Vec<f64>, E> {
    for _ in 0..warmup {
        work()?;
    }
    stream.synchronize()?;
    let raw = stream.raw();
    let ctx = raw.context();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(reps + 1);
    for _ in 0..=reps {
        events.push(ctx.new_event(flags).map_err(Error::from)?);
    }
    events[0].record(raw).map_err(Error::from)?;
    for i in 0..reps {
        work()?;
        events[i + 1].record(raw).map_err(Error::from)?;
    }
    stream.synchronize()?;
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(f64::from)
                .map_err(|e| E::from(Error::from(e)))
        })
        .collect()
}

/// Device milliseconds of one run of each of `candidates` alternatives (`enqueue(i)` queues
/// alternative `i` once on `stream`), for kernels too short to time one at a time: each is
/// captured as a graph of as many runs as fill about `replay_ms` (at most `most_runs`), the
/// graphs replayed once each untimed, then timed in `rounds` interleaved turns (a clock that
/// drifts during the rounds moves every alternative alike); each score is the median of its
/// turns over its runs. An alternative that cannot be captured or run scores infinity.
pub fn replays_in_turns<E: From<Error>>(
    stream: &Stream,
    candidates: usize,
    replay_ms: f64,
    most_runs: usize,
    rounds: usize,
    mut enqueue: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<f64>, E> {
    let mut capture = |i: usize, runs: usize| {
        stream
            .capture(|| (0..runs).try_for_each(|_| enqueue(i)))
            .ok()
    };
    let once = |g: &crate::stream::Graph| {
        time_on_stream::<Error>(stream, 1, 1, || g.launch())
            .ok()
            .and_then(|t| t.first().copied())
    };
    // a first estimate from one run each sets how many runs a graph holds
    let singles: Vec<Option<crate::stream::Graph>> =
        (0..candidates).map(|i| capture(i, 1)).collect();
    let fastest = singles
        .iter()
        .flatten()
        .filter_map(once)
        .fold(f64::INFINITY, f64::min);
    if !fastest.is_finite() {
        return Ok(vec![f64::INFINITY; candidates]);
    }
    let runs = ((replay_ms / fastest.max(1e-4)).ceil() as usize).clamp(1, most_runs.max(1));
    drop(singles);
    let graphs: Vec<Option<crate::stream::Graph>> =
        (0..candidates).map(|i| capture(i, runs)).collect();
    for g in graphs.iter().flatten() {
        g.launch()?;
    }
    stream.synchronize()?;
    let mut turns = vec![Vec::with_capacity(rounds); candidates];
    for _ in 0..rounds.max(1) {
        for (i, g) in graphs.iter().enumerate() {
            if let Some(ms) = g.as_ref().and_then(|g| {
                time_on_stream::<Error>(stream, 0, 1, || g.launch())
                    .ok()
                    .and_then(|t| t.first().copied())
            }) {
                turns[i].push(ms / runs as f64);
            }
        }
    }
    Ok(turns
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t.get(t.len() / 2).copied().unwrap_or(f64::INFINITY)
        })
        .collect())
}
