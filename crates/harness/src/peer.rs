//! PyTorch as a peer: runs scripts/pytorch_reference.py (embedded in the binary, so it works from
//! any directory) with the python3 on PATH, in the same invocation as gpukit's own run.

use crate::error::{Error, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

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

fn python() -> PathBuf {
    std::env::var_os("GPUKIT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The script written to a temporary file (python needs a path), removed when dropped.
struct ScriptFile(PathBuf);

impl ScriptFile {
    fn write(tag: &str) -> Result<ScriptFile> {
        Self::write_text(tag, SCRIPT)
    }

    fn write_text(tag: &str, text: &str) -> Result<ScriptFile> {
        let path = std::env::temp_dir().join(format!(
            "gpukit-pytorch-reference-{}-{tag}.py",
            std::process::id()
        ));
        std::fs::write(&path, text).map_err(|source| Error::Io {
            what: "the PyTorch reference script",
            path: path.clone(),
            source,
        })?;
        Ok(ScriptFile(path))
    }
}

impl Drop for ScriptFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cannot_run(python: &std::path::Path, e: std::io::Error) -> Error {
    Error::Peer(format!(
        "cannot run {}: {e} (install Python 3 and PyTorch to compare)",
        python.display()
    ))
}

/// A document of the script's, or the error it reports (`"ok": false`).
fn succeeded(doc: Value) -> Result<Value> {
    if doc["ok"] == Value::Bool(true) {
        Ok(doc)
    } else {
        Err(Error::Peer(
            doc["error"]
                .as_str()
                .unwrap_or("PyTorch reference failed")
                .to_string(),
        ))
    }
}

/// The torch version the Python of `--compare-pytorch` imports, or the one-line reason it
/// cannot: asked before a command's own work, so a missing PyTorch is said at once rather
/// than after minutes of gpukit's side.
pub fn torch_version() -> Result<String> {
    let python = python();
    let out = Command::new(&python)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map_err(|e| cannot_run(&python, e))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(Error::Peer(format!(
        "PyTorch is not installed ({}); install it with 'pip install torch'",
        err.lines().last().unwrap_or("import torch failed").trim()
    )))
}

/// Runs the script with `args` (a subcommand and its flags). The error is one line a person can
/// act on: no python3, no torch, or what the script reported.
pub fn run_pytorch(args: &[String]) -> Result<PeerRun> {
    run_script("run", SCRIPT, args)
}

/// As [`run_pytorch`], for another of the repository's PyTorch scripts (its text embedded in
/// the binary); `tag` names its temporary file.
pub fn run_script(tag: &str, text: &str, args: &[String]) -> Result<PeerRun> {
    let python = python();
    let script = ScriptFile::write_text(tag, text)?;
    let out = Command::new(&python).arg(&script.0).args(args).output();
    drop(script);
    let out = out.map_err(|e| cannot_run(&python, e))?;
    let doc: Value = serde_json::from_slice(&out.stdout).map_err(|_| {
        let err = String::from_utf8_lossy(&out.stderr);
        Error::Peer(format!(
            "the PyTorch reference printed no JSON (exit {:?}): {}",
            out.status.code(),
            err.lines().last().unwrap_or("")
        ))
    })?;
    let doc = succeeded(doc)?;
    Ok(PeerRun {
        torch_version: doc["torch_version"]
            .as_str()
            .or(doc["torch"].as_str())
            .unwrap_or("?")
            .to_string(),
        device_name: doc["device_name"].as_str().map(str::to_string),
        results: doc["results"].as_array().cloned().unwrap_or_default(),
        document: doc,
    })
}

/// The script's `serve` mode: one long-lived PyTorch process that times blocks on request, so
/// gpukit can take turns with it on the same chip (see `harness::interleave`).
pub struct PeerServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The last line PyTorch wrote to stderr (for a message when it dies), and the thread
    /// reading it.
    last_err: Arc<Mutex<String>>,
    err_reader: Option<std::thread::JoinHandle<()>>,
    _script: ScriptFile,
    pub torch_version: String,
    pub device_name: Option<String>,
}

/// What a run with PyTorch taking turns says about PyTorch: its version, and the rows it gave
/// no figure for (how many, and the first one's reason).
pub fn outcome_line(version: String, missed: &[String]) -> String {
    match missed.first() {
        None => version,
        Some(first) => format!(
            "{version}; no PyTorch figure for {} row(s), first: {first}",
            missed.len()
        ),
    }
}

impl PeerServer {
    /// The server process's id (its GPU work is part of a comparison, not a stranger's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `pytorch_reference.py serve --device DEVICE` and waits for its ready line.
    pub fn start(device: &str, threads: Option<usize>) -> Result<PeerServer> {
        PeerServer::start_with(python(), device, threads)
    }

    /// [`PeerServer::start`] with this interpreter (a chosen python3, or a stand-in in tests).
    pub fn start_with(python: PathBuf, device: &str, threads: Option<usize>) -> Result<PeerServer> {
        let script = ScriptFile::write(device)?;
        let mut cmd = Command::new(&python);
        cmd.arg(&script.0).args(["serve", "--device", device]);
        if let Some(t) = threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| cannot_run(&python, e))?;
        let last_err = Arc::new(Mutex::new(String::new()));
        let err_reader = child.stderr.take().map(|err| {
            let last = Arc::clone(&last_err);
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if !line.trim().is_empty() {
                        if let Ok(mut l) = last.lock() {
                            *l = line;
                        }
                    }
                }
            })
        });
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(Error::Peer(
                "the PyTorch reference's pipes could not be opened".into(),
            ));
        };
        let mut server = PeerServer {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            last_err,
            err_reader,
            _script: script,
            torch_version: String::new(),
            device_name: None,
        };
        let ready = server.read_reply()?;
        server.torch_version = ready["torch_version"].as_str().unwrap_or("?").to_string();
        server.device_name = ready["device_name"].as_str().map(str::to_string);
        Ok(server)
    }

    fn read_reply(&mut self) -> Result<Value> {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line);
        if matches!(read, Ok(0) | Err(_)) {
            // the process is gone or going: let the stderr reader catch its last words (it
            // ends when stderr closes; a second at most)
            for _ in 0..50 {
                if self.err_reader.as_ref().is_none_or(|h| h.is_finished()) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let why = self.last_err.lock().map(|l| l.clone()).unwrap_or_default();
            return Err(Error::Peer(format!(
                "the PyTorch reference stopped answering: {why}"
            )));
        }
        let doc: Value = serde_json::from_str(&line).map_err(|_| {
            Error::Peer(format!(
                "the PyTorch reference answered something else: {}",
                line.trim()
            ))
        })?;
        succeeded(doc)
    }

    /// One timed block of `torch.matmul` on square `size` operands: samples in ms.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_block(
        &mut self,
        device: &str,
        dtype: &str,
        size: usize,
        init: &str,
        warmup: usize,
        reps: usize,
        budget_s: f64,
    ) -> Result<Vec<f64>> {
        self.block(
            json!({"op": "matmul", "device": device, "dtype": dtype, "size": size,
            "init": init, "warmup": warmup, "iterations": reps,
            "budget_s": if budget_s.is_finite() { budget_s } else { 1e9 }}),
        )
    }

    /// One timed block of a copy of `bytes` (`kind` as in `bench_bandwidth`'s rows: "h2d_pinned",
    /// "d2d", ...), checked against its source afterwards: samples in ms.
    pub fn copy_block(
        &mut self,
        kind: &str,
        bytes: usize,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        self.block(
            json!({"op": "copy", "kind": kind, "bytes": bytes, "warmup": warmup,
            "iterations": reps}),
        )
    }

    /// One timed block of `conv2d` on `shape` (the script's `NxCxHxW:KxRxS:s<stride>p<pad>`)
    /// with cudnn.benchmark on: samples in ms per convolution. With `graph` above 0, each
    /// repetition replays a CUDA graph of `graph` convolutions (the sample is its time over
    /// `graph`); with 0, each is one eager call.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_block(
        &mut self,
        shape: &str,
        dtype: &str,
        layout: &str,
        warmup: usize,
        reps: usize,
        graph: usize,
    ) -> Result<Vec<f64>> {
        self.block(
            json!({"op": "conv", "shape": shape, "dtype": dtype, "layout": layout,
            "warmup": warmup, "iterations": reps, "graph": graph}),
        )
    }

    fn block(&mut self, req: Value) -> Result<Vec<f64>> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::Peer("the PyTorch reference is closed".into()))?;
        writeln!(stdin, "{req}")
            .and_then(|_| stdin.flush())
            .map_err(|e| Error::Peer(format!("cannot reach the PyTorch reference: {e}")))?;
        let doc = self.read_reply()?;
        doc["times_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<_>>())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Error::Peer("the PyTorch reference returned no times".into()))
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        // closing stdin ends the serve loop; a server that hangs is killed
        drop(self.stdin.take());
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Joins numbers with commas, as the script's list flags take them.
pub fn csv<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A stand-in for the PyTorch peer in tests of the commands that take turns with it (the
/// `testing` feature; never in a release build's code path).
#[cfg(feature = "testing")]
pub mod fake {
    use std::path::PathBuf;

    /// A stand-in for python3 that ignores the script and speaks the serve protocol: times
    /// [1.5, 2.5] for every request, an error for bf16. Unix only (a shell script).
    #[cfg(unix)]
    pub fn fake_python(dir: &std::path::Path) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-python");
        std::fs::write(
            &path,
            "#!/bin/sh\n\
             echo '{\"ok\": true, \"ready\": true, \"torch_version\": \"9.9-fake\"}'\n\
             while read -r line; do\n\
               case \"$line\" in\n\
                 *bf16*) echo '{\"ok\": false, \"error\": \"no bf16 here\"}' ;;\n\
                 *d2h_pinned*) echo '{\"ok\": false, \"error\": \"copy did not match\"}' ;;\n\
                 *copy*) echo '{\"ok\": true, \"times_ms\": [0.25]}' ;;\n\
                 *) echo '{\"ok\": true, \"times_ms\": [1.5, 2.5]}' ;;\n\
               esac\n\
             done\n",
        )?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }
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
        let e = run_pytorch(&["matmul".into()]).unwrap_err().to_string();
        std::env::remove_var("GPUKIT_PYTHON");
        assert!(e.contains("/nonexistent/python3"), "{e}");
    }

    #[test]
    fn a_missing_interpreter_stops_the_server_with_a_message() {
        let e = PeerServer::start_with("/nonexistent/python3".into(), "cpu", None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/python3"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn the_server_protocol_answers_blocks_and_errors() {
        let dir = std::env::temp_dir().join(format!("gpukit-peer-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server =
            PeerServer::start_with(super::fake::fake_python(&dir).unwrap(), "cpu", Some(2))
                .unwrap();
        assert_eq!(server.torch_version, "9.9-fake");
        let t = server
            .matmul_block("cpu", "f32", 64, "normal", 1, 2, 5.0)
            .unwrap();
        assert_eq!(t, vec![1.5, 2.5]);
        let e = server
            .matmul_block("cpu", "bf16", 64, "normal", 1, 2, f64::INFINITY)
            .unwrap_err();
        assert_eq!(e.to_string(), "no bf16 here");
        // still answering after an error
        assert!(server
            .matmul_block("cuda:0", "f16", 8, "uniform", 0, 1, 1.0)
            .is_ok());
        // copies: their own request, their errors named
        assert_eq!(
            server.copy_block("h2d_pinned", 1 << 20, 1, 1).unwrap(),
            vec![0.25]
        );
        assert_eq!(
            server
                .copy_block("d2h_pinned", 1 << 20, 1, 1)
                .unwrap_err()
                .to_string(),
            "copy did not match"
        );
        drop(server);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[cfg(unix)]
    #[test]
    fn a_server_that_dies_is_named_with_its_last_words() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpukit-peer-dies-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dying-python");
        std::fs::write(
            &path,
            "#!/bin/sh\necho 'ImportError: no torch' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = PeerServer::start_with(path, "cpu", None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("stopped answering") && e.contains("no torch"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn csv_joins() {
        assert_eq!(csv(&[1, 2, 3]), "1,2,3");
    }
}
