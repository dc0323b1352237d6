//! One function per command: turn the parsed arguments into the bench crate's options, run it,
//! and hand its document to [`emit`], which renders it (tables, or JSON) and turns its verdict
//! into the exit code. No measuring and no policy lives here.

use crate::cli::{
    AllArgs, BandwidthArgs, BenchCommand, CheckArgs, Cli, Command, CompareArgs, ConvArgs, HtmlArgs,
    InferArgs, LaunchArgs, LessonsArgs, MatmulArgs, MemoryArgs, NcclArgs, P2pArgs, ProfileCommand,
    ProfileOptionArgs, StressArgs, TrainArgs,
};
use crate::output::{emit, emit_charted, Output};
use crate::render;
use anyhow::{Context, Result};
use gpukit_bench::report::Document;
use gpukit_bench::Error;
use gpukit_cuda::loader::{discover, prepare_process, Discovery};
use gpukit_tensor::{Device, DeviceSelection, Layout};
use std::path::Path;

pub fn run(cli: Cli) -> Result<()> {
    let out = Output {
        json: cli.json,
        save_json: cli.save_json.clone(),
        html: cli.html.clone(),
    };
    // a destination that cannot be written is bad input, found before any work
    if let Some(p) = &out.html {
        check_destination_file(p, "--html")?;
    }
    if let Some(p) = &out.save_json {
        check_destination_file(p, "--save-json")?;
    }
    check_outputs_are_not_inputs(&cli.command, &out)?;
    match cli.command {
        Command::Check(a) => check(a, &out),
        Command::Bench(BenchCommand::Matmul(a)) => bench_matmul(a, &out),
        Command::Bench(BenchCommand::Bandwidth(a)) => bench_bandwidth(a, &out),
        Command::Bench(BenchCommand::Conv(a)) => bench_conv(a, &out),
        Command::Bench(BenchCommand::Nccl(a)) => bench_nccl(a, &out),
        Command::Bench(BenchCommand::P2p(a)) => bench_p2p(a, &out),
        Command::Launch(a) => launch(a),
        Command::Infer(a) => infer(a, &out),
        Command::Memory(a) => memory(a, &out),
        Command::Train(a) => train(*a, &out),
        Command::Monitor(a) => crate::monitor_cmd::monitor(*a, &out),
        Command::Completions(a) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(a.shell, &mut cmd, "gpukit", &mut script);
            print_bytes(&script)
        }
        Command::Man => {
            let page = render::man_page(<Cli as clap::CommandFactory>::command())
                .context("rendering the man page")?;
            print_bytes(&page)
        }
        Command::Profile(p) => profile(p, &out),
        Command::Lessons(a) => lessons(a, &out),
        Command::Stress(a) => stress(a, &out),
        Command::All(a) => all(a, &out),
        Command::Compare(a) => compare(a, &out),
        Command::Html(a) => html(a),
    }
}

