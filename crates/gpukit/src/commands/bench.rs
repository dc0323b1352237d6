//! `bench` (matmul and its search, bandwidth, conv, nccl, p2p) and `stress`.

use super::*;

pub(super) fn bench_matmul(a: MatmulArgs, out: &Output) -> Result<()> {
    use gpukit_bench::matmul::{document, run_matmul, run_matmul_with_pytorch, MatmulOptions};
    if a.search {
        return bench_matmul_search(a, out);
    }
    let discovery = prepare_process();
    check_named_gpu(&discovery, a.device)?;
    if !(a.cpu_seconds > 0.0 && a.cpu_seconds.is_finite()) {
        return Err(Error::BadInput("--cpu-seconds must be a positive number".into()).into());
    }
    let mut opts = MatmulOptions::default();
    if let Some(s) = a
        .matrix_size
        .map(|n| vec![n])
        .or(a.sizes.clone())
        .map(dedup)
    {
        opts.sizes = s;
    }
    opts.dtypes = a.dtype.clone().map(dedup);
    opts.selection = a.device;
    opts.iterations = a.iterations;
    opts.cpu_budget_s = a.cpu_seconds;
    opts.init = a.init;
    opts.lt_candidates = a.lt_candidates;
    opts.rounds = a.turns;
    let busy = busy_notes(&discovery, a.device);
    let (report, peer) = if a.compare_pytorch {
        let (r, p) = run_matmul_with_pytorch(&discovery, &opts, &mut progress());
        (r, Some(p))
    } else {
        (run_matmul(&discovery, &opts, &mut progress()), None)
    };
    let sections = render::matmul_sections(&report);
    let charts = render::html::matmul_charts(&report);
    let doc = document(report, peer.as_ref()).with_notes(busy);
    emit_charted(&doc, out, Vec::new(), sections, charts)
}

pub(super) fn bench_matmul_search(a: MatmulArgs, out: &Output) -> Result<()> {
    use gpukit_bench::matmul::search::{run_search, search_document, SearchOptions};
    let ordinal = match a.device {
        DeviceSelection::All => 0,
        DeviceSelection::One(Device::Cuda(n)) => n,
        DeviceSelection::One(Device::Cpu) => {
            return Err(Error::BadInput(
                "--search measures a GPU: give --device cuda:N (or leave --device out)".into(),
            )
            .into())
        }
    };
    let discovery = prepare_process();
    check_named_gpu(&discovery, DeviceSelection::One(Device::Cuda(ordinal)))?;
    let opts = SearchOptions {
        ordinal,
        dtypes: a
            .dtype
            .map(dedup)
            .unwrap_or_else(|| SearchOptions::default().dtypes),
        iterations: a.iterations,
        lt_candidates: a.lt_candidates,
        ..SearchOptions::default()
    };
    let busy = busy_notes(&discovery, DeviceSelection::One(Device::Cuda(ordinal)));
    let report = run_search(&discovery, &opts, &mut progress())?;
    let sections = render::matmul_search_sections(&report);
    emit(
        &search_document(report).with_notes(busy),
        out,
        Vec::new(),
        sections,
    )
}

pub(super) fn bench_nccl(a: NcclArgs, out: &Output) -> Result<()> {
    use gpukit_bench::nccl::{document, run_nccl, NcclOptions};
    let discovery = prepare_process();
    let opts = NcclOptions {
        gpus: a.gpus,
        ops: dedup(a.ops),
        dtypes: dedup(a.dtype),
        redops: dedup(a.redop),
        min_bytes: a.min_bytes,
        max_bytes: a.max_bytes,
        step_factor: a.step_factor,
        iterations: a.iterations,
        repeats: a.repeats,
        warmup: a.warmup,
        places: a.place.0,
        root: a.root,
        graph: a.graph,
        timeout: std::time::Duration::from_secs(a.timeout as u64),
        compare_pytorch: a.compare_pytorch,
        world: gpukit_ranks::world::from_process_env()?,
    };
    let rank0 = opts.world.as_ref().is_none_or(|w| w.rank == 0);
    let mut quiet = |_: &str| {};
    let mut shown = progress();
    let progress: &mut dyn FnMut(&str) = if rank0 { &mut shown } else { &mut quiet };
    // every rank but 0 measures and hands its figures to rank 0, which prints the report
    let Some((report, peer)) = run_nccl(&discovery, &opts, progress)? else {
        return Ok(());
    };
    let sections = render::nccl_sections(&report);
    emit(&document(report, peer.as_ref()), out, Vec::new(), sections)
}

pub(super) fn bench_p2p(a: P2pArgs, out: &Output) -> Result<()> {
    use gpukit_bench::p2p::{document, run_p2p, P2pOptions};
    let discovery = prepare_process();
    let opts = P2pOptions {
        bytes: a.bytes,
        iterations: a.iterations,
        compare_pytorch: a.compare_pytorch,
        ..P2pOptions::default()
    };
    let (report, peer) = run_p2p(&discovery, &opts, &mut progress())?;
    let sections = render::p2p_sections(&report);
    emit(&document(report, peer.as_ref()), out, Vec::new(), sections)
}

