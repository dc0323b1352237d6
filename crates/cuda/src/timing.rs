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
