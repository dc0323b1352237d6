//! The tests between GPUs, run once the per-GPU tests are done: a copy between every ordered
//! pair (peer to peer where the pair allows it), checked byte for byte and placed against the
//! NVLink rate NVML reports, and an NCCL all-reduce over every tested GPU whose result is
//! counted element by element on each GPU (the pattern kernels `bench nccl` checks with).

use crate::error::{Error, Result};
use crate::measure::{device_samples, gbs, Plan};
use crate::random::{fill_bytes, fresh_seed};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nccl::{self, Comm, RedOp};
use gpukit_cuda::nvml::NvmlSession;
use gpukit_cuda::pattern::{Expect, Pattern};
use gpukit_cuda::transfer::{copy_peer, enable_peer_access};
use gpukit_cuda::{DeviceBuffer, Gpu};
use gpukit_types::DType;
use serde::{Deserialize, Serialize};

/// Bytes of one peer copy.
const PEER_BYTES: usize = 64 << 20;
/// Timed peer copies per pair.
const PEER_COPIES: usize = 10;
/// f32 elements of each GPU's all-reduce buffer (256 MiB).
const REDUCE_COUNT: usize = 64 << 20;
/// All-reduces run and checked.
const REDUCE_ROUNDS: usize = 5;

/// One ordered pair's copy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerCopy {
    pub from: usize,
    pub to: usize,
    /// NVML's link between them (`NV18 (NVLink 4)`, `PCIe (host bridge)`), when it says.
    pub link: Option<String>,
    /// Whether the pair copies peer to peer (else the driver stages through the host).
    pub peer_access: bool,
    pub bytes: u64,
    /// Median of the copies' rates.
    pub gbs: Option<f64>,
    /// Percent of the direct NVLinks' datasheet rate one way, where NVML names them.
    pub pct_of_link: Option<f64>,
    pub verified: bool,
    /// Bytes of the last copy that differed from the source.
    #[serde(default)]
    pub bytes_wrong: u64,
    pub error: Option<String>,
}

/// The all-reduce over every tested GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllReduceCheck {
    pub gpus: Vec<usize>,
    pub dtype: DType,
    /// Elements per GPU.
    pub count: u64,
    pub rounds: u64,
    /// Elements that differed from the exact sum, per GPU (same order as `gpus`).
    pub wrong: Vec<u64>,
    /// nccl-tests' bus bandwidth of the median round (host clock around the group).
    pub busbw_gbs: Option<f64>,
    pub error: Option<String>,
}

/// Everything between GPUs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MultiGpu {
    pub peer_copies: Vec<PeerCopy>,
    pub all_reduce: Option<AllReduceCheck>,
}

/// Runs the tests between the GPUs `ordinals` (whose UUIDs are `uuids`, for NVML's links). An
/// error: the GPUs could not be opened together.
pub(super) fn run_multi(
    discovery: &Discovery,
    ordinals: &[usize],
    uuids: &[String],
    progress: &(dyn Fn(&str) + Sync),
) -> std::result::Result<MultiGpu, String> {
    let mut gpus = Vec::new();
    for &o in ordinals {
        gpus.push(Gpu::open(discovery, o).map_err(|e| format!("opening cuda:{o}: {e}"))?);
    }
    progress("peer copies between every pair of GPUs");
    let nvml = NvmlSession::open(discovery).ok();
    let mut out = MultiGpu::default();
    for a in 0..gpus.len() {
        for b in 0..gpus.len() {
            if a == b {
                continue;
            }
            let link = match (&nvml, uuids.get(a), uuids.get(b)) {
                (Some(n), Some(ua), Some(ub)) => n.peer_link(ua, ub).ok(),
                _ => None,
            };
            let mut row = PeerCopy {
                from: ordinals[a],
                to: ordinals[b],
                link: link.as_ref().map(|l| l.label()),
                peer_access: false,
                bytes: PEER_BYTES as u64,
                gbs: None,
                pct_of_link: None,
                verified: false,
                bytes_wrong: 0,
                error: None,
            };
            if let Err(e) = peer_copy(&gpus[a], &gpus[b], &mut row) {
                row.error = Some(e.to_string());
            }
            row.pct_of_link = row
                .gbs
                .zip(link.and_then(|l| l.nvlink_gbs_each_way()))
                .map(|(r, l)| 100.0 * r / l);
            out.peer_copies.push(row);
        }
    }
    progress("NCCL all-reduce over every GPU");
    let mut check = AllReduceCheck {
        gpus: ordinals.to_vec(),
        dtype: DType::F32,
        count: REDUCE_COUNT as u64,
        rounds: 0,
        wrong: vec![0; gpus.len()],
        busbw_gbs: None,
        error: None,
    };
    if let Err(e) = all_reduce(discovery, &gpus, &mut check) {
        check.error = Some(e.to_string());
    }
    out.all_reduce = Some(check);
    Ok(out)
}

