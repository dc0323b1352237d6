//! A user's ONNX model file, read and decoded once: its bytes as they are (what ONNX Runtime
//! takes), the decoded model (what the importer takes, at any batch size), and what a report
//! says of it (opset, producer, the graph's inputs and outputs as the model declares them).
//!
//! To use:
//! 1. `let file = ModelFile::read(path)?` (errors name the file, as the importer's do);
//! 2. describe it with [`ModelFile::opset`], [`ModelFile::inputs`], [`ModelFile::outputs`];
//! 3. import it at each batch size with [`ModelFile::import`];
//! 4. hand ONNX Runtime [`ModelFile::bytes`], or its path where [`ModelFile::has_external_data`].

use super::import::import_model;
use super::proto::{data_type, ModelProto, TensorProto, ValueInfoProto, DATA_LOCATION_EXTERNAL};
use super::ImportOptions;
use crate::error::{OnnxError, OnnxProblem};
use crate::graph::Graph;
use prost::Message;
use std::path::{Path, PathBuf};

/// One graph input or output as the model declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredValue {
    pub name: String,
    /// `float`, `int64`, ... (`type N` for a type without a name here, `?` when absent).
    pub elem_type: String,
    /// Each axis: its size, its symbolic name (`batch`), or `?` where the model leaves it open.
    /// Empty when the model gives no shape.
    pub dims: Vec<String>,
    /// The first axis's size where the model fixes it to a number.
    pub fixed_first: Option<usize>,
}

/// An ONNX model file, read once.
#[derive(Debug, Clone)]
pub struct ModelFile {
    path: PathBuf,
    bytes: Vec<u8>,
    model: ModelProto,
}

impl ModelFile {
    /// Reads and decodes `path`. Errors are [`crate::Error::Onnx`] naming the file: it cannot be
    /// read, or it is not an ONNX protobuf (truncated, corrupt, another format).
    pub fn read(path: &Path) -> crate::Result<ModelFile> {
        let fail = |problem| OnnxError {
            file: path.display().to_string(),
            problem,
        };
        let bytes = std::fs::read(path).map_err(|e| fail(OnnxProblem::Read(e)))?;
        let model = ModelProto::decode(bytes.as_slice())
            .map_err(|e| fail(OnnxProblem::Decode(e.to_string())))?;
        if model.graph.is_none() {
            return Err(fail(OnnxProblem::NoGraph).into());
        }
        Ok(ModelFile {
            path: path.to_path_buf(),
            bytes,
            model,
        })
    }

    /// The path it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes, as read.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The default domain's opset version, as the model imports it (None: it imports none; the
    /// importer refuses such a model).
    pub fn opset(&self) -> Option<i64> {
        self.model
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
    }

    /// `pytorch 2.5.1`: who wrote the model, as it says (empty when it does not).
    pub fn producer(&self) -> String {
        format!(
            "{} {}",
            self.model.producer_name, self.model.producer_version
        )
        .trim()
        .to_string()
    }

    /// The model's node count, as written (before gpukit's passes).
    pub fn node_count(&self) -> usize {
        self.model.graph.as_ref().map_or(0, |g| g.node.len())
    }

    /// The graph inputs the caller feeds: the declared inputs that are not initializers (older
    /// exporters list the weights among the inputs too).
    pub fn inputs(&self) -> Vec<DeclaredValue> {
        let Some(g) = &self.model.graph else {
            return Vec::new();
        };
        g.input
            .iter()
            .filter(|v| !g.initializer.iter().any(|t| t.name == v.name))
            .map(declared)
            .collect()
    }

    /// The graph outputs, in order.
    pub fn outputs(&self) -> Vec<DeclaredValue> {
        self.model
            .graph
            .as_ref()
            .map(|g| g.output.iter().map(declared).collect())
            .unwrap_or_default()
    }

