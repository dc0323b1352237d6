//! CUPTI's activity API: the kernels, copies and memsets the GPU ran, each with the correlation
//! id of the API call that started it, and the external correlation records that tie those
//! calls to gpukit's ops. CUPTI's callbacks are process-wide, so the records gather in one
//! global buffer between [`begin`] and [`end`].

use super::{kernel_name, Activity, ActivityKind};
use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use cudarc::cupti::result::{activity, get_timestamp, CuptiError};
use cudarc::cupti::sys;
use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Bytes of one activity buffer (CUPTI's samples use 8 MiB).
const BUFFER_BYTES: usize = 8 << 20;
const BUFFER_ALIGN: usize = 8;
const EXTERNAL: sys::CUpti_ExternalCorrelationKind =
    sys::CUpti_ExternalCorrelationKind::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

/// Kernels, copies and memsets; the API records (driver and runtime) are what external
/// correlation records are made for (each is preceded by one while an id is pushed), so they
/// are enabled and then skipped.
const KINDS: [sys::CUpti_ActivityKind; 6] = [
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_RUNTIME,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
];

/// A record as parsed in the callback, times in CUPTI's nanoseconds.
struct Raw {
    kind: ActivityKind,
    name: String,
    /// The CUDA device it ran on (CUPTI records every device the process uses).
    device: u32,
    stream: u32,
    start: u64,
    end: u64,
    correlation: u32,
    bytes: u64,
}

#[derive(Default)]
struct Gathered {
    records: Vec<Raw>,
    /// API call correlation id -> gpukit's external id.
    external: HashMap<u32, u64>,
    /// Kernel names already demangled.
    names: HashMap<usize, String>,
}

static GATHERED: Mutex<Option<Gathered>> = Mutex::new(None);
static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
static START_NS: AtomicU64 = AtomicU64::new(0);

fn err(call: &'static str, e: CuptiError) -> Error {
    Error::library("CUPTI", call, e.0)
}

fn lock() -> std::sync::MutexGuard<'static, Option<Gathered>> {
    GATHERED.lock().unwrap_or_else(|p| p.into_inner())
}

unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let Ok(layout) = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) else {
        return;
    };
    // SAFETY: CUPTI passes valid out-pointers; the buffer is freed in buffer_completed, which
    // CUPTI calls for every buffer it was given (a null buffer tells CUPTI to drop records).
    unsafe {
        let p = alloc(layout);
        *buffer = p;
        *size = if p.is_null() { 0 } else { BUFFER_BYTES };
        *max = 0;
    }
}

unsafe extern "C" fn buffer_completed(
    _ctx: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    {
        let mut g = lock();
        let g = g.get_or_insert_with(Gathered::default);
        // SAFETY: `buffer` holds `valid` bytes of activity records written by CUPTI.
        unsafe { parse(buffer, valid, g) };
    }
    if let Ok(layout) = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) {
        // SAFETY: allocated in buffer_requested with this layout.
        unsafe { dealloc(buffer, layout) };
    }
}

/// Reads every record of one completed buffer into `g`.
///
/// # Safety
/// `buffer` must hold `valid` bytes of CUPTI activity records.
unsafe fn parse(buffer: *mut u8, valid: usize, g: &mut Gathered) {
    use sys::CUpti_ActivityKind as K;
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    // SAFETY (whole loop): CUPTI hands out pointers to complete records inside the buffer;
    // fields are read unaligned (the records are packed) and only those every record version
    // from Kernel9 / Memcpy5 / Memset4 on has at the same offsets.
    while unsafe { activity::get_next_record(buffer, valid, &mut record) }.is_ok() {
        let kind = unsafe { std::ptr::addr_of!((*record).kind).read_unaligned() };
        match kind {
            K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL | K::CUPTI_ACTIVITY_KIND_KERNEL => {
                let k = record as *const sys::CUpti_ActivityKernel9;
                let name_ptr = unsafe { std::ptr::addr_of!((*k).name).read_unaligned() };
                let name = g
                    .names
                    .entry(name_ptr as usize)
                    .or_insert_with(|| {
                        if name_ptr.is_null() {
                            "(unnamed kernel)".to_string()
                        } else {
                            let raw = unsafe { std::ffi::CStr::from_ptr(name_ptr) };
                            kernel_name(&raw.to_string_lossy())
                        }
                    })
                    .clone();
                g.records.push(Raw {
                    kind: ActivityKind::Kernel,
                    name,
                    device: unsafe { std::ptr::addr_of!((*k).deviceId).read_unaligned() },
                    stream: unsafe { std::ptr::addr_of!((*k).streamId).read_unaligned() },
                    start: unsafe { std::ptr::addr_of!((*k).start).read_unaligned() },
                    end: unsafe { std::ptr::addr_of!((*k).end).read_unaligned() },
                    correlation: unsafe { std::ptr::addr_of!((*k).correlationId).read_unaligned() },
                    bytes: 0,
                });
            }
            K::CUPTI_ACTIVITY_KIND_MEMCPY => {
                let m = record as *const sys::CUpti_ActivityMemcpy5;
                let copy = unsafe { std::ptr::addr_of!((*m).copyKind).read_unaligned() };
                g.records.push(Raw {
                    kind: ActivityKind::Memcpy,
                    name: format!("memcpy {}", copy_kind(copy)),
                    device: unsafe { std::ptr::addr_of!((*m).deviceId).read_unaligned() },
                    stream: unsafe { std::ptr::addr_of!((*m).streamId).read_unaligned() },
                    start: unsafe { std::ptr::addr_of!((*m).start).read_unaligned() },
                    end: unsafe { std::ptr::addr_of!((*m).end).read_unaligned() },
                    correlation: unsafe { std::ptr::addr_of!((*m).correlationId).read_unaligned() },
                    bytes: unsafe { std::ptr::addr_of!((*m).bytes).read_unaligned() },
                });
            }
            K::CUPTI_ACTIVITY_KIND_MEMSET => {
                let m = record as *const sys::CUpti_ActivityMemset4;
                g.records.push(Raw {
                    kind: ActivityKind::Memset,
                    name: "memset".into(),
                    device: unsafe { std::ptr::addr_of!((*m).deviceId).read_unaligned() },
                    stream: unsafe { std::ptr::addr_of!((*m).streamId).read_unaligned() },
                    start: unsafe { std::ptr::addr_of!((*m).start).read_unaligned() },
                    end: unsafe { std::ptr::addr_of!((*m).end).read_unaligned() },
                    correlation: unsafe { std::ptr::addr_of!((*m).correlationId).read_unaligned() },
                    bytes: unsafe { std::ptr::addr_of!((*m).bytes).read_unaligned() },
                });
            }
            K::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => {
                let e = record as *const sys::CUpti_ActivityExternalCorrelation;
                let ext_kind = unsafe { std::ptr::addr_of!((*e).externalKind).read_unaligned() };
                if ext_kind == EXTERNAL {
                    let corr = unsafe { std::ptr::addr_of!((*e).correlationId).read_unaligned() };
                    let id = unsafe { std::ptr::addr_of!((*e).externalId).read_unaligned() };
                    g.external.insert(corr, id);
                }
            }
            _ => {}
        }
    }
}

