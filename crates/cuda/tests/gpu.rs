//! GPU tests. They run when a GPU is usable and are reported as ignored, with the reason, when
//! not: never counted as passed. On the lent GPU machine scripts/gpu-test.sh runs this binary.
//! GPUKIT_REQUIRE_GPU=1 turns "no GPU" into a failure (so a broken discovery cannot pass there).

//!
//! Tests of a library itself (NVRTC, cuBLAS, cuDNN, NCCL through cudarc) open their own cudarc
//! context; tests of gpukit's wrappers go through `gpukit_cuda`'s own types.

use cudarc::{
    cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig},
    driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg},
    nccl::{Comm, ReduceOp},
};
use gpukit_cuda::driver::{self, Gpu};
use gpukit_cuda::loader::{Discovery, Lib};
use gpukit_cuda::nvml::NvmlSession;
use gpukit_cuda::transfer::copy_d2d;
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::{Arc, OnceLock};

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

type GpuTest = fn() -> Result<(), Failed>;

fn discovery() -> &'static Discovery {
    DISCOVERY.get().expect("set in main")
}

/// Deterministic-per-seed but fresh-per-run random floats in [-1, 1).
fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut s = seed ^ run ^ 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn gpu() -> Result<Gpu, Failed> {
    Gpu::open(discovery(), 0).map_err(|e| format!("open cuda:0: {e}").into())
}

