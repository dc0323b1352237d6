//! ResNet inference on the GPU: gpukit's own engine.
//!
//! - Batch norm is folded into the convolutions at load ([`crate::forward::fold`]); each
//!   convolution runs as one cuDNN call with its bias, the residual add and the ReLU fused
//!   (`cudnnConvolutionBiasActivationForward`). A projection shortcut's bias is added into the
//!   bias of the convolution it joins, so the projection itself is a plain convolution.
//! - Algorithms are chosen by measurement (cudnnFind) once per shape, when a batch size is
//!   prepared ([`Session`]).
//! - Input conversion, max pooling and global average pooling are gpukit's NVRTC kernels; the
//!   classifier is a cuBLAS f32 matmul plus a bias kernel.
//! - Every activation lives in one arena laid out by a memory plan ([`crate::plan`]) that reuses
//!   bytes whose contents are dead; the input batch and the logits are never overwritten.
//! - A forward pass is one stream of asynchronous calls with no host synchronisation, so it can
//!   be captured once as a CUDA graph and replayed.
//!
//! To use: [`GpuContext::open`], [`GpuWeights::upload`] for a [`Precision`] and layout, then
//! [`Session::new`] per batch size and [`Session::run`] (or [`Session::enqueue`] /
//! [`Session::capture`] + [`Session::replay`] to time it).

use crate::forward::{FoldedConv, FoldedResNet};
use crate::plan::{plan_no_reuse, plan_reuse, Lifetime, MemoryPlan};
use gpukit_cuda::blas::{Blas, BlasError, DeviceBytes, GemmType};
use gpukit_cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use gpukit_cuda::cudarc::driver::CudaGraph;
use gpukit_cuda::dnn::{ConvChoice, ConvDims, ConvType, Dnn, DnnError};
use gpukit_cuda::driver::{CudaError, Gpu};
use gpukit_cuda::kernels::{Elem, Kernels};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::mem::View;
use half::{bf16, f16};

/// Storage and arithmetic of the convolutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Precision {
    /// f32, no tensor cores: the reference.
    F32,
    /// f32 storage, TF32 tensor cores.
    Tf32,
    F16,
    Bf16,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::F32,
        Precision::Tf32,
        Precision::F16,
        Precision::Bf16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::F16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }

    fn conv_type(self) -> ConvType {
        match self {
            Precision::F32 => ConvType::F32,
            Precision::Tf32 => ConvType::Tf32,
            Precision::F16 => ConvType::F16,
            Precision::Bf16 => ConvType::Bf16,
        }
    }

    pub fn elem(self) -> Elem {
        match self {
            Precision::F32 | Precision::Tf32 => Elem::F32,
            Precision::F16 => Elem::F16,
            Precision::Bf16 => Elem::Bf16,
        }
    }
}

/// One way of running the model: a named row of `gpukit infer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Strategy {
    pub precision: Precision,
    /// NHWC activations and KRSC filters (tensor-core friendly); NCHW otherwise.
    pub nhwc: bool,
    /// Replayed as a CUDA graph instead of launched call by call.
    pub graph: bool,
}

impl Strategy {
    /// `fp16-nhwc-graph`, `fp32`, ...
    pub fn name(&self) -> String {
        let mut s = self.precision.name().to_string();
        if self.nhwc {
            s.push_str("-nhwc");
        }
        if self.graph {
            s.push_str("-graph");
        }
        s
    }

    /// Parses a name as [`Strategy::name`] writes it.
    pub fn parse(text: &str) -> Result<Strategy, String> {
        let mut parts = text.trim().split('-');
        let p = parts.next().unwrap_or("");
        let precision = Precision::ALL
            .into_iter()
            .find(|x| x.name() == p)
            .ok_or_else(|| format!("unknown precision {p:?} in strategy {text:?}"))?;
        let (mut nhwc, mut graph) = (false, false);
        for part in parts {
            match part {
                "nhwc" if !nhwc && !graph => nhwc = true,
                "nchw" if !nhwc && !graph => {}
                "graph" if !graph => graph = true,
                "eager" if !graph => {}
                _ => return Err(format!("unknown part {part:?} in strategy {text:?}")),
            }
        }
        Ok(Strategy {
            precision,
            nhwc,
            graph,
        })
    }

