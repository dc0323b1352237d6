//! The lowered program's parts: the views steps read and write (a slot of the arena or a
//! constant, with strides), and the steps themselves. No device is needed.

use super::blocks::Blocks;
use super::kernels::gemm::ConvGeometry;
use super::kernels::Window;
use super::Strided;
use crate::graph::{Activation, Binary};
use gpukit_tensor::ConvShape;

/// Why a graph cannot run on the GPU engine: the node, its operator and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    pub node: String,
    pub op: String,
    pub why: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} ({}): {}", self.node, self.op, self.why)
    }
}

impl std::error::Error for Unsupported {}

/// Where a view's elements are: an arena slot or a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Buf {
    Slot(usize),
    Const(usize),
}

/// A view: its buffer, the offset of its first element (in elements) and its strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tref {
    pub buf: Buf,
    pub offset: usize,
    pub s: Strided,
}

/// A region of the arena.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub bytes: usize,
    pub name: String,
}

/// A constant on the device: its values in the order its view reads them (stored in the
/// strategy's storage type).
#[derive(Debug, Clone)]
pub(super) struct Const {
    pub values: Vec<f32>,
}

/// A convolution step.
#[derive(Debug, Clone)]
pub(super) struct ConvStep {
    pub shape: ConvShape,
    pub x: Tref,
    /// The filter (KCRS or KRSC as the layout is, input channels padded where the input is).
    pub w: usize,
    /// The bias, for a fused call.
    pub bias: Option<usize>,
    pub z: Option<Tref>,
    pub y: Tref,
    /// The epilogue in the library's call, `act(conv + bias (+ z))` (ReLU: the legacy fused
    /// call or a graph; another activation, or none: a backend graph); else the bare
    /// convolution.
    pub fused: bool,
    /// The fused epilogue's activation.
    pub act: Option<Activation>,
}

impl ConvStep {
    /// Whether the fused epilogue is `relu(conv + bias (+ z))`.
    pub fn fused_relu(&self) -> bool {
        self.fused && self.act == Some(Activation::Relu)
    }
}

/// A depthwise convolution on gpukit's kernel (channel-last, dense operands):
/// `y = act(conv(x) + bias (+ z))` in one pass.
#[derive(Debug, Clone)]
pub(super) struct DepthwiseStep {
    pub shape: ConvShape,
    pub x: Tref,
    /// The filter's taps, `[r, s, c]`.
    pub taps: usize,
    pub bias: Option<usize>,
    pub z: Option<Tref>,
    pub act: Option<Activation>,
    pub y: Tref,
}

/// A 1x1 convolution of 1x1 maps (squeeze-and-excitation's layers) on gpukit's kernel:
/// `y [n, k] = act(x [n, c] w [k, c]^T + bias (+ z))`, all dense row-major.
#[derive(Debug, Clone)]
pub(super) struct MatVecStep {
    pub x: Tref,
    /// The weights, `[k, c]` row-major.
    pub w: usize,
    pub bias: Option<usize>,
    pub z: Option<Tref>,
    pub act: Option<Activation>,
    pub y: Tref,
    pub n: usize,
    pub k: usize,
    pub c: usize,
}

/// A matrix product with constant weights on cuBLASLt: row-major
/// `y [m, n] = act(a [m, k] x b [k, n] + bias + z)`, the epilogue in the library's call.
#[derive(Debug, Clone)]
pub(super) struct GemmStep {
    pub a: Tref,
    /// The weights, `[k, n]` row-major (a constant the step owns).
    pub b: Tref,
    /// `n` values added to every row (a constant the step owns).
    pub bias: Option<usize>,
    /// Added before the activation, laid out as `y`.
    pub z: Option<Tref>,
    /// ReLU, or GELU for 16-bit types (cuBLASLt's tanh form, within their rounding).
    pub act: Option<Activation>,
    pub y: Tref,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The weights transposed, `[n, k]` row-major (a constant the step owns), for gpukit's
    /// matrix-vector kernel: products of few rows only (set once the lowering is done).
    pub bt: Option<usize>,
}

/// A convolution cuDNN's path does not take (dilated, or padded unevenly) on gpukit's own
/// kernel, 16-bit channel-last: its geometry and its filter as the kernel reads it
/// (`[r, s, c, k]`, a constant the step owns), with its whole epilogue.
#[derive(Debug, Clone)]
pub(super) struct OwnConvStep {
    pub g: ConvGeometry,
    pub x: Tref,
    pub w: usize,
    pub bias: Option<usize>,
    pub z: Option<Tref>,
    pub act: Option<Activation>,
    pub y: Tref,
}

