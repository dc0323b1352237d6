//! ONNX model -> [`Graph`]: the opset and each node's domain checked, initializers read (raw,
//! typed or external data), the inputs' open sizes resolved (the batch from the caller), every
//! node converted to a typed operator with its attributes checked, and shapes inferred as the
//! graph is built. Errors name the file and the node, operator, input or attribute at fault.
//!
//! To use: `import_file(path, &ImportOptions { batch: Some(8), ..Default::default() })`, then
//! `graph::passes::optimize` and `graph::forward_cpu` (or a GPU lowering).

mod attrs;
mod ops;
mod tensor;

pub use ops::SUPPORTED_OPS;

use crate::error::{NodeProblem, OnnxError, OnnxProblem};
use crate::graph::{DType, Graph, GraphBuilder};
use crate::onnx::proto::{data_type, ModelProto, ValueInfoProto};
use prost::Message;
use std::path::Path;

/// The oldest default-domain opset gpukit reads.
pub const MIN_OPSET: i64 = 13;
/// The newest default-domain opset gpukit reads (the operators it imports last changed
/// meaning in opset 21 at the latest; later versions only added element types).
pub const MAX_OPSET: i64 = 25;

/// How to resolve the sizes a model leaves open.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportOptions {
    /// The batch: the size of every graph input's first axis where the model names it
    /// (`dim_param`, such as "batch_size") or leaves it open. A model whose first axis is a
    /// number must have this one. None: the model's own, 1 where it is open.
    pub batch: Option<usize>,
    /// The sizes of other named dimensions, such as `("height", 224)`.
    pub dims: Vec<(String, usize)>,
}

/// Imports the model at `path`; external data files are found relative to its folder. Errors
/// are [`crate::Error::Onnx`].
pub fn import_file(path: &Path, options: &ImportOptions) -> crate::Result<Graph> {
    let file = path.display().to_string();
    let fail = |problem| OnnxError {
        file: file.clone(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(OnnxProblem::Read(e)))?;
    let model = ModelProto::decode(bytes.as_slice())
        .map_err(|e| fail(OnnxProblem::Decode(e.to_string())))?;
    drop(bytes);
    let dir = path.parent().map(|d| {
        if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        }
    });
    import_model(&model, dir, &file, options)
}

/// Imports a model from its bytes (it cannot have external data: there is no folder).
pub fn import_bytes(bytes: &[u8], options: &ImportOptions) -> crate::Result<Graph> {
    let model = ModelProto::decode(bytes).map_err(|e| OnnxError {
        file: "<bytes>".into(),
        problem: OnnxProblem::Decode(e.to_string()),
    })?;
    import_model(&model, None, "<bytes>", options)
}

/// Imports a decoded model; `dir` is where its external data lives, `file` how errors name it.
pub fn import_model(
    model: &ModelProto,
    dir: Option<&Path>,
    file: &str,
    options: &ImportOptions,
) -> crate::Result<Graph> {
    build(model, dir, options).map_err(|problem| {
        OnnxError {
            file: file.to_string(),
            problem,
        }
        .into()
    })
}

/// The default domain's opset version, checked.
fn opset(model: &ModelProto) -> Result<i64, OnnxProblem> {
    let version = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or(OnnxProblem::NoOpset)?;
    if (MIN_OPSET..=MAX_OPSET).contains(&version) {
        Ok(version)
    } else {
        Err(OnnxProblem::Opset {
            version,
            min: MIN_OPSET,
            max: MAX_OPSET,
        })
    }
}

