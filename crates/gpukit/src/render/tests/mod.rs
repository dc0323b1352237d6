//! Tests of the rendering: each command's sections drawn from a report built by hand, kept as
//! snapshots of the terminal and Markdown text, and checks of the logic behind single cells.

mod all;
mod bandwidth;
mod check;
mod compare;
mod conv;
mod footprint;
mod html;
mod infer;
mod infer_onnx;
mod lessons;
mod matmul;
mod memory;
mod nccl;
mod p2p;
mod profile;
mod stress;
mod train;

use super::fmt::grouped;
use super::{draw_terminal, status_cell, to_markdown, Section};
use gpukit_bench::ceilings::{PeakSource, Peaks};
use gpukit_bench::gpu::GpuFacts;
use gpukit_bench::measure::{Clock, Measurement};
use gpukit_bench::report::{PeerFigure, RowStatus, Verification};
use gpukit_bench::stats::Summary;
use gpukit_cuda::driver::DeviceAttributes;
use gpukit_cuda::nvml::{GpuProcess, NvmlDevice};

/// The sections as the terminal shows them (unwrapped: a snapshot must not depend on the width of
/// the terminal running the tests) and as the Markdown report writes them (at the report's
/// heading level), kept as the snapshots `<name>_terminal` and `<name>_markdown`.
fn assert_drawn(name: &str, sections: &[Section]) {
    assert_text_drawn(name, "", sections);
}

/// [`assert_drawn`] with `headline` on its own line above the sections in both drawings, as
/// `check` and the Markdown report print it.
fn assert_text_drawn(name: &str, headline: &str, sections: &[Section]) {
    let above = if headline.is_empty() {
        String::new()
    } else {
        format!("{headline}\n")
    };
    insta::assert_snapshot!(
        format!("{name}_terminal"),
        format!("{above}{}", terminal(sections))
    );
    insta::assert_snapshot!(
        format!("{name}_markdown"),
        format!("{above}{}", to_markdown(sections, 3))
    );
}

/// The terminal text of `sections`, unwrapped, for assertions on what it contains.
fn terminal(sections: &[Section]) -> String {
    draw_terminal(sections, false)
}

/// A timing whose summary has the given median, p10 and p90 (ms) over `count` repetitions.
fn timing(clock: Clock, median: f64, p10: f64, p90: f64, count: usize) -> Measurement {
    Measurement {
        clock,
        warmup: 3,
        reps_planned: count,
        summary_ms: Summary {
            count,
            median,
            p10,
            p90,
            min: p10,
            max: p90,
            mean: median,
            cv: 0.01,
        },
    }
}

/// A sampled check that passed with relative error `rel_err`.
fn verified(rel_err: f64) -> Verification {
    Verification {
        samples: 1024,
        rel_err,
        tolerance: 1e-3,
        passed: true,
    }
}

/// PyTorch's figure at `rate`; with `turn_ratios`, the two took turns and `ratio` is their median.
fn pytorch(rate: f64, ratio: f64, turn_ratios: &[f64]) -> PeerFigure {
    PeerFigure {
        median_ms: 1.0,
        rate,
        ratio,
        turn_ratios: turn_ratios.to_vec(),
        by_opener: Vec::new(),
    }
}

/// An H100 SXM as `check` describes it after starting CUDA, with NVML's figures and one process.
fn h100() -> GpuFacts {
    let name = "NVIDIA H100 80GB HBM3";
    let uuid = "GPU-8a7c3f52-1b2d-4e6f-9a0b-c1d2e3f40516";
    let pci_bus_id = "00000000:19:00.0";
    GpuFacts {
        index: 0,
        name: name.into(),
        uuid: uuid.into(),
        pci_bus_id: pci_bus_id.into(),
        compute_capability: Some((9, 0)),
        sm_count: Some(132),
        memory_usable_bytes: Some(85_030_813_696),
        memory_board_bytes: Some(81_559 << 20),
        memory_free_bytes: Some(84_440_203_264),
        l2_cache_bytes: Some(50 << 20),
        max_sm_clock_mhz: Some(1980),
        max_memory_clock_mhz: Some(2619),
        memory_bus_width_bits: Some(5120),
        theoretical_bandwidth_gbs: Some(3352.3),
        pcie_max_gbs: Some(53.2),
        peaks: Peaks {
            source: PeakSource::Datasheet {
                part: "H100 SXM5".into(),
            },
            f64_tflops: Some(66.9),
            f32_tflops: Some(66.9),
            tf32_tflops: Some(494.7),
            f16_tflops: Some(989.4),
            bf16_tflops: Some(989.4),
            fp8_tflops: Some(1978.9),
            memory_gbs: Some(3352.0),
        },
        cuda: Some(DeviceAttributes {
            ordinal: 0,
            name: name.into(),
            uuid: uuid.into(),
            pci_bus_id: pci_bus_id.into(),
            total_memory_bytes: 85_030_813_696,
            compute_capability: (9, 0),
            sm_count: 132,
            sm_clock_khz: 1_980_000,
            memory_clock_khz: 2_619_000,
            memory_bus_width_bits: 5120,
            l2_cache_bytes: 50 << 20,
            max_shared_memory_per_block_optin_bytes: 232_448,
            max_threads_per_sm: 2048,
            ecc_enabled: true,
            integrated: false,
        }),
        nvml: Some(NvmlDevice {
            index: 0,
            name: name.into(),
            uuid: uuid.into(),
            pci_bus_id: pci_bus_id.into(),
            pcie_gen_current: Some(5),
            pcie_gen_max: Some(5),
            pcie_width_current: Some(16),
            pcie_width_max: Some(16),
            power_draw_w: Some(71.6),
            power_limit_w: Some(700.0),
            temperature_c: Some(31),
            utilization_gpu_pct: Some(0),
            utilization_memory_pct: Some(0),
            processes: vec![GpuProcess {
                pid: 4242,
                name: "python3".into(),
                used_memory_bytes: Some(520 << 20),
            }],
            ..NvmlDevice::default()
        }),
        nvml_error: None,
    }
}

#[test]
fn a_row_without_a_figure_says_why_in_its_status_cell() {
    assert_eq!(status_cell(&RowStatus::Ok), None);
    assert_eq!(
        status_cell(&RowStatus::Failed("relative error 2e-2".into())).as_deref(),
        Some("FAILED: relative error 2e-2")
    );
    assert_eq!(
        status_cell(&RowStatus::Skipped("no bf16 on this GPU".into())).as_deref(),
        Some("skipped: no bf16 on this GPU")
    );
}

#[test]
fn grouped_thousands() {
    assert_eq!(grouped(12_345.4), "12,345");
    assert_eq!(grouped(1_000.0), "1,000");
    assert_eq!(grouped(999.0), "999");
    assert_eq!(grouped(25_557_032.0), "25,557,032");
    assert_eq!(grouped(12.34), "12.3");
}

#[test]
fn markdown_escapes_pipes_and_keeps_shape() {
    let s = Section {
        title: "T".into(),
        header: Some(vec!["a".into(), "b".into()]),
        rows: vec![vec!["x|y".into(), "z".into()]],
        notes: vec!["note".into()],
    };
    let md = to_markdown(&[s], 2);
    assert!(md.contains("## T"));
    assert!(md.contains("| a | b |\n|---|---|\n| x\\|y | z |"), "{md}");
    assert!(md.contains("\nnote\n"));
}
