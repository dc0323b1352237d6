//! One function per command: run the bench crate's code, then render or write its result.

use crate::cli::{
    AllArgs, BandwidthArgs, BenchCommand, CheckArgs, Cli, Command, ConvArgs, InferArgs, LayoutArg,
    MatmulArgs,
};
use crate::render::{
    bandwidth_sections, check_headline, check_sections, conv_sections, matmul_sections,
    to_markdown, to_terminal,
};
use crate::write::write_files_atomically;
use crate::UsageError;
use anyhow::{Context, Result};
use gpukit_bench::bandwidth::{
    run_bandwidth, run_bandwidth_with_pytorch, BandwidthOptions, BandwidthReport,
};
use gpukit_bench::check::{run_check, CheckOptions, CheckReport};
use gpukit_bench::conv::{resnet50_shapes, run_conv, ConvOptions, ConvReport};
use gpukit_bench::matmul::{run_matmul, MatmulOptions, MatmulReport};
use gpukit_cuda::loader::{discover, prepare_process, Discovery};
use gpukit_tensor::Layout;
use gpukit_tensor::{Device, DeviceSelection};
use serde::Serialize;
use std::time::Instant;

pub fn run(cli: Cli) -> Result<()> {
    let out = Output {
        json: cli.json,
        save_json: cli.save_json.clone(),
    };
    match cli.command {
        Command::Check(a) => check(a, &out),
        Command::Bench(BenchCommand::Matmul(a)) => bench_matmul(a, &out),
        Command::Bench(BenchCommand::Bandwidth(a)) => bench_bandwidth(a, &out),
        Command::Bench(BenchCommand::Conv(a)) => bench_conv(a, &out),
        Command::Infer(a) => infer(a, &out),
        Command::Memory(a) => memory(a, &out),
        Command::All(a) => all(a, out.json),
    }
}

/// Progress lines on stderr, only when a person is watching.
fn progress() -> impl FnMut(&str) {
    use std::io::IsTerminal;
    let show = std::io::stderr().is_terminal();
    move |line: &str| {
        if show {
            eprintln!("  {line}");
        }
    }
}

/// A GPU named on the command line must exist: exit 2 otherwise.
fn check_named_gpu(discovery: &Discovery, selection: DeviceSelection) -> Result<()> {
    if let DeviceSelection::One(Device::Cuda(n)) = selection {
        match gpukit_cuda::driver::probe(discovery) {
            Ok(d) if n < d.device_count => {}
            Ok(d) => {
                return Err(UsageError(format!(
                    "device cuda:{n} does not exist: this machine has {} CUDA device(s)",
                    d.device_count
                ))
                .into())
            }
            // no GPU at all is a missing device (exit 1), not a typo (exit 2)
            Err(e) => anyhow::bail!("cuda:{n} was asked for, but no GPU can be used: {e}"),
        }
    }
    Ok(())
}

/// The options `bench matmul` runs with.
fn matmul_options(a: &MatmulArgs) -> MatmulOptions {
    let mut o = MatmulOptions::default();
    if let Some(s) = a.matrix_size.map(|n| vec![n]).or(a.sizes.clone()) {
        o.sizes = s;
    }
    o.dtypes = a.dtype.clone();
    o.selection = a.device;
    o.iterations = a.iterations;
    o.cpu_budget_s = a.cpu_seconds;
    o.init = a.init;
    o.lt_candidates = a.lt_candidates;
    o.rounds = a.turns;
    o
}

fn bench_matmul(a: MatmulArgs, out: &Output) -> Result<()> {
    let discovery = prepare_process();
    check_named_gpu(&discovery, a.device)?;
    if !(a.cpu_seconds > 0.0 && a.cpu_seconds.is_finite()) {
        return Err(UsageError("--cpu-seconds must be a positive number".into()).into());
    }
    let opts = matmul_options(&a);
    let (report, peer) = if a.compare_pytorch {
        let (r, p) =
            gpukit_bench::matmul::run_matmul_with_pytorch(&discovery, &opts, &mut progress());
        (r, Some(p))
    } else {
        (run_matmul(&discovery, &opts, &mut progress()), None)
    };
    emit_matmul(&report, peer, out)
}

fn peer_line(peer: &Option<gpukit_bench::Result<String>>) -> Option<String> {
    match peer {
        Some(Ok(v)) => Some(format!(
            "PyTorch {v} ran the same workloads in this invocation (scripts/pytorch_reference.py)"
        )),
        Some(Err(e)) => Some(format!("PyTorch comparison not available: {e}")),
        None => None,
    }
}

