//! `gpukit profile infer|train`: run a short, warmed-up window of a workload with the profiler
//! recording, time the same work without it, and assemble the report (table, idle gaps,
//! overhead, trace).

use super::gaps::{idle, Idle};
use super::records::{attribute_graph, records, Records};
use super::table::{key_averages, GroupBy, Roofline, Row};
use super::trace::{chrome_trace, validate, PoolSample};
use super::{KernelRecord, OpRecord, Span};
use crate::accuracy::{agreement, tolerance, verdict};
use crate::ceilings::datasheet_peaks;
use crate::error::{Error, Result};
use crate::stats::Summary;
use crate::workload::strategy::InferStrategy;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::profiler::{self, Profiler, Recording, Timing, TimingChoice};
use gpukit_models::forward::fold;
use gpukit_models::gpu::{GpuContext, GpuWeights, Session};
use gpukit_models::weights::{load_safetensors, seeded_init};
use gpukit_models::ResNet;
use gpukit_tensor::{Device, Tensor};
use gpukit_types::resources::{bytes, Need};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How to profile, whatever the workload.
#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// Steps (forward passes, or training steps) recorded.
    pub steps: usize,
    /// Rows of the table shown (the JSON has every row).
    pub top: usize,
    pub group_by: GroupBy,
    /// Chrome trace file to write.
    pub trace: Option<PathBuf>,
    pub timing: TimingChoice,
}

/// `gpukit profile infer`'s workload.
#[derive(Debug, Clone)]
pub struct InferWorkload {
    pub model: ResNet,
    pub batch: usize,
    pub image_size: usize,
    pub weights: Option<PathBuf>,
    /// `cpu` or a GPU strategy; None: fp16-nhwc on a GPU, else cpu.
    pub strategy: Option<InferStrategy>,
    /// None: cuda:0 when a GPU is usable, else the CPU.
    pub device: Option<Device>,
}

/// Idle time of the work stream between kernels, per step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepIdle {
    pub idle_us_per_step: f64,
    pub gaps_per_step: f64,
    pub largest_gap_us: f64,
    pub busy_fraction: f64,
}

impl StepIdle {
    fn of(i: Idle, steps: usize) -> StepIdle {
        let s = steps.max(1) as f64;
        StepIdle {
            idle_us_per_step: i.total_us / s,
            gaps_per_step: i.gaps as f64 / s,
            largest_gap_us: i.largest_us,
            busy_fraction: i.busy_fraction,
        }
    }
}

/// The report of `gpukit profile`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileReport {
    /// `infer resnet50 fp16-nhwc-graph batch 32`, `train ...`.
    pub workload: String,
    pub device: String,
    pub timing: Timing,
    /// How the times were taken, in words.
    pub timing_note: String,
    /// Why CUPTI was not used, when it was wanted.
    pub fallback: Option<String>,
    /// Whether NVTX ranges named the ops (Nsight Systems shows them).
    pub nvtx: bool,
    pub steps: usize,
    /// The step's time without the profiler (device time from events; host time on the CPU).
    pub step_ms: Option<Summary>,
    /// The step's time while profiled (median over the recorded steps).
    pub profiled_step_ms: Option<f64>,
    /// How much longer a profiled step took, in percent.
    pub overhead_pct: Option<f64>,
    /// The recorded GPU time (kernels', or the ops' event spans) per step, in ms.
    pub recorded_ms_per_step: f64,
    /// recorded_ms_per_step over the step time without the profiler.
    pub coverage: Option<f64>,
    pub kernels: usize,
    /// Kernels no op claims.
    pub unattributed_kernels: usize,
    /// Ops (kernels, under CUPTI) without a layer name.
    pub without_layer: usize,
    /// How a graph replay's kernels were tied to ops (graph strategies).
    pub attribution: Option<String>,
    /// The work stream's idle time between kernels (CUPTI only).
    pub idle: Option<StepIdle>,
    /// For a graph strategy: the same pass launched op by op, for the gaps the graph removes.
    pub eager_idle: Option<StepIdle>,
    pub group_by: GroupBy,
    pub top: usize,
    /// Every row, largest first (tables show `top`).
    pub rows: Vec<Row>,
    /// Times are host times (no GPU).
    pub host_only: bool,
    pub trace: Option<PathBuf>,
    /// Activity records CUPTI dropped (0 when every kernel was seen).
    pub dropped: u64,
    /// What the workload's output was checked against.
    pub verified: String,
}

