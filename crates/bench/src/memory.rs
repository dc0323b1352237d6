//! `gpukit memory`: where GPU memory goes for ResNet inference at several batch sizes, measured
//! from the driver's memory pool (every gpukit allocation comes from it) and from NVML, beside
//! the engine's own plan; the CUDA context's cost, which no allocator sees; a memory limit;
//! out-of-memory as an explanation, with `--on-oom halve` and `--find-max-batch`.

use crate::error::{Error, Result};
use crate::figures::*;
use crate::gpu::{device_used, process_used};
use crate::measure::{time_device, Plan};
use crate::part::{row_statuses, Context, Outcome, Part};
use crate::random::{fresh_seed, uniform_f32};
use crate::report::{judge_rows, Document, RowStatus};
use gpukit_cuda::driver::{device_attributes, probe};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::NvmlSession;
use gpukit_cuda::{Gpu, PoolStats};
use gpukit_models::forward::fold;
use gpukit_models::gpu::kernels::BLAS_ROWS;
use gpukit_models::gpu::{arena_bytes, GpuContext, GpuWeights, NetShape, Session};
use gpukit_models::weights::{load_safetensors, seeded_init};
use gpukit_models::Error as EngineError;
use gpukit_models::ResNet;
use gpukit_tensor::{DType, Layout, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct MemoryOptions {
    pub model: ResNet,
    pub batch_sizes: Vec<usize>,
    pub dtype: DType,
    /// NHWC activations (the tensor-core layout) or NCHW.
    pub layout: Layout,
    pub image_size: usize,
    pub weights: Option<PathBuf>,
    pub ordinal: usize,
    /// Fraction of the device's memory gpukit may use, (0, 1].
    pub memory_fraction: Option<f64>,
    pub on_oom_halve: bool,
    pub find_max_batch: bool,
    /// Most workspace a chosen cuDNN algorithm may use (None: the search's full 256 MiB).
    pub max_workspace_bytes: Option<usize>,
}

/// What the CUDA context and the libraries cost before any tensor exists.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContextCost {
    /// NVML's device-wide used memory before gpukit started CUDA, and after it opened the
    /// context, cuDNN, its kernels and (where a batch's classifier runs on it) cuBLAS.
    pub device_used_before: Option<u64>,
    pub device_used_after: Option<u64>,
    /// What NVML charges this process after opening.
    pub process_used: Option<u64>,
    /// Of that, the pool: the libraries' workspaces (cuDNN's and cuBLAS's) gpukit allocated.
    pub pool_used: u64,
    /// The rest: the context itself, loaded kernels (cuDNN, cuBLAS, gpukit's), driver state.
    /// No allocator counts it (PyTorch's `memory_allocated` shows 0 here).
    pub context_and_code: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryRow {
    /// The batch size asked for, and the one that ran (smaller after `--on-oom halve`).
    pub batch_requested: usize,
    pub batch: usize,
    pub status: RowStatus,
    pub note: Option<String>,
    pub weights_bytes: u64,
    pub input_bytes: u64,
    /// The activation arena the plan laid out (input and logits included).
    pub arena_bytes: u64,
    /// The same activations without the plan (every tensor its own bytes).
    pub arena_without_plan_bytes: u64,
    /// Most workspace any chosen convolution algorithm uses.
    pub conv_workspace_bytes: u64,
    /// The pool's peak while running this batch (eager pass and CUDA graph replays; what was
    /// really allocated: weights, activations, workspaces), planning excluded.
    pub pool_used_peak: u64,
    pub pool_reserved_peak: u64,
    /// The pool's peak while planning (cuDNN's algorithm search borrows a 256 MiB workspace
    /// and the in-place check an output-sized buffer; both are given back before running).
    #[serde(default)]
    pub planning_used_peak: u64,
    /// Whether blocks write their output over their shortcut (checked at planning).
    #[serde(default)]
    pub in_place: bool,
    /// NVML's figure for this process at the batch's peak (context and code included).
    pub process_used: Option<u64>,
    /// After the session was dropped and the cache emptied: must equal the baseline.
    pub pool_reserved_after: u64,
    pub leak_bytes: i64,
    pub ms_per_batch: Option<f64>,
    pub images_per_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MaxBatch {
    pub batch: usize,
    /// The smallest batch that did not fit (None: the search stopped at its cap).
    pub first_failure: Option<usize>,
    pub attempts: usize,
    pub seconds: f64,
    /// Pool reserved bytes after the search (must equal the baseline).
    pub pool_reserved_after: u64,
    /// Whether the pool was back at its baseline after the search (nothing leaked).
    pub back_to_baseline: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryReport {
    pub model: String,
    pub precision: String,
    pub layout: String,
    pub device: String,
    pub total_bytes: u64,
    pub limit_bytes: Option<u64>,
    /// The cap on each chosen algorithm's cuDNN workspace (None: 256 MiB, the fastest).
    #[serde(default)]
    pub max_workspace_bytes: Option<u64>,
    pub context: ContextCost,
    /// Pool used/reserved after weights and library workspaces, before any batch.
    pub baseline_used: u64,
    pub baseline_reserved: u64,
    pub rows: Vec<MemoryRow>,
    pub max_batch: Option<MaxBatch>,
    /// Pinned against pageable host memory: what allocating costs, what copying gains.
    #[serde(default)]
    pub pinned: Option<PinnedHost>,
}

/// Host memory for uploads, pinned (page-locked) against pageable, `bytes` of each: allocation
/// (and first touch), host->device copy speed (median of 5, the copy checked byte-exact), and
/// freeing the pinned buffer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PinnedHost {
    pub bytes: u64,
    pub pageable_alloc_ms: f64,
    pub pinned_alloc_ms: f64,
    pub pinned_free_ms: f64,
    pub pageable_h2d_gb_s: f64,
    pub pinned_h2d_gb_s: f64,
}

/// The JSON document of `gpukit memory`, with the verdict: a failed batch, nothing measured, or
/// memory that did not come back after the largest-batch search.
pub fn document(report: MemoryReport) -> Document<MemoryReport> {
    let leak = report
        .max_batch
        .as_ref()
        .filter(|m| !m.back_to_baseline)
        .map(|_| {
            "memory leaked during --find-max-batch: the pool did not return to its baseline"
                .to_string()
        });
    let failure = leak.or_else(|| judge_rows(report.rows.iter().map(|r| &r.status)));
    Document::new("memory", report, failure)
}

/// Runs the measurement; per-batch problems become rows, not errors.
pub fn run_memory(
    discovery: &Discovery,
    opts: &MemoryOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<MemoryReport> {
    if let Some(f) = opts.memory_fraction {
        if !(f > 0.0 && f <= 1.0) {
            return Err(Error::BadInput(format!(
                "--memory-fraction {f} must be above 0 and at most 1"
            )));
        }
    }
    let dict = match &opts.weights {
        Some(p) => load_safetensors(p, opts.model, None)?,
        None => seeded_init(opts.model, 1000, 0, true),
    };
    let folded = fold(&dict)?;
    let driver = probe(discovery)
        .map_err(|e| Error::Unavailable(format!("gpukit memory needs a GPU: {e}")))?;
    let attrs = device_attributes(opts.ordinal, driver.device_count)?;
    let nvml = NvmlSession::open(discovery).ok();
    let before = device_used(nvml.as_ref(), &attrs.uuid);
    // the classifier of a batch of BLAS_ROWS or more runs on cuBLAS: opened with the context,
    // so its workspace counts there (a session opening it later would read as a leak)
    let blas = opts.find_max_batch || opts.batch_sizes.iter().any(|&n| n >= BLAS_ROWS);
    progress(if blas {
        "memory: opening the GPU (context, cuDNN, cuBLAS, kernels)"
    } else {
        "memory: opening the GPU (context, cuDNN, kernels)"
    });
    let mut ctx = GpuContext::open(discovery, opts.ordinal)?;
    if blas {
        // where cuBLAS is missing or does not open, the classifier runs on gpukit's kernel
        let _ = ctx.blas.get();
    }
    ctx.gpu.synchronize()?;
    let pool0 = ctx.gpu.pool_stats()?;
    let after = device_used(nvml.as_ref(), &attrs.uuid);
    let proc_used = process_used(nvml.as_ref(), &attrs.uuid);
    let context = ContextCost {
        device_used_before: before,
        device_used_after: after,
        process_used: proc_used,
        pool_used: pool0.used,
        context_and_code: proc_used.map(|p| p.saturating_sub(pool0.reserved)),
    };
    let total = attrs.total_memory_bytes;
    ctx.limit = opts.memory_fraction.map(|f| (total as f64 * f) as u64);
    if let Some(bytes) = opts.max_workspace_bytes {
        ctx.dnn.set_workspace_limit(bytes);
    }

    let mut report = MemoryReport {
        model: opts.model.name().to_string(),
        precision: opts.dtype.precision_name().to_string(),
        layout: opts.layout.name().to_ascii_uppercase(),
        device: format!("cuda:{} {}", opts.ordinal, attrs.name),
        total_bytes: total,
        limit_bytes: ctx.limit,
        max_workspace_bytes: opts.max_workspace_bytes.map(|b| b as u64),
        context,
        baseline_used: 0,
        baseline_reserved: 0,
        rows: Vec::new(),
        max_batch: None,
        pinned: None,
    };
    progress("memory: uploading the weights");
    let weights = match GpuWeights::upload(&ctx, &folded, opts.dtype, opts.layout) {
        Ok(w) => w,
        Err(e) => {
            // even the weights do not fit (a tiny --memory-fraction): one row says so
            report.rows.push(failed_row(0, 0, &e));
            return Ok(report);
        }
    };
    ctx.gpu.empty_cache()?; // the pool keeps what earlier work freed: trim it for a baseline
    let base = ctx.gpu.pool_stats()?;
    report.baseline_used = base.used;
    report.baseline_reserved = base.reserved;
    let s = opts.image_size;
    for &asked in &opts.batch_sizes {
        let mut n = asked;
        let mut notes = Vec::new();
        loop {
            progress(&format!("memory: batch {n}"));
            match measure(&ctx, &weights, n, s, &attrs.uuid, nvml.as_ref(), &base) {
                Ok(mut row) => {
                    row.batch_requested = asked;
                    if !notes.is_empty() {
                        row.note = Some(notes.join("; "));
                    }
                    report.rows.push(row);
                    break;
                }
                Err(e) if e.is_out_of_memory() && opts.on_oom_halve && n > 1 => {
                    notes.push(format!("batch {n} did not fit ({e}); halved to {}", n / 2));
                    n /= 2;
                    ctx.gpu.empty_cache()?;
                }
                Err(e) => {
                    let mut row = failed_row(asked, n, &e);
                    if !notes.is_empty() {
                        row.note = Some(notes.join("; "));
                    }
                    row.pool_reserved_after = {
                        ctx.gpu.empty_cache()?;
                        ctx.gpu.pool_stats()?.reserved
                    };
                    report.rows.push(row);
                    break;
                }
            }
        }
    }
    if opts.find_max_batch {
        progress("memory: searching the largest batch that fits");
        report.max_batch = Some(find_max_batch(&ctx, &weights, s, &base)?);
    }
    progress("memory: pinned against pageable host memory");
    report.pinned = Some(pinned_host(&ctx.gpu, 256 << 20)?);
    ctx.gpu.empty_cache()?;
    Ok(report)
}

/// Measures [`PinnedHost`] with buffers of `bytes`.
fn pinned_host(gpu: &Gpu, bytes: usize) -> Result<PinnedHost> {
    use gpukit_cuda::transfer::{copy_h2d, PinnedBytes};
    use std::time::Instant;
    let pattern = |buf: &mut [u8]| {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i.wrapping_mul(31) >> 3) as u8;
        }
    };
    let t = Instant::now();
    let mut pageable = vec![0u8; bytes];
    pattern(&mut pageable);
    let pageable_alloc_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let mut pinned = PinnedBytes::new(gpu, bytes, false)?;
    pattern(pinned.as_mut_slice());
    let pinned_alloc_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut dev = gpu.alloc(bytes)?;
    let mut speed = |src: &[u8]| -> Result<f64> {
        let mut times = Vec::new();
        for _ in 0..5 {
            gpu.synchronize()?;
            let t = Instant::now();
            copy_h2d(gpu.stream(), src, &mut dev)?;
            gpu.synchronize()?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        if gpu.download(&dev)? != src {
            return Err(Error::Failed(
                "a host->device copy did not arrive byte-exact".into(),
            ));
        }
        Ok(bytes as f64 / times[2] / 1e9)
    };
    let pageable_h2d_gb_s = speed(&pageable)?;
    let pinned_h2d_gb_s = speed(pinned.as_slice())?;
    drop(dev);
    let t = Instant::now();
    drop(pinned);
    let pinned_free_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(PinnedHost {
        bytes: bytes as u64,
        pageable_alloc_ms,
        pinned_alloc_ms,
        pinned_free_ms,
        pageable_h2d_gb_s,
        pinned_h2d_gb_s,
    })
}

fn failed_row(asked: usize, n: usize, e: &dyn std::fmt::Display) -> MemoryRow {
    MemoryRow {
        batch_requested: asked,
        batch: n,
        status: RowStatus::Failed(e.to_string()),
        note: None,
        weights_bytes: 0,
        input_bytes: 0,
        arena_bytes: 0,
        arena_without_plan_bytes: 0,
        conv_workspace_bytes: 0,
        pool_used_peak: 0,
        pool_reserved_peak: 0,
        planning_used_peak: 0,
        in_place: false,
        process_used: None,
        pool_reserved_after: 0,
        leak_bytes: 0,
        ms_per_batch: None,
        images_per_s: None,
    }
}

/// Prepares one batch size, runs it (checked: finite logits), times it as a CUDA graph, then
/// frees everything and checks that the pool is back at the baseline.
fn measure(
    ctx: &GpuContext,
    weights: &GpuWeights,
    n: usize,
    s: usize,
    uuid: &str,
    nvml: Option<&NvmlSession>,
    base: &PoolStats,
) -> Result<MemoryRow> {
    ctx.gpu.reset_pool_peaks()?;
    let x = Tensor::from_f32(&[n, 3, s, s], uniform_f32(n * 3 * s * s, fresh_seed()))?;
    let (memory, ms, proc_used, planning, note) = {
        let mut session = Session::new(ctx, weights, n, s, s, true)?;
        ctx.gpu.synchronize()?;
        let planning = ctx.gpu.pool_stats()?.used_high;
        ctx.gpu.reset_pool_peaks()?;
        let logits = session.run(&x)?;
        if logits.f32_values()?.iter().any(|v| !v.is_finite()) {
            return Err(Error::Failed(format!(
                "batch {n}: the logits are not finite"
            )));
        }
        session.capture()?;
        let t = time_device(ctx.gpu.stream(), Plan::new(2, 10), || session.replay())?;
        ctx.gpu.synchronize()?;
        (
            session.memory,
            t.summary_ms.median,
            process_used(nvml, uuid),
            planning,
            session.in_place_note.clone(),
        )
    };
    let peak = ctx.gpu.pool_stats()?;
    ctx.gpu.empty_cache()?;
    let after = ctx.gpu.pool_stats()?;
    Ok(MemoryRow {
        batch_requested: n,
        batch: n,
        status: if after.reserved == base.reserved && after.used == base.used {
            RowStatus::Ok
        } else {
            RowStatus::Failed(format!(
                "memory leaked: the pool holds {} bytes used / {} reserved after the batch, {} / {} before",
                after.used, after.reserved, base.used, base.reserved
            ))
        },
        note,
        weights_bytes: memory.weights_bytes as u64,
        input_bytes: memory.input_bytes as u64,
        arena_bytes: memory.arena_bytes as u64,
        arena_without_plan_bytes: memory.arena_bytes_without_plan as u64,
        conv_workspace_bytes: memory.conv_workspace_bytes as u64,
        pool_used_peak: peak.used_high,
        pool_reserved_peak: peak.reserved_high,
        planning_used_peak: planning,
        in_place: memory.in_place,
        process_used: proc_used,
        pool_reserved_after: after.reserved,
        leak_bytes: after.reserved as i64 - base.reserved as i64,
        ms_per_batch: Some(ms),
        images_per_s: Some(n as f64 / (ms / 1e3)),
    })
}

/// Whether a batch's activation arena fits next to what is already allocated (allocated and
/// freed at once).
fn fits(ctx: &GpuContext, net: &NetShape, n: usize, s: usize) -> Result<bool, EngineError> {
    let bytes = arena_bytes(net, n, s, s, true)?;
    match ctx.try_alloc(bytes, "the activation arena") {
        Ok(()) => Ok(true),
        Err(e) if e.is_out_of_memory() => Ok(false),
        Err(e) => Err(e),
    }
}

/// The largest batch whose activation arena fits next to what is allocated, asked of the
/// allocator as few times as it can ([`search_from`]): from the largest batch whose arena (known
/// on paper for every batch) is under the free memory, which the allocator's granularity and
/// other processes may move a little. Every failure is recovered (the pool is emptied).
fn find_max_batch(
    ctx: &GpuContext,
    weights: &GpuWeights,
    s: usize,
    base: &PoolStats,
) -> Result<MaxBatch> {
    const CAP: usize = 1 << 20;
    let start = std::time::Instant::now();
    let (free, _) = ctx.gpu.mem_info()?;
    // the same search on paper (no allocation: the arena's size against the free memory)
    let (on_paper, _, _) = search_from(1, CAP, |n| {
        Ok(arena_bytes(&weights.shape, n, s, s, true)? as u64 <= free)
    })?;
    let (ok, bad, attempts) = search_from(on_paper, CAP, |n| {
        let fit = fits(ctx, &weights.shape, n, s)?;
        ctx.gpu.empty_cache()?;
        Ok(fit)
    })?;
    // cuDNN's and cuBLAS's workspaces are allocated when the GPU is opened (they are in the
    // baseline), so a batch whose arena fits next to them runs: no pass is needed to know
    let after = ctx.gpu.pool_stats()?;
    Ok(MaxBatch {
        batch: ok,
        first_failure: bad,
        attempts,
        seconds: start.elapsed().as_secs_f64(),
        pool_reserved_after: after.reserved,
        back_to_baseline: after.reserved == base.reserved && after.used == base.used,
    })
}

/// The largest `n` in 1..=`cap` that `fits` (true up to some `n`, false after; 0 when 1 does
/// not fit), the first that does not (None: all up to `cap` fit) and how many questions it
/// took: `guess` first, then steps away from it that double until the answer turns, then
/// bisection. A right guess costs 2 questions, one k off about 2 log2(k) + 2 (doubling from 1
/// cost 28 at a batch of 14,451).
fn search_from(
    guess: usize,
    cap: usize,
    mut fits: impl FnMut(usize) -> Result<bool>,
) -> Result<(usize, Option<usize>, usize)> {
    let mut asked = 0;
    let mut ask = |n: usize| {
        asked += 1;
        fits(n)
    };
    let g = guess.clamp(1, cap.max(1));
    // lo fits (0: nothing known to fit), hi does not (None: nothing known not to)
    let (mut lo, mut hi) = if ask(g)? { (g, None) } else { (0, Some(g)) };
    let mut step = 1;
    if hi.is_none() {
        while hi.is_none() && lo < cap {
            let n = (lo + step).min(cap);
            if ask(n)? {
                lo = n;
            } else {
                hi = Some(n);
            }
            step *= 2;
        }
    } else {
        let mut top = g;
        while lo == 0 && top > 1 {
            let n = top.saturating_sub(step).max(1);
            if ask(n)? {
                lo = n;
            } else {
                top = n;
            }
            step *= 2;
        }
        hi = Some(top);
    }
    if let Some(mut h) = hi {
        while h - lo > 1 {
            let mid = lo + (h - lo) / 2;
            if ask(mid)? {
                lo = mid;
            } else {
                h = mid;
            }
        }
        hi = Some(h);
    }
    Ok((lo, hi, asked))
}

/// `gpukit memory` under `gpukit all`, where there is a GPU: ResNet-50 fp32 at a few batch
/// sizes (under `--quick` 1 and 32, as infer's rows), and the largest batch that fits unless
/// `--quick`.
pub struct MemoryPart;

/// The memory part of `gpukit all`.
pub static PART: MemoryPart = MemoryPart;

impl Part for MemoryPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        memory_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "memory"
    }
    fn command(&self) -> &'static str {
        "memory"
    }
    fn title(&self) -> &'static str {
        "GPU memory"
    }
    fn wanted(&self, ctx: &Context<'_>) -> bool {
        ctx.gpu
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let o = MemoryOptions {
            model: ResNet::R50,
            // the batches infer's fp32 rows planned just before (their choices are cached:
            // memory is measured without planning again), and in the full run 128 beyond them
            // (batches 16 and 64, planned for memory alone, were 3 s of a cold `all`)
            batch_sizes: if ctx.quick {
                vec![1, 32]
            } else {
                vec![1, 8, 32, 128]
            },
            dtype: DType::F32,
            layout: Layout::Nchw,
            image_size: 224,
            weights: None,
            ordinal: ctx.ordinal(),
            memory_fraction: None,
            on_oom_halve: true,
            find_max_batch: !ctx.quick,
            max_workspace_bytes: None,
        };
        Ok(Outcome::of(
            "memory",
            run_memory(ctx.discovery, &o, progress),
        ))
    }
    fn statuses(&self, report: &serde_json::Value) -> Vec<RowStatus> {
        row_statuses(report)
    }
}

