//! `gpukit bench nccl`: one table per collective, dtype and reduction, with nccl-tests' columns
//! (so a figure reads one to one against NVIDIA's tool), and `bench p2p`'s pair table.

use super::fmt::{f1, human_bytes, pct};
use super::{results_table, Columns, Section};
use gpukit_bench::nccl::{Figure, NcclReport, NcclRow};
use gpukit_bench::p2p::{P2pReport, P2pRow};
use gpukit_bench::report::RowStatus;

fn figure_cells(f: Option<&Figure>) -> Vec<String> {
    match f {
        Some(f) => vec![
            format!("{:.2}", f.time_us),
            format!("{:.2}", f.algbw_gbs),
            format!("{:.2}", f.busbw_gbs),
            f.wrong.to_string(),
        ],
        None => vec!["n/a".into(), String::new(), String::new(), String::new()],
    }
}

pub fn nccl_sections(r: &NcclReport) -> Vec<Section> {
    let mut groups: Vec<Vec<&NcclRow>> = Vec::new();
    for row in &r.rows {
        match groups.last_mut() {
            Some(g) if g[0].op == row.op && g[0].dtype == row.dtype && g[0].redop == row.redop => {
                g.push(row)
            }
            _ => groups.push(vec![row]),
        }
    }
    let mut sections: Vec<Section> = groups
        .into_iter()
        .map(|g| {
            let rows: Vec<NcclRow> = g.iter().map(|x| (*x).clone()).collect();
            let (header, body) = results_table(
                &rows,
                Columns {
                    naming: &["size", "count", "type", "redop", "root"],
                    measured: &[
                        "out-of-place us",
                        "algbw GB/s",
                        "busbw GB/s",
                        "#wrong",
                        "in-place us",
                        "algbw GB/s",
                        "busbw GB/s",
                        "#wrong",
                    ],
                    rate_unit: "busbw GB/s (out of place)",
                    name: &|x: &NcclRow| {
                        vec![
                            human_bytes(x.bytes),
                            x.count.to_string(),
                            x.dtype.to_string(),
                            x.redop.map_or("none", |o| o.name()).to_string(),
                            x.root.map_or("-1".into(), |o| o.to_string()),
                        ]
                    },
                    status: &|x| &x.status,
                    values: &|x| {
                        let mut v = figure_cells(x.out_of_place.as_ref());
                        v.extend(figure_cells(x.in_place.as_ref()));
                        v
                    },
                    peer: &|x| x.pytorch.as_ref(),
                    behind: None,
                },
            );
            let first = g[0];
            Section {
                title: format!(
                    "{} {}{}",
                    first.op.name(),
                    first.dtype,
                    first
                        .redop
                        .map(|o| format!(" {}", o.name()))
                        .unwrap_or_default()
                ),
                header: Some(header),
                rows: body,
                notes: Vec::new(),
            }
        })
        .collect();
    if let Some(last) = sections.last_mut() {
        last.notes = nccl_notes(r);
    }
    sections
}

fn nccl_notes(r: &NcclReport) -> Vec<String> {
    let how = match &r.launcher {
        Some(l) => format!("{} processes started by {l}, one GPU each", r.processes),
        None => "one process driving every GPU".into(),
    };
    let gpus: Vec<String> = r
        .gpus
        .iter()
        .map(|g| {
            format!(
                "rank {} = {} cuda:{} ({})",
                g.rank, g.host, g.ordinal, g.name
            )
        })
        .collect();
    let mut notes = vec![
        format!(
            "{} ranks, {how}; NCCL {}; {}.",
            r.ranks,
            r.nccl_version,
            gpus.join(", ")
        ),
        format!(
            "Each time is the mean over ranks of {} collectives back to back between two CUDA events, after {} untimed{}. algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and alltoall, x 1 for broadcast and reduce (nccl-tests' definitions). #wrong: output elements that differ from the exact result, counted on the GPU for every row.",
            r.iterations,
            r.warmup,
            if r.graph { ", replayed as one CUDA graph" } else { "" }
        ),
    ];
    if let Some(l) = &r.link {
        // Only rows whose output was right: a failed row's figures are not shown.
        let best = r
            .rows
            .iter()
            .filter(|x| x.status == RowStatus::Ok)
            .flat_map(|x| [&x.out_of_place, &x.in_place])
            .flatten()
            .map(|f| f.busbw_gbs)
            .fold(0.0, f64::max);
        notes.push(match l.gbs_each_way {
            Some(c) => format!(
                "Link between ranks 0 and 1: {}, {c:.0} GB/s each way on the datasheet; the best busbw here is {best:.1} GB/s ({}).",
                l.label,
                pct(Some(100.0 * best / c))
            ),
            None => format!("Link between ranks 0 and 1: {}.", l.label),
        });
    }
    if let Some(avg) = r.avg_busbw_gbs {
        notes.push(format!(
            "Avg bus bandwidth: {avg:.2} GB/s (over every figure above, as nccl-tests ends)."
        ));
    }
    if !r.nccl_env.is_empty() {
        let env: Vec<String> = r.nccl_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        notes.push(format!(
            "NCCL settings from the environment: {}.",
            env.join(" ")
        ));
    }
    notes
}

pub fn p2p_sections(r: &P2pReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["copy", "link", "peer access", "size"],
            measured: &[
                "one way GB/s (p10-p90)",
                "% of link",
                "both ways GB/s",
                "latency us",
                "check",
            ],
            rate_unit: "GB/s",
            name: &|x: &P2pRow| {
                vec![
                    format!("cuda:{} -> cuda:{}", x.src, x.dst),
                    x.link.clone(),
                    if x.peer_access {
                        "yes"
                    } else {
                        "no (via host)"
                    }
                    .into(),
                    human_bytes(x.bytes),
                ]
            },
            status: &|x| &x.status,
            values: &|x| {
                vec![
                    format!(
                        "{} ({}-{})",
                        f1(x.one_way_gbs),
                        f1(x.one_way_p10_gbs),
                        f1(x.one_way_p90_gbs)
                    ),
                    pct(x.one_way_gbs.zip(x.link_gbs).map(|(g, c)| 100.0 * g / c)),
                    f1(x.both_ways_gbs),
                    f1(x.latency_us),
                    if x.verified { "byte-exact" } else { "MISMATCH" }.into(),
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
            behind: None,
        },
    );
    vec![Section {
        title: format!("Copies between GPUs ({})", r.gpus.join(", ")),
        header: Some(header),
        rows,
        notes: vec![
            "One way: cuMemcpyPeerAsync on the source GPU's stream, timed by its events; both ways: each GPU copying to the other at once, bytes of both directions over the slower one's time; latency: 1,000 copies of 4 bytes back to back, per copy. % of link: of the direct NVLinks' datasheet rate each way (25 GB/s a link for NVLink 2-4, 50 for NVLink 5).".into(),
        ],
    }]
}
