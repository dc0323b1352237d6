//! The Gemm steps' products: cuBLASLt's candidates, gpukit's kernel for products of few rows
//! (K in pieces) and gpukit's matrix-vector kernel, timed per shape on the step's own buffers;
//! and each step's launch with its epilogue.

use super::OwnConvs;
use super::{lt_candidates, lt_epilogue, lt_spec, pick_gemm, time_candidates, ProgramSession};
use crate::error::{Error, Result};
use crate::gpu::program::kernels::gemm::{self, SmallGemm};
use crate::gpu::program::lower::{GemmStep, Step, Tref};
use crate::gpu::program::{Program, Strided};
use crate::gpu::GpuContext;
use crate::graph::Binary;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::lt::{Epilogue as LtEpilogue, LtMatmul, MatmulSpec};
use gpukit_cuda::View;
use gpukit_tensor::DType;
use std::collections::HashMap;

/// A Gemm step's product: a cuBLASLt plan and whether it holds the step's epilogue, gpukit's
/// kernel for products of few rows with K in `pieces` pieces, or gpukit's matrix-vector kernel
/// (the last two with the whole epilogue).
pub(super) enum GemmRun {
    Lt {
        plan: LtMatmul,
        fused: bool,
    },
    Own {
        pieces: usize,
    },
    /// gpukit's matrix-vector kernel over the transposed weights ([`GemmStep::bt`]).
    MatVec,
}

