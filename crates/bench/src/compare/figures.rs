//! Figures of a report: one function per section, each reading its rows as JSON values for
//! the fields that name a row and the figure it measured (a missing field drops that row).
//!
//! A key names what decides the figure, so that only like is matched with like: the row's own
//! fields (device, dtype, size, batch, ...) and the run's settings that change it (the model
//! and image size, the CPU's thread count, a training run's layers, optimizer, batch, samples,
//! precision and loader, NCCL's ranks). What only repeats the measurement (iterations, epochs,
//! warm-up) is left out, and so is what the code under test chooses (algorithms, engines,
//! chunk sizes): comparing those across versions is the point. A setting at its default is
//! left out where older reports lack the field (matmul's inputs), so their keys still match.
//! `profile` and `lessons` hold no figure to compare.

use super::{Better, Figure, Loaded, Reading, ALL_SECTIONS};
use crate::stats::Summary;
use serde_json::Value;
use std::collections::HashMap;

/// Every figure of a report, keys unique (a repeated key gets " #2", " #3", ...).
pub fn figures(loaded: &Loaded) -> Vec<Figure> {
    let mut out = Vec::new();
    // in the order the tables show them (and `all` runs them), not alphabetically
    let ordered = ALL_SECTIONS
        .iter()
        .filter_map(|n| loaded.sections.get(*n).map(|s| (*n, s)));
    for (name, section) in ordered {
        match name {
            "matmul" => matmul_figures(section, &mut out),
            "bandwidth" => bandwidth_figures(section, &mut out),
            "conv" => conv_figures(section, &mut out),
            "infer" => infer_figures(section, &mut out),
            "memory" => memory_figures(section, &mut out),
            "train" => train_figures(section, &mut out),
            "nccl" => nccl_figures(section, &mut out),
            "p2p" => p2p_figures(section, &mut out),
            _ => {}
        }
    }
    unique_keys(out)
}

/// Rows of the same name (a format that did not tell them apart) stay distinct.
fn unique_keys(figures: Vec<Figure>) -> Vec<Figure> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    figures
        .into_iter()
        .map(|mut f| {
            let n = seen.entry(f.key.clone()).or_insert(0);
            *n += 1;
            if *n > 1 {
                f.key = format!("{} #{n}", f.key);
            }
            f
        })
        .collect()
}

