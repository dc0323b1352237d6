//! The channel-last depthwise kernels against float64: the launcher's choice with an epilogue,
//! and each kernel that runs a shape (timed with `GPUKIT_DW_TIMINGS=1`).

use super::{download, kernel_tolerance, kernels_timed, rel, upload, DISCOVERY};
use gpukit_cuda::DeviceBuffer;
use gpukit_models::gpu::program::ProgramKernels;
use gpukit_models::gpu::GpuContext;
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::{ConvShape, DType};
use libtest_mimic::Failed;

/// A depthwise convolution of `c` channels, an `f` x `f` filter of stride `stride` and
/// padding `f / 2`, over `n` images of `h` x `h`.
fn depthwise_strided(n: usize, c: usize, h: usize, f: usize, stride: usize) -> ConvShape {
    ConvShape {
        stride,
        ..depthwise_shape(n, c, h, f)
    }
}

/// A depthwise convolution of `c` channels, an `f` x `f` filter of stride 1 and the padding
/// that keeps the size, over `n` images of `h` x `h`.
fn depthwise_shape(n: usize, c: usize, h: usize, f: usize) -> ConvShape {
    ConvShape {
        n,
        c,
        h,
        w: h,
        k: c,
        r: f,
        s: f,
        stride: 1,
        pad: f / 2,
        groups: c,
    }
}

/// A depthwise convolution's operands for `shape` on the device, drawn from `seed`: x, the
/// taps (scaled by the filter's side) and a bias, each with the values rounded to `dtype`.
#[allow(clippy::type_complexity)]
fn depthwise_operands(
    ctx: &GpuContext,
    shape: &ConvShape,
    dtype: DType,
    seed: u64,
) -> Result<
    (
        (DeviceBuffer, Vec<f64>),
        (DeviceBuffer, Vec<f64>),
        (DeviceBuffer, Vec<f64>),
    ),
    Failed,
> {
    let (c, f) = (shape.c, shape.r);
    let x = upload(
        ctx,
        &normal_f32(shape.n * c * shape.h * shape.w, seed),
        dtype,
    )?;
    let taps: Vec<f32> = normal_f32(f * f * c, seed + 1)
        .iter()
        .map(|v| v / f as f32)
        .collect();
    let taps = upload(ctx, &taps, dtype)?;
    let bias = upload(ctx, &normal_f32(c, seed + 2), dtype)?;
    Ok((x, taps, bias))
}

/// `conv(x, taps) + bias` of depthwise `shape` in float64, channel-last (x `[n, h, w, c]`, taps
/// `[r, s, c]`), padding `shape.pad` on every side.
fn depthwise_float64(shape: &ConvShape, xs: &[f64], ts: &[f64], bs: &[f64]) -> Vec<f64> {
    let (c, h, w, f, pad) = (shape.c, shape.h, shape.w, shape.r, shape.pad as isize);
    let (p, q) = (shape.out_h(), shape.out_w());
    let mut out = Vec::with_capacity(shape.n * p * q * c);
    for o in 0..shape.n * p * q * c {
        let (px, ch) = (o / c, o % c);
        let (img, i, j) = (px / (p * q), px / q % p, px % q);
        let mut s = bs[ch];
        for di in 0..f {
            for dj in 0..f {
                let yy = (i * shape.stride + di) as isize - pad;
                let xx = (j * shape.stride + dj) as isize - pad;
                if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                    continue;
                }
                let at = ((img * h + yy as usize) * w + xx as usize) * c + ch;
                s += xs[at] * ts[(di * f + dj) * c + ch];
            }
        }
        out.push(s);
    }
    out
}

