//! Figures of a report: each command's part reads its own section (`Part::figures`, with the
//! harness's `figures` helpers), as JSON values for the fields that name a row and the figure
//! it measured (a missing field drops that row).
//!
//! A key names what decides the figure, so that only like is matched with like: the row's own
//! fields (device, dtype, size, batch, ...) and the run's settings that change it (the model
//! and image size, the CPU's thread count, a training run's layers, optimizer, batch, samples,
//! precision and loader, NCCL's ranks). What only repeats the measurement (iterations, epochs,
//! warm-up) is left out, and so is what the code under test chooses (algorithms, engines,
//! chunk sizes): comparing those across versions is the point. A setting at its default is
//! left out where older reports lack the field (matmul's inputs), so their keys still match.
//! `profile` and `lessons` hold no figure to compare.

use super::{Figure, Loaded};
use std::collections::HashMap;

/// Every figure of a report, keys unique (a repeated key gets " #2", " #3", ...): each part
/// reads its own section, in the order `all` runs them (the order the tables show them).
pub fn figures(loaded: &Loaded) -> Vec<Figure> {
    let mut out = Vec::new();
    for part in crate::parts() {
        if let Some(section) = loaded.sections.get(part.key()) {
            part.figures(section, &mut out);
        }
    }
    // commands of their own, not parts of `all` (`infer --onnx`)
    for (name, read) in crate::other_reports() {
        if let Some(section) = loaded.sections.get(name) {
            read(section, &mut out);
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
