//! Tensors on a GPU: cpu -> cuda -> cpu round trips byte-exact in every storage dtype, layout
//! changes of CUDA tensors, the golden rule (an op on a CPU and a CUDA tensor is a typed error
//! naming both devices) and ops on two CUDA tensors against the CPU, on fresh random inputs.
//! Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a missing GPU a failure.

use gpukit_cuda::loader::Discovery;
use gpukit_tensor::random::{fresh_seed, uniform_f32};
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
    // matmul of two GPU tensors
    let (m, k, n) = (5, 7, 3);
    let (p, q) = (uniform_f32(m * k, seed ^ 1), uniform_f32(k * n, seed ^ 2));
    let (pc, qc) = (Tensor::from_f32(&[m, k], p)?, Tensor::from_f32(&[k, n], q)?);
    let want = pc.matmul(&qc)?;
    let got = pc.to(CUDA0, &devices)?.matmul(&qc.to(CUDA0, &devices)?)?;
    expect(
        got.device() == CUDA0 && got.to_bytes()? == want.to_bytes()?,
        || format!("GPU matmul differs (seed {seed})"),
    )?;
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
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some()))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
