//! Where each of a network's tensors lives in one flat f32 device buffer: in the network's own
//! order, every tensor starting at a multiple of 64 elements (256 bytes, what cuDNN's and
//! cuBLAS's vectorised kernels like). The gaps hold zeros, so an optimizer over the whole
//! buffer in one launch leaves them zero.

use crate::error::{Error, Result};

/// Elements every tensor's offset is a multiple of.
pub const ALIGN: usize = 64;

/// The offsets and lengths of tensors packed into one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    offsets: Vec<usize>,
    lens: Vec<usize>,
    /// Elements of the whole buffer (at least [`ALIGN`]).
    pub total: usize,
}

impl FlatLayout {
    /// Tensors of these lengths, in order.
    pub fn new(lens: impl IntoIterator<Item = usize>) -> FlatLayout {
        let lens: Vec<usize> = lens.into_iter().collect();
        let mut offsets = Vec::with_capacity(lens.len());
        let mut at = 0;
        for &n in &lens {
            offsets.push(at);
            at = (at + n).next_multiple_of(ALIGN);
        }
        FlatLayout {
            offsets,
            lens,
            total: at.max(ALIGN),
        }
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Tensor `i`'s (offset, length) in elements.
    pub fn range(&self, i: usize) -> Result<(usize, usize)> {
        match (self.offsets.get(i), self.lens.get(i)) {
            (Some(&o), Some(&n)) => Ok((o, n)),
            _ => Err(Error::Failed(format!(
                "tensor {i} of a layout of {}",
                self.lens.len()
            ))),
        }
    }

    /// The tensors in one flat vector (zeros between them): an error unless they are as many
    /// and as long as the layout's.
    pub fn pack<'a>(&self, tensors: impl IntoIterator<Item = &'a [f32]>) -> Result<Vec<f32>> {
        let mut flat = vec![0f32; self.total];
        let mut count = 0;
        for (i, t) in tensors.into_iter().enumerate() {
            let (o, n) = self.range(i)?;
            if t.len() != n {
                return Err(Error::Failed(format!(
                    "tensor {i} has {} values where the layout has {n}",
                    t.len()
                )));
            }
            flat[o..o + n].copy_from_slice(t);
            count += 1;
        }
        if count != self.len() {
            return Err(Error::Failed(format!(
                "{count} tensors for a layout of {}",
                self.len()
            )));
        }
        Ok(flat)
    }

    /// The tensors back out of a flat vector of at least [`FlatLayout::total`] values.
    pub fn unpack(&self, flat: &[f32]) -> Result<Vec<Vec<f32>>> {
        if flat.len() < self.total {
            return Err(Error::Failed(format!(
                "{} values for a layout of {}",
                flat.len(),
                self.total
            )));
        }
        Ok(self
            .offsets
            .iter()
            .zip(&self.lens)
            .map(|(&o, &n)| flat[o..o + n].to_vec())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_start_aligned_and_round_trip() {
        let l = FlatLayout::new([3, 64, 0, 65, 1]);
        assert_eq!(
            (0..5).map(|i| l.range(i).unwrap().0).collect::<Vec<_>>(),
            vec![0, 64, 128, 128, 256]
        );
        assert_eq!(l.total, 320);
        let tensors: Vec<Vec<f32>> = (0..5)
            .map(|i| {
                let n = l.range(i).unwrap().1;
                (0..n).map(|k| (i * 1000 + k + 1) as f32).collect()
            })
            .collect();
        let flat = l.pack(tensors.iter().map(Vec::as_slice)).unwrap();
        // the gaps are zero
        assert!(flat[3..64].iter().all(|&v| v == 0.0));
        assert!(flat[193..256].iter().all(|&v| v == 0.0));
        assert_eq!(l.unpack(&flat).unwrap(), tensors);
    }

    #[test]
    fn mismatched_tensors_are_refused() {
        let l = FlatLayout::new([2, 3]);
        let (a, b) = (vec![1.0f32; 2], vec![2.0f32; 3]);
        assert!(l.pack([a.as_slice()]).is_err());
        assert!(l.pack([a.as_slice(), a.as_slice()]).is_err());
        assert!(l.pack([a.as_slice(), b.as_slice(), b.as_slice()]).is_err());
        assert!(l.unpack(&[0.0; 10]).is_err());
        assert!(l.range(2).is_err());
        assert_eq!(FlatLayout::new([]).total, ALIGN);
    }
}
