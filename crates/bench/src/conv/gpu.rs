//! The GPU rows of `bench conv`: each convolution's engine chosen by cuDNN's selection policy
//! (the inference engine's own: legacy algorithms and backend engines timed alike, tensor-op math
//! where the dtype allows it), timed alone or in turns with PyTorch's cudnn.benchmark, then run
//! once more on a poisoned output and checked against the CPU.

use super::{tolerance, ConvOptions};
use crate::error::{Error, Result};
use crate::measure::{
    block_reps, both_orders, device_samples, Clock, Measurement, PeerSamples, Plan, TurnShape,
};
use crate::peer::PeerServer;
use crate::report::Verification;
use gpukit_cuda::dnn::{Conv, Dnn};
use gpukit_cuda::transfer::{copy_pinned_to, copy_to_pinned, PinnedBytes};
use gpukit_cuda::Gpu;
use gpukit_cuda::View;
use gpukit_tensor::codec::{decode_f32, encode_f32_into, round_f32};
use gpukit_types::DType;
use std::time::Duration;

/// What one GPU row measured.
pub(super) struct GpuMeasured {
    pub engine: String,
    /// `legacy` or `backend`.
    pub api: &'static str,
    pub tensor_cores: Option<bool>,
    /// Convolutions per timed CUDA-graph replay (None: timed as direct launches).
    pub per_replay: Option<usize>,
    pub timing: Measurement,
    pub verification: Verification,
    /// PyTorch's samples from the same turns, when it took part.
    pub theirs: Option<PeerSamples>,
}

/// Page-locked host memory the GPU rows move their operands and outputs through, grown to the
/// largest row's need: pageable copies into fresh buffers were 10 s of a cold `gpukit all`'s
/// conv rows on an H100 (28 ms to encode and upload a row's inputs, 27 to read its output).
#[derive(Default)]
pub(super) struct Staging(Option<PinnedBytes>);

impl Staging {
    /// At least `len` bytes of it (the old buffer freed first when it is too small).
    fn at_least(&mut self, g: &Gpu, len: usize) -> Result<&mut PinnedBytes> {
        if self.0.as_ref().is_none_or(|b| b.len() < len) {
            self.0 = None;
            self.0 = Some(PinnedBytes::new(g, len, false)?);
        }
        self.0
            .as_mut()
            .ok_or_else(|| Error::Failed("no staging buffer".into()))
    }

    /// `values` encoded as `dtype` into `dst`, through the staging buffer; waits for the copy.
    fn upload(&mut self, g: &Gpu, values: &[f32], dtype: DType, dst: View<'_>) -> Result<()> {
        let len = values.len() * dtype.size_bytes();
        let buf = self.at_least(g, len)?;
        if !encode_f32_into(values, dtype, &mut buf.as_mut_slice()[..len]) {
            return Err(Error::Failed(format!("encoding {len} bytes of {dtype}")));
        }
        copy_pinned_to(g.stream(), buf, len, dst)?;
        Ok(g.synchronize()?)
    }

    /// The first `len` bytes of `src`, decoded from `dtype` to f32.
    fn download(&mut self, g: &Gpu, src: View<'_>, len: usize, dtype: DType) -> Result<Vec<f32>> {
        let buf = self.at_least(g, len)?;
        copy_to_pinned(g.stream(), src, buf, len)?;
        g.synchronize()?;
        Ok(decode_f32(&buf.as_slice()[..len], dtype))
    }
}

/// PyTorch beside the GPU rows, and the rows it gave no figure for.
pub(super) struct ConvTurns {
    pub server: PeerServer,
    pub missed: Vec<String>,
}

/// Untimed turns of both sides before a row's timed ones: the chip's clock settles after the
/// previous row's planning (a shorter soak than matmul's: convolutions at these sizes do not
/// bring the chip to its power cap).
const SOAK: Duration = Duration::from_millis(300);

/// The shortest timed turn of either side.
const BLOCK_MS: f64 = 30.0;

/// The shortest CUDA-graph replay: long enough that launching it is a small share of it.
const REPLAY_MS: f64 = 0.5;

/// The most convolutions one graph holds.
const MAX_PER_REPLAY: usize = 64;

/// Convolutions per graph replay for a convolution of `per_conv_ms`.
fn per_graph(per_conv_ms: f64) -> usize {
    if per_conv_ms > 0.0 {
        ((REPLAY_MS / per_conv_ms).ceil() as usize).clamp(1, MAX_PER_REPLAY)
    } else {
        MAX_PER_REPLAY
    }
}

