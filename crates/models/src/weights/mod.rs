//! ResNet weights: loading a torchvision state_dict saved as safetensors (checked key by key),
//! saving one, single named tensors (an input batch, logits), and a deterministic seeded
//! initialisation like torchvision's ([`seeded_init`]).
//!
//! safetensors stores little-endian values; gpukit runs on little-endian machines (x86-64,
//! aarch64), where that is the native order its codec reads and writes.

mod init;
#[cfg(test)]
mod tests;

pub use init::seeded_init;

use crate::error::Result;
pub use crate::error::WeightsError;
use crate::resnet::ResNet;
use gpukit_tensor::codec::{bytes_of, decode_f32};
use gpukit_tensor::DType;
use safetensors::tensor::{Dtype, SafeTensors, TensorView, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// One parameter or buffer, as f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// torchvision's shape, e.g. `[out, in, k, k]` for a convolution.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

/// A checked state dict: exactly the keys of `ResNet::state_dict`, each with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct StateDict {
    /// The architecture the keys and shapes were checked against.
    pub model: ResNet,
    /// Rows of `fc.weight`.
    pub num_classes: usize,
    /// torchvision key name to value; `num_batches_tracked` is never here.
    pub params: BTreeMap<String, Param>,
}

impl StateDict {
    /// The parameter or buffer stored under its torchvision key name.
    pub fn get(&self, name: &str) -> Option<&Param> {
        self.params.get(name)
    }

    /// Total bytes as f32.
    pub fn bytes(&self) -> usize {
        self.params
            .values()
            .map(|p| p.data.len() * std::mem::size_of::<f32>())
            .sum()
    }
}

/// Parses a safetensors file and refuses a header that names a tensor twice (the library keeps
/// the last one silently).
fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, WeightsError> {
    let file = SafeTensors::deserialize(bytes).map_err(|source| WeightsError::Format {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(key) = duplicate_key(bytes) {
        return Err(WeightsError::DuplicateKey {
            path: path.to_path_buf(),
            key,
        });
    }
    Ok(file)
}

/// The first top-level key that a safetensors header repeats; None when there is none or the
/// header is not the JSON object it should be (deserialize has accepted it by then).
fn duplicate_key(bytes: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(key.clone()) {
                    return Ok(Some(key));
                }
            }
            Ok(None)
        }
    }
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let end = 8usize.checked_add(usize::try_from(len).ok()?)?;
    let header = bytes.get(8..end)?;
    let mut de = serde_json::Deserializer::from_slice(header);
    de.deserialize_map(Keys).ok().flatten()
}

/// Loads and checks `path` against `model`'s state dict for `num_classes` (use the class count
/// from fc.weight's first dimension if num_classes is None). Accepts F32, F16, BF16 and F64
/// tensors (converted to f32). `num_batches_tracked` keys (I64 in torchvision) are accepted and
/// ignored. Every problem is reported (the first one found is fine) with the key's name.
///
/// Checks run in this order, so the first error is the most telling: the file can be read and
/// parsed, every model key is present (in torchvision's order), no other key is present (in
/// name order), then per key in torchvision's order: shape, dtype, byte length, finiteness.
pub fn load_safetensors(
    path: &Path,
    model: ResNet,
    num_classes: Option<usize>,
) -> Result<StateDict> {
    Ok(load_checked(path, model, num_classes)?)
}

