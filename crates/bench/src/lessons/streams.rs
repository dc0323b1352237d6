//! The optimisation guide's patterns: independent work on two streams, a copy beside a kernel,
//! a three-stage pipeline over chunks (overlap read from event timestamps); timing with and
//! without synchronising; a launch-bound loop eager and as one CUDA graph.

use super::notebook::{title, Work};
use super::{Bench, Case, Lesson, Overlap, Verdict};
use crate::error::{Error, Result};
use crate::stats::Summary;
use gpukit_cuda::blas::Blas;
use gpukit_cuda::transfer::{copy_pinned_range_to, copy_pinned_to, copy_to_pinned, PinnedBytes};
use gpukit_cuda::{Event, Gpu, Stream};
use gpukit_tensor::kernels::{tensor_ops, Arith, Strided};
use gpukit_tensor::{DType, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// Runs after this many untimed repeats ...
const WARMUPS: usize = 2;
/// ... and reports the median of this many.
const REPEATS: usize = 5;

/// Time covered by at least two of the spans (a sweep over their ends).
pub(crate) fn overlap_time(spans: &[(f64, f64)]) -> f64 {
    let mut points: Vec<(f64, i32)> = spans.iter().flat_map(|&(b, e)| [(b, 1), (e, -1)]).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut depth, mut last, mut total) = (0, 0.0, 0.0);
    for (t, d) in points {
        if depth >= 2 {
            total += t - last;
        }
        depth += d;
        last = t;
    }
    total
}

fn gpu_of(b: &Bench) -> Result<Arc<Gpu>> {
    b.gpu.clone().ok_or(Error::Failed("no GPU".into()))
}

/// One repeat of serial and overlapped work: (serial ms, overlapped ms, labelled spans).
type Repeat = (f64, f64, Vec<(String, f64, f64)>);

/// The median repeat (by overlapped time) of `run`, after the warm-ups.
fn median_repeat(run: &mut dyn FnMut() -> Result<Repeat>) -> Result<Repeat> {
    for _ in 0..WARMUPS {
        run()?;
    }
    let mut all = (0..REPEATS).map(|_| run()).collect::<Result<Vec<_>>>()?;
    all.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(all.swap_remove(REPEATS / 2))
}

fn ms(from: &Event, to: &Event) -> Result<f64> {
    Ok(from.elapsed_ms(to)?)
}

/// `times` products `p <- p * w` (n x n, f32 without tensor cores), alternating two buffers.
fn chain(blas: &Blas, p: &Tensor, q: &Tensor, w: &Tensor, n: usize, times: usize) -> Result<()> {
    let (pv, qv, wv) = (p.device_view()?, q.device_view()?, w.device_view()?);
    for i in 0..times {
        let (src, dst) = if i % 2 == 0 { (pv, qv) } else { (qv, pv) };
        blas.gemm_views(DType::F32, src, wv, dst, (n, n, n))?;
    }
    Ok(())
}

fn overlap_of(name: &str, what: &str, r: Repeat, agree: Option<bool>) -> Overlap {
    let spans: Vec<(f64, f64)> = r.2.iter().map(|(_, b, e)| (*b, *e)).collect();
    Overlap {
        name: name.into(),
        what: what.into(),
        serial_ms: r.0,
        overlapped_ms: r.1,
        overlap_ms: overlap_time(&spans),
        intervals_ms: r.2,
        agree,
        pytorch_serial_ms: None,
        pytorch_overlapped_ms: None,
        pytorch_overlap_ms: None,
    }
}

