//! gpukit's stem-and-pool kernel against float64: the blocked stem convolution (16 channels,
//! 4 x 4 taps, stride 1, unpadded) with its bias and ReLU, rounded to the storage type, then
//! the 3 x 3 stride-2 max pool with padding 1, on fresh random values, for both tiles, at
//! ResNet-50's shape and at sizes no tile divides (and a pool in ceil mode); each launch over an
//! output filled with NaN first, so a value the kernel does not write shows. And the kernel
//! that converts the f32 image itself: against the 7 x 7 stride-2 convolution of the image
//! (padding 3) in float64, its filter blocked by the engine's own rearrangement.

use super::{download, upload, DISCOVERY};
use gpukit_models::gpu::program::blocks::Blocks;
use gpukit_models::gpu::program::kernels::stem::{StemDims, StemInput, StemPool, StemTile};
use gpukit_models::gpu::GpuContext;
use gpukit_models::graph::{Conv, Epilogue};
use gpukit_models::sums::relative as rel;
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::DType;
use libtest_mimic::Failed;

/// relu(conv + bias) rounded to `dtype` for each convolution output, then the pool.
fn reference(d: &StemDims, xv: &[f64], wv: &[f64], bv: &[f64], dtype: DType) -> Vec<f32> {
    let (p, q) = (d.hb - 3, d.wb - 3);
    let round = |v: f64| -> f32 {
        let bytes = gpukit_tensor::codec::encode_f32(&[v as f32], dtype.storage());
        gpukit_tensor::codec::decode_f32(&bytes, dtype.storage())[0]
    };
    let mut conv = vec![0f32; d.n * p * q * 64];
    for b in 0..d.n {
        for i in 0..p {
            for j in 0..q {
                for k in 0..64 {
                    let mut s = bv[k];
                    for r in 0..4 {
                        for t in 0..4 {
                            let at = ((b * d.hb + i + r) * d.wb + j + t) * 16;
                            let taps = &wv[((k * 4 + r) * 4 + t) * 16..][..16];
                            s += xv[at..at + 16]
                                .iter()
                                .zip(taps)
                                .map(|(a, w)| a * w)
                                .sum::<f64>();
                        }
                    }
                    conv[((b * p + i) * q + j) * 64 + k] = round(s.max(0.0));
                }
            }
        }
    }
    let mut y = vec![0f32; d.n * d.pp * d.pq * 64];
    for b in 0..d.n {
        for i in 0..d.pp {
            for j in 0..d.pq {
                for k in 0..64 {
                    let mut m = f32::NEG_INFINITY;
                    for yy in (2 * i).saturating_sub(1)..(2 * i + 2).min(p) {
                        for xx in (2 * j).saturating_sub(1)..(2 * j + 2).min(q) {
                            m = m.max(conv[((b * p + yy) * q + xx) * 64 + k]);
                        }
                    }
                    y[((b * d.pp + i) * d.pq + j) * 64 + k] = m;
                }
            }
        }
    }
    y
}

