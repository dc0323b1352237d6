//! Planning a [`super::GpuResNet`]: each unit's convolution and norm described for cuDNN in the
//! trainer's layout and element type (the stem's 3 image channels padded to 8 in channel-last
//! 16-bit training), their buffers allocated, and which 1x1 filter gradients cuBLAS computes
//! faster than cuDNN.

use super::layout::ALIGN;
use super::memory::UnitSlots;
use super::stem;
use super::F32;
use crate::cnn::resnet::{ResNet, Unit};
use crate::error::{Error, Result};
use crate::precision::Precision;
use gpukit_cuda::blas::Blas;
use gpukit_cuda::dnn::{BatchNorm, BnMode, BnOps, Conv, ConvTrain, Dnn, Maps};
use gpukit_cuda::{DeviceBuffer, Gpu};
use gpukit_types::{ConvShape, Layout};
use std::rc::Rc;

/// The convolution of a unit over `input` maps, as cuDNN describes it (in the input's layout
/// and element type), and its output maps; an error when the input's channels are not the convolution's or the maps are
/// too small to leave one output position.
pub fn unit_shapes(unit: &Unit, input: Maps) -> Result<(Conv, Maps)> {
    let c = unit.conv;
    let blocked = input.layout == Layout::Nhwc
        && input.c == stem::BLOCK_CHANNELS
        && stem::is_stem(c.in_channels, c.kernel, c.stride, c.padding);
    if !blocked && input.c != device_channels(c.in_channels, input.layout) {
        return Err(Error::Setting(format!(
            "a convolution of {} input channels given maps of {}",
            c.in_channels, input.c
        )));
    }
    // the stem over 2x2 blocks: a 4x4 stride-1 convolution of the padded blocks (stem.rs)
    let (kernel, stride, pad) = match blocked {
        true => (stem::TAPS, 1, 0),
        false => (c.kernel, c.stride, c.padding),
    };
    let shape = ConvShape {
        n: input.n,
        c: input.c,
        h: input.h,
        w: input.w,
        k: c.out_channels,
        r: kernel,
        s: kernel,
        stride,
        pad,
        groups: 1,
    };
    let (oh, ow) = shape.out_hw();
    if oh == 0 || ow == 0 {
        return Err(Error::Setting(format!(
            "images too small: a {k}x{k} convolution of stride {s} leaves no position of {}x{} maps",
            input.h,
            input.w,
            k = c.kernel,
            s = c.stride
        )));
    }
    let conv = Conv {
        shape,
        layout: input.layout,
        dtype: input.dtype,
    };
    let output = Maps {
        c: c.out_channels,
        h: oh,
        w: ow,
        ..input
    };
    Ok((conv, output))
}

/// The channels a convolution's input and filter have on the device: channels-last 16-bit
/// maps in whole 8-channel vectors (the stem's 3 become 8, their filter taps zero: cuDNN's
/// tensor-core kernels take them), else the network's own.
pub fn device_channels(c: usize, layout: Layout) -> usize {
    match layout {
        Layout::Nhwc => c.next_multiple_of(8),
        Layout::Nchw => c,
    }
}

/// Whether the stem's ReLU and max pool run as gpukit's kernels over its norm's output `stem`
/// (channel-last maps they take; a `window` x `window` pool): cuDNN's pool, and the ReLU
/// fused into cuDNN's norm (or after it), otherwise.
pub fn pools_on_kernels(stem: &Maps, window: usize) -> bool {
    stem.layout == Layout::Nhwc
        && super::kernels::CnnKernels::max_pool_runs(stem.dtype, stem.c, stem.elements(), window)
}

