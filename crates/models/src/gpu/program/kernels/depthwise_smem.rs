//! An experiment, off unless `GPUKIT_DW_SMEM=1`: a 7x7 depthwise convolution of stride 1 over a
//! tile staged once in shared memory as f32 (the row kernels convert each input value to f32
//! about 2.5 times and each tap once a row: 0.6 conversions an FMA at ConvNeXt's shapes). A
//! module of its own, loaded only when asked, so that the default engine's cold compile does
//! not grow; planning times it beside the other depthwise kernels where it is loaded, and
//! `ProgramKernels::depthwise_variant` runs it by name.

use super::ProgramKernels;
use gpukit_cuda::kernel::{KernelModule, KernelSource, Launch, HALF};
use gpukit_cuda::Result;
use gpukit_tensor::ConvShape;

/// Output rows, output columns and channels a block; outputs of a row a thread.
const TH: usize = 8;
const TW: usize = 16;
const CB: usize = 32;
const P: usize = 8;

/// The kernels (after the prelude).
pub(super) const SOURCE: &str = r#"
// y = act(conv(x) + bias (+ z)), an S x S filter of stride 1, all channel-last and dense (x
// [n, h, w, c], taps [S, S, c], y and z [n, p, q, c]). A block: an 8 x 16 tile of outputs and
// 32 channels of one image, its (8 + S - 1) x (16 + S - 1) input patch and its taps staged in
// shared memory as f32 (zeros outside the image and past the channels), channel fastest. A
// thread: one channel (its lane) and 8 outputs of one row of the tile (warp w: row w / 2,
// half w % 2). v[] as the other depthwise kernels': v[0..4] n, h, w, c; v[4], v[5] p, q; v[9]
// padding. Grid: x the tiles (row-major over ceil(p / 8) x ceil(q / 16)), y the groups of 32
// channels, z the images. 512 threads. Every index fits 31 bits (the launcher checks).
template <class T, int S>
__device__ void depthwise_smem(const T* __restrict__ x, const T* __restrict__ w,
                               const T* __restrict__ bias, const T* __restrict__ z,
                               T* __restrict__ y, Dims g, int act, float alpha, float beta) {
    constexpr int TH = 8, TW = 16, CB = 32, P = 8, PH = TH + S - 1, PW = TW + S - 1;
    extern __shared__ __align__(16) float dw_smem[];
    float* xs = dw_smem;             // [PH * PW][CB]
    float* ws = xs + PH * PW * CB;   // [S * S][CB]
    const long long* d = g.v;
    const int h = (int)d[1], wd = (int)d[2], c = (int)d[3], p = (int)d[4], q = (int)d[5];
    const int pad = (int)d[9];
    const int tiles_q = (q + TW - 1) / TW;
    const int ti0 = (int)(blockIdx.x / tiles_q) * TH, tj0 = (int)(blockIdx.x % tiles_q) * TW;
    const int c0 = (int)blockIdx.y * CB, img = (int)blockIdx.z;
    // the launcher's 512 threads each load LOADS values of the patch, all issued before any is
    // stored (a loop of load-then-store waits on each load in turn)
    constexpr int NT = 512, SPAN = PH * PW * CB, LOADS = (SPAN + NT - 1) / NT;
    const int t = threadIdx.x;
    let_next_grid_start();
    // the taps (weights) before the wait for the kernel ahead, the patch after
    for (int u = t; u < S * S * CB; u += NT) {
        const int tap = u / CB, ch = c0 + u % CB;
        ws[u] = ch < c ? to_f(w[(unsigned)tap * c + ch]) : 0.0f;
    }
    wait_for_previous_grid();
    float buf[LOADS];
#pragma unroll
    for (int it = 0; it < LOADS; ++it) {
        const int u = t + it * NT, pix = u / CB, ch = c0 + u % CB;
        const int yy = ti0 - pad + pix / PW, xx = tj0 - pad + pix % PW;
        const bool in = u < SPAN && ch < c && yy >= 0 && yy < h && xx >= 0 && xx < wd;
        buf[it] = in ? to_f(x[((unsigned)(img * h + yy) * wd + xx) * c + ch]) : 0.0f;
    }
#pragma unroll
    for (int it = 0; it < LOADS; ++it)
        if (t + it * NT < SPAN) xs[t + it * NT] = buf[it];
    __syncthreads();
    const int lane = t & 31, warp = t >> 5;
    const int il = warp / (TW / P), jl = (warp % (TW / P)) * P;
    const int ch = c0 + lane;
    if (il >= TH) return;
    float acc[P];
#pragma unroll
    for (int k = 0; k < P; ++k) acc[k] = 0.0f;
#pragma unroll
    for (int di = 0; di < S; ++di) {
        float win[P + S - 1];
#pragma unroll
        for (int u = 0; u < P + S - 1; ++u) win[u] = xs[((il + di) * PW + jl + u) * CB + lane];
#pragma unroll
        for (int dj = 0; dj < S; ++dj) {
            const float tap = ws[(di * S + dj) * CB + lane];
#pragma unroll
            for (int k = 0; k < P; ++k) acc[k] += win[k + dj] * tap;
        }
    }
    const int i = ti0 + il;
    if (ch >= c || i >= p) return;
    const float b = bias ? to_f(bias[ch]) : 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
        const int j = tj0 + jl + k;
        if (j >= q) break;
        const unsigned at = ((unsigned)(img * p + i) * q + j) * c + ch;
        float v = acc[k] + b;
        if (z) v += to_f(z[at]);
        y[at] = from_f<T>(activate(act, v, alpha, beta));
    }
}

