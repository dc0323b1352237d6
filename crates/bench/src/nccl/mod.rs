//! `gpukit bench nccl`: NCCL's collectives over this machine's GPUs (or a launched world's),
//! measured and printed as NVIDIA's nccl-tests does (size, count, type, redop, root, time,
//! algbw, busbw, #wrong for out-of-place and in-place), every result checked on the GPU.
//!
//! To use: [`run_nccl`] with [`NcclOptions`]; `world` is the launcher's world when the process
//! was started by torchrun, srun, mpirun or `gpukit launch` (one GPU per process), None for one
//! process driving `gpus` GPUs. Only rank 0 gets a report back; the other ranks get None.

mod part;
pub use part::{NcclPart, PART};
mod gpu;
pub mod sweep;

use crate::error::{Error, Result};
use crate::report::{judge_rows, Document, PeerFigure, RowStatus};
use gpu::{Case, Local, Timing};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nccl::{Comm, RedOp, UniqueId};
use gpukit_cuda::Gpu;
use gpukit_ranks::rendezvous::{OnLost, Session};
use gpukit_ranks::world::World;
use gpukit_types::DType;
use serde::{Deserialize, Serialize};
use sweep::{Collective, Counts};

/// Out of place (separate send and receive buffers) or in place (one buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    Out,
    In,
}

#[derive(Debug, Clone)]
pub struct NcclOptions {
    /// GPUs of this process in one-process mode (None: every visible GPU).
    pub gpus: Option<usize>,
    pub ops: Vec<Collective>,
    pub dtypes: Vec<DType>,
    pub redops: Vec<RedOp>,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step_factor: usize,
    pub iterations: usize,
    /// Timed blocks of `iterations` per row; each rank's figure is its median block.
    pub repeats: usize,
    pub warmup: usize,
    pub places: Vec<Place>,
    pub root: usize,
    pub graph: bool,
    pub timeout: std::time::Duration,
    pub compare_pytorch: bool,
    /// The launcher's world (one GPU per process), or None.
    pub world: Option<World>,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            gpus: None,
            ops: Collective::ALL.to_vec(),
            dtypes: vec![DType::F32],
            redops: vec![RedOp::Sum],
            min_bytes: 8,
            max_bytes: 1 << 30,
            step_factor: 2,
            iterations: 20,
            repeats: 5,
            warmup: 5,
            places: vec![Place::Out, Place::In],
            root: 0,
            graph: false,
            timeout: std::time::Duration::from_secs(60),
            compare_pytorch: false,
            world: None,
        }
    }
}

/// One place's figures of a row (nccl-tests' columns).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// Mean over ranks of each rank's time per collective.
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    /// Output elements that differ from the exact result, summed over ranks.
    pub wrong: u64,
    /// Each rank's time per collective, in rank order.
    pub rank_time_us: Vec<f64>,
}

