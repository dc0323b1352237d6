//! The Chrome trace event format (what chrome://tracing and Perfetto open), written from op and
//! kernel records, and checked against the format's rules before it is written.
//!
//! Tracks: process 1 is the host (its thread 0 holds each op's launch), process 2 the GPU with
//! two tracks a stream: the kernels (tid 2 x stream) and the ops' event-bracketed spans (tid
//! 2 x stream + 1), apart because the two clocks' edges need not nest exactly, and Perfetto
//! refuses partly overlapping slices on one track. A flow arrow joins each op's launch to the
//! kernels it started. The memory pool's used and reserved bytes are a counter track.

use super::{KernelRecord, OpRecord, Span};
use serde_json::{json, Value};
use std::collections::HashMap;

const HOST: u32 = 1;
const GPU: u32 = 2;

/// Tracks a stream has room for: kernels in lanes from `1000 x stream`, ops from
/// `1000 x stream + 500`.
const LANES: u64 = 500;

fn kernel_tid(stream: u32, lane: u64) -> u64 {
    1000 * u64::from(stream) + lane
}

fn op_tid(stream: u32, lane: u64) -> u64 {
    1000 * u64::from(stream) + LANES + lane
}

/// Lanes for spans that may overlap on one stream (Hopper's programmatic dependent launch
/// starts a kernel before the previous one has ended): each span goes to the first lane whose
/// last span has ended, so no lane holds two partly overlapping slices.
fn lanes(spans: &[(u32, Span)]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|&a, &b| spans[a].1.start_us.total_cmp(&spans[b].1.start_us));
    let mut ends: HashMap<u32, Vec<f64>> = HashMap::new();
    let mut lane = vec![0u64; spans.len()];
    for i in order {
        let (stream, s) = spans[i];
        let lanes = ends.entry(stream).or_default();
        let free = lanes.iter().position(|&e| e <= s.start_us);
        let l = match free {
            Some(l) => l,
            None if (lanes.len() as u64) < LANES - 1 => {
                lanes.push(f64::NEG_INFINITY);
                lanes.len() - 1
            }
            // more overlap than lanes: the last lane (the validator will say so)
            None => lanes.len() - 1,
        };
        lanes[l] = s.end_us();
        lane[i] = l as u64;
    }
    lane
}

fn slice(name: &str, cat: &str, pid: u32, tid: u64, span: Span, args: Value) -> Value {
    json!({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
           "ts": span.start_us, "dur": span.dur_us.max(0.0), "args": args})
}

fn thread_name(pid: u32, tid: u64, name: &str) -> Value {
    json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
}

/// A memory pool reading: microseconds from the start, bytes in use and reserved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSample {
    pub ts_us: f64,
    pub used: u64,
    pub reserved: u64,
}

