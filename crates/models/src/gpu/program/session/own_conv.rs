//! What may run a convolution instead of cuDNN's plan: gpukit's own kernel (the implicit
//! product of `kernels::gemm`) and, for a 1x1 convolution of stride 1 without padding (the
//! product `[n h w, c] x [c, k]` of channel-last maps), cuBLASLt's product on the step's own
//! buffers and filter, its epilogue fused where cuBLASLt has it. Each 16-bit channel-last
//! convolution the product takes is timed both ways in graph replays once its cuDNN plan is
//! chosen, and leaves cuDNN only where the product is more than 3% faster (`pick_gemm`'s rule,
//! cuDNN's plan in the first place). gpukit's kernel (which reads its filter laid out anew,
//! [`ConvGeometry::filter`], in a buffer of its own) is timed too: by default in whole pieces
//! where the output has few tiles, in every cut it offers when asked,
//! `GPUKIT_OWN_CONV=timed-own`. `never` keeps cuDNN everywhere, `always` takes gpukit's kernel
//! wherever it runs, `product` cuBLASLt's wherever it runs (tests, A/B runs).

use super::{lt_candidates, lt_epilogue, lt_spec, pick_gemm, time_candidates, ProgramSession};
use crate::error::{Error, Result};
use crate::gpu::program::kernels::gemm::{conv_cuts, ConvGeometry, Cut, Loads};
use crate::gpu::program::lower::{ConvStep, OwnConvStep, Step, Tref};
use crate::gpu::program::{Program, Strided};
use gpukit_cuda::lt::{Epilogue as LtEpilogue, LtMatmul, MatmulSpec};
use gpukit_cuda::DeviceBuffer;
use gpukit_tensor::{DType, Layout};
use std::collections::HashMap;

/// When gpukit's convolution kernel or cuBLASLt's product runs instead of cuDNN's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnConvs {
    /// cuBLASLt's product or gpukit's kernel in whole pieces (where the output has few tiles)
    /// where it times more than 3% faster than cuDNN's plan (the default; gpukit's kernel in
    /// stages is not timed: it was slower than cuDNN at every shape of run 114's models).
    Timed,
    /// gpukit's kernel timed too, in every cut (A/B runs of that kernel).
    TimedWithOwn,
    /// cuBLASLt's product timed, gpukit's kernel not (the default before its whole pieces;
    /// A/B runs).
    TimedProducts,
    /// Nowhere.
    Never,
    /// gpukit's kernel wherever it takes the convolution (and gpukit's matrix-vector kernel
    /// for every product of few rows it runs).
    Always,
    /// cuBLASLt's product wherever it takes the convolution (1x1, stride 1, unpadded).
    Products,
}

impl OwnConvs {
    /// What `GPUKIT_OWN_CONV` asks for (`never`, `always`, `product`, `timed-own`,
    /// `timed-products`; anything else: timed).
    pub fn from_env() -> OwnConvs {
        match std::env::var("GPUKIT_OWN_CONV").as_deref() {
            Ok("never") => OwnConvs::Never,
            Ok("timed-own") => OwnConvs::TimedWithOwn,
            Ok("timed-products") => OwnConvs::TimedProducts,
            Ok("always") => OwnConvs::Always,
            Ok("product") => OwnConvs::Products,
            _ => OwnConvs::Timed,
        }
    }

    /// Whether gpukit's kernel is timed in every cut or forced (else it runs only the
    /// convolutions cuDNN's plans do not take, and those `times` says).
    fn asks_for_own(self) -> bool {
        matches!(self, OwnConvs::Always | OwnConvs::TimedWithOwn)
    }

    /// Whether the default times gpukit's kernel in `cut` beside cuDNN's plan: whole pieces of
    /// 16 warps (the fastest of its cuts at every ResNet-50 batch-1 shape, and faster than
    /// cuDNN at layer4's 3x3 convolutions).
    fn times(self, cut: &Cut) -> bool {
        self == OwnConvs::Timed && cut.loads == Loads::Whole { groups: 4 }
    }
}

/// What runs a convolution step instead of cuDNN's plan.
pub(super) enum ConvAlt {
    /// gpukit's kernel.
    Own(OwnConv),
    /// cuBLASLt's product; `fused`: the plan holds the step's epilogue (or it has none).
    Product { plan: LtMatmul, fused: bool },
    /// Sums in f64 (an f32 program's convolution, [`super::exact`]).
    Exact(ExactConv),
}

/// The engine's name of a convolution that sums in f64.
pub(super) const EXACT_ALGORITHM: &str = "f64 sums (im2col + cuBLAS DGEMM)";