/// Relative error of `got` against `want` (root mean square over the root mean square of
/// `want`); infinite where `got` is not finite.
pub(super) fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    use rayon::prelude::*;
    // parts summed on every core, then in order: the same figure on every run
    const PART: usize = 1 << 16;
    let parts: Vec<Option<(f64, f64)>> = got
        .par_chunks(PART)
        .zip(want.par_chunks(PART))
        .map(|(g, w)| {
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (g, w) in g.iter().zip(w) {
                if !g.is_finite() {
                    return None;
                }
                num += (f64::from(*g) - f64::from(*w)).powi(2);
                den += f64::from(*w).powi(2);
            }
            Some((num, den))
        })
        .collect();
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for part in parts {
        let Some((n, d)) = part else {
            return f64::INFINITY;
        };
        num += n;
        den += d;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// One GPU row on the CPU's inputs `x`, `w` (checked against `y_ref_f32`, the CPU's f32 output
/// of the same inputs), alone or in turns with PyTorch.
pub(super) fn gpu_conv(
    (g, dnn): (&Gpu, &Dnn),
    conv: Conv,
    (x, w, y_ref_f32): (&[f32], &[f32], &[f32]),
    opts: &ConvOptions,
    (turns, staging): (Option<&mut ConvTurns>, &mut Staging),
) -> Result<GpuMeasured> {
    // the CPU's reference is computed on a thread of its own while the GPU plans and times
    std::thread::scope(|scope| {
        let reference = scope.spawn(move || reference_of(conv, (x, w, y_ref_f32)));
        measured((g, dnn), conv, (x, w), opts, (turns, staging), reference)
    })
}

/// The output a GPU row is checked against: an f16/bf16 row's is the f32 product of the
/// rounded inputs, another row's the CPU's f32 output.
fn reference_of<'a>(
    conv: Conv,
    (x, w, y_ref_f32): (&[f32], &[f32], &'a [f32]),
) -> std::borrow::Cow<'a, [f32]> {
    if conv.dtype.size_bytes() == 2 {
        let mut y = vec![0f32; conv.shape.output_len()];
        let (xr, wr) = (round_f32(x, conv.dtype), round_f32(w, conv.dtype));
        crate::cpu::conv2d_f32(&conv.shape, conv.layout, &xr, &wr, &mut y);
        y.into()
    } else {
        y_ref_f32.into()
    }
}

/// [`gpu_conv`]'s row once its reference is on its way.
fn measured(
    (g, dnn): (&Gpu, &Dnn),
    conv: Conv,
    (x, w): (&[f32], &[f32]),
    opts: &ConvOptions,
    (turns, staging): (Option<&mut ConvTurns>, &mut Staging),
    reference: std::thread::ScopedJoinHandle<'_, std::borrow::Cow<'_, [f32]>>,
) -> Result<GpuMeasured> {
    use gpukit_cuda::trace;
    // a phase's line, written only under GPUKIT_TRACE (its text is not built otherwise)
    let done = |phase: &str, t: Option<std::time::Instant>| {
        if t.is_some() {
            let spec = conv.shape.spec();
            let line = format!("conv {:?} {:?} {spec}: {phase}", conv.layout, conv.dtype);
            trace::done(&line, t);
        }
    };
    let t = trace::start();
    let (xn, wn) = (conv.input_bytes(), w.len() * conv.dtype.size_bytes());
    let need = xn + wn + conv.output_bytes();
    let free = g.mem_info().map(|(f, _)| f as usize).unwrap_or(0);
    if need.saturating_add(gpukit_cuda::dnn::CONV_WORKSPACE_BYTES) > free {
        return Err(Error::Failed(format!(
            "needs {need} bytes of GPU memory, {free} free"
        )));
    }
    let (xd, wd) = (g.alloc(xn)?, g.alloc(wn)?);
    staging.upload(g, x, conv.dtype, xd.view())?;
    staging.upload(g, w, conv.dtype, wd.view())?;
    let yd = g.alloc(conv.output_bytes())?;
    done("inputs encoded and uploaded", t);
    let choice = dnn.plan_plain_best(conv, xd.view(), wd.view(), yd.view(), true)?;
    let ws = g.alloc(choice.workspace_bytes().max(1))?;
    dnn.release_workspace();
    let run = || dnn.bare_forward(&choice, xd.view(), wd.view(), yd.view(), ws.view());
    // a choice remembered from an earlier run carries no time: a short probe gives one
    let per_conv_ms = match choice.measured_ms().filter(|ms| *ms > 0.0) {
        Some(ms) => ms,
        None => crate::stats::Summary::of(&device_samples(g.stream(), Plan::new(2, 5), run)?)
            .map_or(0.1, |s| s.median),
    };
    let t = trace::start();
    // timed as replays of a CUDA graph of `per_replay` convolutions, so that the figure is the
    // GPU's time and not the host's launch rate; direct launches where capture fails
    let graph = g.capture(|| (0..per_graph(per_conv_ms)).try_for_each(|_| run()));
    let per_replay = graph.as_ref().map_or(1, |_| per_graph(per_conv_ms));
    let launch = || match &graph {
        Ok(gr) => gr.launch(),
        Err(_) => run(),
    };
    let mut ours = |p: Plan| -> Result<Vec<f64>> {
        let samples = device_samples(g.stream(), p, launch)?;
        Ok(samples
            .into_iter()
            .map(|ms| ms / per_replay as f64)
            .collect())
    };
    let plan = Plan::new(3, opts.iterations);
    let shape = TurnShape {
        per_rep_ms: per_conv_ms * per_replay as f64,
        sets: 1,
    };
    let graphed = graph.as_ref().ok().map(|_| per_replay);
    done("probed and captured", t);
    let t = trace::start();
    let (timing, theirs) = match turns {
        None => (
            Measurement::of(Clock::CudaEvents, plan, &ours(plan)?)?,
            None,
        ),
        Some(t) => in_turns(t, conv, (shape, graphed), opts, &mut ours)?,
    };
    done("timed", t);
    let t = trace::start();
    // poison, run once more, compare with the CPU
    g.fill(yd.view(), 0xFF)?;
    launch()?;
    let got = staging.download(g, yd.view(), conv.output_bytes(), conv.dtype)?;
    done("output read back", t);
    let t = trace::start();
    let reference = reference
        .join()
        .map_err(|_| Error::Failed("the CPU reference's thread panicked".into()))?;
    done("waited for the CPU reference", t);
    let err = rel_err(&got, &reference);
    let tol = tolerance(conv.dtype);
    Ok(GpuMeasured {
        engine: choice.name(),
        api: choice.api(),
        tensor_cores: choice.tensor_cores(),
        per_replay: graphed,
        timing,
        verification: Verification {
            samples: got.len(),
            rel_err: err,
            tolerance: tol,
            passed: err <= tol,
        },
        theirs,
    })
}