/// The trace of one profiled window.
pub fn chrome_trace(ops: &[OpRecord], kernels: &[KernelRecord], pool: &[PoolSample]) -> Value {
    let mut ev = vec![
        json!({"ph": "M", "name": "process_name", "pid": HOST, "args": {"name": "host (gpukit)"}}),
        json!({"ph": "M", "name": "process_name", "pid": GPU, "args": {"name": "GPU"}}),
        thread_name(HOST, 0, "launches"),
    ];
    let kernel_lanes = lanes(
        &kernels
            .iter()
            .map(|k| (k.stream, k.gpu))
            .collect::<Vec<_>>(),
    );
    let op_spans: Vec<(usize, u32, Span)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.gpu.map(|g| (i, o.stream, g)))
        .collect();
    let op_lanes = lanes(&op_spans.iter().map(|&(_, s, g)| (s, g)).collect::<Vec<_>>());
    let mut named: Vec<(u64, String)> = Vec::new();
    for (k, &l) in kernels.iter().zip(&kernel_lanes) {
        let name = match l {
            0 => format!("stream {}: kernels", k.stream),
            l => format!("stream {}: kernels (overlapping, {})", k.stream, l + 1),
        };
        named.push((kernel_tid(k.stream, l), name));
    }
    for (&(_, st, _), &l) in op_spans.iter().zip(&op_lanes) {
        let name = match l {
            0 => format!("stream {st}: ops"),
            l => format!("stream {st}: ops (overlapping, {})", l + 1),
        };
        named.push((op_tid(st, l), name));
    }
    named.sort();
    named.dedup();
    for (tid, name) in &named {
        ev.push(thread_name(GPU, *tid, name));
    }
    let args_of = |o: &OpRecord| {
        json!({"layer": o.layer, "detail": o.detail, "library": o.library,
               "flops": o.flops, "bytes": o.bytes, "dtype": o.dtype})
    };
    for o in ops {
        ev.push(slice(&o.name, "launch", HOST, 0, o.cpu, args_of(o)));
    }
    for (&(i, st, g), &l) in op_spans.iter().zip(&op_lanes) {
        let o = &ops[i];
        ev.push(slice(&o.name, "op", GPU, op_tid(st, l), g, args_of(o)));
    }
    for (id, (k, &l)) in kernels.iter().zip(&kernel_lanes).enumerate() {
        let tid = kernel_tid(k.stream, l);
        ev.push(slice(
            &k.name,
            "kernel",
            GPU,
            tid,
            k.gpu,
            json!({"op": k.op}),
        ));
        // the arrow from the op's launch to this kernel: it starts inside the launch slice and
        // ends where the kernel starts (bound to the kernel's slice)
        if let Some(o) = k.op.and_then(|i| ops.get(i)) {
            let from = o.cpu.start_us + o.cpu.dur_us / 2.0;
            if k.gpu.start_us >= from && o.cpu.dur_us > 0.0 {
                ev.push(json!({"ph": "s", "id": id, "name": "launch", "cat": "flow",
                               "pid": HOST, "tid": 0, "ts": from}));
                ev.push(
                    json!({"ph": "f", "bp": "e", "id": id, "name": "launch", "cat": "flow",
                               "pid": GPU, "tid": tid, "ts": k.gpu.start_us}),
                );
            }
        }
    }
    for p in pool {
        ev.push(
            json!({"ph": "C", "name": "memory pool", "pid": GPU, "ts": p.ts_us,
                       "args": {"used MiB": p.used as f64 / 1048576.0,
                                "reserved MiB": p.reserved as f64 / 1048576.0}}),
        );
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ms"})
}

/// A track: (pid, tid).
type Track = (u64, u64);
/// A slice on a track: start, end (us), and its event's index.
type Slice = (f64, f64, usize);
/// One end of a flow: when, and on which track.
type FlowEnd = (f64, u64, u64);