/// The rows of a section, or none when it has no "rows" array.
fn rows(section: &Value) -> &[Value] {
    section
        .get("rows")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A field as text: strings as they are, numbers and the rest as JSON writes them.
fn text(row: &Value, field: &str) -> Option<String> {
    match row.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// A device as the tables write it: "Cpu" -> cpu, {"Cuda": 0} -> cuda:0, and a string's first
/// word ("cuda:0 (NVIDIA H100 80GB HBM3)" -> cuda:0): the GPU's model is the machine's, which
/// the warnings cover, not the run's configuration.
fn device(row: &Value) -> Option<String> {
    match row.get("device")? {
        Value::String(s) => {
            let first = s.split_whitespace().next()?;
            Some(if first.eq_ignore_ascii_case("cpu") {
                "cpu".into()
            } else {
                first.to_string()
            })
        }
        Value::Object(m) => m
            .get("Cuda")
            .and_then(Value::as_u64)
            .map(|n| format!("cuda:{n}")),
        _ => None,
    }
}

/// " 16 threads" for a CPU row when the section says how many threads its CPU kernels ran on
/// (RAYON_NUM_THREADS and the machine's cores decide it, and the CPU's figures scale with it);
/// nothing for a GPU row.
fn threads(section: &Value, dev: &str) -> String {
    match section.get("cpu_threads").and_then(Value::as_u64) {
        Some(n) if dev == "cpu" => format!(" {n} threads"),
        _ => String::new(),
    }
}

/// The section's GPU as `cuda:N`, from its GPU facts.
fn gpu_device(section: &Value) -> Option<String> {
    section
        .get("gpu")
        .and_then(|g| g.get("index"))
        .and_then(Value::as_u64)
        .map(|n| format!("cuda:{n}"))
}

/// Why a row has no figure, from its status ({"status": "failed", "why": ...}, or a bare
/// string in older reports); None when it is ok.
fn problem(row: &Value) -> Option<String> {
    let (status, why) = match row.get("status")? {
        Value::String(s) => (s.clone(), None),
        Value::Object(m) => (
            m.get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            m.get("why").and_then(Value::as_str),
        ),
        _ => return None,
    };
    if status.eq_ignore_ascii_case("ok") {
        return None;
    }
    Some(match why {
        Some(w) => format!("{status}: {w}"),
        None => status,
    })
}

/// A figure that can be divided by: finite and above zero.
fn positive(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
        .filter(|x| x.is_finite() && *x > 0.0)
}

/// The spread of `value` from the row's timing summary (`timing.summary_ms`), and how many
/// repetitions it summarises. A rate is inversely proportional to time, so its low end comes
/// from p90: value·median/p90 .. value·median/p10; a time scales directly: value·p10/median ..
/// value·p90/median.
fn spread(row: &Value, value: f64, better: Better) -> (Option<[f64; 2]>, Option<u64>) {
    let Some(s) = row.get("timing").and_then(|t| t.get("summary_ms")) else {
        return (None, None);
    };
    let samples = s.get("count").and_then(Value::as_u64);
    let range = (|| {
        let median = positive(s.get("median"))?;
        let p10 = positive(s.get("p10"))?;
        let p90 = positive(s.get("p90"))?;
        Some(match better {
            Better::Higher => [value * median / p90, value * median / p10],
            Better::Lower => [value * p10 / median, value * p90 / median],
        })
    })();
    (range, samples)
}

/// What a row's figure describes.
struct Spec<'a> {
    section: &'a str,
    unit: &'a str,
    better: Better,
    /// Whether the row's timing summary measured this figure (its spread applies).
    timed: bool,
    /// A count or size that a repeat reproduces, judged on the threshold alone.
    exact: bool,
}

impl Spec<'_> {
    /// A figure of this kind under `key` (the section's name is put in front).
    fn figure(&self, key: String, reading: Reading) -> Figure {
        Figure {
            section: self.section.to_string(),
            key: format!("{} {key}", self.section),
            unit: self.unit.to_string(),
            better: self.better,
            exact: self.exact,
            reading,
        }
    }
}

/// A row's figure: its problem when the status is not ok, else its value when it has one
/// (a row that is ok but carries no figure gives none).
fn row_figure(spec: &Spec<'_>, key: String, row: &Value, field: &str) -> Option<Figure> {
    let reading = match problem(row) {
        Some(p) => Reading {
            value: None,
            spread: None,
            samples: None,
            problem: Some(p),
        },
        None => {
            let value = positive(row.get(field))?;
            let (spread, samples) = if spec.timed {
                spread(row, value, spec.better)
            } else {
                (None, None)
            };
            Reading {
                value: Some(value),
                spread,
                samples,
                problem: None,
            }
        }
    };
    Some(spec.figure(key, reading))
}

/// A figure that no timing summary describes (totals, memory), never a failed row's.
fn plain_figure(spec: &Spec<'_>, key: String, value: Option<&Value>) -> Option<Figure> {
    let reading = Reading {
        value: Some(positive(value)?),
        spread: None,
        samples: None,
        problem: None,
    };
    Some(spec.figure(key, reading))
}

/// `bench matmul`: TFLOP/s per device, dtype and size; a CPU row's thread count; the inputs'
/// distribution when not the default normal (a power-capped GPU clocks by the bits that
/// toggle).
fn matmul_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "matmul",
        unit: "TFLOP/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let inputs = match text(section, "inputs") {
        Some(d) if d != "normal" => format!(" {d} inputs"),
        _ => String::new(),
    };
    for row in rows(section) {
        let (Some(dev), Some(dtype), Some(size)) =
            (device(row), text(row, "dtype"), text(row, "size"))
        else {
            continue;
        };
        let threads = threads(section, &dev);
        out.extend(row_figure(
            &spec,
            format!("{dev} {dtype} {size}{threads}{inputs}"),
            row,
            "tflops",
        ));
    }
}

