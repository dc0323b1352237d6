//! Products of few rows on the tensor cores, gpukit's own: `y = act(x w + bias + z)` for 16-bit
//! types where the library's kernels cost several microseconds whatever the size (ConvNeXt-T at
//! batch 1: 4-7.7 us a product whose bytes need under 1.2). A block computes a 64 x 64 tile
//! with `mma.sync` over one piece of K; where the tiles are too few to fill the GPU, K is cut
//! into pieces whose f32 tiles the last block to finish adds up. The engine times it beside
//! cuBLASLt's candidates and keeps it only where it is faster.

use super::geometry::activation_code;
use crate::graph::Activation;
use gpukit_cuda::kernel::{tag, Arg, KernelModule, KernelSource, Launch, HALF};
use gpukit_cuda::{DeviceBuffer, Error, Gpu, Result, Stream, View};
use gpukit_types::DType;

pub(super) mod whole;

/// The tensor-core helpers gpukit's product kernels share: `Mma<T>::run` (mma.sync m16n8k16, f32
/// accumulators, for H and B), `copy16` (cp.async of 16 bytes, zero-filled past `bytes`) and
/// `ldmatrix4` / `ldmatrix4_trans` (four 8 x 8 matrices from shared memory).
pub(super) const TENSOR_CORES: &str = r#"
template <class T> struct Mma;
template <> struct Mma<H> {
    static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<B> {
    static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

// 16 bytes from global to shared memory, zeros for the bytes past `bytes` (0 or 16)
__device__ __forceinline__ void copy16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(shared_address(dst)), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void ldmatrix4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(p)));
}

__device__ __forceinline__ void ldmatrix4_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(p)));
}

"#;

pub(super) const SOURCE: &str = r#"
// y [m, n] = act(x [m, k] w [k, n] + bias [n] + z [m, n]), all row-major 16-bit, rows 16-byte
// aligned, n a multiple of 8, k of 32 * gridDim.z; f32 accumulation. Block (x, y, z): the
// 64 x 64 tile at columns 64 x, rows 64 y, over K range [z kc, (z + 1) kc). 4 warps of 32 x 32
// outputs, mma.sync m16n8k16 on fragments read by ldmatrix from x and w tiles (64 x 32, 32 x 64)
// in GS_STAGES stages of shared memory (padded against bank conflicts) filled by cp.async
// GS_STAGES - 1 steps ahead: a piece of K of up to 3 steps is loaded in one go. One piece of K
// (gridDim.z 1): the epilogue from the registers. Several: each block adds its f32 tile into
// part [m][n] (zero between launches) with atomics; the last of a tile's blocks to finish
// (counts[tile], which it sets back to 0) takes the sums, leaving zeros, and writes y. The
// order of the sums varies from launch to launch (f32 rounding apart). w and bias are
// constants: a block prefetches its slice of w into L2, loads its first tiles and reads its
// bias before it waits for the kernel ahead.
// bias, z (laid out as y, may be y itself), part and counts may be null.
#define GS_BM 64
#define GS_BN 64
#define GS_BK 32
#define GS_XP 40
#define GS_WP 72
#define GS_STAGES 4

// Two consecutive 16-bit values as floats (4-byte aligned), and back through the activation.
template <class T>
__device__ __forceinline__ float2 load_pair(const T* p) {
    const Pack<T, 2> v = *(const Pack<T, 2>*)p;
    return make_float2(to_f(v.v[0]), to_f(v.v[1]));
}
template <class T>
__device__ __forceinline__ void store_pair(T* p, float2 s, int act, float alpha, float beta) {
    Pack<T, 2> o;
    o.v[0] = from_f<T>(activate(act, s.x, alpha, beta));
    o.v[1] = from_f<T>(activate(act, s.y, alpha, beta));
    *(Pack<T, 2>*)p = o;
}

// A warp's step of 16 over its 32 x 32 outputs: acc[i][j] += a[i] x w's piece j, where w holds
// two transposed ldmatrix x4 loads of 16 columns each (load jj's registers 0-1 and 2-3 are
// the B fragments of its two 8-column pieces).
template <class T>
__device__ __forceinline__ void mma_step(float (&acc)[2][4][4], const unsigned (&a)[2][4],
                                         const unsigned (&w)[2][4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) Mma<T>::run(acc[i][j], a[i], &w[j >> 1][(j & 1) * 2]);
}

