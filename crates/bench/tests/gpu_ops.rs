//! GPU operations against CPU references, on fresh random inputs: cuBLAS and cuBLASLt at
//! non-square shapes for every dtype, cuDNN convolution in both layouts, and copies (staged ones
//! at sizes that are not a multiple of the chunk). Ignored, with the reason, without a GPU;
//! GPUKIT_REQUIRE_GPU=1 makes a missing GPU a failure.

use gpukit_bench::cpu::{self, ConvShape, Layout};
use gpukit_bench::random::{fill_bytes, fresh_seed, uniform_f32};
use gpukit_cuda::blas::{Blas, GemmType};
use gpukit_cuda::dnn::{ConvDims, ConvType, Dnn};
use gpukit_cuda::driver::Gpu;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::transfer::{copy_d2d, copy_d2h, copy_h2d, h2d_staged, PinnedBytes};
use half::{bf16, f16};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::OnceLock;

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

fn gpu() -> Result<Gpu, Failed> {
    Gpu::open(DISCOVERY.get().ok_or("no discovery")?, 0).map_err(|e| e.to_string().into())
}

use gpukit_bench::matmul::to_storage as encode;

fn decode(ty: GemmType, b: &[u8]) -> Vec<f64> {
    match ty {
        GemmType::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
            .collect(),
        GemmType::F32 | GemmType::Tf32 => b
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        GemmType::F16 => b
            .chunks_exact(2)
            .map(|c| f64::from(f16::from_ne_bytes([c[0], c[1]]).to_f32()))
            .collect(),
        GemmType::Bf16 => b
            .chunks_exact(2)
            .map(|c| f64::from(bf16::from_ne_bytes([c[0], c[1]]).to_f32()))
            .collect(),
    }
}

fn rel(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    if got.iter().any(|g| !g.is_finite()) {
        f64::INFINITY
    } else {
        (num / den).sqrt()
    }
}

fn gemm_all_types_non_square() -> Result<(), Failed> {
    let g = gpu()?;
    let blas = Blas::new(DISCOVERY.get().ok_or("no discovery")?, &g).map_err(|e| e.to_string())?;
    let (m, n, k) = (67usize, 129usize, 255usize);
    for (ty, tol) in [
        (GemmType::F64, 1e-13),
        (GemmType::F32, 2e-6),
        (GemmType::Tf32, 3e-3),
        (GemmType::F16, 3e-3),
        (GemmType::Bf16, 1.5e-2),
    ] {
        let seed = fresh_seed();
        let a = encode(ty, &uniform_f32(m * k, seed ^ 1));
        let b = encode(ty, &uniform_f32(k * n, seed ^ 2));
        let (af, bf) = (decode(ty, &a), decode(ty, &b));
        let mut want = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| af[i * k + p] * bf[p * n + j]).sum();
            }
        }
        let ad = g.upload(&a).map_err(|e| e.to_string())?;
        let bd = g.upload(&b).map_err(|e| e.to_string())?;
        let mut cd = g
            .upload(&vec![0xFFu8; m * n * ty.elem_bytes()])
            .map_err(|e| e.to_string())?;
        blas.gemm(ty, &ad, &bd, &mut cd, (m, n, k))
            .map_err(|e| e.to_string())?;
        let err = rel(
            &decode(ty, &g.download(&cd).map_err(|e| e.to_string())?),
            &want,
        );
        if err > tol {
            return Err(format!(
                "cuBLAS {ty:?}: relative error {err:.2e} > {tol:.0e} (seed {seed})"
            )
            .into());
        }
        let plans = blas
            .lt_candidates(ty, m, n, k, 4)
            .map_err(|e| e.to_string())?;
        if plans.is_empty() {
            return Err(format!("cuBLASLt offered no algorithm for {ty:?}").into());
        }
        for plan in &plans {
            let mut cd = g
                .upload(&vec![0xFFu8; m * n * ty.elem_bytes()])
                .map_err(|e| e.to_string())?;
            blas.gemm_lt(plan, &ad, &bd, &mut cd)
                .map_err(|e| e.to_string())?;
            let err = rel(
                &decode(ty, &g.download(&cd).map_err(|e| e.to_string())?),
                &want,
            );
            if err > tol {
                return Err(format!(
                    "cuBLASLt #{} {ty:?}: relative error {err:.2e} > {tol:.0e}",
                    plan.rank
                )
                .into());
            }
        }
    }
    Ok(())
}

