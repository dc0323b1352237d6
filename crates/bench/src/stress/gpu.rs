//! One GPU's stress tests, run on its own thread: sustained matrix multiplies (each result
//! compared on the GPU with the first, the first and last against a float64 reference), the
//! memory patterns, and pinned copies both ways.

use super::kernels::{Pattern, StressKernels};
use super::{
    bytes_differing, Budget, CopyStress, FaultTest, GpuStress, MatmulStress, MemoryStress,
    PatternPass, StressOptions,
};
use crate::ceilings::PeakSource;
use crate::error::{Error, Result};
use crate::gpu::describe_gpu;

use crate::measure::{device_samples, gbs, Plan};
use crate::random::{fill_bytes, fresh_seed};
use crate::workload::gemm::{
    b_as_stored, cache_dir, draw_fp8, fp8_no_algorithm, load_achievable, unsupported_shape,
    verify_square, AchievableKey, HostPair, Lookup,
};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::NvmlSession;
use gpukit_cuda::transfer::{copy_pinned_to, copy_to_pinned, PinnedBytes};
use gpukit_cuda::{DeviceBuffer, Gpu};
use gpukit_tensor::kernels::Distribution;
use gpukit_tensor::DType;
use std::time::{Duration, Instant};

/// A timed block of products lasts about this long: long enough that a block's rate is steady,
/// short enough that the run ends near its deadline.
const BLOCK_S: f64 = 0.5;

/// Bytes of one copy.
const COPY_BYTES: usize = 256 << 20;

/// The memory test allocates in pieces of this size (one allocation of 70 GB may fail where
/// pieces do not).
const MEMORY_CHUNK: usize = 1 << 30;

/// The bits the planted fault flips in one word (the lowest mantissa bit of a bf16's upper
/// half, or a middle bit of an f32): a small error only a bit-exact comparison sees.
const FAULT_MASK: u32 = 0x0001_0000;

pub(super) fn stress_gpu(
    discovery: &Discovery,
    ordinal: usize,
    opts: &StressOptions,
    budget: Budget,
    progress: &(dyn Fn(&str) + Sync),
) -> GpuStress {
    let mut g = GpuStress::new(ordinal);
    let facts = match describe_gpu(discovery, ordinal) {
        Ok(f) => f,
        Err(e) => {
            g.errors.push(format!("reading the GPU's facts: {e}"));
            return g;
        }
    };
    g.name = facts.name.clone();
    g.uuid = facts.uuid.clone();
    g.compute_capability = facts.compute_capability;
    g.pcie_link_gbs = facts.pcie_max_gbs;
    g.peaks = Some(facts.peaks.clone());
    if let (Some(dir), Some(key)) = (
        cache_dir(),
        AchievableKey::current(discovery, &g.name, &g.uuid),
    ) {
        if let Lookup::Found(a) = load_achievable(&dir, &key) {
            g.achievable = a.best;
        }
    }
    let nvml = NvmlSession::open(discovery).ok();
    let nvml_index = nvml.as_ref().and_then(|n| n.index_of(&g.uuid).ok());
    let health = || {
        nvml.as_ref()
            .zip(nvml_index)
            .and_then(|(n, i)| n.health(i).ok())
    };
    g.health_before = health();
    let gpu = match Gpu::open(discovery, ordinal) {
        Ok(gpu) => gpu,
        Err(e) => {
            g.errors.push(format!("opening the GPU: {e}"));
            return g;
        }
    };
    let kernels = match StressKernels::load(discovery, &gpu) {
        Ok(k) => k,
        Err(e) => {
            g.errors.push(format!("loading the stress kernels: {e}"));
            return g;
        }
    };
    let planted = |test: FaultTest| {
        opts.plant
            .is_some_and(|p| p.test == test && p.gpu == ordinal)
    };
    let cc = facts.compute_capability.unwrap_or((0, 0));
    for (dtype, seconds) in budget.matmul_mix(cc) {
        progress(&format!("cuda:{ordinal} matmul {dtype}"));
        let n = opts.matmul_size;
        let seconds = seconds.and_then(|s| unsupported_shape(dtype, (n, n, n)).map_or(Ok(s), Err));
        let mut m = match seconds {
            Err(why) => MatmulStress {
                dtype: Some(dtype),
                size: opts.matmul_size,
                skipped: Some(why),
                ..MatmulStress::default()
            },
            Ok(seconds) => matmul(
                &gpu,
                &kernels,
                dtype,
                opts.matmul_size,
                seconds,
                planted(FaultTest::Matmul),
            ),
        };
        if let Some(t) = m.tflops {
            let datasheet = g
                .peaks
                .as_ref()
                .filter(|p| matches!(p.source, PeakSource::Datasheet { .. }))
                .and_then(|p| p.for_dtype(dtype.name()));
            m.pct_of_peak = datasheet.map(|p| 100.0 * t / p);
            m.pct_of_achievable = g
                .achievable
                .iter()
                .find(|b| b.dtype == dtype)
                .map(|b| 100.0 * t / b.tflops);
        }
        g.matmul.push(m);
    }
    progress(&format!("cuda:{ordinal} memory"));
    g.memory = Some(memory(
        &gpu,
        &kernels,
        budget.memory_s,
        opts.memory_fraction,
        planted(FaultTest::Memory),
    ));
    progress(&format!("cuda:{ordinal} copies"));
    g.copies = copies(&gpu, budget.copies_s, g.pcie_link_gbs);
    g.health_after = health();
    g
}