// Adds the pair (x, y) into part at `at` (8-byte aligned: n and the column even): one vector
// reduction on sm_90.
__device__ __forceinline__ void add_pair(float* at, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(at), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(at, x);
    atomicAdd(at + 1, y);
#endif
}

// Counts the block's piece of `tile` done once every thread's sums are in (the barrier, then
// one acquire-release add by thread 0; the last block's reads come after its acquire and the
// second barrier); whether it was the tile's last piece, for every thread (`last`: shared).
__device__ __forceinline__ bool last_piece(unsigned* counts, unsigned tile, unsigned* last) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                     : "=r"(before) : "l"(counts + tile) : "memory");
        *last = before == gridDim.z - 1;
    }
    __syncthreads();
    return *last;
}

// The block's 64 x 64 tile of y = act(X w + bias + z) over K range [k0, k0 + kc): X's tile rows
// come from `load_x(stage, kt)` (which fills xs[stage] with rows m0.. and K values
// k0 + 32 kt.., zeros where there are none), w's from the rows of w below `kw` (zeros past it
// and past column n). n is a multiple of 8; columns past it are neither read nor written.
template <class T, class LoadX>
__device__ void product_tile(LoadX& load_x, T* xs, T* ws, const T* __restrict__ w,
                             const T* __restrict__ bias, const T* z, T* y, float* part,
                             unsigned* counts, int m, int n, int kw, int kc, int act, float alpha,
                             float beta) {
    __shared__ unsigned last;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int m0 = blockIdx.y * GS_BM, n0 = blockIdx.x * GS_BN, k0 = blockIdx.z * kc;
    const int steps = kc / GS_BK;
    let_next_grid_start();
    // the weights (constants) before the wait: the block's slice into L2 (a row of it is one
    // 128-byte line), its first tile into shared memory
    for (int r = t; r < kc && k0 + r < kw; r += blockDim.x)
        asm volatile("prefetch.global.L2 [%0];" :: "l"(w + (long long)(k0 + r) * n + n0));
    // a w tile is 32 rows of 8 chunks of 8 values: this thread's (of 128) are rows wr and
    // wr + 16 at column wc; their sources advance 32 rows a step
    const int wr = t >> 3, wc = (t & 7) * 8;
    const bool wcol = n0 + wc < n;
    const T* wsrc = w + (long long)(k0 + wr) * n + n0 + wc;
    T* wdst = ws + wr * GS_WP + wc;
    auto load_w = [&](int s, int kt) {
        const int row = k0 + kt * GS_BK + wr;
        const T* src = wsrc + (long long)kt * GS_BK * n;
        T* dst = wdst + s * (GS_BK * GS_WP);
        const bool a = wcol && row < kw, b = wcol && row + 16 < kw;
        copy16(dst, a ? src : w, a ? 16 : 0);
        copy16(dst + 16 * GS_WP, b ? src + 16 * n : w, b ? 16 : 0);
    };
    for (int st = 0; st < GS_STAGES - 1 && st < steps; ++st) load_w(st, st);
    // the bias of the thread's four column pairs (a constant too): accumulator (i, j, e) is
    // at column n0 + wn + 8 j + 2 (lane % 4) (+ 1 for odd e), wn = 32 (warp % 2)
    float2 bv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = n0 + (warp & 1) * 32 + j * 8 + (lane & 3) * 2;
        bv[j] = bias && col < n ? load_pair(bias + col) : make_float2(0.0f, 0.0f);
    }
    wait_for_previous_grid();
    // X is the kernel ahead's output: read only after the wait. Group st holds stage st's x
    // (and group 0 the w tiles loaded above too)
    for (int st = 0; st < GS_STAGES - 1; ++st) {
        if (st < steps) load_x(st, st);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    float acc[2][4][4] = {};
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32, q = lane >> 3;
    for (int kt = 0; kt < steps; ++kt) {
        const int s = kt % GS_STAGES;
        // step kt's group done (GS_STAGES - 2 younger ones may be in flight), and every
        // thread past step kt - 1, whose stage the load below refills
        asm volatile("cp.async.wait_group %0;\n" :: "n"(GS_STAGES - 2) : "memory");
        __syncthreads();
        if (kt + GS_STAGES - 1 < steps) {
            const int ahead = (kt + GS_STAGES - 1) % GS_STAGES;
            load_w(ahead, kt + GS_STAGES - 1);
            load_x(ahead, kt + GS_STAGES - 1);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < GS_BK; kk += 16) {
            unsigned a[2][4], w[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                ldmatrix4(a[i], &xs[s * (GS_BM * GS_XP) + (wm + i * 16 + (lane & 15)) * GS_XP + kk +
                                    (lane >> 4) * 8]);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                // lanes 8q..8q+7 give the rows of 8 x 8 matrix q: k (q & 1) * 8 + lane % 8,
                // columns from (q >> 1) * 8 of the warp's 16-column piece j
                const int wrow = kk + (q & 1) * 8 + (lane & 7);
                ldmatrix4_trans(w[j], &ws[s * (GS_BK * GS_WP) + wrow * GS_WP + wn + j * 16 +
                                          (q >> 1) * 8]);
            }
            mma_step<T>(acc, a, w);
        }
    }
    // accumulator (i, j, e): row wm + 16 i + lane / 4 (+ 8 for e >= 2), column
    // wn + 8 j + 2 (lane % 4) (+ 1 for odd e), of the block's tile
    const int row0 = m0 + wm + (lane >> 2), col0 = n0 + wn + (lane & 3) * 2;
    if (gridDim.z > 1) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row0 + i * 16 + h * 8, col = col0 + j * 8;
                    if (row < m && col < n)
                        add_pair(part + (long long)row * n + col, acc[i][j][2 * h],
                                 acc[i][j][2 * h + 1]);
                }
        const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
        if (!last_piece(counts, tile, &last)) return;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row0 + i * 16 + h * 8, col = col0 + j * 8;
                    float s0 = 0.0f, s1 = 0.0f;
                    if (row < m && col < n) {
                        // the sums, and zeros left for the next launch
                        float* at = part + (long long)row * n + col;
                        s0 = atomicExch(at, 0.0f);
                        s1 = atomicExch(at + 1, 0.0f);
                    }
                    acc[i][j][2 * h] = s0;
                    acc[i][j][2 * h + 1] = s1;
                }
        if (t == 0) counts[tile] = 0;
    }
    // every residual read before any output is stored (z may be y: a store would otherwise
    // hold back each next pair's read)
    float2 zv[2][4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + i * 16 + h * 8, col = col0 + j * 8;
                zv[i][j][h] = z && row < m && col < n ? load_pair(z + (long long)row * n + col)
                                                      : make_float2(0.0f, 0.0f);
            }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + i * 16 + h * 8, col = col0 + j * 8;
                if (row >= m || col >= n) continue;
                const float2 v = make_float2(acc[i][j][2 * h] + bv[j].x + zv[i][j][h].x,
                                             acc[i][j][2 * h + 1] + bv[j].y + zv[i][j][h].y);
                store_pair(y + (long long)row * n + col, v, act, alpha, beta);
            }
}

