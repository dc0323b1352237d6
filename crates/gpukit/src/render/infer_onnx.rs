//! `gpukit infer --onnx`: the model (file, opset, nodes before and after the passes, inputs and
//! outputs), its latency at the first batch size and its throughput at each, as trtexec's
//! summary gives them.

use super::fmt::{grouped, human_bytes, times};
use super::{results_table, Columns, Section};
use gpukit_bench::infer::onnx::{
    Float64Reference, OnnxRun, OnnxValue, Passes, GRAPH_CPU_ROW, TOLERANCE,
};
use gpukit_bench::infer::InferRow;
use gpukit_bench::report::RowStatus;

/// `input: float [batch, 3, 224, 224], [1, 3, 224, 224] at batch 1`.
fn value_line(v: &OnnxValue, batch: usize) -> String {
    let declared = if v.declared.is_empty() {
        "no declared shape".to_string()
    } else {
        format!("[{}]", v.declared.join(", "))
    };
    format!(
        "{}: {} {declared}, {:?} at batch {batch}",
        v.name, v.elem_type, v.shape
    )
}

/// `2 batch norms folded, 3 conv epilogues fused`, or that the passes changed nothing.
fn passes_line(p: &Passes) -> String {
    let done: Vec<String> = [
        (p.folded_constants, "node(s) folded into constants"),
        (
            p.folded_batch_norms,
            "batch norm(s) folded into convolutions",
        ),
        (p.gelus, "GELU chain(s) made one operator"),
        (p.silus, "x * sigmoid(x) pair(s) made one SiLU"),
        (
            p.fused_epilogues,
            "activation(s)/residual Add(s) fused into convolutions",
        ),
        (p.squeeze_excites, "squeeze-excitation block(s) recognised"),
        (p.dead_nodes, "dead node(s) removed"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if done.is_empty() {
        "the passes changed nothing".into()
    } else {
        done.join(", ")
    }
}

fn setup(r: &OnnxRun) -> Section {
    let m = &r.model;
    let file_name = std::path::Path::new(&m.file)
        .file_name()
        .map_or(m.file.clone(), |n| n.to_string_lossy().into_owned());
    let mut model = format!(
        "{} ({}), opset {}",
        m.file,
        human_bytes(usize::try_from(m.file_bytes).unwrap_or(usize::MAX)),
        m.opset
    );
    if !m.producer.is_empty() {
        model.push_str(&format!(", written by {}", m.producer));
    }
    model.push_str(&format!(
        "; {} constant elements (weights)",
        grouped(m.parameters as f64)
    ));
    if m.external_data {
        model.push_str(", in external data files");
    }
    let mut rows = vec![
        ("Model", model),
        (
            "Graph",
            format!(
                "{} nodes in the file, {} imported, {} after gpukit's passes: {}",
                m.nodes_in_file,
                m.nodes_imported,
                m.nodes_optimized,
                passes_line(&m.passes)
            ),
        ),
    ];
    for v in &m.inputs {
        rows.push(("Input", value_line(v, m.batch)));
    }
    for v in &m.outputs {
        rows.push(("Output", value_line(v, m.batch)));
    }
    rows.push(("Input values", r.input.clone()));
    if let Some(c) = &r.passes_check {
        let figure = c
            .agreement
            .as_ref()
            .map(|a| format!("max rel. diff {:.1e} (<= {:.0e})", a.max_rel, c.tolerance))
            .unwrap_or_default();
        rows.push((
            "Passes check",
            match &c.status {
                RowStatus::Ok => format!(
                    "the graph as imported and as optimized agree at batch {}: {figure}",
                    c.batch
                ),
                RowStatus::Failed(why) | RowStatus::Skipped(why) => {
                    format!("FAILED at batch {}: {why}", c.batch)
                }
            },
        ));
    }
    rows.push((
        "CPU",
        format!(
            "{} threads; ONNX Runtime {}",
            r.cpu_threads,
            match (&r.onnxruntime, &r.onnxruntime_unavailable) {
                (_, Some(why)) => format!("did not run ({why}): gpukit's rows are unchecked"),
                (Some(lib), None) => format!("from {lib}, on the file's bytes as they are"),
                (None, None) => "not asked for".into(),
            }
        ),
    ));
    rows.push((
        "GPU",
        match (&r.gpu_engine, &r.gpu) {
            (Some(engine), None) => engine.clone(),
            (_, Some(why)) => format!("no figures: {why}"),
            (None, None) => "not selected".into(),
        },
    ));
    rows.push((
        "Checks",
        format!(
            "every output of {GRAPH_CPU_ROW} against ONNX Runtime's on the same input: max \
             |diff| / max |ONNX Runtime| <= {TOLERANCE:.0e} (against float64 where the line \
             below says so), else the row fails and shows no speed"
        ),
    ));
    if !r.float64.is_empty() {
        rows.push(("Float64", float64_line(&r.float64)));
    }
    rows.push((
        "Timing",
        "CPU rows: host clock around each pass, after one warm-up pass (at most 10 s a row); \
         GPU rows: CUDA events around each of --gpu-iterations passes, after at least 100 ms \
         of untimed passes; samples/s = batch / median latency"
            .into(),
    ));
    Section::kv(format!("Inference: {file_name} (ONNX)"), rows)
}

/// What the fp32 GPU rows were judged against, and ONNX Runtime's own distance from it, by
/// batch size.
fn float64_line(refs: &[Float64Reference]) -> String {
    let each: Vec<String> = refs
        .iter()
        .map(|f| match (&f.unavailable, f.onnxruntime_max_rel) {
            (Some(why), _) => format!(
                "batch {}: none ({why}; fp32 rows judged against the f32 reference)",
                f.batch
            ),
            (None, Some(o)) => format!(
                "batch {}: ONNX Runtime's f32 is {o:.1e} from it{}",
                f.batch,
                seconds(f.seconds)
            ),
            (None, None) => format!(
                "batch {}: no ONNX Runtime outputs to compare{}",
                f.batch,
                seconds(f.seconds)
            ),
        })
        .collect();
    format!(
        "the graph run entirely in f64 on each batch size's input; f32 rows ({GRAPH_CPU_ROW}, \
         fp32 GPU rows) pass within {TOLERANCE:.0e} of it, or as close as ONNX Runtime's f32 \
         is (max rel. diff); {}",
        each.join("; ")
    )
}

/// ` (computed in 2.3 s)`, or nothing.
fn seconds(s: Option<f64>) -> String {
    s.map(|s| format!(" (computed in {s:.1} s)"))
        .unwrap_or_default()
}

/// The fp32 row's distance from float64 and what it may be: `1.2e-5 (1.5e-5)`.
fn float64_cell(x: &InferRow) -> String {
    x.float64
        .as_ref()
        .map(|c| format!("{:.1e} ({:.1e})", c.max_rel, c.tolerance))
        .unwrap_or_default()
}

/// trtexec's latency summary for the first batch size's timed rows.
fn latency(r: &OnnxRun) -> Option<Section> {
    let first = r.batch_sizes.first().copied()?;
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .filter(|x| x.batch == first)
        .filter_map(|x| {
            let s = &x.timing.as_ref()?.summary_ms;
            Some(vec![
                x.strategy.clone(),
                format!("{:.3}", s.min),
                format!("{:.3}", s.mean),
                format!("{:.3}", s.median),
                format!("{:.3}", s.p90),
                format!("{:.3}", s.max),
                s.count.to_string(),
            ])
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(Section {
        title: format!("Latency at batch {first} (ms)"),
        header: Some(
            ["strategy", "min", "mean", "median", "p90", "max", "passes"]
                .map(String::from)
                .to_vec(),
        ),
        rows,
        notes: vec![
            "percentiles of the timed passes; with this few, a p99 would be the max".into(),
        ],
    })
}

/// One row a strategy and batch size: latency, throughput, the check (and for fp32 GPU rows,
/// the float64 one, in a column of its own where there are such rows).
fn throughput(r: &OnnxRun) -> Section {
    let rows: Vec<&InferRow> = r.rows.iter().collect();
    let float64 = rows.iter().any(|x| x.float64.is_some());
    let measured: &[&str] = &[
        "median ms (p10-p90)",
        "samples/s",
        "vs gpukit",
        "max rel. diff vs ONNX Runtime (tolerance)",
        "vs float64 (tolerance)",
    ];
    let (header, body) = results_table(
        &rows,
        Columns {
            naming: &["strategy", "device", "batch"],
            measured: &measured[..measured.len() - usize::from(!float64)],
            rate_unit: "samples/s",
            name: &|x: &&InferRow| vec![x.strategy.clone(), x.device.clone(), x.batch.to_string()],
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
                    times(x.speedup_vs_reference),
                    match (&x.agreement, x.tolerance) {
                        (Some(a), Some(t)) => format!("{:.1e} ({t:.0e})", a.max_rel),
                        (Some(a), None) => format!("{:.1e}", a.max_rel),
                        (None, _) if x.strategy == GRAPH_CPU_ROW => "unchecked".into(),
                        (None, _) => "reference".into(),
                    },
                ];
                if float64 {
                    cells.push(float64_cell(x));
                }
                cells
            },
            peer: &|x| x.pytorch.as_ref(),
            behind: None,
        },
    );
    let notes = if float64 {
        vec![format!(
            "f32 rows ({GRAPH_CPU_ROW}, fp32 GPU rows) are judged against float64 outputs (the \
             Float64 line): max rel. diff <= the larger of {TOLERANCE:.0e} and ONNX Runtime \
             f32's own; their figure against ONNX Runtime is shown, not judged"
        )]
    } else {
        Vec::new()
    };
    Section {
        title: "Throughput".into(),
        header: Some(header),
        rows: body,
        notes,
    }
}

/// `--fp8-check`: fp8 simulated on the CPU against f32, its verdict and the layers it hurts
/// most.
fn fp8_section(f: &gpukit_bench::infer::onnx::fp8::Fp8Check) -> Section {
    let a = &f.accuracy;
    let layers = a
        .layers
        .iter()
        .take(3)
        .map(|l| format!("{} ({:.1e} of its own output)", l.node, l.rel_error))
        .collect::<Vec<_>>()
        .join(", ");
    let mut rows = vec![
        (
            "Simulated",
            "every convolution's and matrix product's operands rounded to E4M3 on the CPU, \
             the products in f32 (no fp8 kernel ran)"
                .to_string(),
        ),
        (
            "Calibration",
            format!(
                "activations per tensor by {}, on {} generated rows; weights per output channel",
                f.calibration, f.calibration_rows
            ),
        ),
        (
            "Top-1 agreement",
            format!(
                "{:.2}% of {} rows calibration never saw keep f32's top class (needs {:.0}%)",
                a.top1_agreement * 100.0,
                a.rows,
                f.min_top1_agreement * 100.0
            ),
        ),
        (
            "Logits vs f32",
            format!(
                "relative error {:.2e} at most, {:.2e} on average over rows",
                a.max_rel_error, a.mean_rel_error
            ),
        ),
        ("Layers fp8 hurts most", layers),
        (
            "Verdict",
            match &f.failed {
                Some(why) => format!("FAILED: {why}"),
                None => format!("passes ({:.1} s)", f.seconds),
            },
        ),
    ];
    if let Some(r) = &f.rescue {
        rows.push((
            "To pass",
            if r.enough {
                format!(
                    "keep {} layer(s) out of fp8 ({}): {:.2}% of the same rows then keep their top class",
                    r.kept.len(),
                    r.kept.join(", "),
                    r.top1_agreement * 100.0
                )
            } else {
                format!(
                    "keeping the {} layers fp8 hurts most out of fp8 still gives {:.2}%: the model is not one for fp8 as simulated",
                    r.kept.len(),
                    r.top1_agreement * 100.0
                )
            },
        ));
    }
    if let Some(path) = &f.scales_saved {
        rows.push(("Scales written", path.clone()));
    }
    Section::kv("fp8 (E4M3), simulated on the CPU", rows)
}

/// The setup, the latency at the first batch size, the throughput at each, PyTorch's rows
/// where it ran beside (`--torchvision`), and the fp8 check where asked (`--fp8-check`).
pub fn onnx_run_sections(r: &OnnxRun) -> Vec<Section> {
    let mut out = vec![setup(r)];
    out.extend(latency(r));
    out.push(throughput(r));
    out.extend(
        r.pytorch
            .as_ref()
            .map(super::infer_pytorch::pytorch_infer_section),
    );
    out.extend(r.fp8.as_ref().map(fp8_section));
    out
}