impl ProgramSession<'_> {
    /// A cuBLASLt plan for every Gemm step: with its epilogue where cuBLASLt has an algorithm
    /// for it, else the bare product (the epilogue then runs on the element-wise kernel); the
    /// heuristic's first [`super::choice::GEMM_CANDIDATES`] timed on the step's own buffers
    /// ([`pick_gemm`]).
    pub(super) fn plan_gemms(&mut self, own: OwnConvs) -> Result<()> {
        let dtype = self.program.dtype;
        let mut gemms = Vec::with_capacity(self.program.steps.len());
        // a network repeats its products (a block per stage): each shape is timed once
        let mut picked: HashMap<(MatmulSpec, Option<LtEpilogue>, bool, bool), Option<usize>> =
            HashMap::new();
        for (_, step) in &self.program.steps {
            let Step::Gemm(g) = step else {
                gemms.push(None);
                continue;
            };
            let epilogue = lt_epilogue(g.bias.is_some(), g.act);
            let spec = lt_spec(dtype, (g.n, g.m, g.k), false);
            let blas = self.ctx.blas.get()?;
            let (mut candidates, fused) = lt_candidates(blas, spec, epilogue)?;
            let own_pieces = self.own_pieces(g);
            let matvec = g.bt.is_some();
            // gpukit's kernels forced (tests): the matrix-vector kernel where it runs
            if own == OwnConvs::Always && matvec {
                gemms.push(Some(GemmRun::MatVec));
                continue;
            }
            let key = (spec, epilogue, fused, g.z.is_some());
            let count = candidates.len() + own_pieces.len() + usize::from(matvec);
            let pick = match picked.get(&key) {
                Some(&pick) => pick.filter(|&i| i < count),
                None => {
                    let pick = self.fastest_gemm(blas, g, &candidates, fused, &own_pieces)?;
                    picked.insert(key, pick);
                    pick
                }
            };
            let (lt, pieces) = (candidates.len(), own_pieces.len());
            gemms.push(pick.map(|i| match i {
                i if i < lt => GemmRun::Lt {
                    plan: candidates.swap_remove(i),
                    fused,
                },
                i if i < lt + pieces => GemmRun::Own {
                    pieces: own_pieces[i - lt],
                },
                _ => GemmRun::MatVec,
            }));
        }
        self.gemms = gemms;
        Ok(())
    }

    /// Which of `candidates` runs Gemm step `g` fastest, timed on its own buffers (device time:
    /// graphs of up to 32 runs of about 0.1 ms replayed in 5 interleaved turns, since one
    /// product of a small batch takes a few microseconds and one timed call as long again in
    /// launch and event overhead; the arena's contents before a run are of no use to anyone,
    /// so the products may write their outputs); None where there is none. A candidate that
    /// fails to run is left out.
    pub(super) fn fastest_gemm(
        &self,
        blas: &gpukit_cuda::blas::Blas,
        g: &GemmStep,
        candidates: &[LtMatmul],
        fused: bool,
        own: &[usize],
    ) -> Result<Option<usize>> {
        let count = candidates.len() + own.len() + usize::from(g.bt.is_some());
        if count <= 1 {
            return Ok((count == 1).then_some(0));
        }
        let v = |t: &Tref| self.view(t);
        let (a, b, y) = (v(&g.a)?, v(&g.b)?, v(&g.y)?);
        let z = g.z.as_ref().map(&v).transpose()?;
        let (bias, c) = match fused {
            true => (g.bias.map(|c| self.const_view(c)).transpose()?, z),
            false => (None, None),
        };
        let beta = if c.is_some() { 1.0 } else { 0.0 };
        let lt = candidates.len();
        let times = time_candidates(blas.stream(), count, |i| match i {
            i if i < lt => blas.run_lt_with(&candidates[i], (b, a, c, y), beta, bias, None),
            i if i < lt + own.len() => self.run_own(g, own[i - lt]),
            _ => self.run_matvec(g),
        })?;
        let pick = pick_gemm(&times);
        gpukit_cuda::trace::note(|| {
            let us: Vec<String> = times.iter().map(|t| format!("{:.1}", t * 1e3)).collect();
            format!(
                "gemm {}x{}x{} (fused {fused}, gpukit's in {own:?} pieces last): candidate \
                 {pick:?} of [{}] us (gpukit's matrix-vector kernel last where it runs)",
                g.m,
                g.n,
                g.k,
                us.join(", ")
            )
        });
        Ok(pick)
    }

    /// gpukit's kernel for products of few rows, where `program` has a 16-bit product it takes
    /// and the GPU runs it; None otherwise, or where it does not load (the products then stay
    /// cuBLASLt's; the trace says why).
    pub(super) fn small_gemm(
        ctx: &GpuContext,
        discovery: &Discovery,
        program: &Program,
        own: OwnConvs,
    ) -> Option<SmallGemm> {
        let sixteen = matches!(program.dtype.storage(), DType::F16 | DType::Bf16);
        let ampere = ctx
            .gpu
            .compute_capability()
            .is_ok_and(|(major, _)| major >= 8);
        let wanted = super::own_conv::wanted(program, own)
            || program.steps.iter().any(|(_, step)| match step {
                Step::Gemm(g) => !gemm::pieces(g.m, g.n, g.k).is_empty(),
                Step::OwnConv(_) => true,
                _ => false,
            });
        if !(sixteen && ampere && wanted) {
            return None;
        }
        SmallGemm::new(discovery, &ctx.gpu)
            .inspect_err(|e| {
                gpukit_cuda::trace::note(|| format!("gpukit's small products not loaded: {e}"))
            })
            .ok()
    }

    /// The pieces gpukit's small-product kernel may run Gemm step `g` in: none where it is not
    /// loaded or an operand is not dense row-major.
    pub(super) fn own_pieces(&self, g: &GemmStep) -> Vec<usize> {
        let dense = |t: &Tref| t.s.is_dense() && t.s == Strided::row_major(t.s.dims);
        let takes = self.small_gemm.is_some()
            && dense(&g.a)
            && dense(&g.y)
            && g.z.as_ref().is_none_or(|z| z.s == g.y.s);
        match takes {
            true => gemm::pieces(g.m, g.n, g.k),
            false => Vec::new(),
        }
    }

    /// Gemm step `g` on gpukit's small-product kernel, K in `pieces` pieces, with its whole
    /// epilogue.
    pub(super) fn run_own(&self, g: &GemmStep, pieces: usize) -> gpukit_cuda::Result<()> {
        let (small, v) = (self.small()?, |t: &Tref| self.own_view(t));
        let (a, b, y) = (v(&g.a)?, v(&g.b)?, v(&g.y)?);
        let z = g.z.as_ref().map(&v).transpose()?;
        let bias = g.bias.map(|c| self.own_const(c)).transpose()?;
        small.run(
            self.ctx.gpu.stream(),
            self.program.dtype.storage(),
            (a, b, bias, z, y),
            (g.m, g.n, g.k),
            g.act,
            pieces,
        )
    }

    /// gpukit's small-product kernels, in their error type.
    pub(super) fn small(&self) -> gpukit_cuda::Result<&SmallGemm> {
        self.small_gemm.as_ref().ok_or_else(|| {
            gpukit_cuda::Error::Invalid("gpukit's small products are not loaded".into())
        })
    }

    /// View `t` in the kernels' error type.
    pub(super) fn own_view(&self, t: &Tref) -> gpukit_cuda::Result<View<'_>> {
        self.view(t)
            .map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
    }

    /// Constant `c`'s view in the kernels' error type.
    pub(super) fn own_const(&self, c: usize) -> gpukit_cuda::Result<View<'_>> {
        self.const_view(c)
            .map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
    }

    /// Gemm step `i`: its cuBLASLt plan (cuBLAS's GEMM where it has none), then its epilogue
    /// on the element-wise kernel where the plan does not hold it.
    pub(super) fn enqueue_gemm(&self, i: usize, g: &GemmStep) -> Result<()> {
        let v = |t: &Tref| self.view(t);
        let (a, b, y) = (v(&g.a)?, v(&g.b)?, v(&g.y)?);
        let z = g.z.as_ref().map(&v).transpose()?;
        let fused = match self.gemms.get(i).and_then(Option::as_ref) {
            Some(GemmRun::Own { pieces }) => {
                self.run_own(g, *pieces)?;
                return Ok(());
            }
            Some(GemmRun::MatVec) => {
                self.run_matvec(g)?;
                return Ok(());
            }
            Some(GemmRun::Lt { plan, fused }) => {
                let (bias, c) = match fused {
                    true => (g.bias.map(|c| self.const_view(c)).transpose()?, z),
                    false => (None, None),
                };
                let beta = if c.is_some() { 1.0 } else { 0.0 };
                self.ctx
                    .blas
                    .get()?
                    .run_lt_with(plan, (b, a, c, y), beta, bias, None)?;
                *fused
            }
            None => {
                let dims = (g.m, g.n, g.k);
                self.ctx
                    .blas
                    .get()?
                    .gemm_views(self.program.dtype, a, b, y, dims)?;
                false
            }
        };
        if fused || (g.bias.is_none() && g.z.is_none() && g.act.is_none()) {
            return Ok(());
        }
        let row = Strided::row_major([1, 1, 1, g.n]).broadcast_to(g.y.s.dims);
        let bias = match (g.bias, row) {
            (Some(c), Some(s)) => Some((self.const_view(c)?, s)),
            (Some(_), None) => {
                return Err(Error::Invalid(
                    "a Gemm bias that does not broadcast over its output".into(),
                ))
            }
            _ => None,
        };
        self.kernels.pointwise(
            self.program.dtype.storage(),
            (y, &g.y.s),
            bias.as_ref().map(|(bv, s)| (*bv, s, Binary::Add)),
            z.map(|zv| (zv, &g.y.s)),
            g.act,
            (y, &g.y.s),
        )?;
        Ok(())
    }
}
