//! The inference engine's own small GPU kernels (layout/precision conversion, pooling, bias, the
//! classifier, and two helpers of its plans: a stream barrier and a byte comparison), written in CUDA C,
//! compiled at run time by NVRTC for the device's own architecture, cached on disk and launched
//! through `gpukit_cuda::kernel`.
//!
//! To use: [`Kernels::new`] once per opened [`Gpu`] (compiles, or reads the cached PTX), then the
//! launch methods, which enqueue on the GPU's stream and return at once (capturable in a graph).
//! The half-precision types are handled with bit operations and PTX conversions (the kernel
//! API's shared `HALF` prelude), so the source needs no CUDA headers. The kernel API checks
//! each launch's arguments against the kernel's declared parameters; the sizes of the buffers
//! the kernels index are checked here, before each launch.

use gpukit_cuda::kernel::{grid_for, tag, Arg, KernelModule, KernelSource, Launch, HALF};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};
use gpukit_types::{DType, Layout};

const SOURCE: &str = r#"
// NCHW f32 input -> T in NCHW or NHWC with `cout` >= c channels (the extra ones zero). NHWC:
// a thread a pixel (launched over n * hw threads), its c values read from c planes (the
// threads of a warp read consecutive pixels of each), its cout values written together (one
// 16-byte store for 8 16-bit channels); NCHW: a thread an output element.
template <class T, bool NHWC>
__device__ void convert_input(const float* __restrict__ x, T* __restrict__ y,
                              int n, int c, int cout, int hw) {
    if (NHWC) {
        const long pixels = (long)n * hw;
        const bool packed = sizeof(T) == 2 && cout == 8 && ((size_t)y & 15) == 0;
        for (long px = blockIdx.x * (long)blockDim.x + threadIdx.x; px < pixels;
             px += (long)gridDim.x * blockDim.x) {
            const long img = px / hw, p = px - img * hw;
            const float* xi = x + img * c * hw + p;
            T* yo = y + px * cout;
            if (packed) {
                __align__(16) T v[8];
#pragma unroll
                for (int ch = 0; ch < 8; ++ch) v[ch] = from_f<T>(ch < c ? xi[(long)ch * hw] : 0.0f);
                *(uint4*)yo = *(const uint4*)v;
            } else {
                for (int ch = 0; ch < cout; ++ch)
                    yo[ch] = from_f<T>(ch < c ? xi[(long)ch * hw] : 0.0f);
            }
        }
        return;
    }
    long total = (long)n * cout * hw;
    for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < total;
         o += (long)gridDim.x * blockDim.x) {
        int img, ch, p;
        if (NHWC) { ch = o % cout; long r = o / cout; p = r % hw; img = r / hw; }
        else { p = o % hw; long r = o / hw; ch = r % cout; img = r / cout; }
        float v = ch < c ? x[((long)img * c + ch) * hw + p] : 0.0f;
        y[o] = from_f<T>(v);
    }
}

// NCHW f32 image -> T channel-last blocks of side x side pixels (space to depth), for the
// convolution that reads it: y [n, bh, bw, cout], channel (r * side + q) * c + ch of block
// (by, bx) holding pixel (by * side + r - br, bx * side + q - bc) of channel ch (br, bc: the
// pixels of the zero blocks before the image), zero outside the image and from c * side * side
// on. A thread a group of 8 channels of a block (consecutive threads the consecutive groups of
// a block, so their stores are consecutive), its loads all issued before its one 16-byte store
// for 16-bit T (a thread a block, its groups in turn, took 12.5 us at batch 1 of ConvNeXt's
// 56x56 blocks of 48 channels and 60 us at batch 32 on an H200). The group's first channel is
// divided out once and the others walked by increments, with 32-bit indices where every index
// fits (a division a value, and 64-bit ones, made the kernel's instructions, not its bytes, set
// its time).
template <class T, class I>
__device__ __forceinline__ void convert_blocks_in(const float* __restrict__ x, T* __restrict__ y,
                                                  int c, int h, int w, int side, int br, int bc,
                                                  int bh, int bw, int cout, I total) {
    const int used = c * side * side, groups = (cout + 7) / 8;
    const bool packed = sizeof(T) == 2 && cout % 8 == 0 && ((size_t)y & 15) == 0;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (I)gridDim.x * blockDim.x) {
        const I o = t / groups;
        const int g = (int)(t - o * groups) * 8;
        const I rest = o / bw;
        const int bx = (int)(o - rest * bw);
        const I img = rest / bh;
        const int by = (int)(rest - img * bh);
        const float* xi = x + img * (I)(c * h * w);
        T* yo = y + o * (I)cout;
        // channel g + e of the block: (r * side + q) * c + cc
        int at = g / c, cc = g - at * c;
        int r = at / side, q = at - r * side;
        __align__(16) T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float f = 0.0f;
            const int u = by * side + r - br, col = bx * side + q - bc;
            if (g + e < used && u >= 0 && u < h && col >= 0 && col < w)
                f = xi[((I)cc * h + u) * w + col];
            v[e] = from_f<T>(f);
            if (++cc == c) {
                cc = 0;
                if (++q == side) { q = 0; ++r; }
            }
        }
        if (packed) {
            *(uint4*)(yo + g) = *(const uint4*)v;
        } else {
            for (int e = 0; e < 8 && g + e < cout; ++e) yo[g + e] = v[e];
        }
    }
}

