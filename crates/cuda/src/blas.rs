//! Matrix multiply on the GPU through cuBLAS (`cublasGemmEx`) and cuBLASLt (heuristic
//! algorithms, each timed once per shape so the fastest is kept).
//!
//! To use:
//! 1. [`Blas::new`] on an open [`Gpu`] (checks that both libraries load first).
//! 2. [`Blas::gemm`] computes row-major `C = A * B` with the cuBLAS default algorithm;
//!    [`Blas::lt_candidates`] lists cuBLASLt's heuristic algorithms for a shape and
//!    [`Blas::gemm_lt`] runs one of them.
//!
//! Buffers are raw device bytes holding the storage type of the [`DType`] (`Tf32` is f32
//! storage computed on TF32 tensor cores); the library's own type enums are chosen here, at the
//! boundary.
//!
//! fp8 (E4M3, compute capability 8.9 and newer) runs on cuBLASLt only, in the one form its fp8
//! kernels take ("TN": in its column-major terms A transposed, B not): inputs E4M3, C and D
//! bf16 ([`DType::product_output`]), f32 accumulation and scales, the scale pointers left at
//! their default of 1. Row-major `C (m x n) = A (m x k) * B (k x n)` is column-major
//! `C^T = B^T A^T`, whose first operand must be stored transposed: for fp8, the `b` buffer holds
//! B transposed (n x k row-major: B column-major, as a linear layer's weight is kept). `a`
//! stays m x k row-major.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use crate::memory::{DeviceBuffer, View};
use crate::stream::Stream;
use cudarc::cublas::sys as cb;
use cudarc::cublaslt::sys as lt;
use gpukit_types::DType;
use std::ffi::c_void;

/// cuBLAS's and cuBLASLt's names for a [`DType`]'s storage, compute and scale types.
trait GemmTypes {
    fn cublas_types(self) -> (cb::cudaDataType, cb::cublasComputeType_t);
    fn lt_types(self) -> (lt::cudaDataType, lt::cublasComputeType_t, lt::cudaDataType);
    fn scalars(self) -> ([u8; 8], [u8; 8]);
}

impl GemmTypes for DType {
    fn cublas_types(self) -> (cb::cudaDataType, cb::cublasComputeType_t) {
        use cb::cublasComputeType_t as C;
        use cb::cudaDataType as D;
        match self {
            DType::F64 => (D::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
            DType::F32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            DType::Tf32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32),
            DType::F16 => (D::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
            DType::Bf16 => (D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
            // cublasGemmEx takes no fp8: the callers refuse it first (matmul_only)
            DType::F8E4M3 => (D::CUDA_R_8F_E4M3, C::CUBLAS_COMPUTE_32F),
        }
    }

    fn lt_types(self) -> (lt::cudaDataType, lt::cublasComputeType_t, lt::cudaDataType) {
        use lt::cublasComputeType_t as C;
        use lt::cudaDataType as D;
        match self {
            DType::F64 => (D::CUDA_R_64F, C::CUBLAS_COMPUTE_64F, D::CUDA_R_64F),
            DType::F32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F, D::CUDA_R_32F),
            DType::Tf32 => (
                D::CUDA_R_32F,
                C::CUBLAS_COMPUTE_32F_FAST_TF32,
                D::CUDA_R_32F,
            ),
            DType::F16 => (D::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, D::CUDA_R_32F),
            DType::Bf16 => (D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F, D::CUDA_R_32F),
            DType::F8E4M3 => (D::CUDA_R_8F_E4M3, C::CUBLAS_COMPUTE_32F, D::CUDA_R_32F),
        }
    }

    /// alpha = 1, beta = 0 in the scale type (f64 for F64, f32 otherwise).
    fn scalars(self) -> ([u8; 8], [u8; 8]) {
        match self {
            DType::F64 => (1f64.to_ne_bytes(), 0f64.to_ne_bytes()),
            _ => {
                let mut one = [0u8; 8];
                one[..4].copy_from_slice(&1f32.to_ne_bytes());
                (one, [0u8; 8])
            }
        }
    }
}

fn cb_ok(call: &'static str, s: cb::cublasStatus_t) -> Result<()> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::library("cuBLAS", call, s))
    }
}

fn lt_ok(call: &'static str, s: lt::cublasStatus_t) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::library("cuBLASLt", call, s))
    }
}

fn fp8_needs_lt() -> Error {
    Error::Invalid(
        "fp8 products run on cuBLASLt only (lt_candidates and gemm_lt), not cublasGemmEx".into(),
    )
}

