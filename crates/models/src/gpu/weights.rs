//! A model's weights on the device, for one dtype and layout: each convolution's filter (KCRS or
//! KRSC, input channels zero-padded where the layout wants them) and bias as tensors, and the
//! classifier in f32.

use super::lower::{ConvLayer, NetShape};
use super::GpuContext;
use crate::error::{Error, Result};
use crate::forward::{FoldedConv, FoldedResNet};
use gpukit_tensor::{DType, Layout, Tensor};
use rayon::prelude::*;

/// A convolution's weights on the device.
pub(super) struct DeviceConv {
    pub layer: ConvLayer,
    pub weight: Tensor,
    pub bias: Tensor,
}

/// A model's weights on the device for one dtype and layout.
pub struct GpuWeights {
    pub dtype: DType,
    pub layout: Layout,
    pub(super) convs: Vec<DeviceConv>,
    /// classes x features (PyTorch's order), f32.
    pub(super) fc_weight: Tensor,
    pub(super) fc_bias: Tensor,
    /// Bytes of all weights on the device.
    pub bytes: usize,
    /// The shapes (classes, features, the stem's input channels), for the op list and plan.
    pub shape: NetShape,
}

/// K x C x R x S weights (PyTorch's order) as K x C' x R x S, C' >= C, the extra input channels
/// zero.
pub(super) fn pad_channels(conv: &FoldedConv, c_out: usize) -> Vec<f32> {
    let (k, c, rs) = (conv.out_ch, conv.in_ch, conv.kernel * conv.kernel);
    let mut out = vec![0f32; k * c_out * rs];
    for (o, filter) in conv.weight.chunks_exact(c * rs).enumerate() {
        out[o * c_out * rs..][..c * rs].copy_from_slice(filter);
    }
    out
}

/// The filter of `conv` as a tensor of `dtype` in `layout`, input channels padded to `c_pad`.
pub(super) fn filter(
    conv: &FoldedConv,
    c_pad: usize,
    dtype: DType,
    layout: Layout,
) -> Result<Tensor> {
    let r = conv.kernel;
    let t = Tensor::from_f32_as(
        &[conv.out_ch, c_pad, r, r],
        &pad_channels(conv, c_pad),
        dtype,
    )?;
    Ok(match layout {
        Layout::Nhwc => t.to_nhwc()?,
        Layout::Nchw => t,
    })
}

impl GpuWeights {
    /// Converts and uploads `model`'s weights.
    pub fn upload(
        ctx: &GpuContext,
        model: &FoldedResNet,
        dtype: DType,
        layout: Layout,
    ) -> Result<GpuWeights> {
        let shape = NetShape::of(model, dtype, layout)?;
        // the order of NetShape::of: the stem, then per block its main path and its projection
        let mut jobs: Vec<(&FoldedConv, Option<Vec<f32>>)> = vec![(&model.stem, None)];
        for block in &model.blocks {
            let last = block.convs.len() - 1;
            for (i, conv) in block.convs.iter().enumerate() {
                // the projection's bias joins the last convolution's (both feed one sum)
                let bias = match (&block.downsample, i == last) {
                    (Some(d), true) => Some(
                        conv.bias
                            .iter()
                            .zip(&d.bias)
                            .map(|(a, b)| a + b)
                            .collect::<Vec<f32>>(),
                    ),
                    _ => None,
                };
                jobs.push((conv, bias));
            }
            if let Some(d) = &block.downsample {
                jobs.push((d, Some(vec![0.0; d.out_ch])));
            }
        }
        if jobs.len() != shape.convs.len() {
            return Err(Error::Invalid(
                "internal: the convolutions and the network shape disagree".into(),
            ));
        }
        // converted on every core (the filters of a ResNet-50 are 25 million values), then
        // uploaded in order
        let host: Vec<(ConvLayer, Tensor, Tensor)> = jobs
            .into_par_iter()
            .zip(shape.convs.par_iter().copied())
            .map(|((conv, bias), layer)| -> Result<_> {
                let w = filter(conv, layer.c, dtype, layout)?;
                let b = Tensor::from_f32_as(
                    &[conv.out_ch],
                    &bias.unwrap_or_else(|| conv.bias.clone()),
                    dtype,
                )?;
                Ok((layer, w, b))
            })
            .collect::<Result<_>>()?;
        let mut convs = Vec::with_capacity(host.len());
        let mut bytes = 0;
        for (layer, w, b) in host {
            ctx.check_limit(w.bytes() + b.bytes(), "the weights")?;
            bytes += w.bytes() + b.bytes();
            convs.push(DeviceConv {
                layer,
                weight: w.to_gpu(&ctx.gpu)?,
                bias: b.to_gpu(&ctx.gpu)?,
            });
        }
        let (features, classes) = (shape.features, model.num_classes);
        let fc_weight =
            Tensor::from_f32(&[classes, features], model.fc_weight.clone())?.to_gpu(&ctx.gpu)?;
        let fc_bias = Tensor::from_f32(&[classes], model.fc_bias.clone())?.to_gpu(&ctx.gpu)?;
        bytes += fc_weight.bytes() + fc_bias.bytes();
        Ok(GpuWeights {
            dtype,
            layout,
            convs,
            fc_weight,
            fc_bias,
            bytes,
            shape,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(out_ch: usize, in_ch: usize, kernel: usize, weight: Vec<f32>) -> FoldedConv {
        FoldedConv {
            out_ch,
            in_ch,
            kernel,
            stride: 1,
            pad: 0,
            weight,
            bias: vec![0.0; out_ch],
        }
    }

    #[test]
    fn filters_are_padded_and_laid_out_per_layout() {
        let c = conv(2, 3, 1, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            pad_channels(&c, 4),
            vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]
        );
        // c0: 1 2 / 3 4, c1: 5 6 / 7 8
        let c3 = conv(1, 2, 2, (1..=8).map(|v| v as f32).collect());
        let memory =
            |t: Tensor| gpukit_tensor::codec::decode_f32(t.host_storage().unwrap(), t.dtype());
        // KCRS: channels major; KRSC: (r, s) major, channels inner
        assert_eq!(
            memory(filter(&c3, 2, DType::F32, Layout::Nchw).unwrap()),
            (1..=8).map(|v| v as f32).collect::<Vec<_>>()
        );
        assert_eq!(
            memory(filter(&c3, 2, DType::F32, Layout::Nhwc).unwrap()),
            vec![1.0, 5.0, 2.0, 6.0, 3.0, 7.0, 4.0, 8.0]
        );
        let f16 = filter(&c3, 3, DType::F16, Layout::Nhwc).unwrap();
        assert_eq!((f16.shape(), f16.bytes()), (&[1, 3, 2, 2][..], 24));
    }
}
