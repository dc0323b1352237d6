//! The tensor kernels' device code (CUDA C, compiled by NVRTC) and the stems of the kernels it
//! defines, each instantiated for f64, f32, f16 and bf16 (`<stem>_<tag>`). The launchers are in
//! the parent module; `Dims` here must match the bytes its twin there writes (`Dims::bytes`).

pub(super) const SOURCE: &str = r#"
#define MAX_RANK 6
struct Dims {
    int rank;
    long long shape[MAX_RANK];
    long long sa[MAX_RANK];
    long long sb[MAX_RANK];
    long long sy[MAX_RANK];
};

__device__ __forceinline__ double to_d(double x) { return x; }
__device__ __forceinline__ double to_d(float x) { return (double)x; }
__device__ __forceinline__ double to_d(H x) { return (double)to_f(x); }
__device__ __forceinline__ double to_d(B x) { return (double)to_f(x); }

// f64 -> f32 rounded to odd: toward zero, and the last bit set when that was inexact. Rounding
// that once more to f16/bf16 (13 and 16 bits fewer) gives the correctly rounded result.
__device__ __forceinline__ float to_odd(double d) {
    float f;
    asm("cvt.rz.f32.f64 %0, %1;" : "=f"(f) : "d"(d));
    if ((double)f != d && f == f) f = __uint_as_float(__float_as_uint(f) | 1u);
    return f;
}
template <class T> __device__ __forceinline__ T from_d(double d);
template <> __device__ __forceinline__ double from_d<double>(double d) { return d; }
template <> __device__ __forceinline__ float from_d<float>(double d) { return (float)d; }
template <> __device__ __forceinline__ H from_d<H>(double d) {
    return d != d ? from_f<H>(__int_as_float(0x7fc00000)) : from_f<H>(to_odd(d));
}
template <> __device__ __forceinline__ B from_d<B>(double d) {
    return d != d ? from_f<B>(__int_as_float(0x7fc00000)) : from_f<B>(to_odd(d));
}

template <class T> struct Wide { typedef float type; };
template <> struct Wide<double> { typedef double type; };

// Element offsets of logical index `i` in operands a, b and y. Rank 0 means every operand is
// contiguous (the host collapses such shapes): the index is the offset. Below 2^31 elements
// the index arithmetic is 32-bit (a 64-bit division costs several times more).
__device__ __forceinline__ void offsets(const Dims& d, long long i,
                                        long long* oa, long long* ob, long long* oy) {
    if (d.rank == 0) { *oa = i; *ob = i; *oy = i; return; }
    if (d.shape[0] * d.sa[0] < 2147483647LL && i < 2147483647LL) {
        unsigned j = (unsigned)i;
        long long a = 0, b = 0, y = 0;
        for (int k = d.rank - 1; k >= 0; --k) {
            unsigned s = (unsigned)d.shape[k];
            unsigned q = j / s, r = j - q * s;
            j = q;
            a += r * d.sa[k];
            b += r * d.sb[k];
            y += r * d.sy[k];
        }
        *oa = a; *ob = b; *oy = y;
        return;
    }
    long long a = 0, b = 0, y = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
        long long s = d.shape[k];
        long long j = i % s;
        i /= s;
        a += j * d.sa[k];
        b += j * d.sb[k];
        y += j * d.sy[k];
    }
    *oa = a; *ob = b; *oy = y;
}

// y = a (op) b elementwise, any strides; op 0 = add, 1 = mul.
template <class T>
__device__ void binary(const T* a, const T* b, T* y, Dims d, long long n, int op) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long oa, ob, oy;
        offsets(d, i, &oa, &ob, &oy);
        double x = to_d(a[oa]), z = to_d(b[ob]);
        y[oy] = from_d<T>(op == 0 ? x + z : x * z);
    }
}

