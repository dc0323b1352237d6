//! gpukit's first product on Hopper's warpgroup MMA (`wgmma`, decision 195, proposed): the
//! building block of an fp8 implicit product for the 3x3 convolutions that cuDNN's fp8 engines
//! run no faster than f16 (decision 194). `d [m, n] = scale x a [m, k] b [n, k]^T`, a and b
//! E4M3 with K contiguous (the only operand order Hopper's fp8 MMA takes), f32 sums, d f32.
//!
//! A block is one warpgroup (128 threads) and one 64 x 128 tile of d. Each step of 64 bytes of
//! K, the block stages its a and b rows in shared memory as "core matrices" (8 rows x 16
//! bytes, 128 contiguous bytes), those of one 8-row group next to each other along K (the
//! descriptor's leading offset, 128 bytes) and the groups one after another (its stride
//! offset, 4 x 128 bytes): the MMA's canonical K-major layout without swizzling. Then two
//! `wgmma.mma_async m64n128k32` (32 bytes of K each) read both operands from shared memory
//! through their descriptors, after a proxy fence that makes the threads' stores visible to the
//! MMA's reads. The accumulators stay in registers (64 a thread), in the mma.sync C layout a
//! warp a 16-row slice.
//!
//! This first version ([`Variant::Simple`]) stages with plain loads and waits for each step's
//! MMA: correct on the GPU (run 126), 215 TFLOP/s at 4096^3 against cuBLASLt's 1,306 (run 127).
//!
//! [`Variant::Pipelined`] is the next step: two warpgroups, a 128 x 128 tile, 128 bytes of K a
//! stage held in four stages of dynamic shared memory, filled by `cp.async` (16 bytes a
//! thread, zero-filled past the edges) in the 128-byte swizzled K-major layout the MMA reads
//! fastest (row r's 16-byte chunk c at r 128 + ((c ^ r % 8) 16) in 1024-byte atoms); each
//! stage's four MMAs are left running while the next stage is loaded (`wgmma.wait_group 1`).
//! TMA loads and a persistent schedule are the steps after. Not yet run on a GPU.
//!
//! Compiled for `sm_90a` only (architecture-specific: the module loads on compute capability
//! 9.0 alone).

use gpukit_cuda::kernel::{Arg, KernelModule, KernelSource, Launch, ARCH_SPECIFIC};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};

/// Rows of a and columns of d a block takes.
pub const BM: usize = 64;
/// Rows of b (columns of d) a block takes.
pub const BN: usize = 128;
/// Bytes of K a block stages at a time (K must be a multiple).
pub const BK: usize = 64;

/// The pipelined kernel's tile: rows of a, rows of b, bytes of K a stage, stages.
pub const PIPE_BM: usize = 128;
pub const PIPE_BN: usize = 128;
pub const PIPE_BK: usize = 128;
pub const PIPE_STAGES: usize = 4;
/// Its dynamic shared memory: the stages, and room to align them to 1024 bytes.
const PIPE_SHARED: usize = PIPE_STAGES * (PIPE_BM + PIPE_BN) * PIPE_BK + 1024;
// the stages fit Hopper's 227 KiB of shared memory a block
const _: () = assert!(PIPE_SHARED <= 227 * 1024);

/// Which of the module's kernels runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// One warpgroup, plain loads, each step's MMA waited for: k a multiple of [`BK`].
    Simple,
    /// Two warpgroups, `cp.async` into swizzled stages, the MMAs overlapped with the loads:
    /// k a multiple of 16.
    Pipelined,
}

/// The `wgmma` of one m64n128k32 step on the accumulators `acc` (64 floats a thread).
fn wgmma_call() -> String {
    let outs: Vec<String> = (0..64).map(|i| format!("%{i}")).collect();
    let binds: Vec<String> = (0..64).map(|i| format!("\"+f\"(acc[{i}])")).collect();
    format!(
        "asm volatile(\"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {{{}}}, %64, %65, 1, 1, 1;\\n\"\n        : {}\n        : \"l\"(da), \"l\"(db));",
        outs.join(", "),
        binds.join(", ")
    )
}

