//! Tensors on a GPU: cpu -> cuda -> cpu round trips byte-exact in every storage dtype, layout
//! changes of CUDA tensors, the golden rule (an op on a CPU and a CUDA tensor is a typed error
//! naming both devices) and ops on two CUDA tensors against the CPU, on fresh random inputs.
//! Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a missing GPU a failure.

use gpukit_cuda::loader::Discovery;
use gpukit_tensor::random::{fresh_seed, normal_f32, uniform_f32, Distribution};
use gpukit_tensor::{DType, Device, Devices, Error as TensorError, Layout, Tensor};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::OnceLock;

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

const CUDA0: Device = Device::Cuda(0);

fn devices() -> Result<Devices, Failed> {
    Ok(Devices::new(DISCOVERY.get().ok_or("no discovery")?.clone()))
}

fn expect(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

fn round_trip_is_byte_exact() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let shape = [3, 5, 7, 11];
    let x: Vec<f32> = uniform_f32(3 * 5 * 7 * 11, seed)
        .iter()
        .map(|v| v * 1000.0)
        .collect();
    for dtype in [DType::F32, DType::F16, DType::Bf16, DType::F64] {
        let cpu = Tensor::from_f32_as(&shape, &x, dtype)?;
        let gpu = cpu.to(CUDA0, &devices)?;
        expect(
            gpu.device() == CUDA0 && gpu.device_view().is_ok() && gpu.gpu().is_some(),
            || format!("{dtype}: on {}, not cuda:0", gpu.device()),
        )?;
        let back = gpu.to(Device::Cpu, &devices)?;
        expect(back.host_storage() == cpu.host_storage(), || {
            format!("{dtype}: bytes changed on the round trip (seed {seed})")
        })?;
        // read straight from the device too
        expect(gpu.to_bytes()? == cpu.to_bytes()?, || {
            format!("{dtype}: to_bytes differs")
        })?;
        expect(gpu.to_vec_f32()? == cpu.to_vec_f32()?, || {
            format!("{dtype}: to_vec_f32 differs")
        })?;
        // a strided view keeps its layout across devices
        let p = cpu.permute(&[3, 1, 0, 2])?;
        let pg = p.to(CUDA0, &devices)?;
        expect(pg.strides() == p.strides(), || {
            format!("{dtype}: strides changed on upload")
        })?;
        expect(pg.to_vec_f32()? == p.to_vec_f32()?, || {
            format!("{dtype}: permuted values differ")
        })?;
    }
    // empty tensors and zeros allocated on the device
    let empty = Tensor::zeros(&[0, 4], DType::F32)?.to(CUDA0, &devices)?;
    expect(empty.to_vec_f32()?.is_empty(), || "empty tensor".into())?;
    let z = Tensor::zeros_on(&[4, 3], DType::Bf16, CUDA0, &devices)?;
    expect(
        z.device() == CUDA0 && z.to_vec_f32()? == vec![0.0; 12],
        || "zeros_on".into(),
    )?;
    // one GPU opened, shared by every tensor
    expect(devices.open_ordinals() == vec![0], || {
        format!("opened {:?}", devices.open_ordinals())
    })?;
    Ok(())
}

