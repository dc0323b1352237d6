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
                let mut staging = match self.staging.take() {
                    Some(p) if p.len() == len => p,
                    _ => PinnedBytes::new(g, len, true)?,
                };
                self.convert_into(&images.data, staging.as_mut_slice())?;
                copy_pinned_to(g.stream(), &staging, len, self.images.view())?;
                self.staging = Some(staging);
            }
        }
        g.upload_into(self.labels.view(), bytes_of(labels))?;
        self.uploaded = true;
        Ok(())
    }

    /// NCHW f32 images as the input's bytes: as they are (NCHW f32), or channel-last in the
    /// storage type (the stem's blocks, or 3 channels padded to 8), on every core.
    fn convert_into(&self, images: &[f32], out: &mut [u8]) -> Result<()> {
        let (h, w) = self.image;
        match self.input.layout {
            Layout::Nchw => {
                let b = bytes_of(images);
                if b.len() != out.len() {
                    return Err(Error::Failed(format!(
                        "{} bytes of images for {} of input",
                        b.len(),
                        out.len()
                    )));
                }
                out.copy_from_slice(b);
                Ok(())
            }
            Layout::Nhwc if self.stem_mask.is_some() => {
                blocks_into(images, (h, w), self.dtype(), out)
            }
            Layout::Nhwc => nhwc_into(images, (h * w, self.input.c), self.dtype(), out),
        }
    }

    /// Keeps `data` on the device, converted once into the input's format, when it takes at
    /// most `share` of the device's free memory: each batch is then gathered there by its
    /// images' indices (a kernel, about 0.2 ms for a ResNet-50 batch) instead of converted on
    /// the host and copied, as PyTorch's loop indexes a tensor on the GPU. Returns why the
    /// data stays on the host otherwise.
    pub fn keep_data(&mut self, data: &Images, share: f64) -> Result<Option<String>> {
        let (h, w) = self.image;
        if data.size != (h, w) {
            return Err(Error::Setting(format!(
                "images of {:?}; this trainer takes {:?}",
                data.size, self.image
            )));
        }
        if let Some(&bad) = data.labels.iter().find(|&&l| l as usize >= self.classes) {
            return Err(Error::Setting(format!(
                "label {bad} of {} classes",
                self.classes
            )));
        }
        let per_image = self.input.bytes() / self.batch.max(1);
        if !per_image.is_multiple_of(4) {
            return Ok(Some(format!(
                "an image takes {per_image} bytes, not whole 4-byte words"
            )));
        }
        let n = data.len();
        // the gather kernel takes the batch and an image's words as C ints, the indices as u32
        if u32::try_from(n).is_err()
            || i32::try_from(per_image / 4).is_err()
            || i32::try_from(self.batch).is_err()
        {
            return Ok(Some(format!(
                "{n} images of {per_image} bytes are beyond the gather kernel's indices"
            )));
        }
        let need = n * (per_image + 4) + self.batch * 4;
        let (free, _) = self.gpu.mem_info()?;
        let gib = |b: f64| b / f64::from(1u32 << 30);
        if need as f64 > free as f64 * share {
            return Ok(Some(format!(
                "the data set would take {:.1} GiB on the GPU, more than {:.0}% of the {:.1} GiB \
                 free: each batch is converted on the host and copied",
                gib(need as f64),
                share * 100.0,
                gib(free as f64)
            )));
        }
        let _op = self.op_other("keep the data set", "input", n * 3 * h * w, "host + copy");
        let images = self.gpu.alloc(n * per_image)?;
        // a batch's worth converted at a time
        let per = 3 * h * w;
        let chunk = self.batch.max(1);
        let mut host = vec![0u8; chunk * per_image];
        for (i, part) in data.pixels.chunks(chunk * per.max(1)).enumerate() {
            let count = part.len() / per.max(1);
            let out = &mut host[..count * per_image];
            self.convert_into(part, out)?;
            self.gpu.upload_into(
                images
                    .view()
                    .sub(i * chunk * per_image, count * per_image)?,
                out,
            )?;
        }
        let labels = self.gpu.upload(bytes_of(&data.labels))?;
        let index = self.gpu.alloc(self.batch * 4)?;
        self.resident = Some(Resident {
            images,
            labels,
            index,
            count: n,
        });
        Ok(None)
    }

    /// Drops the data set kept on the device: batches come from the host again.
    pub fn forget_data(&mut self) {
        self.resident = None;
    }

    /// The batch of the data set's images at `indices` (and their labels) gathered into the
    /// input on the work stream.
    pub(super) fn gather_batch(&mut self, indices: &[usize]) -> Result<()> {
        let res = self
            .resident
            .as_ref()
            .ok_or_else(|| Error::Failed("no data set on the device to gather from".into()))?;
        if indices.len() != self.batch {
            return Err(Error::Setting(format!(
                "{} images for a batch of {}",
                indices.len(),
                self.batch
            )));
        }
        let idx = indices
            .iter()
            .map(|&i| u32::try_from(i).ok().filter(|_| i < res.count))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                Error::Setting(format!("an image index beyond the {} kept", res.count))
            })?;
        let words = self.input.bytes() / self.batch / 4;
        let _op = self.op_other("gather batch", "input", self.input.bytes() / 4, "gather");
        self.gpu.upload_into(res.index.view(), bytes_of(&idx))?;
        self.k.gather_u32(
            res.images.view(),
            self.images.view(),
            res.index.view(),
            (self.batch, words),
        )?;
        self.k.gather_u32(
            res.labels.view(),
            self.labels.view(),
            res.index.view(),
            (self.batch, 1),
        )?;
        self.uploaded = true;
        Ok(())
    }
}

/// A data set kept on the device in the trainer's input format.
pub(super) struct Resident {
    images: DeviceBuffer,
    labels: DeviceBuffer,
    /// The batch's indices, uploaded before each gather.
    index: DeviceBuffer,
    count: usize,
}

impl Resident {
    pub(super) fn bytes(&self) -> u64 {
        (self.images.len() + self.labels.len() + self.index.len()) as u64
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
