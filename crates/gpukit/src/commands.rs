//! One function per command: run the bench crate's code, then render or write its result.

use crate::cli::{AllArgs, CheckArgs, Cli, Command};
use crate::render::{check_headline, check_sections, to_markdown, to_terminal};
use crate::write::write_files_atomically;
use crate::UsageError;
use anyhow::{Context, Result};
use gpukit_bench::check::{run_check, CheckError, CheckOptions, CheckReport};
use gpukit_cuda::loader::{discover, prepare_process, Discovery};
use serde::Serialize;
use std::time::Instant;

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Check(a) => check(a, cli.json),
        Command::All(a) => all(a, cli.json),
    }
}

fn print_json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn gather_check(discovery: &Discovery, args: &CheckArgs) -> Result<CheckReport> {
    let opts = CheckOptions {
        selection: args.device,
        ask_library_versions: args.library_versions,
        quick: args.quick,
    };
    run_check(discovery, opts).map_err(|e| match e {
        CheckError::NoSuchDevice(m) => UsageError(m).into(),
    })
}

fn warn(report: &CheckReport) {
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
}

fn check(args: CheckArgs, json: bool) -> Result<()> {
    // --quick opens only NVML, by absolute path: no library needs the loader's path.
    let discovery = if args.quick {
        discover()
    } else {
        prepare_process()
    };
    let report = gather_check(&discovery, &args)?;
    warn(&report);
    if json {
        return print_json(&report);
    }
    println!(
        "gpukit {} (built for CUDA {}: needs a driver with CUDA {} or newer)",
        report.gpukit_version, report.build_cuda, report.build_requires_driver_api
    );
    println!("{}", check_headline(&report));
    print!("{}", to_terminal(&check_sections(&report)));
    Ok(())
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
    check_seconds: f64,
    skipped: Vec<Skipped>,
    total_seconds: f64,
}

fn all(args: AllArgs, json: bool) -> Result<()> {
    let started = Instant::now();
    let discovery = prepare_process();
    eprintln!("[1/1] check");
    let t = Instant::now();
    let check = gather_check(
        &discovery,
        &CheckArgs {
            device: args.device,
            library_versions: true,
            quick: false,
        },
    )?;
    let check_seconds = t.elapsed().as_secs_f64();
    warn(&check);
    let mut skipped = Vec::new();
    if !check.available {
        skipped.push(Skipped {
            part: "GPU sections of check".into(),
            reason: check.reason.clone().unwrap_or_default(),
        });
    }
    let report = AllReport {
        gpukit_version: check.gpukit_version.clone(),
        generated_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command_line: std::env::args().collect(),
        check,
        check_seconds,
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
            "wrote {} and {} in {:.2} s",
            args.out.join("report.json").display(),
            args.out.join("report.md").display(),
            report.total_seconds
        );
    }
    Ok(())
}

fn report_markdown(r: &AllReport) -> String {
    let mut md = format!(
        "# gpukit report\n\ngpukit {} · `{}` · {:.2} s\n\n## Check\n\n{}\n",
        r.gpukit_version,
        r.command_line.join(" "),
        r.total_seconds,
        check_headline(&r.check)
    );
    md.push_str(&to_markdown(&check_sections(&r.check), 3));
    if !r.skipped.is_empty() {
        md.push_str("\n## Skipped\n\n");
        for s in &r.skipped {
            md.push_str(&format!("- {}: {}\n", s.part, s.reason));
        }
    }
    md
}