fn emit_matmul(
    report: &MatmulReport,
    peer: Option<gpukit_bench::Result<String>>,
    out: &Output,
) -> Result<()> {
    let doc = serde_json::json!({ "matmul": report, "pytorch": peer_json(&peer) });
    emit(&doc, out, || {
        print!("{}", to_terminal(&matmul_sections(report)));
        if let Some(l) = peer_line(&peer) {
            println!("{l}");
        }
        if matches!(peer, Some(Ok(_))) {
            println!(
                "  turns: gpukit and PyTorch timed each row in {} alternating blocks, so both saw the same clocks; gpukit opened the first half of the rounds (ABBA...) and PyTorch the rest (BAAB...); gpukit / PyTorch is the geometric mean of the two halves' median round ratios (lowest-highest round in brackets)",
                report.rounds
            );
            println!(
                "  GPU rows: {:.1} s of untimed turns first, blocks of at least {:.0} ms, each side over 4 or more operand sets; where both tools ran the same kernel, the ratio still read 0.98-1.05 over two invocations on an H100 (run 56; decisions 35-39)",
                report.soak_ms / 1e3,
                report.turn_ms
            );
        }
        Ok(())
    })?;
    fail_if_wrong(report.rows.iter().map(|r| &r.status))
}

fn peer_json(peer: &Option<gpukit_bench::Result<String>>) -> serde_json::Value {
    match peer {
        Some(Ok(v)) => serde_json::json!({ "torch_version": v }),
        Some(Err(e)) => serde_json::json!({ "error": e.to_string() }),
        None => serde_json::Value::Null,
    }
}

/// A measurement that produced a wrong result makes the command fail (exit 1) after printing.
fn fail_if_wrong<'a>(
    statuses: impl Iterator<Item = &'a gpukit_bench::matmul::RowStatus>,
) -> Result<()> {
    let failed = statuses
        .filter(|s| matches!(s, gpukit_bench::matmul::RowStatus::Failed(_)))
        .count();
    if failed > 0 {
        anyhow::bail!("{failed} row(s) failed (see the table): their figures are not reported");
    }
    Ok(())
}

fn bench_bandwidth(a: BandwidthArgs, out: &Output) -> Result<()> {
    let discovery = prepare_process();
    let ordinal = match a.device {
        Device::Cuda(n) => n,
        Device::Cpu => {
            return Err(UsageError(
                "bench bandwidth measures copies to and from a GPU: use --device cuda:N".into(),
            )
            .into())
        }
    };
    check_named_gpu(&discovery, DeviceSelection::One(a.device))?;
    let mut opts = BandwidthOptions {
        ordinal,
        iterations: a.iterations,
        ..BandwidthOptions::default()
    };
    if let Some(s) = a.sizes {
        opts.sizes_bytes = s;
    }
    let (report, peer) = if a.compare_pytorch {
        let (r, p) = run_bandwidth_with_pytorch(&discovery, &opts, &mut progress());
        (r, Some(p))
    } else {
        (run_bandwidth(&discovery, &opts, &mut progress()), None)
    };
    if let Some(why) = &report.gpu_unavailable {
        anyhow::bail!("bench bandwidth needs a GPU: {why}");
    }
    emit_bandwidth(&report, peer, out)
}

fn emit_bandwidth(
    report: &BandwidthReport,
    peer: Option<gpukit_bench::Result<String>>,
    out: &Output,
) -> Result<()> {
    let doc = serde_json::json!({ "bandwidth": report, "pytorch": peer_json(&peer) });
    emit(&doc, out, || {
        print!("{}", to_terminal(&bandwidth_sections(report)));
        if let Some(l) = peer_line(&peer) {
            println!("{l}");
        }
        if matches!(peer, Some(Ok(_))) {
            println!(
                "  turns: gpukit and PyTorch timed each copy in {} alternating blocks, gpukit opening half of the rounds and PyTorch the rest; gpukit / PyTorch is the geometric mean of the two halves' median round ratios (lowest-highest round in brackets). PyTorch's figure beside the staged path is its own pageable copy",
                report.rounds
            );
        }
        Ok(())
    })?;
    fail_if_wrong(report.rows.iter().map(|r| &r.status))
}

