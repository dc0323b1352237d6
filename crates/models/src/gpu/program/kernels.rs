//! The general engine's own kernels: one strided element-wise kernel (up to two operands and an
//! activation: activations, broadcasting arithmetic, batch norm as a per-channel affine map,
//! convolution epilogues, copies that change a layout or fill a slice of a concatenation),
//! pooling with any window, global average pooling, layer normalization over contiguous rows,
//! and the conversions from and to f32. CUDA C compiled by NVRTC for the device, cached on disk.
//!
//! Every tensor argument is a rank-4 strided view ([`Strided`]: lower ranks are padded with
//! leading size-1 axes), so one kernel serves NCHW, NHWC, transposed and broadcast operands.
//! Each launcher checks the extent of every view it indexes before launching.

use super::Strided;
use crate::graph::{Activation, Binary};
use gpukit_cuda::kernel::{grid_for, tag, Arg, KernelModule, KernelSource, Launch, HALF};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu, Result, Stream, View};
use gpukit_types::DType;

pub(super) mod channels_last;
/// The channel-last kernels' module (depthwise, pooling, global average).
pub use channels_last::kernel_source as channels_last_source;
pub(super) mod depthwise;
pub mod exact;
pub mod fp8_conv;
pub mod gemm;
pub(super) mod norm;
pub mod stem;
/// Every depthwise kernel by name, for `ProgramKernels::depthwise_variant`.
pub use depthwise::variants as depthwise_variants;
/// Every layer-norm kernel by name, for `ProgramKernels::layer_norm_variant`.
pub use norm::VARIANTS as LAYER_NORM_VARIANTS;
mod geometry;

pub use geometry::Window;
use geometry::{activation_code, binary_code, dims_bytes, memory_order, put, put_divisors};

/// What every module of the engine's kernels starts with (after the half types): the launch
/// geometry struct and the activations.
const PRELUDE: &str = r#"
// The geometry of a launch: what each kernel reads from it is documented at the kernel.
struct Dims { long long v[32]; };

// V consecutive elements, loaded and stored as one access.
template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

