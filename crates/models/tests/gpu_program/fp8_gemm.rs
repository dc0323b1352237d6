//! gpukit's fp8 product on Hopper's warpgroup MMA against float64: random E4M3 operands (K
//! contiguous), at sizes no tile divides and at one the tiles fill, over an output filled with
//! NaN first, so a value the kernel does not write shows. Needs compute capability 9.0 (the
//! module is built for sm_90a alone): elsewhere the test fails saying so rather than pass.

use super::DISCOVERY;
use gpukit_models::gpu::program::kernels::fp8_gemm::{Fp8Gemm, Variant};
use gpukit_models::gpu::GpuContext;
use gpukit_tensor::codec::{decode_f64, encode_f32};
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::DType;
use libtest_mimic::Failed;

pub(super) fn fp8_gemm_matches_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let cc = ctx.gpu.compute_capability()?;
    let Some(kernel) = Fp8Gemm::new(discovery, &ctx.gpu)? else {
        return Err(format!(
            "the fp8 product is built for compute capability 9.0; this GPU is {}.{}",
            cc.0, cc.1
        )
        .into());
    };
    let mut failures = Vec::new();
    // the pipelined kernel's stages hold 128 bytes of K: k 64 and 1040 end mid-stage, 1040 with
    // a stage of one 16-byte chunk; 300 x 260 leaves partial tiles both ways
    for (variant, m, n, k) in [
        (Variant::Simple, 100, 200, 256),
        (Variant::Simple, 128, 256, 64),
        (Variant::Simple, 64, 128, 1024),
        (Variant::Simple, 7, 130, 128),
        (Variant::Pipelined, 100, 200, 256),
        (Variant::Pipelined, 128, 256, 64),
        (Variant::Pipelined, 300, 260, 1040),
        (Variant::Pipelined, 7, 130, 128),
        (Variant::Pipelined, 256, 128, 2048),
    ] {
        let seed = fresh_seed();
        // values of a few units: E4M3 keeps 3 bits of mantissa, the products are exact in f32
        let a = encode_f32(&normal_f32(m * k, seed), DType::F8E4M3);
        let b = encode_f32(&normal_f32(n * k, seed + 1), DType::F8E4M3);
        let (av, bv) = (decode_f64(&a, DType::F8E4M3), decode_f64(&b, DType::F8E4M3));
        let scale = 0.5f32;
        let (da, db) = (ctx.gpu.upload(&a)?, ctx.gpu.upload(&b)?);
        let d = ctx.gpu.alloc(m * n * 4)?;
        ctx.gpu.fill(d.view(), 0xff)?;
        kernel.run(
            ctx.gpu.stream(),
            variant,
            da.view(),
            db.view(),
            d.view(),
            (m, n, k),
            scale,
        )?;
        ctx.gpu.synchronize()?;
        let got = decode_f64(&ctx.gpu.download(&d)?, DType::F32);
        let mut want = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|t| av[i * k + t] * bv[j * k + t]).sum();
                want[i * n + j] = s * f64::from(scale);
            }
        }
        let top = want.iter().fold(0f64, |x, v| x.max(v.abs())).max(1e-30);
        let (worst, at) = got
            .iter()
            .zip(&want)
            .enumerate()
            .map(|(i, (g, w))| {
                if g.is_finite() {
                    ((g - w).abs() / top, i)
                } else {
                    (f64::INFINITY, i)
                }
            })
            .fold((0f64, 0), |x, y| if y.0 > x.0 { y } else { x });
        // Hopper's fp8 MMA adds its products with fewer bits than f32 keeps (about 14, as
        // DeepSeek-V3's report measured): a layout error shows as an O(1) difference instead
        eprintln!(
            "    fp8 {variant:?} {m}x{n}x{k} (seed {seed}): max |diff| / max |ref| {worst:.1e}"
        );
        if worst > 5e-3 {
            failures.push(format!(
                "{variant:?} {m}x{n}x{k} (seed {seed}): {worst:.1e} at row {} column {} (got {}, want {})",
                at / n,
                at % n,
                got[at],
                want[at]
            ));
        }
    }
    if failures.is_empty() {
        // its rate at one large shape, for the record beside `gpukit bench matmul --dtype fp8`
        // (cuBLASLt's fp8 product); no bound is asserted on speed
        let (m, n, k) = (4096, 4096, 4096);
        let a = ctx
            .gpu
            .upload(&encode_f32(&normal_f32(m * k, fresh_seed()), DType::F8E4M3))?;
        let b = ctx
            .gpu
            .upload(&encode_f32(&normal_f32(n * k, fresh_seed()), DType::F8E4M3))?;
        // each variant's rate, and the pipelined product against the simple one at this size
        // (many stages; the float64 reference above covers the small shapes)
        let mut outs = Vec::new();
        for variant in [Variant::Simple, Variant::Pipelined] {
            let d = ctx.gpu.alloc(m * n * 4)?;
            let run = || {
                kernel.run(
                    ctx.gpu.stream(),
                    variant,
                    a.view(),
                    b.view(),
                    d.view(),
                    (m, n, k),
                    1.0,
                )
            };
            run()?;
            let stream = ctx.gpu.stream();
            let start = stream.record_timed()?;
            const REPS: usize = 10;
            for _ in 0..REPS {
                run()?;
            }
            let end = stream.record_timed()?;
            end.synchronize()?;
            let ms = start.elapsed_ms(&end)? / REPS as f64;
            eprintln!(
                "    fp8 {variant:?} {m}x{n}x{k}: {ms:.3} ms a product, {:.0} TFLOP/s",
                2.0 * (m * n * k) as f64 / ms / 1e9
            );
            outs.push(decode_f64(&ctx.gpu.download(&d)?, DType::F32));
        }
        let top = outs[0].iter().fold(0f64, |x, v| x.max(v.abs())).max(1e-30);
        let apart = outs[0]
            .iter()
            .zip(&outs[1])
            .map(|(x, y)| {
                if y.is_finite() {
                    (x - y).abs() / top
                } else {
                    f64::INFINITY
                }
            })
            .fold(0f64, f64::max);
        eprintln!("    fp8 {m}x{n}x{k}: pipelined against simple, max |diff| / max {apart:.1e}");
        if apart > 1e-3 {
            failures.push(format!(
                "{m}x{n}x{k}: the pipelined product differs from the simple one by {apart:.1e}"
            ));
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}
