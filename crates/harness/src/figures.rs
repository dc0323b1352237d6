//! Figures of a report for `gpukit compare`: what a figure is (its key, unit, direction and
//! reading), and the helpers each command's part uses to read its rows as JSON values for the
//! fields that name a row and the figure it measured (a missing field drops that row).
//!
//! A key names what decides the figure, so that only like is matched with like: the row's own
//! fields (device, dtype, size, batch, ...) and the run's settings that change it (the model
//! and image size, the CPU's thread count, a training run's layers, optimizer, batch, samples,
//! precision and loader, NCCL's ranks). What only repeats the measurement (iterations, epochs,
//! warm-up) is left out, and so is what the code under test chooses (algorithms, engines,
//! chunk sizes): comparing those across versions is the point.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which way a figure improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Rates: TFLOP/s, GB/s, images/s.
    Higher,
    /// Costs: milliseconds, bytes.
    Lower,
}

/// One row's measurement as a report holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// The figure; None when the row did not produce one (see `problem`).
    pub value: Option<f64>,
    /// The run's own spread in the value's unit: what p10 and p90 of its timing map to.
    pub spread: Option<[f64; 2]>,
    /// How many repetitions the value and its spread summarise (a timing's count, a training
    /// run's steady epochs); None when the report does not say.
    #[serde(default)]
    pub samples: Option<u64>,
    /// "failed: ..." or "skipped: ..." when the row's status was not ok.
    pub problem: Option<String>,
}

/// A figure of one report: what it is (its key names the section, the row and the
/// configuration that decides it), and its reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// matmul, bandwidth, conv, infer, memory, train, nccl, p2p.
    pub section: String,
    /// The section, the row's identifying fields and the settings that change the figure:
    /// "matmul cuda:0 bf16 8192", "train cpu 16-64-1 mse adam batch 64 819 samples fp32".
    pub key: String,
    pub unit: String,
    pub better: Better,
    /// A count or size that a repeat reproduces (bytes, a batch size), not a timing: it has no
    /// spread to wait for, and the threshold alone judges it.
    #[serde(default)]
    pub exact: bool,
    pub reading: Reading,
}

