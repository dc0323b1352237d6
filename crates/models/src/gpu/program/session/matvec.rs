//! Products of few rows on gpukit's matrix-vector kernel (the one squeeze-and-excitation's
//! layers run on): `y [m, n] = act(a [m, k] bt [n, k]^T + bias + z)`, one group of lanes an
//! output, the weights read along their rows ([`GemmStep::bt`], transposed at lowering). A
//! classifier at batch 1 (2,048 x 1,000) is a 4 MB read that cuBLASLt's kernels took about
//! 6 us for.

use super::ProgramSession;
use crate::gpu::program::lower::GemmStep;

impl ProgramSession<'_> {
    /// Enqueues Gemm step `g` on the matrix-vector kernel (an error where it has no
    /// transposed weights).
    pub(super) fn run_matvec(&self, g: &GemmStep) -> gpukit_cuda::Result<()> {
        let Some(bt) = g.bt else {
            return Err(gpukit_cuda::Error::Invalid(
                "a product without transposed weights on the matrix-vector kernel".into(),
            ));
        };
        let view = |t| {
            self.view(t)
                .map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
        };
        let konst = |c| {
            self.const_view(c)
                .map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
        };
        let bias = g.bias.map(konst).transpose()?;
        let z = g.z.as_ref().map(view).transpose()?;
        self.kernels.matvec(
            self.program.dtype.storage(),
            view(&g.a)?,
            konst(bt)?,
            bias,
            z,
            g.act,
            view(&g.y)?,
            (g.m, g.n, g.k),
        )
    }
}
