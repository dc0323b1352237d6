//! Layer normalization of contiguous rows (ConvNeXt's, over each pixel's channels): a warp a
//! row, or, for rows of whole 16-byte vectors, a group of lanes a row holding its values in
//! registers; each kernel by name for timing them against one another.

use super::ProgramKernels;
use gpukit_cuda::kernel::{Arg, Launch};
use gpukit_cuda::{Error, Result, View};
use gpukit_types::DType;

/// The layer norm's kernels (put before the module's instances).
pub(super) const SOURCE: &str = r#"
// Layer normalization of `rows` contiguous rows of `cols` values, a warp per row, statistics in
// f32: y = (x - mean) / sqrt(var + eps) * gamma (+ beta). beta may be null.
template <class T>
__device__ void layer_norm(const T* x, const T* __restrict__ gamma, const T* __restrict__ beta,
                           T* y, long long rows, int cols, float eps) {
    let_next_grid_start();
    wait_for_previous_grid();
    int lane = threadIdx.x & 31;
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long row = warp; row < rows; row += warps) {
        const T* xr = x + row * cols;
        T* yr = y + row * cols;
        float s = 0.0f;
        for (int k = lane; k < cols; k += 32) s += to_f(xr[k]);
        float mean = __shfl_sync(0xffffffffu, warp_sum(s), 0) / (float)cols;
        float q = 0.0f;
        for (int k = lane; k < cols; k += 32) { float e = to_f(xr[k]) - mean; q += e * e; }
        float var = __shfl_sync(0xffffffffu, warp_sum(q), 0) / (float)cols;
        float rstd = rsqrtf(var + eps);
        for (int k = lane; k < cols; k += 32) {
            float v = (to_f(xr[k]) - mean) * rstd * to_f(gamma[k]);
            if (beta) v += to_f(beta[k]);
            yr[k] = from_f<T>(v);
        }
    }
}

// The same for rows of cols = V * vectors values (16-byte aligned): a group of `group` lanes (a
// power of 2 dividing 32) per row, each holding up to NP vectors of its row in registers, so x
// is read once; 32 / group rows a warp. EARLY: the scale and shift loaded with x (one wait on
// memory, not two; NP x 2 vectors of registers more).
template <class T, int V, int NP, bool EARLY>
__device__ void layer_norm_vec(const T* __restrict__ x, const T* __restrict__ gamma,
                               const T* __restrict__ beta, T* __restrict__ y, long long rows,
                               int cols, float eps, int group) {
    let_next_grid_start();
    const int lane = threadIdx.x & 31, sub = lane % group, per_warp = 32 / group;
    const int vecs = cols / V;
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long first = warp * per_warp; first < rows; first += warps * per_warp) {
        const long long row = first + lane / group;
        const bool live = row < rows;
        float v[NP][V];
        float s = 0.0f;
        Pack<T, V> gs[EARLY ? NP : 1], bs[EARLY ? NP : 1];
#pragma unroll
        for (int p = 0; p < (EARLY ? NP : 0); ++p) {
            const int k = sub + p * group;
            if (live && k < vecs) {
                gs[p] = *(const Pack<T, V>*)(gamma + k * V);
                if (beta) bs[p] = *(const Pack<T, V>*)(beta + k * V);
            }
        }
        wait_for_previous_grid();  // the scale and shift (weights) may load before
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            const int k = sub + p * group;
            if (live && k < vecs) {
                Pack<T, V> xv = *(const Pack<T, V>*)(x + row * cols + k * V);
#pragma unroll
                for (int u = 0; u < V; ++u) { v[p][u] = to_f(xv.v[u]); s += v[p][u]; }
            } else {
#pragma unroll
                for (int u = 0; u < V; ++u) v[p][u] = 0.0f;
            }
        }
        for (int o = group / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float mean = s / (float)cols;
        float q = 0.0f;
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            if (live && sub + p * group < vecs) {
#pragma unroll
                for (int u = 0; u < V; ++u) { float e = v[p][u] - mean; q += e * e; }
            }
        }
        for (int o = group / 2; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
        const float rstd = rsqrtf(q / (float)cols + eps);
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            const int k = sub + p * group;
            if (!live || k >= vecs) continue;
            Pack<T, V> g, b;
            if (EARLY) {
                g = gs[EARLY ? p : 0];
                if (beta) b = bs[EARLY ? p : 0];
            } else {
                g = *(const Pack<T, V>*)(gamma + k * V);
                if (beta) b = *(const Pack<T, V>*)(beta + k * V);
            }
            Pack<T, V> out;
#pragma unroll
            for (int u = 0; u < V; ++u) {
                float r = (v[p][u] - mean) * rstd * to_f(g.v[u]);
                if (beta) r += to_f(b.v[u]);
                out.v[u] = from_f<T>(r);
            }
            *(Pack<T, V>*)(y + row * cols + k * V) = out;
        }
    }
}

