//! What `gpukit all` prints once its reports are written: the files and, last, the page to open.

use super::html::h100_all;
use crate::render::all_done;
use std::path::PathBuf;

#[test]
fn all_ends_with_the_page_to_open_after_naming_every_file_written() {
    let doc = h100_all();
    let dir = PathBuf::from("out/my report");
    let written: Vec<PathBuf> = ["report.json", "report.md", "report.html"]
        .iter()
        .map(|n| dir.join(n))
        .collect();
    let done = all_done(&doc, &written);
    assert_eq!(done.last.as_deref(), Some("open out/my report/report.html"));
    assert_eq!(done.head.len(), 2, "{:?}", done.head);
    let wrote = &done.head[1];
    assert!(
        wrote.starts_with(
            "wrote out/my report/report.json, out/my report/report.md, out/my report/report.html in "
        ),
        "{wrote}"
    );
    assert!(wrote.ends_with(" s"), "{wrote}");
}

#[test]
fn without_a_page_written_there_is_nothing_to_open() {
    let done = all_done(&h100_all(), &[PathBuf::from("out/report.json")]);
    assert_eq!(done.last, None);
}
