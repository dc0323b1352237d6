//! gpukit's fp8 convolution on Hopper's warpgroup MMA (`wgmma`, decisions 195 and 202): the
//! implicit product that cuDNN's fp8 engines run no faster than f16 for ResNet's 3x3
//! convolutions (decision 194), and, as a 1x1 convolution of one row of pixels, a plain product
//! `d [m, n] = a [m, k] b [n, k]^T`.
//!
//! `y [n, p, q, k] = act(alpha [k] conv(x, w) + bias [k] + z_scale z) / y_scale`, x E4M3
//! channel-last `[n, h, w, c]` (c a multiple of 16), w E4M3 `[k, r, s, c]` (the product's K,
//! r s c, contiguous: the only operand order Hopper's fp8 MMA takes), f32 sums; y and z f32,
//! f16 or E4M3 (rounded to nearest, saturated to E4M3's 448); k even.
//!
//! A block is two warpgroups (256 threads) and one 128 x BN tile of y (BN 64, 128 or 256
//! output channels), each warpgroup 64 of its rows. The product's K goes by in steps of 128
//! bytes, each staged in shared memory in the 128-byte swizzled K-major layout the MMA reads
//! (row r's 16-byte chunk c at r 128 + ((c ^ r % 8) 16), 1024-byte atoms; descriptor stride
//! 1024 bytes, swizzle mode 1) by `cp.async`, 16 bytes a thread, zeros where the tap falls in
//! the padding or past K. A thread loads one 16-byte chunk column of four rows of x's tile
//! (their image, top and left input coordinates found once) and BN / 32 rows of w's: each step
//! it finds the chunk's tap and channel (two divisions) and so each row's address. `ST` stages
//! of shared memory, loads `ST - 2` steps ahead; each step's four `m64nBNk32` MMAs are left
//! running while the next step's begin (`wgmma.wait_group 1`), and one barrier a step both
//! publishes the landed stage and frees the one two steps back.
//!
//! Compiled for `sm_90a` only (architecture-specific: the module loads on compute capability
//! 9.0 alone).

use super::gemm::ConvGeometry;
use gpukit_cuda::kernel::{Arg, KernelModule, KernelSource, Launch, ARCH_SPECIFIC, HALF};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};
use gpukit_types::DType;

/// Rows of y a block takes.
pub const BM: usize = 128;
/// Bytes of K a stage holds.
pub const BK: usize = 128;

/// One of the module's kernels: output channels a block takes, stages of shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tile {
    pub bn: usize,
    pub stages: usize,
}

/// The tiles the module is built with.
pub const TILES: [Tile; 5] = [
    Tile { bn: 64, stages: 4 },
    Tile { bn: 64, stages: 8 },
    Tile { bn: 128, stages: 4 },
    Tile { bn: 128, stages: 6 },
    Tile { bn: 256, stages: 4 },
];

impl Tile {
    fn name(&self) -> String {
        format!("fp8_conv_n{}s{}", self.bn, self.stages)
    }

    /// Dynamic shared memory: the stages, and room to align them to 1024 bytes.
    pub fn shared_bytes(&self) -> usize {
        self.stages * (BM + self.bn) * BK + 1024
    }

    /// Dynamic shared memory for `steps` steps of K: the stages used (no more than the
    /// steps: stage t % ST is t below ST), at least the epilogue's f32 rows of BN + 8.
    pub fn shared_bytes_for(&self, steps: usize) -> usize {
        let stages = self.stages.min(steps.max(1)) * (BM + self.bn) * BK;
        stages.max(BM * (self.bn + 8) * 4) + 1024
    }

    /// Blocks an SM may hold at once, for the kernel's register bound: three of the narrow
    /// tile (where few steps leave its shared memory small), one of the widest.
    fn blocks_an_sm(&self) -> usize {
        match self.bn {
            64 => 3,
            128 => 2,
            _ => 1,
        }
    }
}

// every tile's stages fit Hopper's 227 KiB of shared memory a block
const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        assert!(TILES[i].stages * (BM + TILES[i].bn) * BK + 1024 <= 227 * 1024);
        assert!(TILES[i].stages >= 4);
        i += 1;
    }
};