template <class T>
__device__ void convert_blocks(const float* __restrict__ x, T* __restrict__ y, int n, int c,
                               int h, int w, int side, int br, int bc, int bh, int bw,
                               int cout) {
    const long total = (long)n * bh * bw * ((cout + 7) / 8);
    const long limit = 1L << 31;
    if (total < limit && (long)n * bh * bw * cout < limit && (long)n * c * h * w < limit)
        convert_blocks_in<T, unsigned>(x, y, c, h, w, side, br, bc, bh, bw, cout,
                                       (unsigned)total);
    else
        convert_blocks_in<T, long>(x, y, c, h, w, side, br, bc, bh, bw, cout, total);
}

// 3x3 max pooling, stride 2, padding 1 (padding is -inf: it never wins).
template <class T, bool NHWC>
__device__ void max_pool(const T* __restrict__ x, T* __restrict__ y,
                         int n, int c, int h, int w, int p, int q) {
    long total = (long)n * c * p * q;
    for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < total;
         o += (long)gridDim.x * blockDim.x) {
        int img, ch, i, j;
        if (NHWC) { ch = o % c; long r = o / c; j = r % q; r /= q; i = r % p; img = r / p; }
        else { j = o % q; long r = o / q; i = r % p; r /= p; ch = r % c; img = r / c; }
        float m = -__int_as_float(0x7f800000);
        for (int di = 0; di < 3; ++di) {
            int yy = 2 * i + di - 1;
            if (yy < 0 || yy >= h) continue;
            for (int dj = 0; dj < 3; ++dj) {
                int xx = 2 * j + dj - 1;
                if (xx < 0 || xx >= w) continue;
                long at = NHWC ? (((long)img * h + yy) * w + xx) * c + ch
                               : (((long)img * c + ch) * h + yy) * w + xx;
                m = fmaxf(m, to_f(x[at]));
            }
        }
        y[o] = from_f<T>(m);
    }
}

// Global average pooling to f32 features [n, c].
template <class T, bool NHWC>
__device__ void avg_pool(const T* __restrict__ x, float* __restrict__ y, int n, int c, int hw) {
    long total = (long)n * c;
    for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < total;
         o += (long)gridDim.x * blockDim.x) {
        int ch = o % c, img = o / c;
        float s = 0.0f;
        for (int p = 0; p < hw; ++p) {
            long at = NHWC ? ((long)img * hw + p) * c + ch : ((long)img * c + ch) * hw + p;
            s += to_f(x[at]);
        }
        y[o] = s / (float)hw;
    }
}

// y = relu(y + bias[channel] (+ z)) in place, f32 arithmetic: the epilogue of a convolution run
// bare (a "split" plan). z may be null; it must not be y.
template <class T, bool NHWC>
__device__ void bias_relu(T* __restrict__ y, const T* __restrict__ b, const T* __restrict__ z,
                          int n, int k, int hw) {
    long total = (long)n * k * hw;
    for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < total;
         o += (long)gridDim.x * blockDim.x) {
        int ch = NHWC ? (int)(o % k) : (int)((o / hw) % k);
        float v = to_f(y[o]) + to_f(b[ch]);
        if (z) v += to_f(z[o]);
        y[o] = from_f<T>(v > 0.0f ? v : 0.0f);
    }
}