/// Refuses bad options before any work: `--top 0`, `--steps 0`, a trace path that cannot be
/// written.
pub fn check_options(o: &ProfileOptions) -> Result<()> {
    if o.top == 0 {
        return Err(Error::BadInput(
            "--top 0 shows nothing: give at least 1".into(),
        ));
    }
    if o.steps == 0 {
        return Err(Error::BadInput("--steps must be at least 1".into()));
    }
    if let Some(t) = &o.trace {
        gpukit_types::files::check_writable_file(t).map_err(|e| {
            Error::BadInput(format!(
                "--trace {}: cannot write there ({})",
                t.display(),
                e
            ))
        })?;
    }
    Ok(())
}

/// A profile of CPU work has host clocks only: grouping by kernel or asking for CUPTI or
/// CUDA-event timing would give an empty or invented table, so it is bad input.
fn check_host_profile(o: &ProfileOptions) -> Result<()> {
    if o.group_by == GroupBy::Kernel {
        return Err(Error::BadInput(
            "--group-by kernel: CPU work runs no GPU kernels (use op or layer, or profile a GPU \
             with --device cuda:0)"
                .into(),
        ));
    }
    if o.timing != TimingChoice::Auto {
        return Err(Error::BadInput(format!(
            "--timing {}: CPU work is timed by the host clock (leave --timing out, or profile a \
             GPU with --device cuda:0)",
            match o.timing {
                TimingChoice::Cupti => "cupti",
                _ => "events",
            }
        )));
    }
    Ok(())
}

fn roofline(device_name: &str) -> impl Fn(&str) -> Option<Roofline> {
    let peaks = datasheet_peaks(device_name);
    move |dtype: &str| {
        let p = peaks.as_ref()?;
        Some(Roofline {
            tflops: p.for_dtype(dtype)?,
            memory_gbs: p.memory_gbs?,
        })
    }
}

/// Per step, the span of its recorded GPU work: from its first start to the next step's first
/// start (the last step to its last end).
fn step_spans(rec: &Records, host_only: bool) -> Vec<f64> {
    let steps = rec.steps.iter().copied().max().map_or(0, |m| m + 1);
    let mut bounds: Vec<Option<(f64, f64)>> = vec![None; steps];
    let mut add = |step: usize, s: Span| {
        if let Some(b) = bounds.get_mut(step) {
            *b = Some(match *b {
                None => (s.start_us, s.end_us()),
                Some((a, e)) => (a.min(s.start_us), e.max(s.end_us())),
            });
        }
    };
    if !rec.kernels.is_empty() {
        for k in &rec.kernels {
            if let Some(step) = k.op.and_then(|o| rec.steps.get(o)) {
                add(*step, k.gpu);
            }
        }
    } else {
        for (o, &step) in rec.ops.iter().zip(&rec.steps) {
            match (o.gpu, host_only) {
                (Some(g), _) => add(step, g),
                (None, true) => add(step, o.cpu),
                _ => {}
            }
        }
    }
    let b: Vec<(f64, f64)> = bounds.into_iter().flatten().collect();
    (0..b.len())
        .map(|i| match b.get(i + 1) {
            Some(next) => next.0 - b[i].0,
            None => b[i].1 - b[i].0,
        })
        .collect()
}

/// The work stream's (stream 0's) idle time between `kernels`, over the window from the first
/// one's start to the last one's end, per step.
fn stream_idle(kernels: &[KernelRecord], steps: usize) -> Option<StepIdle> {
    let spans: Vec<Span> = kernels
        .iter()
        .filter(|k| k.stream == 0)
        .map(|k| k.gpu)
        .collect();
    let lo = spans.iter().map(|s| s.start_us).reduce(f64::min)?;
    let hi = spans.iter().map(|s| s.end_us()).reduce(f64::max)?;
    (hi > lo).then(|| {
        let window = Span {
            start_us: lo,
            dur_us: hi - lo,
        };
        StepIdle::of(idle(&spans, window), steps)
    })
}

