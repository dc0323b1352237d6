//! The rows `gpukit infer` can run, as `--strategies` names them, and which of them a
//! `--device` lets run.

use crate::error::{Error, Result};
use gpukit_models::gpu::Strategy;
use gpukit_tensor::{DType, Device, DeviceSelection, Layout};

/// The CPU reference row's strategy name.
pub const CPU_ROW: &str = "gpukit f32 (folded BN)";
/// ONNX Runtime's row's strategy name.
pub const ORT_ROW: &str = "ONNX Runtime CPU (same weights)";

/// Untimed passes before a GPU row's timed ones (after the verification pass).
pub const GPU_WARMUP: usize = 3;

/// Untimed passes of an inference GPU row before its timed ones (and the [`GPU_WARMUP`] ones),
/// at least this long with the GPU drained: the GPU sat idle while the CPU rows and ONNX
/// Runtime ran, and at batch 1 a few passes (about a millisecond) left the first row of a run
/// 5-7% below the later ones.
pub const GPU_WARM: std::time::Duration = std::time::Duration::from_millis(100);
/// Most warm-up passes (a pass of a large batch is long enough by itself).
pub const GPU_WARM_PASSES: usize = 2_000;

/// Images of the batch the GPU fp32 reference is checked on against gpukit's CPU forward.
pub const CPU_CHECK_IMAGES: usize = 4;

/// How a one-at-a-time strategy's name ends: `fp16-nhwc-graph-one-at-a-time`.
pub const ONE_AT_A_TIME: &str = "-one-at-a-time";

/// Batch-1 passes a one-at-a-time row times at most (over all repetitions): fewer repetitions
/// at large batch sizes, never fewer than [`ONE_AT_A_TIME_MIN_REPS`].
pub const ONE_AT_A_TIME_MAX_PASSES: usize = 4096;
/// Timed repetitions a one-at-a-time row keeps however large the batch (unless fewer asked).
pub const ONE_AT_A_TIME_MIN_REPS: usize = 5;

/// One kind of row of `gpukit infer`, as `--strategies` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferStrategy {
    /// gpukit's f32 CPU forward ([`CPU_ROW`]): the CPU reference.
    Cpu,
    /// ONNX Runtime's CPU provider on the same weights ([`ORT_ROW`]).
    OnnxRuntime,
    /// gpukit's GPU engine.
    Gpu(Strategy),
    /// The strategy's engine at batch 1, run once per image of the batch: at batch size N,
    /// N passes back to back (eager, or N replays of its CUDA graph). Rows only at N > 1.
    OneAtATime(Strategy),
}

impl InferStrategy {
    /// `cpu`, `onnxruntime`, or the GPU strategy's [`Strategy::name`].
    pub fn name(&self) -> String {
        match self {
            InferStrategy::Cpu => "cpu".into(),
            InferStrategy::OnnxRuntime => "onnxruntime".into(),
            InferStrategy::Gpu(s) => s.name(),
            InferStrategy::OneAtATime(s) => format!("{}{ONE_AT_A_TIME}", s.name()),
        }
    }

    /// Parses one name as [`InferStrategy::name`] writes it (`ort` also names ONNX Runtime).
    pub fn parse(text: &str) -> Result<InferStrategy> {
        let t = text.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(InferStrategy::Cpu),
            "onnxruntime" | "ort" => Ok(InferStrategy::OnnxRuntime),
            _ => {
                let (base, single) = match t.strip_suffix(ONE_AT_A_TIME) {
                    Some(base) => (base, true),
                    None => (t.as_str(), false),
                };
                Strategy::parse(base)
                    .map(|g| {
                        if single {
                            InferStrategy::OneAtATime(g)
                        } else {
                            InferStrategy::Gpu(g)
                        }
                    })
                    .map_err(|e| {
                        Error::BadInput(format!(
                            "{e}: a strategy is cpu, onnxruntime or \
                             PRECISION[-nhwc][-graph][{ONE_AT_A_TIME}] with PRECISION one of \
                             fp32, tf32, fp16, bf16 (e.g. fp16-nhwc-graph)"
                        ))
                    })
            }
        }
    }

    /// The best GPU strategy, one image at a time: the default one-at-a-time row.
    pub fn default_one_at_a_time() -> InferStrategy {
        InferStrategy::OneAtATime(Strategy {
            dtype: DType::F16,
            layout: Layout::Nhwc,
            graph: true,
        })
    }

    /// cpu, onnxruntime, [`Strategy::defaults`], and fp16-nhwc-graph one image at a time.
    pub fn defaults() -> Vec<InferStrategy> {
        let mut v = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
        v.extend(Strategy::defaults().into_iter().map(InferStrategy::Gpu));
        v.push(InferStrategy::default_one_at_a_time());
        v
    }

    pub fn on_cpu(&self) -> bool {
        matches!(self, InferStrategy::Cpu | InferStrategy::OnnxRuntime)
    }
}

