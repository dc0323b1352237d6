//! What a `train` request may ask, checked before any work: GPU settings on the CPU, flags
//! that contradict each other or a data file, `--pipeline`'s partners, destinations that cannot
//! be written, step counts that cannot be met, a checkpoint with nothing left to train.

use super::TrainRequest;
use crate::error::{Error, Result};
use gpukit_tensor::{DType, Device};
use gpukit_train::checkpoint::Position;
use gpukit_train::gpu::feed::Loader;
use gpukit_train::gpu::Precision;
use gpukit_types::resources::Need;

/// Refuses, before any work, what cannot run here: GPU settings on the CPU, flags that
/// contradict a data file, destinations that cannot be written.
pub fn check_request(r: &TrainRequest) -> Result<()> {
    let on_gpu = matches!(r.device, Some(Device::Cuda(_)));
    if let Some(dtype) = r.precision {
        let p = dtype.precision_name();
        match Precision::of(dtype) {
            None => {
                return Err(Error::BadInput(format!(
                    "--precision {p}: gpukit trains in fp32, tf32, fp16 or bf16"
                )))
            }
            Some(Precision::Fp32) => {}
            Some(_) if !on_gpu => {
                return Err(Error::BadInput(format!(
                    "--precision {p}: the CPU trains in fp32 (tf32, fp16 and bf16 are GPU \
                     precisions: add --device cuda:0)"
                )))
            }
            Some(_) => {}
        }
    }
    if !on_gpu && (r.loader.is_some() || r.graph.is_some()) {
        return Err(Error::BadInput(format!(
            "{}: is about the GPU path; add --device cuda:0",
            match r.graph {
                Some(true) => "--graph",
                Some(false) => "--no-graph",
                None => "--loader",
            }
        )));
    }
    check_pipeline(r)?;
    if let Some(flag) = r.shard_optimizer.map(|on| {
        if on {
            "--shard-optimizer"
        } else {
            "--no-shard-optimizer"
        }
    }) {
        if r.parallel.is_none() {
            return Err(Error::BadInput(format!(
                "{flag}: is about data-parallel GPUs; add --gpus N or start under a launcher"
            )));
        }
    }
    if r.comm_sms.is_some() && r.parallel.is_none() {
        return Err(Error::BadInput(
            "--comm-sms: is about data-parallel GPUs; add --gpus N or start under a launcher"
                .into(),
        ));
    }
    if r.shard_optimizer == Some(true) && r.precision == Some(DType::F16) {
        return Err(Error::BadInput(
            "--shard-optimizer: fp16's overflow check reads every gradient, which no GPU holds \
             once they are sharded; train in bf16"
                .into(),
        ));
    }
    if r.memory_fraction.is_some() && !on_gpu && r.parallel.is_none() {
        return Err(Error::BadInput(
            "--memory-fraction: is about a GPU's memory; add --device cuda:0".into(),
        ));
    }
    if r.compare_pytorch && r.resume.is_some() {
        return Err(Error::BadInput(
            "--compare-pytorch runs both sides from the start: leave out --resume".into(),
        ));
    }
    if r.init.is_some() && r.resume.is_some() {
        return Err(Error::BadInput(
            "--init and --resume both give the starting weights: use one".into(),
        ));
    }
    if r.data.is_some() && (r.samples.is_some() || r.features.is_some()) {
        return Err(Error::BadInput(
            "--samples and --features describe generated data; with --data the file gives them"
                .into(),
        ));
    }
    for (flag, v) in [("--samples", r.samples), ("--features", r.features)] {
        if v == Some(0) {
            return Err(Error::BadInput(format!("{flag} 0: must be at least 1")));
        }
    }
    if let Some(f) = r.eval_fraction {
        if !(f.is_finite() && (0.0..1.0).contains(&f)) {
            return Err(Error::BadInput(format!(
                "--eval-fraction {f}: must be at least 0 and below 1"
            )));
        }
    }
    for (flag, path) in [("--save", &r.save), ("--save-losses", &r.save_losses)] {
        if let Some(p) = path {
            gpukit_types::files::check_writable_file(p).map_err(|source| Error::Io {
                what: flag,
                path: p.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// `--pipeline N` with what it takes: several GPUs' worth of layers, batches cut into
/// micro-batches, the data on the GPU; the rest is refused naming the flag.
fn check_pipeline(r: &TrainRequest) -> Result<()> {
    let Some(n) = r.pipeline else {
        return match (r.micro_batches, &r.pipeline_split) {
            (Some(_), _) => Err(Error::BadInput(
                "--micro-batches: cuts batches for a pipeline; add --pipeline N".into(),
            )),
            (_, Some(_)) => Err(Error::BadInput(
                "--pipeline-split: splits a pipeline's layers; add --pipeline N".into(),
            )),
            _ => Ok(()),
        };
    };
    if let Some(s) = r.pipeline_split.as_ref().filter(|s| s.len() != n) {
        return Err(Error::BadInput(format!(
            "--pipeline-split: {} stage(s) given ({}), --pipeline {n} has {n}",
            s.len(),
            s.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        )));
    }
    if n < 2 {
        return Err(Error::BadInput(format!(
            "--pipeline {n}: a pipeline has at least 2 stages (one GPU trains without it)"
        )));
    }
    if r.micro_batches == Some(0) {
        return Err(Error::BadInput(
            "--micro-batches 0: must be at least 1".into(),
        ));
    }
    if matches!(r.device, Some(Device::Cpu)) {
        return Err(Error::BadInput(
            "--pipeline: runs on GPUs (cuda:0..N-1); leave --device out or name cuda:0".into(),
        ));
    }
    use crate::workload::train::parallel::Ranks;
    if let Some(Ranks::Launched(w)) = &r.parallel {
        // under a launcher each process is one stage, on cuda:LOCAL_RANK
        if w.world_size != n {
            return Err(Error::BadInput(format!(
                "--pipeline {n} under a launcher of {} processes: each process is one stage \
                 (start {n} processes, or give --pipeline {})",
                w.world_size, w.world_size
            )));
        }
        let refused = [
            (
                "--save (each process holds only its own stage's layers: run --pipeline N in \
                 one process to save the model)",
                r.save.is_some(),
            ),
            (
                "--compare-pytorch (PyTorch's pipeline is started from one process: run \
                 --pipeline N without a launcher)",
                r.compare_pytorch,
            ),
        ];
        if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
            return Err(Error::BadInput(format!(
                "--pipeline under a launcher does not take {flag}"
            )));
        }
    }
    let refused = [
        ("--gpus", matches!(r.parallel, Some(Ranks::Threads(_)))),
        ("--accumulate", r.accumulate.is_some_and(|k| k > 1)),
        ("--checkpoint-activations", r.checkpoint_activations),
        ("--eval-fraction", r.eval_fraction.is_some_and(|f| f > 0.0)),
        ("--resume", r.resume.is_some()),
        ("--graph", r.graph == Some(true)),
        (
            "--loader (the pipeline keeps the data on the GPUs)",
            r.loader.is_some_and(|l| l != Loader::Resident),
        ),
        ("--profile", r.profile.is_some()),
        (
            "--precision fp16 (its loss scale would span the stages: use bf16)",
            r.precision == Some(DType::F16),
        ),
    ];
    if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(Error::BadInput(format!("--pipeline does not take {flag}")));
    }
    Ok(())
}

/// The host memory reading `path` takes: the file's bytes and the data decoded from them
/// (CSV text may decode to twice its size: "1," is two bytes, its f32 four).
pub(crate) fn file_need(path: &std::path::Path) -> Need {
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    let csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    Need::host(format!("reading {}", path.display()))
        .with("the file", Some(len))
        .with(
            "the data decoded from it",
            len.checked_mul(if csv { 2 } else { 1 }),
        )
}

/// `--steps N` makes N updates: with no `--epochs` the run takes as many epochs as that needs;
/// `--epochs` that end before N updates is a contradiction (exit 2), not a silent early stop.
pub(super) fn resolve_steps(
    r: &TrainRequest,
    cfg: &mut gpukit_train::run::TrainConfig,
    train: usize,
    world: usize,
) -> Result<()> {
    let Some(steps) = r.steps else {
        return Ok(());
    };
    let per_epoch = cfg.updates_per_epoch(train, world).max(1);
    let needed = steps.div_ceil(per_epoch);
    match r.epochs {
        None => cfg.epochs = needed,
        Some(e) if e < needed => {
            return Err(Error::BadInput(format!(
                "--steps {steps} needs {needed} epochs of {per_epoch} updates, but --epochs {e} \
                 ends after {}: raise --epochs or leave it out",
                e.saturating_mul(per_epoch)
            )))
        }
        Some(_) => {}
    }
    Ok(())
}

/// A resumed checkpoint must have something left to train: at or past the last epoch (or
/// `--steps`) there is nothing, and that is said rather than a run of no updates.
pub(super) fn check_left_to_train(
    cfg: &gpukit_train::run::TrainConfig,
    at: &Position,
) -> Result<()> {
    if at.epoch >= cfg.epochs {
        return Err(Error::BadInput(format!(
            "--resume: the checkpoint has finished epoch {} and --epochs is {}: nothing is left \
             to train (raise --epochs, which counts from the run's start)",
            at.epoch, cfg.epochs
        )));
    }
    if let Some(m) = cfg.max_steps.filter(|&m| at.step >= m) {
        return Err(Error::BadInput(format!(
            "--resume: the checkpoint has made {} updates and --steps is {m}: nothing is left \
             to train (raise --steps, which counts from the run's start)",
            at.step
        )));
    }
    Ok(())
}
