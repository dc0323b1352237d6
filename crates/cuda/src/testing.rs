//! The gate of gpukit's GPU test binaries: with no GPU their tests are reported as ignored (with
//! the reason), never as passed; `GPUKIT_REQUIRE_GPU=1` (set on the GPU machine) turns "no GPU"
//! into a failure, so a broken discovery cannot pass there.

use crate::driver;
use crate::loader::{prepare_process, Discovery};

/// What a GPU test binary's `main` needs: the discovery, and why its tests are skipped (None
/// when a GPU is usable). Exits the process with code 1 when a GPU is required but absent.
pub fn gpu_test_gate() -> (Discovery, Option<String>) {
    let discovery = prepare_process();
    let require = std::env::var("GPUKIT_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let skip = match driver::probe(&discovery) {
        Ok(_) => None,
        Err(e) if require => {
            eprintln!("GPUKIT_REQUIRE_GPU=1 but no GPU is usable: {e}");
            std::process::exit(1);
        }
        Err(e) => Some(e.to_string()),
    };
    if let Some(r) = &skip {
        eprintln!("GPU tests SKIPPED (reported as ignored, not passed): {r}");
    }
    (discovery, skip)
}