/// The streams lesson: two independent chains of products, a copy beside products, and a
/// copy-in / compute / copy-out pipeline over chunks.
pub(crate) fn streams(b: &Bench) -> Result<Lesson> {
    let mut l = Lesson::new(
        "streams",
        title("streams"),
        "CUDA streams allow overlapping computation and data transfer (guide: streams, pinned \
         memory, pipeline parallelism)",
        None,
    );
    let gpu = gpu_of(b)?;
    let (s1, s2) = (gpu.new_stream()?, gpu.new_stream()?);
    let blas1 = Blas::on_stream(&b.discovery, &gpu, &s1, 32 << 20)?;
    let blas2 = Blas::on_stream(&b.discovery, &gpu, &s2, 32 << 20)?;

    // 1. two independent chains of 16 products of 512 x 512
    let n = 512;
    let make =
        |scale: f64| -> Result<Tensor> { Ok(b.randn(&[n, n], DType::F32)?.mul_scalar(scale)?) };
    let (p1, q1, w1) = (make(1.0)?, make(1.0)?, make(0.04)?);
    let (p2, q2, w2) = (make(1.0)?, make(1.0)?, make(0.04)?);
    gpu.synchronize()?;
    let r = median_repeat(&mut || {
        // serial: both chains on one stream
        let a = s1.record_timed()?;
        chain(&blas1, &p1, &q1, &w1, n, 16)?;
        chain(&blas1, &p2, &q2, &w2, n, 16)?;
        let z = s1.record_timed()?;
        z.synchronize()?;
        let serial = ms(&a, &z)?;
        // overlapped: one chain a stream, both after one start mark
        let start = s1.record_timed()?;
        s2.wait(&start)?;
        let b1 = s1.record_timed()?;
        chain(&blas1, &p1, &q1, &w1, n, 16)?;
        let e1 = s1.record_timed()?;
        let b2 = s2.record_timed()?;
        chain(&blas2, &p2, &q2, &w2, n, 16)?;
        let e2 = s2.record_timed()?;
        e1.synchronize()?;
        e2.synchronize()?;
        let spans = vec![
            ("stream 1".to_string(), ms(&start, &b1)?, ms(&start, &e1)?),
            ("stream 2".to_string(), ms(&start, &b2)?, ms(&start, &e2)?),
        ];
        let total = spans.iter().map(|s| s.2).fold(0.0, f64::max);
        Ok((serial, total, spans))
    })?;
    l.overlaps.push(overlap_of(
        "two-streams",
        "two independent chains of 16 products (512 x 512, f32), one stream against one each",
        r,
        None,
    ));

    // 2. a 64 MiB copy from pinned memory beside 8 products of 4096 x 4096
    let len = 64 << 20;
    let mut pinned = PinnedBytes::new(&gpu, len, false)?;
    gpukit_tensor::random::fill_bytes(pinned.as_mut_slice(), 7);
    let dst = Tensor::zeros_on(&[len / 4], DType::F32, b.device, &b.devices)?;
    let big = 4096;
    let (pa, pb, pw) = (
        b.randn(&[big, big], DType::F32)?,
        b.randn(&[big, big], DType::F32)?,
        b.randn(&[big, big], DType::F32)?.mul_scalar(0.01)?,
    );
    gpu.synchronize()?;
    let r = median_repeat(&mut || {
        let a = s1.record_timed()?;
        copy_pinned_to(&s1, &pinned, len, dst.device_view()?)?;
        chain(&blas1, &pa, &pb, &pw, big, 8)?;
        let z = s1.record_timed()?;
        z.synchronize()?;
        let serial = ms(&a, &z)?;
        let start = s1.record_timed()?;
        s2.wait(&start)?;
        let bc = s2.record_timed()?;
        copy_pinned_to(&s2, &pinned, len, dst.device_view()?)?;
        let ec = s2.record_timed()?;
        let bk = s1.record_timed()?;
        chain(&blas1, &pa, &pb, &pw, big, 8)?;
        let ek = s1.record_timed()?;
        ec.synchronize()?;
        ek.synchronize()?;
        let spans = vec![
            ("copy".to_string(), ms(&start, &bc)?, ms(&start, &ec)?),
            ("compute".to_string(), ms(&start, &bk)?, ms(&start, &ek)?),
        ];
        let total = spans.iter().map(|s| s.2).fold(0.0, f64::max);
        Ok((serial, total, spans))
    })?;
    l.overlaps.push(overlap_of(
        "copy-compute",
        "a 64 MiB host->device copy from pinned memory beside 8 products of 4096 x 4096 (f32)",
        r,
        None,
    ));

    // 3. pipeline: 8 chunks of 8 MiB, each copied in, computed on, copied out
    let (chunks, chunk_bytes) = (8usize, 8usize << 20);
    let elems = chunk_bytes / 4;
    let mut host_in = PinnedBytes::new(&gpu, chunks * chunk_bytes, false)?;
    let init: Vec<f32> = gpukit_tensor::random::uniform_f32(chunks * elems, 11);
    host_in
        .as_mut_slice()
        .copy_from_slice(gpukit_tensor::codec::bytes_of(&init));
    let mut outs: Vec<PinnedBytes> = (0..chunks)
        .map(|_| PinnedBytes::new(&gpu, chunk_bytes, false).map_err(Error::from))
        .collect::<Result<_>>()?;
    let dev: Vec<Tensor> = (0..chunks)
        .map(|_| Tensor::zeros_on(&[elems], DType::F32, b.device, &b.devices).map_err(Error::from))
        .collect::<Result<_>>()?;
    let ops = tensor_ops(&gpu)?;
    let strides = [1usize];
    let pipelined_streams = [s1.clone(), s2.clone(), gpu.new_stream()?];
    // stage by stage on one stream, each stage's time from events
    let mut stage_ms = [0f64; 3];
    let run_chunk =
        |i: usize, s: &Stream, outs: &mut [PinnedBytes], marks: bool| -> Result<Vec<Event>> {
            let mut ev = Vec::new();
            let view = dev[i].device_view()?;
            if marks {
                ev.push(s.record_timed()?);
            }
            copy_pinned_range_to(s, &host_in, i * chunk_bytes, chunk_bytes, view)?;
            if marks {
                ev.push(s.record_timed()?);
            }
            let op = Strided::new(view, &strides);
            for _ in 0..10 {
                ops.kernels
                    .scalar(s, Arith::Mul, DType::F32, &[elems], (op, op), 1.0001)?;
                ops.kernels
                    .scalar(s, Arith::Add, DType::F32, &[elems], (op, op), 0.5)?;
            }
            if marks {
                ev.push(s.record_timed()?);
            }
            copy_to_pinned(s, view, &mut outs[i], chunk_bytes)?;
            if marks {
                ev.push(s.record_timed()?);
            }
            Ok(ev)
        };
    let mut serial_out: Vec<Vec<u8>> = Vec::new();
    let mut agree = true;
    let r = median_repeat(&mut || {
        let a = s1.record_timed()?;
        let mut marks = Vec::new();
        for i in 0..chunks {
            marks.push(run_chunk(i, &s1, &mut outs, true)?);
        }
        let z = s1.record_timed()?;
        z.synchronize()?;
        let serial = ms(&a, &z)?;
        stage_ms = [0.0; 3];
        for m in &marks {
            for (k, st) in stage_ms.iter_mut().enumerate() {
                *st += ms(&m[k], &m[k + 1])?;
            }
        }
        serial_out = outs.iter().map(|o| o.as_slice().to_vec()).collect();
        let start = s1.record_timed()?;
        for s in &pipelined_streams[1..] {
            s.wait(&start)?;
        }
        let mut ends = Vec::new();
        for i in 0..chunks {
            let s = &pipelined_streams[i % 3];
            let begin = s.record_timed()?;
            run_chunk(i, s, &mut outs, false)?;
            ends.push((i, begin, s.record_timed()?));
        }
        let mut spans = Vec::new();
        for (i, begin, end) in &ends {
            end.synchronize()?;
            spans.push((format!("chunk {i}"), ms(&start, begin)?, ms(&start, end)?));
        }
        agree &= outs
            .iter()
            .zip(&serial_out)
            .all(|(o, s)| o.as_slice() == s.as_slice());
        let total = spans.iter().map(|s| s.2).fold(0.0, f64::max);
        Ok((serial, total, spans))
    })?;
    if !agree {
        return Err(Error::Failed(
            "streams: the pipelined output differs from the serial one".into(),
        ));
    }
    l.overlaps.push(overlap_of(
        "pipeline",
        "8 chunks of 8 MiB: copy in (pinned), 20 elementwise passes, copy out; one stream \
         against a chunk a stream over three",
        r,
        Some(agree),
    ));
    l.evidence.push(format!(
        "pipeline stages on one stream: copy in {:.2} ms, compute {:.2} ms, copy out {:.2} ms",
        stage_ms[0], stage_ms[1], stage_ms[2]
    ));
    let mut parts = Vec::new();
    for o in &l.overlaps {
        parts.push(format!(
            "{}: {:.2} ms serial, {:.2} ms overlapped ({:.2}x), {:.2} ms of overlap",
            o.name,
            o.serial_ms,
            o.overlapped_ms,
            o.serial_ms / o.overlapped_ms,
            o.overlap_ms
        ));
    }
    l.evidence.extend(parts);
    let best = l
        .overlaps
        .iter()
        .map(|o| o.serial_ms / o.overlapped_ms)
        .fold(0.0, f64::max);
    let (two, two_overlap) = l.overlaps.first().map_or((f64::NAN, f64::NAN), |o| {
        (o.serial_ms / o.overlapped_ms, o.overlap_ms)
    });
    l.verdict = Verdict::of_speedup(best);
    l.reason = format!(
        "overlap is measured from event timestamps: the best pattern here saves {:.0}% of the \
         serial time; two independent chains of products gained {two:.2}x (their spans \
         overlapped {two_overlap:.3} ms): streams pay where one stream leaves an engine idle \
         (a copy beside compute, a pipeline's stages)",
        100.0 * (1.0 - 1.0 / best)
    );
    Ok(l)
}

