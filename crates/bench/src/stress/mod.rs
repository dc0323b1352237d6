//! `gpukit stress`: a burn-in with a verdict. Every GPU at once, one thread each: sustained
//! matrix multiplies whose every result is compared with the first (bit for bit, on the GPU) and
//! checked against a float64 reference, a pattern test over most of the free memory, pinned
//! copies both ways against the PCIe link; NVML watched on its own thread throughout (clocks,
//! throttle reasons, temperature, power, ECC counts, remapped rows, XID events). Each GPU passes
//! or fails with every reason (`verdict`).
//!
//! With several GPUs, once their own tests are done: a peer copy between every pair and an NCCL
//! all-reduce over all of them, each result checked.
//!
//! The parts: this file (options, levels, the report and the run), `gpu` (one GPU's tests),
//! `multi` (the tests between GPUs), `kernels` (the CUDA C), `watch` (the NVML thread) and
//! `verdict` (the judgement, no GPU).

mod gpu;
pub mod kernels;
pub mod multi;
#[cfg(test)]
mod tests;
pub mod verdict;
mod watch;

use crate::ceilings::Peaks;
use crate::error::{Error, Result};
use crate::report::{Document, Verification};
use crate::workload::gemm::DtypeBest;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::HealthCounters;
use gpukit_tensor::DType;
pub use multi::{AllReduceCheck, MultiGpu, PeerCopy};
use serde::{Deserialize, Serialize};
pub use verdict::{FailReason, Rules, Verdict};
pub use watch::{ThrottleSeen, Watched};

/// The environment variable of the planted fault (tests only): `matmul:N` corrupts one word of
/// one matmul result on GPU N before it is checked, `memory:N` one word of GPU N's memory test.
pub const PLANT_FAULT_VAR: &str = "GPUKIT_STRESS_PLANT_FAULT";

/// How long a level runs, in seconds, all tests of a GPU together.
pub fn level_seconds(level: u8) -> Result<f64> {
    match level {
        1 => Ok(30.0),
        2 => Ok(180.0),
        3 => Ok(900.0),
        _ => Err(Error::BadInput(format!(
            "--level {level}: the levels are 1 (about 30 s), 2 (about 3 min) and 3 (about 15 min)"
        ))),
    }
}

/// The run's time split between the tests of each GPU (seconds), from its whole duration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub matmul_bf16_s: f64,
    /// fp8 (E4M3) matmul, on GPUs of compute capability 8.9 and newer; elsewhere this time goes
    /// to bf16 ([`Budget::matmul_mix`]). Absent from reports made before fp8: 0.
    #[serde(default)]
    pub matmul_fp8_s: f64,
    pub matmul_tf32_s: f64,
    pub memory_s: f64,
    pub copies_s: f64,
}

/// One dtype of a GPU's sustained matmul mix: its seconds, or why it is not run.
pub type MixEntry = (DType, std::result::Result<f64, String>);

impl Budget {
    /// 40% bf16 matmul (the power-hungriest load, held longest), 15% fp8 matmul, 20% tf32
    /// matmul, 18% memory patterns, 5% copies; the rest is setup (drawing operands, the
    /// reference checks). A GPU without fp8 gives its 15% to bf16 (55% then).
    pub fn split(duration_s: f64) -> Budget {
        Budget {
            matmul_bf16_s: 0.40 * duration_s,
            matmul_fp8_s: 0.15 * duration_s,
            matmul_tf32_s: 0.20 * duration_s,
            memory_s: 0.18 * duration_s,
            copies_s: 0.05 * duration_s,
        }
    }

    /// The sustained matmul mix of a GPU of compute capability `cc`, in the order run: bf16,
    /// fp8, tf32, each with its seconds or why the GPU cannot run it (fp8 below 8.9, bf16 and
    /// tf32 below 8.0). Without fp8, its seconds go to bf16.
    pub fn matmul_mix(&self, cc: (u32, u32)) -> Vec<MixEntry> {
        let no_fp8 = crate::gpu::gpu_lacks(cc, DType::F8E4M3);
        let bf16_s = self.matmul_bf16_s
            + if no_fp8.is_some() {
                self.matmul_fp8_s
            } else {
                0.0
            };
        [
            (DType::Bf16, bf16_s),
            (DType::F8E4M3, self.matmul_fp8_s),
            (DType::Tf32, self.matmul_tf32_s),
        ]
        .into_iter()
        .map(|(d, s)| match crate::gpu::gpu_lacks(cc, d) {
            Some(why) if d == DType::F8E4M3 && s > 0.0 => {
                (d, Err(format!("{why} (its time went to bf16)")))
            }
            Some(why) => (d, Err(why)),
            None => (d, Ok(s)),
        })
        .collect()
    }
}

