//! What a training run will hold, counted before anything is allocated: the host's share (data,
//! model, optimizer state, one batch's activations and workspace or the batches staged for a
//! GPU, per-update losses) and, on a
//! GPU, the device's share as [`crate::gpu::GpuTrainer::new`] allocates it. The resource guard
//! ([`gpukit_types::resources`]) sets them against what the machine has, so a run too large for
//! it is refused in milliseconds with the flag to change, instead of an abort or an
//! out-of-memory kill minutes later.
//!
//! To use: describe the data with [`DataShape`], then `host_need(&cfg, &shape, &usage)
//! .check_host(HINT)` before the data is generated or loaded, and on a GPU
//! `device_need(ordinal, &cfg, &shape, precision, loader).check(Some(free), HINT)`.

use crate::gpu::feed::Loader;
use crate::optim::OptimizerKind;
use crate::precision::Precision;
use crate::run::TrainConfig;
use gpukit_types::resources::{bytes, Need};

/// What the flags to change are, for a refused run.
pub const HINT: &str =
    "lower --layers, --batch-size or --samples/--features (or use --checkpoint-activations)";

/// The data a run trains on, by size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataShape {
    /// Samples trained on.
    pub train: usize,
    /// Samples held out for evaluation.
    pub eval: usize,
    pub features: usize,
    /// Values a sample's target holds (1 for a class label).
    pub target_width: usize,
}

impl DataShape {
    fn samples(&self) -> usize {
        self.train.saturating_add(self.eval)
    }

    /// Bytes of the whole data set in the engine's host form (f32 features, 4-byte targets).
    pub fn bytes(&self) -> Option<u64> {
        bytes(
            &[
                self.samples(),
                self.features.checked_add(self.target_width)?,
            ],
            4,
        )
    }
}

/// Where the run goes, for its host share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostUse {
    /// On a GPU: the engine keeps its own copy of the data beside the caller's.
    pub gpu: bool,
    /// PyTorch runs beside: the starting weights are kept and the data is written for it.
    pub compare_pytorch: bool,
    /// Ranks sharing every combined batch (1: one device).
    pub world: usize,
    /// Ranks this process drives (data-parallel threads each keep their own copy of the data,
    /// the weights and the optimizer state on the host; 1 otherwise).
    pub ranks_here: usize,
    /// The data is already in memory (read from a file): its first copy is not counted again.
    pub data_loaded: bool,
}

impl TrainConfig {
    /// Optimizer updates one epoch of `train` samples makes on `world` devices: one every
    /// `accumulate` batches and one at the epoch's last batch.
    pub fn updates_per_epoch(&self, train: usize, world: usize) -> u64 {
        let batches = train.div_ceil(self.batch_size.saturating_mul(world.max(1)).max(1));
        batches.div_ceil(self.accumulate.max(1)) as u64
    }

    /// Updates the whole run makes from its start: every epoch's, or `--steps` if fewer.
    pub fn total_updates(&self, train: usize, world: usize) -> Option<u64> {
        let all = self
            .updates_per_epoch(train, world)
            .checked_mul(self.epochs)?;
        Some(self.max_steps.map_or(all, |m| m.min(all)))
    }
}

/// Parameters (weights and biases) of an MLP of `widths`; None when it cannot be counted.
pub fn parameters(widths: &[usize]) -> Option<u64> {
    widths.windows(2).try_fold(0u64, |acc, w| {
        let layer = (w[0] as u64)
            .checked_mul(w[1] as u64)?
            .checked_add(w[1] as u64)?;
        acc.checked_add(layer)
    })
}

/// "16-64-1": the layer widths as `--layers` writes them.
fn widths_name(cfg: &TrainConfig) -> String {
    cfg.widths
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join("-")
}

/// The widest layer (inputs included).
fn widest(cfg: &TrainConfig) -> usize {
    cfg.widths.iter().copied().max().unwrap_or(1)
}

/// Sum of `parts`, None if any or the sum cannot be counted.
fn sum(parts: &[Option<u64>]) -> Option<u64> {
    parts.iter().try_fold(0u64, |acc, p| acc.checked_add((*p)?))
}

/// Optimizer state buffers a parameter (SGD with momentum 1, Adam and AdamW 2).
fn state_buffers(cfg: &TrainConfig) -> u64 {
    match cfg.optimizer.kind {
        OptimizerKind::Sgd if cfg.optimizer.momentum == 0.0 => 0,
        OptimizerKind::Sgd => 1,
        OptimizerKind::Adam | OptimizerKind::AdamW => 2,
    }
}

