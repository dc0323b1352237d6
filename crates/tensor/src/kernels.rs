//! The kernels behind the tensor crate's CUDA ops: random fill on the device, strided
//! elementwise arithmetic (out of place and in place), strided copies (with a tiled transpose),
//! reductions along an axis, for f64, f32, f16 and bf16 storage: CUDA C compiled by NVRTC once
//! per device and cached, launched through `gpukit_cuda::kernel`.
//!
//! Each result is rounded once to the storage type, as the CPU reference does: an f32, f16 or
//! bf16 sum or product of two values is exact in f64, so the GPU's results equal the CPU's bit
//! for bit. The contiguous, aligned kernels (16-byte loads) add and multiply tensors in the
//! storage type's own precision (f32 for f16/bf16), which rounds to the same bits: a value
//! rounded once from the exact result either way.
//! Sums along an axis accumulate in f64.
//!
//! To use: [`tensor_ops`] for a device (made once per opened [`Gpu`], kept with it), then the
//! launch methods of its [`TensorKernels`], which enqueue on the [`Stream`] given and return at
//! once. Operands are described by a [`Strided`]: a view, the element strides and (shared by
//! the operands of one call) the shape. Every element an operand's strides reach is checked to
//! lie in its view before a launch; the kernel API checks the arguments' kinds.

use gpukit_cuda::blas::Blas;
use gpukit_cuda::kernel::{tag, Arg, KernelModule, KernelSource, Launch, HALF, PART};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{Error, Gpu, Result, Stream, View};
use gpukit_types::DType;
use std::sync::{Arc, Mutex};

/// The most dimensions a strided operand may have.
pub const MAX_RANK: usize = 6;

mod source;
use source::{PARTS, SOURCE, STEMS};

/// Shapes and strides of up to three operands, as the kernels read them (their `struct Dims`).
#[derive(Clone, Copy, Debug, Default)]
struct Dims {
    rank: i32,
    shape: [i64; MAX_RANK],
    sa: [i64; MAX_RANK],
    sb: [i64; MAX_RANK],
    sy: [i64; MAX_RANK],
}

/// Bytes of the kernels' `struct Dims`: an int, padding to 8, then four arrays of 6 long longs.
const DIMS_BYTES: usize = 8 + 4 * MAX_RANK * 8;

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

    /// The bytes of the kernels' `struct Dims` (the C layout, native byte order).
    fn bytes(&self) -> [u8; DIMS_BYTES] {
        let mut b = [0u8; DIMS_BYTES];
        b[..4].copy_from_slice(&self.rank.to_ne_bytes());
        let arrays = [self.shape, self.sa, self.sb, self.sy];
        for (i, v) in arrays.iter().flatten().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }
}

/// The module's name in the kernel cache.
const STEM: &str = "tensor-kernels";