pub(super) fn stress(a: StressArgs, out: &Output) -> Result<()> {
    use gpukit_bench::stress::{document, parse_plant, run_stress, StressOptions, PLANT_FAULT_VAR};
    let mut opts = StressOptions::new(a.level, a.duration)?;
    opts.gpus = a.gpus;
    opts.plant = parse_plant(std::env::var(PLANT_FAULT_VAR).ok().as_deref())?;
    let discovery = prepare_process();
    // a GPU that is not idle may fail the rate rules for what else runs on it: say so
    let busy: Vec<String> = match gpukit_cuda::driver::probe(&discovery) {
        Ok(d) => opts
            .gpus
            .clone()
            .unwrap_or_else(|| (0..d.device_count).collect())
            .into_iter()
            .filter(|&o| o < d.device_count)
            .filter_map(|o| gpukit_bench::gpu::busy_gpu(&discovery, o))
            .collect(),
        Err(_) => Vec::new(),
    };
    // one line per test as each GPU's thread starts it
    let shown = std::sync::Mutex::new(progress());
    let report = run_stress(&discovery, &opts, &|line: &str| {
        if let Ok(mut p) = shown.lock() {
            p(line)
        }
    })?;
    drop(shown);
    let sections = render::stress_sections(&report);
    emit(
        &document(report).with_notes(busy),
        out,
        Vec::new(),
        sections,
    )
}

pub(super) fn bench_bandwidth(a: BandwidthArgs, out: &Output) -> Result<()> {
    use gpukit_bench::bandwidth::{document, run_bandwidth, run_bandwidth_with_pytorch};
    let discovery = prepare_process();
    let ordinal = match a.device {
        Device::Cuda(n) => n,
        Device::Cpu => {
            return Err(Error::BadInput(
                "bench bandwidth measures copies to and from a GPU: use --device cuda:N".into(),
            )
            .into())
        }
    };
    check_named_gpu(&discovery, DeviceSelection::One(a.device))?;
    let mut opts = gpukit_bench::bandwidth::BandwidthOptions {
        ordinal,
        iterations: a.iterations,
        ..Default::default()
    };
    if let Some(s) = a.sizes {
        opts.sizes_bytes = dedup(s);
    }
    let busy = busy_notes(&discovery, DeviceSelection::One(a.device));
    let (report, peer) = if a.compare_pytorch {
        let (r, p) = run_bandwidth_with_pytorch(&discovery, &opts, &mut progress());
        (r, Some(p))
    } else {
        (run_bandwidth(&discovery, &opts, &mut progress()), None)
    };
    if let Some(why) = &report.gpu_unavailable {
        return Err(Error::Unavailable(format!("bench bandwidth needs a GPU: {why}")).into());
    }
    let sections = render::bandwidth_sections(&report);
    let charts = render::html::bandwidth_chart(&report).into_iter().collect();
    let doc = document(report, peer.as_ref()).with_notes(busy);
    emit_charted(&doc, out, Vec::new(), sections, charts)
}

pub(super) fn bench_conv(a: ConvArgs, out: &Output) -> Result<()> {
    use gpukit_bench::conv::{document, resnet50_shapes, run_conv, run_conv_with_pytorch};
    let discovery = prepare_process();
    check_named_gpu(&discovery, a.device)?;
    if let Some(bad) = a.dtype.iter().find(|d| **d == gpukit_tensor::DType::F64) {
        return Err(Error::BadInput(format!(
            "bench conv runs f32, tf32, f16 and bf16; {bad} is not one of them"
        ))
        .into());
    }
    let opts = gpukit_bench::conv::ConvOptions {
        batches: dedup(a.batch),
        dtypes: dedup(a.dtype),
        layouts: dedup(a.layout),
        ordinal: match a.device {
            DeviceSelection::All => Some(0),
            DeviceSelection::One(Device::Cuda(n)) => Some(n),
            DeviceSelection::One(Device::Cpu) => None,
        },
        cpu: !matches!(a.device, DeviceSelection::One(Device::Cuda(_))),
        iterations: a.iterations,
        search: a.planning,
        ..Default::default()
    };
    let shapes = resnet50_shapes(1);
    let busy = busy_notes(&discovery, a.device);
    let (report, peer) = if a.compare_pytorch {
        let (r, p) = run_conv_with_pytorch(&discovery, &shapes, &opts, &mut progress());
        (r, Some(p))
    } else {
        (run_conv(&discovery, &shapes, &opts, &mut progress()), None)
    };
    let sections = render::conv_sections(&report);
    let charts = render::html::conv_chart(&report).into_iter().collect();
    let doc = document(report, peer.as_ref()).with_notes(busy);
    emit_charted(&doc, out, Vec::new(), sections, charts)
}