fn to_nhwc_on_the_gpu() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let (n, c, h, w) = (2, 3, 9, 13);
    let x = uniform_f32(n * c * h * w, seed);
    let cpu = Tensor::from_f32(&[n, c, h, w], x.clone())?;
    for dtype in [DType::F32, DType::F16] {
        let cpu = cpu.to_dtype(dtype)?;
        let gpu = cpu.to(CUDA0, &devices)?.to_nhwc()?;
        expect(gpu.device() == CUDA0, || "to_nhwc left the GPU".into())?;
        expect(gpu.is_nhwc() && gpu.shape() == [n, c, h, w], || {
            format!("shape {:?} strides {:?}", gpu.shape(), gpu.strides())
        })?;
        expect(gpu.to_vec_f32()? == cpu.to_vec_f32()?, || {
            format!("{dtype}: logical values changed (seed {seed})")
        })?;
        // the device memory is what the CPU's channels-last copy holds
        let back = gpu.to(Device::Cpu, &devices)?;
        expect(back.host_storage() == cpu.to_nhwc()?.host_storage(), || {
            format!("{dtype}: device memory is not NHWC (seed {seed})")
        })?;
        let nchw = gpu.to_nchw()?;
        expect(
            nchw.device() == CUDA0 && nchw.is_contiguous() && nchw.to_bytes()? == cpu.to_bytes()?,
            || format!("{dtype}: to_nchw on the GPU"),
        )?;
        let r = gpu.contiguous()?.reshape(&[n * c, h * w])?;
        expect(r.to_vec_f32()? == cpu.to_vec_f32()?, || "reshape".into())?;
    }
    Ok(())
}

fn mixed_devices_are_a_typed_error() -> Result<(), Failed> {
    let devices = devices()?;
    let a = Tensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 4.0])?;
    let g = a.to(CUDA0, &devices)?;
    for (op, result, left, right) in [
        ("add", a.add(&g), Device::Cpu, CUDA0),
        ("add", g.add(&a), CUDA0, Device::Cpu),
        ("matmul", a.matmul(&g), Device::Cpu, CUDA0),
        ("matmul", g.matmul(&a), CUDA0, Device::Cpu),
    ] {
        match result {
            Err(TensorError::DeviceMismatch {
                op: o,
                left: l,
                right: r,
            }) if o == op && l == left && r == right => {}
            other => {
                return Err(
                    format!("{op} {left} {right}: expected DeviceMismatch, got {other:?}").into(),
                )
            }
        }
    }
    let msg = a.add(&g).err().map(|e| e.to_string()).unwrap_or_default();
    expect(
        msg == "add: tensors are on different devices (cpu and cuda:0): move one with .to(...) first",
        || format!("message: {msg}"),
    )?;
    // a device that does not exist is a typed error too
    match a.to(Device::Cuda(4096), &devices) {
        Err(TensorError::Cuda { .. }) => {}
        other => return Err(format!("cuda:4096: expected a Cuda error, got {other:?}").into()),
    }
    Ok(())
}

fn ops_on_two_gpu_tensors_match_the_cpu() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let shape = [4, 8, 16];
    let (x, y) = (uniform_f32(512, seed), uniform_f32(512, seed ^ 0x5555));
    for dtype in [DType::F32, DType::F16, DType::Bf16, DType::F64] {
        let (a, b) = (
            Tensor::from_f32_as(&shape, &x, dtype)?,
            Tensor::from_f32_as(&shape, &y, dtype)?,
        );
        let want = a.add(&b)?;
        let got = a.to(CUDA0, &devices)?.add(&b.to(CUDA0, &devices)?)?;
        expect(got.device() == CUDA0 && got.dtype() == dtype, || {
            format!("{dtype}: sum on {} as {}", got.device(), got.dtype())
        })?;
        expect(got.to_bytes()? == want.to_bytes()?, || {
            format!("{dtype}: GPU add differs from the CPU (seed {seed})")
        })?;
    }
    // strided operands on the GPU
    let a = Tensor::from_f32(&shape, x.clone())?.to(CUDA0, &devices)?;
    let b = Tensor::from_f32(&shape, y.clone())?.to(CUDA0, &devices)?;
    let got = a.permute(&[2, 0, 1])?.add(&b.permute(&[2, 0, 1])?)?;
    let want: Vec<f32> = Tensor::from_f32(&shape, x.iter().zip(&y).map(|(p, q)| p + q).collect())?
        .permute(&[2, 0, 1])?
        .to_vec_f32()?;
    expect(got.to_vec_f32()? == want, || {
        format!("permuted GPU add (seed {seed})")
    })?;
    // products on the GPU go through cuBLAS: checked against f64 in `products_match_f64`
    Ok(())
}