/// The tensor kernels' module: its name in the cache, its whole CUDA C source and the kernels
/// loaded from it (also what `gpukit all` compiles ahead).
pub fn kernel_source() -> KernelSource {
    let names: Vec<String> = STEMS
        .iter()
        .flat_map(|s| ["f64", "f32", "f16", "bf16"].map(|t| format!("{s}_{t}")))
        .collect();
    KernelSource {
        stem: STEM,
        source: format!("{HALF}{SOURCE}{PART}{}", PARTS.join(PART)),
        names,
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

const BLOCK: u32 = 256;

fn grid(total: usize) -> Launch {
    gpukit_cuda::kernel::grid_for(total)
}

/// A grid dimension, an error when it exceeds what a launch takes.
fn dim(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Invalid(format!("{what} = {v}: too many blocks")))
}

/// Threads of the vectorised kernels: one per 16 bytes (at least one, for the tail).
fn vectors(n: usize, dtype: DType) -> usize {
    (n / (16 / dtype.storage().size_bytes())).max(1)
}

/// The loaded tensor kernels of one device.
pub struct TensorKernels {
    module: KernelModule,
    /// Multiprocessors of the device (how many blocks fill it).
    sms: usize,
}

impl TensorKernels {
    /// Compiles the kernels for `gpu` (or reads them from the on-disk cache) and loads them.
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<TensorKernels> {
        let module = KernelModule::load(discovery, gpu, &kernel_source())?;
        let sms = gpukit_cuda::driver::device_attributes(gpu.ordinal, gpu.ordinal + 1)
            .map(|a| a.sm_count as usize)
            .unwrap_or(108)
            .max(1);
        Ok(TensorKernels { module, sms })
    }

    /// Launches `{stem}_{tag}` of `dtype` on `stream`.
    fn run(
        &self,
        stream: &Stream,
        stem: &str,
        dtype: DType,
        launch: Launch,
        args: &[Arg<'_>],
    ) -> Result<()> {
        let name = format!("{stem}_{}", tag(dtype));
        self.module.launch(&name, stream, launch, args)
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
        let args = [
            Arg::Ptr(y),
            Arg::Size(n),
            Arg::U64(seed),
            Arg::Bool(dist == Distribution::Normal),
        ];
        // two values a thread in f64, four below
        let per_thread = if dtype.storage() == DType::F64 { 2 } else { 4 };
        self.run(stream, "fill", dtype, grid(n.div_ceil(per_thread)), &args)
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
        let (pa, pb, py) = (Arg::Ptr(a.view), Arg::Ptr(b.view), Arg::Ptr(y.view));
        if d.rank == 0 && [a.view, b.view, y.view].iter().all(|v| v.is_aligned(16)) {
            // contiguous, n elements each (checked), 16-byte aligned: vector loads
            let args = [pa, pb, py, Arg::Size(n), Arg::I32(op.code())];
            return self.run(stream, "binary_vec", dtype, grid(vectors(n, dtype)), &args);
        }
        let dims = d.bytes();
        let args = [
            pa,
            pb,
            py,
            Arg::Struct("Dims", &dims),
            Arg::Size(n),
            Arg::I32(op.code()),
        ];
        self.run(stream, "binary", dtype, grid(n), &args)
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
        let (pa, py, code) = (Arg::Ptr(a.view), Arg::Ptr(y.view), Arg::I32(op.code()));
        if d.rank == 0 && a.view.is_aligned(16) && y.view.is_aligned(16) {
            let args = [pa, py, Arg::Size(n), code, Arg::F64(s)];
            return self.run(stream, "scalar_vec", dtype, grid(vectors(n, dtype)), &args);
        }
        let dims = d.bytes();
        let args = [
            pa,
            py,
            Arg::Struct("Dims", &dims),
            Arg::Size(n),
            code,
            Arg::F64(s),
        ];
        self.run(stream, "scalar", dtype, grid(n), &args)
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
            let launch = Launch::new(
                (
                    dim(cols.div_ceil(32), "transpose column tiles")?,
                    dim(rows.div_ceil(32), "transpose row tiles")?,
                    dim(batch, "transpose batch")?,
                ),
                (32, 8, 1),
            );
            // the tiles stay inside [batch, rows, cols] (checked in the kernel), which lie in
            // both views
            let args = [
                Arg::Ptr(a.view),
                Arg::Ptr(y.view),
                Arg::Size(batch),
                Arg::Size(rows),
                Arg::Size(cols),
                Arg::Size(xs),
            ];
            return self.run(stream, "transpose", dtype, launch, &args);
        }
        let dims = d.bytes();
        let args = [
            Arg::Ptr(a.view),
            Arg::Ptr(y.view),
            Arg::Struct("Dims", &dims),
            Arg::Size(n),
        ];
        self.run(stream, "copy", dtype, grid(n), &args)
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
            (false, _) => None,
            (true, Some(s)) => {
                s.require(plan.scratch_bytes(), "sum scratch")?;
                Some(s)
            }
            (true, None) => {
                return Err(Error::Invalid(format!(
                    "sum_axis: {} bytes of scratch needed",
                    plan.scratch_bytes()
                )))
            }
        };
        let splits = dim(plan.splits, "sum splits")?;
        let (stem, launch) = if plan.rows {
            let grid = (dim(plan.outputs, "sum outputs")?, splits, 1);
            ("sum_rows", Launch::new(grid, (BLOCK, 1, 1)))
        } else {
            let blocks = dim(plan.outputs.div_ceil(BLOCK as usize), "sum outputs")?;
            ("sum_cols", Launch::new((blocks, splits, 1), (BLOCK, 1, 1)))
        };
        // x's elements checked to lie in its view, y holds `outputs` elements, the partials
        // (when used) fit the scratch
        let dims = plan.dims.bytes();
        let args = [
            Arg::Ptr(x.view),
            Arg::Ptr(y),
            Arg::opt(part),
            Arg::Struct("Dims", &dims),
            Arg::Size(plan.outputs),
            Arg::Size(plan.len),
            Arg::Size(plan.rs),
            Arg::Size(plan.chunk),
        ];
        self.run(stream, stem, dtype, launch, &args)?;
        if let Some(part) = part {
            let args = [
                Arg::Ptr(part),
                Arg::Ptr(y),
                Arg::Size(plan.outputs),
                Arg::Size(plan.splits),
            ];
            self.run(stream, "sum_partials", dtype, grid(plan.outputs), &args)?;
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
/// handle, both on the device's work stream (from [`tensor_ops`]).
pub struct TensorOps {
    pub kernels: TensorKernels,
    /// One thread at a time uses the handle (its work is ordered on its one stream).
    blas: Mutex<Blas>,
}

impl TensorOps {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<TensorOps> {
        Ok(TensorOps {
            kernels: TensorKernels::new(discovery, gpu)?,
            blas: Mutex::new(Blas::new(discovery, gpu)?),
        })
    }

    /// Runs `f` with the device's cuBLAS handle (on the work stream).
    pub fn with_blas<T>(&self, f: impl FnOnce(&Blas) -> Result<T>) -> Result<T> {
        let guard = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }
}

/// The tensor ops' kernels and cuBLAS handle on `gpu`'s work stream, made on the first call for
/// this opened device (compiling or reading cached kernels), shared after and dropped with the
/// [`Gpu`]; a failure is not kept, so a later call tries again.
pub fn tensor_ops(gpu: &Gpu) -> Result<Arc<TensorOps>> {
    gpu.extension(|gpu| TensorOps::new(gpu.discovery(), gpu))
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
    fn the_kernels_take_what_the_launchers_pass() {
        let expected = [
            ("binary_", "p p p s l i"),
            ("scalar_", "p p s l i d"),
            ("binary_vec_", "p p p l i"),
            ("scalar_vec_", "p p l i d"),
            ("copy_", "p p s l"),
            ("transpose_", "p p l i i l"),
            ("fill_", "p l u i"),
            ("sum_rows_", "p p p s l l l l"),
            ("sum_cols_", "p p p s l l l l"),
            ("sum_partials_", "p p l i"),
        ];
        let differences =
            kernel_source().signature_differences(&expected, &["f64", "f32", "f16", "bf16"]);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn dims_match_the_c_layout() {
        // int (4) + padding (4) + 4 arrays of 6 long longs
        assert_eq!(DIMS_BYTES, 8 + 4 * 6 * 8);
        let d = Dims::new(&[2, 3], &[3, 1], &[1, 2], &[1, 2]).unwrap();
        let b = d.bytes();
        assert_eq!(&b[..4], &2i32.to_ne_bytes());
        assert_eq!(&b[4..8], &[0; 4]);
        let at = |array: usize, k: usize| {
            let o = 8 + (array * MAX_RANK + k) * 8;
            i64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
        };
        assert_eq!((at(0, 0), at(0, 1), at(0, 2)), (2, 3, 0));
        assert_eq!((at(1, 0), at(1, 1)), (3, 1));
        assert_eq!((at(2, 0), at(2, 1)), (1, 2));
        assert_eq!((at(3, 0), at(3, 1), at(3, 5)), (1, 2, 0));
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
