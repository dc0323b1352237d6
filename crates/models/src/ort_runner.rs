//! ONNX Runtime as a peer strategy: finds `libonnxruntime` (as the `onnxruntime` wheels install
//! it, or `GPUKIT_ORT_LIB`), loads it at run time through `ort` (no download, no build-time
//! link) and runs a model gpukit exported itself ([`OrtModel::run`]), or a user's model as it is
//! ([`OrtModel::from_file`], [`OrtModel::run_named`]).

use crate::error::{Error, Result};
use ort::session::builder::SessionBuilder;
use ort::session::Session;
use ort::value::{Tensor, TensorRef};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where `libonnxruntime` is: `GPUKIT_ORT_LIB`, else the `onnxruntime` wheel of the active
/// Python (site-packages/onnxruntime/capi/libonnxruntime.so*). The error says what to install.
pub fn find_onnxruntime() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GPUKIT_ORT_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::OnnxRuntime(format!(
                "GPUKIT_ORT_LIB names {}, which is not a file",
                p.display()
            )))
        };
    }
    for site in gpukit_cuda::loader::python_site_packages() {
        let capi = site.join("onnxruntime/capi");
        let Ok(rd) = std::fs::read_dir(&capi) else {
            continue;
        };
        let mut libs: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libonnxruntime.so"))
            })
            .collect();
        libs.sort();
        if let Some(l) = libs.pop() {
            return Ok(l);
        }
    }
    Err(Error::OnnxRuntime("ONNX Runtime was not found: pip install onnxruntime (or onnxruntime-gpu), or set GPUKIT_ORT_LIB to libonnxruntime.so".into()))
}

/// The runtime, loaded once per process (ONNX Runtime keeps one global environment).
fn environment(lib: &Path) -> Result<&'static ort::environment::Environment> {
    // the outcome of the one load, kept: a message when it failed
    static ENV: OnceLock<std::result::Result<ort::environment::Environment, String>> =
        OnceLock::new();
    ENV.get_or_init(|| {
        ort::init_from(lib)
            .map_err(|e| format!("cannot load ONNX Runtime from {}: {e}", lib.display()))?
            .with_name("gpukit")
            .build()
            .map_err(|e| format!("ONNX Runtime at {} did not start: {e}", lib.display()))
    })
    .as_ref()
    .map_err(|e| Error::OnnxRuntime(e.clone()))
}

fn ort_error(e: impl std::fmt::Display) -> Error {
    Error::OnnxRuntime(format!("ONNX Runtime: {e}"))
}

/// A session builder with `threads` intra-op threads whose idle threads block instead of
/// spinning, so they take no core from the rows timed beside (gpukit's CPU row ran up to 20%
/// slower with them spinning).
fn builder(lib: &Path, threads: usize) -> Result<SessionBuilder> {
    Session::builder(environment(lib)?)
        .map_err(ort_error)?
        .with_intra_threads(threads)
        .map_err(ort_error)?
        .with_intra_op_spinning(false)
        .map_err(ort_error)
}

/// An ONNX model in an ONNX Runtime session on the CPU.
pub struct OrtModel {
    session: Session,
}

impl OrtModel {
    /// A session for `onnx` (bytes of a ModelProto) with `threads` intra-op threads.
    pub fn new(lib: &Path, onnx: &[u8], threads: usize) -> Result<OrtModel> {
        let session = builder(lib, threads)?
            .commit_from_memory(onnx)
            .map_err(|e| Error::OnnxRuntime(format!("ONNX Runtime rejected the model: {e}")))?;
        Ok(OrtModel { session })
    }

    /// A session for the model at `path`, read by ONNX Runtime itself: what a model whose
    /// weights are in external data files needs (they are found beside it).
    pub fn from_file(lib: &Path, path: &Path, threads: usize) -> Result<OrtModel> {
        let session = builder(lib, threads)?.commit_from_file(path).map_err(|e| {
            Error::OnnxRuntime(format!(
                "ONNX Runtime rejected the model {}: {e}",
                path.display()
            ))
        })?;
        Ok(OrtModel { session })
    }

    /// Runs the model on one f32 input `input` of `shape` and returns `outputs` (names), in
    /// that order, each as its shape and its values as f32 (int64 outputs converted).
    pub fn run_named(
        &mut self,
        input: &str,
        shape: &[usize],
        values: &[f32],
        outputs: &[String],
    ) -> Result<Vec<(Vec<usize>, Vec<f32>)>> {
        // a view of the caller's values: nothing copied inside a timed pass
        let x = TensorRef::from_array_view((shape.to_vec(), values)).map_err(ort_error)?;
        let got = self
            .session
            .run(ort::inputs![input => x])
            .map_err(ort_error)?;
        outputs
            .iter()
            .map(|name| {
                let v = got.get(name.as_str()).ok_or_else(|| {
                    Error::OnnxRuntime(format!("ONNX Runtime gave no output named {name}"))
                })?;
                let dims = |s: &ort::value::Shape| -> Vec<usize> {
                    s.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect()
                };
                if let Ok((s, x)) = v.try_extract_tensor::<f32>() {
                    return Ok((dims(s), x.to_vec()));
                }
                let (s, x) = v.try_extract_tensor::<i64>().map_err(|e| {
                    Error::OnnxRuntime(format!(
                        "ONNX Runtime's output {name} is neither float nor int64: {e}"
                    ))
                })?;
                Ok((dims(s), x.iter().map(|&i| i as f32).collect()))
            })
            .collect()
    }

    /// Logits for `n` NCHW RGB images of `h x w` (the model's `input` -> `logits`).
    pub fn run(&mut self, input: &[f32], n: usize, h: usize, w: usize) -> Result<Vec<f32>> {
        let x = Tensor::from_array(([n, 3, h, w], input.to_vec())).map_err(ort_error)?;
        let outputs = self
            .session
            .run(ort::inputs!["input" => x])
            .map_err(ort_error)?;
        let (_, logits) = outputs["logits"]
            .try_extract_tensor::<f32>()
            .map_err(ort_error)?;
        Ok(logits.to_vec())
    }
}
