//! A batch's way to the device: checked against the trainer's shapes and classes, converted on
//! every core (16-bit training: channel-last in the storage type, the stem's 2x2 blocks or 3
//! channels padded to 8) into pinned staging memory, and copied from it on the work stream.

use super::*;

/// NCHW f32 images (3 channels of `plane` pixels each) as channel-last `dtype` bytes with
/// `channels` a pixel (zeros after the third), an image at a time on every core: the host's
/// part of each fresh batch, which one thread made a step's worth of time at 224x224.
#[cfg(test)]
fn nhwc_bytes(images: &[f32], (plane, channels): (usize, usize), dtype: DType) -> Result<Vec<u8>> {
    let count = images.len() / (3 * plane).max(1);
    let mut out = vec![0u8; count * plane * channels * dtype.size_bytes()];
    nhwc_into(images, (plane, channels), dtype, &mut out)?;
    Ok(out)
}

/// [`nhwc_bytes`] written into `out` (as many bytes as the images take).
fn nhwc_into(
    images: &[f32],
    (plane, channels): (usize, usize),
    dtype: DType,
    out: &mut [u8],
) -> Result<()> {
    use rayon::prelude::*;
    let per_image = plane * channels * dtype.size_bytes();
    let count = images.len() / (3 * plane).max(1);
    if out.len() != count * per_image {
        return Err(Error::Failed(format!(
            "{} bytes for {count} images of {per_image}",
            out.len()
        )));
    }
    out.par_chunks_mut(per_image.max(1))
        .zip(images.par_chunks(3 * plane.max(1)))
        .try_for_each(|(dst, img)| -> Result<()> {
            let nhwc = channels_last(img, (1, 3, plane))?;
            let wide = pad_rows(&nhwc, (plane, 3, channels))?;
            dst.copy_from_slice(&encode_f32(&wide, dtype));
            Ok(())
        })
}

/// NCHW f32 images as the stem's blocked channel-last `dtype` bytes ([`stem`]), an image at a
/// time on every core.
fn blocks_into(images: &[f32], (h, w): (usize, usize), dtype: DType, out: &mut [u8]) -> Result<()> {
    use rayon::prelude::*;
    let (bh, bw) = stem::block_dims((h, w));
    let per_image = bh * bw * stem::BLOCK_CHANNELS * dtype.size_bytes();
    let count = images.len() / (3 * h * w).max(1);
    if out.len() != count * per_image {
        return Err(Error::Failed(format!(
            "{} bytes for {count} blocked images of {per_image}",
            out.len()
        )));
    }
    out.par_chunks_mut(per_image.max(1))
        .zip(images.par_chunks(3 * h * w))
        .try_for_each(|(dst, img)| stem::image_into(img, (h, w), dtype, dst))
}

impl GpuResNet {
    /// Copies a batch to the device for the next [`GpuResNet::step_uploaded`]s, after checking
    /// its shape and labels (16-bit trainers take it channels-last in the storage type).
    pub fn upload(&mut self, images: &Tensor<f32>, labels: &[u32]) -> Result<()> {
        let (h, w) = self.image;
        if images.shape != [self.batch, 3, h, w]
            || images.data.len() != images.shape.iter().product::<usize>()
        {
            return Err(Error::Setting(format!(
                "images of shape {:?}; this trainer takes {:?}",
                images.shape,
                [self.batch, 3, h, w]
            )));
        }
        if labels.len() != self.batch {
            return Err(Error::Setting(format!(
                "{} labels for a batch of {}",
                labels.len(),
                self.batch
            )));
        }
        if let Some(&bad) = labels.iter().find(|&&l| l as usize >= self.classes) {
            return Err(Error::Setting(format!(
                "label {bad} of {} classes",
                self.classes
            )));
        }
        let g = &self.gpu;
        let _op = self.op_other("upload batch", "input", images.data.len(), "host + copy");
        match self.input.layout {
            Layout::Nchw => g.upload_into(self.images.view(), bytes_of(&images.data))?,
            Layout::Nhwc => {
                // the previous copy out of the staging memory has finished before it is rewritten
                g.stream().synchronize()?;
                let len = self.input.bytes();
                let staging = match self.staging.take() {
                    Some(p) if p.len() == len => p,
                    _ => PinnedBytes::new(g, len, true)?,
                };
                let mut staging = staging;
                if self.stem_mask.is_some() {
                    blocks_into(&images.data, (h, w), self.dtype(), staging.as_mut_slice())?;
                } else {
                    nhwc_into(
                        &images.data,
                        (h * w, self.input.c),
                        self.dtype(),
                        staging.as_mut_slice(),
                    )?;
                }
                copy_pinned_to(g.stream(), &staging, len, self.images.view())?;
                self.staging = Some(staging);
            }
        }
        g.upload_into(self.labels.view(), bytes_of(labels))?;
        self.uploaded = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch becomes padded channel-last bytes image by image, as the whole batch would.
    #[test]
    fn images_become_padded_channel_last_bytes_image_by_image() {
        let (n, plane) = (3, 5);
        let images: Vec<f32> = (0..n * 3 * plane).map(|v| v as f32 * 0.5 - 7.0).collect();
        let got = nhwc_bytes(&images, (plane, 8), DType::Bf16).unwrap();
        let nhwc = channels_last(&images, (n, 3, plane)).unwrap();
        let want = encode_f32(&pad_rows(&nhwc, (n * plane, 3, 8)).unwrap(), DType::Bf16);
        assert_eq!(got, want);
    }
}
