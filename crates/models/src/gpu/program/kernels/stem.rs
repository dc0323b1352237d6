//! ResNet's stem and the max pool after it in one kernel of gpukit's (decision 184): the
//! blocked stem convolution (decision 165: the image as 2 x 2 blocks of 4 channels, the 7 x 7
//! stride-2 filter as 4 x 4 taps of 16 channels at stride 1), its bias and ReLU, and the 3 x 3
//! stride-2 max pool, without the convolution's output ever reaching memory: at ResNet-50's
//! batch 256 that output is 411 MB written by cuDNN and read back by the pool, and cuDNN's
//! kernel for 16 input channels ran at 161 TFLOP/s (run 115's profile). A module of its own,
//! loaded only by a program that has such a step.

use super::gemm::TENSOR_CORES;
use gpukit_cuda::kernel::{tag, Arg, KernelModule, KernelSource, Launch, HALF};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};
use gpukit_types::DType;

/// The kernel (after the prelude and the tensor-core helpers).
pub(super) const SOURCE: &str = r#"
// Pairs of 16-bit values in 32 bits: their maxima, and two f32 values rounded into a pair.
template <class T> struct Pair;
template <> struct Pair<H> {
    static __device__ __forceinline__ unsigned max(unsigned a, unsigned b) {
        unsigned r; asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
    }
};
template <> struct Pair<B> {
    static __device__ __forceinline__ unsigned max(unsigned a, unsigned b) {
        unsigned r; asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
    }
};

