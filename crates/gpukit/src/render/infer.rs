//! `gpukit infer`: the setup, one table per batch size with its best and one-at-a-time lines,
//! PyTorch's own rows; and `infer --input`'s logits table.

use super::fmt::{grouped, mib, times};
use super::power::{any_power, power_cells, power_header, power_note};
use super::{results_table, status_cell, Columns, Section};
use gpukit_bench::report::RowStatus;

/// "best at batch 32: fp16-nhwc-graph 12,345 img/s, 3.1x fp32 eager, 250x CPU f32".
fn infer_best_line(b: &gpukit_bench::infer::InferRow) -> String {
    let mut line = format!(
        "best at batch {}: {} {} img/s",
        b.batch,
        b.strategy,
        grouped(b.images_per_s.unwrap_or(0.0))
    );
    if let Some(x) = b.speedup_vs_fp32_eager {
        line.push_str(&format!(", {} fp32 eager", times(Some(x))));
    }
    if let Some(x) = b.speedup_vs_reference {
        line.push_str(&format!(", {} gpukit's CPU f32", times(Some(x))));
    }
    line
}

/// "one image at a time at batch 32: fp16-nhwc-graph as 32 batch-1 graph replays, 1,234 img/s;
/// batched, 8.00x the images/s" (a one-at-a-time row that passed).
fn infer_one_at_a_time_line(r: &gpukit_bench::infer::InferRow) -> String {
    let batched = r
        .strategy
        .strip_suffix(gpukit_bench::infer::ONE_AT_A_TIME)
        .unwrap_or(&r.strategy);
    let passes = if batched.ends_with("-graph") {
        "graph replays"
    } else {
        "eager passes"
    };
    let mut line = format!(
        "one image at a time at batch {0}: {batched} as {0} batch-1 {passes}, {1} img/s",
        r.batch,
        grouped(r.images_per_s.unwrap_or(0.0))
    );
    if let Some(g) = r.batching_gain {
        line.push_str(&format!("; batched, {} the images/s", times(Some(g))));
    }
    line
}

fn infer_setup(r: &gpukit_bench::infer::InferReport, gpu_rows: bool) -> Section {
    use gpukit_bench::infer::{is_one_at_a_time, CPU_CHECK_IMAGES, GPU_WARMUP};
    let gpu = match (&r.gpu_device, &r.gpu_unavailable) {
        (Some(d), _) => d.clone(),
        (None, Some(why)) => format!("GPU rows absent: {why}"),
        (None, None) if gpu_rows => "?".into(),
        (None, None) => "not selected".into(),
    };
    let mut rows = vec![
        (
            "Model",
            format!(
                "{} ({} parameters), weights: {}",
                r.model,
                grouped(r.parameters as f64),
                r.weights
            ),
        ),
        (
            "Input",
            format!(
                "{0}x{0} random RGB images in [-1, 1); every strategy at one batch size gets the same batch",
                r.image_size
            ),
        ),
        (
            "CPU",
            format!(
                "{} threads, convolutions by {}; ONNX Runtime {}",
                r.cpu_threads,
                if r.cpu_kernel.is_empty() {
                    "gpukit's CPU kernels"
                } else {
                    r.cpu_kernel.as_str()
                },
                match &r.onnxruntime_unavailable {
                    Some(why) => format!("rows skipped: {why}"),
                    None => "on the same weights (exported to ONNX)".into(),
                }
            ),
        ),
        ("GPU", gpu),
    ];
    if let Some(t) = &r.tensorrt {
        rows.push(("TensorRT", t.clone()));
    }
    let singles = r.rows.iter().any(is_one_at_a_time);
    let mut checks =
        "ONNX Runtime against gpukit's f32 CPU path (max rel. diff <= 1e-3 and the same top-1)"
            .to_string();
    if gpu_rows {
        checks.push_str(&format!(
            "; GPU fp32 NCHW eager against gpukit's CPU forward on the first {CPU_CHECK_IMAGES} images (<= 1e-4), every other GPU strategy against those GPU fp32 logits on the whole batch (fp32 1e-4, tf32 1e-2, fp16 1e-2, bf16 5e-2). A row over its tolerance fails and shows no speed; top-1 agreement is shown, not judged (random weights give close logits)"
        ));
        let mut timing = format!(
            "CPU rows: host clock; GPU rows: CUDA events around each pass (after {GPU_WARMUP} warm-up passes and at least 100 ms of untimed ones), eager = call by call, graph = one CUDA graph launch. GPU memory: the engine's own accounting (weights + activation arena + largest cuDNN workspace)"
        );
        if singles {
            timing.push_str(&format!(
                ". {} rows: the batch's N images as N batch-1 passes back to back (eager, or N graph replays), timed together; every pass runs on the batch's first image, uploaded once and resident on the GPU; images/s = N / their time; GPU memory at batch 1",
                gpukit_bench::infer::ONE_AT_A_TIME.trim_start_matches('-')
            ));
            checks.push_str(
                "; one-at-a-time rows: the last pass's logits against the same strategy's batched logits of that first image (its tolerance)",
            );
        }
        rows.push(("Timing", timing));
    }
    rows.push(("Checks", checks));
    Section::kv(format!("Inference: {}", r.model), rows)
}