/// The `wgmma` of one m64nBNk32 step on the accumulators `acc` (BN / 2 floats a thread).
fn wgmma_struct(bn: usize) -> String {
    let count = bn / 2;
    let outs: Vec<String> = (0..count).map(|i| format!("%{i}")).collect();
    let binds: Vec<String> = (0..count).map(|i| format!("\"+f\"(acc[{i}])")).collect();
    format!(
        "template <> struct Wg<{bn}> {{\n    static __device__ __forceinline__ void mma(float* acc, unsigned long long da, unsigned long long db) {{\n        asm volatile(\"wgmma.mma_async.sync.aligned.m64n{bn}k32.f32.e4m3.e4m3 {{{}}}, %{count}, %{}, 1, 1, 1;\\n\"\n            : {}\n            : \"l\"(da), \"l\"(db));\n    }}\n}};\n",
        outs.join(", "),
        count + 1,
        binds.join(", ")
    )
}

/// The parameters every kernel of the module takes, after its name.
const PARAMS: &str = "(const unsigned char* __restrict__ x, const unsigned char* __restrict__ wt, \
const float* __restrict__ alpha, const float* __restrict__ bias, const void* z, void* y, int h, \
int w, int c, int p, int q, int kout, int s, int stride, int pt, int pl, int dh, int dw, int m, \
int kg, int ytype, int ztype, int relu, float yinv, float zscale)";

/// The module's CUDA C.
fn source() -> String {
    let mut s = format!("{ARCH_SPECIFIC}\n{HALF}\ntemplate <int BN> struct Wg;\n");
    for bn in [64, 128, 256] {
        s.push_str(&wgmma_struct(bn));
    }
    s.push_str(BODY);
    for t in TILES {
        s.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__(256, {}) {}{PARAMS} {{\n    f8_conv<{}, {}>(x, wt, alpha, bias, z, y, h, w, c, p, q, kout, s, stride, pt, pl, dh, dw, m, kg, ytype, ztype, relu, yinv, zscale);\n}}\n",
            t.blocks_an_sm(),
            t.name(),
            t.bn,
            t.stages
        ));
    }
    s
}

const BODY: &str = r#"
// A descriptor of a K-major operand in the 128-byte swizzled layout: 8-row groups 1024 bytes
// apart (stride); the leading offset is not read in this layout (1 by convention).
__device__ __forceinline__ unsigned long long f8_desc(unsigned addr) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | (1ull << 16)
        | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// 16 bytes from global to shared memory, asynchronously; zeros where !valid (nothing read).
__device__ __forceinline__ void f8_cp16(unsigned dst, const unsigned char* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// Two values as two E4M3 bytes (the first in the low byte), rounded, saturated.
__device__ __forceinline__ unsigned short f8_pack(float lo, float hi) {
    unsigned short d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
}

// Two E4M3 bytes (the first in the low byte) as floats.
__device__ __forceinline__ float2 f8_unpack(unsigned short v) {
    unsigned hh;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hh) : "h"(v));
    H lo, hi;
    lo.v = (unsigned short)(hh & 0xFFFFu);
    hi.v = (unsigned short)(hh >> 16);
    return make_float2(to_f(lo), to_f(hi));
}

// Two neighbouring values of a map of type `t` (0 f32, 1 f16, 2 E4M3) at element `o`.
__device__ __forceinline__ float2 f8_read2(const void* v, int t, long long o) {
    if (t == 0) return *(const float2*)((const float*)v + o);
    if (t == 1) {
        const unsigned u = *(const unsigned*)((const unsigned short*)v + o);
        H lo, hi;
        lo.v = (unsigned short)(u & 0xFFFFu);
        hi.v = (unsigned short)(u >> 16);
        return make_float2(to_f(lo), to_f(hi));
    }
    return f8_unpack(*(const unsigned short*)((const unsigned char*)v + o));
}

__device__ __forceinline__ void f8_write2(void* v, int t, long long o, float a, float b) {
    if (t == 0) {
        *(float2*)((float*)v + o) = make_float2(a, b);
    } else if (t == 1) {
        const H lo = from_f<H>(a), hi = from_f<H>(b);
        *(unsigned*)((unsigned short*)v + o) = (unsigned)lo.v | ((unsigned)hi.v << 16);
    } else {
        *(unsigned short*)((unsigned char*)v + o) = f8_pack(a, b);
    }
}

