//! The CUDA side of the tensor ops: each op on CUDA tensors launches gpukit's kernels or cuBLAS
//! on the device's work stream and returns without waiting, as PyTorch's ops do; reading a
//! result back ([`Tensor::to_bytes`]) waits for it. Outputs come from the device's
//! stream-ordered memory pool (gpukit's caching allocator), so allocating one is cheap.
//!
//! Results equal the CPU ops' bit for bit for elementwise arithmetic, copies and random draws
//! of the same seed on the same device kind; sums along an axis add in f64 in another order
//! (equal to the CPU's within one rounding of the dtype); products go through cuBLAS.

use crate::error::Result;
use crate::kernels::{tensor_ops, Arith, Distribution, Strided, TensorOps};
use crate::storage::{cuda_err, Storage};
use crate::tensor::{contiguous_strides, sizes};
use crate::{DType, Tensor};
use gpukit_cuda::Gpu;
use std::sync::Arc;

/// The device's tensor kernels and cuBLAS handle.
fn ops_of(gpu: &Gpu, op: &'static str) -> Result<Arc<TensorOps>> {
    tensor_ops(gpu).map_err(cuda_err(op, gpu))
}

impl Tensor {
    /// A contiguous tensor of `shape` on `gpu` whose bytes the caller's op writes in full.
    pub(crate) fn uninit_on(gpu: &Arc<Gpu>, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let (_, bytes) = sizes(shape, dtype)?;
        Ok(Tensor {
            storage: Storage::uninit_on(gpu.clone(), bytes)?,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            dtype,
        })
    }