// y [n, pp, pq, 64] = the 3 x 3 max pool (stride 2, padding 1) of relu(conv(x, w) + bias): x
// channel-last [n, hb, wb, 16], w [64, 4, 4, 16] (k, r, s, c); the convolution 4 x 4 at stride
// 1, unpadded, [n, hb - 3, wb - 3, 64], is never stored. ReLU's outputs are not negative, so a
// window's padding (and its cells past the map) counts as zero. A block (WM x 2 warps: a warp
// MT tiles of 16 convolution outputs by 32 channels) takes tiles of TP x TP pooled outputs in
// turn: the (2 TP + 1)^2 convolution outputs they read (from row 2 py0 - 1, column 2 px0 - 1)
// from the input tile of (2 TP + 4)^2 pixels staged by cp.async, mma.sync m16n8k16 a tap (16
// channels) at a time; then bias, ReLU and rounding into the shared convolution tile; then the
// pool. Dynamic shared memory: the filter (rows padded to SP_WS values), the input tile (each
// pixel's two 16-byte halves swapped in every other group of 4 pixels, against bank
// conflicts), the convolution tile (rows padded to SP_CS values). bias may be null. (Measured
// slower, decision 184: the input double-buffered with empty row tiles skipped, 20%; the f32
// image converted as it is staged instead of by the conversion step, 1-2% at batch 256.)
#define SP_WS 264
#define SP_CS 72
template <class T, int TP, int WM, int MT>
__device__ void stem_pool(const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ bias, T* __restrict__ y, int n, int hb, int wb,
                          int pp, int pq) {
    constexpr int TC = 2 * TP + 1, TI = TC + 3, M = TC * TC, NT = WM * 64;
    extern __shared__ __align__(16) unsigned char stem_shared[];
    T* ws = (T*)stem_shared;
    T* xs = ws + 64 * SP_WS;
    T* cs = xs + TI * TI * 16;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int nh = warp & 1, mg = warp >> 1, half = lane >> 4;
    let_next_grid_start();
    // the filter (a constant) before the wait
    for (int i = t; i < 64 * 32; i += NT)
        copy16(ws + (i >> 5) * SP_WS + (i & 31) * 8, w + i * 8, 16);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    wait_for_previous_grid();
    const int p = hb - 3, q = wb - 3;
    float bv[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            bv[j][e] = bias ? to_f(bias[nh * 32 + j * 8 + 2 * (lane & 3) + e]) : 0.0f;
    // the input pixel of the tile under this lane's row of each of its tiles (at tap 0, 0)
    int base[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int m = (mg * MT + i) * 16 + (lane & 15);
        base[i] = m < M ? (m / TC) * TI + m % TC : 0;
    }
    const int ty_n = (pp + TP - 1) / TP, tx_n = (pq + TP - 1) / TP;
    const long long tiles = (long long)n * ty_n * tx_n;
    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int tx = (int)(tile % tx_n);
        const long long rest = tile / tx_n;
        const int ty = (int)(rest % ty_n), img = (int)(rest / ty_n);
        const int py0 = ty * TP, px0 = tx * TP, cy0 = 2 * py0 - 1, cx0 = 2 * px0 - 1;
        for (int i = t; i < TI * TI * 2; i += NT) {
            const int pix = i >> 1, h = i & 1;
            const int iy = cy0 + pix / TI, ix = cx0 + pix % TI;
            const bool in = iy >= 0 && iy < hb && ix >= 0 && ix < wb;
            const T* src = in ? x + (((long long)img * hb + iy) * wb + ix) * 16 + h * 8 : x;
            copy16(xs + pix * 16 + ((h ^ ((pix >> 2) & 1)) << 3), src, in ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        float acc[MT][4][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
#pragma unroll 4
        for (int tap = 0; tap < 16; ++tap) {
            const int shift = (tap >> 2) * TI + (tap & 3);
            // lanes 8g..8g+7 give the rows of 8 x 8 matrix g: filters nh 32 + 16 jj + (g >> 1) 8
            // + lane % 8, the tap's channels (g & 1) 8..
            unsigned b[4][2];
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                unsigned r[4];
                ldmatrix4(r, ws + (nh * 32 + jj * 16 + (lane & 7) + ((lane >> 4) << 3)) * SP_WS +
                                 tap * 16 + ((lane >> 3) & 1) * 8);
                b[2 * jj][0] = r[0];
                b[2 * jj][1] = r[1];
                b[2 * jj + 1][0] = r[2];
                b[2 * jj + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int px = base[i] + shift;
                unsigned a[4];
                ldmatrix4(a, xs + px * 16 + ((half ^ ((px >> 2) & 1)) << 3));
#pragma unroll
                for (int j = 0; j < 4; ++j) Mma<T>::run(acc[i][j], a, b[j]);
            }
        }
        // bias, ReLU and rounding into the convolution tile
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int m = (mg * MT + i) * 16 + (lane >> 2) + hh * 8;
                if (m >= M) continue;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float v0 = fmaxf(acc[i][j][2 * hh] + bv[j][0], 0.0f);
                    const float v1 = fmaxf(acc[i][j][2 * hh + 1] + bv[j][1], 0.0f);
                    *(unsigned*)(cs + m * SP_CS + nh * 32 + j * 8 + 2 * (lane & 3)) =
                        Pair<T>::pack(v0, v1);
                }
            }
        __syncthreads();
        // the pool: a thread a group of 8 channels of a pooled output
        for (int i = t; i < TP * TP * 8; i += NT) {
            const int g = i & 7, pix = i >> 3, ly = pix / TP, lx = pix % TP;
            const int py = py0 + ly, px = px0 + lx;
            if (py >= pp || px >= pq) continue;
            Pack<unsigned, 4> mx;
#pragma unroll
            for (int e = 0; e < 4; ++e) mx.v[e] = 0u;
#pragma unroll
            for (int dy = 0; dy < 3; ++dy) {
                const int cy = 2 * ly + dy, gy = cy0 + cy;
                if (gy < 0 || gy >= p) continue;
#pragma unroll
                for (int dx = 0; dx < 3; ++dx) {
                    const int cx = 2 * lx + dx, gx = cx0 + cx;
                    if (gx < 0 || gx >= q) continue;
                    const Pack<unsigned, 4> v =
                        *(const Pack<unsigned, 4>*)(cs + (cy * TC + cx) * SP_CS + g * 8);
#pragma unroll
                    for (int e = 0; e < 4; ++e) mx.v[e] = Pair<T>::max(mx.v[e], v.v[e]);
                }
            }
            *(Pack<unsigned, 4>*)(y + (((long long)img * pp + py) * pq + px) * 64 + g * 8) = mx;
        }
        __syncthreads();
    }
}

#define STEM_POOL(T, TAG)                                                                      \
extern "C" __global__ void __launch_bounds__(256, 2) stem_pool8_##TAG(const T* x, const T* w, \
    const T* bias, T* y, int n, int hb, int wb, int pp, int pq)                                \
    { stem_pool<T, 8, 4, 5>(x, w, bias, y, n, hb, wb, pp, pq); }                               \
extern "C" __global__ void __launch_bounds__(128, 4) stem_pool4_##TAG(const T* x, const T* w, \
    const T* bias, T* y, int n, int hb, int wb, int pp, int pq)                                \
    { stem_pool<T, 4, 2, 3>(x, w, bias, y, n, hb, wb, pp, pq); }
