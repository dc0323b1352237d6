//! `train`: its arguments turned into a run request, the run, its report.

use super::*;

pub(super) fn train(a: TrainArgs, out: &Output) -> Result<()> {
    use gpukit_bench::workload::train::parallel::Ranks;
    if let Some(model) = a.model {
        return train_cnn(a, model, out);
    }
    if let Some(flag) = cnn_only_flag(&a) {
        return Err(Error::BadInput(format!(
            "{flag}: is about convolutional networks; add --model resnet18|resnet34|resnet50"
        ))
        .into());
    }
    use gpukit_bench::workload::train::{document, run_train_ranked};
    let world = gpukit_ranks::world::from_process_env()?.filter(|w| w.world_size > 1);
    let parallel = match (&world, a.gpus) {
        (Some(_), Some(g)) if g > 1 => {
            return Err(Error::BadInput(
                "--gpus drives several GPUs from one process; under a launcher every process \
                 is one rank (leave --gpus out)"
                    .into(),
            )
            .into())
        }
        (Some(w), _) => Some(Ranks::Launched(w.clone())),
        (None, Some(g)) if g > 1 => Some(Ranks::Threads(g)),
        _ => None,
    };
    let rank0 = world.as_ref().is_none_or(|w| w.rank == 0);
    let device = match (&parallel, a.device) {
        // a pipeline's stages are cuda:0..N-1
        (None, None) if a.pipeline.is_some() => Device::Cuda(0),
        (None, d) => d.unwrap_or(Device::Cpu),
        (Some(_), Some(Device::Cpu)) => {
            return Err(Error::BadInput(
                "data-parallel training runs on GPUs: leave --device out or name cuda:N".into(),
            )
            .into())
        }
        (Some(Ranks::Launched(w)), _) => Device::Cuda(w.local_rank),
        (Some(_), _) => Device::Cuda(0),
    };
    let request = train_request(a, device, parallel);
    gpukit_bench::workload::train::check_request(&request)?;
    // only GPU work needs the CUDA libraries on the loader's path (which may re-execute)
    let discovery = if device == Device::Cpu {
        discover()
    } else {
        let d = prepare_process();
        if world.is_none() {
            check_named_gpu(&d, DeviceSelection::One(device))?;
        }
        d
    };
    let mut quiet = |_: &str| {};
    let mut shown = progress();
    let progress: &mut dyn FnMut(&str) = if rank0 { &mut shown } else { &mut quiet };
    let Some(report) = run_train_ranked(&request, &discovery, progress)? else {
        return Ok(());
    };
    let sections = render::train_sections(&report);
    let charts = render::html::train_chart(std::slice::from_ref(&report))
        .into_iter()
        .collect();
    emit_charted(&document(report), out, Vec::new(), sections, charts)
}

/// train's flags as the bench crate's request (`profile train` takes the same flags).
pub(super) fn train_request(
    a: TrainArgs,
    device: gpukit_tensor::Device,
    parallel: Option<gpukit_bench::workload::train::parallel::Ranks>,
) -> gpukit_bench::workload::train::TrainRequest {
    use gpukit_bench::workload::train::TrainRequest;
    TrainRequest {
        preset: a.preset,
        layers: a.layers.map(|l| l.0),
        samples: a.samples,
        features: a.features,
        batch_size: a.batch_size,
        epochs: a.epochs,
        optimizer: a.optimizer,
        lr: a.lr,
        momentum: a.momentum,
        weight_decay: a.weight_decay,
        loss: a.loss,
        seed: a.seed,
        eval_fraction: a.eval_fraction,
        data: a.data,
        init: a.init,
        no_shuffle: a.no_shuffle,
        accumulate: a.accumulate,
        steps: a.steps,
        save: a.save,
        resume: a.resume,
        save_losses: a.save_losses,
        precision: a.precision,
        device: Some(device),
        loader: a.loader,
        graph: match (a.graph, a.no_graph) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        compare_pytorch: a.compare_pytorch,
        checkpoint_activations: a.checkpoint_activations,
        parallel,
        bucket_mb: a.bucket_mb,
        grad_pieces: a.grad_pieces,
        grad_comm: a.grad_comm,
        comm_sms: a.comm_sms,
        shard_optimizer: match (a.shard_optimizer, a.no_shard_optimizer) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        timeout: Some(std::time::Duration::from_secs(a.timeout as u64)),
        profile: None,
        pipeline: a.pipeline,
        micro_batches: a.micro_batches,
        pipeline_split: a.pipeline_split.clone(),
        memory_fraction: a.memory_fraction,
    }
}

