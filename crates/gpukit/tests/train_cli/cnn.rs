//! `gpukit train --model`: a tiny CPU run equal, update by update, to the library's
//! `train_step`; every kind of bad input refused with exit 2 and a message naming it; on a GPU,
//! a small run (fp32 and bf16) and a run larger than the GPU refused before any allocation.

use crate::common::*;
use gpukit_train::cnn::data::generated;
use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
use gpukit_train::cnn::resnet::{Depth, ResNet};
use gpukit_train::optim::OptimizerKind;
use libtest_mimic::Failed;
use std::path::Path;

/// A tiny ResNet-18 run on the CPU (6 generated 32x32 images, batches of 2 in a seeded
/// order, Nesterov SGD, label smoothing) reports the losses and accuracies the library's
/// `train_step` gives on the same batches from the same seed, to the last bit.
pub fn a_tiny_cpu_resnet_run_is_the_librarys_train_step() -> Result<(), Failed> {
    let args = [
        "train",
        "--model",
        "resnet18",
        "--image-size",
        "32",
        "--classes",
        "10",
        "--samples",
        "6",
        "--batch-size",
        "2",
        "--steps",
        "3",
        "--seed",
        "7",
        "--lr",
        "0.01",
        "--nesterov",
        "--label-smoothing",
        "0.1",
    ];
    let doc = document(&args, 0)?;
    let r = &doc["result"];
    let updates = r["updates"].as_array().cloned().unwrap_or_default();
    ensure(updates.len() == 3, || format!("{doc}"))?;
    ensure(r["images_per_s"].as_f64().is_some_and(|v| v > 0.0), || {
        format!("{doc}")
    })?;
    let mut model = ResNet::<f32>::new(Depth::ResNet18, 10, 7);
    let mut opt = CnnOptimizer::new(CnnOptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 0.01,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 1e-4,
    });
    let images = generated(6, (32, 32), 10, 7)?;
    let order = gpukit_train::data::batch_order(6, 0, 7, true);
    for (i, u) in updates.iter().enumerate() {
        let (x, y) = images.batch(&order[2 * i..2 * i + 2]);
        let (loss, correct) = gpukit_train::cnn::train_step(&mut model, &mut opt, &x, &y, 0.1);
        ensure(
            u["loss"].as_f64() == Some(loss)
                && u["accuracy"].as_f64() == Some(correct as f64 / 2.0),
            || {
                format!(
                    "update {}: {u} against the library's loss {loss}, {correct} right",
                    i + 1
                )
            },
        )?;
    }
    Ok(())
}

/// A safetensors file of tensors (name, dtype, shape, little-endian bytes).
fn safetensors(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Result<(), Failed> {
    let mut header = Vec::new();
    let mut at = 0;
    for (name, dtype, shape, bytes) in tensors {
        header.push(format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{at},{}]}}",
            at + bytes.len()
        ));
        at += bytes.len();
    }
    let header = format!("{{{}}}", header.join(","));
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    std::fs::write(path, out)?;
    Ok(())
}

fn f32s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i % 7) as f32 * 0.1).to_le_bytes())
        .collect()
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|l| l.to_le_bytes()).collect()
}