/// Exit 2, before any work, when a file the command would write is one it reads (`html R.json
/// --out R.json`): writing it would destroy the input. A checkpoint resumed from may be saved
/// over, as trainers do: it is read whole before the new one replaces it.
fn check_outputs_are_not_inputs(command: &Command, out: &Output) -> Result<()> {
    use crate::cli::{ProfileInferArgs, ProfileTrainArgs};
    fn train_inputs(t: &TrainArgs) -> [(&'static str, Option<&Path>); 3] {
        [
            ("--data", t.data.as_deref()),
            ("--init", t.init.as_deref()),
            ("--resume", t.resume.as_deref()),
        ]
    }
    fn train_outputs(t: &TrainArgs) -> [(&'static str, Option<&Path>); 2] {
        [
            ("--save", t.save.as_deref()),
            ("--save-losses", t.save_losses.as_deref()),
        ]
    }
    type Named<'a> = Vec<(&'static str, Option<&'a Path>)>;
    let (inputs, outputs): (Named, Named) = match command {
        Command::Html(a) => (
            vec![("REPORT", Some(&a.report))],
            vec![("--out", Some(&a.out))],
        ),
        Command::Compare(a) => (
            vec![("OLD", Some(&a.old)), ("NEW", Some(&a.new))],
            vec![("--markdown", a.markdown.as_deref())],
        ),
        Command::Infer(a) => (
            vec![
                ("--weights", a.weights.as_deref()),
                ("--input", a.input.as_deref()),
                ("--onnx", a.onnx.as_deref()),
                ("--torchvision-weights", a.torchvision_weights.as_deref()),
            ],
            vec![("--save-output", a.save_output.as_deref())],
        ),
        Command::Memory(a) => (vec![("--weights", a.weights.as_deref())], Vec::new()),
        Command::Train(a) => (train_inputs(a).to_vec(), train_outputs(a).to_vec()),
        Command::Profile(ProfileCommand::Infer(ProfileInferArgs {
            weights,
            onnx,
            profile,
            ..
        })) => (
            vec![
                ("--weights", weights.as_deref()),
                ("--onnx", onnx.as_deref()),
            ],
            vec![("--trace", profile.trace.as_deref())],
        ),
        Command::Profile(ProfileCommand::Train(p)) => {
            let ProfileTrainArgs { train, profile } = p.as_ref();
            let mut outputs = train_outputs(train).to_vec();
            outputs.push(("--trace", profile.trace.as_deref()));
            (train_inputs(train).to_vec(), outputs)
        }
        _ => (Vec::new(), Vec::new()),
    };
    let inputs: Vec<(&str, &Path)> = inputs
        .into_iter()
        .filter_map(|(flag, p)| Some((flag, p?)))
        .collect();
    let global = [
        ("--save-json", out.save_json.as_deref()),
        ("--html", out.html.as_deref()),
    ];
    for (flag, path) in outputs.into_iter().chain(global) {
        let Some(path) = path else { continue };
        let read: Vec<(&str, &Path)> = inputs
            .iter()
            .copied()
            .filter(|(input, _)| !(flag == "--save" && *input == "--resume"))
            .collect();
        gpukit_types::files::check_not_an_input((flag, path), &read).map_err(Error::BadInput)?;
    }
    Ok(())
}

/// An error unless `path` names a file gpukit can create or replace.
fn check_destination_file(path: &Path, flag: &str) -> Result<()> {
    gpukit_types::files::check_writable_file(path)
        .map_err(|e| Error::BadInput(format!("{flag} {}: {e}", path.display())).into())
}

/// What is running, for long commands: on a terminal a spinner line (elapsed time, rows done,
/// the current row) cleared before the results print; otherwise one line per row on stderr, so
/// logs show progress too (with `GPUKIT_TRACE=1`, each with the time since gpukit started).
fn progress() -> impl FnMut(&str) {
    use std::io::IsTerminal;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} {pos:>3} done  {msg}")
        {
            bar.set_style(style);
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        ClearOnDrop(bar)
    });
    let mut started = false;
    move |line: &str| match &bar {
        Some(ClearOnDrop(b)) => {
            if started {
                b.inc(1);
            }
            started = true;
            b.set_message(line.to_string());
        }
        None if gpukit_cuda::trace::on() => gpukit_cuda::trace::done_since_process_start(line),
        None => eprintln!("  {line}"),
    }
}

/// A progress bar that leaves no line behind when its command is done.
struct ClearOnDrop(indicatif::ProgressBar);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// A GPU named on the command line must exist: exit 2 otherwise.
fn check_named_gpu(discovery: &Discovery, selection: DeviceSelection) -> Result<()> {
    if let DeviceSelection::One(Device::Cuda(n)) = selection {
        match gpukit_cuda::driver::probe(discovery) {
            Ok(d) if n < d.device_count => {}
            Ok(d) => {
                return Err(Error::BadInput(format!(
                    "device cuda:{n} does not exist: this machine has {} CUDA device(s)",
                    d.device_count
                ))
                .into())
            }
            // no GPU at all is a missing device (exit 1), not a typo (exit 2)
            Err(e) => {
                return Err(Error::Unavailable(format!(
                    "cuda:{n} was asked for, but no GPU can be used: {e}"
                ))
                .into())
            }
        }
    }
    Ok(())
}

