//! Files that hand a run to another framework (PyTorch, for `--compare-pytorch`): the initial
//! weights under nn.Sequential's (an MLP's) or torchvision's (a ResNet's) names, the images,
//! and every epoch's or update's sample order. With the data itself
//! (`Dataset::save`) and the configuration, the other side trains on exactly the same
//! weights, batches and order.

use crate::cnn::data::Images;
use crate::cnn::resnet::ResNet;
use crate::data::batch_order;
use crate::error::{Error, Result};
use crate::model::Mlp;
use gpukit_tensor::codec::bytes_of;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// A tensor to write: name, shape, little-endian bytes (of the dtype given with it).
pub(crate) type RawTensor = (String, Vec<usize>, Vec<u8>);

/// Writes `model`'s parameters as F32 tensors named `0.weight`, `0.bias`, `2.weight`, ...
pub fn save_weights(path: &Path, model: &Mlp<f32>) -> Result<()> {
    let tensors: Vec<RawTensor> = model
        .named()
        .into_iter()
        .map(|(name, shape, values)| (name, shape, bytes_of(values).to_vec()))
        .collect();
    write_tensors(path, &tensors, Dtype::F32, None)
}

/// Writes `order`, I64 [epochs, n]: row e is epoch e's sample order (`batch_order`).
pub fn save_order(path: &Path, n: usize, epochs: u64, seed: u64, shuffle: bool) -> Result<()> {
    let mut bytes = Vec::with_capacity(epochs as usize * n * 8);
    for e in 0..epochs {
        for i in batch_order(n, e, seed, shuffle) {
            bytes.extend_from_slice(&(i as i64).to_le_bytes());
        }
    }
    write_tensors(
        path,
        &[("order".to_string(), vec![epochs as usize, n], bytes)],
        Dtype::I64,
        None,
    )
}

/// A ResNet's parameters and running statistics under torchvision's names (F32): the state
/// dict `torchvision.models.resnetNN().load_state_dict` takes (`strict=False`: the norms'
/// `num_batches_tracked` is not written).
pub fn save_resnet(path: &Path, model: &ResNet<f32>) -> Result<()> {
    let tensors: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = model
        .params
        .iter()
        .chain(&model.buffers)
        .map(|t| {
            (
                t.name.clone(),
                t.shape.to_vec(),
                bytes_of(&t.data).to_vec(),
                Dtype::F32,
            )
        })
        .collect();
    write_typed(path, &tensors, None)
}

/// Images and labels as a convolutional run's `--data` file reads them: `x` F32
/// [n, 3, height, width], `y` I64 [n].
pub fn save_images(path: &Path, images: &Images) -> Result<()> {
    let (h, w) = images.size;
    let labels: Vec<u8> = images
        .labels
        .iter()
        .flat_map(|&l| i64::from(l).to_le_bytes())
        .collect();
    write_typed(
        path,
        &[
            (
                "x".into(),
                vec![images.len(), 3, h, w],
                bytes_of(&images.pixels).to_vec(),
                Dtype::F32,
            ),
            ("y".into(), vec![images.len()], labels, Dtype::I64),
        ],
        None,
    )
}

/// Writes `order`, I64 [updates, batch]: the images each update trains on.
pub fn save_update_order(path: &Path, batches: &[Vec<usize>]) -> Result<()> {
    let batch = batches.first().map_or(0, Vec::len);
    if batches.iter().any(|b| b.len() != batch) {
        return Err(Error::Failed("updates of different batch sizes".into()));
    }
    let bytes: Vec<u8> = batches
        .iter()
        .flatten()
        .flat_map(|&i| (i as i64).to_le_bytes())
        .collect();
    write_typed(
        path,
        &[(
            "order".to_string(),
            vec![batches.len(), batch],
            bytes,
            Dtype::I64,
        )],
        None,
    )
}

/// Writes `tensors`, all of `dtype`, and `metadata` as one safetensors file, whole or not at
/// all (a temporary file beside it, then a rename).
pub(crate) fn write_tensors(
    path: &Path,
    tensors: &[RawTensor],
    dtype: Dtype,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let typed: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.clone(), dtype))
        .collect();
    write_typed(path, &typed, metadata)
}

/// [`write_tensors`] with each tensor's own dtype.
fn write_typed(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<u8>, Dtype)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, shape, data, dtype)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.as_str(), v))
                .map_err(|e| Error::Failed(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, metadata)
        .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    gpukit_types::files::write_atomically(path, &bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::SafeTensors;

    /// A ResNet's state dict, images and update order read back as written (the state dict by
    /// the loader `--init` uses, the images by `--data`'s).
    #[test]
    fn a_resnet_run_reads_back_as_written() {
        use crate::cnn::resnet::Depth;
        let dir = tempfile::tempdir().unwrap();
        let mut model = ResNet::<f32>::new(Depth::ResNet18, 10, 5);
        model.buffers[0].data[0] = 0.25;
        let w = dir.path().join("w.safetensors");
        save_resnet(&w, &model).unwrap();
        let mut back = ResNet::<f32>::new(Depth::ResNet18, 10, 6);
        crate::cnn::init::load_state_dict(&w, &mut back).unwrap();
        assert_eq!(back.params, model.params);
        assert_eq!(back.buffers, model.buffers);
        let images = crate::cnn::data::generated(6, (8, 10), 10, 3).unwrap();
        let d = dir.path().join("d.safetensors");
        save_images(&d, &images).unwrap();
        assert_eq!(crate::cnn::data::load(&d, 10).unwrap(), images);
        let o = dir.path().join("o.safetensors");
        save_update_order(&o, &[vec![3, 1], vec![0, 5]]).unwrap();
        let bytes = std::fs::read(&o).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(file.tensor("order").unwrap().shape(), &[2, 2]);
        assert!(save_update_order(&o, &[vec![1], vec![0, 5]]).is_err());
    }

    #[test]
    fn weights_and_orders_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let model = Mlp::<f32>::new(&[3, 4, 2], 9);
        let w = dir.path().join("w.safetensors");
        save_weights(&w, &model).unwrap();
        let back = crate::checkpoint::load_init(&w, &[3, 4, 2]).unwrap();
        assert_eq!(back, model);
        let o = dir.path().join("o.safetensors");
        save_order(&o, 5, 3, 11, true).unwrap();
        let bytes = std::fs::read(&o).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let t = file.tensor("order").unwrap();
        assert_eq!(t.shape(), &[3, 5]);
        let values: Vec<usize> = t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        for e in 0..3 {
            assert_eq!(
                &values[e * 5..e * 5 + 5],
                batch_order(5, e as u64, 11, true).as_slice()
            );
        }
    }
}