/// The cuBLASLt layouts of row-major `C (m x n) = A (m x k) * B (k x n)` computed as
/// column-major `C^T = op(X) * A^T`: whether X (the library's A operand, our B) is read
/// transposed, and (rows, cols, leading dimension) of X, A^T and C^T. fp8 takes X stored
/// transposed (k x n column-major: B transposed, n x k row-major) and read with op T; the other
/// types read our row-major B as it is (n x k column-major, op N).
pub fn lt_layouts(ty: DType, m: usize, n: usize, k: usize) -> (bool, [(usize, usize, usize); 3]) {
    if ty == DType::F8E4M3 {
        (true, [(k, n, k), (k, m, k), (n, m, n)])
    } else {
        (false, [(n, k, n), (k, m, k), (n, m, n)])
    }
}

/// Workspace given to both libraries: NVIDIA recommends 32 MiB on Hopper.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// cuBLAS and cuBLASLt handles bound to one stream, with their workspace.
pub struct Blas {
    stream: Stream,
    handle: cb::cublasHandle_t,
    lt_handle: lt::cublasLtHandle_t,
    workspace: DeviceBuffer,
}

// SAFETY: cuBLAS and cuBLASLt handles may be used from any host thread, one at a time (the
// libraries are thread safe as long as a handle's configuration is not changed concurrently:
// it is set once, at creation). Blas is not Sync, so a handle shared between threads goes
// behind a lock, which serialises every use; its work is ordered on its one stream.
unsafe impl Send for Blas {}

/// One cuBLASLt algorithm for one shape and type, ready to run.
pub struct LtPlan {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
    workspace_bytes: usize,
    ty: DType,
    shape: (usize, usize, usize),
    /// The heuristic's rank (0 = its first choice).
    pub rank: usize,
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: created in lt_candidates and destroyed only here.
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.desc);
            for l in self.layouts {
                lt::cublasLtMatrixLayoutDestroy(l);
            }
        }
    }
}

