//! Convolutions of f32 programs summed in f64 (decision 183): the f32 input unfolded into
//! rows of f64 (`exact_im2col`), multiplied by the filter in f64 on cuBLAS (the session's part:
//! every f32 x f32 product is exact in f64 and the sums round at 2^-53, where f32 sums of a few
//! hundred products drift by 1e-6 and more), and the f64 products rounded once into the f32
//! output with the bias, the residual and the activation (`exact_epilogue`). A module of its
//! own, loaded only by a program that has such a convolution.
//!
//! Both kernels move 32 x 32 tiles of (output pixels x columns) through shared memory, so that
//! reads and writes are coalesced in either layout: along the columns (channels) where the
//! image is channel-last, along the pixels where it is NCHW.

use super::super::Strided;
use super::geometry::{activation_code, dims_bytes, put};
use crate::graph::Activation;
use gpukit_cuda::kernel::{Arg, KernelModule, KernelSource, Launch};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};
use gpukit_tensor::ConvShape;

/// The kernels (after the prelude).
pub(super) const SOURCE: &str = r#"
// The output pixel m of an n x p x q map: its image, row and column.
__device__ __forceinline__ void exact_pixel(unsigned m, unsigned p, unsigned q, unsigned& img,
                                            unsigned& op, unsigned& oq) {
    img = m / (p * q);
    const unsigned pix = m - img * (p * q);
    op = pix / q;
    oq = pix - op * q;
}

// cols [rows, K] (f64, row-major) = x unfolded: row i is output pixel m0 + i of the
// convolution, column kk one tap (ti, tj) of one input channel ch in the filter's order:
// v[17] == 0 (KRSC, channel-last programs) kk = (ti * S + tj) * C + ch, else (KCRS)
// kk = (ch * R + ti) * S + tj. Zeros where a tap reads padding. x is [n, c, h, w] through its
// strides: v[0..4] dims, v[4..8] strides; v[8] p, v[9] q, v[10] R, v[11] S, v[12] stride,
// v[13] padding, v[14] K, v[15] m0, v[16] rows; v[18] != 0: x's fastest axis follows the
// pixels (NCHW), so a warp reads along the pixels, else along the columns. Block 32 x 8, grid
// x the tiles of 32 rows, y of 32 columns. Every index and offset fits 32 bits (the launcher
// checks).
__device__ void exact_im2col(const float* __restrict__ x, double* __restrict__ cols, Dims g) {
    __shared__ double tile[32][33];
    const long long* d = g.v;
    const unsigned c = (unsigned)d[1], h = (unsigned)d[2], w = (unsigned)d[3];
    const unsigned sn = (unsigned)d[4], sc = (unsigned)d[5], sh = (unsigned)d[6];
    const unsigned sw = (unsigned)d[7], p = (unsigned)d[8], q = (unsigned)d[9];
    const unsigned r = (unsigned)d[10], s = (unsigned)d[11], st = (unsigned)d[12];
    const int pad = (int)d[13];
    const unsigned K = (unsigned)d[14], m0 = (unsigned)d[15], rows = (unsigned)d[16];
    const bool krsc = d[17] == 0, pixels_fast = d[18] != 0;
    const unsigned r0 = blockIdx.x * 32, k0 = blockIdx.y * 32, tx = threadIdx.x;
    wait_for_previous_grid();
    for (unsigned u = threadIdx.y; u < 32; u += 8) {
        const unsigned a = pixels_fast ? tx : u, b = pixels_fast ? u : tx;
        const unsigned row = r0 + a, kk = k0 + b;
        double v = 0.0;
        if (row < rows && kk < K) {
            unsigned img, op, oq, ch, ti, tj;
            exact_pixel(m0 + row, p, q, img, op, oq);
            if (krsc) {
                const unsigned t = kk / c;
                ch = kk - t * c;
                ti = t / s;
                tj = t - ti * s;
            } else {
                const unsigned t = kk / s;
                tj = kk - t * s;
                ch = t / r;
                ti = t - ch * r;
            }
            const int yy = (int)(op * st + ti) - pad, xx = (int)(oq * st + tj) - pad;
            if (yy >= 0 && yy < (int)h && xx >= 0 && xx < (int)w)
                v = (double)x[img * sn + ch * sc + (unsigned)yy * sh + (unsigned)xx * sw];
        }
        tile[a][b] = v;
    }
    __syncthreads();
    for (unsigned u = threadIdx.y; u < 32; u += 8) {
        const unsigned row = r0 + u, kk = k0 + tx;
        if (row < rows && kk < K) cols[row * K + kk] = tile[u][tx];
    }
}