/// A cudarc context and stream of device `ordinal`, for tests of a library itself.
fn raw(ordinal: usize) -> Result<(Arc<CudaContext>, Arc<CudaStream>), Failed> {
    // gpukit's discovery (in main) made the libraries loadable; cudarc opens them by name
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("cuda:{ordinal}: {e}"))?;
    let stream = ctx.new_stream().map_err(|e| e.to_string())?;
    Ok((ctx, stream))
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn check(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

fn attributes_agree_with_nvml() -> Result<(), Failed> {
    let d = driver::probe(discovery()).map_err(|e| e.to_string())?;
    let nvml = NvmlSession::open(discovery())?;
    for i in 0..d.device_count {
        let a = driver::device_attributes(i, d.device_count).map_err(|e| e.to_string())?;
        let n = nvml.device(&a.uuid)?;
        // The driver's total leaves out what the firmware reserves; NVML counts the board.
        let board = n.memory_total_bytes.ok_or("NVML gave no total memory")?;
        check(
            a.total_memory_bytes <= board && a.total_memory_bytes as f64 > 0.97 * board as f64,
            format!(
                "total memory: driver {} vs NVML {board}",
                a.total_memory_bytes
            ),
        )?;
        check(a.sm_count > 0 && a.l2_cache_bytes > 0, format!("{a:?}"))?;
        check(
            a.uuid.starts_with("GPU-") && a.uuid.len() == 40,
            a.uuid.clone(),
        )?;
    }
    check(
        driver::device_attributes(d.device_count, d.device_count).is_err(),
        "an ordinal past the last device must be an error",
    )
}

fn copies_round_trip_byte_exact() -> Result<(), Failed> {
    let g = gpu()?;
    let host = bytes_of(&random_f32(1 << 22, 1));
    let dev = g.upload(&host).map_err(|e| e.to_string())?;
    let mut copy = g.alloc(host.len()).map_err(|e| e.to_string())?;
    copy_d2d(g.stream(), &dev, &mut copy, host.len()).map_err(|e| e.to_string())?;
    let back = g.download(&copy).map_err(|e| e.to_string())?;
    check(back == host, "device round trip changed bytes")?;
    // a view past the end is an error, not a wild copy
    check(
        dev.view().sub(host.len() - 4, 8).is_err(),
        "a view past the end must be refused",
    )
}

/// A buffer filled by repeating its first bytes on the device holds the host's periodic
/// pattern (an odd period over an odd length). The inference engine's tests compare such
/// buffers on the device too (its byte comparison kernel lives in gpukit-models).
fn device_repeat_matches_the_host() -> Result<(), Failed> {
    let g = gpu()?;
    let e = |e: gpukit_cuda::Error| e.to_string();
    let period = 1_000_003usize;
    let total = 10 * period + 7;
    let block = bytes_of(&random_f32(period.div_ceil(4), 11));
    let block = &block[..period];
    let want: Vec<u8> = (0..total).map(|i| block[i % period]).collect();
    let dev = g.alloc(total).map_err(e)?;
    g.upload_into(dev.view(), block).map_err(e)?;
    g.repeat_prefix(dev.view(), period).map_err(e)?;
    let got = g.download(&dev).map_err(e)?;
    check(
        got == want,
        "the repeated prefix differs from the host's pattern",
    )
}

/// The pool caches: freed memory stays reserved across a synchronize (the driver's default
/// would hand it back), `empty_cache` trims it, and an allocation larger than what is left
/// beside the cache still succeeds (the cache is handed back and the allocation retried).
fn pool_keeps_its_cache_and_gives_it_back_when_needed() -> Result<(), Failed> {
    let g = gpu()?;
    let e = |e: gpukit_cuda::Error| e.to_string();
    g.empty_cache().map_err(e)?;
    let base = g.pool_stats().map_err(e)?.reserved;
    let n = 256 << 20;
    drop(g.alloc(n).map_err(e)?);
    g.synchronize().map_err(e)?;
    let cached = g.pool_stats().map_err(e)?.reserved;
    check(
        cached >= base + n as u64,
        format!(
            "after a synchronize the pool holds {cached} bytes, {base} before a {n}-byte buffer"
        ),
    )?;
    g.empty_cache().map_err(e)?;
    let trimmed = g.pool_stats().map_err(e)?.reserved;
    check(
        trimmed == base,
        format!("empty_cache left {trimmed} bytes reserved, {base} before"),
    )?;
    // fill the cache with many small blocks holding most of the free memory, free them, then
    // ask for one block bigger than what the driver has left beside them
    let (free, _) = g.mem_info().map_err(e)?;
    let block = 64 << 20;
    let blocks = (free as usize / 10 * 6) / block;
    let small: Vec<_> = (0..blocks)
        .map(|_| g.alloc_uninit(block))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    drop(small);
    g.synchronize().map_err(e)?;
    let big = free as usize / 10 * 7;
    let buf = g.alloc_uninit(big).map_err(|err| {
        format!("{big} bytes after freeing {blocks} x {block} into the cache: {err}")
    })?;
    drop(buf);
    g.empty_cache().map_err(e)?;
    Ok(())
}

fn event_timing_measures_device_work() -> Result<(), Failed> {
    let g = gpu()?;
    let n = 256 << 20; // 256 MiB
    let src = g.alloc(n).map_err(|e| e.to_string())?;
    let mut dst = g.alloc(n).map_err(|e| e.to_string())?;
    let ms = gpukit_cuda::timing::time_on_stream(g.stream(), 2, 5, || {
        copy_d2d(g.stream(), &src, &mut dst, n)
    })
    .map_err(|e: gpukit_cuda::Error| format!("{e}"))?;
    check(ms.len() == 5, format!("{} samples", ms.len()))?;
    // 512 MB moved (read + write): any real copy takes well over 10 us and under a second.
    check(
        ms.iter().all(|&t| t > 0.01 && t < 1000.0),
        format!("implausible event times {ms:?}"),
    )
}

fn nvrtc_kernel_matches_cpu() -> Result<(), Failed> {
    check(
        discovery().usable(Lib::Nvrtc),
        discovery().missing_message(Lib::Nvrtc),
    )?;
    let (ctx, stream) = raw(0)?;
    let src = r#"extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }"#;
    let ptx = cudarc::nvrtc::compile_ptx(src).map_err(|e| e.to_string())?;
    let module = ctx.load_module(ptx).map_err(|e| e.to_string())?;
    let f = module.load_function("axpy").map_err(|e| e.to_string())?;
    let n = 1_000_003usize;
    let x = random_f32(n, 2);
    let y = random_f32(n, 3);
    let a = 0.75f32;
    let xd = stream.clone_htod(&x).map_err(|e| e.to_string())?;
    let mut yd = stream.clone_htod(&y).map_err(|e| e.to_string())?;
    let n32 = n as i32;
    let mut b = stream.launch_builder(&f);
    b.arg(&a).arg(&xd).arg(&mut yd).arg(&n32);
    // SAFETY: argument types match the kernel signature; n bounds every access.
    unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }.map_err(|e| e.to_string())?;
    let out = stream.clone_dtoh(&yd).map_err(|e| e.to_string())?;
    let worst = out
        .iter()
        .zip(x.iter().zip(&y))
        .map(|(o, (xi, yi))| (f64::from(*o) - (0.75 * f64::from(*xi) + f64::from(*yi))).abs())
        .fold(0.0, f64::max);
    check(worst < 1e-6, format!("max abs error {worst}"))
}