fn load_checked(
    path: &Path,
    model: ResNet,
    num_classes: Option<usize>,
) -> Result<StateDict, WeightsError> {
    let bytes = std::fs::read(path).map_err(|source| WeightsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = parse(path, &bytes)?;
    let tensors: HashMap<&str, TensorView<'_>> = file.iter().collect();
    let ctx = Ctx { path, model };

    let num_classes = match num_classes {
        Some(n) => n,
        None => infer_classes(&tensors, ctx)?,
    };
    if num_classes == 0 {
        return Err(WeightsError::NoClasses {
            path: path.to_path_buf(),
        });
    }
    let specs = model.state_dict(num_classes);

    if let Some(spec) = specs
        .iter()
        .find(|s| !tensors.contains_key(s.name.as_str()))
    {
        return Err(ctx.missing(&spec.name));
    }
    let expected: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let mut names: Vec<&str> = tensors.keys().copied().collect();
    // HashMap order differs run to run; sorting makes the reported key reproducible
    names.sort_unstable();
    for name in names {
        if !expected.contains(name) && !is_ignored_counter(name, &expected) {
            return Err(WeightsError::UnexpectedKey {
                path: path.to_path_buf(),
                key: name.to_string(),
                model,
            });
        }
    }

    let mut params = BTreeMap::new();
    for spec in specs {
        let Some(view) = tensors.get(spec.name.as_str()) else {
            // unreachable after the presence check above; kept as an error, not a panic
            return Err(ctx.missing(&spec.name));
        };
        if view.shape() != spec.shape.as_slice() {
            return Err(WeightsError::Shape {
                path: path.to_path_buf(),
                key: spec.name,
                model,
                found: view.shape().to_vec(),
                expected: format!("{:?}", spec.shape),
            });
        }
        let data = convert(view, &spec.name, &spec.shape, ctx)?;
        if let Some(index) = data.iter().position(|v| !v.is_finite()) {
            return Err(WeightsError::NonFinite {
                path: path.to_path_buf(),
                key: spec.name,
                index,
            });
        }
        params.insert(
            spec.name,
            Param {
                shape: spec.shape,
                data,
            },
        );
    }
    Ok(StateDict {
        model,
        num_classes,
        params,
    })
}

/// Writes the state dict as F32 safetensors (atomically: to a temp file in the same directory,
/// then rename), with the torchvision key names.
///
/// The temp file is synced before the rename so that a crash leaves either the old file or the
/// complete new one, never a torn one. Only value counts are checked here (a file with a
/// count that does not fit its shape cannot be written); keys and values are written as given.
pub fn save_safetensors(dict: &StateDict, path: &Path) -> Result<()> {
    Ok(save_checked(dict, path)?)
}

fn save_checked(dict: &StateDict, path: &Path) -> Result<(), WeightsError> {
    for (key, p) in &dict.params {
        let expected = p.shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d));
        if p.data.len() != expected {
            return Err(WeightsError::ValueCount {
                path: path.to_path_buf(),
                key: key.clone(),
                shape: p.shape.clone(),
                found: p.data.len(),
                expected,
            });
        }
    }
    let views: Vec<(&str, &[usize], &[f32])> = dict
        .params
        .iter()
        .map(|(k, p)| (k.as_str(), p.shape.as_slice(), p.data.as_slice()))
        .collect();
    // "pt" is what Hugging Face tooling expects of a PyTorch state dict
    write_atomic(path, &views, Some(("format", "pt")))
}

/// Writes f32 tensors as one safetensors file, whole or not at all (see
/// [`gpukit_types::files`]).
fn write_atomic(
    path: &Path,
    tensors: &[(&str, &[usize], &[f32])],
    metadata: Option<(&str, &str)>,
) -> Result<(), WeightsError> {
    let views = tensors
        .iter()
        .map(|&(k, shape, data)| (k, F32View { shape, data }));
    let metadata = metadata.map(|(k, v)| HashMap::from([(k.to_string(), v.to_string())]));
    let bytes = safetensors::serialize(views, metadata).map_err(|source| WeightsError::Encode {
        path: path.to_path_buf(),
        source,
    })?;
    gpukit_types::files::write_atomically(path, &bytes).map_err(|source| WeightsError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Named f32 tensors (an input batch, logits) as one safetensors file, written atomically.
/// The message of an error names the file.
pub fn save_tensors(path: &Path, tensors: &[(&str, &[usize], &[f32])]) -> Result<()> {
    for &(name, shape, data) in tensors {
        let expected = shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d));
        if expected != data.len() {
            return Err(WeightsError::ValueCount {
                path: path.to_path_buf(),
                key: name.to_string(),
                shape: shape.to_vec(),
                found: data.len(),
                expected,
            }
            .into());
        }
    }
    Ok(write_atomic(path, tensors, None)?)
}

/// The gpukit dtype of a floating-point safetensors dtype.
fn dtype_of(d: Dtype) -> Option<DType> {
    match d {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::Bf16),
        Dtype::F64 => Some(DType::F64),
        _ => None,
    }
}

