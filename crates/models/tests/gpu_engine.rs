//! gpukit's GPU inference engine against its CPU forward pass, on fresh random weights and
//! inputs: every precision in both layouts, eager and replayed as a CUDA graph, odd image sizes,
//! with and without the memory plan, no op writing over a live tensor, and out-of-memory as a
//! typed error; also the engine's device-side byte comparison and its classifier kernel.
//! Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a missing GPU a failure.

use gpukit_cuda::loader::Discovery;
use gpukit_cuda::Gpu;
use gpukit_models::forward::{fold, FoldedResNet};
use gpukit_models::gpu::{GpuContext, GpuWeights, Kernels, Session, ENGINE_DTYPES};
use gpukit_models::weights::seeded_init;
use gpukit_models::Error as EngineError;
use gpukit_models::ResNet;
use gpukit_tensor::random::{fresh_seed, uniform_f32};
use gpukit_tensor::{DType, Layout, Tensor};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::OnceLock;

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

fn context() -> Result<GpuContext, Failed> {
    GpuContext::open(DISCOVERY.get().ok_or("no discovery")?, 0).map_err(|e| e.to_string().into())
}

/// `n` random RGB images of `h x w`.
fn images(n: usize, h: usize, w: usize, seed: u64) -> Result<Tensor, Failed> {
    Ok(Tensor::from_f32(
        &[n, 3, h, w],
        uniform_f32(n * 3 * h * w, seed),
    )?)
}

/// max |got - want| / max |want|; infinite when anything is not finite or shapes differ.
fn rel(got: &Tensor, want: &Tensor) -> f64 {
    let (Ok(got), Ok(want)) = (got.to_vec_f32(), want.to_vec_f32()) else {
        return f64::INFINITY;
    };
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let diff = got.iter().zip(&want).fold(0f64, |m, (a, b)| {
        m.max((f64::from(*a) - f64::from(*b)).abs())
    });
    diff / scale.max(f64::MIN_POSITIVE)
}

fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-4,
        DType::Tf32 | DType::F16 => 2e-2,
        _ => 6e-2,
    }
}

fn model(m: ResNet, classes: usize, seed: u64) -> Result<FoldedResNet, Failed> {
    Ok(fold(&seed_dict(m, classes, seed))?)
}

fn seed_dict(m: ResNet, classes: usize, seed: u64) -> gpukit_models::weights::StateDict {
    seeded_init(m, classes, seed, true)
}

fn every_strategy_matches_cpu() -> Result<(), Failed> {
    let ctx = context()?;
    let seed = fresh_seed();
    let folded = model(ResNet::R18, 10, seed)?;
    for (n, h, w) in [(3, 64, 64), (2, 67, 45)] {
        let x = images(n, h, w, seed ^ 0x55)?;
        let x2 = images(n, h, w, seed ^ 0xaa)?;
        let want = folded.forward_cpu(&x)?;
        let want2 = folded.forward_cpu(&x2)?;
        for p in ENGINE_DTYPES {
            for layout in Layout::ALL {
                let what = format!("{p} {layout} {n}x{h}x{w} seed {seed}");
                let weights = GpuWeights::upload(&ctx, &folded, p, layout)?;
                let mut s = Session::new(&ctx, &weights, n, h, w, true)?;
                let got = s.run(&x)?;
                let e = rel(&got, &want);
                eprintln!("{what}: eager rel {e:.2e}");
                if e > tolerance(p) {
                    return Err(format!("{what}: rel error {e:.3e} > {}", tolerance(p)).into());
                }
                // a graph captured once, replayed on a new input, gives what eager gives
                s.capture()?;
                s.set_input(&x2)?;
                s.replay()?;
                let replayed = s.logits()?;
                let eager = s.run(&x2)?;
                let g = rel(&replayed, &eager);
                let c = rel(&replayed, &want2);
                if g > 1e-6 || c > tolerance(p) {
                    return Err(format!(
                        "{what}: graph replay differs from eager by {g:.3e}, from the CPU by {c:.3e}"
                    )
                    .into());
                }
            }
        }
    }
    Ok(())
}

fn resnet50_fp32_matches_cpu_at_224() -> Result<(), Failed> {
    let ctx = context()?;
    let seed = fresh_seed();
    let folded = model(ResNet::R50, 1000, seed)?;
    let (n, h, w) = (2, 224, 224);
    let x = images(n, h, w, seed)?;
    let want = folded.forward_cpu(&x)?;
    for layout in Layout::ALL {
        let weights = GpuWeights::upload(&ctx, &folded, DType::F32, layout)?;
        let mut s = Session::new(&ctx, &weights, n, h, w, true)?;
        let e = rel(&s.run(&x)?, &want);
        eprintln!("resnet50 fp32 {layout}: rel {e:.2e}");
        if e > 1e-4 {
            return Err(format!("ResNet-50 fp32 {layout}: rel error {e:.3e} > 1e-4").into());
        }
    }
    Ok(())
}

