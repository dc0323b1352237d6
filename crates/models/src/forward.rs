//! ResNet inference on the CPU: batch norm folded into the convolutions once, then convolution
//! (+ bias, + residual, ReLU), max pooling, global average pooling and the classifier. This is the
//! reference every GPU strategy is checked against, so it keeps the network plain; the speed is in
//! `gpukit_tensor::cpu::conv2d_nhwc_packed`: activations stay NHWC (channels-last) from the stem
//! to the pooling, weights are packed once on first use, and every convolution applies its bias,
//! residual and ReLU as it stores its output.

use crate::error::{Error, Result};
use crate::resnet::ResNet;
use crate::weights::StateDict;
use gpukit_cuda::profiler::{op, OpGuard, OpInfo};
use gpukit_tensor::cpu::{
    conv2d_nhwc_packed, conv2d_nhwc_packed_onto, parallel_rows, AlignedBuf, PackedConv,
};
use gpukit_tensor::{ConvShape, DType, Device, Tensor};
use std::sync::OnceLock;

mod peaks;
pub(crate) use peaks::block_name;
pub use peaks::Peaks;

/// torchvision's BatchNorm2d epsilon.
pub const BN_EPS: f32 = 1e-5;

/// A convolution with its batch norm folded in: `y = conv(x, weight) + bias`.
#[derive(Debug, Clone, PartialEq)]
pub struct FoldedConv {
    pub out_ch: usize,
    pub in_ch: usize,
    pub kernel: usize,
    pub stride: usize,
    pub pad: usize,
    /// K x C x R x S.
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// One residual block: two (basic) or three (bottleneck) convolutions and an optional projection.
#[derive(Debug, Clone, PartialEq)]
pub struct FoldedBlock {
    pub convs: Vec<FoldedConv>,
    pub downsample: Option<FoldedConv>,
}

/// A ResNet ready for inference.
#[derive(Debug, Clone, PartialEq)]
pub struct FoldedResNet {
    pub model: ResNet,
    pub num_classes: usize,
    pub stem: FoldedConv,
    pub blocks: Vec<FoldedBlock>,
    /// classes x features.
    pub fc_weight: Vec<f32>,
    pub fc_bias: Vec<f32>,
    /// The CPU engine's packed copy of the weights above, built on the first CPU forward pass
    /// (so GPU-only users never pay for it). It is not rebuilt when they change: a model whose
    /// weights are edited after running on the CPU needs a fresh `CpuPack::default()`.
    pub cpu_pack: CpuPack,
}

/// Weights packed for the CPU engine (see [`FoldedResNet::cpu_pack`]), built once on first use.
/// A cache: clones start empty, and it takes no part in equality.
#[derive(Default)]
pub struct CpuPack(OnceLock<PackedNet>);

impl Clone for CpuPack {
    fn clone(&self) -> Self {
        CpuPack::default()
    }
}

impl PartialEq for CpuPack {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for CpuPack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuPack {{ built: {} }}", self.0.get().is_some())
    }
}

/// Every convolution of a [`FoldedResNet`] packed, in the model's order, the classifier as a
/// 1x1 convolution.
struct PackedNet {
    stem: PackedConv,
    blocks: Vec<PackedBlock>,
    fc: PackedConv,
}

/// A block's convolutions and projection, packed.
type PackedBlock = (Vec<PackedConv>, Option<PackedConv>);

impl PackedNet {
    fn new(m: &FoldedResNet) -> Self {
        let pack = |c: &FoldedConv| {
            PackedConv::new((c.out_ch, c.in_ch, c.kernel, c.kernel), &c.weight, &c.bias)
        };
        let features = m.fc_weight.len() / m.num_classes.max(1);
        PackedNet {
            stem: pack(&m.stem),
            blocks: m
                .blocks
                .iter()
                .map(|b| {
                    (
                        b.convs.iter().map(pack).collect(),
                        b.downsample.as_ref().map(pack),
                    )
                })
                .collect(),
            fc: PackedConv::new((m.num_classes, features, 1, 1), &m.fc_weight, &m.fc_bias),
        }
    }
}

fn param<'a>(dict: &'a StateDict, name: &str, len: usize) -> Result<&'a [f32]> {
    let p = dict
        .get(name)
        .ok_or_else(|| Error::Fold(format!("missing {name}")))?;
    if p.data.len() != len {
        return Err(Error::Fold(format!(
            "{name} has {} values, expected {len}",
            p.data.len()
        )));
    }
    Ok(&p.data)
}