// y [m, n] = act(x [m, k] w [k, n] + bias [n] + z [m, n]): X's rows are x's.
template <class T>
__device__ void gemm_small(const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ bias, const T* z, T* y, float* part,
                           unsigned* counts, int m, int n, int k, int kc, int act, float alpha,
                           float beta) {
    __shared__ __align__(16) T xs[GS_STAGES][GS_BM * GS_XP];
    __shared__ __align__(16) T ws[GS_STAGES][GS_BK * GS_WP];
    const int t = threadIdx.x, m0 = blockIdx.y * GS_BM, k0 = blockIdx.z * kc;
    auto load_x = [&](int s, int kt) {
        for (int i = t; i < GS_BM * 4; i += blockDim.x) {
            const int r = i >> 2, c = (i & 3) * 8, row = m0 + r;
            const T* src = x + (long long)(row < m ? row : 0) * k + k0 + kt * GS_BK + c;
            copy16(&xs[s][r * GS_XP + c], src, row < m ? 16 : 0);
        }
    };
    product_tile<T>(load_x, &xs[0][0], &ws[0][0], w, bias, z, y, part, counts, m, n, k, kc, act,
                    alpha, beta);
}

// y [img, p, q, n] = act(conv(x [img, h, w, c]) + bias [n] + z), channel-last: the product of
// the implicit im2col rows (a row an output pixel, K = (r, s, c) with c fastest, kw = kr ks c
// values, zero padded to the pieces' multiple of 32) and w [kw, n] (the filter as r, s, c, n).
// c a multiple of 8, so each 16-byte chunk of a row lies in one tap: zeros where the tap reads
// padding (pt above, pl to the left; below and right wherever it falls outside). Taps dh and dw
// apart (dilation). A thread keeps the input corners of its two rows and walks its chunk's
// (r, s, c).
template <class T>
__device__ void conv_small(const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ bias, const T* z, T* y, float* part,
                           unsigned* counts, int m, int n, int kw, int kc, int act, float alpha,
                           float beta, int h, int wd, int c, int p, int q, int ks, int stride,
                           int pt, int pl, int dh, int dw) {
    __shared__ __align__(16) T xs[GS_STAGES][GS_BM * GS_XP];
    __shared__ __align__(16) T ws[GS_STAGES][GS_BK * GS_WP];
    const int t = threadIdx.x, m0 = blockIdx.y * GS_BM, k0 = blockIdx.z * kc;
    // this thread's chunks: rows (t >> 2) and (t >> 2) + 32 of the tile, K column (t & 3) * 8;
    // their images and input corners, found at the first call (after the wait)
    const int col = (t & 3) * 8;
    const T* img[2];
    int ih[2], iw[2];
    bool live[2];
    // the chunk's K index, its tap (tr, ts) and channel: next is the one `load_x` reads
    int next = k0 + col;
    int ch = next % c, tap = next / c;
    int tr = tap / ks, ts = tap - tr * ks;
    auto load_x = [&](int s, int kt) {
        if (kt == 0) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int row = m0 + (t >> 2) + 32 * j;
                live[j] = row < m;
                const int pix = live[j] ? row : 0, b = pix / (p * q), rest = pix - b * p * q;
                const int op = rest / q, oq = rest - op * q;
                img[j] = x + (long long)b * h * wd * c;
                ih[j] = op * stride - pt;
                iw[j] = oq * stride - pl;
            }
        }
        // called for kt = 0, 1, 2, ... in order: the chunk's K index is next
        const bool inside = next < kw;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int yy = ih[j] + tr * dh, xx = iw[j] + ts * dw;
            const bool in = inside && live[j] && yy >= 0 && yy < h && xx >= 0 && xx < wd;
            // within one image: fewer than 2^31 values
            const T* src = in ? img[j] + (yy * wd + xx) * c + ch : x;
            copy16(&xs[s][((t >> 2) + 32 * j) * GS_XP + col], src, in ? 16 : 0);
        }
        next += GS_BK;
        ch += GS_BK;
        while (ch >= c) {
            ch -= c;
            if (++ts == ks) {
                ts = 0;
                ++tr;
            }
        }
    };
    product_tile<T>(load_x, &xs[0][0], &ws[0][0], w, bias, z, y, part, counts, m, n, kw, kc, act,
                    alpha, beta);
}