/// Which test the planted fault corrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultTest {
    Matmul,
    Memory,
}

/// A fault planted for tests: one word of one result flipped before its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlantedFault {
    pub test: FaultTest,
    pub gpu: usize,
}

/// Reads the planted fault's variable (`matmul:0`, `memory:1`); empty or unset: none.
pub fn parse_plant(value: Option<&str>) -> Result<Option<PlantedFault>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let bad = || {
        Error::BadInput(format!(
            "{PLANT_FAULT_VAR}={v:?}: expected matmul:N or memory:N (a test and a CUDA ordinal)"
        ))
    };
    let (test, gpu) = v.split_once(':').ok_or_else(bad)?;
    let test = match test.trim() {
        "matmul" => FaultTest::Matmul,
        "memory" => FaultTest::Memory,
        _ => return Err(bad()),
    };
    let gpu = gpu.trim().parse::<usize>().map_err(|_| bad())?;
    Ok(Some(PlantedFault { test, gpu }))
}

/// What to run.
#[derive(Debug, Clone)]
pub struct StressOptions {
    pub level: u8,
    /// Seconds per GPU, all tests together (the level's unless `--duration` was given).
    pub duration_s: f64,
    /// CUDA ordinals; None: every GPU.
    pub gpus: Option<Vec<usize>>,
    /// Side of the square matrices multiplied.
    pub matmul_size: usize,
    /// Share of the free memory the memory test covers.
    pub memory_fraction: f64,
    pub plant: Option<PlantedFault>,
    pub rules: Rules,
}

impl StressOptions {
    /// The options of `level`, with `duration_s` in place of its time when given.
    pub fn new(level: u8, duration_s: Option<f64>) -> Result<StressOptions> {
        let level_s = level_seconds(level)?;
        let duration_s = match duration_s {
            None => level_s,
            Some(d) if (1.0..=7.0 * 86_400.0).contains(&d) => d,
            Some(d) => {
                return Err(Error::BadInput(format!(
                    "--duration {d}: give a number of seconds from 1 to 604800"
                )))
            }
        };
        Ok(StressOptions {
            level,
            duration_s,
            gpus: None,
            matmul_size: 8192,
            memory_fraction: 0.9,
            plant: None,
            rules: Rules::default(),
        })
    }
}

/// One dtype's sustained matrix multiplies on one GPU.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MatmulStress {
    pub dtype: Option<DType>,
    pub size: usize,
    pub backend: String,
    /// Products computed (each compared with the first).
    pub products: u64,
    pub seconds: f64,
    /// The median over the run's blocks (about half a second each) of each block's rate.
    pub tflops: Option<f64>,
    /// The slowest and fastest block.
    pub tflops_min: Option<f64>,
    pub tflops_max: Option<f64>,
    /// The first and the last product against a float64 reference on sampled entries.
    pub reference_first: Option<Verification>,
    pub reference_last: Option<Verification>,
    /// 32-bit words of a result, and how many of all the repeats' words differed from the
    /// first result's (the same inputs must give the same bits).
    pub words_per_result: u64,
    pub repeat_words_differing: u64,
    /// Repeats whose result differed in at least one word.
    pub repeats_differing: u64,
    /// Percent of the datasheet's dense peak for the dtype, where gpukit knows it.
    pub pct_of_peak: Option<f64>,
    /// Percent of the best rate `bench matmul --search` found on this GPU, when cached.
    pub pct_of_achievable: Option<f64>,
    /// Why the test could not run or stopped.
    pub error: Option<String>,
    /// Why it was not run (the GPU lacks the dtype).
    pub skipped: Option<String>,
}

/// One pattern over the tested memory, all its rounds together.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PatternPass {
    pub pattern: kernels::Pattern,
    /// Times it was written over the whole tested memory and counted back.
    pub passes: u64,
    pub words_wrong: u64,
}

