//! The one trait through which `gpukit all` composes the commands. Each command offers a
//! [`Part`]: what it runs under `all`'s choices (a tour with `--quick`, a fuller measurement
//! without), its report as JSON, and the row statuses its report holds for the verdict. `all`
//! knows no command by name: it runs the parts it is given, in their order, and files each
//! report under the part's key (the same key report.json has always used, so older reports
//! still read).

use crate::report::RowStatus;
use gpukit_cuda::loader::Discovery;
use gpukit_tensor::{Device, DeviceSelection};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What every part of `gpukit all` is told: the user's choices and what the check found.
pub struct Context<'a> {
    pub discovery: &'a Discovery,
    pub selection: DeviceSelection,
    /// Fewer sizes and repetitions: a tour, not a measurement campaign.
    pub quick: bool,
    /// Whether the parts may use a GPU (the check found one and `--device` allows it).
    pub gpu: bool,
    /// Why the GPU rows are absent, when they are (said in every part that has GPU rows).
    pub no_gpu: Option<String>,
    /// How many GPUs the check saw.
    pub gpu_count: usize,
}

impl Context<'_> {
    /// The CUDA ordinal the single-GPU parts run on.
    pub fn ordinal(&self) -> usize {
        self.selection.named_cuda().unwrap_or(0)
    }

    /// The device the single-device parts run on: the GPU when there is one, else the CPU.
    pub fn device(&self) -> Device {
        if self.gpu {
            Device::Cuda(self.ordinal())
        } else {
            Device::Cpu
        }
    }

    /// Whether the machine has several GPUs and the user asked for all of them.
    pub fn several_gpus(&self) -> bool {
        self.gpu && self.selection == DeviceSelection::All && self.gpu_count > 1
    }
}

/// One part of `all` (or some of its rows) that did not run, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub part: String,
    pub reason: String,
}

/// What the check tells `all` before the other parts run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Machine {
    /// A GPU can be used.
    pub available: bool,
    /// Why not, when it cannot.
    pub reason: Option<String>,
    pub gpu_count: usize,
}

/// What a part produced.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Its report (its command's JSON result), None when it did not run at all.
    pub report: Option<Value>,
    /// What did not run, and why.
    pub skipped: Vec<Skipped>,
    /// Only the check's: what the machine offers the parts after it.
    pub machine: Option<Machine>,
}

impl Outcome {
    /// The outcome of a report, or of the error that stopped it (a skipped part).
    pub fn of<T: Serialize, E: std::fmt::Display>(part: &str, result: Result<T, E>) -> Outcome {
        match result {
            Ok(r) => Outcome::report(&r),
            Err(e) => Outcome::skipped(part, e.to_string()),
        }
    }

    /// A report that ran.
    pub fn report<T: Serialize>(report: &T) -> Outcome {
        match serde_json::to_value(report) {
            Ok(v) => Outcome {
                report: Some(v),
                ..Outcome::default()
            },
            // a report struct that cannot become JSON is a bug; said, never a panic
            Err(e) => Outcome::skipped("report", format!("cannot be written as JSON: {e}")),
        }
    }

    /// A part that did not run.
    pub fn skipped(part: &str, reason: String) -> Outcome {
        Outcome {
            skipped: vec![Skipped {
                part: part.to_string(),
                reason,
            }],
            ..Outcome::default()
        }
    }

    /// Adds a note that some of the part's rows did not run.
    pub fn with_skipped(mut self, part: &str, reason: String) -> Outcome {
        self.skipped.push(Skipped {
            part: part.to_string(),
            reason,
        });
        self
    }
}

/// A command as `gpukit all` runs it.
pub trait Part: Sync {
    /// Its report's key in report.json, and its section's id in report.html ("matmul").
    fn key(&self) -> &'static str;
    /// The command as the user types it, for progress lines and timings ("bench matmul").
    fn command(&self) -> &'static str;
    /// The heading of its section in report.md and report.html ("Matrix multiply").
    fn title(&self) -> &'static str;
    /// Whether it runs on this machine and under these choices (some need a GPU, or several).
    fn wanted(&self, _ctx: &Context<'_>) -> bool {
        true
    }
    /// Runs it with the sizes `all` chooses for it (fewer under `--quick`). A part that fails
    /// says so in its outcome's skipped list; an error stops `all` (only where nothing can run,
    /// such as the check's bad input).
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> crate::Result<Outcome>;
    /// `gpukit compare`'s figures of its section of a report (read as JSON, so that a report
    /// of another version still reads); none by default.
    fn figures(&self, _section: &Value, _out: &mut Vec<crate::figures::Figure>) {}
    /// The statuses of the rows its report holds that count for `all`'s verdict.
    fn statuses(&self, _report: &Value) -> Vec<RowStatus> {
        Vec::new()
    }
}

/// The status of every row of a report whose rows carry one (`rows[].status`); a row whose
/// status cannot be read counts as failed, never as passed.
pub fn row_statuses(report: &Value) -> Vec<RowStatus> {
    report
        .get("rows")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    r.get("status")
                        .cloned()
                        .and_then(|s| serde_json::from_value(s).ok())
                        .unwrap_or(RowStatus::Failed(
                            "the row's status is missing or unreadable".into(),
                        ))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_statuses_reads_each_row_and_an_unreadable_one_fails() {
        let ok = serde_json::to_value(RowStatus::Ok).unwrap();
        let v = serde_json::json!({"rows": [{"status": ok}, {"status": 7}, {}]});
        let s = row_statuses(&v);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0], RowStatus::Ok);
        assert!(matches!(s[1], RowStatus::Failed(_)));
        assert!(matches!(s[2], RowStatus::Failed(_)));
        assert!(row_statuses(&serde_json::json!({"no": "rows"})).is_empty());
    }

    #[test]
    fn an_error_is_a_skipped_part_with_its_reason() {
        let o = Outcome::of::<u32, _>("memory", Err("out of memory"));
        assert!(o.report.is_none());
        assert_eq!(
            o.skipped,
            vec![Skipped {
                part: "memory".into(),
                reason: "out of memory".into()
            }]
        );
        let o = Outcome::of::<u32, String>("x", Ok(3));
        assert_eq!(o.report, Some(serde_json::json!(3)));
    }
}
