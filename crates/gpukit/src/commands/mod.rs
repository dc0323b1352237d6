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

mod bench;
mod infer;
mod train;

use bench::*;
use infer::*;
use train::*;

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
