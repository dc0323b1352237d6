//! The general GPU engine: any graph of `crate::graph`'s operators (as the ONNX importer and
//! the passes leave it) lowered to a program of GPU steps and run on one stream.
//!
//! - Convolutions (grouped and depthwise too) run on cuDNN, planned by measurement as the ResNet
//!   engine's are (`gpukit_cuda::dnn`'s selection policy and choice cache); bias, residual and
//!   ReLU fused into the cuDNN call where they can be, other epilogues (SiLU, HardSwish, GELU,
//!   ...) one element-wise kernel after it.
//! - Gemm and MatMul with constant weights run on cuBLAS.
//! - Everything else is gpukit's own kernels ([`kernels`]): one strided element-wise kernel,
//!   pooling, global average, layer norm, and the conversions.
//! - Every value is a strided view ([`Strided`]) of a slot of one arena or of the weights:
//!   Transpose, Reshape, Flatten, Squeeze and Unsqueeze are views (a copy only where the bytes
//!   are not in an order the reader can take), Concat's inputs are copied into slices of its
//!   output, an activation is fused into the step that computes its input where that step is
//!   element-wise or a convolution's epilogue and nothing else reads the input.
//! - Activations are stored in the strategy's storage type (f32, f16, bf16), 4-D images in the
//!   strategy's layout (NCHW or NHWC); the graph's inputs and outputs are f32.
//! - The memory plan reuses the bytes of dead slots (`crate::plan`).
//!
//! The parts: `lower` (graph to program, no device), `kernels` (the CUDA C and its launchers)
//! and `session` (a program on a device: weights, arena, planned convolutions, CUDA graph).
//!
//! To use: [`Program::lower`] an optimized graph for a dtype and layout, then
//! [`ProgramSession::new`] on a [`super::GpuContext`], [`ProgramSession::run`] (or
//! `set_inputs` + `enqueue` / `capture` + `replay` to time it) and
//! [`ProgramSession::outputs`].

mod blocks;
pub mod kernels;
mod lower;
mod session;
mod steps;

pub use kernels::{ProgramKernels, Window};
pub use lower::{Program, Unsupported};
pub use session::{Branching, ExactSums, OwnConvs, ProgramSession, EXACT_MARGIN};

use gpukit_tensor::Layout;

/// A rank-4 strided view (lower ranks padded with leading size-1 axes), in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strided {
    pub dims: [usize; 4],
    pub strides: [usize; 4],
}

impl Strided {
    /// Dense row-major `dims`.
    pub fn row_major(dims: [usize; 4]) -> Strided {
        let mut strides = [0; 4];
        let mut s = 1;
        for i in (0..4).rev() {
            strides[i] = s;
            s *= dims[i];
        }
        Strided { dims, strides }
    }

    /// Dense `[n, c, h, w]` in `layout`.
    pub fn image(dims: [usize; 4], layout: Layout) -> Strided {
        match layout {
            Layout::Nchw => Strided::row_major(dims),
            Layout::Nhwc => {
                let [_, c, h, w] = dims;
                Strided {
                    dims,
                    strides: [h * w * c, 1, w * c, c],
                }
            }
        }
    }

    /// Dense, in the order of `self`'s strides (largest stride slowest; ties in axis order):
    /// the layout an output takes from its input.
    pub fn dense_like(&self, dims: [usize; 4]) -> Strided {
        let mut order = [0usize, 1, 2, 3];
        // size-1 axes do not order anything: keep them where they are
        order.sort_by_key(|&i| {
            (
                std::cmp::Reverse(if self.dims[i] == 1 {
                    0
                } else {
                    self.strides[i]
                }),
                i,
            )
        });
        let mut strides = [0; 4];
        let mut s = 1;
        for &i in order.iter().rev() {
            strides[i] = s;
            s *= dims[i];
        }
        Strided { dims, strides }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One past the largest element offset the view reaches (0 when empty).
    pub fn span(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        1 + self
            .dims
            .iter()
            .zip(&self.strides)
            .map(|(d, s)| (d - 1) * s)
            .sum::<usize>()
    }

    /// Whether the view covers `len()` consecutive elements exactly once.
    pub fn is_dense(&self) -> bool {
        let mut axes: Vec<(usize, usize)> = self
            .dims
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d > 1)
            .map(|(d, s)| (*s, *d))
            .collect();
        axes.sort_unstable();
        let mut want = 1;
        for (s, d) in axes {
            if s != want {
                return false;
            }
            want *= d;
        }
        true
    }

