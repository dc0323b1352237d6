//! The kernels behind the tensor crate's CUDA ops: random fill on the device, strided
//! elementwise arithmetic (out of place and in place), strided copies (with a tiled transpose),
//! reductions along an axis, for f64, f32, f16 and bf16 storage, compiled by NVRTC like the
//! crate's other kernels.
//!
//! Each result is rounded once to the storage type, as the CPU reference does: an f32, f16 or
//! bf16 sum or product of two values is exact in f64, so the GPU's results equal the CPU's bit
//! for bit. The contiguous, aligned kernels (16-byte loads) add and multiply tensors in the
//! storage type's own precision (f32 for f16/bf16), which rounds to the same bits: a value
//! rounded once from the exact result either way.
//! Sums along an axis accumulate in f64.
//!
//! To use: [`TensorKernels::new`] once per device (the tensor crate keeps one per [`Gpu`]),
//! then the launch methods, which enqueue on the [`Stream`] given and return at once.
//! Operands are described by a [`Strided`]: a view, the element strides and (shared by the
//! operands of one call) the shape.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{tag, HALF};
use crate::loader::Discovery;
use crate::memory::View;
use crate::nvrtc::Module;
use crate::stream::Stream;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use gpukit_types::DType;

/// The most dimensions a strided operand may have.
pub const MAX_RANK: usize = 6;

mod source;
use source::{SOURCE, STEMS};

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

/// The module's name in the PTX cache.
pub(crate) const STEM: &str = "tensor-kernels";

/// The module's whole CUDA C source.
pub(crate) fn source() -> String {
    format!("{HALF}{SOURCE}")
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

fn grid(total: usize) -> LaunchConfig {
    crate::kernels::config(total)
}

/// Threads of the vectorised kernels: one per 16 bytes (at least one, for the tail).
fn vectors(n: usize, dtype: DType) -> usize {
    (n / (16 / dtype.storage().size_bytes())).max(1)
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
        let module = Module::load(discovery, gpu, &source(), STEM, &names)?;
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
        // two values a thread in f64, four below
        let per_thread = if dtype.storage() == DType::F64 { 2 } else { 4 };
        // SAFETY: (T*, long long, unsigned long long, int) as declared; y holds n elements.
        unsafe { b.launch(grid(n.div_ceil(per_thread))) }?;
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