#define INSTANCES(T, TAG)                                                                     \
extern "C" __global__ void convert_input_##TAG##_nchw(const float* x, T* y, int n, int c,      \
    int cout, int hw) { convert_input<T, false>(x, y, n, c, cout, hw); }                      \
extern "C" __global__ void convert_input_##TAG##_nhwc(const float* x, T* y, int n, int c,      \
    int cout, int hw) { convert_input<T, true>(x, y, n, c, cout, hw); }                       \
extern "C" __global__ void convert_blocks_##TAG##_nhwc(const float* x, T* y, int n, int c,     \
    int h, int w, int side, int br, int bc, int bh, int bw, int cout)                           \
    { convert_blocks<T>(x, y, n, c, h, w, side, br, bc, bh, bw, cout); }                        \
extern "C" __global__ void max_pool_##TAG##_nchw(const T* x, T* y, int n, int c, int h, int w, \
    int p, int q) { max_pool<T, false>(x, y, n, c, h, w, p, q); }                             \
extern "C" __global__ void max_pool_##TAG##_nhwc(const T* x, T* y, int n, int c, int h, int w, \
    int p, int q) { max_pool<T, true>(x, y, n, c, h, w, p, q); }                              \
extern "C" __global__ void avg_pool_##TAG##_nchw(const T* x, float* y, int n, int c, int hw)   \
    { avg_pool<T, false>(x, y, n, c, hw); }                                                   \
extern "C" __global__ void avg_pool_##TAG##_nhwc(const T* x, float* y, int n, int c, int hw)   \
    { avg_pool<T, true>(x, y, n, c, hw); }                                                    \
extern "C" __global__ void bias_relu_##TAG##_nchw(T* y, const T* b, const T* z, int n, int k,  \
    int hw) { bias_relu<T, false>(y, b, z, n, k, hw); }                                       \
extern "C" __global__ void bias_relu_##TAG##_nhwc(T* y, const T* b, const T* z, int n, int k,  \
    int hw) { bias_relu<T, true>(y, b, z, n, k, hw); }

INSTANCES(float, f32)
INSTANCES(H, f16)
INSTANCES(B, bf16)

// Does nothing: launched without programmatic dependent launch, it starts only after everything
// queued before it on the stream has finished, and everything after starts after it.
extern "C" __global__ void stream_barrier() {}

// One 4-vector of row p at column col (c values a row): a 16-byte load where `vec` (c a multiple
// of 4, the rows 16-byte aligned), else one value at a time, zero past the row's end.
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int col, int c, int vec) {
    if (vec) return col < c ? *(const float4*)(p + col) : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col < c) v.x = p[col];
    if (col + 1 < c) v.y = p[col + 1];
    if (col + 2 < c) v.z = p[col + 2];
    if (col + 3 < c) v.w = p[col + 3];
    return v;
}