    /// The default set: every precision in the layout that suits it, eager and as a graph.
    pub fn defaults() -> Vec<Strategy> {
        let mut v = Vec::new();
        for (precision, nhwc) in [
            (Precision::F32, false),
            (Precision::Tf32, false),
            (Precision::Tf32, true),
            (Precision::F16, false),
            (Precision::F16, true),
            (Precision::Bf16, true),
        ] {
            for graph in [false, true] {
                v.push(Strategy {
                    precision,
                    nhwc,
                    graph,
                });
            }
        }
        v
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Cuda(#[from] CudaError),
    #[error("cuDNN: {0}")]
    Dnn(#[from] DnnError),
    #[error("cuBLAS: {0}")]
    Blas(#[from] BlasError),
    /// Out of memory: the driver refused, or the memory limit (`--memory-fraction`) would be
    /// passed. The figures are MiB.
    #[error(
        "out of GPU memory: {what} needs {requested_mib:.1} MiB more; {free_mib:.1} MiB of \
         {total_mib:.1} MiB are free on the device, {reserved_mib:.1} MiB are held by gpukit's \
         memory pool{}",
        limit_mib.map(|l| format!(", and gpukit may use at most {l:.1} MiB (the memory limit)"))
            .unwrap_or_default()
    )]
    OutOfMemory {
        what: String,
        requested_mib: f64,
        free_mib: f64,
        total_mib: f64,
        reserved_mib: f64,
        limit_mib: Option<f64>,
    },
    #[error("{0}")]
    Invalid(String),
}

impl EngineError {
    /// Whether this is running out of GPU memory: the engine's own check, or a driver, cuDNN or
    /// cuBLAS allocation that failed inside a library call (reported there as a status).
    pub fn is_out_of_memory(&self) -> bool {
        if matches!(self, EngineError::OutOfMemory { .. }) {
            return true;
        }
        let text = self.to_string();
        text.contains("OUT_OF_MEMORY") || text.contains("ALLOC_FAILED")
    }
}

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// The device and the libraries the engine uses on it, opened once.
pub struct GpuContext {
    pub gpu: Gpu,
    pub dnn: Dnn,
    pub blas: Blas,
    pub kernels: Kernels,
    /// Most bytes of the memory pool the engine may use (None: what the device has).
    pub limit: Option<u64>,
}

impl GpuContext {
    pub fn open(discovery: &Discovery, ordinal: usize) -> Result<GpuContext, EngineError> {
        let gpu = Gpu::open(discovery, ordinal)?;
        let dnn = Dnn::new(discovery, &gpu)?;
        // one small GEMM per pass (the classifier): a 4 MiB workspace is plenty
        let blas = Blas::with_workspace(discovery, &gpu, 4 << 20)?;
        let kernels = Kernels::new(discovery, &gpu)?;
        Ok(GpuContext {
            gpu,
            dnn,
            blas,
            kernels,
            limit: None,
        })
    }

    /// The out-of-memory error for `bytes` more, with the device's and the pool's figures.
    fn out_of_memory(&self, bytes: usize, what: &str) -> EngineError {
        let (free, total) = self.gpu.mem_info().unwrap_or((0, 0));
        let reserved = self.gpu.pool_stats().map(|p| p.reserved).unwrap_or(0);
        EngineError::OutOfMemory {
            what: what.to_string(),
            requested_mib: mib(bytes),
            free_mib: mib(free as usize),
            total_mib: mib(total as usize),
            reserved_mib: mib(reserved as usize),
            limit_mib: self.limit.map(|l| mib(l as usize)),
        }
    }

    /// Allocates `bytes` and frees them at once: whether that much fits now.
    pub fn try_alloc(&self, bytes: usize, what: &str) -> Result<(), EngineError> {
        let buf = self.alloc(bytes, what)?;
        drop(buf);
        self.gpu.stream.synchronize().map_err(CudaError::from)?;
        Ok(())
    }

    /// An error when allocating `bytes` more would pass the memory limit.
    pub fn check_limit(&self, bytes: usize, what: &str) -> Result<(), EngineError> {
        if let Some(limit) = self.limit {
            let used = self.gpu.pool_stats()?.used;
            if used + bytes as u64 > limit {
                return Err(self.out_of_memory(bytes, what));
            }
        }
        Ok(())
    }

    /// Allocates `bytes`, turning out-of-memory into [`EngineError::OutOfMemory`].
    fn alloc(&self, bytes: usize, what: &str) -> Result<DeviceBytes, EngineError> {
        self.check_limit(bytes, what)?;
        self.gpu.alloc(bytes).map_err(|e| {
            let oom =
                matches!(&e, CudaError::Driver(d) if format!("{d:?}").contains("OUT_OF_MEMORY"));
            if oom {
                self.out_of_memory(bytes, what)
            } else {
                e.into()
            }
        })
    }
}

/// A convolution's weights on the device, in the engine's precision and layout.
struct DeviceConv {
    k: usize,
    c: usize,
    r: usize,
    stride: usize,
    pad: usize,
    weight: DeviceBytes,
    bias: DeviceBytes,
}

/// A model's weights on the device for one precision and layout.
pub struct GpuWeights {
    pub precision: Precision,
    pub nhwc: bool,
    convs: Vec<DeviceConv>,
    /// features x classes, f32.
    fc_weight: DeviceBytes,
    fc_bias: DeviceBytes,
    /// Bytes of all weights on the device.
    pub bytes: usize,
    /// The shapes (classes, features, the stem's input channels), for the op list and plan.
    pub shape: NetShape,
}

fn encode(values: &[f32], elem: Elem) -> Vec<u8> {
    match elem {
        Elem::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Elem::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        Elem::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

fn decode(bytes: &[u8], elem: Elem) -> Vec<f32> {
    match elem {
        Elem::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Elem::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Elem::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    }
}

/// K x C x R x S weights as K x C' x R x S (NCHW) or K x R x S x C' (NHWC), C' >= C zero-padded.
fn arrange(conv: &FoldedConv, c_out: usize, nhwc: bool) -> Vec<f32> {
    let (k, c, r) = (conv.out_ch, conv.in_ch, conv.kernel);
    let mut out = vec![0f32; k * c_out * r * r];
    for o in 0..k {
        for ch in 0..c {
            for i in 0..r {
                for j in 0..r {
                    let v = conv.weight[((o * c + ch) * r + i) * r + j];
                    let at = if nhwc {
                        ((o * r + i) * r + j) * c_out + ch
                    } else {
                        ((o * c_out + ch) * r + i) * r + j
                    };
                    out[at] = v;
                }
            }
        }
    }
    out
}

impl GpuWeights {
    /// Converts and uploads `model`'s weights.
    pub fn upload(
        ctx: &GpuContext,
        model: &FoldedResNet,
        precision: Precision,
        nhwc: bool,
    ) -> Result<GpuWeights, EngineError> {
        let elem = precision.elem();
        let shape = NetShape::of(model, precision, nhwc);
        let mut convs = Vec::new();
        let mut bytes = 0;
        let mut push =
            |conv: &FoldedConv, c_pad: usize, bias: Option<Vec<f32>>| -> Result<(), EngineError> {
                let w = encode(&arrange(conv, c_pad, nhwc), elem);
                let b = encode(&bias.unwrap_or_else(|| conv.bias.clone()), elem);
                ctx.check_limit(w.len() + b.len(), "the weights")?;
                bytes += w.len() + b.len();
                convs.push(DeviceConv {
                    k: conv.out_ch,
                    c: c_pad,
                    r: conv.kernel,
                    stride: conv.stride,
                    pad: conv.pad,
                    weight: ctx.gpu.upload(&w)?,
                    bias: ctx.gpu.upload(&b)?,
                });
                Ok(())
            };
        // the order of NetShape::of: the stem, then per block its main path and its projection
        push(&model.stem, shape.input_channels, None)?;
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
                push(conv, conv.in_ch, bias)?;
            }
            if let Some(d) = &block.downsample {
                push(d, d.in_ch, Some(vec![0.0; d.out_ch]))?;
            }
        }
        let features = shape.features;
        let mut wt = vec![0f32; features * model.num_classes];
        for k in 0..model.num_classes {
            for f in 0..features {
                wt[f * model.num_classes + k] = model.fc_weight[k * features + f];
            }
        }
        let fc_weight = ctx.gpu.upload(&encode(&wt, Elem::F32))?;
        let fc_bias = ctx.gpu.upload(&encode(&model.fc_bias, Elem::F32))?;
        bytes += fc_weight.len() + fc_bias.len();
        // the op list indexes `convs` through the shape: both must list the same convolutions
        let same =
            shape.convs.len() == convs.len()
                && shape.convs.iter().zip(&convs).all(|(m, d)| {
                    (m.k, m.c, m.r, m.stride, m.pad) == (d.k, d.c, d.r, d.stride, d.pad)
                });
        if !same {
            return Err(EngineError::Invalid(
                "internal: uploaded convolutions and the network shape disagree".into(),
            ));
        }
        Ok(GpuWeights {
            precision,
            nhwc,
            convs,
            fc_weight,
            fc_bias,
            bytes,
            shape,
        })
    }
}

/// A tensor of the forward pass: per-image shape and element type.
#[derive(Debug, Clone, Copy)]
struct Tensor {
    c: usize,
    h: usize,
    w: usize,
    elem: Elem,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// f32 NCHW input -> activation type and layout.
    Convert {
        x: usize,
        y: usize,
    },
    /// `conv` index; `z` a residual; `relu`: bias and ReLU fused (every convolution but a
    /// projection, which is a plain convolution: its bias joined the next one's).
    Conv {
        conv: usize,
        x: usize,
        y: usize,
        z: Option<usize>,
        relu: bool,
    },
    MaxPool {
        x: usize,
        y: usize,
    },
    AvgPool {
        x: usize,
        y: usize,
    },
    Classifier {
        x: usize,
        y: usize,
    },
}

type ConvRun = ConvChoice;

fn algorithms_name(run: &ConvRun) -> String {
    run.name()
}

/// The tensor an op writes.
fn y_of(op: Op) -> usize {
    match op {
        Op::Convert { y, .. }
        | Op::MaxPool { y, .. }
        | Op::AvgPool { y, .. }
        | Op::Classifier { y, .. }
        | Op::Conv { y, .. } => y,
    }
}

/// Whether an op is a convolution followed by ReLU (every one but a projection).
fn relu_of(op: Op) -> bool {
    matches!(op, Op::Conv { relu: true, .. })
}

/// Memory of one prepared batch.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct SessionMemory {
    /// The activation arena (input batch and logits included).
    pub arena_bytes: usize,
    /// What the same activations take without reuse.
    pub arena_bytes_without_plan: usize,
    /// The input batch alone (f32).
    pub input_bytes: usize,
    /// Most workspace any chosen convolution algorithm uses (the session's own workspace).
    pub conv_workspace_bytes: usize,
    pub weights_bytes: usize,
    /// Whether each block's last convolution writes its output over the block's shortcut
    /// (checked per convolution shape at planning; see [`Session::new`]).
    #[serde(default)]
    pub in_place: bool,
}

impl SessionMemory {
    /// What the engine holds for this batch size: weights + arena + the largest workspace.
    pub fn total(&self) -> usize {
        self.weights_bytes + self.arena_bytes + self.conv_workspace_bytes
    }
}

/// A convolution's shape as the engine runs it (input channels padded where the layout wants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvMeta {
    pub k: usize,
    pub c: usize,
    pub r: usize,
    pub stride: usize,
    pub pad: usize,
}

