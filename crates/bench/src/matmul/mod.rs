//! `bench matmul`: CPU against GPU matrix multiply for every dtype and size, each result checked
//! against a float64 reference on sampled entries and placed against the chip's peak and the
//! best rate measured in the same run.

//!
//! The parts: this file (options, rows, the report and the run), `gpu` and `cpu` (each side's
//! rows), `turns` (PyTorch taking turns) and `verify` (the check of every row).

mod part;
pub use part::{MatmulPart, PART};
mod cpu;
mod gpu;
pub mod search;
#[cfg(test)]
mod tests;
mod turns;

use crate::ceilings::Peaks;
use crate::error::{Error, Result};
use crate::gpu::{describe_gpu, GpuFacts};
use crate::measure::Measurement;
use crate::peer::PeerServer;
use crate::power::{PowerMeter, RowPower};
use crate::random::{normal_f32, normal_f64, uniform_f32, uniform_f64};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::Gpu;
use gpukit_tensor::codec::{bytes_of, encode_f32};
use gpukit_tensor::{DType, Device, DeviceSelection};
use serde::{Deserialize, Serialize};
use turns::Turns;

/// What to run.
#[derive(Debug, Clone)]
pub struct MatmulOptions {
    pub sizes: Vec<usize>,
    /// None: every dtype the device supports.
    pub dtypes: Option<Vec<DType>>,
    pub selection: DeviceSelection,
    pub iterations: usize,
    pub warmup: usize,
    /// Seconds one CPU row may take at most (fewer iterations then, said in the row).
    pub cpu_budget_s: f64,
    /// cuBLASLt heuristic algorithms tried per shape (0: cuBLAS only).
    pub lt_candidates: usize,
    /// CPU rows above this size are skipped (said in the row): `all` keeps the CPU part short.
    pub cpu_max_size: Option<usize>,
    /// How the inputs are drawn.
    pub init: Init,
    /// How the GPU candidates (cuBLAS and the cuBLASLt algorithms) are timed against each other.
    pub trial: Trial,
    /// With PyTorch beside: how many turns each side takes per row (the iterations are split
    /// between them).
    pub rounds: usize,
    /// With PyTorch beside: GPU turns are lengthened to at least this many milliseconds
    /// (`block_reps`).
    pub block_ms: f64,
    /// With PyTorch beside: untimed GPU turns of both sides for this many milliseconds before
    /// the timed ones (`harness::interleave`).
    pub soak_ms: f64,
}

/// The distribution random inputs are drawn from. It moves GPU figures at large sizes: a
/// power-capped chip clocks by how many bits toggle, so both sides draw from the same one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    /// Standard normal, as `torch.randn`.
    #[default]
    Normal,
    /// Uniform in [-1, 1).
    Uniform,
}

impl Init {
    fn draw(self, n: usize, seed: u64) -> Vec<f32> {
        match self {
            Init::Normal => normal_f32(n, seed),
            Init::Uniform => uniform_f32(n, seed),
        }
    }

    /// Full-precision f64 values (f64 rows: not f32 values widened).
    fn draw_f64(self, n: usize, seed: u64) -> Vec<f64> {
        match self {
            Init::Normal => normal_f64(n, seed),
            Init::Uniform => uniform_f64(n, seed),
        }
    }

    /// `n` values of `ty` as stored bytes: f64 drawn at full precision, the rest from f32
    /// rounded to their storage.
    pub(super) fn draw_storage(self, ty: DType, n: usize, seed: u64) -> Vec<u8> {
        match ty {
            DType::F64 => bytes_of(&self.draw_f64(n, seed)).to_vec(),
            _ => encode_f32(&self.draw(n, seed), ty),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Init::Normal => "standard normal",
            Init::Uniform => "uniform in [-1, 1)",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Init::Normal => "normal",
            Init::Uniform => "uniform",
        }
    }
}