// y [n, k] = x [n, c] w [k, c]^T + b [k], f32 row-major: the classifier, two ways.
//
// classify_warp (one to a few rows): a warp computes up to 8 rows x 1 output, 8 warps a block. Each lane
// sums every 32nd 4-vector of c, a weight 4-vector feeding the 8 rows (x read through L1, where
// the block's warps share it); no shared memory and no barrier, so every SM streams weights.
__device__ void classify_warp(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, float* __restrict__ y,
                              int n, int k, int c, int vec) {
    const int lane = threadIdx.x & 31;
    const int out = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int row0 = blockIdx.y * 8, rows = min(8, n - row0);
    float acc[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) acc[r] = 0.0f;
    if (out < k) {
#pragma unroll 2
        for (int col = lane * 4; col < c; col += 128) {
            const float4 wv = load4(w + (long long)out * c, col, c, vec);
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                // rows past the batch are not summed at all (one row: 9.4 us on an H200, with
                // zeros summed 11.8)
                if (r >= rows) break;
                const float4 xv = load4(x + (long long)(row0 + r) * c, col, c, vec);
                acc[r] = fmaf(xv.x, wv.x, acc[r]);
                acc[r] = fmaf(xv.y, wv.y, acc[r]);
                acc[r] = fmaf(xv.z, wv.z, acc[r]);
                acc[r] = fmaf(xv.w, wv.w, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        float s = acc[r];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && r < rows && out < k) y[(long long)(row0 + r) * k + out] = s + b[out];
    }
}

// classify_block (larger batches): a block of 8 warps computes 8 rows x 32 outputs, 4 a warp.
// The block's rows of x are staged in shared memory 128 values of c at a time; a lane sums every
// 32nd 4-vector of c for its warp's 4 outputs and the 8 rows (each 4-vector of x read from
// shared memory feeds 4 outputs, each of the weights 8 rows), and the lanes' sums are added with
// shuffles at the end.
__device__ void classify_block(const float* __restrict__ x, const float* __restrict__ w,
                               const float* __restrict__ b, float* __restrict__ y,
                               int n, int k, int c, int vec) {
    __shared__ float4 xs[8][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.y * 8, out0 = blockIdx.x * 32 + warp * 4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float acc[8][4];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r][j] = 0.0f;
    for (int c0 = 0; c0 < c; c0 += 128) {
        for (int i = threadIdx.x; i < 8 * 32; i += blockDim.x) {
            const int r = i >> 5, v = i & 31;
            xs[r][v] = row0 + r < n ? load4(x + (long long)(row0 + r) * c, c0 + v * 4, c, vec) : zero;
        }
        __syncthreads();
        float4 wv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            wv[j] = out0 + j < k ? load4(w + (long long)(out0 + j) * c, c0 + lane * 4, c, vec) : zero;
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const float4 xv = xs[r][lane];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[r][j] = fmaf(xv.x, wv[j].x, acc[r][j]);
                acc[r][j] = fmaf(xv.y, wv[j].y, acc[r][j]);
                acc[r][j] = fmaf(xv.z, wv[j].z, acc[r][j]);
                acc[r][j] = fmaf(xv.w, wv[j].w, acc[r][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float s = acc[r][j];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0 && row0 + r < n && out0 + j < k)
                y[(long long)(row0 + r) * k + out0 + j] = s + b[out0 + j];
        }
}

extern "C" __global__ void classify_warp_f32(const float* x, const float* w, const float* b,
    float* y, int n, int k, int c, int vec) { classify_warp(x, w, b, y, n, k, c, vec); }
extern "C" __global__ void classify_block_f32(const float* x, const float* w, const float* b,
    float* y, int n, int k, int c, int vec) { classify_block(x, w, b, y, n, k, c, vec); }

// y[r, k] += b[k] for a row-major rows x cols matrix.
extern "C" __global__ void add_bias_f32(float* y, const float* b, int rows, int cols) {
    long total = (long)rows * cols;
    for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < total;
         o += (long)gridDim.x * blockDim.x) {
        y[o] += b[o % cols];
    }
}

// count[0] += how many of the first `bytes` bytes of a and b differ, compared a 32-bit word at
// a time (a word counts once however many of its bytes differ), the tail byte by byte.
extern "C" __global__ void count_unequal(const unsigned* a, const unsigned* b, long bytes,
                                        unsigned long long* count) {
    long words = bytes / 4;
    unsigned long long mine = 0;
    for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < words;
         o += (long)gridDim.x * blockDim.x) {
        mine += a[o] != b[o];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned char* ab = (const unsigned char*)a;
        const unsigned char* bb = (const unsigned char*)b;
        for (long o = words * 4; o < bytes; ++o) mine += ab[o] != bb[o];
    }
    if (mine) atomicAdd(count, mine);
}
"#;

/// The module's name in the kernel cache.
const STEM: &str = "kernels";

/// The inference kernels' module: its name in the cache, its whole CUDA C source and the
/// kernels loaded from it (also what `gpukit all` compiles ahead).
pub fn kernel_source() -> KernelSource {
    let mut names = vec![
        "classify_warp_f32".to_string(),
        "classify_block_f32".to_string(),
        "add_bias_f32".to_string(),
        "stream_barrier".to_string(),
        "count_unequal".to_string(),
    ];
    for e in ["f32", "f16", "bf16"] {
        for l in ["nchw", "nhwc"] {
            for k in ["convert_input", "max_pool", "avg_pool", "bias_relu"] {
                names.push(format!("{k}_{e}_{l}"));
            }
        }
        names.push(format!("convert_blocks_{e}_nhwc"));
    }
    KernelSource {
        stem: STEM,
        source: format!("{HALF}{SOURCE}"),
        names,
    }
}