/// Copies a random pattern from `a` to `b` on `a`'s stream, times `PEER_COPIES` more, and
/// checks that the last arrived byte for byte.
fn peer_copy(a: &Gpu, b: &Gpu, row: &mut PeerCopy) -> Result<()> {
    row.peer_access = enable_peer_access(a, b)? && enable_peer_access(b, a)?;
    let mut pattern = vec![0u8; PEER_BYTES];
    fill_bytes(&mut pattern, fresh_seed());
    let src = a.upload(&pattern)?;
    let dst: DeviceBuffer = b.alloc(PEER_BYTES)?;
    b.synchronize()?;
    let samples = device_samples(a.stream(), Plan::new(1, PEER_COPIES), || {
        copy_peer(a.stream(), dst.view(), b, src.view(), a, PEER_BYTES)
    })?;
    a.synchronize()?;
    row.bytes_wrong = super::bytes_differing(&pattern, &b.download(&dst)?);
    row.verified = row.bytes_wrong == 0;
    let mut rates: Vec<f64> = samples
        .iter()
        .map(|&ms| gbs(PEER_BYTES as f64, ms))
        .collect();
    rates.sort_by(f64::total_cmp);
    row.gbs = rates.get(rates.len() / 2).copied().filter(|_| row.verified);
    Ok(())
}

/// `REDUCE_ROUNDS` sum all-reduces of each GPU's pattern (small integers: every sum is exact in
/// f32), each output first poisoned and then counted against the exact sum on its GPU.
fn all_reduce(discovery: &Discovery, gpus: &[Gpu], check: &mut AllReduceCheck) -> Result<()> {
    nccl::require(discovery)?;
    let refs: Vec<&Gpu> = gpus.iter().collect();
    let comms = Comm::init_all(&refs)?;
    let bytes = REDUCE_COUNT * 4;
    let mut ranks = Vec::new();
    for (g, comm) in gpus.iter().zip(&comms) {
        let pattern = Pattern::new(discovery, g)?;
        let send = g.alloc(bytes)?;
        let recv = g.alloc(bytes)?;
        pattern.fill(send.view(), REDUCE_COUNT, DType::F32, comm.rank)?;
        ranks.push((g, comm, pattern, send, recv));
    }
    let n = gpus.len();
    let expect = Expect::Reduced {
        ranks: n,
        max: false,
        min: false,
        offset: 0,
    };
    let mut seconds = Vec::new();
    for _ in 0..REDUCE_ROUNDS {
        for (g, _, _, _, recv) in &ranks {
            g.fill(recv.view(), 0xff)?;
            g.synchronize()?;
        }
        let t = std::time::Instant::now();
        nccl::group(|| {
            for (_, comm, _, send, recv) in &ranks {
                comm.all_reduce(
                    send.view(),
                    recv.view(),
                    REDUCE_COUNT,
                    DType::F32,
                    RedOp::Sum,
                )?;
            }
            Ok(())
        })?;
        for (g, comm, _, _, _) in &ranks {
            g.synchronize()?;
            comm.async_error()?;
        }
        seconds.push(t.elapsed().as_secs_f64());
        for (i, (_, _, pattern, _, recv)) in ranks.iter().enumerate() {
            check.wrong[i] += pattern.count_wrong(recv.view(), REDUCE_COUNT, DType::F32, expect)?;
        }
        check.rounds += 1;
    }
    seconds.sort_by(f64::total_cmp);
    let median = seconds
        .get(seconds.len() / 2)
        .copied()
        .ok_or_else(|| Error::Failed("no all-reduce ran".into()))?;
    // nccl-tests' bus bandwidth of an all-reduce: 2 (n - 1) / n of the bytes a rank holds
    let bus_factor = 2.0 * (n as f64 - 1.0) / n as f64;
    check.busbw_gbs = (median > 0.0).then(|| bus_factor * bytes as f64 / median / 1e9);
    Ok(())
}