// The contiguous, 16-byte-aligned case of binary: 16 bytes a thread per load and store. The
// arithmetic is the storage type's own (f32 for f16/bf16): one add or product rounded from f32
// to f16/bf16, or from f64 to f32, equals the correctly rounded result (the wider format has
// at least 2p + 2 bits), so this path gives the same bits as the f64 one.
__device__ __forceinline__ double to_w(double x) { return x; }
__device__ __forceinline__ float to_w(float x) { return x; }
__device__ __forceinline__ float to_w(H x) { return to_f(x); }
__device__ __forceinline__ float to_w(B x) { return to_f(x); }
template <class T> __device__ __forceinline__ T from_w(typename Wide<T>::type w) {
    return w != w ? from_f<T>(__int_as_float(0x7fc00000)) : from_f<T>(w);
}
template <> __device__ __forceinline__ double from_w<double>(double w) { return w; }
template <> __device__ __forceinline__ float from_w<float>(float w) { return w; }

template <class T>
__device__ void binary_vec(const T* a, const T* b, T* y, long long n, int op) {
    typedef typename Wide<T>::type W;
    const int V = 16 / sizeof(T);
    long long nv = n / V, step = (long long)gridDim.x * blockDim.x;
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long v = t; v < nv; v += step) {
        uint4 ra = ((const uint4*)a)[v], rb = ((const uint4*)b)[v], ry;
        const T* xa = (const T*)&ra;
        const T* xb = (const T*)&rb;
        T* xy = (T*)&ry;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            W x = to_w(xa[k]), z = to_w(xb[k]);
            xy[k] = from_w<T>(op == 0 ? x + z : x * z);
        }
        ((uint4*)y)[v] = ry;
    }
    for (long long i = nv * V + t; i < n; i += step) {
        W x = to_w(a[i]), z = to_w(b[i]);
        y[i] = from_w<T>(op == 0 ? x + z : x * z);
    }
}

// The contiguous, aligned case of scalar: vector loads, the arithmetic in f64 as the strided
// kernel (the scalar is an f64, so the storage type's arithmetic would round it first).
template <class T>
__device__ void scalar_vec(const T* a, T* y, long long n, int op, double s) {
    const int V = 16 / sizeof(T);
    long long nv = n / V, step = (long long)gridDim.x * blockDim.x;
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long v = t; v < nv; v += step) {
        uint4 ra = ((const uint4*)a)[v], ry;
        const T* xa = (const T*)&ra;
        T* xy = (T*)&ry;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            double x = to_d(xa[k]);
            xy[k] = from_d<T>(op == 0 ? x + s : x * s);
        }
        ((uint4*)y)[v] = ry;
    }
    for (long long i = nv * V + t; i < n; i += step) {
        double x = to_d(a[i]);
        y[i] = from_d<T>(op == 0 ? x + s : x * s);
    }
}

// y = a (op) s elementwise with a scalar; op 0 = add, 1 = mul.
template <class T>
__device__ void scalar(const T* a, T* y, Dims d, long long n, int op, double s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long oa, ob, oy;
        offsets(d, i, &oa, &ob, &oy);
        double x = to_d(a[oa]);
        y[oy] = from_d<T>(op == 0 ? x + s : x * s);
    }
}

// y = a, any strides (the gather behind contiguous()).
template <class T>
__device__ void copy(const T* a, T* y, Dims d, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long oa, ob, oy;
        offsets(d, i, &oa, &ob, &oy);
        y[oy] = a[oa];
    }
}

// y[b][r][c] = x[b][c][r] for `batch` matrices, x of rows x cols... read as the transposed view:
// element (r, c) of item b is at x[b * xs + c * rows + r]; y is contiguous [batch, rows, cols].
// 32x32 tiles through shared memory: both the reads and the writes coalesce.
template <class T>
__device__ void transpose(const T* x, T* y, long long batch, int rows, int cols, long long xs) {
    __shared__ T tile[32][33];
    long long b = blockIdx.z;
    int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    const T* xb = x + b * xs;
    T* yb = y + b * (long long)rows * cols;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        int c = c0 + k, r = r0 + threadIdx.x;
        if (c < cols && r < rows) tile[k][threadIdx.x] = xb[(long long)c * rows + r];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        int r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols) yb[(long long)r * cols + c] = tile[threadIdx.x][k];
    }
}

