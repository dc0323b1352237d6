//! `gpukit bench p2p`: copies between every pair of GPUs (one way, both ways at once, and the
//! latency of a tiny copy), beside the link NVML reports for the pair: the measured counterpart
//! of `check`'s peer-access matrix.
//!
//! To use: [`run_p2p`] with [`P2pOptions`]; every copy is checked byte for byte.

use crate::error::{Error, Result};
use crate::figures::*;
use crate::part::{Context, Outcome, Part};
use crate::report::{judge_rows, Document, PeerFigure, RowStatus};
use crate::stats::Summary;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::transfer::{copy_peer, enable_peer_access};
use gpukit_cuda::{DeviceBuffer, Gpu};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone)]
pub struct P2pOptions {
    /// Bytes of one copy (bandwidth rows).
    pub bytes: usize,
    /// Timed copies per sample.
    pub iterations: usize,
    /// Samples (each `iterations` copies between two events).
    pub repeats: usize,
    pub compare_pytorch: bool,
}

impl Default for P2pOptions {
    fn default() -> Self {
        P2pOptions {
            bytes: 256 << 20,
            iterations: 10,
            repeats: 10,
            compare_pytorch: false,
        }
    }
}

/// One ordered pair of GPUs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct P2pRow {
    pub src: usize,
    pub dst: usize,
    /// As nvidia-smi topo prints it (`NV18 (NVLink 4)`, `PCIe (host bridge)`).
    pub link: String,
    /// The direct NVLinks' datasheet bandwidth each way, when NVML reports them.
    pub link_gbs: Option<f64>,
    /// Whether the pair copies directly (peer access); without it copies go through the host.
    pub peer_access: bool,
    pub bytes: usize,
    /// One way, src -> dst: median GB/s of the samples.
    pub one_way_gbs: Option<f64>,
    pub one_way_p10_gbs: Option<f64>,
    pub one_way_p90_gbs: Option<f64>,
    /// src -> dst and dst -> src at once: the bytes of both directions over the slower one's
    /// time.
    pub both_ways_gbs: Option<f64>,
    /// A 4-byte copy, back to back: microseconds per copy.
    pub latency_us: Option<f64>,
    pub verified: bool,
    pub status: RowStatus,
    /// PyTorch's `tensor.to(dst)` of the same size (rate: GB/s one way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pytorch: Option<PeerFigure>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct P2pReport {
    pub gpus: Vec<String>,
    pub rows: Vec<P2pRow>,
}

fn gbs(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e6)
}

/// Times `copies` (which queue `iterations` copies each call) `repeats` times between events on
/// `gpu`'s stream; milliseconds per copy.
fn sample(
    gpu: &Gpu,
    iterations: usize,
    repeats: usize,
    mut copies: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    copies()?;
    gpu.synchronize()?;
    let mut out = Vec::new();
    for _ in 0..repeats {
        let a = gpu.stream().record_timed()?;
        copies()?;
        let b = gpu.stream().record_timed()?;
        b.synchronize()?;
        out.push(a.elapsed_ms(&b)? / iterations as f64);
    }
    Ok(out)
}

struct Side {
    gpu: Gpu,
    src: DeviceBuffer,
    dst: DeviceBuffer,
}

impl Side {
    /// Queues a copy of `bytes` from this GPU's source buffer into `to`'s destination buffer,
    /// on this GPU's stream.
    fn copy_to(&self, to: &Side, bytes: usize) -> Result<()> {
        copy_peer(
            self.gpu.stream(),
            to.dst.view(),
            &to.gpu,
            self.src.view(),
            &self.gpu,
            bytes,
        )?;
        Ok(())
    }
}

