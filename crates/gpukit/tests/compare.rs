//! `gpukit compare` on real H100 reports (tests/fixtures: an older `all` in the bare format, a
//! newer one in the envelope; a two-GPU `all --quick` with training runs), a copy of the newer
//! one with one figure cut by 20% (on its real repetitions, and on three), a copy of the
//! two-GPU report with one training run configured as a plain `train`, and inputs that are not
//! reports.
//! Runs on any machine: compare reads files, nothing else.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> PathBuf {
    std::env::var_os("GPUKIT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpukit")))
}

/// The fixture `name` (gzipped JSON) written unzipped into `dir` as `as_name`.
fn fixture(name: &str, dir: &Path, as_name: &str) -> PathBuf {
    let gz = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let unzipped = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
    assert!(unzipped.status.success(), "gzip -dc {}", gz.display());
    let path = dir.join(as_name);
    std::fs::write(&path, unzipped.stdout).unwrap();
    path
}

/// The older and the newer H100 `all` report (gunzipped) in a fresh directory.
fn reports() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let older = fixture("all-h100-bare-format.json.gz", dir.path(), "older.json");
    let newer = fixture("all-h100.json.gz", dir.path(), "newer.json");
    (dir, older, newer)
}

fn gpukit(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn compare(old: &Path, new: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["compare".as_ref(), old.as_os_str(), new.as_os_str()];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    gpukit(&args)
}

#[test]
fn the_real_reports_compare_and_warn_about_the_other_chip() {
    let (_dir, older, newer) = reports();
    let o = compare(&older, &newer, &[]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert!(all.contains("another chip of the same model"), "{all}");
    assert!(all.contains("matmul (new/old"), "{all}");
    assert!(all.contains("cuda:0 bf16 8192"), "{all}");
}

/// The key of the row that is cut.
const CUT: &str = "infer resnet50 224px fp16-nhwc-graph cuda:0 batch 32";

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// the newer report with that row's images/s cut by 20% (its times up to match).
fn cut_copy(newer: &Path, to: &Path) {
    cut_row(read(newer), to)
}

/// `doc` (the newer report) with the cut row's images/s cut by 20%, written to `to`.
fn cut_row(mut doc: Value, to: &Path) {
    let rows = doc["result"]["infer"]["rows"].as_array_mut().unwrap();
    let row = rows
        .iter_mut()
        .find(|r| r["strategy"] == "fp16-nhwc-graph" && r["batch"] == 32)
        .unwrap();
    let ips = row["images_per_s"].as_f64().unwrap();
    row["images_per_s"] = (ips * 0.8).into();
    let summary = &mut row["timing"]["summary_ms"];
    for k in ["median", "p10", "p90", "min", "max", "mean"] {
        let ms = summary[k].as_f64().unwrap();
        summary[k] = (ms / 0.8).into();
    }
    std::fs::write(to, serde_json::to_vec(&doc).unwrap()).unwrap();
}

#[test]
fn a_row_cut_by_20_percent_is_the_one_worse_figure() {
    let (dir, _older, newer) = reports();
    let cut = dir.path().join("newer-cut.json");
    cut_copy(&newer, &cut);
    let o = compare(&newer, &cut, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["command"], "compare");
    let figures = doc["result"]["figures"].as_array().unwrap();
    assert!(figures.len() > 100, "{}", figures.len());
    for f in figures {
        let expected = if f["key"] == CUT {
            "worse"
        } else if f["old"]["value"].is_null() {
            "not_measured"
        } else {
            "same"
        };
        assert_eq!(f["verdict"], expected, "{f}");
    }
    assert_eq!(doc["result"]["total"]["worse"], 1);

    let o = compare(&newer, &cut, &["--fail-on-regression"]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert!(
        all.contains("1 figure(s) worse") && all.contains(CUT),
        "{all}"
    );

    // a 25% threshold swallows the cut
    let o = compare(
        &newer,
        &cut,
        &["--fail-on-regression", "--threshold", "25%"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Every timing summary of the newer report as if it had run three repetitions.
fn three_repetitions(newer: &Path) -> Value {
    let mut doc = read(newer);
    for section in ["matmul", "bandwidth", "conv", "infer"] {
        let rows = doc["result"][section]["rows"].as_array_mut().unwrap();
        for row in rows {
            if let Some(summary) = row["timing"].get_mut("summary_ms") {
                summary["count"] = 3.into();
            }
        }
    }
    doc
}

#[test]
fn a_cut_on_three_repetitions_is_not_judged_and_fails_nothing() {
    let (dir, _older, newer) = reports();
    let (few, few_cut) = (dir.path().join("few.json"), dir.path().join("few-cut.json"));
    let doc = three_repetitions(&newer);
    std::fs::write(&few, serde_json::to_vec(&doc).unwrap()).unwrap();
    cut_row(doc, &few_cut);
    let o = compare(&few, &few_cut, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let figures = doc["result"]["figures"].as_array().unwrap();
    let cut_row = figures.iter().find(|f| f["key"] == CUT).unwrap();
    assert_eq!(cut_row["verdict"], "too_few_samples", "{cut_row}");
    let total = &doc["result"]["total"];
    assert_eq!(
        (&total["worse"], &total["not_judged"]),
        (&0.into(), &1.into())
    );
    assert_eq!(doc["result"]["too_noisy"], true);

    let o = compare(&few, &few_cut, &["--fail-on-regression"]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert!(all.contains("too noisy to judge"), "{all}");
    assert!(all.contains("not judged (n=3) -20.0%"), "{all}");
    assert!(
        all.contains("1 figure(s) moved beyond 5.0% but were not judged"),
        "{all}"
    );
}

/// A two-H100 `all --quick` report (training runs on the CPU and the GPU).
fn two_gpu_report(dir: &Path) -> PathBuf {
    fixture("all-quick-2xh100-training.json.gz", dir, "two-gpus.json")
}

#[test]
fn a_train_preset_inside_all_is_not_matched_with_a_plain_train_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let all = two_gpu_report(dir.path());
    // `all` holds 20% of the preset's 1024 samples out for evaluation; `train` trains on all
    let mut doc = read(&all);
    let first = &mut doc["result"]["train"][0];
    assert_eq!(first["preset"], "seed-regression");
    assert_eq!(first["samples"], 819);
    first["samples"] = 1024.into();
    first["eval_samples"] = 0.into();
    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, serde_json::to_vec(&doc).unwrap()).unwrap();
    let o = compare(&all, &plain, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &doc["result"];
    let key = |samples| format!("train cpu 16-64-1 mse adam batch 64 {samples} samples fp32");
    assert_eq!(
        r["only_old"],
        serde_json::json!([key(819)]),
        "{}",
        r["only_old"]
    );
    assert_eq!(
        r["only_new"],
        serde_json::json!([key(1024)]),
        "{}",
        r["only_new"]
    );
    let train: Vec<&Value> = r["figures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["section"] == "train")
        .collect();
    // the other three runs (classification on the CPU, both on the GPU) still match
    assert_eq!(train.len(), 3, "{train:?}");
    assert!(train.iter().all(|f| f["key"] != key(819).as_str()));
}

#[test]
fn markdown_is_written_whole() {
    let (dir, older, newer) = reports();
    let md = dir.path().join("compare.md");
    let o = compare(&older, &newer, &["--markdown", md.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let written = std::fs::read_to_string(&md).unwrap();
    assert!(written.starts_with("# gpukit compare"), "{written}");
    assert!(written.contains("| figure | unit | old | new | new/old | verdict |"));
    assert!(written.contains("another chip of the same model"));
}

#[test]
fn what_is_not_a_report_exits_2_naming_the_file() {
    let (dir, _older, newer) = reports();
    let truncated = dir.path().join("truncated.json");
    let bytes = std::fs::read(&newer).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let foreign = dir.path().join("foo.json");
    std::fs::write(&foreign, br#"{"foo":1}"#).unwrap();
    for (bad, says) in [
        (&truncated, "is not valid JSON"),
        (&foreign, "is not a gpukit report"),
    ] {
        let o = compare(&newer, bad, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains(bad.to_str().unwrap()) && err.contains(says),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = compare(&foreign, &dir.path().join("missing.json"), &[]);
    assert_eq!(o.status.code(), Some(2));
    let o = compare(&newer, dir.path(), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a directory"));
}

#[test]
fn a_negative_threshold_exits_2() {
    let (_dir, older, newer) = reports();
    for t in ["-1", "-5%", "lots"] {
        let o = compare(&older, &newer, &["--threshold", t]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{t}: {err}");
        assert!(err.contains("--threshold"), "{err}");
    }
}