// Random values: Philox-4x32-10 of (index, seed), uniform in [-1, 1) or standard normal
// (Box-Muller), f64 from 53 random bits.
__device__ __forceinline__ void philox(unsigned c[4], unsigned k0, unsigned k1) {
    for (int r = 0; r < 10; ++r) {
        unsigned long long p0 = (unsigned long long)0xD2511F53u * c[0];
        unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c[2];
        unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0;
        unsigned n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0; c[1] = (unsigned)p1; c[2] = n2; c[3] = (unsigned)p0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
}
__device__ __forceinline__ double unit(unsigned hi, unsigned lo) {
    // (0, 1]: 53 bits, never 0 (the logarithm below needs that)
    unsigned long long m = ((unsigned long long)hi << 21) ^ (lo >> 11);
    return ((double)(m & ((1ull << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
}

// Each thread draws group p: one Philox call gives 4 words, turned into two values (f64: 53
// bits a uniform) or four (below f64: 24 bits a uniform, float arithmetic). Normals by
// Box-Muller, each pair of uniforms giving two (cos and sin branches).
__device__ __forceinline__ void box_muller(float u1, float u2, int normal, float* v0, float* v1) {
    if (normal) {
        float r = sqrtf(-2.0f * logf(u1));
        float sn, cs;
        sincospif(2.0f * u2, &sn, &cs);
        *v0 = r * cs; *v1 = r * sn;
    } else {
        *v0 = 2.0f * u1 - 1.0f; *v1 = 2.0f * u2 - 1.0f;
        if (*v0 >= 1.0f) *v0 = -1.0f;
        if (*v1 >= 1.0f) *v1 = -1.0f;
    }
}
template <class T>
__device__ void fill(T* y, long long n, unsigned long long seed, int normal) {
    const int G = sizeof(T) == 8 ? 2 : 4;
    long long groups = (n + G - 1) / G;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < groups;
         p += (long long)gridDim.x * blockDim.x) {
        unsigned c[4] = {(unsigned)p, (unsigned)(p >> 32), 0x5eedu, 0u};
        philox(c, (unsigned)seed, (unsigned)(seed >> 32));
        double v[4];
        if (G == 2) {
            double u1 = unit(c[0], c[1]), u2 = unit(c[2], c[3]);
            if (normal) {
                double r = sqrt(-2.0 * log(u1));
                double sn, cs;
                sincospi(2.0 * u2, &sn, &cs);
                v[0] = r * cs; v[1] = r * sn;
            } else {
                v[0] = 2.0 * u1 - 1.0; v[1] = 2.0 * u2 - 1.0;
                if (v[0] >= 1.0) v[0] = -1.0;
                if (v[1] >= 1.0) v[1] = -1.0;
            }
        } else {
            // (0, 1] from 24 random bits each
            float u[4], w[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) u[k] = ((float)(c[k] >> 8) + 1.0f) * (1.0f / 16777216.0f);
            box_muller(u[0], u[1], normal, &w[0], &w[1]);
            box_muller(u[2], u[3], normal, &w[2], &w[3]);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = (double)w[k];
        }
        long long i = G * p;
#pragma unroll
        for (int k = 0; k < G; ++k)
            if (i + k < n) y[i + k] = from_d<T>(v[k]);
    }
}

// Sums along one axis. `d` describes the outputs: rank, shape, input strides (sa) of the kept
// dimensions. The reduced axis has `len` elements `rs` apart. Split `s` of `splits` sums
// elements [s * chunk, min((s + 1) * chunk, len)); with one split it writes y (T), else
// partials (f64, [splits][outputs]) that sum_partials adds up.
__device__ __forceinline__ long long out_base(const Dims& d, long long o) {
    if (d.rank == 0) return o;  // kept dimensions row-major: the output index is the offset
    long long a = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
        long long s = d.shape[k];
        a += (o % s) * d.sa[k];
        o /= s;
    }
    return a;
}

// One block per (output, split), its threads along the reduced axis: for rs == 1, coalesced.
template <class T>
__device__ void sum_rows(const T* x, T* y, double* part, Dims d, long long outputs,
                         long long len, long long rs, long long chunk) {
    __shared__ double warp_sums[32];
    long long o = blockIdx.x;
    int s = blockIdx.y;
    long long base = out_base(d, o);
    long long lo = s * chunk, hi = min(len, lo + chunk);
    double acc = 0.0;
    for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) acc += to_d(x[base + j * rs]);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        int warps = (blockDim.x + 31) >> 5;
        acc = lane < warps ? warp_sums[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
        if (lane == 0) {
            if (gridDim.y == 1) y[o] = from_d<T>(acc);
            else part[(long long)s * outputs + o] = acc;
        }
    }
}

// One thread per (output, split), looping along the reduced axis: coalesced when neighbouring
// outputs are neighbours in memory.
template <class T>
__device__ void sum_cols(const T* x, T* y, double* part, Dims d, long long outputs,
                         long long len, long long rs, long long chunk) {
    long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (o >= outputs) return;
    int s = blockIdx.y;
    long long base = out_base(d, o);
    long long lo = s * chunk, hi = min(len, lo + chunk);
    double acc = 0.0;
    for (long long j = lo; j < hi; ++j) acc += to_d(x[base + j * rs]);
    if (gridDim.y == 1) y[o] = from_d<T>(acc);
    else part[(long long)s * outputs + o] = acc;
}

template <class T>
__device__ void sum_partials(const double* part, T* y, long long outputs, int splits) {
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < outputs;
         o += (long long)gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int s = 0; s < splits; ++s) acc += part[(long long)s * outputs + o];
        y[o] = from_d<T>(acc);
    }
}

