//! gpukit's kernels for dense channel-last tensors, a vector of channels a thread (16-byte loads,
//! f32 arithmetic):
//! - depthwise convolution (one filter per channel), `y = act(conv(x) + bias (+ z))` in one
//!   pass: cuDNN's fused engines run these convolutions on a grouped direct kernel at a tenth of
//!   the memory's speed, and its bare ones leave the epilogue to another pass;
//! - max and average pooling;
//! - global average pooling, a block per image and group of channels, its threads sharing the
//!   pixels (the general kernels give 32 channels a block: a 112x112 image of 32 channels took
//!   0.76 ms at batch 32).
//!
//! The general kernels (`super`) serve every other layout and stride.

use super::{dims_bytes, put, ProgramKernels, Strided, Window, HALF, PRELUDE};
use gpukit_cuda::kernel::{grid_for, tag, Arg, KernelModule, KernelSource, Launch};
use gpukit_cuda::{Result, View};
use gpukit_types::DType;

const SOURCE: &str = r#"

// `act` over N values with the choice made once (a switch for each value cost the depthwise
// kernels' epilogue a branch each).
template <int N>
__device__ __forceinline__ void activate_all(int act, float* v, float alpha, float beta) {
#define ACT_ALL(A)                                                                             \
    case A:                                                                                    \
        _Pragma("unroll") for (int k = 0; k < N; ++k) v[k] = activate(A, v[k], alpha, beta);   \
        break;
    switch (act) {
        ACT_ALL(1) ACT_ALL(2) ACT_ALL(3) ACT_ALL(4) ACT_ALL(5) ACT_ALL(6)
        default: break;
    }
#undef ACT_ALL
}

// A depthwise kernel's output vector: y[at, +V) = act(acc + bias[ch, +V) (+ z[at, +V))), the
// bias and the residual read as vectors (the launcher checks their alignment).
template <class T, int V>
__device__ __forceinline__ void dw_store(const float* acc, const T* __restrict__ bias,
                                         unsigned ch, const T* __restrict__ z,
                                         T* __restrict__ y, unsigned at, int act, float alpha,
                                         float beta) {
    float v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = acc[k];
    if (bias) {
        const Pack<T, V> b = *(const Pack<T, V>*)(bias + ch);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] += to_f(b.v[k]);
    }
    if (z) {
        const Pack<T, V> r = *(const Pack<T, V>*)(z + at);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] += to_f(r.v[k]);
    }
    activate_all<V>(act, v, alpha, beta);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_f<T>(v[k]);
    *(Pack<T, V>*)(y + at) = out;
}

// x [n, h, w, c], taps [r, s, c], y and z [n, p, q, c], all dense channel-last; bias [c].
// v[0..4] n, h, w, c; v[4], v[5] p, q; v[6], v[7] r, s; v[8] stride; v[9] padding (all sides).
// Thread o computes channels [V * (o % (c / V)), +V) of output pixel o / (c / V). Every index
// fits 31 bits (the launcher checks).
template <class T, int V>
__device__ void depthwise(const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ bias, const T* __restrict__ z, T* __restrict__ y,
                          Dims g, int act, float alpha, float beta) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    const unsigned h = d[1], wd = d[2], c = d[3], p = d[4], q = d[5], r = d[6], s = d[7];
    const int st = (int)d[8], pad = (int)d[9];
    const unsigned cv = c / V, total = (unsigned)d[0] * p * q * cv;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        unsigned pixel = o / cv, ch = (o - pixel * cv) * V;
        unsigned row = pixel / q, j = pixel - row * q;
        unsigned img = row / p, i = row - img * p;
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = 0.0f;
        for (unsigned di = 0; di < r; ++di) {
            int yy = (int)(i * st + di) - pad;
            if (yy < 0 || yy >= (int)h) continue;
            const T* xrow = x + ((img * h + (unsigned)yy) * wd) * c + ch;
            const T* wrow = w + di * s * c + ch;
            for (unsigned dj = 0; dj < s; ++dj) {
                int xx = (int)(j * st + dj) - pad;
                if (xx < 0 || xx >= (int)wd) continue;
                Pack<T, V> xv = *(const Pack<T, V>*)(xrow + (unsigned)xx * c);
                Pack<T, V> wv = *(const Pack<T, V>*)(wrow + dj * c);
#pragma unroll
                for (int k = 0; k < V; ++k) acc[k] += to_f(xv.v[k]) * to_f(wv.v[k]);
            }
        }
        dw_store<T, V>(acc, bias, ch, z, y, pixel * c + ch, act, alpha, beta);
    }
}