impl Blas {
    /// Creates both handles on `gpu`'s stream; a missing library is an error naming what to
    /// install, never cudarc's panic.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Blas> {
        Self::with_workspace(discovery, gpu, WORKSPACE_BYTES)
    }

    /// As [`Blas::new`] with a workspace of `bytes` (algorithms that need more are not used;
    /// the inference engine runs one small GEMM per pass and takes 4 MiB).
    /// An error naming what to install when the search found no usable cuBLAS or cuBLASLt
    /// (nothing is loaded).
    pub fn require(discovery: &Discovery) -> Result<()> {
        for lib in [Lib::Cublas, Lib::CublasLt] {
            if !discovery.usable(lib) {
                return Err(Error::MissingLibrary(discovery.missing_message(lib)));
            }
        }
        Ok(())
    }

    pub fn with_workspace(discovery: &Discovery, gpu: &Gpu, bytes: usize) -> Result<Blas> {
        Self::on_stream(discovery, gpu, gpu.stream(), bytes)
    }

    /// As [`Blas::with_workspace`], its calls enqueued on `stream` instead of the device's work
    /// stream (independent products on two streams may overlap).
    pub fn on_stream(
        discovery: &Discovery,
        gpu: &Gpu,
        stream: &Stream,
        bytes: usize,
    ) -> Result<Blas> {
        Self::require(discovery)?;
        // SAFETY: asks the loader only.
        let present = unsafe { cb::is_culib_present() && lt::is_culib_present() };
        if !present {
            return Err(Error::MissingLibrary(
                "cuBLAS/cuBLASLt were found but did not load".into(),
            ));
        }
        gpu.bind()?;
        let workspace = gpu.alloc(bytes.max(256))?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        cb_ok("cublasCreate", unsafe { cb::cublasCreate_v2(&mut handle) })?;
        let mut lt_handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        if let Err(e) = lt_ok("cublasLtCreate", unsafe {
            lt::cublasLtCreate(&mut lt_handle)
        }) {
            // SAFETY: created just above.
            unsafe { cb::cublasDestroy_v2(handle) };
            return Err(e);
        }
        let blas = Blas {
            stream: stream.clone(),
            handle,
            lt_handle,
            workspace,
        };
        let ws = blas.workspace.addr();
        // SAFETY: the handle is live; the stream outlives it (held in self); the workspace is
        // owned by self and outlives the handle (dropped after it in Drop order below).
        unsafe {
            cb_ok(
                "cublasSetStream",
                cb::cublasSetStream_v2(blas.handle, blas.stream.cu() as _),
            )?;
            cb_ok(
                "cublasSetWorkspace",
                cb::cublasSetWorkspace_v2(blas.handle, ws as *mut c_void, blas.workspace.len()),
            )?;
        }
        Ok(blas)
    }

    pub(crate) fn lt_handle(&self) -> lt::cublasLtHandle_t {
        self.lt_handle
    }

    pub(crate) fn workspace_addr(&self) -> u64 {
        self.workspace.addr()
    }

    pub(crate) fn workspace_len(&self) -> usize {
        self.workspace.len()
    }

    /// The stream its calls are enqueued on (to time them with events).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub(crate) fn stream_cu(&self) -> cudarc::driver::sys::CUstream {
        self.stream.cu()
    }

    fn check_lens(
        ty: DType,
        a: usize,
        b: usize,
        c: usize,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        let (e, o) = (ty.size_bytes(), ty.product_output().size_bytes());
        for (what, have, need) in [
            ("A", a, m * k * e),
            ("B", b, k * n * e),
            ("C", c, m * n * o),
        ] {
            if have < need {
                return Err(Error::Invalid(format!(
                    "buffer too small for {m}x{n}x{k}: {what} has {have} bytes, needs {need}"
                )));
            }
        }
        Ok(())
    }

    /// Row-major `C (m x n) = A (m x k) * B (k x n)` through `cublasGemmEx`, default algorithm.
    /// (Column-major cuBLAS computes `C^T = B^T * A^T` on the same bytes.)
    pub fn gemm(
        &self,
        ty: DType,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        c: &mut DeviceBuffer,
        mnk: (usize, usize, usize),
    ) -> Result<()> {
        self.gemm_views(ty, a.view(), b.view(), c.view(), mnk)
    }

    /// As [`Blas::gemm`], on views (C is written through its view).
    pub fn gemm_views(
        &self,
        ty: DType,
        a: View<'_>,
        b: View<'_>,
        c: View<'_>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        if ty.matmul_only() {
            return Err(fp8_needs_lt());
        }
        Self::check_lens(ty, a.bytes(), b.bytes(), c.bytes(), (m, n, k))?;
        let (dt, compute) = ty.cublas_types();
        let (alpha, beta) = ty.scalars();
        let (pa, pb, pc) = (a.addr(), b.addr(), c.addr());
        // SAFETY: sizes checked above; pointers are live device memory on this stream; the
        // scalars live on the host for the duration of the call (cuBLAS reads them before
        // returning in host pointer mode, the default).
        let status = unsafe {
            cb::cublasGemmEx(
                self.handle,
                cb::cublasOperation_t::CUBLAS_OP_N,
                cb::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                alpha.as_ptr() as *const c_void,
                pb as *const c_void,
                dt,
                n as i32,
                pa as *const c_void,
                dt,
                k as i32,
                beta.as_ptr() as *const c_void,
                pc as *mut c_void,
                dt,
                n as i32,
                compute,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        cb_ok("cublasGemmEx", status)
    }

    /// `batch` row-major products `C_i (m x n) = op(A_i) * op(B_i)` through
    /// `cublasGemmStridedBatchedEx`: item i of each operand starts i * (its item size) elements
    /// in; `A_i` is stored `m x k`, or `k x m` read transposed when `trans_a`; `B_i` is `k x n`,
    /// or `n x k` read transposed when `trans_b`.
    pub fn gemm_batched(
        &self,
        ty: DType,
        (a, b, c): (View<'_>, View<'_>, View<'_>),
        (batch, m, n, k): (usize, usize, usize, usize),
        (trans_a, trans_b): (bool, bool),
    ) -> Result<()> {
        if ty.matmul_only() {
            return Err(fp8_needs_lt());
        }
        let e = ty.size_bytes();
        for (what, have, need) in [
            ("A", a.bytes(), batch * m * k * e),
            ("B", b.bytes(), batch * k * n * e),
            ("C", c.bytes(), batch * m * n * e),
        ] {
            if have < need {
                return Err(Error::Invalid(format!(
                    "batched gemm {batch} x {m}x{n}x{k}: {what} has {have} bytes, needs {need}"
                )));
            }
        }
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let dim = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| Error::Invalid(format!("{what} = {v} exceeds i32")))
        };
        let (bi, mi, ni, ki) = (
            dim(batch, "batch")?,
            dim(m, "m")?,
            dim(n, "n")?,
            dim(k.max(1), "k")?,
        );
        use cb::cublasOperation_t as Op;
        let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
        // column-major view of row-major data: C^T (n x m) = op(B)^T * op(A)^T
        let ldb = if trans_b { ki } else { ni };
        let lda = if trans_a { mi } else { ki };
        let (dt, compute) = ty.cublas_types();
        let (alpha, beta) = ty.scalars();
        let (pa, pb, pc) = (a.addr(), b.addr(), c.addr());
        // SAFETY: every operand holds `batch` items (checked above); the pointers are live device
        // memory used on this handle's stream; the scalars are read before the call returns.
        let status = unsafe {
            cb::cublasGemmStridedBatchedEx(
                self.handle,
                op(trans_b),
                op(trans_a),
                ni,
                mi,
                k as i32,
                alpha.as_ptr() as *const c_void,
                pb as *const c_void,
                dt,
                ldb,
                (k * n) as i64,
                pa as *const c_void,
                dt,
                lda,
                (m * k) as i64,
                beta.as_ptr() as *const c_void,
                pc as *mut c_void,
                dt,
                ni,
                (m * n) as i64,
                bi,
                compute,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        cb_ok("cublasGemmStridedBatchedEx", status)
    }

    /// Up to `max` cuBLASLt algorithms for this shape, in the heuristic's order.
    pub fn lt_candidates(
        &self,
        ty: DType,
        m: usize,
        n: usize,
        k: usize,
        max: usize,
    ) -> Result<Vec<LtPlan>> {
        let (dt, compute, scale) = ty.lt_types();
        let (out_dt, _, _) = ty.product_output().lt_types();
        let (trans_x, dims) = lt_layouts(ty, m, n, k);
        let make = || -> Result<(lt::cublasLtMatmulDesc_t, [lt::cublasLtMatrixLayout_t; 3])> {
            let mut desc = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            lt_ok("cublasLtMatmulDescCreate", unsafe {
                lt::cublasLtMatmulDescCreate(&mut desc, compute, scale)
            })?;
            // column-major view: D^T (n x m) = op(X) (n x k) * A^T (k x m), X our B (see
            // lt_layouts)
            let mut layouts = [std::ptr::null_mut(); 3];
            let types = [dt, dt, out_dt];
            let op_x: i32 = i32::from(trans_x); // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                                                // SAFETY: `op_x` is a live i32, the attribute's type.
            let transposed = lt_ok("cublasLtMatmulDescSetAttribute", unsafe {
                lt::cublasLtMatmulDescSetAttribute(
                    desc,
                    lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    &op_x as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
            });
            if let Err(e) = transposed {
                // SAFETY: created above, not shared.
                unsafe { lt::cublasLtMatmulDescDestroy(desc) };
                return Err(e);
            }
            for ((slot, (rows, cols, ld)), t) in layouts.iter_mut().zip(dims).zip(types) {
                // SAFETY: out-pointer to a local array slot.
                let s = unsafe {
                    lt::cublasLtMatrixLayoutCreate(slot, t, rows as u64, cols as u64, ld as i64)
                };
                if let Err(e) = lt_ok("cublasLtMatrixLayoutCreate", s) {
                    // SAFETY: destroy what was created so far.
                    unsafe {
                        lt::cublasLtMatmulDescDestroy(desc);
                        for l in layouts.iter().filter(|l| !l.is_null()) {
                            lt::cublasLtMatrixLayoutDestroy(*l);
                        }
                    }
                    return Err(e);
                }
            }
            Ok((desc, layouts))
        };
        let (desc, layouts) = make()?;
        let mut pref = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the attribute buffer is a live u64.
        let ws = self.workspace.len() as u64;
        let got = unsafe {
            lt_ok("cublasLtMatmulPreferenceCreate", lt::cublasLtMatmulPreferenceCreate(&mut pref))
                .and_then(|_| {
                    lt_ok(
                        "cublasLtMatmulPreferenceSetAttribute",
                        lt::cublasLtMatmulPreferenceSetAttribute(
                            pref,
                            lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                            &ws as *const u64 as *const c_void,
                            std::mem::size_of::<u64>(),
                        ),
                    )
                })
                .and_then(|_| {
                    let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> =
                        vec![std::mem::zeroed(); max.max(1)];
                    let mut count = 0;
                    lt_ok(
                        "cublasLtMatmulAlgoGetHeuristic",
                        lt::cublasLtMatmulAlgoGetHeuristic(
                            self.lt_handle,
                            desc,
                            layouts[0],
                            layouts[1],
                            layouts[2],
                            layouts[2],
                            pref,
                            results.len() as i32,
                            results.as_mut_ptr(),
                            &mut count,
                        ),
                    )?;
                    results.truncate(count.max(0) as usize);
                    Ok(results)
                })
        };
        // SAFETY: created above (null when creation failed, which destroy accepts).
        unsafe {
            if !pref.is_null() {
                lt::cublasLtMatmulPreferenceDestroy(pref);
            }
        }
        let results = match got {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: created above, not shared yet.
                unsafe {
                    lt::cublasLtMatmulDescDestroy(desc);
                    for l in layouts {
                        lt::cublasLtMatrixLayoutDestroy(l);
                    }
                }
                return Err(e);
            }
        };
        // SAFETY: we created these; they are dropped after the plans are built from fresh copies.
        unsafe {
            lt::cublasLtMatmulDescDestroy(desc);
            for l in layouts {
                lt::cublasLtMatrixLayoutDestroy(l);
            }
        }
        let mut plans = Vec::new();
        for (rank, r) in results
            .into_iter()
            .enumerate()
            .filter(|(_, r)| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        {
            let (desc, layouts) = make()?;
            plans.push(LtPlan {
                desc,
                layouts,
                algo: r.algo,
                workspace_bytes: r.workspaceSize,
                ty,
                shape: (m, n, k),
                rank,
            });
        }
        Ok(plans)
    }

    /// Runs one cuBLASLt plan: row-major `C = A * B` for the plan's shape (for fp8, `b` holds B
    /// transposed, n x k, and `c` is bf16: see the module's notes).
    pub fn gemm_lt(
        &self,
        plan: &LtPlan,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        c: &mut DeviceBuffer,
    ) -> Result<()> {
        Self::check_lens(plan.ty, a.len(), b.len(), c.len(), plan.shape)?;
        let (alpha, beta) = plan.ty.scalars();
        let (pa, pb, pc, pw) = (a.addr(), b.addr(), c.addr(), self.workspace.addr());
        // SAFETY: sizes checked; descriptors live as long as `plan`; the workspace is ours and
        // at least as large as the heuristic asked (it was told our size).
        let status = unsafe {
            lt::cublasLtMatmul(
                self.lt_handle,
                plan.desc,
                alpha.as_ptr() as *const c_void,
                pb as *const c_void,
                plan.layouts[0],
                pa as *const c_void,
                plan.layouts[1],
                beta.as_ptr() as *const c_void,
                pc as *const c_void,
                plan.layouts[2],
                pc as *mut c_void,
                plan.layouts[2],
                &plan.algo,
                pw as *mut c_void,
                plan.workspace_bytes.min(self.workspace.len()),
                self.stream.cu() as _,
            )
        };
        lt_ok("cublasLtMatmul", status)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: handles created in new() and destroyed only here; work queued on the stream
        // that uses the workspace is finished first.
        unsafe {
            let _ = self.stream.synchronize();
            cb::cublasDestroy_v2(self.handle);
            lt::cublasLtDestroy(self.lt_handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_layouts_are_the_tn_form_and_the_others_read_b_as_stored() {
        // m = 2, n = 3, k = 16: C^T is 3 x 2 column-major either way
        let (t, [x, at, ct]) = lt_layouts(DType::F8E4M3, 2, 3, 16);
        assert!(t, "fp8 reads its first operand transposed");
        // X stored k x n column-major (B transposed, n x k row-major), ld k
        assert_eq!(x, (16, 3, 16));
        assert_eq!(at, (16, 2, 16));
        assert_eq!(ct, (3, 2, 3));
        let (t, [x, ..]) = lt_layouts(DType::Bf16, 2, 3, 16);
        assert!(!t);
        assert_eq!(x, (3, 16, 3));
    }

    #[test]
    fn fp8_writes_bf16_and_is_refused_by_gemm_ex() {
        assert_eq!(DType::F8E4M3.lt_types().0, lt::cudaDataType::CUDA_R_8F_E4M3);
        assert_eq!(
            DType::F8E4M3.product_output().lt_types().0,
            lt::cudaDataType::CUDA_R_16BF
        );
        // C of a 4x4x16 fp8 product is bf16: 32 bytes, not 16
        assert!(Blas::check_lens(DType::F8E4M3, 64, 64, 16, (4, 4, 16)).is_err());
        assert!(Blas::check_lens(DType::F8E4M3, 64, 64, 32, (4, 4, 16)).is_ok());
        assert!(fp8_needs_lt().to_string().contains("cuBLASLt"));
    }
}
