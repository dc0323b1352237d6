//! Each supported ONNX operator converted to the graph's [`Op`]: attributes read and checked
//! (defaults of the ONNX spec filled in, values gpukit does not implement refused), axes made
//! non-negative, inputs that ONNX passes as tensors but that are attributes in the graph
//! (Unsqueeze's and Squeeze's axes, ReduceMean's from opset 18) read from their constants.

use super::attrs::{axes, axis, Attrs};
use super::tensor::read_tensor;
use crate::error::NodeProblem;
use crate::graph::{
    Activation, Binary, Conv, Data, Epilogue, Gemm, GraphBuilder, Op, Pool, ValueId,
};
use crate::onnx::proto::NodeProto;
use std::path::Path;

/// The operators gpukit imports, in the default domain.
pub const SUPPORTED_OPS: &[&str] = &[
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Concat",
    "Constant",
    "Conv",
    "Div",
    "Erf",
    "Flatten",
    "Gather",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "LayerNormalization",
    "MatMul",
    "MaxPool",
    "Mul",
    "ReduceMean",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Squeeze",
    "Sub",
    "Transpose",
    "Unsqueeze",
];

/// What a conversion reads of the node and the graph built so far.
pub(super) struct Ctx<'a> {
    pub node: &'a NodeProto,
    pub opset: i64,
    /// The node's inputs, None where the model left an optional one out ("").
    pub inputs: &'a [Option<ValueId>],
    pub builder: &'a GraphBuilder,
    pub dir: Option<&'a Path>,
}

fn input_problem(ctx: &Ctx, i: usize, problem: impl Into<String>) -> NodeProblem {
    NodeProblem::Input {
        input: ctx
            .node
            .input
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("#{i}")),
        problem: problem.into(),
    }
}

impl Ctx<'_> {
    /// Inputs `0..required` present, at most `max` inputs in all; returns the present ones
    /// (optional trailing inputs left out are dropped; a gap before a present one is refused).
    fn take(&self, required: usize, max: usize) -> Result<Vec<ValueId>, NodeProblem> {
        let n = self.inputs.len();
        if n < required || n > max {
            return Err(NodeProblem::Arity(format!(
                "has {n} inputs; {} takes {required} to {max}",
                self.node.op_type
            )));
        }
        let last = self
            .inputs
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1);
        let mut ids = Vec::new();
        for (i, v) in self.inputs[..last].iter().enumerate() {
            match v {
                Some(v) => ids.push(*v),
                None if i < required => return Err(input_problem(self, i, "is required")),
                None => return Err(input_problem(self, i, "is left out before a later input; gpukit needs optional inputs given or trailing")),
            }
        }
        if ids.len() < required {
            return Err(input_problem(self, ids.len(), "is required"));
        }
        Ok(ids)
    }

    /// The rank of input `i`.
    fn rank(&self, ids: &[ValueId], i: usize) -> Result<usize, NodeProblem> {
        ids.get(i)
            .and_then(|&v| self.builder.value(v))
            .map(|v| v.shape.len())
            .ok_or_else(|| input_problem(self, i, "is missing"))
    }

    /// The i64 elements of input `i`, which must be known before running (a constant).
    fn known_ints(&self, ids: &[ValueId], i: usize) -> Result<Vec<i64>, NodeProblem> {
        ids.get(i)
            .and_then(|&v| self.builder.known(v))
            .and_then(Data::as_i64)
            .map(<[i64]>::to_vec)
            .ok_or_else(|| input_problem(self, i, "must be a constant i64 tensor"))
    }
}

fn conv(ctx: &Ctx, a: &Attrs) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    let ids = ctx.take(2, 3)?;
    let w = ctx
        .builder
        .value(ids[1])
        .map(|v| v.shape.clone())
        .unwrap_or_default();
    if w.len() != 4 || ctx.rank(&ids, 0)? != 4 {
        return Err(input_problem(
            ctx,
            1,
            format!("has shape {w:?}; gpukit imports 2-D convolutions (4-D input and weight)"),
        ));
    }
    let kernel = a
        .sizes("kernel_shape", 2)?
        .unwrap_or_else(|| w[2..].to_vec());
    let c = Conv {
        kernel: [kernel[0], kernel[1]],
        strides: a.sizes("strides", 2)?.map_or([1, 1], |s| [s[0], s[1]]),
        pads: a.pads()?,
        dilations: a.sizes("dilations", 2)?.map_or([1, 1], |s| [s[0], s[1]]),
        groups: match a.int("group")?.unwrap_or(1) {
            g if g >= 1 => usize::try_from(g).unwrap_or(usize::MAX),
            g => {
                return Err(NodeProblem::Attribute {
                    attribute: "group".into(),
                    problem: format!("{g} is not a positive count"),
                })
            }
        },
        bias: ids.len() == 3,
        epilogue: Epilogue::default(),
    };
    Ok((Op::Conv(c), ids))
}