fn cublas_sgemm_matches_f64_reference() -> Result<(), Failed> {
    check(
        discovery().usable(Lib::Cublas),
        discovery().missing_message(Lib::Cublas),
    )?;
    let (_ctx, stream) = raw(0)?;
    let (m, n, k) = (129usize, 67usize, 255usize);
    let a = random_f32(m * k, 4); // column-major m x k
    let b = random_f32(k * n, 5); // column-major k x n
    let blas = CudaBlas::new(stream.clone()).map_err(|e| e.to_string())?;
    let ad = stream.clone_htod(&a).map_err(|e| e.to_string())?;
    let bd = stream.clone_htod(&b).map_err(|e| e.to_string())?;
    let mut cd = stream
        .alloc_zeros::<f32>(m * n)
        .map_err(|e| e.to_string())?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: m as i32,
        ldb: k as i32,
        beta: 0.0f32,
        ldc: m as i32,
    };
    // SAFETY: buffer sizes match m, n, k and the leading dimensions.
    unsafe { blas.gemm(cfg, &ad, &bd, &mut cd) }.map_err(|e| e.to_string())?;
    let c = stream.clone_dtoh(&cd).map_err(|e| e.to_string())?;
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for j in 0..n {
        for i in 0..m {
            let r: f64 = (0..k)
                .map(|p| f64::from(a[i + p * m]) * f64::from(b[p + j * k]))
                .sum();
            num += (f64::from(c[i + j * m]) - r).powi(2);
            den += r * r;
        }
    }
    let rel = (num / den).sqrt();
    // default math mode is true f32 (not TF32): far below 1e-5
    check(rel < 1e-5, format!("relative error {rel}"))
}

fn cudnn_and_nccl_load_and_work() -> Result<(), Failed> {
    for lib in [Lib::Cudnn, Lib::Nccl] {
        check(discovery().usable(lib), discovery().missing_message(lib))?;
    }
    let (_ctx, stream) = raw(0)?;
    cudarc::cudnn::Cudnn::new(stream.clone()).map_err(|e| format!("cuDNN: {e:?}"))?;
    let comms = Comm::from_devices(vec![stream.clone()]).map_err(|e| format!("NCCL: {e:?}"))?;
    let x = random_f32(4096, 6);
    let xd = stream.clone_htod(&x).map_err(|e| e.to_string())?;
    let mut yd = stream
        .alloc_zeros::<f32>(x.len())
        .map_err(|e| e.to_string())?;
    comms[0]
        .all_reduce(&xd, &mut yd, &ReduceOp::Sum)
        .map_err(|e| format!("NCCL all_reduce: {e:?}"))?;
    let y = stream.clone_dtoh(&yd).map_err(|e| e.to_string())?;
    check(y == x, "a one-rank all-reduce must return its input")
}

