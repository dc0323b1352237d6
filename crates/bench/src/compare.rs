//! `gpukit compare OLD NEW`: the figures two reports have in common, side by side, each judged
//! better, worse or the same. A change counts only when it is beyond both a threshold and the
//! two runs' own spread: two runs of the same build on the same machine differ by a few percent,
//! and a comparison that calls that a regression teaches people to ignore it.
//!
//! Two things make a verdict trustworthy, and both are checked here:
//! - the two figures measured the same thing: a figure's key names the configuration that
//!   decides it (dtype, size, batch, model, layers, optimizer, threads, ...), so a figure of
//!   another configuration is listed as found in one report only, never compared;
//! - the spread behind each side rests on enough repetitions: a timed figure with fewer than
//!   [`MIN_SAMPLES`] of them (or no spread at all) that moved beyond the threshold is "not
//!   judged", since with so few the p10-p90 ranges of two runs of the same build miss each other
//!   by chance (below 10 they are interpolated from the extremes). When most figures are like
//!   that, or spread wider than the threshold, the report says the runs are too noisy to judge.
//!
//! The reports are read as JSON values, not as the report structs: those change from version to
//! version, and a comparison is most useful exactly across versions (an old report against a new
//! one). Each section's rows are walked for the fields that name them and the figure they
//! measured; a field that is missing only drops that row.

mod figures;
#[cfg(test)]
mod tests;

pub use figures::figures;

use crate::error::{Error, Result};
pub use crate::figures::{Better, Figure, Reading};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Repetitions each side needs behind its p10-p90 range before a change beyond the threshold
/// is called better or worse. From ten on, p10 and p90 sit at the second-lowest and
/// second-highest sample; below that they lean on the extremes, and two runs of the same build
/// land apart by chance (simulated: 2 samples 39%, 3 samples 15%, 5 samples 2%, 10 samples
/// 0.03% of figures with a 10% spread).
pub const MIN_SAMPLES: u64 = 10;

/// The share of timed figures, not judged better or worse, that cannot tell a change of the
/// threshold's size from noise (too few repetitions, or a spread wider than the threshold) from
/// which the runs as a whole are called too noisy to judge: past half, the counts describe the
/// noise more than the builds.
const NOISY_SHARE: f64 = 0.5;

/// How a figure changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Better,
    Worse,
    /// Within the threshold, or within the runs' spread.
    Same,
    /// Moved beyond the threshold, but a side has fewer than [`MIN_SAMPLES`] repetitions
    /// behind its spread, or no spread: not judged, too few to tell a change from noise.
    TooFewSamples,
    /// One side has no figure (the row failed or was skipped): nothing to compare.
    NotMeasured,
}

/// One key found in both reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compared {
    pub section: String,
    pub key: String,
    pub unit: String,
    pub better: Better,
    /// A count or size, judged on the threshold alone (see [`Figure::exact`]).
    #[serde(default)]
    pub exact: bool,
    pub old: Reading,
    pub new: Reading,
    /// new / old, plainly (for a "lower is better" figure, below 1 is better).
    pub ratio: Option<f64>,
    /// The ratio turned so that above 1 is better whatever the unit: new/old for rates,
    /// old/new for costs.
    pub gain: Option<f64>,
    pub verdict: Verdict,
    /// The change passed the threshold but the two runs' [p10, p90] ranges overlap.
    pub within_noise: bool,
}

/// The machine a report was measured on, as far as the report says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub gpu: Option<String>,
    pub gpu_uuid: Option<String>,
    pub driver: Option<String>,
    pub cpu: Option<String>,
}

/// One input file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub path: String,
    /// The command that wrote it ("all" for the old bare `all` report).
    pub command: String,
    pub gpukit_version: Option<String>,
    pub machine: Machine,
    /// The run's own failure, when it says it failed.
    pub failure: Option<String>,
}