fn measure_pair(
    a: &Side,
    b: &Side,
    link: Option<gpukit_cuda::nvml::PeerLink>,
    o: &P2pOptions,
) -> Result<P2pRow> {
    let n = o.bytes;
    let peer_access = enable_peer_access(&a.gpu, &b.gpu)? && enable_peer_access(&b.gpu, &a.gpu)?;
    // a copy of a random pattern must arrive byte for byte
    let pattern: Vec<u8> = (0..n)
        .map(|i| {
            (i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(17) as u8
        })
        .collect();
    a.gpu.upload_into(a.src.view(), &pattern)?;
    b.gpu.fill(b.dst.view(), 0)?;
    b.gpu.synchronize()?;
    a.copy_to(b, n)?;
    a.gpu.synchronize()?;
    let verified = b.gpu.download_from(b.dst.view(), n)? == pattern;
    let it = o.iterations;
    let one = sample(&a.gpu, it, o.repeats, || {
        for _ in 0..it {
            a.copy_to(b, n)?;
        }
        Ok(())
    })?;
    // both directions at once: each direction timed on its own source's stream
    let mut both = Vec::new();
    for _ in 0..o.repeats {
        a.gpu.synchronize()?;
        b.gpu.synchronize()?;
        let (sa, sb) = (
            a.gpu.stream().record_timed()?,
            b.gpu.stream().record_timed()?,
        );
        for _ in 0..it {
            a.copy_to(b, n)?;
            b.copy_to(a, n)?;
        }
        let (ea, eb) = (
            a.gpu.stream().record_timed()?,
            b.gpu.stream().record_timed()?,
        );
        ea.synchronize()?;
        eb.synchronize()?;
        let slower = sa.elapsed_ms(&ea)?.max(sb.elapsed_ms(&eb)?);
        both.push(gbs(2 * n * it, slower));
    }
    let tiny = 1000;
    let lat = sample(&a.gpu, tiny, 5, || {
        for _ in 0..tiny {
            a.copy_to(b, 4)?;
        }
        Ok(())
    })?;
    let rates: Vec<f64> = one.iter().map(|ms| gbs(n, *ms)).collect();
    let r = Summary::of(&rates);
    let status = if verified {
        RowStatus::Ok
    } else {
        RowStatus::Failed(format!(
            "cuda:{} -> cuda:{}: the copy did not arrive byte for byte",
            a.gpu.ordinal, b.gpu.ordinal
        ))
    };
    Ok(P2pRow {
        src: a.gpu.ordinal,
        dst: b.gpu.ordinal,
        link: link
            .as_ref()
            .map_or_else(|| "unknown".into(), |l| l.label()),
        link_gbs: link.as_ref().and_then(|l| l.nvlink_gbs_each_way()),
        peer_access,
        bytes: n,
        one_way_gbs: r.as_ref().map(|s| s.median),
        one_way_p10_gbs: r.as_ref().map(|s| s.p10),
        one_way_p90_gbs: r.as_ref().map(|s| s.p90),
        both_ways_gbs: Summary::of(&both).map(|s| s.median),
        latency_us: Summary::of(&lat).map(|s| s.median * 1e3),
        verified,
        status,
        pytorch: None,
    })
}

/// Measures every ordered pair of GPUs. Needs at least two.
pub fn run_p2p(
    discovery: &Discovery,
    o: &P2pOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<(P2pReport, Option<Result<String>>)> {
    let count = gpukit_cuda::driver::probe(discovery)
        .map_err(|e| Error::Unavailable(format!("bench p2p needs GPUs: {e}")))?
        .device_count;
    if count < 2 {
        return Err(Error::Unavailable(format!(
            "bench p2p copies between GPUs: this machine has {count} CUDA device"
        )));
    }
    let nvml = gpukit_cuda::nvml::NvmlSession::open(discovery).ok();
    let mut sides = Vec::new();
    for i in 0..count {
        let gpu = Gpu::open(discovery, i)?;
        let (src, dst) = (gpu.alloc(o.bytes)?, gpu.alloc(o.bytes)?);
        sides.push(Side { gpu, src, dst });
    }
    let attrs: Vec<_> = (0..count)
        .map(|i| gpukit_cuda::driver::device_attributes(i, count))
        .collect::<gpukit_cuda::Result<_>>()?;
    let mut rows = Vec::new();
    for a in 0..count {
        for b in 0..count {
            if a == b {
                continue;
            }
            progress(&format!("cuda:{a} -> cuda:{b}"));
            let link = nvml
                .as_ref()
                .and_then(|n| n.peer_link(&attrs[a].uuid, &attrs[b].uuid).ok());
            rows.push(measure_pair(&sides[a], &sides[b], link, o)?);
        }
    }
    let mut report = P2pReport {
        gpus: attrs.iter().map(|a| a.name.clone()).collect(),
        rows,
    };
    drop(sides);
    let peer = o
        .compare_pytorch
        .then(|| compare_pytorch(&mut report, o, progress));
    Ok((report, peer))
}

fn compare_pytorch(
    report: &mut P2pReport,
    o: &P2pOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<String> {
    progress("PyTorch: tensor.to(other GPU)");
    let run = crate::peer::run_pytorch(&[
        "p2p".to_string(),
        "--bytes".into(),
        o.bytes.to_string(),
        "--iterations".into(),
        o.iterations.to_string(),
        "--repeats".into(),
        o.repeats.to_string(),
    ])?;
    for r in &run.results {
        let (Some(src), Some(dst), Some(ms), Some(rate)) = (
            r["src"].as_u64(),
            r["dst"].as_u64(),
            r["median_ms"].as_f64(),
            r["gbs"].as_f64(),
        ) else {
            continue;
        };
        if let Some(row) = report
            .rows
            .iter_mut()
            .find(|x| x.src as u64 == src && x.dst as u64 == dst)
        {
            row.pytorch = row
                .one_way_gbs
                .map(|ours| PeerFigure::single(ms, rate, ours));
        }
    }
    Ok(run.torch_version)
}

pub fn document(report: P2pReport, peer: Option<&Result<String>>) -> Document<P2pReport> {
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench p2p", report, failure).with_peer(peer)
}

/// `bench p2p` under `gpukit all`, where there are several GPUs and all are selected.
pub struct P2pPart;

/// The p2p part of `gpukit all`.
pub static PART: P2pPart = P2pPart;

impl Part for P2pPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        p2p_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "p2p"
    }
    fn command(&self) -> &'static str {
        "bench p2p"
    }
    fn title(&self) -> &'static str {
        "Several GPUs: copies between them"
    }
    fn wanted(&self, ctx: &Context<'_>) -> bool {
        ctx.several_gpus()
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        Ok(Outcome::of(
            "bench p2p",
            run_p2p(ctx.discovery, &P2pOptions::default(), progress).map(|(r, _)| r),
        ))
    }
}

// `gpukit compare`'s figures of this command's section.
/// `bench p2p`: one-way GB/s per ordered pair of GPUs and copy size, with its p10-p90 range
/// (the report does not say over how many samples, so such a figure is judged only when the
/// change stays within the threshold or the ranges overlap).
fn p2p_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "p2p",
        unit: "GB/s",
        better: Better::Higher,
        timed: false,
        exact: false,
    };
    for row in rows(section) {
        let (Some(src), Some(dst)) = (text(row, "src"), text(row, "dst")) else {
            continue;
        };
        let size = row
            .get("bytes")
            .and_then(Value::as_u64)
            .map(|b| format!(" {}", bytes_name(b)))
            .unwrap_or_default();
        let Some(mut f) = row_figure(
            &spec,
            format!("cuda:{src} -> cuda:{dst}{size} one way"),
            row,
            "one_way_gbs",
        ) else {
            continue;
        };
        if f.reading.value.is_some() {
            if let (Some(lo), Some(hi)) = (
                positive(row.get("one_way_p10_gbs")),
                positive(row.get("one_way_p90_gbs")),
            ) {
                f.reading.spread = Some([lo, hi]);
            }
        }
        out.push(f);
    }
}