/// A convolution step that sums in f64 ([`super::exact`]): its filter as the product's right
/// operand, f64 `[K, k]` row-major (shared by the steps of one filter).
#[derive(Clone)]
pub(super) struct ExactConv {
    pub weights: std::rc::Rc<DeviceBuffer>,
}

impl ConvAlt {
    /// The library behind it, as the profiler names it.
    pub fn library(&self) -> &'static str {
        match self {
            ConvAlt::Own(_) => "NVRTC",
            ConvAlt::Product { .. } => "cuBLASLt",
            ConvAlt::Exact(_) => "cuBLAS",
        }
    }

    /// The op's name in the profiler, for a step whose epilogue is `fused` in it or not.
    pub fn kind(&self, fused: bool) -> &'static str {
        match (self, fused) {
            (ConvAlt::Own(_), true) => "conv+epilogue (gpukit)",
            (ConvAlt::Own(_), false) => "conv (gpukit)",
            (ConvAlt::Product { .. }, true) => "conv+epilogue (cuBLASLt)",
            (ConvAlt::Product { .. }, false) => "conv (cuBLASLt)",
            (ConvAlt::Exact(_), true) => "conv+epilogue (f64 sums)",
            (ConvAlt::Exact(_), false) => "conv (f64 sums)",
        }
    }
}

/// A convolution step on gpukit's kernel: its geometry, K cut as `cut` says, its filter laid
/// out.
pub(super) struct OwnConv {
    pub cut: Cut,
    pub geometry: ConvGeometry,
    pub weights: DeviceBuffer,
}

/// Convolution step `c` of `program` as gpukit's kernel and cuBLASLt's product see it:
/// 16-bit, channel-last, one group, dense maps; None otherwise. Whether gpukit's kernel
/// runs the geometry is `ConvGeometry::runs` (a product may take it where the kernel does not).
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
    takes.then_some(g)
}

