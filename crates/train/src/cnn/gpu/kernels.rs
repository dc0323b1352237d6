//! The convolutional networks' own small GPU kernels (CUDA C compiled by NVRTC, launched
//! through `gpukit_cuda::kernel`): a residual add and ReLU after batch norm where cuDNN does not
//! fuse them, global average pooling with its backward (channels-first and channels-last), the
//! stem's ReLU and max pooling in one channel-last pass (positions kept for the backward), and
//! the blocked stem filter's gradient mask. The losses, the optimizers and
//! ReLU's backward are the MLP engine's kernels ([`crate::gpu::kernels`]), the same math.
//!
//! Each does its arithmetic in f32 in the CPU reference's order (the pool sums a plane in
//! order, then multiplies by 1 / plane), so the f32 paths agree to the last bit where the
//! inputs do.

use gpukit_cuda::kernel::{grid_for, tag, Arg, KernelModule, KernelSource, Launch, HALF};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Gpu, Result, Stream, View};
use gpukit_types::DType;

const SOURCE: &str = r#"
#define LOOP(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); \
                        i += (long)gridDim.x * blockDim.x)

// y = relu(y + z), or relu(y) when z is null; a NaN stays NaN.
template <class T> __device__ void add_relu(T* y, const T* z, long n) {
    LOOP(i, n) {
        float v = to_f(y[i]);
        if (z) v += to_f(z[i]);
        y[i] = from_f<T>(v < 0.0f ? 0.0f : v);
    }
}

// y[p] = (sum of plane p of x, in order) * inv, one thread a plane.
template <class T> __device__ void avg_pool(const T* x, T* y, long planes, int plane, float inv) {
    LOOP(p, planes) {
        const T* src = x + p * plane;
        float s = 0.0f;
        for (int k = 0; k < plane; ++k) s += to_f(src[k]);
        y[p] = from_f<T>(s * inv);
    }
}

// dx[i] = dy[i / plane] * inv.
template <class T> __device__ void avg_pool_back(const T* dy, T* dx, long n, int plane, float inv) {
    LOOP(i, n) dx[i] = from_f<T>(to_f(dy[i / plane]) * inv);
}



// Channels-last: y[b c + ch] = (sum over the plane of x[(b plane + k) c + ch], in order) * inv.
template <class T> __device__ void avg_pool_nhwc(const T* x, T* y, long planes, int plane, int c,
                                                 float inv) {
    LOOP(p, planes) {
        long b = p / c, ch = p % c;
        const T* src = x + b * (long)plane * c + ch;
        float s = 0.0f;
        for (int k = 0; k < plane; ++k) s += to_f(src[(long)k * c]);
        y[p] = from_f<T>(s * inv);
    }
}

// Channels-last: dx[(b plane + k) c + ch] = dy[b c + ch] * inv.
template <class T> __device__ void avg_pool_back_nhwc(const T* dy, T* dx, long n, int plane, int c,
                                                      float inv) {
    LOOP(i, n) {
        long ch = i % c, b = i / ((long)plane * c);
        dx[i] = from_f<T>(to_f(dy[b * c + ch]) * inv);
    }
}