/// What the op list and memory plan of a forward pass depend on: no device needed.
#[derive(Debug, Clone)]
pub struct NetShape {
    pub elem: Elem,
    pub nhwc: bool,
    pub input_channels: usize,
    /// In the engine's order: the stem, then per block its main path and its projection.
    pub convs: Vec<ConvMeta>,
    pub blocks: Vec<(Vec<usize>, Option<usize>)>,
    pub num_classes: usize,
    pub features: usize,
}

impl NetShape {
    /// The shape [`GpuWeights::upload`] gives `model` in this precision and layout.
    pub fn of(model: &FoldedResNet, precision: Precision, nhwc: bool) -> NetShape {
        let input_channels = if nhwc { 8 } else { 3 };
        let meta = |c: &FoldedConv, ch: usize| ConvMeta {
            k: c.out_ch,
            c: ch,
            r: c.kernel,
            stride: c.stride,
            pad: c.pad,
        };
        let mut convs = vec![meta(&model.stem, input_channels)];
        let mut blocks = Vec::new();
        for block in &model.blocks {
            let mut main = Vec::new();
            for conv in &block.convs {
                convs.push(meta(conv, conv.in_ch));
                main.push(convs.len() - 1);
            }
            let proj = block.downsample.as_ref().map(|d| {
                convs.push(meta(d, d.in_ch));
                convs.len() - 1
            });
            blocks.push((main, proj));
        }
        NetShape {
            elem: precision.elem(),
            nhwc,
            input_channels,
            convs,
            blocks,
            num_classes: model.num_classes,
            features: model.fc_weight.len() / model.num_classes.max(1),
        }
    }
}

/// The op list of a forward pass at one batch size and where each tensor lives.
struct Layout {
    /// Per tensor, the first and last op that touch it.
    spans: Vec<(usize, usize)>,
    /// Convolutions whose output shares its residual input's bytes (op indices).
    in_place: Vec<usize>,
    tensors: Vec<Tensor>,
    ops: Vec<Op>,
    logits: usize,
    plan: MemoryPlan,
    /// Arena bytes without reuse.
    without: usize,
    input_bytes: usize,
}

