//! gpukit's own convolution kernel (the implicit product of `kernels::gemm`) beside cuDNN's:
//! each 16-bit channel-last convolution it takes is timed both ways in graph replays once its
//! cuDNN plan is chosen, and runs on gpukit's kernel only where that is more than 3% faster
//! (`pick_gemm`'s rule, cuDNN's plan in the first place). Its filter is laid out anew
//! ([`ConvGeometry::filter`]) in a buffer of its own. `GPUKIT_OWN_CONV=never` keeps cuDNN
//! everywhere, `always` takes gpukit's kernel wherever it runs (tests, A/B runs).

use super::{pick_gemm, ProgramSession};
use crate::error::{Error, Result};
use crate::gpu::program::kernels::gemm::{conv_pieces, ConvGeometry};
use crate::gpu::program::lower::{ConvStep, OwnConvStep, Step, Tref};
use crate::gpu::program::{Program, Strided};
use gpukit_cuda::DeviceBuffer;
use gpukit_tensor::{DType, Layout};
use std::collections::HashMap;

/// When gpukit's convolution kernel runs instead of cuDNN's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnConvs {
    /// Where it times more than 3% faster (the default).
    Timed,
    /// Nowhere.
    Never,
    /// Wherever it takes the convolution.
    Always,
}

impl OwnConvs {
    /// What `GPUKIT_OWN_CONV` asks for (`never`, `always`; anything else: timed).
    pub fn from_env() -> OwnConvs {
        match std::env::var("GPUKIT_OWN_CONV").as_deref() {
            Ok("never") => OwnConvs::Never,
            Ok("always") => OwnConvs::Always,
            _ => OwnConvs::Timed,
        }
    }
}

/// A convolution step on gpukit's kernel: its geometry, K in `pieces`, its filter laid out.
pub(super) struct OwnConv {
    pub pieces: usize,
    pub geometry: ConvGeometry,
    pub weights: DeviceBuffer,
}

/// Convolution step `c` of `program` as gpukit's kernel takes it: 16-bit, channel-last,
/// one group, dense maps; None otherwise.
pub(super) fn own_geometry(program: &Program, c: &ConvStep) -> Option<ConvGeometry> {
    let sixteen = matches!(program.dtype.storage(), DType::F16 | DType::Bf16);
    let dense = |t: &Tref| t.s == Strided::image(t.s.dims, Layout::Nhwc);
    let sh = c.shape;
    let takes = sixteen
        && program.layout == Layout::Nhwc
        && sh.groups == 1
        && dense(&c.x)
        && dense(&c.y)
        && c.z.as_ref().is_none_or(dense);
    let g = ConvGeometry {
        n: sh.n,
        h: sh.h,
        w: sh.w,
        c: sh.c,
        k: sh.k,
        r: sh.r,
        s: sh.s,
        stride: sh.stride,
        pads: [sh.pad; 4],
        dilation: [1, 1],
    };
    (takes && g.runs()).then_some(g)
}

/// Whether `program` has a convolution gpukit's kernel takes.
pub(super) fn wanted(program: &Program) -> bool {
    program.steps.iter().any(|(_, s)| match s {
        Step::Conv(c) => own_geometry(program, c).is_some(),
        _ => false,
    })
}

/// An error where `program` has convolutions only gpukit's kernel runs (dilated, or padded
/// unevenly) and the kernel is not `loaded`.
pub(super) fn loaded_where_needed(program: &Program, loaded: bool) -> Result<()> {
    let needed = program
        .steps
        .iter()
        .any(|(_, s)| matches!(s, Step::OwnConv(_)));
    match needed && !loaded {
        true => Err(Error::Invalid(
            "this model's dilated or unevenly padded convolutions run on gpukit's own kernel, \
             which needs a GPU of compute capability 8.0 or later (GPUKIT_TRACE=1 says why it \
             did not load)"
                .into(),
        )),
        false => Ok(()),
    }
}