pub(super) fn stem_pool_matches_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let kernel = StemPool::new(discovery, &ctx.gpu)?;
    let mut failures = Vec::new();
    let shapes = [
        // ResNet-50's stem at 224 x 224 (blocked: 115 x 115)
        StemDims {
            n: 2,
            hb: 115,
            wb: 115,
            pp: 56,
            pq: 56,
        },
        // a 60 x 44 image: conv 30 x 22, pooled 15 x 11
        StemDims {
            n: 3,
            hb: 33,
            wb: 25,
            pp: 15,
            pq: 11,
        },
        // ceil mode's extra row; one image
        StemDims {
            n: 1,
            hb: 33,
            wb: 20,
            pp: 16,
            pq: 9,
        },
    ];
    for dtype in [DType::F16, DType::Bf16] {
        for d in shapes {
            let seed = fresh_seed();
            let (x, xv) = upload(&ctx, &normal_f32(d.n * d.hb * d.wb * 16, seed), dtype)?;
            let filter: Vec<f32> = normal_f32(64 * 256, seed + 1)
                .iter()
                .map(|v| v / 16.0)
                .collect();
            let (w, wv) = upload(&ctx, &filter, dtype)?;
            let (bias, bv) = upload(&ctx, &normal_f32(64, seed + 2), dtype)?;
            let want = reference(&d, &xv, &wv, &bv, dtype);
            let y = ctx
                .gpu
                .alloc(d.n * d.pp * d.pq * 64 * dtype.storage().size_bytes())?;
            for tile in [StemTile::Eight, StemTile::Four] {
                ctx.gpu.fill(y.view(), 0xff)?;
                let ops = (
                    StemInput::Blocked(x.view()),
                    w.view(),
                    Some(bias.view()),
                    y.view(),
                );
                kernel.run(ctx.gpu.stream(), dtype, ops, &d, tile)?;
                let got = download(&ctx, &y, dtype)?;
                // the same rounded values but where the f32 sums round the other way: one
                // unit of the storage type's last place
                let e = rel(&got, &want);
                let tolerance = if dtype == DType::F16 { 1e-3 } else { 8e-3 };
                if e > tolerance {
                    failures.push(format!("{dtype} {d:?} {tile:?} (seed {seed}): {e:.1e}"));
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// relu(conv7x7/2(image) + bias), each value rounded to `dtype`, then the pool: the image and
/// the filter rounded to `dtype` as the kernel reads them.
#[allow(clippy::too_many_arguments)]
fn image_reference(
    (n, c, h, w): (usize, usize, usize, usize),
    xv: &[f64],
    fv: &[f64],
    bv: &[f64],
    (p, q, pp, pq): (usize, usize, usize, usize),
    dtype: DType,
) -> Vec<f32> {
    let round = |v: f64| -> f32 {
        let bytes = gpukit_tensor::codec::encode_f32(&[v as f32], dtype.storage());
        gpukit_tensor::codec::decode_f32(&bytes, dtype.storage())[0]
    };
    let mut conv = vec![0f32; n * p * q * 64];
    for b in 0..n {
        for i in 0..p {
            for j in 0..q {
                for k in 0..64 {
                    let mut s = bv[k];
                    for ch in 0..c {
                        for r in 0..7 {
                            for t in 0..7 {
                                let (u, v) = ((2 * i + r) as isize - 3, (2 * j + t) as isize - 3);
                                if u < 0 || v < 0 || u >= h as isize || v >= w as isize {
                                    continue;
                                }
                                let at = ((b * c + ch) * h + u as usize) * w + v as usize;
                                s += xv[at] * fv[((k * c + ch) * 7 + r) * 7 + t];
                            }
                        }
                    }
                    conv[((b * p + i) * q + j) * 64 + k] = round(s.max(0.0));
                }
            }
        }
    }
    let mut y = vec![0f32; n * pp * pq * 64];
    for b in 0..n {
        for i in 0..pp {
            for j in 0..pq {
                for k in 0..64 {
                    let mut m = f32::NEG_INFINITY;
                    for yy in (2 * i).saturating_sub(1)..(2 * i + 2).min(p) {
                        for xx in (2 * j).saturating_sub(1)..(2 * j + 2).min(q) {
                            m = m.max(conv[((b * p + yy) * q + xx) * 64 + k]);
                        }
                    }
                    y[((b * pp + i) * pq + j) * 64 + k] = m;
                }
            }
        }
    }
    y
}

pub(super) fn stem_image_matches_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let kernel = StemPool::new(discovery, &ctx.gpu)?;
    let mut failures = Vec::new();
    // (n, c, h, w): ResNet's 224 x 224, an image no tile divides, odd sizes, 4 channels
    let images = [
        (2, 3, 224, 224),
        (3, 3, 60, 44),
        (1, 3, 37, 51),
        (2, 4, 33, 29),
    ];
    let conv = Conv {
        kernel: [7, 7],
        strides: [2, 2],
        pads: [3; 4],
        dilations: [1, 1],
        groups: 1,
        bias: true,
        epilogue: Epilogue::default(),
    };
    for dtype in [DType::F16, DType::Bf16] {
        for (n, c, h, w) in images {
            let (p, q) = ((h + 6 - 7) / 2 + 1, (w + 6 - 7) / 2 + 1);
            let (pp, pq) = ((p - 1) / 2 + 1, (q - 1) / 2 + 1);
            let Some(b) = Blocks::of(&conv, c, (h, w), (p, q)) else {
                failures.push(format!("{c} channels {h}x{w}: not blocked"));
                continue;
            };
            if b.channels != 16 || b.rows.taps != 4 || b.cols.taps != 4 {
                failures.push(format!("{c} channels {h}x{w}: blocked as {b:?}"));
                continue;
            }
            let seed = fresh_seed();
            let image = normal_f32(n * c * h * w, seed);
            let x = ctx
                .gpu
                .upload(&gpukit_tensor::codec::encode_f32(&image, DType::F32))?;
            // the kernel rounds the image to the storage type as it stages it
            let (_, xv) = upload(&ctx, &image, dtype)?;
            let filter: Vec<f32> = normal_f32(64 * c * 49, seed + 1)
                .iter()
                .map(|v| v / (c as f32 * 49.0).sqrt())
                .collect();
            let (_, fv) = upload(&ctx, &filter, dtype)?;
            let fr: Vec<f32> = fv.iter().map(|&v| v as f32).collect();
            let (wt, _) = upload(&ctx, &b.filter(&fr, [64, 7, 7]), dtype)?;
            let (bias, bv) = upload(&ctx, &normal_f32(64, seed + 2), dtype)?;
            let want = image_reference((n, c, h, w), &xv, &fv, &bv, (p, q, pp, pq), dtype);
            let d = StemDims {
                n,
                hb: b.rows.blocks,
                wb: b.cols.blocks,
                pp,
                pq,
            };
            let y = ctx
                .gpu
                .alloc(n * pp * pq * 64 * dtype.storage().size_bytes())?;
            for tile in [StemTile::Eight, StemTile::Four] {
                ctx.gpu.fill(y.view(), 0xff)?;
                let input = StemInput::Image {
                    x: x.view(),
                    c,
                    h,
                    w,
                    before: (b.rows.before, b.cols.before),
                };
                let ops = (input, wt.view(), Some(bias.view()), y.view());
                kernel.run(ctx.gpu.stream(), dtype, ops, &d, tile)?;
                let got = download(&ctx, &y, dtype)?;
                let e = rel(&got, &want);
                let tolerance = if dtype == DType::F16 { 1e-3 } else { 8e-3 };
                if e > tolerance {
                    failures.push(format!(
                        "{dtype} image {n}x{c}x{h}x{w} {tile:?} (seed {seed}): {e:.1e}"
                    ));
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}
