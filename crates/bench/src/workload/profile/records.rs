//! From the cuda crate's [`Recording`] to the profiler's records: each op with its host launch
//! span and GPU span, each kernel (copy, memset) with its op, streams numbered from 0 in the
//! order they first ran work; and the attribution of a CUDA graph replay's kernels to the ops
//! an eager pass launched them from.

use super::{KernelRecord, OpRecord, Span};
use gpukit_cuda::profiler::{Activity, OpInfo, Recording, Timing};

/// The records of one recording, with each op's step.
#[derive(Debug, Clone, PartialEq)]
pub struct Records {
    pub ops: Vec<OpRecord>,
    /// Per op, the step it was launched in.
    pub steps: Vec<usize>,
    pub kernels: Vec<KernelRecord>,
}

fn span(a: f64, b: f64) -> Span {
    Span {
        start_us: a,
        dur_us: (b - a).max(0.0),
    }
}

fn op_record(info: &OpInfo, cpu: Span, gpu: Option<Span>, stream: u32) -> OpRecord {
    OpRecord {
        name: info.name.clone(),
        layer: info.layer.clone(),
        detail: info.detail.clone(),
        library: info.library.clone(),
        stream,
        cpu,
        gpu,
        flops: info.flops,
        bytes: info.bytes,
        dtype: info.dtype.clone(),
    }
}

/// Numbers CUPTI's stream ids 0, 1, ... in the order they first ran work.
fn stream_numbers(acts: &[Activity]) -> Vec<u32> {
    let mut seen: Vec<u32> = Vec::new();
    for a in acts {
        if !seen.contains(&a.stream) {
            seen.push(a.stream);
        }
    }
    seen
}

/// Each activity's start, moved to the end of the work ahead of it on its stream where it began
/// before that ended: a kernel launched to start early (programmatic dependent launch) is
/// scheduled while the kernel ahead runs and waits for it, and would otherwise be charged the
/// wait (the kernels' time a step then adds up to more than the step).
fn own_starts(acts: &[Activity]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..acts.len()).collect();
    order.sort_by(|&a, &b| acts[a].start_us.total_cmp(&acts[b].start_us));
    let mut ahead: Vec<(u32, f64)> = Vec::new();
    let mut starts = vec![0.0; acts.len()];
    for i in order {
        let a = &acts[i];
        let end = match ahead.iter_mut().find(|(s, _)| *s == a.stream) {
            Some((_, e)) => e,
            None => {
                ahead.push((a.stream, f64::NEG_INFINITY));
                &mut ahead.last_mut().expect("just pushed").1
            }
        };
        starts[i] = a.start_us.max(*end).min(a.end_us);
        *end = end.max(a.end_us);
    }
    starts
}

/// The records of `r`: with CUPTI, an op's GPU span runs from its first kernel's start to its
/// last one's end (None when it ran none), a kernel's start taken after the work ahead of it on
/// its stream ([`own_starts`]); with events, the events' span.
pub fn records(r: &Recording) -> Records {
    let streams = stream_numbers(&r.activities);
    let number = |s: u32| streams.iter().position(|&x| x == s).unwrap_or(0) as u32;
    let starts = own_starts(&r.activities);
    let mut gpu: Vec<Option<(f64, f64, u32)>> = vec![None; r.ops.len()];
    for (a, &start) in r.activities.iter().zip(&starts) {
        if let Some(g) = a.op.and_then(|i| gpu.get_mut(i)) {
            *g = Some(match *g {
                None => (start, a.end_us, number(a.stream)),
                Some((s, e, st)) => (s.min(start), e.max(a.end_us), st),
            });
        }
    }
    let ops = r
        .ops
        .iter()
        .zip(&gpu)
        .map(|(o, g)| {
            let cpu = span(o.cpu_start_us, o.cpu_end_us);
            let (gpu, stream) = match (r.timing, g, o.gpu) {
                (Timing::Cupti, Some((s, e, st)), _) => (Some(span(*s, *e)), *st),
                (Timing::Events, _, Some((s, e))) => (Some(span(s, e)), 0),
                _ => (None, 0),
            };
            op_record(&o.info, cpu, gpu, stream)
        })
        .collect();
    let kernels = r
        .activities
        .iter()
        .zip(&starts)
        .map(|(a, &start)| KernelRecord {
            name: a.name.clone(),
            stream: number(a.stream),
            gpu: span(start, a.end_us),
            op: a.op,
        })
        .collect();
    Records {
        ops,
        steps: r.ops.iter().map(|o| o.step).collect(),
        kernels,
    }
}