// The same for stride 1 and an S x S filter, with S and the stride (ST) known to the compiler
// (every tap's load issued before the first is used). One output vector (V channels) a thread;
// v[] as above.
template <class T, int V, int S, int ST>
__device__ void depthwise_fixed(const T* __restrict__ x, const T* __restrict__ w,
                                const T* __restrict__ bias, const T* __restrict__ z,
                                T* __restrict__ y, Dims g, int act, float alpha, float beta) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    const unsigned h = d[1], wd = d[2], c = d[3], p = d[4], q = d[5];
    const int pad = (int)d[9];
    const unsigned cv = c / V, total = (unsigned)d[0] * p * q * cv;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        const unsigned pixel = o / cv, ch = (o - pixel * cv) * V;
        const unsigned row = pixel / q, j = pixel - row * q;
        const unsigned img = row / p, i = row - img * p;
        const int y0 = (int)(i * ST) - pad, x0 = (int)(j * ST) - pad;
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = 0.0f;
#pragma unroll
        for (int di = 0; di < S; ++di) {
            const int yy = y0 + di;
            const bool row_in = yy >= 0 && yy < (int)h;
            const T* xrow = x + ((img * h + (unsigned)(row_in ? yy : 0)) * wd) * c + ch;
#pragma unroll
            for (int dj = 0; dj < S; ++dj) {
                const int xx = x0 + dj;
                if (!row_in || xx < 0 || xx >= (int)wd) continue;
                Pack<T, V> xv = *(const Pack<T, V>*)(xrow + (unsigned)xx * c);
                Pack<T, V> wv = *(const Pack<T, V>*)(w + (unsigned)(di * S + dj) * c + ch);
#pragma unroll
                for (int k = 0; k < V; ++k) acc[k] += to_f(xv.v[k]) * to_f(wv.v[k]);
            }
        }
        dw_store<T, V>(acc, bias, ch, z, y, pixel * c + ch, act, alpha, beta);
    }
}

// An S x S filter with stride ST, P outputs along a row a thread: each of the S input rows'
// (P - 1) ST + S pixels is loaded once into registers and each tap once, where the kernels
// above load an input pixel and a tap for every output and tap (their loads, not their
// arithmetic, set their speed). V channels a thread (8-byte loads); v[] as above. Thread o
// computes channels [V * (o % (c / V)), +V) of outputs j0..j0+P of row (o / (c / V)) / ceil(q / P).
template <class T, int V, int P, int S, int ST>
__device__ void depthwise_rows(const T* __restrict__ x, const T* __restrict__ w,
                               const T* __restrict__ bias, const T* __restrict__ z,
                               T* __restrict__ y, Dims g, int act, float alpha, float beta) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    const unsigned h = d[1], wd = d[2], c = d[3], p = d[4], q = d[5];
    const int pad = (int)d[9];
    const unsigned cv = c / V, qb = (q + P - 1) / P, total = (unsigned)d[0] * p * qb * cv;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        const unsigned rest = o / cv, ch = (o - rest * cv) * V;
        const unsigned row = rest / qb, jb = rest - row * qb;
        const unsigned img = row / p, i = row - img * p;
        const int j0 = (int)(jb * P);
        float acc[P][V];
#pragma unroll
        for (int k = 0; k < P; ++k)
#pragma unroll
            for (int u = 0; u < V; ++u) acc[k][u] = 0.0f;
        constexpr int WIN = (P - 1) * ST + S;
        for (int di = 0; di < S; ++di) {
            const int yy = (int)i * ST + di - pad;
            if (yy < 0 || yy >= (int)h) continue;
            const T* xrow = x + ((img * h + (unsigned)yy) * wd) * c + ch;
            float win[WIN][V];
#pragma unroll
            for (int t = 0; t < WIN; ++t) {
                const int xx = j0 * ST - pad + t;
                if (xx >= 0 && xx < (int)wd) {
                    Pack<T, V> xv = *(const Pack<T, V>*)(xrow + (unsigned)xx * c);
#pragma unroll
                    for (int u = 0; u < V; ++u) win[t][u] = to_f(xv.v[u]);
                } else {
#pragma unroll
                    for (int u = 0; u < V; ++u) win[t][u] = 0.0f;
                }
            }
            const T* wrow = w + (unsigned)(di * S) * c + ch;
#pragma unroll
            for (int dj = 0; dj < S; ++dj) {
                Pack<T, V> wv = *(const Pack<T, V>*)(wrow + (unsigned)dj * c);
#pragma unroll
                for (int k = 0; k < P; ++k)
#pragma unroll
                    for (int u = 0; u < V; ++u) acc[k][u] += win[k * ST + dj][u] * to_f(wv.v[u]);
            }
        }
#pragma unroll
        for (int k = 0; k < P; ++k) {
            const int j = j0 + k;
            if (j >= (int)q) break;
            const unsigned at = ((img * p + i) * q + (unsigned)j) * c + ch;
            dw_store<T, V>(acc[k], bias, ch, z, y, at, act, alpha, beta);
        }
    }
}