template <int BN, int ST>
__device__ __forceinline__ void f8_conv(const unsigned char* __restrict__ x,
    const unsigned char* __restrict__ wt, const float* __restrict__ alpha,
    const float* __restrict__ bias, const void* z, void* y, int h, int w, int c, int p, int q,
    int kout, int s, int stride, int pt, int pl, int dh, int dw, int m, int kg, int ytype,
    int ztype, int relu, float yinv, float zscale) {
    constexpr int STAGE = (128 + BN) * 128;
    extern __shared__ unsigned char smem[];
    unsigned char* aligned = smem + ((1024u - ((unsigned)__cvta_generic_to_shared(smem) & 1023u)) & 1023u);
    const unsigned base = (unsigned)__cvta_generic_to_shared(aligned);
    const int tid = threadIdx.x, wg = tid >> 7;
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * BN;
    // this thread's chunk column and first row; the swizzle is the same for all its rows
    const int kc = tid & 7, rr = tid >> 3;
    const unsigned swz = (unsigned)((kc ^ (rr & 7)) << 4);
    // its four rows of x's tile: the address of tap (0, 0)'s first channel (outside the map
    // where the tap is), the top and left input coordinates
    const unsigned char* xr[4];
    int hb[4], wb[4];
    const int pq = p * q;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int mi = m0 + rr + 32 * i;
        if (mi < m) {
            const int ni = mi / pq, rem = mi - ni * pq;
            const int pi = rem / q, qi = rem - pi * q;
            hb[i] = pi * stride - pt;
            wb[i] = qi * stride - pl;
            xr[i] = x + (((long long)ni * h + hb[i]) * w + wb[i]) * c;
        } else {
            hb[i] = -0x40000000;  // never inside the map
            wb[i] = 0;
            xr[i] = x;
        }
    }
    // its BN / 32 rows of w's tile
    const unsigned char* wr[BN / 32];
    unsigned wok = 0;
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int row = n0 + rr + 32 * i;
        wr[i] = wt + (long long)(row < kout ? row : 0) * kg;
        wok |= (row < kout ? 1u : 0u) << i;
    }
    // the chunk's place in K as the loads go by, step after step: tap (ri, si), channel ch
    int kk = kc * 16, ch = kc * 16, ri = 0, si = 0;
    while (ch >= c) { ch -= c; if (++si == s) { si = 0; ++ri; } }
    const int steps = (kg + 127) / 128;
    auto load = [&](int t) {
        const unsigned at = base + (t % ST) * STAGE;
        const bool kin = kk < kg;
        const int oh = ri * dh, ow = si * dw;
        const long long off = ((long long)oh * w + ow) * c + ch;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const bool ok = kin && (unsigned)(hb[i] + oh) < (unsigned)h && (unsigned)(wb[i] + ow) < (unsigned)w;
            f8_cp16(at + (rr + 32 * i) * 128 + swz, ok ? xr[i] + off : x, ok);
        }