/// How a command's result leaves: tables or JSON on stdout, and optionally a JSON file.
pub struct Output {
    pub json: bool,
    /// `--save-json FILE`.
    pub save_json: Option<std::path::PathBuf>,
}

fn print_json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Writes the command's JSON document where `--save-json` asked, then prints it or the tables.
fn emit<T: Serialize>(value: &T, out: &Output, tables: impl FnOnce() -> Result<()>) -> Result<()> {
    if let Some(path) = &out.save_json {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| UsageError(format!("--save-json {} names no file", path.display())))?;
        write_files_atomically(dir, &[(name, serde_json::to_vec_pretty(value)?)])?;
    }
    if out.json {
        print_json(value)
    } else {
        tables()
    }
}

fn gather_check(discovery: &Discovery, args: &CheckArgs) -> Result<CheckReport> {
    let opts = CheckOptions {
        selection: args.device,
        ask_library_versions: args.library_versions,
        quick: args.quick,
    };
    Ok(run_check(discovery, opts)?)
}

fn warn(report: &CheckReport) {
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
}

fn check(args: CheckArgs, out: &Output) -> Result<()> {
    // --quick opens only NVML, by absolute path: no library needs the loader's path.
    let discovery = if args.quick {
        discover()
    } else {
        prepare_process()
    };
    let report = gather_check(&discovery, &args)?;
    warn(&report);
    emit(&report, out, || {
        println!(
            "gpukit {} (built for CUDA {}: needs a driver with CUDA {} or newer)",
            report.gpukit_version, report.build_cuda, report.build_requires_driver_api
        );
        println!("{}", check_headline(&report));
        print!("{}", to_terminal(&check_sections(&report)));
        Ok(())
    })
}

/// One part of `all` that did not run, and why.
#[derive(Debug, Serialize)]
struct Skipped {
    part: String,
    reason: String,
}

#[derive(Debug, Serialize)]
struct AllReport {
    gpukit_version: String,
    generated_unix_s: u64,
    command_line: Vec<String>,
    check: CheckReport,
    matmul: MatmulReport,
    bandwidth: Option<BandwidthReport>,
    conv: ConvReport,
    infer: Option<gpukit_bench::infer::InferReport>,
    /// `gpukit memory` (fp32, ResNet-50) when a GPU is there.
    memory: Option<gpukit_bench::memory::MemoryReport>,
    /// Seconds each part took.
    seconds: Vec<(String, f64)>,
    skipped: Vec<Skipped>,
    total_seconds: f64,
}

