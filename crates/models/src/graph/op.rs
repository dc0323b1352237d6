//! The graph's operators: one typed variant per operation, its attributes resolved (axes made
//! non-negative, defaults filled in) so that a backend reads them without ONNX's rules.

use super::Data;

/// An element-wise activation: a Conv epilogue or an operator of its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// max(x, 0).
    Relu,
    /// 1 / (1 + exp(-x)).
    Sigmoid,
    /// max(0, min(1, alpha * x + beta)).
    HardSigmoid { alpha: f32, beta: f32 },
    /// x * max(0, min(1, x / 6 + 1 / 2)).
    HardSwish,
    /// x * (1 + erf(x / sqrt(2))) / 2 (the exact form, not tanh's approximation).
    Gelu,
    /// x / (1 + exp(-x)), also called swish (torch.onnx writes it as a Sigmoid and a Mul).
    Silu,
}

impl Activation {
    /// The activation's ONNX operator name.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "Relu",
            Activation::Sigmoid => "Sigmoid",
            Activation::HardSigmoid { .. } => "HardSigmoid",
            Activation::HardSwish => "HardSwish",
            Activation::Gelu => "Gelu",
            Activation::Silu => "Silu",
        }
    }
}

/// A two-input element-wise operation, with numpy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

impl Binary {
    /// The operation's ONNX operator name.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "Add",
            Binary::Sub => "Sub",
            Binary::Mul => "Mul",
            Binary::Div => "Div",
        }
    }
}

/// What a convolution applies as it stores its output, in this order: `+ bias` (when
/// [`Conv::bias`]), `+ residual` (an input of the output's shape), then the activation. The
/// fusion pass sets it; an imported Conv has none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Epilogue {
    /// A residual input is added (the Conv's last input).
    pub residual: bool,
    pub activation: Option<Activation>,
}

/// A 2-D convolution on NCHW input `[n, c, h, w]` with weight `[k, c / groups, r, s]`; inputs
/// are `x, weight`, then `bias [k]` when `bias`, then the residual `[n, k, p, q]` when
/// `epilogue.residual`.
#[derive(Debug, Clone, PartialEq)]
pub struct Conv {
    /// Filter height and width (r, s).
    pub kernel: [usize; 2],
    /// Step along height and width.
    pub strides: [usize; 2],
    /// Zero padding: top, left, bottom, right (ONNX's begin, begin, end, end order).
    pub pads: [usize; 4],
    /// Spacing between filter taps along height and width.
    pub dilations: [usize; 2],
    /// Channel groups: 1 is a plain convolution, `c` (with `k` a multiple of it) depthwise.
    pub groups: usize,
    /// A bias input follows the weight.
    pub bias: bool,
    pub epilogue: Epilogue,
}

impl Conv {
    /// The index of the residual input, when there is one.
    pub fn residual_input(&self) -> Option<usize> {
        self.epilogue.residual.then_some(2 + usize::from(self.bias))
    }

    /// How many inputs the node takes.
    pub fn input_count(&self) -> usize {
        2 + usize::from(self.bias) + usize::from(self.epilogue.residual)
    }
}

/// A 2-D pooling window on NCHW input (max or average).
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    /// top, left, bottom, right.
    pub pads: [usize; 4],
    /// Output extents round up; a window that would start in the end padding is dropped.
    pub ceil_mode: bool,
    /// Average pooling divides by the window's size including padding (clipped to the padded
    /// input), rather than by its taps inside the input. Max pooling ignores it.
    pub count_include_pad: bool,
}

/// `Y = alpha * op(A) * op(B) + beta * C`, A and B 2-D, C broadcast to the output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// One operation of the graph.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Conv(Conv),
    /// Inputs A, B, optional C.
    Gemm(Gemm),
    /// numpy's matmul: 1-D operands promoted, batch dimensions broadcast.
    MatMul,
    Activation(Activation),
    /// The error function, element-wise.
    Erf,
    Binary(Binary),
    MaxPool(Pool),
    AveragePool(Pool),
    /// The mean over every axis after the second, kept as size-1 axes.
    GlobalAveragePool,
    /// To 2-D: the axes before `axis` and from `axis` on, each multiplied together.
    Flatten {
        axis: usize,
    },
    /// Data and target shape (an i64 tensor); the output shape is static, so the data is
    /// only relabelled.
    Reshape,
    /// Output axis `i` is input axis `perm[i]`.
    Transpose {
        perm: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    /// Inference batch norm on axis 1: inputs x, scale, bias, mean, variance.
    BatchNorm {
        epsilon: f32,
    },
    /// Normalization over the axes from `axis` on: inputs x, scale, optional bias.
    LayerNorm {
        axis: usize,
        epsilon: f32,
    },
    /// The mean over `axes` (sorted, distinct), kept as size-1 axes when `keep_dims`.
    ReduceMean {
        axes: Vec<usize>,
        keep_dims: bool,
    },
    /// A value written into the graph (an ONNX Constant node, before constant folding).
    Constant {
        shape: Vec<usize>,
        value: Data,
    },
    /// The input's shape `[start, end)` as an i64 tensor.
    Shape {
        start: usize,
        end: usize,
    },
    /// Inputs data and i64 indices: the slices of `axis` that the indices pick.
    Gather {
        axis: usize,
    },
    /// Size-1 axes inserted at `axes` (of the output, sorted, distinct).
    Unsqueeze {
        axes: Vec<usize>,
    },
    /// Size-1 axes removed (sorted, distinct).
    Squeeze {
        axes: Vec<usize>,
    },
    Identity,
}

impl Op {
    /// The operator's name as ONNX spells it (Conv with an epilogue is still "Conv").
    pub fn name(&self) -> &'static str {
        match self {
            Op::Conv(_) => "Conv",
            Op::Gemm(_) => "Gemm",
            Op::MatMul => "MatMul",
            Op::Activation(a) => a.name(),
            Op::Erf => "Erf",
            Op::Binary(b) => b.name(),
            Op::MaxPool(_) => "MaxPool",
            Op::AveragePool(_) => "AveragePool",
            Op::GlobalAveragePool => "GlobalAveragePool",
            Op::Flatten { .. } => "Flatten",
            Op::Reshape => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Concat { .. } => "Concat",
            Op::BatchNorm { .. } => "BatchNormalization",
            Op::LayerNorm { .. } => "LayerNormalization",
            Op::ReduceMean { .. } => "ReduceMean",
            Op::Constant { .. } => "Constant",
            Op::Shape { .. } => "Shape",
            Op::Gather { .. } => "Gather",
            Op::Unsqueeze { .. } => "Unsqueeze",
            Op::Squeeze { .. } => "Squeeze",
            Op::Identity => "Identity",
        }
    }
}
