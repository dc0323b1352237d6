//! Convolutions of f32 programs summed in f64 (decision 183): cuDNN's f32 sums round as they
//! go, and on deep networks the early layers' rounding grows through the blocks after them
//! (ResNet-50: 1.7-2.9e-5 from float64 with cuDNN's sums, over the 1e-5 an f32 row is judged
//! by). A convolution chosen here runs as its input unfolded into f64 rows, a DGEMM on cuBLAS
//! against its filter in f64 (every f32 x f32 product exact, the sums rounded at 2^-53) and an
//! epilogue that rounds each output once to f32 after its bias and residual, in pieces of at
//! most [`exact::PIECE_BYTES`] of scratch. No cuDNN plan is made for it.
//!
//! `GPUKIT_EXACT_SUMS`: `timed` (the default) each convolution the kernels take is timed both
//! ways once its cuDNN plan is chosen, and sums in f64 where that costs at most
//! [`EXACT_MARGIN`] times cuDNN's plan; `all` every one, untimed (no cuDNN plan made); `off`
//! none (cuDNN's f32 sums).

use super::own_conv::{ConvAlt, ExactConv, EXACT_ALGORITHM as ALGORITHM};
use super::{time_candidates, ProgramSession};
use crate::error::{Error, Result};
use crate::gpu::program::kernels::exact::{self, ExactKernels};
use crate::gpu::program::lower::{ConvStep, Step, Tref};
use crate::gpu::program::Program;
use crate::sums::{fewest_within, largest_distance, SUM_BUDGET};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::DeviceBuffer;
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::{ConvShape, DType, Layout};
use std::collections::HashMap;
use std::rc::Rc;

/// Which convolutions of an f32 program sum in f64 (tf32 and 16-bit programs: none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExactSums {
    /// None: cuDNN's f32 sums everywhere.
    Off,
    /// Each where it times within this factor of cuDNN's f32 plan for the step (default
    /// [`EXACT_MARGIN`]).
    Timed(f64),
    /// Every convolution the kernels take, untimed.
    All,
}

/// How much slower than cuDNN's f32 plan a convolution summed in f64 may time and still be
/// kept (run 117: ResNet-50's fp32 rows 2.1-2.6e-6 from float64 with every convolution summed
/// in f64, 2.1-2.9e-5 with cuDNN's sums, where 1e-5 is the bar).
pub const EXACT_MARGIN: f64 = 1.25;

impl ExactSums {
    /// What `GPUKIT_EXACT_SUMS` asks for (`off`, `all`, `timed:FACTOR`; anything else: timed
    /// within [`EXACT_MARGIN`]).
    pub fn from_env() -> ExactSums {
        ExactSums::parse(std::env::var("GPUKIT_EXACT_SUMS").ok().as_deref())
    }

    fn parse(v: Option<&str>) -> ExactSums {
        let factor = |f: &str| f.parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0);
        match v {
            Some("off") => ExactSums::Off,
            Some("all") => ExactSums::All,
            Some(t) => match t.strip_prefix("timed:").and_then(factor) {
                Some(f) => ExactSums::Timed(f),
                None => ExactSums::Timed(EXACT_MARGIN),
            },
            None => ExactSums::Timed(EXACT_MARGIN),
        }
    }
}

/// Per step of `program`, whether it is a convolution that may sum in f64 under `mode` (an
/// f32 program's convolution the kernels take).
pub(super) fn exact_candidates(program: &Program, mode: ExactSums) -> Vec<bool> {
    program
        .steps
        .iter()
        .map(|(_, s)| match s {
            Step::Conv(c) => {
                mode != ExactSums::Off
                    && program.dtype == DType::F32
                    && exact::takes(&c.shape, &c.x.s, &c.y.s)
            }
            _ => false,
        })
        .collect()
}

/// What the f64 convolutions share: their kernels and the scratch of the largest piece.
pub(super) struct ExactScratch {
    kernels: ExactKernels,
    cols: DeviceBuffer,
    out: DeviceBuffer,
    /// Bytes of the scratch and of the f64 filters.
    pub bytes: usize,
}

/// The filter of a convolution as stored (`[k, K]`, K in the order the layout's filter has)
/// transposed to f64 `[K, k]`.
fn transposed_f64(w: &[f32], k: usize, kk: usize) -> Option<Vec<f64>> {
    (w.len() == k * kk).then(|| {
        let mut b = vec![0f64; k * kk];
        for (o, row) in w.chunks(kk).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                b[j * k + o] = f64::from(v);
            }
        }
        b
    })
}

