//! `bench bandwidth`: host<->device copies from pageable and pinned memory, a staged pageable
//! path, device->device, and both directions at once; every copy checked byte-exact and placed
//! against the PCIe link and the memory's peak.

use crate::error::Result;
use crate::figures::*;
use crate::gpu::{describe_gpu, GpuFacts};
use crate::measure::{
    both_orders, device_samples, gbs, host_samples, Block, Clock, Measurement, PeerSamples, Plan,
};
use crate::part::{row_statuses, Context, Outcome, Part};
use crate::peer::PeerServer;
use crate::random::{fill_bytes, fresh_seed};
use crate::report::{judge_rows, Document, PeerFigure, RowStatus};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::transfer::{copy_d2d, copy_d2h, copy_h2d, h2d_staged, PinnedBytes};
use gpukit_cuda::{DeviceBuffer, Gpu, Stream};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// Which copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    /// Host->device from ordinary (pageable) memory: the driver stages it.
    H2dPageable,
    /// The same source through gpukit's double-buffered pinned staging.
    H2dPageableStaged,
    H2dPinned,
    D2hPinned,
    D2hPageable,
    /// Device->device; its rate also counts bytes read plus bytes written.
    D2d,
    /// Host->device and device->host at once, pinned, on two streams.
    Bidirectional,
}