// Max pooling of ReLU's output, channels-last, one thread a vector of V channels of one output
// position (16-byte loads; 32-bit index arithmetic: total < 2^32): y = the window's largest of
// relu(x), taken as the CPU reference takes it (from -inf, a value larger than the best or a
// NaN; the first in-bounds position when none is), and idx = its position in the window
// (ky k + kx, below 256). relu(x) is never written: x is the norm's output before its ReLU.
// Window k, stride s, padding p; cv = channels / V.
template <class T, int V> struct alignas(sizeof(T) * V) PoolPack { T v[V]; };
template <int V> struct alignas(V) IdxPack { unsigned char v[V]; };
template <class T, int V>
__device__ void max_pool_relu_nhwc(const T* x, T* y, unsigned char* idx, unsigned total, int h,
                                   int w, int cv, int oh, int ow, int k, int s, int p) {
    typedef PoolPack<T, V> P;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        unsigned r = o / (unsigned)cv;
        const unsigned chv = o - r * (unsigned)cv;
        const unsigned q = r / (unsigned)ow;
        const int ox = (int)(r - q * (unsigned)ow);
        const unsigned b = q / (unsigned)oh;
        const int oy = (int)(q - b * (unsigned)oh);
        float best[V];
        int at[V];
#pragma unroll
        for (int u = 0; u < V; ++u) { best[u] = -__int_as_float(0x7f800000); at[u] = -1; }
        for (int ky = 0; ky < k; ++ky) {
            const int iy = oy * s - p + ky;
            if (iy < 0 || iy >= h) continue;
            for (int kx = 0; kx < k; ++kx) {
                const int ix = ox * s - p + kx;
                if (ix < 0 || ix >= w) continue;
                const P e = ((const P*)x)[((b * (unsigned)h + (unsigned)iy) * (unsigned)w
                                           + (unsigned)ix) * (unsigned)cv + chv];
#pragma unroll
                for (int u = 0; u < V; ++u) {
                    float v = to_f(e.v[u]);
                    v = v < 0.0f ? 0.0f : v;
                    if (at[u] < 0) at[u] = ky * k + kx;
                    if (v > best[u] || v != v) { best[u] = v; at[u] = ky * k + kx; }
                }
            }
        }
        P out;
        IdxPack<V> where;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            out.v[u] = from_f<T>(best[u]);
            where.v[u] = (unsigned char)(at[u] < 0 ? 0 : at[u]);
        }
        ((P*)y)[o] = out;
        ((IdxPack<V>*)idx)[o] = where;
    }
}

// max_pool_relu_nhwc's backward, one thread a vector of V channels of one input position: the
// gradients of the outputs whose window took this position (idx), added in output order, each
// where the output is above zero (ReLU's backward: the value taken is the output). dx is the
// gradient of the norm's output before its ReLU.
template <class T, int V>
__device__ void max_pool_relu_back_nhwc(const unsigned char* idx, const T* y, const T* dy, T* dx,
                                        unsigned total, int h, int w, int cv, int oh, int ow,
                                        int k, int s, int p) {
    typedef PoolPack<T, V> P;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        unsigned r = i / (unsigned)cv;
        const unsigned chv = i - r * (unsigned)cv;
        const unsigned q = r / (unsigned)w;
        const int ix = (int)(r - q * (unsigned)w);
        const unsigned b = q / (unsigned)h;
        const int iy = (int)(q - b * (unsigned)h);
        float g[V];
#pragma unroll
        for (int u = 0; u < V; ++u) g[u] = 0.0f;
        const int ly = iy + p - k + 1, lx = ix + p - k + 1;
        const int oy0 = ly <= 0 ? 0 : (ly + s - 1) / s, ox0 = lx <= 0 ? 0 : (lx + s - 1) / s;
        const int oy1 = min(oh - 1, (iy + p) / s), ox1 = min(ow - 1, (ix + p) / s);
        for (int oy = oy0; oy <= oy1; ++oy) {
            for (int ox = ox0; ox <= ox1; ++ox) {
                const unsigned o = ((b * (unsigned)oh + (unsigned)oy) * (unsigned)ow
                                    + (unsigned)ox) * (unsigned)cv + chv;
                const unsigned char pos = (unsigned char)((iy - (oy * s - p)) * k
                                                          + (ix - (ox * s - p)));
                const IdxPack<V> at = ((const IdxPack<V>*)idx)[o];
                bool any = false;
#pragma unroll
                for (int u = 0; u < V; ++u) any = any || at.v[u] == pos;
                if (!any) continue;
                const P yv = ((const P*)y)[o];
                const P dv = ((const P*)dy)[o];
#pragma unroll
                for (int u = 0; u < V; ++u)
                    if (at.v[u] == pos && to_f(yv.v[u]) > 0.0f) g[u] += to_f(dv.v[u]);
            }
        }
        P out;
#pragma unroll
        for (int u = 0; u < V; ++u) out.v[u] = from_f<T>(g[u]);
        ((P*)dx)[i] = out;
    }
}