/// Whether `program` has a convolution gpukit's kernel takes and `mode` asks for the kernel
/// there (by default it is not timed, so not loaded for them).
pub(super) fn wanted(program: &Program, mode: OwnConvs) -> bool {
    mode.asks_for_own()
        && program.steps.iter().any(|(_, s)| match s {
            Step::Conv(c) => own_geometry(program, c).is_some_and(|g| g.runs()),
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

/// A convolution of geometry `g` as cuBLASLt's product, where it is one (1x1, stride 1,
/// unpadded, undilated): `y [n h w, k] = x [n h w, c] w [k, c]^T` in column-major terms,
/// `y^T = op(A) x^T` with A the filter `[k, c]` read as stored (`c x k`, transposed); None
/// otherwise. Operands as `run_lt_with` takes them: (filter, x, residual, y).
fn product_spec(g: &ConvGeometry, dtype: DType) -> Option<MatmulSpec> {
    let one = (g.r, g.s, g.stride, g.pads, g.dilation) == (1, 1, 1, [0; 4], [1, 1]);
    one.then(|| lt_spec(dtype, (g.k, g.n * g.h * g.w, g.c), true))
}

impl ProgramSession<'_> {
    /// A convolution only gpukit's kernel runs, K in the most pieces it offers in stages (more
    /// than one only where the tiles are few).
    pub(super) fn run_own_step(&self, o: &OwnConvStep) -> Result<()> {
        let (m, n, kw) = o.g.product();
        let sms = self.small()?.sms;
        let Some(cut) = conv_cuts(m, n, kw, sms)
            .into_iter()
            .rfind(|c| c.loads == Loads::Staged)
        else {
            return Err(Error::Invalid(format!(
                "gpukit's convolution kernel does not take {:?}",
                o.g
            )));
        };
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
            .run_conv(self.ctx.gpu.stream(), dtype, ops, &o.g, o.act, cut)?;
        Ok(())
    }

    /// Decides, per convolution step, cuDNN's plan, gpukit's kernel or cuBLASLt's product
    /// (`mode`); each distinct shape and epilogue is timed once. Runs after the cuDNN plans
    /// and their workspace.
    pub(super) fn plan_own_convs(&mut self, mode: OwnConvs) -> Result<()> {
        let program = self.program;
        let steps = &program.steps;
        let mut alts: Vec<Option<ConvAlt>> = (0..steps.len()).map(|_| None).collect();
        if mode == OwnConvs::Never {
            self.conv_alts = alts;
            return Ok(());
        }
        // shape, fused, activation (as written), residual, bias
        type Key = (ConvGeometry, bool, String, bool, bool);
        let mut picked: HashMap<Key, Option<usize>> = HashMap::new();
        for (i, (_, step)) in steps.iter().enumerate() {
            let Step::Conv(c) = step else { continue };
            let Some(g) = own_geometry(program, c) else {
                continue;
            };
            // gpukit's kernel: K cut each way it offers where asked for, else its whole pieces
            // of 16 warps (offered only where the output has few tiles)
            let (m, n, kw) = g.product();
            let own: Vec<Cut> = match (&self.small_gemm, g.runs()) {
                (Some(small), true) => conv_cuts(m, n, kw, small.sms)
                    .into_iter()
                    .filter(|c| mode.asks_for_own() || mode.times(c))
                    .collect(),
                _ => Vec::new(),
            };
            let weights = match own.is_empty() {
                true => None,
                false => Some(self.own_filter(c, &g)?),
            };
            let (mut products, fused) = match mode {
                OwnConvs::Always => (Vec::new(), false),
                _ => self.product_candidates(c, &g)?,
            };
            let count = 1 + own.len() + products.len();
            let key = (
                g,
                c.fused,
                format!("{:?}", c.act),
                c.z.is_some(),
                c.bias.is_some(),
            );
            let pick = match (mode, picked.get(&key)) {
                (OwnConvs::Always, _) => (!own.is_empty()).then_some(1),
                (OwnConvs::Products, _) => (!products.is_empty()).then_some(1),
                (_, Some(&pick)) => pick.filter(|&j| j < count),
                (_, None) if count == 1 => None,
                (_, None) => {
                    let times = time_candidates(self.ctx.gpu.stream(), count, |j| {
                        let run = match j.checked_sub(1) {
                            None => self.enqueue_step(i),
                            Some(o) => match (o.checked_sub(own.len()), &weights) {
                                (None, Some(w)) => {
                                    self.run_own_conv(c, &g, w, own[o]).map_err(Error::from)
                                }
                                (None, None) => {
                                    Err(Error::Invalid("gpukit's kernel without its filter".into()))
                                }
                                (Some(p), _) => self.run_conv_product(c, &products[p], fused),
                            },
                        };
                        run.map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
                    })?;
                    let pick = pick_gemm(&times);
                    gpukit_cuda::trace::note(|| {
                        let us: Vec<String> =
                            times.iter().map(|t| format!("{:.1}", t * 1e3)).collect();
                        let cuts: Vec<String> = own.iter().map(Cut::to_string).collect();
                        format!(
                            "conv {g:?}: cuDNN's plan, gpukit's in [{}], then \
                             {} of cuBLASLt's (fused {fused}): candidate {pick:?} of [{}] us",
                            cuts.join("; "),
                            products.len(),
                            us.join(", ")
                        )
                    });
                    picked.insert(key, pick);
                    pick
                }
            };
            let Some(o) = pick.and_then(|j| j.checked_sub(1)) else {
                continue;
            };
            alts[i] = match (o.checked_sub(own.len()), weights) {
                (None, Some(weights)) => Some(ConvAlt::Own(OwnConv {
                    cut: own[o],
                    geometry: g,
                    weights,
                })),
                (Some(p), _) if p < products.len() => Some(ConvAlt::Product {
                    plan: products.swap_remove(p),
                    fused,
                }),
                _ => None,
            };
        }
        // the engine named for each convolution step, in order
        let mut at = 0;
        for (i, (_, step)) in steps.iter().enumerate() {
            if !matches!(step, Step::Conv(_)) {
                continue;
            }
            if let (Some(alt), Some(name)) = (&alts[i], self.algorithms.get_mut(at)) {
                *name = match alt {
                    ConvAlt::Own(o) => format!("gpukit implicit product in {}", o.cut),
                    ConvAlt::Product { fused, .. } => {
                        format!("cuBLASLt product (epilogue fused: {fused})")
                    }
                    ConvAlt::Exact(_) => EXACT_ALGORITHM.into(),
                };
            }
            at += 1;
        }
        self.conv_alts = alts;
        Ok(())
    }

    /// Convolution step `c`'s filter laid out for gpukit's kernel, in a buffer of its own.
    fn own_filter(&self, c: &ConvStep, g: &ConvGeometry) -> Result<DeviceBuffer> {
        // the step's filter is KRSC (channel-last) in the constants: back to KCRS, then laid
        // out as the kernel reads it
        let krsc = &self.program.consts[c.w].values;
        let mut kcrs = vec![0f32; krsc.len()];
        for o in 0..g.k {
            for t in 0..g.r * g.s {
                for ch in 0..g.c {
                    kcrs[(o * g.c + ch) * g.r * g.s + t] = krsc[(o * g.r * g.s + t) * g.c + ch];
                }
            }
        }
        let storage = self.program.dtype.storage();
        let bytes = gpukit_tensor::codec::encode_f32(&g.filter(&kcrs), storage);
        let weights = self.ctx.alloc(bytes.len(), "gpukit's convolution filter")?;
        self.ctx.gpu.upload_into(weights.view(), &bytes)?;
        Ok(weights)
    }

    /// cuBLASLt's candidates for convolution step `c` as a product, where it is one (1x1,
    /// stride 1, unpadded: `y [n h w, k] = x [n h w, c] w [k, c]^T`, the filter read in place
    /// as the transposed operand), and whether they hold the step's epilogue; none elsewhere.
    fn product_candidates(&self, c: &ConvStep, g: &ConvGeometry) -> Result<(Vec<LtMatmul>, bool)> {
        let Some(spec) = product_spec(g, self.program.dtype) else {
            return Ok((Vec::new(), false));
        };
        // a step without an epilogue of its own (or whose epilogue a later step runs) is the
        // bare product
        let epilogue = match c.fused {
            true => lt_epilogue(c.bias.is_some(), c.act),
            false => Some(LtEpilogue::None),
        };
        lt_candidates(self.ctx.blas.get()?, spec, epilogue)
    }

    /// Convolution step `c` as cuBLASLt's product `plan`: its epilogue in the plan where it
    /// is `fused` there, else on the element-wise kernel after the bare product (a step
    /// whose epilogue a later step runs: the bare product).
    pub(super) fn run_conv_product(
        &self,
        c: &ConvStep,
        plan: &LtMatmul,
        fused: bool,
    ) -> Result<()> {
        let v = |t: &Tref| self.view(t);
        let (x, y, w) = (v(&c.x)?, v(&c.y)?, self.const_view(c.w)?);
        let (bias, z) = match c.fused {
            true => (
                c.bias.map(|b| self.const_view(b)).transpose()?,
                c.z.as_ref().map(&v).transpose()?,
            ),
            false => (None, None),
        };
        let blas = self.ctx.blas.get()?;
        if fused {
            let beta = if z.is_some() { 1.0 } else { 0.0 };
            blas.run_lt_with(plan, (w, x, z, y), beta, bias, None)?;
            return Ok(());
        }
        blas.run_lt_with(plan, (w, x, None, y), 0.0, None, None)?;
        if c.fused {
            self.split_epilogue(c, y, bias, z)?;
        }
        Ok(())
    }

    /// Convolution step `c` on what replaces cuDNN's plan for it.
    pub(super) fn run_conv_alt(&self, c: &ConvStep, alt: &ConvAlt) -> Result<()> {
        match alt {
            ConvAlt::Own(o) => Ok(self.run_own_conv(c, &o.geometry, &o.weights, o.cut)?),
            ConvAlt::Product { plan, fused } => self.run_conv_product(c, plan, *fused),
            ConvAlt::Exact(e) => self.run_exact_conv(c, e),
        }
    }

    /// Convolution step `c` on gpukit's kernel: with its epilogue where cuDNN's call would
    /// have it (a fused step), bare otherwise (the program's element-wise step follows).
    pub(super) fn run_own_conv(
        &self,
        c: &ConvStep,
        g: &ConvGeometry,
        weights: &DeviceBuffer,
        cut: Cut,
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
            cut,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(r: usize, stride: usize, pad: usize, dilation: usize) -> ConvGeometry {
        ConvGeometry {
            n: 3,
            h: 14,
            w: 10,
            c: 64,
            k: 40,
            r,
            s: r,
            stride,
            pads: [pad; 4],
            dilation: [dilation; 2],
        }
    }

    #[test]
    fn a_product_takes_the_convolutions_buffers_as_they_are() {
        let g = geometry(1, 1, 0, 1);
        let spec = product_spec(&g, DType::F16).expect("a 1x1 convolution is a product");
        // A: the filter [k, c]; B: x [n h w, c]; D: y [n h w, k], 2 bytes a value
        let (rows, c, k) = (3 * 14 * 10, 64, 40);
        assert_eq!(spec.bytes(), [k * c * 2, rows * c * 2, rows * k * 2]);
        assert!(spec.trans_a && !spec.trans_b);
        assert_eq!((spec.m, spec.n, spec.k), (k, rows, c));
    }

    #[test]
    fn only_unpadded_1x1_stride_1_convolutions_are_products() {
        for g in [
            geometry(3, 1, 1, 1),
            geometry(1, 2, 0, 1),
            geometry(1, 1, 1, 1),
            geometry(1, 1, 0, 2),
        ] {
            assert!(product_spec(&g, DType::F16).is_none(), "{g:?}");
        }
    }
}