// Stride 1 and an S x S filter for few outputs (small batches, where a thread an output leaves
// most of the GPU idle and each thread's chain of loads sets the time): a block computes an
// 8 x 8 tile of output pixels for G vectors of V channels (8-byte vectors), after loading the
// input patch the tile reads ((8 + S - 1)^2 pixels, zeros outside the image) and the taps into
// shared memory with every load of the block in flight at once. A thread an output vector,
// thread t: vector t % G of pixel t / G of the tile. v[] as depthwise's; v[10] G. Grid: x the
// tiles (row-major over ceil(p / 8) x ceil(q / 8)), y the groups of G vectors, z the images.
template <class T, int S>
__device__ void depthwise_tile(const T* __restrict__ x, const T* __restrict__ w,
                               const T* __restrict__ bias, const T* __restrict__ z,
                               T* __restrict__ y, Dims g, int act, float alpha, float beta) {
    constexpr int V = 8 / sizeof(T), TILE = 8, PW = TILE + S - 1;
    typedef Pack<T, V> P;
    extern __shared__ __align__(16) unsigned char dw_tile_smem[];
    const long long* d = g.v;
    const int h = (int)d[1], wd = (int)d[2], c = (int)d[3], p = (int)d[4], q = (int)d[5];
    const int pad = (int)d[9], G = (int)d[10], cv = c / V;
    const int tiles_q = (q + TILE - 1) / TILE;
    const int ti0 = (int)(blockIdx.x / tiles_q) * TILE, tj0 = (int)(blockIdx.x % tiles_q) * TILE;
    const int g0 = (int)blockIdx.y * G, img = (int)blockIdx.z;
    P* xs = (P*)dw_tile_smem;  // [PW * PW][G]
    P* ws = xs + PW * PW * G;  // [S * S][G]
    const int t = threadIdx.x, nt = blockDim.x;
    P zero;
#pragma unroll
    for (int k = 0; k < V; ++k) zero.v[k] = from_f<T>(0.0f);
    let_next_grid_start();
    // the taps (weights) before the wait for the kernel ahead, the patch after
    for (int u = t; u < S * S * G; u += nt) {
        const int gv = u % G, tap = u / G, vec = g0 + gv;
        ws[u] = vec < cv ? *(const P*)(w + (unsigned)tap * c + vec * V) : zero;
    }
    wait_for_previous_grid();
    // the patch: with the launcher's block (TILE * TILE * G threads) each thread loads LOADS
    // vectors, all issued before any is stored (a loop of load-then-store waits on each load in
    // turn); the last loop serves any other block size
    constexpr int LOADS = (PW * PW + TILE * TILE - 1) / (TILE * TILE);
    const int span = PW * PW * G;
    P buf[LOADS];
#pragma unroll
    for (int it = 0; it < LOADS; ++it) {
        const int u = t + it * nt, gv = u % G, pix = u / G, vec = g0 + gv;
        const int yy = ti0 - pad + pix / PW, xx = tj0 - pad + pix % PW;
        const bool in = u < span && vec < cv && yy >= 0 && yy < h && xx >= 0 && xx < wd;
        buf[it] = in ? *(const P*)(x + ((unsigned)(img * h + yy) * wd + xx) * c + vec * V) : zero;
    }
#pragma unroll
    for (int it = 0; it < LOADS; ++it)
        if (t + it * nt < span) xs[t + it * nt] = buf[it];
    for (int u = t + LOADS * nt; u < span; u += nt) {
        const int gv = u % G, pix = u / G, vec = g0 + gv;
        const int yy = ti0 - pad + pix / PW, xx = tj0 - pad + pix % PW;
        const bool in = vec < cv && yy >= 0 && yy < h && xx >= 0 && xx < wd;
        xs[u] = in ? *(const P*)(x + ((unsigned)(img * h + yy) * wd + xx) * c + vec * V) : zero;
    }
    __syncthreads();
    const int gv = t % G, pix = t / G, ti = pix / TILE, tj = pix % TILE;
    const int i = ti0 + ti, j = tj0 + tj, vec = g0 + gv;
    if (pix >= TILE * TILE || i >= p || j >= q || vec >= cv) return;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
#pragma unroll
    for (int di = 0; di < S; ++di) {
#pragma unroll
        for (int dj = 0; dj < S; ++dj) {
            const P xv = xs[((ti + di) * PW + tj + dj) * G + gv];
            const P wv = ws[(di * S + dj) * G + gv];
#pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += to_f(xv.v[k]) * to_f(wv.v[k]);
        }
    }
    const unsigned at = ((unsigned)(img * p + i) * q + j) * c + vec * V;
    dw_store<T, V>(acc, bias, vec * V, z, y, at, act, alpha, beta);
}