STEM_POOL(H, f16)
STEM_POOL(B, bf16)
"#;

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-stem",
        source: format!("{HALF}{}{TENSOR_CORES}{SOURCE}", super::PRELUDE),
        names: [
            "stem_pool8_f16",
            "stem_pool8_bf16",
            "stem_pool4_f16",
            "stem_pool4_bf16",
        ]
        .map(String::from)
        .to_vec(),
    }
}

/// Input channels (2 x 2 blocks of 4), output channels and taps a side the kernel takes.
pub const STEM_CHANNELS: usize = 16;
pub const STEM_OUTPUTS: usize = 64;
pub const STEM_TAPS: usize = 4;

/// The pooled tile a block takes: 8 x 8 outputs (8 warps) or 4 x 4 (4 warps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StemTile {
    Eight,
    Four,
}

impl StemTile {
    /// Its side, its threads and its shared memory in bytes (filter, input tile,
    /// convolution tile).
    fn geometry(self) -> (usize, u32, u32) {
        let (side, threads) = match self {
            StemTile::Eight => (8, 256),
            StemTile::Four => (4, 128),
        };
        let (tc, ti) = (2 * side + 1, 2 * side + 4);
        let bytes = 2 * (STEM_OUTPUTS * 264 + ti * ti * STEM_CHANNELS + tc * tc * 72);
        (side, threads, bytes as u32)
    }

    /// Blocks that fit a multiprocessor (by shared memory and the kernel's launch bounds).
    fn per_multiprocessor(self) -> usize {
        match self {
            StemTile::Eight => 2,
            StemTile::Four => 4,
        }
    }

    /// The tile for a launch of `tiles8` 8 x 8 tiles on `sms` multiprocessors: 8 x 8 where
    /// those fill every multiprocessor's blocks, else 4 x 4 (four times as many blocks).
    pub fn for_work(tiles8: usize, sms: usize) -> StemTile {
        if tiles8 >= sms * StemTile::Eight.per_multiprocessor() {
            StemTile::Eight
        } else {
            StemTile::Four
        }
    }
}

/// The dims of a stem-and-pool launch: images, the blocked input's rows and columns, the
/// pooled output's rows and columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StemDims {
    pub n: usize,
    pub hb: usize,
    pub wb: usize,
    pub pp: usize,
    pub pq: usize,
}

impl StemDims {
    /// Whether the pooled dims are those of a 3 x 3 stride-2 max pool with padding 1 over
    /// the convolution's output (`hb - 3` x `wb - 3`), rounding down or up.
    pub fn consistent(&self) -> bool {
        // floor((conv + 2 - 3) / 2) + 1, or ceil's (whose last window still starts in the map)
        let pooled = |conv: usize, got: usize| {
            conv >= 1 && ((conv - 1) / 2 + 1 == got || (conv - 1).div_ceil(2) + 1 == got)
        };
        self.hb > STEM_TAPS
            && self.wb > STEM_TAPS
            && pooled(self.hb - 3, self.pp)
            && pooled(self.wb - 3, self.pq)
            && [self.n, self.hb, self.wb, self.pp, self.pq]
                .iter()
                .all(|&v| v < (1 << 30))
    }

    /// The 8 x 8 tiles of pooled outputs.
    pub fn tiles8(&self) -> usize {
        self.n * self.pp.div_ceil(8) * self.pq.div_ceil(8)
    }
}

/// The kernel on one device.
pub struct StemPool {
    module: KernelModule,
    sms: usize,
}

