//! Files that hand a run to another framework (PyTorch, for `--compare-pytorch`): the initial
//! weights under nn.Sequential's names, and every epoch's sample order. With the data itself
//! (`Dataset::save`) and the configuration, the other side trains on exactly the same
//! weights, batches and order.

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

/// Writes `tensors`, all of `dtype`, and `metadata` as one safetensors file, whole or not at
/// all (a temporary file beside it, then a rename).
pub(crate) fn write_tensors(
    path: &Path,
    tensors: &[RawTensor],
    dtype: Dtype,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(dtype, shape.clone(), data)
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