// Max (v[14] != 0) or average pooling: x [n, h, w, c], y [n, p, q, c]. v[0..4] n, h, w, c;
// v[4], v[5] p, q; v[6], v[7] window; v[8], v[9] steps; v[10..14] padding top, left, bottom,
// right; v[15] != 0: an average divides by the window clipped to the padded input, else by its
// taps inside the input.
template <class T, int V>
__device__ void pool_cl(const T* __restrict__ x, T* __restrict__ y, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    const unsigned h = d[1], wd = d[2], c = d[3], p = d[4], q = d[5];
    const int kh = (int)d[6], kw = (int)d[7], sh = (int)d[8], sw = (int)d[9];
    const int pt = (int)d[10], pl = (int)d[11], pb = (int)d[12], pr = (int)d[13];
    const bool is_max = d[14] != 0;
    const unsigned cv = c / V, total = (unsigned)d[0] * p * q * cv;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        unsigned pixel = o / cv, ch = (o - pixel * cv) * V;
        unsigned row = pixel / q, j = pixel - row * q;
        unsigned img = row / p, i = row - img * p;
        int h0 = (int)i * sh - pt, w0 = (int)j * sw - pl;
        float m[V];
#pragma unroll
        for (int k = 0; k < V; ++k) m[k] = is_max ? -__int_as_float(0x7f800000) : 0.0f;
        int taps = 0;
        for (int di = 0; di < kh; ++di) {
            int yy = h0 + di;
            if (yy < 0 || yy >= (int)h) continue;
            for (int dj = 0; dj < kw; ++dj) {
                int xx = w0 + dj;
                if (xx < 0 || xx >= (int)wd) continue;
                Pack<T, V> xv = *(const Pack<T, V>*)(x + ((img * h + (unsigned)yy) * wd +
                                                          (unsigned)xx) * c + ch);
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    float u = to_f(xv.v[k]);
                    m[k] = is_max ? fmaxf(m[k], u) : m[k] + u;
                }
                ++taps;
            }
        }
        float scale = 1.0f;
        if (!is_max) {
            int div = taps;
            if (d[15]) {
                int he = min(h0 + kh, (int)h + pb), we = min(w0 + kw, (int)wd + pr);
                div = (he - h0) * (we - w0);
            }
            scale = div > 0 ? 1.0f / (float)div : 0.0f;
        }
        Pack<T, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = from_f<T>(is_max ? m[k] : m[k] * scale);
        *(Pack<T, V>*)(y + pixel * c + ch) = out;
    }
}

// Global average pooling: x [n, hw, c] into y [n, c]. v[0] n, v[1] hw, v[2] c, v[3] the channel
// vectors a block sums (vb), v[4] splits: the blocks an image's group of channels is split over.
// A block of blockDim.x = lanes * vb threads per (image, group of vb vectors, split), each lane
// summing every (lanes * splits)-th pixel, the lanes' sums added in shared memory. With splits
// > 1 (small batches: too few blocks otherwise) each block writes its sums to `partial` and the
// last block of its (image, group) to finish adds them up and writes y, then sets the group's
// `count` back to 0 for the next launch.
template <class T, int V>
__device__ void gap_cl(const T* __restrict__ x, T* __restrict__ y, float* partial,
                       unsigned* count, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    __shared__ float part[1024 * V];
    __shared__ float stage[1024];
    __shared__ bool last;
    const long long* d = g.v;
    const unsigned n = d[0], hw = d[1], c = d[2], vb = d[3], splits = d[4];
    const unsigned cv = c / V, chunks = (cv + vb - 1) / vb, lanes = blockDim.x / vb;
    const unsigned t = threadIdx.x, v = t % vb, lane = t / vb;
    for (unsigned b = blockIdx.x; b < n * chunks * splits; b += gridDim.x) {
        const unsigned group = b / splits, split = b - group * splits;
        const unsigned img = group / chunks, first = (group % chunks) * vb, vec = first + v;
        float s[V];
#pragma unroll
        for (int k = 0; k < V; ++k) s[k] = 0.0f;
        if (vec < cv)
#pragma unroll 4
            for (unsigned px = split * lanes + lane; px < hw; px += lanes * splits) {
                Pack<T, V> xv =
                    *(const Pack<T, V>*)(x + ((unsigned long long)img * hw + px) * c + vec * V);
#pragma unroll
                for (int k = 0; k < V; ++k) s[k] += to_f(xv.v[k]);
            }
#pragma unroll
        for (int k = 0; k < V; ++k) part[t * V + k] = s[k];
        __syncthreads();
        // the lanes' sums added in two stages with every thread taking part (one thread a
        // value adding all the lanes took 200 steps where a block has 200 lanes): G groups of
        // threads each add every G-th lane of every value, then one thread a value the G sums
        const unsigned vals = vb * V, G = max(1u, min(lanes, blockDim.x / vals));
        for (unsigned w = t; w < G * vals; w += blockDim.x) {
            const unsigned u = w % vals, gi = w / vals, vv = u / V, k = u % V;
            float sum = 0.0f;
            for (unsigned l = gi; l < lanes; l += G) sum += part[(l * vb + vv) * V + k];
            stage[w] = sum;
        }
        __syncthreads();
        for (unsigned u = t; u < vals; u += blockDim.x) {
            unsigned vv = u / V, k = u % V;
            float sum = 0.0f;
            for (unsigned gi = 0; gi < G; ++gi) sum += stage[gi * vals + u];
            if (splits > 1)
                partial[(unsigned long long)b * vb * V + u] = sum;
            else if (first + vv < cv)
                y[(unsigned long long)img * c + (first + vv) * V + k] = from_f<T>(sum / (float)hw);
        }
        if (splits > 1) {
            __threadfence();
            __syncthreads();
            if (t == 0) last = atomicAdd(&count[group], 1u) == splits - 1;
            __syncthreads();
            if (last) {
                __threadfence();
                for (unsigned u = t; u < vb * V; u += blockDim.x) {
                    unsigned vv = u / V, k = u % V;
                    float sum = 0.0f;
#pragma unroll 8
                    for (unsigned sp = 0; sp < splits; ++sp)
                        sum += __ldcg(&partial[((unsigned long long)group * splits + sp) * vb * V + u]);
                    if (first + vv < cv)
                        y[(unsigned long long)img * c + (first + vv) * V + k] =
                            from_f<T>(sum / (float)hw);
                }
                if (t == 0) count[group] = 0;
            }
        }
        __syncthreads();
    }
}

