//! The layering rule, checked on the source: a command module uses the harness and the
//! workloads, never another command's module; a workload uses no command; `all` knows no
//! command (it runs the parts `crate::parts` lists).

use std::path::{Path, PathBuf};

/// Every command module of this crate.
const COMMANDS: [&str; 15] = [
    "all",
    "bandwidth",
    "check",
    "compare",
    "conv",
    "infer",
    "lessons",
    "matmul",
    "memory",
    "monitor",
    "nccl",
    "p2p",
    "profile",
    "stress",
    "train",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The Rust files of module `name` (`name.rs` and everything under `name/`).
fn files_of(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let file = dir.join(format!("{name}.rs"));
    if file.is_file() {
        out.push(file);
    }
    let mut stack = vec![dir.join(name)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The modules of this crate a file names as `crate::NAME`.
fn crate_paths(text: &str) -> Vec<String> {
    text.match_indices("crate::")
        .filter(|(i, _)| {
            // `gpukit_crate::` or `some_crate::` is another crate, not this one
            !text[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(i, m)| {
            text[i + m.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// `(file, command)` for every use of a command module by a module that may not use it.
fn violations() -> Vec<(PathBuf, String)> {
    let dir = src();
    let mut out = Vec::new();
    let mut owners: Vec<(String, Vec<PathBuf>)> = COMMANDS
        .iter()
        .map(|c| (c.to_string(), files_of(&dir, c)))
        .collect();
    owners.push(("workload".into(), files_of(&dir, "workload")));
    for (owner, files) in owners {
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for used in crate_paths(&text) {
                if used != owner && COMMANDS.contains(&used.as_str()) {
                    out.push((f.clone(), used));
                }
            }
        }
    }
    out
}

#[test]
fn every_command_module_exists() {
    for c in COMMANDS {
        assert!(!files_of(&src(), c).is_empty(), "{c} has no source");
    }
}

#[test]
fn no_command_or_workload_uses_a_command() {
    let v = violations();
    assert!(v.is_empty(), "a module uses a command's module: {v:?}");
}

#[test]
fn the_scan_sees_a_use_of_a_command() {
    assert_eq!(
        crate_paths("use crate::matmul::x; gpukit_crate::no; crate::gpu"),
        vec!["matmul".to_string(), "gpu".to_string()]
    );
}