fn between_gpus() -> Result<(), Failed> {
    let devices = devices()?;
    let x = uniform_f32(300, fresh_seed());
    let cpu = Tensor::from_f32_as(&[3, 100], &x, DType::Bf16)?;
    let g0 = cpu.to(CUDA0, &devices)?;
    match g0.to(Device::Cuda(1), &devices) {
        Ok(g1) => {
            expect(g1.device() == Device::Cuda(1), || "not on cuda:1".into())?;
            expect(g1.to_bytes()? == cpu.to_bytes()?, || {
                "cuda:0 -> cuda:1".into()
            })?;
            match g0.add(&g1) {
                Err(TensorError::DeviceMismatch { .. }) => Ok(()),
                other => Err(format!("cuda:0 + cuda:1: got {other:?}").into()),
            }
        }
        // one GPU: a typed error naming the missing device
        Err(TensorError::Cuda {
            device: Device::Cuda(1),
            ..
        }) => Ok(()),
        Err(e) => Err(format!("cuda:0 -> cuda:1: {e}").into()),
    }
}

/// The engines' view of an arena: tensors over ranges of one shared device buffer, written from
/// CPU tensors (in either layout) and read back, and a range past the buffer refused.
fn tensors_in_a_shared_buffer() -> Result<(), Failed> {
    let devices = devices()?;
    let gpu = devices.gpu(0)?;
    let arena = std::sync::Arc::new(gpu.alloc(1 << 16).map_err(|e| e.to_string())?);
    let (n, c, h, w) = (2, 3, 4, 5);
    let x = uniform_f32(n * c * h * w, fresh_seed());
    let cpu = Tensor::from_f32(&[n, c, h, w], x.clone())?;
    let mut nchw = Tensor::in_buffer(&gpu, &arena, 0, &[n, c, h, w], DType::F32, Layout::Nchw)?;
    let mut nhwc = Tensor::in_buffer(&gpu, &arena, 4096, &[n, c, h, w], DType::F32, Layout::Nhwc)?;
    nchw.write(&cpu)?;
    nhwc.write(&cpu)?;
    expect(nchw.to_vec_f32()? == x, || "NCHW view round trip".into())?;
    expect(nhwc.to_vec_f32()? == x, || "NHWC view round trip".into())?;
    // the NHWC view's memory is channels-last: the same bytes as the CPU's to_nhwc
    let raw = Tensor::in_buffer(
        &gpu,
        &arena,
        4096,
        &[n * c * h * w],
        DType::F32,
        Layout::Nchw,
    )?;
    expect(
        raw.to_bytes()? == cpu.to_nhwc()?.host_storage().unwrap_or_default(),
        || "NHWC view is not channels-last in memory".into(),
    )?;
    expect(
        nchw.device_view().map(|v| v.bytes()).ok() == Some(n * c * h * w * 4),
        || "device view size".into(),
    )?;
    match Tensor::in_buffer(&gpu, &arena, 1 << 16, &[1], DType::F32, Layout::Nchw) {
        Err(TensorError::ViewPastBuffer { .. }) => Ok(()),
        other => Err(format!("a view past the arena: got {other:?}").into()),
    }
}

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::Bf16, DType::F64];

/// Relative spacing of the dtype's values (one unit in the last place at 1.0).
fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-10),
        DType::Bf16 => 2f64.powi(-7),
        _ => f32::EPSILON as f64,
    }
}

