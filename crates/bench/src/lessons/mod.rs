//! `gpukit lessons`: the CUDA-101 notebook's lessons (0-8) and the optimisation guide's stream,
//! synchronisation and graph patterns, run through gpukit's tensor API on the user's GPU, each
//! with a verdict for this machine: the claim holds, holds weakly or does not hold, and why.
//!
//! Every case is timed the same way, by gpukit and by PyTorch (`--compare-pytorch` runs the
//! notebook's own code through scripts/pytorch_lessons.py): the notebook's `benchmark_operation`
//! (a loop of calls ended by one synchronize) repeated, so each figure has a spread
//! ([`timing::time_case`]). Stream overlap is read from event timestamps, not inferred from
//! totals.

mod part;
pub use part::{LessonsPart, PART};
mod notebook;
mod peer;
mod profile;
mod streams;
pub mod timing;

use crate::ceilings::datasheet_peaks;
use crate::error::{Error, Result};
pub use crate::regime::Regime;
use crate::stats::Summary;
use gpukit_cuda::loader::Discovery;
use gpukit_tensor::{Device, Devices};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The lessons, in the order `all` runs them.
pub const LESSONS: [&str; 12] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "streams", "sync", "graphs",
];

/// Which lessons run; `all` or a comma list of numbers and names.
pub fn parse_lessons(s: &str) -> std::result::Result<Vec<String>, String> {
    let s = s.trim();
    if s.is_empty() || s == "all" {
        return Ok(LESSONS.iter().map(|l| l.to_string()).collect());
    }
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim) {
        if !LESSONS.contains(&item) {
            return Err(format!(
                "no lesson {item:?}: the lessons are {} (or all)",
                LESSONS.join(", ")
            ));
        }
        if !out.iter().any(|o| o == item) {
            out.push(item.to_string());
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct LessonsOptions {
    pub lessons: Vec<String>,
    /// None: cuda:0 when a GPU is usable, else the CPU.
    pub device: Option<Device>,
    pub compare_pytorch: bool,
    /// Timed samples per case.
    pub samples: usize,
    /// Each sample lasts at least this long (calls are batched until it does).
    pub min_sample_ms: f64,
}

impl Default for LessonsOptions {
    fn default() -> Self {
        LessonsOptions {
            lessons: LESSONS.iter().map(|l| l.to_string()).collect(),
            device: None,
            compare_pytorch: false,
            samples: 15,
            min_sample_ms: 2.0,
        }
    }
}

/// A time as PyTorch's run reported it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeerTime {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
}

/// One timed version of a lesson.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Case {
    pub name: String,
    /// What it does, in the notebook's terms.
    pub what: String,
    /// Per call.
    pub ms: Summary,
    pub calls_per_sample: usize,
    /// Pool memory above what was in use before the case (MiB), where the lesson is about it.
    pub peak_mib: Option<f64>,
    pub flops: Option<f64>,
    pub bytes: Option<f64>,
    /// Kernel launches (and copies) per call.
    pub launches: usize,
    pub tflops: Option<f64>,
    pub gbs: Option<f64>,
    /// FLOPs per byte.
    pub intensity: Option<f64>,
    pub regime: Option<Regime>,
    pub pytorch: Option<PeerTime>,
    pub pytorch_peak_mib: Option<f64>,
    /// PyTorch's median over gpukit's (above 1: gpukit is faster).
    pub vs_pytorch: Option<f64>,
}

/// A bad version against a good one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    pub bad: String,
    pub good: String,
    /// bad's median over good's: how much faster the good version is.
    pub speedup: f64,
    pub pytorch_speedup: Option<f64>,
}

