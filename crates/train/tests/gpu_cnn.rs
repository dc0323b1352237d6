//! The GPU convolutional path's parts against the CPU reference (`gpukit_train::cnn`), on fresh
//! random inputs every run (the seed is printed): each cuDNN call of `gpukit_cuda::dnn`'s training
//! module against the CPU layer computed in float64 from the same f32 inputs (convolution
//! forward, backward data and filter with every algorithm cuDNN offers, and the cuBLAS product a
//! 1x1 filter's gradient may take; batch norm forward-training and backward, also with its fused
//! ReLU and add + ReLU where cuDNN runs them; max pooling, and gpukit's channel-last backward
//! kernel; the smoothed cross-entropy kernel, the CNN's own kernels). The whole network is
//! `gpu_cnn_resnet.rs`. Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a
//! missing GPU a failure.

mod cnn_gpu_common;

use cnn_gpu_common::*;
use gpukit_cuda::dnn::{BnBackward, BnForward, BnMode, BnOps, Conv, Dnn, Maps, Pass};
use gpukit_cuda::{DeviceBuffer, Gpu};
use gpukit_tensor::codec::{encode_f32, round_f32};
use gpukit_tensor::random::{fresh_seed, normal_f32, uniform_f32};
use gpukit_train::cnn::gpu::kernels::CnnKernels;
use gpukit_train::cnn::layers::{
    add_inplace, avgpool_backward, avgpool_forward, relu_inplace, BatchNorm2d, Conv2d, MaxPool2d,
};
use gpukit_train::cnn::loss::cross_entropy_smoothed;
use gpukit_train::cnn::Tensor;
use gpukit_train::gpu::kernels::TrainKernels;
use gpukit_types::{ConvShape, DType, Layout};
use libtest_mimic::Failed;