/// Counts and the geometric mean gain of one section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SectionSummary {
    pub section: String,
    pub better: usize,
    pub worse: usize,
    pub same: usize,
    /// Of `same`: moved beyond the threshold, but within the two runs' p10-p90 ranges.
    #[serde(default)]
    pub within_noise: usize,
    /// Moved beyond the threshold with too few repetitions to judge (`TooFewSamples`).
    #[serde(default)]
    pub not_judged: usize,
    pub not_measured: usize,
    pub only_old: usize,
    pub only_new: usize,
    /// Geometric mean of the gains (above 1: new better) over the figures measured in both.
    pub geomean_gain: Option<f64>,
    /// Timed figures (not counts or sizes) measured in both reports.
    #[serde(default)]
    pub timed: usize,
    /// Of `timed`, not judged better or worse: fewer than [`MIN_SAMPLES`] repetitions, or no
    /// spread, on a side.
    #[serde(default)]
    pub too_few: usize,
    /// Of `timed`, not judged better or worse, with enough repetitions: a side's p10-p90 range
    /// is wider than the threshold (relative to its value), so a change of the threshold's size
    /// hides in it.
    #[serde(default)]
    pub wide: usize,
}

/// The result of `gpukit compare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub old: Side,
    pub new: Side,
    /// A change smaller than this fraction is "same" (0.05: 5%).
    pub threshold: f64,
    /// Repetitions each side needs behind a timed figure's spread to be judged.
    #[serde(default)]
    pub min_samples: u64,
    /// Whether too many timed figures cannot tell a change of the threshold's size from noise
    /// for the verdict counts to mean much (see `caveats`).
    #[serde(default)]
    pub too_noisy: bool,
    /// What could not be judged and why, and what would let it be (more repetitions, a quieter
    /// machine); empty when every figure could be judged.
    #[serde(default)]
    pub caveats: Vec<String>,
    /// Totals over every section (its `section` is "all").
    pub total: SectionSummary,
    pub sections: Vec<SectionSummary>,
    /// Keys in both reports, worst first within each section.
    pub figures: Vec<Compared>,
    pub only_old: Vec<String>,
    pub only_new: Vec<String>,
    /// Different GPUs, drivers or CPUs; the inputs' own failures.
    pub warnings: Vec<String>,
}

/// A report read from a file: who wrote it, and its sections by name.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub side: Side,
    /// Section name (matmul, infer, check, ...) to its report.
    pub sections: BTreeMap<String, Value>,
}

/// The section names an `all` report holds; their presence marks the old bare format.
const ALL_SECTIONS: [&str; 9] = [
    "check",
    "matmul",
    "bandwidth",
    "conv",
    "infer",
    "memory",
    "train",
    "nccl",
    "p2p",
];

/// Reads a report from `path`. Anything but a gpukit report is bad input naming the file.
pub fn load(path: &Path) -> Result<Loaded> {
    let shown = path.display().to_string();
    if path.is_dir() {
        return Err(Error::BadInput(format!(
            "{shown} is a directory, not a gpukit report (give the report.json inside it)"
        )));
    }
    let bytes =
        std::fs::read(path).map_err(|e| Error::BadInput(format!("cannot read {shown}: {e}")))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::BadInput(format!("{shown} is not valid JSON: {e}")))?;
    from_value(&shown, value)
}

/// Recognises a report in a parsed file: the envelope of any command, or the old bare `all`
/// report (no envelope, the sections at the top), so that reports from before the envelope
/// still compare.
pub fn from_value(shown: &str, value: Value) -> Result<Loaded> {
    let Value::Object(mut top) = value else {
        return Err(not_a_report(shown));
    };
    let version = top
        .get("gpukit_version")
        .and_then(Value::as_str)
        .map(String::from);
    let command = top.get("command").and_then(Value::as_str).map(String::from);
    let (command, result, failure) = match (command, top.remove("result")) {
        (Some(c), Some(r)) => {
            let failure = top.get("failure").and_then(Value::as_str).map(String::from);
            (c, r, failure)
        }
        (None, None) if top.contains_key("matmul") || top.contains_key("infer") => {
            ("all".to_string(), Value::Object(top), None)
        }
        _ => return Err(not_a_report(shown)),
    };
    let sections = sections_of(&command, result);
    let machine = machine_of(&sections);
    Ok(Loaded {
        side: Side {
            path: shown.to_string(),
            command,
            gpukit_version: version,
            machine,
            failure,
        },
        sections,
    })
}