fn all(args: AllArgs, json: bool) -> Result<()> {
    let started = Instant::now();
    let discovery = prepare_process();
    check_named_gpu(&discovery, args.device)?;
    let mut seconds = Vec::new();
    let mut skipped = Vec::new();
    let mut prog = progress();
    let step = |name: &str| eprintln!("[gpukit all] {name}");

    step("check");
    let t = Instant::now();
    let check = gather_check(
        &discovery,
        &CheckArgs {
            device: args.device,
            library_versions: true,
            quick: false,
        },
    )?;
    seconds.push(("check".to_string(), t.elapsed().as_secs_f64()));
    warn(&check);
    let gpu = check.available && args.device != DeviceSelection::One(Device::Cpu);
    if !check.available {
        skipped.push(Skipped {
            part: "GPU rows of bench matmul, bench conv and infer, and all of bench bandwidth"
                .into(),
            reason: check.reason.clone().unwrap_or_default(),
        });
    }

    step("bench matmul");
    let t = Instant::now();
    let mut mopts = MatmulOptions {
        sizes: if args.quick {
            vec![1024, 4096]
        } else {
            vec![1024, 4096, 8192]
        },
        selection: if gpu {
            args.device
        } else {
            DeviceSelection::One(Device::Cpu)
        },
        iterations: if args.quick { 10 } else { 30 },
        cpu_budget_s: if args.quick { 2.0 } else { 5.0 },
        cpu_max_size: Some(if args.quick { 1024 } else { 4096 }),
        ..MatmulOptions::default()
    };
    if !gpu {
        // without a GPU only the CPU runs: keep it to sizes a small machine does in seconds
        mopts.sizes = vec![256, 1024];
        mopts.iterations = 5;
    }
    let matmul = run_matmul(&discovery, &mopts, &mut prog);
    seconds.push(("bench matmul".to_string(), t.elapsed().as_secs_f64()));

    let bandwidth = if gpu {
        step("bench bandwidth");
        let t = Instant::now();
        let ordinal = match args.device {
            DeviceSelection::One(Device::Cuda(n)) => n,
            _ => 0,
        };
        let bopts = BandwidthOptions {
            ordinal,
            sizes_bytes: if args.quick {
                vec![4 << 10, 16 << 20]
            } else {
                vec![4 << 10, 1 << 20, 64 << 20, 1 << 30]
            },
            iterations: if args.quick { 5 } else { 10 },
            ..BandwidthOptions::default()
        };
        let b = run_bandwidth(&discovery, &bopts, &mut prog);
        seconds.push(("bench bandwidth".to_string(), t.elapsed().as_secs_f64()));
        Some(b)
    } else {
        None
    };

    step("bench conv");
    let t = Instant::now();
    let copts = ConvOptions {
        batch: if !gpu {
            2
        } else if args.quick {
            8
        } else {
            32
        },
        ordinal: if gpu {
            match args.device {
                DeviceSelection::One(Device::Cuda(n)) => Some(n),
                _ => Some(0),
            }
        } else {
            None
        },
        iterations: if args.quick || !gpu { 3 } else { 20 },
        cpu_budget_s: if args.quick || !gpu { 1.0 } else { 3.0 },
        ..ConvOptions::default()
    };
    let conv = run_conv(&discovery, &resnet50_shapes(copts.batch), &copts, &mut prog);
    seconds.push(("bench conv".to_string(), t.elapsed().as_secs_f64()));

    step("infer");
    let t = Instant::now();
    let iopts = {
        use gpukit_bench::infer::InferStrategy;
        use gpukit_models::gpu::Strategy;
        let strategies = if gpu && args.quick {
            let mut v = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
            v.extend(
                ["fp32", "fp16-nhwc", "fp16-nhwc-graph"]
                    .iter()
                    .filter_map(|s| Strategy::parse(s).ok())
                    .map(InferStrategy::Gpu),
            );
            v
        } else {
            InferStrategy::defaults()
        };
        gpukit_bench::infer::InferOptions {
            model: gpukit_models::ResNet::R50,
            batch_sizes: match (gpu, args.quick) {
                (false, _) => vec![1],
                (true, true) => vec![1, 32],
                (true, false) => vec![1, 8, 32],
            },
            iterations: if args.quick { 2 } else { 5 },
            weights: None,
            image_size: 224,
            budget_s: 5.0,
            selection: if gpu {
                args.device
            } else {
                DeviceSelection::One(Device::Cpu)
            },
            strategies,
            gpu_iterations: if args.quick { 20 } else { 50 },
            // the CPU rows at large batches take minutes: the GPU rows' comparison is enough
            cpu_max_batch: Some(if args.quick { 1 } else { 8 }),
        }
    };
    let infer = match gpukit_bench::infer::run_infer(&discovery, &iopts, &mut prog) {
        Ok(r) => {
            let gpu_skipped = r
                .gpu_unavailable
                .clone()
                .or_else(|| gpukit_bench::infer::gpu_rows_without_figure(&r));
            if let Some(reason) = gpu_skipped {
                skipped.push(Skipped {
                    part: "infer's GPU rows".into(),
                    reason,
                });
            }
            Some(r)
        }
        Err(e) => {
            skipped.push(Skipped {
                part: "infer".into(),
                reason: e.to_string(),
            });
            None
        }
    };
    seconds.push(("infer".to_string(), t.elapsed().as_secs_f64()));

    let memory = if gpu {
        step("memory");
        let t = Instant::now();
        let mopts = gpukit_bench::memory::MemoryOptions {
            model: gpukit_models::ResNet::R50,
            batch_sizes: if args.quick {
                vec![16, 64]
            } else {
                vec![16, 32, 64, 128]
            },
            dtype: gpukit_tensor::DType::F32,
            layout: Layout::Nchw,
            image_size: 224,
            weights: None,
            ordinal: match args.device {
                DeviceSelection::One(Device::Cuda(n)) => n,
                _ => 0,
            },
            memory_fraction: None,
            on_oom_halve: true,
            find_max_batch: !args.quick,
            max_workspace_bytes: None,
        };
        let m = match gpukit_bench::memory::run_memory(&discovery, &mopts, &mut prog) {
            Ok(m) => Some(m),
            Err(e) => {
                skipped.push(Skipped {
                    part: "memory".into(),
                    reason: e.to_string(),
                });
                None
            }
        };
        seconds.push(("memory".to_string(), t.elapsed().as_secs_f64()));
        m
    } else {
        skipped.push(Skipped {
            part: "memory".into(),
            reason: "it needs a GPU".into(),
        });
        None
    };

    let report = AllReport {
        gpukit_version: check.gpukit_version.clone(),
        generated_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command_line: std::env::args().collect(),
        check,
        matmul,
        bandwidth,
        conv,
        infer,
        memory,
        seconds,
        skipped,
        total_seconds: started.elapsed().as_secs_f64(),
    };
    let json_bytes = serde_json::to_vec_pretty(&report).context("serializing the report")?;
    let md = report_markdown(&report);
    write_files_atomically(
        &args.out,
        &[("report.json", json_bytes), ("report.md", md.into_bytes())],
    )?;
    if json {
        print_json(&report)?;
    } else {
        println!("{}", check_headline(&report.check));
        for s in &report.skipped {
            println!("skipped {}: {}", s.part, s.reason);
        }
        println!(
            "wrote {} and {} in {:.1} s",
            args.out.join("report.json").display(),
            args.out.join("report.md").display(),
            report.total_seconds
        );
    }
    let statuses = report
        .matmul
        .rows
        .iter()
        .map(|r| &r.status)
        .chain(
            report
                .bandwidth
                .iter()
                .flat_map(|b| b.rows.iter().map(|r| &r.status)),
        )
        .chain(report.conv.rows.iter().map(|r| &r.status))
        .chain(
            report
                .infer
                .iter()
                .flat_map(|i| i.rows.iter().map(|r| &r.status)),
        );
    fail_if_wrong(statuses)
}

