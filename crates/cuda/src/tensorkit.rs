//! The kernels behind the tensor crate's CUDA ops: random fill on the device, strided
//! elementwise arithmetic (out of place and in place), strided copies (with a tiled transpose),
//! reductions along an axis, for f64, f32, f16 and bf16 storage, compiled by NVRTC like the
//! crate's other kernels.
//!
//! Arithmetic is done in f64 and each result rounded once to the storage type, as the CPU
//! reference does: an f32, f16 or bf16 sum or product of two values is exact in f64, so the
//! GPU's results equal the CPU's bit for bit. Sums along an axis accumulate in f64.
//!
//! To use: [`TensorKernels::new`] once per device (the tensor crate keeps one per [`Gpu`]),
//! then the launch methods, which enqueue on the [`Stream`] given and return at once.
//! Operands are described by a [`Strided`]: a view, the element strides and (shared by the
//! operands of one call) the shape.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{Module, HALF};
use crate::loader::Discovery;
use crate::memory::View;
use crate::stream::Stream;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use gpukit_types::DType;

/// The most dimensions a strided operand may have.
pub const MAX_RANK: usize = 6;

const SOURCE: &str = r#"
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

ALL(double, f64)
ALL(float, f32)
ALL(H, f16)
ALL(B, bf16)
"#;

const STEMS: [&str; 10] = [
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

/// Shapes and strides of up to three operands, as the kernels read them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Dims {
    rank: i32,
    shape: [i64; MAX_RANK],
    sa: [i64; MAX_RANK],
    sb: [i64; MAX_RANK],
    sy: [i64; MAX_RANK],
}

// SAFETY: plain-old-data with the C layout of the kernels' `struct Dims` (an int, padding to 8,
// then four arrays of 6 long longs).
unsafe impl DeviceRepr for Dims {}

fn rank_error(rank: usize) -> Error {
    Error::Invalid(format!(
        "tensors of rank {rank}: gpukit's CUDA ops take at most {MAX_RANK} dimensions"
    ))
}

fn i64s(v: &[usize]) -> [i64; MAX_RANK] {
    let mut out = [0i64; MAX_RANK];
    for (o, &x) in out.iter_mut().zip(v) {
        *o = x as i64;
    }
    out
}

impl Dims {
    fn new(shape: &[usize], sa: &[usize], sb: &[usize], sy: &[usize]) -> Result<Dims> {
        // every operand row-major: the logical index is the offset (rank 0 to the kernels)
        let dense = row_major(shape);
        let is_dense = |s: &[usize]| {
            s.len() == shape.len()
                && shape
                    .iter()
                    .zip(s)
                    .zip(&dense)
                    .all(|((&d, &x), &w)| d == 1 || x == w)
        };
        if is_dense(sa) && is_dense(sb) && is_dense(sy) {
            return Ok(Dims::default());
        }
        if shape.len() > MAX_RANK {
            return Err(rank_error(shape.len()));
        }
        for s in [sa, sb, sy] {
            if s.len() != shape.len() {
                return Err(Error::Invalid(format!(
                    "strides {s:?} do not match shape {shape:?}"
                )));
            }
        }
        Ok(Dims {
            rank: shape.len() as i32,
            shape: i64s(shape),
            sa: i64s(sa),
            sb: i64s(sb),
            sy: i64s(sy),
        })
    }
}

/// An operand of a strided op: its bytes and its strides in elements (the shape is the op's).
#[derive(Clone, Copy, Debug)]
pub struct Strided<'a> {
    pub view: View<'a>,
    pub strides: &'a [usize],
}

impl<'a> Strided<'a> {
    pub fn new(view: View<'a>, strides: &'a [usize]) -> Strided<'a> {
        Strided { view, strides }
    }

    /// An error unless every element of `shape` at these strides lies inside the view.
    fn check(&self, shape: &[usize], dtype: DType, what: &str) -> Result<()> {
        if shape.contains(&0) {
            return Ok(());
        }
        let last: usize = shape
            .iter()
            .zip(self.strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum();
        self.view.require((last + 1) * dtype.size_bytes(), what)
    }
}

/// An elementwise operation of two operands (or one and a scalar).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    Add,
    Mul,
}

