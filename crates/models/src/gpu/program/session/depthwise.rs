//! Which of gpukit's depthwise kernels runs each depthwise step: the one the launcher's rule
//! chooses (`ProgramKernels::depthwise`) and every other that takes the shape (row kernels of
//! stride 1 and 2, tiles, a thread an output vector with the filter's side and stride fixed),
//! each distinct step timed once in graph replays and the fastest kept by the 3% rule (the
//! rule's choice in the first place). `GPUKIT_DW=rule` keeps the rule's choice (A/B runs).

use super::{pick_gemm, time_candidates, ProgramSession};
use crate::error::{Error, Result};
use crate::gpu::program::kernels::depthwise::depthwise_candidates;
use crate::gpu::program::lower::{DepthwiseStep, Step};
use gpukit_cuda::View;
use std::collections::HashMap;

/// Whether the depthwise kernels are timed (`GPUKIT_DW` other than `rule`).
fn timed() -> bool {
    std::env::var("GPUKIT_DW").as_deref() != Ok("rule")
}

impl ProgramSession<'_> {
    /// The views of depthwise step `d`: x, taps, bias, z, y.
    #[allow(clippy::type_complexity)]
    fn depthwise_views(
        &self,
        d: &DepthwiseStep,
    ) -> Result<(
        View<'_>,
        View<'_>,
        Option<View<'_>>,
        Option<View<'_>>,
        View<'_>,
    )> {
        Ok((
            self.view(&d.x)?,
            self.const_view(d.taps)?,
            d.bias.map(|b| self.const_view(b)).transpose()?,
            d.z.as_ref().map(|t| self.view(t)).transpose()?,
            self.view(&d.y)?,
        ))
    }

    /// Depthwise step `d` on kernel `kernel` (a name of `depthwise_variants`), else on the
    /// kernel the launcher's rule chooses.
    pub(super) fn run_depthwise(&self, d: &DepthwiseStep, kernel: Option<&str>) -> Result<()> {
        let (x, taps, bias, z, y) = self.depthwise_views(d)?;
        let dt = self.program.dtype.storage();
        let k = &self.kernels;
        match kernel {
            Some(v) => k.depthwise_variant(v, dt, &d.shape, x, taps, bias, z, d.act, y)?,
            None => k.depthwise(dt, &d.shape, x, taps, bias, z, d.act, y)?,
        }
        Ok(())
    }

    /// Times each distinct depthwise step's kernels and keeps the fastest (see the module).
    pub(super) fn plan_depthwise(&mut self) -> Result<()> {
        let steps = &self.program.steps;
        let mut picks: Vec<Option<String>> = vec![None; steps.len()];
        if !timed() {
            self.dw_kernels = picks;
            return Ok(());
        }
        // shape, bias, residual, activation (as written)
        type Key = (gpukit_tensor::ConvShape, bool, bool, String);
        let mut seen: HashMap<Key, Option<String>> = HashMap::new();
        for (i, (_, step)) in steps.iter().enumerate() {
            let Step::Depthwise(d) = step else { continue };
            let key = (
                d.shape,
                d.bias.is_some(),
                d.z.is_some(),
                format!("{:?}", d.act),
            );
            let names = {
                let (x, taps, bias, z, y) = self.depthwise_views(d)?;
                let dt = self.program.dtype.storage();
                depthwise_candidates(&d.shape, dt, &[Some(x), Some(taps), bias, z, Some(y)])
            };
            // a step like one timed before keeps its pick where the kernel takes this step's
            // views too (their alignment is part of what a kernel takes)
            if let Some(pick) = seen.get(&key) {
                picks[i] = pick.clone().filter(|k| names.contains(k));
                continue;
            }
            let pick = match names.len() {
                0 | 1 => None,
                count => {
                    let times = time_candidates(self.ctx.gpu.stream(), count, |j| {
                        self.run_depthwise(d, Some(&names[j]))
                            .map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
                    })?;
                    let pick = pick_gemm(&times).filter(|&j| j > 0);
                    gpukit_cuda::trace::note(|| {
                        let row: Vec<String> = names
                            .iter()
                            .zip(&times)
                            .map(|(n, t)| format!("{} {:.1}", n, t * 1e3))
                            .collect();
                        format!(
                            "depthwise {:?}: kept {:?} of [{}] us",
                            d.shape,
                            pick.map(|j| &names[j]),
                            row.join(", ")
                        )
                    });
                    pick.map(|j| names[j].clone())
                }
            };
            seen.insert(key, pick.clone());
            picks[i] = pick;
        }
        self.dw_kernels = picks;
        Ok(())
    }

    /// Depthwise step `i` (`d`) on the kernel planning kept for it.
    pub(super) fn enqueue_depthwise(&self, i: usize, d: &DepthwiseStep) -> Result<()> {
        let kernel = self.dw_kernels.get(i).and_then(Option::as_deref);
        self.run_depthwise(d, kernel).map_err(|e| match e {
            Error::Invalid(m) => Error::Invalid(format!("depthwise step {i}: {m}")),
            e => e,
        })
    }
}
