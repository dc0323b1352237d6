//! `train` under `gpukit all`. The training run itself is a workload
//! ([`crate::workload::train`]): `train`, `profile train` and lesson 8 all run it.

use crate::error::Result;
use crate::figures::*;
use crate::part::{Context, Outcome, Part};
use crate::stats::Summary;
use crate::workload::train::{run_train, Preset, TrainRequest};
use gpukit_tensor::{Device, DeviceSelection};
use serde_json::Value;

/// `train` under `gpukit all`: each tutorial preset once on the CPU, and again on the GPU when
/// there is one (the data resident on the GPU, each epoch replayed as one graph: the defaults).
pub struct TrainPart;

/// The training part of `gpukit all`.
pub static PART: TrainPart = TrainPart;

impl Part for TrainPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        train_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "train"
    }
    fn command(&self) -> &'static str {
        "train"
    }
    fn title(&self) -> &'static str {
        "Training"
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let mut devices = vec![Device::Cpu];
        if ctx.gpu {
            devices.push(match ctx.selection {
                DeviceSelection::One(d @ Device::Cuda(_)) => d,
                _ => Device::Cuda(0),
            });
        }
        let mut reports = Vec::new();
        let mut skipped = Vec::new();
        for device in devices {
            for preset in [Preset::SeedRegression, Preset::SeedClassification] {
                let request = TrainRequest {
                    preset: Some(preset),
                    eval_fraction: Some(0.2),
                    device: Some(device),
                    ..TrainRequest::default()
                };
                match run_train(&request, ctx.discovery, progress) {
                    Ok(r) => reports.push(r),
                    Err(e) => skipped.push((
                        format!("train --preset {} --device {device}", preset.name()),
                        e.to_string(),
                    )),
                }
            }
        }
        let mut o = Outcome::report(&reports);
        for (part, reason) in skipped {
            o = o.with_skipped(&part, reason);
        }
        Ok(o)
    }
}

// `gpukit compare`'s figures of this command's section.
/// `train`: samples/s of each training run, under the configuration that decides it (see
/// [`train_key`]). `all` holds a list of train reports, the `train` command one.
///
/// The figure is the median over the run's steady epochs: the complete ones after the first,
/// which also warms caches and the allocator (and captures the CUDA graph), unless it is the
/// only one. The epochs are the run's repetitions: their p10-p90 range is the spread, their
/// count the samples, so more `--epochs` make a run judgeable.
fn train_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "train",
        unit: "samples/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let reports = match section {
        Value::Array(a) => a.as_slice(),
        other => std::slice::from_ref(other),
    };
    for r in reports {
        let Some(key) = train_key(r) else { continue };
        // a run stopped by a non-finite loss failed: its rates are of a loop that broke
        let reading = match text(r, "diverged") {
            Some(why) => Some(Reading {
                value: None,
                spread: None,
                samples: None,
                problem: Some(format!("failed: {why}")),
            }),
            None => steady_epochs(r),
        };
        out.extend(reading.map(|reading| spec.figure(key, reading)));
    }
}

/// What decides a training run's samples/s, in words: "cpu 16-64-1 mse adam batch 64 819
/// samples fp32", then what differs from the plain loop (momentum, weight decay, accumulation,
/// no shuffle, checkpointed activations), the GPU's loader and graph, data-parallel ranks.
/// The preset's name is left out: a preset inside `all` (with an evaluation split) and a plain
/// `train` of the same preset train on different data, while flags that match a preset measure
/// the same loop. Learning rate and seed do not change the work; epochs and steps only repeat
/// it.
fn train_key(r: &Value) -> Option<String> {
    let cfg = r.get("config")?;
    let widths: Vec<String> = cfg
        .get("widths")?
        .as_array()?
        .iter()
        .map(|w| w.as_u64().map(|n| n.to_string()))
        .collect::<Option<_>>()?;
    let optimizer = cfg.get("optimizer")?;
    let mut parts = vec![
        device(r)?,
        widths.join("-"),
        text(cfg, "loss")?,
        text(optimizer, "kind")?,
    ];
    for (field, name) in [("momentum", "momentum"), ("weight_decay", "weight decay")] {
        if let Some(v) = optimizer
            .get(field)
            .and_then(Value::as_f64)
            .filter(|v| *v != 0.0)
        {
            parts.push(format!("{name} {v}"));
        }
    }
    parts.push(format!("batch {}", text(cfg, "batch_size")?));
    if let Some(k) = cfg
        .get("accumulate")
        .and_then(Value::as_u64)
        .filter(|k| *k > 1)
    {
        parts.push(format!("accumulate {k}"));
    }
    parts.push(format!("{} samples", text(r, "samples")?));
    parts.push(text(r, "precision")?);
    if cfg.get("shuffle").and_then(Value::as_bool) == Some(false) {
        parts.push("no shuffle".into());
    }
    if cfg.get("checkpoint_activations").and_then(Value::as_bool) == Some(true) {
        parts.push("checkpointed activations".into());
    }
    if let Some(gpu) = r.get("gpu").filter(|g| g.is_object()) {
        if let Some(loader) = text(gpu, "loader") {
            parts.push(format!("{loader} loader"));
        }
        match gpu.get("graph").and_then(Value::as_bool) {
            Some(true) => parts.push("graph".into()),
            Some(false) => parts.push("no graph".into()),
            None => {}
        }
    }
    if let Some(dp) = r.get("data_parallel").filter(|d| d.is_object()) {
        if let Some(n) = text(dp, "ranks") {
            parts.push(format!("{n} ranks"));
        }
        if let Some(by) = text(dp, "started_by") {
            parts.push(format!("({by})"));
        }
        if let Some(mb) = text(dp, "bucket_mb") {
            parts.push(format!("buckets {mb} MiB"));
        }
    }
    Some(parts.join(" "))
}

/// The median samples/s of a run's steady epochs, their p10-p90 range (when there are two or
/// more) and their count; None when no epoch is complete.
fn steady_epochs(r: &Value) -> Option<Reading> {
    let epochs = r.get("epochs").and_then(Value::as_array)?;
    let rate = |e: &Value| {
        let complete = e.get("complete").and_then(Value::as_bool).unwrap_or(true);
        complete.then(|| positive(e.get("samples_per_s"))).flatten()
    };
    let all: Vec<f64> = epochs.iter().filter_map(rate).collect();
    let later: Vec<f64> = epochs.iter().skip(1).filter_map(rate).collect();
    let steady = if later.is_empty() { all } else { later };
    let s = Summary::of(&steady)?;
    Some(Reading {
        value: Some(s.median),
        spread: (s.count > 1).then_some([s.p10, s.p90]),
        samples: Some(s.count as u64),
        problem: None,
    })
}