/// Each bad input exits 2, before any update, with a message naming what is wrong.
pub fn bad_cnn_input_exits_2_naming_it() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (gray, labels, conv1, partial) = (
        p("gray.safetensors"),
        p("labels.safetensors"),
        p("conv1.safetensors"),
        p("partial.safetensors"),
    );
    safetensors(
        Path::new(&gray),
        &[
            ("x", "F32", vec![2, 1, 8, 8], f32s(128)),
            ("y", "I64", vec![2], i64s(&[0, 1])),
        ],
    )?;
    safetensors(
        Path::new(&labels),
        &[
            ("x", "F32", vec![2, 3, 8, 8], f32s(384)),
            ("y", "I64", vec![2], i64s(&[0, 12])),
        ],
    )?;
    // a 3x3 stem: not resnet18's 7x7
    safetensors(
        Path::new(&conv1),
        &[("conv1.weight", "F32", vec![64, 3, 3, 3], f32s(64 * 27))],
    )?;
    safetensors(
        Path::new(&partial),
        &[("conv1.weight", "F32", vec![64, 3, 7, 7], f32s(64 * 147))],
    )?;
    let model = ["train", "--model", "resnet18", "--classes", "10"];
    let with = |rest: &[&str]| -> Vec<String> {
        model.iter().chain(rest).map(|s| s.to_string()).collect()
    };
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            vec!["train".into(), "--model".into(), "resnet101".into()],
            vec!["resnet101", "resnet18, resnet34, resnet50"],
        ),
        (
            with(&["--data", &gray]),
            vec![
                "gray.safetensors",
                "x has shape [2, 1, 8, 8]",
                "[n, 3, height, width]",
            ],
        ),
        (
            with(&["--data", &labels]),
            vec![
                "labels.safetensors",
                "y[1] is 12, out of range for a model of 10 classes",
            ],
        ),
        (
            with(&["--init", &conv1, "--image-size", "32", "--batch-size", "2"]),
            vec![
                "conv1.safetensors",
                "conv1.weight has shape [64, 3, 3, 3], resnet18 of 10 classes needs [64, 3, 7, 7]",
            ],
        ),
        (
            with(&[
                "--init",
                &partial,
                "--image-size",
                "32",
                "--batch-size",
                "2",
            ]),
            vec!["has no tensor \"bn1.weight\" (shape [64]), which resnet18"],
        ),
        (
            with(&["--precision", "bf16"]),
            vec!["--precision bf16: the CPU trains convolutional networks in fp32"],
        ),
        (
            with(&["--precision", "tf32"]),
            vec!["--precision tf32: the CPU trains convolutional networks in fp32"],
        ),
        (
            with(&["--gpus", "2"]),
            vec!["--gpus 2: data-parallel training runs on cuda:0..1; give --device cuda:0"],
        ),
        (
            with(&["--grad-comm", "bf16"]),
            vec!["--grad-comm and --bucket-mb: say how data-parallel ranks average"],
        ),
        (
            with(&["--checkpoint-activations"]),
            vec!["--checkpoint-activations: the CPU path keeps every map"],
        ),
        (
            with(&["--layers", "3,4,2"]),
            vec!["--layers: is not available with --model"],
        ),
        (
            with(&["--compare-pytorch"]),
            vec!["--compare-pytorch: PyTorch's side trains on the GPU; give --device cuda:N"],
        ),
        (
            with(&["--compare-pytorch", "--accumulate", "2"]),
            vec!["--compare-pytorch with --accumulate"],
        ),
        (
            with(&["--graph"]),
            vec!["--graph: CUDA graphs replay GPU work; give --device cuda:N"],
        ),
        (
            vec!["train".into(), "--label-smoothing".into(), "0.1".into()],
            vec!["--label-smoothing: is about convolutional networks; add --model"],
        ),
        (
            with(&["--label-smoothing", "1.5"]),
            vec!["--label-smoothing 1.5: must be at least 0 and below 1"],
        ),
        (
            with(&["--data", &labels, "--image-size", "32"]),
            vec!["--image-size and --samples describe generated images"],
        ),
        (
            with(&["--samples", "3", "--batch-size", "4", "--image-size", "32"]),
            vec!["--batch-size 4: the data holds 3 images, not one whole batch"],
        ),
        (
            with(&["--optimizer", "adam"]),
            vec!["convolutional networks train with sgd or adamw"],
        ),
    ];
    for (args, says) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = gpukit(&args);
        exited(&out, 2, &args)?;
        let err = text(&out.stderr);
        for s in says {
            ensure(err.contains(s) && !err.contains("update 1:"), || {
                format!("{args:?}: wanted {s:?} in: {err}")
            })?;
        }
    }
    Ok(())
}

/// On a GPU: a small ResNet-18 run trains and reports its rate and peak memory; ResNet-50 at
/// a batch no GPU holds is refused at once (exit 1), needed against available.
pub fn gpu_resnet_runs_and_oversized_runs_are_refused() -> Result<(), Failed> {
    let args = [
        "train",
        "--model",
        "resnet18",
        "--device",
        "cuda:0",
        "--image-size",
        "32",
        "--batch-size",
        "8",
        "--steps",
        "3",
        "--classes",
        "10",
    ];
    let doc = document(&args, 0)?;
    ensure(
        doc["result"]["peak_gpu_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
            && doc["result"]["updates"].as_array().map(Vec::len) == Some(3),
        || format!("{doc}"),
    )?;
    let args = [
        "train",
        "--model",
        "resnet50",
        "--device",
        "cuda:0",
        "--batch-size",
        "100000",
        "--steps",
        "1",
    ];
    let started = std::time::Instant::now();
    let out = gpukit(&args);
    exited(&out, 1, &args)?;
    let err = text(&out.stderr);
    ensure(
        err.contains("resnet50") && err.contains("needs") && err.contains("available"),
        || err.clone(),
    )?;
    ensure(started.elapsed().as_secs_f64() < 5.0, || {
        format!("refused after {:.1} s", started.elapsed().as_secs_f64())
    })
}

/// On a GPU: ResNet-18 in bf16 (channels-last, fp32 master weights) at 32x32 trains 5 updates of
/// one generated batch, reports its precision, and its loss falls from the first update to the
/// last (lr 0.01: the same batch each time).
pub fn gpu_resnet_trains_in_bf16() -> Result<(), Failed> {
    let args = [
        "train",
        "--model",
        "resnet18",
        "--device",
        "cuda:0",
        "--precision",
        "bf16",
        "--image-size",
        "32",
        "--batch-size",
        "8",
        "--steps",
        "5",
        "--classes",
        "10",
        "--lr",
        "0.01",
    ];
    let doc = document(&args, 0)?;
    let r = &doc["result"];
    let losses: Vec<f64> = r["updates"]
        .as_array()
        .map(|u| u.iter().filter_map(|u| u["loss"].as_f64()).collect())
        .unwrap_or_default();
    ensure(
        r["precision"] == "bf16"
            && losses.len() == 5
            && losses.iter().all(|l| l.is_finite())
            && losses[4] < losses[0],
        || format!("{doc}"),
    )
}
