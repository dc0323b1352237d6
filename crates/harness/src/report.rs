//! What every command leaves behind: the row vocabulary its report is made of ([`RowStatus`],
//! [`Verification`], [`PeerFigure`]), one judgement of whether the run may exit 0
//! ([`judge_rows`]), and one JSON envelope around every command's report ([`Document`]) carrying
//! the notes every view shows (terminal, report.md, JSON).

use crate::error::Result;
use crate::measure::PeerSamples;
use serde::{Deserialize, Serialize};

/// Whether a row produced a figure.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", content = "why", rename_all = "snake_case")]
pub enum RowStatus {
    Ok,
    /// Ran, but the output was wrong (no figure is reported) or a call failed.
    Failed(String),
    /// Did not run (dtype missing on the device, too big, ...).
    Skipped(String),
}

/// A sampled comparison against a float64 reference computed from the same stored inputs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Verification {
    pub samples: usize,
    /// ||C_sample - ref|| / ||ref||.
    pub rel_err: f64,
    pub tolerance: f64,
    pub passed: bool,
}

/// A figure from PyTorch for the same workload, measured in the same invocation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerFigure {
    pub median_ms: f64,
    /// TFLOP/s for compute rows, GB/s for copies: the same unit as the row's own rate.
    pub rate: f64,
    /// gpukit's rate over PyTorch's (above 1: gpukit faster). When the two took turns, the
    /// geometric mean of the two orders' medians of `turn_ratios`.
    pub ratio: f64,
    /// When the two took turns: gpukit's rate over PyTorch's in each round, from the blocks'
    /// medians (`harness::Interleaved::paired_time_ratios`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_ratios: Vec<f64>,
    /// The median of the rounds gpukit opened, then of those PyTorch opened; `ratio` is their
    /// geometric mean: the side that opens a round gains a few percent, and the two orders
    /// cancel it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_opener: Vec<f64>,
}

impl PeerFigure {
    /// PyTorch's figure from one run of its own (no turns taken): its median time and rate,
    /// and ours over it.
    pub fn single(median_ms: f64, rate: f64, ours_rate: f64) -> PeerFigure {
        PeerFigure {
            median_ms,
            rate,
            ratio: ours_rate / rate,
            turn_ratios: Vec::new(),
            by_opener: Vec::new(),
        }
    }

    /// PyTorch's figure from its samples of the same turns, beside ours (`ours_rate`, in the
    /// unit `rate_of` turns a time in ms into). The ratio comes from the per-round ratios when
    /// there are any (pooled medians of two bimodal, throttled series can each land on either
    /// mode): the geometric mean of the two orders' medians, so that what the opener gains
    /// cancels, or the median of one order's rounds; without rounds, the rates' ratio.
    pub fn from_turns(
        theirs: Option<PeerSamples>,
        rate_of: impl Fn(f64) -> f64,
        ours_rate: f64,
    ) -> Option<PeerFigure> {
        let theirs = theirs?;
        let s = crate::stats::Summary::of(&theirs.samples)?;
        let rate = rate_of(s.median);
        Some(PeerFigure {
            median_ms: s.median,
            rate,
            ratio: theirs.ratio().unwrap_or(ours_rate / rate),
            turn_ratios: theirs.turn_ratios,
            by_opener: theirs.by_opener,
        })
    }
}

/// How the rows of a run came out, as far as the exit code is concerned: `Some(why)` when the
/// run must not exit 0, because a row failed (a wrong result is never a success) or because it
/// measured nothing at all (every row skipped).
pub fn judge_rows<'a>(statuses: impl IntoIterator<Item = &'a RowStatus>) -> Option<String> {
    let (mut ok, mut failed, mut skipped) = (0usize, Vec::new(), Vec::new());
    for s in statuses {
        match s {
            RowStatus::Ok => ok += 1,
            RowStatus::Failed(why) => failed.push(why.as_str()),
            RowStatus::Skipped(why) => skipped.push(why.as_str()),
        }
    }
    if let Some(first) = failed.first() {
        return Some(format!(
            "{} row(s) failed, their figures are not reported (the first: {first})",
            failed.len()
        ));
    }
    match (ok, skipped.first()) {
        (0, Some(first)) => Some(format!(
            "nothing was measured: all {} row(s) were skipped (the first: {first})",
            skipped.len()
        )),
        _ => None,
    }
}