/// Our samples and PyTorch's, in turns of at least [`BLOCK_MS`] each, both orders; PyTorch
/// replays a CUDA graph of the same number of convolutions when ours does (`graphed`).
fn in_turns(
    t: &mut ConvTurns,
    conv: Conv,
    (shape, graphed): (TurnShape, Option<usize>),
    opts: &ConvOptions,
    ours: &mut dyn FnMut(Plan) -> Result<Vec<f64>>,
) -> Result<(Measurement, Option<PeerSamples>)> {
    let rounds = opts.rounds.max(1);
    let reps = block_reps(opts.iterations.div_ceil(rounds), Some(shape), BLOCK_MS);
    let (first, later) = (Plan::new(3, reps), Plan::new(1, reps));
    let spec = conv.shape.spec();
    let server = &mut t.server;
    let mut theirs = |p: Plan| {
        server.conv_block(
            &spec,
            conv.dtype.name(),
            conv.layout.name(),
            p.warmup,
            p.reps,
            graphed.unwrap_or(0),
        )
    };
    let run = both_orders(rounds, (first, later), SOAK, ours, &mut theirs);
    let mine = run.ours?;
    let theirs = match run.theirs {
        Err(e) => {
            t.missed
                .push(format!("{spec} {} {}: {e}", conv.dtype, conv.layout));
            None
        }
        Ok(p) if p.samples.is_empty() => None,
        Ok(p) => Some(p),
    };
    let overall = Plan::new(3, reps * rounds);
    Ok((Measurement::of(Clock::CudaEvents, overall, &mine)?, theirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphs_hold_enough_convolutions_to_last_half_a_millisecond() {
        assert_eq!(per_graph(0.012), 42);
        assert_eq!(per_graph(0.5), 1);
        assert_eq!(per_graph(3.0), 1);
        assert_eq!(per_graph(0.001), MAX_PER_REPLAY);
        assert_eq!(per_graph(0.0), MAX_PER_REPLAY);
    }

    #[test]
    fn relative_error_of_a_large_output_is_the_whole_sums() {
        let n = (1 << 18) + 4321;
        let want: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let got: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, w)| w + 1e-3 * ((i % 7) as f32 - 3.0))
            .collect();
        let (num, den) = got
            .iter()
            .zip(&want)
            .fold((0.0f64, 0.0f64), |(n, d), (g, w)| {
                (
                    n + (f64::from(*g) - f64::from(*w)).powi(2),
                    d + f64::from(*w).powi(2),
                )
            });
        let whole = (num / den).sqrt();
        assert!(
            (rel_err(&got, &want) - whole).abs() <= 1e-12 * whole,
            "{} vs {whole}",
            rel_err(&got, &want)
        );
        let mut bad = got.clone();
        bad[n - 1] = f32::INFINITY;
        assert!(rel_err(&bad, &want).is_infinite());
    }

    #[test]
    fn relative_error_catches_nan_and_differences() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_err(&[f32::NAN], &[1.0]).is_infinite());
        assert!((rel_err(&[1.1], &[1.0]) - 0.1).abs() < 1e-6);
    }
}
