//! Extraction from small hand-made reports of every section (and the old bare `all` format),
//! the configuration in each key, the verdict rules (threshold, spread, repetitions), and the
//! inputs that must be refused.

use super::*;
use serde_json::json;

/// A timing summary of 30 repetitions whose median, p10 and p90 are given in ms.
fn timing(median: f64, p10: f64, p90: f64) -> Value {
    timing_of(30, median, p10, p90)
}

/// A timing summary of `count` repetitions.
fn timing_of(count: u64, median: f64, p10: f64, p90: f64) -> Value {
    json!({"clock": "cuda_events",
           "summary_ms": {"count": count, "median": median, "p10": p10, "p90": p90}})
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
    json!({"cpu_model": "Xeon", "cpu_threads": 16, "inputs": "normal", "rows": [
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
    assert_eq!(
        (f.reading.value, f.reading.samples),
        (Some(500.0), Some(30))
    );
    assert!(!f.exact);
    // a rate's low end comes from p90: 500 * 2.0 / 2.2
    let [lo, hi] = f.reading.spread.unwrap();
    assert!((lo - 500.0 * 2.0 / 2.2).abs() < 1e-9 && (hi - 500.0 * 2.0 / 1.9).abs() < 1e-9);
    // a CPU row names the threads its kernels ran on
    let skipped = by_key(&figs, "matmul cpu f32 8192 16 threads");
    assert_eq!(skipped.reading.value, None);
    assert!(skipped
        .reading
        .problem
        .unwrap()
        .starts_with("skipped: too big"));
    // a failed row carries no figure even when a number is there
    let failed = by_key(&figs, "matmul cpu f64 1024 16 threads");
    assert_eq!(failed.reading.value, None);
    assert_eq!(
        failed.reading.problem.as_deref(),
        Some("failed: wrong result")
    );
}

/// One training run's report: the seed-regression loop on `samples` samples, its epochs at
/// these rates.
fn train_run(device: &str, samples: u64, rates: &[f64]) -> Value {
    let epochs: Vec<Value> = rates
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"epoch": i + 1, "complete": true, "samples_per_s": r}))
        .collect();
    json!({"preset": "seed-regression", "device": device, "precision": "fp32",
           "config": {"widths": [16, 64, 1], "loss": "mse",
                      "optimizer": {"kind": "adam", "lr": 0.001, "momentum": 0.0,
                                    "weight_decay": 0.0},
                      "batch_size": 64, "epochs": rates.len(), "seed": 0, "shuffle": true,
                      "accumulate": 1, "max_steps": null, "checkpoint_activations": false},
           "samples": samples, "features": 16, "epochs": epochs, "gpu": null,
           "data_parallel": null})
}