/// The compiled kernels of one device.
pub struct Kernels {
    stream: Stream,
    module: KernelModule,
}

impl Kernels {
    /// Compiles the kernels for `gpu` (or reads them from the on-disk cache) and loads them.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Kernels> {
        let module = KernelModule::load(discovery, gpu, &kernel_source())?;
        Ok(Kernels {
            stream: gpu.stream().clone(),
            module,
        })
    }

    fn run(&self, name: &str, launch: Launch, args: &[Arg<'_>]) -> Result<()> {
        self.module.launch(name, &self.stream, launch, args)
    }

    /// The kernel `{stem}_{dtype}_{layout}`.
    fn variant(
        &self,
        stem: &str,
        dtype: DType,
        layout: Layout,
        launch: Launch,
        args: &[Arg<'_>],
    ) -> Result<()> {
        let name = format!("{stem}_{}_{}", tag(dtype), layout.name());
        self.run(&name, launch, args)
    }

    /// `y` (elem, NCHW or NHWC, `cout` channels) = `x` (f32 NCHW, `c` channels), zero-padded.
    #[allow(clippy::too_many_arguments)]
    pub fn convert_input(
        &self,
        x: View<'_>,
        y: View<'_>,
        dtype: DType,
        layout: Layout,
        (n, c, h, w): (usize, usize, usize, usize),
        cout: usize,
    ) -> Result<()> {
        if cout < c {
            return Err(Error::Invalid(format!(
                "convert_input: {cout} output channels < {c} input channels"
            )));
        }
        x.require(n * c * h * w * 4, "convert_input x")?;
        let total = n * cout * h * w;
        y.require(total * dtype.size_bytes(), "convert_input y")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::Size(c),
            Arg::Size(cout),
            Arg::Size(h * w),
        ];
        // NHWC: a thread a pixel
        let threads = match layout {
            Layout::Nhwc => n * h * w,
            Layout::Nchw => total,
        };
        self.variant("convert_input", dtype, layout, grid_for(threads), &args)
    }

    /// `y` (channel-last, `[n, bh, bw, cout]`) = `x` (f32 NCHW, `[n, c, h, w]`) in blocks of
    /// `side x side` pixels (space to depth): block channel `(r * side + q) * c + ch` holds
    /// pixel `(by * side + r - before.0 * side, bx * side + q - before.1 * side)` of channel
    /// `ch`, zero outside the image and from `c * side * side` on.
    #[allow(clippy::too_many_arguments)]
    pub fn convert_blocks(
        &self,
        x: View<'_>,
        y: View<'_>,
        dtype: DType,
        (n, c, h, w): (usize, usize, usize, usize),
        side: usize,
        before: (usize, usize),
        (bh, bw): (usize, usize),
        cout: usize,
    ) -> Result<()> {
        if cout < c * side * side {
            return Err(Error::Invalid(format!(
                "convert_blocks: {cout} channels hold fewer than {c} x {side} x {side} values"
            )));
        }
        x.require(n * c * h * w * 4, "convert_blocks x")?;
        let blocks = n * bh * bw;
        y.require(blocks * cout * dtype.size_bytes(), "convert_blocks y")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::Size(c),
            Arg::Size(h),
            Arg::Size(w),
            Arg::Size(side),
            Arg::Size(before.0 * side),
            Arg::Size(before.1 * side),
            Arg::Size(bh),
            Arg::Size(bw),
            Arg::Size(cout),
        ];
        self.variant(
            "convert_blocks",
            dtype,
            Layout::Nhwc,
            grid_for(blocks * cout.div_ceil(8)),
            &args,
        )
    }

    /// `y = relu(y + bias[channel] (+ z))` in place over `n x k x hw` elements (f32 inside):
    /// the epilogue of a convolution run bare. `z` must not overlap `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn bias_relu(
        &self,
        y: View<'_>,
        bias: View<'_>,
        z: Option<View<'_>>,
        dtype: DType,
        layout: Layout,
        (n, k, hw): (usize, usize, usize),
    ) -> Result<()> {
        let bytes = n * k * hw * dtype.size_bytes();
        y.require(bytes, "bias_relu y")?;
        bias.require(k * dtype.size_bytes(), "bias_relu bias")?;
        if let Some(z) = z {
            z.require(bytes, "bias_relu z")?;
            if z.overlaps(&y) {
                return Err(Error::Invalid(
                    "bias_relu: the residual overlaps the output".into(),
                ));
            }
        }
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(bias),
            Arg::opt(z),
            Arg::Size(n),
            Arg::Size(k),
            Arg::Size(hw),
        ];
        self.variant("bias_relu", dtype, layout, grid_for(n * k * hw), &args)
    }

    /// 3x3 / stride 2 / padding 1 max pooling; returns the output height and width.
    pub fn max_pool(
        &self,
        x: View<'_>,
        y: View<'_>,
        dtype: DType,
        layout: Layout,
        (n, c, h, w): (usize, usize, usize, usize),
    ) -> Result<(usize, usize)> {
        let (p, q) = ((h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1);
        x.require(n * c * h * w * dtype.size_bytes(), "max_pool x")?;
        y.require(n * c * p * q * dtype.size_bytes(), "max_pool y")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::Size(c),
            Arg::Size(h),
            Arg::Size(w),
            Arg::Size(p),
            Arg::Size(q),
        ];
        self.variant("max_pool", dtype, layout, grid_for(n * c * p * q), &args)?;
        Ok((p, q))
    }

    /// Global average pooling of `x` into f32 features `y` [n, c].
    pub fn avg_pool(
        &self,
        x: View<'_>,
        y: View<'_>,
        dtype: DType,
        layout: Layout,
        (n, c, h, w): (usize, usize, usize, usize),
    ) -> Result<()> {
        x.require(n * c * h * w * dtype.size_bytes(), "avg_pool x")?;
        y.require(n * c * 4, "avg_pool y")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::Size(c),
            Arg::Size(h * w),
        ];
        self.variant("avg_pool", dtype, layout, grid_for(n * c), &args)
    }

    /// An empty kernel: a full dependency point on the stream. After a library kernel whose
    /// output the next library kernel reads at once, it keeps the two from overlapping.
    pub fn barrier(&self) -> Result<()> {
        // one block of 1024 threads, the shape this launch has always had
        self.run("stream_barrier", Launch::new((1, 1, 1), (1024, 1, 1)), &[])
    }

    /// Whether the first `bytes` bytes of `a` and `b` are equal, compared on the GPU (waits for
    /// the answer): a check of a whole activation without copying it to the host.
    pub fn equal_bytes(&self, gpu: &Gpu, a: View<'_>, b: View<'_>, bytes: usize) -> Result<bool> {
        a.require(bytes, "equal_bytes a")?;
        b.require(bytes, "equal_bytes b")?;
        if !a.is_aligned(4) || !b.is_aligned(4) {
            return Err(Error::Invalid(
                "equal_bytes compares 4-byte words: both views must start 4-byte aligned".into(),
            ));
        }
        let count = gpu.alloc(8)?;
        let args = [
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Size(bytes),
            Arg::Ptr(count.view()),
        ];
        self.run("count_unequal", grid_for(bytes.div_ceil(4)), &args)?;
        let got = gpu.download(&count)?;
        Ok(got.iter().all(|&b| b == 0))
    }

    /// `y [n, k] = x [n, c] w [k, c]^T + bias [k]`, f32 row-major: the classifier's product
    /// and bias in one launch; a warp an output up to [`WARP_ROWS`] rows (every SM streams
    /// weights), a block of 32 outputs and 8 rows beyond.
    pub fn classify(
        &self,
        x: View<'_>,
        w: View<'_>,
        bias: View<'_>,
        y: View<'_>,
        (n, k, c): (usize, usize, usize),
    ) -> Result<()> {
        x.require(n * c * 4, "classify x")?;
        w.require(k * c * 4, "classify weights")?;
        bias.require(k * 4, "classify bias")?;
        y.require(n * k * 4, "classify y")?;
        if y.overlaps(&x) {
            return Err(Error::Invalid(
                "classify: the output overlaps the input".into(),
            ));
        }
        let (name, launch) = classify_launch(n, k, c)?;
        let vec = c.is_multiple_of(4) && x.is_aligned(16) && w.is_aligned(16);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(bias),
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::Size(k),
            Arg::Size(c),
            Arg::I32(i32::from(vec)),
        ];
        self.run(name, launch, &args)
    }

    /// `y[r, k] += bias[k]` for a row-major f32 `rows x cols` matrix.
    pub fn add_bias(&self, y: View<'_>, bias: View<'_>, rows: usize, cols: usize) -> Result<()> {
        y.require(rows * cols * 4, "add_bias y")?;
        bias.require(cols * 4, "add_bias bias")?;
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(bias),
            Arg::Size(rows),
            Arg::Size(cols),
        ];
        self.run("add_bias_f32", grid_for(rows * cols), &args)
    }
}

