//! `gpukit monitor -- CMD`: a training command on two H100s (one held at its power cap for a
//! while), and a run on a machine where NVML could not be opened.

use super::assert_drawn;
use crate::render::footprint_sections;
use gpukit_bench::monitor::run::{Footprint, GpuFootprint, ProcessPeak};
use std::collections::BTreeMap;

fn h100(index: u32, uuid: &str) -> GpuFootprint {
    GpuFootprint {
        index,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: uuid.into(),
        samples: 423,
        sampled_seconds: 42.2,
        power_limit_w: Some(700.0),
        ..GpuFootprint::default()
    }
}

#[test]
fn footprint_of_a_training_run() {
    let busy = GpuFootprint {
        peak_memory_bytes: Some(61_847_109_632),
        mean_utilization_pct: Some(93.4),
        max_utilization_pct: Some(100),
        mean_power_w: Some(612.8),
        max_power_w: Some(699.1),
        energy_j: Some(25_861.0),
        energy_from_power_j: Some(25_902.4),
        power_for_energy: Some("instant".into()),
        throttled_seconds: BTreeMap::from([("sw_power_cap".to_string(), 3.4)]),
        ..h100(0, "GPU-8a7c3f52-1b2d-4e6f-9a0b-c1d2e3f40516")
    };
    let second = GpuFootprint {
        peak_memory_bytes: Some(59_523_465_216),
        mean_utilization_pct: Some(91.8),
        max_utilization_pct: Some(100),
        mean_power_w: Some(598.2),
        max_power_w: Some(688.5),
        energy_j: Some(25_244.0),
        energy_from_power_j: Some(25_270.9),
        power_for_energy: Some("instant".into()),
        ..h100(1, "GPU-1c4e9d07-2a3b-4c5d-8e9f-0a1b2c3d4e5f")
    };
    let footprint = Footprint {
        command: [
            "torchrun",
            "--nproc-per-node",
            "2",
            "train.py",
            "--epochs",
            "1",
        ]
        .map(String::from)
        .to_vec(),
        exit_code: 0,
        seconds: 42.317,
        interval_ms: 100,
        gpus: vec![busy, second],
        processes: vec![
            ProcessPeak {
                gpu: 0,
                pid: 48_213,
                name: "python3".into(),
                peak_memory_bytes: 61_203_283_968,
            },
            ProcessPeak {
                gpu: 1,
                pid: 48_214,
                name: "python3".into(),
                peak_memory_bytes: 58_879_639_552,
            },
        ],
        not_sampled: None,
    };
    assert_drawn("footprint_training", &footprint_sections(&footprint));
}

#[test]
fn footprint_without_nvml() {
    let footprint = Footprint {
        command: vec!["./solver".into(), "--steps".into(), "100".into()],
        exit_code: 137,
        seconds: 8.904,
        interval_ms: 100,
        gpus: Vec::new(),
        processes: Vec::new(),
        not_sampled: Some(
            "NVML could not be loaded: libnvidia-ml.so.1: cannot open shared object file".into(),
        ),
    };
    assert_drawn("footprint_not_sampled", &footprint_sections(&footprint));
}