#pragma unroll
        for (int i = 0; i < BN / 32; ++i) {
            const bool ok = kin && ((wok >> i) & 1u);
            f8_cp16(at + 128 * 128 + (rr + 32 * i) * 128 + swz, ok ? wr[i] + kk : wt, ok);
        }
        kk += 128;
        ch += 128;
        while (ch >= c) { ch -= c; if (++si == s) { si = 0; ++ri; } }
    };
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    // the first ST - 2 steps in flight (a group committed for each, empty or not)
#pragma unroll
    for (int t = 0; t < ST - 2; ++t) {
        if (t < steps) load(t);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int t = 0; t < steps; ++t) {
        // step t landed: this thread's copies, then (the barrier) every thread's, made visible
        // to the MMA; past the barrier, every warpgroup's MMAs of step t - 2 are done (each
        // waited for them at step t - 1). This step's MMAs go first, so the tensor cores have
        // them queued while the threads load step t + ST - 2 into step t - 2's stage.
        asm volatile("cp.async.wait_group %0;\n" :: "n"(ST - 3) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const unsigned at = base + (t % ST) * STAGE;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int u = 0; u < 4; ++u)
            Wg<BN>::mma(acc, f8_desc(at + wg * 64 * 128 + u * 32), f8_desc(at + 128 * 128 + u * 32));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (t + ST - 2 < steps) load(t + ST - 2);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    // the epilogue in two passes through shared memory (the stages', free once every
    // warpgroup's MMAs are done): first each thread's sums, scaled and biased, as f32 rows of
    // BN + 8 (a half-warp's pairs on distinct banks): lane l of a warp holds rows l / 4 and
    // l / 4 + 8 of its 16, in each 8-column piece j the columns 8 j + 2 (l % 4) and the next
    __syncthreads();
    constexpr int SR = BN + 8;
    float* tile = (float*)aligned;
    {
        const int lane = tid & 31;
        const int r0 = wg * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int cl = j * 8 + (lane & 3) * 2, col = n0 + cl;
            float a0 = 1.0f, a1 = 1.0f, b0 = 0.0f, b1 = 0.0f;
            if (col < kout) {
                if (alpha) { a0 = alpha[col]; a1 = alpha[col + 1]; }
                if (bias) { b0 = bias[col]; b1 = bias[col + 1]; }
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *(float2*)(tile + (r0 + hh * 8) * SR + cl) =
                    make_float2(acc[4 * j + 2 * hh] * a0 + b0, acc[4 * j + 2 * hh + 1] * a1 + b1);
        }
    }
    __syncthreads();
    // then 8 neighbouring outputs a thread: the residual read, ReLU, the output's scale and
    // type, one store of 8 values (32, 16 or 8 bytes)
    for (int e = tid; e < 128 * (BN / 8); e += 256) {
        const int rl = e / (BN / 8), cl = (e % (BN / 8)) * 8;
        const int row = m0 + rl, col = n0 + cl;
        if (row >= m || col >= kout) continue;
        float v[8];
        const float4 lo = *(const float4*)(tile + rl * SR + cl), hi = *(const float4*)(tile + rl * SR + cl + 4);
        v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w; v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
        const long long o = (long long)row * kout + col;
        const int n = kout - col < 8 ? kout - col : 8;
        if (n == 8 && (kout & 7) == 0) {
            if (z) {
#pragma unroll
                for (int i = 0; i < 8; i += 2) {
                    const float2 zz = f8_read2(z, ztype, o + i);
                    v[i] += zz.x * zscale;
                    v[i + 1] += zz.y * zscale;
                }
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = (relu ? fmaxf(v[i], 0.0f) : v[i]) * yinv;
            if (ytype == 2) {
                uint2 u;
                u.x = (unsigned)f8_pack(v[0], v[1]) | ((unsigned)f8_pack(v[2], v[3]) << 16);
                u.y = (unsigned)f8_pack(v[4], v[5]) | ((unsigned)f8_pack(v[6], v[7]) << 16);
                *(uint2*)((unsigned char*)y + o) = u;
            } else if (ytype == 1) {
                uint4 u;
                unsigned* uw = (unsigned*)&u;
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    uw[i] = (unsigned)from_f<H>(v[2 * i]).v | ((unsigned)from_f<H>(v[2 * i + 1]).v << 16);
                *(uint4*)((unsigned short*)y + o) = u;
            } else {
                *(float4*)((float*)y + o) = make_float4(v[0], v[1], v[2], v[3]);
                *(float4*)((float*)y + o + 4) = make_float4(v[4], v[5], v[6], v[7]);
            }
        } else {
            // a row's last columns where k is not a multiple of 8: pairs (k is even)
            for (int i = 0; i < n; i += 2) {
                float a = v[i], b = v[i + 1];
                if (z) {
                    const float2 zz = f8_read2(z, ztype, o + i);
                    a += zz.x * zscale;
                    b += zz.y * zscale;
                }
                if (relu) { a = fmaxf(a, 0.0f); b = fmaxf(b, 0.0f); }
                f8_write2(y, ytype, o + i, a * yinv, b * yinv);
            }
        }
    }
}
"#;

/// The module's source, for the offline compile test and the cache warmer.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-fp8-conv",
        source: source(),
        names: TILES.iter().map(Tile::name).collect(),
    }
}

/// A map's type code in the kernels: f32, f16 or E4M3.
fn map_type(dtype: DType, what: &str) -> Result<i32> {
    match dtype {
        DType::F32 => Ok(0),
        DType::F16 => Ok(1),
        DType::F8E4M3 => Ok(2),
        other => Err(Error::Invalid(format!(
            "gpukit's fp8 convolution writes and reads f32, f16 or E4M3 maps, not {other} ({what})"
        ))),
    }
}

