//! Tensor operations: dtype and layout conversions, views, and the elementwise and matrix ops.
//! Each returns a new tensor on the device of its operand(s); operands on two devices are an
//! [`Error::DeviceMismatch`].

use crate::codec::{encode_f32, encode_f64};
use crate::error::{check_same_device, Error, Result};
use crate::kernels::Arith;
use crate::tensor::{contiguous_strides, nhwc_strides, numel_of, sizes};
use crate::{DType, Tensor};

/// `x (op) y` in f64 (rounded to the dtype by the caller).
fn apply(arith: Arith, x: f64, y: f64) -> f64 {
    match arith {
        Arith::Add => x + y,
        Arith::Mul => x * y,
    }
}

impl Tensor {
    /// This tensor stored as `dtype` on the same device, each value rounded once to nearest.
    /// f32 <-> tf32 only relabels (tf32 is f32 storage). The result is contiguous.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        if dtype.storage() == self.dtype.storage() {
            return Ok(Tensor {
                dtype,
                ..self.clone()
            });
        }
        sizes(&self.shape, dtype)?;
        let bytes = encode_f64(&self.to_vec_f64()?, dtype);
        self.alike(
            bytes,
            self.shape.clone(),
            contiguous_strides(&self.shape),
            dtype,
        )
    }

    /// A contiguous (row-major) tensor with the same values: `self` when already contiguous,
    /// else a copy on the same device.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        if let Some(gpu) = self.gpu() {
            return self.cuda_relayout(gpu, "contiguous", contiguous_strides(&self.shape));
        }
        let bytes = self.to_bytes()?;
        self.alike(
            bytes,
            self.shape.clone(),
            contiguous_strides(&self.shape),
            self.dtype,
        )
    }

    /// A view with the dimensions reordered: dimension `i` of the result is `dims[i]` of `self`.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        let valid = dims.len() == rank
            && dims.iter().all(|&d| match seen.get_mut(d) {
                Some(s) if !*s => {
                    *s = true;
                    true
                }
                _ => false,
            });
        if !valid {
            return Err(Error::InvalidPermutation {
                dims: dims.to_vec(),
                rank,
            });
        }
        let pick = |v: &[usize]| dims.iter().filter_map(|&d| v.get(d).copied()).collect();
        Ok(Tensor {
            shape: pick(&self.shape),
            strides: pick(&self.strides),
            ..self.clone()
        })
    }

    /// A view with a new shape of the same number of elements; the tensor must be contiguous
    /// (call [`Tensor::contiguous`] first otherwise).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let from_numel = self.numel();
        let to_numel = numel_of(shape).ok_or_else(|| Error::TooLarge {
            shape: shape.to_vec(),
            dtype: self.dtype,
        })?;
        if from_numel != to_numel {
            return Err(Error::ReshapeNumel {
                from: self.shape.clone(),
                to: shape.to_vec(),
                from_numel,
                to_numel,
            });
        }
        if !self.is_contiguous() {
            return Err(Error::NotContiguous {
                op: "reshape",
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            ..self.clone()
        })
    }

    fn require_rank(&self, op: &'static str, expected: usize) -> Result<()> {
        if self.rank() == expected {
            Ok(())
        } else {
            Err(Error::Rank {
                op,
                expected,
                shape: self.shape.clone(),
            })
        }
    }

    /// The 4-D `[n, c, h, w]` tensor laid out channels-last in memory: shape and logical
    /// indexing unchanged, strides `[h*w*c, 1, w*c, c]`. `self` when already so; else a copy
    /// on the same device.
    pub fn to_nhwc(&self) -> Result<Tensor> {
        self.require_rank("to_nhwc", 4)?;
        if self.is_nhwc() {
            return Ok(self.clone());
        }
        let strides = nhwc_strides(&self.shape).unwrap_or_default();
        if let Some(gpu) = self.gpu() {
            return self.cuda_relayout(gpu, "to_nhwc", strides);
        }
        // [n, h, w, c] in logical order is NHWC in memory.
        let bytes = self.permute(&[0, 2, 3, 1])?.to_bytes()?;
        self.alike(bytes, self.shape.clone(), strides, self.dtype)
    }

    /// The 4-D tensor laid out NCHW (row-major) in memory: [`Tensor::contiguous`] for 4-D.
    pub fn to_nchw(&self) -> Result<Tensor> {
        self.require_rank("to_nchw", 4)?;
        self.contiguous()
    }

    fn check_binary(&self, op: &'static str, other: &Tensor) -> Result<()> {
        check_same_device(op, self.device(), other.device())?;
        if self.dtype != other.dtype {
            return Err(Error::DTypeMismatch {
                op,
                left: self.dtype,
                right: other.dtype,
            });
        }
        Ok(())
    }

    /// Elementwise `self + other`: same device, dtype and shape; any layouts. Each sum is
    /// rounded once to the dtype (computed in f64, which is exact before that rounding for
    /// f32/f16/bf16 operands, so results equal native addition). Contiguous result on the
    /// device of the operands (on a GPU: one kernel, not waited for).
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.zip_with("add", Arith::Add, other)
    }

    /// Elementwise `self * other`, under [`Tensor::add`]'s rules (a product of two f32 values
    /// is exact in f64, so each result is the native product).
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.zip_with("mul", Arith::Mul, other)
    }

    /// `self += other` in place: this tensor's storage takes the sums (its layout kept; on a
    /// GPU no new buffer is made unless `other` overlaps this tensor at other strides).
    pub fn add_assign(&mut self, other: &Tensor) -> Result<()> {
        self.zip_assign("add_assign", Arith::Add, other)
    }

    /// `self *= other` in place.
    pub fn mul_assign(&mut self, other: &Tensor) -> Result<()> {
        self.zip_assign("mul_assign", Arith::Mul, other)
    }

    /// Elementwise `self + s` into a new contiguous tensor (rounded once, as [`Tensor::add`]).
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("add_scalar", Arith::Add, s)
    }

    /// Elementwise `self * s` into a new contiguous tensor (rounded once, as [`Tensor::mul`]).
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("mul_scalar", Arith::Mul, s)
    }

    /// `self += s` in place.
    pub fn add_scalar_assign(&mut self, s: f64) -> Result<()> {
        self.scalar_assign("add_scalar_assign", Arith::Add, s)
    }

    /// `self *= s` in place.
    pub fn mul_scalar_assign(&mut self, s: f64) -> Result<()> {
        self.scalar_assign("mul_scalar_assign", Arith::Mul, s)
    }

    fn scalar_op(&self, op: &'static str, arith: Arith, s: f64) -> Result<Tensor> {
        if let Some(gpu) = self.gpu() {
            let out = self.cuda_scalar(gpu, op, arith, s, false)?;
            return out.ok_or(Error::NotOnGpu {
                op,
                device: self.device(),
            });
        }
        let out: Vec<f64> = self
            .to_vec_f64()?
            .iter()
            .map(|&x| apply(arith, x, s))
            .collect();
        self.alike(
            encode_f64(&out, self.dtype),
            self.shape.clone(),
            contiguous_strides(&self.shape),
            self.dtype,
        )
    }

    fn scalar_assign(&mut self, op: &'static str, arith: Arith, s: f64) -> Result<()> {
        if let Some(gpu) = self.gpu().cloned() {
            self.cuda_scalar(&gpu, op, arith, s, true)?;
            return Ok(());
        }
        let result = self.scalar_op(op, arith, s)?;
        self.write(&result)
    }

    fn zip_assign(&mut self, op: &'static str, arith: Arith, other: &Tensor) -> Result<()> {
        self.check_zip(op, other)?;
        if let Some(gpu) = self.gpu().cloned() {
            return self.cuda_binary_assign(&gpu, op, arith, other);
        }
        let result = self.zip_with(op, arith, other)?;
        self.write(&result)
    }

    fn check_zip(&self, op: &'static str, other: &Tensor) -> Result<()> {
        self.check_binary(op, other)?;
        if self.shape != other.shape {
            return Err(Error::ShapeMismatch {
                op,
                left: self.shape.clone(),
                right: other.shape.clone(),
                expected: "equal shapes",
            });
        }
        Ok(())
    }

    fn zip_with(&self, op: &'static str, arith: Arith, other: &Tensor) -> Result<Tensor> {
        self.check_zip(op, other)?;
        if let Some(gpu) = self.gpu() {
            return self.cuda_binary(gpu, op, arith, other);
        }
        let a = self.to_vec_f64()?;
        let b = other.to_vec_f64()?;
        let out: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| apply(arith, *x, *y))
            .collect();
        self.alike(
            encode_f64(&out, self.dtype),
            self.shape.clone(),
            contiguous_strides(&self.shape),
            self.dtype,
        )
    }

    /// The sum along `axis`, which leaves the shape: `[a, b, c].sum_axis(1)` is `[a, c]`. Sums
    /// in f64 in index order, rounded once to the dtype. Any layout in; contiguous out.
    pub fn sum_axis(&self, axis: usize) -> Result<Tensor> {
        let rank = self.rank();
        if axis >= rank {
            return Err(Error::Axis {
                op: "sum_axis",
                axis,
                rank,
            });
        }
        if let Some(gpu) = self.gpu() {
            return self.cuda_sum_axis(gpu, axis);
        }
        let values = self.to_vec_f64()?;
        let outer: usize = self.shape[..axis].iter().product();
        let len = self.shape[axis];
        let inner: usize = self.shape[axis + 1..].iter().product();
        let mut out = vec![0f64; outer * inner];
        for o in 0..outer {
            for i in 0..inner {
                out[o * inner + i] = (0..len).map(|j| values[(o * len + j) * inner + i]).sum();
            }
        }
        let mut shape = self.shape.clone();
        shape.remove(axis);
        let strides = contiguous_strides(&shape);
        self.alike(encode_f64(&out, self.dtype), shape, strides, self.dtype)
    }

    /// The sum of every element, as a 0-D tensor (`x.sum()`).
    pub fn sum(&self) -> Result<Tensor> {
        let flat = self.contiguous()?.reshape(&[self.numel()])?;
        flat.sum_axis(0)
    }

    /// A view with dimensions `d0` and `d1` swapped (`x.T` is `transpose(0, 1)` of a matrix).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        let rank = self.rank();
        if d0 >= rank || d1 >= rank {
            return Err(Error::Axis {
                op: "transpose",
                axis: d0.max(d1),
                rank,
            });
        }
        let mut dims: Vec<usize> = (0..rank).collect();
        dims.swap(d0, d1);
        self.permute(&dims)
    }

    /// Batched matrix product: `self [b, m, k] x other [b, k, n] -> [b, m, n]`. On the CPU each
    /// of the `b` products goes through [`Tensor::matmul`]'s reference (f64, f32, tf32); on a
    /// GPU all of them through one strided-batched cuBLAS call (every dtype; transposed views
    /// are read in place).
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        self.check_binary("bmm", other)?;
        let (&[b, m, k], &[b2, k2, n]) = (self.shape.as_slice(), other.shape.as_slice()) else {
            let bad = if self.rank() != 3 { self } else { other };
            return Err(Error::Rank {
                op: "bmm",
                expected: 3,
                shape: bad.shape.clone(),
            });
        };
        if b != b2 || k != k2 {
            return Err(Error::ShapeMismatch {
                op: "bmm",
                left: self.shape.clone(),
                right: other.shape.clone(),
                expected: "[b, m, k] and [b, k, n]",
            });
        }
        if let Some(gpu) = self.gpu() {
            return self.cuda_batched_matmul(gpu, "bmm", other, (b, m, n, k), vec![b, m, n]);
        }
        let (lhs, rhs) = (self.to_bytes()?, other.to_bytes()?);
        let mut out = Vec::with_capacity(b * m * n * self.dtype.size_bytes());
        for i in 0..b {
            let a = batch_item(&lhs, i, &[m, k], self.dtype)?;
            let c = batch_item(&rhs, i, &[k, n], self.dtype)?;
            out.extend(a.matmul(&c)?.to_bytes()?);
        }
        let shape = vec![b, m, n];
        let strides = contiguous_strides(&shape);
        self.alike(out, shape, strides, self.dtype)
    }

    /// `self (m x k) * other (k x n)` for 2-D tensors of one dtype on one device: on the CPU
    /// f64, f32 or tf32 (tf32 computes in full f32 here) through the reference matmul
    /// ([`crate::cpu`]); on a GPU any dtype through cuBLAS (tf32 on tensor cores).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.check_binary("matmul", other)?;
        let (&[m, k], &[k2, n]) = (self.shape.as_slice(), other.shape.as_slice()) else {
            let bad = if self.rank() != 2 { self } else { other };
            return Err(Error::Rank {
                op: "matmul",
                expected: 2,
                shape: bad.shape.clone(),
            });
        };
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                left: self.shape.clone(),
                right: other.shape.clone(),
                expected: "[m, k] and [k, n]",
            });
        }
        let out_shape = vec![m, n];
        let (mn, _) = sizes(&out_shape, self.dtype)?;
        if let Some(gpu) = self.gpu() {
            return self.cuda_batched_matmul(gpu, "matmul", other, (1, m, n, k), out_shape);
        }
        let bytes = match self.dtype {
            DType::F64 => {
                let mut c = vec![0f64; mn];
                if mn > 0 && k > 0 {
                    let (a, b) = (self.to_vec_f64()?, other.to_vec_f64()?);
                    crate::cpu::matmul_f64(&a, &b, &mut c, m, n, k);
                }
                encode_f64(&c, DType::F64)
            }
            DType::F32 | DType::Tf32 => {
                let mut c = vec![0f32; mn];
                if mn > 0 && k > 0 {
                    let (a, b) = (self.to_vec_f32()?, other.to_vec_f32()?);
                    crate::cpu::matmul_f32(&a, &b, &mut c, m, n, k);
                }
                encode_f32(&c, DType::F32)
            }
            dtype => {
                return Err(Error::UnsupportedDType {
                    op: "matmul",
                    dtype,
                    supported: "f64, f32, tf32",
                })
            }
        };
        let strides = contiguous_strides(&out_shape);
        self.alike(bytes, out_shape, strides, self.dtype)
    }
}

/// Item `i` of a batch held as contiguous bytes, as a host tensor of `shape` (a copy).
fn batch_item(bytes: &[u8], i: usize, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let per: usize = shape.iter().product::<usize>() * dtype.size_bytes();
    let piece = bytes
        .get(i * per..(i + 1) * per)
        .ok_or(Error::StorageTooSmall {
            storage_bytes: bytes.len(),
            needed: (i + 1) * per,
        })?
        .to_vec();
    Tensor::from_bytes(shape, dtype, piece)
}