/// A setup list, then one table per batch size with the best GPU strategy under it.
pub fn infer_sections(r: &gpukit_bench::infer::InferReport) -> Vec<Section> {
    use gpukit_bench::infer::{best_gpu_rows, is_gpu_row, is_one_at_a_time, InferRow};
    let gpu = r.rows.iter().any(is_gpu_row);
    let mut out = vec![infer_setup(r, gpu)];
    let mut batches: Vec<usize> = r.rows.iter().map(|x| x.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let best = best_gpu_rows(&r.rows);
    let power = any_power(r.rows.iter().map(|x| x.power.as_ref()));
    let power_header = power_header("images");
    let mut measured: Vec<&str> = if gpu {
        vec![
            "median ms (p10-p90)",
            "images/s",
            "vs fp32 eager",
            "vs CPU f32",
            "GPU memory",
            "max rel. diff (tolerance)",
            "top-1 agree",
        ]
    } else {
        vec![
            "median ms (p10-p90)",
            "images/s",
            "vs CPU f32",
            "max rel. diff (tolerance)",
            "top-1 agree",
        ]
    };
    if power {
        measured.extend(power_header.iter().map(String::as_str));
    }
    for n in batches {
        let rows: Vec<&InferRow> = r.rows.iter().filter(|x| x.batch == n).collect();
        let (header, body) = results_table(
            &rows,
            Columns {
                naming: &["strategy", "device"],
                measured: &measured,
                rate_unit: "images/s",
                name: &|x: &&InferRow| vec![x.strategy.clone(), x.device.clone()],
                status: &|x| &x.status,
                values: &|x| {
                    let mut cells = vec![
                        x.timing
                            .as_ref()
                            .map(|t| {
                                let s = &t.summary_ms;
                                format!("{:.3} ({:.3}-{:.3}) n={}", s.median, s.p10, s.p90, s.count)
                            })
                            .unwrap_or_default(),
                        x.images_per_s.map(grouped).unwrap_or_default(),
                    ];
                    if gpu {
                        cells.push(times(x.speedup_vs_fp32_eager));
                    }
                    cells.push(times(x.speedup_vs_reference));
                    if gpu {
                        cells.push(x.gpu_memory_bytes.map(mib).unwrap_or_default());
                    }
                    cells.push(match (&x.agreement, x.tolerance) {
                        (Some(a), Some(t)) => format!("{:.1e} ({t:.0e})", a.max_rel),
                        (Some(a), None) => format!("{:.1e}", a.max_rel),
                        (None, _) => "reference".into(),
                    });
                    cells.push(
                        x.agreement
                            .as_ref()
                            .map(|a| format!("{:.0}%", a.top1 * 100.0))
                            .unwrap_or_default(),
                    );
                    if power {
                        cells.extend(power_cells(x.power.as_ref(), None, x.images_per_s));
                    }
                    cells
                },
                peer: &|x| x.pytorch.as_ref(),
                behind: None,
            },
        );
        let notes = best
            .iter()
            .filter(|b| b.batch == n)
            .map(|b| infer_best_line(b))
            .chain(
                rows.iter()
                    .filter(|x| is_one_at_a_time(x) && x.status == RowStatus::Ok)
                    .map(|x| infer_one_at_a_time_line(x)),
            )
            .chain(power.then(|| {
                power_note(
                    "images",
                    false,
                    &format!(
                        "over the last two of the {} ms stretches the same passes run again \
                         after the timed ones (until two agree within {}%, at most {})",
                        gpukit_bench::power::STRETCH_MS,
                        gpukit_bench::power::SETTLED * 100.0,
                        gpukit_bench::power::MAX_STRETCHES
                    ),
                )
            }))
            .collect();
        out.push(Section {
            title: format!("Inference at batch {n}"),
            header: Some(header),
            rows: body,
            notes,
        });
    }
    if !r.planning.is_empty() {
        let mut s = planning_section(&r.planning);
        s.notes
            .extend(r.cache_note.iter().map(|n| format!("warning: {n}")));
        out.push(s);
    }
    if let Some(p) = &r.pytorch {
        out.push(super::infer_pytorch::pytorch_infer_section(p));
    }
    out
}

/// How each GPU session's convolutions were planned and what it cost.
fn planning_section(planning: &[gpukit_bench::infer::Planning]) -> Section {
    let rows = planning
        .iter()
        .map(|p| {
            vec![
                p.what.clone(),
                p.search.name().to_string(),
                p.measured.to_string(),
                p.cached.to_string(),
                p.candidates_timed.to_string(),
                format!("{:.2}", p.seconds),
            ]
        })
        .collect();
    let total: f64 = planning.iter().map(|p| p.seconds).sum();
    Section {
        title: "Planning".into(),
        header: Some(
            [
                "session",
                "search",
                "convolutions chosen now",
                "from the cache",
                "candidates timed",
                "seconds",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes: vec![format!(
            "{total:.2} s in all preparing the GPU sessions (lowering, memory, choosing each \
             convolution's engine); fast: the few best of cuDNN's ranking timed, the finalists \
             confirmed in interleaved rounds; heuristic: cuDNN's first suggestion, untimed (the \
             fp32 reference of rows that are not fp32); choices are kept on disk for the next run \
             (--planning exhaustive times every candidate)"
        )],
    }
}

/// `infer --input`: each strategy's logits against the CPU's.
pub fn input_run_section(r: &gpukit_bench::infer::io::InputRun) -> Section {
    let rows = r
        .logits
        .iter()
        .map(|l| {
            let (check, top1) = match &l.agreement {
                Some(a) => (
                    format!("{:.1e}", a.max_rel),
                    format!("{:.0}%", a.top1 * 100.0),
                ),
                None if l.tensor == "logits" => ("reference".into(), String::new()),
                None => (String::new(), String::new()),
            };
            vec![
                l.strategy.clone(),
                l.tensor.clone(),
                check,
                l.tolerance.map(|t| format!("{t:.0e}")).unwrap_or_default(),
                top1,
                status_cell(&l.status).unwrap_or_else(|| "ok".into()),
            ]
        })
        .collect();
    let mut notes = vec![format!(
        "largest activation on the CPU's f32 pass: {:.3e}",
        r.largest_activation
    )];
    notes.extend(
        r.output
            .iter()
            .map(|o| format!("written to {o} (every strategy's logits, failed ones too)")),
    );
    Section {
        title: format!("Logits for {} {:?}", r.input, r.shape),
        header: Some(
            [
                "strategy",
                "tensor",
                "max rel. diff vs CPU f32",
                "tolerance",
                "top-1 agree",
                "verdict",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes,
    }
}