/// The channel-last depthwise kernels against float64 where each runs: rows of outputs a
/// thread (four at batch 8), tiles in shared memory (batch 1 to 4: maps a tile wide and not,
/// channels not a whole group of a block) and an output a thread (f32's larger maps), 3x3, 5x5
/// and 7x7 filters, with bias, a residual and SiLU.
pub(super) fn depthwise_matches_float64() -> Result<(), Failed> {
    use gpukit_models::graph::Activation;
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let k = ProgramKernels::new(discovery, &ctx.gpu)?;
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for (n, c, h, f, stride, residual) in [
            (8, 96, 56, 7, 1, false),
            (1, 96, 56, 7, 1, true),
            (1, 384, 14, 7, 1, false),
            (8, 144, 28, 3, 1, true),
            (1, 240, 28, 5, 1, false),
            (2, 12, 9, 3, 1, false),
            (1, 768, 7, 7, 1, true),
            (1, 40, 13, 3, 1, true),
            (4, 24, 10, 5, 1, false),
            (4, 24, 11, 3, 2, true),
            (2, 40, 14, 5, 2, false),
        ] {
            let shape = depthwise_strided(n, c, h, f, stride);
            let seed = fresh_seed();
            let len = n * c * shape.out_h() * shape.out_w();
            let ((x, xs), (taps, ts), (bias, bs)) = depthwise_operands(&ctx, &shape, dtype, seed)?;
            let (z, zs) = upload(&ctx, &normal_f32(len, seed + 3), dtype)?;
            let want: Vec<f32> = depthwise_float64(&shape, &xs, &ts, &bs)
                .iter()
                .zip(&zs)
                .map(|(s, zo)| {
                    let s = s + if residual { *zo } else { 0.0 };
                    (s / (1.0 + (-s).exp())) as f32
                })
                .collect();
            let y = ctx.gpu.alloc(len * dtype.storage().size_bytes())?;
            k.depthwise(
                dtype,
                &shape,
                x.view(),
                taps.view(),
                Some(bias.view()),
                residual.then(|| z.view()),
                Some(Activation::Silu),
                y.view(),
            )?;
            let r = rel(&download(&ctx, &y, dtype)?, &want);
            if r > kernel_tolerance(dtype) {
                failures.push(format!(
                    "{dtype} {n}x{c}x{h}x{h} {f}x{f} stride {stride} residual {residual} \
                     (seed {seed}): {r:.1e}"
                ));
            }
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}

/// Every depthwise kernel that runs a shape, and the one the launcher's rule chooses, against
/// float64, at ConvNeXt-T's, MobileNetV3's and EfficientNet's shapes (batch 1 and 32, stride 1
/// and 2) in f16; with `GPUKIT_DW_TIMINGS=1`, each one's device time too (graphs of launches
/// replayed in turns), as the engine's planning times them.
pub(super) fn depthwise_variants_agree() -> Result<(), Failed> {
    use gpukit_models::gpu::program::kernels::depthwise_variants;
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let k = ProgramKernels::new(discovery, &ctx.gpu)?;
    let timings = std::env::var("GPUKIT_DW_TIMINGS").is_ok_and(|v| v == "1");
    let dtype = DType::F16;
    let mut failures = Vec::new();
    // ConvNeXt-T's, then MobileNetV3-L's and EfficientNet-B0's at batch 32 (stride 2 too, odd
    // maps), and a batch of 3 with odd maps and channels
    for (n, c, h, f, stride) in [
        (32, 96, 56, 7, 1),
        (32, 192, 28, 7, 1),
        (32, 384, 14, 7, 1),
        (32, 768, 7, 7, 1),
        (1, 96, 56, 7, 1),
        (1, 192, 28, 7, 1),
        (1, 384, 14, 7, 1),
        (1, 768, 7, 7, 1),
        (32, 72, 56, 3, 1),
        (32, 240, 14, 5, 1),
        (32, 16, 112, 3, 1),
        (32, 64, 112, 3, 2),
        (32, 72, 56, 5, 2),
        (32, 120, 28, 5, 1),
        (32, 672, 14, 5, 2),
        (32, 960, 7, 5, 1),
        (32, 32, 112, 3, 1),
        (32, 96, 112, 3, 2),
        (32, 144, 56, 5, 2),
        (32, 480, 14, 3, 1),
        (32, 1152, 7, 5, 1),
        (3, 24, 13, 3, 2),
        (3, 40, 15, 5, 2),
        (3, 8, 9, 5, 1),
    ] {
        let shape = depthwise_strided(n, c, h, f, stride);
        let seed = fresh_seed();
        let len = n * c * shape.out_h() * shape.out_w();
        let ((x, xs), (taps, ts), (bias, bs)) = depthwise_operands(&ctx, &shape, dtype, seed)?;
        let float64: Vec<f32> = depthwise_float64(&shape, &xs, &ts, &bs)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let bytes = len * dtype.storage().size_bytes();
        let (want, got) = (ctx.gpu.alloc(bytes)?, ctx.gpu.alloc(bytes)?);
        let run = |variant: Option<&str>, y: &DeviceBuffer| {
            let (x, t, b, y) = (x.view(), taps.view(), Some(bias.view()), y.view());
            match variant {
                Some(v) => k.depthwise_variant(v, dtype, &shape, x, t, b, None, None, y),
                None => k.depthwise(dtype, &shape, x, t, b, None, None, y),
            }
        };
        run(None, &want)?;
        let chosen = rel(&download(&ctx, &want, dtype)?, &float64);
        if chosen > kernel_tolerance(dtype) {
            failures.push(format!(
                "the chosen kernel {n}x{c}x{h}x{h} {f}x{f} stride {stride} (seed {seed}): \
                 {chosen:.1e}"
            ));
        }
        let mut runs = Vec::new();
        for v in depthwise_variants() {
            if run(Some(v), &got).is_err() {
                continue; // it does not take this shape
            }
            let r = rel(&download(&ctx, &got, dtype)?, &float64);
            if r > kernel_tolerance(dtype) {
                failures.push(format!(
                    "{v} {n}x{c}x{h}x{h} {f}x{f} stride {stride} (seed {seed}): {r:.1e}"
                ));
            }
            runs.push(v);
        }
        if timings {
            let row = kernels_timed(&ctx, &runs, "depthwise_", |v| run(Some(v), &got))?;
            println!("dw timing {n}x{c}x{h}x{h} {f}x{f} s{stride} us: {row}");
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}