fn report_markdown(r: &AllReport) -> String {
    let mut md = format!(
        "# gpukit report\n\ngpukit {} · `{}` · {:.1} s ({})\n\n## Check\n\n{}\n",
        r.gpukit_version,
        r.command_line.join(" "),
        r.total_seconds,
        r.seconds
            .iter()
            .map(|(n, s)| format!("{n} {s:.1} s"))
            .collect::<Vec<_>>()
            .join(", "),
        check_headline(&r.check)
    );
    md.push_str(&to_markdown(&check_sections(&r.check), 3));
    md.push_str("\n## Matrix multiply\n");
    md.push_str(&to_markdown(&matmul_sections(&r.matmul), 3));
    if let Some(b) = &r.bandwidth {
        md.push_str("\n## Data transfer\n");
        md.push_str(&to_markdown(&bandwidth_sections(b), 3));
    }
    md.push_str("\n## Convolution\n");
    md.push_str(&to_markdown(&conv_sections(&r.conv), 3));
    if let Some(i) = &r.infer {
        md.push_str("\n## Inference\n");
        md.push_str(&to_markdown(&crate::render::infer_sections(i), 3));
    }
    if let Some(m) = &r.memory {
        md.push_str("\n## GPU memory\n");
        md.push_str(&to_markdown(&crate::render::memory_sections(m), 3));
    }
    if !r.skipped.is_empty() {
        md.push_str("\n## Skipped\n\n");
        for s in &r.skipped {
            md.push_str(&format!("- {}: {}\n", s.part, s.reason));
        }
    }
    md
}

fn bench_conv(a: ConvArgs, out: &Output) -> Result<()> {
    let discovery = prepare_process();
    check_named_gpu(&discovery, a.device)?;
    if let Some(bad) = a.dtype.iter().find(|d| {
        !matches!(
            d,
            gpukit_tensor::DType::F32 | gpukit_tensor::DType::Tf32 | gpukit_tensor::DType::F16
        )
    }) {
        return Err(UsageError(format!(
            "bench conv runs f32, tf32 and f16; {bad} is not one of them"
        ))
        .into());
    }
    let opts = ConvOptions {
        batch: a.batch,
        dtypes: a.dtype.clone(),
        layouts: a
            .layout
            .iter()
            .map(|l| match l {
                LayoutArg::Nchw => Layout::Nchw,
                LayoutArg::Nhwc => Layout::Nhwc,
            })
            .collect(),
        ordinal: match a.device {
            DeviceSelection::All => Some(0),
            DeviceSelection::One(Device::Cuda(n)) => Some(n),
            DeviceSelection::One(Device::Cpu) => None,
        },
        cpu: a.device != DeviceSelection::One(Device::Cuda(0))
            && !matches!(a.device, DeviceSelection::One(Device::Cuda(_))),
        iterations: a.iterations,
        ..ConvOptions::default()
    };
    let shapes = resnet50_shapes(opts.batch);
    let mut report = run_conv(&discovery, &shapes, &opts, &mut progress());
    let peer = a
        .compare_pytorch
        .then(|| gpukit_bench::conv::compare_with_pytorch(&mut report, &shapes, &opts));
    emit_conv(&report, peer, out)
}