#define LAYER_NORMS(T, TAG)                                                                    \
extern "C" __global__ void layer_norm_##TAG(const T* x, const T* gamma, const T* beta, T* y,   \
    long long rows, int cols, float eps) { layer_norm<T>(x, gamma, beta, y, rows, cols, eps); } \
extern "C" __global__ void layer_norm_vec_##TAG(const T* x, const T* gamma, const T* beta,     \
    T* y, long long rows, int cols, float eps, int group)                                     \
    { layer_norm_vec<T, 16 / sizeof(T), 4, true>(x, gamma, beta, y, rows, cols, eps, group); } \
extern "C" __global__ void layer_norm_vec_late_##TAG(const T* x, const T* gamma,               \
    const T* beta, T* y, long long rows, int cols, float eps, int group)                       \
    { layer_norm_vec<T, 16 / sizeof(T), 4, false>(x, gamma, beta, y, rows, cols, eps, group); }\
extern "C" __global__ void layer_norm_vec3_##TAG(const T* x, const T* gamma, const T* beta,    \
    T* y, long long rows, int cols, float eps, int group)                                     \
    { layer_norm_vec<T, 16 / sizeof(T), 3, true>(x, gamma, beta, y, rows, cols, eps, group); } \
extern "C" __global__ void layer_norm_vec3_late_##TAG(const T* x, const T* gamma,              \
    const T* beta, T* y, long long rows, int cols, float eps, int group)                       \
    { layer_norm_vec<T, 16 / sizeof(T), 3, false>(x, gamma, beta, y, rows, cols, eps, group); }
"#;

/// Every layer-norm kernel, by name (without the element type's tag).
pub const VARIANTS: [&str; 5] = [
    "layer_norm",
    "layer_norm_vec",
    "layer_norm_vec_late",
    "layer_norm_vec3",
    "layer_norm_vec3_late",
];

/// Rows from which the engine loads the scale and shift after the statistics: timed on an
/// H200 at ConvNeXt-T's rows, the late kernels took 11.4 / 6.3 / 3.9 us at 100,352 / 25,088 /
/// 6,272 rows where the early ones took 17.6 / 7.8 / 5.4 (fewer registers, more rows in
/// flight), 3.5 against 3.5 at 1,568, and 3.1 against 2.9 at 196 and 49 rows.
const LATE_FROM_ROWS: usize = 1024;

/// The kernel that runs `rows` rows of `vectors` 16-byte vectors (`vector`: rows of whole
/// aligned vectors, at most 4 a lane with `group` lanes a row): `variant` where it takes them
/// (the 3-vector kernels need at most 3 a lane), the engine's choice where `variant` is None
/// (the 3-vector kernels where they fit, the scale and shift loaded late from
/// [`LATE_FROM_ROWS`] rows).
fn kernel(
    variant: Option<&str>,
    vector: bool,
    vectors: usize,
    group: usize,
    rows: usize,
) -> Option<&'static str> {
    let three = vector && vectors.div_ceil(group) <= 3;
    let takes = |v: &str| match v {
        "layer_norm" => true,
        "layer_norm_vec" | "layer_norm_vec_late" => vector,
        "layer_norm_vec3" | "layer_norm_vec3_late" => three,
        _ => false,
    };
    match variant {
        None if !vector => Some("layer_norm"),
        None if rows < LATE_FROM_ROWS => Some("layer_norm_vec"),
        None if three => Some("layer_norm_vec3_late"),
        None => Some("layer_norm_vec_late"),
        Some(v) => VARIANTS.into_iter().find(|k| *k == v && takes(k)),
    }
}

