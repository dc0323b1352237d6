//! `infer` (ResNet, and `--onnx`), `memory` and `profile`.

use super::*;

pub(super) fn infer(a: InferArgs, out: &Output) -> Result<()> {
    use gpukit_bench::infer::{
        check_batches, compare_with_pytorch, document, run_infer, select_strategies, unusable,
        InferOptions,
    };
    if a.onnx.is_some() {
        return infer_onnx(a, out);
    }
    let strategies = select_strategies(a.strategies.as_deref(), a.device)?;
    let batch_sizes = a.batch_sizes.clone().unwrap_or_else(|| vec![1, 8, 16, 32]);
    if a.input.is_none() {
        check_batches(&strategies, &batch_sizes)?;
    }
    let wants_gpu = strategies.iter().any(|s| !s.on_cpu());
    // only GPU work needs the CUDA libraries on the loader's path (which may re-execute)
    let discovery = if wants_gpu {
        prepare_process()
    } else {
        discover()
    };
    if wants_gpu {
        check_named_gpu(&discovery, a.device)?;
    }
    if let Some(p) = &a.save_output {
        check_destination_file(p, "--save-output")?;
    }
    let opts = InferOptions {
        model: a.model_name,
        batch_sizes: dedup(batch_sizes),
        iterations: a.iterations,
        weights: a.weights.clone(),
        image_size: a.image_size,
        budget_s: 10.0,
        selection: a.device,
        strategies,
        gpu_iterations: a.gpu_iterations,
        cpu_max_batch: None,
        search: a.planning,
        tolerance: gpukit_bench::accuracy::tolerance,
    };
    if let Some(input) = &a.input {
        let run = gpukit_bench::infer::io::run_on_input(
            &discovery,
            &opts,
            input,
            a.save_output.as_deref(),
            &mut progress(),
        )?;
        let sections = vec![render::input_run_section(&run)];
        return emit(
            &gpukit_bench::infer::io::document(run),
            out,
            Vec::new(),
            sections,
        );
    }
    let busy = if wants_gpu {
        busy_notes(&discovery, a.device)
    } else {
        Vec::new()
    };
    let mut report = run_infer(&discovery, &opts, &mut progress())?;
    if let Some(e) = unusable(&report, a.device) {
        return Err(e.into());
    }
    let peer = a
        .compare_pytorch
        .then(|| compare_with_pytorch(&mut report, &opts));
    let sections = render::infer_sections(&report);
    let charts = render::html::infer_chart(&report).into_iter().collect();
    let doc = document(report, peer.as_ref()).with_notes(busy);
    emit_charted(&doc, out, Vec::new(), sections, charts)
}

/// `infer --onnx`: the user's model on the CPU (gpukit's interpreter and ONNX Runtime) and on
/// the GPU; the CUDA libraries are looked for only when a GPU strategy is asked for. With
/// `--torchvision`, PyTorch's model is checked to be the file's before any row runs, and runs
/// beside after.
pub(super) fn infer_onnx(a: InferArgs, out: &Output) -> Result<()> {
    use gpukit_bench::infer::check_batches;
    use gpukit_bench::infer::onnx::peer::{check_same_model, compare, Torchvision};
    use gpukit_bench::infer::onnx::{document, onnx_strategies, run_onnx, OnnxOptions};
    let Some(file) = a.onnx else {
        return Err(Error::BadInput("infer --onnx needs a model file".into()).into());
    };
    let torchvision = match (a.compare_pytorch, a.torchvision) {
        (true, None) => {
            return Err(Error::BadInput(
                "--compare-pytorch with --onnx needs --torchvision NAME, the torchvision \
                 classifier the file was exported from (e.g. --torchvision mobilenet_v3_large)"
                    .into(),
            )
            .into())
        }
        (_, name) => name.map(|name| Torchvision {
            name,
            weights: a.torchvision_weights,
        }),
    };
    // the GPU's default rows only where one is usable (never a wall of skipped rows)
    let gpu_usable = a.strategies.is_none()
        && a.device != DeviceSelection::One(Device::Cpu)
        && gpukit_cuda::driver::probe(&prepare_process()).is_ok();
    let strategies = onnx_strategies(a.strategies.as_deref(), a.device, gpu_usable)?;
    if let Some(sizes) = &a.batch_sizes {
        check_batches(&strategies, sizes)?;
    }
    let opts = OnnxOptions {
        file,
        batch_sizes: a.batch_sizes.map(dedup),
        dims: a.input_dims,
        iterations: a.iterations,
        gpu_iterations: a.gpu_iterations,
        budget_s: 10.0,
        selection: a.device,
        strategies,
        resnet_engine: a.resnet_engine,
        fp8: a
            .fp8_check
            .then(|| gpukit_bench::infer::onnx::fp8::Fp8Options {
                method: a
                    .fp8_calibration
                    .unwrap_or(gpukit_models::graph::fp8::Method::Max),
                samples: a.calibrate.clone(),
                save_scales: a.save_fp8_scales.clone(),
            }),
    };
    let wants_gpu = opts.strategies.iter().any(|s| !s.on_cpu());
    let discovery = if wants_gpu {
        let discovery = prepare_process();
        check_named_gpu(&discovery, opts.selection)?;
        Some(discovery)
    } else {
        None
    };
    let checked = match &torchvision {
        Some(tv) => Some(check_same_model(&opts, tv, &mut progress())?),
        None => None,
    };
    let mut run = run_onnx(&opts, discovery.as_ref(), &mut progress())?;
    let peer = torchvision
        .zip(checked)
        .map(|(tv, checked)| compare(&mut run, &opts, &tv, checked, &mut progress()));
    let sections = render::onnx_run_sections(&run);
    emit(
        &document(run).with_peer(peer.as_ref()),
        out,
        Vec::new(),
        sections,
    )
}