#define GEMM_SMALL(T, TAG)                                                                     \
extern "C" __global__ void gemm_small_##TAG(const T* x, const T* w, const T* bias,          \
    const T* z, T* y, float* part, unsigned* counts, int m, int n, int k, int kc, int act,      \
    float alpha, float beta)                                                                   \
    { gemm_small<T>(x, w, bias, z, y, part, counts, m, n, k, kc, act, alpha, beta); }
GEMM_SMALL(H, f16)
GEMM_SMALL(B, bf16)

// A convolution kernel NAME_TAG of element type T over the device function NAME<T> (the
// staged conv_small here, conv_whole in gemm/whole.rs: the same parameters).
#define CONV_KERNEL(NAME, T, TAG)                                                              \
extern "C" __global__ void NAME##_##TAG(const T* x, const T* w, const T* bias,               \
    const T* z, T* y, float* part, unsigned* counts, int m, int n, int kw, int kc, int act,     \
    float alpha, float beta, int h, int wd, int c, int p, int q, int ks, int stride, int pt,    \
    int pl, int dh, int dw)                                                                    \
    { NAME<T>(x, w, bias, z, y, part, counts, m, n, kw, kc, act, alpha, beta, h, wd, c, p, q,  \
              ks, stride, pt, pl, dh, dw); }