/// The host memory a run holds at its peak.
pub fn host_need(cfg: &TrainConfig, data: &DataShape, usage: &HostUse) -> Need {
    let params = parameters(&cfg.widths);
    let f32s = |n: Option<u64>| n.and_then(|n| n.checked_mul(4));
    let rows = cfg.batch_size.min(data.train.max(data.eval)).max(1);
    let per_row: usize = cfg.widths.iter().fold(0usize, |a, &w| a.saturating_add(w));
    let widest = widest(cfg);
    let largest_layer = cfg
        .widths
        .windows(2)
        .map(|w| w[0].saturating_mul(w[1]))
        .max()
        .unwrap_or(0);
    let ranks = usage.ranks_here.max(1) as u64;
    let copies = if usage.gpu { ranks } else { 0 } + u64::from(!usage.data_loaded);
    let mut need = Need::host(format!(
        "training MLP {} (batch {}, {} samples of {} features)",
        widths_name(cfg),
        cfg.batch_size,
        data.samples(),
        data.features
    ));
    need.add(
        match (usage.gpu, usage.data_loaded) {
            (true, true) => "the engine's copy of the data",
            (true, false) => "the data and the engine's copy",
            (false, _) => "the data",
        },
        data.bytes().and_then(|b| b.checked_mul(copies)),
    )
    .add(
        // a GPU run keeps its gradients on the device: the host holds the weights it loads
        // from and stores into
        if usage.gpu {
            "weights"
        } else {
            "weights and gradients"
        },
        f32s(params).and_then(|b| b.checked_mul(if usage.gpu { ranks } else { 2 })),
    )
    .add(
        "optimizer state",
        f32s(params).and_then(|b| b.checked_mul(state_buffers(cfg) * ranks)),
    )
    .add(
        // on the CPU every layer output of a batch (kept for backward, or the evaluation's),
        // backward's two running gradients and the widest layer's weight gradient; a GPU run
        // computes those on the device and holds only the batches its loader stages
        if usage.gpu {
            "batches staged for the GPU"
        } else {
            "one batch's activations and workspace"
        },
        if usage.gpu {
            bytes(
                &[
                    rows,
                    data.features.saturating_add(data.target_width),
                    crate::gpu::feed::RING + 1,
                    usage.ranks_here.max(1),
                ],
                4,
            )
        } else {
            sum(&[
                bytes(&[rows, per_row], 4),
                bytes(&[rows, widest, 2], 4),
                bytes(&[largest_layer], 4),
                bytes(&[rows, data.features.saturating_add(data.target_width)], 4),
            ])
        },
    )
    .add("an epoch's batch order", bytes(&[data.samples()], 8))
    .add(
        "per-update losses",
        cfg.total_updates(data.train, usage.world)
            .and_then(|u| u.checked_mul(8)),
    );
    if usage.compare_pytorch {
        // the starting weights kept for PyTorch, and the data and batch orders written for it
        need.add("the copy PyTorch starts from", f32s(params)).add(
            "the data and batch orders written for PyTorch",
            sum(&[
                data.bytes(),
                bytes(&[data.train], 8)
                    .and_then(|b| b.checked_mul(cfg.epochs.min(u64::from(u32::MAX)))),
            ]),
        );
    }
    need
}

