//! `infer --onnx --compare-pytorch --torchvision NAME` without PyTorch: GPUKIT_PYTHON names a
//! stand-in for python3 that answers as scripts/pytorch_reference.py does (the structure it is
//! told, constant logits, one eager fp32 row per batch size) and logs each call, so the command's
//! wiring is checked on any machine with python3: the check before any row runs, the refusal of
//! another model, PyTorch's rows beside gpukit's and what the report says of them. The real
//! script runs too, as far as it goes without torch: its refusal of a name it does not know.

use crate::common::{bin, ensure, exited, text};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The stand-in: the script's JSON document for `infer` (with `--check-only`, the logits file
/// of `--save-output`, [n, classes] of 0.5, n read from `--input`'s header).
const FAKE: &str = r#"
import json, os, struct, sys
args = sys.argv[2:]  # sys.argv[1]: the reference script's path
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
def value(flag):
    return args[args.index(flag) + 1] if flag in args else None
structure = json.loads(os.environ["FAKE_STRUCTURE"])
doc = {"ok": True, "command": "infer", "torch_version": "0.0-fake", "device_name": "fake CPU",
       "torchvision": "0.0-fake", "weights": value("--weights") or "seeded",
       "cudnn_benchmark": False, "structure": structure, "results": []}
if "--check-only" in args:
    with open(value("--input"), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    n, classes = header["input"]["shape"][0], structure["output_shape"][1]
    head = json.dumps({"logits": {"dtype": "F32", "shape": [n, classes],
                                  "data_offsets": [0, 4 * n * classes]}}).encode()
    with open(value("--save-output"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + struct.pack("<f", 0.5) * (n * classes))
else:
    for b in map(int, value("--batch-sizes").split(",")):
        doc["results"].append({"strategy": "eager_fp32", "batch": b, "status": "ok",
                               "median_ms": 2.0, "p10_ms": 1.9, "p90_ms": 2.1, "count": 3,
                               "images_per_s": b / 2.0 * 1e3, "peak_allocated_bytes": None})
print(json.dumps(doc))
"#;

/// A directory with the fixture ResNet (6 convolutions, one Gemm, 10 classes at 32x32) and
/// the stand-in for python3.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Result<Setup, Failed> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let model = gpukit_models::onnx::fixtures::tiny_resnet(4);
        std::fs::write(
            dir.path().join("tiny_resnet.onnx"),
            gpukit_models::onnx::fixtures::bytes(&model),
        )?;
        std::fs::write(dir.path().join("fake.py"), FAKE)?;
        let python = dir.path().join("python");
        std::fs::write(
            &python,
            format!(
                "#!/bin/sh\nexec python3 {} \"$@\"\n",
                dir.path().join("fake.py").display()
            ),
        )?;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755))?;
        Ok(Setup { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `gpukit infer --onnx tiny_resnet.onnx --compare-pytorch --torchvision resnet18` on the
    /// CPU with `more`, PyTorch reporting `conv` convolutions.
    fn run(&self, conv: usize, more: &[&str]) -> Result<Output, Failed> {
        let model = self.path("tiny_resnet.onnx");
        let structure = format!(
            "{{\"conv\": {conv}, \"linear\": 1, \"parameters\": 4000, \"output_shape\": [1, 10]}}"
        );
        Ok(Command::new(bin())
            .args(["infer", "--onnx"])
            .arg(&model)
            .args(["--compare-pytorch", "--torchvision", "resnet18"])
            .args([
                "--device",
                "cpu",
                "--strategies",
                "cpu",
                "--batch-sizes",
                "1,2",
            ])
            .args(["--iterations", "1"])
            .args(more)
            .env("GPUKIT_PYTHON", self.path("python"))
            .env("FAKE_LOG", self.path("calls.log"))
            .env("FAKE_STRUCTURE", structure)
            .env("GPUKIT_TRACE", "0")
            .output()?)
    }

    /// The stand-in's calls, each its arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.path("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// How a failing check names the command it ran.
const SHOWN: [&str; 1] = ["infer --onnx tiny_resnet.onnx --compare-pytorch --torchvision resnet18"];

fn has(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

/// PyTorch's model with other layers than the file's: exit 2 naming both counts, before any of
/// gpukit's rows or PyTorch's timed ones.
fn another_model_is_refused_naming_both_counts() -> Result<(), Failed> {
    let setup = Setup::new()?;
    let out = setup.run(7, &[])?;
    exited(&out, 2, &SHOWN)?;
    let err = text(&out.stderr);
    ensure(
        err.contains("--torchvision resnet18 is not the model in the file")
            && err.contains("6 Conv and 1 Gemm/MatMul")
            && err.contains("7 convolution(s) and 1 linear"),
        || err.clone(),
    )?;
    let calls = setup.calls();
    ensure(
        calls.len() == 1 && calls[0].iter().any(|a| a == "--check-only"),
        || format!("{calls:?}"),
    )?;
    ensure(!err.contains("importing"), || err.clone())
}

/// The same layers: PyTorch's rows beside gpukit's, the check and its verdict on the weights
/// (the stand-in's logits are not the file's) in the JSON and the table.
fn pytorch_stands_beside_with_what_made_it_the_same_model() -> Result<(), Failed> {
    let setup = Setup::new()?;
    let out = setup.run(6, &["--json"])?;
    exited(&out, 0, &SHOWN)?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    let p = &doc["result"]["pytorch"];
    let same = &p["same_model"];
    ensure(
        same["onnx"] == serde_json::json!({"conv": 6, "linear": 1})
            && same["pytorch"] == same["onnx"]
            && same["output_shape"] == serde_json::json!([10])
            && same["weights"] == "seeded"
            && same["same_weights"] == false,
        || format!("{p}"),
    )?;
    ensure(p["logits"]["max_rel"].as_f64().is_some(), || format!("{p}"))?;
    let rows = doc["result"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let beside: Vec<&Value> = rows.iter().filter(|r| !r["pytorch"].is_null()).collect();
    ensure(
        beside.len() == 2 && beside.iter().all(|r| r["strategy"] == "gpukit graph f32"),
        || format!("{rows:?}"),
    )?;
    let notes = doc["notes"].to_string();
    ensure(
        notes.contains("PyTorch 0.0-fake ran")
            && notes.contains("other weights")
            && notes.contains("--torchvision-weights"),
        || notes.clone(),
    )?;
    // the check on the CPU first, then the timed rows at gpukit's CPU row's batch sizes
    let calls = setup.calls();
    ensure(calls.len() == 2, || format!("{calls:?}"))?;
    ensure(
        has(&calls[0], "--model", "resnet18")
            && has(&calls[0], "--image-size", "32")
            && has(&calls[0], "--device", "cpu")
            && calls[0].iter().any(|a| a == "--check-only")
            && !calls[0].iter().any(|a| a == "--weights"),
        || format!("{:?}", calls[0]),
    )?;
    ensure(
        has(&calls[1], "--batch-sizes", "1,2")
            && has(&calls[1], "--strategies", "eager_fp32")
            && !calls[1].iter().any(|a| a == "--check-only"),
        || format!("{:?}", calls[1]),
    )?;
    let table = setup.run(6, &[])?;
    let s = text(&table.stdout);
    ensure(
        s.contains("PyTorch 0.0-fake (torchvision 0.0-fake")
            && s.contains("the same model by its layers: the file has 6 Conv and 1 Gemm/MatMul")
            && s.contains("other weights, so PyTorch's times are for the same layers"),
        || s.clone(),
    )
}

/// `--torchvision-weights` reaches the script as its `--weights`.
fn the_weights_file_is_what_pytorch_loads() -> Result<(), Failed> {
    let setup = Setup::new()?;
    let weights = setup.path("resnet18.safetensors");
    std::fs::write(&weights, b"read by PyTorch, not by gpukit")?;
    let w = weights
        .to_str()
        .ok_or("a temporary path that is not UTF-8")?;
    let out = setup.run(6, &["--torchvision-weights", w, "--json"])?;
    exited(&out, 0, &SHOWN)?;
    let calls = setup.calls();
    ensure(
        calls.len() == 2 && calls.iter().all(|c| has(c, "--weights", w)),
        || format!("{calls:?}"),
    )?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    let same = &doc["result"]["pytorch"]["same_model"];
    ensure(same["weights"] == w, || format!("{same}"))?;
    let notes = doc["notes"].to_string();
    ensure(notes.contains(&format!("is {w} the state dict")), || {
        notes.clone()
    })
}

/// Without a python, the check fails at once (exit 1) saying what to install, before gpukit's
/// rows run.
fn without_python_it_says_what_to_install_before_any_row() -> Result<(), Failed> {
    let setup = Setup::new()?;
    let model = setup.path("tiny_resnet.onnx");
    let out = Command::new(bin())
        .args(["infer", "--onnx"])
        .arg(&model)
        .args([
            "--compare-pytorch",
            "--torchvision",
            "resnet18",
            "--device",
            "cpu",
        ])
        .env("GPUKIT_PYTHON", "/nonexistent/python3")
        .output()?;
    exited(&out, 1, &SHOWN)?;
    let err = text(&out.stderr);
    ensure(
        err.contains("install Python 3 and PyTorch") && !err.contains("importing"),
        || err.clone(),
    )
}

/// scripts/pytorch_reference.py refuses a name torchvision has no classifier of while reading
/// its arguments, before it imports torch: `{"ok": false}` naming the name, exit 2.
fn the_script_refuses_an_unknown_model_before_importing_torch() -> Result<(), Failed> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/pytorch_reference.py"
    );
    let out = Command::new("python3")
        .args([script, "infer", "--model", "resnet", "--check-only"])
        .output()?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    ensure(out.status.code() == Some(2) && doc["ok"] == false, || {
        format!("exit {:?}: {doc}", out.status.code())
    })?;
    let error = doc["error"].as_str().unwrap_or_default();
    ensure(
        error.contains("'resnet' is not one of") && error.contains("mobilenet_v3_large"),
        || error.to_string(),
    )
}

/// The trials, ignored (with the reason) where python3 does not run.
pub fn trials() -> Vec<Trial> {
    let python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !python {
        eprintln!("fake_pytorch:: tests ignored: the stand-in for PyTorch needs python3");
    }
    let all: [(&str, crate::common::Test); 5] = [
        (
            "fake_pytorch::another_model_is_refused_naming_both_counts",
            another_model_is_refused_naming_both_counts,
        ),
        (
            "fake_pytorch::pytorch_stands_beside_with_what_made_it_the_same_model",
            pytorch_stands_beside_with_what_made_it_the_same_model,
        ),
        (
            "fake_pytorch::the_weights_file_is_what_pytorch_loads",
            the_weights_file_is_what_pytorch_loads,
        ),
        (
            "fake_pytorch::without_python_it_says_what_to_install_before_any_row",
            without_python_it_says_what_to_install_before_any_row,
        ),
        (
            "fake_pytorch::the_script_refuses_an_unknown_model_before_importing_torch",
            the_script_refuses_an_unknown_model_before_importing_torch,
        ),
    ];
    all.into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(!python))
        .collect()
}