CONV_KERNEL(conv_small, H, f16)
CONV_KERNEL(conv_small, B, bf16)
"#;

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-gemm",
        source: format!(
            "{HALF}{}{TENSOR_CORES}{SOURCE}{}",
            super::PRELUDE,
            whole::SOURCE
        ),
        names: vec![
            "gemm_small_f16".into(),
            "gemm_small_bf16".into(),
            "conv_small_f16".into(),
            "conv_small_bf16".into(),
            "conv_whole_f16".into(),
            "conv_whole_bf16".into(),
        ],
    }
}

/// Floats of the pieces' sums and counters of tiles ([`SmallGemm::new`] allocates them once):
/// 4 MiB. The sums take m x n floats; the pieces are held to pieces x m x n within it (the
/// partial tiles of an earlier design), which keeps the kernel to the small products it is for.
const PART_FLOATS: usize = 1 << 20;
const COUNTS: usize = 4096;
/// Blocks a product aims for when K is cut into pieces: about two a multiprocessor of an H100.
const AIM_BLOCKS: usize = 264;
/// Fewest values of K a piece takes (4 tiles of 32).
const MIN_PIECE: usize = 128;

/// The pieces K may be cut into for an `m x n x k` product (the kernel's constraints: n a
/// multiple of 8, every piece of K a multiple of 32, the partial tiles within the scratch):
/// one, and where one leaves too few blocks, the most pieces up to about [`AIM_BLOCKS`] blocks
/// of at least [`MIN_PIECE`] values of K. Empty where the kernel does not take the shape.
pub fn pieces(m: usize, n: usize, k: usize) -> Vec<usize> {
    if !k.is_multiple_of(32) {
        return Vec::new();
    }
    cuts(m, n, k, |p| k.is_multiple_of(32 * p))
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// The pieces of a convolution's implicit product (`m` output pixels, `n` filters, `kw` =
/// taps x channels): K rounded up to pieces of a multiple of 32 (the kernel reads zeros past
/// `kw`), as (pieces, values of K a piece).
pub fn conv_pieces(m: usize, n: usize, kw: usize) -> Vec<(usize, usize)> {
    cuts(m, n, kw, |p| (p - 1) * piece_of(kw, p) < kw)
}

/// Most values of K a block of `conv_whole` holds (its x and w tiles: 88 KiB of shared
/// memory, within what every GPU from compute capability 8.0 grants a block).
pub const WHOLE_KC: usize = 320;
/// Most pieces `conv_whole` cuts K into.
const WHOLE_PIECES: usize = 64;

/// How a block of gpukit's convolution kernel loads its piece of K.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Loads {
    /// `conv_small`: in stages of 32 values, 4 warps a block.
    Staged,
    /// `conv_whole`: the whole piece at once, shared by `groups` groups of 4 warps.
    Whole { groups: usize },
}

/// One way gpukit's kernel runs a convolution: K in `pieces` pieces of `kc` values (a
/// multiple of 32), each block loading its piece as `loads` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cut {
    pub pieces: usize,
    pub kc: usize,
    pub loads: Loads,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.loads {
            Loads::Staged => write!(f, "{} pieces of {} (staged)", self.pieces, self.kc),
            Loads::Whole { groups } => write!(
                f,
                "{} pieces of {} (whole, {} warps)",
                self.pieces,
                self.kc,
                4 * groups
            ),
        }
    }
}