/// The module's CUDA C.
fn source() -> String {
    format!(
        r#"{ARCH_SPECIFIC}
#define F8_BM {BM}
#define F8_BN {BN}
#define F8_BK {BK}
#define F8_KG (F8_BK / 16)

// A shared-memory matrix descriptor without swizzling: the start address, the byte offset
// between core matrices next to each other along K (leading) and between 8-row groups
// (stride), each in units of 16 bytes.
__device__ __forceinline__ unsigned long long f8_desc(unsigned addr, unsigned lead, unsigned stride) {{
    return (unsigned long long)((addr >> 4) & 0x3FFF)
        | ((unsigned long long)((lead >> 4) & 0x3FFF) << 16)
        | ((unsigned long long)((stride >> 4) & 0x3FFF) << 32);
}}

// `rows` rows of `src` (row length k bytes, from byte k0) into `dst` as core matrices:
// 16-byte chunk kc of row r at ((r / 8) F8_KG + kc) 128 + (r % 8) 16; rows past `limit` zero.
__device__ __forceinline__ void f8_stage(unsigned char* dst, const unsigned char* src, int rows,
                                         int first, int limit, int k, int k0) {{
    for (int c = threadIdx.x; c < rows * F8_KG; c += 128) {{
        const int r = c / F8_KG, kc = c % F8_KG;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (first + r < limit) v = *(const uint4*)(src + (long long)(first + r) * k + k0 + kc * 16);
        *(uint4*)(dst + ((r >> 3) * F8_KG + kc) * 128 + (r & 7) * 16) = v;
    }}
}}

// A warp's 16 rows of an m64n128 accumulator (rows `row0`.., columns `n0`..) scaled into d:
// lane l holds rows l / 4 and l / 4 + 8, in each 8-column piece j the columns 8 j + 2 (l % 4)
// and the next.
__device__ __forceinline__ void f8_store(const float* acc, float* d, int row0, int n0, int m,
                                         int n, float scale) {{
    const int lane = threadIdx.x & 31;
    const int row = row0 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 128 / 8; ++j) {{
        const int col = n0 + j * 8 + (lane & 3) * 2;
#pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int r = row + h * 8;
            if (r < m && col < n)
                *(float2*)(d + (long long)r * n + col) =
                    make_float2(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale);
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__(128) fp8_gemm_tn(const unsigned char* a,
    const unsigned char* b, float* d, int m, int n, int k, float scale) {{
    __shared__ __align__(128) unsigned char as[F8_BM * F8_BK];
    __shared__ __align__(128) unsigned char bs[F8_BN * F8_BK];
    const int m0 = blockIdx.y * F8_BM, n0 = blockIdx.x * F8_BN;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    const unsigned sa = (unsigned)__cvta_generic_to_shared(as);
    const unsigned sb = (unsigned)__cvta_generic_to_shared(bs);
    for (int k0 = 0; k0 < k; k0 += F8_BK) {{
        f8_stage(as, a, F8_BM, m0, m, k, k0);
        f8_stage(bs, b, F8_BN, n0, n, k, k0);
        // each thread's stores made visible to the MMA's (asynchronous proxy) reads, before
        // and after the barrier that gathers every thread's
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < F8_BK / 32; ++s) {{
            const unsigned long long da = f8_desc(sa + s * 256, 128, F8_KG * 128);
            const unsigned long long db = f8_desc(sb + s * 256, 128, F8_KG * 128);
            {wgmma}
        }}
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();
    }}
    f8_store(acc, d, m0 + (threadIdx.x >> 5) * 16, n0, m, n, scale);
}}

// The pipelined kernel (`Variant::Pipelined`).
#define P_BM {PIPE_BM}
#define P_BN {PIPE_BN}
#define P_BK {PIPE_BK}
#define P_STAGES {PIPE_STAGES}
#define P_STAGE_BYTES ((P_BM + P_BN) * P_BK)

// A descriptor of a K-major operand in the 128-byte swizzled layout: 8-row groups 1024 bytes
// apart (stride); the leading offset is not read in this layout (1 by convention).
__device__ __forceinline__ unsigned long long f8_desc_sw128(unsigned addr) {{
    return (unsigned long long)((addr >> 4) & 0x3FFF)
        | (1ull << 16)
        | ((unsigned long long)(1024 >> 4) << 32)
        | (1ull << 62);
}}

// 16 bytes from global to shared memory, asynchronously; zeros where !valid (nothing read).
__device__ __forceinline__ void f8_cp16(unsigned dst, const unsigned char* src, bool valid) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}}

// `rows` rows of `src` (row length k bytes) from row `first`, bytes [k0, k0 + P_BK), to the
// swizzled stage at shared address `dst` (1024-aligned): chunk c of row r at
// r 128 + ((c ^ r % 8) 16); rows past `limit` and bytes past k zero.
__device__ __forceinline__ void f8_load_sw(unsigned dst, const unsigned char* src, int rows,
                                           int first, int limit, int k, int k0) {{
    for (int c = threadIdx.x; c < rows * (P_BK / 16); c += 256) {{
        const int r = c / (P_BK / 16), kc = c % (P_BK / 16);
        const bool valid = first + r < limit && k0 + kc * 16 < k;
        const unsigned char* p = valid ? src + (long long)(first + r) * k + k0 + kc * 16 : src;
        f8_cp16(dst + r * 128 + ((kc ^ (r & 7)) << 4), p, valid);
    }}
}}

extern "C" __global__ void __launch_bounds__(256) fp8_gemm_tn_pipe(const unsigned char* a,
    const unsigned char* b, float* d, int m, int n, int k, float scale) {{
    extern __shared__ unsigned char smem[];
    unsigned base = (unsigned)__cvta_generic_to_shared(smem);
    base += (1024u - (base & 1023u)) & 1023u;
    const int m0 = blockIdx.y * P_BM, n0 = blockIdx.x * P_BN;
    const int wg = threadIdx.x >> 7;
    const int steps = (k + P_BK - 1) / P_BK;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // the first P_STAGES - 1 stages in flight (a group committed for each, empty or not)
    for (int s = 0; s < P_STAGES - 1; ++s) {{
        if (s < steps) {{
            const unsigned at = base + s * P_STAGE_BYTES;
            f8_load_sw(at, a, P_BM, m0, m, k, s * P_BK);
            f8_load_sw(at + P_BM * P_BK, b, P_BN, n0, n, k, s * P_BK);
        }}
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }}
    for (int t = 0; t < steps; ++t) {{
        // stage t landed: this thread's copies, then every thread's; made visible to the MMA
        asm volatile("cp.async.wait_group %0;\n" :: "n"(P_STAGES - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const unsigned at = base + (t % P_STAGES) * P_STAGE_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int q = 0; q < P_BK / 32; ++q) {{
            const unsigned long long da = f8_desc_sw128(at + wg * 64 * P_BK + q * 32);
            const unsigned long long db = f8_desc_sw128(at + P_BM * P_BK + q * 32);
            {wgmma}
        }}
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // step t - 1's MMAs done in both warpgroups: its stage may be filled again
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        __syncthreads();
        const int next = t + P_STAGES - 1;
        if (next < steps) {{
            const unsigned to = base + (next % P_STAGES) * P_STAGE_BYTES;
            f8_load_sw(to, a, P_BM, m0, m, k, next * P_BK);
            f8_load_sw(to + P_BM * P_BK, b, P_BN, n0, n, k, next * P_BK);
        }}
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }}
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    f8_store(acc, d, m0 + wg * 64 + ((threadIdx.x >> 5) & 3) * 16, n0, m, n, scale);
}}
"#,
        wgmma = wgmma_call()
    )
}

/// The module's source, for the offline compile test and the cache warmer.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-fp8-gemm",
        source: source(),
        names: vec!["fp8_gemm_tn".into(), "fp8_gemm_tn_pipe".into()],
    }
}