fn nccl_all_reduce_across_every_gpu() -> Result<(), Failed> {
    let d = discovery();
    let count = driver::probe(d).map_err(|e| e.to_string())?.device_count;
    let gpus: Vec<(Arc<CudaContext>, Arc<CudaStream>)> =
        (0..count).map(raw).collect::<Result<_, _>>()?;
    let n = 1 << 20;
    let inputs: Vec<Vec<f32>> = (0..count).map(|i| random_f32(n, 100 + i as u64)).collect();
    let comms = Comm::from_devices(gpus.iter().map(|(_, s)| s.clone()).collect())
        .map_err(|e| format!("NCCL: {e:?}"))?;
    let mut outs = Vec::new();
    // one process drives every rank: the calls of one collective form a group
    cudarc::nccl::result::group_start().map_err(|e| format!("{e:?}"))?;
    for (i, (_, s)) in gpus.iter().enumerate() {
        let x = s.clone_htod(&inputs[i]).map_err(|e| e.to_string())?;
        let mut y = s.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
        comms[i]
            .all_reduce(&x, &mut y, &ReduceOp::Sum)
            .map_err(|e| format!("NCCL all_reduce: {e:?}"))?;
        outs.push((x, y));
    }
    cudarc::nccl::result::group_end().map_err(|e| format!("{e:?}"))?;
    let want: Vec<f64> = (0..n)
        .map(|j| inputs.iter().map(|v| f64::from(v[j])).sum())
        .collect();
    for (i, ((_, s), (_, y))) in gpus.iter().zip(&outs).enumerate() {
        let got = s.clone_dtoh(y).map_err(|e| e.to_string())?;
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        check(
            worst < 1e-5 * count as f64,
            format!("cuda:{i}: max error {worst}"),
        )?;
    }
    let m = driver::peer_access_matrix(count).map_err(|e| e.to_string())?;
    eprintln!("    {count} GPUs, peer access: {m:?}");
    check(
        m.len() == count && (0..count).all(|i| m[i][i]),
        "peer matrix shape",
    )
}

