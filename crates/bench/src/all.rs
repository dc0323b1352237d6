//! `gpukit all`: every command in one run, sized to be a tour (`quick`) or a fuller measurement,
//! and one report of them all. `all` knows no command: it runs the [`Part`]s it is given in
//! their order (the check first, whose findings decide what the others may use), times each,
//! and files each report under the part's key. What a part runs under `all` is the part's own
//! choice; the CLI only passes the user's choices and writes the files.

use crate::error::{Error, Result};
use crate::part::{Context, Machine, Part, Skipped};
use crate::report::{judge_rows, Document, RowStatus};
use gpukit_cuda::loader::Discovery;
use gpukit_tensor::{Device, DeviceSelection};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Instant;

/// What the user chose.
#[derive(Debug, Clone)]
pub struct AllOptions {
    pub selection: DeviceSelection,
    /// Fewer sizes and repetitions: a tour, not a measurement campaign.
    pub quick: bool,
    /// The command line, as it is recorded in the report.
    pub command_line: Vec<String>,
}

/// Every part's report under its key, how long each took, and what was skipped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllReport {
    pub generated_unix_s: u64,
    pub command_line: Vec<String>,
    /// Seconds each part took, by command.
    pub seconds: Vec<(String, f64)>,
    pub skipped: Vec<Skipped>,
    pub total_seconds: f64,
    /// Each part's report under its key ("check", "matmul", "train", ...): the fields report.json
    /// has always had. A part that did not run is absent (older reports wrote null).
    #[serde(flatten)]
    pub parts: BTreeMap<String, Value>,
}

impl AllReport {
    /// The report of the part `key` as its command's result type; None when the part did not
    /// run (or a report of another version cannot be read as this one's type).
    pub fn part<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        self.parts
            .get(key)
            .filter(|v| !v.is_null())
            .and_then(|v| T::deserialize(v).ok())
    }

    /// Files `report` as the part `key`'s report (replacing one there).
    pub fn set_part<T: Serialize>(&mut self, key: &str, report: &T) -> Result<()> {
        let v = serde_json::to_value(report).map_err(|e| {
            Error::Failed(format!("the {key} report cannot be written as JSON: {e}"))
        })?;
        self.parts.insert(key.to_string(), v);
        Ok(())
    }

    /// Whether the part `key` has a report (not absent, not null, not an empty list).
    pub fn has(&self, key: &str) -> bool {
        self.parts
            .get(key)
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
    }
}