/// `bench bandwidth`: GB/s per GPU, kind of copy and size.
fn bandwidth_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "bandwidth",
        unit: "GB/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let gpu = gpu_device(section)
        .map(|d| format!("{d} "))
        .unwrap_or_default();
    for row in rows(section) {
        let (Some(kind), Some(bytes)) =
            (text(row, "kind"), row.get("bytes").and_then(Value::as_u64))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!("{gpu}{kind} {}", bytes_name(bytes)),
            row,
            "gbs",
        ));
    }
}

/// 1073741824 -> "1 GiB": sizes as the command line gives them.
fn bytes_name(b: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} B")
}

/// `bench conv`: TFLOP/s per shape (kernel, stride, channels, input size, padding), layout,
/// dtype, batch and device, and a CPU row's threads; and the whole network's
/// convolutions in ms per dtype, layout and batch on the GPU and the CPU (its totals), when the
/// report has them.
fn conv_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "conv",
        unit: "TFLOP/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    for row in rows(section) {
        let batch = row
            .get("shape")
            .and_then(|s| s.get("n"))
            .map(|n| n.to_string());
        let (Some(shape), Some(layout), Some(dtype), Some(batch), Some(dev)) = (
            conv_shape(row).or_else(|| text(row, "name")),
            text(row, "layout"),
            text(row, "dtype"),
            batch,
            device(row),
        ) else {
            continue;
        };
        let key = format!(
            "{shape} {} {dtype} batch {batch} {dev}{}",
            layout.to_ascii_uppercase(),
            threads(section, &dev)
        );
        out.extend(row_figure(&spec, key, row, "tflops"));
    }
    let totals = Spec {
        section: "conv",
        unit: "ms",
        better: Better::Lower,
        timed: false,
        exact: false,
    };
    let gpu = gpu_device(section).unwrap_or_else(|| "gpu".into());
    let cpu = format!("cpu{}", threads(section, "cpu"));
    let list = section.get("totals").and_then(Value::as_array);
    for t in list.map(Vec::as_slice).unwrap_or(&[]) {
        let (Some(dtype), Some(layout), Some(batch)) =
            (text(t, "dtype"), text(t, "layout"), text(t, "batch"))
        else {
            continue;
        };
        let what = format!(
            "total {dtype} {} batch {batch}",
            layout.to_ascii_uppercase()
        );
        out.extend(plain_figure(
            &totals,
            format!("{what} {gpu}"),
            t.get("gpu_ms"),
        ));
        out.extend(plain_figure(
            &totals,
            format!("{what} {cpu}"),
            t.get("cpu_ms"),
        ));
    }
}

/// A convolution's shape as its row names it, "1x1 64->256 @56" (kernel, /stride past 1,
/// channels in and out, input size; the padding when not the kernel's half), from the shape's
/// fields rather than the row's name: a shape is what was measured, and its name changed from
/// version to version ("layer1 1x1 expand", then "layer1 1x1 64->256 @56").
fn conv_shape(row: &Value) -> Option<String> {
    let shape = row.get("shape")?;
    let field = |f: &str| shape.get(f).and_then(Value::as_u64);
    let (c, k, h, w) = (field("c")?, field("k")?, field("h")?, field("w")?);
    let (r, s, stride, pad) = (field("r")?, field("s")?, field("stride")?, field("pad")?);
    let mut out = format!("{r}x{s}");
    if stride != 1 {
        out.push_str(&format!("/{stride}"));
    }
    out.push_str(&format!(" {c}->{k} @{h}"));
    if w != h {
        out.push_str(&format!("x{w}"));
    }
    if pad != r / 2 || r != s {
        out.push_str(&format!(" pad {pad}"));
    }
    Some(out)
}

