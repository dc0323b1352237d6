//! How numbers and sizes are written in every table: GiB and MiB, rates, percentages, ratios,
//! thousands separators.

pub(super) fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

pub(super) fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map(|x| format!("{x}{unit}"))
        .unwrap_or_else(|| "n/a".into())
}

pub(super) fn tf(v: Option<f64>) -> String {
    v.map(|x| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else if x >= 1.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    })
    .unwrap_or_else(|| "none".into())
}

pub(super) fn f1(v: Option<f64>) -> String {
    v.map(|x| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else if x >= 10.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    })
    .unwrap_or_default()
}

pub(super) fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0}%")).unwrap_or_default()
}

pub(super) fn times(v: Option<f64>) -> String {
    v.map(|x| {
        if x >= 10.0 {
            format!("{x:.0}x")
        } else {
            format!("{x:.2}x")
        }
    })
    .unwrap_or_default()
}

/// `12345.6` -> `12,346`; below 1000 as [`f1`] does.
pub(super) fn grouped(x: f64) -> String {
    if !x.is_finite() || x.abs() < 1000.0 {
        return f1(Some(x));
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 {
        out.insert(0, '-');
    }
    out
}

pub(super) fn human_bytes(b: usize) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}