fn manual_case(b: &Bench, name: &str, what: &str, samples: &[f64], work: Work) -> Result<Case> {
    let ms = Summary::of(samples).ok_or(Error::NoSamples)?;
    Ok(b.measured(name, what, "f32", work, ms, 1))
}

/// Timing a 4096 x 4096 product without synchronising (the wrong number), with, and by events.
pub(crate) fn sync(b: &Bench) -> Result<Lesson> {
    let mut l = Lesson::new(
        "sync",
        title("sync"),
        "always synchronize before timing: GPU calls return before the work is done",
        None,
    );
    let gpu = gpu_of(b)?;
    let n = 4096;
    let a = b.randn(&[n, n], DType::F32)?;
    let flops = 2.0 * (n as f64).powi(3);
    let work = Work {
        flops,
        bytes: 3.0 * (n * n * 4) as f64,
        launches: 1,
        host: false,
    };
    for _ in 0..3 {
        let _ = a.matmul(&a)?;
    }
    gpu.synchronize()?;
    let (mut unsynced, mut synced, mut events) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..b.samples {
        let t = Instant::now();
        let c = a.matmul(&a)?;
        unsynced.push(t.elapsed().as_secs_f64() * 1e3);
        gpu.synchronize()?;
        drop(c);
        let t = Instant::now();
        let c = a.matmul(&a)?;
        gpu.synchronize()?;
        synced.push(t.elapsed().as_secs_f64() * 1e3);
        drop(c);
        let e0 = gpu.stream().record_timed()?;
        let c = a.matmul(&a)?;
        let e1 = gpu.stream().record_timed()?;
        e1.synchronize()?;
        events.push(e0.elapsed_ms(&e1)?);
        drop(c);
    }
    let mut launch_only = work;
    launch_only.flops = 0.0;
    launch_only.bytes = 0.0;
    l.cases.push(manual_case(
        b,
        "unsynchronized",
        "t0; c = a @ a; t1 (no synchronize): the launch",
        &unsynced,
        launch_only,
    )?);
    l.cases.push(manual_case(
        b,
        "synchronized",
        "t0; c = a @ a; synchronize; t1",
        &synced,
        work,
    )?);
    l.cases.push(manual_case(
        b,
        "events",
        "CUDA events around c = a @ a",
        &events,
        work,
    )?);
    let (u, s, e) = (
        l.cases[0].ms.median,
        l.cases[1].ms.median,
        l.cases[2].ms.median,
    );
    l.verdict = if s / u >= 2.0 {
        Verdict::Holds
    } else {
        Verdict::HoldsWeakly
    };
    l.reason = format!(
        "without synchronising the timer reads {:.1} us, the launch; the product takes {e:.3} ms \
         on the GPU (events) and {s:.3} ms from the host with a synchronize: the unsynchronised \
         figure is {:.0}x too small",
        u * 1e3,
        s / u
    );
    Ok(l)
}