// y[b, oy, ox, :] = x[b, s oy, s ox, :] for channel-last maps, a 16-byte vector a thread: the
// pixels a 1x1 stride-s convolution reads, gathered so that its filter gradient is one product.
template <class T, int V>
__device__ void subsample_nhwc(const T* x, T* y, unsigned total, int h, int w, int cv, int oh,
                               int ow, int s) {
    typedef PoolPack<T, V> P;
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        unsigned r = o / (unsigned)cv;
        const unsigned chv = o - r * (unsigned)cv;
        const unsigned q = r / (unsigned)ow;
        const unsigned ox = r - q * (unsigned)ow;
        const unsigned b = q / (unsigned)oh;
        const unsigned oy = q - b * (unsigned)oh;
        ((P*)y)[o] = ((const P*)x)[((b * (unsigned)h + oy * (unsigned)s) * (unsigned)w
                                    + ox * (unsigned)s) * (unsigned)cv + chv];
    }
}

#define INSTANCES(T, TAG)                                                                      \
extern "C" __global__ void add_relu_##TAG(T* y, const T* z, long n) { add_relu<T>(y, z, n); }  \
extern "C" __global__ void avg_pool_nhwc_##TAG(const T* x, T* y, long planes, int plane, int c, \
    float inv) { avg_pool_nhwc<T>(x, y, planes, plane, c, inv); }                              \
extern "C" __global__ void avg_pool_back_nhwc_##TAG(const T* dy, T* dx, long n, int plane,     \
    int c, float inv) { avg_pool_back_nhwc<T>(dy, dx, n, plane, c, inv); }                     \
extern "C" __global__ void avg_pool_##TAG(const T* x, T* y, long planes, int plane, float inv) \
    { avg_pool<T>(x, y, planes, plane, inv); }                                                 \
extern "C" __global__ void avg_pool_back_##TAG(const T* dy, T* dx, long n, int plane,          \
    float inv) { avg_pool_back<T>(dy, dx, n, plane, inv); }                                    \
extern "C" __global__ void max_pool_relu_nhwc_##TAG(const T* x, T* y, unsigned char* idx,      \
    unsigned total, int h, int w, int cv, int oh, int ow, int k, int s, int p)                 \
    { max_pool_relu_nhwc<T, 16 / sizeof(T)>(x, y, idx, total, h, w, cv, oh, ow, k, s, p); }    \
extern "C" __global__ void max_pool_relu_back_nhwc_##TAG(const unsigned char* idx, const T* y,  \
    const T* dy, T* dx, unsigned total, int h, int w, int cv, int oh, int ow, int k, int s,     \
    int p) { max_pool_relu_back_nhwc<T, 16 / sizeof(T)>(idx, y, dy, dx, total, h, w, cv, oh, ow, \
    k, s, p); }                                                                                \
extern "C" __global__ void subsample_nhwc_##TAG(const T* x, T* y, unsigned total, int h, int w, \
    int cv, int oh, int ow, int s) { subsample_nhwc<T, 16 / sizeof(T)>(x, y, total, h, w, cv,   \
    oh, ow, s); }

INSTANCES(float, f32)
INSTANCES(H, f16)
INSTANCES(B, bf16)

// v[i] *= keep[i]: the blocked stem filter's gradient kept to the network's taps (keep is 0 or 1).
extern "C" __global__ void mask_f32(float* v, const float* keep, long n) { LOOP(i, n) v[i] *= keep[i]; }
"#;

const STEM: &str = "cnn-kernels";
const TAGS: [&str; 3] = ["f32", "f16", "bf16"];
const KERNELS: [&str; 8] = [
    "add_relu",
    "avg_pool",
    "avg_pool_back",
    "avg_pool_nhwc",
    "avg_pool_back_nhwc",
    "max_pool_relu_nhwc",
    "max_pool_relu_back_nhwc",
    "subsample_nhwc",
];