fn random_on_the_device() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let n = 1 << 20;
    for dtype in DTYPES {
        for dist in [Distribution::Normal, Distribution::Uniform] {
            let t = Tensor::random(&[1024, 1024], dtype, CUDA0, &devices, seed, dist)?;
            expect(t.device() == CUDA0 && t.dtype() == dtype, || {
                format!("{dtype} {dist:?}: made on {}", t.device())
            })?;
            let v = t.to_vec_f64()?;
            let mean = v.iter().sum::<f64>() / n as f64;
            let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
            let (want_var, lo, hi) = match dist {
                Distribution::Normal => (1.0, f64::NEG_INFINITY, f64::INFINITY),
                Distribution::Uniform => (1.0 / 3.0, -1.0, 1.0),
            };
            // 6 standard errors of the mean; variance within 2%
            expect(mean.abs() < 6.0 * (want_var / n as f64).sqrt(), || {
                format!("{dtype} {dist:?}: mean {mean} (seed {seed})")
            })?;
            expect((var / want_var - 1.0).abs() < 0.02, || {
                format!("{dtype} {dist:?}: variance {var}, want {want_var} (seed {seed})")
            })?;
            // uniform draws stay in [-1, 1) (16-bit types may round up to 1.0)
            let top_ok = |x: f64| x < hi || (x == hi && dtype.size_bytes() == 2);
            expect(
                v.iter().all(|&x| x.is_finite() && x >= lo && top_ok(x)),
                || format!("{dtype} {dist:?}: a value outside the range (seed {seed})"),
            )?;
            let zeros = v.iter().filter(|&&x| x == 0.0).count();
            expect(zeros < n / 1000, || {
                format!("{dtype} {dist:?}: {zeros} zeros (seed {seed})")
            })?;
            // the same seed draws the same values, another seed others
            let again = Tensor::random(&[1024, 1024], dtype, CUDA0, &devices, seed, dist)?;
            expect(again.to_bytes()? == t.to_bytes()?, || {
                format!("{dtype} {dist:?}: one seed, two draws (seed {seed})")
            })?;
            let other = Tensor::random(&[1024, 1024], dtype, CUDA0, &devices, seed ^ 1, dist)?;
            let same = other
                .to_vec_f64()?
                .iter()
                .zip(&v)
                .filter(|(a, b)| a == b)
                .count();
            expect(same < n / 100, || {
                format!(
                    "{dtype} {dist:?}: seeds {seed} and {} agree at {same} places",
                    seed ^ 1
                )
            })?;
        }
    }
    Ok(())
}

fn elementwise_matches_the_cpu_bit_for_bit() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let shape = [33, 65, 17];
    let n = 33 * 65 * 17;
    let (mut x, mut y) = (normal_f32(n, seed), normal_f32(n, seed ^ 0x77));
    // overflow in f16, subnormal results, and a sum that needs more than the wide type's bits
    x[..4].copy_from_slice(&[65000.0, 1e-7, 3.0e38, 1.0]);
    y[..4].copy_from_slice(&[65000.0, 3e-8, 3.0e38, 1e-30]);
    for dtype in DTYPES {
        let (a, b) = (
            Tensor::from_f32_as(&shape, &x, dtype)?,
            Tensor::from_f32_as(&shape, &y, dtype)?,
        );
        let (ga, gb) = (a.to(CUDA0, &devices)?, b.to(CUDA0, &devices)?);
        let same = |what: &str, got: &Tensor, want: &Tensor| -> Result<(), Failed> {
            expect(got.device() == CUDA0, || {
                format!("{dtype} {what}: on {}", got.device())
            })?;
            expect(got.to_bytes()? == want.to_bytes()?, || {
                format!("{dtype} {what}: GPU differs from the CPU (seed {seed})")
            })
        };
        same("add", &ga.add(&gb)?, &a.add(&b)?)?;
        same("mul", &ga.mul(&gb)?, &a.mul(&b)?)?;
        same("add_scalar", &ga.add_scalar(0.3)?, &a.add_scalar(0.3)?)?;
        same("mul_scalar", &ga.mul_scalar(2.0)?, &a.mul_scalar(2.0)?)?;
        // contiguous rows at an offset: row 16 starts on 16 bytes (the vectorised kernel), row 1
        // does not (the general one)
        for row in [1, 16] {
            let (ra, rb) = (a.select(row)?, b.select(row)?);
            let (gra, grb) = (ga.select(row)?, gb.select(row)?);
            same(&format!("row {row} add"), &gra.add(&grb)?, &ra.add(&rb)?)?;
            same(
                &format!("row {row} mul_scalar"),
                &gra.mul_scalar(0.7)?,
                &ra.mul_scalar(0.7)?,
            )?;
        }
        // strided operands: a permuted view times a transposed one
        let (pa, pb) = (a.permute(&[2, 0, 1])?, b.permute(&[2, 0, 1])?);
        let (gpa, gpb) = (ga.permute(&[2, 0, 1])?, gb.permute(&[2, 0, 1])?);
        same("permuted mul", &gpa.mul(&gpb)?, &pa.mul(&pb)?)?;
        // in place, on a fresh copy each time (clones of a GPU tensor share bytes)
        let fresh = || a.to(CUDA0, &devices);
        let mut g = fresh()?;
        g.add_assign(&gb)?;
        same("add_assign", &g, &a.add(&b)?)?;
        let mut g = fresh()?;
        g.mul_assign(&gb)?;
        same("mul_assign", &g, &a.mul(&b)?)?;
        let mut g = fresh()?;
        g.add_scalar_assign(1.5)?;
        g.mul_scalar_assign(2.0)?;
        same("scalar assigns", &g, &a.add_scalar(1.5)?.mul_scalar(2.0)?)?;
        // in place through a transposed view: the storage takes the values in its own layout
        let g = fresh()?;
        let mut gt = g.transpose(0, 2)?;
        gt.add_assign(&gb.transpose(0, 2)?)?;
        same("add_assign through a view", &g, &a.add(&b)?)?;
        // x += x.T of a square matrix: operands overlap at other strides
        let sq = Tensor::from_f32_as(&[64, 64], &x[..4096], dtype)?;
        let mut gsq = sq.to(CUDA0, &devices)?;
        let gsq_t = gsq.transpose(0, 1)?;
        gsq.add_assign(&gsq_t)?;
        same("x += x.T", &gsq, &sq.add(&sq.transpose(0, 1)?)?)?;
    }
    Ok(())
}