/// Convolution forward, backward data (also accumulating) and backward filter against the CPU
/// layer in float64, on the stem's 7x7/2, a 3x3/1, a 3x3/2 and a 1x1/2 downsample: within 1e-5
/// of the reference's largest value (true fp32: FMA math, no TF32, whose 10-bit mantissa would
/// miss by ~1e-3).
fn convolutions_match_the_cpu_layer() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let dnn = Dnn::new(d, &g)?;
    let seed = fresh_seed();
    println!("seed {seed}");
    // (n, c, h, w, k, kernel, stride, pad)
    let cases = [
        (2, 3, 20, 20, 16, 7, 2, 3),
        (2, 16, 9, 9, 16, 3, 1, 1),
        (3, 8, 10, 11, 12, 3, 2, 1),
        (2, 16, 8, 8, 32, 1, 2, 0),
        (4, 64, 7, 7, 64, 3, 1, 1),
        (3, 16, 6, 5, 24, 1, 1, 0),
    ];
    let blas = gpukit_cuda::blas::Blas::new(d, &g)?;
    let ck = CnnKernels::new(d, &g)?;
    // every algorithm cuDNN offers for each pass, in f32 NCHW and in bf16 channels-last (its
    // inputs rounded to bf16 first, so the tolerance is the output's rounding)
    for (layout, dtype, tol) in [
        (Layout::Nchw, DType::F32, 1e-5),
        (Layout::Nhwc, DType::Bf16, 1e-2),
    ] {
        for (i, &(n, c, h, w, k, r, stride, pad)) in cases.iter().enumerate() {
            if dtype == DType::Bf16 && c % 8 != 0 {
                continue; // channels-last 16-bit convolutions take whole 16-byte channel vectors
            }
            let layer = Conv2d {
                in_channels: c,
                out_channels: k,
                kernel: r,
                stride,
                padding: pad,
            };
            let shape = ConvShape {
                n,
                c,
                h,
                w,
                k,
                r,
                s: r,
                stride,
                pad,
                groups: 1,
            };
            let plan = dnn.plan_conv_train(Conv {
                shape,
                layout,
                dtype,
            })?;
            let (oh, ow) = layer.out_size(h, w);
            let s = seed.wrapping_add(i as u64 * 10);
            let rounded = |v: Vec<f32>| round_f32(&v, dtype);
            let x = rounded(normal_f32(n * c * h * w, s));
            let wt = rounded(normal_f32(layer.weight_len(), s + 1));
            let dy = rounded(normal_f32(n * k * oh * ow, s + 2));
            let prior = rounded(normal_f32(n * c * h * w, s + 3));
            let (xs, ws_, ys) = ([n, c, h, w], [k, c, r, r], [n, k, oh, ow]);
            let put = |v: &[f32], sh| up(&g, &to_layout(v, sh, layout), dtype);
            let take = |b: &DeviceBuffer, sh: [usize; 4]| -> Result<Vec<f32>, Failed> {
                let v = down(&g, b, sh.iter().product(), dtype)?;
                Ok(from_layout(&v, sh, layout))
            };
            let (xb, wb, dyb) = (put(&x, xs)?, put(&wt, ws_)?, put(&dy, ys)?);
            let es = dtype.size_bytes();
            let yb = g.alloc(n * k * oh * ow * es)?;
            let dxb = g.alloc(x.len() * es)?;
            let dwb = g.alloc(wt.len() * es)?;
            let most = Pass::ALL
                .iter()
                .flat_map(|&p| plan.candidates(p).iter().map(|c| c.workspace_bytes))
                .max()
                .unwrap_or(0);
            let ws = g.alloc(most.max(256))?;

            let (x64, w64) = (tensor64(xs, &x), wide(&wt));
            let dy64 = tensor64(ys, &dy);
            let y_ref = layer.forward(&w64, &x64);
            let mut dw_ref = vec![0.0; wt.len()];
            let dx_ref = layer
                .backward(&w64, &x64, &dy64, &mut dw_ref, true)
                .ok_or("the CPU layer gave no dx")?;
            let acc_ref: Vec<f64> = dx_ref
                .data
                .iter()
                .zip(&prior)
                .map(|(a, &b)| a + f64::from(b))
                .collect();
            let what = format!(
                "{r}x{r}/{stride} {c}->{k} on {n}x{h}x{w} {} {}",
                dtype.name(),
                layout.name()
            );
            let mut tried = Vec::new();
            for pass in Pass::ALL {
                for (j, cand) in plan.candidates(pass).iter().enumerate() {
                    plan.choose(pass, j)?;
                    let case = format!("{what} {} {}", pass.name(), cand.name);
                    match pass {
                        Pass::Forward => {
                            dnn.conv_train_forward(
                                &plan,
                                xb.view(),
                                wb.view(),
                                yb.view(),
                                ws.view(),
                            )?;
                            check(&case, rel(&take(&yb, ys)?, &y_ref.data), tol)?;
                        }
                        Pass::BackwardData => {
                            dnn.conv_backward_data(
                                &plan,
                                (wb.view(), dyb.view(), dxb.view()),
                                ws.view(),
                                false,
                            )?;
                            check(&case, rel(&take(&dxb, xs)?, &dx_ref.data), tol)?;
                            // accumulating into a buffer that holds `prior`
                            g.upload_into(
                                dxb.view(),
                                &encode_f32(&to_layout(&prior, xs, layout), dtype),
                            )?;
                            dnn.conv_backward_data(
                                &plan,
                                (wb.view(), dyb.view(), dxb.view()),
                                ws.view(),
                                true,
                            )?;
                            check(
                                &format!("{case}, accumulated"),
                                rel(&take(&dxb, xs)?, &acc_ref),
                                tol,
                            )?;
                        }
                        Pass::BackwardFilter => {
                            dnn.conv_backward_filter(
                                &plan,
                                (xb.view(), dyb.view(), dwb.view()),
                                ws.view(),
                                false,
                            )?;
                            check(&case, rel(&take(&dwb, ws_)?, &dw_ref), tol)?;
                        }
                    }
                    tried.push(format!("{} {}", pass.name(), cand.name));
                }
                plan.choose(pass, 0)?;
            }
            // a channels-last 1x1 filter's gradient as the trainer may take it: one cuBLAS
            // product dW [k, c] = dY^T [k, pixels] X [pixels, c], a strided one's input pixels
            // gathered first by gpukit's kernel
            if layout == Layout::Nhwc && (r, pad) == (1, 0) {
                let (oh, ow) = shape.out_hw();
                let gathered = g.alloc(n * oh * ow * c * dtype.size_bytes())?;
                let x = match stride {
                    1 => xb.view(),
                    _ => {
                        ck.subsample_nhwc(
                            (xb.view(), gathered.view()),
                            dtype,
                            (n, h, w, c),
                            (oh, ow),
                            stride,
                        )?;
                        gathered.view()
                    }
                };
                blas.gemm_batched(
                    dtype,
                    (dyb.view(), x, dwb.view()),
                    (1, k, c, n * oh * ow),
                    (true, false),
                )?;
                check(
                    &format!("{what} filter gradient as a cuBLAS product (stride {stride})"),
                    rel(&take(&dwb, ws_)?, &dw_ref),
                    tol,
                )?;
                tried.push("cuBLAS product".into());
            }
            println!("  {what}: {} algorithms right", tried.len());
        }
    }
    // the same shape gets the same plan back
    let again = dnn.plan_conv_train(Conv {
        shape: ConvShape {
            n: 2,
            c: 16,
            h: 9,
            w: 9,
            k: 16,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
            groups: 1,
        },
        layout: Layout::Nchw,
        dtype: DType::F32,
    })?;
    if again.candidates(Pass::Forward).is_empty() {
        return Err("a kept plan without forward candidates".into());
    }
    Ok(())
}