/// The first flag given that only convolutional networks (`--model`) take.
pub(super) fn cnn_only_flag(a: &TrainArgs) -> Option<&'static str> {
    [
        ("--image-size", a.image_size.is_some()),
        ("--classes", a.classes.is_some()),
        ("--nesterov", a.nesterov),
        ("--label-smoothing", a.label_smoothing.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag))
}

/// `train --model`: a ResNet, refusing the flags only the MLP loop takes.
fn train_cnn(a: TrainArgs, model: gpukit_train::cnn::resnet::Depth, out: &Output) -> Result<()> {
    use gpukit_bench::workload::train::cnn::{document, run_cnn_train};
    // under a launcher every process is one rank, on cuda:LOCAL_RANK
    let world = gpukit_ranks::world::from_process_env()?.filter(|w| w.world_size > 1);
    if world.is_some() && a.device == Some(Device::Cpu) {
        return Err(Error::BadInput(
            "data-parallel training runs on GPUs: leave --device out or name cuda:N".into(),
        )
        .into());
    }
    let rank0 = world.as_ref().is_none_or(|w| w.rank == 0);
    let request = cnn_request(a, model, world)?;
    let device = request.device;
    let discovery = if device == Device::Cpu {
        discover()
    } else {
        let d = prepare_process();
        check_named_gpu(&d, DeviceSelection::One(device))?;
        d
    };
    let mut quiet = |_: &str| {};
    let mut shown = progress();
    let progress: &mut dyn FnMut(&str) = if rank0 { &mut shown } else { &mut quiet };
    let report = run_cnn_train(&request, &discovery, progress)?;
    if !rank0 {
        // rank 0 reports the run; another rank says only that it failed
        return match report.diverged {
            Some(why) => Err(Error::Failed(why).into()),
            None => Ok(()),
        };
    }
    let sections = render::cnn_train_sections(&report);
    emit(&document(report), out, Vec::new(), sections)
}

/// The request `train --model` (and `profile train --model`) makes of the flags, checked:
/// flags only the MLP loop takes are refused.
pub(super) fn cnn_request(
    a: TrainArgs,
    model: gpukit_train::cnn::resnet::Depth,
    launched: Option<gpukit_ranks::world::World>,
) -> Result<gpukit_bench::workload::train::cnn::CnnTrainRequest> {
    use gpukit_bench::workload::train::cnn::{check_request, CnnTrainRequest};
    let mlp_only = [
        ("--preset", a.preset.is_some()),
        ("--layers", a.layers.is_some()),
        ("--features", a.features.is_some()),
        ("--loss", a.loss.is_some()),
        ("--eval-fraction", a.eval_fraction.is_some()),
        ("--no-shuffle", a.no_shuffle),
        ("--save", a.save.is_some()),
        ("--resume", a.resume.is_some()),
        ("--grad-pieces", a.grad_pieces.is_some()),
        ("--shard-optimizer", a.shard_optimizer),
        ("--no-shard-optimizer", a.no_shard_optimizer),
        ("--comm-sms", a.comm_sms.is_some()),
        ("--loader", a.loader.is_some()),
        ("--pipeline", a.pipeline.is_some()),
        ("--micro-batches", a.micro_batches.is_some()),
        ("--pipeline-split", a.pipeline_split.is_some()),
        ("--memory-fraction", a.memory_fraction.is_some()),
    ];
    if let Some((flag, _)) = mlp_only.iter().find(|(_, given)| *given) {
        return Err(Error::BadInput(format!(
            "{flag}: is not available with --model yet (convolutional networks train from \
             the start, on one GPU or data-parallel with --gpus)"
        ))
        .into());
    }
    let device = match &launched {
        Some(w) => Device::Cuda(w.local_rank),
        None => a.device.unwrap_or(Device::Cpu),
    };
    let request = CnnTrainRequest {
        model,
        device,
        batch_size: a.batch_size,
        steps: a.steps,
        epochs: a.epochs,
        image_size: a.image_size,
        classes: a.classes,
        samples: a.samples,
        optimizer: a.optimizer,
        lr: a.lr,
        momentum: a.momentum,
        nesterov: a.nesterov,
        weight_decay: a.weight_decay,
        label_smoothing: a.label_smoothing,
        seed: a.seed,
        init: a.init,
        data: a.data,
        precision: a.precision,
        save_losses: a.save_losses,
        profile: None,
        compare_pytorch: a.compare_pytorch,
        accumulate: a.accumulate,
        checkpoint_activations: a.checkpoint_activations,
        gpus: a.gpus,
        launched,
        bucket_mb: a.bucket_mb,
        grad_comm: a.grad_comm,
        graph: match (a.graph, a.no_graph) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
    };
    check_request(&request)?;
    Ok(request)
}