pub(super) fn selection_has_cpu(selection: DeviceSelection) -> bool {
    matches!(
        selection,
        DeviceSelection::All | DeviceSelection::One(Device::Cpu)
    )
}

/// The CUDA ordinal the GPU rows run on: cuda:0 for `all`.
pub fn gpu_ordinal(selection: DeviceSelection) -> Option<usize> {
    match selection {
        DeviceSelection::All => Some(0),
        DeviceSelection::One(Device::Cuda(n)) => Some(n),
        DeviceSelection::One(Device::Cpu) => None,
    }
}

/// Whether strategy `s` runs under `selection`: the CPU rows where the CPU is selected, the GPU
/// rows where a GPU is.
pub fn runs_on(s: &InferStrategy, selection: DeviceSelection) -> bool {
    if s.on_cpu() {
        selection_has_cpu(selection)
    } else {
        gpu_ordinal(selection).is_some()
    }
}

/// The strategies `--device` lets run, duplicates dropped (first kept). `requested` None: the
/// defaults, silently narrowed to the device; a requested strategy the device leaves out, or
/// nothing left to run, is bad input (the message says which).
pub fn select_strategies(
    requested: Option<&[InferStrategy]>,
    selection: DeviceSelection,
) -> Result<Vec<InferStrategy>> {
    let list = requested.map_or_else(InferStrategy::defaults, <[InferStrategy]>::to_vec);
    let mut unique: Vec<InferStrategy> = Vec::new();
    for s in list {
        if !unique.contains(&s) {
            unique.push(s);
        }
    }
    let (keep, left_out): (Vec<_>, Vec<_>) =
        unique.into_iter().partition(|s| runs_on(s, selection));
    if requested.is_some() && !left_out.is_empty() {
        let names: Vec<String> = left_out.iter().map(InferStrategy::name).collect();
        let side = if left_out[0].on_cpu() {
            "the CPU"
        } else {
            "a GPU"
        };
        return Err(Error::BadInput(format!(
            "--device {selection} leaves out strategy {} (it runs on {side}): use --device all, or drop it from --strategies",
            names.join(", ")
        )));
    }
    if keep.is_empty() {
        return Err(Error::BadInput(format!(
            "no strategy runs on --device {selection}"
        )));
    }
    Ok(keep)
}

/// Refuses a request that would time nothing: one-at-a-time rows run only at batch sizes over
/// 1 (N images one by one against the batch of N), so asking for nothing else at batch 1 is bad
/// input, said before any work starts.
pub fn check_batches(strategies: &[InferStrategy], batch_sizes: &[usize]) -> Result<()> {
    let only_singles = strategies
        .iter()
        .all(|s| matches!(s, InferStrategy::OneAtATime(_)));
    if only_singles && batch_sizes.iter().all(|&n| n <= 1) {
        let names: Vec<String> = strategies.iter().map(InferStrategy::name).collect();
        return Err(Error::BadInput(format!(
            "--strategies {} runs only at batch sizes over 1 (one image at a time against the \
             batch), and --batch-sizes has none: add a batch size, or a batched strategy",
            names.join(",")
        )));
    }
    Ok(())
}
