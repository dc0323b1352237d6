//! Device timing with CUDA events: the only honest clock for asynchronous GPU work.

use crate::driver::CudaError;
use cudarc::driver::{sys, CudaStream};
use std::sync::Arc;

/// Runs `work` `warmup` times untimed, then `reps` times, each between two events recorded on
/// `stream`; returns each repetition's device milliseconds. Synchronizes once at the end, so
/// repetitions queue back to back and launch gaps between them are not counted.
pub fn time_on_stream<E>(
    stream: &Arc<CudaStream>,
    warmup: usize,
    reps: usize,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<Vec<f64>, TimingError<E>> {
    for _ in 0..warmup {
        work().map_err(TimingError::Work)?;
    }
    stream
        .synchronize()
        .map_err(|e| TimingError::Cuda(e.into()))?;
    let ctx = stream.context();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(reps + 1);
    for _ in 0..=reps {
        events.push(
            ctx.new_event(flags)
                .map_err(|e| TimingError::Cuda(e.into()))?,
        );
    }
    events[0]
        .record(stream)
        .map_err(|e| TimingError::Cuda(e.into()))?;
    for i in 0..reps {
        work().map_err(TimingError::Work)?;
        events[i + 1]
            .record(stream)
            .map_err(|e| TimingError::Cuda(e.into()))?;
    }
    stream
        .synchronize()
        .map_err(|e| TimingError::Cuda(e.into()))?;
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(f64::from)
                .map_err(|e| TimingError::Cuda(e.into()))
        })
        .collect()
}

/// Either the timed work failed or CUDA did.
#[derive(Debug, thiserror::Error)]
pub enum TimingError<E> {
    #[error("{0}")]
    Cuda(CudaError),
    #[error("timed work failed: {0}")]
    Work(E),
}