fn pool(ctx: &Ctx, a: &Attrs, max: bool) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    let ids = ctx.take(1, 1)?;
    if ctx.rank(&ids, 0)? != 4 {
        return Err(input_problem(
            ctx,
            0,
            "gpukit imports 2-D pooling (a 4-D input)",
        ));
    }
    let kernel = a
        .sizes("kernel_shape", 2)?
        .ok_or_else(|| NodeProblem::MissingAttribute {
            attribute: "kernel_shape".into(),
        })?;
    if let Some(d) = a.sizes("dilations", 2)? {
        if d != [1, 1] {
            return Err(NodeProblem::Attribute {
                attribute: "dilations".into(),
                problem: format!("{d:?} is not supported (only 1s)"),
            });
        }
    }
    let count_include_pad = if max {
        a.int_only("storage_order", 0, "only row-major indices")?;
        false
    } else {
        a.flag("count_include_pad", false)?
    };
    let p = Pool {
        kernel: [kernel[0], kernel[1]],
        strides: a.sizes("strides", 2)?.map_or([1, 1], |s| [s[0], s[1]]),
        pads: a.pads()?,
        ceil_mode: a.flag("ceil_mode", false)?,
        count_include_pad,
    };
    Ok((
        if max {
            Op::MaxPool(p)
        } else {
            Op::AveragePool(p)
        },
        ids,
    ))
}

/// A Constant node's value.
fn constant(ctx: &Ctx, a: &Attrs) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    ctx.take(0, 0)?;
    let (shape, value) = if let Some(t) = a.tensor("value")? {
        read_tensor(t, ctx.dir).map_err(|e| NodeProblem::Attribute {
            attribute: "value".into(),
            problem: e.to_string(),
        })?
    } else if let Some(f) = a.floats("value_floats")? {
        (vec![f.len()], Data::F32(f.to_vec()))
    } else if let Some(i) = a.ints("value_ints")? {
        (vec![i.len()], Data::I64(i.to_vec()))
    } else if let Some(i) = a.int("value_int")? {
        (vec![], Data::I64(vec![i]))
    } else if let Some(f) = a.float_opt("value_float")? {
        (vec![], Data::F32(vec![f]))
    } else {
        return Err(NodeProblem::MissingAttribute {
            attribute: "value (or value_float(s), value_int(s))".into(),
        });
    };
    Ok((Op::Constant { shape, value }, Vec::new()))
}

fn reduce_mean(ctx: &Ctx, a: &Attrs) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    let keep_dims = a.flag("keepdims", true)?;
    let (ids, list) = if ctx.opset >= 18 {
        a.int_only(
            "noop_with_empty_axes",
            0,
            "an empty axes list reduces every axis",
        )?;
        let ids = ctx.take(1, 2)?;
        let list = if ids.len() == 2 {
            ctx.known_ints(&ids, 1)?
        } else {
            Vec::new()
        };
        (ids[..1].to_vec(), list)
    } else {
        (
            ctx.take(1, 1)?,
            a.ints("axes")?.map(<[i64]>::to_vec).unwrap_or_default(),
        )
    };
    let rank = ctx.rank(&ids, 0)?;
    let axes = if list.is_empty() {
        (0..rank).collect()
    } else {
        axes("axes", &list, rank)?
    };
    Ok((Op::ReduceMean { axes, keep_dims }, ids))
}

fn squeeze(ctx: &Ctx, unsqueeze: bool) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    let ids = ctx.take(if unsqueeze { 2 } else { 1 }, 2)?;
    let rank = ctx.rank(&ids, 0)?;
    let op = if unsqueeze {
        let list = ctx.known_ints(&ids, 1)?;
        Op::Unsqueeze {
            axes: axes("axes", &list, rank + list.len())?,
        }
    } else if ids.len() == 2 {
        Op::Squeeze {
            axes: axes("axes", &ctx.known_ints(&ids, 1)?, rank)?,
        }
    } else {
        let shape = ctx
            .builder
            .value(ids[0])
            .map(|v| v.shape.clone())
            .unwrap_or_default();
        Op::Squeeze {
            axes: (0..rank).filter(|&a| shape[a] == 1).collect(),
        }
    };
    Ok((op, ids[..1].to_vec()))
}

/// Shape's start and end (opset 15): negative counting from the end, clamped to the rank.
fn shape(ctx: &Ctx, a: &Attrs) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    let ids = ctx.take(1, 1)?;
    let rank = ctx.rank(&ids, 0)? as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clamp(a.int("start")?.unwrap_or(0));
    let end = clamp(a.int("end")?.unwrap_or(rank)).max(start);
    Ok((Op::Shape { start, end }, ids))
}

