//! `gpukit bench nccl`: two H100s over NVLink driven by one process (all_reduce beside
//! torch.distributed, all_gather, broadcast with a row whose output was wrong), and a world of
//! two nodes started by torchrun.

use super::{assert_drawn, pytorch, terminal};
use crate::render::nccl_sections;
use gpukit_bench::nccl::sweep::Collective;
use gpukit_bench::nccl::{Figure, Link, NcclReport, NcclRow, RankGpu};
use gpukit_bench::report::RowStatus;
use gpukit_cuda::nccl::RedOp;
use gpukit_types::DType;

const H100: &str = "NVIDIA H100 80GB HBM3";

/// nccl-tests' figures for `bytes` moved in `time_us` by `ranks`, as the benchmark computes them.
fn figure(op: Collective, bytes: usize, ranks: usize, time_us: f64) -> Figure {
    let algbw_gbs = bytes as f64 / (time_us * 1e3);
    Figure {
        time_us,
        algbw_gbs,
        busbw_gbs: algbw_gbs * op.bus_factor(ranks),
        wrong: 0,
        rank_time_us: vec![time_us * 0.99, time_us * 1.01],
    }
}

/// A row of two ranks at f32; `times` are the out-of-place and in-place microseconds.
fn row(op: Collective, redop: Option<RedOp>, bytes: usize, times: Option<(f64, f64)>) -> NcclRow {
    NcclRow {
        op,
        dtype: DType::F32,
        redop,
        root: matches!(op, Collective::Broadcast | Collective::Reduce).then_some(0),
        bytes,
        count: bytes / 4,
        out_of_place: times.map(|(out, _)| figure(op, bytes, 2, out)),
        in_place: times.map(|(_, inp)| figure(op, bytes, 2, inp)),
        status: RowStatus::Ok,
        pytorch: None,
    }
}

fn gpu(rank: usize, host: &str, ordinal: usize) -> RankGpu {
    RankGpu {
        rank,
        host: host.into(),
        pid: 31_337 + rank as u32,
        ordinal,
        name: H100.into(),
    }
}

/// nccl-tests' closing figure: the mean busbw over every figure of the rows.
fn avg_busbw(rows: &[NcclRow]) -> Option<f64> {
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| [&r.out_of_place, &r.in_place])
        .flatten()
        .map(|f| f.busbw_gbs)
        .collect();
    (!all.is_empty()).then(|| all.iter().sum::<f64>() / all.len() as f64)
}

#[test]
fn nccl_two_gpus_over_nvlink() {
    let sum = Some(RedOp::Sum);
    let mut rows = vec![
        row(Collective::AllReduce, sum, 8, Some((11.2, 11.0))),
        row(Collective::AllReduce, sum, 1 << 20, Some((14.8, 14.6))),
        row(Collective::AllReduce, sum, 64 << 20, Some((215.0, 213.4))),
        row(Collective::AllReduce, sum, 1 << 30, Some((2870.0, 2861.5))),
    ];
    rows[2].pytorch = Some(pytorch(309.6, 1.01, &[0.99, 1.01, 1.03]));
    rows[3].pytorch = Some(pytorch(371.2, 1.01, &[1.00, 1.01, 1.02]));
    rows.push(row(
        Collective::AllGather,
        None,
        1 << 20,
        Some((11.9, 11.4)),
    ));
    rows.push(row(
        Collective::AllGather,
        None,
        64 << 20,
        Some((96.0, 95.1)),
    ));
    rows.push(row(
        Collective::Broadcast,
        None,
        64 << 20,
        Some((186.7, 185.2)),
    ));
    // As the benchmark marks a row whose output was wrong: figures measured, status failed.
    // Its figures are the best of the run: the link's note must not quote them.
    let mut wrong = row(Collective::Broadcast, None, 1 << 30, Some((2752.0, 2749.1)));
    if let Some(f) = wrong.in_place.as_mut() {
        f.wrong = 1024;
    }
    wrong.status = RowStatus::Failed(
        "broadcast f32 1073741824: 1024 output element(s) differ from the exact result".into(),
    );
    rows.push(wrong);
    let report = NcclReport {
        ranks: 2,
        processes: 1,
        launcher: None,
        gpus: vec![gpu(0, "dgx-07", 0), gpu(1, "dgx-07", 1)],
        nccl_version: "2.26.2".into(),
        nccl_env: vec![("NCCL_DEBUG".into(), "WARN".into())],
        iterations: 20,
        repeats: 5,
        warmup: 5,
        graph: false,
        link: Some(Link {
            label: "NV18 (NVLink 4)".into(),
            gbs_each_way: Some(450.0),
        }),
        avg_busbw_gbs: avg_busbw(&rows),
        setup_ms: 812.0,
        rows,
    };
    let sections = nccl_sections(&report);
    // One table per collective (and dtype and reduction); PyTorch's columns only where it ran.
    assert_eq!(sections.len(), 3);
    let text = terminal(&sections);
    assert!(
        text.contains("the best busbw here is 375.2 GB/s (83%)"),
        "{text}"
    );
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    assert_drawn("nccl_two_gpus", &sections);
}

#[test]
fn nccl_launched_over_two_nodes() {
    let max = Some(RedOp::Max);
    let mut rows = vec![
        row(Collective::AllReduce, max, 1 << 20, Some((38.5, 38.1))),
        row(
            Collective::AllReduce,
            max,
            256 << 20,
            Some((5712.0, 5698.3)),
        ),
    ];
    for r in &mut rows {
        r.dtype = DType::Bf16;
        r.count = r.bytes / 2;
    }
    let report = NcclReport {
        ranks: 2,
        processes: 2,
        launcher: Some("torchrun".into()),
        gpus: vec![gpu(0, "node-a", 0), gpu(1, "node-b", 0)],
        nccl_version: "2.26.2".into(),
        nccl_env: vec![
            ("NCCL_IB_HCA".into(), "mlx5_0".into()),
            ("NCCL_SOCKET_IFNAME".into(), "ens5".into()),
        ],
        iterations: 20,
        repeats: 5,
        warmup: 5,
        graph: true,
        // The two GPUs are on different machines: NVML cannot say what joins them.
        link: None,
        avg_busbw_gbs: avg_busbw(&rows),
        setup_ms: 2140.0,
        rows,
    };
    assert_drawn("nccl_launched", &nccl_sections(&report));
}