// depthwise_rows for filter size S and P outputs a thread, 8-byte loads
#define DW_ROWS(T, TAG, S, P)                                                                  \
extern "C" __global__ void depthwise_rows##S##x##P##_##TAG(const T* x, const T* w,            \
    const T* bias, const T* z, T* y, Dims g, int act, float alpha, float beta)                 \
    { depthwise_rows<T, 8 / sizeof(T), P, S, 1>(x, w, bias, z, y, g, act, alpha, beta); }
// the same for stride 2
#define DW_ROWS2(T, TAG, S, P)                                                                 \
extern "C" __global__ void depthwise_rows##S##x##P##s2_##TAG(const T* x, const T* w,          \
    const T* bias, const T* z, T* y, Dims g, int act, float alpha, float beta)                 \
    { depthwise_rows<T, 8 / sizeof(T), P, S, 2>(x, w, bias, z, y, g, act, alpha, beta); }
// depthwise_fixed for filter size S and stride ST, 16-byte loads
#define DW_FIXED(T, TAG, V, S, ST)                                                             \
extern "C" __global__ void depthwise_vec##S##s##ST##_##TAG(const T* x, const T* w,            \
    const T* bias, const T* z, T* y, Dims g, int act, float alpha, float beta)                 \
    { depthwise_fixed<T, V, S, ST>(x, w, bias, z, y, g, act, alpha, beta); }

// depthwise_tile for filter size S
#define DW_TILE(T, TAG, S)                                                                     \
extern "C" __global__ void depthwise_tile##S##_##TAG(const T* x, const T* w, const T* bias,    \
    const T* z, T* y, Dims g, int act, float alpha, float beta)                                \
    { depthwise_tile<T, S>(x, w, bias, z, y, g, act, alpha, beta); }

#define DEPTHWISE(T, TAG, V)                                                                   \
extern "C" __global__ void depthwise_vec_##TAG(const T* x, const T* w, const T* bias,           \
    const T* z, T* y, Dims g, int act, float alpha, float beta)                                \
    { depthwise<T, V>(x, w, bias, z, y, g, act, alpha, beta); }                                 \
extern "C" __global__ void depthwise_one_##TAG(const T* x, const T* w, const T* bias,           \
    const T* z, T* y, Dims g, int act, float alpha, float beta)                                \
    { depthwise<T, 1>(x, w, bias, z, y, g, act, alpha, beta); }                                 \
DW_ROWS(T, TAG, 3, 2) DW_ROWS(T, TAG, 3, 4) DW_ROWS(T, TAG, 5, 2) DW_ROWS(T, TAG, 5, 4)          \
DW_ROWS(T, TAG, 7, 2) DW_ROWS(T, TAG, 7, 4)                                                    \
DW_ROWS2(T, TAG, 3, 2) DW_ROWS2(T, TAG, 3, 4) DW_ROWS2(T, TAG, 5, 2)                           \
DW_FIXED(T, TAG, V, 3, 1) DW_FIXED(T, TAG, V, 3, 2) DW_FIXED(T, TAG, V, 5, 1)                  \
DW_FIXED(T, TAG, V, 5, 2)                                                                      \
DW_TILE(T, TAG, 3) DW_TILE(T, TAG, 5) DW_TILE(T, TAG, 7)                                       \
extern "C" __global__ void pool_cl_##TAG(const T* x, T* y, Dims g) { pool_cl<T, V>(x, y, g); }  \
extern "C" __global__ void gap_cl_##TAG(const T* x, T* y, float* partial, unsigned* count,      \
    Dims g) { gap_cl<T, V>(x, y, partial, count, g); }

DEPTHWISE(float, f32, 4)
DEPTHWISE(H, f16, 8)
DEPTHWISE(B, bf16, 8)
"#;

/// The kernels' names without their element type tag.
pub(super) const KERNELS: [&str; 20] = [
    "depthwise_vec",
    "depthwise_one",
    "depthwise_rows3x2",
    "depthwise_rows3x4",
    "depthwise_rows5x2",
    "depthwise_rows5x4",
    "depthwise_rows7x2",
    "depthwise_rows7x4",
    "depthwise_rows3x2s2",
    "depthwise_rows3x4s2",
    "depthwise_rows5x2s2",
    "depthwise_vec3s1",
    "depthwise_vec3s2",
    "depthwise_vec5s1",
    "depthwise_vec5s2",
    "depthwise_tile3",
    "depthwise_tile5",
    "depthwise_tile7",
    "pool_cl",
    "gap_cl",
];