/// Folds `bn` (gamma, beta, mean, var) into the convolution `conv` (its `.weight` key):
/// w' = w * gamma / sqrt(var + eps), b' = beta - mean * gamma / sqrt(var + eps).
fn fold_conv(dict: &StateDict, conv: &str, bn: &str, stride: usize) -> Result<FoldedConv> {
    let w = dict
        .get(&format!("{conv}.weight"))
        .ok_or_else(|| Error::Fold(format!("missing {conv}.weight")))?;
    let [k, c, r, s] = w.shape[..] else {
        return Err(Error::Fold(format!("{conv}.weight is not 4-D")));
    };
    let gamma = param(dict, &format!("{bn}.weight"), k)?;
    let beta = param(dict, &format!("{bn}.bias"), k)?;
    let mean = param(dict, &format!("{bn}.running_mean"), k)?;
    let var = param(dict, &format!("{bn}.running_var"), k)?;
    let per_out = c * r * s;
    let mut weight = w.data.clone();
    let mut bias = vec![0f32; k];
    for o in 0..k {
        // f64 keeps the fold itself from adding rounding beyond the final f32 store
        let scale = f64::from(gamma[o]) / (f64::from(var[o]) + f64::from(BN_EPS)).sqrt();
        for x in &mut weight[o * per_out..(o + 1) * per_out] {
            *x = (f64::from(*x) * scale) as f32;
        }
        bias[o] = (f64::from(beta[o]) - f64::from(mean[o]) * scale) as f32;
    }
    Ok(FoldedConv {
        out_ch: k,
        in_ch: c,
        kernel: r,
        stride,
        pad: r / 2,
        weight,
        bias,
    })
}

/// Folds every batch norm of `dict` into its convolution.
pub fn fold(dict: &StateDict) -> Result<FoldedResNet> {
    let model = dict.model;
    let stem = fold_conv(dict, "conv1", "bn1", 2)?;
    let mut blocks = Vec::new();
    let mut in_ch = 64;
    let expansion = if model.bottleneck() { 4 } else { 1 };
    for (stage, &n) in model.blocks().iter().enumerate() {
        let width = 64 << stage;
        for b in 0..n {
            let p = format!("layer{}.{b}", stage + 1);
            let stride = if b == 0 && stage > 0 { 2 } else { 1 };
            let convs = if model.bottleneck() {
                // torchvision v1.5: the stride sits on the 3x3 convolution
                vec![
                    fold_conv(dict, &format!("{p}.conv1"), &format!("{p}.bn1"), 1)?,
                    fold_conv(dict, &format!("{p}.conv2"), &format!("{p}.bn2"), stride)?,
                    fold_conv(dict, &format!("{p}.conv3"), &format!("{p}.bn3"), 1)?,
                ]
            } else {
                vec![
                    fold_conv(dict, &format!("{p}.conv1"), &format!("{p}.bn1"), stride)?,
                    fold_conv(dict, &format!("{p}.conv2"), &format!("{p}.bn2"), 1)?,
                ]
            };
            let out_ch = width * expansion;
            let downsample = if b == 0 && (stride != 1 || in_ch != out_ch) {
                let mut d = fold_conv(
                    dict,
                    &format!("{p}.downsample.0"),
                    &format!("{p}.downsample.1"),
                    stride,
                )?;
                d.pad = 0;
                Some(d)
            } else {
                None
            };
            blocks.push(FoldedBlock { convs, downsample });
            in_ch = out_ch;
        }
    }
    let fc_weight = param(dict, "fc.weight", dict.num_classes * in_ch)?.to_vec();
    let fc_bias = param(dict, "fc.bias", dict.num_classes)?.to_vec();
    Ok(FoldedResNet {
        model,
        num_classes: dict.num_classes,
        stem,
        blocks,
        fc_weight,
        fc_bias,
        cpu_pack: CpuPack::default(),
    })
}

/// Activation buffers reused across layers and across calls: a ResNet-50 forward pass at batch
/// 32 would otherwise allocate (and page-fault in) about 3 GB of fresh memory every time.
#[derive(Debug, Default)]
pub struct Workspace {
    free: Vec<AlignedBuf>,
}