/// A warning for the document when the GPU that `selection` times is not idle (other
/// processes on it, or busy): its figures could not be the GPU's best.
fn busy_notes(discovery: &Discovery, selection: DeviceSelection) -> Vec<String> {
    let ordinal = match selection {
        DeviceSelection::One(Device::Cuda(n)) => n,
        DeviceSelection::All => 0,
        DeviceSelection::One(Device::Cpu) => return Vec::new(),
    };
    gpukit_bench::gpu::busy_gpu(discovery, ordinal)
        .into_iter()
        .collect()
}

fn check(args: CheckArgs, out: &Output) -> Result<()> {
    // --quick opens only NVML, by absolute path: no library needs the loader's path.
    let discovery = if args.quick {
        discover()
    } else {
        prepare_process()
    };
    let report = gpukit_bench::check::run_check(
        &discovery,
        gpukit_bench::check::CheckOptions {
            selection: args.device,
            ask_library_versions: args.library_versions,
            quick: args.quick,
        },
    )?;
    let head = render::check_head(&report);
    let sections = render::check_sections(&report);
    emit(&gpukit_bench::check::document(report), out, head, sections)
}

fn bench_matmul(a: MatmulArgs, out: &Output) -> Result<()> {
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

fn bench_matmul_search(a: MatmulArgs, out: &Output) -> Result<()> {
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

fn bench_nccl(a: NcclArgs, out: &Output) -> Result<()> {
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

fn bench_p2p(a: P2pArgs, out: &Output) -> Result<()> {
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

fn stress(a: StressArgs, out: &Output) -> Result<()> {
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

fn launch(a: LaunchArgs) -> Result<()> {
    let code = gpukit_ranks::launch::run(&gpukit_ranks::launch::LaunchOptions {
        nproc_per_node: a.nproc_per_node,
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        master_addr: a.master_addr,
        master_port: a.master_port,
        timeout: std::time::Duration::from_secs(a.timeout as u64),
        command: a.command,
    })?;
    if code != 0 {
        // the ranks have said what went wrong; gpukit exits as the first failed rank did
        std::process::exit(code);
    }
    Ok(())
}

fn bench_bandwidth(a: BandwidthArgs, out: &Output) -> Result<()> {
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

fn bench_conv(a: ConvArgs, out: &Output) -> Result<()> {
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

/// The items in the order given, each once (`--dtype f16,f16` runs f16 once).
fn dedup<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

fn memory(a: MemoryArgs, out: &Output) -> Result<()> {
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

fn lessons(a: LessonsArgs, out: &Output) -> Result<()> {
    use gpukit_bench::lessons::{document, run_lessons, LessonsOptions};
    if !(a.min_sample_ms > 0.0 && a.min_sample_ms <= 10_000.0) {
        return Err(Error::BadInput(format!(
            "--min-sample-ms {} must be above 0 and at most 10000",
            a.min_sample_ms
        ))
        .into());
    }
    let discovery = prepare_process();
    let opts = LessonsOptions {
        lessons: a.lessons.0,
        device: a.device,
        compare_pytorch: a.compare_pytorch,
        samples: a.samples as usize,
        min_sample_ms: a.min_sample_ms,
    };
    let report = run_lessons(&discovery, &opts, &mut progress())?;
    let sections = render::lessons_sections(&report);
    let notes = report.pytorch.clone().into_iter().collect::<Vec<_>>();
    emit(
        &document(report).with_notes(notes),
        out,
        Vec::new(),
        sections,
    )
}

/// Writes `bytes` to stdout; a reader that stopped early (`| head`) is not an error.
fn print_bytes(bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

fn train(a: TrainArgs, out: &Output) -> Result<()> {
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
fn train_request(
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

fn infer(a: InferArgs, out: &Output) -> Result<()> {
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
fn infer_onnx(a: InferArgs, out: &Output) -> Result<()> {
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
        budget_s: 10.0,
        selection: a.device,
        strategies,
        resnet_engine: a.resnet_engine,
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

fn all(a: AllArgs, out: &Output) -> Result<()> {
    use gpukit_bench::all::{document, run_all, AllOptions};
    // the report directory must be writable before minutes of benchmarks run
    gpukit_types::files::check_writable_dir(&a.out)
        .map_err(|e| Error::BadInput(format!("--out {}: {e}", a.out.display())))?;
    let discovery = prepare_process();
    check_named_gpu(&discovery, a.device)?;
    let opts = AllOptions {
        selection: a.device,
        quick: a.quick,
        // lossy: a path that is not UTF-8 is recorded, not a reason to fail
        command_line: std::env::args_os()
            .map(|s| s.to_string_lossy().into_owned())
            .collect(),
    };
    let busy = busy_notes(&discovery, a.device);
    let parts = gpukit_bench::parts();
    let report = run_all(&discovery, &opts, &parts, &mut progress())?;
    let warnings = report
        .part::<gpukit_bench::check::CheckReport>("check")
        .map(|c| c.warnings)
        .unwrap_or_default();
    let doc = document(report, &parts, &warnings).with_notes(busy);
    let json = serde_json::to_vec_pretty(&doc).context("serializing the report")?;
    let md = render::all_markdown(&doc);
    let html = render::all_html(&doc);
    let written = gpukit_types::files::write_all_atomically(
        &a.out,
        &[
            ("report.json", json),
            ("report.md", md.into_bytes()),
            ("report.html", html.into_bytes()),
        ],
    )
    .with_context(|| format!("cannot write the reports into {}", a.out.display()))?;
    let done = render::all_done(&doc, &written);
    if let Some(p) = &out.html {
        gpukit_types::files::write_atomically(p, render::all_html(&doc).as_bytes())
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let to_stdout = Output {
        json: out.json,
        save_json: None,
        html: None,
    };
    let emitted = emit(&doc, &to_stdout, done.head, Vec::new());
    // after the notes, failed or not (the reports are written either way); JSON stays alone
    if let (false, Some(last)) = (out.json, &done.last) {
        println!("{last}");
    }
    emitted
}

fn compare(a: CompareArgs, out: &Output) -> Result<()> {
    use gpukit_bench::compare::{compare, document, load};
    if let Some(p) = &a.markdown {
        check_destination_file(p, "--markdown")?;
    }
    let old = load(&a.old)?;
    let new = load(&a.new)?;
    let report = compare(&old, &new, a.threshold)?;
    let sections = render::compare_sections(&report);
    let doc = document(report, a.fail_on_regression);
    if let Some(p) = &a.markdown {
        let md = render::compare_markdown(&doc, &sections);
        gpukit_types::files::write_atomically(p, md.as_bytes())
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    emit(&doc, out, Vec::new(), sections)
}

/// `gpukit html`: report.html from an `all` report already written.
fn html(a: HtmlArgs) -> Result<()> {
    use gpukit_bench::all::AllReport;
    check_destination_file(&a.out, "--out")?;
    let shown = a.report.display().to_string();
    let bytes = std::fs::read(&a.report)
        .map_err(|e| Error::BadInput(format!("cannot read {shown}: {e}")))?;
    let doc: Document<AllReport> = serde_json::from_slice(&bytes)
        .map_err(|e| Error::BadInput(format!("{shown} is not the report of `gpukit all`: {e}")))?;
    gpukit_types::files::write_atomically(&a.out, render::all_html(&doc).as_bytes())
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    println!("wrote {}", a.out.display());
    Ok(())
}

fn profile_options(
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

fn profile(cmd: ProfileCommand, out: &Output) -> Result<()> {
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
            if a.train.gpus.is_some_and(|g| g > 1) {
                return Err(Error::BadInput(
                    "profile train records one GPU: leave out --gpus".into(),
                )
                .into());
            }
            let device = a.train.device.unwrap_or(Device::Cpu);
            let request = train_request(a.train, device, None);
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
