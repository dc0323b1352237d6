//! What the GPU CNN test binaries share: the GPU opened once, uploads and downloads in an element
//! type, float64 helpers, tolerance checks and layout permutations. Each binary uses part of it.
#![allow(dead_code)]

pub mod resnet;

use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu};
use gpukit_tensor::codec::{decode_f32, encode_f32};
use gpukit_train::cnn::gpu::layout::{channels_first, channels_last};
use gpukit_train::cnn::Tensor;
use gpukit_types::{DType, Layout};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::{Arc, OnceLock};

pub static DISCOVERY: OnceLock<Discovery> = OnceLock::new();
pub static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
/// One test at a time on the shared GPU stream.
pub static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn gpu() -> Result<(&'static Discovery, Arc<Gpu>), Failed> {
    let d = DISCOVERY.get().ok_or("no discovery")?;
    if GPU.get().is_none() {
        let _ = GPU.set(Arc::new(Gpu::open(d, 0)?));
    }
    Ok((d, GPU.get().ok_or("no GPU")?.clone()))
}

pub fn up(g: &Gpu, v: &[f32], dtype: DType) -> Result<DeviceBuffer, Failed> {
    Ok(g.upload(&encode_f32(v, dtype))?)
}

pub fn down(g: &Gpu, b: &DeviceBuffer, n: usize, dtype: DType) -> Result<Vec<f32>, Failed> {
    let bytes = g.download_from(b.view(), n * dtype.size_bytes())?;
    Ok(decode_f32(&bytes, dtype))
}

pub fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// The largest difference, relative to the reference's largest magnitude.
pub fn rel(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, f64::max)
        / scale
}

pub fn check(what: &str, err: f64, tol: f64) -> Result<(), Failed> {
    println!("  {what}: {err:.2e} (tolerance {tol:.0e})");
    if err <= tol {
        Ok(())
    } else {
        Err(format!("{what}: relative error {err:.3e} over {tol:.0e}").into())
    }
}

pub fn tensor64(shape: [usize; 4], v: &[f32]) -> Tensor<f64> {
    Tensor::from_vec(shape, wide(v))
}

/// NCHW values in `layout`'s order, and back.
pub fn to_layout(v: &[f32], [n, c, h, w]: [usize; 4], layout: Layout) -> Vec<f32> {
    match layout {
        Layout::Nchw => v.to_vec(),
        Layout::Nhwc => channels_last(v, (n, c, h * w)).unwrap_or_default(),
    }
}

pub fn from_layout(v: &[f32], [n, c, h, w]: [usize; 4], layout: Layout) -> Vec<f32> {
    match layout {
        Layout::Nchw => v.to_vec(),
        Layout::Nhwc => channels_first(v, (n, c, h * w)).unwrap_or_default(),
    }
}

/// A GPU test: its name and body.
pub type GpuTest = fn() -> Result<(), Failed>;

/// Runs `tests` one at a time on the shared GPU (ignored, with the reason, without one;
/// GPUKIT_REQUIRE_GPU=1 makes that a failure), then `diagnostics`, which run only when asked
/// for (`--ignored`).
pub fn run(tests: Vec<(&'static str, GpuTest)>, diagnostics: Vec<(&'static str, GpuTest)>) {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    let trial = |name: &'static str, f: GpuTest, ignored: bool| {
        Trial::test(name, move || {
            let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
            f()
        })
        .with_ignored_flag(ignored)
    };
    let trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| trial(name, f, skip.is_some()))
        .chain(
            diagnostics
                .into_iter()
                .map(|(name, f)| trial(name, f, true)),
        )
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