impl Workspace {
    /// A buffer of `len` values whose contents are unspecified (every user overwrites them all).
    fn take(&mut self, len: usize) -> AlignedBuf {
        // the smallest free buffer that is large enough, else a new one
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut v = match best {
            Some(i) => self.free.swap_remove(i),
            None => AlignedBuf::default(),
        };
        v.resize(len);
        v
    }

    fn give(&mut self, v: AlignedBuf) {
        if v.capacity() > 0 {
            self.free.push(v);
        }
    }
}

/// An NHWC activation.
#[derive(Debug)]
struct Act {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    data: AlignedBuf,
}

impl Act {
    /// A placeholder holding no buffer.
    fn empty() -> Act {
        Act {
            n: 0,
            h: 0,
            w: 0,
            c: 0,
            data: AlignedBuf::default(),
        }
    }
}

impl FoldedConv {
    /// The convolution's shape on input `x`.
    fn shape(&self, x: &Act) -> ConvShape {
        ConvShape {
            n: x.n,
            c: x.c,
            h: x.h,
            w: x.w,
            k: self.out_ch,
            r: self.kernel,
            s: self.kernel,
            stride: self.stride,
            pad: self.pad,
            groups: 1,
        }
    }

    /// relu?(conv(x) + bias + acc), written over `acc` (an activation of the output's shape).
    fn apply_onto(&self, packed: &PackedConv, x: &Act, mut acc: Act, relu: bool) -> Act {
        let shape = self.shape(x);
        conv2d_nhwc_packed_onto(&shape, &x.data, packed, relu, &mut acc.data);
        Act {
            n: x.n,
            h: shape.out_h(),
            w: shape.out_w(),
            c: self.out_ch,
            data: acc.data,
        }
    }

    /// y = conv(x) + bias (+ residual), then ReLU when `relu`, with `packed` this convolution's
    /// packed weights.
    fn apply(
        &self,
        packed: &PackedConv,
        x: &Act,
        residual: Option<&Act>,
        relu: bool,
        ws: &mut Workspace,
    ) -> Act {
        let shape = self.shape(x);
        let mut data = ws.take(shape.output_len());
        conv2d_nhwc_packed(
            &shape,
            &x.data,
            packed,
            residual.map(|r| &r.data[..]),
            relu,
            &mut data,
        );
        Act {
            n: x.n,
            h: shape.out_h(),
            w: shape.out_w(),
            c: self.out_ch,
            data,
        }
    }
}

/// A profiler's op around one CPU convolution (host time; nothing when no profiler records).
fn conv_op(layer: impl FnOnce() -> String, shape: ConvShape, relu: bool) -> Option<OpGuard> {
    op(|| OpInfo {
        name: if relu { "conv+bias+relu" } else { "conv+bias" }.into(),
        layer: Some(layer()),
        detail: format!(
            "{}x{}x{}x{} f32 NHWC, {}x{}/{}",
            shape.n, shape.c, shape.h, shape.w, shape.r, shape.s, shape.stride
        ),
        library: "gpukit CPU (packed f32)".into(),
        flops: shape.flops(),
        bytes: 4.0
            * (shape.input_len() + shape.k * shape.c * shape.r * shape.s + shape.output_len())
                as f64,
        dtype: "f32".into(),
    })
}

/// A profiler's op around other CPU work: `elems` f32 values read (host time).
fn cpu_op(name: &str, layer: &str, detail: String, elems: usize) -> Option<OpGuard> {
    op(|| OpInfo {
        name: name.into(),
        layer: Some(layer.into()),
        detail,
        library: "gpukit CPU".into(),
        flops: elems as f64,
        bytes: 4.0 * elems as f64,
        dtype: "f32".into(),
    })
}