/// Which classifier kernel runs `n` rows of `c` features into `k` outputs, and its grid: a warp
/// an output up to [`WARP_ROWS`] rows (8 outputs a block), a block of 32 outputs beyond; 8 rows
/// a block either way. An error past one launch's grid or the kernel's 32-bit sizes.
fn classify_launch(n: usize, k: usize, c: usize) -> Result<(&'static str, Launch)> {
    let (name, outputs) = match n <= WARP_ROWS {
        true => ("classify_warp_f32", 8),
        false => ("classify_block_f32", 32),
    };
    let (rows, cols) = (n.div_ceil(8), k.div_ceil(outputs));
    let int = i32::MAX as usize;
    if rows > 65_535 || cols > int || n > int || k > int || c > int {
        return Err(Error::Invalid(format!(
            "classify: {n} rows of {c} features into {k} outputs is past one launch"
        )));
    }
    Ok((
        name,
        Launch::new((cols as u32, rows as u32, 1), (256, 1, 1)),
    ))
}

/// Up to this many rows [`Kernels::classify`] gives a warp an output. On an H200 a warp an
/// output took 9.3 us at one row (cuBLAS's product and bias 9.5) and 2.5 us more a row (26.7
/// at 8), a block of 8 rows x 32 outputs about 21 us from 9 to 64 rows (cuBLAS 19-22).
pub const WARP_ROWS: usize = 4;

