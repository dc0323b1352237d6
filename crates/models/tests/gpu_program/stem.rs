//! gpukit's stem-and-pool kernel against float64: the blocked stem convolution (16 channels,
//! 4 x 4 taps, stride 1, unpadded) with its bias and ReLU, rounded to the storage type, then
//! the 3 x 3 stride-2 max pool with padding 1, on fresh random values, for both tiles, at
//! ResNet-50's shape and at sizes no tile divides (and a pool in ceil mode); each launch over an
//! output filled with NaN first, so a value the kernel does not write shows.

use super::{download, upload, DISCOVERY};
use gpukit_models::gpu::program::kernels::stem::{StemDims, StemPool, StemTile};
use gpukit_models::gpu::GpuContext;
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
                let ops = (x.view(), w.view(), Some(bias.view()), y.view());
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
