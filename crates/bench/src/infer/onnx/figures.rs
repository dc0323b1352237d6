//! `gpukit compare`'s figures of an `infer --onnx` report: images/s per model file, input shape,
//! strategy, device (a CPU row's threads) and batch. The model is named by its file's stem and
//! the shape of one image, so that two runs of the same export match and two models do not;
//! what the engine chose (steps, fusions, algorithms) is left out: comparing those across
//! versions is the point.

use crate::figures::Figure;
use serde_json::Value;

/// The command as an `infer --onnx` report names it, and the section `compare` files it under.
pub const SECTION: &str = "infer --onnx";

/// The model part of a key: `mobilenet_v3_large 3x224x224`.
fn model_key(section: &Value) -> Option<String> {
    let model = section.get("model")?;
    let file = model.get("file")?.as_str()?;
    let stem = std::path::Path::new(file)
        .file_stem()?
        .to_string_lossy()
        .into_owned();
    let shape: Vec<String> = model
        .get("inputs")?
        .get(0)?
        .get("shape")?
        .as_array()?
        .iter()
        .skip(1)
        .map(|d| d.as_u64().map(|d| d.to_string()))
        .collect::<Option<_>>()?;
    Some(format!("{stem} {}", shape.join("x")))
}

/// Every row's images/s, keyed as the module says.
pub fn figures(section: &Value, out: &mut Vec<Figure>) {
    if let Some(model) = model_key(section) {
        crate::infer::part::rate_figures(SECTION, &format!("{model} "), section, out);
    }
}