/// Runs every part in turn. `progress` gets a line as each part starts (and the parts' own
/// lines). Errors only where nothing can run at all (the check's bad input).
pub fn run_all(
    discovery: &Discovery,
    opts: &AllOptions,
    parts: &[&dyn Part],
    progress: &mut dyn FnMut(&str),
) -> Result<AllReport> {
    let started = Instant::now();
    let mut report = AllReport {
        generated_unix_s: 0,
        command_line: opts.command_line.clone(),
        seconds: Vec::new(),
        skipped: Vec::new(),
        total_seconds: 0.0,
        parts: BTreeMap::new(),
    };
    // before the check has run, no GPU is assumed
    let mut ctx = Context {
        discovery,
        selection: opts.selection,
        quick: opts.quick,
        gpu: false,
        no_gpu: None,
        gpu_count: 0,
    };
    let mut machine_known = false;
    for part in parts {
        if machine_known && !part.wanted(&ctx) {
            continue;
        }
        progress(&format!("[gpukit all] {}", part.command()));
        let t = Instant::now();
        let outcome = part.run(&ctx, progress)?;
        report
            .seconds
            .push((part.command().to_string(), t.elapsed().as_secs_f64()));
        if let Some(m) = outcome.machine {
            know_machine(&mut ctx, &m, &mut report.skipped);
            machine_known = true;
            if ctx.gpu {
                // gpukit's own kernels compile on other cores while the first parts run
                gpukit_cuda::kernel::warm_cache(
                    discovery,
                    ctx.ordinal(),
                    &[
                        gpukit_models::gpu::kernels::kernel_source(),
                        gpukit_tensor::kernels::kernel_source(),
                        gpukit_train::gpu::kernels::kernel_source(),
                        gpukit_cuda::pattern::kernel_source(),
                    ],
                );
            }
        } else if !machine_known {
            // the first part must be the check: without it no part knows what it may use
            return Err(Error::Failed(format!(
                "`all` ran {} before the check",
                part.command()
            )));
        }
        if let Some(v) = outcome.report {
            report.parts.insert(part.key().to_string(), v);
        }
        report.skipped.extend(outcome.skipped);
    }
    report.generated_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// What the check found, told to the parts after it; why the GPU rows are absent is said once
/// in the skipped list (and in every part that has GPU rows).
fn know_machine(ctx: &mut Context<'_>, m: &Machine, skipped: &mut Vec<Skipped>) {
    ctx.gpu = m.available && ctx.selection != DeviceSelection::One(Device::Cpu);
    ctx.gpu_count = m.gpu_count;
    ctx.no_gpu = (!ctx.gpu).then(|| match (&m.reason, m.available) {
        (Some(r), _) => r.clone(),
        (None, true) => "--device cpu".to_string(),
        (None, false) => "no GPU can be used".to_string(),
    });
    if let Some(reason) = &ctx.no_gpu {
        skipped.push(Skipped {
            part: "GPU rows of bench matmul, bench conv and infer, bench bandwidth and memory"
                .into(),
            reason: reason.clone(),
        });
    }
}

/// Every row status of the report that counts for the verdict, part by part.
fn statuses(r: &AllReport, parts: &[&dyn Part]) -> Vec<RowStatus> {
    parts
        .iter()
        .filter_map(|p| r.parts.get(p.key()).map(|v| p.statuses(v)))
        .flatten()
        .collect()
}

/// The JSON document of `gpukit all` (report.json): the report, its notes (what was skipped and
/// why, the check's warnings) and the verdict over every row of every part.
pub fn document(
    report: AllReport,
    parts: &[&dyn Part],
    warnings: &[String],
) -> Document<AllReport> {
    let statuses = statuses(&report, parts);
    let failure = judge_rows(statuses.iter());
    let notes: Vec<String> = warnings
        .iter()
        .map(|w| format!("warning: {w}"))
        .chain(
            report
                .skipped
                .iter()
                .map(|s| format!("skipped {}: {}", s.part, s.reason)),
        )
        .collect();
    Document::new("all", report, failure).with_notes(notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::part::Outcome;

    fn empty_discovery() -> Discovery {
        Discovery {
            libraries: Vec::new(),
            warnings: Vec::new(),
            searched: Vec::new(),
            added_to_loader_path: Vec::new(),
            alias_dir: None,
        }
    }

    struct Fake {
        key: &'static str,
        machine: Option<Machine>,
        needs_gpu: bool,
    }

    impl Part for Fake {
        fn key(&self) -> &'static str {
            self.key
        }
        fn command(&self) -> &'static str {
            self.key
        }
        fn title(&self) -> &'static str {
            self.key
        }
        fn wanted(&self, ctx: &Context<'_>) -> bool {
            !self.needs_gpu || ctx.gpu
        }
        fn run(&self, ctx: &Context<'_>, _: &mut dyn FnMut(&str)) -> Result<Outcome> {
            let mut o = Outcome::report(&serde_json::json!({
                "rows": [{"status": RowStatus::Ok}],
                "gpu": ctx.gpu,
            }));
            o.machine = self.machine.clone();
            Ok(o)
        }
        fn statuses(&self, v: &Value) -> Vec<RowStatus> {
            crate::part::row_statuses(v)
        }
    }

    #[test]
    fn parts_run_in_order_under_their_keys_and_gpu_parts_wait_for_a_gpu() {
        let d = empty_discovery();
        let check = Fake {
            key: "check",
            machine: Some(Machine {
                available: false,
                reason: Some("no driver".into()),
                ..Machine::default()
            }),
            needs_gpu: false,
        };
        let cpu = Fake {
            key: "matmul",
            machine: None,
            needs_gpu: false,
        };
        let gpu = Fake {
            key: "memory",
            machine: None,
            needs_gpu: true,
        };
        let parts: [&dyn Part; 3] = [&check, &cpu, &gpu];
        let opts = AllOptions {
            selection: DeviceSelection::All,
            quick: true,
            command_line: vec!["gpukit".into(), "all".into()],
        };
        let r = run_all(&d, &opts, &parts, &mut |_| {}).unwrap();
        assert_eq!(r.parts.keys().collect::<Vec<_>>(), vec!["check", "matmul"]);
        assert_eq!(r.parts["matmul"]["gpu"], false);
        assert!(r.skipped[0].reason.contains("no driver"), "{:?}", r.skipped);
        assert_eq!(
            r.seconds
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            vec!["check", "matmul"]
        );
        // a JSON round trip keeps every part under its key
        let back: AllReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert!(back.has("matmul") && !back.has("memory"));
        let doc = document(back, &parts, &["hot".into()]);
        assert!(doc.failure.is_none());
        assert_eq!(doc.notes[0], "warning: hot");
    }

    #[test]
    fn a_first_part_that_is_not_the_check_is_an_error() {
        let d = empty_discovery();
        let cpu = Fake {
            key: "matmul",
            machine: None,
            needs_gpu: false,
        };
        let opts = AllOptions {
            selection: DeviceSelection::All,
            quick: true,
            command_line: Vec::new(),
        };
        assert!(run_all(&d, &opts, &[&cpu], &mut |_| {}).is_err());
    }
}
