//! The `gpukit` binary: parses the command line, runs a command from the bench crate and renders
//! its result (tables on stdout, or one JSON document with `--json`). No measuring lives here.

#![forbid(unsafe_code)]

mod cli;
mod commands;
mod monitor_cmd;
mod output;
mod render;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    gpukit_cuda::trace::mark_process_start();
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) if e.kind() == clap::error::ErrorKind::InvalidUtf8 => {
            // clap does not say which value; gpukit does
            eprintln!("error: {}", not_utf8(std::env::args_os()));
            return ExitCode::from(2);
        }
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
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            exit_code(&e)
        }
    };
    // the CUDA libraries' exit handlers took a fifth of a second after every GPU command;
    // everything gpukit opened is closed by now
    gpukit_cuda::exit::now(code)
}

/// The error and its causes, joined with ": ", each cause said once: a cause whose text the
/// message already holds (an error that prints its source and also names it as its source)
/// is not repeated.
fn message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Which argument is not UTF-8, and the flag it belongs to: "the value of --dtype is not valid
/// UTF-8 ('f\u{fffd}16')". Paths may be any bytes; names, numbers and dtypes may not.
fn not_utf8(args: impl Iterator<Item = std::ffi::OsString>) -> String {
    let args: Vec<std::ffi::OsString> = args.collect();
    let Some(at) = args.iter().position(|a| a.to_str().is_none()) else {
        return "an argument is not valid UTF-8".to_string();
    };
    let shown = gpukit_types::shown(&args[at].to_string_lossy());
    match args[..at]
        .last()
        .and_then(|f| f.to_str())
        .filter(|f| f.starts_with("--"))
    {
        Some(flag) => format!("the value of {flag} is not valid UTF-8 ('{shown}')"),
        None => format!("argument '{shown}' is not valid UTF-8"),
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
        let dist = || {
            cause
                .downcast_ref::<gpukit_ranks::Error>()
                .map(HasKind::kind)
        };
        bench
            .or_else(models)
            .or_else(tensor)
            .or_else(cuda)
            .or_else(dist)
    });
    kind.unwrap_or(ErrorKind::Failed).exit_code()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    /// An error that prints its source and also returns it as its source.
    #[derive(Debug)]
    struct Both {
        source: std::io::Error,
    }

    impl std::fmt::Display for Both {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot be read: {}", self.source)
        }
    }

    impl std::error::Error for Both {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_is_said_once() {
        let os = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Both { source: os }).context("weights file x.safetensors");
        assert_eq!(
            super::message(&e),
            "weights file x.safetensors: cannot be read: entity not found"
        );
        let plain = anyhow::anyhow!("a").context("b");
        assert_eq!(super::message(&plain), "b: a");
    }

    #[test]
    fn the_value_that_is_not_utf8_is_named_with_its_flag() {
        let bad = OsString::from_vec(vec![b'f', 0xff, b'1', b'6']);
        let args = ["gpukit", "bench", "matmul", "--dtype"].map(OsString::from);
        let mut v: Vec<OsString> = args.to_vec();
        v.push(bad.clone());
        assert_eq!(
            super::not_utf8(v.into_iter()),
            "the value of --dtype is not valid UTF-8 ('f\u{fffd}16')"
        );
        let v = vec![OsString::from("gpukit"), bad];
        assert!(super::not_utf8(v.into_iter()).starts_with("argument 'f"));
    }
}