impl CopyKind {
    pub const ALL: [CopyKind; 7] = [
        CopyKind::H2dPageable,
        CopyKind::H2dPageableStaged,
        CopyKind::H2dPinned,
        CopyKind::D2hPinned,
        CopyKind::D2hPageable,
        CopyKind::D2d,
        CopyKind::Bidirectional,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CopyKind::H2dPageable => "host->device, pageable",
            CopyKind::H2dPageableStaged => "host->device, pageable via staging",
            CopyKind::H2dPinned => "host->device, pinned",
            CopyKind::D2hPinned => "device->host, pinned",
            CopyKind::D2hPageable => "device->host, pageable",
            CopyKind::D2d => "device->device",
            CopyKind::Bidirectional => "both directions at once, pinned",
        }
    }

    /// PyTorch's name for the same copy in scripts/pytorch_reference.py.
    pub fn pytorch_kind(self) -> Option<&'static str> {
        match self {
            CopyKind::H2dPageable | CopyKind::H2dPageableStaged => Some("h2d_pageable"),
            CopyKind::H2dPinned => Some("h2d_pinned"),
            CopyKind::D2hPinned => Some("d2h_pinned"),
            CopyKind::D2hPageable => Some("d2h_pageable"),
            CopyKind::D2d => Some("d2d"),
            CopyKind::Bidirectional => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BandwidthOptions {
    pub sizes_bytes: Vec<usize>,
    pub ordinal: usize,
    /// Repetitions for large copies; small ones (latency-bound) get 10x as many.
    pub iterations: usize,
    /// Chunk of the staged path.
    pub staging_chunk_bytes: usize,
    /// With PyTorch beside: blocks each side runs per row, half of the rounds opened by each
    /// (`harness::both_orders`).
    pub rounds: usize,
}

impl Default for BandwidthOptions {
    fn default() -> Self {
        BandwidthOptions {
            sizes_bytes: vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30],
            ordinal: 0,
            iterations: 20,
            // one 1 MiB piece for each of 16 threads; 8 MiB was slower in every pairing
            staging_chunk_bytes: 16 << 20,
            rounds: 6,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BandwidthRow {
    pub kind: CopyKind,
    pub bytes: usize,
    pub status: RowStatus,
    pub timing: Option<Measurement>,
    /// Payload bytes per second (1e9), per direction summed for `Bidirectional`.
    pub gbs: Option<f64>,
    /// Device->device only: bytes read plus bytes written per second.
    pub gbs_read_write: Option<f64>,
    /// Median time of one copy in microseconds (what matters for small copies).
    pub latency_us: Option<f64>,
    /// Percent of the PCIe link's payload rate (one direction; both for `Bidirectional`).
    pub pct_of_link: Option<f64>,
    /// Device->device: percent of the memory's peak (datasheet or estimate); none when the
    /// copy fits in L2 (then it is not a memory figure).
    pub pct_of_memory_peak: Option<f64>,
    /// Device->device whose source and destination fit in the L2 cache together.
    #[serde(default)]
    pub in_l2: bool,
    /// Every byte of the destination compared with the source after the timed copies.
    pub verified: bool,
    pub pytorch: Option<PeerFigure>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BandwidthReport {
    pub gpu: Option<GpuFacts>,
    pub gpu_unavailable: Option<String>,
    pub pcie_link_gbs: Option<f64>,
    pub memory_peak_gbs: Option<f64>,
    /// The GPU's L2 cache (device->device copies that fit are marked, not placed against DRAM).
    #[serde(default)]
    pub l2_cache_bytes: Option<u64>,
    pub staging_chunk_bytes: usize,
    /// Blocks per side when PyTorch took turns (`run_bandwidth_with_pytorch`).
    #[serde(default)]
    pub rounds: usize,
    pub rows: Vec<BandwidthRow>,
}

/// Host copy spread over threads: one thread cannot feed a PCIe 5 x16 link. One piece a
/// thread (at least 64 KiB): with 1 MiB pieces of an 8 MiB staging chunk, half of 16 threads sat
/// idle and staging ran at 24-25 GB/s; one piece for each of 16 threads reached 38-40.
fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let piece = dst
        .len()
        .div_ceil(rayon::current_num_threads().max(1))
        .next_multiple_of(4096)
        .max(64 << 10);
    dst.par_chunks_mut(piece)
        .zip(src.par_chunks(piece))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// All the buffers one size needs.
struct Buffers {
    src: Vec<u8>,
    pinned_src: PinnedBytes,
    pinned_dst: PinnedBytes,
    pageable_dst: Vec<u8>,
    dev_a: DeviceBuffer,
    dev_b: DeviceBuffer,
    staging: [PinnedBytes; 2],
}

impl Buffers {
    fn new(gpu: &Gpu, bytes: usize, chunk: usize) -> gpukit_cuda::Result<Buffers> {
        let mut src = vec![0u8; bytes];
        fill_bytes(&mut src, fresh_seed());
        let mut pinned_src = PinnedBytes::new(gpu, bytes, true)?;
        parallel_copy(pinned_src.as_mut_slice(), &src);
        Ok(Buffers {
            pinned_src,
            pinned_dst: PinnedBytes::new(gpu, bytes, false)?,
            pageable_dst: vec![0u8; bytes],
            dev_a: gpu.alloc(bytes)?,
            dev_b: gpu.alloc(bytes)?,
            staging: [
                PinnedBytes::new(gpu, chunk.min(bytes), true)?,
                PinnedBytes::new(gpu, chunk.min(bytes), true)?,
            ],
            src,
        })
    }
}

/// The JSON document of `bench bandwidth`: the report, PyTorch's outcome and how the turns were
/// taken, and the verdict (a copy that did not arrive byte-exact fails the run).
pub fn document(
    report: BandwidthReport,
    peer: Option<&Result<String>>,
) -> Document<BandwidthReport> {
    let mut notes = Vec::new();
    if matches!(peer, Some(Ok(_))) {
        notes.push(format!(
            "turns: gpukit and PyTorch timed each copy in {} alternating blocks, gpukit opening \
             half of the rounds and PyTorch the rest; gpukit / PyTorch is the geometric mean of \
             the two halves' median round ratios (lowest-highest round in brackets). PyTorch's \
             figure beside the staged path is its own pageable copy",
            report.rounds
        ));
    }
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench bandwidth", report, failure)
        .with_peer(peer)
        .with_notes(notes)
}

/// Runs every copy kind at every size on one GPU.
pub fn run_bandwidth(
    discovery: &Discovery,
    opts: &BandwidthOptions,
    progress: &mut dyn FnMut(&str),
) -> BandwidthReport {
    run_bandwidth_turns(discovery, opts, &mut None, progress)
}

/// `run_bandwidth` with PyTorch taking turns on every copy it has (two figures compare only
/// when both sides took turns on the same chip, in both orders: see `harness::interleave`):
/// its version (and any rows it gave no figure for), or why it could not run.
pub fn run_bandwidth_with_pytorch(
    discovery: &Discovery,
    opts: &BandwidthOptions,
    progress: &mut dyn FnMut(&str),
) -> (BandwidthReport, Result<String>) {
    let server = match PeerServer::start("cuda", None) {
        Ok(s) => s,
        Err(e) => return (run_bandwidth(discovery, opts, progress), Err(e)),
    };
    let version = server.torch_version.clone();
    let mut turns = Some(CopyTurns {
        server,
        missed: Vec::new(),
    });
    let report = run_bandwidth_turns(discovery, opts, &mut turns, progress);
    let missed = turns.map(|t| t.missed).unwrap_or_default();
    (report, Ok(crate::peer::outcome_line(version, &missed)))
}

/// The PyTorch reference taking turns, and the rows it gave no figure for.
struct CopyTurns {
    server: PeerServer,
    missed: Vec<String>,
}

fn run_bandwidth_turns(
    discovery: &Discovery,
    opts: &BandwidthOptions,
    turns: &mut Option<CopyTurns>,
    progress: &mut dyn FnMut(&str),
) -> BandwidthReport {
    let mut report = BandwidthReport {
        gpu: None,
        gpu_unavailable: None,
        pcie_link_gbs: None,
        memory_peak_gbs: None,
        l2_cache_bytes: None,
        staging_chunk_bytes: opts.staging_chunk_bytes,
        rounds: opts.rounds,
        rows: Vec::new(),
    };
    let (gpu, facts) = match (
        Gpu::open(discovery, opts.ordinal),
        describe_gpu(discovery, opts.ordinal),
    ) {
        (Ok(g), Ok(f)) => (g, f),
        (Err(e), _) => {
            report.gpu_unavailable = Some(e.to_string());
            return report;
        }
        (_, Err(e)) => {
            report.gpu_unavailable = Some(e.to_string());
            return report;
        }
    };
    report.pcie_link_gbs = facts.pcie_max_gbs;
    report.memory_peak_gbs = facts.peaks.memory_gbs;
    report.l2_cache_bytes = facts.l2_cache_bytes;
    report.gpu = Some(facts);
    let stream2 = match gpu.new_stream() {
        Ok(s) => s,
        Err(e) => {
            report.gpu_unavailable = Some(e.to_string());
            return report;
        }
    };
    for &bytes in &opts.sizes_bytes {
        progress(&format!("bandwidth {} bytes", bytes));
        let free = gpu.mem_info().map(|(f, _)| f as usize).unwrap_or(0);
        // source, pinned source and destination, pageable destination: four host copies
        let guard = gpukit_types::resources::Need::host(format!("copies of {bytes} bytes"))
            .with(
                "the source, its pinned copy and two destinations",
                (bytes as u64).checked_mul(4),
            )
            .check_host("lower --sizes");
        if let Err(refused) = guard {
            for kind in CopyKind::ALL {
                report.rows.push(skipped(kind, bytes, refused.to_string()));
            }
            continue;
        }
        if bytes.saturating_mul(2) > free {
            for kind in CopyKind::ALL {
                report.rows.push(skipped(
                    kind,
                    bytes,
                    format!("needs {} bytes of GPU memory, {free} free", 2 * bytes),
                ));
            }
            continue;
        }
        let mut bufs = match Buffers::new(&gpu, bytes, opts.staging_chunk_bytes) {
            Ok(b) => b,
            Err(e) => {
                for kind in CopyKind::ALL {
                    report
                        .rows
                        .push(skipped(kind, bytes, format!("allocating buffers: {e}")));
                }
                continue;
            }
        };
        let reps = if bytes <= 1 << 20 {
            opts.iterations * 10
        } else {
            opts.iterations
        };
        let plan = Plan::new(3, reps);
        for kind in CopyKind::ALL {
            if kind == CopyKind::Bidirectional && bytes < 1 << 20 {
                continue; // latency-bound: says nothing about the link
            }
            let row = match measure(&gpu, &stream2, kind, &mut bufs, plan, opts.rounds, turns) {
                Ok((timing, verified, theirs)) => {
                    let mut row = finish(kind, bytes, timing, verified, &report);
                    row.pytorch = row.gbs.and_then(|ours| {
                        PeerFigure::from_turns(theirs, |ms| gbs(bytes as f64, ms), ours)
                    });
                    row
                }
                Err(e) => {
                    let mut r = skipped(kind, bytes, String::new());
                    r.status = RowStatus::Failed(e.to_string());
                    r
                }
            };
            report.rows.push(row);
        }
    }
    report
}

fn skipped(kind: CopyKind, bytes: usize, why: String) -> BandwidthRow {
    BandwidthRow {
        kind,
        bytes,
        status: RowStatus::Skipped(why),
        timing: None,
        gbs: None,
        gbs_read_write: None,
        latency_us: None,
        pct_of_link: None,
        pct_of_memory_peak: None,
        in_l2: false,
        verified: false,
        pytorch: None,
    }
}

fn finish(
    kind: CopyKind,
    bytes: usize,
    timing: Measurement,
    verified: bool,
    report: &BandwidthReport,
) -> BandwidthRow {
    let ms = timing.summary_ms.median;
    let payload = if kind == CopyKind::Bidirectional {
        2 * bytes
    } else {
        bytes
    };
    let rate = gbs(payload as f64, ms);
    let rw = (kind == CopyKind::D2d).then(|| gbs(2.0 * bytes as f64, ms));
    let in_l2 = kind == CopyKind::D2d
        && report
            .l2_cache_bytes
            .is_some_and(|l2| 2 * bytes as u64 <= l2);
    let link = match kind {
        CopyKind::D2d => None,
        CopyKind::Bidirectional => report.pcie_link_gbs.map(|l| 100.0 * rate / (2.0 * l)),
        _ => report.pcie_link_gbs.map(|l| 100.0 * rate / l),
    };
    BandwidthRow {
        kind,
        bytes,
        status: if verified {
            RowStatus::Ok
        } else {
            RowStatus::Failed("destination differs from the source".into())
        },
        gbs: verified.then_some(rate),
        gbs_read_write: rw.filter(|_| verified),
        latency_us: verified.then_some(ms * 1e3),
        pct_of_link: link.filter(|_| verified),
        pct_of_memory_peak: rw
            .zip(report.memory_peak_gbs)
            .map(|(r, p)| 100.0 * r / p)
            .filter(|_| verified && !in_l2),
        in_l2,
        timing: Some(timing),
        verified,
        pytorch: None,
    }
}

/// Times one kind, in turns with PyTorch when it is beside and has the same copy, then checks
/// the destination byte for byte.
fn measure(
    gpu: &Gpu,
    stream2: &Stream,
    kind: CopyKind,
    b: &mut Buffers,
    plan: Plan,
    rounds: usize,
    turns: &mut Option<CopyTurns>,
) -> Result<(Measurement, bool, Option<PeerSamples>)> {
    let s = gpu.stream();
    let bytes = b.src.len();
    // poison the destination first so a copy that did nothing cannot pass
    let poison = |gpu: &Gpu, d: &mut DeviceBuffer| gpu.fill(d.view(), 0);
    match kind {
        CopyKind::H2dPageable | CopyKind::H2dPageableStaged | CopyKind::H2dPinned => {
            poison(gpu, &mut b.dev_a)?
        }
        CopyKind::D2hPinned => {
            copy_h2d(s, &b.src, &mut b.dev_a)?;
            b.pinned_dst.as_mut_slice().fill(0);
        }
        CopyKind::D2hPageable => {
            copy_h2d(s, &b.src, &mut b.dev_a)?;
            b.pageable_dst.fill(0);
        }
        CopyKind::D2d => {
            copy_h2d(s, &b.src, &mut b.dev_a)?;
            poison(gpu, &mut b.dev_b)?;
        }
        CopyKind::Bidirectional => {
            copy_h2d(s, &b.src, &mut b.dev_a)?;
            s.synchronize()?;
            poison(gpu, &mut b.dev_b)?;
            b.pinned_dst.as_mut_slice().fill(0);
        }
    }
    let clock = match kind {
        CopyKind::H2dPageableStaged | CopyKind::Bidirectional => Clock::Host,
        _ => Clock::CudaEvents,
    };
    let (samples, planned, theirs) = {
        let mut ours: Box<dyn FnMut(Plan) -> Result<Vec<f64>> + '_> = match kind {
            CopyKind::H2dPageable => {
                Box::new(|p| device_samples(s, p, || copy_h2d(s, &b.src, &mut b.dev_a)))
            }
            CopyKind::H2dPageableStaged => {
                let (src, dev, staging) = (&b.src, &mut b.dev_a, &mut b.staging);
                Box::new(move |p| {
                    host_samples(p, || {
                        h2d_staged(s, src, dev, staging, &parallel_copy)?;
                        s.synchronize()
                    })
                })
            }
            CopyKind::H2dPinned => Box::new(|p| {
                device_samples(s, p, || copy_h2d(s, b.pinned_src.as_slice(), &mut b.dev_a))
            }),
            CopyKind::D2hPinned => Box::new(|p| {
                device_samples(s, p, || copy_d2h(s, &b.dev_a, b.pinned_dst.as_mut_slice()))
            }),
            CopyKind::D2hPageable => {
                Box::new(|p| device_samples(s, p, || copy_d2h(s, &b.dev_a, &mut b.pageable_dst)))
            }
            CopyKind::D2d => {
                Box::new(|p| device_samples(s, p, || copy_d2d(s, &b.dev_a, &mut b.dev_b, bytes)))
            }
            CopyKind::Bidirectional => {
                // dev_a -> host on stream 2 while host -> dev_b on stream 1
                let (pin_src, pin_dst, dev_a, dev_b) =
                    (&b.pinned_src, &mut b.pinned_dst, &b.dev_a, &mut b.dev_b);
                Box::new(move |p| {
                    host_samples(p, || -> gpukit_cuda::Result<()> {
                        copy_h2d(s, pin_src.as_slice(), dev_b)?;
                        copy_d2h(stream2, dev_a, pin_dst.as_mut_slice())?;
                        s.synchronize()?;
                        stream2.synchronize()?;
                        Ok(())
                    })
                })
            }
        };
        time_copy(&mut *ours, plan, rounds, turns, kind, bytes)?
    };
    s.synchronize()?;
    let verified = match kind {
        CopyKind::H2dPageable | CopyKind::H2dPageableStaged | CopyKind::H2dPinned => {
            gpu.download(&b.dev_a)? == b.src
        }
        CopyKind::D2hPinned => b.pinned_dst.as_slice() == b.src.as_slice(),
        CopyKind::D2hPageable => b.pageable_dst == b.src,
        CopyKind::D2d => gpu.download(&b.dev_b)? == b.src,
        CopyKind::Bidirectional => {
            b.pinned_dst.as_slice() == b.src.as_slice() && gpu.download(&b.dev_b)? == b.src
        }
    };
    let timing = Measurement::of(clock, planned, &samples)?;
    Ok((timing, verified, theirs))
}

/// Our samples of one copy (and the plan they ran under), alone under `plan`, or with PyTorch's
/// same copy in turns (`harness::both_orders`, `rounds` blocks a side) when it is beside.
fn time_copy(
    ours: Block,
    plan: Plan,
    rounds: usize,
    turns: &mut Option<CopyTurns>,
    kind: CopyKind,
    bytes: usize,
) -> Result<(Vec<f64>, Plan, Option<PeerSamples>)> {
    let (Some(t), Some(theirs_kind)) = (turns.as_mut(), kind.pytorch_kind()) else {
        return Ok((ours(plan)?, plan, None));
    };
    let rounds = rounds.max(1);
    let reps = plan.reps.div_ceil(rounds);
    let server = &mut t.server;
    let mut theirs = |p: Plan| server.copy_block(theirs_kind, bytes, p.warmup, p.reps);
    let plans = (Plan::new(plan.warmup, reps), Plan::new(1, reps));
    let run = both_orders(rounds, plans, Duration::ZERO, ours, &mut theirs);
    let mine = run.ours?;
    let theirs = match run.theirs {
        Err(e) => {
            t.missed
                .push(format!("{} {bytes} bytes: {e}", kind.label()));
            None
        }
        Ok(p) if p.samples.is_empty() => None,
        Ok(p) => Some(p),
    };
    Ok((mine, Plan::new(plan.warmup, reps * rounds), theirs))
}

/// `bench bandwidth` under `gpukit all`, where there is a GPU: a few sizes (two under
/// `--quick`).
pub struct BandwidthPart;

/// The bandwidth part of `gpukit all`.
pub static PART: BandwidthPart = BandwidthPart;

impl Part for BandwidthPart {
    fn figures(&self, section: &serde_json::Value, out: &mut Vec<crate::figures::Figure>) {
        bandwidth_figures(section, out)
    }
    fn key(&self) -> &'static str {
        "bandwidth"
    }
    fn command(&self) -> &'static str {
        "bench bandwidth"
    }
    fn title(&self) -> &'static str {
        "Data transfer"
    }
    fn wanted(&self, ctx: &Context<'_>) -> bool {
        ctx.gpu
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let o = BandwidthOptions {
            ordinal: ctx.ordinal(),
            // 256 MiB is past where the copies reach their rate; at 1 GiB the pageable ones
            // took 14 s of a full run (`bench bandwidth` has them)
            sizes_bytes: if ctx.quick {
                vec![4 << 10, 16 << 20]
            } else {
                vec![4 << 10, 1 << 20, 64 << 20, 256 << 20]
            },
            iterations: if ctx.quick { 5 } else { 10 },
            ..BandwidthOptions::default()
        };
        Ok(Outcome::report(&run_bandwidth(ctx.discovery, &o, progress)))
    }
    fn statuses(&self, report: &serde_json::Value) -> Vec<RowStatus> {
        row_statuses(report)
    }
}