impl ProgramSession<'_> {
    /// A convolution only gpukit's kernel runs, K in the most pieces it offers (more than one
    /// only where the tiles are few).
    pub(super) fn run_own_step(&self, o: &OwnConvStep) -> Result<()> {
        let (m, n, kw) = o.g.product();
        let pieces = conv_pieces(m, n, kw).last().map_or(1, |&(p, _)| p);
        let bias = o.bias.map(|b| self.const_view(b)).transpose()?;
        let z = o.z.as_ref().map(|t| self.view(t)).transpose()?;
        let ops = (
            self.view(&o.x)?,
            self.const_view(o.w)?,
            bias,
            z,
            self.view(&o.y)?,
        );
        let dtype = self.program.dtype.storage();
        self.small()?
            .run_conv(self.ctx.gpu.stream(), dtype, ops, &o.g, o.act, pieces)?;
        Ok(())
    }

    /// Decides, per convolution step, cuDNN's plan or gpukit's kernel (`mode`); each distinct
    /// shape and epilogue is timed once. Runs after the cuDNN plans and their workspace.
    pub(super) fn plan_own_convs(&mut self, mode: OwnConvs) -> Result<()> {
        let program = self.program;
        let steps = &program.steps;
        let mut own: Vec<Option<OwnConv>> = (0..steps.len()).map(|_| None).collect();
        if self.small_gemm.is_none() || mode == OwnConvs::Never {
            self.own_convs = own;
            return Ok(());
        }
        // shape, fused, activation (as written), residual, bias
        type Key = (ConvGeometry, bool, String, bool, bool);
        let mut picked: HashMap<Key, Option<usize>> = HashMap::new();
        let storage = self.program.dtype.storage();
        for (i, (_, step)) in steps.iter().enumerate() {
            let Step::Conv(c) = step else { continue };
            let Some(g) = own_geometry(program, c) else {
                continue;
            };
            let (m, n, kw) = g.product();
            let pieces: Vec<usize> = conv_pieces(m, n, kw).into_iter().map(|(p, _)| p).collect();
            // the step's filter is KRSC (channel-last) in the constants: back to KCRS, then
            // laid out as the kernel reads it
            let krsc = &program.consts[c.w].values;
            let mut kcrs = vec![0f32; krsc.len()];
            for o in 0..g.k {
                for t in 0..g.r * g.s {
                    for ch in 0..g.c {
                        kcrs[(o * g.c + ch) * g.r * g.s + t] = krsc[(o * g.r * g.s + t) * g.c + ch];
                    }
                }
            }
            let bytes = gpukit_tensor::codec::encode_f32(&g.filter(&kcrs), storage);
            let weights = self.ctx.alloc(bytes.len(), "gpukit's convolution filter")?;
            self.ctx.gpu.upload_into(weights.view(), &bytes)?;
            let key = (
                g,
                c.fused,
                format!("{:?}", c.act),
                c.z.is_some(),
                c.bias.is_some(),
            );
            let pick = match (mode, picked.get(&key)) {
                (OwnConvs::Always, _) => Some(1),
                (_, Some(&pick)) => pick,
                (_, None) => {
                    let times = gpukit_cuda::timing::replays_in_turns(
                        self.ctx.gpu.stream(),
                        1 + pieces.len(),
                        0.1,
                        32,
                        5,
                        |j| match j.checked_sub(1) {
                            None => self
                                .enqueue_step(i)
                                .map_err(|e| gpukit_cuda::Error::Invalid(e.to_string())),
                            Some(o) => self.run_own_conv(c, &g, &weights, pieces[o]),
                        },
                    )?;
                    let pick = pick_gemm(&times);
                    gpukit_cuda::trace::note(|| {
                        let us: Vec<String> =
                            times.iter().map(|t| format!("{:.1}", t * 1e3)).collect();
                        format!(
                            "conv {g:?}: cuDNN's plan, then gpukit's in {pieces:?} pieces: \
                             candidate {pick:?} of [{}] us",
                            us.join(", ")
                        )
                    });
                    picked.insert(key, pick);
                    pick
                }
            };
            if let Some(o) = pick.and_then(|j| j.checked_sub(1)) {
                own[i] = Some(OwnConv {
                    pieces: pieces[o],
                    geometry: g,
                    weights,
                });
            }
        }
        // the engine named for each convolution step, in order
        let mut at = 0;
        for (i, (_, step)) in steps.iter().enumerate() {
            if !matches!(step, Step::Conv(_)) {
                continue;
            }
            if let (Some(o), Some(name)) = (&own[i], self.algorithms.get_mut(at)) {
                *name = format!("gpukit implicit product in {} pieces", o.pieces);
            }
            at += 1;
        }
        self.own_convs = own;
        Ok(())
    }

    /// Convolution step `c` on gpukit's kernel: with its epilogue where cuDNN's call would
    /// have it (a fused step), bare otherwise (the program's element-wise step follows).
    pub(super) fn run_own_conv(
        &self,
        c: &ConvStep,
        g: &ConvGeometry,
        weights: &DeviceBuffer,
        pieces: usize,
    ) -> gpukit_cuda::Result<()> {
        let (small, v) = (self.small()?, |t: &Tref| self.own_view(t));
        let (x, y) = (v(&c.x)?, v(&c.y)?);
        let (bias, z, act) = match c.fused {
            true => (
                c.bias.map(|b| self.own_const(b)).transpose()?,
                c.z.as_ref().map(&v).transpose()?,
                c.act,
            ),
            false => (None, None, None),
        };
        small.run_conv(
            self.ctx.gpu.stream(),
            self.program.dtype.storage(),
            (x, weights.view(), bias, z, y),
            g,
            act,
            pieces,
        )
    }
}
