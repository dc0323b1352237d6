//! `gpukit train` as a user runs it: both presets, a stopped and resumed run (on the CPU and,
//! where there is one, on the GPU in fp16), GPU settings refused where they cannot apply, and the comparison with PyTorch (ignored, with the reason, where the python has no
//! torch).

#[path = "train_cli/cnn.rs"]
mod cnn;
mod common;

use common::*;
use libtest_mimic::{Failed, Trial};
use std::process::Command;

/// The tutorial loops run on the CPU and report per epoch; a run stopped after 30 updates and
/// resumed from its checkpoint writes the same per-update losses, to the last digit, as the
/// run that was never stopped.
fn train_runs_the_presets_and_resumes_exactly() -> Result<(), Failed> {
    let doc = document(&["train"], 0)?;
    ensure(doc["command"] == "train" && doc["ok"] == true, || {
        format!("{doc}")
    })?;
    let epochs = doc["result"]["epochs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure(epochs.len() == 3, || format!("{doc}"))?;
    ensure(
        doc["result"]["step_losses"].as_array().map(Vec::len) == Some(48),
        || format!("{doc}"),
    )?;
    let doc = document(
        &[
            "train",
            "--preset",
            "seed-classification",
            "--eval-fraction",
            "0.2",
        ],
        0,
    )?;
    let last = &doc["result"]["epochs"][4];
    ensure(
        last["train_accuracy"].is_number() && last["eval_accuracy"].is_number(),
        || format!("{doc}"),
    )?;
    let dir = tempfile::tempdir()?;
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (ck, a, b, whole) = (p("ck.safetensors"), p("a.csv"), p("b.csv"), p("whole.csv"));
    for args in [
        vec!["train", "--steps", "30", "--save", &ck, "--save-losses", &a],
        vec!["train", "--resume", &ck, "--save-losses", &b],
        vec!["train", "--save-losses", &whole],
    ] {
        exited(&gpukit(&args), 0, &args)?;
    }
    let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
    let joined = format!("{}{}", read(&a), read(&b).trim_start_matches("step,loss\n"));
    ensure(
        joined == read(&whole) && read(&whole).lines().count() == 49,
        || format!("stopped and resumed:\n{joined}\nwhole:\n{}", read(&whole)),
    )
}

/// Without a GPU, `--device cuda:0` names what is missing (exit 1); GPU-only settings on the
/// CPU are bad input (exit 2).
fn train_on_cuda_without_a_gpu_names_what_is_missing() -> Result<(), Failed> {
    let args = ["train", "--device", "cuda:0"];
    let out = gpukit(&args);
    exited(&out, 1, &args)?;
    ensure(text(&out.stderr).contains("driver"), || text(&out.stderr))
}

/// `--steps N` makes N updates, however many epochs that takes (the tutorial's 3 epochs are 48
/// updates); with `--epochs` too, the first limit reached stops the run.
fn steps_set_the_number_of_updates() -> Result<(), Failed> {
    for (args, updates) in [
        (vec!["train", "--steps", "200"], 200),
        (vec!["train", "--steps", "20"], 20),
        (vec!["train", "--steps", "40", "--accumulate", "3"], 40),
        (vec!["train", "--steps", "20", "--epochs", "5"], 20),
        (vec!["train", "--epochs", "5"], 80),
    ] {
        let doc = document(&args, 0)?;
        let made = doc["result"]["step_losses"].as_array().map(Vec::len);
        ensure(made == Some(updates), || {
            format!("{args:?}: {made:?} updates, not {updates}")
        })?;
    }
    Ok(())
}

/// Reports, checkpoints and loss files follow the user's umask (0644 under 022, 0640 under
/// 027), as files any other program writes do; none is private to its writer.
fn written_files_follow_the_umask() -> Result<(), Failed> {
    use std::os::unix::fs::PermissionsExt;
    for (umask, want) in [("022", 0o644), ("027", 0o640)] {
        let dir = tempfile::tempdir()?;
        let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
        let files = [p("r.json"), p("r.html"), p("ck.safetensors"), p("l.csv")];
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
            .arg(bin())
            .args(["train", "--steps", "2", "--save-json", &files[0], "--html"])
            .args([&files[1], "--save", &files[2], "--save-losses", &files[3]])
            .output()?;
        exited(&out, 0, &["train", "under umask", umask])?;
        for f in &files {
            let mode = std::fs::metadata(f)?.permissions().mode() & 0o777;
            ensure(mode == want, || {
                format!("umask {umask}: {f} has mode {mode:o}, not {want:o}")
            })?;
        }
    }
    Ok(())
}

/// A run whose loss stops being finite fails (exit 1) naming the update, and still writes its
/// report where --save-json asked (the updates before it are there); its weights are not saved
/// as a checkpoint.
fn a_diverged_run_writes_its_report_and_no_checkpoint() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (json, ck) = (p("d.json"), p("ck.safetensors"));
    let args = [
        "train",
        "--optimizer",
        "sgd",
        "--lr",
        "1e30",
        "--save-json",
        &json,
        "--save",
        &ck,
    ];
    let out = gpukit(&args);
    exited(&out, 1, &args)?;
    ensure(text(&out.stderr).contains("diverged"), || text(&out.stderr))?;
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    ensure(
        doc["ok"] == false
            && doc["failure"]
                .as_str()
                .is_some_and(|f| f.contains("at update")),
        || format!("{doc}"),
    )?;
    ensure(!std::path::Path::new(&ck).exists(), || {
        "a diverged run saved its weights".into()
    })
}