impl std::str::FromStr for Init {
    type Err = Error;
    fn from_str(s: &str) -> Result<Init> {
        match s {
            "normal" => Ok(Init::Normal),
            "uniform" => Ok(Init::Uniform),
            _ => Err(Error::BadInput(
                "unknown input distribution (normal or uniform)".to_string(),
            )),
        }
    }
}

/// Candidate trials: `rounds` passes over every candidate, each `warmup` + `reps` runs; a
/// candidate's score is the median of its per-round medians.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trial {
    pub warmup: usize,
    pub reps: usize,
    pub rounds: usize,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        MatmulOptions {
            sizes: vec![1000, 1023, 1024, 2048, 4096, 8192],
            dtypes: None,
            selection: DeviceSelection::All,
            iterations: 50,
            warmup: 5,
            cpu_budget_s: 10.0,
            lt_candidates: 8,
            cpu_max_size: None,
            init: Init::Normal,
            // three interleaved rounds: a candidate's rank does not hang on when it ran
            trial: Trial {
                warmup: 2,
                reps: 5,
                rounds: 3,
            },
            rounds: 6,
            block_ms: 100.0,
            soak_ms: 1500.0,
        }
    }
}

use crate::report::{judge_rows, Document};
use crate::report::{PeerFigure, RowStatus, Verification};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatmulRow {
    pub device: Device,
    pub dtype: DType,
    pub size: usize,
    pub status: RowStatus,
    /// What computed it: "cuBLAS GemmEx", "cuBLASLt (heuristic #2)", "gemm crate (AVX-512)".
    pub backend: Option<String>,
    /// Set where the device has no such arithmetic and another was used ("f32").
    pub computed_as: Option<String>,
    pub timing: Option<Measurement>,
    pub tflops: Option<f64>,
    /// Percent of the device's peak for this dtype (datasheet or estimate; see peaks source).
    pub pct_of_peak: Option<f64>,
    /// Percent of the best rate measured in this run for the same device and dtype.
    pub pct_of_best: Option<f64>,
    /// GPU rate over the CPU's for the same dtype and size (CPU rows: None).
    pub speedup_vs_cpu: Option<f64>,
    pub verification: Option<Verification>,
    pub pytorch: Option<PeerFigure>,
    /// GPU rows: each candidate timed before the run (label, median of its round medians in
    /// ms; None where it did not run), in the order tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<(String, Option<f64>)>,
    /// GPU rows where a cuBLASLt algorithm won the trial: its time over cuBLAS's in paired
    /// turns (the median, then each round's); it is kept only below `CONFIRM_RATIO`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<(f64, Vec<f64>)>,
    /// GPU rows: what the chip drew during gpukit's timed blocks (power, clock, throttling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<RowPower>,
    /// The same during PyTorch's blocks, when it took turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pytorch_power: Option<RowPower>,
}

impl MatmulRow {
    pub(super) fn new(device: Device, dtype: DType, size: usize) -> MatmulRow {
        MatmulRow {
            device,
            dtype,
            size,
            status: RowStatus::Ok,
            backend: None,
            computed_as: None,
            timing: None,
            tflops: None,
            pct_of_peak: None,
            pct_of_best: None,
            speedup_vs_cpu: None,
            verification: None,
            pytorch: None,
            candidates: Vec::new(),
            confirmation: None,
            power: None,
            pytorch_power: None,
        }
    }