fn f32_gemm_is_not_tf32() -> Result<(), Failed> {
    // With k large, TF32's input rounding (about 3e-4 relative) is far above true f32's error.
    let g = gpu()?;
    let blas = Blas::new(DISCOVERY.get().ok_or("no discovery")?, &g).map_err(|e| e.to_string())?;
    let (m, n, k) = (64usize, 64usize, 4096usize);
    let seed = fresh_seed();
    let a = encode(GemmType::F32, &uniform_f32(m * k, seed ^ 3));
    let b = encode(GemmType::F32, &uniform_f32(k * n, seed ^ 4));
    let (af, bf) = (decode(GemmType::F32, &a), decode(GemmType::F32, &b));
    let want: Vec<f64> = (0..m * n)
        .map(|ij| {
            (0..k)
                .map(|p| af[(ij / n) * k + p] * bf[p * n + ij % n])
                .sum()
        })
        .collect();
    let ad = g.upload(&a).map_err(|e| e.to_string())?;
    let bd = g.upload(&b).map_err(|e| e.to_string())?;
    let mut errs = Vec::new();
    for ty in [GemmType::F32, GemmType::Tf32] {
        let mut cd = g.alloc(m * n * 4).map_err(|e| e.to_string())?;
        blas.gemm(ty, &ad, &bd, &mut cd, (m, n, k))
            .map_err(|e| e.to_string())?;
        errs.push(rel(
            &decode(ty, &g.download(&cd).map_err(|e| e.to_string())?),
            &want,
        ));
    }
    if errs[0] < 1e-5 && errs[1] > 3.0 * errs[0] {
        Ok(())
    } else {
        Err(format!(
            "f32 error {:.2e}, tf32 error {:.2e}: f32 must be true f32",
            errs[0], errs[1]
        )
        .into())
    }
}

fn cudnn_conv_matches_cpu() -> Result<(), Failed> {
    let g = gpu()?;
    let dnn = Dnn::new(DISCOVERY.get().ok_or("no discovery")?, &g).map_err(|e| e.to_string())?;
    let shapes = [
        ConvShape {
            n: 2,
            c: 16,
            h: 13,
            w: 11,
            k: 24,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
        },
        ConvShape {
            n: 3,
            c: 8,
            h: 17,
            w: 17,
            k: 32,
            r: 3,
            s: 3,
            stride: 2,
            pad: 1,
        },
        ConvShape {
            n: 2,
            c: 64,
            h: 7,
            w: 7,
            k: 16,
            r: 1,
            s: 1,
            stride: 1,
            pad: 0,
        },
        ConvShape {
            n: 1,
            c: 3,
            h: 32,
            w: 32,
            k: 16,
            r: 7,
            s: 7,
            stride: 2,
            pad: 3,
        },
    ];
    for sh in shapes {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for (ty, tol) in [
                (ConvType::F32, 1e-5),
                (ConvType::Tf32, 3e-3),
                (ConvType::F16, 3e-3),
            ] {
                let seed = fresh_seed();
                let mut x = uniform_f32(sh.input_len(), seed ^ 5);
                let mut w = uniform_f32(sh.weight_len(), seed ^ 6);
                if ty == ConvType::F16 {
                    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
                    w.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
                }
                let mut want = vec![0f32; sh.output_len()];
                cpu::conv2d_f32(&sh, layout, &x, &w, &mut want);
                let enc = |v: &[f32]| -> Vec<u8> {
                    if ty == ConvType::F16 {
                        encode(GemmType::F16, v)
                    } else {
                        encode(GemmType::F32, v)
                    }
                };
                let xd = g.upload(&enc(&x)).map_err(|e| e.to_string())?;
                let wd = g.upload(&enc(&w)).map_err(|e| e.to_string())?;
                let mut yd = g
                    .upload(&vec![0xFFu8; sh.output_len() * ty.elem_bytes()])
                    .map_err(|e| e.to_string())?;
                let dims = ConvDims {
                    n: sh.n,
                    c: sh.c,
                    h: sh.h,
                    w: sh.w,
                    k: sh.k,
                    r: sh.r,
                    s: sh.s,
                    stride: sh.stride,
                    pad: sh.pad,
                    nhwc: layout == Layout::Nhwc,
                };
                let plan = dnn
                    .plan_conv(dims, ty, &xd, &wd, &mut yd)
                    .map_err(|e| e.to_string())?;
                g.stream
                    .memcpy_htod(&vec![0xFFu8; yd.len()], &mut yd)
                    .map_err(|e| e.to_string())?;
                dnn.conv_forward(&plan, &xd, &wd, &mut yd)
                    .map_err(|e| e.to_string())?;
                let got = decode(
                    if ty == ConvType::F16 {
                        GemmType::F16
                    } else {
                        GemmType::F32
                    },
                    &g.download(&yd).map_err(|e| e.to_string())?,
                );
                let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
                let err = rel(&got, &want64);
                if err > tol {
                    return Err(format!(
                        "{sh:?} {layout:?} {ty:?} ({}): relative error {err:.2e} > {tol:.0e}",
                        plan.algo_name
                    )
                    .into());
                }
            }
        }
    }
    Ok(())
}