/// The maps of a batch of images in a precision: fp32 and tf32 NCHW f32 (tf32 is the
/// convolutions' and products' arithmetic, `Precision::inputs`), or 16-bit NHWC: 2x2 blocks of pixels
/// where the sizes are even (the stem runs on them: `stem.rs`), else 3 channels padded to
/// [`device_channels`]. tf32 stays NCHW: cuDNN's legacy training algorithms for channels-last
/// f32 ran off tensor cores (IMPLICIT_GEMM, ALGO_0/1), ResNet-18 at 1,075 images/s against
/// 4,306 NCHW (run 96).
pub fn input_maps(precision: Precision, batch: usize, (h, w): (usize, usize)) -> Result<Maps> {
    let (layout, dtype) = match precision {
        Precision::Fp32 | Precision::Tf32 => (Layout::Nchw, F32),
        Precision::Bf16 | Precision::Fp16 => (Layout::Nhwc, precision.storage()),
    };
    if stem::runs_on_blocks(layout, (h, w)) {
        let (bh, bw) = stem::block_dims((h, w));
        return Ok(Maps {
            n: batch,
            c: stem::BLOCK_CHANNELS,
            h: bh,
            w: bw,
            layout,
            dtype,
        });
    }
    Ok(Maps {
        n: batch,
        c: device_channels(3, layout),
        h,
        w,
        layout,
        dtype,
    })
}

/// One convolution and its batch norm on the GPU, with the buffers the step keeps.
pub(super) struct GpuUnit {
    pub(super) spec: Unit,
    pub(super) conv: Rc<ConvTrain>,
    pub(super) bn: BatchNorm,
    /// What follows the norm in the network: nothing (a downsampling unit, whose output is the
    /// residual), ReLU, or the residual add then ReLU (a block's last unit). cuDNN runs it
    /// when `bn.ops` is the same, else gpukit's kernels do.
    pub(super) role: BnOps,
    /// The maps it reads and writes.
    pub(super) output: Maps,
    /// The convolution's output (the norm's input, kept for the norm's backward) and the
    /// norm's output (after the ReLU or the residual add and ReLU that follow it): their places
    /// in the trainer's arena of maps.
    pub(super) maps: UnitSlots,
    pub(super) reserve: Option<DeviceBuffer>,
    /// Offsets (f32 elements) of the batch mean and inverse std in the saved-statistics buffer.
    pub(super) saved: (usize, usize),
    /// The filter's gradient as one cuBLAS product (a channels-last 1x1 stride-1 convolution's
    /// is dY^T X), where that timed faster than cuDNN's chosen algorithm.
    pub(super) gemm_filter: bool,
    /// With activation checkpointing, where its block's stage recomputes its maps.
    pub(super) recompute: Option<UnitSlots>,
}

impl GpuUnit {
    /// Whether cuDNN runs what follows the norm.
    pub(super) fn fused(&self) -> bool {
        self.bn.ops == self.role
    }

    /// The maps its backward reads: the recomputed ones with checkpointing, else the forward's.
    pub(super) fn backward_maps(&self) -> UnitSlots {
        self.recompute.unwrap_or(self.maps)
    }
}

/// `unit` with the slots its block's stage recomputes its maps into (`again`: None without
/// checkpointing; Some(None) when the plan has none for it, an error), checked against its
/// output's size.
pub(super) fn recomputed_in(
    mut unit: GpuUnit,
    again: Option<Option<UnitSlots>>,
) -> Result<GpuUnit> {
    let Some(again) = again else {
        return Ok(unit);
    };
    match again {
        Some(r)
            if r.conv_out.bytes == unit.output.bytes() && r.bn_out.bytes == unit.output.bytes() =>
        {
            unit.recompute = Some(r);
            Ok(unit)
        }
        _ => Err(Error::Failed(format!(
            "the maps' plan recomputes {again:?} for {:?}",
            unit.output
        ))),
    }
}

pub(super) struct GpuBlock {
    pub(super) main: Vec<GpuUnit>,
    pub(super) down: Option<GpuUnit>,
}