/// The tolerances of a batch-norm case: feature maps, statistics, parameter gradients.
fn bn_tolerances(dtype: DType) -> (f64, f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5, 1e-5),
        // outputs rounded to 16 bits (f16: 4.9e-4, bf16: 3.9e-3 relative)
        DType::F16 => (2e-3, 1e-4, 1e-3),
        _ => (1e-2, 1e-4, 1e-2),
    }
}

/// One batch-norm configuration against the CPU layer in float64 (inputs rounded to the
/// dtype first): the output (after the fused op), the running statistics, the saved inverse
/// std, and dx, dgamma, dbeta (and dz). None when cuDNN does not run the configuration.
fn bn_case(
    dnn: &Dnn,
    g: &Gpu,
    maps: Maps,
    ops: BnOps,
    mode: BnMode,
    seed: u64,
) -> Result<Option<()>, Failed> {
    let bn = match dnn.batch_norm(maps, ops, mode, (1e-5, 0.1)) {
        Ok(bn) => bn,
        Err(gpukit_cuda::Error::NoAlgorithm(why)) => {
            println!("  not run by cuDNN: {why}");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let Maps {
        n,
        c,
        h,
        w,
        layout,
        dtype,
    } = maps;
    let shape = [n, c, h, w];
    let len = maps.elements();
    // channels of different means and spreads
    let mut x = normal_f32(len, seed);
    for (i, v) in x.iter_mut().enumerate() {
        let ch = (i / (h * w)) % c;
        *v = *v * (0.5 + ch as f32 * 0.3) + ch as f32 * 0.7 - 1.0;
    }
    let x = round_f32(&x, dtype);
    let z = round_f32(&normal_f32(len, seed + 1), dtype);
    let dy = round_f32(&normal_f32(len, seed + 2), dtype);
    let gamma: Vec<f32> = uniform_f32(c, seed + 3)
        .iter()
        .map(|v| 1.0 + 0.5 * v)
        .collect();
    let beta = normal_f32(c, seed + 4);
    let rm = normal_f32(c, seed + 5);
    let rv: Vec<f32> = uniform_f32(c, seed + 6).iter().map(|v| 1.5 + v).collect();

    let put = |v: &[f32]| up(g, &to_layout(v, shape, layout), dtype);
    let (xb, zb, dyb) = (put(&x)?, put(&z)?, put(&dy)?);
    let (yb, dxb, dzb) = (
        g.alloc(maps.bytes())?,
        g.alloc(maps.bytes())?,
        g.alloc(maps.bytes())?,
    );
    let f = |v: &[f32]| up(g, v, DType::F32);
    let (gb, bb, rmb, rvb) = (f(&gamma)?, f(&beta)?, f(&rm)?, f(&rv)?);
    let (smb, sib, dgb, dbb) = (
        g.alloc(c * 4)?,
        g.alloc(c * 4)?,
        g.alloc(c * 4)?,
        g.alloc(c * 4)?,
    );
    let ws = g.alloc(bn.workspace_bytes().max(256))?;
    let reserve = match bn.reserve_bytes() {
        0 => None,
        r => Some(g.alloc(r)?),
    };
    let add = ops == BnOps::BnAddRelu;
    let fwd = BnForward {
        x: xb.view(),
        z: add.then(|| zb.view()),
        y: yb.view(),
        gamma: gb.view(),
        beta: bb.view(),
        running_mean: rmb.view(),
        running_var: rvb.view(),
        move_running: true,
        saved_mean: smb.view(),
        saved_invstd: sib.view(),
    };
    let run = dnn.bn_forward_training(&bn, &fwd, ws.view(), reserve.as_ref().map(|r| r.view()));
    if let Err(e) = run {
        if e.to_string().contains("NOT_SUPPORTED") {
            println!("  not run by cuDNN at the call: {e}");
            return Ok(None);
        }
        return Err(e.into());
    }
    let back = BnBackward {
        x: xb.view(),
        y: (ops != BnOps::Bn).then(|| yb.view()),
        dy: dyb.view(),
        dz: add.then(|| dzb.view()),
        dx: dxb.view(),
        gamma: gb.view(),
        beta: bb.view(),
        dgamma: dgb.view(),
        dbeta: dbb.view(),
        saved_mean: smb.view(),
        saved_invstd: sib.view(),
    };
    dnn.bn_backward(
        &bn,
        &back,
        ws.view(),
        reserve.as_ref().map(|r| r.view()),
        false,
    )?;
    let get = |b: &DeviceBuffer| -> Result<Vec<f32>, Failed> {
        Ok(from_layout(&down(g, b, len, dtype)?, shape, layout))
    };
    let (y, dx, dz) = (get(&yb)?, get(&dxb)?, get(&dzb)?);
    let stat = |b: &DeviceBuffer| down(g, b, c, DType::F32);
    let (rm_got, rv_got, si_got) = (stat(&rmb)?, stat(&rvb)?, stat(&sib)?);
    let (dg_got, db_got) = (stat(&dgb)?, stat(&dbb)?);
    // a recomputation (activation checkpointing) of the same forward into another output: the
    // same maps and saved statistics, the running statistics left as the first forward put them
    let y2b = g.alloc(maps.bytes())?;
    let again = BnForward {
        y: y2b.view(),
        move_running: false,
        ..fwd
    };
    dnn.bn_forward_training(&bn, &again, ws.view(), reserve.as_ref().map(|r| r.view()))?;
    let same_bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    if !same_bits(&stat(&rmb)?, &rm_got) || !same_bits(&stat(&rvb)?, &rv_got) {
        return Err("a forward that does not move the running statistics moved them".into());
    }
    let (y2, si2) = (get(&y2b)?, stat(&sib)?);
    let (maps_tol, stat_tol, _) = bn_tolerances(dtype);
    check(
        "recomputed output against the first",
        rel(&y2, &wide(&y)),
        maps_tol,
    )?;
    check(
        "recomputed inverse std",
        rel(&si2, &wide(&si_got)),
        stat_tol,
    )?;

    // the reference
    let layer = BatchNorm2d::new(c);
    let (g64, b64) = (wide(&gamma), wide(&beta));
    let (mut rm64, mut rv64) = (wide(&rm), wide(&rv));
    let (mut out, cache) =
        layer.forward_train((&g64, &b64), (&mut rm64, &mut rv64), &tensor64(shape, &x));
    if add {
        for (o, &zv) in out.data.iter_mut().zip(&z) {
            *o += f64::from(zv);
        }
    }
    if ops != BnOps::Bn {
        for o in &mut out.data {
            *o = o.max(0.0);
        }
    }
    let mut grad = tensor64(shape, &dy);
    if ops != BnOps::Bn {
        for (d, &o) in grad.data.iter_mut().zip(&out.data) {
            if o <= 0.0 {
                *d = 0.0;
            }
        }
    }
    let (mut dg64, mut db64) = (vec![0.0; c], vec![0.0; c]);
    let dx64 = layer.backward(&g64, &cache, &grad, (&mut dg64, &mut db64));
    let (maps_tol, stat_tol, param_tol) = bn_tolerances(dtype);
    check("output", rel(&y, &out.data), maps_tol)?;
    check("running mean", rel(&rm_got, &rm64), stat_tol)?;
    check("running variance", rel(&rv_got, &rv64), stat_tol)?;
    check("saved inverse std", rel(&si_got, &cache.invstd), stat_tol)?;
    check("dx", rel(&dx, &dx64.data), maps_tol)?;
    check("dgamma", rel(&dg_got, &dg64), param_tol)?;
    check("dbeta", rel(&db_got, &db64), param_tol)?;
    if add {
        check("dz", rel(&dz, &grad.data), maps_tol)?;
    }
    Ok(Some(()))
}

/// Batch norm in training mode and its backward, bare and with the fused ReLU and add + ReLU:
/// f32 NCHW and NHWC (SPATIAL) must run bare; each fused op must run in at least one of f32
/// NCHW and NHWC (SPATIAL, and NHWC SPATIAL_PERSISTENT), f16 NHWC and bf16 NHWC
/// (SPATIAL_PERSISTENT), and every configuration cuDNN runs must match.
fn batch_norm_matches_the_cpu_layer() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let dnn = Dnn::new(d, &g)?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let f32_maps = Maps::nchw_f32(4, 6, 5, 7);
    let nhwc = |dtype| Maps {
        c: 8,
        layout: Layout::Nhwc,
        dtype,
        ..f32_maps
    };
    for ops in [BnOps::Bn, BnOps::BnRelu, BnOps::BnAddRelu] {
        let mut ran = 0;
        for (maps, mode) in [
            (f32_maps, BnMode::Spatial),
            (nhwc(DType::F32), BnMode::Spatial),
            (nhwc(DType::F32), BnMode::SpatialPersistent),
            (nhwc(DType::F16), BnMode::SpatialPersistent),
            (nhwc(DType::Bf16), BnMode::SpatialPersistent),
        ] {
            println!(
                "{ops:?} {:?} {} {mode:?} {}x{}x{}x{}:",
                maps.dtype,
                maps.layout.name(),
                maps.n,
                maps.c,
                maps.h,
                maps.w
            );
            let r = bn_case(&dnn, &g, maps, ops, mode, seed)?;
            // fp32 (NCHW) and tf32 (NHWC) training run the bare SPATIAL norm
            if r.is_none() && (ops, maps.dtype, mode) == (BnOps::Bn, DType::F32, BnMode::Spatial) {
                return Err(format!(
                    "cuDNN did not run plain f32 {} batch norm",
                    maps.layout.name()
                )
                .into());
            }
            ran += usize::from(r.is_some());
        }
        if ran == 0 {
            return Err(format!("cuDNN ran {ops:?} in none of the configurations").into());
        }
    }
    Ok(())
}

/// cuDNN's deterministic max pooling (3x3/2, padding 1, as the stem's) against the CPU layer:
/// forward exactly (a max is a copy), backward within 1e-6 (overlapping windows sum).
fn max_pooling_matches_the_cpu_layer() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let dnn = Dnn::new(d, &g)?;
    let seed = fresh_seed();
    println!("seed {seed}");
    for (n, c, h, w) in [(2, 5, 9, 9), (3, 4, 16, 12)] {
        let layer = MaxPool2d {
            kernel: 3,
            stride: 2,
            padding: 1,
        };
        let p = dnn.max_pool(Maps::nchw_f32(n, c, h, w), 3, 2, 1)?;
        let (oh, ow) = layer.out_size(h, w);
        if (p.output.h, p.output.w) != (oh, ow) {
            return Err(format!(
                "cuDNN pools to {}x{}, the CPU layer to {oh}x{ow}",
                p.output.h, p.output.w
            )
            .into());
        }
        let x = normal_f32(n * c * h * w, seed);
        let dy = normal_f32(n * c * oh * ow, seed + 1);
        let (xb, dyb) = (up(&g, &x, DType::F32)?, up(&g, &dy, DType::F32)?);
        let (yb, dxb) = (g.alloc(dy.len() * 4)?, g.alloc(x.len() * 4)?);
        dnn.max_pool_forward(&p, xb.view(), yb.view())?;
        dnn.max_pool_backward(&p, (xb.view(), yb.view()), dyb.view(), dxb.view())?;
        let y = down(&g, &yb, dy.len(), DType::F32)?;
        let dx = down(&g, &dxb, x.len(), DType::F32)?;
        let (y_ref, arg) = layer.forward(&Tensor::from_vec([n, c, h, w], x.clone()));
        let dx_ref = layer.backward([n, c, h, w], &arg, &tensor64([n, c, oh, ow], &dy));
        check("forward", rel(&y, &wide(&y_ref.data)), 0.0)?;
        check("backward", rel(&dx, &dx_ref.data), 1e-6)?;
    }
    // gpukit's channel-last ReLU + max pool kernels and their backward, on maps of which half
    // are below zero (after the ReLU, windows whose maximum is a tie at zero): against the CPU
    // layers (ReLU, then the pool; the pool's backward, then ReLU's), the pooled values exact,
    // the gradient to each window's first maximum where it is above zero, f32 within 1e-6 (sums
    // of up to four gradients), 16-bit within one rounding
    let ck = CnnKernels::new(d, &g)?;
    for (dtype, tol) in [(DType::F32, 1e-6), (DType::Bf16, 4e-3), (DType::F16, 1e-3)] {
        for (n, c, h, w, (k, st, pad)) in [
            (2, 8, 9, 9, (3, 2, 1)),
            (2, 8, 9, 9, (2, 2, 0)),
            (3, 16, 16, 12, (3, 2, 1)),
            (2, 64, 112, 112, (3, 2, 1)),
        ] {
            let layer = MaxPool2d {
                kernel: k,
                stride: st,
                padding: pad,
            };
            let (oh, ow) = layer.out_size(h, w);
            let x = round_f32(&normal_f32(n * c * h * w, seed + 7), dtype);
            let dy = round_f32(&normal_f32(n * c * oh * ow, seed + 8), dtype);
            let (xs, ys) = ([n, c, h, w], [n, c, oh, ow]);
            let xb = up(&g, &to_layout(&x, xs, Layout::Nhwc), dtype)?;
            let dyb = up(&g, &to_layout(&dy, ys, Layout::Nhwc), dtype)?;
            let e = dtype.size_bytes();
            let (yb, dxb, idx) = (
                g.alloc(dy.len() * e)?,
                g.alloc(x.len() * e)?,
                g.alloc(dy.len())?,
            );
            ck.max_pool_relu_nhwc(
                (xb.view(), yb.view(), idx.view()),
                dtype,
                (n, h, w, c),
                (oh, ow),
                (k, st, pad),
            )?;
            ck.max_pool_relu_back_nhwc(
                (idx.view(), yb.view(), dyb.view(), dxb.view()),
                dtype,
                (n, h, w, c),
                (oh, ow),
                (k, st, pad),
            )?;
            let y = from_layout(&down(&g, &yb, dy.len(), dtype)?, ys, Layout::Nhwc);
            let dx = from_layout(&down(&g, &dxb, x.len(), dtype)?, xs, Layout::Nhwc);
            let relu: Vec<f32> = x.iter().map(|&v| v.max(0.0)).collect();
            let (y_ref, arg) = layer.forward(&Tensor::from_vec(xs, relu.clone()));
            let mut dx_ref = layer.backward(xs, &arg, &tensor64(ys, &dy));
            for (d, &r) in dx_ref.data.iter_mut().zip(&relu) {
                if r <= 0.0 {
                    *d = 0.0;
                }
            }
            let what = format!(
                "{} relu + max pool {n}x{c}x{h}x{w} window {k}/{st}/{pad}",
                dtype.name()
            );
            check(&format!("{what} forward"), rel(&y, &wide(&y_ref.data)), 0.0)?;
            check(&format!("{what} backward"), rel(&dx, &dx_ref.data), tol)?;
        }
    }
    Ok(())
}