// Sigmoid and SiLU divide by the approximate reciprocal (`__fdividef`, within 2 ulp) and
// HardSwish multiplies by 1/6 (ONNX's alpha): IEEE division is a subroutine of some twenty
// instructions, and EfficientNet-B0's depthwise convolutions with a bias and SiLU timed
// 1.3-1.7x the same shapes with a bias alone at batch 32.
__device__ __forceinline__ float activate(int act, float x, float alpha, float beta) {
    switch (act) {
        case 1: return x > 0.0f ? x : 0.0f;
        case 2: return __fdividef(1.0f, 1.0f + expf(-x));
        case 3: return fminf(fmaxf(alpha * x + beta, 0.0f), 1.0f);
        case 4: return x * fminf(fmaxf(x * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
        case 5: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        case 6: return __fdividef(x, 1.0f + expf(-x));
        default: return x;
    }
}


// Early start (programmatic dependent launch, compute capability 9.0 and later; nothing
// elsewhere): a kernel the host launches to start early calls wait_for_previous_grid() before
// it reads what an earlier kernel wrote and before it writes anything (what it does before may
// only read weights), and may call let_next_grid_start() to let the kernel after it be
// scheduled (that kernel still waits for this one to end before it touches memory).
__device__ __forceinline__ void wait_for_previous_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_next_grid_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The sum of `s` over a warp, in lane 0.
__device__ __forceinline__ float warp_sum(float s) {
    for (int k = 16; k > 0; k >>= 1) s += __shfl_down_sync(0xffffffffu, s, k);
    return s;
}
"#;

const SOURCE: &str = r#"
// n / d by a multiply (n < 2^31): `magic` packs m (low 32 bits) and the shift (high bits), as
// `fast_divisor` computes them on the host.
__device__ __forceinline__ long long fdiv(long long n, long long magic) {
    unsigned m = (unsigned)(magic & 0xffffffffll), s = (unsigned)(magic >> 32);
    return (long long)((__umulhi((unsigned)n, m) + (unsigned)n) >> s);
}

__device__ __forceinline__ unsigned fdiv32(unsigned n, long long magic) {
    unsigned m = (unsigned)(magic & 0xffffffffll), s = (unsigned)(magic >> 32);
    return (__umulhi(n, m) + n) >> s;
}

// An offset in 32 bits, for views whose every offset fits 31 bits.
__device__ __forceinline__ unsigned at4u(const long long* s, unsigned i0, unsigned i1,
                                         unsigned i2, unsigned i3) {
    return i0 * (unsigned)s[0] + i1 * (unsigned)s[1] + i2 * (unsigned)s[2] + i3 * (unsigned)s[3];
}

__device__ __forceinline__ long long at4(const long long* s, long long i0, long long i1,
                                         long long i2, long long i3) {
    return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3];
}

// y = act(op(a, b) + c), element by element over the dims v[0..4]; strides of a, b, c and y in
// v[4..8], v[8..12], v[12..16], v[16..20]; v[20] != 0: all four share one dense layout, so the
// element index is the offset; v[24..28]: fast division (see fdiv). b and c may be null. y may
// be a (in place).
// op: 0 none, 1 add, 2 sub, 3 mul, 4 div.
template <class T>
__device__ void pointwise(const T* a, const T* b, const T* c, T* y, Dims g, int op, int act,
                          float alpha, float beta) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    long long total = d[0] * d[1] * d[2] * d[3];
    bool flat = d[20] != 0;
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < total;
         o += (long long)gridDim.x * blockDim.x) {
        long long ia = o, ib = o, ic = o, iy = o;
        if (!flat && d[27]) {
            // v[24..27]: the divisors' magic numbers; v[27] != 0: every index and offset fits
            // 31 bits, so the arithmetic is 32-bit
            unsigned u = (unsigned)o;
            unsigned r3 = fdiv32(u, d[24]), i3 = u - r3 * (unsigned)d[3];
            unsigned r2 = fdiv32(r3, d[25]), i2 = r3 - r2 * (unsigned)d[2];
            unsigned i0 = fdiv32(r2, d[26]), i1 = r2 - i0 * (unsigned)d[1];
            ia = at4u(d + 4, i0, i1, i2, i3);
            ib = at4u(d + 8, i0, i1, i2, i3);
            ic = at4u(d + 12, i0, i1, i2, i3);
            iy = at4u(d + 16, i0, i1, i2, i3);
        } else if (!flat) {
            long long r3 = o / d[3], i3 = o - r3 * d[3];
            long long r2 = r3 / d[2], i2 = r3 - r2 * d[2];
            long long i0 = r2 / d[1], i1 = r2 - i0 * d[1];
            ia = at4(d + 4, i0, i1, i2, i3);
            ib = at4(d + 8, i0, i1, i2, i3);
            ic = at4(d + 12, i0, i1, i2, i3);
            iy = at4(d + 16, i0, i1, i2, i3);
        }
        float v = to_f(a[ia]);
        if (b) {
            float u = to_f(b[ib]);
            if (op == 1) v += u;
            else if (op == 2) v -= u;
            else if (op == 3) v *= u;
            else if (op == 4) v /= u;
        }
        if (c) v += to_f(c[ic]);
        y[iy] = from_f<T>(activate(act, v, alpha, beta));
    }
}

// pointwise, V elements of y's last axis a thread: the same Dims, with the dims and strides in
// memory order (y's last axis contiguous, v[3] a multiple of V; every operand's last stride 1,
// or 0 for one value broadcast over the vector; every other stride a multiple of V, every
// pointer 16-byte aligned, every offset within 31 bits); v[24..27]: the magic numbers of
// v[3] / V, v[2], v[1].
template <class T, int V>
__device__ void pointwise_vec(const T* a, const T* b, const T* c, T* y, Dims g, int op, int act,
                              float alpha, float beta) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    const unsigned d3 = (unsigned)d[3] / V;
    const unsigned total = (unsigned)(d[0] * d[1] * d[2]) * d3;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        unsigned r3 = fdiv32(o, d[24]), i3 = (o - r3 * d3) * V;
        unsigned r2 = fdiv32(r3, d[25]), i2 = r3 - r2 * (unsigned)d[2];
        unsigned i0 = fdiv32(r2, d[26]), i1 = r2 - i0 * (unsigned)d[1];
        float v[V], u[V], w[V];
        Pack<T, V> pa = *(const Pack<T, V>*)(a + at4u(d + 4, i0, i1, i2, i3));
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = to_f(pa.v[k]);
        if (b) {
            const T* pb = b + at4u(d + 8, i0, i1, i2, i3);
            if (d[11]) {
                Pack<T, V> q = *(const Pack<T, V>*)pb;
#pragma unroll
                for (int k = 0; k < V; ++k) u[k] = to_f(q.v[k]);
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) u[k] = to_f(pb[0]);
            }
