//! Figures of a report: one function per section, each reading its rows as JSON values for
//! the fields that name a row and the figure it measured (a missing field drops that row).

use super::{Better, Figure, Loaded, Reading, ALL_SECTIONS};
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

/// A device as the tables write it: "Cpu" -> cpu, {"Cuda": 0} -> cuda:0, strings as they are.
fn device(row: &Value) -> Option<String> {
    match row.get("device")? {
        Value::String(s) if s.eq_ignore_ascii_case("cpu") => Some("cpu".into()),
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m
            .get("Cuda")
            .and_then(Value::as_u64)
            .map(|n| format!("cuda:{n}")),
        _ => None,
    }
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

/// The spread of `value` from the row's timing summary (`timing.summary_ms`). A rate is
/// inversely proportional to time, so its low end comes from p90: value·median/p90 ..
/// value·median/p10; a time scales directly: value·p10/median .. value·p90/median.
fn spread(row: &Value, value: f64, better: Better) -> Option<[f64; 2]> {
    let s = row.get("timing")?.get("summary_ms")?;
    let median = positive(s.get("median"))?;
    let p10 = positive(s.get("p10"))?;
    let p90 = positive(s.get("p90"))?;
    Some(match better {
        Better::Higher => [value * median / p90, value * median / p10],
        Better::Lower => [value * p10 / median, value * p90 / median],
    })
}

/// What a row's figure describes.
struct Spec<'a> {
    section: &'a str,
    unit: &'a str,
    better: Better,
    /// Whether the row's timing summary measured this figure (its spread applies).
    timed: bool,
}

/// A row's figure: its problem when the status is not ok, else its value when it has one
/// (a row that is ok but carries no figure gives none).
fn row_figure(spec: &Spec<'_>, key: String, row: &Value, field: &str) -> Option<Figure> {
    let reading = match problem(row) {
        Some(p) => Reading {
            value: None,
            spread: None,
            problem: Some(p),
        },
        None => {
            let value = positive(row.get(field))?;
            Reading {
                value: Some(value),
                spread: spec
                    .timed
                    .then(|| spread(row, value, spec.better))
                    .flatten(),
                problem: None,
            }
        }
    };
    Some(Figure {
        section: spec.section.to_string(),
        key: format!("{} {key}", spec.section),
        unit: spec.unit.to_string(),
        better: spec.better,
        reading,
    })
}

/// A figure that no timing summary describes (totals, memory), never a failed row's.
fn plain_figure(spec: &Spec<'_>, key: String, value: Option<&Value>) -> Option<Figure> {
    Some(Figure {
        section: spec.section.to_string(),
        key: format!("{} {key}", spec.section),
        unit: spec.unit.to_string(),
        better: spec.better,
        reading: Reading {
            value: Some(positive(value)?),
            spread: None,
            problem: None,
        },
    })
}

/// `bench matmul`: TFLOP/s per device, dtype and size.
fn matmul_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "matmul",
        unit: "TFLOP/s",
        better: Better::Higher,
        timed: true,
    };
    for row in rows(section) {
        let (Some(dev), Some(dtype), Some(size)) =
            (device(row), text(row, "dtype"), text(row, "size"))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!("{dev} {dtype} {size}"),
            row,
            "tflops",
        ));
    }
}

/// `bench bandwidth`: GB/s per kind of copy and size.
fn bandwidth_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "bandwidth",
        unit: "GB/s",
        better: Better::Higher,
        timed: true,
    };
    for row in rows(section) {
        let (Some(kind), Some(bytes)) =
            (text(row, "kind"), row.get("bytes").and_then(Value::as_u64))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!("{kind} {}", bytes_name(bytes)),
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

/// `bench conv`: TFLOP/s per shape, layout, dtype, batch and device; and the whole network's
/// convolutions in ms per dtype and layout (its totals), when the report has them.
fn conv_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "conv",
        unit: "TFLOP/s",
        better: Better::Higher,
        timed: true,
    };
    for row in rows(section) {
        let batch = row
            .get("shape")
            .and_then(|s| s.get("n"))
            .map(|n| n.to_string());
        let (Some(name), Some(layout), Some(dtype), Some(batch), Some(dev)) = (
            text(row, "name"),
            text(row, "layout"),
            text(row, "dtype"),
            batch,
            device(row),
        ) else {
            continue;
        };
        let key = format!(
            "{name} {} {dtype} batch {batch} {dev}",
            layout.to_ascii_uppercase()
        );
        out.extend(row_figure(&spec, key, row, "tflops"));
    }
    let totals = Spec {
        section: "conv",
        unit: "ms",
        better: Better::Lower,
        timed: false,
    };
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
            format!("{what} gpu"),
            t.get("gpu_ms"),
        ));
        out.extend(plain_figure(
            &totals,
            format!("{what} cpu"),
            t.get("cpu_ms"),
        ));
    }
}