/// PyTorch beside a run (`--compare-pytorch`): the version that ran, or why it could not.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PeerInfo {
    Ran { torch_version: String },
    Failed { error: String },
}

impl PeerInfo {
    /// From a comparison's outcome (its version line, or its error).
    pub fn of(outcome: &Result<String>) -> PeerInfo {
        match outcome {
            Ok(v) => PeerInfo::Ran {
                torch_version: v.clone(),
            },
            Err(e) => PeerInfo::Failed {
                error: e.to_string(),
            },
        }
    }

    /// The one line every view shows about the peer.
    pub fn line(&self) -> String {
        match self {
            PeerInfo::Ran { torch_version } => format!(
                "PyTorch {torch_version} ran the same workloads in this invocation \
                 (scripts/pytorch_reference.py)"
            ),
            PeerInfo::Failed { error } => format!("PyTorch comparison not available: {error}"),
        }
    }
}

/// The JSON document of every command: the same envelope around each command's report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Document<T> {
    /// The gpukit that wrote it.
    pub gpukit_version: String,
    /// `check`, `bench matmul`, `infer`, `all`, ...
    pub command: String,
    /// False when the run must not count as a success (see [`Document::failure`]).
    pub ok: bool,
    /// Why the run failed though it produced a report: rows that failed, or nothing measured.
    pub failure: Option<String>,
    /// Lines that explain the figures, shown by every view under the tables.
    pub notes: Vec<String>,
    /// PyTorch beside the run, when it was asked for.
    pub pytorch: Option<PeerInfo>,
    /// The command's own report.
    pub result: T,
}

impl<T> Document<T> {
    /// A document for `result` with the run's judgement (`failure`, None for a success).
    pub fn new(command: &str, result: T, failure: Option<String>) -> Document<T> {
        Document {
            gpukit_version: env!("CARGO_PKG_VERSION").to_string(),
            command: command.to_string(),
            ok: failure.is_none(),
            failure,
            notes: Vec::new(),
            pytorch: None,
            result,
        }
    }

    /// Adds the peer's outcome (and its line to the notes, first).
    pub fn with_peer(mut self, outcome: Option<&Result<String>>) -> Document<T> {
        if let Some(o) = outcome {
            let info = PeerInfo::of(o);
            self.notes.insert(0, info.line());
            self.pytorch = Some(info);
        }
        self
    }

    pub fn with_notes(mut self, notes: impl IntoIterator<Item = String>) -> Document<T> {
        self.notes.extend(notes);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_failed_row_or_nothing_measured_is_not_a_success() {
        let ok = RowStatus::Ok;
        let skipped = RowStatus::Skipped("too big".into());
        let failed = RowStatus::Failed("wrong result".into());
        assert_eq!(judge_rows([&ok, &skipped]), None);
        assert_eq!(judge_rows(std::iter::empty()), None);
        let all_skipped = judge_rows([&skipped, &skipped]).unwrap();
        assert!(all_skipped.contains("nothing was measured") && all_skipped.contains("too big"));
        let f = judge_rows([&ok, &skipped, &failed]).unwrap();
        assert!(
            f.contains("1 row(s) failed") && f.contains("wrong result"),
            "{f}"
        );
    }

    #[test]
    fn the_envelope_carries_the_peer_and_notes() {
        let d = Document::new("bench matmul", 7u32, None)
            .with_notes(["a note".to_string()])
            .with_peer(Some(&Ok("2.11".into())));
        assert!(d.ok && d.failure.is_none());
        assert_eq!(d.notes.len(), 2);
        assert!(d.notes[0].starts_with("PyTorch 2.11 ran"));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["pytorch"]["torch_version"], "2.11");
        assert_eq!(json["result"], 7);
        assert_eq!(json["command"], "bench matmul");
        let failed = Document::new("infer", (), Some("x".into()))
            .with_peer(Some(&Err(Error::Peer("no torch".into()))));
        assert!(!failed.ok);
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(json["pytorch"]["error"], "no torch");
    }
}
