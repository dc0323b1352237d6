//! CPU reference paths: matrix multiply and convolution, multithreaded (the gemm crate).
//!
//! These are the CPU side of the CPU-vs-GPU comparisons, so they aim to be competitive with a
//! tuned CPU library (PyTorch's CPU backend) rather than merely correct: matmul reads its
//! operands in place through gemm's strides, and convolution lowers to im2col + gemm in the
//! orientation that writes the requested output layout directly, parallelised whichever way
//! the batch size and layer shape make fastest.
//!
//! The inference engine's convolution, [`conv2d_nhwc_packed`], goes further: weights packed
//! once, NHWC activations read in place, an AVX-512 micro-kernel with bias, residual and ReLU
//! fused, and a spinning thread team.
//!
//! The parts:
//! - `matmul`: the row-major matmuls, tiled over single-threaded gemm calls, and the strided
//!   gemm wrappers the convolutions build on;
//! - `im2col`: [`conv2d_f32`], NCHW and NHWC, lowered to im2col + gemm;
//! - `packed`: [`PackedConv`], [`AlignedBuf`] and [`conv2d_nhwc_packed`], which picks its
//!   micro-kernel (AVX-512, or im2col + gemm anywhere else and under `GPUKIT_CPU_KERNEL=gemm`);
//! - `avx512`: that AVX-512 micro-kernel, in inline assembly;
//! - `team`: the spinning thread team behind the packed convolution, [`parallel_ranges`] and
//!   [`parallel_rows`].
//!
//! Unsafe code is allowed here alone in the crate: SIMD, and outputs that several threads write
//! in disjoint parts through one pointer (`SharedOut`).
#![allow(unsafe_code)]

mod avx512;
mod im2col;
mod matmul;
mod packed;
mod team;

pub use im2col::conv2d_f32;
pub use matmul::{gemm_t, matmul_f16, matmul_f32, matmul_f64, GemmOne};
pub use packed::{
    conv2d_nhwc_packed, conv2d_nhwc_packed_onto, conv_kernel_name, uses_avx512_kernel, AlignedBuf,
    PackedConv,
};
pub use team::{parallel_ranges, parallel_rows};

/// How many threads CPU kernels use: rayon's current pool size.
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// The output pointer handed to every task of a split product (`gemm_split`, the tiled
/// `matmul`, the packed convolution, `parallel_rows`), each of which writes its own disjoint
/// block through it. Shared by the parts, hence here.
struct SharedOut<T = f32>(*mut T);

// Clone and Copy by hand: derived ones would ask T to be Copy too.
impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedOut<T> {}

// SAFETY: tasks only ever write disjoint elements through the pointer (see its users), and
// the borrow it came from outlives them all.
unsafe impl<T> Send for SharedOut<T> {}
// SAFETY: as for Send.
unsafe impl<T> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The pointer; a method so closures capture the whole (Send) wrapper, not its field.
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests;