/// Every way `trace` breaks the format's rules that chrome://tracing or Perfetto would refuse or
/// mis-draw; empty when it is well formed.
pub fn validate(trace: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(events) = trace.get("traceEvents").and_then(Value::as_array) else {
        return vec!["no traceEvents array at the top level".into()];
    };
    // per track: (start, end, index) of its slices
    let mut tracks: HashMap<Track, Vec<Slice>> = HashMap::new();
    let mut flows: HashMap<String, (Vec<FlowEnd>, Vec<FlowEnd>)> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
        let num = |k: &str| e.get(k).and_then(Value::as_f64);
        let id = |k: &str| e.get(k).and_then(Value::as_u64);
        if !matches!(ph, "X" | "M" | "s" | "f" | "t" | "C" | "i" | "B" | "E") {
            bad.push(format!("event {i}: unknown phase {ph:?}"));
            continue;
        }
        if ph == "M" {
            if e.get("args")
                .and_then(|a| a.get("name"))
                .and_then(Value::as_str)
                .is_none()
            {
                bad.push(format!("event {i}: metadata without args.name"));
            }
            continue;
        }
        let Some(ts) = num("ts").filter(|t| t.is_finite() && *t >= 0.0) else {
            bad.push(format!(
                "event {i} ({ph}): ts missing, negative or not a number"
            ));
            continue;
        };
        let Some(pid) = id("pid") else {
            bad.push(format!("event {i} ({ph}): pid missing"));
            continue;
        };
        if ph == "C" {
            let ok = e
                .get("args")
                .and_then(Value::as_object)
                .is_some_and(|a| !a.is_empty() && a.values().all(Value::is_number));
            if !ok {
                bad.push(format!("event {i}: a counter needs numeric args"));
            }
            continue;
        }
        let Some(tid) = id("tid") else {
            bad.push(format!("event {i} ({ph}): tid missing"));
            continue;
        };
        match ph {
            "X" => {
                if e.get("name").and_then(Value::as_str).is_none() {
                    bad.push(format!("event {i}: a slice without a name"));
                }
                match num("dur").filter(|d| d.is_finite() && *d >= 0.0) {
                    Some(d) => tracks.entry((pid, tid)).or_default().push((ts, ts + d, i)),
                    None => bad.push(format!("event {i}: a slice without a valid dur")),
                }
            }
            "s" | "f" => {
                let key = e.get("id").map(Value::to_string).unwrap_or_default();
                if key.is_empty() {
                    bad.push(format!("event {i}: a flow without an id"));
                    continue;
                }
                let entry = flows.entry(key).or_default();
                if ph == "s" {
                    entry.0.push((ts, pid, tid));
                } else {
                    entry.1.push((ts, pid, tid));
                }
            }
            _ => {}
        }
    }
    // slices of one track nest or follow each other: none may overlap another partly
    for ((pid, tid), slices) in &mut tracks {
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<Slice> = Vec::new();
        for &(s, e, i) in slices.iter() {
            while open.last().is_some_and(|o| o.1 <= s) {
                open.pop();
            }
            if let Some(o) = open.last() {
                if e > o.1 {
                    bad.push(format!(
                        "track pid {pid} tid {tid}: event {i} ({s}-{e} us) overlaps event {} \
                         ({}-{} us) without nesting in it",
                        o.2, o.0, o.1
                    ));
                }
            }
            open.push((s, e, i));
        }
    }
    // every flow starts once and ends once, not before it starts, each end inside a slice
    let inside = |ts: f64, pid: u64, tid: u64| {
        tracks
            .get(&(pid, tid))
            .is_some_and(|v| v.iter().any(|&(s, e, _)| s <= ts && ts <= e))
    };
    for (id, (starts, ends)) in &flows {
        if starts.len() != 1 || ends.len() != 1 {
            bad.push(format!(
                "flow {id}: {} start(s) and {} end(s), not one of each",
                starts.len(),
                ends.len()
            ));
            continue;
        }
        let (s, f) = (starts[0], ends[0]);
        if f.0 < s.0 {
            bad.push(format!(
                "flow {id}: ends at {} us, before it starts at {} us",
                f.0, s.0
            ));
        }
        if !inside(s.0, s.1, s.2) {
            bad.push(format!("flow {id}: its start is in no slice of its track"));
        }
        if !inside(f.0, f.1, f.2) {
            bad.push(format!("flow {id}: its end is in no slice of its track"));
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_us: f64, dur_us: f64) -> Span {
        Span { start_us, dur_us }
    }

    fn records() -> (Vec<OpRecord>, Vec<KernelRecord>) {
        let op = |name: &str, cpu: Span, gpu: Span| OpRecord {
            name: name.into(),
            layer: Some("layer1.0.conv1".into()),
            detail: "32x64x56x56 f16 NHWC".into(),
            library: "cuDNN".into(),
            stream: 7,
            cpu,
            gpu: Some(gpu),
            flops: 1e9,
            bytes: 1e6,
            dtype: "f16".into(),
        };
        let ops = vec![
            op("conv", span(0.0, 5.0), span(10.0, 40.0)),
            op("relu", span(6.0, 3.0), span(52.0, 8.0)),
        ];
        let k = |name: &str, gpu: Span, op: usize| KernelRecord {
            name: name.into(),
            stream: 7,
            gpu,
            op: Some(op),
        };
        let kernels = vec![
            k("sm90_xmma_fprop", span(10.5, 30.0), 0),
            k("reorder", span(41.0, 8.0), 0),
            k("relu_f16", span(52.5, 7.0), 1),
        ];
        (ops, kernels)
    }

    #[test]
    fn a_written_trace_keeps_the_rules() {
        let (ops, kernels) = records();
        let pool = [PoolSample {
            ts_us: 0.0,
            used: 1 << 20,
            reserved: 2 << 20,
        }];
        let t = chrome_trace(&ops, &kernels, &pool);
        assert_eq!(validate(&t), Vec::<String>::new());
        let events = t["traceEvents"].as_array().unwrap();
        // one arrow per kernel, kernels and ops on their own tracks of stream 7
        assert_eq!(events.iter().filter(|e| e["ph"] == "s").count(), 3);
        assert!(events
            .iter()
            .any(|e| e["ph"] == "X" && e["cat"] == "kernel" && e["tid"] == 7000));
        assert!(events
            .iter()
            .any(|e| e["ph"] == "X" && e["cat"] == "op" && e["tid"] == 7500));
        // the JSON round-trips
        let text = serde_json::to_string(&t).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert!(validate(&back).is_empty());
    }

    #[test]
    fn kernels_that_overlap_on_a_stream_get_a_lane_of_their_own() {
        // Hopper starts a kernel before the one before it ends (programmatic dependent
        // launch): as measured on an H100, a 1 us kernel overlapped by the next by 0.26 us
        let (ops, mut kernels) = records();
        kernels.push(KernelRecord {
            name: "pdl".into(),
            stream: 7,
            gpu: span(48.7, 3.0),
            op: Some(0),
        });
        let t = chrome_trace(&ops, &kernels, &[]);
        assert_eq!(validate(&t), Vec::<String>::new());
        let events = t["traceEvents"].as_array().unwrap();
        let tid_of = |name: &str| {
            events
                .iter()
                .find(|e| e["ph"] == "X" && e["name"] == name)
                .map(|e| e["tid"].clone())
                .unwrap()
        };
        assert_eq!(tid_of("reorder"), 7000);
        assert_eq!(tid_of("pdl"), 7001);
        // the lane is named
        assert!(events.iter().any(|e| e["ph"] == "M"
            && e["tid"] == 7001
            && e["args"]["name"].as_str().unwrap().contains("overlapping")));
    }

    #[test]
    fn broken_traces_are_caught() {
        let (ops, kernels) = records();
        let good = chrome_trace(&ops, &kernels, &[]);
        let broken = |f: &dyn Fn(&mut Vec<Value>)| {
            let mut t = good.clone();
            f(t["traceEvents"].as_array_mut().unwrap());
            validate(&t)
        };
        let msg = |v: Vec<String>| v.join("; ");
        // a kernel partly overlapping another on its track
        let overlap = broken(&|ev| {
            ev.push(slice(
                "late",
                "kernel",
                GPU,
                7000,
                span(35.0, 10.0),
                json!({}),
            ))
        });
        assert!(msg(overlap).contains("overlaps"));
        // nesting is fine
        assert!(broken(&|ev| {
            ev.push(slice(
                "inner",
                "kernel",
                GPU,
                7000,
                span(11.0, 2.0),
                json!({}),
            ))
        })
        .is_empty());
        assert!(msg(broken(&|ev| ev[5]["ts"] = json!(-1.0))).contains("ts"));
        assert!(msg(broken(&|ev| ev.push(json!({"ph": "Q"})))).contains("unknown phase"));
        assert!(msg(broken(&|ev| {
            if let Some(s) = ev.iter_mut().find(|e| e["ph"] == "X") {
                s.as_object_mut().unwrap().remove("dur");
            }
        }))
        .contains("dur"));
        // a flow that lost its end, and one that ends before it starts
        let lost = broken(&|ev| {
            let at = ev.iter().position(|e| e["ph"] == "f").unwrap();
            ev.remove(at);
        });
        assert!(msg(lost).contains("not one of each"));
        let backwards = broken(&|ev| {
            if let Some(f) = ev.iter_mut().find(|e| e["ph"] == "f") {
                f["ts"] = json!(0.5);
            }
        });
        assert!(msg(backwards).contains("before it starts"));
        assert!(msg(broken(&|ev| {
            ev.push(json!({"ph": "C", "name": "m", "pid": 2, "ts": 1.0, "args": {"x": "high"}}))
        }))
        .contains("counter"));
        assert_eq!(
            validate(&json!({"events": []})),
            vec!["no traceEvents array at the top level".to_string()]
        );
    }
}