/// Channels a thread of `depthwise_vec` computes for element type `dtype`.
pub(super) fn vector(dtype: DType) -> usize {
    16 / dtype.size_bytes()
}

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-channels-last",
        source: format!("{HALF}{PRELUDE}{SOURCE}"),
        names: super::tagged(&KERNELS),
    }
}

/// Floats of the global average's partial sums and groups of its counters
/// ([`ProgramKernels::new`] allocates them once).
pub(super) const GAP_PARTIAL_FLOATS: usize = 1 << 19;
pub(super) const GAP_COUNTS: usize = 4096;
/// Blocks below which a global average gives a block fewer channel vectors or splits images'
/// pixels over blocks.
const GAP_BLOCKS: usize = 256;
/// Blocks a global average aims for when it splits images' pixels: about eight of 256
/// threads an SM of the largest GPUs (256 left EfficientNet-B0's averages of few channels
/// over large maps at 1.0-1.9 TB/s on an H200).
const GAP_SPLIT_BLOCKS: usize = 1024;

/// Lanes a block and splits an (image, group of `vb` channel vectors) for a global average of
/// `groups` such groups over `hw` pixels: one block a group of up to 1,024 threads where there
/// are enough groups; else blocks of 256 threads, each group's pixels split over up to 32 of
/// them (at least 4 pixels a lane) towards [`GAP_SPLIT_BLOCKS`], as long as the partial sums
/// fit the scratch.
fn split_average(groups: usize, vb: usize, hw: usize) -> (usize, usize) {
    let whole = ((1024 / vb).min(hw).max(1), 1);
    if groups >= GAP_BLOCKS / 2 || groups > GAP_COUNTS {
        return whole;
    }
    let lanes = (256 / vb).min(hw).max(1);
    let splits = GAP_SPLIT_BLOCKS
        .div_ceil(groups)
        .min(32)
        .min(hw.div_ceil(lanes * 4))
        .max(1);
    // at most 8 values a vector (16 bytes of 16-bit values)
    let fits = groups * splits * vb * 8 <= GAP_PARTIAL_FLOATS;
    match splits > 1 && fits {
        true => (lanes, splits),
        false => whole,
    }
}

/// Channel vectors a block of the global average sums for `n` images of `cv` vectors: up to
/// 128, halved while that leaves fewer than `GAP_BLOCKS / 2` blocks and more than 4 vectors
/// (64 bytes of 16-bit channels a pixel, two memory sectors): at batch 32 an image of 960
/// channels took one block of 120 vectors and its pixels split over 7 blocks, the partial sums
/// then added up in a chain of loads.
fn vectors_a_block(n: usize, cv: usize) -> usize {
    let mut vb = cv.clamp(1, 128);
    while vb > 4 && n * cv.div_ceil(vb) < GAP_BLOCKS / 2 {
        vb = vb.div_ceil(2).max(4);
    }
    vb
}

/// Loads the module for `gpu`.
pub(super) fn load(
    discovery: &gpukit_cuda::loader::Discovery,
    gpu: &gpukit_cuda::Gpu,
) -> Result<KernelModule> {
    KernelModule::load(discovery, gpu, &kernel_source())
}

/// The channels of one dense channel-last image row: `s` (`[n, c, h, w]` dims) with channels
/// contiguous and pixels `c` apart; Some(c).
fn dense_channels_last(s: &Strided) -> Option<usize> {
    let [_, c, h, w] = s.dims;
    (*s == Strided::image(s.dims, gpukit_tensor::Layout::Nhwc) && c > 1 && h * w >= 1).then_some(c)
}

