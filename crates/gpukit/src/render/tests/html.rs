//! report.html of `gpukit all`, drawn from a real H100 report (tests/fixtures) with the
//! two training presets added (that run predates `train` in `all`): well-formed enough, every
//! section and chart there, text from the report escaped, and rows without a figure never drawn.

use crate::render::html::{
    infer_chart, matmul_charts, memory_chart, section_ids, sections_to_html, Chart,
};
use crate::render::{all_html, Section};
use gpukit_bench::all::AllReport;
use gpukit_bench::check::CheckReport;
use gpukit_bench::infer::InferReport;
use gpukit_bench::matmul::MatmulReport;
use gpukit_bench::memory::MemoryReport;
use gpukit_bench::report::{Document, RowStatus};
use gpukit_bench::workload::train::TrainReport;
use gpukit_train::loss::LossKind;
use std::path::Path;

/// A real `gpukit all` document from an H100 (tests/fixtures/all-h100.json.gz, gunzipped with
/// the system's gzip).
pub(crate) fn h100_all() -> Document<AllReport> {
    let gz = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/all-h100.json.gz");
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(&gz)
        .output()
        .expect("gzip runs");
    assert!(out.status.success(), "gzip -dc {}", gz.display());
    serde_json::from_slice(&out.stdout).expect("the stored H100 report reads as the all document")
}

/// The H100 report with both training presets (decaying losses) and a note.
pub(crate) fn h100_all_with_train() -> Document<AllReport> {
    let mut doc = h100_all();
    let mut train: Vec<TrainReport> = doc.result.part("train").unwrap_or_default();
    for loss in [LossKind::Mse, LossKind::CrossEntropy] {
        let mut t = super::train::report(loss);
        t.step_losses = (0..60)
            .map(|k| 0.9 * (-(k as f64) / 20.0).exp() + 0.05)
            .collect();
        train.push(t);
    }
    doc.result.set_part("train", &train).unwrap();
    doc.notes.push("warning: a note under the tables".into());
    doc
}

fn count(h: &str, needle: &str) -> usize {
    h.matches(needle).count()
}

#[test]
fn the_h100_report_is_one_well_formed_page() {
    let doc = h100_all_with_train();
    let h = all_html(&doc);
    assert!(h.starts_with("<!DOCTYPE html>"), "{}", &h[..100]);
    for tag in ["<html", "</html>", "<head>", "<body>", "<main>", "<style>"] {
        assert_eq!(count(&h, tag), 1, "{tag}");
    }
    assert!(!h.to_lowercase().contains("<script"));
    assert!(
        !h.contains(" src=") && !h.contains("<link"),
        "nothing fetched"
    );
    // the H100 report has no profile, lessons or several-GPU parts
    let absent = ["profile", "lessons", "nccl", "p2p"];
    let ids = section_ids();
    let present: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !absent.contains(id))
        .collect();
    for id in ids {
        let want = usize::from(present.contains(&id));
        assert_eq!(count(&h, &format!("id=\"{id}\"")), want, "section {id}");
    }
    assert_eq!(count(&h, "<section "), present.len());
    assert_eq!(count(&h, "</section>"), present.len());
    // matmul GPU + CPU, bandwidth, conv, infer, memory, train
    assert_eq!(count(&h, "<svg"), 7);
    assert_eq!(count(&h, "</svg>"), 7);
    assert!(
        !h.contains("class=\"chart-error\""),
        "a chart failed to draw"
    );
    assert_eq!(count(&h, "<table>"), count(&h, "</table>"));
    assert!(count(&h, "<table>") > 10);
    assert!(!h.contains("<?xml"), "the SVGs' prologs are stripped");
    // the machine and the headline figures
    assert!(h.contains("NVIDIA H100 80GB HBM3"));
    assert!(h.contains("580.159.04"));
    assert!(h.contains("cuBLAS 13.1.0.3"));
    assert!(h.contains("782 TFLOP/s"), "best bf16 matmul");
    assert!(h.contains("24,494 images/s") || h.contains("24494 images/s"));
    assert!(h.contains("fp16-nhwc-graph on cuda:0, batch 32"));
    assert!(h.contains("1506 GB/s"), "best device-device copy");
    assert!(h.contains("@media print"));
}