#define DW_SMEM(T, TAG, S)                                                                     \
extern "C" __global__ void depthwise_smem##S##_##TAG(const T* x, const T* w, const T* bias,     \
    const T* z, T* y, Dims g, int act, float alpha, float beta)                                \
    { depthwise_smem<T, S>(x, w, bias, z, y, g, act, alpha, beta); }

DW_SMEM(float, f32, 7)
DW_SMEM(H, f16, 7)
DW_SMEM(B, bf16, 7)
"#;

/// The kernels' names without their element type tag.
pub const VARIANTS: [&str; 1] = ["depthwise_smem7"];

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-depthwise-smem",
        source: format!("{HALF}{}{SOURCE}", super::PRELUDE),
        names: super::tagged(&VARIANTS),
    }
}

/// Whether the experiment is on (`GPUKIT_DW_SMEM=1`).
pub fn enabled() -> bool {
    std::env::var("GPUKIT_DW_SMEM").is_ok_and(|v| v == "1")
}

/// The launch of `depthwise_smem7` for `shape`, where it runs it: one 7x7 filter a channel,
/// stride 1, at most 65,535 images, every index within 31 bits.
pub fn launch(shape: &ConvShape) -> Option<Launch> {
    let fits = super::depthwise::depthwise_runs(shape)
        && (shape.r, shape.s, shape.stride) == (7, 7, 1)
        && shape.n <= 65_535;
    if !fits {
        return None;
    }
    let (p, q) = (shape.out_h(), shape.out_w());
    let tiles = p.div_ceil(TH) * q.div_ceil(TW);
    let patch = (TH + shape.r - 1) * (TW + shape.s - 1) + shape.r * shape.s;
    Some(Launch {
        shared_bytes: (patch * CB * 4) as u32,
        ..Launch::new(
            (tiles as u32, shape.c.div_ceil(CB) as u32, shape.n as u32),
            ((CB * TH * TW / P) as u32, 1, 1),
        )
    })
}

impl ProgramKernels {
    /// Compiles (or reads from the cache) and loads the experiment's kernels.
    pub fn load_depthwise_smem(
        &mut self,
        discovery: &gpukit_cuda::loader::Discovery,
        gpu: &gpukit_cuda::Gpu,
    ) -> Result<()> {
        if self.depthwise_smem.is_none() {
            self.depthwise_smem = Some(KernelModule::load(discovery, gpu, &kernel_source())?);
        }
        Ok(())
    }

    /// Whether the experiment's kernels are loaded.
    pub fn has_depthwise_smem(&self) -> bool {
        self.depthwise_smem.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::super::depthwise::tests::convnext;
    use super::*;

    #[test]
    fn a_block_a_tile_and_32_channels_within_48_kib() {
        // ConvNeXt-T's first stage at batch 32: 7 x 4 tiles of 8 x 16, 3 groups of channels
        let l = launch(&convnext(32, 96, 56)).expect("7x7 stride 1");
        assert_eq!((l.grid, l.block.0), ((28, 3, 32), 512));
        assert_eq!(l.shared_bytes as usize, (14 * 22 + 49) * 32 * 4);
        assert!(l.shared_bytes <= 48 * 1024);
        // 9x9 outputs: two tiles of rows; 40 channels: a second group, its lanes past them idle
        assert_eq!(launch(&convnext(1, 40, 9)).unwrap().grid, (2, 2, 1));
        // other filters and strides: not this kernel
        let b = convnext(2, 96, 14);
        assert!(launch(&ConvShape { stride: 2, ..b }).is_none());
        assert!(launch(&ConvShape {
            r: 5,
            s: 5,
            pad: 2,
            ..b
        })
        .is_none());
        assert!(launch(&ConvShape { groups: 1, ..b }).is_none());
    }

    #[test]
    fn the_kernels_take_what_the_launcher_passes() {
        let expected = [("depthwise_smem7_", "p p p p p s i f f")];
        let differences = kernel_source().signature_differences(&expected, &super::super::TAGS);
        assert!(differences.is_empty(), "{differences:#?}");
    }
}