/// `infer`: images/s per model, image size, strategy, device (a CPU row's threads) and batch.
fn infer_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "infer",
        unit: "images/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let model = model_and_size(section, text(section, "image_size"));
    for row in rows(section) {
        let (Some(strategy), Some(dev), Some(batch)) =
            (text(row, "strategy"), device(row), text(row, "batch"))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!(
                "{model}{strategy} {dev}{} batch {batch}",
                threads(section, &dev)
            ),
            row,
            "images_per_s",
        ));
    }
}

/// "resnet50 224px " from a section's model and square image size, each when known.
fn model_and_size(section: &Value, image_size: Option<String>) -> String {
    let mut out = String::new();
    if let Some(m) = text(section, "model") {
        out.push_str(&format!("{m} "));
    }
    if let Some(px) = image_size {
        out.push_str(&format!("{px}px "));
    }
    out
}

/// `memory`: per model, precision, layout, image size, device and workspace cap, and per
/// batch, the pool's peak (bytes, exact) and the time per batch (ms); the largest batch that
/// fits (exact; under the memory limit when one was set), when it was searched for.
fn memory_figures(section: &Value, out: &mut Vec<Figure>) {
    let bytes = Spec {
        section: "memory",
        unit: "bytes",
        better: Better::Lower,
        timed: false,
        exact: true,
    };
    let ms = Spec {
        unit: "ms",
        exact: false,
        ..bytes
    };
    let mut setup = model_and_size(section, memory_image_size(section));
    for field in ["precision", "layout"] {
        if let Some(v) = text(section, field) {
            setup.push_str(&format!("{v} "));
        }
    }
    if let Some(dev) = device(section) {
        setup.push_str(&format!("{dev} "));
    }
    if let Some(cap) = section.get("max_workspace_bytes").and_then(Value::as_u64) {
        setup.push_str(&format!("workspace cap {} ", bytes_name(cap)));
    }
    for row in rows(section) {
        let Some(batch) = text(row, "batch") else {
            continue;
        };
        out.extend(row_figure(
            &bytes,
            format!("{setup}batch {batch} pool peak"),
            row,
            "pool_used_peak",
        ));
        out.extend(row_figure(
            &ms,
            format!("{setup}batch {batch} per batch"),
            row,
            "ms_per_batch",
        ));
    }
    let largest = Spec {
        section: "memory",
        unit: "images",
        better: Better::Higher,
        timed: false,
        exact: true,
    };
    let limit = section
        .get("limit_bytes")
        .and_then(Value::as_u64)
        .map(|b| format!(" under {}", bytes_name(b)))
        .unwrap_or_default();
    let max = section.get("max_batch").and_then(|m| m.get("batch"));
    out.extend(plain_figure(
        &largest,
        format!("{setup}largest batch{limit}"),
        max,
    ));
}

/// The image size of a memory report, which names none: its input batch is NCHW f32 whatever
/// the precision (3 channels of 4 bytes a pixel), so a row's input bytes give the square's side.
fn memory_image_size(section: &Value) -> Option<String> {
    rows(section).iter().find_map(|row| {
        let batch = row.get("batch").and_then(Value::as_u64)?;
        let input = row.get("input_bytes").and_then(Value::as_u64)?;
        let per_image = input.checked_div(batch * 12)?;
        if per_image * batch * 12 != input {
            return None;
        }
        // a side of at most a few thousand pixels: the float root is exact here
        let side = (per_image as f64).sqrt().round() as u64;
        (side * side == per_image).then(|| side.to_string())
    })
}

/// `train`: samples/s of each training run, under the configuration that decides it (see
/// [`train_key`]). `all` holds a list of train reports, the `train` command one.
///
/// The figure is the median over the run's steady epochs: the complete ones after the first,
/// which also warms caches and the allocator (and captures the CUDA graph), unless it is the
/// only one. The epochs are the run's repetitions: their p10-p90 range is the spread, their
/// count the samples, so more `--epochs` make a run judgeable.
fn train_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "train",
        unit: "samples/s",
        better: Better::Higher,
        timed: true,
        exact: false,
    };
    let reports = match section {
        Value::Array(a) => a.as_slice(),
        other => std::slice::from_ref(other),
    };
    for r in reports {
        let Some(key) = train_key(r) else { continue };
        // a run stopped by a non-finite loss failed: its rates are of a loop that broke
        let reading = match text(r, "diverged") {
            Some(why) => Some(Reading {
                value: None,
                spread: None,
                samples: None,
                problem: Some(format!("failed: {why}")),
            }),
            None => steady_epochs(r),
        };
        out.extend(reading.map(|reading| spec.figure(key, reading)));
    }
}

