//! The `gpukit` binary: parses the command line, runs a command from the bench crate and renders
//! its result (tables on stdout, or one JSON document with `--json`). No measuring lives here.

#![forbid(unsafe_code)]

mod cli;
mod commands;
mod render;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    gpukit_cuda::trace::mark_process_start();
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => {
            // clap prints help/version on stdout (exit 0) and usage errors on stderr (exit 2)
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let started = gpukit_cuda::trace::start();
    let result = commands::run(args);
    gpukit_cuda::trace::done("total in this process", started);
    gpukit_cuda::trace::done_since_process_start(
        "total since the first process started (re-exec included)",
    );
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The one place where a failure becomes an exit code: 2 for bad usage or bad input, 1 for the
/// rest (a missing GPU or library, a failed measurement). The kind comes from the first typed
/// error in the chain.
fn exit_code(e: &anyhow::Error) -> u8 {
    use gpukit_types::{ErrorKind, HasKind};
    let kind = e.chain().find_map(|cause| {
        let bench = cause
            .downcast_ref::<gpukit_bench::Error>()
            .map(HasKind::kind);
        let models = || {
            cause
                .downcast_ref::<gpukit_models::Error>()
                .map(HasKind::kind)
        };
        let tensor = || {
            cause
                .downcast_ref::<gpukit_tensor::Error>()
                .map(HasKind::kind)
        };
        let cuda = || {
            cause
                .downcast_ref::<gpukit_cuda::Error>()
                .map(HasKind::kind)
        };
        bench.or_else(models).or_else(tensor).or_else(cuda)
    });
    kind.unwrap_or(ErrorKind::Failed).exit_code()
}