impl Figure {
    fn of(op: Collective, bytes: usize, ranks: usize, rank_time_us: Vec<f64>, wrong: u64) -> Self {
        let time_us = rank_time_us.iter().sum::<f64>() / rank_time_us.len().max(1) as f64;
        let algbw_gbs = bytes as f64 / (time_us * 1e3);
        Figure {
            time_us,
            algbw_gbs,
            busbw_gbs: algbw_gbs * op.bus_factor(ranks),
            wrong,
            rank_time_us,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NcclRow {
    pub op: Collective,
    pub dtype: DType,
    /// None for collectives that do not reduce.
    pub redop: Option<RedOp>,
    /// None for collectives without a root.
    pub root: Option<usize>,
    /// nccl-tests' size: bytes of the larger of each rank's two buffers.
    pub bytes: usize,
    pub count: usize,
    pub out_of_place: Option<Figure>,
    pub in_place: Option<Figure>,
    pub status: RowStatus,
    /// torch.distributed's out-of-place figure for the same row (rate: busbw GB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pytorch: Option<PeerFigure>,
}

/// The link between the first two ranks' GPUs, as NVML reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Link {
    /// `NV18 (NVLink 4)`, `PCIe (host bridge)`.
    pub label: String,
    /// The direct NVLinks' datasheet bandwidth each way: the ceiling of a 2-GPU busbw.
    pub gbs_each_way: Option<f64>,
}

/// What NVML says of the link between the GPUs of ranks 0 and 1, when both are on this machine.
fn link_of(discovery: &Discovery, gpus: &[RankGpu]) -> Option<Link> {
    let (a, b) = (gpus.first()?, gpus.get(1)?);
    if a.host != b.host {
        return None;
    }
    let count = gpukit_cuda::driver::probe(discovery).ok()?.device_count;
    let uuid = |o| {
        gpukit_cuda::driver::device_attributes(o, count)
            .ok()
            .map(|x| x.uuid)
    };
    let nvml = gpukit_cuda::nvml::NvmlSession::open(discovery).ok()?;
    let l = nvml.peer_link(&uuid(a.ordinal)?, &uuid(b.ordinal)?).ok()?;
    Some(Link {
        label: l.label(),
        gbs_each_way: l.nvlink_gbs_each_way(),
    })
}

/// Which GPU each rank used.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankGpu {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    pub ordinal: usize,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NcclReport {
    pub ranks: usize,
    pub processes: usize,
    /// `torchrun`, `Slurm (srun)`, `mpirun`, `gpukit launch`, or None for one process.
    pub launcher: Option<String>,
    pub gpus: Vec<RankGpu>,
    pub nccl_version: String,
    /// Every NCCL_* variable set for rank 0 (they choose algorithms, protocols, transports).
    pub nccl_env: Vec<(String, String)>,
    pub iterations: usize,
    pub repeats: usize,
    pub warmup: usize,
    pub graph: bool,
    pub rows: Vec<NcclRow>,
    /// How rank 0's GPU reaches rank 1's, when both are on rank 0's machine.
    pub link: Option<Link>,
    /// nccl-tests' closing line: the mean busbw over every measured figure.
    pub avg_busbw_gbs: Option<f64>,
    pub setup_ms: f64,
}

fn check_options(o: &NcclOptions) -> Result<()> {
    let bad = |m: String| Err(Error::BadInput(m));
    if o.min_bytes > o.max_bytes {
        return bad(format!(
            "--min-bytes ({}) is larger than --max-bytes ({})",
            o.min_bytes, o.max_bytes
        ));
    }
    if o.step_factor < 2 {
        return bad("--step-factor must be at least 2".into());
    }
    if o.iterations == 0 {
        return bad("--iterations must be at least 1".into());
    }
    if o.ops.is_empty() || o.dtypes.is_empty() || o.places.is_empty() {
        return bad("nothing to measure: give at least one op, dtype and place".into());
    }
    for d in &o.dtypes {
        if !matches!(d, DType::F32 | DType::F16 | DType::Bf16) {
            return bad(format!(
                "--dtype {d}: bench nccl measures f32, f16 and bf16 (as nccl-tests' float, half, bfloat16)"
            ));
        }
    }
    for r in &o.redops {
        if !matches!(r, RedOp::Sum | RedOp::Max | RedOp::Min) {
            return bad(format!(
                "--redop {}: results are checked exactly for sum, max and min only",
                r.name()
            ));
        }
    }
    if o.world.is_some() && o.gpus.is_some_and(|g| g > 1) {
        return bad(
            "--gpus drives several GPUs from one process; under a launcher every process drives \
             one GPU (leave --gpus out)"
                .into(),
        );
    }
    if o.world.is_some() && o.compare_pytorch {
        return bad(
            "--compare-pytorch starts PyTorch's own processes on every GPU: run it from one \
             process (without a launcher)"
                .into(),
        );
    }
    Ok(())
}

/// The NCCL_* variables in the environment, sorted.
fn nccl_env() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::env::vars()
        // NCCL_VERSION is set by NVIDIA's containers to name the image's NCCL: not a setting
        .filter(|(k, _)| k.starts_with("NCCL_") && k != "NCCL_VERSION")
        .collect();
    v.sort();
    v
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// This process's part of the world: its GPUs, communicators, and the session to the other
/// processes when there are any.
struct Setup {
    local: Local,
    session: Option<Session>,
    rank0: bool,
    processes: usize,
    launcher: Option<String>,
    gpus: Vec<RankGpu>,
}

fn setup(discovery: &Discovery, o: &NcclOptions) -> Result<Setup> {
    let count = gpukit_cuda::driver::probe(discovery)
        .map_err(|e| Error::Unavailable(format!("bench nccl needs a GPU: {e}")))?
        .device_count;
    gpukit_cuda::nccl::require(discovery)
        .map_err(|e| Error::Unavailable(format!("bench nccl needs NCCL: {e}")))?;
    let bytes = o.max_bytes;
    let describe = |rank: usize, gpu: &Gpu| RankGpu {
        rank,
        host: hostname(),
        pid: std::process::id(),
        ordinal: gpu.ordinal,
        name: gpu.name().unwrap_or_default(),
    };
    match &o.world {
        None => {
            let n = o.gpus.unwrap_or(count);
            if n == 0 || n > count {
                return Err(Error::BadInput(format!(
                    "--gpus {n}: this machine has {count} CUDA device(s)"
                )));
            }
            let gpus = (0..n)
                .map(|i| Gpu::open(discovery, i))
                .collect::<gpukit_cuda::Result<Vec<_>>>()?;
            let comms = Comm::init_all(&gpus.iter().collect::<Vec<_>>())?;
            let infos = gpus
                .iter()
                .enumerate()
                .map(|(r, g)| describe(r, g))
                .collect();
            Ok(Setup {
                local: Local::new(discovery, gpus, comms, bytes)?,
                session: None,
                rank0: true,
                processes: 1,
                launcher: None,
                gpus: infos,
            })
        }
        Some(world) => {
            let ordinal = world.local_rank % count;
            gpukit_ranks::before_exit(|| gpukit_cuda::nccl::exit_now(1));
            let options = gpukit_ranks::rendezvous::Options {
                timeout: o.timeout,
                on_lost: OnLost::Exit,
            };
            let session = Session::join(world, options, || {
                UniqueId::new()
                    .map(|id| id.to_bytes())
                    .map_err(|e| e.to_string())
            })?;
            let gpu = Gpu::open(discovery, ordinal)?;
            let id = UniqueId::from_bytes(session.blob())?;
            let comm = Comm::init_rank(&gpu, &id, world.rank, world.world_size)?;
            let me = describe(world.rank, &gpu);
            let all = session.all_gather(&serde_json::to_vec(&me).unwrap_or_default())?;
            let gpus = all
                .iter()
                .map(|b| serde_json::from_slice(b))
                .collect::<std::result::Result<Vec<RankGpu>, _>>()
                .map_err(|e| Error::Failed(format!("a rank sent a malformed description: {e}")))?;
            Ok(Setup {
                local: Local::new(discovery, vec![gpu], vec![comm], bytes)?,
                rank0: world.rank == 0,
                processes: world.world_size,
                launcher: Some(world.launcher.to_string()),
                session: Some(session),
                gpus,
            })
        }
    }
}

/// Runs the sweep. Rank 0 gets the report (with every rank's figures) and, when asked for,
/// PyTorch's outcome (its version, or why it could not run); other ranks get None.
#[allow(clippy::type_complexity)]
pub fn run_nccl(
    discovery: &Discovery,
    o: &NcclOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<(NcclReport, Option<Result<String>>)>> {
    check_options(o)?;
    let started = std::time::Instant::now();
    let mut s = setup(discovery, o)?;
    let setup_ms = started.elapsed().as_secs_f64() * 1e3;
    let rows = match sweep_rows(&mut s, o, progress) {
        Ok(r) => r,
        Err(e) => {
            if let Some(session) = &s.session {
                session.abort(&e.to_string());
            }
            return Err(e);
        }
    };
    let ranks = s.local.world;
    let rows = match &s.session {
        None => rows,
        Some(session) => {
            let mine = serde_json::to_vec(&rows).unwrap_or_default();
            let parts = session
                .all_gather(&mine)?
                .iter()
                .map(|b| serde_json::from_slice(b))
                .collect::<std::result::Result<Vec<Vec<NcclRow>>, _>>()
                .map_err(|e| Error::Failed(format!("a rank sent malformed rows: {e}")))?;
            merge(parts, ranks)?
        }
    };
    if let Some(session) = s.session {
        session.finish()?;
    }
    if !s.rank0 {
        return Ok(None);
    }
    let figures: Vec<f64> = rows
        .iter()
        .flat_map(|r| [&r.out_of_place, &r.in_place])
        .flatten()
        .map(|f| f.busbw_gbs)
        .collect();
    let mut report = NcclReport {
        ranks,
        processes: s.processes,
        launcher: s.launcher,
        link: link_of(discovery, &s.gpus),
        gpus: s.gpus,
        nccl_version: gpukit_cuda::nccl::version().unwrap_or_default(),
        nccl_env: nccl_env(),
        iterations: o.iterations,
        repeats: o.repeats,
        warmup: o.warmup,
        graph: o.graph,
        avg_busbw_gbs: (!figures.is_empty())
            .then(|| figures.iter().sum::<f64>() / figures.len() as f64),
        rows,
        setup_ms,
    };
    let peer = o.compare_pytorch.then(|| {
        drop(s.local);
        compare_pytorch(&mut report, o, progress)
    });
    Ok(Some((report, peer)))
}

/// Every row of the sweep, measured by this process's GPUs (their ranks' figures only).
fn sweep_rows(
    s: &mut Setup,
    o: &NcclOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<NcclRow>> {
    let ranks = s.local.world;
    let mut rows = Vec::new();
    let root = o.root;
    if root >= ranks {
        return Err(Error::BadInput(format!(
            "--root {root}: the world has {ranks} rank(s)"
        )));
    }
    for &op in &o.ops {
        for &dtype in &o.dtypes {
            let redops: Vec<Option<RedOp>> = if op.reduces() {
                o.redops.iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            for redop in redops {
                if s.rank0 {
                    progress(&format!(
                        "{} {}{}",
                        op.name(),
                        dtype,
                        redop.map(|r| format!(" {}", r.name())).unwrap_or_default()
                    ));
                }
                let sizes = sweep::sizes(o.min_bytes, o.max_bytes, o.step_factor);
                // as nccl-tests: the clocks and NCCL's buffers warmed at the largest size first
                if let Some(counts) = sizes
                    .last()
                    .and_then(|&b| Counts::of(op, b, dtype.size_bytes(), ranks))
                {
                    let case = Case {
                        op,
                        dtype,
                        redop: redop.unwrap_or(RedOp::Sum),
                        root,
                        counts,
                    };
                    let warm = Timing {
                        place: Place::Out,
                        warmup: o.warmup,
                        iterations: o.iterations,
                        repeats: 1,
                        graph: false,
                    };
                    s.local.time(&case, warm)?;
                }
                for bytes in sizes {
                    let Some(counts) = Counts::of(op, bytes, dtype.size_bytes(), ranks) else {
                        continue;
                    };
                    let case = Case {
                        op,
                        dtype,
                        redop: redop.unwrap_or(RedOp::Sum),
                        root,
                        counts,
                    };
                    rows.push(measure_row(s, o, &case, redop)?);
                }
            }
        }
    }
    Ok(rows)
}

fn measure_row(
    s: &mut Setup,
    o: &NcclOptions,
    case: &Case,
    redop: Option<RedOp>,
) -> Result<NcclRow> {
    let ranks = s.local.world;
    let bytes = case.counts.count * case.dtype.size_bytes();
    let mut figure = |place: Place| -> Result<Option<Figure>> {
        if place == Place::In && case.op == Collective::AllToAll {
            return Ok(None);
        }
        if !o.places.contains(&place) {
            return Ok(None);
        }
        let wrong = s.local.check(case, place)?;
        let timing = Timing {
            place,
            warmup: o.warmup,
            iterations: o.iterations,
            repeats: o.repeats,
            graph: o.graph,
        };
        let times = s.local.time(case, timing)?;
        Ok(Some(Figure::of(case.op, bytes, ranks, times, wrong)))
    };
    let out_of_place = figure(Place::Out)?;
    let in_place = figure(Place::In)?;
    let mut row = NcclRow {
        op: case.op,
        dtype: case.dtype,
        redop,
        root: case.op.rooted().then_some(case.root),
        bytes,
        count: case.counts.count,
        out_of_place,
        in_place,
        status: RowStatus::Ok,
        pytorch: None,
    };
    row.status = status_of(&row);
    Ok(row)
}

/// Failed when any rank's output had a wrong element.
fn status_of(row: &NcclRow) -> RowStatus {
    let wrong: u64 = [&row.out_of_place, &row.in_place]
        .into_iter()
        .flatten()
        .map(|f| f.wrong)
        .sum();
    if wrong > 0 {
        RowStatus::Failed(format!(
            "{} {} {}: {wrong} output element(s) differ from the exact result",
            row.op.name(),
            row.dtype,
            crate::peer::csv(&[row.bytes])
        ))
    } else {
        RowStatus::Ok
    }
}

/// Every process's rows (in rank order, each holding its own ranks' times) as one set of rows
/// with every rank's times and the wrong elements of all.
fn merge(parts: Vec<Vec<NcclRow>>, ranks: usize) -> Result<Vec<NcclRow>> {
    let mut parts = parts.into_iter();
    let Some(mut rows) = parts.next() else {
        return Ok(Vec::new());
    };
    for other in parts {
        if other.len() != rows.len() {
            return Err(Error::Failed(format!(
                "ranks measured different sweeps ({} rows and {} rows): were they all started \
                 with the same arguments?",
                rows.len(),
                other.len()
            )));
        }
        for (row, theirs) in rows.iter_mut().zip(other) {
            if (row.op, row.dtype, row.bytes) != (theirs.op, theirs.dtype, theirs.bytes) {
                return Err(Error::Failed(
                    "ranks measured different rows: were they all started with the same \
                     arguments?"
                        .into(),
                ));
            }
            for (mine, other) in [
                (&mut row.out_of_place, theirs.out_of_place),
                (&mut row.in_place, theirs.in_place),
            ] {
                if let (Some(m), Some(t)) = (mine.as_mut(), other) {
                    m.rank_time_us.extend(t.rank_time_us);
                    m.wrong += t.wrong;
                }
            }
        }
    }
    for row in &mut rows {
        for f in [&mut row.out_of_place, &mut row.in_place]
            .into_iter()
            .flatten()
        {
            *f = Figure::of(
                row.op,
                row.bytes,
                ranks,
                std::mem::take(&mut f.rank_time_us),
                f.wrong,
            );
        }
        row.status = status_of(row);
    }
    Ok(rows)
}

/// torch.distributed's figures for the same sweep (its own processes, launched by
/// torch.multiprocessing), out of place, beside each row.
fn compare_pytorch(
    report: &mut NcclReport,
    o: &NcclOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<String> {
    progress("PyTorch: torch.distributed, the same sweep");
    let names = |v: &[&str]| v.join(",");
    let ops: Vec<&str> = o.ops.iter().map(|c| c.name()).collect();
    let dtypes: Vec<&str> = o.dtypes.iter().map(|d| d.name()).collect();
    let redops: Vec<&str> = o.redops.iter().map(|r| r.name()).collect();
    let args: Vec<String> = [
        "nccl".to_string(),
        "--nproc".into(),
        report.ranks.to_string(),
        "--ops".into(),
        names(&ops),
        "--dtype".into(),
        names(&dtypes),
        "--redop".into(),
        names(&redops),
        "--min-bytes".into(),
        o.min_bytes.to_string(),
        "--max-bytes".into(),
        o.max_bytes.to_string(),
        "--step-factor".into(),
        o.step_factor.to_string(),
        "--iterations".into(),
        o.iterations.to_string(),
        "--warmup".into(),
        o.warmup.to_string(),
    ]
    .to_vec();
    let run = crate::peer::run_pytorch(&args)?;
    for r in &run.results {
        let Some(op) = r["op"].as_str().and_then(Collective::parse) else {
            continue;
        };
        let dtype = r["dtype"].as_str().and_then(|d| d.parse::<DType>().ok());
        let redop = r["redop"].as_str().and_then(RedOp::parse);
        let bytes = r["bytes"].as_u64().map(|b| b as usize);
        let (Some(time_us), Some(busbw)) = (r["time_us"].as_f64(), r["busbw_gbs"].as_f64()) else {
            continue;
        };
        if r["wrong"].as_u64() != Some(0) {
            continue;
        }
        for row in report.rows.iter_mut() {
            if Some(row.op) == Some(op)
                && Some(row.dtype) == dtype
                && row.redop == redop
                && Some(row.bytes) == bytes
            {
                if let Some(ours) = &row.out_of_place {
                    row.pytorch = Some(PeerFigure::single(time_us / 1e3, busbw, ours.busbw_gbs));
                }
            }
        }
    }
    Ok(run.torch_version)
}

/// The JSON document of a run, with the PyTorch comparison's outcome when it was asked for.
pub fn document(report: NcclReport, peer: Option<&Result<String>>) -> Document<NcclReport> {
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench nccl", report, failure).with_peer(peer)
}

#[cfg(test)]
mod tests;
