//! Versions reported by the CUDA libraries themselves, for installs whose file names don't say.
//!
//! Each query opens the library (cheap for NVRTC and NCCL, slower for cuBLAS and cuDNN, which
//! map hundreds of megabytes), so callers ask only when [`crate::loader::Found::version`] is None.

use crate::loader::{Discovery, Lib};

/// The version the library reports, or None when it is missing or does not say.
pub fn api_version(discovery: &Discovery, lib: Lib) -> Option<String> {
    if !discovery.usable(lib) {
        return None;
    }
    match lib {
        Lib::Cudnn => {
            // SAFETY: presence checked first so cudarc's loader cannot panic; no arguments.
            if !unsafe { cudarc::cudnn::sys::is_culib_present() } {
                return None;
            }
            // SAFETY: as above.
            let v = unsafe { cudarc::cudnn::sys::cudnnGetVersion() };
            // 9.x encodes major*10000 + minor*100 + patch
            Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
        }
        Lib::Nccl => {
            // SAFETY: presence checked first.
            if !unsafe { cudarc::nccl::sys::is_culib_present() } {
                return None;
            }
            let mut v = 0;
            // SAFETY: `v` is a live local.
            let rc = unsafe { cudarc::nccl::sys::ncclGetVersion(&mut v) };
            (rc == cudarc::nccl::sys::ncclResult_t::ncclSuccess)
                .then(|| format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
        }
        Lib::Nvrtc => {
            // SAFETY: presence checked first.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return None;
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: both pointers are live locals.
            let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
            (rc == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS)
                .then(|| format!("{major}.{minor}"))
        }
        Lib::Cublas => {
            // SAFETY: presence checked first.
            if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return None;
            }
            use cudarc::cublas::sys::{cublasGetProperty, libraryPropertyType as P};
            let mut parts = [0; 3];
            for (slot, p) in
                parts
                    .iter_mut()
                    .zip([P::MAJOR_VERSION, P::MINOR_VERSION, P::PATCH_LEVEL])
            {
                // SAFETY: `slot` is a live local; no handle needed.
                let rc = unsafe { cublasGetProperty(p, slot) };
                if rc != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    return None;
                }
            }
            Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
        }
        Lib::CublasLt => {
            // SAFETY: presence checked first.
            if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
                return None;
            }
            // SAFETY: no arguments.
            let v = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
            Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
        }
        Lib::Cuda | Lib::Nvml | Lib::Cupti | Lib::Nvtx => None,
    }
}
