//! One process driving several GPUs from a thread each: when one thread's work fails after the
//! GPUs joined one NCCL communicator, the others' collectives wait for it forever, and the
//! process would hang joining them. [`after_failure`] arms a timer that ends the process with
//! the failure's message if it is still running when the timer fires (a process whose threads
//! all finish exits first, with its own error).

use std::time::Duration;

/// Ends the process (exit 1, `error: <message>`) `after` from now, unless it has exited by
/// then. For a thread whose failure its sibling GPUs' threads cannot outlive.
pub fn after_failure(after: Duration, message: String) {
    let spawned = std::thread::Builder::new()
        .name("gpukit-hang-guard".into())
        .spawn(move || {
            std::thread::sleep(after);
            eprintln!(
                "error: {message} (the other GPUs' work waits for this one's and cannot finish; \
                 stopped after {} s)",
                after.as_secs()
            );
            gpukit_cuda::nccl::exit_now(1)
        });
    // without a thread there is no guard; the failure is still returned to the caller
    drop(spawned);
}