fn gpu_settings_on_the_cpu_are_bad_input() -> Result<(), Failed> {
    for (args, fragment) in [
        (vec!["train", "--precision", "bf16"], "--precision bf16"),
        (vec!["train", "--graph"], "--graph"),
        (vec!["train", "--loader", "pinned"], "--loader"),
        (vec!["train", "--precision", "fp8"], "unknown"),
    ] {
        let out = gpukit(&args);
        exited(&out, 2, &args)?;
        ensure(text(&out.stderr).contains(fragment), || {
            format!("{args:?}: {}", text(&out.stderr))
        })?;
    }
    Ok(())
}

/// On the GPU, fp16 with its loss scaler: a run stopped after 20 updates and resumed from its
/// checkpoint (weights, Adam's moments, the scale and its growth count) writes the same
/// per-update losses as the run never stopped, to the last digit; a graph without resident
/// data is bad input.
/// Runs larger than the GPU are refused before anything is allocated or generated: exit 1 in
/// under 2 s, naming what they need against what is there (the host's share first: 100,000
/// samples of 100,000 features; then a model that fits a 128 GiB host (68 GB of weights) but
/// no GPU lent here, H200 included (169 GB of weights, gradients and 16-bit copies)).
fn a_run_larger_than_the_gpu_is_refused_at_once() -> Result<(), Failed> {
    for (args, memory) in [
        (
            vec![
                "train",
                "--device",
                "cuda:0",
                "--layers",
                "100000,100000,100000,1",
                "--samples",
                "100000",
                "--features",
                "100000",
            ],
            "memory",
        ),
        (
            vec![
                "train",
                "--device",
                "cuda:0",
                "--precision",
                "bf16",
                "--optimizer",
                "sgd",
                "--layers",
                "1024,130000,130000,1",
                "--samples",
                "4096",
                "--features",
                "1024",
            ],
            "GPU memory on cuda:0",
        ),
    ] {
        let started = std::time::Instant::now();
        let out = gpukit(&args);
        let seconds = started.elapsed().as_secs_f64();
        exited(&out, 1, &args)?;
        let err = text(&out.stderr);
        eprintln!("{seconds:.2} s: {err}");
        ensure(
            err.contains("needs") && err.contains(memory) && err.contains("available"),
            || format!("{args:?}: {err}"),
        )?;
        ensure(seconds < 2.0, || {
            format!("{args:?}: refused after {seconds:.2} s")
        })?;
    }
    Ok(())
}

fn train_on_the_gpu_resumes_exactly() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (ck, a, b, whole) = (p("ck.safetensors"), p("a.csv"), p("b.csv"), p("whole.csv"));
    let gpu = ["--device", "cuda:0", "--precision", "fp16"];
    for rest in [
        vec!["--steps", "20", "--save", &ck, "--save-losses", &a],
        vec!["--resume", &ck, "--save-losses", &b],
        vec!["--save-losses", &whole],
    ] {
        let args: Vec<&str> = ["train"].iter().chain(&gpu).chain(&rest).copied().collect();
        exited(&gpukit(&args), 0, &args)?;
    }
    let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
    let joined = format!("{}{}", read(&a), read(&b).trim_start_matches("step,loss\n"));
    ensure(
        joined == read(&whole) && read(&whole).lines().count() == 49,
        || format!("stopped and resumed:\n{joined}\nwhole:\n{}", read(&whole)),
    )?;
    for (args, fragment) in [
        (
            vec![
                "train", "--device", "cuda:0", "--graph", "--loader", "plain",
            ],
            "--loader resident",
        ),
        (
            vec![
                "train", "--device", "cuda:0", "--loader", "plain", "--graph",
            ],
            "--graph",
        ),
    ] {
        let out = gpukit(&args);
        exited(&out, 2, &args)?;
        ensure(text(&out.stderr).contains(fragment), || {
            format!("{args:?}: {}", text(&out.stderr))
        })?;
    }
    Ok(())
}

