//! `train` under `gpukit all`. The training run itself is a workload
//! ([`crate::workload::train`]): `train`, `profile train` and lesson 8 all run it.

use crate::error::Result;
use crate::part::{Context, Outcome, Part};
use crate::workload::train::{run_train, Preset, TrainRequest};
use gpukit_tensor::{Device, DeviceSelection};

/// `train` under `gpukit all`: each tutorial preset once on the CPU, and again on the GPU when
/// there is one (the data resident on the GPU, each epoch replayed as one graph: the defaults).
pub struct TrainPart;

/// The training part of `gpukit all`.
pub static PART: TrainPart = TrainPart;

impl Part for TrainPart {
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
