//! The power columns the GPU results tables share: watts during gpukit's timed blocks, marked
//! when the chip was held at a limit or shared, and work per joule beside PyTorch's.

use super::fmt::f1;
use gpukit_bench::power::RowPower;

/// The two column names, for a rate unit such as "TFLOP" or "images".
pub(super) fn power_header(unit: &str) -> [String; 2] {
    ["W".to_string(), format!("{unit}/J")]
}

/// Whether any row carries a power figure (the columns are shown only then).
pub(super) fn any_power<'a>(mut powers: impl Iterator<Item = Option<&'a RowPower>>) -> bool {
    powers.any(|p| p.is_some())
}

/// The cells: gpukit's mean watts (with what held the chip down, or who else used it), and
/// work per joule from `rate` (units a second), PyTorch's in brackets from its own blocks.
pub(super) fn power_cells(
    ours: Option<&RowPower>,
    theirs: Option<(&RowPower, f64)>,
    rate: Option<f64>,
) -> [String; 2] {
    let Some(p) = ours else {
        return [String::new(), String::new()];
    };
    let mut w = format!("{:.0}", p.median_w);
    if p.throttled() {
        if let Some((reason, share)) = p.worst_throttle() {
            w.push_str(&format!(" {} {:.0}%", throttle_name(reason), share * 100.0));
        }
    }
    if !p.other_processes.is_empty() {
        w.push_str(&format!(" +{} other process(es)", p.other_processes.len()));
    }
    let mut per_j = f1(rate.and_then(|r| p.per_joule(r)));
    if let Some(t) = theirs.and_then(|(p, r)| p.per_joule(r)) {
        per_j.push_str(&format!(" (PyTorch {})", f1(Some(t))));
    }
    [w, per_j]
}

/// What the power columns mean, for a table's notes (`peer`: PyTorch's figure is beside;
/// `during`: when the readings were taken).
pub(super) fn power_note(unit: &str, peer: bool, during: &str) -> String {
    format!(
        "W: the board's median power {during} (NVML read every 10 ms, \
         instantaneous where the driver has it), marked with what held the clocks down (\"power \
         cap 80%\": that share of the readings) and with other processes on the GPU; {unit}/J: \
         {unit} a second per watt{}.",
        if peer {
            ", PyTorch's in brackets from its own blocks"
        } else {
            ""
        }
    )
}

fn throttle_name(reason: &str) -> &'static str {
    gpukit_types::throttle::by_name(reason).map_or("held", |r| r.label)
}
