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

/// A seed that differs from run to run (tests print it with a failure so it can be replayed).
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7)
        | 1
}

/// `len` values uniform in [-1, 1) from `seed` (xorshift64): test inputs.
pub fn uniform_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