/// 3x3 max pooling, stride 2, padding 1 (padding never wins: the centre tap is always inside).
fn max_pool(x: &Act, ws: &mut Workspace) -> Act {
    let (p, q) = ((x.h + 2 - 3) / 2 + 1, (x.w + 2 - 3) / 2 + 1);
    let c = x.c;
    let mut data = ws.take(x.n * p * q * c);
    parallel_rows(&mut data, q * c, &|row, out| {
        let (img, i) = (row / p, row % p);
        let src = &x.data[img * x.h * x.w * c..(img + 1) * x.h * x.w * c];
        for (j, o) in out.chunks_exact_mut(c).enumerate() {
            let at = |y: usize, z: usize| &src[(y * x.w + z) * c..(y * x.w + z + 1) * c];
            o.copy_from_slice(at(2 * i, 2 * j));
            for y in (2 * i).saturating_sub(1)..(2 * i + 2).min(x.h) {
                for z in (2 * j).saturating_sub(1)..(2 * j + 2).min(x.w) {
                    for (m, &v) in o.iter_mut().zip(at(y, z)) {
                        *m = if v > *m { v } else { *m };
                    }
                }
            }
        }
    });
    Act {
        n: x.n,
        h: p,
        w: q,
        c,
        data,
    }
}

/// Bytes of the largest activation (the stem's output) that the first two stages work on at
/// once: at batch 32 their activations (3.2 MB an image at 224 x 224) would otherwise stream
/// through memory between every two layers, so they run a few images at a time, with their
/// output gathered for the later stages, which run on the whole batch (their activations are
/// small, and their weights, 90% of ResNet-50's, are then read once).
const FRONT_PASS_BYTES: usize = 8 << 20;

/// `(n, h, w)` of a batch of images the CPU forward pass takes: a CPU tensor `[n, 3, h, w]` of
/// f32 (any layout), images at least 32 x 32.
fn check_images(input: &Tensor) -> Result<(usize, usize, usize)> {
    gpukit_tensor::check_same_device("forward_cpu", input.device(), Device::Cpu)?;
    if input.dtype() != DType::F32 {
        return Err(gpukit_tensor::Error::UnsupportedDType {
            op: "forward_cpu",
            dtype: input.dtype(),
            supported: "f32",
        }
        .into());
    }
    let &[n, 3, h, w] = input.shape() else {
        return Err(Error::Invalid(format!(
            "forward_cpu: input of shape {:?}; a batch of RGB images is [n, 3, h, w]",
            input.shape()
        )));
    };
    if h < 32 || w < 32 {
        return Err(Error::TooSmall { h, w });
    }
    Ok((n, h, w))
}

impl FoldedResNet {
    /// Logits (`n x num_classes`, row-major) for `n` NCHW RGB images of `h x w`.
    pub fn forward_cpu(&self, input: &Tensor) -> Result<Tensor> {
        self.forward_cpu_with(input, &mut Workspace::default())
    }

    /// As [`FoldedResNet::forward_cpu`], reusing `ws`'s buffers (keep one per caller between
    /// calls: the second call then allocates nothing).
    pub fn forward_cpu_with(&self, input: &Tensor, ws: &mut Workspace) -> Result<Tensor> {
        let (n, h, w) = check_images(input)?;
        // the stem's output, the largest activation
        let per_image = h.div_ceil(2) * w.div_ceil(2) * 64 * 4;
        let pass = (FRONT_PASS_BYTES / per_image).max(1);
        let logits = self.forward_in_passes(&input.f32_values()?, (n, h, w), pass, ws, None);
        Ok(Tensor::from_f32(&[n, self.num_classes], logits)?)
    }

    /// About how much host memory a CPU forward pass of `n` images of `h x w` needs: the input
    /// twice (NCHW and NHWC) and four activations of the largest layer's size (the workspace's
    /// buffers). None when the count overflows.
    pub fn cpu_forward_bytes(&self, n: usize, h: usize, w: usize) -> Option<u64> {
        let side = h.max(w);
        let largest = self
            .model
            .convolutions(side)
            .iter()
            .map(|(_, c)| {
                (c.k as u64)
                    .checked_mul(c.out_h() as u64)?
                    .checked_mul(c.out_w() as u64)
            })
            .try_fold(0u64, |m, x| Some(m.max(x?)))?;
        let input = 3u64.checked_mul(h as u64)?.checked_mul(w as u64)?;
        let per_image = input.checked_mul(2)?.checked_add(largest.checked_mul(4)?)?;
        per_image.checked_mul(n as u64)?.checked_mul(4)
    }