impl Arith {
    fn code(self) -> i32 {
        match self {
            Arith::Add => 0,
            Arith::Mul => 1,
        }
    }
}

/// The distribution of [`TensorKernels::fill_random`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    /// Uniform in [-1, 1).
    Uniform,
    /// Standard normal (mean 0, deviation 1), as `torch.randn`.
    Normal,
}

fn tag(dtype: DType) -> &'static str {
    match dtype.storage() {
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        _ => "f32",
    }
}

const BLOCK: u32 = 256;

fn grid(total: usize) -> LaunchConfig {
    crate::kernels::config(total)
}

/// Threads of the vectorised kernels: one per 16 bytes (at least one, for the tail).
fn vectors(n: usize, dtype: DType) -> usize {
    (n / (16 / tag_size(dtype))).max(1)
}

fn tag_size(dtype: DType) -> usize {
    match tag(dtype) {
        "f64" => 8,
        "f32" => 4,
        _ => 2,
    }
}

/// The loaded tensor kernels of one device.
pub struct TensorKernels {
    module: Module,
    /// Multiprocessors of the device (how many blocks fill it).
    sms: usize,
    pub origin: String,
    pub load_ms: f64,
}

impl TensorKernels {
    /// Compiles the kernels for `gpu` (or reads them from the on-disk cache) and loads them.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<TensorKernels> {
        let names: Vec<String> = STEMS
            .iter()
            .flat_map(|s| ["f64", "f32", "f16", "bf16"].map(|t| format!("{s}_{t}")))
            .collect();
        let module = Module::load(
            discovery,
            gpu,
            &format!("{HALF}{SOURCE}"),
            "tensor-kernels",
            &names,
        )?;
        let sms = crate::driver::device_attributes(gpu.ordinal, gpu.ordinal + 1)
            .map(|a| a.sm_count as usize)
            .unwrap_or(108)
            .max(1);
        Ok(TensorKernels {
            origin: module.origin.clone(),
            load_ms: module.load_ms,
            module,
            sms,
        })
    }

    fn f(&self, stem: &str, dtype: DType) -> Result<&CudaFunction> {
        self.module.function(&format!("{stem}_{}", tag(dtype)))
    }

    /// Fills the first `n` elements of `y` with random values from `seed`: element `i` depends
    /// on (seed, i) alone, so any launch shape gives the same values.
    pub fn fill_random(
        &self,
        stream: &Stream,
        y: View<'_>,
        dtype: DType,
        n: usize,
        seed: u64,
        dist: Distribution,
    ) -> Result<()> {
        y.require(n * dtype.size_bytes(), "fill")?;
        if n == 0 {
            return Ok(());
        }
        let f = self.f("fill", dtype)?;
        let (py, nn, normal) = (y.addr(), n as i64, i32::from(dist == Distribution::Normal));
        let mut b = stream.raw().launch_builder(f);
        b.arg(&py).arg(&nn).arg(&seed).arg(&normal);
        // SAFETY: (T*, long long, unsigned long long, int) as declared; y holds n elements.
        unsafe { b.launch(grid(n.div_ceil(if tag(dtype) == "f64" { 2 } else { 4 }))) }?;
        Ok(())
    }

    /// `y = a (op) b` elementwise over `shape`, each operand at its own strides (`y` may be
    /// `a` itself: in place).
    pub fn binary(
        &self,
        stream: &Stream,
        op: Arith,
        dtype: DType,
        shape: &[usize],
        (a, b, y): (Strided<'_>, Strided<'_>, Strided<'_>),
    ) -> Result<()> {
        let d = Dims::new(shape, a.strides, b.strides, y.strides)?;
        a.check(shape, dtype, "binary a")?;
        b.check(shape, dtype, "binary b")?;
        y.check(shape, dtype, "binary y")?;
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        let (pa, pb, py, nn, code) = (
            a.view.addr(),
            b.view.addr(),
            y.view.addr(),
            n as i64,
            op.code(),
        );
        if d.rank == 0 && [pa, pb, py].iter().all(|p| p % 16 == 0) {
            let mut l = stream.raw().launch_builder(self.f("binary_vec", dtype)?);
            l.arg(&pa).arg(&pb).arg(&py).arg(&nn).arg(&code);
            // SAFETY: (const T*, const T*, T*, long long, int) as declared; the three operands
            // are contiguous, hold n elements (checked) and start on 16 bytes.
            unsafe { l.launch(grid(vectors(n, dtype))) }?;
            return Ok(());
        }
        let f = self.f("binary", dtype)?;
        let mut l = stream.raw().launch_builder(f);
        l.arg(&pa).arg(&pb).arg(&py).arg(&d).arg(&nn).arg(&code);
        // SAFETY: (const T*, const T*, T*, Dims, long long, int) as declared; every element
        // each operand's strides reach was checked to lie in its view.
        unsafe { l.launch(grid(n)) }?;
        Ok(())
    }

    /// `y = a (op) s` elementwise with a scalar (`y` may be `a`).
    pub fn scalar(
        &self,
        stream: &Stream,
        op: Arith,
        dtype: DType,
        shape: &[usize],
        (a, y): (Strided<'_>, Strided<'_>),
        s: f64,
    ) -> Result<()> {
        let d = Dims::new(shape, a.strides, a.strides, y.strides)?;
        a.check(shape, dtype, "scalar a")?;
        y.check(shape, dtype, "scalar y")?;
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        let (pa, py, nn, code) = (a.view.addr(), y.view.addr(), n as i64, op.code());
        if d.rank == 0 && pa % 16 == 0 && py % 16 == 0 {
            let mut l = stream.raw().launch_builder(self.f("scalar_vec", dtype)?);
            l.arg(&pa).arg(&py).arg(&nn).arg(&code).arg(&s);
            // SAFETY: (const T*, T*, long long, int, double) as declared; both operands are
            // contiguous, hold n elements (checked) and start on 16 bytes.
            unsafe { l.launch(grid(vectors(n, dtype))) }?;
            return Ok(());
        }
        let f = self.f("scalar", dtype)?;
        let mut l = stream.raw().launch_builder(f);
        l.arg(&pa).arg(&py).arg(&d).arg(&nn).arg(&code).arg(&s);
        // SAFETY: (const T*, T*, Dims, long long, int, double) as declared; bounds checked.
        unsafe { l.launch(grid(n)) }?;
        Ok(())
    }

    /// `y = a` over `shape` at both operands' strides. A batch of transposed matrices (the last
    /// two dimensions' strides swapped, the rest contiguous) into a contiguous `y` goes through
    /// 32x32 tiles in shared memory, so that reads and writes both coalesce.
    pub fn copy(
        &self,
        stream: &Stream,
        dtype: DType,
        shape: &[usize],
        (a, y): (Strided<'_>, Strided<'_>),
    ) -> Result<()> {
        let d = Dims::new(shape, a.strides, a.strides, y.strides)?;
        a.check(shape, dtype, "copy a")?;
        y.check(shape, dtype, "copy y")?;
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        if let Some((batch, rows, cols, xs)) = transposed_batch(shape, a.strides, y.strides) {
            let f = self.f("transpose", dtype)?;
            let (px, py) = (a.view.addr(), y.view.addr());
            let (nb, r, c, s) = (batch as i64, rows as i32, cols as i32, xs as i64);
            let cfg = LaunchConfig {
                grid_dim: (
                    cols.div_ceil(32) as u32,
                    rows.div_ceil(32) as u32,
                    batch as u32,
                ),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            let mut l = stream.raw().launch_builder(f);
            l.arg(&px).arg(&py).arg(&nb).arg(&r).arg(&c).arg(&s);
            // SAFETY: (const T*, T*, long long, int, int, long long) as declared; the tiles stay
            // inside [batch, rows, cols] (checked in the kernel), which lie in both views.
            unsafe { l.launch(cfg) }?;
            return Ok(());
        }
        let f = self.f("copy", dtype)?;
        let (pa, py, nn) = (a.view.addr(), y.view.addr(), n as i64);
        let mut l = stream.raw().launch_builder(f);
        l.arg(&pa).arg(&py).arg(&d).arg(&nn);
        // SAFETY: (const T*, T*, Dims, long long) as declared; bounds checked.
        unsafe { l.launch(grid(n)) }?;
        Ok(())
    }

    /// Sums `x` (of `shape`, at its strides) along `axis` into the contiguous `y` (the shape
    /// without `axis`). `scratch` receives per-split partial sums when the reduction is split to
    /// fill the device: [`TensorKernels::sum_scratch_bytes`] says how many bytes it needs.
    #[allow(clippy::too_many_arguments)]
    pub fn sum_axis(
        &self,
        stream: &Stream,
        dtype: DType,
        shape: &[usize],
        x: Strided<'_>,
        axis: usize,
        y: View<'_>,
        scratch: Option<View<'_>>,
    ) -> Result<()> {
        let plan = self.sum_plan(shape, x.strides, axis)?;
        x.check(shape, dtype, "sum x")?;
        y.require(plan.outputs * dtype.size_bytes(), "sum y")?;
        if plan.outputs == 0 {
            return Ok(());
        }
        let part = match (plan.splits > 1, scratch) {
            (false, _) => 0u64,
            (true, Some(s)) => {
                s.require(plan.scratch_bytes(), "sum scratch")?;
                s.addr()
            }
            (true, None) => {
                return Err(Error::Invalid(format!(
                    "sum_axis: {} bytes of scratch needed",
                    plan.scratch_bytes()
                )))
            }
        };
        let (px, py) = (x.view.addr(), y.addr());
        let (outputs, len, rs, chunk) = (
            plan.outputs as i64,
            plan.len as i64,
            plan.rs as i64,
            plan.chunk as i64,
        );
        let (f, cfg) = if plan.rows {
            let cfg = LaunchConfig {
                grid_dim: (plan.outputs as u32, plan.splits as u32, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            (self.f("sum_rows", dtype)?, cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (
                    plan.outputs.div_ceil(BLOCK as usize) as u32,
                    plan.splits as u32,
                    1,
                ),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            (self.f("sum_cols", dtype)?, cfg)
        };
        let mut l = stream.raw().launch_builder(f);
        l.arg(&px)
            .arg(&py)
            .arg(&part)
            .arg(&plan.dims)
            .arg(&outputs)
            .arg(&len)
            .arg(&rs)
            .arg(&chunk);
        // SAFETY: (const T*, T*, double*, Dims, long long x4) as declared; x's elements checked
        // to lie in its view, y holds `outputs` elements, the partials (when used) fit scratch.
        unsafe { l.launch(cfg) }?;
        if plan.splits > 1 {
            let f = self.f("sum_partials", dtype)?;
            let splits = plan.splits as i32;
            let mut l = stream.raw().launch_builder(f);
            l.arg(&part).arg(&py).arg(&outputs).arg(&splits);
            // SAFETY: (const double*, T*, long long, int) as declared; sizes checked above.
            unsafe { l.launch(grid(plan.outputs)) }?;
        }
        Ok(())
    }

    /// Bytes of scratch [`TensorKernels::sum_axis`] needs for this reduction (0: none).
    pub fn sum_scratch_bytes(
        &self,
        shape: &[usize],
        strides: &[usize],
        axis: usize,
    ) -> Result<usize> {
        let plan = self.sum_plan(shape, strides, axis)?;
        Ok(if plan.splits > 1 {
            plan.scratch_bytes()
        } else {
            0
        })
    }

    fn sum_plan(&self, shape: &[usize], strides: &[usize], axis: usize) -> Result<SumPlan> {
        if axis >= shape.len() || strides.len() != shape.len() {
            return Err(Error::Invalid(format!(
                "sum along axis {axis} of shape {shape:?} (strides {strides:?})"
            )));
        }
        if shape.len() > MAX_RANK + 1 {
            return Err(rank_error(shape.len()));
        }
        let mut kept_shape = shape.to_vec();
        let len = kept_shape.remove(axis);
        let mut kept_strides = strides.to_vec();
        let rs = kept_strides.remove(axis);
        let outputs: usize = kept_shape.iter().product();
        let dims = Dims::new(&kept_shape, &kept_strides, &kept_strides, &kept_strides)?;
        // Along a unit stride, a block per output reads coalesced; otherwise a thread per
        // output, which coalesces when the outputs are neighbours in memory.
        let rows = rs == 1 && len >= 64;
        let target = self.sms * 2048; // threads that fill the device
        let splits = if rows {
            let blocks = outputs.max(1);
            (target / BLOCK as usize / blocks).clamp(1, (len / 2048).max(1))
        } else {
            (target / outputs.max(1)).clamp(1, (len / 32).max(1))
        }
        .min(65_535);
        let chunk = len.div_ceil(splits).max(1);
        let splits = len.div_ceil(chunk).max(1);
        Ok(SumPlan {
            dims,
            outputs,
            len,
            rs,
            rows,
            splits,
            chunk,
        })
    }
}

/// What the tensor crate's CUDA ops launch on one device: [`TensorKernels`] and a cuBLAS
/// handle, both on the device's work stream (from [`Gpu::tensor_ops`]).
pub struct TensorOps {
    pub kernels: TensorKernels,
    blas: std::sync::Mutex<SendBlas>,
}

/// A cuBLAS handle that may move between threads: the mutex around it lets one thread at a
/// time use it, and its work is ordered on its one stream.
struct SendBlas(crate::blas::Blas);

// SAFETY: cuBLAS handles may be used from any host thread (cuBLAS is thread safe as long as
// the handle's configuration is not changed concurrently; it is set once, at creation, and the
// mutex serialises every use).
unsafe impl Send for SendBlas {}

impl TensorOps {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<TensorOps> {
        Ok(TensorOps {
            kernels: TensorKernels::new(discovery, gpu)?,
            blas: std::sync::Mutex::new(SendBlas(crate::blas::Blas::new(discovery, gpu)?)),
        })
    }

    /// Runs `f` with the device's cuBLAS handle (on the work stream).
    pub fn with_blas<T>(&self, f: impl FnOnce(&crate::blas::Blas) -> Result<T>) -> Result<T> {
        let guard = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        f(&guard.0)
    }
}

struct SumPlan {
    dims: Dims,
    outputs: usize,
    len: usize,
    rs: usize,
    rows: bool,
    splits: usize,
    chunk: usize,
}

impl SumPlan {
    fn scratch_bytes(&self) -> usize {
        self.splits * self.outputs * 8
    }
}

/// Row-major strides of `shape`, in elements.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    strides
}

/// (batch, rows, cols, batch stride of x) when `x_strides` read a batch of transposed matrices
/// (last two strides `[1, rows]`, earlier dimensions one contiguous batch) and `y` is
/// contiguous: the case a tiled transpose serves.
fn transposed_batch(
    shape: &[usize],
    x_strides: &[usize],
    y_strides: &[usize],
) -> Option<(usize, usize, usize, usize)> {
    let r = shape.len();
    if r < 2 || y_strides != row_major(shape).as_slice() {
        return None;
    }
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    if rows < 2 || cols < 2 || x_strides[r - 2] != 1 || x_strides[r - 1] != rows {
        return None;
    }
    let batch: usize = shape[..r - 2].iter().product();
    let xs = rows * cols;
    // earlier dimensions: contiguous batches of rows x cols elements
    let mut expect = xs;
    for k in (0..r - 2).rev() {
        if shape[k] > 1 && x_strides[k] != expect {
            return None;
        }
        expect *= shape[k];
    }
    (batch <= 65_535).then_some((batch, rows, cols, xs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_match_the_c_layout() {
        // int (4) + padding (4) + 4 arrays of 6 long longs
        assert_eq!(std::mem::size_of::<Dims>(), 8 + 4 * 6 * 8);
        assert_eq!(std::mem::align_of::<Dims>(), 8);
    }

    #[test]
    fn transposed_batches_are_recognised() {
        // x.T of a contiguous 4 x 3: shape [3, 4], strides [1, 3]
        assert_eq!(
            transposed_batch(&[3, 4], &[1, 3], &[4, 1]),
            Some((1, 3, 4, 12))
        );
        // a batch of 5 of them
        assert_eq!(
            transposed_batch(&[5, 3, 4], &[12, 1, 3], &[12, 4, 1]),
            Some((5, 3, 4, 12))
        );
        // contiguous input, or a non-contiguous output, is not a transpose
        assert_eq!(transposed_batch(&[3, 4], &[4, 1], &[4, 1]), None);
        assert_eq!(transposed_batch(&[3, 4], &[1, 3], &[1, 3]), None);
        // a batch dimension that is not packed
        assert_eq!(transposed_batch(&[5, 3, 4], &[24, 1, 3], &[12, 4, 1]), None);
    }
}