impl ProgramKernels {
    /// Layer normalization of `rows` contiguous rows of `cols` values.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        dtype: DType,
        x: View<'_>,
        gamma: View<'_>,
        beta: Option<View<'_>>,
        y: View<'_>,
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        self.layer_norm_as(None, dtype, (x, gamma, beta, y), (rows, cols), eps)
    }

    /// [`ProgramKernels::layer_norm`] on the kernel `variant` names ([`VARIANTS`]) rather than
    /// the one it would choose, to time them against one another; an error where that kernel
    /// does not take the rows.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_variant(
        &self,
        variant: &str,
        dtype: DType,
        x: View<'_>,
        gamma: View<'_>,
        beta: Option<View<'_>>,
        y: View<'_>,
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        self.layer_norm_as(Some(variant), dtype, (x, gamma, beta, y), (rows, cols), eps)
    }

    fn layer_norm_as(
        &self,
        variant: Option<&str>,
        dtype: DType,
        (x, gamma, beta, y): (View<'_>, View<'_>, Option<View<'_>>, View<'_>),
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        let e = dtype.size_bytes();
        x.require(rows * cols * e, "layer norm x")?;
        y.require(rows * cols * e, "layer norm y")?;
        gamma.require(cols * e, "layer norm scale")?;
        if let Some(b) = beta {
            b.require(cols * e, "layer norm bias")?;
        }
        // rows of whole 16-byte vectors, at most 4 a lane: the vector kernel, a group of lanes
        // a row
        let width = 16 / e;
        let vectors = cols / width;
        let aligned = [Some(x), Some(gamma), beta, Some(y)]
            .into_iter()
            .flatten()
            .all(|b| b.is_aligned(16));
        let group = vectors.div_ceil(4).next_power_of_two().clamp(1, 32);
        let vector = cols.is_multiple_of(width)
            && vectors <= 4 * 32
            && aligned
            && beta.is_none_or(|b| b.is_aligned(16));
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(gamma),
            Arg::opt(beta),
            Arg::Ptr(y),
            Arg::Size(rows),
            Arg::Size(cols),
            Arg::F32(eps),
            Arg::I32(group as i32),
        ];
        let Some(stem) = kernel(variant, vector, vectors, group, rows) else {
            return Err(Error::Invalid(format!(
                "{} does not take {rows} rows of {cols} values",
                variant.unwrap_or("layer_norm")
            )));
        };
        let (args, rows_a_block) = match stem {
            "layer_norm" => (&args[..7], 8),
            _ => (&args[..], 8 * (32 / group)),
        };
        let blocks = rows.div_ceil(rows_a_block).clamp(1, 65_535 * 8) as u32;
        // every layer-norm kernel waits for the kernel ahead before it reads x or writes y
        let launch = Launch::new((blocks, 1, 1), (256, 1, 1)).starting_early();
        self.run(stem, dtype, launch, args)
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel, VARIANTS};

    #[test]
    fn a_named_kernel_takes_the_rows_it_fits() {
        // ConvNeXt-T's widths in f16: 12, 24, 48, 96 vectors, 4, 8, 16, 32 lanes a row
        for (vectors, group) in [(12, 4), (24, 8), (48, 16), (96, 32)] {
            for v in VARIANTS {
                assert_eq!(
                    kernel(Some(v), true, vectors, group, 196),
                    Some(v),
                    "{v} {vectors}"
                );
            }
        }
        // 4 vectors a lane: not the 3-vector kernels
        assert_eq!(kernel(Some("layer_norm_vec3"), true, 16, 4, 196), None);
        assert_eq!(
            kernel(Some("layer_norm_vec"), true, 16, 4, 196),
            Some("layer_norm_vec")
        );
        // rows not of whole vectors: the warp kernel only
        assert_eq!(kernel(Some("layer_norm_vec"), false, 12, 4, 196), None);
        assert_eq!(
            kernel(Some("layer_norm"), false, 12, 4, 196),
            Some("layer_norm")
        );
        // the engine's choice, and a name of no kernel
        assert_eq!(kernel(None, true, 12, 4, 196), Some("layer_norm_vec"));
        assert_eq!(kernel(None, false, 12, 4, 196), Some("layer_norm"));
        // many rows: the scale and shift loaded late, 3 vectors a lane where they fit
        assert_eq!(
            kernel(None, true, 12, 4, 100_352),
            Some("layer_norm_vec3_late")
        );
        assert_eq!(
            kernel(None, true, 16, 4, 100_352),
            Some("layer_norm_vec_late")
        );
        assert_eq!(kernel(None, false, 12, 4, 100_352), Some("layer_norm"));
        assert_eq!(kernel(Some("layer_norm_vec5"), true, 12, 4, 196), None);
    }
}