#define ALL(T, tag) \
extern "C" __global__ void binary_##tag(const T* a, const T* b, T* y, Dims d, long long n, int op) \
    { binary<T>(a, b, y, d, n, op); } \
extern "C" __global__ void scalar_##tag(const T* a, T* y, Dims d, long long n, int op, double s) \
    { scalar<T>(a, y, d, n, op, s); } \
extern "C" __global__ void binary_vec_##tag(const T* a, const T* b, T* y, long long n, int op) \
    { binary_vec<T>(a, b, y, n, op); } \
extern "C" __global__ void scalar_vec_##tag(const T* a, T* y, long long n, int op, double s) \
    { scalar_vec<T>(a, y, n, op, s); } \
extern "C" __global__ void copy_##tag(const T* a, T* y, Dims d, long long n) \
    { copy<T>(a, y, d, n); } \
extern "C" __global__ void transpose_##tag(const T* x, T* y, long long batch, int rows, int cols, long long xs) \
    { transpose<T>(x, y, batch, rows, cols, xs); } \
extern "C" __global__ void fill_##tag(T* y, long long n, unsigned long long seed, int normal) \
    { fill<T>(y, n, seed, normal); } \
extern "C" __global__ void sum_rows_##tag(const T* x, T* y, double* part, Dims d, long long outputs, long long len, long long rs, long long chunk) \
    { sum_rows<T>(x, y, part, d, outputs, len, rs, chunk); } \
extern "C" __global__ void sum_cols_##tag(const T* x, T* y, double* part, Dims d, long long outputs, long long len, long long rs, long long chunk) \
    { sum_cols<T>(x, y, part, d, outputs, len, rs, chunk); } \
extern "C" __global__ void sum_partials_##tag(const double* part, T* y, long long outputs, int splits) \
    { sum_partials<T>(part, y, outputs, splits); }

"#;

/// The instances, one part each (compiled apart: see `gpukit_cuda::kernel::PART`).
pub(super) const PARTS: [&str; 4] = [
    "ALL(double, f64)",
    "ALL(float, f32)",
    "ALL(H, f16)",
    "ALL(B, bf16)",
];

pub(super) const STEMS: [&str; 10] = [
    "binary",
    "binary_vec",
    "scalar",
    "scalar_vec",
    "copy",
    "transpose",
    "fill",
    "sum_rows",
    "sum_cols",
    "sum_partials",
];