fn not_a_report(shown: &str) -> Error {
    Error::BadInput(format!(
        "{shown} is not a gpukit report (no \"command\" and \"result\" of gpukit's JSON \
         document, nor the \"matmul\"/\"infer\" of an older `gpukit all` report)"
    ))
}

/// The sections of a command's result: `all`'s are its fields, any other command's result is
/// the one section the command is named after.
fn sections_of(command: &str, result: Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    if command == "all" {
        if let Value::Object(map) = result {
            for (k, v) in map {
                if ALL_SECTIONS.contains(&k.as_str()) && !v.is_null() {
                    out.insert(k, v);
                }
            }
        }
        return out;
    }
    if let Some((name, _)) = crate::other_reports()
        .into_iter()
        .find(|(c, _)| *c == command)
    {
        out.insert(name.to_string(), result);
        return out;
    }
    let name = command.strip_prefix("bench ").unwrap_or(command);
    if ALL_SECTIONS.contains(&name) {
        out.insert(name.to_string(), result);
    }
    out
}

/// The GPU, driver and CPU as the report names them: `check`'s first GPU when there is a check
/// section, else the GPU facts a benchmark section carries.
fn machine_of(sections: &BTreeMap<String, Value>) -> Machine {
    let check = sections.get("check");
    let gpu = check
        .and_then(|c| c.get("gpus"))
        .and_then(|g| g.get(0))
        .or_else(|| {
            ["matmul", "bandwidth", "conv"]
                .iter()
                .filter_map(|s| sections.get(*s))
                .find_map(|s| s.get("gpu").filter(|g| g.is_object()))
        });
    let text = |v: Option<&Value>, field: &str| {
        v.and_then(|v| v.get(field))
            .and_then(Value::as_str)
            .map(String::from)
    };
    let cpu = text(check.and_then(|c| c.get("host")), "cpu_model")
        .or_else(|| text(sections.get("matmul"), "cpu_model"));
    Machine {
        gpu: text(gpu, "name"),
        gpu_uuid: text(gpu, "uuid"),
        driver: text(check.and_then(|c| c.get("driver")), "version"),
        cpu,
    }
}

/// A warning per difference between the machines that changes what figures mean: another GPU
/// model, another chip of the same model, another driver, another CPU.
fn machine_warnings(old: &Machine, new: &Machine) -> Vec<String> {
    let mut out = Vec::new();
    let beyond = "figures from different chips differ for reasons beyond gpukit";
    let short = |u: &Option<String>| {
        u.as_deref()
            .map(|u| match u.get(..12) {
                Some(head) if u.len() > 12 => format!("{head}…"),
                _ => u.to_string(),
            })
            .unwrap_or_else(|| "uuid unknown".into())
    };
    if let (Some(a), Some(b)) = (&old.gpu, &new.gpu) {
        if a != b {
            out.push(format!(
                "warning: different GPUs: {a} ({}) vs {b} ({}) — {beyond}",
                short(&old.gpu_uuid),
                short(&new.gpu_uuid)
            ));
        } else if let (Some(x), Some(y)) = (&old.gpu_uuid, &new.gpu_uuid) {
            if x != y {
                out.push(format!(
                    "warning: another chip of the same model: {a} {} vs {} — {beyond} \
                     (clocks, cooling, power limits)",
                    short(&old.gpu_uuid),
                    short(&new.gpu_uuid)
                ));
            }
        }
    }
    if let (Some(a), Some(b)) = (&old.driver, &new.driver) {
        if a != b {
            out.push(format!("warning: different drivers: {a} vs {b}"));
        }
    }
    if let (Some(a), Some(b)) = (&old.cpu, &new.cpu) {
        if a != b {
            out.push(format!(
                "warning: different CPUs: {a} vs {b} — the CPU rows measure different machines"
            ));
        }
    }
    out
}

/// Parses `--threshold`: "5%" or a fraction, "0.05". A bare number of 1 or more is refused: it
/// could mean percent or a fraction, and guessing wrong hides every regression.
pub fn parse_threshold(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim();
    let (num, percent) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let v: f64 = num.parse().map_err(|_| {
        format!("'{s}' is not a threshold (a percentage such as 5% or a fraction such as 0.05)")
    })?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "'{s}': a threshold is a percentage or fraction of 0 or more"
        ));
    }
    if percent {
        return Ok(v / 100.0);
    }
    if v >= 1.0 {
        return Err(format!(
            "'{s}' is ambiguous: write a percentage ({s}%) or a fraction (0.05)"
        ));
    }
    Ok(v)
}