/// The module's name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    let names = TAGS
        .iter()
        .flat_map(|t| KERNELS.map(|k| format!("{k}_{t}")))
        .chain(["mask_f32".to_string()])
        .collect();
    KernelSource {
        stem: STEM,
        source: format!("{HALF}{SOURCE}"),
        names,
    }
}

/// The loaded kernels of one device.
pub struct CnnKernels {
    stream: Stream,
    module: KernelModule,
}

impl CnnKernels {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<CnnKernels> {
        Ok(CnnKernels {
            stream: gpu.stream().clone(),
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
        })
    }

    fn typed(&self, stem: &str, dtype: DType, launch: Launch, args: &[Arg<'_>]) -> Result<()> {
        self.module.launch(
            &format!("{stem}_{}", tag(dtype)),
            &self.stream,
            launch,
            args,
        )
    }

    /// `v *= keep` over `n` f32 values (`keep` 0 or 1).
    pub fn mask_f32(&self, v: View<'_>, keep: View<'_>, n: usize) -> Result<()> {
        v.require(n * 4, "mask_f32 v")?;
        keep.require(n * 4, "mask_f32 keep")?;
        let args = [Arg::Ptr(v), Arg::Ptr(keep), Arg::Size(n)];
        self.module
            .launch("mask_f32", &self.stream, grid_for(n), &args)
    }

    /// `y = relu(y + z)` (`relu(y)` without `z`) over `n` values.
    pub fn add_relu(&self, y: View<'_>, z: Option<View<'_>>, dtype: DType, n: usize) -> Result<()> {
        let bytes = n * dtype.size_bytes();
        y.require(bytes, "add_relu y")?;
        if let Some(z) = z {
            z.require(bytes, "add_relu z")?;
        }
        let args = [Arg::Ptr(y), Arg::opt(z), Arg::Size(n)];
        self.typed("add_relu", dtype, grid_for(n), &args)
    }

    /// Each of `planes` planes of `plane` values of `x` averaged into `y`.
    pub fn avg_pool(
        &self,
        x: View<'_>,
        y: View<'_>,
        dtype: DType,
        (planes, plane): (usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        x.require(planes * plane * e, "avg_pool x")?;
        y.require(planes * e, "avg_pool y")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(planes),
            Arg::Size(plane),
            Arg::F32(inverse(plane)),
        ];
        self.typed("avg_pool", dtype, grid_for(planes), &args)
    }

    /// The average pool's backward: each of `planes` gradients of `dy` spread over its plane of
    /// `dx`.
    pub fn avg_pool_back(
        &self,
        dy: View<'_>,
        dx: View<'_>,
        dtype: DType,
        (planes, plane): (usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        dy.require(planes * e, "avg_pool_back dy")?;
        dx.require(planes * plane * e, "avg_pool_back dx")?;
        let n = planes * plane;
        let args = [
            Arg::Ptr(dy),
            Arg::Ptr(dx),
            Arg::Size(n),
            Arg::Size(plane),
            Arg::F32(inverse(plane)),
        ];
        self.typed("avg_pool_back", dtype, grid_for(n), &args)
    }

    /// Max pooling of `relu(x)` (channels-last `n x h x w x c` maps to `oh x ow`, window,
    /// stride, padding) into `y`, each output's position in its window into `idx` (a byte an
    /// output value): ReLU and pooling in one pass over the norm's output, the CPU layer's
    /// choice of the value taken.
    pub fn max_pool_relu_nhwc(
        &self,
        (x, y, idx): (View<'_>, View<'_>, View<'_>),
        dtype: DType,
        (n, h, w, c): (usize, usize, usize, usize),
        (oh, ow): (usize, usize),
        (window, stride, pad): (usize, usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        let v = 16 / e;
        let outputs = n * oh * ow * c;
        x.require(n * h * w * c * e, "max_pool_relu x")?;
        y.require(outputs * e, "max_pool_relu y")?;
        idx.require(outputs, "max_pool_relu idx")?;
        check_pool(dtype, c, n * h * w * c, window, &[x, y], &[idx])?;
        let total = outputs / v;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Ptr(idx),
            Arg::Size(total),
            Arg::Size(h),
            Arg::Size(w),
            Arg::Size(c / v),
            Arg::Size(oh),
            Arg::Size(ow),
            Arg::Size(window),
            Arg::Size(stride),
            Arg::Size(pad),
        ];
        self.typed("max_pool_relu_nhwc", dtype, grid_for(total), &args)
    }

    /// [`CnnKernels::max_pool_relu_nhwc`]'s backward: from the outputs' gradients `dy`, their
    /// values `y` and positions `idx`, the gradient of the pooled ReLU's input into `dx` (each
    /// output's gradient to the position it took where the output is above zero).
    pub fn max_pool_relu_back_nhwc(
        &self,
        (idx, y, dy, dx): (View<'_>, View<'_>, View<'_>, View<'_>),
        dtype: DType,
        (n, h, w, c): (usize, usize, usize, usize),
        (oh, ow): (usize, usize),
        (window, stride, pad): (usize, usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        let v = 16 / e;
        let values = n * h * w * c;
        let outputs = n * oh * ow * c;
        dx.require(values * e, "max_pool_relu_back dx")?;
        y.require(outputs * e, "max_pool_relu_back y")?;
        dy.require(outputs * e, "max_pool_relu_back dy")?;
        idx.require(outputs, "max_pool_relu_back idx")?;
        check_pool(dtype, c, values, window, &[y, dy, dx], &[idx])?;
        let total = values / v;
        let args = [
            Arg::Ptr(idx),
            Arg::Ptr(y),
            Arg::Ptr(dy),
            Arg::Ptr(dx),
            Arg::Size(total),
            Arg::Size(h),
            Arg::Size(w),
            Arg::Size(c / v),
            Arg::Size(oh),
            Arg::Size(ow),
            Arg::Size(window),
            Arg::Size(stride),
            Arg::Size(pad),
        ];
        self.typed("max_pool_relu_back_nhwc", dtype, grid_for(total), &args)
    }

    /// Every `stride`-th pixel of channel-last `n x h x w x c` maps `x` into `y` (`oh x ow`
    /// pixels: what a 1x1 stride-`stride` convolution reads), in 16-byte channel vectors.
    pub fn subsample_nhwc(
        &self,
        (x, y): (View<'_>, View<'_>),
        dtype: DType,
        (n, h, w, c): (usize, usize, usize, usize),
        (oh, ow): (usize, usize),
        stride: usize,
    ) -> Result<()> {
        let e = dtype.size_bytes();
        let v = 16 / e;
        let outputs = n * oh * ow * c;
        x.require(n * h * w * c * e, "subsample x")?;
        y.require(outputs * e, "subsample y")?;
        if !Self::subsample_runs(dtype, c, n * h * w * c)
            || [x, y].iter().any(|b| !b.is_aligned(16))
            || (oh - 1) * stride >= h
            || (ow - 1) * stride >= w
        {
            return Err(gpukit_cuda::Error::Invalid(format!(
                "subsample_nhwc: {c} channels not in whole 16-byte vectors, a view not aligned, \
                 or {oh}x{ow} outputs at stride {stride} beyond {h}x{w}"
            )));
        }
        let total = outputs / v;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(total),
            Arg::Size(h),
            Arg::Size(w),
            Arg::Size(c / v),
            Arg::Size(oh),
            Arg::Size(ow),
            Arg::Size(stride),
        ];
        self.typed("subsample_nhwc", dtype, grid_for(total), &args)
    }

    /// Whether [`CnnKernels::subsample_nhwc`] takes maps of `c` channels and `values` values:
    /// whole 16-byte channel vectors, 32-bit indices (the pool kernels' condition too).
    pub fn subsample_runs(dtype: DType, c: usize, values: usize) -> bool {
        let v = 16 / dtype.size_bytes();
        c.is_multiple_of(v) && values / v < u32::MAX as usize
    }

    /// Whether the max-pool kernels take channel-last maps of `c` channels, `values` values and
    /// a window of `window` x `window`: whole 16-byte channel vectors, 32-bit indices, window
    /// positions in a byte.
    pub fn max_pool_runs(dtype: DType, c: usize, values: usize, window: usize) -> bool {
        Self::subsample_runs(dtype, c, values) && window * window <= 256
    }

    /// [`CnnKernels::avg_pool`] of channels-last maps: `planes` = images x `channels`.
    pub fn avg_pool_nhwc(
        &self,
        x: View<'_>,
        y: View<'_>,
        dtype: DType,
        (planes, plane, channels): (usize, usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        x.require(planes * plane * e, "avg_pool_nhwc x")?;
        y.require(planes * e, "avg_pool_nhwc y")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(planes),
            Arg::Size(plane),
            Arg::Size(channels),
            Arg::F32(inverse(plane)),
        ];
        self.typed("avg_pool_nhwc", dtype, grid_for(planes), &args)
    }

    /// [`CnnKernels::avg_pool_back`] of channels-last maps.
    pub fn avg_pool_back_nhwc(
        &self,
        dy: View<'_>,
        dx: View<'_>,
        dtype: DType,
        (planes, plane, channels): (usize, usize, usize),
    ) -> Result<()> {
        let e = dtype.size_bytes();
        dy.require(planes * e, "avg_pool_back_nhwc dy")?;
        dx.require(planes * plane * e, "avg_pool_back_nhwc dx")?;
        let n = planes * plane;
        let args = [
            Arg::Ptr(dy),
            Arg::Ptr(dx),
            Arg::Size(n),
            Arg::Size(plane),
            Arg::Size(channels),
            Arg::F32(inverse(plane)),
        ];
        self.typed("avg_pool_back_nhwc", dtype, grid_for(n), &args)
    }
}

/// The max-pool kernels' preconditions ([`CnnKernels::max_pool_runs`], maps 16-byte aligned,
/// index bytes aligned to a vector's count).
fn check_pool(
    dtype: DType,
    c: usize,
    values: usize,
    window: usize,
    maps: &[View<'_>],
    idx: &[View<'_>],
) -> Result<()> {
    let v = 16 / dtype.size_bytes();
    if !CnnKernels::max_pool_runs(dtype, c, values, window)
        || maps.iter().any(|b| !b.is_aligned(16))
        || idx.iter().any(|b| !b.is_aligned(v))
    {
        return Err(gpukit_cuda::Error::Invalid(format!(
            "max pooling kernels: {c} channels, a {window}x{window} window or a view not in \
             whole 16-byte vectors (max_pool_runs says which maps they take)"
        )));
    }
    Ok(())
}

/// 1 / plane as the CPU reference rounds it (through f64).
fn inverse(plane: usize) -> f32 {
    (1.0 / plane.max(1) as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        let expected = [
            ("add_relu_", "p p l"),
            ("avg_pool_", "p p l i f"),
            ("avg_pool_back_", "p p l i f"),
            ("avg_pool_nhwc_", "p p l i i f"),
            ("avg_pool_back_nhwc_", "p p l i i f"),
            ("max_pool_relu_nhwc_", "p p p u32 i i i i i i i i"),
            ("max_pool_relu_back_nhwc_", "p p p p u32 i i i i i i i i"),
            ("subsample_nhwc_", "p p u32 i i i i i i"),
            ("mask_f32", "p p l"),
        ];
        let differences = kernel_source().signature_differences(&expected, &TAGS);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn the_pool_scale_is_the_cpu_references() {
        assert_eq!(inverse(16), 0.0625);
        assert_eq!(inverse(49), (1.0f64 / 49.0) as f32);
        assert_eq!(inverse(0), 1.0);
    }
}