/// Sustained `n x n x n` products of `dtype` for about `seconds`: cuBLAS's default algorithm
/// (bit-reproducible run to run on one GPU, as cuBLAS documents; for fp8, which cuBLAS's
/// GemmEx lacks, cuBLASLt's heuristic first choice, one algorithm throughout), each result
/// compared word for word with the first on the GPU, the first and the last against a float64
/// reference.
fn matmul(
    gpu: &Gpu,
    kernels: &StressKernels,
    dtype: DType,
    n: usize,
    seconds: f64,
    plant: bool,
) -> MatmulStress {
    let mut m = MatmulStress {
        dtype: Some(dtype),
        size: n,
        backend: if dtype == DType::F8E4M3 {
            "cuBLASLt (heuristic #0; E4M3 inputs, bf16 output)".into()
        } else {
            "cuBLAS GemmEx (default algorithm)".into()
        },
        ..MatmulStress::default()
    };
    if let Err(e) = run_matmul(gpu, kernels, dtype, n, seconds, plant, &mut m) {
        m.error = Some(e.to_string());
    }
    m
}

fn run_matmul(
    gpu: &Gpu,
    kernels: &StressKernels,
    dtype: DType,
    n: usize,
    seconds: f64,
    plant: bool,
    m: &mut MatmulStress,
) -> Result<()> {
    let bytes = n * n * dtype.size_bytes();
    // fp8 writes bf16
    let out_bytes = n * n * dtype.product_output().size_bytes();
    let free = gpu.mem_info()?.0 as usize;
    let need = 2 * bytes + 2 * out_bytes + gpukit_cuda::blas::WORKSPACE_BYTES;
    if need > free {
        return Err(Error::Failed(format!(
            "needs {:.1} GiB of GPU memory, {:.1} GiB free",
            need as f64 / f64::from(1u32 << 30),
            free as f64 / f64::from(1u32 << 30)
        )));
    }
    let blas = Blas::new(gpu.discovery(), gpu)?;
    let ops = gpukit_tensor::kernels::tensor_ops(gpu)?;
    let seed = fresh_seed();
    let draw = |k: u64| -> Result<DeviceBuffer> {
        if dtype == DType::F8E4M3 {
            return draw_fp8(gpu, n * n, seed ^ k, Distribution::Normal);
        }
        let buf = gpu.alloc(bytes)?;
        ops.kernels.fill_random(
            gpu.stream(),
            buf.view(),
            dtype,
            n * n,
            seed ^ k,
            Distribution::Normal,
        )?;
        Ok(buf)
    };
    // for fp8, b holds B transposed (the form gemm_lt's fp8 takes)
    let (a, b) = (draw(1)?, draw(2)?);
    let mut first = gpu.alloc(out_bytes)?;
    let mut work = gpu.alloc(out_bytes)?;
    let pair = HostPair {
        a: gpu.download(&a)?,
        b: b_as_stored(dtype, gpu.download(&b)?, n, n),
    };
    // one algorithm for every product: the same inputs must give the same bits
    let plan = if dtype == DType::F8E4M3 {
        let plans = blas
            .lt_candidates(dtype, n, n, n, 1)
            .map_err(|e| Error::Failed(fp8_no_algorithm((n, n, n), &e.to_string())))?;
        Some(
            plans
                .into_iter()
                .next()
                .ok_or_else(|| Error::Failed(fp8_no_algorithm((n, n, n), "none")))?,
        )
    } else {
        None
    };
    let product = |c: &mut DeviceBuffer| -> Result<()> {
        match &plan {
            Some(plan) => blas.gemm_lt(plan, &a, &b, c),
            None => blas.gemm(dtype, &a, &b, c, (n, n, n)),
        }
        .map_err(Error::from)
    };
    product(&mut first)?;
    let c = gpu.download(&first)?;
    m.reference_first = Some(verify_square(dtype, dtype, &pair, &c, n, seed));
    m.words_per_result = (out_bytes / 4) as u64;
    let words = out_bytes / 4;
    let flops = 2.0 * (n as f64).powi(3);
    let stream = gpu.stream();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
    let started = Instant::now();
    let mut reps = 2usize;
    let mut rates = Vec::new();
    let mut plant = plant;
    loop {
        let mut marks = Vec::with_capacity(reps);
        for _ in 0..reps {
            let before = stream.record_timed()?;
            product(&mut work)?;
            let after = stream.record_timed()?;
            if plant {
                kernels.flip(work.view(), words / 2, FAULT_MASK)?;
                plant = false;
            }
            kernels.count_unequal(work.view(), first.view(), words)?;
            marks.push((before, after));
        }
        let differing = kernels.take_count(gpu)?;
        let mut ms = 0.0;
        for (before, after) in &marks {
            ms += before.elapsed_ms(after)?;
        }
        m.products += reps as u64;
        m.repeat_words_differing += differing;
        if ms > 0.0 {
            rates.push(flops * reps as f64 / (ms * 1e9));
            // the next block lasts about BLOCK_S
            let per = ms / 1e3 / reps as f64;
            reps = ((BLOCK_S / per) as usize).clamp(1, 10_000);
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    // the repeats counted against the first; the first product is one more result
    m.products += 1;
    m.seconds = started.elapsed().as_secs_f64();
    let c = gpu.download(&work)?;
    m.reference_last = Some(verify_square(dtype, dtype, &pair, &c, n, seed));
    let passed = |v: &Option<crate::report::Verification>| v.as_ref().is_some_and(|v| v.passed);
    if passed(&m.reference_first) && passed(&m.reference_last) && m.repeat_words_differing == 0 {
        rates.sort_by(f64::total_cmp);
        m.tflops = rates.get(rates.len() / 2).copied();
        m.tflops_min = rates.first().copied();
        m.tflops_max = rates.last().copied();
    }
    Ok(())
}

/// The memory test: `fraction` of the free memory in pieces, each pattern written over all of
/// it and then counted back, patterns in turn (the seed moves every round) for about `seconds`,
/// one round at least.
fn memory(
    gpu: &Gpu,
    kernels: &StressKernels,
    seconds: f64,
    fraction: f64,
    plant: bool,
) -> MemoryStress {
    let mut mem = MemoryStress::default();
    if let Err(e) = run_memory(gpu, kernels, seconds, fraction, plant, &mut mem) {
        mem.error = Some(e.to_string());
    }
    mem
}

fn run_memory(
    gpu: &Gpu,
    kernels: &StressKernels,
    seconds: f64,
    fraction: f64,
    plant: bool,
    mem: &mut MemoryStress,
) -> Result<()> {
    // the products' buffers went back to the pool: hand them to the driver first
    gpu.empty_cache()?;
    let free = gpu.mem_info()?.0;
    mem.free_bytes = free;
    let target = ((free as f64 * fraction) as usize) / 4 * 4;
    let mut chunks: Vec<DeviceBuffer> = Vec::new();
    let mut have = 0usize;
    while have < target {
        let size = MEMORY_CHUNK.min(target - have);
        match gpu.alloc_uninit(size) {
            Ok(c) => {
                have += size;
                chunks.push(c);
            }
            Err(e) if chunks.is_empty() => return Err(e.into()),
            Err(e) => {
                mem.shortfall = Some(format!(
                    "allocation stopped at {:.1} of {:.1} GiB asked: {e}",
                    have as f64 / f64::from(1u32 << 30),
                    target as f64 / f64::from(1u32 << 30)
                ));
                break;
            }
        }
    }
    mem.tested_bytes = have as u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds.max(0.0));
    let mut passes: Vec<PatternPass> = Pattern::ALL
        .iter()
        .map(|&pattern| PatternPass {
            pattern,
            passes: 0,
            words_wrong: 0,
        })
        .collect();
    let seed = fresh_seed();
    let mut plant = plant;
    'rounds: for round in 0u64.. {
        for pass in passes.iter_mut() {
            let s = seed.wrapping_add(round);
            let mut base = 0usize;
            for c in &chunks {
                kernels.fill(c.view(), c.len() / 4, base, pass.pattern, s)?;
                base += c.len() / 4;
            }
            if plant {
                if let Some(c) = chunks.first() {
                    kernels.flip(c.view(), c.len() / 8, FAULT_MASK)?;
                }
                plant = false;
            }
            let mut base = 0usize;
            for c in &chunks {
                kernels.count_wrong(c.view(), c.len() / 4, base, pass.pattern, s)?;
                base += c.len() / 4;
            }
            pass.words_wrong += kernels.take_count(gpu)?;
            pass.passes += 1;
            if round > 0 && Instant::now() >= deadline {
                break 'rounds;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    mem.passes = passes;
    mem.seconds = started.elapsed().as_secs_f64();
    drop(chunks);
    gpu.empty_cache()?;
    Ok(())
}

/// Pinned copies host->device then device->host for about `seconds` together, each direction
/// timed with CUDA events and its last copy compared byte for byte with the source.
fn copies(gpu: &Gpu, seconds: f64, link_gbs: Option<f64>) -> Vec<CopyStress> {
    let bytes = COPY_BYTES;
    let row = |direction: &str| CopyStress {
        direction: direction.to_string(),
        bytes: bytes as u64,
        copies: 0,
        gbs: None,
        pct_of_link: None,
        verified: false,
        bytes_wrong: 0,
        error: None,
    };
    let mut h2d = row("host->device");
    let mut d2h = row("device->host");
    if let Err(e) = run_copies(gpu, seconds, link_gbs, (&mut h2d, &mut d2h)) {
        for r in [&mut h2d, &mut d2h] {
            if r.copies == 0 || !r.verified {
                r.error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    vec![h2d, d2h]
}

fn run_copies(
    gpu: &Gpu,
    seconds: f64,
    link_gbs: Option<f64>,
    (h2d, d2h): (&mut CopyStress, &mut CopyStress),
) -> Result<()> {
    let bytes = COPY_BYTES;
    let stream = gpu.stream();
    let mut src = vec![0u8; bytes];
    fill_bytes(&mut src, fresh_seed());
    let mut pinned_src = PinnedBytes::new(gpu, bytes, true)?;
    pinned_src.as_mut_slice().copy_from_slice(&src);
    let mut pinned_dst = PinnedBytes::new(gpu, bytes, false)?;
    let dev = gpu.alloc(bytes)?;
    let each_s = seconds.max(0.0) / 2.0;
    // host->device: timed, then the device's bytes read back and compared
    let rates = timed_copies(gpu, each_s, bytes, &mut || {
        copy_pinned_to(stream, &pinned_src, bytes, dev.view())
    })?;
    finish_copy(h2d, &rates, link_gbs);
    h2d.bytes_wrong = bytes_differing(&src, &gpu.download(&dev)?);
    h2d.verified = h2d.bytes_wrong == 0;
    // device->host into a poisoned destination
    pinned_dst.as_mut_slice().fill(0);
    let rates = timed_copies(gpu, each_s, bytes, &mut || {
        copy_to_pinned(stream, dev.view(), &mut pinned_dst, bytes)
    })?;
    finish_copy(d2h, &rates, link_gbs);
    stream.synchronize()?;
    d2h.bytes_wrong = bytes_differing(&src, pinned_dst.as_slice());
    d2h.verified = d2h.bytes_wrong == 0;
    Ok(())
}

/// Copies in blocks of about half a second until `seconds` are spent: each copy's GB/s.
fn timed_copies(
    gpu: &Gpu,
    seconds: f64,
    bytes: usize,
    copy: &mut dyn FnMut() -> gpukit_cuda::Result<()>,
) -> Result<Vec<f64>> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut reps = 3usize;
    let mut rates = Vec::new();
    loop {
        let samples = device_samples(gpu.stream(), Plan::new(1, reps), &mut *copy)?;
        let total: f64 = samples.iter().sum();
        rates.extend(samples.iter().map(|&ms| gbs(bytes as f64, ms)));
        if total > 0.0 {
            reps = ((BLOCK_S * 1e3 / (total / reps as f64)) as usize).clamp(1, 1000);
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Ok(rates)
}

fn finish_copy(row: &mut CopyStress, rates: &[f64], link_gbs: Option<f64>) {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    row.copies = rates.len() as u64;
    row.gbs = sorted.get(sorted.len() / 2).copied();
    row.pct_of_link = row.gbs.zip(link_gbs).map(|(r, l)| 100.0 * r / l);
}