/// A graph input's type and shape, its open sizes resolved.
fn input_type(
    v: &ValueInfoProto,
    options: &ImportOptions,
) -> Result<(DType, Vec<usize>), OnnxProblem> {
    let fail = |problem: String| OnnxProblem::Value {
        role: "input",
        name: v.name.clone(),
        problem,
    };
    let t = v
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .ok_or_else(|| fail("is not a tensor".into()))?;
    let dtype = match t.elem_type {
        data_type::FLOAT => DType::F32,
        data_type::INT64 => DType::I64,
        other => {
            return Err(fail(format!(
                "has element type {other}; gpukit takes float (1) or int64 (7) inputs"
            )))
        }
    };
    let dims = &t
        .shape
        .as_ref()
        .ok_or_else(|| fail("has no shape".into()))?
        .dim;
    let mut shape = Vec::with_capacity(dims.len());
    for (axis, d) in dims.iter().enumerate() {
        let named = d.dim_param.as_deref().filter(|p| !p.is_empty());
        let given = named
            .and_then(|p| options.dims.iter().find(|(n, _)| n == p))
            .map(|(_, s)| *s);
        let size = match (d.dim_value, named, given) {
            (Some(v), _, _) if v > 0 => {
                let v = usize::try_from(v)
                    .map_err(|_| fail(format!("dimension {axis} of {v} is too large")))?;
                if axis == 0 && options.batch.is_some_and(|b| b != v) {
                    return Err(fail(format!(
                        "has a fixed batch of {v}; a batch of {} was asked for (re-export the model with a dynamic batch axis)",
                        options.batch.unwrap_or(v)
                    )));
                }
                v
            }
            (Some(v), _, _) if v <= 0 && named.is_none() => {
                return Err(fail(format!("dimension {axis} is {v}")))
            }
            (_, _, Some(s)) => s,
            (_, _, None) if axis == 0 => options.batch.unwrap_or(1),
            (_, p, None) => {
                return Err(fail(format!(
                    "dimension {axis} ({}) is not resolved: give its size",
                    p.map_or("unnamed".to_string(), |p| format!("{p:?}"))
                )))
            }
        };
        if size == 0 {
            return Err(fail(format!("dimension {axis} is 0")));
        }
        shape.push(size);
    }
    Ok((dtype, shape))
}

fn build(
    model: &ModelProto,
    dir: Option<&Path>,
    options: &ImportOptions,
) -> Result<Graph, OnnxProblem> {
    let opset = opset(model)?;
    let g = model.graph.as_ref().ok_or(OnnxProblem::NoGraph)?;
    let mut b = GraphBuilder::new();
    for t in &g.initializer {
        let (shape, data) = tensor::read_tensor(t, dir)?;
        b.constant(&t.name, shape, data)?;
    }
    for v in &g.input {
        // older models list their initializers among the inputs too
        if b.lookup(&v.name).is_some() {
            continue;
        }
        let (dtype, shape) = input_type(v, options)?;
        b.input(&v.name, dtype, shape)?;
    }
    for (index, node) in g.node.iter().enumerate() {
        // a node the model left unnamed is named by its operator and position
        let name = match node.name.as_str() {
            "" => format!("{}_{index}", node.op_type),
            n => n.to_string(),
        };
        let fail = |problem: NodeProblem| OnnxProblem::Node {
            node: name.clone(),
            op: node.op_type.clone(),
            problem,
        };
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            return Err(fail(NodeProblem::Domain {
                domain: node.domain.clone(),
            }));
        }
        let inputs = node
            .input
            .iter()
            .map(|name| match name.as_str() {
                "" => Ok(None),
                n => b.lookup(n).map(Some).ok_or_else(|| {
                    fail(NodeProblem::Input {
                        input: n.to_string(),
                        problem: "is not a graph input, an initializer or an earlier node's output"
                            .into(),
                    })
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ctx = ops::Ctx {
            node,
            opset,
            inputs: &inputs,
            builder: &b,
            dir,
        };
        let (op, ids) = ops::convert(&ctx).map_err(fail)?;
        let output = match node.output.as_slice() {
            [first, rest @ ..] if !first.is_empty() => match rest.iter().find(|o| !o.is_empty()) {
                Some(extra) => {
                    return Err(fail(NodeProblem::Arity(format!(
                        "output {extra}: gpukit computes only the first output of {}",
                        node.op_type
                    ))))
                }
                None => first.as_str(),
            },
            _ => return Err(fail(NodeProblem::Arity("has no output".into()))),
        };
        b.node(&name, op, &ids, &[output])?;
    }
    for v in &g.output {
        let id = b.lookup(&v.name).ok_or_else(|| OnnxProblem::Value {
            role: "output",
            name: v.name.clone(),
            problem: "is computed by no node and is no input or initializer".into(),
        })?;
        b.output(id);
    }
    Ok(b.finish()?)
}

#[cfg(test)]
mod tests;