/// Every way gpukit's kernel runs a convolution's implicit product (`m` output pixels, `n`
/// filters, `kw` = taps x channels) on a GPU of `sms` multiprocessors: [`conv_pieces`]' cuts
/// in stages, and where the output has fewer tiles than about two a multiprocessor, whole
/// pieces: of at most 64, 128 and 256 values with 2 warp groups, and with 4 the pieces of at
/// most 256 values and as many pieces as fill the multiprocessors once (a block each: a
/// second block on some would double their time). The engine times each.
pub fn conv_cuts(m: usize, n: usize, kw: usize, sms: usize) -> Vec<Cut> {
    let mut cuts: Vec<Cut> = conv_pieces(m, n, kw)
        .into_iter()
        .map(|(pieces, kc)| Cut {
            pieces,
            kc,
            loads: Loads::Staged,
        })
        .collect();
    // the staged cuts' checks hold for the whole ones (n a multiple of 8, tiles counted)
    let tiles = m.div_ceil(64) * n.div_ceil(64);
    if cuts.is_empty() || tiles >= AIM_BLOCKS || m * n > PART_FLOATS {
        return cuts;
    }
    let fill = (sms / tiles).max(1);
    let ways = [64, 128, 256]
        .map(|most| (kw.div_ceil(most), 2))
        .into_iter()
        .chain([(kw.div_ceil(256), 4), (fill, 4)]);
    let mut whole: Vec<Cut> = Vec::new();
    for (pieces, groups) in ways {
        let kc = piece_of(kw, pieces);
        let cut = Cut {
            pieces,
            kc,
            loads: Loads::Whole { groups },
        };
        let fits = (pieces - 1) * kc < kw && pieces <= WHOLE_PIECES && kc <= WHOLE_KC;
        if fits && !whole.contains(&cut) {
            whole.push(cut);
        }
    }
    cuts.extend(whole);
    cuts
}

/// Values of K a piece takes when `k` is cut into `p`: a multiple of 32.
fn piece_of(k: usize, p: usize) -> usize {
    k.div_ceil(p).div_ceil(32) * 32
}

/// One piece, and where one leaves too few blocks the most pieces (`allowed`) up to about
/// [`AIM_BLOCKS`] blocks of at least [`MIN_PIECE`] values, and up to a half and a quarter of
/// that (fewer pieces: fewer sums added, longer pieces; the engine times each); empty where
/// the kernel does not take the shape (n not a multiple of 8, too many tiles).
fn cuts(m: usize, n: usize, k: usize, allowed: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let (rows, cols) = (m.div_ceil(64), n.div_ceil(64));
    let tiles = rows * cols;
    if m == 0 || k == 0 || !n.is_multiple_of(8) || tiles > COUNTS || rows > 65_535 {
        return Vec::new();
    }
    let fits = |p: usize| allowed(p) && k / p >= MIN_PIECE && p * m * n <= PART_FLOATS;
    let most = |aim: usize| (2..=32).rev().find(|&p| tiles * p <= aim && fits(p));
    let mut out: Vec<usize> = std::iter::once(1)
        .chain(
            [AIM_BLOCKS / 4, AIM_BLOCKS / 2, AIM_BLOCKS]
                .into_iter()
                .filter_map(most),
        )
        .collect();
    out.dedup();
    out.into_iter().map(|p| (p, piece_of(k, p))).collect()
}

/// x, w, bias, z and y of a product.
type Operands<'a> = (
    View<'a>,
    View<'a>,
    Option<View<'a>>,
    Option<View<'a>>,
    View<'a>,
);