/// Work on two streams (or a pipeline), from event timestamps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Overlap {
    pub name: String,
    pub what: String,
    /// Everything on one stream.
    pub serial_ms: f64,
    /// Spread over streams.
    pub overlapped_ms: f64,
    /// Each stream's (or stage's) busy span from the start event: (label, begin, end) in ms.
    pub intervals_ms: Vec<(String, f64, f64)>,
    /// Time during which two spans ran at once.
    pub overlap_ms: f64,
    /// Whether the overlapped result equals the serial one (where there is a result).
    pub agree: Option<bool>,
    pub pytorch_serial_ms: Option<f64>,
    pub pytorch_overlapped_ms: Option<f64>,
    pub pytorch_overlap_ms: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Holds,
    HoldsWeakly,
    DoesNotHold,
    /// The notebook's printed figure or explanation is wrong; the lesson says what is right.
    Corrected,
    /// A measurement to read, not a claim to test.
    Measured,
    Skipped,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::HoldsWeakly => "holds weakly",
            Verdict::DoesNotHold => "does not hold",
            Verdict::Corrected => "corrected",
            Verdict::Measured => "measured",
            Verdict::Skipped => "skipped",
        }
    }

    /// The verdict on "the good version is faster" from its speedup: 1.5x or more holds,
    /// 1.1x-1.5x holds weakly, less does not hold.
    pub fn of_speedup(speedup: f64) -> Verdict {
        if speedup >= 1.5 {
            Verdict::Holds
        } else if speedup >= 1.1 {
            Verdict::HoldsWeakly
        } else {
            Verdict::DoesNotHold
        }
    }
}

/// A row of lesson 8's profile (the network's top ops by GPU time).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileRow {
    pub name: String,
    pub calls: usize,
    pub gpu_total_us: f64,
    pub pct: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lesson {
    pub id: String,
    pub title: String,
    /// The notebook's (or guide's) claim, briefly quoted.
    pub claim: String,
    /// What the notebook printed, where it printed a figure.
    pub notebook: Option<String>,
    pub cases: Vec<Case>,
    pub comparisons: Vec<Comparison>,
    pub overlaps: Vec<Overlap>,
    pub profile: Vec<ProfileRow>,
    pub verdict: Verdict,
    /// Why, with the figures.
    pub reason: String,
    /// Lines of evidence printed under the verdict.
    pub evidence: Vec<String>,
    /// PyTorch's figures that are not per-case (lesson 0's memory, 8's profile), in words.
    pub pytorch_notes: Vec<String>,
    /// The lesson stopped with an error (the reason says which): the run is not a success.
    pub failed: bool,
}

impl Lesson {
    fn new(id: &str, title: &str, claim: &str, notebook: Option<&str>) -> Lesson {
        Lesson {
            id: id.into(),
            title: title.into(),
            claim: claim.into(),
            notebook: notebook.map(str::to_string),
            cases: Vec::new(),
            comparisons: Vec::new(),
            overlaps: Vec::new(),
            profile: Vec::new(),
            verdict: Verdict::Measured,
            reason: String::new(),
            evidence: Vec::new(),
            pytorch_notes: Vec::new(),
            failed: false,
        }
    }

    fn skipped(id: &str, title: &str, claim: &str, why: String) -> Lesson {
        let mut l = Lesson::new(id, title, claim, None);
        l.verdict = Verdict::Skipped;
        l.reason = why;
        l
    }

