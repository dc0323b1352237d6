//! cuBLASLt matrix multiplies with transposes, mixed storage types and fused epilogues (bias,
//! ReLU with its bit mask, ReLU's and the bias's gradients): the linear layers of the training
//! engine, forward and backward, each in one library call.
//!
//! Column-major, as cuBLASLt is: `D (m x n) = op(A) op(B) (+ beta D)`, each matrix stored
//! column-major with its leading dimension. A row-major `rows x cols` matrix is the
//! column-major `cols x rows` matrix on the same bytes, which is how the engine above maps its
//! row-major tensors (see gpukit-train's gpu module).
//!
//! To use: [`crate::blas::Blas::lt_matmul`] builds a [`LtMatmul`] for a [`MatmulSpec`] (its
//! algorithm is the heuristic's first choice, so the same shape always runs the same kernel and
//! training is reproducible bit for bit); `None` when cuBLASLt has no algorithm for that
//! combination (the caller then runs the plain product and its own epilogue kernels). Then
//! [`crate::blas::Blas::run_lt`] with the operands.

use crate::blas::Blas;
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cublaslt::sys as lt;
use gpukit_types::DType;
use std::ffi::c_void;

/// What cuBLASLt does to the product before writing D.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// D = AB.
    None,
    /// D = AB + bias (bias: m values, broadcast over the columns).
    Bias,
    /// D = relu(AB + bias), and the mask of positive values (one bit each) to `aux`.
    ReluAuxBias,
    /// D = relu(AB + bias) without a mask (evaluation).
    ReluBias,
    /// D = AB masked by a forward ReLU's bits in `aux`; bias = the sum of D over its columns
    /// (the gradient of the previous layer's bias).
    DreluBgrad,
    /// D = AB masked by a forward ReLU's bits (no bias gradient).
    Drelu,
    /// D = AB; bias = the sum of op(B) over the k dimension (n values): the gradient of this
    /// layer's bias, taken while its weight gradient is computed.
    BgradB,
    /// D = relu(AB).
    Relu,
    /// D = gelu(AB), GELU by cuBLASLt's tanh approximation (within 16-bit rounding of the erf
    /// form; for 16-bit outputs only).
    Gelu,
    /// D = gelu(AB + bias), the same approximation.
    GeluBias,
}

impl Epilogue {
    fn raw(self) -> lt::cublasLtEpilogue_t {
        use lt::cublasLtEpilogue_t as E;
        match self {
            Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::ReluAuxBias => E::CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
            Epilogue::ReluBias => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::DreluBgrad => E::CUBLASLT_EPILOGUE_DRELU_BGRAD,
            Epilogue::Drelu => E::CUBLASLT_EPILOGUE_DRELU,
            Epilogue::BgradB => E::CUBLASLT_EPILOGUE_BGRADB,
            Epilogue::Relu => E::CUBLASLT_EPILOGUE_RELU,
            Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::GeluBias => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        }
    }

    /// Whether the epilogue reads or writes the bias vector.
    pub fn uses_bias(self) -> bool {
        !matches!(
            self,
            Epilogue::None | Epilogue::Drelu | Epilogue::Relu | Epilogue::Gelu
        )
    }

    /// Whether it writes (ReluAuxBias) or reads (DreluBgrad) the ReLU bit mask.
    pub fn uses_mask(self) -> bool {
        matches!(
            self,
            Epilogue::ReluAuxBias | Epilogue::DreluBgrad | Epilogue::Drelu
        )
    }
}

/// Rows of a ReLU bit mask's leading dimension: cuBLASLt wants a multiple of 128 bits.
pub fn mask_ld(rows: usize) -> usize {
    rows.div_ceil(128) * 128
}

/// Bytes of the bit mask of an `rows x cols` output.
pub fn mask_bytes(rows: usize, cols: usize) -> usize {
    mask_ld(rows) / 8 * cols
}