// y = act(out + bias (+ z)), rounded once to f32: out [rows, k] (f64, row-major) holds output
// pixels m0 .. m0 + rows; y and z are [n, k, p, q] through their strides: v[0..4] y's dims,
// v[4..8] y's strides, v[8..12] z's; v[12] m0, v[13] rows; v[14] != 0: y's fastest axis
// follows the pixels (NCHW). bias and z may be null; z may be y (each element is read before
// it is written, by the same thread). Block and grid as exact_im2col's (y: tiles of channels).
__device__ void exact_epilogue(const double* __restrict__ out, const float* __restrict__ bias,
                               const float* z, float* y, Dims g, int act, float alpha,
                               float beta) {
    __shared__ double tile[32][33];
    const long long* d = g.v;
    const unsigned k = (unsigned)d[1], p = (unsigned)d[2], q = (unsigned)d[3];
    const unsigned m0 = (unsigned)d[12], rows = (unsigned)d[13];
    const bool pixels_fast = d[14] != 0;
    const unsigned r0 = blockIdx.x * 32, k0 = blockIdx.y * 32, tx = threadIdx.x;
    wait_for_previous_grid();
    for (unsigned u = threadIdx.y; u < 32; u += 8) {
        const unsigned row = r0 + u, o = k0 + tx;
        tile[u][tx] = row < rows && o < k ? out[row * k + o] : 0.0;
    }
    __syncthreads();
    for (unsigned u = threadIdx.y; u < 32; u += 8) {
        const unsigned a = pixels_fast ? tx : u, b = pixels_fast ? u : tx;
        const unsigned row = r0 + a, o = k0 + b;
        if (row >= rows || o >= k) continue;
        unsigned img, op, oq;
        exact_pixel(m0 + row, p, q, img, op, oq);
        double v = tile[a][b];
        if (bias) v += (double)bias[o];
        if (z) v += (double)z[img * (unsigned)d[8] + o * (unsigned)d[9] + op * (unsigned)d[10] +
                              oq * (unsigned)d[11]];
        y[img * (unsigned)d[4] + o * (unsigned)d[5] + op * (unsigned)d[6] + oq * (unsigned)d[7]] =
            activate(act, (float)v, alpha, beta);
    }
}

extern "C" __global__ void exact_im2col_f32(const float* x, double* cols, Dims g)
    { exact_im2col(x, cols, g); }
extern "C" __global__ void exact_epilogue_f32(const double* out, const float* bias,
    const float* z, float* y, Dims g, int act, float alpha, float beta)
    { exact_epilogue(out, bias, z, y, g, act, alpha, beta); }
"#;

/// The module's kernels.
const KERNELS: [&str; 2] = ["exact_im2col_f32", "exact_epilogue_f32"];

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: "program-exact",
        source: format!("{}{SOURCE}", super::PRELUDE),
        names: KERNELS.iter().map(|k| k.to_string()).collect(),
    }
}

/// Bytes of f64 columns and products a piece of a convolution may take: the unfolded rows
/// and the products of one piece of the output's pixels.
pub const PIECE_BYTES: usize = 256 << 20;

