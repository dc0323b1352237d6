//! `gpukit compare`: two small matmul reports compared (a figure better, one worse, one the
//! same, one within the runs' spread, one on too few repetitions, a row failed now, keys found in
//! one report only), kept as snapshots; and two runs too noisy to judge, said in the headline.

use crate::render::{compare_sections, draw_terminal, to_markdown};
use gpukit_bench::compare::{compare, from_value, CompareReport};
use serde_json::{json, Value};

/// A GPU row of `tflops`, timed `count` times with a p10-p90 range `spread` wide (a fraction
/// of the median).
fn row(size: u64, tflops: f64, count: u64, spread: f64) -> Value {
    json!({"device": {"Cuda": 0}, "dtype": "bf16", "size": size, "status": {"status": "ok"},
           "timing": {"clock": "cuda_events",
                      "summary_ms": {"count": count, "median": 1.0, "p10": 1.0 - spread / 2.0,
                                     "p90": 1.0 + spread / 2.0}},
           "tflops": tflops})
}

fn report(rows: Vec<Value>) -> gpukit_bench::compare::Loaded {
    let doc = json!({"gpukit_version": "0.9.0", "command": "bench matmul", "ok": true,
                     "failure": null, "notes": [],
                     "result": {"cpu_model": "Xeon", "cpu_threads": 16, "rows": rows}});
    from_value("test.json", doc).expect("a report")
}

fn compared(old: Vec<Value>, new: Vec<Value>) -> CompareReport {
    compare(&report(old), &report(new), 0.05).expect("figures in common")
}

#[test]
fn every_verdict_is_drawn_with_the_rule_and_what_could_not_be_judged() {
    let failed = json!({"device": {"Cuda": 0}, "dtype": "f16", "size": 256,
                        "status": {"status": "failed", "why": "wrong result"}});
    let cpu = |tflops: f64| {
        json!({"device": "Cpu", "dtype": "f32", "size": 1024, "status": {"status": "ok"},
               "timing": {"clock": "host", "summary_ms": {"count": 20, "median": 1.0,
                                                          "p10": 0.99, "p90": 1.01}},
               "tflops": tflops})
    };
    let mut was_ok = failed.clone();
    was_ok["status"] = json!({"status": "ok"});
    was_ok["tflops"] = json!(10.0);
    was_ok["timing"] = row(256, 10.0, 30, 0.02)["timing"].clone();
    let old = vec![
        row(1024, 100.0, 30, 0.02),
        row(2048, 200.0, 30, 0.02),
        row(4096, 300.0, 30, 0.02),
        row(8192, 400.0, 30, 0.4),
        row(512, 50.0, 3, 0.02),
        row(128, 5.0, 30, 0.02),
        was_ok,
        cpu(1.0),
    ];
    let new = vec![
        row(1024, 130.0, 30, 0.02),
        row(2048, 150.0, 30, 0.02),
        row(4096, 303.0, 30, 0.02),
        row(8192, 440.0, 30, 0.4),
        row(512, 40.0, 3, 0.02),
        row(16384, 600.0, 30, 0.02),
        failed,
        cpu(1.01),
    ];
    let sections = compare_sections(&compared(old, new));
    insta::assert_snapshot!("compare_terminal", draw_terminal(&sections, false));
    insta::assert_snapshot!("compare_markdown", to_markdown(&sections, 3));
}

#[test]
fn runs_too_noisy_to_judge_say_so_before_their_counts() {
    // three repetitions a side: 20% apart, but nothing can be judged
    let sizes = [1024, 2048, 4096];
    let old = sizes.iter().map(|s| row(*s, 100.0, 3, 0.01)).collect();
    let new = sizes.iter().map(|s| row(*s, 80.0, 3, 0.01)).collect();
    let text = draw_terminal(&compare_sections(&compared(old, new)), false);
    assert!(
        text.contains("too noisy to judge as a whole (see below); per figure: 0 better, 0 worse"),
        "{text}"
    );
    assert!(
        text.contains("too noisy to judge: 3 of 3 timed figures"),
        "{text}"
    );
    assert!(text.contains("not judged (n=3) -20.0%"), "{text}");
}