/// One matrix multiply: shape, transposes, types and epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// op(A) = A^T (A stored k x m) rather than A (stored m x k).
    pub trans_a: bool,
    /// op(B) = B^T (B stored n x k) rather than B (stored k x n).
    pub trans_b: bool,
    /// Type of A and B, and the arithmetic (Tf32: f32 storage on TF32 tensor cores).
    pub inputs: DType,
    /// Storage type of C and D (F32 with 16-bit inputs: gradients kept in f32).
    pub output: DType,
    pub epilogue: Epilogue,
    /// Type of the epilogue's bias vector (or bias gradient): F32, or the output's type.
    pub bias_type: DType,
    /// B's leading dimension where B is a block of a wider matrix (None: its stored rows).
    pub b_ld: Option<usize>,
    /// Multiprocessors the heuristic plans the product for, when fewer than the GPU's: the
    /// rest are left to work beside it on another stream (NCCL's kernels), which a product
    /// that keeps every multiprocessor busy until it ends would shut out. None: all of them.
    pub sm_count_target: Option<u32>,
}

impl MatmulSpec {
    fn stored(&self) -> [(usize, usize); 3] {
        let a = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let b = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        [a, b, (self.m, self.n)]
    }

    /// Bytes A, B and D take (B: from its first element to its last, through its leading
    /// dimension).
    pub fn bytes(&self) -> [usize; 3] {
        let [a, b, d] = self.stored();
        let (i, o) = (self.inputs.size_bytes(), self.output.size_bytes());
        let b_span = match self.b_ld {
            Some(ld) if b.1 > 0 => ld * (b.1 - 1) + b.0,
            _ => b.0 * b.1,
        };
        [a.0 * a.1 * i, b_span * i, d.0 * d.1 * o]
    }
}

/// A built cuBLASLt matmul: descriptors and the chosen algorithm.
pub struct LtMatmul {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
    workspace_bytes: usize,
    pub spec: MatmulSpec,
}

impl LtMatmul {
    /// Bytes of the Blas's workspace the chosen algorithm uses (0: none).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }
}

// SAFETY: the descriptors are plain host structures owned by this value; cuBLASLt allows using
// them from any thread as long as calls on one descriptor do not overlap. The value stays !Sync
// (raw pointers), so a shared reference never reaches two threads: run_lt's attribute setters
// cannot race.
unsafe impl Send for LtMatmul {}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        // SAFETY: created in build() and destroyed only here.
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.desc);
            for l in self.layouts {
                lt::cublasLtMatrixLayoutDestroy(l);
            }
        }
    }
}

fn lt_ok(call: &'static str, s: lt::cublasStatus_t) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::library("cuBLASLt", call, s))
    }
}

fn storage_type(d: DType) -> lt::cudaDataType {
    use lt::cudaDataType as D;
    match d.storage() {
        DType::F64 => D::CUDA_R_64F,
        DType::F16 => D::CUDA_R_16F,
        DType::Bf16 => D::CUDA_R_16BF,
        DType::F8E4M3 => D::CUDA_R_8F_E4M3,
        _ => D::CUDA_R_32F,
    }
}