fn memory_plan_saves_memory_and_changes_nothing() -> Result<(), Failed> {
    let ctx = context()?;
    let seed = fresh_seed();
    let folded = model(ResNet::R50, 1000, seed)?;
    let (n, h, w) = (4, 224, 224);
    let x = images(n, h, w, seed)?;
    // f32: two sessions may measure different algorithms fastest, which in f16 changes the
    // rounding; in f32 only the summation order differs
    let weights = GpuWeights::upload(&ctx, &folded, DType::F32, Layout::Nhwc)?;
    let mut planned = Session::new(&ctx, &weights, n, h, w, true)?;
    // blocks write over their shortcut unless the planning-time check found an engine that
    // cannot (then the note says why and the plan keeps them apart)
    match (&planned.in_place_note, planned.memory.in_place) {
        (None, true) => eprintln!("outputs written over their shortcuts (checked)"),
        (Some(why), false) => eprintln!("outputs kept apart from their shortcuts: {why}"),
        other => return Err(format!("in-place state inconsistent: {other:?}").into()),
    }
    let a = planned.run(&x)?;
    let (with, without) = (
        planned.memory.arena_bytes,
        planned.memory.arena_bytes_without_plan,
    );
    drop(planned);
    let mut unplanned = Session::new(&ctx, &weights, n, h, w, false)?;
    let b = unplanned.run(&x)?;
    eprintln!("arena {with} bytes with the plan, {without} without");
    if with * 2 > without {
        return Err(format!("the plan saves too little: {with} vs {without} bytes").into());
    }
    if unplanned.memory.arena_bytes != without {
        return Err("the unplanned arena is not the sum of the buffers".into());
    }
    if rel(&a, &b) > 1e-5 {
        return Err(format!(
            "logits differ with and without the plan: {:.3e}",
            rel(&a, &b)
        )
        .into());
    }
    Ok(())
}

/// The memory plan and in-place writes never change a tensor that is still to be read: around
/// every op, each live tensor other than its output keeps its bytes (both layouts, fp16).
fn no_op_changes_a_live_tensor() -> Result<(), Failed> {
    let ctx = context()?;
    let seed = fresh_seed();
    let folded = model(ResNet::R50, 10, seed)?;
    for layout in Layout::ALL {
        let weights = GpuWeights::upload(&ctx, &folded, DType::F16, layout)?;
        let mut s = Session::new(&ctx, &weights, 2, 64, 64, true)?;
        s.set_input(&images(2, 64, 64, seed)?)?;
        let found = s.find_clobbers()?;
        if !found.is_empty() {
            return Err(format!("fp16 {layout} seed {seed}: {}", found.join("; ")).into());
        }
    }
    Ok(())
}

fn out_of_memory_is_a_typed_error() -> Result<(), Failed> {
    let ctx = context()?;
    let folded = model(ResNet::R18, 10, 1)?;
    let weights = GpuWeights::upload(&ctx, &folded, DType::F32, Layout::Nchw)?;
    match Session::new(&ctx, &weights, 1_000_000, 224, 224, true) {
        Err(EngineError::OutOfMemory {
            requested_mib,
            free_mib,
            ..
        }) if requested_mib > free_mib => Ok(()),
        Err(e) => Err(format!("expected out-of-memory, got: {e}").into()),
        Ok(_) => Err("a batch of a million 224x224 images fitted".into()),
    }
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

/// A seed that differs from run to run (the time), printed by the failures that use it.
fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64)
}

/// A buffer filled by repeating its first bytes on the device holds the host's periodic
/// pattern (an odd period over an odd length), and the device's byte comparison finds one
/// changed byte anywhere: in a 32-bit word, and in the tail past the last whole word.
fn device_repeat_and_compare_match_the_host() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let g = Gpu::open(discovery, 0).map_err(|e| format!("open cuda:0: {e}"))?;
    let e = |e: gpukit_cuda::Error| e.to_string();
    let kernels = Kernels::new(discovery, &g).map_err(e)?;
    let period = 1_000_003usize;
    let total = 10 * period + 7;
    let block = bytes_of(&gpukit_tensor::random::uniform_f32(
        period.div_ceil(4),
        gpukit_tensor::random::fresh_seed(),
    ));
    let block = &block[..period];
    let want: Vec<u8> = (0..total).map(|i| block[i % period]).collect();
    let dev = g.alloc(total).map_err(e)?;
    g.upload_into(dev.view(), block).map_err(e)?;
    g.repeat_prefix(dev.view(), period).map_err(e)?;
    let got = g.download(&dev).map_err(e)?;
    check(
        got == want,
        "the repeated prefix differs from the host's pattern",
    )?;
    let copy = g.upload(&want).map_err(e)?;
    check(
        kernels
            .equal_bytes(&g, dev.view(), copy.view(), total)
            .map_err(e)?,
        "equal buffers compared unequal",
    )?;
    let seed = time_seed();
    for at in [seed as usize % (total - 8), total - 1, total - 3, 0] {
        let mut changed = want.clone();
        changed[at] ^= 0x10;
        let other = g.upload(&changed).map_err(e)?;
        check(
            !kernels
                .equal_bytes(&g, dev.view(), other.view(), total)
                .map_err(e)?,
            format!("a byte changed at {at} of {total} (seed {seed}) compared equal"),
        )?;
        // the bytes before the change compare equal
        if at > 0 {
            check(
                kernels
                    .equal_bytes(&g, dev.view(), other.view(), at)
                    .map_err(e)?,
                format!("the {at} bytes before a change compared unequal"),
            )?;
        }
    }
    Ok(())
}