// `gpukit compare`'s figures of this command's section.
/// `bench bandwidth`: GB/s per GPU, kind of copy and size.
fn bandwidth_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "bandwidth",
        unit: "GB/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let gpu = gpu_device(section)
        .map(|d| format!("{d} "))
        .unwrap_or_default();
    for row in rows(section) {
        let (Some(kind), Some(bytes)) =
            (text(row, "kind"), row.get("bytes").and_then(Value::as_u64))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!("{gpu}{kind} {}", bytes_name(bytes)),
            row,
            "gbs",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::time_host;

    #[test]
    fn parallel_copy_copies_every_byte() {
        let mut src = vec![0u8; (3 << 20) + 17];
        fill_bytes(&mut src, 11);
        let mut dst = vec![0u8; src.len()];
        parallel_copy(&mut dst, &src);
        assert_eq!(dst, src);
        // seven threads: seven pieces, the last one short
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(7)
            .build()
            .unwrap();
        let mut dst = vec![0u8; src.len()];
        pool.install(|| parallel_copy(&mut dst, &src));
        assert_eq!(dst, src);
        // below one minimum piece: a single task
        let mut small = vec![0u8; 1000];
        pool.install(|| parallel_copy(&mut small, &src[..1000]));
        assert_eq!(small[..], src[..1000]);
    }

    #[test]
    fn rates_and_fractions() {
        let report = BandwidthReport {
            gpu: None,
            gpu_unavailable: None,
            pcie_link_gbs: Some(63.0),
            memory_peak_gbs: Some(3350.0),
            l2_cache_bytes: Some(50 << 20),
            staging_chunk_bytes: 1,
            rounds: 0,
            rows: vec![],
        };
        let t = time_host(Plan::new(0, 1), || Ok::<(), crate::Error>(())).unwrap();
        let mut m = t.clone();
        m.summary_ms.median = 1.0; // 1 ms
        let r = finish(CopyKind::D2d, 1_000_000_000, m.clone(), true, &report);
        assert!((r.gbs.unwrap() - 1000.0).abs() < 1e-9);
        assert!((r.gbs_read_write.unwrap() - 2000.0).abs() < 1e-9);
        assert!((r.pct_of_memory_peak.unwrap() - 100.0 * 2000.0 / 3350.0).abs() < 1e-9);
        assert_eq!(r.pct_of_link, None);
        assert!(!r.in_l2);
        // 16 MiB each way fits a 50 MiB L2: a cache figure, not placed against DRAM's peak
        let small = finish(CopyKind::D2d, 16 << 20, m.clone(), true, &report);
        assert!(small.in_l2 && small.pct_of_memory_peak.is_none() && small.gbs.is_some());
        let h = finish(CopyKind::H2dPinned, 50_000_000, m.clone(), true, &report);
        assert!((h.pct_of_link.unwrap() - 100.0 * 50.0 / 63.0).abs() < 1e-9);
        let bad = finish(CopyKind::H2dPinned, 50_000_000, m, false, &report);
        assert!(bad.gbs.is_none() && matches!(bad.status, RowStatus::Failed(_)));
    }
}