impl ProgramSession<'_> {
    /// Decides, per candidate step (`self.exact_candidates`), cuDNN's plan or f64 sums (`mode`;
    /// each distinct shape and epilogue timed once, in graph replays, cuDNN's plan first);
    /// uploads the f64 filters and the scratch of the largest piece where any step keeps them.
    /// Runs after `plan_own_convs`.
    pub(super) fn plan_exact_convs(
        &mut self,
        discovery: &Discovery,
        mode: ExactSums,
    ) -> Result<()> {
        if !self.exact_candidates.contains(&true) {
            return Ok(());
        }
        let ctx = self.ctx;
        let mut filters: HashMap<usize, Rc<DeviceBuffer>> = HashMap::new();
        let (mut cols, mut outs) = (0, 0);
        let mut exact = Vec::new();
        for (i, (name, step)) in self.program.steps.iter().enumerate() {
            let (Step::Conv(c), true) = (step, self.exact_candidates[i]) else {
                continue;
            };
            let (kk, k, rows) = exact::pieces(&c.shape);
            cols = cols.max(rows * kk * 8);
            outs = outs.max(rows * k * 8);
            let weights = match filters.get(&c.w) {
                Some(w) => Rc::clone(w),
                None => {
                    let values = &self.program.consts[c.w].values;
                    let b = transposed_f64(values, k, kk).ok_or_else(|| {
                        Error::Invalid(format!(
                            "{name}: a filter of {} values for {k} x {kk}",
                            values.len()
                        ))
                    })?;
                    let raw = gpukit_tensor::codec::bytes_of(&b);
                    ctx.check_limit(raw.len(), "f64 filters")?;
                    let w = ctx.alloc(raw.len(), "f64 filters")?;
                    ctx.gpu.upload_into(w.view(), raw)?;
                    let w = Rc::new(w);
                    filters.insert(c.w, Rc::clone(&w));
                    w
                }
            };
            exact.push((i, c, ExactConv { weights }));
        }
        ctx.check_limit(cols + outs, "the f64 sums' scratch")?;
        self.exact = Some(ExactScratch {
            kernels: ExactKernels::new(discovery, &ctx.gpu)?,
            cols: ctx.alloc(cols, "f64 columns")?,
            out: ctx.alloc(outs, "f64 products")?,
            bytes: 0,
        });
        // shape, fused, activation (as written), residual, bias
        type Key = (ConvShape, bool, String, bool, bool);
        let mut picked: HashMap<Key, bool> = HashMap::new();
        let mut decided = Vec::new();
        for (i, c, e) in exact {
            let key = (
                c.shape,
                c.fused,
                format!("{:?}", c.act),
                c.z.is_some(),
                c.bias.is_some(),
            );
            let keep = match (mode, picked.get(&key)) {
                (ExactSums::All, _) => true,
                (_, Some(&keep)) => keep,
                (_, None) => {
                    let times = time_candidates(ctx.gpu.stream(), 2, |j| {
                        let run = match j {
                            0 => self.enqueue_step(i),
                            _ => self.run_exact_conv(c, &e),
                        };
                        run.map_err(|e| gpukit_cuda::Error::Invalid(e.to_string()))
                    })?;
                    let margin = match mode {
                        ExactSums::Timed(f) => f,
                        _ => EXACT_MARGIN,
                    };
                    let keep = times[1] <= times[0] * margin;
                    gpukit_cuda::trace::note(|| {
                        format!(
                            "f32 conv {:?}: cuDNN's plan {:.1} us, f64 sums {:.1} us: {}",
                            c.shape,
                            times[0] * 1e3,
                            times[1] * 1e3,
                            if keep { "f64 sums" } else { "cuDNN" }
                        )
                    });
                    picked.insert(key, keep);
                    keep
                }
            };
            decided.push((i, e, keep));
        }
        if decided.iter().any(|d| !d.2) {
            self.hold_to_budget(&mut decided)?;
        }
        // the engine named for each convolution step, in order; the filters no step keeps freed
        let conv_index: Vec<usize> = (0..self.program.steps.len())
            .scan(0, |at, i| {
                let here = *at;
                if matches!(self.program.steps[i].1, Step::Conv(_)) {
                    *at += 1;
                }
                Some(here)
            })
            .collect();
        let mut bytes = 0;
        let mut counted = std::collections::HashSet::new();
        for (i, e, keep) in decided {
            if let Some(alt) = self.conv_alts.get_mut(i) {
                *alt = None;
            }
            if !keep {
                continue;
            }
            if counted.insert(Rc::as_ptr(&e.weights)) {
                bytes += e.weights.len();
            }
            if let Some(name) = self.algorithms.get_mut(conv_index[i]) {
                *name = ALGORITHM.to_string();
            }
            if let Some(alt) = self.conv_alts.get_mut(i) {
                *alt = Some(ConvAlt::Exact(e));
            }
        }
        match (bytes, self.exact.as_mut()) {
            (0, _) => self.exact = None,
            (_, Some(s)) => s.bytes = bytes + cols + outs,
            _ => {}
        }
        Ok(())
    }

    /// Where the timed choice leaves candidates on cuDNN's f32 sums: the program's outputs on
    /// one random input with that choice against those with every candidate summed in f64;
    /// while they are more than [`SUM_BUDGET`] apart, the earliest candidates left on cuDNN
    /// move to f64 sums (the fewest that bring it within, by bisection: f32 sums early in a
    /// deep network are what its later blocks amplify).
    fn hold_to_budget(&mut self, decided: &mut [(usize, ExactConv, bool)]) -> Result<()> {
        let inputs: Vec<Vec<f32>> = self
            .program
            .inputs
            .iter()
            .map(|(_, shape, _)| normal_f32(shape.iter().product(), fresh_seed()))
            .collect();
        let xs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let left: Vec<usize> = (0..decided.len()).filter(|&n| !decided[n].2).collect();
        let reference = self.outputs_with(decided, &left, &xs)?;
        let mut distance = |first: usize| -> Result<f64> {
            let got = self.outputs_with(decided, &left[..first], &xs)?;
            let pairs = got.iter().zip(&reference);
            Ok(largest_distance(pairs.map(|(g, r)| (&g[..], &r[..]))))
        };
        let (before, good) = fewest_within(left.len(), SUM_BUDGET, &mut distance)?;
        for &n in &left[..good] {
            decided[n].2 = true;
        }
        gpukit_cuda::trace::note(|| {
            format!(
                "f32 sums: the timed choice {before:.1e} from every candidate in f64 (budget \
                 {SUM_BUDGET:.0e}): the first {good} of {} convolutions left on cuDNN move to \
                 f64 sums",
                left.len()
            )
        });
        Ok(())
    }

    /// The program's outputs for `xs` with the candidates `decided` keeps, and those of `also`
    /// (positions in `decided`), summed in f64, the others on cuDNN's plans.
    fn outputs_with(
        &mut self,
        decided: &[(usize, ExactConv, bool)],
        also: &[usize],
        xs: &[&[f32]],
    ) -> Result<Vec<Vec<f32>>> {
        for (n, (i, e, keep)) in decided.iter().enumerate() {
            let on = *keep || also.contains(&n);
            if let Some(alt) = self.conv_alts.get_mut(*i) {
                *alt = on.then(|| ConvAlt::Exact(e.clone()));
            }
        }
        self.run(xs)
    }

    /// Convolution step `c` summed in f64, piece by piece: unfolded, multiplied on cuBLAS,
    /// rounded once with its epilogue (where the step has it; a step whose epilogue a later
    /// step runs: the bare convolution).
    pub(super) fn run_exact_conv(&self, c: &ConvStep, e: &ExactConv) -> Result<()> {
        let s = self
            .exact
            .as_ref()
            .ok_or_else(|| Error::Invalid("f64 sums without their scratch".into()))?;
        let (kk, k, rows) = exact::pieces(&c.shape);
        let total = c.shape.n * c.shape.out_h() * c.shape.out_w();
        let v = |t: &Tref| self.view(t);
        let (x, y) = (v(&c.x)?, v(&c.y)?);
        let (bias, z, act) = match c.fused {
            true => (
                c.bias.map(|b| self.const_view(b)).transpose()?,
                match &c.z {
                    Some(t) => Some((v(t)?, &t.s)),
                    None => None,
                },
                c.act,
            ),
            false => (None, None, None),
        };
        let blas = self.ctx.blas.get()?;
        let krsc = self.program.layout == Layout::Nhwc;
        let mut m0 = 0;
        while m0 < total {
            let r = rows.min(total - m0);
            let (cols, out) = (
                s.cols.view().sub(0, r * kk * 8)?,
                s.out.view().sub(0, r * k * 8)?,
            );
            s.kernels
                .im2col(&c.shape, (x, &c.x.s), cols, krsc, (m0, r))?;
            blas.gemm_views(DType::F64, cols, e.weights.view(), out, (r, k, kk))?;
            s.kernels
                .epilogue(out, bias, z, act, (y, &c.y.s), (m0, r))?;
            m0 += r;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_is_transposed_whole_or_refused() {
        // k = 2 filters of K = 3 values
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = transposed_f64(&w, 2, 3).expect("2 x 3");
        assert_eq!(b, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        assert!(transposed_f64(&w, 2, 4).is_none());
    }

    #[test]
    fn the_switch_reads_off_and_all_and_otherwise_times() {
        assert_eq!(ExactSums::parse(Some("off")), ExactSums::Off);
        assert_eq!(ExactSums::parse(Some("all")), ExactSums::All);
        assert_eq!(ExactSums::parse(Some("timed:2")), ExactSums::Timed(2.0));
        let default = ExactSums::Timed(EXACT_MARGIN);
        for v in [Some("early"), Some("timed:-1"), Some("timed:x"), None] {
            assert_eq!(ExactSums::parse(v), default, "{v:?}");
        }
    }
}
