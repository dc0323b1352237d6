//! `gpukit bench bandwidth`: each kind of copy, one in L2, one that failed its check, one skipped,
//! PyTorch on some rows.

use super::{assert_drawn, pytorch, timing};
use crate::render::bandwidth_sections;
use gpukit_bench::bandwidth::{BandwidthReport, BandwidthRow, CopyKind};
use gpukit_bench::measure::Clock;
use gpukit_bench::report::RowStatus;

/// A checked copy of `bytes` at `gbs`; callers add how it compares with the link or memory.
fn copy(kind: CopyKind, bytes: usize, gbs: f64) -> BandwidthRow {
    let payload = match kind {
        CopyKind::Bidirectional => 2 * bytes,
        _ => bytes,
    };
    let us = payload as f64 / gbs / 1e3;
    BandwidthRow {
        kind,
        bytes,
        status: RowStatus::Ok,
        timing: Some(timing(Clock::CudaEvents, us / 1e3, us / 1e3, us / 1e3, 20)),
        gbs: Some(gbs),
        gbs_read_write: None,
        latency_us: Some(us),
        pct_of_link: None,
        pct_of_memory_peak: None,
        in_l2: false,
        verified: true,
        pytorch: None,
    }
}

/// One direction of the PCIe link, GB/s.
const LINK_GBS: f64 = 53.2;

fn over_link(kind: CopyKind, bytes: usize, gbs: f64) -> BandwidthRow {
    let link = match kind {
        CopyKind::Bidirectional => 2.0 * LINK_GBS,
        _ => LINK_GBS,
    };
    BandwidthRow {
        pct_of_link: Some(gbs / link * 100.0),
        ..copy(kind, bytes, gbs)
    }
}

fn device_to_device(bytes: usize, gbs: f64) -> BandwidthRow {
    let in_l2 = bytes <= 16 << 20;
    BandwidthRow {
        gbs_read_write: Some(2.0 * gbs),
        pct_of_memory_peak: (!in_l2).then_some(2.0 * gbs / 3352.0 * 100.0),
        in_l2,
        ..copy(CopyKind::D2d, bytes, gbs)
    }
}

#[test]
fn bandwidth_copies() {
    let mut pinned = over_link(CopyKind::H2dPinned, 256 << 20, 50.9);
    pinned.pytorch = Some(pytorch(49.9, 1.02, &[1.01, 1.02, 1.02]));
    let mut large = device_to_device(1 << 30, 1488.2);
    large.pytorch = Some(pytorch(1391.0, 1.07, &[]));
    let broken = BandwidthRow {
        status: RowStatus::Failed("destination differs from the source".into()),
        verified: false,
        ..copy(CopyKind::D2hPageable, 256 << 20, 9.1)
    };
    let report = BandwidthReport {
        gpu: None,
        gpu_unavailable: None,
        pcie_link_gbs: Some(LINK_GBS),
        memory_peak_gbs: Some(3352.0),
        l2_cache_bytes: Some(50 << 20),
        staging_chunk_bytes: 8 << 20,
        rounds: 3,
        rows: vec![
            over_link(CopyKind::H2dPageable, 4096, 0.42),
            over_link(CopyKind::H2dPageable, 256 << 20, 13.7),
            over_link(CopyKind::H2dPageableStaged, 256 << 20, 38.6),
            pinned,
            over_link(CopyKind::D2hPinned, 256 << 20, 51.8),
            broken,
            device_to_device(8 << 20, 2950.4),
            large,
            over_link(CopyKind::Bidirectional, 256 << 20, 96.1),
            BandwidthRow {
                status: RowStatus::Skipped("allocating buffers: out of memory".into()),
                ..copy(CopyKind::D2d, 48 << 30, 1.0)
            },
        ],
    };
    assert_drawn("bandwidth", &bandwidth_sections(&report));
}

#[test]
fn bandwidth_without_a_gpu_says_so_and_what_is_unknown() {
    let report = BandwidthReport {
        gpu: None,
        gpu_unavailable: Some("no NVIDIA driver found".into()),
        pcie_link_gbs: None,
        memory_peak_gbs: None,
        l2_cache_bytes: None,
        staging_chunk_bytes: 1536,
        rounds: 0,
        rows: Vec::new(),
    };
    let s = &bandwidth_sections(&report)[0];
    assert!(
        s.notes[0].starts_with(
            "PCIe link (one direction, max generation and width): unknown; memory peak: unknown."
        ),
        "{:?}",
        s.notes
    );
    assert!(s.notes[0].contains("in the unknown L2 cache"));
    assert!(s.notes[1].contains("two pinned 1536 B buffers"));
    assert_eq!(s.notes[2], "No GPU: no NVIDIA driver found");
}
