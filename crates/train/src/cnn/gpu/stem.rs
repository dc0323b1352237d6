//! The stem of 16-bit channel-last training as a convolution over 2x2 blocks (space to depth):
//! ResNet's 7x7 stride-2 convolution of 3 channels becomes a 4x4 stride-1 convolution of 16
//! channels (the 12 values of each 2x2 block of pixels, 4 zeros), the same products summed.
//!
//! The 7x7 filter padded in front to 8x8 (tap row and column 0 zero) has taps i = 2a + b,
//! j = 2a' + b' (a, a' < 4; b, b' < 2), and output (y, x) reads input pixel
//! (2y + i - 4, 2x + j - 4) = (2(y + a - 2) + b, 2(x + a' - 2) + b'). So with the images in
//! blocks, `S[Y][X][(b, b', c)] = image[c][2Y + b][2X + b']`, padded by 2 blocks before and 1
//! after, output (y, x) is a plain 4x4 convolution at block (y + a, x + a'): an image of
//! H x W (both even) gives blocks of (H/2 + 3) x (W/2 + 3), and the output is H/2 x W/2 as the
//! stride-2 convolution's. The blocked filter has 4 x 4 x 16 taps a filter, 49 x 3 of them the
//! network's weights; the others (tap row or column 0 of the padded filter, and the 4 zero
//! channels) are zero, and a mask keeps their gradient zero so they stay so.
//!
//! Measured against the 7x7 convolution over images padded to 8 channels: see decision 122.

use crate::error::{Error, Result};
use gpukit_types::{DType, Layout};

/// Channels of a block: 2 x 2 pixels of 3 channels, padded to a whole 16-byte vector pair.
pub const BLOCK_CHANNELS: usize = 16;
/// The blocked filter's side.
pub const TAPS: usize = 4;
/// Blocks of padding before (and `AFTER` after) the image's blocks.
const BEFORE: usize = 2;
const AFTER: usize = 1;

/// Whether a stem over `image` (height, width) runs on blocks: channel-last training of even
/// sizes.
pub fn runs_on_blocks(layout: Layout, (h, w): (usize, usize)) -> bool {
    layout == Layout::Nhwc && h >= 2 && w >= 2 && h % 2 == 0 && w % 2 == 0
}

/// Whether a convolution is ResNet's stem as [`runs_on_blocks`] replaces it: 3 input
/// channels, 7x7, stride 2, padding 3.
pub fn is_stem(in_channels: usize, kernel: usize, stride: usize, padding: usize) -> bool {
    (in_channels, kernel, stride, padding) == (3, 7, 2, 3)
}

/// The blocked maps' (height, width) of an image.
pub fn block_dims((h, w): (usize, usize)) -> (usize, usize) {
    (h / 2 + BEFORE + AFTER, w / 2 + BEFORE + AFTER)
}

/// The channel of block value (b, b', c).
fn channel(b: usize, b2: usize, c: usize) -> usize {
    (b * 2 + b2) * 3 + c
}

/// One NCHW f32 image of 3 channels, `h` x `w`, as blocked channel-last `dtype` bytes into
/// `out` (exactly the blocked image's bytes; the padding written as zeros).
pub fn image_into(img: &[f32], (h, w): (usize, usize), dtype: DType, out: &mut [u8]) -> Result<()> {
    let (bh, bw) = block_dims((h, w));
    let es = dtype.size_bytes();
    if img.len() != 3 * h * w || out.len() != bh * bw * BLOCK_CHANNELS * es {
        return Err(Error::Failed(format!(
            "{} values of a {h}x{w} image into {} bytes of blocks",
            img.len(),
            out.len()
        )));
    }
    let mut row = vec![0f32; bw * BLOCK_CHANNELS];
    for (by, dst) in out.chunks_exact_mut(bw * BLOCK_CHANNELS * es).enumerate() {
        row.fill(0.0);
        if let Some(y) = by.checked_sub(BEFORE).filter(|&y| y < h / 2) {
            for x in 0..w / 2 {
                let at = (x + BEFORE) * BLOCK_CHANNELS;
                for (b, b2, c) in block_values() {
                    row[at + channel(b, b2, c)] = img[(c * h + 2 * y + b) * w + 2 * x + b2];
                }
            }
        }
        dst.copy_from_slice(&gpukit_tensor::codec::encode_f32(&row, dtype));
    }
    Ok(())
}

fn block_values() -> impl Iterator<Item = (usize, usize, usize)> {
    (0..2).flat_map(|b| (0..2).flat_map(move |b2| (0..3).map(move |c| (b, b2, c))))
}

/// Where weight (k, c, i, j) of a [k, 3, 7, 7] filter lies in the blocked [k, 4, 4, 16] one.
fn blocked_index(k: usize, c: usize, i: usize, j: usize) -> usize {
    let (i, j) = (i + 1, j + 1);
    let (a, b, a2, b2) = (i / 2, i % 2, j / 2, j % 2);
    ((k * TAPS + a) * TAPS + a2) * BLOCK_CHANNELS + channel(b, b2, c)
}

/// A [k, 3, 7, 7] filter (KCRS, the network's) as the blocked [k, 4, 4, 16] one (KRSC).
pub fn filter_to_blocks(v: &[f32], k: usize) -> Result<Vec<f32>> {
    if v.len() != k * 3 * 49 {
        return Err(Error::Failed(format!(
            "{} values as {k} filters of 3x7x7",
            v.len()
        )));
    }
    let mut out = vec![0f32; k * TAPS * TAPS * BLOCK_CHANNELS];
    for (n, &x) in v.iter().enumerate() {
        let (kk, c, i, j) = (n / 147, n / 49 % 3, n / 7 % 7, n % 7);
        out[blocked_index(kk, c, i, j)] = x;
    }
    Ok(out)
}