pub(super) fn memory(a: MemoryArgs, out: &Output) -> Result<()> {
    use gpukit_bench::memory::{document, run_memory, MemoryOptions};
    let device = a.device.unwrap_or(Device::Cuda(0));
    let ordinal = match device {
        Device::Cuda(n) => n,
        Device::Cpu => {
            return Err(Error::BadInput(
                "gpukit memory measures GPU memory: --device must be cuda:N".into(),
            )
            .into())
        }
    };
    let discovery = prepare_process();
    if a.device.is_some() {
        check_named_gpu(&discovery, DeviceSelection::One(device))?;
    } else if let Err(e) = gpukit_cuda::driver::probe(&discovery) {
        return Err(Error::Unavailable(format!(
            "gpukit memory measures GPU memory, and no GPU can be used here: {e}"
        ))
        .into());
    }
    let layout = match a.layout {
        Some(l) => l,
        // half precision runs on tensor cores, which want channels-last
        None if a.precision.size_bytes() == 2 => Layout::Nhwc,
        None => Layout::Nchw,
    };
    let opts = MemoryOptions {
        model: a.model_name,
        batch_sizes: dedup(a.batch_sizes.clone()),
        dtype: a.precision,
        layout,
        image_size: a.image_size,
        weights: a.weights.clone(),
        ordinal,
        memory_fraction: a.memory_fraction,
        on_oom_halve: a.on_oom == "halve",
        find_max_batch: a.find_max_batch,
        max_workspace_bytes: a.max_workspace.map(|m| m << 20),
    };
    let busy = busy_notes(&discovery, DeviceSelection::One(device));
    let report = run_memory(&discovery, &opts, &mut progress())?;
    let sections = render::memory_sections(&report);
    let charts = render::html::memory_chart(&report).into_iter().collect();
    emit_charted(
        &document(report).with_notes(busy),
        out,
        Vec::new(),
        sections,
        charts,
    )
}

pub(super) fn profile_options(
    p: &ProfileOptionArgs,
    steps: usize,
) -> Result<gpukit_bench::workload::profile::ProfileOptions> {
    let o = gpukit_bench::workload::profile::ProfileOptions {
        steps,
        top: p.top,
        group_by: p.group_by,
        trace: p.trace.clone(),
        timing: p.timing,
    };
    // --top 0, an unwritable trace: bad input, before any work
    gpukit_bench::workload::profile::run::check_options(&o)?;
    Ok(o)
}

pub(super) fn profile(cmd: ProfileCommand, out: &Output) -> Result<()> {
    use gpukit_bench::workload::profile::{
        profile_infer, profile_onnx, profile_train, InferWorkload,
    };
    let report = match cmd {
        ProfileCommand::Infer(a) => {
            let o = profile_options(&a.profile, a.steps)?;
            let wants_gpu = a.device != Some(Device::Cpu)
                && a.strategy != Some(gpukit_bench::infer::InferStrategy::Cpu);
            let discovery = if wants_gpu {
                prepare_process()
            } else {
                discover()
            };
            if let Some(d @ Device::Cuda(_)) = a.device {
                check_named_gpu(&discovery, DeviceSelection::One(d))?;
            }
            let w = InferWorkload {
                model: a.model_name,
                batch: a.batch_size,
                image_size: a.image_size,
                weights: a.weights,
                strategy: a.strategy,
                device: a.device,
            };
            match &a.onnx {
                Some(file) => {
                    profile_onnx(&discovery, &w, file, &a.input_dims, &o, &mut progress())?
                }
                None => profile_infer(&discovery, &w, &o, &mut progress())?,
            }
        }
        ProfileCommand::Train(a) => {
            let a = *a;
            let o = profile_options(&a.profile, 1)?;
            if let Some(model) = a.train.model {
                if a.train.gpus.is_some_and(|g| g > 1) {
                    return Err(Error::BadInput(
                        "profile train --model records one GPU: leave out --gpus".into(),
                    )
                    .into());
                }
                let request = super::train::cnn_request(a.train, model, None)?;
                let discovery = prepare_process();
                check_named_gpu(&discovery, DeviceSelection::One(request.device))?;
                let report = gpukit_bench::workload::profile::profile_cnn_train(
                    &discovery,
                    &request,
                    &o,
                    &mut progress(),
                )?;
                let sections = render::profile_sections(&report);
                let doc = Document::new("profile", report, None);
                return emit(&doc, out, Vec::new(), sections);
            }
            if let Some(flag) = cnn_only_flag(&a.train) {
                return Err(Error::BadInput(format!(
                    "{flag}: is about convolutional networks (train --model)"
                ))
                .into());
            }
            // data-parallel: threads on cuda:0..N-1, cuda:0's rank recorded
            let parallel = a
                .train
                .gpus
                .filter(|&g| g > 1)
                .map(gpukit_bench::workload::train::parallel::Ranks::Threads);
            let device = match parallel {
                Some(_) => Device::Cuda(0),
                None => a.train.device.unwrap_or(Device::Cpu),
            };
            let request = train_request(a.train, device, parallel);
            gpukit_bench::workload::train::check_request(&request)?;
            let discovery = if device == Device::Cpu {
                discover()
            } else {
                let d = prepare_process();
                check_named_gpu(&d, DeviceSelection::One(device))?;
                d
            };
            profile_train(&discovery, &request, &o, &mut progress())?
        }
    };
    let sections = render::profile_sections(&report);
    let doc = Document::new("profile", report, None);
    emit(&doc, out, Vec::new(), sections)
}