    /// Whether any tensor keeps its data in another file (initializers or Constant nodes'
    /// tensors): ONNX Runtime must then load the model from its path, not from its bytes.
    pub fn has_external_data(&self) -> bool {
        let external = |t: &TensorProto| t.data_location == DATA_LOCATION_EXTERNAL;
        self.model.graph.as_ref().is_some_and(|g| {
            g.initializer.iter().any(external)
                || g.node
                    .iter()
                    .flat_map(|n| &n.attribute)
                    .filter_map(|a| a.t.as_ref())
                    .any(external)
        })
    }

    /// The model as gpukit's graph, its open sizes resolved by `options`; external data is
    /// found beside the file. Errors are the importer's ([`crate::Error::Onnx`]).
    pub fn import(&self, options: &ImportOptions) -> crate::Result<Graph> {
        let dir = self.path.parent().map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        });
        import_model(&self.model, dir, &self.path.display().to_string(), options)
    }
}

/// The name of an ONNX element type.
fn type_name(t: i32) -> String {
    match t {
        data_type::FLOAT => "float".into(),
        data_type::INT32 => "int32".into(),
        data_type::INT64 => "int64".into(),
        data_type::DOUBLE => "double".into(),
        2 => "uint8".into(),
        3 => "int8".into(),
        9 => "bool".into(),
        10 => "float16".into(),
        16 => "bfloat16".into(),
        other => format!("type {other}"),
    }
}

fn declared(v: &ValueInfoProto) -> DeclaredValue {
    let tensor = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
    let dims: Vec<(String, Option<usize>)> = tensor
        .and_then(|t| t.shape.as_ref())
        .map(|s| {
            s.dim
                .iter()
                .map(|d| match (d.dim_value, d.dim_param.as_deref()) {
                    (Some(n), _) if n > 0 => (n.to_string(), usize::try_from(n).ok()),
                    (_, Some(p)) if !p.is_empty() => (p.to_string(), None),
                    _ => ("?".to_string(), None),
                })
                .collect()
        })
        .unwrap_or_default();
    DeclaredValue {
        name: v.name.clone(),
        elem_type: tensor.map_or("?".into(), |t| type_name(t.elem_type)),
        fixed_first: dims.first().and_then(|(_, n)| *n),
        dims: dims.into_iter().map(|(d, _)| d).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::fixtures;

    fn written(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn a_fixture_file_describes_its_inputs_outputs_and_opset() {
        let (_dir, path) = written(&fixtures::tiny_resnet(1).encode_to_vec());
        let f = ModelFile::read(&path).unwrap();
        assert_eq!(f.opset(), Some(17));
        assert_eq!(
            f.producer(),
            format!("gpukit-tests {}", env!("CARGO_PKG_VERSION"))
        );
        let inputs = f.inputs();
        assert_eq!(inputs.len(), 1);
        assert_eq!(inputs[0].name, "input");
        assert_eq!(inputs[0].elem_type, "float");
        assert_eq!(inputs[0].dims, ["batch", "3", "32", "32"]);
        assert_eq!(inputs[0].fixed_first, None);
        assert_eq!(f.outputs()[0].dims, ["batch", "10"]);
        assert!(!f.has_external_data());
        assert!(f.node_count() > 10);
        let g = f
            .import(&ImportOptions {
                batch: Some(3),
                dims: Vec::new(),
            })
            .unwrap();
        assert_eq!(g.values[g.inputs[0]].shape, [3, 3, 32, 32]);
    }

    #[test]
    fn a_truncated_or_missing_file_is_an_error_naming_it() {
        let bytes = fixtures::tiny_resnet(1).encode_to_vec();
        let (dir, path) = written(&bytes[..bytes.len() / 2]);
        let e = ModelFile::read(&path).unwrap_err().to_string();
        assert!(
            e.contains("model.onnx") && e.contains("not a valid ONNX"),
            "{e}"
        );
        let missing = dir.path().join("absent.onnx");
        let e = ModelFile::read(&missing).unwrap_err().to_string();
        assert!(
            e.contains("absent.onnx") && e.contains("cannot be read"),
            "{e}"
        );
    }
}