/// How a graph replay's kernels were tied to ops.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribution {
    /// Every replay ran the eager pass's kernels in its order: each kernel has its op.
    Matched,
    /// A replay's kernels differ from the eager pass's (count or names): left with the replay.
    Mismatch(String),
}

impl Attribution {
    /// The profile's line on how a replay's kernels were tied to ops; `in_order`: branches the
    /// graph keeps in step order here (where `infer` overlaps them with the steps before them).
    pub fn describe(&self, in_order: usize) -> String {
        let matched = "each replay's kernels matched the eager pass's, in order: each is its op's";
        match (self, in_order) {
            (Attribution::Matched, 0) => matched.to_string(),
            (Attribution::Matched, n) => format!(
                "{matched} (the graph runs in step order here; `infer`'s overlaps {n} branches \
                 with the steps before them)"
            ),
            (Attribution::Mismatch(why), _) => format!("kernels left with the replay: {why}"),
        }
    }
}

/// Splits each graph replay op of `replays` into the ops of the eager pass `eager` (one step,
/// recorded with CUPTI): the replay runs the same kernels in the same order on one stream, so
/// the i-th kernel of a replay belongs to the op the i-th eager kernel did. Each replay op
/// stays as a launch-only op (its host time, no GPU span); the eager ops are added once per
/// replay with the GPU span of their kernels and no host time (a graph launches nothing op by
/// op).
pub fn attribute_graph(eager: &Records, replays: &Records) -> (Records, Attribution) {
    let sequence: Vec<(usize, &str)> = eager
        .kernels
        .iter()
        .filter_map(|k| k.op.map(|o| (o, k.name.as_str())))
        .collect();
    let mut out = Records {
        ops: Vec::new(),
        steps: Vec::new(),
        kernels: Vec::new(),
    };
    for (ri, replay) in replays.ops.iter().enumerate() {
        let ks: Vec<&KernelRecord> = replays
            .kernels
            .iter()
            .filter(|k| k.op == Some(ri))
            .collect();
        let names_match =
            ks.len() == sequence.len() && ks.iter().zip(&sequence).all(|(k, (_, n))| k.name == *n);
        if !names_match {
            let why = format!(
                "a replay ran {} kernels, the eager pass {}{}",
                ks.len(),
                sequence.len(),
                if ks.len() == sequence.len() {
                    " (names differ)"
                } else {
                    ""
                }
            );
            return (replays.clone(), Attribution::Mismatch(why));
        }
        let step = replays.steps.get(ri).copied().unwrap_or(0);
        let launch = OpRecord {
            gpu: None,
            ..replay.clone()
        };
        out.ops.push(launch);
        out.steps.push(step);
        let base = out.ops.len();
        for o in &eager.ops {
            out.ops.push(OpRecord {
                cpu: Span {
                    start_us: replay.cpu.start_us,
                    dur_us: 0.0,
                },
                gpu: None,
                ..o.clone()
            });
            out.steps.push(step);
        }
        for (k, (eager_op, _)) in ks.iter().zip(&sequence) {
            let op = base + eager_op;
            let g = &mut out.ops[op].gpu;
            *g = Some(match *g {
                None => k.gpu,
                Some(s) => span(
                    s.start_us.min(k.gpu.start_us),
                    s.end_us().max(k.gpu.end_us()),
                ),
            });
            out.ops[op].stream = k.stream;
            out.kernels.push(KernelRecord {
                op: Some(op),
                ..(*k).clone()
            });
        }
    }
    (out, Attribution::Matched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_cuda::profiler::{ActivityKind, RecordedOp};

    fn info(name: &str) -> OpInfo {
        OpInfo {
            name: name.into(),
            layer: Some(format!("{name}.layer")),
            detail: String::new(),
            library: "test".into(),
            flops: 1.0,
            bytes: 1.0,
            dtype: "f16".into(),
        }
    }

    fn act(name: &str, stream: u32, a: f64, b: f64, op: Option<usize>) -> Activity {
        Activity {
            kind: ActivityKind::Kernel,
            name: name.into(),
            stream,
            start_us: a,
            end_us: b,
            op,
            bytes: 0,
        }
    }

    fn recorded(name: &str, step: usize, cpu: (f64, f64)) -> RecordedOp {
        RecordedOp {
            info: info(name),
            step,
            cpu_start_us: cpu.0,
            cpu_end_us: cpu.1,
            gpu: None,
        }
    }

    fn recording(ops: Vec<RecordedOp>, activities: Vec<Activity>) -> Recording {
        Recording {
            timing: Timing::Cupti,
            ops,
            activities,
            pool: Vec::new(),
            nvtx: false,
            wall_us: 100.0,
            dropped: 0,
            fallback: None,
        }
    }

    #[test]
    fn a_kernel_started_early_is_timed_from_the_end_of_the_one_ahead() {
        // stream 7: k1 0-10, k2 scheduled at 8 (early) ending 14, k3 from 15; stream 9 apart
        let acts = vec![
            act("k2", 7, 8.0, 14.0, Some(1)),
            act("k1", 7, 0.0, 10.0, Some(0)),
            act("other", 9, 9.0, 12.0, None),
            act("k3", 7, 15.0, 16.0, Some(2)),
            act("inside", 7, 15.2, 15.5, None),
        ];
        assert_eq!(own_starts(&acts), vec![10.0, 0.0, 9.0, 15.0, 15.5]);
        let r = recording(
            vec![
                recorded("a", 0, (0.0, 1.0)),
                recorded("b", 0, (1.0, 2.0)),
                recorded("c", 0, (2.0, 3.0)),
            ],
            acts,
        );
        let rec = records(&r);
        let b = rec.ops[1].gpu.expect("b ran a kernel");
        assert_eq!((b.start_us, b.dur_us), (10.0, 4.0));
        assert_eq!(rec.kernels[0].gpu.dur_us, 4.0);
        assert_eq!(rec.kernels[2].gpu.dur_us, 3.0);
    }

    #[test]
    fn ops_span_their_kernels_and_streams_are_numbered_by_first_use() {
        let r = recording(
            vec![
                recorded("conv", 0, (0.0, 5.0)),
                recorded("pool", 0, (5.0, 6.0)),
            ],
            vec![
                act("a", 17, 10.0, 20.0, Some(0)),
                act("b", 17, 21.0, 30.0, Some(0)),
                act("c", 9, 31.0, 32.0, Some(1)),
                act("orphan", 9, 40.0, 41.0, None),
            ],
        );
        let rec = records(&r);
        assert_eq!(rec.ops[0].gpu, Some(span(10.0, 30.0)));
        assert_eq!((rec.ops[0].stream, rec.ops[1].stream), (0, 1));
        assert_eq!(rec.kernels[3].op, None);
        assert_eq!(rec.kernels[2].stream, 1);
        assert_eq!(rec.ops[1].cpu, span(5.0, 6.0));
    }

    #[test]
    fn a_replays_kernels_go_to_the_eager_ops_in_order() {
        let eager = records(&recording(
            vec![
                recorded("conv", 0, (0.0, 1.0)),
                recorded("pool", 0, (1.0, 2.0)),
            ],
            vec![
                act("k1", 5, 10.0, 11.0, Some(0)),
                act("k2", 5, 11.0, 12.0, Some(0)),
                act("k3", 5, 12.0, 13.0, Some(1)),
            ],
        ));
        let replays = records(&recording(
            vec![
                recorded("graph replay", 0, (50.0, 51.0)),
                recorded("graph replay", 1, (51.0, 52.0)),
            ],
            vec![
                act("k1", 5, 60.0, 61.0, Some(0)),
                act("k2", 5, 61.0, 62.0, Some(0)),
                act("k3", 5, 62.0, 63.0, Some(0)),
                act("k1", 5, 63.0, 64.0, Some(1)),
                act("k2", 5, 64.0, 65.0, Some(1)),
                act("k3", 5, 65.0, 66.0, Some(1)),
            ],
        ));
        let (out, how) = attribute_graph(&eager, &replays);
        assert_eq!(how, Attribution::Matched);
        // per replay: the launch, then conv and pool
        assert_eq!(out.ops.len(), 6);
        assert_eq!(out.steps, vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(out.ops[0].gpu, None);
        assert_eq!(out.ops[1].name, "conv");
        assert_eq!(out.ops[1].gpu, Some(span(60.0, 62.0)));
        assert_eq!(out.ops[5].gpu, Some(span(65.0, 66.0)));
        assert!(out.kernels.iter().all(|k| k.op.is_some()));
        assert_eq!(out.kernels[5].op, Some(5));
        // a replay that ran other kernels is left as it was, and says why
        let mut other = replays.clone();
        other.kernels[1].name = "k9".into();
        let (kept, how) = attribute_graph(&eager, &other);
        assert_eq!(kept, other);
        assert!(matches!(how, Attribution::Mismatch(w) if w.contains("names differ")));
    }
}