    pub fn case(&self, name: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.name == name)
    }

    /// Adds the comparison of two cases (bad over good) and returns gpukit's speedup.
    fn compare(&mut self, bad: &str, good: &str) -> Option<f64> {
        let (b, g) = (self.case(bad)?, self.case(good)?);
        let speedup = b.ms.median / g.ms.median;
        let pytorch_speedup = match (b.pytorch, g.pytorch) {
            (Some(pb), Some(pg)) => Some(pb.median_ms / pg.median_ms),
            _ => None,
        };
        self.comparisons.push(Comparison {
            bad: bad.into(),
            good: good.into(),
            speedup,
            pytorch_speedup,
        });
        Some(speedup)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LessonsReport {
    pub device: String,
    /// How every case is timed, in words.
    pub method: String,
    /// PyTorch's version line, or why it gave no figures.
    pub pytorch: Option<String>,
    pub lessons: Vec<Lesson>,
}

pub const METHOD: &str =
    "each case: warm-up (at least 3 calls and 50 ms), then samples of k calls ended by one \
synchronize (k chosen so a sample lasts at least the minimum), time per call = sample / k: the \
notebook's benchmark_operation, repeated for a spread";

/// The machine a lesson runs on: a GPU (with its ceilings) or the CPU.
pub(crate) struct Bench {
    pub devices: Devices,
    pub device: Device,
    pub gpu: Option<Arc<gpukit_cuda::Gpu>>,
    pub discovery: Discovery,
    pub samples: usize,
    pub min_sample_ms: f64,
    /// (TFLOP/s for a dtype name, memory GB/s) from the datasheet, when known.
    pub peaks: Option<crate::ceilings::Peaks>,
}

impl Bench {
    /// Fills in the rates, intensity and regime of a case from its work and time.
    pub(crate) fn place(&self, c: &mut Case, dtype: Option<&str>, host: bool) {
        let ms = c.ms.median;
        if let Some(f) = c.flops.filter(|f| *f > 0.0) {
            c.tflops = Some(f / (ms * 1e-3) / 1e12);
        }
        if let Some(b) = c.bytes.filter(|b| *b > 0.0) {
            c.gbs = Some(b / (ms * 1e-3) / 1e9);
        }
        c.intensity = match (c.flops, c.bytes) {
            (Some(f), Some(b)) if b > 0.0 => Some(f / b),
            _ => None,
        };
        c.regime = if host {
            Some(Regime::HostAndTransfer)
        } else if self.gpu.is_none() {
            None
        } else if ms * 1e3 / (c.launches.max(1) as f64) < 10.0 {
            Some(Regime::LaunchOverhead)
        } else {
            let ridge = self.peaks.as_ref().and_then(|p| {
                let t = p.for_dtype(dtype.unwrap_or("f32"))?;
                Some(t * 1e12 / (p.memory_gbs? * 1e9))
            });
            match (c.intensity, ridge) {
                (Some(i), Some(r)) if i >= r => Some(Regime::Compute),
                (Some(_), Some(_)) => Some(Regime::Memory),
                (None, _) if c.bytes.is_some() => Some(Regime::Memory),
                _ => None,
            }
        };
    }
}

/// Runs the lessons asked for. A lesson that fails is reported in its row (verdict skipped,
/// with the error), never as a figure; a bad device is an error.
pub fn run_lessons(
    discovery: &Discovery,
    opts: &LessonsOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<LessonsReport> {
    if opts.samples < 3 {
        return Err(Error::BadInput(format!(
            "--samples {}: at least 3 are needed for a spread",
            opts.samples
        )));
    }
    if !(opts.min_sample_ms > 0.0 && opts.min_sample_ms.is_finite()) {
        return Err(Error::BadInput(format!(
            "--min-sample-ms {} must be a positive number",
            opts.min_sample_ms
        )));
    }
    for l in &opts.lessons {
        parse_lessons(l).map_err(Error::BadInput)?;
    }
    let probe = gpukit_cuda::driver::probe(discovery);
    let device = match (opts.device, &probe) {
        (Some(Device::Cuda(n)), Ok(driver)) if n >= driver.device_count => {
            return Err(Error::BadInput(format!(
                "--device cuda:{n}: this machine has {} GPU(s) (cuda:0 to cuda:{})",
                driver.device_count,
                driver.device_count.saturating_sub(1)
            )))
        }
        (Some(Device::Cuda(n)), Err(e)) => {
            return Err(Error::Unavailable(format!(
                "--device cuda:{n}: no GPU can be used: {e}"
            )))
        }
        (Some(d), _) => d,
        (None, Ok(_)) => Device::Cuda(0),
        (None, Err(_)) => Device::Cpu,
    };
    // lesson 0 measures the context's cost: it must see the device before anything opens it
    let mut lessons = Vec::new();
    let mut lesson0 = if opts.lessons.iter().any(|l| l == "0") {
        progress("lesson 0: the CUDA context's memory");
        Some(notebook::lesson0(discovery, device))
    } else {
        None
    };
    let devices = Devices::new(discovery.clone());
    let gpu = match device {
        Device::Cuda(n) => Some(devices.gpu(n)?),
        Device::Cpu => None,
    };
    let name = match &gpu {
        Some(g) => g.name()?,
        None => "CPU".to_string(),
    };
    let bench = Bench {
        devices,
        device,
        gpu,
        discovery: discovery.clone(),
        samples: opts.samples,
        min_sample_ms: opts.min_sample_ms,
        peaks: datasheet_peaks(&name),
    };
    for id in &opts.lessons {
        let lesson = match id.as_str() {
            "0" => lesson0
                .take()
                .unwrap_or_else(|| Ok(Lesson::skipped("0", "", "", "not run".into()))),
            _ => {
                progress(&format!("lesson {id}"));
                run_one(&bench, id)
            }
        };
        lessons.push(match lesson {
            Ok(l) => l,
            Err(e) if e.kind() == gpukit_types::ErrorKind::BadInput => return Err(e),
            Err(e) => {
                let mut l = Lesson::skipped(id, notebook::title(id), "", format!("failed: {e}"));
                l.failed = true;
                l
            }
        });
    }
    let mut report = LessonsReport {
        device: match device {
            Device::Cuda(n) => format!("cuda:{n} {name}"),
            Device::Cpu => "CPU".into(),
        },
        method: METHOD.into(),
        pytorch: None,
        lessons,
    };
    if opts.compare_pytorch {
        progress("PyTorch: the notebook's own code, the same timing");
        let outcome = peer::run(&report, device, opts);
        report.pytorch = Some(match outcome {
            Ok(doc) => peer::merge(&mut report, &doc),
            Err(e) => format!("no PyTorch figures: {e}"),
        });
    }
    for l in &mut report.lessons {
        add_pytorch_speedup(l);
    }
    Ok(report)
}

use gpukit_types::HasKind;

/// The JSON document of `gpukit lessons`: a failure when a lesson stopped with an error (a
/// check of its results, or the GPU), or when nothing ran.
pub fn document(report: LessonsReport) -> crate::report::Document<LessonsReport> {
    let failed: Vec<String> = report
        .lessons
        .iter()
        .filter(|l| l.failed)
        .map(|l| format!("lesson {}: {}", l.id, l.reason))
        .collect();
    let failure = if !failed.is_empty() {
        Some(failed.join("; "))
    } else if report.lessons.iter().all(|l| l.verdict == Verdict::Skipped) {
        Some("no lesson ran on this machine".into())
    } else {
        None
    };
    crate::report::Document::new("lessons", report, failure)
}

fn run_one(bench: &Bench, id: &str) -> Result<Lesson> {
    let on_gpu = bench.gpu.is_some();
    match id {
        "1" | "3" | "6" | "streams" | "sync" | "graphs" if !on_gpu => Ok(Lesson::skipped(
            id,
            notebook::title(id),
            "",
            "needs a GPU: it is about the GPU's memory, copies, tensor cores, streams or launches"
                .into(),
        )),
        "1" => notebook::lesson1(bench),
        "2" => notebook::lesson2(bench),
        "3" => notebook::lesson3(bench),
        "4" => notebook::lesson4(bench),
        "5" => notebook::lesson5(bench),
        "6" => notebook::lesson6(bench),
        "7" => notebook::lesson7(bench),
        "8" => profile::lesson8(bench),
        "streams" => streams::streams(bench),
        "sync" => streams::sync(bench),
        "graphs" => streams::graphs(bench),
        other => Err(Error::BadInput(format!("no lesson {other:?}"))),
    }
}

/// Adds PyTorch's speedup of the lesson's main comparison to its reason.
fn add_pytorch_speedup(l: &mut Lesson) {
    if let Some(p) = l.comparisons.first().and_then(|c| c.pytorch_speedup) {
        l.reason
            .push_str(&format!("; with PyTorch, the notebook's own code: {p:.2}x"));
    }
}

/// The verdict of "the good version is faster" from the comparison of `bad` and `good`, with
/// the reason in figures.
fn judge_speedup(l: &mut Lesson, bad: &str, good: &str) {
    if let Some(s) = l.compare(bad, good) {
        l.verdict = Verdict::of_speedup(s);
        l.reason = if s >= 0.9 {
            format!("{good} is {s:.2}x as fast as {bad}")
        } else {
            format!(
                "the opposite holds: {bad} is {:.2}x as fast as {good}",
                1.0 / s
            )
        };
    }
}