/// `infer`: images/s per strategy, device and batch.
fn infer_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "infer",
        unit: "images/s",
        better: Better::Higher,
        timed: true,
    };
    for row in rows(section) {
        let (Some(strategy), Some(dev), Some(batch)) =
            (text(row, "strategy"), device(row), text(row, "batch"))
        else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!("{strategy} {dev} batch {batch}"),
            row,
            "images_per_s",
        ));
    }
}

/// `memory`: per batch, the pool's peak (bytes) and the time per batch (ms); the largest batch
/// that fits, when it was searched for.
fn memory_figures(section: &Value, out: &mut Vec<Figure>) {
    let bytes = Spec {
        section: "memory",
        unit: "bytes",
        better: Better::Lower,
        timed: false,
    };
    let ms = Spec {
        unit: "ms",
        ..bytes
    };
    for row in rows(section) {
        let Some(batch) = text(row, "batch") else {
            continue;
        };
        out.extend(row_figure(
            &bytes,
            format!("batch {batch} pool peak"),
            row,
            "pool_used_peak",
        ));
        out.extend(row_figure(
            &ms,
            format!("batch {batch} per batch"),
            row,
            "ms_per_batch",
        ));
    }
    let largest = Spec {
        section: "memory",
        unit: "images",
        better: Better::Higher,
        timed: false,
    };
    let max = section.get("max_batch").and_then(|m| m.get("batch"));
    out.extend(plain_figure(&largest, "largest batch".into(), max));
}

/// `train`: samples/s per preset, device and epoch. `all` holds a list of train reports, the
/// `train` command one.
fn train_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "train",
        unit: "samples/s",
        better: Better::Higher,
        timed: false,
    };
    let reports = match section {
        Value::Array(a) => a.as_slice(),
        other => std::slice::from_ref(other),
    };
    for r in reports {
        let preset = text(r, "preset").unwrap_or_else(|| "custom".into());
        let dev = text(r, "device").unwrap_or_else(|| "?".into());
        let epochs = r.get("epochs").and_then(Value::as_array);
        for e in epochs.map(Vec::as_slice).unwrap_or(&[]) {
            let Some(n) = text(e, "epoch") else { continue };
            out.extend(plain_figure(
                &spec,
                format!("{preset} {dev} epoch {n}"),
                e.get("samples_per_s"),
            ));
        }
    }
}

/// `bench nccl`: busbw per collective, dtype, reduction, size and place (a row's figure is
/// the mean over ranks of each rank's median block; no spread is kept).
fn nccl_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "nccl",
        unit: "GB/s busbw",
        better: Better::Higher,
        timed: false,
    };
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
        for (place, field) in [("out-of-place", "out_of_place"), ("in-place", "in_place")] {
            let Some(fig) = row.get(field).filter(|f| !f.is_null()) else {
                continue;
            };
            let key = format!("{op} {dtype}{redop} {} {place}", bytes_name(bytes));
            match problem(row) {
                Some(_) => out.extend(row_figure(&spec, key, row, "busbw_gbs")),
                None => out.extend(plain_figure(&spec, key, fig.get("busbw_gbs"))),
            }
        }
    }
}

/// `bench p2p`: one-way GB/s per ordered pair of GPUs.
fn p2p_figures(section: &Value, out: &mut Vec<Figure>) {
    let spec = Spec {
        section: "p2p",
        unit: "GB/s",
        better: Better::Higher,
        timed: false,
    };
    for row in rows(section) {
        let (Some(src), Some(dst)) = (text(row, "src"), text(row, "dst")) else {
            continue;
        };
        out.extend(row_figure(
            &spec,
            format!("cuda:{src} -> cuda:{dst} one way"),
            row,
            "one_way_gbs",
        ));
    }
}