fn median(v: &[f64]) -> Option<f64> {
    Summary::of(v).map(|s| s.median)
}

/// The report of one recording.
struct Assembly<'a> {
    workload: String,
    device: String,
    recording: &'a Recording,
    records: Records,
    steps: usize,
    step_ms: Option<Summary>,
    attribution: Option<String>,
    eager_idle: Option<StepIdle>,
    verified: String,
}

fn assemble(a: Assembly<'_>, o: &ProfileOptions) -> Result<ProfileReport> {
    let r = a.recording;
    let host_only = r.timing == Timing::Host;
    let traced = a.records.clone();
    let mut rec = a.records;
    if host_only {
        // the table's time columns are host time here
        for op in &mut rec.ops {
            op.gpu = Some(op.cpu);
        }
    }
    let steps = a.steps.max(1);
    let recorded_us: f64 = if rec.kernels.is_empty() {
        rec.ops.iter().filter_map(|o| o.gpu).map(|g| g.dur_us).sum()
    } else {
        rec.kernels.iter().map(|k| k.gpu.dur_us).sum()
    };
    let per_step_us = recorded_us / steps as f64;
    let spans = step_spans(&rec, host_only);
    let profiled = median(&spans).map(|us| us / 1e3);
    let base = a.step_ms.map(|s| s.median);
    let overhead_pct = match (profiled, base) {
        (Some(p), Some(b)) if b > 0.0 => Some(100.0 * (p / b - 1.0)),
        _ => None,
    };
    let window_us = spans.iter().sum::<f64>().max(per_step_us * steps as f64);
    let roof = roofline(&a.device);
    let mut rows = key_averages(&rec.ops, &rec.kernels, o.group_by, window_us, &roof);
    if host_only {
        // the regimes are the GPU's (launch overhead, its roofline)
        for row in &mut rows {
            row.regime = None;
        }
    }
    let unattributed = rec.kernels.iter().filter(|k| k.op.is_none()).count();
    let without_layer = if rec.kernels.is_empty() {
        rec.ops.iter().filter(|o| o.layer.is_none()).count()
    } else {
        rec.kernels
            .iter()
            .filter(|k| {
                k.op.and_then(|i| rec.ops.get(i))
                    .is_none_or(|o| o.layer.is_none())
            })
            .count()
    };
    if let Some(path) = &o.trace {
        let pool: Vec<PoolSample> = r
            .pool
            .iter()
            .map(|p| PoolSample {
                ts_us: p.ts_us,
                used: p.used,
                reserved: p.reserved,
            })
            .collect();
        let trace = chrome_trace(&traced.ops, &traced.kernels, &pool);
        let broken = validate(&trace);
        if !broken.is_empty() {
            return Err(Error::Failed(format!(
                "the trace breaks the format's rules (not written): {}",
                broken.join("; ")
            )));
        }
        let bytes = serde_json::to_vec(&trace).map_err(|e| Error::Failed(e.to_string()))?;
        gpukit_types::files::write_atomically(path, &bytes).map_err(|source| Error::Io {
            what: "cannot write the trace",
            path: path.clone(),
            source,
        })?;
    }
    Ok(ProfileReport {
        workload: a.workload,
        device: a.device,
        timing: r.timing,
        timing_note: r.timing.describe().to_string(),
        fallback: r.fallback.clone(),
        nvtx: r.nvtx,
        steps,
        step_ms: a.step_ms,
        profiled_step_ms: profiled,
        overhead_pct,
        recorded_ms_per_step: per_step_us / 1e3,
        coverage: base.filter(|b| *b > 0.0).map(|b| per_step_us / 1e3 / b),
        kernels: rec.kernels.len(),
        unattributed_kernels: unattributed,
        without_layer,
        attribution: a.attribution,
        idle: (r.timing == Timing::Cupti)
            .then(|| stream_idle(&rec.kernels, steps))
            .flatten(),
        eager_idle: a.eager_idle,
        group_by: o.group_by,
        top: o.top,
        rows,
        host_only,
        trace: o.trace.clone(),
        dropped: r.dropped,
        verified: a.verified,
    })
}