/// The memory test of one GPU.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemoryStress {
    /// Free memory when the test started, and the bytes it wrote over (in chunks).
    pub free_bytes: u64,
    pub tested_bytes: u64,
    pub passes: Vec<PatternPass>,
    pub seconds: f64,
    /// Less memory than asked could be allocated: how much, and why.
    pub shortfall: Option<String>,
    pub error: Option<String>,
}

impl MemoryStress {
    /// Bytes written and read back, all passes together.
    pub fn checked_bytes(&self) -> u64 {
        self.tested_bytes * self.passes.iter().map(|p| p.passes).sum::<u64>()
    }

    pub fn words_wrong(&self) -> u64 {
        self.passes.iter().map(|p| p.words_wrong).sum()
    }
}

/// Pinned copies one way on one GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CopyStress {
    /// "host->device" or "device->host".
    pub direction: String,
    pub bytes: u64,
    pub copies: u64,
    /// Median of the copies' rates.
    pub gbs: Option<f64>,
    /// Percent of one direction of the PCIe link at its maximum generation and width.
    pub pct_of_link: Option<f64>,
    /// The last copy arrived byte for byte.
    pub verified: bool,
    /// Bytes of the last copy that differed from the source.
    #[serde(default)]
    pub bytes_wrong: u64,
    pub error: Option<String>,
}

/// How many bytes of `got` differ from `want` (a length difference counts too).
pub(crate) fn bytes_differing(want: &[u8], got: &[u8]) -> u64 {
    let differ = want.iter().zip(got).filter(|(a, b)| a != b).count();
    (differ + want.len().abs_diff(got.len())) as u64
}

/// Everything one GPU did and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuStress {
    /// CUDA ordinal.
    pub ordinal: usize,
    pub name: String,
    pub uuid: String,
    pub compute_capability: Option<(u32, u32)>,
    pub peaks: Option<Peaks>,
    /// The best rates `bench matmul --search` found on this GPU (this driver and cuBLASLt).
    pub achievable: Vec<DtypeBest>,
    pub pcie_link_gbs: Option<f64>,
    pub matmul: Vec<MatmulStress>,
    pub memory: Option<MemoryStress>,
    pub copies: Vec<CopyStress>,
    pub health_before: Option<HealthCounters>,
    pub health_after: Option<HealthCounters>,
    pub watched: Watched,
    /// A test or the GPU itself could not run: why.
    pub errors: Vec<String>,
    pub verdict: Verdict,
}

impl GpuStress {
    pub(crate) fn new(ordinal: usize) -> GpuStress {
        GpuStress {
            ordinal,
            name: String::new(),
            uuid: String::new(),
            compute_capability: None,
            peaks: None,
            achievable: Vec::new(),
            pcie_link_gbs: None,
            matmul: Vec::new(),
            memory: None,
            copies: Vec::new(),
            health_before: None,
            health_after: None,
            watched: Watched::default(),
            errors: Vec::new(),
            verdict: Verdict::default(),
        }
    }

