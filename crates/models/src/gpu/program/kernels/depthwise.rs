//! The depthwise convolution's launcher: which of the channel-last module's kernels runs a
//! shape (a tile of outputs a block at small batches, rows of outputs a thread at larger ones,
//! else an output vector a thread), and each variant by name for timing them against one
//! another.

use super::channels_last::vector;
use super::{activation_code, dims_bytes, put, ProgramKernels};
use crate::graph::Activation;
use gpukit_cuda::kernel::{grid_for, tag, Arg, Launch};
use gpukit_cuda::{Error, Result, View};
use gpukit_tensor::ConvShape;
use gpukit_types::DType;

/// Threads below which `depthwise_rows` would leave the GPU idle (a row's outputs shared by
/// fewer threads): about two blocks of 128 an SM of the largest GPUs.
const ROWS_MIN_THREADS: usize = 16 * 1024;

/// What the row and tile kernels both take: stride 1, a square 3, 5 or 7 filter, channels in
/// whole 8-byte vectors, 8-byte aligned views.
fn square_stride_one(shape: &ConvShape, dtype: DType, views: &[Option<View<'_>>]) -> bool {
    square_rows(shape, dtype, views, 1)
}

/// What a row kernel of stride `stride` takes: that stride, a square 3, 5 or 7 filter,
/// channels in whole 8-byte vectors, 8-byte aligned views.
fn square_rows(shape: &ConvShape, dtype: DType, views: &[Option<View<'_>>], stride: usize) -> bool {
    shape.stride == stride
        && shape.r == shape.s
        && matches!(shape.r, 3 | 5 | 7)
        && shape.c.is_multiple_of(8 / dtype.size_bytes())
        && views.iter().flatten().all(|b| b.is_aligned(8))
}

/// The `depthwise_rows` kernel for `shape` and its thread count: stride 1, a square 3, 5 or 7
/// filter, channels in whole 8-byte vectors, 8-byte aligned views; four outputs a thread
/// where that leaves 32K threads or more, two where 16K or more, else None (the kernel a thread
/// an output serves small images better).
fn rows_variant(
    shape: &ConvShape,
    dtype: DType,
    views: &[Option<View<'_>>],
) -> Option<(String, usize)> {
    if !square_stride_one(shape, dtype, views) {
        return None;
    }
    let v = 8 / dtype.size_bytes();
    let (p, q) = (shape.out_h(), shape.out_w());
    let threads = |per: usize| shape.n * p * q.div_ceil(per) * (shape.c / v);
    let per = [4, 2]
        .into_iter()
        .find(|&per| threads(per) >= ROWS_MIN_THREADS * per / 2)?;
    Some((format!("depthwise_rows{}x{per}", shape.r), threads(per)))
}

/// Output vectors (8 bytes) up to which `depthwise_tile` runs: batch 1 of ConvNeXt's and
/// MobileNet's maps (56x56x96 f16: 75K), where the kernels a thread an output or a row have too
/// few threads to hide their loads' latency; more (larger batches) keep the row kernels.
const TILE_MAX_VECTORS: usize = 128 * 1024;
/// Blocks a tiled depthwise aims for: two an SM of the largest GPUs.
const TILE_BLOCKS: usize = 256;

/// How `depthwise_tile` runs `shape`: its kernel, and G (vectors a block) with the launch; None
/// where it does not (stride 1, a square 3, 5 or 7 filter, channels in whole 8-byte vectors,
/// 8-byte aligned views, at most [`TILE_MAX_VECTORS`] output vectors). G is the largest of 8, 4
/// and 2 that still gives [`TILE_BLOCKS`] blocks (2 where none does).
fn tile_variant(
    shape: &ConvShape,
    dtype: DType,
    views: &[Option<View<'_>>],
) -> Option<(String, usize, Launch)> {
    let v = 8 / dtype.size_bytes();
    let (p, q) = (shape.out_h(), shape.out_w());
    let reach = shape.n * p * q * (shape.c / v) <= TILE_MAX_VECTORS;
    reach.then(|| tile_launch(shape, dtype, views)).flatten()
}

/// [`tile_variant`] without its reach (what the tiled kernel would do at any batch, for
/// timing it there).
fn tile_launch(
    shape: &ConvShape,
    dtype: DType,
    views: &[Option<View<'_>>],
) -> Option<(String, usize, Launch)> {
    let v = 8 / dtype.size_bytes();
    let (p, q) = (shape.out_h(), shape.out_w());
    let vectors = shape.c / v;
    let fits = square_stride_one(shape, dtype, views) && shape.n <= 65_535;
    if !fits {
        return None;
    }
    let tiles = p.div_ceil(8) * q.div_ceil(8);
    let blocks = |g: usize| tiles * vectors.div_ceil(g) * shape.n;
    let g = [8, 4, 2]
        .into_iter()
        .find(|&g| blocks(g) >= TILE_BLOCKS)
        .unwrap_or(2);
    let patch = (8 + shape.r - 1).pow(2) + shape.r * shape.s;
    let launch = Launch {
        shared_bytes: (patch * g * 8) as u32,
        ..Launch::new(
            (tiles as u32, vectors.div_ceil(g) as u32, shape.n as u32),
            (64 * g as u32, 1, 1),
        )
    };
    Some((format!("depthwise_tile{}", shape.r), g, launch))
}

/// Whether the depthwise kernel runs `shape`: one filter per channel, and every index within 31
/// bits.
pub fn depthwise_runs(shape: &ConvShape) -> bool {
    let fits = |n: usize| n < (1 << 31);
    shape.groups == shape.c
        && shape.k == shape.c
        && fits(shape.n * shape.c * shape.h * shape.w)
        && fits(shape.n * shape.k * shape.out_h() * shape.out_w())
}

/// Every depthwise kernel of the channel-last module, by name ([`named`] says which runs a
/// shape).
pub fn variants() -> impl Iterator<Item = &'static str> {
    super::channels_last::KERNELS
        .into_iter()
        .filter(|k| k.starts_with("depthwise_"))
}

/// The kernel `ProgramKernels::depthwise` runs `shape` on, its launch and G (the tile's
/// vectors a block, else 0): the tiled kernel where it runs, else the rows kernel, else an
/// output vector a thread (16-byte vectors where the channels and views allow).
fn chosen(shape: &ConvShape, dtype: DType, views: &[Option<View<'_>>]) -> (String, Launch, usize) {
    let out = shape.n * shape.k * shape.out_h() * shape.out_w();
    let v = vector(dtype);
    let aligned = views.iter().flatten().all(|b| b.is_aligned(16));
    match (
        tile_variant(shape, dtype, views),
        rows_variant(shape, dtype, views),
    ) {
        (Some((stem, g, launch)), _) => (stem, launch, g),
        (None, Some((stem, threads))) => (stem, grid_for(threads), 0),
        _ if shape.c.is_multiple_of(v) && aligned => {
            ("depthwise_vec".to_string(), grid_for(out / v), 0)
        }
        _ => ("depthwise_one".to_string(), grid_for(out), 0),
    }
}

/// The launch and G of kernel `stem` (a name of [`variants`]) for `shape`, where it runs it
/// (the tiled kernel past the reach the engine gives it too).
fn named(
    stem: &str,
    shape: &ConvShape,
    dtype: DType,
    views: &[Option<View<'_>>],
) -> Option<(String, Launch, usize)> {
    let out = shape.n * shape.k * shape.out_h() * shape.out_w();
    let (v, v8) = (vector(dtype), 8 / dtype.size_bytes());
    let aligned = views.iter().flatten().all(|b| b.is_aligned(16));
    let vectors = shape.c.is_multiple_of(v) && aligned;
    let launch = match stem {
        "depthwise_one" => (grid_for(out), 0),
        "depthwise_vec" if vectors => (grid_for(out / v), 0),
        _ if stem.starts_with("depthwise_tile") => {
            let (name, g, launch) = tile_launch(shape, dtype, views)?;
            (name == stem).then_some((launch, g))?
        }
        _ if stem.starts_with("depthwise_vec") => {
            // depthwise_vec{S}s{stride}: the filter's side and stride fixed
            let (s, stride) = stem.strip_prefix("depthwise_vec")?.split_once('s')?;
            let (s, stride): (usize, usize) = (s.parse().ok()?, stride.parse().ok()?);
            let fits = vectors && (shape.r, shape.s, shape.stride) == (s, s, stride);
            fits.then_some((grid_for(out / v), 0))?
        }
        _ => {
            // depthwise_rows{S}x{P}, or depthwise_rows{S}x{P}s{stride}
            let rest = stem.strip_prefix("depthwise_rows")?;
            let (s, per) = rest.split_once('x')?;
            let (per, stride) = per.split_once('s').unwrap_or((per, "1"));
            let (s, per): (usize, usize) = (s.parse().ok()?, per.parse().ok()?);
            let stride: usize = stride.parse().ok()?;
            let fits = square_rows(shape, dtype, views, stride) && s == shape.r;
            let threads = shape.n * shape.out_h() * shape.out_w().div_ceil(per) * (shape.c / v8);
            fits.then_some((grid_for(threads), 0))?
        }
    };
    variants()
        .any(|v| v == stem)
        .then(|| (stem.to_string(), launch.0, launch.1))
}

/// The kernels that run `shape` (views `x`, `taps`, `bias`, `z`, `y`), the one
/// [`ProgramKernels::depthwise`] chooses first, to time them against one another
/// (`depthwise_one`, the vector kernel's one-channel form, only where it is the choice).
pub fn depthwise_candidates(
    shape: &ConvShape,
    dtype: DType,
    views: &[Option<View<'_>>],
) -> Vec<String> {
    let first = chosen(shape, dtype, views).0;
    let others = variants().filter(|v| {
        *v != first && *v != "depthwise_one" && named(v, shape, dtype, views).is_some()
    });
    std::iter::once(first.clone())
        .chain(others.map(str::to_string))
        .collect()
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
        self.depthwise_as(None, dtype, shape, (x, taps, bias, z), act, y)
    }

    /// [`ProgramKernels::depthwise`] on the kernel `variant` names (`depthwise_rows7x4`,
    /// `depthwise_tile7`, `depthwise_vec`, `depthwise_one`, ...: [`variants`]) rather than the
    /// one it would choose, to time them against one another; an error where that kernel does
    /// not run the shape.
    #[allow(clippy::too_many_arguments)]
    pub fn depthwise_variant(
        &self,
        variant: &str,
        dtype: DType,
        shape: &ConvShape,
        x: View<'_>,
        taps: View<'_>,
        bias: Option<View<'_>>,
        z: Option<View<'_>>,
        act: Option<Activation>,
        y: View<'_>,
    ) -> Result<()> {
        self.depthwise_as(Some(variant), dtype, shape, (x, taps, bias, z), act, y)
    }

    fn depthwise_as(
        &self,
        variant: Option<&str>,
        dtype: DType,
        shape: &ConvShape,
        (x, taps, bias, z): (View<'_>, View<'_>, Option<View<'_>>, Option<View<'_>>),
        act: Option<Activation>,
        y: View<'_>,
    ) -> Result<()> {
        if !depthwise_runs(shape) {
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
        let views = [Some(x), Some(taps), bias, z, Some(y)];
        let (stem, launch, g) = match variant {
            Some(stem) => named(stem, shape, dtype, &views).ok_or_else(|| {
                Error::Invalid(format!("{stem} does not run {shape:?} in {dtype}"))
            })?,
            None => chosen(shape, dtype, &views),
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
                g,
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
        // every depthwise kernel waits for the kernel ahead before it reads x or writes y
        let name = format!("{stem}_{}", tag(dtype));
        self.channels_last
            .launch(&name, &self.stream, launch.starting_early(), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ConvNeXt depthwise convolution: 7x7, padding 3, one filter a channel.
    fn convnext(n: usize, c: usize, h: usize) -> ConvShape {
        ConvShape {
            n,
            c,
            h,
            w: h,
            k: c,
            r: 7,
            s: 7,
            stride: 1,
            pad: 3,
            groups: c,
        }
    }

    #[test]
    fn rows_of_outputs_a_thread_where_there_are_threads_enough() {
        let pick = |s: &ConvShape, d: DType| rows_variant(s, d, &[]).map(|(k, _)| k);
        // batch 32: four outputs a thread; batch 1: two at 56x56 and 28x28, the old kernel below
        assert_eq!(
            pick(&convnext(32, 96, 56), DType::F16).as_deref(),
            Some("depthwise_rows7x4")
        );
        assert_eq!(
            pick(&convnext(1, 96, 56), DType::F16).as_deref(),
            Some("depthwise_rows7x2")
        );
        assert_eq!(
            pick(&convnext(1, 192, 28), DType::F16).as_deref(),
            Some("depthwise_rows7x2")
        );
        assert_eq!(pick(&convnext(1, 384, 14), DType::F16), None);
        // stride 2, a 1x3 filter, channels not in 8-byte vectors: never
        assert_eq!(
            pick(
                &ConvShape {
                    stride: 2,
                    ..convnext(32, 96, 56)
                },
                DType::F16
            ),
            None
        );
        assert_eq!(
            pick(
                &ConvShape {
                    r: 1,
                    s: 3,
                    ..convnext(32, 96, 56)
                },
                DType::F16
            ),
            None
        );
        assert_eq!(pick(&convnext(32, 6, 56), DType::F16), None);
        assert_eq!(
            pick(&convnext(32, 6, 56), DType::F32).as_deref(),
            Some("depthwise_rows7x4")
        );
    }

    #[test]
    fn few_outputs_take_the_tiled_kernel_with_blocks_enough() {
        let pick = |s: &ConvShape, d: DType| tile_variant(s, d, &[]);
        // batch 1 of ConvNeXt-T's four stages (f16: 4 channels a vector)
        for (c, h, g) in [(96, 56, 4), (192, 28, 2), (384, 14, 2), (768, 7, 2)] {
            let shape = convnext(1, c, h);
            let (kernel, got, launch) = pick(&shape, DType::F16).expect("batch 1 is tiled");
            assert_eq!((kernel.as_str(), got), ("depthwise_tile7", g), "{c}x{h}");
            // every output pixel and vector has its thread, the patch fits 48 KiB
            let (tx, ty, tz) = launch.grid;
            assert_eq!(launch.block.0 as usize, 64 * g);
            assert!(tx as usize * 64 >= h * h && ty as usize * g * 4 >= c && tz == 1);
            assert!(launch.shared_bytes <= 48 * 1024);
        }
        // more outputs: 4 vectors a block where that still gives 256 blocks; 8 only at the
        // limit (a block of 8 vectors covers 512 of its output vectors)
        let (_, g, launch) = pick(&convnext(2, 192, 28), DType::F16).unwrap();
        assert_eq!((g, launch.grid), (4, (16, 12, 2)));
        assert_eq!(launch.shared_bytes, (14 * 14 + 49) * 4 * 8);
        let at_limit = ConvShape {
            r: 3,
            s: 3,
            pad: 1,
            ..convnext(2, 256, 32)
        };
        assert_eq!(pick(&at_limit, DType::F16).map(|t| t.1), Some(8));
        // batch 32, stride 2, a 1x3 filter, channels not in 8-byte vectors: never
        assert!(pick(&convnext(32, 96, 56), DType::F16).is_none());
        assert!(pick(
            &ConvShape {
                stride: 2,
                ..convnext(1, 96, 56)
            },
            DType::F16
        )
        .is_none());
        assert!(pick(
            &ConvShape {
                r: 1,
                s: 3,
                ..convnext(1, 96, 56)
            },
            DType::F16
        )
        .is_none());
        assert!(pick(&convnext(1, 6, 14), DType::F16).is_none());
        assert!(pick(&convnext(1, 6, 14), DType::F32).is_some());
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
        assert!(depthwise_runs(&shape));
        assert!(!depthwise_runs(&ConvShape { groups: 4, ..shape }));
        assert!(!depthwise_runs(&ConvShape { k: 16, ..shape }));
    }

    #[test]
    fn a_named_kernel_runs_the_shapes_it_takes() {
        let b32 = convnext(32, 96, 56);
        let f16 = DType::F16;
        for stem in ["depthwise_rows7x2", "depthwise_rows7x4"] {
            assert!(named(stem, &b32, f16, &[]).is_some(), "{stem}");
        }
        assert!(named("depthwise_rows3x4", &b32, f16, &[]).is_none());
        assert!(named("depthwise_vec", &b32, f16, &[]).is_some());
        assert!(named("depthwise_one", &b32, f16, &[]).is_some());
        // the tiled kernel by name at any batch (chosen at batch 1 only)
        assert!(named("depthwise_tile7", &b32, f16, &[]).is_some());
        assert!(chosen(&b32, f16, &[]).0 != "depthwise_tile7");
        assert!(named("depthwise_tile7", &convnext(1, 96, 56), f16, &[]).is_some());
        assert!(named("depthwise_tile3", &convnext(1, 96, 56), f16, &[]).is_none());
        // stride 2: the row kernels of stride 2 and the fixed vector kernels of its filter
        let s2 = ConvShape {
            r: 3,
            s: 3,
            pad: 1,
            stride: 2,
            ..convnext(32, 64, 112)
        };
        assert!(named("depthwise_rows3x4s2", &s2, f16, &[]).is_some());
        assert!(named("depthwise_rows3x4", &s2, f16, &[]).is_none());
        assert!(named("depthwise_rows5x2s2", &s2, f16, &[]).is_none());
        assert!(named("depthwise_vec3s2", &s2, f16, &[]).is_some());
        assert!(named("depthwise_vec3s1", &s2, f16, &[]).is_none());
        assert!(named("depthwise_vec5s2", &s2, f16, &[]).is_none());
        assert!(named("depthwise_rows3x4s2", &b32, f16, &[]).is_none());
        assert_eq!(
            depthwise_candidates(&s2, f16, &[]),
            [
                "depthwise_vec",
                "depthwise_rows3x2s2",
                "depthwise_rows3x4s2",
                "depthwise_vec3s2"
            ]
        );
        // the chosen kernel first, each once
        let all = depthwise_candidates(&b32, f16, &[]);
        assert_eq!(all[0], chosen(&b32, f16, &[]).0);
        assert!(all.contains(&"depthwise_tile7".to_string()));
        assert!(!all.contains(&"depthwise_one".to_string()));
        assert!(all
            .iter()
            .all(|v| all.iter().filter(|w| *w == v).count() == 1));
        // a name of no kernel, and the choice is among the names
        assert!(named("depthwise_rows7x8", &b32, f16, &[]).is_none());
        assert!(named("depthwise_vec7s1", &b32, f16, &[]).is_none());
        assert!(named("pool_cl", &b32, f16, &[]).is_none());
        for shape in [b32, convnext(1, 96, 56), convnext(2, 20, 9)] {
            assert!(variants().any(|v| v == chosen(&shape, f16, &[]).0));
        }
    }
}
