//! Extraction from small hand-made reports of every section (and the old bare `all` format),
//! the verdict rules, and the inputs that must be refused.

use super::*;
use serde_json::json;

/// A timing summary whose median, p10 and p90 are given in ms.
fn timing(median: f64, p10: f64, p90: f64) -> Value {
    json!({"clock": "cuda_events", "summary_ms": {"count": 30, "median": median, "p10": p10, "p90": p90}})
}

fn envelope(command: &str, result: Value) -> Value {
    json!({"gpukit_version": "0.9.0", "command": command, "ok": true, "failure": null,
           "notes": [], "pytorch": null, "result": result})
}

fn loaded(v: Value) -> Loaded {
    from_value("test.json", v).expect("a report")
}

fn by_key(figs: &[Figure], key: &str) -> Figure {
    figs.iter()
        .find(|f| f.key == key)
        .unwrap_or_else(|| {
            panic!(
                "no {key} in {:?}",
                figs.iter().map(|f| &f.key).collect::<Vec<_>>()
            )
        })
        .clone()
}

fn matmul_section(tflops: f64) -> Value {
    json!({"cpu_model": "Xeon", "rows": [
        {"device": {"Cuda": 0}, "dtype": "bf16", "size": 8192, "status": {"status": "ok"},
         "timing": timing(2.0, 1.9, 2.2), "tflops": tflops},
        {"device": "Cpu", "dtype": "f32", "size": 8192,
         "status": {"status": "skipped", "why": "too big for the CPU budget"},
         "timing": null, "tflops": null},
        {"device": "Cpu", "dtype": "f64", "size": 1024,
         "status": {"status": "failed", "why": "wrong result"}, "tflops": 3.0}
    ]})
}

#[test]
fn matmul_rows_give_keys_units_and_spreads() {
    let figs = figures(&loaded(envelope("bench matmul", matmul_section(500.0))));
    let f = by_key(&figs, "matmul cuda:0 bf16 8192");
    assert_eq!((f.unit.as_str(), f.better), ("TFLOP/s", Better::Higher));
    assert_eq!(f.reading.value, Some(500.0));
    // a rate's low end comes from p90: 500 * 2.0 / 2.2
    let [lo, hi] = f.reading.spread.unwrap();
    assert!((lo - 500.0 * 2.0 / 2.2).abs() < 1e-9 && (hi - 500.0 * 2.0 / 1.9).abs() < 1e-9);
    let skipped = by_key(&figs, "matmul cpu f32 8192");
    assert_eq!(skipped.reading.value, None);
    assert!(skipped
        .reading
        .problem
        .unwrap()
        .starts_with("skipped: too big"));
    // a failed row carries no figure even when a number is there
    let failed = by_key(&figs, "matmul cpu f64 1024");
    assert_eq!(failed.reading.value, None);
    assert_eq!(
        failed.reading.problem.as_deref(),
        Some("failed: wrong result")
    );
}