/// Builds the op list (with shapes) and plans its memory; see [`Session::new`].
fn lay_out(
    net: &NetShape,
    n: usize,
    h: usize,
    w: usize,
    reuse: bool,
    in_place: bool,
) -> Result<Layout, EngineError> {
    let elem = net.elem;
    let mut tensors = vec![Tensor {
        c: 3,
        h,
        w,
        elem: Elem::F32,
    }];
    let mut ops = Vec::new();
    let new = |tensors: &mut Vec<Tensor>, t: Tensor| {
        tensors.push(t);
        tensors.len() - 1
    };
    // the stem reads the f32 input directly when nothing needs converting
    let mut x = 0;
    if elem != Elem::F32 || net.nhwc || net.input_channels != 3 {
        let y = new(
            &mut tensors,
            Tensor {
                c: net.input_channels,
                h,
                w,
                elem,
            },
        );
        ops.push(Op::Convert { x, y });
        x = y;
    }
    let conv_out = |tensors: &Vec<Tensor>, x: usize, c: &ConvMeta| -> Tensor {
        let t = tensors[x];
        Tensor {
            c: c.k,
            h: (t.h + 2 * c.pad - c.r) / c.stride + 1,
            w: (t.w + 2 * c.pad - c.r) / c.stride + 1,
            elem,
        }
    };
    let t = conv_out(&tensors, x, &net.convs[0]);
    let y = new(&mut tensors, t);
    ops.push(Op::Conv {
        conv: 0,
        x,
        y,
        z: None,
        relu: true,
    });
    let s = tensors[y];
    let pooled = new(
        &mut tensors,
        Tensor {
            h: (s.h + 2 - 3) / 2 + 1,
            w: (s.w + 2 - 3) / 2 + 1,
            ..s
        },
    );
    ops.push(Op::MaxPool { x: y, y: pooled });
    x = pooled;
    let project_early = std::env::var("GPUKIT_PROJECTION").is_ok_and(|v| v == "early");
    for (main, proj) in &net.blocks {
        // The projection runs just before the convolution that adds it, so that its output is
        // not live beside the main path's first two outputs (this lowers the peak of
        // ResNet-50's layer2). GPUKIT_PROJECTION=early runs it first instead: the comparison
        // that found the overlap of decision 26.
        let mut cur = x;
        let mut projected = None;
        for (i, &ci) in main.iter().enumerate() {
            let last = i + 1 == main.len();
            if let (true, Some(p)) = (if project_early { i == 0 } else { last }, proj) {
                let t = conv_out(&tensors, x, &net.convs[*p]);
                let y = new(&mut tensors, t);
                ops.push(Op::Conv {
                    conv: *p,
                    x,
                    y,
                    z: None,
                    relu: false,
                });
                projected = Some(y);
            }
            let shortcut = projected.unwrap_or(x);
            let t = conv_out(&tensors, cur, &net.convs[ci]);
            let y = new(&mut tensors, t);
            ops.push(Op::Conv {
                conv: ci,
                x: cur,
                y,
                z: last.then_some(shortcut),
                relu: true,
            });
            cur = y;
        }
        x = cur;
    }
    let f = tensors[x];
    let feats = new(
        &mut tensors,
        Tensor {
            c: f.c,
            h: 1,
            w: 1,
            elem: Elem::F32,
        },
    );
    ops.push(Op::AvgPool { x, y: feats });
    let logits = new(
        &mut tensors,
        Tensor {
            c: net.num_classes,
            h: 1,
            w: 1,
            elem: Elem::F32,
        },
    );
    ops.push(Op::Classifier {
        x: feats,
        y: logits,
    });
    if f.c != net.features {
        return Err(EngineError::Invalid(format!(
            "the classifier expects {} features, the network gives {}",
            net.features, f.c
        )));
    }

    // lifetimes: from the op that writes a tensor to the last op that reads it; the input
    // and the logits live throughout (the input is uploaded before, the logits read after)
    let bytes = |t: &Tensor| n * t.c * t.h * t.w * t.elem.bytes();
    let mut life: Vec<Lifetime> = tensors
        .iter()
        .map(|t| Lifetime {
            bytes: bytes(t),
            first: usize::MAX,
            last: 0,
        })
        .collect();
    let steps = ops.len();
    for (step, op) in ops.iter().enumerate() {
        let (reads, write): (Vec<usize>, usize) = match *op {
            Op::Convert { x, y }
            | Op::MaxPool { x, y }
            | Op::AvgPool { x, y }
            | Op::Classifier { x, y } => (vec![x], y),
            Op::Conv { x, y, z, .. } => (std::iter::once(x).chain(z).collect(), y),
        };
        for r in reads {
            life[r].last = life[r].last.max(step);
        }
        life[write].first = life[write].first.min(step);
        life[write].last = life[write].last.max(step);
    }
    life[0].first = 0;
    life[0].last = steps;
    life[logits].last = steps;
    let spans: Vec<(usize, usize)> = life.iter().map(|l| (l.first, l.last)).collect();
    let without = plan_no_reuse(&life).total;
    // In place: a block's last convolution may write its output over its shortcut when nothing
    // reads the shortcut afterwards (the output then takes the shortcut's bytes, and the pair is
    // planned as one buffer). Whether each chosen cuDNN engine computes correctly so is checked
    // when the session is planned.
    let mut alias: Vec<Option<usize>> = vec![None; tensors.len()];
    let mut done_in_place = Vec::new();
    if reuse && in_place {
        for (step, op) in ops.iter().enumerate() {
            if let Op::Conv { y, z: Some(z), .. } = *op {
                let root = alias[z].unwrap_or(z);
                if life[z].last == step && life[y].bytes == life[root].bytes && z != 0 {
                    alias[y] = Some(root);
                    life[root].last = life[root].last.max(life[y].last);
                    life[y].bytes = 0;
                    done_in_place.push(step);
                }
            }
        }
    }
    let mut plan = if reuse {
        plan_reuse(&life)
    } else {
        plan_no_reuse(&life)
    };
    for (t, root) in alias.iter().enumerate() {
        if let Some(root) = *root {
            plan.offsets[t] = plan.offsets[root];
        }
    }
    if let Err(e) = crate::plan::check(&life, &plan) {
        return Err(EngineError::Invalid(format!("internal: memory plan: {e}")));
    }
    Ok(Layout {
        spans,
        in_place: done_in_place,
        input_bytes: life[0].bytes,
        tensors,
        ops,
        logits,
        plan,
        without,
    })
}