fn copies_are_byte_exact_at_odd_sizes() -> Result<(), Failed> {
    let g = gpu()?;
    for bytes in [1usize, 4095, (3 << 20) + 13] {
        let mut src = vec![0u8; bytes];
        fill_bytes(&mut src, fresh_seed());
        let mut staging = [
            PinnedBytes::new(&g, 1 << 20, true).map_err(|e| e.to_string())?,
            PinnedBytes::new(&g, 1 << 20, true).map_err(|e| e.to_string())?,
        ];
        let mut d = g.alloc(bytes).map_err(|e| e.to_string())?;
        h2d_staged(
            &g.stream,
            &src,
            &mut d,
            &mut staging,
            &|dst: &mut [u8], s: &[u8]| dst.copy_from_slice(s),
        )
        .map_err(|e| e.to_string())?;
        g.stream.synchronize().map_err(|e| e.to_string())?;
        if g.download(&d).map_err(|e| e.to_string())? != src {
            return Err(format!("staged copy of {bytes} bytes differs").into());
        }
        let mut d2 = g.alloc(bytes).map_err(|e| e.to_string())?;
        copy_d2d(&g.stream, &d, &mut d2, bytes).map_err(|e| e.to_string())?;
        let mut pinned = PinnedBytes::new(&g, bytes, false).map_err(|e| e.to_string())?;
        copy_d2h(&g.stream, &d2, pinned.as_mut_slice()).map_err(|e| e.to_string())?;
        g.stream.synchronize().map_err(|e| e.to_string())?;
        if pinned.as_slice() != src.as_slice() {
            return Err(
                format!("device->device->pinned host copy of {bytes} bytes differs").into(),
            );
        }
        let mut d3 = g.alloc(bytes).map_err(|e| e.to_string())?;
        copy_h2d(&g.stream, pinned.as_slice(), &mut d3).map_err(|e| e.to_string())?;
        g.stream.synchronize().map_err(|e| e.to_string())?;
        if g.download(&d3).map_err(|e| e.to_string())? != src {
            return Err(format!("pinned host->device copy of {bytes} bytes differs").into());
        }
    }
    // a destination too small is an error, not a write past its end
    let small = g.alloc(10).map_err(|e| e.to_string())?;
    let mut tiny = g.alloc(5).map_err(|e| e.to_string())?;
    if copy_d2d(&g.stream, &small, &mut tiny, 10).is_ok() {
        return Err("an oversized copy was accepted".into());
    }
    Ok(())
}

fn main() {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    type GpuTest = fn() -> Result<(), Failed>;
    let tests: Vec<(&str, GpuTest)> = vec![
        ("gpu::gemm_all_types_non_square", gemm_all_types_non_square),
        ("gpu::f32_gemm_is_not_tf32", f32_gemm_is_not_tf32),
        ("gpu::cudnn_conv_matches_cpu", cudnn_conv_matches_cpu),
        (
            "gpu::copies_are_byte_exact_at_odd_sizes",
            copies_are_byte_exact_at_odd_sizes,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some()))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
