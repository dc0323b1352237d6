//! Recording what an engine launches, op by op, for `gpukit profile`.
//!
//! Engines name each op they launch with [`op`] (a guard around the op's calls); while no
//! [`Profiler`] is recording on the calling thread that costs one thread-local check and the
//! op's description is never built. While one records, each op gets:
//! - its host launch interval (from entering the guard to leaving it);
//! - its GPU time: from CUPTI's activity records of the kernels, copies and memsets it started
//!   (correlated through an external correlation id pushed around the op), or, without CUPTI,
//!   from timed events recorded on the work stream before and after it ([`Timing::Events`]:
//!   event-bracketed stream time, not kernel time);
//! - an NVTX range with its name when libnvToolsExt is loaded, so Nsight Systems shows gpukit's
//!   names;
//! - a reading of the memory pool's used and reserved bytes when it ends.
//!
//! To use: `let p = Profiler::start(&gpu, &discovery, TimingChoice::Auto)?;` run the workload
//! (engines call [`op`] and [`step`]), then `p.finish()?` for the [`Recording`]. Without a GPU,
//! [`Profiler::host_only`] records the ops' host time alone.

mod cupti;

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use crate::stream::{Event, Stream};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

/// What one op is, as the engine that launches it describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpInfo {
    /// `conv`, `matmul`, `max_pool`, ...
    pub name: String,
    /// The model's name for where it sits (`layer3.1.conv2`), when it has one.
    pub layer: Option<String>,
    /// Shapes and types in words (`32x256x14x14 f16 NHWC, 3x3`).
    pub detail: String,
    /// The library call or kernel behind it (`cuDNN`, `cuBLASLt`, `NVRTC`).
    pub library: String,
    /// Floating-point operations it performs.
    pub flops: f64,
    /// Bytes it must move at least (inputs read once, outputs written once).
    pub bytes: f64,
    /// The element type its rate is set against (`f16`, `tf32`, ...).
    pub dtype: String,
}

/// How GPU time was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Timing {
    /// CUPTI's activity records: every kernel, copy and memset the GPU ran.
    Cupti,
    /// Timed events around each op on the work stream: stream time, not kernel time.
    Events,
    /// No GPU: host time only.
    Host,
}

impl Timing {
    pub fn describe(self) -> &'static str {
        match self {
            Timing::Cupti => "CUPTI activity records (kernel time)",
            Timing::Events => {
                "CUDA events around each op (event-bracketed stream time, not kernel time)"
            }
            Timing::Host => "host time only (no GPU)",
        }
    }
}

/// Which timing to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingChoice {
    /// CUPTI when it is found, else events.
    Auto,
    Cupti,
    Events,
}

/// One recorded op: times in microseconds from the recording's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedOp {
    pub info: OpInfo,
    /// The step ([`Profiler::step`]) it was launched in.
    pub step: usize,
    pub cpu_start_us: f64,
    pub cpu_end_us: f64,
    /// Event-bracketed GPU interval (events timing only).
    pub gpu: Option<(f64, f64)>,
}

/// What a GPU activity record was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivityKind {
    Kernel,
    Memcpy,
    Memset,
}

/// One kernel, copy or memset the GPU ran (CUPTI), in microseconds from the recording's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activity {
    pub kind: ActivityKind,
    /// The kernel's demangled name, or `memcpy HtoD` / `memset`.
    pub name: String,
    /// CUPTI's stream id.
    pub stream: u32,
    pub start_us: f64,
    pub end_us: f64,
    /// The index of the op that launched it, when one did.
    pub op: Option<usize>,
    /// Bytes copied or set (0 for kernels).
    pub bytes: u64,
}

/// A memory pool reading, in microseconds from the recording's start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PoolReading {
    pub ts_us: f64,
    pub used: u64,
    pub reserved: u64,
}

/// Everything one recording holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    pub timing: Timing,
    pub ops: Vec<RecordedOp>,
    pub activities: Vec<Activity>,
    pub pool: Vec<PoolReading>,
    /// Whether NVTX ranges were emitted.
    pub nvtx: bool,
    /// Host microseconds from start to finish.
    pub wall_us: f64,
    /// Activity records CUPTI dropped (its buffers were full).
    pub dropped: u64,
    /// Why CUPTI was not used, when it was wanted and events were used instead.
    pub fallback: Option<String>,
}

struct Pending {
    info: OpInfo,
    step: usize,
    cpu_start: Instant,
    cpu_end: Option<Instant>,
    events: Option<(Event, Option<Event>)>,
}

struct State {
    t0: Instant,
    timing: Timing,
    gpu: Option<Arc<Gpu>>,
    stream: Option<Stream>,
    start_event: Option<Event>,
    ops: Vec<Pending>,
    pool: Vec<PoolReading>,
    nvtx: bool,
    step: usize,
    /// Why CUPTI was not used, when it was wanted.
    fallback: Option<String>,
    /// The first error a guard met (guards cannot return one).
    error: Option<Error>,
}