    /// The rate of `dtype`'s sustained multiplies, when it ran and checked out.
    pub fn tflops(&self, dtype: DType) -> Option<f64> {
        self.matmul
            .iter()
            .find(|m| m.dtype == Some(dtype))
            .and_then(|m| m.tflops)
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StressReport {
    pub level: u8,
    pub duration_s: f64,
    pub budget: Budget,
    /// Wall time of the whole run.
    pub elapsed_s: f64,
    pub rules: Rules,
    pub gpus: Vec<GpuStress>,
    /// The tests between GPUs (peer copies, an NCCL all-reduce), with two GPUs or more.
    pub multi_gpu: Option<MultiGpu>,
    /// Why they did not run, when they did not; never counted as passed.
    pub multi_gpu_not_run: Option<String>,
    /// Set only when a fault was planted for a test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planted: Option<PlantedFault>,
    /// Why fp8 was not run.
    pub fp8_not_run: String,
}

/// The JSON document of `stress`: the verdict names every failing GPU and its reasons.
pub fn document(report: StressReport) -> Document<StressReport> {
    let failing: Vec<String> = report
        .gpus
        .iter()
        .filter_map(|g| match &g.verdict {
            Verdict::Fail { reasons, .. } => Some(format!(
                "cuda:{} failed: {}",
                g.ordinal,
                reasons
                    .iter()
                    .map(FailReason::describe)
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Verdict::Pass { .. } => None,
        })
        .collect();
    let failure = if report.gpus.is_empty() {
        Some("no GPU was tested".to_string())
    } else {
        (!failing.is_empty()).then(|| failing.join(" | "))
    };
    let mut notes = Vec::new();
    if let Some(p) = &report.planted {
        notes.push(format!(
            "warning: a fault was planted on cuda:{} ({PLANT_FAULT_VAR}, for tests only): this \
             run says nothing of the hardware",
            p.gpu
        ));
    }
    Document::new("stress", report, failure).with_notes(notes)
}

/// Runs the stress test on every selected GPU at once. `progress` gets a line as each test
/// starts. An error: no GPU can be used (names what to install), or a GPU asked for does not
/// exist (bad input).
pub fn run_stress(
    discovery: &Discovery,
    opts: &StressOptions,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<StressReport> {
    let count = gpukit_cuda::driver::probe(discovery)
        .map_err(|e| Error::Unavailable(format!("stress needs a GPU: {e}")))?
        .device_count;
    let ordinals = select_gpus(opts.gpus.as_deref(), count)?;
    if let Some(p) = &opts.plant {
        if !ordinals.contains(&p.gpu) {
            return Err(Error::BadInput(format!(
                "{PLANT_FAULT_VAR} names cuda:{}, which this run does not test",
                p.gpu
            )));
        }
    }
    let budget = Budget::split(opts.duration_s);
    let started = std::time::Instant::now();
    let watcher = watch::Watcher::start(discovery);
    let mut gpus: Vec<GpuStress> = std::thread::scope(|scope| {
        let handles: Vec<_> = ordinals
            .iter()
            .map(|&ordinal| {
                scope.spawn(move || gpu::stress_gpu(discovery, ordinal, opts, budget, progress))
            })
            .collect();
        handles
            .into_iter()
            .zip(&ordinals)
            .map(|(h, &ordinal)| {
                h.join().unwrap_or_else(|_| {
                    let mut g = GpuStress::new(ordinal);
                    g.errors
                        .push("the GPU's thread stopped unexpectedly".into());
                    g
                })
            })
            .collect()
    });
    let (multi_gpu, multi_gpu_not_run) = if ordinals.len() < 2 {
        (
            None,
            Some("one GPU tested: there is no pair for peer copies or an all-reduce".to_string()),
        )
    } else {
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        match multi::run_multi(discovery, &ordinals, &uuids, progress) {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(e)),
        }
    };
    let watched = watcher.stop();
    for g in &mut gpus {
        if let Some(w) = watched.get(&g.uuid) {
            g.watched = w.clone();
        } else {
            g.watched.unreadable = Some(
                watched
                    .failure()
                    .unwrap_or_else(|| "NVML did not report this GPU".to_string()),
            );
        }
    }
    verdict::judge(&mut gpus, multi_gpu.as_ref(), &opts.rules);
    Ok(StressReport {
        level: opts.level,
        duration_s: opts.duration_s,
        budget,
        elapsed_s: started.elapsed().as_secs_f64(),
        rules: opts.rules,
        multi_gpu,
        multi_gpu_not_run,
        gpus,
        planted: opts.plant,
        fp8_not_run: "fp8 (E4M3) matmul is not run: gpukit's cuBLASLt wrapper has no fp8 \
                      types yet"
            .to_string(),
    })
}

/// The CUDA ordinals to test: every one of `count`, or those asked for (each must exist).
pub fn select_gpus(asked: Option<&[usize]>, count: usize) -> Result<Vec<usize>> {
    let Some(asked) = asked else {
        return if count == 0 {
            Err(Error::Unavailable(
                "stress needs a GPU: CUDA sees none".into(),
            ))
        } else {
            Ok((0..count).collect())
        };
    };
    let mut out: Vec<usize> = Vec::new();
    for &g in asked {
        if g >= count {
            return Err(Error::BadInput(format!(
                "--gpus names cuda:{g}, but this machine has {count} CUDA device(s)"
            )));
        }
        if !out.contains(&g) {
            out.push(g);
        }
    }
    if out.is_empty() {
        return Err(Error::BadInput("--gpus names no GPU".into()));
    }
    Ok(out)
}
