//! `GPUKIT_TRACE=1` prints how long each start-up phase took, on stderr: how `check` is kept
//! fast, and how a user finds out what is slow on their machine.

use std::time::Instant;

fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUKIT_TRACE").is_ok_and(|v| v == "1"))
}

/// Whether `GPUKIT_TRACE=1` is set: callers print their own trace lines (prefixed "trace: ").
pub fn on() -> bool {
    enabled()
}

/// Starts a phase (None when tracing is off, so nothing is measured).
pub fn start() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// Ends a phase started with [`start`]: its length, then when it ended (milliseconds since the
/// first of gpukit's processes started), so phases on different threads line up.
pub fn done(phase: &str, started: Option<Instant>) {
    if let Some(t) = started {
        let at = since_process_start()
            .map(|ms| format!("  (ends at {ms:.0} ms)"))
            .unwrap_or_default();
        eprintln!(
            "trace: {:>8.2} ms  {phase}{at}",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// Milliseconds since [`mark_process_start`] ran in the first process (None when it did not).
fn since_process_start() -> Option<f64> {
    static T0: std::sync::OnceLock<Option<u128>> = std::sync::OnceLock::new();
    let t0 = (*T0.get_or_init(|| std::env::var(T0_ENV).ok().and_then(|v| v.parse().ok())))?;
    Some(unix_ns().saturating_sub(t0) as f64 / 1e6)
}

/// Environment variable carrying the first process's start time across gpukit's re-exec.
pub(crate) const T0_ENV: &str = "GPUKIT_INTERNAL_T0_NS";

fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Call first thing in `main`: remembers when the first of gpukit's processes started.
pub fn mark_process_start() {
    if enabled() && std::env::var_os(T0_ENV).is_none() {
        std::env::set_var(T0_ENV, unix_ns().to_string());
    }
}

/// Prints the time since [`mark_process_start`] ran in the first process (re-exec included).
pub fn done_since_process_start(phase: &str) {
    if !enabled() {
        return;
    }
    if let Some(ms) = since_process_start() {
        eprintln!("trace: {ms:>8.2} ms  {phase}");
    }
}

/// Prints a trace line built by `line` (only built when tracing is on).
pub fn note(line: impl FnOnce() -> String) {
    if enabled() {
        eprintln!("trace: {}", line());
    }
}