#pragma unroll
            for (int k = 0; k < V; ++k) {
                if (op == 1) v[k] += u[k];
                else if (op == 2) v[k] -= u[k];
                else if (op == 3) v[k] *= u[k];
                else if (op == 4) v[k] /= u[k];
            }
        }
        if (c) {
            const T* pc = c + at4u(d + 12, i0, i1, i2, i3);
            if (d[15]) {
                Pack<T, V> q = *(const Pack<T, V>*)pc;
#pragma unroll
                for (int k = 0; k < V; ++k) w[k] = to_f(q.v[k]);
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) w[k] = to_f(pc[0]);
            }
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] += w[k];
        }
        Pack<T, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = from_f<T>(activate(act, v[k], alpha, beta));
        *(Pack<T, V>*)(y + at4u(d + 16, i0, i1, i2, i3)) = out;
    }
}

// Max (v[22] = 1) or average pooling. Output dims n, c, p, q in v[0..4]; strides of x and y in
// v[4..8] and v[8..12]; input h, w in v[12], v[13]; window kh, kw v[14], v[15]; steps v[16],
// v[17]; padding top, left, bottom, right v[18..22]; v[23] != 0: an average divides by the
// window clipped to the padded input, else by its taps inside the input; v[24] != 0: outputs
// are visited channel fastest (NHWC), else width fastest.
template <class T>
__device__ void pool(const T* __restrict__ x, T* __restrict__ y, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    long long n = d[0], c = d[1], p = d[2], q = d[3], h = d[12], w = d[13];
    long long total = n * c * p * q;
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < total;
         o += (long long)gridDim.x * blockDim.x) {
        long long img, ch, i, j, r, r2;
        // v[25..28]: the magic numbers of the three divisors in visiting order, v[28] != 0 when
        // the indices fit 31 bits
        if (d[24]) {
            r = d[28] ? fdiv(o, d[25]) : o / c; ch = o - r * c;
            r2 = d[28] ? fdiv(r, d[26]) : r / q; j = r - r2 * q;
            img = d[28] ? fdiv(r2, d[27]) : r2 / p; i = r2 - img * p;
        } else {
            r = d[28] ? fdiv(o, d[25]) : o / q; j = o - r * q;
            r2 = d[28] ? fdiv(r, d[26]) : r / p; i = r - r2 * p;
            img = d[28] ? fdiv(r2, d[27]) : r2 / c; ch = r2 - img * c;
        }
        long long h0 = i * d[16] - d[18], w0 = j * d[17] - d[19];
        bool is_max = d[22] != 0;
        float m = is_max ? -__int_as_float(0x7f800000) : 0.0f;
        long long taps = 0;
        for (long long di = 0; di < d[14]; ++di) {
            long long yy = h0 + di;
            if (yy < 0 || yy >= h) continue;
            for (long long dj = 0; dj < d[15]; ++dj) {
                long long xx = w0 + dj;
                if (xx < 0 || xx >= w) continue;
                long long at = d[28] ? (long long)at4u(d + 4, img, ch, yy, xx)
                                     : at4(d + 4, img, ch, yy, xx);
                float v = to_f(x[at]);
                m = is_max ? fmaxf(m, v) : m + v;
                ++taps;
            }
        }
        if (!is_max) {
            long long div = taps;
            if (d[23]) {
                long long he = min(h0 + d[14], h + d[20]), we = min(w0 + d[15], w + d[21]);
                div = (he - h0) * (we - w0);
            }
            m = div > 0 ? m / (float)div : 0.0f;
        }
        y[d[28] ? (long long)at4u(d + 8, img, ch, i, j) : at4(d + 8, img, ch, i, j)] = from_f<T>(m);
    }
}