fn copies_match_the_cpu() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    for dtype in DTYPES {
        // transposed matrices (the tiled path), odd sizes, and a batch of them
        for shape in [vec![1000, 999], vec![3, 70, 45], vec![2, 1]] {
            let n: usize = shape.iter().product();
            let cpu = Tensor::from_f32_as(&shape, &uniform_f32(n, seed), dtype)?;
            let r = shape.len();
            let t = cpu.transpose(r - 2, r - 1)?;
            let got = t.to(CUDA0, &devices)?.contiguous()?;
            expect(got.is_contiguous() && got.shape() == t.shape(), || {
                format!(
                    "{dtype} {shape:?}: contiguous() gave strides {:?}",
                    got.strides()
                )
            })?;
            expect(got.to_bytes()? == t.contiguous()?.to_bytes()?, || {
                format!("{dtype} {shape:?}: transposed copy differs (seed {seed})")
            })?;
        }
        // a general permutation (the gather path) and channels-last
        let cpu = Tensor::from_f32_as(&[4, 6, 10, 12], &uniform_f32(2880, seed ^ 3), dtype)?;
        let g = cpu.to(CUDA0, &devices)?;
        let p = [3, 1, 0, 2];
        expect(
            g.permute(&p)?.contiguous()?.to_bytes()?
                == cpu.permute(&p)?.contiguous()?.to_bytes()?,
            || format!("{dtype}: permuted copy differs (seed {seed})"),
        )?;
        let nhwc = g.to_nhwc()?;
        expect(
            nhwc.is_nhwc() && nhwc.to_bytes()? == cpu.to_bytes()?,
            || format!("{dtype}: to_nhwc on the GPU changed values (seed {seed})"),
        )?;
    }
    Ok(())
}

