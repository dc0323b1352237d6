//! Convolutions summed in f64 (f32 programs): the kernels and cuBLAS's DGEMM against float64
//! element by element (each output rounded once, so within half an f32 ulp of the exact
//! result), in three pieces of uneven size, both layouts, with and without an epilogue; and
//! every fixture in f32 with every convolution summed in f64 against the float64 interpreter,
//! beside the same program on cuDNN's f32 sums.

use super::{download, graph, rel, upload, DISCOVERY};
use gpukit_models::gpu::program::kernels::exact::{pieces, ExactKernels};
use gpukit_models::gpu::program::{ExactSums, OwnConvs, Program, ProgramSession, Strided};
use gpukit_models::gpu::GpuContext;
use gpukit_models::graph::{forward_cpu_f64, Activation, Array};
use gpukit_models::onnx::fixtures;
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::{ConvShape, DType, Layout};
use libtest_mimic::Failed;

/// The exact convolution of the f32 values `x` (`[n, c, h, w]` through `sx`) with the filter
/// `w` (`[k, K]`, K in the layout's order), then `+ bias + z` (z `[n, k, p, q]` through `sy`)
/// and ReLU where asked, in f64: `[n, k, p, q]` through `sy`.
#[allow(clippy::too_many_arguments)]
fn reference(
    sh: &ConvShape,
    (x, sx): (&[f64], &Strided),
    w: &[f64],
    krsc: bool,
    bias: Option<&[f64]>,
    z: Option<&[f64]>,
    relu: bool,
    sy: &Strided,
) -> Vec<f64> {
    let (p, q) = (sh.out_h(), sh.out_w());
    let kk = sh.c * sh.r * sh.s;
    let at = |s: &Strided, i: [usize; 4]| (0..4).map(|a| i[a] * s.strides[a]).sum::<usize>();
    let mut y = vec![0f64; sy.span()];
    for b in 0..sh.n {
        for o in 0..sh.k {
            for op in 0..p {
                for oq in 0..q {
                    let mut sum = 0f64;
                    for ch in 0..sh.c {
                        for ti in 0..sh.r {
                            for tj in 0..sh.s {
                                let yy = (op * sh.stride + ti) as isize - sh.pad as isize;
                                let xx = (oq * sh.stride + tj) as isize - sh.pad as isize;
                                if yy < 0 || xx < 0 || yy >= sh.h as isize || xx >= sh.w as isize {
                                    continue;
                                }
                                let col = match krsc {
                                    true => (ti * sh.s + tj) * sh.c + ch,
                                    false => (ch * sh.r + ti) * sh.s + tj,
                                };
                                sum +=
                                    x[at(sx, [b, ch, yy as usize, xx as usize])] * w[o * kk + col];
                            }
                        }
                    }
                    let i = at(sy, [b, o, op, oq]);
                    let mut v = sum + bias.map_or(0.0, |bv| bv[o]) + z.map_or(0.0, |zv| zv[i]);
                    if relu {
                        v = v.max(0.0);
                    }
                    y[i] = v;
                }
            }
        }
    }
    y
}

