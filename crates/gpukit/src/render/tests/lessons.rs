//! `gpukit lessons`: a lesson that measured its cases beside one that was skipped (no GPU).

use super::{assert_drawn, terminal};
use crate::render::{lessons_sections, to_markdown};
use gpukit_bench::lessons::{Case, Lesson, LessonsReport, Regime, Verdict};
use gpukit_bench::stats::Summary;

fn case(name: &str, median: f64) -> Case {
    Case {
        name: name.into(),
        what: format!("{name}, as the notebook writes it"),
        ms: Summary {
            count: 15,
            median,
            p10: median * 0.97,
            p90: median * 1.04,
            min: median * 0.95,
            max: median * 1.1,
            mean: median,
            cv: 0.02,
        },
        calls_per_sample: 8,
        peak_mib: None,
        flops: None,
        bytes: Some(4.0 * (1 << 24) as f64),
        launches: 1,
        tflops: None,
        gbs: Some(4.0 * (1 << 24) as f64 / (median * 1e-3) / 1e9),
        intensity: None,
        regime: Some(Regime::Memory),
        pytorch: None,
        pytorch_peak_mib: None,
        vs_pytorch: None,
    }
}

fn lesson(id: &str, title: &str, claim: &str) -> Lesson {
    Lesson {
        id: id.into(),
        title: title.into(),
        claim: claim.into(),
        notebook: None,
        cases: Vec::new(),
        comparisons: Vec::new(),
        overlaps: Vec::new(),
        profile: Vec::new(),
        verdict: Verdict::Measured,
        reason: String::new(),
        evidence: Vec::new(),
        pytorch_notes: Vec::new(),
        failed: false,
    }
}

fn report() -> LessonsReport {
    let mut skipped = lesson(
        "0",
        "The CUDA context's memory",
        "CUDA kernels consume 1-2 GB regardless of your model size",
    );
    skipped.verdict = Verdict::Skipped;
    skipped.reason = "needs a GPU: it measures the CUDA context".into();
    let mut measured = lesson(
        "2",
        "Contiguous memory",
        "a transposed view copies before it is summed",
    );
    measured.cases = vec![case("contiguous", 0.8), case("transposed", 2.4)];
    measured.verdict = Verdict::Holds;
    measured.reason = "the transposed sum takes 3.00x as long".into();
    LessonsReport {
        device: "cpu".into(),
        method: "samples of k calls ended by one synchronize".into(),
        pytorch: None,
        lessons: vec![skipped, measured],
    }
}

#[test]
fn lessons_terminal_and_markdown() {
    assert_drawn("lessons", &lessons_sections(&report()));
}

#[test]
fn a_skipped_lesson_is_one_line_saying_why_and_no_table() {
    let sections = lessons_sections(&report());
    let skipped = &sections[1];
    assert_eq!(skipped.title, "Lesson 0: The CUDA context's memory");
    assert!(skipped.header.is_none() && skipped.rows.is_empty());
    assert_eq!(
        skipped.notes,
        vec!["Skipped: needs a GPU: it measures the CUDA context".to_string()]
    );

    let text = terminal(&sections[1..2]);
    assert_eq!(
        text,
        "\nLesson 0: The CUDA context's memory\n  Skipped: needs a GPU: it measures the CUDA context\n"
    );
    let md = to_markdown(&sections[1..2], 3);
    assert_eq!(
        md,
        "\n### Lesson 0: The CUDA context's memory\n\nSkipped: needs a GPU: it measures the CUDA context\n"
    );
    let html = crate::render::html::sections_to_html(&sections[1..2]);
    assert!(!html.contains("<table"), "{html}");
    assert!(html.contains("Skipped: needs a GPU"), "{html}");
}