#[test]
fn bandwidth_conv_infer_memory_and_train_rows_are_read() {
    let bw = json!({"rows": [{"kind": "h2d_pinned", "bytes": 1073741824, "status": {"status": "ok"},
                              "timing": timing(20.0, 19.0, 21.0), "gbs": 54.0}]});
    let conv = json!({"rows": [{"name": "layer3 1x1 1024->256 @14", "shape": {"n": 32},
                                "layout": "Nhwc", "device": {"Cuda": 0}, "dtype": "bf16",
                                "status": {"status": "ok"}, "timing": timing(0.1, 0.09, 0.11),
                                "tflops": 300.0}],
                      "totals": [{"batch": 32, "dtype": "f16", "layout": "Nhwc",
                                  "gpu_ms": 0.87, "cpu_ms": 372.0}]});
    let infer = json!({"rows": [{"strategy": "fp16-nhwc-graph", "device": "cuda:0", "batch": 32,
                                 "status": {"status": "ok"}, "timing": timing(5.0, 4.0, 6.0),
                                 "images_per_s": 6400.0}]});
    let memory = json!({"rows": [{"batch_requested": 64, "batch": 64, "status": {"status": "ok"},
                                  "pool_used_peak": 621429152u64, "ms_per_batch": 14.5}],
                        "max_batch": {"batch": 14474}});
    let train = json!([{"preset": "seed-regression", "device": "cpu",
                        "epochs": [{"epoch": 1, "samples_per_s": 90000.0}]}]);
    let all = envelope(
        "all",
        json!({"check": {}, "matmul": {"rows": []}, "bandwidth": bw, "conv": conv,
               "infer": infer, "memory": memory, "train": train}),
    );
    let figs = figures(&loaded(all));
    let b = by_key(&figs, "bandwidth h2d_pinned 1 GiB");
    assert_eq!((b.unit.as_str(), b.reading.value), ("GB/s", Some(54.0)));
    let c = by_key(
        &figs,
        "conv layer3 1x1 1024->256 @14 NHWC bf16 batch 32 cuda:0",
    );
    assert_eq!(c.reading.value, Some(300.0));
    let t = by_key(&figs, "conv total f16 NHWC batch 32 gpu");
    assert_eq!((t.unit.as_str(), t.better), ("ms", Better::Lower));
    let i = by_key(&figs, "infer fp16-nhwc-graph cuda:0 batch 32");
    assert_eq!(
        (i.unit.as_str(), i.reading.value),
        ("images/s", Some(6400.0))
    );
    let [lo, hi] = i.reading.spread.unwrap();
    assert!((lo - 6400.0 * 5.0 / 6.0).abs() < 1e-9 && (hi - 8000.0).abs() < 1e-9);
    let m = by_key(&figs, "memory batch 64 pool peak");
    assert_eq!((m.unit.as_str(), m.better), ("bytes", Better::Lower));
    assert_eq!(
        by_key(&figs, "memory batch 64 per batch").reading.value,
        Some(14.5)
    );
    assert_eq!(
        by_key(&figs, "memory largest batch").reading.value,
        Some(14474.0)
    );
    let tr = by_key(&figs, "train seed-regression cpu epoch 1");
    assert_eq!(tr.reading.value, Some(90000.0));
}

