//! Depthwise convolution (one filter per channel) on gpukit's own kernel, for channel-last
//! tensors: `y = act(conv(x) + bias (+ z))` in one pass. cuDNN's fused engines run these
//! convolutions on a grouped direct kernel at a tenth of the memory's speed, and its bare ones
//! leave the epilogue to another pass; here a thread computes a vector of channels of one
//! output pixel (16-byte loads), accumulating in f32, with the bias, residual and activation
//! applied before the single store.

use super::{activation_code, dims_bytes, put, ProgramKernels, HALF, PRELUDE};
use crate::graph::Activation;
use gpukit_cuda::kernel::{grid_for, tag, Arg, KernelModule, KernelSource};
use gpukit_cuda::{Error, Result, View};
use gpukit_tensor::ConvShape;
use gpukit_types::DType;

const SOURCE: &str = r#"
template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

// x [n, h, w, c], taps [r, s, c], y and z [n, p, q, c], all dense channel-last; bias [c].
// v[0..4] n, h, w, c; v[4], v[5] p, q; v[6], v[7] r, s; v[8] stride; v[9] padding (all sides).
// Thread o computes channels [V * (o % (c / V)), +V) of output pixel o / (c / V). Every index
// fits 31 bits (the launcher checks).
template <class T, int V>
__device__ void depthwise(const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ bias, const T* __restrict__ z, T* __restrict__ y,
                          Dims g, int act, float alpha, float beta) {
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
        unsigned at = pixel * c + ch;
        Pack<T, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            float v = acc[k];
            if (bias) v += to_f(bias[ch + k]);
            if (z) v += to_f(z[at + k]);
            out.v[k] = from_f<T>(activate(act, v, alpha, beta));
        }
        *(Pack<T, V>*)(y + at) = out;
    }
}

#define DEPTHWISE(T, TAG, V)                                                                   \
extern "C" __global__ void depthwise_vec_##TAG(const T* x, const T* w, const T* bias,           \
    const T* z, T* y, Dims g, int act, float alpha, float beta)                                \
    { depthwise<T, V>(x, w, bias, z, y, g, act, alpha, beta); }                                 \
extern "C" __global__ void depthwise_one_##TAG(const T* x, const T* w, const T* bias,           \
    const T* z, T* y, Dims g, int act, float alpha, float beta)                                \
    { depthwise<T, 1>(x, w, bias, z, y, g, act, alpha, beta); }

DEPTHWISE(float, f32, 4)
DEPTHWISE(H, f16, 8)
DEPTHWISE(B, bf16, 8)
"#;

/// The module: its name in the kernel cache, its source and its kernels.
pub fn kernel_source() -> KernelSource {
    let names = ["f32", "f16", "bf16"]
        .iter()
        .flat_map(|t| ["depthwise_vec", "depthwise_one"].map(|k| format!("{k}_{t}")))
        .collect();
    KernelSource {
        stem: "program-depthwise",
        source: format!("{HALF}{PRELUDE}{SOURCE}"),
        names,
    }
}

/// Channels a thread of `depthwise_vec` computes for element type `dtype`.
fn vector(dtype: DType) -> usize {
    16 / dtype.size_bytes()
}

/// Whether the kernel runs `shape`: one filter per channel, and every index within 31 bits.
pub fn runs(shape: &ConvShape) -> bool {
    let fits = |n: usize| n < (1 << 31);
    shape.groups == shape.c
        && shape.k == shape.c
        && fits(shape.n * shape.c * shape.h * shape.w)
        && fits(shape.n * shape.k * shape.out_h() * shape.out_w())
}

/// Loads the module for `gpu`.
pub(super) fn load(
    discovery: &gpukit_cuda::loader::Discovery,
    gpu: &gpukit_cuda::Gpu,
) -> Result<KernelModule> {
    KernelModule::load(discovery, gpu, &kernel_source())
}

impl ProgramKernels {
    /// `y = act(depthwise(x, taps) + bias (+ z))`, all channel-last and dense; `taps` is
    /// `[r, s, c]`.
    #[allow(clippy::too_many_arguments)]
    pub fn depthwise(
        &self,
        dtype: DType,
        shape: &ConvShape,
        x: View<'_>,
        taps: View<'_>,
        bias: Option<View<'_>>,
        z: Option<View<'_>>,
        act: Option<Activation>,
        y: View<'_>,
    ) -> Result<()> {
        if !runs(shape) {
            return Err(Error::Invalid(format!(
                "the depthwise kernel does not run {shape:?}"
            )));
        }
        let e = dtype.size_bytes();
        let (p, q) = (shape.out_h(), shape.out_w());
        let out = shape.n * shape.k * p * q;
        x.require(shape.n * shape.c * shape.h * shape.w * e, "depthwise x")?;
        taps.require(shape.r * shape.s * shape.c * e, "depthwise taps")?;
        y.require(out * e, "depthwise y")?;
        if let Some(b) = bias {
            b.require(shape.c * e, "depthwise bias")?;
        }
        if let Some(z) = z {
            z.require(out * e, "depthwise z")?;
        }
        let v = vector(dtype);
        let aligned = [Some(x), Some(taps), z, Some(y)]
            .into_iter()
            .flatten()
            .all(|b| b.is_aligned(16));
        let (stem, v) = if shape.c % v == 0 && aligned {
            ("depthwise_vec", v)
        } else {
            ("depthwise_one", 1)
        };
        let mut dims = [0i64; 32];
        put(
            &mut dims,
            0,
            &[
                shape.n,
                shape.h,
                shape.w,
                shape.c,
                p,
                q,
                shape.r,
                shape.s,
                shape.stride,
                shape.pad,
            ],
        );
        let bytes = dims_bytes(&dims);
        let (code, alpha, beta) = activation_code(act);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(taps),
            Arg::opt(bias),
            Arg::opt(z),
            Arg::Ptr(y),
            Arg::Struct("Dims", &bytes),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(beta),
        ];
        let name = format!("{stem}_{}", tag(dtype));
        self.depthwise_module
            .launch(&name, &self.stream, grid_for(out / v), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_what_the_launcher_passes() {
        let expected = [
            ("depthwise_vec_", "p p p p p s i f f"),
            ("depthwise_one_", "p p p p p s i f f"),
        ];
        let differences = kernel_source().signature_differences(&expected, &["f32", "f16", "bf16"]);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn only_one_filter_a_channel_runs() {
        let shape = ConvShape {
            n: 2,
            c: 8,
            h: 5,
            w: 5,
            k: 8,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
            groups: 8,
        };
        assert!(runs(&shape));
        assert!(!runs(&ConvShape { groups: 4, ..shape }));
        assert!(!runs(&ConvShape { k: 16, ..shape }));
    }
}