#[test]
fn bandwidth_conv_infer_memory_and_train_rows_are_read() {
    let bw = json!({"gpu": {"index": 1, "name": "H100"},
                    "rows": [{"kind": "h2d_pinned", "bytes": 1073741824, "status": {"status": "ok"},
                              "timing": timing(20.0, 19.0, 21.0), "gbs": 54.0}]});
    let conv = json!({"gpu": {"index": 0}, "cpu_threads": 16,
                      "rows": [{"name": "layer3 1x1 reduce",
                                "shape": {"n": 32, "c": 1024, "h": 14, "w": 14, "k": 256,
                                          "r": 1, "s": 1, "stride": 1, "pad": 0},
                                "layout": "Nhwc", "device": {"Cuda": 0}, "dtype": "bf16",
                                "status": {"status": "ok"}, "timing": timing(0.1, 0.09, 0.11),
                                "tflops": 300.0}],
                      "totals": [{"batch": 32, "dtype": "f16", "layout": "Nhwc",
                                  "gpu_ms": 0.87, "cpu_ms": 372.0}]});
    let infer = json!({"model": "resnet50", "image_size": 224, "cpu_threads": 16,
                       "rows": [{"strategy": "fp16-nhwc-graph", "device": "cuda:0", "batch": 32,
                                 "status": {"status": "ok"}, "timing": timing(5.0, 4.0, 6.0),
                                 "images_per_s": 6400.0},
                                {"strategy": "cpu", "device": "cpu", "batch": 1,
                                 "status": {"status": "ok"}, "timing": timing(50.0, 40.0, 60.0),
                                 "images_per_s": 20.0}]});
    let memory = json!({"model": "resnet50", "precision": "fp32", "layout": "NCHW",
                        "device": "cuda:0 NVIDIA H100 80GB HBM3", "max_workspace_bytes": null,
                        "limit_bytes": null,
                        "rows": [{"batch_requested": 64, "batch": 64, "status": {"status": "ok"},
                                  "input_bytes": 64 * 3 * 224 * 224 * 4,
                                  "pool_used_peak": 621429152u64, "ms_per_batch": 14.5}],
                        "max_batch": {"batch": 14474}});
    let train = json!([train_run("cpu", 819, &[90000.0, 100000.0, 98000.0])]);
    let all = envelope(
        "all",
        json!({"check": {}, "matmul": {"rows": []}, "bandwidth": bw, "conv": conv,
               "infer": infer, "memory": memory, "train": train}),
    );
    let figs = figures(&loaded(all));
    let b = by_key(&figs, "bandwidth cuda:1 h2d_pinned 1 GiB");
    assert_eq!((b.unit.as_str(), b.reading.value), ("GB/s", Some(54.0)));
    // the shape, not the row's name (which changed between versions), names a convolution
    let c = by_key(&figs, "conv 1x1 1024->256 @14 NHWC bf16 batch 32 cuda:0");
    assert_eq!(c.reading.value, Some(300.0));
    let t = by_key(&figs, "conv total f16 NHWC batch 32 cuda:0");
    assert_eq!((t.unit.as_str(), t.better), ("ms", Better::Lower));
    by_key(&figs, "conv total f16 NHWC batch 32 cpu 16 threads");
    let i = by_key(
        &figs,
        "infer resnet50 224px fp16-nhwc-graph cuda:0 batch 32",
    );
    assert_eq!(
        (i.unit.as_str(), i.reading.value),
        ("images/s", Some(6400.0))
    );
    let [lo, hi] = i.reading.spread.unwrap();
    assert!((lo - 6400.0 * 5.0 / 6.0).abs() < 1e-9 && (hi - 8000.0).abs() < 1e-9);
    by_key(&figs, "infer resnet50 224px cpu cpu 16 threads batch 1");
    // the image size comes from the input's bytes (NCHW f32), the device's model is dropped
    let setup = "memory resnet50 224px fp32 NCHW cuda:0";
    let m = by_key(&figs, &format!("{setup} batch 64 pool peak"));
    assert_eq!((m.unit.as_str(), m.better), ("bytes", Better::Lower));
    assert!(m.exact);
    let per_batch = by_key(&figs, &format!("{setup} batch 64 per batch"));
    assert_eq!(
        (per_batch.reading.value, per_batch.exact),
        (Some(14.5), false)
    );
    let largest = by_key(&figs, &format!("{setup} largest batch"));
    assert_eq!(
        (largest.reading.value, largest.exact),
        (Some(14474.0), true)
    );
    // one figure per training run: the median of the epochs after the first
    let tr = by_key(
        &figs,
        "train cpu 16-64-1 mse adam batch 64 819 samples fp32",
    );
    assert_eq!(tr.reading.value, Some(99000.0));
    assert_eq!(tr.reading.samples, Some(2));
    assert!(tr.reading.spread.is_some());
}