/// 200 tiny in-place adds launched one by one, or replayed as one CUDA graph.
pub(crate) fn graphs(b: &Bench) -> Result<Lesson> {
    let mut l = Lesson::new(
        "graphs",
        title("graphs"),
        "capture CUDA operations into a graph for replay: much faster for repeated patterns",
        None,
    );
    let gpu = gpu_of(b)?;
    let ops = 200;
    let mut x = Tensor::zeros_on(&[1024], DType::F32, b.device, &b.devices)?;
    let work = Work {
        flops: (ops * 1024) as f64,
        bytes: (ops * 1024 * 8) as f64,
        launches: ops,
        host: false,
    };
    l.cases.push(b.case(
        "eager",
        "200 x x.add_(1.0) on 1024 values, launched one by one",
        "f32",
        work,
        &mut || {
            for _ in 0..ops {
                x.add_scalar_assign(1.0)?;
            }
            Ok(())
        },
    )?);
    let graph = gpu.capture(|| {
        for _ in 0..ops {
            x.add_scalar_assign(1.0)?;
        }
        Ok::<(), Error>(())
    })?;
    let mut one_launch = work;
    one_launch.launches = 1;
    l.cases.push(b.case(
        "graph",
        "the same 200 adds captured once, replayed as one CUDA graph",
        "f32",
        one_launch,
        &mut || Ok(graph.launch()?),
    )?);
    // from zero, 3 replays make every value 600
    let zero = Tensor::zeros(&[1024], DType::F32)?;
    x.write(&zero)?;
    for _ in 0..3 {
        graph.launch()?;
    }
    gpu.synchronize()?;
    let v = x.to_vec_f32()?;
    if v.iter().any(|&e| e != 600.0) {
        return Err(Error::Failed(format!(
            "graphs: 3 replays of 200 adds gave {} instead of 600",
            v[0]
        )));
    }
    l.evidence
        .push("3 replays of the graph from zero give exactly 600 in every element".into());
    super::judge_speedup(&mut l, "eager", "graph");
    if let Some(c) = l.case("eager") {
        l.evidence.push(format!(
            "eager: {:.1} us a launch; the GPU work of each add is well under a microsecond",
            c.ms.median * 1e3 / ops as f64
        ));
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::overlap_time;

    #[test]
    fn overlap_counts_time_under_two_spans() {
        assert_eq!(overlap_time(&[(0.0, 2.0), (1.0, 3.0)]), 1.0);
        assert_eq!(overlap_time(&[(0.0, 1.0), (2.0, 3.0)]), 0.0);
        // nested, and three at once counted once
        assert_eq!(overlap_time(&[(0.0, 4.0), (1.0, 2.0)]), 1.0);
        assert_eq!(overlap_time(&[(0.0, 3.0), (1.0, 3.0), (2.0, 3.0)]), 2.0);
        // touching ends do not overlap
        assert_eq!(overlap_time(&[(0.0, 1.0), (1.0, 2.0)]), 0.0);
    }
}
