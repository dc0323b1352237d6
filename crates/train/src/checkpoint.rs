//! Checkpoints: the weights, the optimizer's state, and where the run stood (step, epoch and
//! batch within it, the seed that orders the batches), in one safetensors file written
//! atomically (a temporary file beside it, then a rename: an interrupted save leaves the old
//! file or none, never half of one). Resuming from one continues exactly: the batches, the
//! updates and so the losses are those the uninterrupted run would have had.
//!
//! Also: loading initial weights (`--init`) saved by PyTorch as an nn.Sequential state dict.

use crate::error::{Error, Result};
use crate::export::{write_tensors, RawTensor};
use crate::model::Mlp;
use crate::optim::{Optimizer, OptimizerConfig};
use gpukit_tensor::codec::bytes_of;
use safetensors::tensor::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Where a run stands: the next batch to train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Position {
    /// Optimizer updates applied so far.
    pub step: u64,
    /// The epoch the next batch belongs to (from 0).
    pub epoch: u64,
    /// The next batch's index within that epoch.
    pub batch: u64,
}

/// What a checkpoint records besides tensors (its `__metadata__`, as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// gpukit's checkpoint format version.
    pub format: u32,
    pub widths: Vec<usize>,
    pub optimizer: OptimizerConfig,
    pub position: Position,
    /// The seed that orders the batches (and made the data, for the presets).
    pub seed: u64,
    /// The loss scaler's scale and clean-step count (fp16 runs; absent otherwise).
    pub scaler: Option<(f64, u64)>,
}

const FORMAT: u32 = 1;
const META_KEY: &str = "gpukit";

/// Writes `model`, `opt` and `meta` to `path` atomically.
pub fn save(path: &Path, model: &Mlp<f32>, opt: &Optimizer<f32>, meta: &Meta) -> Result<()> {
    let mut tensors: Vec<RawTensor> = model
        .named()
        .into_iter()
        .map(|(name, shape, values)| (name, shape, bytes_of(values).to_vec()))
        .collect();
    let named = model.named();
    for (prefix, buffers) in opt.buffers() {
        for ((name, shape, _), values) in named.iter().zip(buffers) {
            let name = format!("optimizer.{prefix}.{name}");
            tensors.push((name, shape.clone(), bytes_of(values).to_vec()));
        }
    }
    let meta_json = serde_json::to_string(&Meta {
        format: FORMAT,
        ..meta.clone()
    })
    .map_err(|e| Error::Failed(format!("checkpoint metadata: {e}")))?;
    let info = HashMap::from([(META_KEY.to_string(), meta_json)]);
    write_tensors(path, &tensors, Dtype::F32, Some(info))
}

/// Reads a checkpoint written by [`save`] for a model of `widths`: the model, the optimizer
/// (its configuration as saved) and the metadata. A file for other layers, or not a gpukit
/// checkpoint, is refused naming what differs.
pub fn load(path: &Path, widths: &[usize]) -> Result<(Mlp<f32>, Optimizer<f32>, Meta)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::file(path, format!("is not a valid safetensors file: {e}")))?;
    let meta: Meta = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(META_KEY))
        .ok_or_else(|| {
            Error::file(
                path,
                "is not a gpukit training checkpoint (no gpukit metadata)",
            )
        })
        .and_then(|json| {
            serde_json::from_str(json)
                .map_err(|e| Error::file(path, format!("has unreadable gpukit metadata: {e}")))
        })?;
    if meta.format != FORMAT {
        return Err(Error::file(
            path,
            format!(
                "is checkpoint format {}, this gpukit reads {FORMAT}",
                meta.format
            ),
        ));
    }
    if meta.widths != widths {
        return Err(Error::file(
            path,
            format!(
                "was saved from a model with layers {}, not {} (give the same --layers)",
                join(&meta.widths),
                join(widths)
            ),
        ));
    }
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::file(path, format!("is not a valid safetensors file: {e}")))?;
    let mut model = Mlp::<f32>::new(widths, 0);
    read_into(&file, path, "", &mut model)?;
    let mut opt = Optimizer::new(meta.optimizer);
    opt.step = meta.position.step;
    for (prefix, slot) in [("m", &mut opt.m), ("v", &mut opt.v)] {
        let first = format!("optimizer.{prefix}.{}", Mlp::<f32>::name(0, "weight"));
        if file.tensor(&first).is_err() {
            continue;
        }
        let mut buffers = Mlp::<f32>::new(widths, 0);
        read_into(&file, path, &format!("optimizer.{prefix}."), &mut buffers)?;
        *slot = buffers
            .layers
            .into_iter()
            .flat_map(|l| [l.weight, l.bias])
            .collect();
    }
    Ok((model, opt, meta))
}

/// Loads initial weights saved by PyTorch from an nn.Sequential of Linear and ReLU layers
/// (`0.weight`, `0.bias`, `2.weight`, ...), f32/f64/f16/bf16, into a model of `widths`.
pub fn load_init(path: &Path, widths: &[usize]) -> Result<Mlp<f32>> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::file(path, format!("is not a valid safetensors file: {e}")))?;
    let mut model = Mlp::<f32>::new(widths, 0);
    read_into(&file, path, "", &mut model)?;
    let expected: Vec<String> = model.named().into_iter().map(|(n, _, _)| n).collect();
    if let Some(extra) = file
        .names()
        .into_iter()
        .filter(|n| !expected.iter().any(|e| e == *n))
        .min()
    {
        return Err(Error::file(
            path,
            format!(
                "has tensor {extra:?}, which a model with layers {} does not have",
                join(widths)
            ),
        ));
    }
    Ok(model)
}

/// Fills every parameter of `model` from the tensors `prefix + name`, checking shape, dtype
/// and finiteness.
fn read_into(
    file: &SafeTensors<'_>,
    path: &Path,
    prefix: &str,
    model: &mut Mlp<f32>,
) -> Result<()> {
    let widths = join(&model.widths());
    for (i, layer) in model.layers.iter_mut().enumerate() {
        for (what, shape, dst) in [
            (
                "weight",
                vec![layer.outputs, layer.inputs],
                &mut layer.weight,
            ),
            ("bias", vec![layer.outputs], &mut layer.bias),
        ] {
            let name = format!("{prefix}{}", Mlp::<f32>::name(i, what));
            let t = file.tensor(&name).map_err(|_| {
                Error::file(
                    path,
                    format!("has no tensor {name:?}, which a model with layers {widths} needs"),
                )
            })?;
            if t.shape() != shape.as_slice() {
                return Err(Error::file(
                    path,
                    format!(
                        "{name} has shape {:?}, the model needs {shape:?}",
                        t.shape()
                    ),
                ));
            }
            let dtype = match t.dtype() {
                Dtype::F32 => gpukit_types::DType::F32,
                Dtype::F64 => gpukit_types::DType::F64,
                Dtype::F16 => gpukit_types::DType::F16,
                Dtype::BF16 => gpukit_types::DType::Bf16,
                other => {
                    return Err(Error::file(
                        path,
                        format!("{name} has dtype {other}; expected F32, F64, F16 or BF16"),
                    ))
                }
            };
            let values = gpukit_tensor::codec::decode_f32(t.data(), dtype);
            if let Some(j) = values.iter().position(|v| !v.is_finite()) {
                return Err(Error::file(
                    path,
                    format!("{name} holds NaN or Inf (first at element {j})"),
                ));
            }
            *dst = values;
        }
    }
    Ok(())
}

fn join(widths: &[usize]) -> String {
    widths
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