/// Bytes of the activation arena for `net` at this batch size (with or without the memory
/// plan), computed without a device.
pub fn arena_bytes(
    net: &NetShape,
    n: usize,
    h: usize,
    w: usize,
    reuse: bool,
) -> Result<usize, EngineError> {
    Ok(lay_out(net, n, h, w, reuse, reuse)?.plan.total)
}

/// A batch size prepared for one [`GpuWeights`]: arena, plans and (after [`Session::capture`])
/// a CUDA graph.
pub struct Session<'a> {
    ctx: &'a GpuContext,
    weights: &'a GpuWeights,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    tensors: Vec<Tensor>,
    ops: Vec<Op>,
    /// Per op, its convolution plan; layers of one shape share one (planned once).
    runs: Vec<Option<std::rc::Rc<ConvRun>>>,
    arena: DeviceBytes,
    /// The convolutions' workspace: what the chosen algorithms need, no more.
    workspace: DeviceBytes,
    plan: MemoryPlan,
    /// Ops whose output is written over their residual input.
    in_place: Vec<usize>,
    /// Why outputs are not written over their residual inputs, when the check failed.
    pub in_place_note: Option<String>,
    /// Per tensor, the first and last op that touch it.
    spans: Vec<(usize, usize)>,
    /// A barrier kernel after each projection (GPUKIT_PROJECTION_BARRIER=0 leaves it out).
    barrier_after_projection: bool,
    input: usize,
    logits: usize,
    graph: Option<CudaGraph>,
    /// Whether convolutions may use the backend API's fused graphs (else legacy calls only).
    try_graph: bool,
    pub memory: SessionMemory,
    /// The algorithm chosen for each convolution (name), in network order.
    pub algorithms: Vec<String>,
}