/// `kernel`'s operands checked: a 16-bit `dtype`, x of `x_elems` values, w `[k, n]`, y (and z)
/// `[m, n]`, bias `[n]`, x, w and y 16-byte aligned.
fn check_operands(
    kernel: &str,
    dtype: DType,
    (x, w, bias, z, y): Operands<'_>,
    x_elems: usize,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    if !matches!(dtype, DType::F16 | DType::Bf16) {
        return Err(Error::Invalid(format!(
            "{kernel} takes f16 and bf16, not {dtype}"
        )));
    }
    let e = dtype.size_bytes();
    x.require(x_elems * e, &format!("{kernel} x"))?;
    w.require(k * n * e, &format!("{kernel} w"))?;
    y.require(m * n * e, &format!("{kernel} y"))?;
    if let Some(b) = bias {
        b.require(n * e, &format!("{kernel} bias"))?;
    }
    if let Some(z) = z {
        z.require(m * n * e, &format!("{kernel} z"))?;
    }
    let aligned = [x, w, y].iter().all(|v| v.is_aligned(16))
        && z.is_none_or(|z| z.is_aligned(4))
        && bias.is_none_or(|b| b.is_aligned(4));
    match aligned {
        true => Ok(()),
        false => Err(Error::Invalid(format!(
            "{kernel} needs 16-byte aligned operands"
        ))),
    }
}

/// The kernel on one device, with its scratch.
pub struct SmallGemm {
    module: KernelModule,
    part: DeviceBuffer,
    counts: DeviceBuffer,
    /// The device's multiprocessors (the whole pieces' counts fill them).
    pub sms: usize,
}

impl SmallGemm {
    /// Compiles the kernel for `gpu` (or reads it from the cache) and allocates its scratch
    /// (the counters and the sums zeroed).
    pub fn new(discovery: &gpukit_cuda::loader::Discovery, gpu: &Gpu) -> Result<SmallGemm> {
        let counts = gpu.alloc(COUNTS * 4)?;
        gpu.fill(counts.view(), 0)?;
        let part = gpu.alloc(PART_FLOATS * 4)?;
        gpu.fill(part.view(), 0)?;
        Ok(SmallGemm {
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
            part,
            counts,
            sms: gpukit_cuda::driver::device_attributes(gpu.ordinal, 1)?.sm_count as usize,
        })
    }

    /// Bytes of its scratch: the pieces' sums and the tiles' counters.
    pub fn scratch_bytes(&self) -> usize {
        self.part.len() + self.counts.len()
    }

    /// `y [m, n] = act(x [m, k] w [k, n] + bias + z)` (row-major, z laid out as y) with K in
    /// `pieces` pieces (one of [`pieces`]' answers), on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        stream: &Stream,
        dtype: DType,
        (x, w, bias, z, y): Operands<'_>,
        (m, n, k): (usize, usize, usize),
        act: Option<Activation>,
        pieces: usize,
    ) -> Result<()> {
        if !self::pieces(m, n, k).contains(&pieces) {
            return Err(Error::Invalid(format!(
                "gemm_small does not take {m}x{n}x{k} in {pieces} pieces"
            )));
        }
        let ops = (x, w, bias, z, y);
        check_operands("gemm_small", dtype, ops, m * k, (m, n, k))?;
        self.launch(
            "gemm_small",
            stream,
            dtype,
            ops,
            (m, n, k, k / pieces),
            act,
            (pieces, Loads::Staged),
            &[],
        )
    }

    /// Launches `kernel` (gemm_small or conv_small) of `dtype`: the operands, the scratch,
    /// `m`, `n`, K, values of K a piece, the activation, then `extra`; a grid of `pieces`
    /// layers, blocks as `loads` has them.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        kernel: &str,
        stream: &Stream,
        dtype: DType,
        (x, w, bias, z, y): Operands<'_>,
        (m, n, k, kc): (usize, usize, usize, usize),
        act: Option<Activation>,
        (pieces, loads): (usize, Loads),
        extra: &[Arg<'_>],
    ) -> Result<()> {
        let (code, alpha, beta) = activation_code(act);
        let mut args = vec![
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::opt(bias),
            Arg::opt(z),
            Arg::Ptr(y),
            Arg::Ptr(self.part.view()),
            Arg::Ptr(self.counts.view()),
            Arg::Size(m),
            Arg::Size(n),
            Arg::Size(k),
            Arg::Size(kc),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(beta),
        ];
        args.extend_from_slice(extra);
        let grid = (n.div_ceil(64) as u32, m.div_ceil(64) as u32, pieces as u32);
        let launch = match loads {
            Loads::Staged => Launch::new(grid, (128, 1, 1)),
            Loads::Whole { groups } => Launch {
                shared_bytes: whole::shared_bytes(kc, groups) as u32,
                ..Launch::new(grid, (128 * groups as u32, 1, 1))
            },
        }
        .starting_early();
        let name = format!("{kernel}_{}", tag(dtype));
        self.module.launch(&name, stream, launch, &args)
    }
}