/// What decides a training run's samples/s, in words: "cpu 16-64-1 mse adam batch 64 819
/// samples fp32", then what differs from the plain loop (momentum, weight decay, accumulation,
/// no shuffle, checkpointed activations), the GPU's loader and graph, data-parallel ranks.
/// The preset's name is left out: a preset inside `all` (with an evaluation split) and a plain
/// `train` of the same preset train on different data, while flags that match a preset measure
/// the same loop. Learning rate and seed do not change the work; epochs and steps only repeat
/// it.
fn train_key(r: &Value) -> Option<String> {
    let cfg = r.get("config")?;
    let widths: Vec<String> = cfg
        .get("widths")?
        .as_array()?
        .iter()
        .map(|w| w.as_u64().map(|n| n.to_string()))
        .collect::<Option<_>>()?;
    let optimizer = cfg.get("optimizer")?;
    let mut parts = vec![
        device(r)?,
        widths.join("-"),
        text(cfg, "loss")?,
        text(optimizer, "kind")?,
    ];
    for (field, name) in [("momentum", "momentum"), ("weight_decay", "weight decay")] {
        if let Some(v) = optimizer
            .get(field)
            .and_then(Value::as_f64)
            .filter(|v| *v != 0.0)
        {
            parts.push(format!("{name} {v}"));
        }
    }
    parts.push(format!("batch {}", text(cfg, "batch_size")?));
    if let Some(k) = cfg
        .get("accumulate")
        .and_then(Value::as_u64)
        .filter(|k| *k > 1)
    {
        parts.push(format!("accumulate {k}"));
    }
    parts.push(format!("{} samples", text(r, "samples")?));
    parts.push(text(r, "precision")?);
    if cfg.get("shuffle").and_then(Value::as_bool) == Some(false) {
        parts.push("no shuffle".into());
    }
    if cfg.get("checkpoint_activations").and_then(Value::as_bool) == Some(true) {
        parts.push("checkpointed activations".into());
    }
    if let Some(gpu) = r.get("gpu").filter(|g| g.is_object()) {
        if let Some(loader) = text(gpu, "loader") {
            parts.push(format!("{loader} loader"));
        }
        match gpu.get("graph").and_then(Value::as_bool) {
            Some(true) => parts.push("graph".into()),
            Some(false) => parts.push("no graph".into()),
            None => {}
        }
    }
    if let Some(dp) = r.get("data_parallel").filter(|d| d.is_object()) {
        if let Some(n) = text(dp, "ranks") {
            parts.push(format!("{n} ranks"));
        }
        if let Some(by) = text(dp, "started_by") {
            parts.push(format!("({by})"));
        }
        if let Some(mb) = text(dp, "bucket_mb") {
            parts.push(format!("buckets {mb} MiB"));
        }
    }
    Some(parts.join(" "))
}

/// The median samples/s of a run's steady epochs, their p10-p90 range (when there are two or
/// more) and their count; None when no epoch is complete.
fn steady_epochs(r: &Value) -> Option<Reading> {
    let epochs = r.get("epochs").and_then(Value::as_array)?;
    let rate = |e: &Value| {
        let complete = e.get("complete").and_then(Value::as_bool).unwrap_or(true);
        complete.then(|| positive(e.get("samples_per_s"))).flatten()
    };
    let all: Vec<f64> = epochs.iter().filter_map(rate).collect();
    let later: Vec<f64> = epochs.iter().skip(1).filter_map(rate).collect();
    let steady = if later.is_empty() { all } else { later };
    let s = Summary::of(&steady)?;
    Some(Reading {
        value: Some(s.median),
        spread: (s.count > 1).then_some([s.p10, s.p90]),
        samples: Some(s.count as u64),
        problem: None,
    })
}