// Global average pooling, a warp per output (for inputs whose spatial axes are contiguous).
// x dims n, c, h, w in v[0..4], strides v[4..8]; y strides v[8..12].
template <class T>
__device__ void gap_warps(const T* __restrict__ x, T* __restrict__ y, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    long long n = d[0], c = d[1], h = d[2], w = d[3], hw = h * w;
    int lane = threadIdx.x & 31;
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long o = warp; o < n * c; o += warps) {
        long long ch = o % c, img = o / c;
        float s = 0.0f;
        for (long long p = lane; p < hw; p += 32) s += to_f(x[at4(d + 4, img, ch, p / w, p % w)]);
        s = warp_sum(s);
        if (lane == 0) y[at4(d + 8, img, ch, 0, 0)] = from_f<T>(s / (float)hw);
    }
}

// Global average pooling for channel-contiguous inputs: a block of 32 x 8 threads per image and
// 32 channels, each lane one channel, each warp a share of the pixels. Same Dims as gap_warps.
template <class T>
__device__ void gap_channels(const T* __restrict__ x, T* __restrict__ y, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    long long n = d[0], c = d[1], h = d[2], w = d[3], hw = h * w;
    long long chunks = (c + 31) / 32;
    __shared__ float part[8][33];
    for (long long b = blockIdx.x; b < n * chunks; b += gridDim.x) {
        long long img = b / chunks, ch = (b % chunks) * 32 + threadIdx.x;
        float s = 0.0f;
        if (ch < c)
            for (long long p = threadIdx.y; p < hw; p += blockDim.y)
                s += to_f(x[at4(d + 4, img, ch, p / w, p % w)]);
        part[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && ch < c) {
            float t = 0.0f;
            for (int k = 0; k < blockDim.y; ++k) t += part[k][threadIdx.x];
            y[at4(d + 8, img, ch, 0, 0)] = from_f<T>(t / (float)hw);
        }
        __syncthreads();
    }
}

// y [n, k] = act(x [n, c] w [k, c]^T + bias (+ z)), all dense row-major (16-byte aligned rows
// of V values where V > 1): a group of `group` lanes (a power of 2 dividing 32) an output, each
// summing every group-th vector of the row, the group's sums added with shuffles; 32 / group
// outputs a warp. bias and z may be null.
template <class T, int V>
__device__ void matvec(const T* __restrict__ x, const T* __restrict__ w,
                       const T* __restrict__ bias, const T* __restrict__ z, T* __restrict__ y,
                       long long n, int k, int c, int group, int act, float alpha, float beta) {
    let_next_grid_start();
    wait_for_previous_grid();
    const int lane = threadIdx.x & 31, sub = lane % group, per_warp = 32 / group;
    const int vecs = c / V;
    const long long outs = n * k;
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long first = warp * per_warp; first < outs; first += warps * per_warp) {
        const long long o = first + lane / group;
        const bool live = o < outs;
        const long long img = live ? o / k : 0;
        const long long row = live ? o - img * k : 0;
        float acc = 0.0f;
        if (live)
            for (int v = sub; v < vecs; v += group) {
                Pack<T, V> xv = *(const Pack<T, V>*)(x + img * c + v * V);
                Pack<T, V> wv = *(const Pack<T, V>*)(w + row * c + v * V);
#pragma unroll
                for (int u = 0; u < V; ++u) acc += to_f(xv.v[u]) * to_f(wv.v[u]);
            }
        for (int s = group / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if (live && sub == 0) {
            if (bias) acc += to_f(bias[row]);
            if (z) acc += to_f(z[o]);
            y[o] = from_f<T>(activate(act, acc, alpha, beta));
        }
    }
}

// y (f32, dense row-major over dims v[0..4]) = x read through strides v[4..8].
template <class T>
__device__ void to_f32(const T* __restrict__ x, float* __restrict__ y, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    long long total = d[0] * d[1] * d[2] * d[3];
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < total;
         o += (long long)gridDim.x * blockDim.x) {
        long long r3 = d[27] ? fdiv(o, d[24]) : o / d[3], i3 = o - r3 * d[3];
        long long r2 = d[27] ? fdiv(r3, d[25]) : r3 / d[2], i2 = r3 - r2 * d[2];
        long long i0 = d[27] ? fdiv(r2, d[26]) : r2 / d[1], i1 = r2 - i0 * d[1];
        y[o] = to_f(x[at4(d + 4, i0, i1, i2, i3)]);
    }
}