/// Whether two [p10, p90] ranges share a point.
fn overlap(a: [f64; 2], b: [f64; 2]) -> bool {
    a[0] <= b[1] && b[0] <= a[1]
}

/// Whether a reading's spread rests on enough repetitions to judge a change by.
fn enough_samples(r: &Reading) -> bool {
    r.spread.is_some() && r.samples.is_some_and(|n| n >= MIN_SAMPLES)
}

/// The verdict on one figure, returned with the plain ratio, the gain, and whether the spread
/// alone made it "same":
/// - within the threshold: same;
/// - a count or size (`exact`) beyond it: better or worse;
/// - a timing whose two p10-p90 ranges overlap: same (noise);
/// - a timing with fewer than [`MIN_SAMPLES`] repetitions or no spread on a side: not judged;
/// - else better or worse.
fn judge(
    better: Better,
    exact: bool,
    old: &Reading,
    new: &Reading,
    threshold: f64,
) -> (Verdict, Option<f64>, Option<f64>, bool) {
    let (Some(a), Some(b)) = (old.value, new.value) else {
        return (Verdict::NotMeasured, None, None, false);
    };
    let ratio = b / a;
    let gain = match better {
        Better::Higher => ratio,
        Better::Lower => 1.0 / ratio,
    };
    let beyond = gain > 1.0 + threshold || gain < 1.0 - threshold;
    if !beyond {
        return (Verdict::Same, Some(ratio), Some(gain), false);
    }
    let moved = if gain > 1.0 {
        Verdict::Better
    } else {
        Verdict::Worse
    };
    if exact {
        return (moved, Some(ratio), Some(gain), false);
    }
    // ranges that overlap though they rest on few samples overlap all the more with more
    if let (Some(x), Some(y)) = (old.spread, new.spread) {
        if overlap(x, y) {
            return (Verdict::Same, Some(ratio), Some(gain), true);
        }
    }
    if !enough_samples(old) || !enough_samples(new) {
        return (Verdict::TooFewSamples, Some(ratio), Some(gain), false);
    }
    (moved, Some(ratio), Some(gain), false)
}

/// Whether a p10-p90 range is wider than the threshold, relative to its value.
fn wider_than(r: &Reading, threshold: f64) -> bool {
    match (r.value, r.spread) {
        (Some(v), Some([lo, hi])) => (hi - lo) / v > threshold,
        _ => false,
    }
}

/// How a compared figure sorts (lowest first): a row that failed in the new report but not in
/// the old one, then the gains from the worst, then rows skipped or failing all along.
fn badness(c: &Compared) -> f64 {
    match c.gain {
        Some(g) => g,
        None if newly_failed(c) => f64::NEG_INFINITY,
        None => f64::INFINITY,
    }
}

/// Whether a row measured in the old report failed in the new one: a regression though there
/// is no number to compare.
pub fn newly_failed(c: &Compared) -> bool {
    let failed = |r: &Reading| {
        r.problem
            .as_deref()
            .is_some_and(|p| p.starts_with("failed"))
    };
    failed(&c.new) && !failed(&c.old)
}