/// The op `ctx.node` computes and the inputs it reads.
pub(super) fn convert(ctx: &Ctx) -> Result<(Op, Vec<ValueId>), NodeProblem> {
    let a = Attrs::new(ctx.node);
    let unary = |op: Op| ctx.take(1, 1).map(|ids| (op, ids));
    let binary = |b: Binary| ctx.take(2, 2).map(|ids| (Op::Binary(b), ids));
    let out = match ctx.node.op_type.as_str() {
        "Conv" => conv(ctx, &a)?,
        "Gemm" => {
            let g = Gemm {
                alpha: a.float("alpha", 1.0)?,
                beta: a.float("beta", 1.0)?,
                trans_a: a.flag("transA", false)?,
                trans_b: a.flag("transB", false)?,
            };
            (Op::Gemm(g), ctx.take(2, 3)?)
        }
        "MatMul" => (Op::MatMul, ctx.take(2, 2)?),
        "Relu" => unary(Op::Activation(Activation::Relu))?,
        "Sigmoid" => unary(Op::Activation(Activation::Sigmoid))?,
        "HardSigmoid" => unary(Op::Activation(Activation::HardSigmoid {
            alpha: a.float("alpha", 0.2)?,
            beta: a.float("beta", 0.5)?,
        }))?,
        "HardSwish" => unary(Op::Activation(Activation::HardSwish))?,
        "Gelu" => match a.string("approximate")?.as_deref() {
            None | Some("none") => unary(Op::Activation(Activation::Gelu))?,
            Some(other) => {
                return Err(NodeProblem::Attribute {
                    attribute: "approximate".into(),
                    problem: format!("{other:?} is not supported (only \"none\")"),
                })
            }
        },
        "Erf" => unary(Op::Erf)?,
        "Identity" => unary(Op::Identity)?,
        "Add" => binary(Binary::Add)?,
        "Sub" => binary(Binary::Sub)?,
        "Mul" => binary(Binary::Mul)?,
        "Div" => binary(Binary::Div)?,
        "MaxPool" => pool(ctx, &a, true)?,
        "AveragePool" => pool(ctx, &a, false)?,
        "GlobalAveragePool" => unary(Op::GlobalAveragePool)?,
        "Flatten" => {
            let ids = ctx.take(1, 1)?;
            let rank = ctx.rank(&ids, 0)?;
            // Flatten's axis lies in [-rank, rank]
            let (v, r) = (a.int("axis")?.unwrap_or(1), rank as i64);
            if v < -r || v > r {
                return Err(NodeProblem::Attribute {
                    attribute: "axis".into(),
                    problem: format!("{v} is out of range for rank {rank}"),
                });
            }
            let axis = (if v < 0 { v + r } else { v }) as usize;
            (Op::Flatten { axis }, ids)
        }
        "Reshape" => {
            a.int_only("allowzero", 0, "a 0 in the shape copies the input's size")?;
            (Op::Reshape, ctx.take(2, 2)?)
        }
        "Transpose" => {
            let ids = ctx.take(1, 1)?;
            let rank = ctx.rank(&ids, 0)?;
            let perm = match a.ints("perm")? {
                Some(p) => p
                    .iter()
                    .map(|&x| axis("perm", x, rank))
                    .collect::<Result<Vec<_>, _>>()?,
                None => (0..rank).rev().collect(),
            };
            (Op::Transpose { perm }, ids)
        }
        "Concat" => {
            let ids = ctx.take(1, usize::MAX)?;
            let rank = ctx.rank(&ids, 0)?;
            let list = a
                .int("axis")?
                .ok_or_else(|| NodeProblem::MissingAttribute {
                    attribute: "axis".into(),
                })?;
            (
                Op::Concat {
                    axis: axis("axis", list, rank)?,
                },
                ids,
            )
        }
        "BatchNormalization" => {
            a.int_only("training_mode", 0, "inference only")?;
            a.float("momentum", 0.9)?;
            (
                Op::BatchNorm {
                    epsilon: a.float("epsilon", 1e-5)?,
                },
                ctx.take(5, 5)?,
            )
        }
        "LayerNormalization" => {
            let ids = ctx.take(2, 3)?;
            let rank = ctx.rank(&ids, 0)?;
            a.int_only("stash_type", 1, "statistics in float")?;
            let axis = axis("axis", a.int("axis")?.unwrap_or(-1), rank)?;
            (
                Op::LayerNorm {
                    axis,
                    epsilon: a.float("epsilon", 1e-5)?,
                },
                ids,
            )
        }
        "ReduceMean" => reduce_mean(ctx, &a)?,
        "Constant" => constant(ctx, &a)?,
        "Shape" => shape(ctx, &a)?,
        "Gather" => {
            let ids = ctx.take(2, 2)?;
            let rank = ctx.rank(&ids, 0)?;
            (
                Op::Gather {
                    axis: axis("axis", a.int("axis")?.unwrap_or(0), rank)?,
                },
                ids,
            )
        }
        "Unsqueeze" => squeeze(ctx, true)?,
        "Squeeze" => squeeze(ctx, false)?,
        other => {
            return Err(NodeProblem::UnsupportedOp {
                op: other.to_string(),
                supported: SUPPORTED_OPS.join(", "),
            });
        }
    };
    a.finish()?;
    Ok(out)
}