// y (strides v[4..8]) = x (f32, dense row-major over dims v[0..4]).
template <class T>
__device__ void from_f32(const float* __restrict__ x, T* __restrict__ y, Dims g) {
    let_next_grid_start();
    wait_for_previous_grid();
    const long long* d = g.v;
    long long total = d[0] * d[1] * d[2] * d[3];
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < total;
         o += (long long)gridDim.x * blockDim.x) {
        long long r3 = d[27] ? fdiv(o, d[24]) : o / d[3], i3 = o - r3 * d[3];
        long long r2 = d[27] ? fdiv(r3, d[25]) : r3 / d[2], i2 = r3 - r2 * d[2];
        long long i0 = d[27] ? fdiv(r2, d[26]) : r2 / d[1], i1 = r2 - i0 * d[1];
        y[at4(d + 4, i0, i1, i2, i3)] = from_f<T>(x[o]);
    }
}

#define INSTANCES(T, TAG)                                                                     \
extern "C" __global__ void pointwise_##TAG(const T* a, const T* b, const T* c, T* y, Dims g,  \
    int op, int act, float alpha, float beta) { pointwise<T>(a, b, c, y, g, op, act, alpha, beta); } \
extern "C" __global__ void pointwise_vec_##TAG(const T* a, const T* b, const T* c, T* y,        \
    Dims g, int op, int act, float alpha, float beta)                                          \
    { pointwise_vec<T, 16 / sizeof(T)>(a, b, c, y, g, op, act, alpha, beta); }                  \
extern "C" __global__ void pool_##TAG(const T* x, T* y, Dims g) { pool<T>(x, y, g); }          \
extern "C" __global__ void gap_warps_##TAG(const T* x, T* y, Dims g) { gap_warps<T>(x, y, g); } \
extern "C" __global__ void gap_channels_##TAG(const T* x, T* y, Dims g)                       \
    { gap_channels<T>(x, y, g); }                                                             \
LAYER_NORMS(T, TAG)                                                                            \
extern "C" __global__ void matvec_vec_##TAG(const T* x, const T* w, const T* bias, const T* z,  \
    T* y, long long n, int k, int c, int group, int act, float alpha, float beta)              \
    { matvec<T, 16 / sizeof(T)>(x, w, bias, z, y, n, k, c, group, act, alpha, beta); }         \
extern "C" __global__ void matvec_one_##TAG(const T* x, const T* w, const T* bias, const T* z,  \
    T* y, long long n, int k, int c, int group, int act, float alpha, float beta)              \
    { matvec<T, 1>(x, w, bias, z, y, n, k, c, group, act, alpha, beta); }                      \
extern "C" __global__ void to_f32_##TAG(const T* x, float* y, Dims g) { to_f32<T>(x, y, g); }  \
extern "C" __global__ void from_f32_##TAG(const float* x, T* y, Dims g) { from_f32<T>(x, y, g); }

INSTANCES(float, f32)
INSTANCES(H, f16)
INSTANCES(B, bf16)
"#;

/// The kernels' names without their element type tag.
const KERNELS: [&str; 14] = [
    "pointwise",
    "pointwise_vec",
    "pool",
    "gap_warps",
    "gap_channels",
    "layer_norm",
    "layer_norm_vec",
    "layer_norm_vec_late",
    "layer_norm_vec3",
    "layer_norm_vec3_late",
    "matvec_vec",
    "matvec_one",
    "to_f32",
    "from_f32",
];

/// The element types every module of the engine instantiates its kernels for, by tag.
const TAGS: [&str; 3] = ["f32", "f16", "bf16"];

/// Each of `kernels` (names without their tag) for every type of [`TAGS`].
fn tagged(kernels: &[&str]) -> Vec<String> {
    TAGS.iter()
        .flat_map(|t| kernels.iter().map(move |k| format!("{k}_{t}")))
        .collect()
}

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program",
        source: format!("{HALF}{PRELUDE}{}{SOURCE}", norm::SOURCE),
        names: tagged(&KERNELS),
    }
}

/// The compiled kernels on one device.
pub struct ProgramKernels {
    stream: Stream,
    module: KernelModule,
    channels_last: KernelModule,
    /// The channel-last global average's partial sums and counters (zeroed; each launch that
    /// uses a counter sets it back to 0).
    gap_partial: DeviceBuffer,
    gap_counts: DeviceBuffer,
}