#[test]
fn a_train_key_names_what_changes_the_rate_and_not_what_repeats_it() {
    let key = |r: &Value| {
        let figs = figures(&loaded(envelope("train", r.clone())));
        assert_eq!(figs.len(), 1, "{figs:?}");
        figs[0].key.clone()
    };
    let plain = train_run("cpu", 1024, &[1.0, 2.0, 3.0]);
    assert_eq!(
        key(&plain),
        "train cpu 16-64-1 mse adam batch 64 1024 samples fp32"
    );
    // more epochs, another seed or learning rate: the same loop repeated
    let mut longer = train_run("cpu", 1024, &[1.0; 12]);
    longer["config"]["seed"] = json!(7);
    longer["config"]["optimizer"]["lr"] = json!(0.1);
    assert_eq!(key(&longer), key(&plain));
    let mut gpu = train_run("cuda:0 (NVIDIA H100 80GB HBM3)", 1024, &[1.0, 2.0]);
    gpu["precision"] = json!("bf16");
    gpu["config"]["accumulate"] = json!(4);
    gpu["config"]["optimizer"]["kind"] = json!("sgd");
    gpu["config"]["optimizer"]["momentum"] = json!(0.9);
    gpu["gpu"] = json!({"precision": "bf16", "loader": "pinned", "graph": false});
    gpu["data_parallel"] =
        json!({"ranks": 2, "started_by": "threads in one process", "bucket_mb": 25.0});
    assert_eq!(
        key(&gpu),
        "train cuda:0 16-64-1 mse sgd momentum 0.9 batch 64 accumulate 4 1024 samples bf16 \
         pinned loader no graph 2 ranks (threads in one process) buckets 25.0 MiB"
    );
    let mut diverged = plain.clone();
    diverged["diverged"] = json!("the loss is NaN at step 3");
    let figs = figures(&loaded(envelope("train", diverged)));
    assert_eq!(
        figs[0].reading.problem.as_deref(),
        Some("failed: the loss is NaN at step 3")
    );
}

