//! `gpukit bench p2p`: two H100s over NVLink (one size beside PyTorch, one copy that arrived
//! wrong), and a pair of GPUs without peer access that copies through the host over PCIe.

use super::{assert_drawn, pytorch};
use crate::render::p2p_sections;
use gpukit_bench::p2p::{P2pReport, P2pRow};
use gpukit_bench::report::RowStatus;

/// A measured copy from `src` to `dst` at `one_way` GB/s (the p10 and p90 a few percent
/// around it).
fn row(src: usize, dst: usize, bytes: usize, one_way: f64, both_ways: f64) -> P2pRow {
    P2pRow {
        src,
        dst,
        link: "NV18 (NVLink 4)".into(),
        link_gbs: Some(450.0),
        peer_access: true,
        bytes,
        one_way_gbs: Some(one_way),
        one_way_p10_gbs: Some(one_way * 0.98),
        one_way_p90_gbs: Some(one_way * 1.01),
        both_ways_gbs: Some(both_ways),
        latency_us: Some(2.31),
        verified: true,
        status: RowStatus::Ok,
        pytorch: None,
    }
}

#[test]
fn p2p_two_gpus_over_nvlink() {
    let mut forth = row(0, 1, 256 << 20, 389.4, 741.2);
    forth.pytorch = Some(pytorch(376.0, 1.04, &[1.02, 1.04, 1.05]));
    let mut back = row(1, 0, 256 << 20, 387.9, 741.2);
    back.pytorch = Some(pytorch(377.5, 1.03, &[1.01, 1.03, 1.04]));
    let mut small = row(0, 1, 1 << 20, 148.6, 262.0);
    small.latency_us = Some(2.28);
    // As the benchmark marks a copy that arrived wrong: measured, but no figure shown.
    let mut wrong = row(1, 0, 1 << 20, 147.9, 262.0);
    wrong.verified = false;
    wrong.status =
        RowStatus::Failed("cuda:1 -> cuda:0: the copy did not arrive byte for byte".into());
    let report = P2pReport {
        gpus: vec![
            "NVIDIA H100 80GB HBM3".into(),
            "NVIDIA H100 80GB HBM3".into(),
        ],
        rows: vec![small, wrong, forth, back],
    };
    assert_drawn("p2p_two_gpus", &p2p_sections(&report));
}

#[test]
fn p2p_through_the_host() {
    let via_host = |src, dst, one_way| P2pRow {
        link: "PCIe (host bridge)".into(),
        link_gbs: None,
        peer_access: false,
        latency_us: Some(11.7),
        ..row(src, dst, 256 << 20, one_way, 24.9)
    };
    let report = P2pReport {
        gpus: vec!["NVIDIA L4".into(), "NVIDIA L4".into()],
        rows: vec![via_host(0, 1, 13.2), via_host(1, 0, 13.0)],
    };
    assert_drawn("p2p_through_the_host", &p2p_sections(&report));
}
