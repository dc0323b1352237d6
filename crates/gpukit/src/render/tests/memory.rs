//! `gpukit memory`: the context's cost, batch sizes that ran (one halved after running out of
//! memory, one that leaked), the largest batch that fits, pinned host memory.

use super::{assert_drawn, terminal};
use crate::render::memory_sections;
use gpukit_bench::memory::{ContextCost, MaxBatch, MemoryReport, MemoryRow, PinnedHost};
use gpukit_bench::report::RowStatus;

fn row(batch: usize) -> MemoryRow {
    let per_image = (batch as u64) << 20;
    MemoryRow {
        batch_requested: batch,
        batch,
        status: RowStatus::Ok,
        note: None,
        weights_bytes: 100 << 20,
        input_bytes: per_image * 70 / 128,
        arena_bytes: per_image * 700 / 128,
        arena_without_plan_bytes: per_image * 5600 / 128,
        conv_workspace_bytes: 0,
        pool_used_peak: (100 << 20) + per_image * 710 / 128,
        pool_reserved_peak: (128 << 20) + per_image * 712 / 128,
        planning_used_peak: (100 << 20) + per_image * 800 / 128,
        in_place: true,
        process_used: None,
        pool_reserved_after: 128 << 20,
        leak_bytes: 0,
        ms_per_batch: Some(batch as f64 * 0.234),
        images_per_s: Some(4266.0),
    }
}

fn report() -> MemoryReport {
    let mut leaked = row(256);
    leaked.status = RowStatus::Failed(
        "memory leaked: the pool holds 104857600 bytes used / 136314880 reserved after the \
         batch, 104857600 / 134217728 before"
            .into(),
    );
    leaked.pool_reserved_after = 130 << 20;
    leaked.leak_bytes = 2 << 20;
    let mut halved = row(1024);
    halved.batch_requested = 2048;
    halved.note = Some("batch 2048 ran out of memory; halved to 1024 (--on-oom halve)".into());
    halved.process_used = Some(6_512 << 20);
    MemoryReport {
        model: "resnet50".into(),
        precision: "fp32".into(),
        layout: "NCHW".into(),
        device: "cuda:0 test".into(),
        total_bytes: 80 << 30,
        limit_bytes: None,
        max_workspace_bytes: Some(0),
        context: ContextCost {
            device_used_before: Some(4 << 20),
            device_used_after: Some(612 << 20),
            process_used: Some(606 << 20),
            pool_used: 64 << 20,
            context_and_code: Some(542 << 20),
        },
        baseline_used: 100 << 20,
        baseline_reserved: 128 << 20,
        rows: vec![row(128), leaked, halved],
        max_batch: Some(MaxBatch {
            batch: 1536,
            first_failure: Some(1537),
            attempts: 12,
            seconds: 9.84,
            pool_reserved_after: 128 << 20,
            back_to_baseline: true,
        }),
        pinned: Some(PinnedHost {
            bytes: 256 << 20,
            pageable_alloc_ms: 40.0,
            pinned_alloc_ms: 90.0,
            pinned_free_ms: 30.0,
            pageable_h2d_gb_s: 9.5,
            pinned_h2d_gb_s: 55.0,
        }),
    }
}

#[test]
fn memory_report_shows_rows_workspace_cap_and_pinned_memory() {
    let sections = memory_sections(&report());
    let text = terminal(&sections);
    assert!(text.contains("at most 0.0 MiB of workspace"), "{text}");
    assert!(text.contains("in place"), "{text}");
    assert!(
        text.contains("810.0 MiB") && text.contains("900.0 MiB"),
        "{text}"
    );
    assert!(
        text.contains("pinned (cuMemHostAlloc)") && text.contains("55.0 GB/s"),
        "{text}"
    );
    assert_drawn("memory", &sections);
}

#[test]
fn memory_without_a_cap_or_pinned_figures() {
    let mut r = report();
    r.max_workspace_bytes = None;
    r.limit_bytes = Some(40 << 30);
    r.pinned = None;
    r.max_batch = Some(MaxBatch {
        first_failure: None,
        back_to_baseline: false,
        ..r.max_batch.clone().unwrap()
    });
    let sections = memory_sections(&r);
    assert_eq!(sections.len(), 2, "no host-memory section without figures");
    let text = terminal(&sections);
    assert!(
        text.contains("81920.0 MiB total, gpukit limited to 40960.0 MiB (--memory-fraction)"),
        "{text}"
    );
    assert!(
        text.contains("the fastest cuDNN algorithms (up to 256 MiB of workspace each)"),
        "{text}"
    );
    assert!(
        text.contains("the search cap was reached") && text.contains("NOT back at the baseline"),
        "{text}"
    );
}