// `gpukit compare`'s figures of this command's section.
/// `memory`: per model, precision, layout, image size, device and workspace cap, and per
/// batch, the pool's peak (bytes, exact) and the time per batch (ms); the largest batch that
/// fits (exact; under the memory limit when one was set), when it was searched for.
fn memory_figures(section: &Value, out: &mut Vec<Figure>) {
    let bytes = Spec {
        section: "memory",
        unit: "bytes",
        better: Better::Lower,
        timed: false,
        exact: true,
    };
    let ms = Spec {
        unit: "ms",
        exact: false,
        ..bytes
    };
    let mut setup = model_and_size(section, memory_image_size(section));
    for field in ["precision", "layout"] {
        if let Some(v) = text(section, field) {
            setup.push_str(&format!("{v} "));
        }
    }
    if let Some(dev) = device(section) {
        setup.push_str(&format!("{dev} "));
    }
    if let Some(cap) = section.get("max_workspace_bytes").and_then(Value::as_u64) {
        setup.push_str(&format!("workspace cap {} ", bytes_name(cap)));
    }
    for row in rows(section) {
        let Some(batch) = text(row, "batch") else {
            continue;
        };
        out.extend(row_figure(
            &bytes,
            format!("{setup}batch {batch} pool peak"),
            row,
            "pool_used_peak",
        ));
        out.extend(row_figure(
            &ms,
            format!("{setup}batch {batch} per batch"),
            row,
            "ms_per_batch",
        ));
    }
    let largest = Spec {
        section: "memory",
        unit: "images",
        better: Better::Higher,
        timed: false,
        exact: true,
    };
    let limit = section
        .get("limit_bytes")
        .and_then(Value::as_u64)
        .map(|b| format!(" under {}", bytes_name(b)))
        .unwrap_or_default();
    let max = section.get("max_batch").and_then(|m| m.get("batch"));
    out.extend(plain_figure(
        &largest,
        format!("{setup}largest batch{limit}"),
        max,
    ));
}