fn sums_match_the_cpu() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let shape = [37, 300, 65];
    let n = 37 * 300 * 65;
    let x = normal_f32(n, seed);
    for dtype in DTYPES {
        let cpu = Tensor::from_f32_as(&shape, &x, dtype)?;
        let gpu = cpu.to(CUDA0, &devices)?;
        let abs = Tensor::from_f64_as(
            &shape,
            &cpu.to_vec_f64()?
                .iter()
                .map(|v| v.abs())
                .collect::<Vec<_>>(),
            DType::F64,
        )?;
        // both layouts of the input: as stored, and a permuted view
        for (label, c, g, a) in [
            ("", cpu.clone(), gpu.clone(), abs.clone()),
            (
                "permuted ",
                cpu.permute(&[2, 0, 1])?,
                gpu.permute(&[2, 0, 1])?,
                abs.permute(&[2, 0, 1])?,
            ),
        ] {
            for axis in 0..3 {
                let want = c.sum_axis(axis)?.to_vec_f64()?;
                let got = g.sum_axis(axis)?;
                let scale = a.sum_axis(axis)?.to_vec_f64()?;
                let got_v = got.to_vec_f64()?;
                expect(
                    got.shape() == c.sum_axis(axis)?.shape() && got_v.len() == want.len(),
                    || format!("{dtype} {label}axis {axis}: shape {:?}", got.shape()),
                )?;
                for (i, ((g, w), s)) in got_v.iter().zip(&want).zip(&scale).enumerate() {
                    // both round one f64 sum to the dtype: one unit apart at most
                    let tol = 2.0 * eps(dtype) * w.abs() + 1e-12 * s;
                    expect((g - w).abs() <= tol, || {
                        format!(
                            "{dtype} {label}axis {axis}: [{i}] GPU {g} vs CPU {w} (seed {seed})"
                        )
                    })?;
                }
            }
        }
        // the whole tensor (split across the device, then added up)
        let total = gpu.sum()?;
        let want = cpu.to_vec_f64()?.iter().sum::<f64>();
        let scale = abs.to_vec_f64()?.iter().sum::<f64>();
        let got = total.to_vec_f64()?;
        expect(total.shape().is_empty() && got.len() == 1, || {
            format!("{dtype}: sum() shape {:?}", total.shape())
        })?;
        expect(
            (got[0] - want).abs() <= 2.0 * eps(dtype) * want.abs() + 1e-12 * scale,
            || format!("{dtype}: sum() {} vs {want} (seed {seed})", got[0]),
        )?;
    }
    Ok(())
}

/// max |got - want| over max sum_k |a_ik b_kj|, against an f64 product of the same inputs.
fn product_error(
    got: &[f64],
    a: &[f64],
    b: &[f64],
    (batch, m, n, k): (usize, usize, usize, usize),
    b_t: bool,
) -> f64 {
    let mut worst = 0f64;
    let mut scale = 0f64;
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut sa) = (0f64, 0f64);
                for l in 0..k {
                    let av = a[p * m * k + i * k + l];
                    let bv = if b_t {
                        b[p * n * k + j * k + l]
                    } else {
                        b[p * k * n + l * n + j]
                    };
                    s += av * bv;
                    sa += (av * bv).abs();
                }
                worst = worst.max((got[p * m * n + i * n + j] - s).abs());
                scale = scale.max(sa);
            }
        }
    }
    worst / scale.max(f64::MIN_POSITIVE)
}