    /// Whether the elements are in row-major order (size-1 axes ignored): a reshape of it is
    /// a relabelling.
    pub fn is_row_major(&self) -> bool {
        let rm = Strided::row_major(self.dims);
        (0..4).all(|i| self.dims[i] == 1 || self.strides[i] == rm.strides[i])
    }

    /// Whether this is `dims` dense in `layout` (size-1 axes ignored).
    pub fn is_image(&self, layout: Layout) -> bool {
        let want = Strided::image(self.dims, layout);
        (0..4).all(|i| self.dims[i] == 1 || self.strides[i] == want.strides[i])
    }

    /// The view with its axes permuted: output axis `i` is axis `perm[i]`.
    pub fn permuted(&self, perm: [usize; 4]) -> Strided {
        Strided {
            dims: perm.map(|p| self.dims[p]),
            strides: perm.map(|p| self.strides[p]),
        }
    }

    /// Broadcast to `dims` (numpy's rule: size-1 axes repeat, stride 0).
    pub fn broadcast_to(&self, dims: [usize; 4]) -> Option<Strided> {
        let mut out = *self;
        for ((have, stride), want) in out.dims.iter_mut().zip(&mut out.strides).zip(dims) {
            if *have == want {
                continue;
            }
            if *have != 1 {
                return None;
            }
            *have = want;
            *stride = 0;
        }
        Some(out)
    }
}

/// `shape` (rank <= 4) padded to rank 4 with leading 1s; None for a higher rank.
pub fn pad4(shape: &[usize]) -> Option<[usize; 4]> {
    if shape.len() > 4 {
        return None;
    }
    let mut d = [1; 4];
    d[4 - shape.len()..].copy_from_slice(shape);
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_know_their_order_extent_and_density() {
        let nchw = Strided::image([2, 3, 4, 5], Layout::Nchw);
        let nhwc = Strided::image([2, 3, 4, 5], Layout::Nhwc);
        assert_eq!(nchw.strides, [60, 20, 5, 1]);
        assert_eq!(nhwc.strides, [60, 1, 15, 3]);
        assert!(nchw.is_dense() && nhwc.is_dense());
        assert!(nchw.is_row_major() && !nhwc.is_row_major());
        assert_eq!((nchw.span(), nhwc.span()), (120, 120));
        // NHWC permuted to [n, h, w, c] is row-major: ConvNeXt's transposes are free
        let t = nhwc.permuted([0, 2, 3, 1]);
        assert!(t.is_row_major());
        assert_eq!(
            nhwc.dense_like([2, 7, 4, 5]),
            Strided::image([2, 7, 4, 5], Layout::Nhwc)
        );
        // [n, c, 1, 1] is row-major whatever its layout
        assert!(Strided::image([2, 3, 1, 1], Layout::Nhwc).is_row_major());
        // a channel slice of a concatenation is not dense; a broadcast has stride 0
        let slice = Strided {
            dims: [2, 1, 4, 5],
            ..nhwc
        };
        assert!(!slice.is_dense() && slice.span() < 120);
        let bias = Strided::row_major([1, 3, 1, 1])
            .broadcast_to([2, 3, 4, 5])
            .unwrap();
        assert_eq!(bias.strides, [0, 1, 0, 0]);
        assert!(Strided::row_major([1, 2, 1, 1])
            .broadcast_to([2, 3, 4, 5])
            .is_none());
        assert_eq!(pad4(&[7, 9]), Some([1, 1, 7, 9]));
        assert_eq!(pad4(&[1, 2, 3, 4, 5]), None);
    }
}