/// How convolution `shape` is cut for its f64 sums: K (its columns), k (its outputs) and the
/// output pixels a piece (all of them where they fit [`PIECE_BYTES`]).
pub fn pieces(shape: &ConvShape) -> (usize, usize, usize) {
    let kk = shape.c / shape.groups.max(1) * shape.r * shape.s;
    let pixels = shape.n * shape.out_h() * shape.out_w();
    let per_row = 8 * (kk + shape.k);
    let rows = (PIECE_BYTES / per_row.max(1)).clamp(1, pixels.max(1));
    (kk, shape.k, rows)
}

/// Whether the kernels take convolution `shape` with input `x` and output `y` (one group,
/// views of the shape's dims, every index and offset within 31 bits).
pub fn takes(shape: &ConvShape, x: &Strided, y: &Strided) -> bool {
    let small = |v: usize| v < (1 << 31);
    let (kk, k, rows) = pieces(shape);
    let (p, q) = (shape.out_h(), shape.out_w());
    shape.groups == 1
        && x.dims == [shape.n, shape.c, shape.h, shape.w]
        && y.dims == [shape.n, shape.k, p, q]
        && small(shape.n * shape.out_h() * shape.out_w())
        && small(x.span())
        && small(y.span())
        && small(rows * kk)
        && small(rows * k)
}

/// Whether the view's fastest axis is the image's width (NCHW): the kernels then read or write
/// along the pixels.
fn pixels_fast(s: &Strided) -> bool {
    s.strides[3] == 1 && s.dims[3] > 1 && s.strides[1] != 1
}

/// The tiles of `rows` pixels by `cols` columns: block 32 x 8.
fn tiles(rows: usize, cols: usize) -> Launch {
    Launch::new(
        (rows.div_ceil(32) as u32, cols.div_ceil(32) as u32, 1),
        (32, 8, 1),
    )
}

/// The compiled kernels on one device.
pub struct ExactKernels {
    stream: Stream,
    module: KernelModule,
}