/// The training kernels' cross-entropy, one thread a row and a block a row, against the CPU
/// loss in float64: with label smoothing 0.1 and without, 10 classes and ImageNet's 1000,
/// logits rounded to halves in one case so that rows hold tied maxima (the first counts): the
/// loss within 1e-6, the gradient within 1e-5, the count of right answers exact.
fn smoothed_cross_entropy_matches_the_cpu_loss() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let k = TrainKernels::new(d, &g)?;
    let seed = fresh_seed();
    println!("seed {seed}");
    for (case, (rows, classes, eps, ties)) in [
        (13, 10, 0.1, false),
        (256, 1000, 0.1, false),
        (300, 1000, 0.0, false),
        (64, 1000, 0.1, true),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = seed + 2 * case as u64;
        let logits: Vec<f32> = normal_f32(rows * classes, seed)
            .iter()
            .map(|v| {
                if ties {
                    (2.0 * v).round() * 0.5
                } else {
                    3.0 * v
                }
            })
            .collect();
        let labels: Vec<u32> = uniform_f32(rows, seed + 1)
            .iter()
            .map(|v| (((v + 1.0) * 0.5 * classes as f32) as u32).min(classes as u32 - 1))
            .collect();
        let mut grad64 = Vec::new();
        let (loss64, correct64) =
            cross_entropy_smoothed(&wide(&logits), classes, &labels, eps, &mut grad64);
        let lb = up(&g, &logits, DType::F32)?;
        let cb = g.upload(gpukit_tensor::codec::bytes_of(&labels))?;
        for per_block in [false, true] {
            let (gb, loss_b, correct_b) = (g.alloc(logits.len() * 4)?, g.alloc(8)?, g.alloc(4)?);
            if per_block {
                let part = g.alloc(rows * 16)?;
                k.cross_entropy_rows(
                    (lb.view(), cb.view(), Some(gb.view())),
                    DType::F32,
                    (rows, classes),
                    None,
                    (1.0, eps as f32),
                    part.view(),
                    (loss_b.view(), correct_b.view()),
                )?;
            } else {
                k.cross_entropy(
                    lb.view(),
                    cb.view(),
                    Some(gb.view()),
                    DType::F32,
                    (rows, classes),
                    None,
                    (1.0, eps as f32),
                    loss_b.view(),
                    correct_b.view(),
                )?;
            }
            let grad = down(&g, &gb, logits.len(), DType::F32)?;
            let loss_bytes = g.download(&loss_b)?;
            let loss = f64::from_ne_bytes(loss_bytes[..8].try_into().map_err(|_| "loss bytes")?);
            let cbytes = g.download(&correct_b)?;
            let correct = u32::from_ne_bytes(cbytes[..4].try_into().map_err(|_| "count bytes")?);
            let what = format!(
                "{rows}x{classes} eps {eps}{} ({})",
                if ties { " with ties" } else { "" },
                if per_block {
                    "a block a row"
                } else {
                    "a thread a row"
                }
            );
            check(
                &format!("loss {what}"),
                (loss - loss64).abs() / loss64.abs(),
                1e-6,
            )?;
            check(&format!("gradient {what}"), rel(&grad, &grad64), 1e-5)?;
            if correct as usize != correct64 {
                return Err(
                    format!("{what}: {correct} right on the GPU, {correct64} on the CPU").into(),
                );
            }
        }
    }
    Ok(())
}

