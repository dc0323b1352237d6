//! `lessons --compare-pytorch`: scripts/pytorch_lessons.py runs the notebook's own code for
//! each lesson with the same timing method, and its figures go beside gpukit's.

use super::{LessonsOptions, LessonsReport, PeerTime, Verdict};
use crate::error::{Error, Result};
use gpukit_tensor::Device;
use serde_json::Value;

/// The script, as shipped in the repository (embedded, so it runs from any directory).
pub const SCRIPT: &str = include_str!("../../../../scripts/pytorch_lessons.py");

/// Runs the script for the lessons that ran; its whole JSON document.
pub(crate) fn run(report: &LessonsReport, device: Device, opts: &LessonsOptions) -> Result<Value> {
    let Device::Cuda(n) = device else {
        return Err(Error::Peer(
            "the PyTorch comparison runs on a GPU (this run is on the CPU)".into(),
        ));
    };
    let ids: Vec<&str> = report
        .lessons
        .iter()
        .filter(|l| l.verdict != Verdict::Skipped)
        .map(|l| l.id.as_str())
        .collect();
    if ids.is_empty() {
        return Err(Error::Peer("no lesson ran, so none was compared".into()));
    }
    let args: Vec<String> = vec![
        "--lessons".into(),
        ids.join(","),
        "--device".into(),
        format!("cuda:{n}"),
        "--samples".into(),
        opts.samples.to_string(),
        "--min-sample-ms".into(),
        opts.min_sample_ms.to_string(),
    ];
    Ok(crate::peer::run_script("lessons", SCRIPT, &args)?.document)
}

fn peer_time(v: &Value) -> Option<PeerTime> {
    Some(PeerTime {
        median_ms: v["median_ms"].as_f64()?,
        p10_ms: v["p10_ms"].as_f64()?,
        p90_ms: v["p90_ms"].as_f64()?,
    })
}

fn f(v: &Value, key: &str) -> Option<f64> {
    v[key].as_f64()
}

/// Puts PyTorch's figures beside gpukit's; returns the version line.
pub(crate) fn merge(report: &mut LessonsReport, doc: &Value) -> String {
    for l in &mut report.lessons {
        let p = &doc["lessons"][l.id.as_str()];
        if p.is_null() {
            continue;
        }
        if let Some(e) = p["error"].as_str() {
            l.pytorch_notes
                .push(format!("PyTorch's run of this lesson failed: {e}"));
            continue;
        }
        for c in &mut l.cases {
            let pc = &p["cases"][c.name.as_str()];
            if let Some(t) = peer_time(pc) {
                c.vs_pytorch = Some(t.median_ms / c.ms.median);
                c.pytorch = Some(t);
                c.pytorch_peak_mib = f(pc, "peak_mib");
            }
        }
        let medians: Vec<(String, f64)> = l
            .cases
            .iter()
            .filter_map(|c| Some((c.name.clone(), c.pytorch?.median_ms)))
            .collect();
        let of = |name: &str| medians.iter().find(|(n, _)| n == name).map(|(_, m)| *m);
        for cmp in &mut l.comparisons {
            if let (Some(b), Some(g)) = (of(&cmp.bad), of(&cmp.good)) {
                cmp.pytorch_speedup = Some(b / g);
            }
        }
        for o in &mut l.overlaps {
            let po = &p[o.name.as_str()];
            o.pytorch_serial_ms = f(po, "serial_ms");
            o.pytorch_overlapped_ms = f(po, "concurrent_ms").or(f(po, "pipelined_ms"));
            o.pytorch_overlap_ms = f(po, "overlap_ms");
        }
        match l.id.as_str() {
            "0" => {
                let bytes = f(p, "allocated_after_bytes");
                let shown = f(p, "allocated_after_mib");
                let ctx = f(p, "context_mib");
                l.pytorch_notes.push(format!(
                    "PyTorch: memory_allocated after torch.ones((1, 1)) is {} bytes (printed as \
                     {} MB); its context took {} of device memory (measured by {})",
                    bytes.map_or("?".into(), |b| format!("{b:.0}")),
                    shown.map_or("?".into(), |m| format!("{m:.1}")),
                    ctx.map_or("an unknown amount".into(), |c| format!("{c:.0} MiB")),
                    p["query"].as_str().unwrap_or("?")
                ));
            }
            "8" => {
                if let Some(e) = p["notebook_error"].as_str() {
                    l.pytorch_notes.push(format!(
                        "PyTorch: the notebook's cell as written fails: {e}"
                    ));
                }
                if let Some(e) = p["profiler_error"].as_str() {
                    l.pytorch_notes
                        .push(format!("PyTorch's profiler failed: {e}"));
                }
                if let Some(rows) = p["top"].as_array() {
                    let top: Vec<String> = rows
                        .iter()
                        .take(5)
                        .map(|r| {
                            format!(
                                "{} {:.0} us",
                                r["name"].as_str().unwrap_or("?"),
                                r["device_total_us"].as_f64().unwrap_or(f64::NAN)
                            )
                        })
                        .collect();
                    l.pytorch_notes.push(format!(
                        "torch.profiler's top ops over 10 calls (device time): {}",
                        top.join(", ")
                    ));
                }
            }
            "streams" => {
                if let Some(st) = p["pipeline"]["stage_ms"].as_object() {
                    l.pytorch_notes.push(format!(
                        "PyTorch's pipeline stages on one stream: copy in {:.2} ms, compute \
                         {:.2} ms, copy out {:.2} ms",
                        st.get("h2d").and_then(Value::as_f64).unwrap_or(f64::NAN),
                        st.get("compute")
                            .and_then(Value::as_f64)
                            .unwrap_or(f64::NAN),
                        st.get("d2h").and_then(Value::as_f64).unwrap_or(f64::NAN)
                    ));
                }
            }
            _ => {}
        }
    }
    format!(
        "PyTorch {} (CUDA {}), the notebook's own code",
        doc["torch"].as_str().unwrap_or("?"),
        doc["cuda"].as_str().unwrap_or("?")
    )
}