/// ResNet's blocked stem convolution with its bias and ReLU, and the 3 x 3 stride-2 max pool
/// after it, on gpukit's kernel ([`super::kernels::stem`]): the convolution's output is never
/// stored. `conv` is the convolution step it replaces (16-bit channel-last, 16 channels in, 64
/// out, 4 x 4 taps at stride 1 unpadded, its ReLU fused, no residual); `y` the pool's output.
#[derive(Debug, Clone)]
pub(super) struct StemPoolStep {
    pub conv: ConvStep,
    pub y: Tref,
}

/// One step of the program.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// The f32 NCHW input to the image layout and type, channels zero-padded to `cout`.
    ConvertImage {
        x: Tref,
        y: Tref,
        c: usize,
        cout: usize,
    },
    /// The f32 NCHW input as 16-bit channel-last blocks of pixels, for the convolution that
    /// reads it ([`Blocks`]).
    ConvertBlocks {
        x: Tref,
        y: Tref,
        blocks: Blocks,
    },
    FromF32 {
        x: Tref,
        y: Tref,
    },
    Conv(ConvStep),
    OwnConv(OwnConvStep),
    StemPool(StemPoolStep),
    Depthwise(DepthwiseStep),
    MatVec(MatVecStep),
    Pointwise {
        a: Tref,
        b: Option<(Tref, Binary)>,
        c: Option<Tref>,
        act: Option<Activation>,
        y: Tref,
    },
    Pool {
        x: Tref,
        y: Tref,
        win: Window,
    },
    GlobalAverage {
        x: Tref,
        y: Tref,
    },
    LayerNorm {
        x: Tref,
        gamma: Tref,
        beta: Option<Tref>,
        y: Tref,
        rows: usize,
        cols: usize,
        eps: f32,
    },
    Gemm(GemmStep),
    ToF32 {
        x: Tref,
        y: Tref,
    },
}

impl Step {
    /// The views the step reads, then the one it writes.
    pub(super) fn operands(&self) -> (Vec<Tref>, Tref) {
        match self {
            Step::ConvertImage { x, y, .. }
            | Step::ConvertBlocks { x, y, .. }
            | Step::FromF32 { x, y }
            | Step::Pool { x, y, .. }
            | Step::GlobalAverage { x, y }
            | Step::ToF32 { x, y } => (vec![*x], *y),
            Step::Conv(c) => (std::iter::once(c.x).chain(c.z).collect(), c.y),
            Step::Depthwise(d) => (std::iter::once(d.x).chain(d.z).collect(), d.y),
            Step::OwnConv(o) => (std::iter::once(o.x).chain(o.z).collect(), o.y),
            Step::StemPool(sp) => (vec![sp.conv.x], sp.y),
            Step::MatVec(m) => (std::iter::once(m.x).chain(m.z).collect(), m.y),
            Step::Pointwise { a, b, c, y, .. } => (
                std::iter::once(*a)
                    .chain(b.map(|(t, _)| t))
                    .chain(*c)
                    .collect(),
                *y,
            ),
            Step::LayerNorm {
                x, gamma, beta, y, ..
            } => (
                std::iter::once(*x)
                    .chain(Some(*gamma))
                    .chain(*beta)
                    .collect(),
                *y,
            ),
            Step::Gemm(g) => ([g.a, g.b].into_iter().chain(g.z).collect(), g.y),
        }
    }

    /// A short name of the step's kind.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Step::ConvertImage { .. } | Step::ConvertBlocks { .. } | Step::FromF32 { .. } => {
                "convert input"
            }
            Step::Conv(c) if c.fused_relu() => "conv+bias+relu (cuDNN)",
            Step::Conv(c) if c.fused => "conv+epilogue (cuDNN)",
            Step::Conv(_) => "conv (cuDNN)",
            Step::Depthwise(_) => "depthwise conv (gpukit)",
            Step::OwnConv(_) => "conv+epilogue (gpukit)",
            Step::StemPool(_) => "stem conv+relu+max pool (gpukit)",
            Step::MatVec(_) => "1x1 conv of 1x1 maps (gpukit)",
            Step::Pointwise { .. } => "element-wise",
            Step::Pool { .. } => "pool",
            Step::GlobalAverage { .. } => "global average",
            Step::LayerNorm { .. } => "layer norm",
            Step::Gemm(_) => "gemm (cuBLASLt or gpukit's, timed)",
            Step::ToF32 { .. } => "convert output",
        }
    }
}
