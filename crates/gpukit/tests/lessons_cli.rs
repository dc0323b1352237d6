//! `gpukit lessons` as a user runs it: on the CPU the lessons that mean something there run
//! (and the rest say why not), bad input is refused with exit 2, and on a GPU every lesson runs
//! with a verdict, the stream lessons' overlap comes from event timestamps, and lessons 0 and 7
//! correct the notebook.

mod common;

use common::*;
use libtest_mimic::Failed;
use serde_json::Value;

fn lessons(doc: &Value) -> Vec<Value> {
    doc["result"]["lessons"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn lesson<'a>(all: &'a [Value], id: &str) -> Result<&'a Value, Failed> {
    all.iter()
        .find(|l| l["id"] == id)
        .ok_or_else(|| format!("no lesson {id}").into())
}

fn case_ms(l: &Value, name: &str) -> Result<f64, Failed> {
    l["cases"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .and_then(|c| c["ms"]["median"].as_f64())
        .ok_or_else(|| format!("lesson {}: no case {name}", l["id"]).into())
}

fn on_the_cpu_the_cpu_lessons_run_and_the_rest_say_why() -> Result<(), Failed> {
    let doc = document(
        &[
            "lessons",
            "4,5,1",
            "--device",
            "cpu",
            "--samples",
            "3",
            "--min-sample-ms",
            "1",
        ],
        0,
    )?;
    let all = lessons(&doc);
    ensure(all.len() == 3, || format!("{} lessons", all.len()))?;
    for id in ["4", "5"] {
        let l = lesson(&all, id)?;
        ensure(l["verdict"] != "skipped" && l["failed"] == false, || {
            format!("{l}")
        })?;
        let cases = l["cases"].as_array().map_or(0, Vec::len);
        ensure(cases >= 2, || format!("lesson {id}: {cases} cases"))?;
        for c in l["cases"].as_array().into_iter().flatten() {
            let (m, p10, p90) = (
                c["ms"]["median"].as_f64().unwrap_or(-1.0),
                c["ms"]["p10"].as_f64().unwrap_or(-1.0),
                c["ms"]["p90"].as_f64().unwrap_or(-1.0),
            );
            ensure(
                m > 0.0 && p10 <= m && m <= p90 && c["ms"]["count"] == 3,
                || format!("lesson {id}: {c}"),
            )?;
        }
        ensure(
            l["comparisons"].as_array().is_some_and(|c| !c.is_empty()),
            || format!("lesson {id}: no comparison"),
        )?;
    }
    // the speedup is the ratio of the two medians
    let l4 = lesson(&all, "4")?;
    let s = l4["comparisons"][0]["speedup"].as_f64().unwrap_or(0.0);
    let want = case_ms(l4, "separate")? / case_ms(l4, "batched")?;
    ensure((s - want).abs() < 1e-9 * want, || {
        format!("speedup {s}, medians give {want}")
    })?;
    let l1 = lesson(&all, "1")?;
    ensure(
        l1["verdict"] == "skipped" && l1["reason"].as_str().is_some_and(|r| r.contains("GPU")),
        || format!("{l1}"),
    )
}

fn bad_input_exits_2() -> Result<(), Failed> {
    for args in [
        &["lessons", "99"][..],
        &["lessons", "0,nine"],
        &["lessons", "4", "--samples", "2"],
        &["lessons", "4", "--min-sample-ms", "0"],
        &["lessons", "4", "--device", "tpu:0"],
    ] {
        let out = gpukit(args);
        exited(&out, 2, args)?;
        let err = text(&out.stderr);
        ensure(!err.contains("panicked"), || format!("{args:?}: {err}"))?;
    }
    let out = gpukit(&["lessons", "99"]);
    let err = text(&out.stderr);
    ensure(err.contains("no lesson") && err.contains("streams"), || {
        err.clone()
    })
}

fn with_a_gpu_every_lesson_runs_with_a_verdict() -> Result<(), Failed> {
    let doc = document(
        &[
            "lessons",
            "all",
            "--device",
            "cuda:0",
            "--samples",
            "5",
            "--min-sample-ms",
            "1",
        ],
        0,
    )?;
    let all = lessons(&doc);
    ensure(all.len() == 12, || format!("{} lessons", all.len()))?;
    for l in &all {
        ensure(l["verdict"] != "skipped" && l["failed"] == false, || {
            format!("lesson {}: {} ({})", l["id"], l["verdict"], l["reason"])
        })?;
        ensure(l["reason"].as_str().is_some_and(|r| !r.is_empty()), || {
            format!("lesson {}: no reason", l["id"])
        })?;
    }
    // lesson 0 corrects the notebook's 0.0 MB with a measured context
    let l0 = lesson(&all, "0")?;
    ensure(l0["verdict"] == "corrected", || format!("{l0}"))?;
    // lesson 7: both sums were checked equal, and the verdict names the inversion
    let l7 = lesson(&all, "7")?;
    ensure(l7["verdict"] == "corrected", || format!("{l7}"))?;
    // streams: spans from events, inside the overlapped total, the overlap no longer than either
    let st = lesson(&all, "streams")?;
    let overlaps = st["overlaps"].as_array().cloned().unwrap_or_default();
    ensure(overlaps.len() == 3, || {
        format!("{} stream patterns", overlaps.len())
    })?;
    for o in &overlaps {
        let total = o["overlapped_ms"].as_f64().unwrap_or(-1.0);
        let spans = o["intervals_ms"].as_array().cloned().unwrap_or_default();
        ensure(spans.len() >= 2 && total > 0.0, || format!("{o}"))?;
        for s in &spans {
            let (b, e) = (s[1].as_f64().unwrap_or(-1.0), s[2].as_f64().unwrap_or(-1.0));
            ensure(0.0 <= b && b <= e && e <= total + 1e-6, || {
                format!("{}: span {s}", o["name"])
            })?;
        }
        let ov = o["overlap_ms"].as_f64().unwrap_or(-1.0);
        ensure(ov >= 0.0 && ov <= total, || {
            format!("{}: overlap {ov}", o["name"])
        })?;
    }
    ensure(overlaps[2]["agree"] == true, || {
        "the pipeline's output differs".to_string()
    })?;
    // sync: the unsynchronised figure is the launch, far below the event-timed product
    let sync = lesson(&all, "sync")?;
    ensure(
        case_ms(sync, "unsynchronized")? < case_ms(sync, "events")?,
        || format!("{sync}"),
    )
}

fn with_a_gpu_a_missing_device_exits_2() -> Result<(), Failed> {
    let args = ["lessons", "4", "--device", "cuda:9"];
    let out = gpukit(&args);
    exited(&out, 2, &args)?;
    let err = text(&out.stderr);
    ensure(err.contains("cuda:9"), || err.clone())
}

fn main() {
    let any: Vec<(&str, Test)> = vec![
        (
            "lessons_on_the_cpu_the_cpu_lessons_run_and_the_rest_say_why",
            on_the_cpu_the_cpu_lessons_run_and_the_rest_say_why,
        ),
        ("lessons_bad_input_exits_2", bad_input_exits_2),
    ];
    let gpu: Vec<(&str, Test)> = vec![
        (
            "gpu::every_lesson_runs_with_a_verdict",
            with_a_gpu_every_lesson_runs_with_a_verdict,
        ),
        (
            "gpu::a_missing_device_exits_2",
            with_a_gpu_a_missing_device_exits_2,
        ),
    ];
    run_kinds(any, Vec::new(), gpu, Vec::new());
}