/// The GPU memory [`crate::gpu::GpuTrainer::new`] allocates for a run with `loader` (what it
/// holds whatever the batches: the data too when resident).
pub fn device_need(
    ordinal: usize,
    cfg: &TrainConfig,
    data: &DataShape,
    precision: Precision,
    loader: Loader,
) -> Need {
    let st = precision.storage().size_bytes();
    let params = parameters(&cfg.widths);
    let f32s = |n: Option<u64>| n.and_then(|n| n.checked_mul(4));
    let rows = cfg.batch_size.min(data.train.max(data.eval)).max(1);
    let widest = widest(cfg);
    let layers = cfg.widths.len().saturating_sub(1);
    let outputs: usize = cfg.widths[1..]
        .iter()
        .fold(0usize, |a, &w| a.saturating_add(w));
    // layer outputs: every one kept, or with checkpointing a segment's worth of shared buffers
    // and each segment's last
    let activations = if cfg.checkpoint_activations {
        let segment = cfg.segment();
        bytes(&[rows, widest, segment + layers.div_ceil(segment)], st)
    } else {
        bytes(&[rows, outputs], st)
    };
    let stages: usize = match loader {
        Loader::Resident => 0,
        Loader::Prefetch => 2,
        Loader::Plain | Loader::Pinned => 1,
    };
    let resident = |n: usize| bytes(&[n, data.features.saturating_add(data.target_width) + 1], 4);
    let batches = data
        .train
        .div_ceil(cfg.batch_size.max(1))
        .max(data.eval.div_ceil(cfg.batch_size.max(1)));
    let mut need = Need::device(
        ordinal,
        format!(
            "training MLP {} on the GPU (batch {}, {})",
            widths_name(cfg),
            cfg.batch_size,
            precision.name()
        ),
    );
    // the layout aligns each weight and bias to 128 elements
    let padded = params.and_then(|p| p.checked_add(256 * layers as u64));
    need.add(
        "weights and gradients",
        f32s(padded).and_then(|b| b.checked_mul(2)),
    )
    .add(
        "optimizer state",
        f32s(padded).and_then(|b| b.checked_mul(state_buffers(cfg))),
    )
    .add(
        "16-bit weights",
        if matches!(precision, Precision::Fp16 | Precision::Bf16) {
            padded.and_then(|p| p.checked_mul(st as u64))
        } else {
            Some(0)
        },
    )
    .add(
        // outputs, ReLU bit masks, two gradient buffers, the input and the staged batches
        "activations and workspace",
        sum(&[
            activations,
            bytes(&[rows, outputs.saturating_add(256 * layers) / 8], 1),
            bytes(&[rows, widest, 2], st),
            bytes(&[rows, data.features], st),
            bytes(
                &[
                    rows,
                    data.features.saturating_add(data.target_width),
                    stages,
                ],
                4,
            ),
            bytes(&[rows, data.target_width], 4),
            bytes(&[outputs], if cfg.accumulate > 1 { 4 } else { 0 }),
            bytes(&[batches.max(1)], 12),
            Some(gpukit_cuda::blas::WORKSPACE_BYTES as u64),
        ]),
    )
    .add(
        "the data on the GPU",
        if loader == Loader::Resident {
            resident(data.train)
        } else {
            Some(0)
        },
    )
    .add("the held-out data on the GPU", resident(data.eval));
    need
}