fn emit_conv(
    report: &ConvReport,
    peer: Option<gpukit_bench::Result<String>>,
    out: &Output,
) -> Result<()> {
    let doc = serde_json::json!({ "conv": report, "pytorch": peer_json(&peer) });
    emit(&doc, out, || {
        print!("{}", to_terminal(&conv_sections(report)));
        if let Some(l) = peer_line(&peer) {
            println!("{l}");
        }
        Ok(())
    })?;
    fail_if_wrong(report.rows.iter().map(|r| &r.status))
}

fn memory(a: crate::cli::MemoryArgs, out: &Output) -> Result<()> {
    use gpukit_bench::memory::{run_memory, MemoryOptions};
    let ordinal = match a.device {
        Device::Cuda(n) => n,
        Device::Cpu => {
            return Err(UsageError(
                "gpukit memory measures GPU memory: --device must be cuda:N".into(),
            )
            .into())
        }
    };
    let discovery = prepare_process();
    check_named_gpu(&discovery, DeviceSelection::One(a.device))?;
    let layout = match a.layout.as_deref() {
        Some("nhwc") => Layout::Nhwc,
        Some(_) => Layout::Nchw,
        None if a.precision.size_bytes() == 2 => Layout::Nhwc,
        None => Layout::Nchw,
    };
    let opts = MemoryOptions {
        model: a.model_name,
        batch_sizes: a.batch_sizes.clone(),
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
    let report = run_memory(&discovery, &opts, &mut progress())?;
    emit(&report, out, || {
        print!("{}", to_terminal(&crate::render::memory_sections(&report)));
        Ok(())
    })?;
    if report
        .max_batch
        .as_ref()
        .is_some_and(|m| !m.back_to_baseline)
    {
        anyhow::bail!(
            "memory leaked during --find-max-batch: the pool did not return to its baseline"
        );
    }
    fail_if_wrong(report.rows.iter().map(|r| &r.status))
}

fn infer(a: InferArgs, out: &Output) -> Result<()> {
    use gpukit_bench::infer::{
        compare_with_pytorch, gpu_rows_without_figure, run_infer, select_strategies, InferOptions,
    };
    let strategies = select_strategies(a.strategies.as_deref(), a.device)?;
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
    let opts = InferOptions {
        model: a.model_name,
        batch_sizes: a.batch_sizes.clone(),
        iterations: a.iterations,
        weights: a.weights.clone(),
        image_size: a.image_size,
        budget_s: 10.0,
        selection: a.device,
        strategies,
        gpu_iterations: a.gpu_iterations,
        cpu_max_batch: None,
    };
    if let Some(input) = &a.input {
        let run = gpukit_bench::infer::io::run_on_input(
            &discovery,
            &opts,
            input,
            a.save_output.as_deref(),
            &mut progress(),
        )?;
        return emit(&run, out, || {
            print!("{}", to_terminal(&[crate::render::input_run_section(&run)]));
            Ok(())
        });
    }
    let mut report = run_infer(&discovery, &opts, &mut progress())?;
    if let (Some(n), Some(why)) = (a.device.named_cuda(), &report.gpu_unavailable) {
        anyhow::bail!("infer on cuda:{n} cannot run: {why}");
    }
    if report.rows.is_empty() {
        let why: Vec<String> = [
            report.gpu_unavailable.as_ref().map(|w| format!("GPU: {w}")),
            report
                .onnxruntime_unavailable
                .as_ref()
                .map(|w| format!("ONNX Runtime: {w}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        anyhow::bail!("no strategy could run: {}", why.join("; "));
    }
    let peer = a
        .compare_pytorch
        .then(|| compare_with_pytorch(&mut report, &opts));
    emit(&report, out, || {
        print!("{}", to_terminal(&crate::render::infer_sections(&report)));
        if let Some(l) = peer_line(&peer) {
            println!("{l}");
        }
        Ok(())
    })?;
    fail_if_wrong(report.rows.iter().map(|r| &r.status))?;
    match gpu_rows_without_figure(&report) {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}
