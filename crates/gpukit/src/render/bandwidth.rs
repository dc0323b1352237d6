//! `gpukit bench bandwidth`: one results table of copy rates between host and device memory.

use super::fmt::{f1, human_bytes, pct};
use super::{results_table, Columns, Section};

pub fn bandwidth_sections(r: &gpukit_bench::bandwidth::BandwidthReport) -> Vec<Section> {
    let (header, rows) = results_table(
        &r.rows,
        Columns {
            naming: &["copy", "size"],
            measured: &["median us", "GB/s", "% of link / memory", "check"],
            rate_unit: "GB/s",
            name: &|x: &gpukit_bench::bandwidth::BandwidthRow| {
                vec![x.kind.label().to_string(), human_bytes(x.bytes)]
            },
            status: &|x| &x.status,
            values: &|x| {
                vec![
                    f1(x.latency_us),
                    match (x.gbs, x.gbs_read_write) {
                        (Some(g), Some(rw)) => {
                            format!("{} ({} read+write)", f1(Some(g)), f1(Some(rw)))
                        }
                        (g, _) => f1(g),
                    },
                    if x.in_l2 {
                        "in L2".into()
                    } else {
                        pct(x.pct_of_link.or(x.pct_of_memory_peak))
                    },
                    if x.verified {
                        "byte-exact".into()
                    } else {
                        "MISMATCH".into()
                    },
                ]
            },
            peer: &|x| x.pytorch.as_ref(),
            behind: None,
        },
    );
    let mut notes = vec![format!(
        "PCIe link (one direction, max generation and width): {}; memory peak: {}. Device->device's % is of the memory peak, counting bytes read plus written; \"in L2\": source and destination fit in the {} L2 cache together, so the figure is the cache's, not memory's.",
        r.pcie_link_gbs.map(|g| format!("{g:.1} GB/s")).unwrap_or_else(|| "unknown".into()),
        r.memory_peak_gbs.map(|g| format!("{g:.0} GB/s")).unwrap_or_else(|| "unknown".into()),
        r.l2_cache_bytes.map(|b| human_bytes(b as usize)).unwrap_or_else(|| "unknown".into())
    )];
    notes.push(format!(
        "Staging: pageable memory copied by all CPU threads into two pinned {} buffers in turn, each sent while the other fills.",
        human_bytes(r.staging_chunk_bytes)
    ));
    if let Some(why) = &r.gpu_unavailable {
        notes.push(format!("No GPU: {why}"));
    }
    vec![Section {
        title: "Data transfer".into(),
        header: Some(header),
        rows,
        notes,
    }]
}