thread_local! {
    static ACTIVE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// Whether a profiler records on this thread.
pub fn recording() -> bool {
    ACTIVE.with(|a| a.borrow().is_some())
}

/// Marks one op: keep the guard alive across the op's calls. `info` is only called while a
/// profiler records on this thread.
#[must_use = "the op lasts as long as its guard"]
pub fn op(info: impl FnOnce() -> OpInfo) -> Option<OpGuard> {
    ACTIVE.with(|a| {
        let mut a = a.borrow_mut();
        let s = a.as_mut()?;
        let info = info();
        let index = s.ops.len();
        if s.nvtx {
            cudarc::nvtx::result::range_push(&info.name);
        }
        if s.timing == Timing::Cupti {
            if let Err(e) = cupti::push(index as u64 + 1) {
                s.error.get_or_insert(e);
            }
        }
        let events = match (&s.stream, s.timing) {
            (Some(stream), Timing::Events) => match stream.record_timed() {
                Ok(e) => Some((e, None)),
                Err(e) => {
                    s.error.get_or_insert(e);
                    None
                }
            },
            _ => None,
        };
        s.ops.push(Pending {
            info,
            step: s.step,
            cpu_start: Instant::now(),
            cpu_end: None,
            events,
        });
        Some(OpGuard { index })
    })
}

/// Ops launched from now on, on this thread, belong to step `n` (nothing when no profiler
/// records).
pub fn step(n: usize) {
    ACTIVE.with(|a| {
        if let Some(s) = a.borrow_mut().as_mut() {
            s.step = n;
        }
    });
}

/// Ends its op when dropped.
pub struct OpGuard {
    index: usize,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            let Some(s) = a.as_mut() else { return };
            let now = Instant::now();
            let ts = now.duration_since(s.t0).as_secs_f64() * 1e6;
            let end_event = match (&s.stream, s.timing) {
                (Some(stream), Timing::Events) => match stream.record_timed() {
                    Ok(e) => Some(e),
                    Err(e) => {
                        s.error.get_or_insert(e);
                        None
                    }
                },
                _ => None,
            };
            if s.timing == Timing::Cupti {
                if let Err(e) = cupti::pop() {
                    s.error.get_or_insert(e);
                }
            }
            if s.nvtx {
                cudarc::nvtx::result::range_pop();
            }
            let reading = s.gpu.as_ref().map(|g| g.pool_stats());
            if let Some(p) = s.ops.get_mut(self.index) {
                p.cpu_end = Some(now);
                if let (Some((_, end)), Some(e)) = (p.events.as_mut(), end_event) {
                    *end = Some(e);
                }
            }
            match reading {
                Some(Ok(r)) => s.pool.push(PoolReading {
                    ts_us: ts,
                    used: r.used,
                    reserved: r.reserved,
                }),
                Some(Err(e)) => {
                    s.error.get_or_insert(e);
                }
                None => {}
            }
        });
    }
}

/// Records the ops launched on the calling thread until [`Profiler::finish`].
pub struct Profiler {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Profiler {
    /// Starts recording on this thread for work on `gpu`'s work stream (waits for the stream
    /// first, so the recording starts with the GPU idle).
    pub fn start(gpu: &Arc<Gpu>, discovery: &Discovery, choice: TimingChoice) -> Result<Profiler> {
        if recording() {
            return Err(Error::Invalid(
                "a profiler already records on this thread".into(),
            ));
        }
        gpu.synchronize()?;
        let (timing, fallback) = match choice {
            TimingChoice::Events => (Timing::Events, None),
            TimingChoice::Cupti | TimingChoice::Auto => match cupti::begin(discovery) {
                Ok(()) => (Timing::Cupti, None),
                Err(e) if choice == TimingChoice::Auto => (Timing::Events, Some(e.to_string())),
                Err(e) => return Err(e),
            },
        };
        let stream = gpu.stream().clone();
        let start_event = match timing {
            Timing::Events => Some(stream.record_timed()?),
            _ => None,
        };
        let t0 = Instant::now();
        if timing == Timing::Cupti {
            cupti::mark_start();
        }
        // SAFETY: probes for the library without calling into it.
        let nvtx = discovery.usable(Lib::Nvtx) && unsafe { cudarc::nvtx::sys::is_culib_present() };
        let pool = gpu.pool_stats()?;
        ACTIVE.with(|a| {
            *a.borrow_mut() = Some(State {
                t0,
                timing,
                gpu: Some(gpu.clone()),
                stream: Some(stream),
                start_event,
                ops: Vec::new(),
                pool: vec![PoolReading {
                    ts_us: 0.0,
                    used: pool.used,
                    reserved: pool.reserved,
                }],
                nvtx,
                step: 0,
                fallback,
                error: None,
            })
        });
        Ok(Profiler {
            _not_send: std::marker::PhantomData,
        })
    }

    /// Starts recording host time only (no GPU).
    pub fn host_only() -> Result<Profiler> {
        if recording() {
            return Err(Error::Invalid(
                "a profiler already records on this thread".into(),
            ));
        }
        ACTIVE.with(|a| {
            *a.borrow_mut() = Some(State {
                t0: Instant::now(),
                timing: Timing::Host,
                gpu: None,
                stream: None,
                start_event: None,
                ops: Vec::new(),
                pool: Vec::new(),
                nvtx: false,
                step: 0,
                fallback: None,
                error: None,
            })
        });
        Ok(Profiler {
            _not_send: std::marker::PhantomData,
        })
    }

