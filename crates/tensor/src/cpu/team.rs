//! A team of spinning threads for the layer-by-layer inference path.
//!
//! A ResNet forward pass is some 55 parallel steps of 0.05-0.5 ms each at batch 1. Handing each
//! to rayon wakes its sleeping workers every time, and the last one starts tens of microseconds
//! late (measured 7-12 us per step on 2 cores, more with more threads). The team's workers
//! instead wait between steps without sleeping, like an OpenMP runtime's: they spin for 50 us,
//! then keep checking but yield their core to any other runnable thread in between, and park
//! after 2 ms, so a step reaches every thread within a cache-line transfer while the machine is
//! otherwise idle, and the team gives way to other work while it is not. The packed convolution
//! and `parallel_ranges` use it when the work is split as many ways as rayon has threads (so a
//! caller's own rayon pool of another size still gets rayon), and not from inside a team job.

use super::{threads, SharedOut};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// How long an idle team worker spins flat out before it starts yielding its core to any
/// other runnable thread between checks, and how long it waits in all before it parks.
const TEAM_SPIN: std::time::Duration = std::time::Duration::from_micros(50);
const TEAM_PARK: std::time::Duration = std::time::Duration::from_millis(2);

/// A job as the workers see it: the leader's closure, its lifetime erased (the leader does not
/// return before every worker is done with it).
type JobPtr = *const (dyn Fn(usize) + Sync + 'static);

/// What the leader and the workers share.
struct TeamState {
    /// Bumped (SeqCst) by the leader to start a job.
    generation: AtomicUsize,
    /// The current job; written only while no worker runs one.
    job: std::cell::UnsafeCell<JobPtr>,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Whether a worker's share of the current job panicked.
    panicked: AtomicBool,
    /// Workers parked (or about to park) on `cv`.
    sleepers: AtomicUsize,
    mutex: Mutex<()>,
    cv: Condvar,
}

// SAFETY: `job` is written by the leader only between jobs (no worker reads it then, see
// `Team::run`) and read by workers only during one; the closure it points to is Sync, so
// calling it from any thread is fine; everything else is atomics and locks.
unsafe impl Sync for TeamState {}
// SAFETY: as for Sync: the pointer is only a handle to a Sync closure.
unsafe impl Send for TeamState {}

/// Threads that run one job at a time, each member (the caller being member 0) with its index.
struct Team {
    size: usize,
    state: Arc<TeamState>,
    /// One job at a time, whoever calls.
    leader: Mutex<()>,
}

thread_local! {
    /// Whether this thread is running a team job (a nested job must not wait for the team).
    static IN_TEAM_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Placeholder for `TeamState::job` before the first job.
fn no_job(_: usize) {}

impl Team {
    /// A team of `size` members: the caller and `size - 1` new threads; None if a thread
    /// cannot be started.
    fn new(size: usize) -> Option<Team> {
        let placeholder: &'static (dyn Fn(usize) + Sync) = &no_job;
        let state = Arc::new(TeamState {
            generation: AtomicUsize::new(0),
            job: std::cell::UnsafeCell::new(placeholder as JobPtr),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            mutex: Mutex::new(()),
            cv: Condvar::new(),
        });
        for index in 1..size {
            let st = Arc::clone(&state);
            std::thread::Builder::new()
                .name(format!("gpukit-team-{index}"))
                .spawn(move || Team::work(&st, index))
                .ok()?;
        }
        Some(Team {
            size,
            state,
            leader: Mutex::new(()),
        })
    }

    /// A worker's life: wait for a job, run its share, report; forever (the team is static).
    fn work(st: &TeamState, index: usize) {
        let mut seen = 0;
        loop {
            let mut spins = 0u32;
            let mut since = None;
            loop {
                let g = st.generation.load(Ordering::Acquire);
                if g != seen {
                    seen = g;
                    break;
                }
                spins = spins.wrapping_add(1);
                if spins & 63 == 0 {
                    let start = *since.get_or_insert_with(std::time::Instant::now);
                    let waited = start.elapsed();
                    if waited > TEAM_SPIN {
                        // on a busy machine, let whoever else is runnable have the core
                        std::thread::yield_now();
                    }
                    if waited > TEAM_PARK {
                        // park; the leader notifies under the mutex when it sees a sleeper
                        st.sleepers.fetch_add(1, Ordering::SeqCst);
                        let mut guard = st.mutex.lock().unwrap_or_else(|e| e.into_inner());
                        while st.generation.load(Ordering::SeqCst) == seen {
                            guard = st.cv.wait(guard).unwrap_or_else(|e| e.into_inner());
                        }
                        drop(guard);
                        st.sleepers.fetch_sub(1, Ordering::SeqCst);
                        since = None;
                    }
                }
                std::hint::spin_loop();
            }
            // SAFETY: the generation was bumped after the job was written (Release/Acquire),
            // and the leader keeps the closure alive until `pending` reaches zero below.
            let job = unsafe { &**st.job.get() };
            IN_TEAM_JOB.with(|f| f.set(true));
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index)));
            IN_TEAM_JOB.with(|f| f.set(false));
            if ok.is_err() {
                st.panicked.store(true, Ordering::Relaxed);
            }
            st.pending.fetch_sub(1, Ordering::Release);
        }
    }

    /// Runs `job(i)` for every member i, the caller taking 0; returns when all are done.
    ///
    /// # Panics
    ///
    /// If any member's share panicked (after every member has finished).
    fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        let _leader = self.leader.lock().unwrap_or_else(|e| e.into_inner());
        let st = &*self.state;
        /// Waits for the workers even when the leader's own share unwinds, since they borrow
        /// the job from the leader's stack.
        struct Wait<'a>(&'a TeamState);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                let mut spins = 0u32;
                while self.0.pending.load(Ordering::Acquire) != 0 {
                    // a worker still busy, or descheduled: after a short spin, yield
                    spins = spins.saturating_add(1);
                    if spins > 2048 {
                        std::thread::yield_now();
                    }
                    std::hint::spin_loop();
                }
            }
        }
        // SAFETY: no worker is running a job (the previous run waited for all of them), so
        // none reads `job` while it is replaced; the erased lifetime is upheld by `Wait`.
        unsafe {
            *st.job.get() = std::mem::transmute::<&(dyn Fn(usize) + Sync), JobPtr>(job);
        }
        st.panicked.store(false, Ordering::Relaxed);
        st.pending.store(self.size - 1, Ordering::Relaxed);
        st.generation.fetch_add(1, Ordering::SeqCst);
        if st.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = st.mutex.lock().unwrap_or_else(|e| e.into_inner());
            st.cv.notify_all();
        }
        {
            let _wait = Wait(st);
            IN_TEAM_JOB.with(|f| f.set(true));
            let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0)));
            IN_TEAM_JOB.with(|f| f.set(false));
            if let Err(payload) = mine {
                drop(_wait);
                std::panic::resume_unwind(payload);
            }
        }
        assert!(
            !st.panicked.load(Ordering::Relaxed),
            "a team thread panicked"
        );
    }
}

