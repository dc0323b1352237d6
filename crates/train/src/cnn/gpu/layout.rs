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

/// `[outer, c, plane]` values with the channel moved last, `[outer, plane, c]`: NCHW maps to
/// NHWC, and a KCRS filter to KRSC (cuDNN's channels-last filter). An error unless the sizes
/// multiply to the values' count.
pub fn channels_last(v: &[f32], (outer, c, plane): (usize, usize, usize)) -> Result<Vec<f32>> {
    permute_channels(v, (outer, c, plane), true)
}

/// Rows of `c` values widened to `wide` with zeros after them (`wide >= c`).
pub fn pad_rows(v: &[f32], (rows, c, wide): (usize, usize, usize)) -> Result<Vec<f32>> {
    if rows.checked_mul(c) != Some(v.len()) || wide < c {
        return Err(Error::Failed(format!(
            "{} values padded as {rows} rows of {c} to {wide}",
            v.len()
        )));
    }
    if wide == c {
        return Ok(v.to_vec());
    }
    let mut out = vec![0f32; rows * wide];
    for (o, i) in out.chunks_exact_mut(wide).zip(v.chunks_exact(c)) {
        o[..c].copy_from_slice(i);
    }
    Ok(out)
}

/// [`pad_rows`] undone: the first `c` of each row of `wide` values.
pub fn unpad_rows(v: &[f32], (rows, c, wide): (usize, usize, usize)) -> Result<Vec<f32>> {
    if rows.checked_mul(wide) != Some(v.len()) || wide < c {
        return Err(Error::Failed(format!(
            "{} values unpadded as {rows} rows of {wide} to {c}",
            v.len()
        )));
    }
    Ok(v.chunks_exact(wide.max(1))
        .flat_map(|r| &r[..c])
        .copied()
        .collect())
}

/// [`channels_last`] undone: `[outer, plane, c]` back to `[outer, c, plane]`.
pub fn channels_first(v: &[f32], (outer, c, plane): (usize, usize, usize)) -> Result<Vec<f32>> {
    permute_channels(v, (outer, c, plane), false)
}

fn permute_channels(
    v: &[f32],
    (outer, c, plane): (usize, usize, usize),
    last: bool,
) -> Result<Vec<f32>> {
    let n = outer.checked_mul(c).and_then(|x| x.checked_mul(plane));
    if n != Some(v.len()) {
        return Err(Error::Failed(format!(
            "{} values permuted as {outer} x {c} x {plane}",
            v.len()
        )));
    }
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for ch in 0..c {
            for p in 0..plane {
                let first = (o * c + ch) * plane + p;
                let lst = (o * plane + p) * c + ch;
                if last {
                    out[lst] = v[first];
                } else {
                    out[first] = v[lst];
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_pad_with_zeros_and_come_back() {
        let v: Vec<f32> = (1..=6).map(|x| x as f32).collect();
        let wide = pad_rows(&v, (2, 3, 8)).unwrap();
        assert_eq!(wide.len(), 16);
        assert_eq!(&wide[..8], &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(&wide[8..11], &[4.0, 5.0, 6.0]);
        assert_eq!(unpad_rows(&wide, (2, 3, 8)).unwrap(), v);
        assert_eq!(pad_rows(&v, (2, 3, 3)).unwrap(), v);
        assert!(pad_rows(&v, (2, 3, 2)).is_err());
        assert!(unpad_rows(&v, (2, 3, 8)).is_err());
    }

    #[test]
    fn channels_move_last_and_back() {
        // two images of 3 channels of 2 positions
        let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let last = channels_last(&v, (2, 3, 2)).unwrap();
        assert_eq!(
            last,
            vec![0.0, 2.0, 4.0, 1.0, 3.0, 5.0, 6.0, 8.0, 10.0, 7.0, 9.0, 11.0]
        );
        assert_eq!(channels_first(&last, (2, 3, 2)).unwrap(), v);
        assert!(channels_last(&v, (2, 3, 3)).is_err());
    }

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