/// What the convolution does after its sums: `y = act(alpha [k] sum + bias [k] + z_scale z) /
/// y_scale`, stored as `y_dtype`.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue<'a> {
    /// One factor an output channel (f32; none: 1), the product of the input's and the
    /// channel's filter scales.
    pub alpha: Option<View<'a>>,
    /// One bias an output channel (f32).
    pub bias: Option<View<'a>>,
    /// A map laid out as y, its type and the factor its values are multiplied by.
    pub z: Option<(View<'a>, DType, f32)>,
    pub relu: bool,
    pub y_dtype: DType,
    /// What y's stored values are multiplied by to give the real ones (E4M3: the output's
    /// scale; 1 otherwise).
    pub y_scale: f32,
}

impl Epilogue<'_> {
    /// Sums scaled by one factor, stored as `y_dtype`.
    pub fn plain(y_dtype: DType) -> Epilogue<'static> {
        Epilogue {
            alpha: None,
            bias: None,
            z: None,
            relu: false,
            y_dtype,
            y_scale: 1.0,
        }
    }
}

/// The kernels on one Hopper GPU.
pub struct Fp8Conv {
    module: KernelModule,
}

impl Fp8Conv {
    /// The kernels where `gpu` is of compute capability 9.0 (None elsewhere: the module is
    /// built for that architecture alone).
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Option<Fp8Conv>> {
        if gpu.compute_capability()? != (9, 0) {
            return Ok(None);
        }
        Ok(Some(Fp8Conv {
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
        }))
    }

    /// Whether the kernels take `g`: channels a multiple of 16 (rows of 16-byte chunks), an
    /// even number of filters (the epilogue's pairs stay inside a row), one stride, 32-bit
    /// indices.
    pub fn takes(g: &ConvGeometry) -> bool {
        let (m, n, kg) = g.product();
        g.c.is_multiple_of(16)
            && g.k.is_multiple_of(2)
            && g.stride >= 1
            && g.dilation.iter().all(|&d| d >= 1)
            && m > 0
            && n > 0
            && [g.n * g.h * g.w * g.c, m, n * kg, kg]
                .iter()
                .all(|&v| v < i32::MAX as usize)
    }

    /// The filters `w [k, c, r, s]` (the graph's order) as the kernels read them: `[k, r, s,
    /// c]`.
    pub fn filter(g: &ConvGeometry, w: &[f32]) -> Vec<f32> {
        let (k, c, r, s) = (g.k, g.c, g.r, g.s);
        let mut out = vec![0f32; k * c * r * s];
        for o in 0..k {
            for ch in 0..c {
                for i in 0..r {
                    for j in 0..s {
                        out[((o * r + i) * s + j) * c + ch] = w[((o * c + ch) * r + i) * s + j];
                    }
                }
            }
        }
        out
    }

    /// `y = epilogue(conv(x, w))` on `stream` by `tile`'s kernel: x `[n, h, w, c]` and w `[k,
    /// r, s, c]` E4M3 bytes, y `[n, p, q, k]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        stream: &Stream,
        tile: Tile,
        (x, w, y): (View<'_>, View<'_>, View<'_>),
        g: &ConvGeometry,
        e: &Epilogue<'_>,
    ) -> Result<()> {
        if !TILES.contains(&tile) {
            return Err(Error::Invalid(format!("no fp8 convolution kernel of {tile:?}")));
        }
        if !Self::takes(g) {
            return Err(Error::Invalid(format!(
                "gpukit's fp8 convolution does not take {g:?} (channels a multiple of 16, filters of 2)"
            )));
        }
        let (m, n, kg) = g.product();
        let (p, q) = g.out();
        let ytype = map_type(e.y_dtype, "y")?;
        x.require(g.n * g.h * g.w * g.c, "fp8 conv x")?;
        w.require(n * kg, "fp8 conv w")?;
        y.require(m * n * e.y_dtype.size_bytes(), "fp8 conv y")?;
        if let Some(a) = e.alpha {
            a.require(n * 4, "fp8 conv alpha")?;
        }
        if let Some(b) = e.bias {
            b.require(n * 4, "fp8 conv bias")?;
        }
        let (z, ztype, zscale) = match e.z {
            Some((v, t, s)) => {
                v.require(m * n * t.size_bytes(), "fp8 conv z")?;
                (Some(v), map_type(t, "z")?, s)
            }
            None => (None, 0, 0.0),
        };
        if !(e.y_scale.is_finite() && e.y_scale > 0.0) {
            return Err(Error::Invalid(format!(
                "fp8 conv: y's scale must be positive, not {}",
                e.y_scale
            )));
        }
        let blocks = |v: usize, t: usize| {
            u32::try_from(v.div_ceil(t))
                .map_err(|_| Error::Invalid(format!("fp8 conv: {m}x{n} is too many tiles")))
        };
        let grid = (blocks(n, tile.bn)?, blocks(m, BM)?, 1);
        let [pt, pl, _, _] = g.pads;
        let [dh, dw] = g.dilation;
        let mut args = vec![
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::opt(e.alpha),
            Arg::opt(e.bias),
            Arg::opt(z),
            Arg::Ptr(y),
        ];
        args.extend([g.h, g.w, g.c, p, q, n, g.s, g.stride, pt, pl, dh, dw, m, kg].map(Arg::Size));
        args.extend([
            Arg::I32(ytype),
            Arg::I32(ztype),
            Arg::Bool(e.relu),
            Arg::F32(1.0 / e.y_scale),
            Arg::F32(zscale),
        ]);
        let launch = Launch {
            shared_bytes: tile.shared_bytes_for(kg.div_ceil(BK)) as u32,
            ..Launch::new(grid, (256, 1, 1))
        };
        self.module.launch(&tile.name(), stream, launch, &args)
    }