/// The kernel on one Hopper GPU.
pub struct Fp8Gemm {
    module: KernelModule,
}

impl Fp8Gemm {
    /// The kernel where `gpu` is of compute capability 9.0 (None elsewhere: the module is
    /// built for that architecture alone).
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Option<Fp8Gemm>> {
        if gpu.compute_capability()? != (9, 0) {
            return Ok(None);
        }
        Ok(Some(Fp8Gemm {
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
        }))
    }

    /// `d = scale x a b^T` on `stream` by `variant`: a `m x k` and b `n x k` E4M3 bytes, d
    /// `m x n` f32; k a positive multiple of [`BK`] (simple) or 16 (pipelined: rows of 16-byte
    /// chunks).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        stream: &Stream,
        variant: Variant,
        a: View<'_>,
        b: View<'_>,
        d: View<'_>,
        (m, n, k): (usize, usize, usize),
        scale: f32,
    ) -> Result<()> {
        // the kernel, the multiple k must be of, its tile, threads and dynamic shared memory
        let (name, step, tile, threads, shared) = match variant {
            Variant::Simple => ("fp8_gemm_tn", BK, (BM, BN), 128, 0),
            Variant::Pipelined => (
                "fp8_gemm_tn_pipe",
                16,
                (PIPE_BM, PIPE_BN),
                256,
                PIPE_SHARED as u32,
            ),
        };
        if m == 0 || n == 0 || k == 0 || !k.is_multiple_of(step) {
            return Err(Error::Invalid(format!(
                "{name} takes k a positive multiple of {step}, not {m}x{n}x{k}"
            )));
        }
        a.require(m * k, "fp8 a")?;
        b.require(n * k, "fp8 b")?;
        d.require(m * n * 4, "fp8 d")?;
        let blocks = |x: usize, t: usize| {
            u32::try_from(x.div_ceil(t))
                .map_err(|_| Error::Invalid(format!("{name}: {m}x{n} is too many tiles")))
        };
        let grid = (blocks(n, tile.1)?, blocks(m, tile.0)?, 1);
        let args = [
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Ptr(d),
            Arg::Size(m),
            Arg::Size(n),
            Arg::Size(k),
            Arg::F32(scale),
        ];
        let launch = Launch {
            shared_bytes: shared,
            ..Launch::new(grid, (threads, 1, 1))
        };
        self.module.launch(name, stream, launch, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_takes_what_its_launcher_passes() {
        let differences = kernel_source().signature_differences(
            &[
                ("fp8_gemm_tn", "p p p i i i f"),
                ("fp8_gemm_tn_pipe", "p p p i i i f"),
            ],
            &[],
        );
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn the_mma_binds_every_accumulator_once() {
        let call = wgmma_call();
        for i in 0..64 {
            assert_eq!(call.matches(&format!("acc[{i}])")).count(), 1, "{i}");
        }
        assert!(call.contains("%63}, %64, %65"));
        assert!(source().starts_with(ARCH_SPECIFIC));
    }
}