/// The image size of a memory report, which names none: its input batch is NCHW f32 whatever
/// the precision (3 channels of 4 bytes a pixel), so a row's input bytes give the square's side.
fn memory_image_size(section: &Value) -> Option<String> {
    rows(section).iter().find_map(|row| {
        let batch = row.get("batch").and_then(Value::as_u64)?;
        let input = row.get("input_bytes").and_then(Value::as_u64)?;
        let per_image = input.checked_div(batch * 12)?;
        if per_image * batch * 12 != input {
            return None;
        }
        // a side of at most a few thousand pixels: the float root is exact here
        let side = (per_image as f64).sqrt().round() as u64;
        (side * side == per_image).then(|| side.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::search_from;

    #[test]
    fn the_search_from_a_guess_finds_the_largest_that_fits() {
        let cap = 1 << 20;
        for limit in [0usize, 1, 2, 7, 14_451, cap - 1, cap] {
            for guess in [
                0usize,
                1,
                2,
                limit.saturating_sub(9),
                limit,
                limit + 1,
                limit + 9,
                3 * limit + 5,
                cap,
            ] {
                let (got, first_bad, asked) = search_from(guess, cap, |n| {
                    assert!((1..=cap).contains(&n), "asked about {n}");
                    Ok(n <= limit)
                })
                .unwrap();
                let what = format!("limit {limit} guess {guess}");
                assert_eq!(got, limit, "{what}");
                assert_eq!(first_bad, (limit < cap).then_some(limit + 1), "{what}");
                assert!(asked <= 44, "{what}: {asked} questions");
                if guess == limit && limit >= 1 && limit < cap {
                    assert_eq!(asked, 2, "{what}: a right guess");
                }
            }
        }
    }
}
