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
//! (each row's tap-(0, 0) address and input coordinates found once; a 1x1 convolution of
//! stride 1 reads row m for row m) and BN / 32 rows of w's; the chunk's tap and channel move
//! on step by step without a division. `ST` stages of shared memory, loads `ST - 2` steps
//! ahead; each step's four `m64nBNk32` MMAs are issued before the next loads and left running
//! (`wgmma.wait_group 1`), and one barrier a step both publishes the landed stage and frees
//! the one two steps back.
//!
//! The epilogue goes through shared memory: a first pass finishes each thread's values in y's
//! type (or f16 / f32 where a residual is still to be added) into padded rows, a second writes
//! them out 16 bytes a thread (adding the residual 8 values a thread where there is one).
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

/// How blocks take tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// A block a tile.
    OneTile,
    /// As many blocks as the SMs hold at once, each taking every so many tiles in turn and
    /// loading the next one's first steps during the last one's epilogue.
    Persistent,
}

/// A launch's kernel and schedule.
pub type Plan = (Tile, Schedule);

/// The tiles the module is built with.
pub const TILES: [Tile; 6] = [
    Tile { bn: 64, stages: 3 },
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

    /// Where the epilogue's rows start after the aligned stages, and the launch's dynamic
    /// shared memory, for `steps` steps of K and an epilogue whose first pass keeps `bytes` a
    /// value: the stages used (no more than the steps: stage t % ST is t below ST), then the
    /// epilogue's rows of BN values and 16 bytes (32 for f32) and the block's factors and
    /// biases. Persistent blocks keep the two apart where they fit together (so the next tile
    /// loads during the epilogue); otherwise the epilogue is written over the stages (offset
    /// 0).
    pub fn layout(&self, schedule: Schedule, steps: usize, bytes: usize) -> (usize, usize) {
        let stages = self.stages.min(steps.max(1)) * (BM + self.bn) * BK;
        let pad = if bytes == 4 { 32 } else { 16 };
        let epilogue = BM * (self.bn * bytes + pad) + 2 * self.bn * 4;
        match schedule {
            Schedule::Persistent if stages + epilogue + 1024 <= 227 * 1024 => {
                (stages, stages + epilogue + 1024)
            }
            _ => (0, stages.max(epilogue) + 1024),
        }
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
        assert!(TILES[i].stages >= 3);
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
int kg, int ytype, int ztype, int relu, float yinv, float zscale, int eoff)";

/// The module's CUDA C.
fn source() -> String {
    let mut s = format!("{ARCH_SPECIFIC}\n{HALF}\ntemplate <int BN> struct Wg;\n");
    for bn in [64, 128, 256] {
        s.push_str(&wgmma_struct(bn));
    }
    s.push_str(BODY);
    for t in TILES {
        s.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__(256, {}) {}{PARAMS} {{\n    f8_conv<{}, {}>(x, wt, alpha, bias, z, y, h, w, c, p, q, kout, s, stride, pt, pl, dh, dw, m, kg, ytype, ztype, relu, yinv, zscale, eoff);\n}}\n",
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

// A warpgroup's accumulators (BN / 2 a thread) times fa [col] plus fb [col], ReLU'd where
// asked, as type T (0 f32, 1 f16, 2 E4M3) into the block's rows of rs bytes at `tile`: lane l
// of a warp holds rows l / 4 and l / 4 + 8 of its 16, in each 8-column piece j the columns
// 8 j + 2 (l % 4) and the next.
template <int T, int BN>
__device__ __forceinline__ void f8_tile(const float* acc, unsigned char* tile, int rs,
                                        const float* fa, const float* fb, bool relu) {
    const int tid = threadIdx.x, lane = tid & 31;
    const int r0 = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2);
    constexpr int S = T == 0 ? 4 : T == 1 ? 2 : 1;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int cl = j * 8 + (lane & 3) * 2;
        const float2 a = *(const float2*)(fa + cl), b = *(const float2*)(fb + cl);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float v0 = acc[4 * j + 2 * hh] * a.x + b.x, v1 = acc[4 * j + 2 * hh + 1] * a.y + b.y;
            if (relu) {
                v0 = fmaxf(v0, 0.0f);
                v1 = fmaxf(v1, 0.0f);
            }
            unsigned char* at = tile + (r0 + hh * 8) * rs + cl * S;
            if (T == 2) {
                *(unsigned short*)at = f8_pack(v0, v1);
            } else if (T == 1) {
                const H lo = from_f<H>(v0), hi = from_f<H>(v1);
                *(unsigned*)at = (unsigned)lo.v | ((unsigned)hi.v << 16);
            } else {
                *(float2*)at = make_float2(v0, v1);
            }
        }
    }
}