/// The python that `--compare-pytorch` runs (GPUKIT_PYTHON, else python3), if it imports torch.
fn python_with_torch() -> Option<String> {
    let python = std::env::var("GPUKIT_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Both tutorial loops through PyTorch on the CPU from the same weights, data and order: the
/// per-update losses agree within the tolerance, and both times are there.
fn with_torch_train_matches_pytorch_update_by_update() -> Result<(), Failed> {
    for preset in ["seed-regression", "seed-classification"] {
        let doc = document(&["train", "--preset", preset, "--compare-pytorch"], 0)?;
        let p = &doc["result"]["pytorch"];
        let d = p["max_relative_difference"].as_f64().unwrap_or(f64::NAN);
        ensure(d <= 1e-4, || format!("{preset}: {p}"))?;
        ensure(
            p["step_losses"].as_array().map(Vec::len)
                == doc["result"]["step_losses"].as_array().map(Vec::len)
                && p["seconds_median"].as_f64().is_some_and(|s| s > 0.0),
            || format!("{preset}: {p}"),
        )?;
    }
    Ok(())
}

/// Without PyTorch, --compare-pytorch fails (exit 1) saying what to install.
fn train_compare_without_python_says_what_to_install() -> Result<(), Failed> {
    let args = ["train", "--compare-pytorch"];
    let out = Command::new(bin())
        .args(args)
        .env("GPUKIT_PYTHON", "/nonexistent/python3")
        .output()?;
    exited(&out, 1, &args)?;
    // said before any training: no epoch ran first
    ensure(
        text(&out.stderr).contains("install Python 3 and PyTorch")
            && !text(&out.stderr).contains("epoch 1"),
        || text(&out.stderr),
    )
}

fn main() {
    let torch = python_with_torch();
    if torch.is_none() {
        eprintln!("torch:: tests ignored: no python with torch (set GPUKIT_PYTHON to one)");
    }
    let with_torch = Trial::test(
        "torch::train_matches_pytorch_update_by_update",
        with_torch_train_matches_pytorch_update_by_update,
    )
    .with_ignored_flag(torch.is_none());
    run_kinds(
        vec![
            (
                "train_runs_the_presets_and_resumes_exactly",
                train_runs_the_presets_and_resumes_exactly,
            ),
            (
                "train_compare_without_python_says_what_to_install",
                train_compare_without_python_says_what_to_install,
            ),
            (
                "gpu_settings_on_the_cpu_are_bad_input",
                gpu_settings_on_the_cpu_are_bad_input,
            ),
            (
                "steps_set_the_number_of_updates",
                steps_set_the_number_of_updates,
            ),
            (
                "written_files_follow_the_umask",
                written_files_follow_the_umask,
            ),
            (
                "a_diverged_run_writes_its_report_and_no_checkpoint",
                a_diverged_run_writes_its_report_and_no_checkpoint,
            ),
            (
                "cnn::a_tiny_cpu_resnet_run_is_the_librarys_train_step",
                cnn::a_tiny_cpu_resnet_run_is_the_librarys_train_step,
            ),
            (
                "cnn::bad_cnn_input_exits_2_naming_it",
                cnn::bad_cnn_input_exits_2_naming_it,
            ),
        ],
        vec![(
            "no_gpu::train_on_cuda_names_what_is_missing",
            train_on_cuda_without_a_gpu_names_what_is_missing,
        )],
        vec![
            (
                "gpu::train_on_the_gpu_resumes_exactly",
                train_on_the_gpu_resumes_exactly,
            ),
            (
                "gpu::a_run_larger_than_the_gpu_is_refused_at_once",
                a_run_larger_than_the_gpu_is_refused_at_once,
            ),
            (
                "gpu::cnn_resnet_runs_and_oversized_runs_are_refused",
                cnn::gpu_resnet_runs_and_oversized_runs_are_refused,
            ),
            (
                "gpu::cnn_resnet_trains_in_bf16",
                cnn::gpu_resnet_trains_in_bf16,
            ),
        ],
        vec![with_torch],
    )
}