#[test]
fn text_from_the_report_is_escaped() {
    let mut doc = h100_all_with_train();
    let mut infer: InferReport = doc.result.part("infer").unwrap();
    infer.rows[3].strategy = "<b>bold</b> & \"quoted\"".into();
    doc.result.set_part("infer", &infer).unwrap();
    let mut check: CheckReport = doc.result.part("check").unwrap();
    check.gpus[0].name = "<img src=x onerror=alert(1)>".into();
    doc.result.set_part("check", &check).unwrap();
    doc.notes.push("<script>alert(2)</script>".into());
    doc.result.command_line.push("</code><i>".into());
    let h = all_html(&doc);
    assert!(!h.contains("<b>bold"), "a strategy name is HTML");
    assert!(h.contains("&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;"));
    assert!(!h.contains("<img"));
    assert!(h.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(!h.to_lowercase().contains("<script"));
    assert!(!h.contains("<i>"));
    // every `<` left is one of the page's own tags
    for (i, _) in h.match_indices('<') {
        let rest = &h[i + 1..];
        let name: String = rest
            .trim_start_matches(['/', '!'])
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        assert!(
            [
                "DOCTYPE",
                "html",
                "head",
                "meta",
                "title",
                "style",
                "body",
                "main",
                "h1",
                "h2",
                "h3",
                "p",
                "code",
                "div",
                "section",
                "dl",
                "dt",
                "dd",
                "figure",
                "figcaption",
                "svg",
                "rect",
                "line",
                "polyline",
                "text",
                "circle",
                "path",
                "polygon",
                "g",
                "table",
                "thead",
                "tbody",
                "tr",
                "th",
                "td",
                "ul",
                "li",
                "strong",
                "defs",
            ]
            .contains(&name.as_str()),
            "unexpected tag <{name}: {}",
            &rest[..rest.len().min(80)]
        );
    }
}

#[test]
fn rows_without_a_figure_are_in_the_tables_but_never_drawn() {
    let mut doc = h100_all();
    // a failed matmul row that still carries a (wrong) rate, and a skipped one
    let mut matmul: MatmulReport = doc.result.part("matmul").unwrap();
    let m = &mut matmul.rows;
    m[1].status = RowStatus::Failed("wrong result".into());
    m[1].tflops = Some(1234.5);
    m[2].status = RowStatus::Skipped("too big".into());
    let failed_size = m[1].size as f64;
    let skipped_size = m[2].size as f64;
    let Chart::Lines(gpu) = &matmul_charts(&matmul)[0] else {
        panic!("matmul draws lines")
    };
    let f64_line = gpu.series.iter().find(|s| s.name == "f64").unwrap();
    assert!(!f64_line
        .points
        .iter()
        .any(|p| p.0 == failed_size || p.1 == 1234.5));
    assert!(!f64_line.points.iter().any(|p| p.0 == skipped_size));
    assert_eq!(f64_line.points.len(), 1);

    let mut infer: InferReport = doc.result.part("infer").unwrap();
    infer.rows[2].status = RowStatus::Failed("logits differ".into());
    let failed = (infer.rows[2].strategy.clone(), infer.rows[2].batch);
    let Some(Chart::Dots(dots)) = infer_chart(&infer) else {
        panic!("infer draws dots")
    };
    let cat = dots
        .categories
        .iter()
        .position(|c| c.starts_with(&format!("{} [", failed.0)))
        .unwrap();
    let batch = dots
        .series
        .iter()
        .find(|s| s.0 == format!("batch {}", failed.1))
        .unwrap();
    assert_eq!(batch.1[cat], None, "the failed row is not drawn");

    let mut mem: MemoryReport = doc.result.part("memory").unwrap();
    mem.rows[0].status = RowStatus::Failed("out of memory".into());
    let Some(Chart::Stacked(bars)) = memory_chart(&mem) else {
        panic!("memory draws bars")
    };
    assert_eq!(bars.categories.len(), mem.rows.len() - 1);

    for (key, v) in [
        ("matmul", serde_json::to_value(&matmul)),
        ("infer", serde_json::to_value(&infer)),
        ("memory", serde_json::to_value(&mem)),
    ] {
        doc.result.set_part(key, &v.unwrap()).unwrap();
    }
    let h = all_html(&doc);
    assert!(h.contains("<tr class=\"failed\">"));
    assert!(h.contains("FAILED: wrong result"));
    assert!(h.contains("<tr class=\"skipped\">"));
    assert!(h.contains("Failed(&quot;out of memory&quot;)"));
    let failed_rows: Vec<_> = h
        .match_indices("<tr class=\"failed\">")
        .map(|(i, _)| &h[i..i + 300])
        .collect();
    assert_eq!(failed_rows.len(), 3, "{failed_rows:#?}");
}

#[test]
fn sections_become_tables_with_escaped_cells() {
    let s = vec![
        Section {
            title: "A <grid>".into(),
            header: Some(vec!["name".into(), "value".into()]),
            rows: vec![
                vec!["a&b".into(), "1".into()],
                vec!["c".into(), "FAILED: <x>".into()],
            ],
            notes: vec!["note <n>".into()],
        },
        Section {
            title: "list".into(),
            header: None,
            rows: vec![vec!["key".into(), "v".into()]],
            notes: Vec::new(),
        },
    ];
    let h = sections_to_html(&s);
    assert!(h.contains("<h3>A &lt;grid&gt;</h3>"));
    assert!(h.contains("<thead><tr><th>name</th><th>value</th></tr></thead>"));
    assert!(h.contains("<tr><td>a&amp;b</td><td>1</td></tr>"));
    assert!(h.contains("<tr class=\"failed\"><td>c</td><td>FAILED: &lt;x&gt;</td></tr>"));
    assert!(h.contains("<li>note &lt;n&gt;</li>"));
    assert!(h.contains("<tr><th>key</th><td>v</td></tr>"));
    assert_eq!(h.matches("<table>").count(), 2);
}

#[test]
fn each_headline_card_writes_its_figure_as_its_table_does() {
    let mut doc = h100_all();
    // a best inference rate that rounding to a whole number would change
    let mut infer: InferReport = doc.result.part("infer").unwrap();
    let mut first = true;
    for row in infer.rows.iter_mut().filter(|r| r.status == RowStatus::Ok) {
        row.images_per_s = Some(if first { 34.6 } else { 1.5 });
        first = false;
    }
    doc.result.set_part("infer", &infer).unwrap();
    let h = all_html(&doc);
    assert!(
        h.contains("<div class=\"v\">34.6 images/s</div>"),
        "the card"
    );
    assert!(h.contains("<td>34.6</td>"), "the table");
    assert!(!h.contains("35.0 images/s") && !h.contains(">35 images/s"));
    // every rate on a card is a cell of a table, written the same way
    let cards: Vec<&str> = h
        .split("<div class=\"v\">")
        .skip(1)
        .filter_map(|c| c.split("</div>").next())
        .collect();
    let mut rates = 0;
    for card in &cards {
        let Some(figure) = [" TFLOP/s", " GB/s", " images/s"]
            .iter()
            .find_map(|unit| card.strip_suffix(unit))
        else {
            continue;
        };
        rates += 1;
        assert!(
            h.contains(&format!("<td>{figure}</td>")) || h.contains(&format!("<td>{figure} (")),
            "card {card:?}: no table cell reads {figure:?}"
        );
    }
    assert!(rates >= 5, "{cards:?}");
    // the largest batch, as memory's note under its table writes it
    let batch = doc
        .result
        .part::<MemoryReport>("memory")
        .unwrap()
        .max_batch
        .as_ref()
        .unwrap()
        .batch;
    assert!(cards.contains(&batch.to_string().as_str()), "{cards:?}");
    assert!(h.contains(&format!("largest batch that fits: {batch} (")));
}