/// A convolution of channel-last 16-bit maps as [`SmallGemm::run_conv`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// Input `[n, h, w, c]` (c a multiple of 8).
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    /// Filters (a multiple of 8), taps `r x s`, one stride.
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub stride: usize,
    /// Zero padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Spacing of the taps along height and width.
    pub dilation: [usize; 2],
}

impl ConvGeometry {
    /// Output (p, q).
    pub fn out(&self) -> (usize, usize) {
        let [pt, pl, pb, pr] = self.pads;
        let side = |x: usize, pads: usize, t: usize, d: usize| {
            let span = d.saturating_mul(t.saturating_sub(1)).saturating_add(1);
            match (x + pads).checked_sub(span) {
                Some(v) if self.stride > 0 && t > 0 && d > 0 => v / self.stride + 1,
                _ => 0,
            }
        };
        (
            side(self.h, pt + pb, self.r, self.dilation[0]),
            side(self.w, pl + pr, self.s, self.dilation[1]),
        )
    }

    /// Rows, columns and K of the implicit product.
    pub fn product(&self) -> (usize, usize, usize) {
        let (p, q) = self.out();
        (self.n * p * q, self.k, self.r * self.s * self.c)
    }

    /// Whether the kernel takes it: channels and filters multiples of 8, a stride, sizes that
    /// fit its 32-bit indices.
    pub fn runs(&self) -> bool {
        let (m, n, kw) = self.product();
        self.c.is_multiple_of(8)
            && self.k.is_multiple_of(8)
            && self.stride >= 1
            && m > 0
            && !conv_pieces(m, n, kw).is_empty()
            && [self.n * self.h * self.w * self.c, m * n, kw]
                .iter()
                .all(|&v| v < i32::MAX as usize)
    }

    /// `w [k, c, r, s]` (the graph's filter) as the kernel reads it: `[r, s, c, k]`.
    pub fn filter(&self, w: &[f32]) -> Vec<f32> {
        let (k, c, r, s) = (self.k, self.c, self.r, self.s);
        let mut out = vec![0f32; k * c * r * s];
        for o in 0..k {
            for ch in 0..c {
                for i in 0..r {
                    for j in 0..s {
                        out[((i * s + j) * c + ch) * k + o] = w[((o * c + ch) * r + i) * s + j];
                    }
                }
            }
        }
        out
    }
}

impl SmallGemm {
    /// `y [n, p, q, k] = act(conv(x) + bias + z)` (channel-last, z laid out as y) as `cut`
    /// says (one of [`conv_cuts`]' answers); `w` is [`ConvGeometry::filter`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn run_conv(
        &self,
        stream: &Stream,
        dtype: DType,
        (x, w, bias, z, y): Operands<'_>,
        g: &ConvGeometry,
        act: Option<Activation>,
        cut: Cut,
    ) -> Result<()> {
        let (m, n, kw) = g.product();
        if !(g.runs() && conv_cuts(m, n, kw, self.sms).contains(&cut)) {
            return Err(Error::Invalid(format!(
                "gpukit's convolution kernel does not take {g:?} in {cut}"
            )));
        }
        let ops = (x, w, bias, z, y);
        check_operands("conv_small", dtype, ops, g.n * g.h * g.w * g.c, (m, n, kw))?;
        let (p, q) = g.out();
        let [pt, pl, _, _] = g.pads;
        let [dh, dw] = g.dilation;
        let extra = [g.h, g.w, g.c, p, q, g.s, g.stride, pt, pl, dh, dw].map(Arg::Size);
        let kernel = match cut.loads {
            Loads::Staged => "conv_small",
            Loads::Whole { .. } => "conv_whole",
        };
        self.launch(
            kernel,
            stream,
            dtype,
            ops,
            (m, n, kw, cut.kc),
            act,
            (cut.pieces, cut.loads),
            &extra,
        )
    }
}

#[cfg(test)]
mod tests;