#[test]
fn the_old_bare_all_report_is_read_as_all() {
    let old = json!({"gpukit_version": "0.8.0", "generated_unix_s": 1,
                     "check": {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-a"}],
                               "driver": {"version": "580.1"}},
                     "matmul": matmul_section(400.0), "infer": null});
    let l = loaded(old);
    assert_eq!(l.side.command, "all");
    assert_eq!(l.side.gpukit_version.as_deref(), Some("0.8.0"));
    assert_eq!(l.side.machine.gpu.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(l.side.machine.driver.as_deref(), Some("580.1"));
    assert_eq!(
        by_key(&figures(&l), "matmul cuda:0 bf16 8192")
            .reading
            .value,
        Some(400.0)
    );
}

fn reading(value: f64, spread: Option<[f64; 2]>) -> Reading {
    Reading {
        value: Some(value),
        spread,
        problem: None,
    }
}

#[test]
fn overlapping_spreads_are_the_same_even_at_20_percent() {
    let old = reading(100.0, Some([70.0, 130.0]));
    let new = reading(120.0, Some([90.0, 150.0]));
    let (v, ratio, gain, noise) = judge(Better::Higher, &old, &new, 0.05);
    assert_eq!(v, Verdict::Same);
    assert!(noise);
    assert!((ratio.unwrap() - 1.2).abs() < 1e-12 && (gain.unwrap() - 1.2).abs() < 1e-12);
}

#[test]
fn separate_spreads_beyond_the_threshold_are_better_or_worse() {
    let old = reading(100.0, Some([98.0, 102.0]));
    let up = reading(120.0, Some([118.0, 122.0]));
    let down = reading(80.0, Some([78.0, 82.0]));
    assert_eq!(judge(Better::Higher, &old, &up, 0.05).0, Verdict::Better);
    assert_eq!(judge(Better::Higher, &old, &down, 0.05).0, Verdict::Worse);
    // within the threshold: same, though the spreads are apart
    let near = reading(103.0, Some([102.5, 103.5]));
    let (v, _, _, noise) = judge(Better::Higher, &old, &near, 0.05);
    assert_eq!((v, noise), (Verdict::Same, false));
    // a higher threshold swallows the 20%
    assert_eq!(judge(Better::Higher, &old, &down, 0.25).0, Verdict::Same);
    // without spreads the threshold alone decides
    assert_eq!(
        judge(
            Better::Higher,
            &reading(100.0, None),
            &reading(80.0, None),
            0.05
        )
        .0,
        Verdict::Worse
    );
}

#[test]
fn lower_is_better_turns_the_gain() {
    let old = reading(10.0, Some([9.9, 10.1]));
    let slower = reading(12.0, Some([11.9, 12.1]));
    let (v, ratio, gain, _) = judge(Better::Lower, &old, &slower, 0.05);
    assert_eq!(v, Verdict::Worse);
    assert!((ratio.unwrap() - 1.2).abs() < 1e-12);
    assert!((gain.unwrap() - 10.0 / 12.0).abs() < 1e-12);
    assert_eq!(
        judge(Better::Lower, &old, &reading(8.0, Some([7.9, 8.1])), 0.05).0,
        Verdict::Better
    );
}

#[test]
fn failed_rows_are_never_compared() {
    let old = loaded(envelope("bench matmul", matmul_section(500.0)));
    let mut broken = matmul_section(100.0);
    broken["rows"][0]["status"] = json!({"status": "failed", "why": "wrong result"});
    let new = loaded(envelope("bench matmul", broken));
    let r = compare(&old, &new, 0.05).unwrap();
    let c = r
        .figures
        .iter()
        .find(|c| c.key == "matmul cuda:0 bf16 8192")
        .unwrap();
    assert_eq!(c.verdict, Verdict::NotMeasured);
    assert_eq!((c.ratio, c.gain), (None, None));
    assert_eq!(c.new.problem.as_deref(), Some("failed: wrong result"));
    assert_eq!(r.total.worse, 0);
    assert_eq!(r.total.not_measured, 3);
    assert_eq!(r.total.geomean_gain, None);
    // no number is compared, but a row that worked before and fails now is a regression
    let why = regression(&r).unwrap();
    assert!(
        why.contains("1 row(s) that did not fail") && why.contains("bf16 8192"),
        "{why}"
    );
    // rows failing or skipped in both are not
    let same = compare(&old, &old, 0.05).unwrap();
    assert_eq!(regression(&same), None);
}

#[test]
fn a_regression_is_counted_and_named() {
    let old = loaded(envelope("bench matmul", matmul_section(500.0)));
    let new = loaded(envelope("bench matmul", matmul_section(300.0)));
    let r = compare(&old, &new, 0.05).unwrap();
    assert_eq!(r.total.worse, 1);
    assert!((r.sections[0].geomean_gain.unwrap() - 0.6).abs() < 1e-12);
    let why = regression(&r).unwrap();
    assert!(
        why.contains("1 figure(s) worse") && why.contains("matmul cuda:0 bf16 8192"),
        "{why}"
    );
    assert!(document(r.clone(), false).ok);
    let failed = document(r, true);
    assert!(!failed.ok && failed.failure.unwrap().contains("worse"));
}

#[test]
fn different_commands_compare_their_common_section() {
    let all = loaded(envelope(
        "all",
        json!({"matmul": matmul_section(500.0), "infer": {"rows": []}}),
    ));
    let mm = loaded(envelope("bench matmul", matmul_section(500.0)));
    let r = compare(&all, &mm, 0.05).unwrap();
    assert_eq!(r.total.same, 1);
}

#[test]
fn no_figure_in_common_is_bad_input() {
    let mm = loaded(envelope("bench matmul", matmul_section(500.0)));
    let infer = loaded(envelope(
        "infer",
        json!({"rows": [{"strategy": "fp16", "device": "cuda:0", "batch": 1,
                         "status": {"status": "ok"}, "images_per_s": 100.0}]}),
    ));
    match compare(&mm, &infer, 0.05) {
        Err(Error::BadInput(m)) => assert!(m.contains("no figure in common"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn machines_that_differ_are_warned_about() {
    let m = |name: &str, uuid: &str| Machine {
        gpu: Some(name.into()),
        gpu_uuid: Some(uuid.into()),
        driver: Some("580".into()),
        cpu: None,
    };
    let other_model = machine_warnings(&m("H100", "GPU-1"), &m("A100", "GPU-2"));
    assert!(other_model[0].contains("different GPUs: H100 (GPU-1) vs A100 (GPU-2)"));
    let same_model = machine_warnings(&m("H100", "GPU-aaaaaaaaaaaaaaa"), &m("H100", "GPU-b"));
    assert!(
        same_model[0].contains("another chip of the same model"),
        "{same_model:?}"
    );
    assert!(same_model[0].contains("GPU-aaaaaaaa…"), "{same_model:?}");
    assert!(machine_warnings(&m("H100", "GPU-1"), &m("H100", "GPU-1")).is_empty());
}

fn bad_input(path: &Path) -> String {
    match load(path) {
        Err(Error::BadInput(m)) => m,
        other => panic!("{other:?}"),
    }
}

#[test]
fn what_is_not_a_report_is_bad_input_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let m = bad_input(&missing);
    assert!(
        m.contains("cannot read") && m.contains("missing.json"),
        "{m}"
    );
    let m = bad_input(dir.path());
    assert!(m.contains("is a directory"), "{m}");
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, br#"{"command": "all", "result": {"matmul""#).unwrap();
    let m = bad_input(&truncated);
    assert!(
        m.contains("truncated.json is not valid JSON") && m.contains("line 1 column"),
        "{m}"
    );
    let foreign = dir.path().join("foo.json");
    std::fs::write(&foreign, br#"{"foo": 1}"#).unwrap();
    let m = bad_input(&foreign);
    assert!(
        m.contains("foo.json is not a gpukit report (no \"command\""),
        "{m}"
    );
    let list = dir.path().join("list.json");
    std::fs::write(&list, b"[1, 2]").unwrap();
    assert!(bad_input(&list).contains("is not a gpukit report"));
}

#[test]
fn thresholds_take_percent_or_fraction() {
    assert_eq!(parse_threshold("5%"), Ok(0.05));
    assert_eq!(parse_threshold("0.05"), Ok(0.05));
    assert_eq!(parse_threshold("0"), Ok(0.0));
    assert!(parse_threshold("-1").unwrap_err().contains("0 or more"));
    assert!(parse_threshold("-5%").unwrap_err().contains("0 or more"));
    assert!(parse_threshold("abc")
        .unwrap_err()
        .contains("not a threshold"));
    assert!(parse_threshold("NaN").is_err());
    assert!(parse_threshold("5").unwrap_err().contains("ambiguous"));
}

#[test]
fn nccl_and_p2p_rows_are_read() {
    let nccl = envelope(
        "bench nccl",
        json!({"rows": [
            {"op": "all_reduce", "dtype": "f32", "redop": "sum", "bytes": 1048576,
             "status": {"status": "ok"},
             "out_of_place": {"busbw_gbs": 73.5}, "in_place": {"busbw_gbs": 70.0}},
            {"op": "alltoall", "dtype": "bf16", "redop": null, "bytes": 8,
             "status": {"status": "ok"}, "out_of_place": {"busbw_gbs": 0.01}, "in_place": null}
        ]}),
    );
    let figs = super::figures::figures(&loaded(nccl));
    assert_eq!(
        by_key(&figs, "nccl all_reduce f32 sum 1 MiB out-of-place")
            .reading
            .value,
        Some(73.5)
    );
    assert_eq!(
        by_key(&figs, "nccl all_reduce f32 sum 1 MiB in-place")
            .reading
            .value,
        Some(70.0)
    );
    assert_eq!(figs.len(), 3, "{figs:?}");
    assert_eq!(
        by_key(&figs, "nccl alltoall bf16 8 B out-of-place").unit,
        "GB/s busbw"
    );
    let p2p = envelope(
        "bench p2p",
        json!({"rows": [{"src": 0, "dst": 1, "one_way_gbs": 394.0, "status": {"status": "ok"}}]}),
    );
    let figs = super::figures::figures(&loaded(p2p));
    assert_eq!(
        by_key(&figs, "p2p cuda:0 -> cuda:1 one way").reading.value,
        Some(394.0)
    );
}