/// `bench nccl`: busbw per collective, dtype, reduction, root, size and place, under the run's
/// ranks (and processes when more than one), CUDA graph and NCCL_* settings (they choose
/// algorithms, protocols and transports). A row's figure is the mean over ranks of each rank's
/// median block; no spread is kept.
fn nccl_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "nccl",
        unit: "GB/s busbw",
        better: Better::Higher,
        timed: false,
        exact: false,
    };
    let setup = nccl_setup(section);
    for row in rows(section) {
        let (Some(op), Some(dtype), Some(bytes)) = (
            text(row, "op"),
            text(row, "dtype"),
            row.get("bytes").and_then(Value::as_u64),
        ) else {
            continue;
        };
        let redop = text(row, "redop")
            .map(|r| format!(" {r}"))
            .unwrap_or_default();
        let root = text(row, "root")
            .map(|r| format!(" root {r}"))
            .unwrap_or_default();
        for (place, field) in [("out-of-place", "out_of_place"), ("in-place", "in_place")] {
            let Some(fig) = row.get(field).filter(|f| !f.is_null()) else {
                continue;
            };
            let key = format!(
                "{op} {dtype}{redop}{root} {} {place}{setup}",
                bytes_name(bytes)
            );
            match problem(row) {
                Some(_) => out.extend(row_figure(&spec, key, row, "busbw_gbs")),
                None => out.extend(plain_figure(&spec, key, fig.get("busbw_gbs"))),
            }
        }
    }
}

/// " 2 ranks", then " in 2 processes", " graph" and each NCCL_* variable that changes what
/// NCCL does (its logging ones do not) when they apply.
fn nccl_setup(section: &Value) -> String {
    let mut out = String::new();
    if let Some(n) = text(section, "ranks") {
        out.push_str(&format!(" {n} ranks"));
    }
    if let Some(p) = section
        .get("processes")
        .and_then(Value::as_u64)
        .filter(|p| *p > 1)
    {
        out.push_str(&format!(" in {p} processes"));
    }
    if section.get("graph").and_then(Value::as_bool) == Some(true) {
        out.push_str(" graph");
    }
    let env = section.get("nccl_env").and_then(Value::as_array);
    for pair in env.map(Vec::as_slice).unwrap_or(&[]) {
        let (Some(name), Some(value)) = (
            pair.get(0).and_then(Value::as_str),
            pair.get(1).and_then(Value::as_str),
        ) else {
            continue;
        };
        if !name.starts_with("NCCL_DEBUG") {
            out.push_str(&format!(" {name}={value}"));
        }
    }
    out
}

/// `bench p2p`: one-way GB/s per ordered pair of GPUs and copy size, with its p10-p90 range
/// (the report does not say over how many samples, so such a figure is judged only when the
/// change stays within the threshold or the ranges overlap).
fn p2p_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "p2p",
        unit: "GB/s",
        better: Better::Higher,
        timed: false,
        exact: false,
    };
    for row in rows(section) {
        let (Some(src), Some(dst)) = (text(row, "src"), text(row, "dst")) else {
            continue;
        };
        let size = row
            .get("bytes")
            .and_then(Value::as_u64)
            .map(|b| format!(" {}", bytes_name(b)))
            .unwrap_or_default();
        let Some(mut f) = row_figure(
            &spec,
            format!("cuda:{src} -> cuda:{dst}{size} one way"),
            row,
            "one_way_gbs",
        ) else {
            continue;
        };
        if f.reading.value.is_some() {
            if let (Some(lo), Some(hi)) = (
                positive(row.get("one_way_p10_gbs")),
                positive(row.get("one_way_p90_gbs")),
            ) {
                f.reading.spread = Some([lo, hi]);
            }
        }
        out.push(f);
    }
}