fn random_images(n: usize, s: usize) -> Result<Tensor> {
    let seed = gpukit_tensor::random::fresh_seed();
    let x = gpukit_tensor::random::normal_f32(n * 3 * s * s, seed);
    Ok(Tensor::from_f32(&[n, 3, s, s], x)?)
}

/// `gpukit profile infer`.
pub fn profile_infer(
    discovery: &Discovery,
    w: &InferWorkload,
    o: &ProfileOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ProfileReport> {
    check_options(o)?;
    if w.image_size < 32 {
        return Err(Error::BadInput(format!(
            "--image-size {} is too small: ResNet needs at least 32",
            w.image_size
        )));
    }
    let gpu_usable = gpukit_cuda::driver::probe(discovery).is_ok();
    let strategy = match (w.strategy, w.device) {
        (Some(s @ InferStrategy::Cpu), _) => s,
        (Some(InferStrategy::Gpu(s)), Some(Device::Cpu)) => {
            return Err(Error::BadInput(format!(
                "strategy {} runs on a GPU, not on --device cpu",
                s.name()
            )))
        }
        (Some(s @ InferStrategy::Gpu(_)), _) => s,
        (Some(other), _) => {
            return Err(Error::BadInput(format!(
                "profile runs gpukit's own engines: {} is not one (give cpu or a GPU strategy \
                 such as fp16-nhwc or fp16-nhwc-graph)",
                other.name()
            )))
        }
        (None, Some(Device::Cpu)) => InferStrategy::Cpu,
        (None, Some(Device::Cuda(_))) => InferStrategy::parse("fp16-nhwc")?,
        (None, None) if gpu_usable => InferStrategy::parse("fp16-nhwc")?,
        (None, None) => InferStrategy::Cpu,
    };
    let dict = match &w.weights {
        Some(p) => load_safetensors(p, w.model, None)?,
        None => seeded_init(w.model, 1000, 0, true),
    };
    let folded = fold(&dict)?;
    let (n, s) = (w.batch, w.image_size);
    let on_cpu = strategy == InferStrategy::Cpu;
    if on_cpu {
        check_host_profile(o)?;
    }
    let mut need = Need::host(format!(
        "profiling {} at batch {n} of {s}x{s}",
        w.model.name()
    ))
    .with("the images", bytes(&[n, 3, s, s], 4));
    if on_cpu {
        need.add("the CPU forward pass", folded.cpu_forward_bytes(n, s, s));
    }
    need.check_host("lower --batch-size or --image-size")?;
    let images = random_images(n, s)?;
    let check_images = n.min(2);
    let workload = format!(
        "infer {} {} batch {n} {s}x{s}",
        w.model.name(),
        strategy.name()
    );
    let InferStrategy::Gpu(gs) = strategy else {
        // the CPU path: host time
        progress(&format!("profile: {workload} on the CPU"));
        let run = || -> Result<Vec<f32>> { Ok(folded.forward_cpu(&images)?.to_vec_f32()?) };
        let first = run()?;
        if first.iter().any(|v| !v.is_finite()) {
            return Err(Error::Failed(
                "the CPU forward pass gave non-finite logits".into(),
            ));
        }
        let mut times = Vec::new();
        for _ in 0..o.steps {
            let t = Instant::now();
            run()?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let p = Profiler::host_only()?;
        for step in 0..o.steps {
            profiler::step(step);
            run()?;
        }
        let rec = p.finish()?;
        return assemble(
            Assembly {
                workload,
                device: "cpu".into(),
                records: records(&rec),
                recording: &rec,
                steps: o.steps,
                step_ms: Summary::of(&times),
                attribution: None,
                eager_idle: None,
                verified: "the CPU path is gpukit's reference (logits finite)".into(),
            },
            o,
        );
    };
    let ordinal = w.device.and_then(|d| d.cuda()).unwrap_or(0);
    let ctx = GpuContext::open(discovery, ordinal)?;
    let device_name = ctx.gpu.name().unwrap_or_else(|_| format!("cuda:{ordinal}"));
    progress(&format!("profile: {workload} on {device_name}"));
    let weights = GpuWeights::upload(&ctx, &folded, gs.dtype, gs.layout)?;
    let mut session = Session::new(&ctx, &weights, n, s, s, true)?;
    let classes = folded.num_classes;
    // the output checked against the CPU's on the batch's first images (computed once)
    let first_images: Vec<f32> = images.to_vec_f32()?[..check_images * 3 * s * s].to_vec();
    let cpu = folded
        .forward_cpu(&Tensor::from_f32(&[check_images, 3, s, s], first_images)?)?
        .to_vec_f32()?;
    let check = |got: &[f32]| -> Result<()> {
        let got = &got[..check_images * classes];
        let a = agreement(got, &cpu, classes);
        match verdict(got, &a, tolerance(gs.dtype)) {
            Some(why) => Err(Error::Failed(format!(
                "{}: the logits disagree with the CPU's: {why}",
                gs.name()
            ))),
            None => Ok(()),
        }
    };
    let first = session.run(&images)?.to_vec_f32()?;
    check(&first)?;
    if gs.graph {
        session.capture()?;
    }
    let session = std::cell::RefCell::new(session);
    let after = || -> Result<()> {
        let got = session.borrow().logits()?.to_vec_f32()?;
        check(&got)
    };
    profile_gpu(
        &ctx,
        discovery,
        o,
        GpuPass {
            graph: gs.graph,
            enqueue: &|| Ok(session.borrow().enqueue()?),
            replay: &|| Ok(session.borrow().replay()?),
            check_after: &after,
            in_order: 0,
        },
        workload,
        device_name,
        format!(
            "logits of the first {check_images} image(s) against gpukit's f32 CPU path, \
             before and after profiling (tolerance {})",
            tolerance(gs.dtype)
        ),
    )
}

/// A prepared pass the profiler runs: launched call by call, or replayed as a captured graph
/// (`graph`), and the check of its outputs after the recorded steps.
pub(super) struct GpuPass<'a> {
    pub graph: bool,
    pub enqueue: &'a dyn Fn() -> Result<()>,
    pub replay: &'a dyn Fn() -> Result<()>,
    pub check_after: &'a dyn Fn() -> Result<()>,
    /// Branches the graph keeps in step order here (where `infer` overlaps them with the steps
    /// before them): a replay's kernels then run in the eager pass's order.
    pub in_order: usize,
}

/// The GPU part of `profile infer`, whatever the engine: warm-up, the step time without the
/// profiler, a graph's attribution through an eager pass, the recorded steps, the check after
/// them, the report.
fn profile_gpu(
    ctx: &GpuContext,
    discovery: &Discovery,
    o: &ProfileOptions,
    pass: GpuPass<'_>,
    workload: String,
    device_name: String,
    verified: String,
) -> Result<ProfileReport> {
    let stream = ctx.gpu.stream().clone();
    let step = || -> Result<()> {
        if pass.graph {
            (pass.replay)()
        } else {
            (pass.enqueue)()
        }
    };
    // an idle GPU lowers its clocks (the check before left it idle): run the step for a while
    // first, or the first timed steps measure the clocks coming up
    let warm = Instant::now();
    while warm.elapsed() < std::time::Duration::from_millis(300) {
        step()?;
        stream.synchronize()?;
    }
    let reps = o.steps.max(50);
    let times = gpukit_cuda::timing::time_on_stream(&stream, 3, reps, step)?;
    // a graph's replay is attributed through the same pass launched op by op
    let mut eager: Option<Records> = None;
    let mut eager_idle = None;
    if pass.graph && o.timing != TimingChoice::Events {
        if let Ok(p) = Profiler::start(&ctx.gpu, discovery, TimingChoice::Cupti) {
            for k in 0..3 {
                profiler::step(k);
                (pass.enqueue)()?;
            }
            let rec = p.finish()?;
            let r = records(&rec);
            // its first pass is the sequence
            let first_ops = r.steps.iter().filter(|&&k| k == 0).count();
            eager_idle = stream_idle(&r.kernels, 3);
            let kernels: Vec<KernelRecord> = r
                .kernels
                .iter()
                .filter(|k| k.op.is_some_and(|i| i < first_ops))
                .cloned()
                .collect();
            let ops: Vec<OpRecord> = r.ops[..first_ops].to_vec();
            eager = Some(Records {
                steps: vec![0; ops.len()],
                ops,
                kernels,
            });
        }
    }
    let p = Profiler::start(&ctx.gpu, discovery, o.timing)?;
    for k in 0..o.steps {
        profiler::step(k);
        step()?;
    }
    let rec = p.finish()?;
    (pass.check_after)()?;
    let mut rs = records(&rec);
    let mut attribution = None;
    if let (Some(e), true) = (&eager, pass.graph && rec.timing == Timing::Cupti) {
        let (a, how) = attribute_graph(e, &rs);
        rs = a;
        attribution = Some(how.describe(pass.in_order));
    } else if pass.graph {
        attribution = Some(
            "a graph replay is one op here: per-op times need CUPTI (the eager pass's kernel \
             order ties a replay's kernels to ops)"
                .into(),
        );
    }
    assemble(
        Assembly {
            workload,
            device: device_name,
            records: rs,
            recording: &rec,
            steps: o.steps,
            step_ms: Summary::of(&times),
            attribution,
            eager_idle,
            verified,
        },
        o,
    )
}

/// `gpukit profile infer --onnx`: the model's graph at `w.batch` on the general GPU engine,
/// each step named by the ONNX node it comes from; outputs checked against gpukit's graph
/// interpreter before and after profiling.
pub fn profile_onnx(
    discovery: &Discovery,
    w: &InferWorkload,
    file: &Path,
    dims: &[(String, usize)],
    o: &ProfileOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ProfileReport> {
    check_options(o)?;
    let gs = match w.strategy {
        None => gpukit_models::gpu::Strategy {
            dtype: gpukit_tensor::DType::F16,
            layout: gpukit_tensor::Layout::Nhwc,
            graph: false,
        },
        Some(InferStrategy::Gpu(s)) => s,
        Some(other) => {
            return Err(Error::BadInput(format!(
                "profile infer --onnx runs gpukit's GPU engine: {} is not one of its strategies \
                 (give fp16-nhwc, fp16-nhwc-graph, fp32, ...)",
                other.name()
            )))
        }
    };
    if w.device == Some(Device::Cpu) {
        return Err(Error::BadInput(
            "profile infer --onnx runs on a GPU, not on --device cpu".into(),
        ));
    }
    let n = w.batch;
    let mut graph = gpukit_models::onnx::ModelFile::read(file)?.import(
        &gpukit_models::onnx::ImportOptions {
            batch: Some(n),
            dims: dims.to_vec(),
        },
    )?;
    gpukit_models::graph::passes::optimize(&mut graph).map_err(gpukit_models::Error::from)?;
    let ordinal = w.device.and_then(|d| d.cuda()).unwrap_or(0);
    let ctx = GpuContext::open(discovery, ordinal)?;
    // lowered for the GPU: some steps' kernels need compute capability 8.0
    let cc = ctx.gpu.compute_capability().unwrap_or((0, 0));
    let program = gpukit_models::gpu::program::Program::lower_for(&graph, gs.dtype, gs.layout, cc)
        .map_err(|e| Error::BadInput(format!("the GPU engine cannot run this model yet: {e}")))?;
    let device_name = ctx.gpu.name().unwrap_or_else(|_| format!("cuda:{ordinal}"));
    let name = file.file_name().map_or_else(
        || file.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let workload = format!("infer --onnx {name} {} batch {n}", gs.name());
    progress(&format!("profile: {workload} on {device_name}"));
    let inputs: Vec<gpukit_models::graph::Array> = graph
        .inputs
        .iter()
        .map(|&i| {
            let shape = graph.value(i).shape.clone();
            let x = crate::random::normal_f32(shape.iter().product(), crate::random::fresh_seed());
            gpukit_models::graph::Array::f32(&shape, x)
        })
        .collect();
    // f32 rows against float64 (the f32 interpreter's sums drift too far), others the interpreter
    let want = match gs.dtype {
        gpukit_tensor::DType::F32 => gpukit_models::graph::forward_cpu_f64_rounded(&graph, &inputs),
        _ => gpukit_models::graph::forward_cpu(&graph, &inputs),
    }
    .map_err(gpukit_models::Error::from)?;
    let xs: Vec<&[f32]> = inputs.iter().filter_map(|a| a.as_f32()).collect();
    let mut session =
        gpukit_models::gpu::program::ProgramSession::new(&ctx, discovery, &program, progress)?;
    let tol = crate::accuracy::graph_tolerance(gs.dtype);
    let check = |got: &[Vec<f32>]| -> Result<()> {
        for (g, w) in got.iter().zip(&want) {
            let w = w.as_f32().unwrap_or_default();
            let classes = w.len() / n.max(1);
            let a = agreement(g, w, classes.max(1));
            if let Some(why) = verdict(g, &a, tol) {
                return Err(Error::Failed(format!(
                    "{}: the outputs disagree with {}: {why}",
                    gs.name(),
                    match gs.dtype {
                        gpukit_tensor::DType::F32 => "the float64 reference",
                        _ => "gpukit's graph interpreter",
                    }
                )));
            }
        }
        Ok(())
    };
    check(&session.run(&xs)?)?;
    // in step order: each replayed kernel is tied to its step by the eager pass's order
    let branches = session.branch_count();
    if gs.graph {
        session.capture_in_order()?;
    }
    let session = std::cell::RefCell::new(session);
    let after = || -> Result<()> { check(&session.borrow().outputs()?) };
    profile_gpu(
        &ctx,
        discovery,
        o,
        GpuPass {
            graph: gs.graph,
            enqueue: &|| Ok(session.borrow().enqueue()?),
            replay: &|| Ok(session.borrow().replay()?),
            check_after: &after,
            in_order: branches,
        },
        workload,
        device_name,
        format!(
            "outputs of the whole batch against gpukit's graph interpreter (CPU, f32), before \
             and after profiling (tolerance {tol})"
        ),
    )
}

/// `gpukit profile train`: the run of `request` with its second epoch recorded (its first when
/// it has one; every epoch on the CPU); the step time without the profiler comes from the
/// epochs after the recorded one.
pub fn profile_train(
    discovery: &Discovery,
    request: &crate::workload::train::TrainRequest,
    o: &ProfileOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ProfileReport> {
    check_options(o)?;
    let parallel = match &request.parallel {
        Some(crate::workload::train::parallel::Ranks::Launched(_)) => {
            return Err(Error::BadInput(
                "profile train records the ranks of one process: use --gpus N outside a \
                 launcher"
                    .into(),
            ))
        }
        Some(crate::workload::train::parallel::Ranks::Threads(n)) => Some(*n),
        None => None,
    };
    if !matches!(request.device, Some(Device::Cuda(_))) {
        check_host_profile(o)?;
    }
    let mut r = request.clone();
    // op by op unless a graph is asked for (a graph replays a whole epoch as one launch)
    if matches!(r.device, Some(Device::Cuda(_))) {
        r.graph = r.graph.or(Some(false));
    }
    // the second epoch is recorded (the first pays for planning), unless --steps alone sets
    // how far the run goes
    let recorded_epoch = match (r.epochs, r.steps) {
        (None, Some(_)) => 0,
        (epochs, _) => {
            let epochs = epochs.unwrap_or(3);
            r.epochs = Some(epochs);
            u64::from(epochs > 1)
        }
    };
    r.profile = Some((recorded_epoch, o.timing));
    let report = crate::workload::train::run_train(&r, discovery, progress)?;
    let rec = report.recording.clone().ok_or_else(|| {
        Error::Failed("the recorded epoch did not run (--steps stopped the run before it?)".into())
    })?;
    let host_only = rec.timing == Timing::Host;
    let recorded_steps = rec.ops.iter().map(|op| op.step).max().map_or(0, |m| m + 1);
    // the other epochs' time a step, host clock around each epoch (data-parallel: every
    // epoch is recorded, none is left unprofiled)
    let per_step: Vec<f64> = report
        .epochs
        .iter()
        .filter(|e| !host_only && parallel.is_none() && e.batches > 0)
        .filter(|e| e.epoch > recorded_epoch + 1)
        .map(|e| e.seconds * 1e3 / e.batches as f64)
        .collect();
    let config = &report.config;
    let workload = match parallel {
        Some(n) => format!(
            "train MLP {:?} batch {} a GPU {} data-parallel on {n} GPUs: cuda:0's whole run \
             (every epoch), its communication stream included",
            config.widths, config.batch_size, report.precision
        ),
        None => format!(
            "train MLP {:?} batch {} {} {}",
            config.widths, config.batch_size, report.precision, report.device
        ),
    };
    let graph = report.gpu.as_ref().is_some_and(|g| g.graph);
    assemble(
        Assembly {
            workload,
            device: report
                .gpu
                .as_ref()
                .map_or_else(|| "cpu".to_string(), |g| g.device_name.clone()),
            records: records(&rec),
            recording: &rec,
            steps: recorded_steps,
            step_ms: Summary::of(&per_step),
            attribution: graph.then(|| {
                "each epoch replays as one CUDA graph: its kernels belong to the replay (use \
                 --no-graph for per-op times)"
                    .to_string()
            }),
            eager_idle: None,
            verified: "the run's own checks (losses finite; a diverging run fails)".into(),
        },
        o,
    )
}

/// `gpukit profile train --model`: one update of a ResNet on the GPU recorded op by op (the
/// third by default: the first pays for planning, the second warms up), the others timed
/// around it by the host as the step's time.
pub fn profile_cnn_train(
    discovery: &Discovery,
    request: &crate::workload::train::cnn::CnnTrainRequest,
    o: &ProfileOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ProfileReport> {
    check_options(o)?;
    if !matches!(request.device, Device::Cuda(_)) {
        return Err(Error::BadInput(
            "profile train --model records a GPU run: add --device cuda:0".into(),
        ));
    }
    let mut r = request.clone();
    if r.steps.is_none() && r.epochs.is_none() {
        r.steps = Some(8);
    }
    let at = r.steps.map_or(2, |s| s.saturating_sub(1).min(2));
    r.profile = Some((at, o.timing));
    let report = crate::workload::train::cnn::run_cnn_train(&r, discovery, progress)?;
    let rec = report.recording.clone().ok_or_else(|| {
        Error::Failed(format!(
            "update {} was not made (--steps or --epochs ended the run before it)",
            at + 1
        ))
    })?;
    if let Some(why) = &report.diverged {
        return Err(Error::Failed(format!("the run diverged: {why}")));
    }
    // the step's time from the updates neither planning (the first) nor recorded
    let per_step: Vec<f64> = report
        .updates
        .iter()
        .enumerate()
        .filter(|&(i, _)| i > 0 && i as u64 != at)
        .map(|(_, u)| u.seconds * 1e3)
        .collect();
    let workload = format!(
        "train {} batch {} {}x{} {} {}",
        report.model,
        report.batch_size,
        report.image_size.0,
        report.image_size.1,
        report.precision,
        report.device
    );
    assemble(
        Assembly {
            workload,
            device: report.gpu_name.clone().unwrap_or(report.device.clone()),
            records: records(&rec),
            recording: &rec,
            steps: 1,
            step_ms: Summary::of(&per_step),
            attribution: None,
            eager_idle: None,
            verified: "the run's own checks (losses finite; a diverging run fails)".into(),
        },
        o,
    )
}

/// Where the trace went, for the notes.
pub fn trace_note(path: &Path) -> String {
    format!(
        "trace written to {} (open it in https://ui.perfetto.dev or chrome://tracing)",
        path.display()
    )
}