/// Every GPU of this machine, opened through gpukit's own types.
fn all_gpus() -> Result<Vec<Gpu>, Failed> {
    let count = driver::probe(discovery())
        .map_err(|e| e.to_string())?
        .device_count;
    (0..count)
        .map(|i| Gpu::open(discovery(), i).map_err(|e| Failed::from(e.to_string())))
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// gpukit's NCCL wrapper against float64 on the host: every collective, random inputs, over
/// every GPU of the machine in one process (one GPU is a world of one).
fn nccl_collectives_match_float64() -> Result<(), Failed> {
    use gpukit_cuda::nccl::{group, Comm as GComm, RedOp};
    use gpukit_types::DType;
    let gpus = all_gpus()?;
    let n = gpus.len();
    let comms = GComm::init_all(&gpus.iter().collect::<Vec<_>>()).map_err(|e| e.to_string())?;
    let per = 3000; // elements each rank contributes to the gathers
    let count = per * n;
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| random_f32(count, 40 + r as u64)).collect();
    let send: Vec<_> = gpus
        .iter()
        .zip(&inputs)
        .map(|(g, x)| g.upload(&bytes_of(x)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let recv: Vec<_> = gpus
        .iter()
        .map(|g| g.alloc(count * 4))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let e = |e: gpukit_cuda::Error| Failed::from(e.to_string());
    let read = |i: usize| -> Result<Vec<f32>, Failed> {
        gpus[i].synchronize().map_err(e)?;
        Ok(f32s(&gpus[i].download(&recv[i]).map_err(e)?))
    };
    let close = |got: &[f32], want: &[f64], what: &str| -> Result<(), Failed> {
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        check(
            got.len() >= want.len() && worst < 1e-5 * n as f64,
            format!("{what}: max error {worst}"),
        )
    };
    let sum_at = |j: usize| inputs.iter().map(|v| f64::from(v[j])).sum::<f64>();
    let max_at = |j: usize| {
        inputs
            .iter()
            .map(|v| f64::from(v[j]))
            .fold(f64::MIN, f64::max)
    };
    // all_reduce sum and max
    for (op, f) in [
        (RedOp::Sum, &sum_at as &dyn Fn(usize) -> f64),
        (RedOp::Max, &max_at),
    ] {
        group(|| {
            for (i, c) in comms.iter().enumerate() {
                c.all_reduce(send[i].view(), recv[i].view(), count, DType::F32, op)?;
            }
            Ok(())
        })
        .map_err(e)?;
        let want: Vec<f64> = (0..count).map(f).collect();
        for i in 0..n {
            close(&read(i)?, &want, &format!("all_reduce {op:?} cuda:{i}"))?;
        }
    }
    // all_gather: rank r's first `per` elements, in rank order
    group(|| {
        for (i, c) in comms.iter().enumerate() {
            c.all_gather(send[i].view(), recv[i].view(), per, DType::F32)?;
        }
        Ok(())
    })
    .map_err(e)?;
    let want: Vec<f64> = (0..count)
        .map(|j| f64::from(inputs[j / per][j % per]))
        .collect();
    for i in 0..n {
        close(&read(i)?, &want, "all_gather")?;
    }
    // reduce_scatter: rank r keeps block r of the sum
    group(|| {
        for (i, c) in comms.iter().enumerate() {
            c.reduce_scatter(send[i].view(), recv[i].view(), per, DType::F32, RedOp::Sum)?;
        }
        Ok(())
    })
    .map_err(e)?;
    for i in 0..n {
        let want: Vec<f64> = (0..per).map(|j| sum_at(i * per + j)).collect();
        close(&read(i)?[..per], &want, "reduce_scatter")?;
    }
    // broadcast from the last rank
    let root = n - 1;
    group(|| {
        for (i, c) in comms.iter().enumerate() {
            c.broadcast(send[i].view(), recv[i].view(), count, DType::F32, root)?;
        }
        Ok(())
    })
    .map_err(e)?;
    let want: Vec<f64> = inputs[root].iter().map(|x| f64::from(*x)).collect();
    for i in 0..n {
        close(&read(i)?, &want, "broadcast")?;
    }
    // alltoall from grouped sends and receives: block p of rank i's output is block i of p's input
    group(|| {
        for (i, c) in comms.iter().enumerate() {
            c.all_to_all(send[i].view(), recv[i].view(), per, DType::F32)?;
        }
        Ok(())
    })
    .map_err(e)?;
    for i in 0..n {
        let want: Vec<f64> = (0..count)
            .map(|j| f64::from(inputs[j / per][i * per + j % per]))
            .collect();
        close(&read(i)?, &want, "alltoall")?;
    }
    // a view too small for the count is refused before NCCL sees it
    check(
        comms[0]
            .all_reduce(
                send[0].view().sub(0, 8).map_err(e)?,
                recv[0].view(),
                count,
                DType::F32,
                RedOp::Sum,
            )
            .is_err(),
        "an undersized buffer must be refused",
    )
}

/// The pattern checker counts exactly the elements that are wrong, in every dtype.
fn pattern_check_counts_wrong_elements() -> Result<(), Failed> {
    use gpukit_cuda::pattern::{value, Expect, Pattern};
    use gpukit_types::DType;
    let g = gpu()?;
    let e = |e: gpukit_cuda::Error| Failed::from(e.to_string());
    let p = Pattern::new(discovery(), &g).map_err(e)?;
    let n = 100_003;
    let buf = g.alloc(n * 4).map_err(e)?;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        p.fill(buf.view(), n, dtype, 3).map_err(e)?;
        let own = Expect::Gathered {
            block: n,
            rank: Some(3),
            offset: 0,
        };
        check(
            p.count_wrong(buf.view(), n, dtype, own).map_err(e)? == 0,
            format!("{dtype}: a fresh fill must match"),
        )?;
        // the host's value() is what the kernel wrote (element 12345, as f32)
        if dtype == DType::F32 {
            let host = f32s(&g.download(&buf).map_err(e)?);
            check(
                (0..n).all(|i| f64::from(host[i]) == value(3, i)),
                "the fill differs from pattern::value",
            )?;
        }
        // two corrupted elements are counted as two
        let w = dtype.size_bytes();
        g.fill(buf.view().sub(17 * w, w).map_err(e)?, 0x7f)
            .map_err(e)?;
        g.fill(buf.view().sub((n - 1) * w, w).map_err(e)?, 0x7f)
            .map_err(e)?;
        let wrong = p.count_wrong(buf.view(), n, dtype, own).map_err(e)?;
        check(wrong == 2, format!("{dtype}: counted {wrong} wrong, not 2"))?;
        // another rank's pattern is all but wrong everywhere
        let other = Expect::Gathered {
            block: n,
            rank: Some(4),
            offset: 0,
        };
        let wrong = p.count_wrong(buf.view(), n, dtype, other).map_err(e)?;
        check(
            wrong > n as u64 / 2,
            format!("{dtype}: rank 4's pattern gave {wrong}"),
        )?;
    }
    Ok(())
}

/// Copies between the first two GPUs arrive byte for byte, with or without peer access.
fn peer_copies_are_byte_exact() -> Result<(), Failed> {
    use gpukit_cuda::transfer::{copy_peer, enable_peer_access};
    let gpus = all_gpus()?;
    let e = |e: gpukit_cuda::Error| Failed::from(e.to_string());
    let (a, b) = (&gpus[0], &gpus[1]);
    let peer = enable_peer_access(a, b).map_err(e)?;
    let host = bytes_of(&random_f32(1 << 20, 77));
    let src = a.upload(&host).map_err(e)?;
    let dst = b.alloc(host.len()).map_err(e)?;
    copy_peer(a.stream(), dst.view(), b, src.view(), a, host.len()).map_err(e)?;
    a.synchronize().map_err(e)?;
    check(
        b.download(&dst).map_err(e)? == host,
        format!("cuda:0 -> cuda:1 (peer access {peer}) changed bytes"),
    )
}

fn library_versions_are_reported() -> Result<(), Failed> {
    for lib in [
        Lib::Cublas,
        Lib::CublasLt,
        Lib::Cudnn,
        Lib::Nvrtc,
        Lib::Nccl,
    ] {
        let v = gpukit_cuda::libs::api_version(discovery(), lib)
            .ok_or_else(|| format!("{} reported no version", lib.name()))?;
        check(
            v.chars().next().is_some_and(|c| c.is_ascii_digit()),
            format!("{}: {v}", lib.name()),
        )?;
        eprintln!("    {}: {v}", lib.name());
        // the copy that loaded must be the copy discovery reported (same major.minor)
        if let Some(file_version) = discovery().found(lib).and_then(|f| f.version.clone()) {
            let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
            check(
                major_minor(&file_version) == major_minor(&v),
                format!(
                    "{}: discovery found {file_version} but the loaded library reports {v}",
                    lib.name()
                ),
            )?;
        }
    }
    Ok(())
}

fn main() {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let mut args = Arguments::from_args();
    // the trials share one device and its memory pool (one of them checks what the pool holds),
    // so they run one at a time
    args.test_threads = Some(1);
    let gpus = DISCOVERY
        .get()
        .and_then(|d| driver::probe(d).ok())
        .map_or(0, |d| d.device_count);
    let tests: Vec<(&str, GpuTest)> = vec![
        (
            "gpu::attributes_agree_with_nvml",
            attributes_agree_with_nvml,
        ),
        (
            "gpu::copies_round_trip_byte_exact",
            copies_round_trip_byte_exact,
        ),
        (
            "gpu::pool_keeps_its_cache_and_gives_it_back_when_needed",
            pool_keeps_its_cache_and_gives_it_back_when_needed,
        ),
        (
            "gpu::event_timing_measures_device_work",
            event_timing_measures_device_work,
        ),
        ("gpu::nvrtc_kernel_matches_cpu", nvrtc_kernel_matches_cpu),
        (
            "gpu::device_repeat_matches_the_host",
            device_repeat_matches_the_host,
        ),
        (
            "gpu::cublas_sgemm_matches_f64_reference",
            cublas_sgemm_matches_f64_reference,
        ),
        (
            "gpu::cudnn_and_nccl_load_and_work",
            cudnn_and_nccl_load_and_work,
        ),
        (
            "gpu::library_versions_are_reported",
            library_versions_are_reported,
        ),
    ];
    let mut tests = tests;
    tests.push((
        "gpu::nccl_collectives_match_float64",
        nccl_collectives_match_float64,
    ));
    tests.push((
        "gpu::pattern_check_counts_wrong_elements",
        pattern_check_counts_wrong_elements,
    ));
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some()))
        .collect();
    if gpus < 2 {
        eprintln!(
            "gpu::nccl_all_reduce_across_every_gpu needs 2 or more GPUs ({gpus} here): ignored"
        );
    }
    trials.push(
        Trial::test(
            "gpu::nccl_all_reduce_across_every_gpu",
            nccl_all_reduce_across_every_gpu,
        )
        .with_ignored_flag(gpus < 2),
    );
    trials.push(
        Trial::test(
            "gpu::peer_copies_are_byte_exact",
            peer_copies_are_byte_exact,
        )
        .with_ignored_flag(gpus < 2),
    );
    libtest_mimic::run(&args, trials).exit();
}
