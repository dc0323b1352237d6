//! What the binary's test files share: finding the binary (GPUKIT_BIN overrides it: the staged
//! copy on the GPU machine), running it, checks with messages that name the command, and the
//! runner that gives each test its machine kind.

// each test file uses some of these
#![allow(dead_code)]

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

pub fn bin() -> PathBuf {
    std::env::var_os("GPUKIT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpukit")))
}

pub fn gpukit(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run gpukit")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// An error unless the process exited with `code`; names the command and its stderr.
pub fn exited(out: &Output, code: i32, args: &[&str]) -> Result<(), Failed> {
    ensure(out.status.code() == Some(code), || {
        format!(
            "{args:?}: exit {:?}, wanted {code}; stderr: {}",
            out.status.code(),
            text(&out.stderr)
        )
    })?;
    ensure(!text(&out.stderr).contains("panicked"), || {
        format!("{args:?} panicked: {}", text(&out.stderr))
    })
}

/// Runs gpukit with `--json`, expects exit `code` and returns the document (the envelope).
pub fn document(args: &[&str], code: i32) -> Result<Value, Failed> {
    let mut all = args.to_vec();
    all.push("--json");
    let out = gpukit(&all);
    exited(&out, code, &all)?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{all:?}: stdout is not one JSON document: {e}"))?;
    for key in [
        "gpukit_version",
        "command",
        "ok",
        "failure",
        "notes",
        "pytorch",
        "result",
    ] {
        ensure(doc.get(key).is_some(), || format!("{key} missing: {doc}"))?;
    }
    ensure(doc["gpukit_version"] == env!("CARGO_PKG_VERSION"), || {
        format!("{doc}")
    })?;
    ensure(doc["ok"] == (code == 0), || {
        format!("ok must follow the exit code: {doc}")
    })?;
    Ok(doc)
}

/// A test of the binary.
pub type Test = fn() -> Result<(), Failed>;

/// Runs `any` everywhere, `no_gpu` only where no GPU is usable and `gpu` only where one is
/// (each reported as ignored, with the reason, elsewhere; GPUKIT_REQUIRE_GPU=1 turns "no GPU"
/// into a failure), and `more` as they come.
pub fn run_kinds(
    any: Vec<(&'static str, Test)>,
    no_gpu: Vec<(&'static str, Test)>,
    gpu: Vec<(&'static str, Test)>,
    more: Vec<Trial>,
) -> ! {
    let (_discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    let args = Arguments::from_args();
    if skip.is_none() && !no_gpu.is_empty() {
        eprintln!("no_gpu:: tests ignored: this machine has a usable GPU");
    }
    let mut trials: Vec<Trial> = any
        .into_iter()
        .map(|(name, f)| Trial::test(name, f))
        .collect();
    trials.extend(
        no_gpu
            .into_iter()
            .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_none())),
    );
    trials.extend(
        gpu.into_iter()
            .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some())),
    );
    trials.extend(more);
    libtest_mimic::run(&args, trials).exit()
}