/// The rows of a section, or none when it has no "rows" array.
pub fn rows(section: &Value) -> &[Value] {
    section
        .get("rows")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A field as text: strings as they are, numbers and the rest as JSON writes them.
pub fn text(row: &Value, field: &str) -> Option<String> {
    match row.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// A device as the tables write it: "Cpu" -> cpu, {"Cuda": 0} -> cuda:0, and a string's first
/// word ("cuda:0 (NVIDIA H100 80GB HBM3)" -> cuda:0): the GPU's model is the machine's, which
/// the warnings cover, not the run's configuration.
pub fn device(row: &Value) -> Option<String> {
    match row.get("device")? {
        Value::String(s) => {
            let first = s.split_whitespace().next()?;
            Some(if first.eq_ignore_ascii_case("cpu") {
                "cpu".into()
            } else {
                first.to_string()
            })
        }
        Value::Object(m) => m
            .get("Cuda")
            .and_then(Value::as_u64)
            .map(|n| format!("cuda:{n}")),
        _ => None,
    }
}

/// " 16 threads" for a CPU row when the section says how many threads its CPU kernels ran on
/// (RAYON_NUM_THREADS and the machine's cores decide it, and the CPU's figures scale with it);
/// nothing for a GPU row.
pub fn threads(section: &Value, dev: &str) -> String {
    match section.get("cpu_threads").and_then(Value::as_u64) {
        Some(n) if dev == "cpu" => format!(" {n} threads"),
        _ => String::new(),
    }
}

/// The section's GPU as `cuda:N`, from its GPU facts.
pub fn gpu_device(section: &Value) -> Option<String> {
    section
        .get("gpu")
        .and_then(|g| g.get("index"))
        .and_then(Value::as_u64)
        .map(|n| format!("cuda:{n}"))
}

/// Why a row has no figure, from its status ({"status": "failed", "why": ...}, or a bare
/// string in older reports); None when it is ok.
pub fn problem(row: &Value) -> Option<String> {
    let (status, why) = match row.get("status")? {
        Value::String(s) => (s.clone(), None),
        Value::Object(m) => (
            m.get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            m.get("why").and_then(Value::as_str),
        ),
        _ => return None,
    };
    if status.eq_ignore_ascii_case("ok") {
        return None;
    }
    Some(match why {
        Some(w) => format!("{status}: {w}"),
        None => status,
    })
}

/// A figure that can be divided by: finite and above zero.
pub fn positive(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
        .filter(|x| x.is_finite() && *x > 0.0)
}

/// The spread of `value` from the row's timing summary (`timing.summary_ms`), and how many
/// repetitions it summarises. A rate is inversely proportional to time, so its low end comes
/// from p90: value·median/p90 .. value·median/p10; a time scales directly: value·p10/median ..
/// value·p90/median.
pub fn spread(row: &Value, value: f64, better: Better) -> (Option<[f64; 2]>, Option<u64>) {
    let Some(s) = row.get("timing").and_then(|t| t.get("summary_ms")) else {
        return (None, None);
    };
    let samples = s.get("count").and_then(Value::as_u64);
    let range = (|| {
        let median = positive(s.get("median"))?;
        let p10 = positive(s.get("p10"))?;
        let p90 = positive(s.get("p90"))?;
        Some(match better {
            Better::Higher => [value * median / p90, value * median / p10],
            Better::Lower => [value * p10 / median, value * p90 / median],
        })
    })();
    (range, samples)
}

/// What a row's figure describes.
pub struct Spec<'a> {
    pub section: &'a str,
    pub unit: &'a str,
    pub better: Better,
    /// Whether the row's timing summary measured this figure (its spread applies).
    pub timed: bool,
    /// A count or size that a repeat reproduces, judged on the threshold alone.
    pub exact: bool,
}

impl Spec<'_> {
    /// A figure of this kind under `key` (the section's name is put in front).
    pub fn figure(&self, key: String, reading: Reading) -> Figure {
        Figure {
            section: self.section.to_string(),
            key: format!("{} {key}", self.section),
            unit: self.unit.to_string(),
            better: self.better,
            exact: self.exact,
            reading,
        }
    }
}

/// A row's figure: its problem when the status is not ok, else its value when it has one
/// (a row that is ok but carries no figure gives none).
pub fn row_figure(spec: &Spec<'_>, key: String, row: &Value, field: &str) -> Option<Figure> {
    let reading = match problem(row) {
        Some(p) => Reading {
            value: None,
            spread: None,
            samples: None,
            problem: Some(p),
        },
        None => {
            let value = positive(row.get(field))?;
            let (spread, samples) = if spec.timed {
                spread(row, value, spec.better)
            } else {
                (None, None)
            };
            Reading {
                value: Some(value),
                spread,
                samples,
                problem: None,
            }
        }
    };
    Some(spec.figure(key, reading))
}

/// A figure that no timing summary describes (totals, memory), never a failed row's.
pub fn plain_figure(spec: &Spec<'_>, key: String, value: Option<&Value>) -> Option<Figure> {
    let reading = Reading {
        value: Some(positive(value)?),
        spread: None,
        samples: None,
        problem: None,
    };
    Some(spec.figure(key, reading))
}

/// 1073741824 -> "1 GiB": sizes as the command line gives them.
pub fn bytes_name(b: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} B")
}

/// "resnet50 224px " from a section's model and square image size, each when known.
pub fn model_and_size(section: &Value, image_size: Option<String>) -> String {
    let mut out = String::new();
    if let Some(m) = text(section, "model") {
        out.push_str(&format!("{m} "));
    }
    if let Some(px) = image_size {
        out.push_str(&format!("{px}px "));
    }
    out
}