/// Compares two loaded reports. No key in common at all is bad input: the files measured
/// different things (another command, other sizes), and an empty comparison would pass for a
/// clean one.
pub fn compare(old: &Loaded, new: &Loaded, threshold: f64) -> Result<CompareReport> {
    let olds = figures(old);
    let news = figures(new);
    let new_by_key: HashMap<&str, &Figure> = news.iter().map(|f| (f.key.as_str(), f)).collect();
    let old_keys: HashSet<&str> = olds.iter().map(|f| f.key.as_str()).collect();
    let mut matched = Vec::new();
    let mut only_old = Vec::new();
    for o in &olds {
        match new_by_key.get(o.key.as_str()) {
            Some(n) => matched.push(compared(o, n, threshold)),
            None => only_old.push(o),
        }
    }
    let only_new: Vec<&Figure> = news
        .iter()
        .filter(|f| !old_keys.contains(f.key.as_str()))
        .collect();
    if matched.is_empty() {
        return Err(Error::BadInput(format!(
            "{} ({}, {} figures) and {} ({}, {} figures) have no figure in common",
            old.side.path,
            old.side.command,
            olds.len(),
            new.side.path,
            new.side.command,
            news.len()
        )));
    }
    let order: Vec<String> = section_order(&olds, &news);
    matched.sort_by(|a, b| {
        let pos = |s: &str| order.iter().position(|x| x == s);
        pos(&a.section)
            .cmp(&pos(&b.section))
            .then(badness(a).total_cmp(&badness(b)))
    });
    let mut sections: Vec<SectionSummary> = order
        .iter()
        .map(|s| summarize(s, &matched, &only_old, &only_new))
        .collect();
    let mut total = summarize_all(&matched, &only_old, &only_new);
    for s in sections.iter_mut().chain(std::iter::once(&mut total)) {
        count_noise(s, &matched, threshold);
    }
    let too_noisy =
        total.timed > 0 && (total.too_few + total.wide) as f64 >= NOISY_SHARE * total.timed as f64;
    let caveats = caveats(&total, threshold, too_noisy);
    let mut warnings = machine_warnings(&old.side.machine, &new.side.machine);
    for (which, side) in [("old", &old.side), ("new", &new.side)] {
        if let Some(f) = &side.failure {
            warnings.push(format!(
                "warning: the {which} report's run failed ({}): {f}",
                side.path
            ));
        }
    }
    Ok(CompareReport {
        old: old.side.clone(),
        new: new.side.clone(),
        threshold,
        min_samples: MIN_SAMPLES,
        too_noisy,
        caveats,
        total,
        sections,
        figures: matched,
        only_old: only_old.iter().map(|f| f.key.clone()).collect(),
        only_new: only_new.iter().map(|f| f.key.clone()).collect(),
        warnings,
    })
}

/// One key of both reports, judged.
fn compared(old: &Figure, new: &Figure, threshold: f64) -> Compared {
    let exact = old.exact && new.exact;
    let (verdict, ratio, gain, within_noise) =
        judge(old.better, exact, &old.reading, &new.reading, threshold);
    Compared {
        section: old.section.clone(),
        key: old.key.clone(),
        unit: old.unit.clone(),
        better: old.better,
        exact,
        old: old.reading.clone(),
        new: new.reading.clone(),
        ratio,
        gain,
        verdict,
        within_noise,
    }
}

/// Sections in the order the old report has them, then any the new one adds.
fn section_order(olds: &[Figure], news: &[Figure]) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    for f in olds.iter().chain(news) {
        if !order.contains(&f.section) {
            order.push(f.section.clone());
        }
    }
    order
}

fn summarize(
    section: &str,
    matched: &[Compared],
    only_old: &[&Figure],
    only_new: &[&Figure],
) -> SectionSummary {
    let mine: Vec<&Compared> = matched.iter().filter(|c| c.section == section).collect();
    let mut s = tally(section, &mine);
    s.only_old = only_old.iter().filter(|f| f.section == section).count();
    s.only_new = only_new.iter().filter(|f| f.section == section).count();
    s
}

fn summarize_all(
    matched: &[Compared],
    only_old: &[&Figure],
    only_new: &[&Figure],
) -> SectionSummary {
    let all: Vec<&Compared> = matched.iter().collect();
    let mut s = tally("all", &all);
    s.only_old = only_old.len();
    s.only_new = only_new.len();
    s
}

/// Verdict counts and the geometric mean gain of some compared figures.
fn tally(section: &str, figures: &[&Compared]) -> SectionSummary {
    let mut s = SectionSummary {
        section: section.to_string(),
        ..SectionSummary::default()
    };
    let mut log_sum = 0.0;
    let mut n = 0usize;
    for c in figures {
        match c.verdict {
            Verdict::Better => s.better += 1,
            Verdict::Worse => s.worse += 1,
            Verdict::Same => s.same += 1,
            Verdict::TooFewSamples => s.not_judged += 1,
            Verdict::NotMeasured => s.not_measured += 1,
        }
        if c.within_noise {
            s.within_noise += 1;
        }
        if let Some(g) = c.gain {
            log_sum += g.ln();
            n += 1;
        }
    }
    s.geomean_gain = (n > 0).then(|| (log_sum / n as f64).exp());
    s
}