fn set<T>(
    desc: lt::cublasLtMatmulDesc_t,
    attr: lt::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` is a live value of the attribute's documented type and size.
    lt_ok("cublasLtMatmulDescSetAttribute", unsafe {
        lt::cublasLtMatmulDescSetAttribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    })
}

impl Blas {
    /// Builds the matmul of `spec` with the heuristic's first algorithm; `Ok(None)` when
    /// cuBLASLt has none for it (a combination of types and epilogue it does not fuse).
    pub fn lt_matmul(&self, spec: MatmulSpec) -> Result<Option<LtMatmul>> {
        Ok(self.lt_matmul_candidates(spec, 1)?.into_iter().next())
    }

    /// Up to `max` builds of the matmul of `spec`, one a heuristic result in the heuristic's
    /// order (each with descriptors of its own); empty when cuBLASLt has none for it.
    pub fn lt_matmul_candidates(&self, spec: MatmulSpec, max: usize) -> Result<Vec<LtMatmul>> {
        let probe = self.describe(spec)?;
        let found = self.heuristics(&probe, max.max(1))?;
        let mut plans = Vec::with_capacity(found.len());
        // the first result keeps the descriptors it was found with; each other gets its own
        let mut probe = Some(probe);
        for (algo, workspace_bytes) in found {
            let mut plan = match probe.take() {
                Some(plan) => plan,
                None => self.describe(spec)?,
            };
            plan.algo = algo;
            plan.workspace_bytes = workspace_bytes;
            plans.push(plan);
        }
        Ok(plans)
    }

    /// The descriptors of `spec` (its algorithm not chosen yet).
    fn describe(&self, spec: MatmulSpec) -> Result<LtMatmul> {
        use lt::cublasLtMatmulDescAttributes_t as A;
        if spec.inputs.matmul_only() || spec.output.matmul_only() || spec.bias_type.matmul_only() {
            return Err(Error::Invalid(format!(
                "lt_matmul: {} is not a training type (fp8 products run through Blas::gemm_lt)",
                DType::F8E4M3
            )));
        }
        if spec.inputs == DType::F64
            || !matches!(spec.output.storage(), DType::F32)
                && spec.output.storage() != spec.inputs.storage()
        {
            return Err(Error::Invalid(format!(
                "lt_matmul: {} inputs with {} outputs are not a training combination",
                spec.inputs, spec.output
            )));
        }
        let compute = if spec.inputs == DType::Tf32 {
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let mut desc = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        lt_ok("cublasLtMatmulDescCreate", unsafe {
            lt::cublasLtMatmulDescCreate(&mut desc, compute, lt::cudaDataType::CUDA_R_32F)
        })?;
        let mut plan = LtMatmul {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            // SAFETY: a plain C struct; replaced by the heuristic's choice before any use.
            algo: unsafe { std::mem::zeroed() },
            workspace_bytes: 0,
            spec,
        };
        let op = |t: bool| -> i32 { i32::from(t) }; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
        set(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op(spec.trans_a))?;
        set(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op(spec.trans_b))?;
        set(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &spec.epilogue.raw())?;
        if spec.epilogue.uses_bias() {
            set(
                desc,
                A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &storage_type(spec.bias_type),
            )?;
        }
        if spec.epilogue.uses_mask() {
            set(
                desc,
                A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                &(mask_ld(spec.m) as i64),
            )?;
        }
        if let Some(sms) = spec.sm_count_target {
            set(
                desc,
                A::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                &i32::try_from(sms).unwrap_or(i32::MAX),
            )?;
        }
        if spec.b_ld.is_some_and(|ld| ld < spec.stored()[1].0) {
            return Err(Error::Invalid(format!(
                "a leading dimension of B ({:?}) below its {} stored rows",
                spec.b_ld,
                spec.stored()[1].0
            )));
        }
        let stored = spec.stored();
        let types = [spec.inputs, spec.inputs, spec.output];
        let lds = [stored[0].0, spec.b_ld.unwrap_or(stored[1].0), stored[2].0];
        for (slot, (((rows, cols), ty), ld)) in plan
            .layouts
            .iter_mut()
            .zip(stored.iter().zip(types).zip(lds))
        {
            // SAFETY: out-pointer to a field; plan's Drop destroys what was made.
            lt_ok("cublasLtMatrixLayoutCreate", unsafe {
                lt::cublasLtMatrixLayoutCreate(
                    slot,
                    storage_type(ty),
                    *rows as u64,
                    *cols as u64,
                    ld as i64,
                )
            })?;
        }
        Ok(plan)
    }

    /// Up to `max` of the heuristic's algorithms for `plan`'s descriptors, in its order, each
    /// with the workspace it needs (within this Blas's); empty where it has none.
    fn heuristics(
        &self,
        plan: &LtMatmul,
        max: usize,
    ) -> Result<Vec<(lt::cublasLtMatmulAlgo_t, usize)>> {
        let mut pref = std::ptr::null_mut();
        let ws = self.workspace_len() as u64;
        let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> =
            // SAFETY: plain C structs; all-zero is a valid "nothing yet".
            (0..max).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut count = 0;
        let requested = i32::try_from(max).unwrap_or(i32::MAX);
        // SAFETY: out-pointers to locals (`results` holds `requested` entries); the
        // descriptors are live (owned by plan).
        let found = unsafe {
            lt_ok(
                "cublasLtMatmulPreferenceCreate",
                lt::cublasLtMatmulPreferenceCreate(&mut pref),
            )
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
            .map(|_| {
                lt::cublasLtMatmulAlgoGetHeuristic(
                    self.lt_handle(),
                    plan.desc,
                    plan.layouts[0],
                    plan.layouts[1],
                    plan.layouts[2],
                    plan.layouts[2],
                    pref,
                    requested,
                    results.as_mut_ptr(),
                    &mut count,
                )
            })
        };
        // SAFETY: created above (or null, which is skipped).
        unsafe {
            if !pref.is_null() {
                lt::cublasLtMatmulPreferenceDestroy(pref);
            }
        }
        let status = found?;
        if status != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            // NOT_SUPPORTED and friends: no algorithm for this combination
            return Ok(Vec::new());
        }
        let count = usize::try_from(count).unwrap_or(0).min(max);
        Ok(results[..count]
            .iter()
            .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| (r.algo, r.workspaceSize))
            .collect())
    }

    /// Runs `plan`: `d = op(a) op(b) + beta * d` with its epilogue; `bias` is read (Bias,
    /// ReluBias, ReluAuxBias, GeluBias) or written (DreluBgrad, BgradB; those ignore beta for
    /// the bias: it is overwritten) in the spec's bias type; `mask` is written (ReluAuxBias) or
    /// read (DreluBgrad, Drelu).
    /// Enqueued on the Blas's stream; capturable.
    #[allow(clippy::too_many_arguments)]
    pub fn run_lt(
        &self,
        plan: &LtMatmul,
        a: View<'_>,
        b: View<'_>,
        d: View<'_>,
        beta: f32,
        bias: Option<View<'_>>,
        mask: Option<View<'_>>,
    ) -> Result<()> {
        self.run_lt_with(plan, (a, b, None, d), beta, bias, mask)
    }

    /// [`Blas::run_lt`] with C apart from D: `d = epilogue(op(a) op(b) + beta * c)`, `c` laid
    /// out as D (D itself when None).
    pub fn run_lt_with(
        &self,
        plan: &LtMatmul,
        (a, b, c, d): (View<'_>, View<'_>, Option<View<'_>>, View<'_>),
        beta: f32,
        bias: Option<View<'_>>,
        mask: Option<View<'_>>,
    ) -> Result<()> {
        use lt::cublasLtMatmulDescAttributes_t as A;
        let s = plan.spec;
        let [na, nb, nd] = s.bytes();
        a.require(na, "matmul A")?;
        b.require(nb, "matmul B")?;
        d.require(nd, "matmul D")?;
        let c = c.unwrap_or(d);
        c.require(nd, "matmul C")?;
        if s.epilogue.uses_bias() {
            let len = if s.epilogue == Epilogue::BgradB {
                s.n
            } else {
                s.m
            };
            let bias =
                bias.ok_or_else(|| Error::Invalid("matmul: the epilogue needs a bias".into()))?;
            bias.require(len * s.bias_type.size_bytes(), "matmul bias")?;
            set(
                plan.desc,
                A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias.addr(),
            )?;
        }
        if s.epilogue.uses_mask() {
            let mask = mask
                .ok_or_else(|| Error::Invalid("matmul: the epilogue needs a ReLU mask".into()))?;
            mask.require(mask_bytes(s.m, s.n), "matmul ReLU mask")?;
            set(
                plan.desc,
                A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                &mask.addr(),
            )?;
        }
        let one = 1f32;
        let (pa, pb, pc, pd, pw) = (
            a.addr(),
            b.addr(),
            c.addr(),
            d.addr(),
            self.workspace_addr(),
        );
        // SAFETY: sizes checked above; the descriptors live in `plan`; the workspace is the
        // Blas's and at least as large as the heuristic was told; alpha and beta are host f32
        // (scale type f32), read before the call returns.
        let status = unsafe {
            lt::cublasLtMatmul(
                self.lt_handle(),
                plan.desc,
                &one as *const f32 as *const c_void,
                pa as *const c_void,
                plan.layouts[0],
                pb as *const c_void,
                plan.layouts[1],
                &beta as *const f32 as *const c_void,
                pc as *const c_void,
                plan.layouts[2],
                pd as *mut c_void,
                plan.layouts[2],
                &plan.algo,
                pw as *mut c_void,
                plan.workspace_bytes.min(self.workspace_len()),
                self.stream_cu() as _,
            )
        };
        lt_ok("cublasLtMatmul", status)
    }
}