fn products_match_f64() -> Result<(), Failed> {
    let devices = devices()?;
    let seed = fresh_seed();
    let (batch, m, n, k) = (3, 37, 65, 129);
    let (x, y) = (
        normal_f32(batch * m * k, seed),
        normal_f32(batch * k * n, seed ^ 9),
    );
    for (dtype, tol) in [
        (DType::F64, 1e-13),
        (DType::F32, 2e-6),
        (DType::Tf32, 4e-3),
        (DType::F16, 4e-3),
        (DType::Bf16, 2e-2),
    ] {
        let a = Tensor::from_f32_as(&[batch, m, k], &x, dtype)?;
        let b = Tensor::from_f32_as(&[batch, k, n], &y, dtype)?;
        let (av, bv) = (a.to_vec_f64()?, b.to_vec_f64()?);
        let (ga, gb) = (a.to(CUDA0, &devices)?, b.to(CUDA0, &devices)?);
        let check =
            |what: &str, got: &Tensor, want_shape: &[usize], err: f64| -> Result<(), Failed> {
                expect(
                    got.device() == CUDA0 && got.shape() == want_shape && got.dtype() == dtype,
                    || {
                        format!(
                            "{dtype} {what}: {:?} {} on {}",
                            got.shape(),
                            got.dtype(),
                            got.device()
                        )
                    },
                )?;
                expect(err <= tol, || {
                    format!("{dtype} {what}: error {err:.3e} > {tol:.0e} (seed {seed})")
                })
            };
        let got = ga.bmm(&gb)?;
        check(
            "bmm",
            &got,
            &[batch, m, n],
            product_error(&got.to_vec_f64()?, &av, &bv, (batch, m, n, k), false),
        )?;
        // batch x batch^T, the notebook's bmm(batch, batch.transpose(-2, -1)): read in place
        let bt = ga.transpose(1, 2)?;
        let got = ga.bmm(&bt)?;
        check(
            "bmm with a transposed view",
            &got,
            &[batch, m, m],
            product_error(&got.to_vec_f64()?, &av, &av, (batch, m, m, k), true),
        )?;
        // a 2-D product, and one with a permuted (neither contiguous nor transposed) operand
        let a2 = ga.reshape(&[batch * m, k])?;
        let b2 = Tensor::from_f32_as(&[k, n], &y[..k * n], dtype)?;
        let got = a2.matmul(&b2.to(CUDA0, &devices)?)?;
        check(
            "matmul",
            &got,
            &[batch * m, n],
            product_error(
                &got.to_vec_f64()?,
                &av,
                &b2.to_vec_f64()?,
                (1, batch * m, n, k),
                false,
            ),
        )?;
        // one product with a transposed view (cublasGemmEx with its transpose flag)
        let got = a2.matmul(&a2.transpose(0, 1)?)?;
        check(
            "matmul with a transposed view",
            &got,
            &[batch * m, batch * m],
            product_error(
                &got.to_vec_f64()?,
                &av,
                &av,
                (1, batch * m, batch * m, k),
                true,
            ),
        )?;
        // [batch, m, k] at strides [k, batch * k, 1]: neither contiguous nor a transposed
        // batch, so it is copied before cuBLAS reads it
        let odd = ga.permute(&[1, 0, 2])?.contiguous()?.permute(&[1, 0, 2])?;
        expect(!odd.is_contiguous(), || {
            "the odd operand is contiguous".to_string()
        })?;
        let got = odd.bmm(&gb)?;
        check(
            "bmm of a permuted operand",
            &got,
            &[batch, m, n],
            product_error(&got.to_vec_f64()?, &av, &bv, (batch, m, n, k), false),
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
        ("gpu::round_trip_is_byte_exact", round_trip_is_byte_exact),
        ("gpu::to_nhwc_on_the_gpu", to_nhwc_on_the_gpu),
        (
            "gpu::mixed_devices_are_a_typed_error",
            mixed_devices_are_a_typed_error,
        ),
        (
            "gpu::ops_on_two_gpu_tensors_match_the_cpu",
            ops_on_two_gpu_tensors_match_the_cpu,
        ),
        ("gpu::between_gpus", between_gpus),
        (
            "gpu::tensors_in_a_shared_buffer",
            tensors_in_a_shared_buffer,
        ),
        ("gpu::random_on_the_device", random_on_the_device),
        (
            "gpu::elementwise_matches_the_cpu_bit_for_bit",
            elementwise_matches_the_cpu_bit_for_bit,
        ),
        ("gpu::copies_match_the_cpu", copies_match_the_cpu),
        ("gpu::sums_match_the_cpu", sums_match_the_cpu),
        ("gpu::products_match_f64", products_match_f64),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some()))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