/// Counts a summary's timed figures measured in both reports, and among those not judged
/// better or worse, the ones whose repetitions are too few and the ones whose spread is wider
/// than the threshold: their "same" or "not judged" could hide a change of the threshold's
/// size. A figure judged better or worse moved beyond its spread, however wide.
fn count_noise(s: &mut SectionSummary, matched: &[Compared], threshold: f64) {
    let timed = matched.iter().filter(|c| {
        (s.section == "all" || c.section == s.section)
            && !c.exact
            && c.old.value.is_some()
            && c.new.value.is_some()
    });
    for c in timed {
        s.timed += 1;
        if matches!(c.verdict, Verdict::Better | Verdict::Worse) {
            continue;
        }
        if !enough_samples(&c.old) || !enough_samples(&c.new) {
            s.too_few += 1;
        } else if c.within_noise || wider_than(&c.old, threshold) || wider_than(&c.new, threshold) {
            s.wide += 1;
        }
    }
}

/// The sentences that say what could not be judged, why, and what would let it be.
fn caveats(total: &SectionSummary, threshold: f64, too_noisy: bool) -> Vec<String> {
    let t = format!("{:.1}%", threshold * 100.0);
    let more = "more repetitions (--iterations; --epochs for train)";
    let mut out = Vec::new();
    if too_noisy {
        // a wider threshold helps only where the spread, not the count, is the trouble
        let wider = if total.wide > 0 {
            ", or compare at a --threshold above the spread"
        } else {
            ""
        };
        out.push(format!(
            "too noisy to judge: {} of {} timed figures cannot tell a {t} change from noise \
             ({} with fewer than {MIN_SAMPLES} repetitions or no spread, {} with a p10-p90 \
             range wider than {t}), so the better/worse counts say little; rerun both with \
             {more} on an otherwise idle machine{wider}",
            total.too_few + total.wide,
            total.timed,
            total.too_few,
            total.wide
        ));
    }
    if total.not_judged > 0 {
        let advice = if too_noisy {
            String::new()
        } else {
            format!("; repeat the runs with {more} to judge them")
        };
        out.push(format!(
            "{} figure(s) moved beyond {t} but were not judged: a side has fewer than \
             {MIN_SAMPLES} repetitions behind its p10-p90 range, or no spread{advice}",
            total.not_judged
        ));
    }
    out
}

/// Why `--fail-on-regression` fails: how many figures were judged worse (and the worst of them),
/// and how many rows that worked before failed now; None when neither happened. A figure left
/// unjudged for too few repetitions is no regression: its change may be noise.
pub fn regression(r: &CompareReport) -> Option<String> {
    let worse: Vec<&Compared> = r
        .figures
        .iter()
        .filter(|c| c.verdict == Verdict::Worse)
        .collect();
    let failed: Vec<&Compared> = r.figures.iter().filter(|c| newly_failed(c)).collect();
    let mut parts = Vec::new();
    if let Some(worst) = worse
        .iter()
        .min_by(|a, b| badness(a).total_cmp(&badness(b)))
    {
        parts.push(format!(
            "{} figure(s) worse than {} beyond {:.1}% and the runs' spread (the worst: {} \
             {:.1}% worse, new/old {:.3})",
            worse.len(),
            r.old.path,
            r.threshold * 100.0,
            worst.key,
            (1.0 - worst.gain.unwrap_or(1.0)) * 100.0,
            worst.ratio.unwrap_or(f64::NAN)
        ));
    }
    if let Some(first) = failed.first() {
        parts.push(format!(
            "{} row(s) that did not fail in {} failed (the first: {})",
            failed.len(),
            r.old.path,
            first.key
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The document `gpukit compare` writes: failed only when asked to fail on a regression and
/// one was found.
pub fn document(
    report: CompareReport,
    fail_on_regression: bool,
) -> crate::report::Document<CompareReport> {
    let failure = if fail_on_regression {
        regression(&report)
    } else {
        None
    };
    let notes = report.warnings.clone();
    crate::report::Document::new("compare", report, failure).with_notes(notes)
}