/// The classifier kernel against float64 on fresh random inputs: one row and many, both ways it
/// runs (a warp an output up to 4 rows, a block of 32 outputs beyond; a last block of rows part
/// empty), outputs not a multiple of a block's, features not a multiple of 4 or 128, and inputs
/// that are not 16-byte aligned (one value at a time).
fn classifier_kernel_matches_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let g = Gpu::open(discovery, 0).map_err(|e| format!("open cuda:0: {e}"))?;
    let e = |e: gpukit_cuda::Error| e.to_string();
    let kernels = Kernels::new(discovery, &g).map_err(e)?;
    let seed = fresh_seed();
    let shapes = [
        (1, 1000, 2048, 0),
        (3, 37, 130, 0),
        (4, 33, 132, 4),
        (5, 33, 132, 4),
        (8, 1000, 2048, 0),
        (9, 1000, 2048, 0),
        (20, 1000, 2048, 0),
        (64, 1000, 512, 0),
        (65, 10, 2048, 0),
        (256, 1000, 2048, 0),
        (300, 33, 132, 4),
    ];
    for (i, (n, k, c, skew)) in shapes.into_iter().enumerate() {
        let s = seed ^ (i as u64 * 0x9e37);
        let x = gpukit_tensor::random::uniform_f32(n * c, s);
        let w = gpukit_tensor::random::uniform_f32(k * c, s ^ 1);
        let b = gpukit_tensor::random::uniform_f32(k, s ^ 2);
        // `skew` bytes before x and w: rows no longer 16-byte aligned
        let pad = vec![0u8; skew];
        let xd = g.upload(&[pad.clone(), bytes_of(&x)].concat()).map_err(e)?;
        let wd = g.upload(&[pad, bytes_of(&w)].concat()).map_err(e)?;
        let bd = g.upload(&bytes_of(&b)).map_err(e)?;
        let yd = g.alloc(n * k * 4).map_err(e)?;
        let xv = xd.view().sub(skew, n * c * 4).map_err(e)?;
        let wv = wd.view().sub(skew, k * c * 4).map_err(e)?;
        kernels
            .classify(xv, wv, bd.view(), yd.view(), (n, k, c))
            .map_err(e)?;
        let got: Vec<f32> = g
            .download(&yd)
            .map_err(e)?
            .chunks_exact(4)
            .map(|q| f32::from_ne_bytes([q[0], q[1], q[2], q[3]]))
            .collect();
        let (mut diff, mut scale) = (0f64, 0f64);
        for r in 0..n {
            for o in 0..k {
                let want = f64::from(b[o])
                    + (0..c)
                        .map(|j| f64::from(x[r * c + j]) * f64::from(w[o * c + j]))
                        .sum::<f64>();
                diff = diff.max((f64::from(got[r * k + o]) - want).abs());
                scale = scale.max(want.abs());
            }
        }
        let rel = diff / scale.max(f64::MIN_POSITIVE);
        eprintln!("classify {n}x{c} -> {k} (skew {skew}): rel {rel:.2e}");
        check(
            rel <= 1e-5,
            format!("classify {n}x{c} -> {k} (skew {skew}, seed {seed}): rel error {rel:.3e}"),
        )?;
    }
    Ok(())
}

fn main() {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    type GpuTest = fn() -> Result<(), Failed>;
    let tests: Vec<(&str, GpuTest)> = vec![
        (
            "gpu::every_strategy_matches_cpu",
            every_strategy_matches_cpu,
        ),
        (
            "gpu::resnet50_fp32_matches_cpu_at_224",
            resnet50_fp32_matches_cpu_at_224,
        ),
        (
            "gpu::memory_plan_saves_memory_and_changes_nothing",
            memory_plan_saves_memory_and_changes_nothing,
        ),
        (
            "gpu::no_op_changes_a_live_tensor",
            no_op_changes_a_live_tensor,
        ),
        (
            "gpu::out_of_memory_is_a_typed_error",
            out_of_memory_is_a_typed_error,
        ),
        (
            "gpu::device_repeat_and_compare_match_the_host",
            device_repeat_and_compare_match_the_host,
        ),
        (
            "gpu::classifier_kernel_matches_float64",
            classifier_kernel_matches_float64,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some()))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
