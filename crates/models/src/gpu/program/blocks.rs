//! A strided convolution of an image of few channels (a network's stem) as a stride-1
//! convolution over blocks of `s x s` pixels (space to depth), where the image is converted:
//! ResNet's 7x7 stride-2 convolution of 3 channels becomes a 4x4 convolution of 16 channels
//! (12 values a block, 4 zeros), ConvNeXt's 4x4 stride-4 one a 1x1 convolution of 48 channels,
//! a 3x3 stride-2 one a 2x2 convolution of 16. The same products are summed (the other taps
//! are zero); the sums need fewer taps of channels padded for tensor cores (256 against 392,
//! 48 against 128, 64 against 72), and the converted image is about half as many bytes.
//!
//! The geometry, for a kernel of `k` taps, stride `s` and padding `p` along an axis: shift the
//! taps by `e = (s - p mod s) mod s` so that `p + e = s * d`; tap `i` becomes `i' = i + e =
//! s * a + b` (b < s). Output `y` reads input row `s * y + i - p = s * (y - d + a) + b`: block
//! row `y - d + a`, row `b` within the block. With `d` blocks of zeros before the image, the
//! output `y` reads blocked rows `y + a`, `a < ceil((e + k) / s)`: a plain convolution without
//! padding. The blocked image has `out + taps - 1` rows of blocks; rows of pixels outside the
//! image (the padding, or past its end) are zeros.

use crate::graph::Conv;

/// Channels of blocked images are padded to a multiple of this (16 bytes of 16-bit values).
const CHANNEL_MULTIPLE: usize = 8;
/// The largest block of channels (`c * s * s`) worth converting to.
const MAX_BLOCK_VALUES: usize = 64;

/// One axis of the blocking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axis {
    /// The shift of the taps (`e`).
    lead: usize,
    /// Blocks of zeros before the image (`d`).
    pub before: usize,
    /// Taps of the blocked filter.
    pub taps: usize,
    /// Blocks of the converted image.
    pub blocks: usize,
}

impl Axis {
    /// The blocking of an axis of `size` pixels under a kernel of `k` taps, stride `s` and
    /// padding `p` before, whose convolution has `out` outputs; None when it does not apply.
    fn of(size: usize, k: usize, s: usize, p: usize, out: usize) -> Option<Axis> {
        if s < 2 || k == 0 || out == 0 || size == 0 {
            return None;
        }
        let lead = (s - p % s) % s;
        let before = (p + lead) / s;
        let taps = (lead + k).div_ceil(s);
        Some(Axis {
            lead,
            before,
            taps,
            blocks: out + taps - 1,
        })
    }

    /// The blocked tap `(a, b)` of original tap `i`.
    fn tap(&self, i: usize, s: usize) -> (usize, usize) {
        let j = i + self.lead;
        (j / s, j % s)
    }

    /// The image row (or column) that block `at`'s row `b` holds, if inside the image.
    #[cfg(test)]
    pub fn source(&self, at: usize, b: usize, s: usize, size: usize) -> Option<usize> {
        (at * s + b)
            .checked_sub(self.before * s)
            .filter(|&u| u < size)
    }
}

/// How a convolution of a converted image runs over blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    /// The image's channels.
    pub c: usize,
    /// The block side: the convolution's stride.
    pub side: usize,
    /// Blocked channels: `c * side * side` padded to a multiple of 8.
    pub channels: usize,
    pub rows: Axis,
    pub cols: Axis,
}

