//! Max pooling forward and backward.

use super::*;

/// A cuDNN pooling descriptor, destroyed on drop.
struct PoolDesc(dn::cudnnPoolingDescriptor_t);

impl Drop for PoolDesc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created in Dnn::max_pool, destroyed only here.
            unsafe { dn::cudnnDestroyPoolingDescriptor(self.0) };
        }
    }
}

/// Max pooling of square windows: descriptors of the pooling, its input and its output.
pub struct MaxPool {
    desc: PoolDesc,
    x: TensorDesc,
    y: TensorDesc,
    pub input: Maps,
    pub output: Maps,
}

impl Dnn {
    /// Max pooling of `input` by `window` x `window` windows every `stride` positions, `pad`
    /// padding positions (never chosen) on each side, floor mode. cuDNN's deterministic max
    /// pooling: its backward gives each output's gradient to one input of its window.
    pub fn max_pool(
        &self,
        input: Maps,
        window: usize,
        stride: usize,
        pad: usize,
    ) -> Result<MaxPool> {
        let (oh, ow) = (
            pool_out(input.h, window, stride, pad),
            pool_out(input.w, window, stride, pad),
        );
        if oh == 0 || ow == 0 || pad >= window {
            return Err(Error::Invalid(format!(
                "max pooling {window}x{window} stride {stride} padding {pad} over {}x{} maps",
                input.h, input.w
            )));
        }
        let output = Maps {
            h: oh,
            w: ow,
            ..input
        };
        let mut desc = PoolDesc(std::ptr::null_mut());
        // SAFETY: writes a descriptor that `desc` owns, then sets it.
        unsafe {
            ok(
                "cudnnCreatePoolingDescriptor",
                dn::cudnnCreatePoolingDescriptor(&mut desc.0),
            )?;
            ok(
                "cudnnSetPooling2dDescriptor",
                dn::cudnnSetPooling2dDescriptor(
                    desc.0,
                    dn::cudnnPoolingMode_t::CUDNN_POOLING_MAX_DETERMINISTIC,
                    dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    int(window, "pool window")?,
                    int(window, "pool window")?,
                    int(pad, "pool padding")?,
                    int(pad, "pool padding")?,
                    int(stride, "pool stride")?,
                    int(stride, "pool stride")?,
                ),
            )?;
        }
        Ok(MaxPool {
            desc,
            x: TensorDesc::of(&input)?,
            y: TensorDesc::of(&output)?,
            input,
            output,
        })
    }

    /// `y = maxpool(x)`.
    pub fn max_pool_forward(&self, p: &MaxPool, x: View<'_>, y: View<'_>) -> Result<()> {
        x.require(p.input.bytes(), "pool input")?;
        y.require(p.output.bytes(), "pool output")?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked against the descriptors.
        ok("cudnnPoolingForward", unsafe {
            dn::cudnnPoolingForward(
                self.handle(),
                p.desc.0,
                scalar(&alpha),
                p.x.0,
                x.addr() as *const c_void,
                scalar(&beta),
                p.y.0,
                y.addr() as *mut c_void,
            )
        })
    }

    /// `dx` from `dy`, given the forward's input `x` and output `y`.
    pub fn max_pool_backward(
        &self,
        p: &MaxPool,
        (x, y): (View<'_>, View<'_>),
        dy: View<'_>,
        dx: View<'_>,
    ) -> Result<()> {
        x.require(p.input.bytes(), "pool input")?;
        dx.require(p.input.bytes(), "pool input gradient")?;
        y.require(p.output.bytes(), "pool output")?;
        dy.require(p.output.bytes(), "pool output gradient")?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked against the descriptors.
        ok("cudnnPoolingBackward", unsafe {
            dn::cudnnPoolingBackward(
                self.handle(),
                p.desc.0,
                scalar(&alpha),
                p.y.0,
                y.addr() as *const c_void,
                p.y.0,
                dy.addr() as *const c_void,
                p.x.0,
                x.addr() as *const c_void,
                scalar(&beta),
                p.x.0,
                dx.addr() as *mut c_void,
            )
        })
    }
}