/// The loader a run takes when none is asked for: the data resident on the GPU when it takes
/// under a quarter of the free memory, else prefetched batch by batch.
pub fn default_loader(data: &DataShape, free_bytes: u64) -> Loader {
    match data.bytes() {
        Some(b) if b < free_bytes / 4 => Loader::Resident,
        _ => Loader::Prefetch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::LossKind;
    use crate::optim::OptimizerConfig;

    fn cfg(widths: &[usize], batch: usize, kind: OptimizerKind) -> TrainConfig {
        TrainConfig {
            widths: widths.to_vec(),
            loss: LossKind::Mse,
            optimizer: OptimizerConfig {
                kind,
                lr: 1e-3,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            batch_size: batch,
            epochs: 3,
            seed: 0,
            shuffle: true,
            accumulate: 1,
            max_steps: None,
            checkpoint_activations: false,
        }
    }

    const CPU: HostUse = HostUse {
        gpu: false,
        compare_pytorch: false,
        world: 1,
        ranks_here: 1,
        data_loaded: false,
    };

    #[test]
    fn updates_follow_the_loops_rule() {
        let mut c = cfg(&[16, 64, 1], 64, OptimizerKind::Adam);
        assert_eq!(c.updates_per_epoch(1024, 1), 16);
        assert_eq!(c.updates_per_epoch(1000, 1), 16);
        assert_eq!(c.updates_per_epoch(1024, 2), 8);
        c.accumulate = 3;
        assert_eq!(c.updates_per_epoch(1024, 1), 6);
        assert_eq!(c.total_updates(1024, 1), Some(18));
        c.max_steps = Some(5);
        assert_eq!(c.total_updates(1024, 1), Some(5));
    }

    #[test]
    fn the_huge_layers_of_the_report_cannot_fit_a_24_gib_machine() {
        let data = DataShape {
            train: 1024,
            eval: 0,
            features: 16,
            target_width: 1,
        };
        let c = cfg(&[16, 50_000, 50_000, 1], 64, OptimizerKind::Adam);
        let need = host_need(&c, &data, &CPU);
        // 2.5e9 parameters: weights, gradients and Adam's two moments, 4 bytes each
        assert!(need.total().unwrap() > 40_000_000_000, "{need:?}");
        assert!(need.check(Some(24 << 30), HINT).is_err());
        let huge = cfg(&[100_000, 100_000, 1], 64, OptimizerKind::Adam);
        let data = DataShape {
            features: 100_000,
            ..data
        };
        assert!(host_need(&huge, &data, &CPU)
            .check(Some(24 << 30), HINT)
            .is_err());
        // counts that overflow 64 bits are refused, never wrapped into a small number
        let overflow = cfg(&[usize::MAX / 2, usize::MAX / 2, 1], 1, OptimizerKind::Sgd);
        assert_eq!(host_need(&overflow, &data, &CPU).total(), None);
    }

    #[test]
    fn the_host_estimate_covers_what_a_run_held() {
        use crate::checkpoint::Position;
        use crate::model::Mlp;
        use crate::optim::Optimizer;
        let c = cfg(&[16, 64, 32, 1], 64, OptimizerKind::Adam);
        let data = crate::data::regression_preset(1000, 16, 0);
        let mut model = Mlp::new(&c.widths, 0);
        let mut opt = Optimizer::new(c.optimizer);
        let out = crate::run::train_cpu(
            &c,
            &mut model,
            &mut opt,
            Position::default(),
            &data,
            None,
            &mut |_| {},
        )
        .unwrap();
        let shape = DataShape {
            train: 1000,
            eval: 0,
            features: 16,
            target_width: 1,
        };
        let estimate = host_need(&c, &shape, &CPU).total().unwrap();
        let held = out.memory.total() as u64 + shape.bytes().unwrap();
        assert!(
            estimate >= held && estimate <= 3 * held,
            "estimate {estimate}, held {held}: {:?}",
            out.memory
        );
    }

    /// The model `train_cli`'s GPU refusal test asks for fits a 125 GiB host but no lent GPU
    /// (an H200 has about 139 GiB): the refusal it expects is the device's.
    #[test]
    fn the_gpu_refusal_case_fits_the_host_and_no_gpu() {
        let c = cfg(&[1024, 130_000, 130_000, 1], 64, OptimizerKind::Sgd);
        let data = DataShape {
            train: 4096,
            eval: 0,
            features: 1024,
            target_width: 1,
        };
        let gpu = HostUse { gpu: true, ..CPU };
        let host = host_need(&c, &data, &gpu).total().unwrap();
        let device = device_need(0, &c, &data, Precision::Bf16, Loader::Resident)
            .total()
            .unwrap();
        assert!(host < 100 << 30, "host {host}");
        assert!(device > 150 << 30, "device {device}");
    }

    #[test]
    fn the_tutorials_run_fits_in_a_few_hundred_kib() {
        let data = DataShape {
            train: 1024,
            eval: 0,
            features: 16,
            target_width: 1,
        };
        let need = host_need(&cfg(&[16, 64, 1], 64, OptimizerKind::Adam), &data, &CPU);
        let total = need.total().unwrap();
        assert!(total > 70_000 && total < 1 << 20, "{total}");
    }

    #[test]
    fn the_gpu_share_counts_the_resident_data_only_when_resident() {
        let data = DataShape {
            train: 100_000,
            eval: 0,
            features: 100_000,
            target_width: 1,
        };
        let c = cfg(&[100_000, 100_000, 100_000, 1], 4096, OptimizerKind::Adam);
        let resident = device_need(0, &c, &data, Precision::Bf16, Loader::Resident);
        let prefetch = device_need(0, &c, &data, Precision::Bf16, Loader::Prefetch);
        let (r, p) = (resident.total().unwrap(), prefetch.total().unwrap());
        assert!(r > p + 30_000_000_000, "{r} {p}");
        // 2e10 parameters in f32 four times over, and bf16 copies: far past 80 GB
        assert!(p > 80_000_000_000, "{p}");
        assert_eq!(default_loader(&data, 80 << 30), Loader::Prefetch);
        let small = DataShape {
            train: 1024,
            eval: 0,
            features: 16,
            target_width: 1,
        };
        assert_eq!(default_loader(&small, 80 << 30), Loader::Resident);
    }
}