    /// `d [m, n] = epilogue(a [m, k] b [n, k]^T)`: the 1x1 convolution of one row of m pixels
    /// of k channels (k a multiple of 16).
    #[allow(clippy::too_many_arguments)]
    pub fn run_product(
        &self,
        stream: &Stream,
        tile: Tile,
        (a, b, d): (View<'_>, View<'_>, View<'_>),
        (m, n, k): (usize, usize, usize),
        e: &Epilogue<'_>,
    ) -> Result<()> {
        self.run(stream, tile, (a, b, d), &product_geometry(m, n, k), e)
    }
}

/// The 1x1 convolution that is the product `a [m, k] b [n, k]^T`.
pub fn product_geometry(m: usize, n: usize, k: usize) -> ConvGeometry {
    ConvGeometry {
        n: 1,
        h: 1,
        w: m,
        c: k,
        k: n,
        r: 1,
        s: 1,
        stride: 1,
        pads: [0; 4],
        dilation: [1, 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_what_their_launcher_passes() {
        let params = "p p p p p p i i i i i i i i i i i i i i i i i f f";
        let expected: Vec<(String, &str)> = TILES.iter().map(|t| (t.name(), params)).collect();
        let expected: Vec<(&str, &str)> = expected.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let differences = kernel_source().signature_differences(&expected, &[]);
        assert!(differences.is_empty(), "{differences:#?}");
        assert!(source().starts_with(ARCH_SPECIFIC));
    }

    #[test]
    fn each_mma_binds_every_accumulator_once() {
        for bn in [64, 128, 256] {
            let call = wgmma_struct(bn);
            for i in 0..bn / 2 {
                assert_eq!(call.matches(&format!("(acc[{i}])")).count(), 1, "{bn} {i}");
            }
            assert!(call.contains(&format!("%{}}}, %{}, %{}", bn / 2 - 1, bn / 2, bn / 2 + 1)));
        }
    }

    #[test]
    fn filters_are_reordered_with_k_outermost_and_channels_innermost() {
        let g = ConvGeometry {
            n: 1,
            h: 4,
            w: 4,
            c: 3,
            k: 2,
            r: 2,
            s: 3,
            stride: 1,
            pads: [0; 4],
            dilation: [1, 1],
        };
        let w: Vec<f32> = (0..2 * 3 * 2 * 3).map(|i| i as f32).collect();
        let f = Fp8Conv::filter(&g, &w);
        // w [o=1, ch=2, i=1, j=0] = ((1 * 3 + 2) * 2 + 1) * 3 + 0 = 33 lands at
        // ((1 * 2 + 1) * 3 + 0) * 3 + 2 = 29
        assert_eq!(f[29], 33.0);
        let mut sorted = f.clone();
        sorted.sort_by(f32::total_cmp);
        assert_eq!(sorted, w);
    }

    #[test]
    fn shapes_outside_the_kernels_are_refused() {
        let mut g = product_geometry(100, 64, 128);
        assert!(Fp8Conv::takes(&g));
        g.c = 24;
        assert!(!Fp8Conv::takes(&g));
        g.c = 32;
        g.k = 13;
        assert!(!Fp8Conv::takes(&g));
    }
}