    /// As [`FoldedResNet::forward_cpu`], also recording each layer's largest output magnitude
    /// (one more pass over every activation): where a half-precision run's values overflowed.
    pub fn forward_cpu_probed(&self, input: &Tensor) -> Result<(Tensor, Peaks)> {
        let (n, h, w) = check_images(input)?;
        let per_image = h.div_ceil(2) * w.div_ceil(2) * 64 * 4;
        let pass = (FRONT_PASS_BYTES / per_image).max(1);
        let mut peaks = Peaks::default();
        let values = input.f32_values()?;
        let ws = &mut Workspace::default();
        let logits = self.forward_in_passes(&values, (n, h, w), pass, ws, Some(&mut peaks));
        Ok((Tensor::from_f32(&[n, self.num_classes], logits)?, peaks))
    }

    /// `forward_cpu_with` on checked arguments, the first two stages `pass` images at a time
    /// (see `FRONT_PASS_BYTES`), the rest on the whole batch.
    fn forward_in_passes(
        &self,
        input: &[f32],
        (n, h, w): (usize, usize, usize),
        pass: usize,
        ws: &mut Workspace,
        mut probe: Option<&mut Peaks>,
    ) -> Vec<f32> {
        let pack = self.cpu_pack.0.get_or_init(|| PackedNet::new(self));
        let split = self.model.blocks().iter().take(2).sum::<usize>();
        let split = split.min(self.blocks.len());
        let pass = pass.max(1);
        let x = if pass >= n {
            self.front(pack, input, (n, h, w), split, ws, probe.as_deref_mut())
        } else {
            let mut whole: Option<Act> = None;
            for (i, images) in input.chunks(pass * 3 * h * w).enumerate() {
                let images_n = images.len() / (3 * h * w);
                let part = self.front(
                    pack,
                    images,
                    (images_n, h, w),
                    split,
                    ws,
                    probe.as_deref_mut(),
                );
                let at = i * pass * part.h * part.w * part.c;
                let whole = whole.get_or_insert_with(|| Act {
                    n,
                    h: part.h,
                    w: part.w,
                    c: part.c,
                    data: ws.take(n * part.h * part.w * part.c),
                });
                let src = &part.data[..];
                parallel_rows(
                    &mut whole.data[at..at + part.data.len()],
                    4096,
                    &|i, dst| dst.copy_from_slice(&src[i * 4096..][..dst.len()]),
                );
                ws.give(part.data);
            }
            whole.expect("n > pass >= 1, so at least one pass")
        };
        let x = self.run_blocks(pack, x, (split, split..), ws, probe.as_deref_mut());
        let mut logits = vec![0f32; n * self.num_classes];
        self.head(pack, x, ws, &mut logits);
        if let Some(p) = probe {
            p.record("fc", &logits);
        }
        logits
    }

    /// The layout change, the stem, max pooling and blocks `..split` for `n` NCHW images.
    fn front(
        &self,
        pack: &PackedNet,
        input: &[f32],
        (n, h, w): (usize, usize, usize),
        split: usize,
        ws: &mut Workspace,
        mut probe: Option<&mut Peaks>,
    ) -> Act {
        // NCHW -> NHWC, by image rows
        let mut data = ws.take(n * 3 * h * w);
        parallel_rows(&mut data, w * 3, &|row, out| {
            let (img, y) = (row / h, row % h);
            for ch in 0..3 {
                let src = &input[((img * 3 + ch) * h + y) * w..][..w];
                for (o, &v) in out.iter_mut().skip(ch).step_by(3).zip(src) {
                    *o = v;
                }
            }
        });
        let input = Act {
            n,
            h,
            w,
            c: 3,
            data,
        };
        let stem = {
            let _op = conv_op(|| "conv1".into(), self.stem.shape(&input), true);
            self.stem.apply(&pack.stem, &input, None, true, ws)
        };
        if let Some(p) = probe.as_deref_mut() {
            p.record("conv1", &stem.data);
        }
        ws.give(input.data);
        let x = {
            let _op = cpu_op(
                "max_pool",
                "maxpool",
                format!("{}x{}x{}x{} f32 NHWC, 3x3/2", n, stem.c, stem.h, stem.w),
                stem.data.len(),
            );
            max_pool(&stem, ws)
        };
        ws.give(stem.data);
        self.run_blocks(pack, x, (0, ..split), ws, probe)
    }