impl Blocks {
    /// The blocking of `conv` over an image of `c` channels, `h x w`, whose output is `p x q`:
    /// None where it does not apply (one group, no dilation, one stride of 2 or more on both
    /// axes, one padding before and after) or would not take fewer taps of padded channels.
    pub fn of(
        conv: &Conv,
        c: usize,
        (h, w): (usize, usize),
        (p, q): (usize, usize),
    ) -> Option<Blocks> {
        let s = conv.strides[0];
        let [pt, pl, pb, pr] = conv.pads;
        let plain = conv.groups == 1
            && conv.dilations == [1, 1]
            && conv.strides[1] == s
            && pt == pb
            && pl == pr
            && pt == pl;
        if !plain || c * s * s > MAX_BLOCK_VALUES {
            return None;
        }
        let [kr, ks] = conv.kernel;
        let rows = Axis::of(h, kr, s, pt, p)?;
        let cols = Axis::of(w, ks, s, pl, q)?;
        let channels = (c * s * s).div_ceil(CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE;
        let plain_taps = c.div_ceil(CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE * kr * ks;
        (channels * rows.taps * cols.taps <= plain_taps).then_some(Blocks {
            c,
            side: s,
            channels,
            rows,
            cols,
        })
    }

    /// The blocked channel of image channel `ch` at row `b` and column `b2` of a block.
    pub fn channel(&self, b: usize, b2: usize, ch: usize) -> usize {
        (b * self.side + b2) * self.c + ch
    }

    /// `[n, channels, rows.blocks, cols.blocks]`: the converted image's dims (NCHW order).
    pub fn dims(&self, n: usize) -> [usize; 4] {
        [n, self.channels, self.rows.blocks, self.cols.blocks]
    }

    /// A `[k, c, kr, ks]` filter (KCRS) as the blocked one, channel-last
    /// (`[k, rows.taps, cols.taps, channels]`); the taps it does not fill are zero.
    pub fn filter(&self, w: &[f32], [k, kr, ks]: [usize; 3]) -> Vec<f32> {
        let (ta, tb) = (self.rows.taps, self.cols.taps);
        let mut out = vec![0f32; k * ta * tb * self.channels];
        for o in 0..k {
            for ch in 0..self.c {
                for i in 0..kr {
                    let (a, b) = self.rows.tap(i, self.side);
                    for j in 0..ks {
                        let (a2, b2) = self.cols.tap(j, self.side);
                        let at = ((o * ta + a) * tb + a2) * self.channels + self.channel(b, b2, ch);
                        out[at] = w[((o * self.c + ch) * kr + i) * ks + j];
                    }
                }
            }
        }
        out
    }

    /// Image `[c, h, w]` (f32, NCHW) as its blocks, channel-last
    /// (`[rows.blocks, cols.blocks, channels]`): what the GPU's conversion writes.
    #[cfg(test)]
    pub fn image(&self, x: &[f32], (h, w): (usize, usize)) -> Vec<f32> {
        let (bh, bw, s) = (self.rows.blocks, self.cols.blocks, self.side);
        let mut out = vec![0f32; bh * bw * self.channels];
        for by in 0..bh {
            for bx in 0..bw {
                for b in 0..s {
                    let Some(u) = self.rows.source(by, b, s, h) else {
                        continue;
                    };
                    for b2 in 0..s {
                        let Some(v) = self.cols.source(bx, b2, s, w) else {
                            continue;
                        };
                        for ch in 0..self.c {
                            out[(by * bw + bx) * self.channels + self.channel(b, b2, ch)] =
                                x[(ch * h + u) * w + v];
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Epilogue;
    use gpukit_tensor::random::{fresh_seed, normal_f32};

    fn conv_of(k: usize, s: usize, p: usize) -> Conv {
        Conv {
            kernel: [k, k],
            strides: [s, s],
            pads: [p; 4],
            dilations: [1, 1],
            groups: 1,
            bias: false,
            epilogue: Epilogue::default(),
        }
    }

    /// The strided convolution, in f64: `x` `[c, h, w]`, `wt` `[k, c, r, r]`, output `[k, p, q]`.
    fn strided(
        x: &[f32],
        (c, h, w): (usize, usize, usize),
        wt: &[f32],
        conv: &Conv,
        k: usize,
    ) -> Vec<f64> {
        let ([r, _], s, pad) = (conv.kernel, conv.strides[0], conv.pads[0]);
        let p = (h + 2 * pad - r) / s + 1;
        let q = (w + 2 * pad - r) / s + 1;
        let mut out = vec![0f64; k * p * q];
        for o in 0..k {
            for y in 0..p {
                for z in 0..q {
                    let mut acc = 0f64;
                    for ch in 0..c {
                        for i in 0..r {
                            for j in 0..r {
                                let (u, v) = (
                                    (y * s + i) as isize - pad as isize,
                                    (z * s + j) as isize - pad as isize,
                                );
                                if u < 0 || v < 0 || u >= h as isize || v >= w as isize {
                                    continue;
                                }
                                acc += f64::from(x[(ch * h + u as usize) * w + v as usize])
                                    * f64::from(wt[((o * c + ch) * r + i) * r + j]);
                            }
                        }
                    }
                    out[(o * p + y) * q + z] = acc;
                }
            }
        }
        out
    }

    /// The stride-1 unpadded convolution of the blocked image and filter, in f64.
    fn blocked(bx: &[f32], b: &Blocks, bw_: &[f32], k: usize) -> Vec<f64> {
        let (bh, bw, ta, tb, cb) = (
            b.rows.blocks,
            b.cols.blocks,
            b.rows.taps,
            b.cols.taps,
            b.channels,
        );
        let (p, q) = (bh - ta + 1, bw - tb + 1);
        let mut out = vec![0f64; k * p * q];
        for o in 0..k {
            for y in 0..p {
                for z in 0..q {
                    let mut acc = 0f64;
                    for a in 0..ta {
                        for a2 in 0..tb {
                            for ch in 0..cb {
                                acc += f64::from(bx[((y + a) * bw + z + a2) * cb + ch])
                                    * f64::from(bw_[((o * ta + a) * tb + a2) * cb + ch]);
                            }
                        }
                    }
                    out[(o * p + y) * q + z] = acc;
                }
            }
        }
        out
    }

    /// Every stem shape of the six classifiers, and odd sizes and paddings, computes the
    /// strided convolution's outputs over blocks (to f64 rounding).
    #[test]
    fn blocked_convolutions_compute_the_strided_ones() {
        let cases = [
            // (c, h, w, kernel, stride, pad)
            (3, 16, 12, 7, 2, 3), // ResNet, DenseNet
            (3, 17, 15, 7, 2, 1), // odd sizes, another padding
            (3, 16, 16, 4, 4, 0), // ConvNeXt
            (3, 17, 18, 4, 4, 0), // sizes not multiples of the stride
            (3, 14, 14, 3, 2, 1), // MobileNetV3, EfficientNet, RegNet
            (1, 11, 13, 5, 3, 2), // stride 3
            (4, 12, 12, 3, 2, 0),
        ];
        for (c, h, w, r, s, pad) in cases {
            let conv = conv_of(r, s, pad);
            let k = 5;
            let (p, q) = ((h + 2 * pad - r) / s + 1, (w + 2 * pad - r) / s + 1);
            let b = Blocks::of(&conv, c, (h, w), (p, q))
                .unwrap_or_else(|| panic!("{c}x{h}x{w} {r}/{s}/{pad} does not block"));
            assert_eq!(
                (
                    b.rows.blocks - b.rows.taps + 1,
                    b.cols.blocks - b.cols.taps + 1
                ),
                (p, q)
            );
            assert_eq!(b.channels % CHANNEL_MULTIPLE, 0);
            let x = normal_f32(c * h * w, fresh_seed());
            let wt = normal_f32(k * c * r * r, fresh_seed());
            let want = strided(&x, (c, h, w), &wt, &conv, k);
            let got = blocked(&b.image(&x, (h, w)), &b, &b.filter(&wt, [k, r, r]), k);
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-12 * scale,
                    "{c}x{h}x{w} {r}/{s}/{pad} output {i}: {g} against {w}"
                );
            }
            // each of the network's taps lands once: the blocked filter holds all of them
            let ones = b.filter(&vec![1.0; k * c * r * r], [k, r, r]);
            assert_eq!(ones.iter().sum::<f32>() as usize, k * c * r * r);
        }
        // the stems' geometry as decision records it
        let resnet = Blocks::of(&conv_of(7, 2, 3), 3, (224, 224), (112, 112)).unwrap();
        assert_eq!(
            (
                resnet.channels,
                resnet.rows.taps,
                resnet.rows.before,
                resnet.rows.blocks
            ),
            (16, 4, 2, 115)
        );
        let convnext = Blocks::of(&conv_of(4, 4, 0), 3, (224, 224), (56, 56)).unwrap();
        assert_eq!(
            (convnext.channels, convnext.rows.taps, convnext.rows.blocks),
            (48, 1, 56)
        );
    }

    /// What does not block: stride 1, groups, dilation, many channels, uneven padding.
    #[test]
    fn convolutions_that_gain_nothing_are_left_as_they_are() {
        assert_eq!(Blocks::of(&conv_of(3, 1, 1), 3, (16, 16), (16, 16)), None);
        assert_eq!(Blocks::of(&conv_of(3, 2, 1), 32, (16, 16), (8, 8)), None);
        let mut grouped = conv_of(3, 2, 1);
        grouped.groups = 3;
        assert_eq!(Blocks::of(&grouped, 3, (16, 16), (8, 8)), None);
        let mut dilated = conv_of(3, 2, 1);
        dilated.dilations = [2, 2];
        assert_eq!(Blocks::of(&dilated, 3, (16, 16), (8, 8)), None);
        let mut uneven = conv_of(3, 2, 1);
        uneven.pads = [0, 0, 1, 1];
        assert_eq!(Blocks::of(&uneven, 3, (16, 16), (8, 8)), None);
        // a 1x1 stride-2 convolution reads a quarter of the pixels: 8 channels a tap against 16
        assert_eq!(Blocks::of(&conv_of(1, 2, 0), 3, (16, 16), (8, 8)), None);
    }
}
