//! How a command's report leaves: tables on stdout, or JSON, and the files `--save-json` and
//! `--html` ask for.

use crate::render::{self, Section};
use anyhow::{Context, Result};
use gpukit_bench::report::Document;
use gpukit_bench::Error;
use serde::Serialize;

/// How a command's result leaves: tables or JSON on stdout, and optionally a JSON file.
pub struct Output {
    pub json: bool,
    /// `--save-json FILE`.
    pub save_json: Option<std::path::PathBuf>,
    /// `--html FILE`.
    pub html: Option<std::path::PathBuf>,
}

/// Writes the document where `--save-json` asked, prints it (`--json`) or its heading lines,
/// sections and notes, then fails (exit 1) when the document says the run failed.
pub fn emit<T: Serialize>(
    doc: &Document<T>,
    out: &Output,
    head: Vec<String>,
    sections: Vec<Section>,
) -> Result<()> {
    emit_charted(doc, out, head, sections, Vec::new())
}

/// [`emit`], with the charts `--html` draws above the tables.
pub fn emit_charted<T: Serialize>(
    doc: &Document<T>,
    out: &Output,
    head: Vec<String>,
    sections: Vec<Section>,
    charts: Vec<render::html::Chart>,
) -> Result<()> {
    if let Some(path) = &out.html {
        let line = std::env::args().collect::<Vec<_>>().join(" ");
        let page = render::html::command_html(doc, &line, &charts, &sections);
        gpukit_types::files::write_atomically(path, page.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &out.save_json {
        let bytes = serde_json::to_vec_pretty(doc).context("serializing the report")?;
        gpukit_types::files::write_atomically(path, &bytes)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    // warnings go to stderr whatever the format, so that a piped JSON document is not alone
    let (warnings, notes): (Vec<&String>, Vec<&String>) =
        doc.notes.iter().partition(|n| n.starts_with("warning: "));
    for w in warnings {
        eprintln!("{w}");
    }
    if out.json {
        println!("{}", serde_json::to_string_pretty(doc)?);
    } else {
        for line in head {
            println!("{line}");
        }
        print!("{}", render::to_terminal(&sections));
        for n in notes {
            println!("  {n}");
        }
    }
    match &doc.failure {
        Some(why) => Err(Error::Failed(why.clone()).into()),
        None => Ok(()),
    }
}