/// The norm of a unit: in 16-bit channels-last maps cuDNN's persistent kernels with the
/// unit's ReLU or add + ReLU fused, else (fp32, or where cuDNN runs no fused form) bare.
pub(super) fn plan_norm(dnn: &Dnn, output: Maps, role: BnOps, spec: &Unit) -> Result<BatchNorm> {
    let stats = (spec.bn.eps, spec.bn.momentum);
    if output.dtype != F32 {
        for ops in [role, BnOps::Bn] {
            match dnn.batch_norm(output, ops, BnMode::SpatialPersistent, stats) {
                Ok(bn) => return Ok(bn),
                Err(gpukit_cuda::Error::NoAlgorithm(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(dnn.batch_norm(output, BnOps::Bn, BnMode::Spatial, stats)?)
}

/// Plans a unit over `input` whose maps the arena keeps at `maps`, its convolution in
/// `arithmetic` (the precision's `inputs`: tf32's f32 maps multiply on tensor cores, where
/// fp32 stays strict and exact), and allocates its norm's reserve; `saved_at` hands out its place
/// in the saved-statistics buffer.
pub(super) fn plan_unit(
    (dnn, gpu, arithmetic): (&Dnn, &Gpu, gpukit_types::DType),
    (spec, role): (&Unit, BnOps),
    (input, maps): (Maps, UnitSlots),
    saved_at: &mut usize,
) -> Result<GpuUnit> {
    let (mut conv, output) = unit_shapes(spec, input)?;
    if arithmetic.storage() != input.dtype {
        return Err(Error::Failed(format!(
            "{} products over maps of {}",
            arithmetic.name(),
            input.dtype.name()
        )));
    }
    conv.dtype = arithmetic;
    if [maps.conv_out, maps.bn_out]
        .iter()
        .any(|s| s.bytes != output.bytes())
    {
        return Err(Error::Failed(format!(
            "the maps' plan holds {maps:?} for {output:?}"
        )));
    }
    let conv = dnn.plan_conv_train(conv)?;
    let bn = plan_norm(dnn, output, role, spec)?;
    let c = output.c;
    let mean = *saved_at;
    let invstd = (mean + c).next_multiple_of(ALIGN);
    *saved_at = (invstd + c).next_multiple_of(ALIGN);
    let reserve = match bn.reserve_bytes() {
        0 => None,
        r => Some(gpu.alloc(r)?),
    };
    Ok(GpuUnit {
        spec: *spec,
        conv,
        role,
        output,
        maps,
        reserve,
        saved: (mean, invstd),
        bn,
        gemm_filter: false,
        recompute: None,
    })
}

/// Whether a unit's filter gradient is a plain product in its layout: channels-last 16-bit
/// maps through a 1x1 filter without padding (each output pixel is one input pixel's channels
/// times the filter), dW [k, c] = dY^T [k, pixels] X [pixels, c]; at a stride above 1 over the
/// input's pixels gathered first ([`super::kernels::CnnKernels::subsample_nhwc`]).
fn filter_is_a_product(conv: &Conv) -> bool {
    let s = conv.shape;
    conv.layout == Layout::Nhwc
        && conv.dtype.uses_tensor_cores()
        && (s.r, s.s, s.pad, s.groups) == (1, 1, 0, 1)
        && (s.stride == 1
            || super::kernels::CnnKernels::subsample_runs(conv.dtype, s.c, s.input_len()))
}

/// For each distinct convolution whose filter gradient is a product, whether cuBLAS computes it
/// (after gathering a strided convolution's pixels) faster than cuDNN's chosen algorithm: both
/// timed (median of 5 after a warm-up) on scratch buffers of the convolution's shapes. cuDNN's
/// algorithms for a 64x64 filter over 800K pixels (ResNet-50's layer1.0.conv1 at batch 256) ran
/// at 3 TFLOP/s (run 94), for ResNet-18's 1x1 stride-2 128 -> 256 at batch 64 at 1.2 (run 95).
pub(super) fn time_filter_products(
    (dnn, blas, ck, gpu): (&Dnn, &Blas, &super::kernels::CnnKernels, &Gpu),
    convs: impl Iterator<Item = Rc<ConvTrain>>,
) -> Result<std::collections::HashMap<Conv, bool>> {
    let mut faster = std::collections::HashMap::new();
    for plan in convs {
        let conv = plan.conv();
        if !filter_is_a_product(&conv) || faster.contains_key(&conv) {
            continue;
        }
        let s = conv.shape;
        let es = conv.dtype.size_bytes();
        let (oh, ow) = s.out_hw();
        let pixels = s.n * oh * ow;
        let (x, dy, dw) = (
            gpu.alloc(s.input_len() * es)?,
            gpu.alloc(pixels * s.k * es)?,
            gpu.alloc(s.k * s.c * es)?,
        );
        let gathered = match s.stride {
            1 => None,
            _ => Some(gpu.alloc(pixels * s.c * es)?),
        };
        let ws = gpu.alloc(plan.workspace_bytes().max(256))?;
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let stream = gpu.stream();
        let cudnn = median(gpukit_cuda::timing::time_on_stream(stream, 1, 5, || {
            dnn.conv_backward_filter(&plan, (x.view(), dy.view(), dw.view()), ws.view(), false)
                .map_err(Error::from)
        })?);
        let cublas = median(gpukit_cuda::timing::time_on_stream(stream, 1, 5, || {
            let x = match &gathered {
                Some(g) => {
                    ck.subsample_nhwc(
                        (x.view(), g.view()),
                        conv.dtype,
                        (s.n, s.h, s.w, s.c),
                        (oh, ow),
                        s.stride,
                    )?;
                    g.view()
                }
                None => x.view(),
            };
            blas.gemm_batched(
                conv.dtype,
                (dy.view(), x, dw.view()),
                (1, s.k, s.c, pixels),
                (true, false),
            )
            .map_err(Error::from)
        })?);
        gpukit_cuda::trace::note(|| {
            format!("{conv:?}: filter gradient cuDNN {cudnn:.3} ms, cuBLAS {cublas:.3} ms")
        });
        faster.insert(conv, cublas < cudnn);
    }
    Ok(faster)
}

/// How a filter parameter is held on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeviceFilter {
    /// KRSC: `k` filters of `taps` taps of `c` channels, padded with zeros to `wide`.
    Krsc {
        k: usize,
        c: usize,
        taps: usize,
        wide: usize,
    },
    /// The stem's `k` filters over 2x2 blocks (`stem.rs`).
    Blocks { k: usize },
}

impl DeviceFilter {
    pub(super) fn len(&self) -> usize {
        match *self {
            DeviceFilter::Krsc { k, taps, wide, .. } => k * taps * wide,
            DeviceFilter::Blocks { k } => k * stem::TAPS * stem::TAPS * stem::BLOCK_CHANNELS,
        }
    }
}

/// Each parameter's form on the device when it is a filter held channels-last (16-bit
/// training over `input`), else None.
pub(super) fn filters_of(model: &ResNet<f32>, input: Maps) -> Vec<Option<DeviceFilter>> {
    let blocks = input.layout == Layout::Nhwc && input.c == stem::BLOCK_CHANNELS;
    let stem = model.stem();
    model
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| match (&p.shape[..], input.layout) {
            (&[k, ..], Layout::Nhwc)
                if blocks
                    && i == stem.weight
                    && stem::is_stem(
                        stem.conv.in_channels,
                        stem.conv.kernel,
                        stem.conv.stride,
                        stem.conv.padding,
                    ) =>
            {
                Some(DeviceFilter::Blocks { k })
            }
            (&[k, c, r, s], Layout::Nhwc) => Some(DeviceFilter::Krsc {
                k,
                c,
                taps: r * s,
                wide: device_channels(c, input.layout),
            }),
            _ => None,
        })
        .collect()
}

/// Each parameter's length on the device (a filter's padded channels or blocked taps included).
pub fn device_lens(model: &ResNet<f32>, input: Maps) -> Vec<usize> {
    model
        .params
        .iter()
        .zip(filters_of(model, input))
        .map(|(p, f)| f.map_or(p.data.len(), |f| f.len()))
        .collect()
}