#[test]
fn a_train_preset_inside_all_and_a_plain_train_run_are_not_matched() {
    // `all` holds the preset out 20% for evaluation (819 of 1024 samples); `train` does not
    let all = loaded(envelope(
        "all",
        json!({"matmul": matmul_section(500.0),
               "train": [train_run("cpu", 819, &[1.0e6; 12])]}),
    ));
    let plain = loaded(envelope(
        "all",
        json!({"matmul": matmul_section(500.0),
               "train": [train_run("cpu", 1024, &[2.0e6; 12])]}),
    ));
    let r = compare(&all, &plain, 0.05).unwrap();
    assert!(
        r.figures.iter().all(|c| c.section != "train"),
        "{:?}",
        r.figures
    );
    assert_eq!(
        r.only_old,
        ["train cpu 16-64-1 mse adam batch 64 819 samples fp32"]
    );
    assert_eq!(
        r.only_new,
        ["train cpu 16-64-1 mse adam batch 64 1024 samples fp32"]
    );
    assert_eq!(
        (r.total.better, r.total.only_old, r.total.only_new),
        (0, 1, 1)
    );
    // alone, the two train reports have nothing in common
    let train = |samples| loaded(envelope("train", train_run("cpu", samples, &[1.0e6; 12])));
    match compare(&train(819), &train(1024), 0.05) {
        Err(Error::BadInput(m)) => assert!(m.contains("no figure in common"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_of_other_sections_name_their_configuration() {
    let mut mm = matmul_section(500.0);
    mm["inputs"] = json!("uniform");
    let figs = figures(&loaded(envelope("bench matmul", mm)));
    by_key(&figs, "matmul cuda:0 bf16 8192 uniform inputs");
    let nccl = json!({"ranks": 8, "processes": 8, "graph": true,
                      "nccl_env": [["NCCL_ALGO", "Ring"], ["NCCL_DEBUG", "INFO"]],
                      "rows": [{"op": "broadcast", "dtype": "f32", "redop": null, "root": 0,
                                "bytes": 1024, "status": {"status": "ok"},
                                "out_of_place": {"busbw_gbs": 3.0}, "in_place": null}]});
    let figs = figures(&loaded(envelope("bench nccl", nccl)));
    by_key(
        &figs,
        "nccl broadcast f32 root 0 1 KiB out-of-place 8 ranks in 8 processes graph NCCL_ALGO=Ring",
    );
    let memory = json!({"model": "resnet18", "precision": "fp16", "layout": "NHWC",
                        "device": "cuda:1 H100", "max_workspace_bytes": 0,
                        "limit_bytes": 1073741824u64,
                        "rows": [{"batch": 2, "status": {"status": "ok"},
                                  "input_bytes": 2 * 3 * 64 * 64 * 4, "pool_used_peak": 9}],
                        "max_batch": {"batch": 300}});
    let figs = figures(&loaded(envelope("memory", memory)));
    let setup = "memory resnet18 64px fp16 NHWC cuda:1 workspace cap 0 B";
    by_key(&figs, &format!("{setup} batch 2 pool peak"));
    by_key(&figs, &format!("{setup} largest batch under 1 GiB"));
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

/// A reading of 30 repetitions when it has a spread.
fn reading(value: f64, spread: Option<[f64; 2]>) -> Reading {
    Reading {
        value: Some(value),
        spread,
        samples: spread.map(|_| 30),
        problem: None,
    }
}

/// A reading whose spread rests on `samples` repetitions.
fn reading_of(value: f64, spread: [f64; 2], samples: u64) -> Reading {
    Reading {
        value: Some(value),
        spread: Some(spread),
        samples: Some(samples),
        problem: None,
    }
}

#[test]
fn overlapping_spreads_are_the_same_even_at_20_percent() {
    let old = reading(100.0, Some([70.0, 130.0]));
    let new = reading(120.0, Some([90.0, 150.0]));
    let (v, ratio, gain, noise) = judge(Better::Higher, false, &old, &new, 0.05);
    assert_eq!(v, Verdict::Same);
    assert!(noise);
    assert!((ratio.unwrap() - 1.2).abs() < 1e-12 && (gain.unwrap() - 1.2).abs() < 1e-12);
}

#[test]
fn separate_spreads_beyond_the_threshold_are_better_or_worse() {
    let old = reading(100.0, Some([98.0, 102.0]));
    let up = reading(120.0, Some([118.0, 122.0]));
    let down = reading(80.0, Some([78.0, 82.0]));
    assert_eq!(
        judge(Better::Higher, false, &old, &up, 0.05).0,
        Verdict::Better
    );
    assert_eq!(
        judge(Better::Higher, false, &old, &down, 0.05).0,
        Verdict::Worse
    );
    // within the threshold: same, though the spreads are apart
    let near = reading(103.0, Some([102.5, 103.5]));
    let (v, _, _, noise) = judge(Better::Higher, false, &old, &near, 0.05);
    assert_eq!((v, noise), (Verdict::Same, false));
    // a higher threshold swallows the 20%
    assert_eq!(
        judge(Better::Higher, false, &old, &down, 0.25).0,
        Verdict::Same
    );
}

#[test]
fn a_timing_with_too_few_repetitions_or_no_spread_is_not_judged() {
    // apart and 20% down, but three repetitions a side: not judged
    let old = reading_of(100.0, [99.0, 101.0], 3);
    let new = reading_of(80.0, [79.0, 81.0], 3);
    let (v, ratio, gain, noise) = judge(Better::Higher, false, &old, &new, 0.05);
    assert_eq!((v, noise), (Verdict::TooFewSamples, false));
    assert!((ratio.unwrap() - 0.8).abs() < 1e-12 && (gain.unwrap() - 0.8).abs() < 1e-12);
    // one side short is enough to withhold the verdict
    let thirty = reading_of(100.0, [99.0, 101.0], 30);
    assert_eq!(
        judge(Better::Higher, false, &thirty, &new, 0.05).0,
        Verdict::TooFewSamples
    );
    // ten a side is enough
    let ten = |v: f64| reading_of(v, [v - 1.0, v + 1.0], MIN_SAMPLES);
    assert_eq!(
        judge(Better::Higher, false, &ten(100.0), &ten(80.0), 0.05).0,
        Verdict::Worse
    );
    // no spread at all, or a spread without a count: not judged
    let bare = |v| reading(v, None);
    assert_eq!(
        judge(Better::Higher, false, &bare(100.0), &bare(80.0), 0.05).0,
        Verdict::TooFewSamples
    );
    let uncounted = |v: f64| Reading {
        samples: None,
        ..ten(v)
    };
    assert_eq!(
        judge(
            Better::Higher,
            false,
            &uncounted(100.0),
            &uncounted(80.0),
            0.05
        )
        .0,
        Verdict::TooFewSamples
    );
    // within the threshold few samples still make "same", and overlapping ranges "noise"
    assert_eq!(
        judge(Better::Higher, false, &bare(100.0), &bare(103.0), 0.05).0,
        Verdict::Same
    );
    let wide = judge(
        Better::Higher,
        false,
        &reading_of(100.0, [70.0, 130.0], 3),
        &reading_of(120.0, [90.0, 150.0], 3),
        0.05,
    );
    assert_eq!((wide.0, wide.3), (Verdict::Same, true));
}

#[test]
fn counts_and_sizes_are_judged_on_the_threshold_alone() {
    let bare = |v| reading(v, None);
    assert_eq!(
        judge(Better::Lower, true, &bare(100.0), &bare(120.0), 0.05).0,
        Verdict::Worse
    );
    assert_eq!(
        judge(Better::Higher, true, &bare(100.0), &bare(120.0), 0.05).0,
        Verdict::Better
    );
}

#[test]
fn lower_is_better_turns_the_gain() {
    let old = reading(10.0, Some([9.9, 10.1]));
    let slower = reading(12.0, Some([11.9, 12.1]));
    let (v, ratio, gain, _) = judge(Better::Lower, false, &old, &slower, 0.05);
    assert_eq!(v, Verdict::Worse);
    assert!((ratio.unwrap() - 1.2).abs() < 1e-12);
    assert!((gain.unwrap() - 10.0 / 12.0).abs() < 1e-12);
    assert_eq!(
        judge(
            Better::Lower,
            false,
            &old,
            &reading(8.0, Some([7.9, 8.1])),
            0.05
        )
        .0,
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

/// A matmul report of `sizes` GPU rows at `tflops`, each timed `count` times with a p10-p90
/// range of `spread` around its median (a fraction: 0.02 is 2% wide).
fn timed_matmul(sizes: &[u64], tflops: f64, count: u64, spread: f64) -> Loaded {
    let rows: Vec<Value> = sizes
        .iter()
        .map(|size| {
            json!({"device": {"Cuda": 0}, "dtype": "bf16", "size": size,
                   "status": {"status": "ok"},
                   "timing": timing_of(count, 1.0, 1.0 - spread / 2.0, 1.0 + spread / 2.0),
                   "tflops": tflops})
        })
        .collect();
    loaded(envelope("bench matmul", json!({"rows": rows})))
}

#[test]
fn same_config_runs_with_few_repetitions_are_not_called_better_or_worse() {
    // 20% apart, ranges 1% wide that miss each other: on three repetitions, not judged
    let sizes = [1024, 2048, 4096];
    let old = timed_matmul(&sizes, 500.0, 3, 0.01);
    let new = timed_matmul(&sizes, 400.0, 3, 0.01);
    let r = compare(&old, &new, 0.05).unwrap();
    assert!(r
        .figures
        .iter()
        .all(|c| c.verdict == Verdict::TooFewSamples));
    let t = &r.total;
    assert_eq!((t.better, t.worse, t.not_judged), (0, 0, 3));
    assert_eq!((t.timed, t.too_few, t.wide), (3, 3, 0));
    assert!(r.too_noisy);
    assert_eq!(r.min_samples, MIN_SAMPLES);
    let said = r.caveats.join("\n");
    assert!(said.contains("too noisy to judge: 3 of 3"), "{said}");
    assert!(
        said.contains("3 figure(s) moved beyond 5.0% but were not judged"),
        "{said}"
    );
    assert!(said.contains("--iterations"), "{said}");
    // --fail-on-regression fails only on a judged regression
    assert_eq!(regression(&r), None);
    assert!(document(r, true).ok);
    // the same change on thirty repetitions a side is judged, and the runs are not noisy
    let r = compare(
        &timed_matmul(&sizes, 500.0, 30, 0.01),
        &timed_matmul(&sizes, 400.0, 30, 0.01),
        0.05,
    )
    .unwrap();
    assert_eq!((r.total.worse, r.total.not_judged), (3, 0));
    assert!(!r.too_noisy && r.caveats.is_empty(), "{:?}", r.caveats);
    assert!(!document(r, true).ok);
}

#[test]
fn runs_whose_spreads_are_wider_than_the_threshold_are_called_too_noisy() {
    // thirty repetitions, but p10-p90 ranges 40% wide: a 10% move is noise
    let sizes = [1024, 2048, 4096, 8192];
    let r = compare(
        &timed_matmul(&sizes, 500.0, 30, 0.4),
        &timed_matmul(&sizes, 450.0, 30, 0.4),
        0.05,
    )
    .unwrap();
    let t = &r.total;
    assert_eq!((t.better, t.worse, t.same, t.within_noise), (0, 0, 4, 4));
    assert_eq!((t.timed, t.too_few, t.wide), (4, 0, 4));
    assert!(r.too_noisy);
    assert!(
        r.caveats[0].contains("4 with a p10-p90 range wider than 5.0%"),
        "{:?}",
        r.caveats
    );
    // the same spreads at a threshold above them are not
    let r = compare(
        &timed_matmul(&sizes, 500.0, 30, 0.4),
        &timed_matmul(&sizes, 450.0, 30, 0.4),
        0.5,
    )
    .unwrap();
    assert!(!r.too_noisy, "{:?}", r.caveats);
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

/// An `infer --onnx` report of `file` (input `[n, 3, 224, 224]`) with one GPU row.
fn onnx_report(file: &str, images_per_s: f64) -> Value {
    envelope(
        "infer --onnx",
        json!({"model": {"file": file, "inputs": [{"name": "input", "shape": [1, 3, 224, 224]}]},
               "cpu_threads": 2,
               "rows": [{"strategy": "fp16-nhwc-graph", "device": "cuda:0", "batch": 32,
                         "status": {"status": "ok"}, "images_per_s": images_per_s,
                         "timing": timing(1.0, 0.99, 1.01)},
                        {"strategy": "gpukit graph f32", "device": "cpu", "batch": 1,
                         "status": {"status": "ok"}, "images_per_s": 50.0,
                         "timing": timing(20.0, 19.8, 20.2)}]}),
    )
}

#[test]
fn infer_onnx_reports_compare_by_model_file_shape_strategy_device_and_batch() {
    let old = loaded(onnx_report("/tmp/a/mobilenet_v3_large.onnx", 30_000.0));
    let figs = figures::figures(&old);
    let gpu = by_key(
        &figs,
        "infer --onnx mobilenet_v3_large 3x224x224 fp16-nhwc-graph cuda:0 batch 32",
    );
    assert_eq!(gpu.unit, "images/s");
    by_key(
        &figs,
        "infer --onnx mobilenet_v3_large 3x224x224 gpukit graph f32 cpu 2 threads batch 1",
    );
    // the same export elsewhere matches; 20% faster is better
    let new = loaded(onnx_report("/home/u/mobilenet_v3_large.onnx", 36_000.0));
    let r = compare(&old, &new, 0.05).unwrap();
    assert_eq!((r.total.better, r.total.same), (1, 1), "{r:?}");
    // another model has nothing in common with it
    let other = loaded(onnx_report("/tmp/a/efficientnet_b0.onnx", 30_000.0));
    match compare(&old, &other, 0.05) {
        Err(Error::BadInput(m)) => assert!(m.contains("no figure in common"), "{m}"),
        other => panic!("{other:?}"),
    }
}