/// The tensor `name` of a safetensors file as f32 (F32, F16, BF16 or F64 stored), with its
/// shape. The message of an error names the file and the key.
pub fn load_tensor(path: &Path, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).map_err(|source| WeightsError::TensorRead {
        path: path.to_path_buf(),
        source,
    })?;
    // a data file, not weights: its errors say so
    let st = parse(path, &bytes).map_err(|e| match e {
        WeightsError::Format { path, source } => WeightsError::TensorFormat { path, source },
        other => other,
    })?;
    let t = st.tensor(name).map_err(|_| WeightsError::NoTensor {
        path: path.to_path_buf(),
        name: name.to_string(),
        names: st.names().into_iter().map(str::to_string).collect(),
    })?;
    let dtype = dtype_of(t.dtype()).ok_or_else(|| WeightsError::Dtype {
        path: path.to_path_buf(),
        key: name.to_string(),
        dtype: t.dtype().to_string(),
    })?;
    Ok((t.shape().to_vec(), decode_f32(t.data(), dtype)))
}

/// What every load error needs to name, passed around instead of two arguments.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    path: &'a Path,
    model: ResNet,
}

impl Ctx<'_> {
    fn missing(self, key: &str) -> WeightsError {
        WeightsError::MissingKey {
            path: self.path.to_path_buf(),
            key: key.to_string(),
        }
    }
}

/// The class count is fc.weight's first dimension; a tensor that is not a matrix cannot say it,
/// so that is reported as a shape error against the known input width.
fn infer_classes(
    tensors: &HashMap<&str, TensorView<'_>>,
    ctx: Ctx<'_>,
) -> Result<usize, WeightsError> {
    let key = "fc.weight";
    let Some(view) = tensors.get(key) else {
        return Err(ctx.missing(key));
    };
    match view.shape() {
        [classes, _] => Ok(*classes),
        found => {
            let width = ctx
                .model
                .state_dict(1)
                .into_iter()
                .find(|s| s.name == key)
                .and_then(|s| s.shape.get(1).copied())
                .unwrap_or(0);
            Err(WeightsError::Shape {
                path: ctx.path.to_path_buf(),
                key: key.to_string(),
                model: ctx.model,
                found: found.to_vec(),
                expected: format!("[classes, {width}]"),
            })
        }
    }
}

/// torchvision saves `<bn>.num_batches_tracked` next to each batch norm; it only drives the
/// momentum schedule of training, so it is skipped, but only beside a batch norm the model has
/// (elsewhere it betrays a different architecture).
fn is_ignored_counter(name: &str, expected: &HashSet<&str>) -> bool {
    name.strip_suffix(".num_batches_tracked")
        .is_some_and(|bn| expected.contains(format!("{bn}.running_mean").as_str()))
}

/// Converts F32/F16/BF16/F64 bytes to f32, after checking the dtype and the byte length.
fn convert(
    view: &TensorView<'_>,
    key: &str,
    shape: &[usize],
    ctx: Ctx<'_>,
) -> Result<Vec<f32>, WeightsError> {
    let Some(dtype) = dtype_of(view.dtype()) else {
        return Err(WeightsError::Dtype {
            path: ctx.path.to_path_buf(),
            key: key.to_string(),
            dtype: view.dtype().to_string(),
        });
    };
    let bytes = view.data();
    let count = shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d));
    // the library checks offsets against shape and dtype already; this guards against a
    // future version that does not, since a short tensor would silently shift every value
    let expected = count.saturating_mul(dtype.size_bytes());
    if bytes.len() != expected {
        return Err(WeightsError::ByteLength {
            path: ctx.path.to_path_buf(),
            key: key.to_string(),
            shape: shape.to_vec(),
            dtype: view.dtype().to_string(),
            found: bytes.len(),
            expected,
        });
    }
    Ok(decode_f32(bytes, dtype))
}

/// A Param seen as a safetensors F32 tensor; bytes are produced one tensor at a time while the
/// file is written, so saving never holds a second copy of the whole model.
struct F32View<'a> {
    shape: &'a [usize],
    data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(bytes_of(self.data))
    }

    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}