    /// Residual blocks `range` (the first being block `first` of the network) on `x`; with
    /// `probe`, each convolution's output is recorded under its torchvision name.
    fn run_blocks(
        &self,
        pack: &PackedNet,
        mut x: Act,
        (first, range): (
            usize,
            impl std::slice::SliceIndex<[FoldedBlock], Output = [FoldedBlock]>
                + std::slice::SliceIndex<[PackedBlock], Output = [PackedBlock]>
                + Clone,
        ),
        ws: &mut Workspace,
        mut probe: Option<&mut Peaks>,
    ) -> Act {
        let stages = self.model.blocks();
        for (index, (block, (convs, downsample))) in self.blocks[range.clone()]
            .iter()
            .zip(&pack.blocks[range])
            .enumerate()
        {
            let name = || block_name(&stages, first + index);
            let mut projected = block
                .downsample
                .as_ref()
                .zip(downsample.as_ref())
                .map(|(d, p)| {
                    let _op = conv_op(|| format!("{}.downsample.0", name()), d.shape(&x), false);
                    d.apply(p, &x, None, false, ws)
                });
            if let (Some(p), Some(d)) = (probe.as_deref_mut(), &projected) {
                p.record(&format!("{}.downsample.0", name()), &d.data);
            }
            let count = block.convs.len();
            let mut y: Option<Act> = None;
            for (i, (conv, packed)) in block.convs.iter().zip(convs).enumerate() {
                let last = i + 1 == count;
                let _op = conv_op(
                    || format!("{}.conv{}", name(), i + 1),
                    conv.shape(y.as_ref().unwrap_or(&x)),
                    true,
                );
                let out = match (last, y.take()) {
                    // The last convolution adds the shortcut (the projection, else the block's
                    // input) in place, overwriting the shortcut's buffer: one activation-sized
                    // buffer less to stream through memory.
                    (true, Some(src)) => {
                        let shortcut = projected
                            .take()
                            .unwrap_or_else(|| std::mem::replace(&mut x, Act::empty()));
                        let out = conv.apply_onto(packed, &src, shortcut, true);
                        ws.give(src.data);
                        out
                    }
                    (_, src) => {
                        let input = src.as_ref().unwrap_or(&x);
                        let residual = last.then(|| projected.as_ref().unwrap_or(&x));
                        let out = conv.apply(packed, input, residual, true, ws);
                        if let Some(src) = src {
                            ws.give(src.data);
                        }
                        out
                    }
                };
                if let Some(p) = probe.as_deref_mut() {
                    p.record(&format!("{}.conv{}", name(), i + 1), &out.data);
                }
                y = Some(out);
            }
            if let Some(p) = projected {
                ws.give(p.data);
            }
            if let Some(next) = y {
                ws.give(std::mem::replace(&mut x, next).data);
            }
        }
        x
    }

    /// Global average pooling and the classifier on `x`, into `logits`.
    fn head(&self, pack: &PackedNet, x: Act, ws: &mut Workspace, logits: &mut [f32]) {
        let n = x.n;
        let _op = cpu_op(
            "avg_pool+linear",
            "fc",
            format!(
                "{}x{}x{}x{} f32 NHWC -> {n}x{}",
                n, x.c, x.h, x.w, self.num_classes
            ),
            x.data.len(),
        );
        // global average pooling (summed in f64, 16 channels at a time down the pixel rows)
        let f = x.c;
        let plane = x.h * x.w;
        let mut feats = ws.take(n * f);
        parallel_rows(&mut feats, f, &|i, out| {
            let img = &x.data[i * plane * f..(i + 1) * plane * f];
            for (c0, o) in (0..f).step_by(16).zip(out.chunks_mut(16)) {
                let mut acc = [0f64; 16];
                for px in img.chunks_exact(f) {
                    for (a, &v) in acc.iter_mut().zip(&px[c0..c0 + o.len()]) {
                        *a += f64::from(v);
                    }
                }
                for (o, a) in o.iter_mut().zip(acc) {
                    *o = (a / plane as f64) as f32;
                }
            }
        });
        ws.give(x.data);
        // the classifier: a 1x1 convolution over n one-pixel images
        let fc = ConvShape {
            n,
            c: f,
            h: 1,
            w: 1,
            k: self.num_classes,
            r: 1,
            s: 1,
            stride: 1,
            pad: 0,
            groups: 1,
        };
        conv2d_nhwc_packed(&fc, &feats, &pack.fc, None, false, logits);
        ws.give(feats);
    }
}

#[cfg(test)]
mod tests;
