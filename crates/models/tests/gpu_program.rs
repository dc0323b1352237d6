//! The general GPU engine against gpukit's graph interpreter on fresh random weights and
//! inputs: every ONNX fixture (ResNet, MobileNetV3, EfficientNet, RegNet, DenseNet and ConvNeXt
//! blocks, a flatten by shape arithmetic), every precision in both layouts, eager and replayed
//! as a CUDA graph. Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a
//! missing GPU a failure.

use gpukit_cuda::loader::Discovery;
use gpukit_models::gpu::program::{Program, ProgramSession};
use gpukit_models::gpu::{GpuContext, ENGINE_DTYPES};
use gpukit_models::graph::{forward_cpu, passes::optimize, Array, Graph};
use gpukit_models::onnx::{fixtures, import_model, ImportOptions};
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::{DType, Layout};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::OnceLock;

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-4,
        DType::Tf32 | DType::F16 => 2e-2,
        _ => 6e-2,
    }
}

fn rel(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let diff = got.iter().zip(want).fold(0f64, |m, (a, b)| {
        m.max((f64::from(*a) - f64::from(*b)).abs())
    });
    diff / scale.max(f64::MIN_POSITIVE)
}

fn graph(model: &gpukit_models::onnx::ModelProto, batch: usize) -> Result<Graph, Failed> {
    let options = ImportOptions {
        batch: Some(batch),
        dims: Vec::new(),
    };
    let mut g = import_model(model, None, "fixture", &options)?;
    optimize(&mut g)?;
    Ok(g)
}

fn every_fixture_matches_the_interpreter() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let mut failures = Vec::new();
    for batch in [2, 5] {
        for f in fixtures::all(fresh_seed()) {
            let g = graph(&f.model, batch)?;
            let inputs: Vec<Array> = g
                .inputs
                .iter()
                .map(|&i| {
                    let shape = g.value(i).shape.clone();
                    Array::f32(&shape, normal_f32(shape.iter().product(), fresh_seed()))
                })
                .collect();
            let want = forward_cpu(&g, &inputs)?;
            let xs: Vec<&[f32]> = inputs.iter().filter_map(Array::as_f32).collect();
            for dtype in ENGINE_DTYPES {
                for layout in [Layout::Nchw, Layout::Nhwc] {
                    let what = format!("{} batch {batch} {dtype} {layout:?}", f.name);
                    let p =
                        Program::lower(&g, dtype, layout).map_err(|e| format!("{what}: {e}"))?;
                    let mut s = ProgramSession::new(&ctx, discovery, &p, &mut |_| {})
                        .map_err(|e| format!("{what}: {e}"))?;
                    let eager = s.run(&xs).map_err(|e| format!("{what}: {e}"))?;
                    s.capture().map_err(|e| format!("{what}: capture: {e}"))?;
                    s.replay()?;
                    let replayed = s.outputs()?;
                    for (o, w) in want.iter().enumerate() {
                        let w = w.as_f32().ok_or("an output that is not f32")?;
                        let (e, r) = (rel(&eager[o], w), rel(&replayed[o], w));
                        if e > tolerance(dtype) || r > tolerance(dtype) {
                            failures.push(format!(
                                "{what} output {o}: eager {e:.1e}, replayed {r:.1e} (tolerance \
                                 {:.0e}); steps {:?}",
                                tolerance(dtype),
                                p.step_counts()
                            ));
                        }
                    }
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

fn main() {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    let trials = vec![Trial::test(
        "gpu::program::every_fixture_matches_the_interpreter",
        every_fixture_matches_the_interpreter,
    )
    .with_ignored_flag(skip.is_some())];
    libtest_mimic::run(&args, trials).exit();
}
