//! ONNX Runtime as a peer strategy: finds `libonnxruntime` (as the `onnxruntime` wheels install
//! it, or `GPUKIT_ORT_LIB`), loads it at run time through `ort` (no download, no build-time
//! link) and runs a model gpukit exported itself.

use crate::error::{Error, Result};
use ort::session::Session;
use ort::value::Tensor;
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

/// An ONNX model in an ONNX Runtime session on the CPU.
pub struct OrtModel {
    session: Session,
}

impl OrtModel {
    /// A session for `onnx` (bytes of a ModelProto) with `threads` intra-op threads.
    pub fn new(lib: &Path, onnx: &[u8], threads: usize) -> Result<OrtModel> {
        let env = environment(lib)?;
        let session = Session::builder(env)
            .map_err(ort_error)?
            .with_intra_threads(threads)
            .map_err(ort_error)?
            .commit_from_memory(onnx)
            .map_err(|e| Error::OnnxRuntime(format!("ONNX Runtime rejected the model: {e}")))?;
        Ok(OrtModel { session })
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
