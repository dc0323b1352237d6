//! Initial weights of a ResNet from a torchvision state dict saved as safetensors
//! (`safetensors.torch.save_file(torchvision.models.resnet50().state_dict(), path)`): every
//! parameter and running statistic by its torchvision name, its shape checked against the
//! model's, so that a state dict of another network or another class count is refused naming
//! the first tensor that does not fit.

use super::resnet::ResNet;
use crate::data::{floats, tensor};
use crate::error::{Error, Result};
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use std::path::Path;

/// Sets every parameter and buffer of `model` from the state dict at `path` (f32, f64, f16 or
/// bf16; `num_batches_tracked`, if there, sets the batch count). A missing tensor, one of
/// another shape, or a tensor the model does not have is an [`Error::File`] naming it.
pub fn load_state_dict(path: &Path, model: &mut ResNet<f32>) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_bytes(&bytes, model).map_err(|why| Error::file(path, why))
}

fn from_bytes(bytes: &[u8], model: &mut ResNet<f32>) -> Result<(), String> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let what = format!("{} of {} classes", model.depth.name(), model.classes);
    let another = "is it a state dict of another network?";
    for t in model.params.iter_mut().chain(model.buffers.iter_mut()) {
        let found = file.tensor(&t.name).map_err(|_| {
            format!(
                "has no tensor {:?} (shape {:?}), which {what} needs: {another}",
                t.name, t.shape
            )
        })?;
        if found.shape() != t.shape.as_slice() {
            let hint = if t.name.starts_with("fc.") {
                " (set --classes to the state dict's)"
            } else {
                ""
            };
            return Err(format!(
                "{} has shape {:?}, {what} needs {:?}{hint}",
                t.name,
                found.shape(),
                t.shape
            ));
        }
        t.data = floats(&found, &t.name)?;
    }
    let batches = tensor(&file, "bn1.num_batches_tracked").ok().and_then(|t| {
        (t.dtype() == Dtype::I64 && t.data().len() == 8)
            .then(|| t.data().try_into().ok().map(i64::from_le_bytes))
            .flatten()
    });
    if let Some(b) = batches {
        model.batches_tracked = u64::try_from(b).unwrap_or(0);
    }
    let known = |name: &str| {
        name.ends_with(".num_batches_tracked")
            || model
                .params
                .iter()
                .chain(&model.buffers)
                .any(|t| t.name == name)
    };
    if let Some(extra) = file.names().into_iter().filter(|n| !known(n)).min() {
        return Err(format!(
            "has tensor {extra:?}, which {what} does not have: {another}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cnn::resnet::Depth;
    use safetensors::tensor::TensorView;

    /// The safetensors bytes of a model's state dict (f32), as torchvision would save it.
    fn state_dict(model: &ResNet<f32>) -> Vec<u8> {
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = model
            .params
            .iter()
            .chain(&model.buffers)
            .map(|t| {
                let b = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
                (t.name.clone(), t.shape.clone(), b)
            })
            .chain(std::iter::once((
                "bn1.num_batches_tracked".to_string(),
                vec![],
                7i64.to_le_bytes().to_vec(),
            )))
            .collect();
        let views: Vec<(String, TensorView)> = data
            .iter()
            .map(|(n, s, b)| {
                let dtype = if s.is_empty() { Dtype::I64 } else { Dtype::F32 };
                (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap())
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn a_state_dict_of_the_same_network_loads_every_tensor() {
        let source = ResNet::<f32>::new(Depth::ResNet18, 10, 5);
        let mut model = ResNet::<f32>::new(Depth::ResNet18, 10, 6);
        from_bytes(&state_dict(&source), &mut model).unwrap();
        assert_eq!(model.params, source.params);
        assert_eq!(model.buffers, source.buffers);
        assert_eq!(model.batches_tracked, 7);
    }

    #[test]
    fn another_networks_state_dict_is_refused_by_its_first_misfit() {
        let resnet50 = state_dict(&ResNet::<f32>::new(Depth::ResNet50, 10, 1));
        let resnet34 = state_dict(&ResNet::<f32>::new(Depth::ResNet34, 10, 1));
        let classes = state_dict(&ResNet::<f32>::new(Depth::ResNet18, 1000, 1));
        let mut model = ResNet::<f32>::new(Depth::ResNet18, 10, 1);
        for (bytes, says) in [
            (
                &resnet50,
                "layer1.0.conv1.weight has shape [64, 64, 1, 1], resnet18 of 10 classes needs \
                 [64, 64, 3, 3]",
            ),
            (
                &resnet34,
                "has tensor \"layer1.2.bn1.bias\", which resnet18 of 10 classes does not have",
            ),
            (
                &classes,
                "fc.weight has shape [1000, 512], resnet18 of 10 classes needs [10, 512] (set \
                 --classes",
            ),
        ] {
            let e = from_bytes(bytes, &mut model).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
        let mut bigger = ResNet::<f32>::new(Depth::ResNet50, 10, 1);
        let e = from_bytes(&resnet34, &mut bigger).unwrap_err();
        assert!(e.contains("layer1.0.conv1.weight has shape [64, 64, 3, 3], resnet50 of 10 classes needs [64, 64, 1, 1]"), "{e}");
    }
}