impl ExactKernels {
    /// Compiles the kernels for `gpu` (or reads them from the cache) and loads them.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<ExactKernels> {
        Ok(ExactKernels {
            stream: gpu.stream().clone(),
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
        })
    }

    fn run(&self, name: &str, launch: Launch, args: &[Arg<'_>]) -> Result<()> {
        self.module
            .launch(name, &self.stream, launch.starting_early(), args)
    }

    /// `cols` (f64 `[rows, K]`) = output pixels `m0 .. m0 + rows` of convolution `shape`
    /// unfolded from `x` (f32, `[n, c, h, w]` through `sx`), columns in the order of the
    /// filter (`krsc`: KRSC, else KCRS).
    pub fn im2col(
        &self,
        shape: &ConvShape,
        (x, sx): (View<'_>, &Strided),
        cols: View<'_>,
        krsc: bool,
        (m0, rows): (usize, usize),
    ) -> Result<()> {
        let (kk, _, _) = pieces(shape);
        x.require(sx.span() * 4, "im2col x")?;
        cols.require(rows * kk * 8, "im2col columns")?;
        if sx.dims != [shape.n, shape.c, shape.h, shape.w] {
            return Err(Error::Invalid(format!(
                "im2col: an input of {:?} for {shape:?}",
                sx.dims
            )));
        }
        let mut v = [0i64; 32];
        put(&mut v, 0, &sx.dims);
        put(&mut v, 4, &sx.strides);
        put(
            &mut v,
            8,
            &[
                shape.out_h(),
                shape.out_w(),
                shape.r,
                shape.s,
                shape.stride,
                shape.pad,
                kk,
                m0,
                rows,
                usize::from(!krsc),
                usize::from(pixels_fast(sx)),
            ],
        );
        let bytes = dims_bytes(&v);
        let args = [Arg::Ptr(x), Arg::Ptr(cols), Arg::Struct("Dims", &bytes)];
        self.run("exact_im2col_f32", tiles(rows, kk), &args)
    }

    /// `y = act(out + bias (+ z))` rounded to f32 for output pixels `m0 .. m0 + rows`: `out`
    /// f64 `[rows, k]`, `y` and `z` `[n, k, p, q]` through their strides.
    pub fn epilogue(
        &self,
        out: View<'_>,
        bias: Option<View<'_>>,
        z: Option<(View<'_>, &Strided)>,
        act: Option<Activation>,
        (y, sy): (View<'_>, &Strided),
        (m0, rows): (usize, usize),
    ) -> Result<()> {
        let k = sy.dims[1];
        out.require(rows * k * 8, "epilogue products")?;
        y.require(sy.span() * 4, "epilogue y")?;
        if let Some(b) = bias {
            b.require(k * 4, "epilogue bias")?;
        }
        let mut v = [0i64; 32];
        put(&mut v, 0, &sy.dims);
        put(&mut v, 4, &sy.strides);
        if let Some((zv, sz)) = z {
            if sz.dims != sy.dims {
                return Err(Error::Invalid(format!(
                    "epilogue: a residual of {:?} for an output of {:?}",
                    sz.dims, sy.dims
                )));
            }
            zv.require(sz.span() * 4, "epilogue z")?;
            put(&mut v, 8, &sz.strides);
        }
        put(&mut v, 12, &[m0, rows, usize::from(pixels_fast(sy))]);
        let bytes = dims_bytes(&v);
        let (code, alpha, beta) = activation_code(act);
        let args = [
            Arg::Ptr(out),
            Arg::opt(bias),
            Arg::opt(z.map(|(v, _)| v)),
            Arg::Ptr(y),
            Arg::Struct("Dims", &bytes),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(beta),
        ];
        self.run("exact_epilogue_f32", tiles(rows, k), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_tensor::Layout;

    fn shape(n: usize, c: usize, hw: usize, k: usize, r: usize, stride: usize) -> ConvShape {
        ConvShape {
            n,
            c,
            h: hw,
            w: hw,
            k,
            r,
            s: r,
            stride,
            pad: r / 2,
            groups: 1,
        }
    }

    #[test]
    fn pieces_hold_at_most_their_bytes_and_cover_small_maps_at_once() {
        // ResNet-50's stem at batch 256: 3.2M pixels of 147 columns and 64 outputs
        let stem = shape(256, 3, 224, 64, 7, 2);
        let (kk, k, rows) = pieces(&stem);
        assert_eq!((kk, k), (147, 64));
        assert!(rows * 8 * (kk + k) <= PIECE_BYTES);
        assert!(rows < 256 * 112 * 112 && rows > 100_000);
        // a small map: every pixel in one piece
        assert_eq!(pieces(&shape(2, 64, 14, 64, 3, 1)).2, 2 * 14 * 14);
    }

    #[test]
    fn the_kernels_take_one_group_and_32_bit_offsets() {
        let s = shape(32, 64, 56, 64, 3, 1);
        let x = Strided::image([32, 64, 56, 56], Layout::Nhwc);
        assert!(takes(&s, &x, &x));
        assert!(!takes(&ConvShape { groups: 2, ..s }, &x, &x));
        assert!(
            !takes(&ConvShape { k: 32, ..s }, &x, &x),
            "an output of other dims"
        );
        let big = shape(2048, 512, 56, 64, 1, 1);
        let xb = Strided::image([2048, 512, 56, 56], Layout::Nhwc);
        let yb = Strided::image([2048, 64, 56, 56], Layout::Nhwc);
        assert!(!takes(&big, &xb, &yb), "an input past 2^31 elements");
        // NCHW reads along the pixels, channel-last along the channels
        assert!(pixels_fast(&Strided::image([2, 8, 5, 5], Layout::Nchw)));
        assert!(!pixels_fast(&x));
    }

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        let expected = [
            ("exact_im2col_f32", "p p s"),
            ("exact_epilogue_f32", "p p p p s i f f"),
        ];
        let differences = kernel_source().signature_differences(&expected, &[]);
        assert!(differences.is_empty(), "{differences:#?}");
    }
}