template <int BN, int ST>
__device__ __forceinline__ void f8_conv(const unsigned char* __restrict__ x,
    const unsigned char* __restrict__ wt, const float* __restrict__ alpha,
    const float* __restrict__ bias, const void* z, void* y, int h, int w, int c, int p, int q,
    int kout, int s, int stride, int pt, int pl, int dh, int dw, int m, int kg, int ytype,
    int ztype, int relu, float yinv, float zscale, int eoff) {
    constexpr int STAGE = (128 + BN) * 128;
    extern __shared__ unsigned char smem[];
    unsigned char* aligned = smem + ((1024u - ((unsigned)__cvta_generic_to_shared(smem) & 1023u)) & 1023u);
    const unsigned base = (unsigned)__cvta_generic_to_shared(aligned);
    // the epilogue's rows: after the stages (eoff > 0: the next tile's first steps load while
    // this one's epilogue runs) or over them
    unsigned char* epi = aligned + eoff;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int tiles_n = (kout + BN - 1) / BN, tiles = tiles_n * ((m + 127) / 128);
    int tile = blockIdx.x;
    if (tile >= tiles) return;
    // this thread's chunk column and first row; the swizzle is the same for all its rows
    const int kc = tid & 7, rr = tid >> 3;
    const unsigned swz = (unsigned)((kc ^ (rr & 7)) << 4);
    const int pq = p * q;
    // a 1x1 convolution of stride 1 without padding reads pixel m for output m
    const bool same = s == 1 && h * w == pq && stride == 1 && pt == 0 && pl == 0 && kg == c;
    const int steps = (kg + 127) / 128;
    // a tile's loads: its four rows of x (the address of tap (0, 0)'s first channel, outside
    // the map where the tap is; the top and left input coordinates), its BN / 32 rows of w, and
    // the chunk's place in K as the steps go by (tap (ri, si), channel ch)
    int m0 = 0, n0 = 0;
    const unsigned char* xr[4];
    int hb[4], wb[4];
    const unsigned char* wr[BN / 32];
    unsigned wok = 0;
    int kk = 0, ch = 0, ri = 0, si = 0;
    auto setup = [&](int t) {
        m0 = (t / tiles_n) * 128;
        n0 = (t % tiles_n) * BN;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int mi = m0 + rr + 32 * i;
            if (mi < m && same) {
                hb[i] = 0;
                wb[i] = 0;
                xr[i] = x + (long long)mi * c;
            } else if (mi < m) {
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
        wok = 0;
#pragma unroll
        for (int i = 0; i < BN / 32; ++i) {
            const int row = n0 + rr + 32 * i;
            wr[i] = wt + (long long)(row < kout ? row : 0) * kg;
            wok |= (row < kout ? 1u : 0u) << i;
        }
        kk = kc * 16;
        ch = kc * 16;
        ri = 0;
        si = 0;
        while (ch >= c) { ch -= c; if (++si == s) { si = 0; ++ri; } }
    };
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
    // a tile's first ST - 2 steps in flight (a group committed for each, empty or not)
    auto first_loads = [&]() {
#pragma unroll
        for (int t = 0; t < ST - 2; ++t) {
            if (t < steps) load(t);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
    };
    const int ot = z ? (ytype == 0 ? 0 : 1) : ytype;   // the epilogue's first pass's type
    const int os = ot == 0 ? 4 : ot == 1 ? 2 : 1;
    const int rs = BN * os + (os == 4 ? 32 : 16);       // its rows: a half-warp's on distinct banks
    float* fa = (float*)(epi + 128 * rs);
    float* fb = fa + BN;
    const float fs = z ? 1.0f : yinv;
    const bool relu1 = relu && !z;
    setup(tile);
    first_loads();
    float acc[BN / 2];
    while (true) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
        for (int t = 0; t < steps; ++t) {
            // step t landed: this thread's copies, then (the barrier) every thread's, made
            // visible to the MMA; past the barrier, every warpgroup's MMAs of step t - 2 are
            // done (each waited for them at step t - 1). This step's MMAs go first, so the
            // tensor cores have them queued while the threads load step t + ST - 2 into step
            // t - 2's stage.
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
        // every warpgroup's MMAs done (the stages free) and the last epilogue's rows read
        __syncthreads();
        const int em0 = m0, en0 = n0;
        const int next = tile + gridDim.x;
        if (eoff > 0 && next < tiles) {
            setup(next);
            first_loads();
        }
        // the epilogue. Without a residual the first pass finishes the values (factors,
        // biases and ReLU, times 1 / y's scale) in y's type and the second copies them out;
        // with one, the first keeps alpha sum + bias in f16 (f32 for f32 out) and the second
        // adds the residual.
        if (tid < BN) {
            const int col = en0 + tid;
            fa[tid] = (alpha && col < kout ? alpha[col] : 1.0f) * fs;
            fb[tid] = (bias && col < kout ? bias[col] : 0.0f) * fs;
        }
        __syncthreads();
        if (ot == 2) f8_tile<2, BN>(acc, epi, rs, fa, fb, relu1);
        else if (ot == 1) f8_tile<1, BN>(acc, epi, rs, fa, fb, relu1);
        else f8_tile<0, BN>(acc, epi, rs, fa, fb, relu1);
        __syncthreads();
        if (!z) {
            // the tile to y, 16 bytes a thread (the bytes of a row past k one at a time)
            const int chunks = BN * os / 16;
            const long long ybytes = (long long)kout * os;
            for (int e = tid; e < 128 * chunks; e += 256) {
                const int rl = e / chunks, cb = (e - rl * chunks) * 16;
                const int row = em0 + rl;
                const long long cbyte = (long long)en0 * os + cb;
                if (row >= m || cbyte >= ybytes) continue;
                unsigned char* to = (unsigned char*)y + row * ybytes + cbyte;
                const unsigned char* from = epi + rl * rs + cb;
                if (cbyte + 16 <= ybytes && (ybytes & 15) == 0) {
                    *(uint4*)to = *(const uint4*)from;
                } else {
                    for (int i = 0; i < 16 && cbyte + i < ybytes; ++i) to[i] = from[i];
                }
            }
        } else {
            // with the residual: 8 neighbouring outputs a thread, by pairs
            for (int e = tid; e < 128 * (BN / 8); e += 256) {
                const int rl = e / (BN / 8), cl = (e % (BN / 8)) * 8;
                const int row = em0 + rl, col = en0 + cl;
                if (row >= m || col >= kout) continue;
                const long long o = (long long)row * kout + col;
                const int n = kout - col < 8 ? kout - col : 8;
                for (int i = 0; i < n; i += 2) {
                    const unsigned char* from = epi + rl * rs + (cl + i) * os;
                    float2 v = os == 4 ? *(const float2*)from : f8_read2(from, 1, 0);
                    const float2 zz = f8_read2(z, ztype, o + i);
                    v.x = (v.x + zz.x * zscale) * yinv;
                    v.y = (v.y + zz.y * zscale) * yinv;
                    if (relu) {
                        v.x = fmaxf(v.x, 0.0f);
                        v.y = fmaxf(v.y, 0.0f);
                    }
                    if (ytype == 2) {
                        *((unsigned short*)((unsigned char*)y + o + i)) = f8_pack(v.x, v.y);
                    } else if (ytype == 1) {
                        const H lo = from_f<H>(v.x), hi = from_f<H>(v.y);
                        *(unsigned*)((unsigned short*)y + o + i) = (unsigned)lo.v | ((unsigned)hi.v << 16);
                    } else {
                        *(float2*)((float*)y + o + i) = v;
                    }
                }
            }
        }
        if (next >= tiles) break;
        if (eoff == 0) {
            // the epilogue's rows were the stages': read by every thread before refilled
            __syncthreads();
            setup(next);
            first_loads();
        }
        tile = next;
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
    sms: usize,
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
            sms: gpukit_cuda::driver::device_attributes(gpu.ordinal, 1)?.sm_count as usize,
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

    /// `y = epilogue(conv(x, w))` on `stream` by `tile`'s kernel and `schedule`: x `[n, h, w,
    /// c]` and w `[k, r, s, c]` E4M3 bytes, y `[n, p, q, k]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        stream: &Stream,
        (tile, schedule): Plan,
        (x, w, y): (View<'_>, View<'_>, View<'_>),
        g: &ConvGeometry,
        e: &Epilogue<'_>,
    ) -> Result<()> {
        if !TILES.contains(&tile) {
            return Err(Error::Invalid(format!(
                "no fp8 convolution kernel of {tile:?}"
            )));
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
        // the factors and biases are read 16 bytes at a time
        for (v, what) in [(e.alpha, "fp8 conv alpha"), (e.bias, "fp8 conv bias")] {
            if let Some(v) = v {
                v.require(n * 4, what)?;
                if !v.is_aligned(16) {
                    return Err(Error::Invalid(format!("{what} must start 16-byte aligned")));
                }
            }
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
        // the epilogue's first pass keeps y's type, or f16 (f32 for f32 y) to add a residual to
        let first_pass = match (e.z.is_some(), e.y_dtype) {
            (true, DType::F32) => 4,
            (true, _) => 2,
            (false, t) => t.size_bytes(),
        };
        let (eoff, shared) = tile.layout(schedule, kg.div_ceil(BK), first_pass);
        let tiles = n.div_ceil(tile.bn) * m.div_ceil(BM);
        let blocks = match schedule {
            Schedule::OneTile => tiles,
            Schedule::Persistent => {
                // blocks an SM holds: its registers (the kernel's bound), 228 KiB of shared
                // memory (1 KiB of it the system's a block), 2048 threads
                let resident = tile
                    .blocks_an_sm()
                    .min(228 * 1024 / (shared + 1024))
                    .clamp(1, 8);
                tiles.min(self.sms * resident)
            }
        };
        let grid = (
            u32::try_from(blocks)
                .map_err(|_| Error::Invalid(format!("fp8 conv: {m}x{n} is too many tiles")))?,
            1,
            1,
        );
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
            Arg::Size(eoff),
        ]);
        let launch = Launch {
            shared_bytes: shared as u32,
            ..Launch::new(grid, (256, 1, 1))
        };
        self.module.launch(&tile.name(), stream, launch, &args)
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
        let params = "p p p p p p i i i i i i i i i i i i i i i i i f f i";
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
    fn persistent_blocks_keep_the_epilogue_apart_where_it_fits() {
        let tile = Tile { bn: 128, stages: 6 };
        let stages = 6 * (128 + 128) * 128;
        // E4M3 out: 192 KiB of stages and 19 KiB of epilogue fit together
        let (eoff, shared) = tile.layout(Schedule::Persistent, 20, 1);
        assert_eq!(eoff, stages);
        assert!(shared <= 227 * 1024);
        // f32 out does not: the epilogue goes over the stages
        let (eoff, shared) = tile.layout(Schedule::Persistent, 20, 4);
        assert_eq!((eoff, shared), (0, stages + 1024));
        // one tile a block: always over the stages; few steps take few stages
        let (eoff, shared) = tile.layout(Schedule::OneTile, 2, 1);
        assert_eq!(eoff, 0);
        assert_eq!(shared, 2 * (128 + 128) * 128 + 1024);
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