    /// This tensor's elements as a kernel operand (its storage's bytes and its strides).
    fn operand(&self, op: &'static str) -> Result<Strided<'_>> {
        Ok(Strided::new(self.storage.view(op)?, &self.strides))
    }

    /// Random values drawn on `gpu`: element `i` is a function of (seed, i) alone.
    pub(crate) fn cuda_random(
        gpu: &Arc<Gpu>,
        shape: &[usize],
        dtype: DType,
        seed: u64,
        dist: Distribution,
    ) -> Result<Tensor> {
        let out = Tensor::uninit_on(gpu, shape, dtype)?;
        let ops = ops_of(gpu, "random")?;
        ops.kernels
            .fill_random(
                gpu.stream(),
                out.storage.view("random")?,
                dtype,
                out.numel(),
                seed,
                dist,
            )
            .map_err(cuda_err("random", gpu))?;
        Ok(out)
    }

    /// `self (op) other` into a new contiguous tensor, or into `self` when `in_place`.
    pub(crate) fn cuda_binary(
        &self,
        gpu: &Arc<Gpu>,
        op: &'static str,
        arith: Arith,
        other: &Tensor,
    ) -> Result<Tensor> {
        let ops = ops_of(gpu, op)?;
        let out = Tensor::uninit_on(gpu, &self.shape, self.dtype)?;
        ops.kernels
            .binary(
                gpu.stream(),
                arith,
                self.dtype,
                &self.shape,
                (self.operand(op)?, other.operand(op)?, out.operand(op)?),
            )
            .map_err(cuda_err(op, gpu))?;
        Ok(out)
    }

    /// `self (op)= other` in place, through this tensor's own strides. When `other` shares
    /// this tensor's bytes at other strides (`x += x.T`), an element could be read after it was
    /// written: the result is computed apart first, then copied in.
    pub(crate) fn cuda_binary_assign(
        &mut self,
        gpu: &Arc<Gpu>,
        op: &'static str,
        arith: Arith,
        other: &Tensor,
    ) -> Result<()> {
        let (mine, theirs) = (self.storage.view(op)?, other.storage.view(op)?);
        if mine.overlaps(&theirs) && (self.strides != other.strides || !mine.same_start(&theirs)) {
            let result = self.cuda_binary(gpu, op, arith, other)?;
            return self.cuda_copy_from(gpu, op, &result);
        }
        let ops = ops_of(gpu, op)?;
        let y = self.operand(op)?;
        ops.kernels
            .binary(
                gpu.stream(),
                arith,
                self.dtype,
                &self.shape,
                (y, other.operand(op)?, y),
            )
            .map_err(cuda_err(op, gpu))
    }

    /// `self (op) s` elementwise, into a new tensor or (`in_place`) into `self`.
    pub(crate) fn cuda_scalar(
        &self,
        gpu: &Arc<Gpu>,
        op: &'static str,
        arith: Arith,
        s: f64,
        in_place: bool,
    ) -> Result<Option<Tensor>> {
        let ops = ops_of(gpu, op)?;
        let out = if in_place {
            None
        } else {
            Some(Tensor::uninit_on(gpu, &self.shape, self.dtype)?)
        };
        let y = match &out {
            Some(t) => t.operand(op)?,
            None => self.operand(op)?,
        };
        ops.kernels
            .scalar(
                gpu.stream(),
                arith,
                self.dtype,
                &self.shape,
                (self.operand(op)?, y),
                s,
            )
            .map_err(cuda_err(op, gpu))?;
        Ok(out)
    }

    /// Copies `src`'s elements (same shape and dtype, on this GPU) into this tensor's strides.
    pub(crate) fn cuda_copy_from(
        &mut self,
        gpu: &Arc<Gpu>,
        op: &'static str,
        src: &Tensor,
    ) -> Result<()> {
        let ops = ops_of(gpu, op)?;
        ops.kernels
            .copy(
                gpu.stream(),
                self.dtype,
                &self.shape,
                (src.operand(op)?, self.operand(op)?),
            )
            .map_err(cuda_err(op, gpu))
    }

    /// A new tensor with the same values at `strides` (a dense layout of this shape).
    pub(crate) fn cuda_relayout(
        &self,
        gpu: &Arc<Gpu>,
        op: &'static str,
        strides: Vec<usize>,
    ) -> Result<Tensor> {
        let mut out = Tensor::uninit_on(gpu, &self.shape, self.dtype)?;
        out.strides = strides;
        out.cuda_copy_from(gpu, op, self)?;
        Ok(out)
    }

    /// The sum along `axis` into a new contiguous tensor.
    pub(crate) fn cuda_sum_axis(&self, gpu: &Arc<Gpu>, axis: usize) -> Result<Tensor> {
        let op = "sum_axis";
        let ops = ops_of(gpu, op)?;
        let mut shape = self.shape.clone();
        shape.remove(axis);
        let out = Tensor::uninit_on(gpu, &shape, self.dtype)?;
        let scratch_bytes = ops
            .kernels
            .sum_scratch_bytes(&self.shape, &self.strides, axis)
            .map_err(cuda_err(op, gpu))?;
        let scratch = if scratch_bytes > 0 {
            Some(gpu.alloc_uninit(scratch_bytes).map_err(cuda_err(op, gpu))?)
        } else {
            None
        };
        ops.kernels
            .sum_axis(
                gpu.stream(),
                self.dtype,
                &self.shape,
                self.operand(op)?,
                axis,
                out.storage.view(op)?,
                scratch.as_ref().map(|s| s.view()),
            )
            .map_err(cuda_err(op, gpu))?;
        // the scratch is freed in stream order, after the kernels that use it
        drop(scratch);
        Ok(out)
    }

    /// `batch` products `[m, k] x [k, n]` through cuBLAS. Operands that are contiguous, or
    /// batches of transposed matrices (what `transpose(-2, -1)` of a contiguous tensor gives),
    /// are read in place; others are made contiguous first.
    pub(crate) fn cuda_batched_matmul(
        &self,
        gpu: &Arc<Gpu>,
        op: &'static str,
        other: &Tensor,
        (batch, m, n, k): (usize, usize, usize, usize),
        out_shape: Vec<usize>,
    ) -> Result<Tensor> {
        let ops = ops_of(gpu, op)?;
        let (a, trans_a) = self.as_gemm_operand(gpu)?;
        let (b, trans_b) = other.as_gemm_operand(gpu)?;
        let out = Tensor::uninit_on(gpu, &out_shape, self.dtype)?;
        let views = (
            a.storage.view(op)?,
            b.storage.view(op)?,
            out.storage.view(op)?,
        );
        ops.with_blas(|blas| {
            blas.gemm_batched(self.dtype, views, (batch, m, n, k), (trans_a, trans_b))
        })
        .map_err(cuda_err(op, gpu))?;
        Ok(out)
    }

    /// (tensor cuBLAS can read, whether it is read transposed): contiguous as is, a batch of
    /// transposed matrices as the contiguous matrices under it, anything else copied.
    fn as_gemm_operand(&self, gpu: &Arc<Gpu>) -> Result<(Tensor, bool)> {
        if self.is_contiguous() {
            return Ok((self.clone(), false));
        }
        let r = self.rank();
        if r >= 2 {
            let mut dims: Vec<usize> = (0..r).collect();
            dims.swap(r - 2, r - 1);
            let under = self.permute(&dims)?;
            if under.is_contiguous() {
                return Ok((under, true));
            }
        }
        let strides = contiguous_strides(&self.shape);
        Ok((self.cuda_relayout(gpu, "matmul", strides)?, false))
    }
}