    /// Waits for the GPU, stops recording and returns what was recorded.
    pub fn finish(self) -> Result<Recording> {
        let state = ACTIVE.with(|a| a.borrow_mut().take());
        let s = state.ok_or_else(|| Error::Invalid("the profiler was not recording".into()))?;
        if let Some(g) = &s.gpu {
            g.synchronize()?;
        }
        let wall_us = s.t0.elapsed().as_secs_f64() * 1e6;
        let (activities, dropped) = if s.timing == Timing::Cupti {
            // this GPU's activities (threads driving other GPUs are recorded too)
            cupti::end(s.gpu.as_ref().map(|g| g.ordinal as u32))?
        } else {
            (Vec::new(), 0)
        };
        if let Some(e) = s.error {
            return Err(e);
        }
        let us = |t: Instant| t.duration_since(s.t0).as_secs_f64() * 1e6;
        let mut ops = Vec::with_capacity(s.ops.len());
        for p in s.ops {
            let gpu = match (&s.start_event, &p.events) {
                (Some(start), Some((a, Some(b)))) => {
                    Some((start.elapsed_ms(a)? * 1e3, start.elapsed_ms(b)? * 1e3))
                }
                _ => None,
            };
            let cpu_end = p.cpu_end.unwrap_or(p.cpu_start);
            ops.push(RecordedOp {
                info: p.info,
                step: p.step,
                cpu_start_us: us(p.cpu_start),
                cpu_end_us: us(cpu_end),
                gpu,
            });
        }
        Ok(Recording {
            timing: s.timing,
            ops,
            activities,
            pool: s.pool,
            nvtx: s.nvtx,
            wall_us,
            dropped,
            fallback: s.fallback,
        })
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        // finish() took the state; a profiler dropped on an error path stops recording here
        let left = ACTIVE.with(|a| a.borrow_mut().take());
        if let Some(s) = left {
            if s.timing == Timing::Cupti {
                let _ = cupti::end(None);
            }
        }
    }
}

/// A kernel's readable name: demangled C++ (`void cutlass::Kernel<...>(...)` loses its
/// `void ` and argument list), or the name as it came.
pub fn kernel_name(raw: &str) -> String {
    let demangled = cpp_demangle::Symbol::new(raw)
        .ok()
        .and_then(|s| s.demangle().ok());
    match demangled {
        Some(d) => {
            let d = d.strip_prefix("void ").unwrap_or(&d);
            // drop the trailing argument list: "name<...>(args)" -> "name<...>"
            match top_level_paren(d) {
                Some(i) => d[..i].to_string(),
                None => d.to_string(),
            }
        }
        None => raw.to_string(),
    }
}

/// Where the first `(` outside template brackets opens (the argument list).
fn top_level_paren(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_recorded_only_while_a_profiler_records() {
        let built = std::cell::Cell::new(0);
        let info = || {
            built.set(built.get() + 1);
            OpInfo {
                name: "relu".into(),
                layer: Some("fc1".into()),
                detail: "1024 f32".into(),
                library: "test".into(),
                flops: 1024.0,
                bytes: 8192.0,
                dtype: "f32".into(),
            }
        };
        assert!(op(info).is_none());
        assert_eq!(
            built.get(),
            0,
            "the description is not built when nobody records"
        );
        let p = Profiler::host_only().unwrap();
        assert!(Profiler::host_only().is_err(), "one profiler a thread");
        {
            let _outer = op(info);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        step(1);
        drop(op(info));
        let r = p.finish().unwrap();
        assert_eq!(built.get(), 2);
        assert_eq!(r.timing, Timing::Host);
        assert_eq!(r.ops.len(), 2);
        assert_eq!((r.ops[0].step, r.ops[1].step), (0, 1));
        let o = &r.ops[0];
        assert!(o.cpu_end_us - o.cpu_start_us >= 2000.0, "{o:?}");
        assert!(r.ops[1].cpu_start_us >= o.cpu_end_us);
        assert!(o.gpu.is_none() && r.activities.is_empty());
        assert!(!recording());
    }

    #[test]
    fn a_dropped_profiler_stops_recording() {
        let p = Profiler::host_only().unwrap();
        assert!(recording());
        drop(p);
        assert!(!recording());
    }

    #[test]
    fn kernel_names_are_demangled_without_arguments() {
        assert_eq!(
            kernel_name("_Z10add_kernelPfPKfi"),
            "add_kernel",
            "a plain mangled function"
        );
        assert_eq!(
            kernel_name("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32"),
            "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32"
        );
        assert_eq!(
            kernel_name("_ZN7cutlass6KernelINS_4gemm6kernel4GemmIiEEEEvNT_6ParamsE"),
            "cutlass::Kernel<cutlass::gemm::kernel::Gemm<int> >"
        );
    }
}
