//! Several GPUs, several processes: who this process is among its peers ([`world`]), how the
//! peers find each other and stay in touch ([`rendezvous`]), and how one machine starts them
//! ([`launch`]). No CUDA here: NCCL itself is wrapped by the cuda crate; this crate carries the
//! bytes NCCL needs (its unique id) and notices when a peer is gone. No MPI library either: an
//! MPI launcher only tells each process its rank.
//!
//! To use:
//! 1. [`world::from_process_env`]: `None` is a plain single process; `Some(world)` says the rank,
//!    the world's size and where rank 0 listens.
//! 2. [`rendezvous::Session::join`] with a closure that makes NCCL's unique id (run on rank 0
//!    only); every rank gets it from [`rendezvous::Session::blob`].
//! 3. [`rendezvous::Session::all_gather`] to collect per-rank results; [`rendezvous::Session::finish`]
//!    before exiting on success, [`rendezvous::Session::abort`] on failure. Meanwhile a watchdog
//!    makes every rank exit with a clear message within the timeout when a peer dies.
//!
//! [`launch::run`] is `gpukit launch`: N local ranks, like torchrun's standalone mode.
//!
//! # Across machines
//! Any of these launchers starts gpukit on every node; gpukit reads its variables:
//!
//! - Slurm: `srun -N2 --ntasks-per-node=2 gpukit ...` (rank 0's host is the step's first node;
//!   the port is 29500 + SLURM_JOB_ID % 1000 unless MASTER_PORT is set).
//! - Open MPI: `mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a -x MASTER_PORT=29500 gpukit ...`
//!   (MPICH / Intel MPI: `mpiexec -genv MASTER_ADDR a -genv MASTER_PORT 29500 ...`).
//! - torchrun: `torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint
//!   a:29400 --no-python $(which gpukit) ...` (`--no-python`, also spelt `--no_python`, runs
//!   an executable instead of a Python script; gpukit moves to MASTER_PORT+1 when torchrun's
//!   agent already serves its store on MASTER_PORT, or to GPUKIT_RDZV_PORT).
//! - `gpukit launch --nnodes 2 --node-rank <0|1> --nproc-per-node 2 --master-addr a
//!   --master-port 29500 -- gpukit ...` on each node.
//!
//! NCCL then needs a network between the nodes: `NCCL_SOCKET_IFNAME` picks the interface for
//! its TCP bootstrap and socket transport (e.g. `eth0`, `^lo,docker`), `NCCL_IB_HCA` the
//! InfiniBand or RoCE adapters (RoCE may also need `NCCL_IB_GID_INDEX`; other fabrics come as
//! NCCL net plugins), and `NCCL_DEBUG=INFO` prints the transport it chose. gpukit's own
//! rendezvous uses only the one TCP port.

#![forbid(unsafe_code)]

pub mod error;
pub mod launch;
pub mod rendezvous;
pub mod world;

pub use error::{Error, Result};
pub use launch::LaunchOptions;
pub use rendezvous::{OnLost, Options, Session};
pub use world::{Endpoint, Launcher, World};

static BEFORE_EXIT: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Registers what a watchdog runs before it ends the process over a lost peer (once; later
/// calls are ignored); the hook may end the process itself. GPU work stuck in a collective
/// whose peer is gone never finishes, and a process exiting normally with it still on the
/// device hangs in the driver's exit handlers: the caller's hook exits without them.
pub fn before_exit(hook: fn()) {
    let _ = BEFORE_EXIT.set(hook);
}

pub(crate) fn run_before_exit() {
    if let Some(hook) = BEFORE_EXIT.get() {
        hook();
    }
}

/// Writes one whole line to stderr in a single write, so that lines of ranks sharing a terminal
/// or a pipe never interleave mid-line (eprintln! writes its pieces separately).
pub(crate) fn stderr_line(line: &str) {
    use std::io::Write;
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    let _ = std::io::stderr().lock().write_all(&bytes);
}

/// `after` from now; a duration too long for the clock (a timeout of u64::MAX seconds) means
/// "a year from now", which no wait here outlives, instead of an overflow.
pub(crate) fn deadline_after(after: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(after)
        .or_else(|| now.checked_add(std::time::Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn endless_timeouts_do_not_overflow_the_clock() {
        let far = super::deadline_after(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(3600));
        let near = super::deadline_after(Duration::from_millis(5));
        assert!(near <= Instant::now() + Duration::from_millis(5));
    }
}