/// [`filter_to_blocks`] undone; an error naming the first tap outside the network's filter
/// that is not zero (the gradient mask keeps them so: one that moved is a fault).
pub fn filter_from_blocks(v: &[f32], k: usize) -> Result<Vec<f32>> {
    if v.len() != k * TAPS * TAPS * BLOCK_CHANNELS {
        return Err(Error::Failed(format!(
            "{} values as {k} blocked stem filters",
            v.len()
        )));
    }
    let mut out = vec![0f32; k * 3 * 49];
    for (n, o) in out.iter_mut().enumerate() {
        *o = v[blocked_index(n / 147, n / 49 % 3, n / 7 % 7, n % 7)];
    }
    if let Some(n) = mask(k)
        .iter()
        .zip(v)
        .position(|(&keep, &x)| keep == 0.0 && x != 0.0)
    {
        return Err(Error::Failed(format!(
            "the blocked stem filter's unused tap {n} holds {}",
            v[n]
        )));
    }
    Ok(out)
}

/// 1 where the blocked filter holds a weight of the network's, 0 elsewhere.
pub fn mask(k: usize) -> Vec<f32> {
    let ones = vec![1f32; k * 3 * 49];
    filter_to_blocks(&ones, k).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_tensor::codec::decode_f32;

    /// The stride-2 7x7 convolution, plain.
    fn conv7(img: &[f32], (h, w): (usize, usize), wt: &[f32], k: usize) -> Vec<f64> {
        let (oh, ow) = (h / 2, w / 2);
        let mut out = vec![0f64; k * oh * ow];
        for kk in 0..k {
            for y in 0..oh {
                for x in 0..ow {
                    let mut s = 0f64;
                    for c in 0..3 {
                        for i in 0..7 {
                            for j in 0..7 {
                                let (r, q) = ((2 * y + i) as isize - 3, (2 * x + j) as isize - 3);
                                if r < 0 || q < 0 || r >= h as isize || q >= w as isize {
                                    continue;
                                }
                                let p = img[(c * h + r as usize) * w + q as usize];
                                s += f64::from(p) * f64::from(wt[((kk * 3 + c) * 7 + i) * 7 + j]);
                            }
                        }
                    }
                    out[(kk * oh + y) * ow + x] = s;
                }
            }
        }
        out
    }

    /// The 4x4 stride-1 unpadded convolution over the blocked image and filter.
    fn conv4(blocks: &[f32], (bh, bw): (usize, usize), wt: &[f32], k: usize) -> Vec<f64> {
        let (oh, ow) = (bh - 3, bw - 3);
        let mut out = vec![0f64; k * oh * ow];
        for kk in 0..k {
            for y in 0..oh {
                for x in 0..ow {
                    let mut s = 0f64;
                    for a in 0..TAPS {
                        for a2 in 0..TAPS {
                            for ch in 0..BLOCK_CHANNELS {
                                let p = blocks[((y + a) * bw + x + a2) * BLOCK_CHANNELS + ch];
                                let f = wt[((kk * TAPS + a) * TAPS + a2) * BLOCK_CHANNELS + ch];
                                s += f64::from(p) * f64::from(f);
                            }
                        }
                    }
                    out[(kk * oh + y) * ow + x] = s;
                }
            }
        }
        out
    }

    /// The blocked convolution gives the stem's outputs (to f64 rounding), the filter goes
    /// there and back exactly, and the mask holds 49 x 3 ones a filter.
    #[test]
    fn the_blocked_stem_computes_the_stride_2_convolution() {
        let (h, w, k) = (10, 14, 3);
        let img: Vec<f32> = (0..3 * h * w)
            .map(|v| ((v * 37 % 23) as f32 - 11.0) / 8.0)
            .collect();
        let wt: Vec<f32> = (0..k * 147)
            .map(|v| ((v * 29 % 31) as f32 - 15.0) / 16.0)
            .collect();
        let (bh, bw) = block_dims((h, w));
        let mut bytes = vec![0u8; bh * bw * BLOCK_CHANNELS * 4];
        image_into(&img, (h, w), DType::F32, &mut bytes).unwrap();
        let blocks = decode_f32(&bytes, DType::F32);
        let filt = filter_to_blocks(&wt, k).unwrap();
        let (want, got) = (
            conv7(&img, (h, w), &wt, k),
            conv4(&blocks, (bh, bw), &filt, k),
        );
        assert_eq!(want.len(), got.len());
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() < 1e-9, "{a} {b}");
        }
        assert_eq!(filter_from_blocks(&filt, k).unwrap(), wt);
        let m = mask(k);
        assert_eq!(m.iter().filter(|&&v| v == 1.0).count(), k * 147);
        let mut moved = filt.clone();
        let unused = m.iter().position(|&v| v == 0.0).unwrap();
        moved[unused] = 0.5;
        let e = filter_from_blocks(&moved, k).unwrap_err().to_string();
        assert!(e.contains("unused tap"), "{e}");
        assert!(runs_on_blocks(Layout::Nhwc, (224, 224)));
        assert!(!runs_on_blocks(Layout::Nhwc, (225, 224)));
        assert!(!runs_on_blocks(Layout::Nchw, (224, 224)));
    }
}