impl StemPool {
    /// Compiles the kernel for `gpu` (or reads it from the cache) and loads it.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<StemPool> {
        let sms = gpukit_cuda::driver::device_attributes(gpu.ordinal, 1)?.sm_count as usize;
        Ok(StemPool {
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
            sms: sms.max(1),
        })
    }

    /// The tile a launch of `dims` takes.
    pub fn tile_for(&self, dims: &StemDims) -> StemTile {
        StemTile::for_work(dims.tiles8(), self.sms)
    }

    /// `y = maxpool(relu(conv(x, w) + bias))` on `stream` (see the module): x `[n, hb, wb,
    /// 16]`, w `[64, 4, 4, 16]`, y `[n, pp, pq, 64]`, all dense channel-last, in tiles of
    /// `tile`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        stream: &Stream,
        dtype: DType,
        (x, w, bias, y): (View<'_>, View<'_>, Option<View<'_>>, View<'_>),
        dims: &StemDims,
        tile: StemTile,
    ) -> Result<()> {
        if !matches!(dtype, DType::F16 | DType::Bf16) {
            return Err(Error::Invalid(format!(
                "stem_pool takes f16 and bf16, not {dtype}"
            )));
        }
        if !dims.consistent() {
            return Err(Error::Invalid(format!(
                "stem_pool does not take {dims:?}: not a 3 x 3 stride-2 pool of a 4 x 4 \
                 convolution's output"
            )));
        }
        let e = dtype.size_bytes();
        x.require(
            dims.n * dims.hb * dims.wb * STEM_CHANNELS * e,
            "stem_pool x",
        )?;
        w.require(
            STEM_OUTPUTS * STEM_TAPS * STEM_TAPS * STEM_CHANNELS * e,
            "stem_pool w",
        )?;
        y.require(dims.n * dims.pp * dims.pq * STEM_OUTPUTS * e, "stem_pool y")?;
        if let Some(b) = bias {
            b.require(STEM_OUTPUTS * e, "stem_pool bias")?;
        }
        if ![x, w, y].iter().all(|v| v.is_aligned(16)) || bias.is_some_and(|b| !b.is_aligned(4)) {
            return Err(Error::Invalid(
                "stem_pool needs 16-byte aligned operands".into(),
            ));
        }
        let (side, threads, shared) = tile.geometry();
        let tiles = dims.n * dims.pp.div_ceil(side) * dims.pq.div_ceil(side);
        let blocks = tiles.min(self.sms * tile.per_multiprocessor()).max(1);
        let mut launch = Launch::new((blocks as u32, 1, 1), (threads, 1, 1)).starting_early();
        launch.shared_bytes = shared;
        let kernel = match tile {
            StemTile::Eight => "stem_pool8",
            StemTile::Four => "stem_pool4",
        };
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::opt(bias),
            Arg::Ptr(y),
            Arg::Size(dims.n),
            Arg::Size(dims.hb),
            Arg::Size(dims.wb),
            Arg::Size(dims.pp),
            Arg::Size(dims.pq),
        ];
        let name = format!("{kernel}_{}", tag(dtype));
        self.module.launch(&name, stream, launch, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_what_the_launcher_passes() {
        let expected = [
            ("stem_pool8_", "p p p p i i i i i"),
            ("stem_pool4_", "p p p p i i i i i"),
        ];
        let differences = kernel_source().signature_differences(&expected, &["f16", "bf16"]);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn shared_memory_fits_the_blocks_a_multiprocessor_is_meant_to_hold() {
        // an H100's multiprocessor has 228 KiB, 1 KiB of it reserved a block
        for tile in [StemTile::Eight, StemTile::Four] {
            let (side, threads, bytes) = tile.geometry();
            let blocks = tile.per_multiprocessor() as u32;
            assert!(
                blocks * (bytes + 1024) <= 228 * 1024,
                "{tile:?}: {bytes} bytes"
            );
            // registers: 64K a multiprocessor, the launch bounds' 128 a thread or fewer
            assert!(blocks * threads * 128 <= 65536);
            assert!(side == 8 || side == 4);
        }
        // the 8 x 8 tile: 88,208 bytes (filter 33,792, input 12,800, convolution 41,616)
        assert_eq!(StemTile::Eight.geometry().2, 88_208);
    }

    #[test]
    fn small_batches_take_the_small_tile() {
        // ResNet-50 at batch 1: 7 x 7 tiles of 8 on 132 multiprocessors
        let dims = |n| StemDims {
            n,
            hb: 115,
            wb: 115,
            pp: 56,
            pq: 56,
        };
        assert_eq!(dims(1).tiles8(), 49);
        assert_eq!(StemTile::for_work(dims(1).tiles8(), 132), StemTile::Four);
        assert_eq!(StemTile::for_work(dims(32).tiles8(), 132), StemTile::Eight);
        assert!(dims(256).consistent());
        // ceil mode's extra row, and a map of other sizes
        assert!(StemDims { pp: 57, ..dims(1) }.consistent());
        assert!(!StemDims { pp: 55, ..dims(1) }.consistent());
        assert!(!StemDims { pp: 58, ..dims(1) }.consistent());
        assert!(!StemDims { hb: 3, ..dims(1) }.consistent());
    }
}
