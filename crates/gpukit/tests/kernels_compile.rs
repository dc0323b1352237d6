//! Every CUDA C module of gpukit compiled by NVRTC for the architectures gpukit runs on, with no
//! GPU: a kernel that does not compile is found on the machine where it was written, not on a
//! lent GPU. Needs only NVRTC (its Python wheel will do: `pip install nvidia-cuda-nvrtc`, or
//! `GPUKIT_CUDA_PATH` at a folder that holds it); without it the tests are reported as ignored,
//! with the reason, never as passed. `GPUKIT_REQUIRE_NVRTC=1` makes a missing NVRTC a failure.
//! `GPUKIT_CUBIN_DIR=DIR` keeps each program's machine code in DIR (`{program}-{arch}.cubin`):
//! with `cuobjdump` (pip's `nvidia-cuda-cuobjdump`) a kernel's registers and instructions can be
//! read on a machine without a GPU.

use gpukit_cuda::kernel::{compile_offline, KernelSource, ARCH_SPECIFIC};
use gpukit_cuda::loader::{prepare_process, Discovery, Lib};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::{Arc, OnceLock};

/// Ampere (A100) and Hopper (H100, H200): the oldest and the newest gpukit is measured on.
const ARCHES: [&str; 2] = ["sm_80", "sm_90"];

fn modules() -> Vec<KernelSource> {
    vec![
        gpukit_cuda::pattern::kernel_source(),
        gpukit_tensor::kernels::kernel_source(),
        gpukit_models::gpu::kernels::kernel_source(),
        gpukit_models::gpu::program::kernels::kernel_source(),
        gpukit_models::gpu::program::kernels::channels_last_source(),
        gpukit_models::gpu::program::kernels::gemm::kernel_source(),
        gpukit_models::gpu::program::kernels::exact::kernel_source(),
        gpukit_models::gpu::program::kernels::stem::kernel_source(),
        gpukit_models::gpu::program::kernels::fp8_conv::kernel_source(),
        gpukit_train::gpu::kernels::kernel_source(),
        gpukit_train::cnn::gpu::kernels::kernel_source(),
        gpukit_bench::stress::kernels::kernel_source(),
    ]
}

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

fn main() {
    let discovery = prepare_process();
    let skip = (!discovery.usable(Lib::Nvrtc)).then(|| discovery.missing_message(Lib::Nvrtc));
    if let Some(why) = &skip {
        if std::env::var("GPUKIT_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            eprintln!("GPUKIT_REQUIRE_NVRTC=1 but NVRTC is missing: {why}");
            std::process::exit(1);
        }
        eprintln!("kernel compile tests SKIPPED (reported as ignored, not passed): {why}");
    }
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for module in modules() {
        let module = Arc::new(module);
        // an architecture-specific module (Hopper's wgmma) compiles for its one target
        let arches: &[&'static str] = match module.source.contains(ARCH_SPECIFIC) {
            true => &["sm_90a"],
            false => &ARCHES,
        };
        for &arch in arches {
            let m = Arc::clone(&module);
            let test = move || -> Result<(), Failed> {
                let discovery = DISCOVERY.get().ok_or("no discovery")?;
                let cubins = compile_offline(discovery, &m, arch).map_err(|e| e.to_string())?;
                if cubins.is_empty() || cubins.iter().any(|(_, c)| c.is_empty()) {
                    return Err(format!("{}: NVRTC gave no machine code for {arch}", m.stem).into());
                }
                // GPUKIT_CUBIN_DIR: each program's machine code kept there, to read its
                // registers and instructions with no GPU (`cuobjdump -res-usage` / `-sass`)
                if let Some(dir) = std::env::var_os("GPUKIT_CUBIN_DIR") {
                    for (name, cubin) in &cubins {
                        let path = std::path::Path::new(&dir).join(format!("{name}-{arch}.cubin"));
                        gpukit_types::files::write_atomically(&path, cubin)
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                    }
                }
                Ok(())
            };
            trials.push(
                Trial::test(format!("nvrtc::{}::{arch}", module.stem), test)
                    .with_ignored_flag(skip.is_some()),
            );
        }
    }
    // the check itself: a source with an error must fail, with NVRTC's log naming it
    trials.push(
        Trial::test("nvrtc::a_broken_source_fails", || -> Result<(), Failed> {
            let discovery = DISCOVERY.get().ok_or("no discovery")?;
            let broken = KernelSource {
                stem: "broken",
                source: "extern \"C\" __global__ void f(int* y) { *y = ; }".into(),
                names: vec!["f".into()],
            };
            match compile_offline(discovery, &broken, ARCHES[1]) {
                Ok(_) => Err("NVRTC compiled a source with a syntax error".into()),
                Err(e) if e.to_string().contains("broken") => Ok(()),
                Err(e) => Err(format!("the error does not name the module: {e}").into()),
            }
        })
        .with_ignored_flag(skip.is_some()),
    );
    libtest_mimic::run(&args, trials).exit();
}