/// The kernels and the DGEMM against float64, output by output.
pub fn exact_convolutions_match_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let kernels = ExactKernels::new(discovery, &ctx.gpu)?;
    let blas = ctx.blas.get()?;
    let mut failures = Vec::new();
    let mut worst = 0f64;
    // (n, c, h, k, taps, stride): a stem, a 3x3 of K = 576, a 1x1, odd sizes with stride 2
    let shapes = [
        (2, 3, 23, 16, 7, 2),
        (2, 64, 14, 64, 3, 1),
        (3, 64, 9, 256, 1, 1),
        (1, 8, 11, 40, 3, 2),
    ];
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let krsc = layout == Layout::Nhwc;
        for (n, c, h, k, f, stride) in shapes {
            let sh = ConvShape {
                n,
                c,
                h,
                w: h,
                k,
                r: f,
                s: f,
                stride,
                pad: f / 2,
                groups: 1,
            };
            let (kk, _, _) = pieces(&sh);
            let (p, q) = (sh.out_h(), sh.out_w());
            let seed = fresh_seed();
            let sx = Strided::image([n, c, h, h], layout);
            let sy = Strided::image([n, k, p, q], layout);
            let (x, xv) = upload(&ctx, &normal_f32(sx.span(), seed), DType::F32)?;
            let w: Vec<f32> = normal_f32(k * kk, seed + 1);
            let wv: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
            let mut b = vec![0f64; kk * k];
            for o in 0..k {
                for j in 0..kk {
                    b[j * k + o] = wv[o * kk + j];
                }
            }
            let wt = ctx.gpu.upload(gpukit_tensor::codec::bytes_of(&b))?;
            let (bias, bv) = upload(&ctx, &normal_f32(k, seed + 2), DType::F32)?;
            let (z, zv) = upload(&ctx, &normal_f32(sy.span(), seed + 3), DType::F32)?;
            let y = ctx.gpu.alloc(sy.span() * 4)?;
            let total = n * p * q;
            // three pieces of uneven size, the scratch for the largest
            let cuts = [0, total / 3, total / 3 + total / 2, total];
            let rows = cuts.windows(2).map(|c| c[1] - c[0]).max().unwrap_or(1);
            let cols = ctx.gpu.alloc(rows * kk * 8)?;
            let out = ctx.gpu.alloc(rows * k * 8)?;
            for epilogue in [false, true] {
                let want = match epilogue {
                    true => reference(&sh, (&xv, &sx), &wv, krsc, Some(&bv), Some(&zv), true, &sy),
                    false => reference(&sh, (&xv, &sx), &wv, krsc, None, None, false, &sy),
                };
                ctx.gpu.fill(y.view(), 0xff)?;
                for piece in cuts.windows(2) {
                    let (m0, r) = (piece[0], piece[1] - piece[0]);
                    let (cv, ov) = (
                        cols.view().sub(0, r * kk * 8)?,
                        out.view().sub(0, r * k * 8)?,
                    );
                    kernels.im2col(&sh, (x.view(), &sx), cv, krsc, (m0, r))?;
                    blas.gemm_views(DType::F64, cv, wt.view(), ov, (r, k, kk))?;
                    let (bb, zz) = match epilogue {
                        true => (Some(bias.view()), Some((z.view(), &sy))),
                        false => (None, None),
                    };
                    let act = epilogue.then_some(Activation::Relu);
                    kernels.epilogue(ov, bb, zz, act, (y.view(), &sy), (m0, r))?;
                }
                let got = download(&ctx, &y, DType::F32)?;
                // each output rounded once: within half an ulp of f32 (2^-24 of its value) of
                // the exact result, up to f64's own rounding (1e-10 of the largest output)
                let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                let (mut excess, mut rel_max) = (0f64, 0f64);
                for (&g, &e) in got.iter().zip(&want) {
                    let err = (f64::from(g) - e).abs();
                    excess = excess.max((err - e.abs() / 16_777_216.0).max(0.0) / scale);
                    if e.abs() > 1e-3 * scale {
                        rel_max = rel_max.max(err / e.abs());
                    }
                }
                worst = worst.max(rel_max);
                if excess > 1e-10 || !got.iter().all(|v| v.is_finite()) {
                    failures.push(format!(
                        "{layout:?} {sh:?} epilogue {epilogue} (seed {seed}): {excess:.1e} of the \
                         largest output past half an f32 ulp (element by element: {rel_max:.1e})"
                    ));
                }
            }
        }
    }
    println!("exact sums: worst output {worst:.2e} from float64 (relative, element by element)");
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}

/// Every fixture in f32, both layouts, every convolution summed in f64, against the float64
/// interpreter; the same programs on cuDNN's sums beside (printed).
pub fn exact_sums_bring_fixtures_to_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let mut failures = Vec::new();
    let mut exact_runs = 0;
    let seed = fresh_seed();
    for f in fixtures::all(seed) {
        let g = graph(&f.model, 3)?;
        let inputs: Vec<Array> = g
            .inputs
            .iter()
            .map(|&i| {
                let shape = g.value(i).shape.clone();
                Array::f32(&shape, normal_f32(shape.iter().product(), fresh_seed()))
            })
            .collect();
        let want = forward_cpu_f64(&g, &inputs)?;
        let xs: Vec<&[f32]> = inputs.iter().filter_map(Array::as_f32).collect();
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let p = Program::lower_with_conv1x1_gemm(&g, DType::F32, layout, false)
                .map_err(|e| format!("{} {layout:?}: {e}", f.name))?;
            let mut errors = Vec::new();
            for mode in [ExactSums::All, ExactSums::Off] {
                let what = format!("{} {layout:?} {mode:?}", f.name);
                let mut s = ProgramSession::with_options(
                    &ctx,
                    discovery,
                    &p,
                    &mut |_| {},
                    OwnConvs::Timed,
                    mode,
                )
                .map_err(|e| format!("{what}: {e}"))?;
                if mode == ExactSums::All {
                    exact_runs += s.algorithms.iter().filter(|a| a.starts_with("f64")).count();
                }
                let eager = s.run(&xs).map_err(|e| format!("{what}: {e}"))?;
                s.capture().map_err(|e| format!("{what}: capture: {e}"))?;
                s.replay()?;
                let replayed = s.outputs()?;
                let mut e = 0f64;
                for (o, w) in want.iter().enumerate() {
                    let w: Vec<f32> = w.data.iter().map(|&v| v as f32).collect();
                    e = e.max(rel(&eager[o], &w)).max(rel(&replayed[o], &w));
                }
                errors.push(e);
            }
            println!(
                "exact sums: {} {layout:?}: {:.1e} from float64 (cuDNN's f32 sums {:.1e})",
                f.name, errors[0], errors[1]
            );
            // f32 storage between layers and the other steps' f32 sums remain
            if errors[0] > 5e-6 {
                failures.push(format!(
                    "{} {layout:?} (seed {seed}): {:.1e} from float64 with f64 sums",
                    f.name, errors[0]
                ));
            }
        }
    }
    if exact_runs == 0 {
        failures.push("no convolution summed in f64".into());
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}
