//! The shape of a 2-D convolution: one description for the CPU kernels, cuDNN and the reports.

use serde::{Deserialize, Serialize};

/// A 2-D convolution's shape: input `n x c x h x w`, filter `k x (c / groups) x r x s`, one
/// stride and one padding for both axes, no dilation. `groups` splits the channels: 1 is a
/// plain convolution, `c` (with `k` a multiple of it) a depthwise one. The layout is not part of the shape (it is
/// chosen apart: [`crate::Layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConvShape {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels (filters).
    pub k: usize,
    /// Filter height.
    pub r: usize,
    /// Filter width.
    pub s: usize,
    /// Step in both directions.
    pub stride: usize,
    /// Zero padding on all four sides.
    pub pad: usize,
    /// Channel groups (1: a plain convolution); `c` and `k` are multiples of it.
    #[serde(default = "one")]
    pub groups: usize,
}

fn one() -> usize {
    1
}

/// Output extent along one axis; 0 when the shape is degenerate (stride 0, or a filter larger
/// than the padded input) so that such shapes yield an empty output instead of a panic.
fn out_dim(len: usize, kernel: usize, stride: usize, pad: usize) -> usize {
    if stride == 0 {
        return 0;
    }
    len.saturating_add(pad.saturating_mul(2))
        .checked_sub(kernel)
        .map_or(0, |span| span / stride + 1)
}

/// Product that saturates, so absurd shapes make length checks fail rather than wrap.
fn product(factors: &[usize]) -> usize {
    factors.iter().fold(1, |acc, &f| acc.saturating_mul(f))
}

impl ConvShape {
    /// Output height P (0 for degenerate shapes).
    pub fn out_h(&self) -> usize {
        out_dim(self.h, self.r, self.stride, self.pad)
    }

    /// Output width Q (0 for degenerate shapes).
    pub fn out_w(&self) -> usize {
        out_dim(self.w, self.s, self.stride, self.pad)
    }

    /// (P, Q).
    pub fn out_hw(&self) -> (usize, usize) {
        (self.out_h(), self.out_w())
    }

    /// 2 * N * K * P * Q * (C / groups) * R * S: multiply-adds counted as two, padding
    /// included, as cuDNN and PyTorch benchmarks count them.
    pub fn flops(&self) -> f64 {
        [
            self.n,
            self.k,
            self.out_h(),
            self.out_w(),
            self.group_channels(),
            self.r,
            self.s,
        ]
        .iter()
        .fold(2.0, |acc, &f| acc * f as f64)
    }

    /// Elements in the input tensor, N * C * H * W (saturating).
    pub fn input_len(&self) -> usize {
        product(&[self.n, self.c, self.h, self.w])
    }

    /// Elements in the weight tensor, K * (C / groups) * R * S (saturating).
    pub fn weight_len(&self) -> usize {
        product(&[self.k, self.group_channels(), self.r, self.s])
    }

    /// Input channels each filter reads, C / groups (C when groups is 0).
    pub fn group_channels(&self) -> usize {
        self.c.checked_div(self.groups).unwrap_or(self.c)
    }

    /// Whether the groups divide both channel counts (a shape a backend can run).
    pub fn groups_fit(&self) -> bool {
        self.groups >= 1 && self.c.is_multiple_of(self.groups) && self.k.is_multiple_of(self.groups)
    }

    /// Elements in the output tensor, N * K * P * Q (saturating).
    pub fn output_len(&self) -> usize {
        product(&[self.n, self.k, self.out_h(), self.out_w()])
    }

    /// 1x1, stride 1, no padding: the input image already is the gemm operand.
    pub fn is_pointwise(&self) -> bool {
        self.r == 1 && self.s == 1 && self.stride == 1 && self.pad == 0
    }

    /// The same convolution at batch size `n`.
    pub fn with_batch(self, n: usize) -> ConvShape {
        ConvShape { n, ..self }
    }

    /// `NxCxHxW:KxRxS:s<stride>p<pad>` (then `g<groups>` when grouped), the syntax of the
    /// PyTorch reference script.
    pub fn spec(&self) -> String {
        let groups = match self.groups {
            1 => String::new(),
            g => format!("g{g}"),
        };
        format!(
            "{}x{}x{}x{}:{}x{}x{}:s{}p{}{groups}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.stride, self.pad
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(h: usize, r: usize, stride: usize, pad: usize) -> ConvShape {
        ConvShape {
            n: 2,
            c: 3,
            h,
            w: h,
            k: 4,
            r,
            s: r,
            stride,
            pad,
            groups: 1,
        }
    }

    #[test]
    fn output_sizes_flops_and_degenerate_shapes() {
        let s = shape(224, 7, 2, 3);
        assert_eq!(s.out_hw(), (112, 112));
        assert_eq!(s.flops(), 2.0 * 2.0 * 4.0 * 112.0 * 112.0 * 3.0 * 49.0);
        assert_eq!(s.output_len(), 2 * 4 * 112 * 112);
        assert_eq!(s.spec(), "2x3x224x224:4x7x7:s2p3");
        // a filter larger than the padded input, and stride 0, give empty outputs
        assert_eq!(shape(2, 7, 1, 0).out_h(), 0);
        assert_eq!(shape(9, 3, 0, 1).out_w(), 0);
        // absurd sizes saturate instead of wrapping
        let huge = ConvShape { n: usize::MAX, ..s };
        assert_eq!(huge.input_len(), usize::MAX);
        assert!(shape(9, 1, 1, 0).is_pointwise() && !s.is_pointwise());
        // depthwise: one input channel per filter
        let dw = ConvShape {
            c: 8,
            k: 8,
            groups: 8,
            ..s
        };
        assert_eq!(dw.weight_len(), 8 * 49);
        assert_eq!(dw.flops(), 2.0 * 2.0 * 8.0 * 112.0 * 112.0 * 49.0);
        assert_eq!(dw.spec(), "2x8x224x224:8x7x7:s2p3g8");
        assert!(dw.groups_fit() && !ConvShape { k: 4, ..dw }.groups_fit());
        // a shape saved before groups existed reads as a plain convolution
        let old: ConvShape = serde_json::from_str(
            r#"{"n":1,"c":3,"h":8,"w":8,"k":4,"r":3,"s":3,"stride":1,"pad":1}"#,
        )
        .unwrap();
        assert_eq!(old.groups, 1);
    }
}