impl ProgramKernels {
    /// Compiles the kernels for `gpu` (or reads them from the cache) and loads them.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<ProgramKernels> {
        Ok(ProgramKernels {
            stream: gpu.stream().clone(),
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
            channels_last: channels_last::load(discovery, gpu)?,
            gap_partial: gpu.alloc(channels_last::GAP_PARTIAL_FLOATS * 4)?,
            gap_counts: gpu.alloc(channels_last::GAP_COUNTS * 4)?,
        })
    }

    /// Launches kernel `stem` for `dtype`, started early: every kernel of the module waits for
    /// the kernel ahead before it touches activations (channels_last.rs's test checks each).
    fn run(&self, stem: &str, dtype: DType, launch: Launch, args: &[Arg<'_>]) -> Result<()> {
        let name = format!("{stem}_{}", tag(dtype));
        self.module
            .launch(&name, &self.stream, launch.starting_early(), args)
    }

    /// `y = act(op(a, b) + c)` over `y`'s dims (a, b, c broadcast through their strides).
    #[allow(clippy::too_many_arguments)]
    pub fn pointwise(
        &self,
        dtype: DType,
        (a, sa): (View<'_>, &Strided),
        b: Option<(View<'_>, &Strided, Binary)>,
        c: Option<(View<'_>, &Strided)>,
        act: Option<Activation>,
        (y, sy): (View<'_>, &Strided),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        a.require(sa.span() * e, "pointwise a")?;
        y.require(sy.span() * e, "pointwise y")?;
        // visited in the output's memory order (its largest stride slowest), so that a warp's
        // writes, and the reads of operands laid out alike, are consecutive
        let order = memory_order(sy);
        let (sa, sy) = (&sa.permuted(order), &sy.permuted(order));
        let b = b.map(|(v, s, op)| (v, s.permuted(order), op));
        let c = c.map(|(v, s)| (v, s.permuted(order)));
        let mut spans = vec![sa.span(), sy.span()];
        spans.extend(b.iter().map(|(_, s, _)| s.span()));
        spans.extend(c.iter().map(|(_, s)| s.span()));
        let mut v = [0i64; 32];
        put(&mut v, 0, &sy.dims);
        put(&mut v, 4, &sa.strides);
        put(&mut v, 16, &sy.strides);
        let mut flat = sy.is_dense() && sa.strides == sy.strides && sa.dims == sy.dims;
        let op = match &b {
            Some((view, s, op)) => {
                view.require(s.span() * e, "pointwise b")?;
                put(&mut v, 8, &s.strides);
                flat &= s.strides == sy.strides && s.dims == sy.dims;
                binary_code(*op)
            }
            None => 0,
        };
        if let Some((view, s)) = &c {
            view.require(s.span() * e, "pointwise c")?;
            put(&mut v, 12, &s.strides);
            flat &= s.strides == sy.strides && s.dims == sy.dims;
        }
        v[20] = i64::from(flat);
        let biggest = spans.into_iter().max().unwrap_or(0).max(sy.len());
        // a vector of elements a thread where y's last axis in memory order is contiguous and
        // every operand reads it whole (or one value for it), aligned
        let width = 16 / e;
        let whole = |s: &Strided, view: &View<'_>| {
            s.strides[3] == 1
                && s.strides[..3].iter().all(|x| x % width == 0)
                && view.is_aligned(16)
        };
        let vector = sy.dims[3] % width == 0
            && whole(sy, &y)
            && whole(sa, &a)
            && b.iter()
                .all(|(view, s, _)| s.strides[3] == 0 || whole(s, view))
            && c.iter()
                .all(|(view, s)| s.strides[3] == 0 || whole(s, view))
            && biggest < (1 << 31);
        let (stem, last) = match vector {
            true => ("pointwise_vec", sy.dims[3] / width),
            false => ("pointwise", sy.dims[3]),
        };
        put_divisors(&mut v, 24, [last, sy.dims[2], sy.dims[1]], biggest);
        let bytes = dims_bytes(&v);
        let (code, alpha, beta) = activation_code(act);
        let args = [
            Arg::Ptr(a),
            b.as_ref().map_or(Arg::Null, |(v, _, _)| Arg::Ptr(*v)),
            c.as_ref().map_or(Arg::Null, |(v, _)| Arg::Ptr(*v)),
            Arg::Ptr(y),
            Arg::Struct("Dims", &bytes),
            Arg::I32(op),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(beta),
        ];
        let threads = if vector { sy.len() / width } else { sy.len() };
        self.run(stem, dtype, grid_for(threads), &args)
    }

    /// Max or average pooling of `x` ([n, c, h, w]) into `y` ([n, c, p, q]).
    pub fn pool(
        &self,
        dtype: DType,
        (x, sx): (View<'_>, &Strided),
        (y, sy): (View<'_>, &Strided),
        win: &Window,
    ) -> Result<()> {
        let e = dtype.size_bytes();
        x.require(sx.span() * e, "pool x")?;
        y.require(sy.span() * e, "pool y")?;
        if let Some(done) = self.pool_channels_last(dtype, (x, sx), (y, sy), win) {
            return done;
        }
        let mut v = [0i64; 32];
        put(&mut v, 0, &sy.dims);
        put(&mut v, 4, &sx.strides);
        put(&mut v, 8, &sy.strides);
        put(&mut v, 12, &[sx.dims[2], sx.dims[3]]);
        put(&mut v, 14, &win.kernel);
        put(&mut v, 16, &win.strides);
        put(&mut v, 18, &win.pads);
        v[22] = i64::from(win.max);
        v[23] = i64::from(win.count_include_pad);
        let channels_fastest = sy.strides[1] == 1 && sy.dims[1] > 1;
        v[24] = i64::from(channels_fastest);
        let [_, c, p, q] = sy.dims;
        let order = if channels_fastest {
            [c, q, p]
        } else {
            [q, p, c]
        };
        put_divisors(&mut v, 25, order, sy.len().max(sx.span()).max(sy.span()));
        let bytes = dims_bytes(&v);
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Struct("Dims", &bytes)];
        self.run("pool", dtype, grid_for(sy.len()), &args)
    }

    /// The mean of each image's channel over its pixels: `x` [n, c, h, w] into `y` [n, c, 1, 1].
    pub fn global_average(
        &self,
        dtype: DType,
        (x, sx): (View<'_>, &Strided),
        (y, sy): (View<'_>, &Strided),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        x.require(sx.span() * e, "global average x")?;
        y.require(sy.span() * e, "global average y")?;
        if let Some(done) = self.global_average_channels_last(dtype, (x, sx), (y, sy)) {
            return done;
        }
        let mut v = [0i64; 32];
        put(&mut v, 0, &sx.dims);
        put(&mut v, 4, &sx.strides);
        put(&mut v, 8, &sy.strides);
        let bytes = dims_bytes(&v);
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Struct("Dims", &bytes)];
        let [n, c, ..] = sx.dims;
        if sx.strides[1] == 1 && c > 1 {
            let blocks = (n * c.div_ceil(32)).clamp(1, 65_535) as u32;
            let launch = Launch::new((blocks, 1, 1), (32, 8, 1));
            self.run("gap_channels", dtype, launch, &args)
        } else {
            // a warp per output: 8 outputs a block
            let blocks = (n * c).div_ceil(8).clamp(1, 65_535 * 8) as u32;
            self.run(
                "gap_warps",
                dtype,
                Launch::new((blocks, 1, 1), (256, 1, 1)),
                &args,
            )
        }
    }

    /// `y [n, k] = act(x [n, c] w [k, c]^T + bias (+ z))`, all dense row-major: a group of
    /// lanes an output, sized so that each lane sums about four 16-byte vectors of a row.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec(
        &self,
        dtype: DType,
        x: View<'_>,
        w: View<'_>,
        bias: Option<View<'_>>,
        z: Option<View<'_>>,
        act: Option<Activation>,
        y: View<'_>,
        (n, k, c): (usize, usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        x.require(n * c * e, "matvec x")?;
        w.require(k * c * e, "matvec weights")?;
        y.require(n * k * e, "matvec y")?;
        if let Some(b) = bias {
            b.require(k * e, "matvec bias")?;
        }
        if let Some(z) = z {
            z.require(n * k * e, "matvec z")?;
        }
        let width = 16 / e;
        let vector = c.is_multiple_of(width) && x.is_aligned(16) && w.is_aligned(16);
        let (stem, vectors) = match vector {
            true => ("matvec_vec", c / width),
            false => ("matvec_one", c),
        };
        let group = vectors.div_ceil(4).next_power_of_two().clamp(1, 32);
        let (code, alpha, beta) = activation_code(act);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::opt(bias),
            Arg::opt(z),
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::Size(k),
            Arg::Size(c),
            Arg::I32(group as i32),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(beta),
        ];
        let warps = (n * k).div_ceil(32 / group);
        let blocks = warps.div_ceil(8).clamp(1, 65_535 * 8) as u32;
        self.run(stem, dtype, Launch::new((blocks, 1, 1), (256, 1, 1)), &args)
    }

    /// `y` (f32, dense row-major) = `x` of `dtype` through its strides.
    pub fn to_f32(&self, dtype: DType, (x, sx): (View<'_>, &Strided), y: View<'_>) -> Result<()> {
        x.require(sx.span() * dtype.size_bytes(), "to_f32 x")?;
        y.require(sx.len() * 4, "to_f32 y")?;
        let mut v = [0i64; 32];
        put(&mut v, 0, &sx.dims);
        put(&mut v, 4, &sx.strides);
        put_divisors(&mut v, 24, [sx.dims[3], sx.dims[2], sx.dims[1]], sx.len());
        let bytes = dims_bytes(&v);
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Struct("Dims", &bytes)];
        self.run("to_f32", dtype, grid_for(sx.len()), &args)
    }

    /// `y` of `dtype` through its strides = `x` (f32, dense row-major over `y`'s dims).
    pub fn from_f32(&self, dtype: DType, x: View<'_>, (y, sy): (View<'_>, &Strided)) -> Result<()> {
        x.require(sy.len() * 4, "from_f32 x")?;
        y.require(sy.span() * dtype.size_bytes(), "from_f32 y")?;
        let mut v = [0i64; 32];
        put(&mut v, 0, &sy.dims);
        put(&mut v, 4, &sy.strides);
        put_divisors(&mut v, 24, [sy.dims[3], sy.dims[2], sy.dims[1]], sy.len());
        let bytes = dims_bytes(&v);
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Struct("Dims", &bytes)];
        self.run("from_f32", dtype, grid_for(sy.len()), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::geometry::fast_divisor;
    use super::*;

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        let expected = [
            ("pointwise_", "p p p p s i i f f"),
            ("pointwise_vec_", "p p p p s i i f f"),
            ("pool_", "p p s"),
            ("gap_warps_", "p p s"),
            ("gap_channels_", "p p s"),
            ("layer_norm_", "p p p p l i f"),
            ("layer_norm_vec_", "p p p p l i f i"),
            ("layer_norm_vec_late_", "p p p p l i f i"),
            ("layer_norm_vec3_", "p p p p l i f i"),
            ("layer_norm_vec3_late_", "p p p p l i f i"),
            ("matvec_vec_", "p p p p p l i i i i f f"),
            ("matvec_one_", "p p p p p l i i i i f f"),
            ("to_f32_", "p p s"),
            ("from_f32_", "p p s"),
        ];
        let differences = kernel_source().signature_differences(&expected, &super::TAGS);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    /// `fdiv` as the kernels compute it, on the host.
    fn fdiv(n: u32, magic: i64) -> u32 {
        let (m, s) = (magic as u32, (magic >> 32) as u32);
        let hi = ((u64::from(n) * u64::from(m)) >> 32) as u32;
        (hi + n) >> s
    }

    #[test]
    fn division_by_a_multiply_is_exact_below_two_to_the_31() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut divisors: Vec<usize> = (1..300).collect();
        divisors.extend([3136, 12544, 50176, 1 << 20, (1 << 31) - 1]);
        divisors.extend((0..200).map(|_| (next() % (1 << 31)) as usize + 1));
        for d in divisors {
            let magic = fast_divisor(d);
            let mut ns: Vec<u32> = vec![0, 1, d as u32 - 1, d as u32, (1 << 31) - 1];
            ns.extend((0..500).map(|_| (next() % (1 << 31)) as u32));
            for n in ns {
                assert_eq!(fdiv(n, magic), n / d as u32, "{n} / {d}");
            }
        }
    }
}
