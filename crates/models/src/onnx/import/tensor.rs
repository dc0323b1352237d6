//! A TensorProto's elements: raw little-endian bytes, the typed field of its type, or an
//! external file beside the model. Every claimed size is checked against the bytes actually
//! there before anything of that size is allocated.

use crate::error::OnnxProblem;
use crate::graph::{Data, MAX_ELEMENTS};
use crate::onnx::proto::{data_type, TensorProto, DATA_LOCATION_EXTERNAL};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

fn tensor_problem(t: &TensorProto, problem: String) -> OnnxProblem {
    OnnxProblem::Tensor {
        tensor: t.name.clone(),
        problem,
    }
}

/// The tensor's shape, checked: no negative dimension, at most [`MAX_ELEMENTS`] elements.
pub(super) fn dims(t: &TensorProto) -> Result<(Vec<usize>, usize), OnnxProblem> {
    let shape = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| tensor_problem(t, format!("dimension {d} is negative")))
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&c| c <= MAX_ELEMENTS)
        .ok_or_else(|| {
            tensor_problem(
                t,
                format!("shape {shape:?} has more than {MAX_ELEMENTS} elements"),
            )
        })?;
    Ok((shape, count))
}

/// Bytes per element of the types gpukit reads.
fn element_bytes(t: &TensorProto) -> Result<usize, OnnxProblem> {
    match t.data_type {
        data_type::FLOAT | data_type::INT32 => Ok(4),
        data_type::INT64 | data_type::DOUBLE => Ok(8),
        other => Err(tensor_problem(
            t,
            format!(
                "data type {other} is not supported (gpukit reads float, double, int32 and int64)"
            ),
        )),
    }
}

/// Elements decoded from little-endian bytes (their length already checked).
fn from_le(t: &TensorProto, bytes: &[u8]) -> Data {
    match t.data_type {
        data_type::FLOAT => Data::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        data_type::DOUBLE => Data::F32(
            bytes
                .chunks_exact(8)
                .map(|b| {
                    f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                })
                .collect(),
        ),
        data_type::INT32 => Data::I64(
            bytes
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
        ),
        _ => Data::I64(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
        ),
    }
}

/// The tensor's shape and elements; `dir` is the model's folder (None for a model read from
/// memory, which then cannot have external data).
pub(super) fn read_tensor(
    t: &TensorProto,
    dir: Option<&Path>,
) -> Result<(Vec<usize>, Data), OnnxProblem> {
    let (shape, count) = dims(t)?;
    let size = element_bytes(t)?;
    let need = count * size;
    if t.data_location == DATA_LOCATION_EXTERNAL {
        let bytes = read_external(t, dir, need)?;
        return Ok((shape, from_le(t, &bytes)));
    }
    if !t.raw_data.is_empty() {
        if t.raw_data.len() != need {
            return Err(tensor_problem(
                t,
                format!(
                    "raw_data has {} bytes; shape {shape:?} needs {need}",
                    t.raw_data.len()
                ),
            ));
        }
        return Ok((shape, from_le(t, &t.raw_data)));
    }
    let (found, data) = match t.data_type {
        data_type::FLOAT => (t.float_data.len(), Data::F32(t.float_data.clone())),
        data_type::DOUBLE => (
            t.double_data.len(),
            Data::F32(t.double_data.iter().map(|&v| v as f32).collect()),
        ),
        data_type::INT32 => (
            t.int32_data.len(),
            Data::I64(t.int32_data.iter().map(|&v| i64::from(v)).collect()),
        ),
        _ => (t.int64_data.len(), Data::I64(t.int64_data.clone())),
    };
    if found != count {
        return Err(tensor_problem(
            t,
            format!("holds {found} values; shape {shape:?} needs {count}"),
        ));
    }
    Ok((shape, data))
}

/// An external data entry's value.
fn entry<'a>(t: &'a TensorProto, key: &str) -> Option<&'a str> {
    t.external_data
        .iter()
        .find(|e| e.key == key)
        .map(|e| e.value.as_str())
}

/// `need` bytes of the tensor's external file, at its offset.
fn read_external(t: &TensorProto, dir: Option<&Path>, need: usize) -> Result<Vec<u8>, OnnxProblem> {
    let location = entry(t, "location")
        .ok_or_else(|| tensor_problem(t, "external data without a location".into()))?;
    let relative = PathBuf::from(location);
    let ext = |file: &Path, problem: String| OnnxProblem::ExternalData {
        tensor: t.name.clone(),
        file: file.to_path_buf(),
        problem,
    };
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(ext(
            &relative,
            "must be a relative path inside the model's folder".into(),
        ));
    }
    let dir = dir.ok_or_else(|| {
        ext(
            &relative,
            "a model read from memory has no folder to find it in; import it from its file".into(),
        )
    })?;
    let file = dir.join(&relative);
    let number = |key: &str| -> Result<Option<u64>, OnnxProblem> {
        entry(t, key)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| ext(&file, format!("{key} {v:?} is not a byte count")))
            })
            .transpose()
    };
    let offset = number("offset")?.unwrap_or(0);
    if let Some(length) = number("length")? {
        if length != need as u64 {
            return Err(ext(&file, format!("length {length} differs from the {need} bytes the tensor's shape and type need")));
        }
    }
    let mut f =
        std::fs::File::open(&file).map_err(|e| ext(&file, format!("cannot be opened: {e}")))?;
    let len = f
        .metadata()
        .map_err(|e| ext(&file, format!("cannot be read: {e}")))?
        .len();
    let end = offset.saturating_add(need as u64);
    if end > len {
        return Err(ext(
            &file,
            format!("has {len} bytes; the tensor needs bytes {offset} to {end}"),
        ));
    }
    let mut bytes = vec![0u8; need];
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| f.read_exact(&mut bytes))
        .map_err(|e| ext(&file, format!("cannot be read: {e}")))?;
    Ok(bytes)
}
