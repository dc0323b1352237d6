//! `train`: its arguments turned into a run request, the run, its report.

use super::*;

pub(super) fn train(a: TrainArgs, out: &Output) -> Result<()> {
    use gpukit_bench::workload::train::parallel::Ranks;
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
        bucket_mb: Some(a.bucket_mb),
        timeout: Some(std::time::Duration::from_secs(a.timeout as u64)),
        profile: None,
    }
}