/// Whether vectors of `v` elements of these views are whole and 16-byte aligned, and every index
/// fits 31 bits.
fn vectors_fit(views: &[View<'_>], c: usize, v: usize, elements: usize) -> bool {
    c.is_multiple_of(v) && views.iter().all(|b| b.is_aligned(16)) && elements < (1 << 31)
}

impl ProgramKernels {
    /// Pooling on dense channel-last tensors, a vector of channels a thread; None where the
    /// views are not of that form (the general kernel runs them).
    pub(super) fn pool_channels_last(
        &self,
        dtype: DType,
        (x, sx): (View<'_>, &Strided),
        (y, sy): (View<'_>, &Strided),
        win: &Window,
    ) -> Option<Result<()>> {
        let c = dense_channels_last(sx)?;
        dense_channels_last(sy)?;
        let v = vector(dtype);
        if !vectors_fit(&[x, y], c, v, sx.len().max(sy.len())) {
            return None;
        }
        let [n, _, h, w] = sx.dims;
        let [_, _, p, q] = sy.dims;
        let mut dims = [0i64; 32];
        put(&mut dims, 0, &[n, h, w, c, p, q]);
        put(&mut dims, 6, &win.kernel);
        put(&mut dims, 8, &win.strides);
        put(&mut dims, 10, &win.pads);
        dims[14] = i64::from(win.max);
        dims[15] = i64::from(win.count_include_pad);
        let bytes = dims_bytes(&dims);
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Struct("Dims", &bytes)];
        let name = format!("pool_cl_{}", tag(dtype));
        Some(self.channels_last.launch(
            &name,
            &self.stream,
            grid_for(sy.len() / v).starting_early(),
            &args,
        ))
    }

    /// Global average pooling of a dense channel-last `x` into `y` ([n, c] dense); None where
    /// the views are not of that form.
    pub(super) fn global_average_channels_last(
        &self,
        dtype: DType,
        (x, sx): (View<'_>, &Strided),
        (y, sy): (View<'_>, &Strided),
    ) -> Option<Result<()>> {
        let c = dense_channels_last(sx)?;
        let [n, _, h, w] = sx.dims;
        if sy.dims != [n, c, 1, 1] || (n > 1 && sy.strides[0] != c) || sy.strides[1] != 1 {
            return None;
        }
        let v = vector(dtype);
        if !vectors_fit(&[x, y], c, v, sx.len()) {
            return None;
        }
        // a block: up to 128 channel vectors (fewer where that gives the blocks a whole image
        // a block needs), and as many lanes over the pixels as 1,024 threads allow; where that
        // still gives few blocks (small batches), blocks of 256 threads and each image's pixels
        // split over several
        let vb = vectors_a_block(n, c / v);
        let chunks = (c / v).div_ceil(vb);
        let groups = n * chunks;
        let (lanes, splits) = split_average(groups, vb, h * w);
        let mut dims = [0i64; 32];
        put(&mut dims, 0, &[n, h * w, c, vb, splits]);
        let bytes = dims_bytes(&dims);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Ptr(self.gap_partial.view()),
            Arg::Ptr(self.gap_counts.view()),
            Arg::Struct("Dims", &bytes),
        ];
        let blocks = (groups * splits).clamp(1, 65_535) as u32;
        let launch = Launch::new((blocks, 1, 1), ((lanes * vb) as u32, 1, 1));
        let name = format!("gap_cl_{}", tag(dtype));
        Some(
            self.channels_last
                .launch(&name, &self.stream, launch.starting_early(), &args),
        )
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// The pointer parameters of a kernel declaration's text (`(...)` after its name).
    fn pointer_parameters(declaration: &str) -> Vec<&str> {
        let open = declaration.find('(').expect("a parameter list");
        let close = declaration.find(')').expect("a parameter list");
        declaration[open + 1..close]
            .split(',')
            .filter(|p| p.contains('*'))
            .filter_map(|p| {
                p.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .rfind(|w| !w.is_empty())
            })
            .collect()
    }

    /// `body` with the bodies of its lambdas (`[&](...) { ... }`) blanked out: what they touch
    /// is checked where they are called.
    fn without_lambdas(body: &str) -> String {
        let mut out = body.to_string();
        let mut from = 0;
        while let Some(at) = out[from..].find("[&](").map(|i| i + from) {
            let open = at + out[at..].find('{').expect("a lambda's body");
            let mut depth = 0;
            let mut close = open;
            for (i, ch) in out[open..].char_indices() {
                depth += match ch {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                if depth == 0 {
                    close = open + i;
                    break;
                }
            }
            out.replace_range(open + 1..close, &" ".repeat(close - open - 1));
            from = close;
        }
        out
    }

    /// Where identifier `name` first occurs in `text` (not as part of a longer identifier nor
    /// as a member, such as `blockIdx.x`).
    fn first_use(text: &str, name: &str) -> Option<usize> {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        text.match_indices(name).map(|(i, _)| i).find(|&i| {
            let before = text[..i]
                .chars()
                .next_back()
                .is_none_or(|c| !word(c) && c != '.');
            let after = text[i + name.len()..]
                .chars()
                .next()
                .is_none_or(|c| !word(c));
            before && after
        })
    }

    #[test]
    fn kernels_started_early_wait_before_they_touch_activations() {
        // every kernel of the engine's modules is launched to start early: each must wait for
        // the kernel ahead before it uses any pointer but its weights (taps, scale, shift)
        let source = format!(
            "{}{SOURCE}{}{}{}{}{}",
            super::super::SOURCE,
            super::super::norm::SOURCE,
            super::super::gemm::SOURCE,
            super::super::gemm::whole::SOURCE,
            super::super::exact::SOURCE,
            super::super::stem::SOURCE
        );
        // weights, and the product tile's shared-memory stages
        let weights = ["w", "gamma", "beta", "xs", "ws"];
        let mut kernels = 0;
        for (start, _) in source.match_indices("__device__ void ") {
            let text = &source[start..];
            let body_at = text.find('{').expect("a body");
            let body = without_lambdas(&text[body_at..text.find("\n}\n").expect("a body's end")]);
            let name = &text["__device__ void ".len()..text.find('(').expect("a name")];
            // a kernel whose loads are lambdas handed to a product tile (which waits before
            // it calls them) waits where it calls it
            let wait = body
                .find("wait_for_previous_grid();")
                .or_else(|| body.find("product_tile<"))
                .or_else(|| body.find("whole_tile<"))
                .unwrap_or_else(|| panic!("{name} never waits"));
            // the product tiles' bias is a constant too (the engine passes the program's)
            let tile = name.ends_with("_tile");
            let mut checked = pointer_parameters(&text[..body_at]);
            if text[..body_at].contains("LoadX& load_x") {
                // the product tile's loader of the activations, a parameter
                checked.push("load_x");
            }
            for p in checked {
                if weights.contains(&p) || (tile && p == "bias") {
                    continue;
                }
                let used = first_use(&body, p).unwrap_or(usize::MAX);
                assert!(wait < used, "{name} uses {p} before it waits");
            }
            kernels += 1;
        }
        assert_eq!(kernels, 24, "every kernel template checked");
    }

    #[test]
    fn small_batches_split_an_average_over_blocks_within_the_scratch() {
        // EfficientNet's first average at batch 1: 32 channels of 112x112 in f16 (4 vectors)
        let (lanes, splits) = split_average(1, 4, 112 * 112);
        assert_eq!((lanes, splits), (64, 32));
        // enough groups: one block each, as before
        assert_eq!(split_average(256, 4, 3136), (256, 1));
        // few pixels: no split below 4 a lane
        assert_eq!(split_average(1, 128, 7), (7, 1));
        // its average of 144 channels over 56x56 (18 vectors)
        assert_eq!(split_average(1, 18, 56 * 56), (14, 32));
        // at batch 32: towards 1,024 blocks (32 channels at 112x112; 96 at 56x56, 3 groups an
        // image of 4 vectors)
        assert_eq!(split_average(32, 4, 112 * 112), (64, 32));
        assert_eq!(split_average(96, 4, 56 * 56), (64, 11));
        for groups in 1..200 {
            for vb in [1, 2, 4, 12, 60, 128] {
                for hw in [1, 7, 49, 196, 3136, 12544] {
                    let (lanes, splits) = split_average(groups, vb, hw);
                    assert!(lanes * vb <= 1024 && (1..=32).contains(&splits));
                    assert!(splits == 1 || groups * splits * vb * 8 <= GAP_PARTIAL_FLOATS);
                    assert!(splits == 1 || groups <= GAP_COUNTS);
                }
            }
        }
    }

    #[test]
    fn a_global_average_gives_blocks_enough_before_splitting_pixels() {
        // batch 32 of 960 channels (120 f16 vectors): 4 blocks an image, whole images
        assert_eq!(vectors_a_block(32, 120), 30);
        assert_eq!(split_average(32 * 4, 30, 49).1, 1);
        // many images keep 128 vectors; few channels keep them all (at least 4 a block)
        assert_eq!(vectors_a_block(256, 120), 120);
        assert_eq!(vectors_a_block(32, 4), 4);
        assert_eq!(vectors_a_block(32, 2), 2);
        assert_eq!(vectors_a_block(1, 240), 4);
        for n in [1, 2, 8, 32, 64, 128, 256] {
            for cv in 1..300 {
                let vb = vectors_a_block(n, cv);
                assert!((1..=128).contains(&vb) && vb <= cv.max(1));
                // halved only while blocks are too few, never below 4 (or all there are)
                assert!(vb >= 4.min(cv));
                assert!(vb == cv.min(128) || n * cv.div_ceil(vb * 2) < GAP_BLOCKS / 2);
            }
        }
    }

    #[test]
    fn the_kernels_take_what_the_launcher_passes() {
        let expected = [
            ("depthwise_vec_", "p p p p p s i f f"),
            ("depthwise_one_", "p p p p p s i f f"),
            ("depthwise_rows3x2_", "p p p p p s i f f"),
            ("depthwise_rows3x4_", "p p p p p s i f f"),
            ("depthwise_rows5x2_", "p p p p p s i f f"),
            ("depthwise_rows5x4_", "p p p p p s i f f"),
            ("depthwise_rows7x2_", "p p p p p s i f f"),
            ("depthwise_rows7x4_", "p p p p p s i f f"),
            ("depthwise_rows3x2s2_", "p p p p p s i f f"),
            ("depthwise_rows3x4s2_", "p p p p p s i f f"),
            ("depthwise_rows5x2s2_", "p p p p p s i f f"),
            ("depthwise_vec3s1_", "p p p p p s i f f"),
            ("depthwise_vec3s2_", "p p p p p s i f f"),
            ("depthwise_vec5s1_", "p p p p p s i f f"),
            ("depthwise_vec5s2_", "p p p p p s i f f"),
            ("depthwise_tile3_", "p p p p p s i f f"),
            ("depthwise_tile5_", "p p p p p s i f f"),
            ("depthwise_tile7_", "p p p p p s i f f"),
            ("pool_cl_", "p p s"),
            ("gap_cl_", "p p p p s"),
        ];
        let differences = kernel_source().signature_differences(&expected, &super::super::TAGS);
        assert!(differences.is_empty(), "{differences:#?}");
    }
}