/// From this many rows the engine's classifier runs on cuBLAS where it opens (the classifier
/// kernel took 89 us at 256 rows on an H200, cuBLAS's product and bias 57 us); below, cuBLAS is
/// never loaded (opening it held up a warm single-row `infer` by about 270 ms).
pub const BLAS_ROWS: usize = 65;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classifier_takes_a_warp_an_output_up_to_warp_rows() {
        let (name, l) = classify_launch(1, 1000, 2048).unwrap();
        assert_eq!(
            (name, l.grid, l.block),
            ("classify_warp_f32", (125, 1, 1), (256, 1, 1))
        );
        let (name, _) = classify_launch(WARP_ROWS, 1000, 2048).unwrap();
        assert_eq!(name, "classify_warp_f32");
        let (name, l) = classify_launch(WARP_ROWS + 1, 1000, 2048).unwrap();
        assert_eq!((name, l.grid), ("classify_block_f32", (32, 1, 1)));
        // 8 rows a block, the last one part empty; outputs not a multiple of a block's
        let (_, l) = classify_launch(300, 33, 132).unwrap();
        assert_eq!(l.grid, (2, 38, 1));
        assert!(classify_launch(65_535 * 8, 10, 10).is_ok());
        assert!(classify_launch(65_535 * 8 + 1, 10, 10).is_err());
        assert!(classify_launch(1, 10, i32::MAX as usize + 1).is_err());
    }

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        let tags: Vec<String> = ["f32", "f16", "bf16"]
            .iter()
            .flat_map(|e| ["nchw", "nhwc"].map(|l| format!("{e}_{l}")))
            .collect();
        let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
        let expected = [
            ("convert_input_", "p p i i i i"),
            ("max_pool_", "p p i i i i i i"),
            ("avg_pool_", "p p i i i"),
            ("bias_relu_", "p p p i i i"),
            ("classify_warp_f32", "p p p p i i i i"),
            ("classify_block_f32", "p p p p i i i i"),
            ("add_bias_f32", "p p i i"),
            ("stream_barrier", ""),
            ("count_unequal", "p p l p"),
            ("convert_blocks_f32_nhwc", "p p i i i i i i i i i i"),
            ("convert_blocks_f16_nhwc", "p p i i i i i i i i i i"),
            ("convert_blocks_bf16_nhwc", "p p i i i i i i i i i i"),
        ];
        let differences = kernel_source().signature_differences(&expected, &tags);
        assert!(differences.is_empty(), "{differences:#?}");
    }
}