    pub(super) fn skipped(device: Device, dtype: DType, size: usize, why: String) -> MatmulRow {
        let mut r = MatmulRow::new(device, dtype, size);
        r.status = RowStatus::Skipped(why);
        r
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatmulReport {
    pub gpu: Option<GpuFacts>,
    /// Why the GPU rows are absent, when they are.
    pub gpu_unavailable: Option<String>,
    pub cpu_model: String,
    pub cpu_threads: usize,
    pub iterations: usize,
    /// The distribution the inputs were drawn from.
    #[serde(default)]
    pub inputs: Init,
    /// Blocks per side when PyTorch took turns (`run_matmul_with_pytorch`).
    #[serde(default)]
    pub rounds: usize,
    /// The shortest GPU turn and the untimed soak before the turns, in ms (see
    /// `harness::interleave`).
    #[serde(default)]
    pub turn_ms: f64,
    #[serde(default)]
    pub soak_ms: f64,
    pub rows: Vec<MatmulRow>,
    /// The best rates `bench matmul --search` kept for this GPU under this driver and cuBLASLt:
    /// the achievable ceiling beside the datasheet's (empty: no search kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub achievable: Vec<crate::workload::gemm::DtypeBest>,
}

/// The tolerance of a sampled check, by dtype (shared with every matrix product gpukit checks).
pub use crate::workload::gemm::tolerance;

/// The JSON document of `bench matmul`: the report with PyTorch's outcome (when compared), the
/// notes on how the turns were taken, and the verdict (a failed row, or nothing measured, is
/// not a success).
pub fn document(report: MatmulReport, peer: Option<&Result<String>>) -> Document<MatmulReport> {
    let mut notes = Vec::new();
    if matches!(peer, Some(Ok(_))) {
        notes.push(format!(
            "turns: gpukit and PyTorch timed each row in {} alternating blocks, so both saw the same \
             clocks; gpukit opened the first half of the rounds (ABBA...) and PyTorch the rest \
             (BAAB...); gpukit / PyTorch is the geometric mean of the two halves' median round \
             ratios (lowest-highest round in brackets)",
            report.rounds
        ));
        notes.push(format!(
            "GPU rows: {:.1} s of untimed turns first, blocks of at least {:.0} ms, each side over 4 \
             or more operand sets; where both tools ran the same cuBLAS kernel, this method read \
             0.98-1.05 on an H100 over two invocations: rows within that are at parity",
            report.soak_ms / 1e3,
            report.turn_ms
        ));
    }
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench matmul", report, failure)
        .with_peer(peer)
        .with_notes(notes)
}

/// Runs the whole matmul benchmark. `progress` receives one line per row as it starts.
pub fn run_matmul(
    discovery: &Discovery,
    opts: &MatmulOptions,
    progress: &mut dyn FnMut(&str),
) -> MatmulReport {
    let mut alone = Turns {
        server: None,
        missed: Vec::new(),
        meter: None,
    };
    run_matmul_turns(discovery, opts, &mut alone, progress)
}

/// `run_matmul` with PyTorch taking turns on every row (`scripts/pytorch_reference.py serve`):
/// each row's iterations are split into `opts.rounds` blocks per side, alternating in both
/// orders (`harness::both_orders`), so both see the same clocks. Returns the report and
/// PyTorch's version (with the rows it gave no figure for), or why it could not run (the report
/// then has gpukit's figures only).
pub fn run_matmul_with_pytorch(
    discovery: &Discovery,
    opts: &MatmulOptions,
    progress: &mut dyn FnMut(&str),
) -> (MatmulReport, Result<String>) {
    let threads = Some(crate::cpu::threads());
    let server = match opts.selection {
        DeviceSelection::One(Device::Cpu) => PeerServer::start("cpu", threads),
        DeviceSelection::One(Device::Cuda(_)) => PeerServer::start("cuda", threads),
        // a torch without CUDA can still take the CPU rows
        DeviceSelection::All => PeerServer::start("cuda", threads)
            .or_else(|e| PeerServer::start("cpu", threads).map_err(|_| e)),
    };
    let server = match server {
        Ok(s) => s,
        Err(e) => return (run_matmul(discovery, opts, progress), Err(e)),
    };
    let version = server.torch_version.clone();
    let mut turns = Turns {
        server: Some(server),
        missed: Vec::new(),
        meter: None,
    };
    let report = run_matmul_turns(discovery, opts, &mut turns, progress);
    (
        report,
        Ok(crate::peer::outcome_line(version, &turns.missed)),
    )
}

fn run_matmul_turns(
    discovery: &Discovery,
    opts: &MatmulOptions,
    turns: &mut Turns,
    progress: &mut dyn FnMut(&str),
) -> MatmulReport {
    let host = crate::host::host_facts();
    let mut report = MatmulReport {
        gpu: None,
        gpu_unavailable: None,
        cpu_model: host.cpu_model.clone(),
        cpu_threads: crate::cpu::threads(),
        iterations: opts.iterations,
        inputs: opts.init,
        rounds: opts.rounds,
        turn_ms: opts.block_ms,
        soak_ms: opts.soak_ms,
        rows: Vec::new(),
        achievable: Vec::new(),
    };
    let ordinal = match opts.selection {
        DeviceSelection::All => Some(0),
        DeviceSelection::One(Device::Cuda(i)) => Some(i),
        DeviceSelection::One(Device::Cpu) => None,
    };
    if let Some(ordinal) = ordinal {
        match (
            Gpu::open(discovery, ordinal),
            describe_gpu(discovery, ordinal),
        ) {
            (Ok(gpu), Ok(facts)) => {
                report.achievable = kept_ceiling(discovery, &facts);
                turns.meter = PowerMeter::start(discovery, &facts.uuid);
                if let (Some(m), Some(s)) = (&turns.meter, &turns.server) {
                    m.own_process(s.pid());
                }
                match Blas::new(discovery, &gpu) {
                    Ok(blas) => gpu::gpu_rows(
                        (&gpu, &blas, &facts),
                        opts,
                        turns,
                        &mut report.rows,
                        progress,
                    ),
                    Err(e) => report.gpu_unavailable = Some(e.to_string()),
                }
                report.gpu = Some(facts);
            }
            (Err(e), _) => report.gpu_unavailable = Some(e.to_string()),
            (_, Err(e)) => report.gpu_unavailable = Some(e.to_string()),
        }
    }
    if matches!(
        opts.selection,
        DeviceSelection::All | DeviceSelection::One(Device::Cpu)
    ) {
        // the sampler stops before the CPU rows: they say nothing of the GPU's power
        turns.meter = None;
        cpu::cpu_rows(opts, &host, turns, &mut report.rows, progress);
    }
    finish_rows(&mut report.rows, report.gpu.as_ref().map(|g| &g.peaks));
    report
}

/// The search kept for this GPU, driver and cuBLASLt, if any.
fn kept_ceiling(discovery: &Discovery, facts: &GpuFacts) -> Vec<crate::workload::gemm::DtypeBest> {
    use crate::workload::gemm::{cache_dir, load_achievable, AchievableKey, Lookup};
    let found = cache_dir()
        .zip(AchievableKey::current(discovery, &facts.name, &facts.uuid))
        .map(|(dir, key)| load_achievable(&dir, &key));
    match found {
        Some(Lookup::Found(a)) => a.best,
        _ => Vec::new(),
    }
}

/// Fills the derived columns: % of peak, % of best measured, speedup over the CPU.
fn finish_rows(rows: &mut [MatmulRow], peaks: Option<&Peaks>) {
    let best = |rows: &[MatmulRow], dev: Device, d: DType| {
        rows.iter()
            .filter(|r| r.device == dev && r.dtype == d)
            .filter_map(|r| r.tflops)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let snapshot = rows.to_vec();
    for r in rows.iter_mut() {
        let Some(t) = r.tflops else { continue };
        if let Some(b) = best(&snapshot, r.device, r.dtype) {
            r.pct_of_best = Some(100.0 * t / b);
        }
        if let (Device::Cuda(_), Some(p)) = (r.device, peaks) {
            r.pct_of_peak = p.for_dtype(r.dtype.name()).map(|peak| 100.0 * t / peak);
        }
        if let Device::Cuda(_) = r.device {
            r.speedup_vs_cpu = snapshot
                .iter()
                .find(|c| c.device == Device::Cpu && c.dtype == r.dtype && c.size == r.size)
                .and_then(|c| c.tflops)
                .map(|ct| t / ct);
        }
    }
}