/// The CNN's own kernels against the CPU layers in f32, bit for bit (the same operations in
/// the same order): ReLU, residual add + ReLU, global average pooling and its backward.
fn cnn_kernels_match_the_cpu_bit_for_bit() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let k = CnnKernels::new(d, &g)?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let shape = [3, 5, 7, 6];
    let len: usize = shape.iter().product();
    let (y, z) = (normal_f32(len, seed), normal_f32(len, seed + 1));
    let (yb, zb) = (up(&g, &y, DType::F32)?, up(&g, &z, DType::F32)?);
    k.add_relu(yb.view(), Some(zb.view()), DType::F32, len)?;
    let mut want = Tensor::from_vec(shape, y.clone());
    add_inplace(&mut want, &Tensor::from_vec(shape, z));
    relu_inplace(&mut want);
    if down(&g, &yb, len, DType::F32)? != want.data {
        return Err("add_relu differs from the CPU's add then ReLU".into());
    }
    let rb = up(&g, &y, DType::F32)?;
    k.add_relu(rb.view(), None, DType::F32, len)?;
    let mut want = Tensor::from_vec(shape, y.clone());
    relu_inplace(&mut want);
    if down(&g, &rb, len, DType::F32)? != want.data {
        return Err("add_relu without z differs from the CPU's ReLU".into());
    }
    let planes = shape[0] * shape[1];
    let plane = shape[2] * shape[3];
    let xb = up(&g, &y, DType::F32)?;
    let fb = g.alloc(planes * 4)?;
    k.avg_pool(xb.view(), fb.view(), DType::F32, (planes, plane))?;
    let x = Tensor::from_vec(shape, y);
    if down(&g, &fb, planes, DType::F32)? != avgpool_forward(&x) {
        return Err("avg_pool differs from the CPU's".into());
    }
    let dy = normal_f32(planes, seed + 2);
    let (dyb, dxb) = (up(&g, &dy, DType::F32)?, g.alloc(len * 4)?);
    k.avg_pool_back(dyb.view(), dxb.view(), DType::F32, (planes, plane))?;
    if down(&g, &dxb, len, DType::F32)? != avgpool_backward(shape, &dy).data {
        return Err("avg_pool_back differs from the CPU's".into());
    }
    // channels-last: the same sums in the same order
    let xl = up(&g, &to_layout(&x.data, shape, Layout::Nhwc), DType::F32)?;
    k.avg_pool_nhwc(xl.view(), fb.view(), DType::F32, (planes, plane, shape[1]))?;
    if down(&g, &fb, planes, DType::F32)? != avgpool_forward(&x) {
        return Err("avg_pool_nhwc differs from the CPU's".into());
    }
    k.avg_pool_back_nhwc(
        dyb.view(),
        dxb.view(),
        DType::F32,
        (planes, plane, shape[1]),
    )?;
    let back = from_layout(&down(&g, &dxb, len, DType::F32)?, shape, Layout::Nhwc);
    if back != avgpool_backward(shape, &dy).data {
        return Err("avg_pool_back_nhwc differs from the CPU's".into());
    }
    for dtype in [DType::F32, DType::Bf16] {
        let src = up(&g, &x.data, dtype)?;
        let dst = g.alloc(len * dtype.size_bytes())?;
        g.copy_view(dst.view(), src.view(), len * dtype.size_bytes())?;
        if down(&g, &dst, len, dtype)? != round_f32(&x.data, dtype) {
            return Err(format!("copy of {dtype:?} changed values").into());
        }
    }
    Ok(())
}

fn main() {
    run(
        vec![
            (
                "gpu_cnn::convolutions_match_the_cpu_layer",
                convolutions_match_the_cpu_layer,
            ),
            (
                "gpu_cnn::batch_norm_matches_the_cpu_layer",
                batch_norm_matches_the_cpu_layer,
            ),
            (
                "gpu_cnn::max_pooling_matches_the_cpu_layer",
                max_pooling_matches_the_cpu_layer,
            ),
            (
                "gpu_cnn::smoothed_cross_entropy_matches_the_cpu_loss",
                smoothed_cross_entropy_matches_the_cpu_loss,
            ),
            (
                "gpu_cnn::cnn_kernels_match_the_cpu_bit_for_bit",
                cnn_kernels_match_the_cpu_bit_for_bit,
            ),
        ],
        vec![],
    );
}