fn copy_kind(k: u8) -> &'static str {
    match k {
        1 => "HtoD",
        2 => "DtoH",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        _ => "other",
    }
}

/// Starts gathering: CUPTI must be found; the callbacks are registered once a process.
pub(super) fn begin(discovery: &Discovery) -> Result<()> {
    // SAFETY: probes for the library without calling into it.
    if !discovery.usable(Lib::Cupti) || !unsafe { sys::is_culib_present() } {
        return Err(Error::MissingLibrary(discovery.missing_message(Lib::Cupti)));
    }
    REGISTERED
        .get_or_init(|| {
            activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
                .map_err(|e| err("cuptiActivityRegisterCallbacks", e).to_string())
        })
        .clone()
        .map_err(Error::Invalid)?;
    *lock() = Some(Gathered::default());
    for k in KINDS {
        activity::enable(k).map_err(|e| err("cuptiActivityEnable", e))?;
    }
    Ok(())
}

/// The recording's zero on CUPTI's clock: now.
pub(super) fn mark_start() {
    let mut ts = 0u64;
    // SAFETY: `ts` is a live u64.
    if unsafe { get_timestamp(&mut ts) }.is_ok() {
        START_NS.store(ts, Ordering::SeqCst);
    }
}

pub(super) fn push(id: u64) -> Result<()> {
    activity::push_external_correlation_id(EXTERNAL, id)
        .map_err(|e| err("cuptiActivityPushExternalCorrelationId", e))
}

pub(super) fn pop() -> Result<()> {
    let mut last = 0u64;
    // SAFETY: `last` is a live u64.
    unsafe { activity::pop_external_correlation_id(EXTERNAL, &mut last) }
        .map_err(|e| err("cuptiActivityPopExternalCorrelationId", e))
}

/// Flushes CUPTI's buffers, stops gathering and returns the activities (with the op each
/// belongs to) on `device` (every device when None) and how many records CUPTI dropped.
pub(super) fn end(device: Option<u32>) -> Result<(Vec<Activity>, u64)> {
    let forced = sys::CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED as u32;
    let flushed = activity::flush_all(forced).map_err(|e| err("cuptiActivityFlushAll", e));
    for k in KINDS {
        let _ = activity::disable(k);
    }
    flushed?;
    let mut dropped = 0usize;
    // SAFETY: a null context and stream 0 ask for the records dropped anywhere.
    let _ = unsafe { activity::get_num_dropped_records(std::ptr::null_mut(), 0, &mut dropped) };
    let g = lock().take().unwrap_or_default();
    let t0 = START_NS.load(Ordering::SeqCst);
    let us = |ns: u64| (ns as f64 - t0 as f64) / 1e3;
    let mut acts: Vec<Activity> = g
        .records
        .into_iter()
        .filter(|r| device.is_none_or(|d| d == r.device))
        .map(|r| Activity {
            kind: r.kind,
            op: g
                .external
                .get(&r.correlation)
                .and_then(|&id| usize::try_from(id).ok())
                .and_then(|id| id.checked_sub(1)),
            name: r.name,
            stream: r.stream,
            start_us: us(r.start),
            end_us: us(r.end),
            bytes: r.bytes,
        })
        .collect();
    acts.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    Ok((acts, dropped as u64))
}