/// The process's team, sized like rayon's global pool when first asked for.
fn global_team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<Team>> = OnceLock::new();
    TEAM.get_or_init(|| Team::new(rayon::current_num_threads()))
        .as_ref()
}

/// Runs `job(i, parts)` for i in 0..parts, in parallel: on the spinning team when this thread
/// may use it and its size is `parts` (else on rayon), inline when `parts` is 1.
pub(super) fn run_parts(parts: usize, job: &(dyn Fn(usize, usize) + Sync)) {
    if parts <= 1 {
        job(0, 1);
        return;
    }
    let team = global_team().filter(|t| t.size == parts && !IN_TEAM_JOB.with(|f| f.get()));
    match team {
        Some(t) => t.run(&|i| job(i, parts)),
        None => (0..parts).into_par_iter().for_each(|i| job(i, parts)),
    }
}

/// Calls `f` on `threads()` contiguous, nearly equal ranges covering `0..count`, in parallel
/// (on the same spinning team as [`conv2d_nhwc_packed`](super::conv2d_nhwc_packed), so that
/// short steps between convolutions do not wake rayon's sleeping threads). Ranges may be empty.
pub fn parallel_ranges(count: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let parts = threads().min(count).max(1);
    run_parts(parts, &|i, parts| {
        f(count * i / parts..count * (i + 1) / parts)
    });
}

/// Calls `f(row_index, row)` for every `row_len`-element row of `buf` (the last row may be
/// shorter), the rows split over the team in contiguous ranges as [`parallel_ranges`] splits
/// them: each call gets its own row, so callers write in parallel with no unsafe code.
pub fn parallel_rows(buf: &mut [f32], row_len: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let row_len = row_len.max(1);
    let len = buf.len();
    let rows = len.div_ceil(row_len);
    let out = SharedOut(buf.as_mut_ptr());
    parallel_ranges(rows, &|range| {
        for i in range {
            let start = i * row_len;
            let n = row_len.min(len - start);
            // SAFETY: every row index is handed to exactly one range, rows are disjoint and
            // inside `buf`, whose exclusive borrow outlives the parallel section.
            let row = unsafe { std::slice::from_raw_parts_mut(out.get().add(start), n) };
            f(i, row);
        }
    });
}

#[cfg(test)]
mod tests;
