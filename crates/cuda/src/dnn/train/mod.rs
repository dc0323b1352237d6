//! cuDNN's legacy calls for training a convolutional network: the convolution's three passes
//! (forward, backward data, backward filter) with algorithms from cuDNN's heuristic ranking,
//! batch normalisation in training mode with its backward (the `Ex` forms, whose fused ReLU and
//! add + ReLU ops cuDNN runs where it supports them), and max pooling forward and backward.
//!
//! To use: [`Dnn::plan_conv_train`] once a convolution shape (the plan is kept on the handle, so
//! a network's repeated shapes are planned once), then [`Dnn::conv_train_forward`],
//! [`Dnn::conv_backward_data`] and [`Dnn::conv_backward_filter`] with a workspace of
//! [`ConvTrain::workspace_bytes`]; [`Dnn::batch_norm`] once a norm, then
//! [`Dnn::bn_forward_training`] and [`Dnn::bn_backward`]; [`Dnn::max_pool`] then
//! [`Dnn::max_pool_forward`] / [`Dnn::max_pool_backward`].
//!
//! Strict f32 ([`DType::F32`]) stays off tensor cores in every pass: the convolution's math type
//! is `CUDNN_FMA_MATH` (cuDNN's default math lets Ampere and newer run f32 as TF32) and only
//! algorithms cuDNN lists under FMA or default math are kept. The element type and layout are
//! parameters throughout, so channels-last bf16 (`SPATIAL_PERSISTENT` batch norm) takes the
//! same calls.

use super::legacy::{ConvPlan, FWD_ALGOS};
use super::{data_type, format, ok, Conv, Dnn};
use crate::error::{Error, Result};
use crate::memory::View;
use cudarc::cudnn::sys as dn;
use gpukit_types::{DType, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::rc::Rc;

mod conv;
mod norm;
mod pool;

pub use conv::{Candidate, ConvTrain, Pass};
pub use norm::{BatchNorm, BnBackward, BnForward, BnMode, BnOps};
pub use pool::MaxPool;

/// A host f32 scalar as cuDNN takes it (alpha and beta for float, half and bf16 data).
fn scalar(v: &f32) -> *const c_void {
    v as *const f32 as *const c_void
}

/// A batch of feature maps as cuDNN sees them: (n, c, h, w) in a layout and an element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Maps {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub layout: Layout,
    pub dtype: DType,
}

impl Maps {
    /// Fully packed NCHW f32 maps.
    pub fn nchw_f32(n: usize, c: usize, h: usize, w: usize) -> Maps {
        Maps {
            n,
            c,
            h,
            w,
            layout: Layout::Nchw,
            dtype: DType::F32,
        }
    }

    pub fn elements(&self) -> usize {
        [self.n, self.c, self.h, self.w]
            .iter()
            .fold(1usize, |a, &v| a.saturating_mul(v))
    }

    pub fn bytes(&self) -> usize {
        self.elements().saturating_mul(self.dtype.size_bytes())
    }
}

/// How far one axis of `len` positions pools to with a window, stride and padding (floor mode,
/// as PyTorch); 0 for a window larger than the padded input or a stride of 0.
pub fn pool_out(len: usize, window: usize, stride: usize, pad: usize) -> usize {
    if stride == 0 {
        return 0;
    }
    (len + 2 * pad)
        .checked_sub(window)
        .map_or(0, |span| span / stride + 1)
}

fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Invalid(format!("{what} = {v} exceeds cuDNN's int")))
}

/// A cuDNN tensor descriptor, destroyed on drop.
struct TensorDesc(dn::cudnnTensorDescriptor_t);

impl TensorDesc {
    fn empty() -> Result<TensorDesc> {
        let mut d = TensorDesc(std::ptr::null_mut());
        // SAFETY: writes a descriptor that `d` owns.
        ok("cudnnCreateTensorDescriptor", unsafe {
            dn::cudnnCreateTensorDescriptor(&mut d.0)
        })?;
        Ok(d)
    }

    /// Packed maps in their layout and type.
    fn of(m: &Maps) -> Result<TensorDesc> {
        let d = TensorDesc::empty()?;
        let dt = data_type(m.dtype)?;
        // SAFETY: a live descriptor; the dimensions are positive ints (checked by int()).
        ok("cudnnSetTensor4dDescriptor", unsafe {
            dn::cudnnSetTensor4dDescriptor(
                d.0,
                format(m.layout),
                dt,
                int(m.n, "batch")?,
                int(m.c, "channels")?,
                int(m.h, "height")?,
                int(m.w, "width")?,
            )
        })?;
        Ok(d)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created in empty(), destroyed only here.
            unsafe { dn::cudnnDestroyTensorDescriptor(self.0) };
        }
    }
}

/// A cuDNN ReLU activation descriptor, destroyed on drop.
struct ReluDesc(dn::cudnnActivationDescriptor_t);

impl ReluDesc {
    fn new() -> Result<ReluDesc> {
        let mut d = ReluDesc(std::ptr::null_mut());
        // SAFETY: writes a descriptor that `d` owns, then sets it.
        unsafe {
            ok(
                "cudnnCreateActivationDescriptor",
                dn::cudnnCreateActivationDescriptor(&mut d.0),
            )?;
            ok(
                "cudnnSetActivationDescriptor",
                dn::cudnnSetActivationDescriptor(
                    d.0,
                    dn::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                    dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    0.0,
                ),
            )?;
        }
        Ok(d)
    }
}

impl Drop for ReluDesc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created in new(), destroyed only here.
            unsafe { dn::cudnnDestroyActivationDescriptor(self.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_extents_are_floor_mode() {
        // the ResNet stem's pool: 3x3 stride 2 padding 1
        assert_eq!(pool_out(112, 3, 2, 1), 56);
        assert_eq!(pool_out(16, 3, 2, 1), 8);
        assert_eq!(pool_out(7, 3, 2, 1), 4);
        assert_eq!(pool_out(1, 3, 2, 1), 1);
        assert_eq!(pool_out(1, 3, 2, 0), 0);
        assert_eq!(pool_out(5, 2, 0, 0), 0);
    }

    #[test]
    fn maps_count_elements_and_bytes() {
        let m = Maps::nchw_f32(4, 64, 16, 16);
        assert_eq!(m.elements(), 4 * 64 * 256);
        assert_eq!(m.bytes(), 4 * 4 * 64 * 256);
        let h = Maps {
            dtype: DType::Bf16,
            layout: Layout::Nhwc,
            ..m
        };
        assert_eq!(h.bytes(), 2 * 4 * 64 * 256);
        let huge = Maps::nchw_f32(usize::MAX, 2, 2, 2);
        assert_eq!(huge.bytes(), usize::MAX);
    }
}
