//! PyTorch as a peer: runs scripts/pytorch_reference.py (embedded in the binary, so it works from
//! any directory) with the python3 on PATH, in the same invocation as gpukit's own run.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The reference script, as shipped in the repository.
pub const SCRIPT: &str = include_str!("../../../scripts/pytorch_reference.py");

/// What the script answered: its `results` rows, and the versions it ran with.
#[derive(Debug, Clone)]
pub struct PeerRun {
    pub torch_version: String,
    pub device_name: Option<String>,
    pub results: Vec<Value>,
    /// The whole JSON document (fields beyond the common ones).
    pub document: Value,
}

/// Runs the script with `args` (a subcommand and its flags). The error is one line a person can
/// act on: no python3, no torch, or what the script reported.
pub fn run_pytorch(args: &[String]) -> Result<PeerRun, String> {
    let python = std::env::var_os("GPUKIT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let script = std::env::temp_dir().join(format!(
        "gpukit-pytorch-reference-{}.py",
        std::process::id()
    ));
    std::fs::write(&script, SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let out = Command::new(&python).arg(&script).args(args).output();
    let _ = std::fs::remove_file(&script);
    let out = out.map_err(|e| {
        format!(
            "cannot run {}: {e} (install Python 3 and PyTorch to compare)",
            python.display()
        )
    })?;
    let doc: Value = serde_json::from_slice(&out.stdout).map_err(|_| {
        let err = String::from_utf8_lossy(&out.stderr);
        format!(
            "the PyTorch reference printed no JSON (exit {:?}): {}",
            out.status.code(),
            err.lines().last().unwrap_or("")
        )
    })?;
    if doc["ok"] != Value::Bool(true) {
        return Err(doc["error"]
            .as_str()
            .unwrap_or("PyTorch reference failed")
            .to_string());
    }
    Ok(PeerRun {
        torch_version: doc["torch_version"].as_str().unwrap_or("?").to_string(),
        device_name: doc["device_name"].as_str().map(str::to_string),
        results: doc["results"].as_array().cloned().unwrap_or_default(),
        document: doc,
    })
}

/// Joins numbers with commas, as the script's list flags take them.
pub fn csv<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_is_embedded_and_has_the_subcommands() {
        for sub in ["matmul", "bandwidth", "conv"] {
            assert!(SCRIPT.contains(sub), "{sub}");
        }
    }

    #[test]
    fn a_missing_interpreter_is_a_message_not_a_panic() {
        std::env::set_var("GPUKIT_PYTHON", "/nonexistent/python3");
        let e = run_pytorch(&["matmul".into()]).unwrap_err();
        std::env::remove_var("GPUKIT_PYTHON");
        assert!(e.contains("/nonexistent/python3"), "{e}");
    }

    #[test]
    fn csv_joins() {
        assert_eq!(csv(&[1, 2, 3]), "1,2,3");
    }
}
