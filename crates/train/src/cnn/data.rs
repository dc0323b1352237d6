//! Images a convolutional network trains on: a safetensors file (an image tensor `x`
//! [n, 3, height, width] and class labels `y` [n]) or images generated from a seed, and the
//! batches of an epoch.
//!
//! To use: [`load`] (every value checked finite, every label below the model's classes) or
//! [`generated`], then [`Images::batch`] with the indices of [`crate::data::batch_order`].

use super::Tensor;
use crate::data::{class_targets, floats, targets_seed, tensor, Targets};
use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::SafeTensors;
use std::path::Path;

/// Images (NCHW, f32) and a class label each.
#[derive(Debug, Clone, PartialEq)]
pub struct Images {
    /// (height, width) of every image.
    pub size: (usize, usize),
    pub pixels: Vec<f32>,
    pub labels: Vec<u32>,
}

impl Images {
    /// How many images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values of one image.
    pub fn image_len(&self) -> usize {
        3 * self.size.0 * self.size.1
    }

    /// The images at `idx`, in that order, as one batch, and their labels.
    pub fn batch(&self, idx: &[usize]) -> (Tensor<f32>, Vec<u32>) {
        use rayon::prelude::*;
        let len = self.image_len();
        // an image a task: a ResNet batch is hundreds of MB, one thread's copy a step's time
        let mut pixels = vec![0f32; idx.len() * len];
        pixels
            .par_chunks_mut(len.max(1))
            .zip(idx.par_iter())
            .for_each(|(out, &i)| out.copy_from_slice(&self.pixels[i * len..(i + 1) * len]));
        let labels = idx.iter().map(|&i| self.labels[i]).collect();
        let (h, w) = self.size;
        (
            Tensor {
                shape: [idx.len(), 3, h, w],
                data: pixels,
            },
            labels,
        )
    }
}

/// `n` images of `size` with standard normal pixels and labels uniform over `classes`, the
/// same for the same seed (the labels from another stream than the pixels).
pub fn generated(n: usize, size: (usize, usize), classes: usize, seed: u64) -> Result<Images> {
    let values = n
        .checked_mul(3)
        .and_then(|v| v.checked_mul(size.0))
        .and_then(|v| v.checked_mul(size.1))
        .ok_or_else(|| Error::Setting(format!("{n} images of {size:?}: too many values")))?;
    if classes == 0 {
        return Err(Error::Setting("--classes 0: must be at least 1".into()));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(targets_seed(seed));
    let labels = (0..n)
        .map(|_| rng.random_range(0..classes as u32))
        .collect();
    Ok(Images {
        size,
        pixels: gpukit_tensor::random::normal_f32(values, seed),
        labels,
    })
}

/// The images of a safetensors file: `x` [n, 3, height, width] of F32, F64, F16 or BF16 and
/// `y` [n] of class indices (I64, I32, U8 or whole floats), each below `classes`. Anything else
/// is an [`Error::File`] naming the tensor and what is wrong.
pub fn load(path: &Path, classes: usize) -> Result<Images> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_safetensors(&bytes, classes).map_err(|why| Error::file(path, why))
}

fn from_safetensors(bytes: &[u8], classes: usize) -> Result<Images, String> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let x = tensor(&file, "x")?;
    let (n, h, w) = match *x.shape() {
        [n, 3, h, w] if h > 0 && w > 0 => (n, h, w),
        ref s => {
            return Err(format!(
                "x has shape {s:?}; images are [n, 3, height, width] (3 channels, NCHW)"
            ))
        }
    };
    let y = tensor(&file, "y")?;
    match *y.shape() {
        [rows] if rows == n => {}
        [rows] => return Err(format!("x holds {n} images but y {rows} labels")),
        ref s => return Err(format!("y has shape {s:?}; labels are [n], one a image")),
    }
    if n == 0 {
        return Err("holds no images (x and y have 0 rows)".into());
    }
    let pixels = floats(&x, "x")?;
    let labels = match class_targets(&y)? {
        Targets::Classes { data, .. } => data,
        Targets::Values { .. } => return Err("y does not hold class indices".into()),
    };
    if let Some((i, l)) = labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= classes)
    {
        return Err(format!(
            "y[{i}] is {l}, out of range for a model of {classes} classes (labels 0 to {}; \
             set --classes)",
            classes.saturating_sub(1)
        ));
    }
    Ok(Images {
        size: (h, w),
        pixels,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                (
                    n.to_string(),
                    safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    fn f32s(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect()
    }

    fn i64s(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|l| l.to_le_bytes()).collect()
    }

    #[test]
    fn a_file_of_images_and_labels_loads() {
        use safetensors::Dtype::*;
        let bytes = file(&[
            ("x", F32, vec![2, 3, 4, 5], f32s(120)),
            ("y", I64, vec![2], i64s(&[1, 0])),
        ]);
        let images = from_safetensors(&bytes, 2).unwrap();
        assert_eq!((images.size, images.len()), ((4, 5), 2));
        let (batch, labels) = images.batch(&[1, 0]);
        assert_eq!(batch.shape, [2, 3, 4, 5]);
        assert_eq!(batch.data[0], 30.0);
        assert_eq!(labels, vec![0, 1]);
    }

    #[test]
    fn wrong_shapes_and_labels_are_named() {
        use safetensors::Dtype::*;
        for (tensors, says) in [
            (
                vec![
                    ("x", F32, vec![2, 4, 4], f32s(32)),
                    ("y", I64, vec![2], i64s(&[0, 0])),
                ],
                "x has shape [2, 4, 4]; images are [n, 3, height, width]",
            ),
            (
                vec![
                    ("x", F32, vec![2, 1, 4, 4], f32s(32)),
                    ("y", I64, vec![2], i64s(&[0, 0])),
                ],
                "x has shape [2, 1, 4, 4]",
            ),
            (
                vec![
                    ("x", F32, vec![2, 3, 2, 2], f32s(24)),
                    ("y", I64, vec![3], i64s(&[0, 0, 0])),
                ],
                "x holds 2 images but y 3 labels",
            ),
            (
                vec![
                    ("x", F32, vec![2, 3, 2, 2], f32s(24)),
                    ("y", I64, vec![2], i64s(&[0, 10])),
                ],
                "y[1] is 10, out of range for a model of 10 classes",
            ),
            (
                vec![
                    ("x", F32, vec![2, 3, 2, 2], f32s(24)),
                    ("y", I64, vec![2], i64s(&[0, -1])),
                ],
                "y[1]",
            ),
            (
                vec![("images", F32, vec![2, 3, 2, 2], f32s(24))],
                "has no tensor named \"x\"",
            ),
        ] {
            let e = from_safetensors(&file(&tensors), 10).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn generated_images_follow_the_seed() {
        let a = generated(4, (8, 8), 10, 3).unwrap();
        assert_eq!(a, generated(4, (8, 8), 10, 3).unwrap());
        assert_ne!(a, generated(4, (8, 8), 10, 4).unwrap());
        assert_eq!(a.pixels.len(), 4 * 3 * 64);
        assert!(a.labels.iter().all(|&l| l < 10));
    }
}