impl<'a> Session<'a> {
    /// Builds the op list, plans memory, allocates the arena and measures cuDNN's algorithms for
    /// every convolution at this batch size.
    pub fn new(
        ctx: &'a GpuContext,
        weights: &'a GpuWeights,
        n: usize,
        h: usize,
        w: usize,
        reuse: bool,
    ) -> Result<Session<'a>, EngineError> {
        if n == 0 {
            return Err(EngineError::Invalid("batch size must be at least 1".into()));
        }
        if h < 32 || w < 32 {
            return Err(EngineError::Invalid(format!(
                "input images must be at least 32x32 for a ResNet (got {h}x{w})"
            )));
        }
        let try_graph = std::env::var("GPUKIT_CUDNN_LEGACY").map_or(true, |v| v != "1");
        // NCHW below f32 tries split plans (bare convolution, then an epilogue kernel), which
        // cannot write over their residual: there speed goes first (decision 29)
        let split_plans = !weights.nhwc && weights.precision.conv_type() != ConvType::F32;
        let in_place =
            reuse && !split_plans && std::env::var("GPUKIT_IN_PLACE").map_or(true, |v| v != "0");
        let mut session = Self::prepare(ctx, weights, (n, h, w), reuse, in_place, try_graph)?;
        if !session.in_place.is_empty() {
            if let Err(why) = session.check_in_place() {
                // an engine that cannot write over its residual: plan again without that
                drop(session);
                session = Self::prepare(ctx, weights, (n, h, w), reuse, false, try_graph)?;
                session.in_place_note = Some(why);
            }
        }
        ctx.dnn.release_workspace();
        Ok(session)
    }

    /// Lays out and allocates the arena, plans every convolution and allocates the workspace
    /// the chosen algorithms need.
    fn prepare(
        ctx: &'a GpuContext,
        weights: &'a GpuWeights,
        (n, h, w): (usize, usize, usize),
        reuse: bool,
        in_place: bool,
        try_graph: bool,
    ) -> Result<Session<'a>, EngineError> {
        let Layout {
            spans,
            in_place,
            tensors,
            ops,
            logits,
            plan,
            without,
            input_bytes,
        } = lay_out(&weights.shape, n, h, w, reuse, in_place)?;
        let arena = ctx.alloc(plan.total, "activation arena")?;
        let mut session = Session {
            ctx,
            weights,
            n,
            h,
            w,
            tensors,
            ops,
            runs: Vec::new(),
            arena,
            workspace: ctx.alloc(256, "convolution workspace")?,
            plan,
            input: 0,
            logits,
            graph: None,
            try_graph,
            memory: SessionMemory {
                arena_bytes: 0,
                arena_bytes_without_plan: without,
                input_bytes,
                conv_workspace_bytes: 0,
                weights_bytes: weights.bytes,
                in_place: !in_place.is_empty(),
            },
            in_place_note: None,
            in_place,
            spans,
            barrier_after_projection: std::env::var("GPUKIT_PROJECTION_BARRIER")
                .map_or(true, |v| v != "0"),
            algorithms: Vec::new(),
        };
        session.memory.arena_bytes = session.plan.total;
        session.plan_convolutions()?;
        let need = session.memory.conv_workspace_bytes;
        if need > session.workspace.len() {
            session.workspace = ctx.alloc(need, "convolution workspace")?;
        }
        Ok(session)
    }

    /// Checks every convolution that writes over its residual input: on fresh random inputs,
    /// its in-place output must match its output written elsewhere (same engine). An engine
    /// that writes parts of its output before it has read the matching residual would fail.
    fn check_in_place(&self) -> Result<(), String> {
        let mut checked: Vec<*const ConvRun> = Vec::new();
        for &i in &self.in_place {
            let (
                Op::Conv {
                    x, y, z: Some(z), ..
                },
                Some(run),
            ) = (self.ops[i], self.runs[i].as_ref())
            else {
                continue;
            };
            if checked.contains(&std::rc::Rc::as_ptr(run)) {
                continue;
            }
            checked.push(std::rc::Rc::as_ptr(run));
            let fail = |e: &dyn std::fmt::Display| format!("in-place check of {}: {e}", run.name());
            let (tx, ty) = (self.tensors[x], self.tensors[y]);
            let count = |t: Tensor| self.n * t.c * t.h * t.w;
            let seed = gpukit_tensor::random::fresh_seed();
            let gpu = &self.ctx.gpu;
            let (xv, zv) = (
                self.view(x).map_err(|e| fail(&e))?,
                self.view(z).map_err(|e| fail(&e))?,
            );
            gpu.upload_into(
                xv,
                &encode(
                    &gpukit_tensor::random::uniform_f32(count(tx), seed),
                    tx.elem,
                ),
            )
            .map_err(|e| fail(&e))?;
            let residual = encode(
                &gpukit_tensor::random::uniform_f32(count(ty), seed ^ 0x9e37),
                ty.elem,
            );
            gpu.upload_into(zv, &residual).map_err(|e| fail(&e))?;
            let elsewhere = self
                .ctx
                .alloc(residual.len(), "in-place check")
                .map_err(|e| fail(&e))?;
            let ev = View::of(&elsewhere, &gpu.stream);
            self.conv_call(i, xv, Some(zv), ev).map_err(|e| fail(&e))?;
            self.conv_call(i, xv, Some(zv), zv).map_err(|e| fail(&e))?;
            let want = decode(
                &gpu.download_from(ev, residual.len())
                    .map_err(|e| fail(&e))?,
                ty.elem,
            );
            let got = decode(
                &gpu.download_from(zv, residual.len())
                    .map_err(|e| fail(&e))?,
                ty.elem,
            );
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            let worst = want
                .iter()
                .zip(&got)
                .map(|(a, b)| {
                    if a.is_finite() && b.is_finite() {
                        (a - b).abs()
                    } else {
                        f32::INFINITY
                    }
                })
                .fold(0f32, f32::max);
            if worst / scale > 1e-2 {
                return Err(format!(
                    "{} wrote over its residual input gave a max difference of {:.1e} of the \
                     output's scale: outputs are written apart from their residuals",
                    run.name(),
                    worst / scale
                ));
            }
        }
        Ok(())
    }

    fn view(&self, t: usize) -> Result<View<'_>, CudaError> {
        let d = self.tensors[t];
        View::of(&self.arena, &self.ctx.gpu.stream).sub(
            self.plan.offsets[t],
            self.n * d.c * d.h * d.w * d.elem.bytes(),
        )
    }

    fn dims(&self, conv: usize, x: usize) -> ConvDims {
        let c = &self.weights.convs[conv];
        let t = self.tensors[x];
        ConvDims {
            n: self.n,
            c: c.c,
            h: t.h,
            w: t.w,
            k: c.k,
            r: c.r,
            s: c.r,
            stride: c.stride,
            pad: c.pad,
            nhwc: self.weights.nhwc,
        }
    }

    fn plan_convolutions(&mut self) -> Result<(), EngineError> {
        let ty = self.weights.precision.conv_type();
        let mut runs = Vec::with_capacity(self.ops.len());
        let mut algorithms = Vec::new();
        let mut workspace = 0;
        type Key = (ConvDims, bool, bool);
        let mut planned: std::collections::HashMap<Key, std::rc::Rc<ConvRun>> = Default::default();
        for op in &self.ops {
            if let Op::Conv {
                conv, x, z, relu, ..
            } = *op
            {
                if let Some(run) = planned.get(&(self.dims(conv, x), z.is_some(), relu)) {
                    algorithms.push(algorithms_name(run));
                    runs.push(Some(std::rc::Rc::clone(run)));
                    continue;
                }
            }
            let run = match *op {
                Op::Conv {
                    conv,
                    x,
                    y,
                    z,
                    relu,
                } => {
                    let dims = self.dims(conv, x);
                    let c = &self.weights.convs[conv];
                    let s = &self.ctx.gpu.stream;
                    let (wv, bv) = (View::of(&c.weight, s), View::of(&c.bias, s));
                    let (xv, yv) = (self.view(x)?, self.view(y)?);
                    let zv = z.map(|z| self.view(z)).transpose()?;
                    // NCHW also tries the bare convolution and the epilogue kernel (decision 29):
                    // its fused engines are few and often slow
                    let (elem, nhwc, p) = (self.tensors[y].elem, dims.nhwc, dims.out_hw());
                    let kernels = &self.ctx.kernels;
                    let epilogue = |y: View<'_>, b: View<'_>, z: Option<View<'_>>| {
                        kernels
                            .bias_relu(y, b, z, elem, nhwc, (dims.n, dims.k, p.0 * p.1))
                            .map_err(DnnError::from)
                    };
                    let split: Option<gpukit_cuda::dnn::Epilogue<'_>> =
                        (!nhwc && ty != ConvType::F32).then_some(&epilogue);
                    let run = if relu {
                        self.ctx.dnn.plan_fused_best(
                            dims,
                            ty,
                            xv,
                            wv,
                            bv,
                            zv,
                            yv,
                            self.try_graph,
                            split,
                        )?
                    } else {
                        self.ctx
                            .dnn
                            .plan_plain_best(dims, ty, xv, wv, yv, self.try_graph)?
                    };
                    let ws = run.workspace_bytes();
                    workspace = workspace.max(ws);
                    algorithms.push(algorithms_name(&run));
                    let run = std::rc::Rc::new(run);
                    planned.insert((dims, z.is_some(), relu), run.clone());
                    Some(run)
                }
                _ => None,
            };
            runs.push(run);
        }
        self.ctx.dnn.save_choices();
        self.runs = runs;
        self.algorithms = algorithms;
        self.memory.conv_workspace_bytes = workspace;
        Ok(())
    }

    /// Enqueues one forward pass on the GPU's stream (no synchronisation): the input must have
    /// been uploaded ([`Session::set_input`]); the logits are read with [`Session::logits`].
    pub fn enqueue(&self) -> Result<(), EngineError> {
        for i in 0..self.ops.len() {
            self.enqueue_op(i)?;
        }
        Ok(())
    }

    fn enqueue_op(&self, i: usize) -> Result<(), EngineError> {
        let ctx = self.ctx;
        let nhwc = self.weights.nhwc;
        {
            match (self.ops[i], self.runs[i].as_deref()) {
                (Op::Convert { x, y }, _) => {
                    let t = self.tensors[y];
                    ctx.kernels.convert_input(
                        self.view(x)?,
                        self.view(y)?,
                        t.elem,
                        nhwc,
                        (self.n, 3, t.h, t.w),
                        t.c,
                    )?;
                }
                (Op::Conv { x, y, z, .. }, Some(_)) => {
                    let zv = z.map(|z| self.view(z)).transpose()?;
                    self.conv_call(i, self.view(x)?, zv, self.view(y)?)?;
                    if !relu_of(self.ops[i]) && self.barrier_after_projection {
                        ctx.kernels.barrier()?;
                    }
                }
                (Op::MaxPool { x, y }, _) => {
                    let t = self.tensors[x];
                    ctx.kernels.max_pool(
                        self.view(x)?,
                        self.view(y)?,
                        t.elem,
                        nhwc,
                        (self.n, t.c, t.h, t.w),
                    )?;
                }
                (Op::AvgPool { x, y }, _) => {
                    let t = self.tensors[x];
                    ctx.kernels.avg_pool(
                        self.view(x)?,
                        self.view(y)?,
                        t.elem,
                        nhwc,
                        (self.n, t.c, t.h, t.w),
                    )?;
                }
                (Op::Classifier { x, y }, _) => {
                    let classes = self.weights.shape.num_classes;
                    let s = &ctx.gpu.stream;
                    ctx.blas.gemm_views(
                        GemmType::F32,
                        self.view(x)?,
                        View::of(&self.weights.fc_weight, s),
                        self.view(y)?,
                        (self.n, classes, self.weights.shape.features),
                    )?;
                    ctx.kernels.add_bias(
                        self.view(y)?,
                        View::of(&self.weights.fc_bias, s),
                        self.n,
                        classes,
                    )?;
                }
                (Op::Conv { .. }, None) => {
                    return Err(EngineError::Invalid("convolution without a plan".into()))
                }
            }
        }
        Ok(())
    }

    /// Enqueues convolution op `i` on these buffers with the session's workspace.
    fn conv_call(
        &self,
        i: usize,
        x: View<'_>,
        z: Option<View<'_>>,
        y: View<'_>,
    ) -> Result<(), EngineError> {
        let (Op::Conv { conv, .. }, Some(run)) = (self.ops[i], self.runs[i].as_deref()) else {
            return Err(EngineError::Invalid(format!(
                "op {i} is not a planned convolution"
            )));
        };
        let ctx = self.ctx;
        let c = &self.weights.convs[conv];
        let s = &ctx.gpu.stream;
        let (wv, bv) = (View::of(&c.weight, s), View::of(&c.bias, s));
        let ws = View::of(&self.workspace, s);
        // the projection (no ReLU) has no bias: it joined the next convolution's
        let bias = relu_of(self.ops[i]).then_some(bv);
        match run {
            ConvRun::Fused(f) => ctx.dnn.fused_forward(f, x, wv, bv, z, y, ws)?,
            ConvRun::Graph(g) => ctx.dnn.graph_forward(g, x, wv, bias, z, y, ws)?,
            ConvRun::Plain(p) => ctx.dnn.conv_forward_views(p, x, wv, y, ws)?,
            ConvRun::Split(bare) => {
                ctx.dnn.bare_forward(bare, x, wv, y, ws)?;
                let t = self.tensors[y_of(self.ops[i])];
                ctx.kernels.bias_relu(
                    y,
                    bv,
                    z,
                    t.elem,
                    self.weights.nhwc,
                    (self.n, t.c, t.h * t.w),
                )?;
            }
        }
        Ok(())
    }

    /// A diagnostic: runs one forward pass op by op and, around each op, compares every tensor
    /// that must stay intact across it (live before and after, not the op's output) byte for
    /// byte. Returns one line per op that changed such a tensor (an out-of-bounds write or an
    /// overlap in the memory plan). The input must have been set. Slow; for debugging.
    pub fn find_clobbers(&self) -> Result<Vec<String>, EngineError> {
        let gpu = &self.ctx.gpu;
        let mut found = Vec::new();
        for (step, op) in self.ops.iter().enumerate() {
            let out = y_of(*op);
            let out_at = self.plan.offsets[out];
            let keep: Vec<usize> = (0..self.tensors.len())
                .filter(|&t| {
                    let (first, last) = self.spans[t];
                    first < step && last >= step && t != out && self.plan.offsets[t] != out_at
                })
                .collect();
            let bytes = |t: usize| {
                let d = self.tensors[t];
                self.n * d.c * d.h * d.w * d.elem.bytes()
            };
            let mut before = Vec::new();
            for &t in &keep {
                before.push(gpu.download_from(self.view(t)?, bytes(t))?);
            }
            self.enqueue_op(step)?;
            gpu.stream.synchronize().map_err(CudaError::from)?;
            for (&t, was) in keep.iter().zip(&before) {
                let now = gpu.download_from(self.view(t)?, bytes(t))?;
                if &now != was {
                    let first = now.iter().zip(was).position(|(a, b)| a != b).unwrap_or(0);
                    let what = match (op, self.runs[step].as_deref()) {
                        (Op::Conv { .. }, Some(run)) => run.name(),
                        _ => format!("{op:?}"),
                    };
                    found.push(format!(
                        "op {step} ({what}) changed tensor {t} (live ops {:?}, {} bytes at arena \
                         offset {}; first changed byte {first}; the op writes tensor {out} at \
                         offset {out_at}, {} bytes)",
                        self.spans[t],
                        bytes(t),
                        self.plan.offsets[t],
                        bytes(out)
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Copies a batch of NCHW f32 images into the input buffer.
    pub fn set_input(&self, images: &[f32]) -> Result<(), EngineError> {
        let want = self.n * 3 * self.h * self.w;
        if images.len() != want {
            return Err(EngineError::Invalid(format!(
                "input has {} values; a batch of {} RGB {}x{} images needs {want}",
                images.len(),
                self.n,
                self.h,
                self.w
            )));
        }
        let bytes: Vec<u8> = images.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.ctx.gpu.upload_into(self.view(self.input)?, &bytes)?;
        Ok(())
    }

    /// The logits of the last forward pass (waits for it): `n x classes`, row-major.
    pub fn logits(&self) -> Result<Vec<f32>, EngineError> {
        let len = self.n * self.weights.shape.num_classes * 4;
        let bytes = self.ctx.gpu.download_from(self.view(self.logits)?, len)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Uploads `images`, runs one forward pass and returns the logits.
    pub fn run(&self, images: &[f32]) -> Result<Vec<f32>, EngineError> {
        self.set_input(images)?;
        self.enqueue()?;
        self.logits()
    }

    /// Records one forward pass as a CUDA graph (replaced if there was one).
    pub fn capture(&mut self) -> Result<(), EngineError> {
        let stream = &self.ctx.gpu.stream;
        stream.synchronize().map_err(CudaError::from)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::from)?;
        let enqueued = self.enqueue();
        // the capture must end whatever happened, or the stream stays unusable
        let ended = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        enqueued?;
        let graph = ended
            .map_err(CudaError::from)?
            .ok_or_else(|| EngineError::Invalid("the captured graph is empty".into()))?;
        graph.upload().map_err(CudaError::from)?;
        self.graph = Some(graph);
        Ok(())
    }

    /// Launches the captured graph (no synchronisation).
    pub fn replay(&self) -> Result<(), EngineError> {
        let graph = self
            .graph
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("no graph captured".into()))?;
        graph.launch().map_err(CudaError::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::defaults() {
            assert_eq!(Strategy::parse(&s.name()).unwrap(), s);
        }
        assert_eq!(
            Strategy::parse("fp16-nchw-eager").unwrap(),
            Strategy {
                precision: Precision::F16,
                nhwc: false,
                graph: false
            }
        );
        for bad in ["", "fp8", "fp16-nhwc-nhwc", "fp16-graph-nhwc", "fp16-fast"] {
            assert!(Strategy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn weights_are_arranged_per_layout_with_padding() {
        let conv = FoldedConv {
            out_ch: 2,
            in_ch: 3,
            kernel: 1,
            stride: 1,
            pad: 0,
            weight: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            bias: vec![0.0; 2],
        };
        assert_eq!(
            arrange(&conv, 4, false),
            vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]
        );
        assert_eq!(
            arrange(&conv, 4, true),
            vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]
        );
        let conv3 = FoldedConv {
            out_ch: 1,
            in_ch: 2,
            kernel: 2,
            stride: 1,
            pad: 0,
            // c0: 1 2 / 3 4, c1: 5 6 / 7 8
            weight: (1..=8).map(|v| v as f32).collect(),
            bias: vec![0.0],
        };
        // KRSC: (r,s) major, channels inner
        assert_eq!(
            arrange(&conv3, 2, true),
            vec![1.0, 5.0, 2.0, 6.0, 3.0, 7.0, 4.0, 8.0]
        );
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use crate::forward::fold;
    use crate::weights::seeded_init;
    use crate::ResNet;

    #[test]
    fn resnet50_arena_is_its_largest_live_set() {
        let folded = fold(&seeded_init(ResNet::R50, 1000, 0, false)).unwrap();
        let net = NetShape::of(&folded, Precision::F32, false);
        let n = 128;
        let with = arena_bytes(&net, n, 224, 224, true).unwrap();
        let without = arena_bytes(&net, n, 224, 224, false).unwrap();
        // the peak by hand, beside the input batch (3x224x224), all f32: layer2's first block
        // at its second convolution holds the block's input (256x56x56, read later by the
        // projection), the first intermediate (128x56x56) and the second (128x28x28); a
        // layer1 block holds less (256x56x56 + 2 x 64x56x56); each block's last convolution
        // writes its output over the shortcut
        let f = |c: usize, hw: usize| n * c * hw * hw * 4;
        let layer1 = f(256, 56) + 2 * f(64, 56);
        let layer2 = f(256, 56) + f(128, 56) + f(128, 28);
        let peak = f(3, 224) + layer1.max(layer2);
        assert_eq!(with, peak, "{with} vs {peak}");
        assert!(with * 7 < without, "{with} vs {without}");
        // without writing in place, the last convolution holds the shortcut and its output
        let apart = lay_out(&net, n, 224, 224, true, false).unwrap();
        assert_eq!(apart.plan.total, f(3, 224) + 2 * f(256, 56) + f(64, 56));
        assert!(with * 10 < apart.plan.total * 8);
        assert!(apart.in_place.is_empty());
        // every one of ResNet-50's 16 blocks writes in place
        let inplace = lay_out(&net, n, 224, 224, true, true).unwrap();
        assert_eq!(inplace.in_place.len(), 16);
        for &i in &inplace.in_place {
            let Op::Conv { y, z: Some(z), .. } = inplace.ops[i] else {
                panic!("op {i} is not a residual convolution")
            };
            assert_eq!(inplace.plan.offsets[y], inplace.plan.offsets[z]);
        }
        // f16 NHWC: half the bytes, except the stem's input conversion (8 channels)
        let half = arena_bytes(
            &NetShape::of(&folded, Precision::F16, true),
            n,
            224,
            224,
            true,
        );
        assert!(half.unwrap() * 10 < with * 6);
    }
}
