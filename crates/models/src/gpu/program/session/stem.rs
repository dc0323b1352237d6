//! The stem-and-pool steps ([`StemPoolStep`]) on gpukit's kernel: the module loaded where the
//! program has one, and each step's launch.

use super::ProgramSession;
use crate::error::{Error, Result};
use crate::gpu::program::kernels::stem::{StemDims, StemPool};
use crate::gpu::program::lower::{StemPoolStep, Step, STEM_POOL_CC};
use crate::gpu::program::Program;
use crate::gpu::GpuContext;
use gpukit_cuda::loader::Discovery;

/// The kernel, where `program` has a stem-and-pool step (an error where it does not load: the
/// step has no other engine; `GPUKIT_NO_STEM_POOL=1` lowers the two steps apart).
pub(super) fn load(
    ctx: &GpuContext,
    discovery: &Discovery,
    program: &Program,
) -> Result<Option<StemPool>> {
    if !program
        .steps
        .iter()
        .any(|(_, s)| matches!(s, Step::StemPool(_)))
    {
        return Ok(None);
    }
    let cc = ctx.gpu.compute_capability()?;
    if cc < STEM_POOL_CC {
        return Err(Error::Invalid(format!(
            "a stem-and-pool step on a GPU of compute capability {}.{} (its kernel needs {}.{}; \
             Program::lower_for keeps the two steps apart there)",
            cc.0, cc.1, STEM_POOL_CC.0, STEM_POOL_CC.1
        )));
    }
    StemPool::new(discovery, &ctx.gpu).map(Some).map_err(|e| {
        Error::Invalid(format!(
            "the stem's convolution and pool on gpukit's kernel: {e} (GPUKIT_NO_STEM_POOL=1 \
                 runs them on cuDNN and the pool kernel)"
        ))
    })
}

/// The launch dims of step `sp`.
pub(super) fn dims(sp: &StemPoolStep) -> StemDims {
    let [n, _, pp, pq] = sp.y.s.dims;
    StemDims {
        n,
        hb: sp.conv.shape.h,
        wb: sp.conv.shape.w,
        pp,
        pq,
    }
}

impl ProgramSession<'_> {
    /// Enqueues stem-and-pool step `sp`.
    pub(super) fn run_stem_pool(&self, sp: &StemPoolStep) -> Result<()> {
        let kernel = self
            .stem
            .as_ref()
            .ok_or_else(|| Error::Invalid("a stem-and-pool step without its kernel".into()))?;
        let c = &sp.conv;
        let bias = c.bias.map(|b| self.const_view(b)).transpose()?;
        let ops = (
            self.view(&c.x)?,
            self.const_view(c.w)?,
            bias,
            self.view(&sp.y)?,
        );
        let d = dims(sp);
        kernel.run(
            self.ctx.gpu.stream(),
            self.program.dtype.storage(),
            ops,
            &d,
            kernel.tile_for(&d),
        )?;
        Ok(())
    }
}
