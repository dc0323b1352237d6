//! `gpukit memory`: the context's cost, then what each batch size holds on the GPU, and pinned
//! against pageable host memory for uploads.

use super::fmt::mib;
use super::Section;

/// `gpukit memory`.
pub fn memory_sections(r: &gpukit_bench::memory::MemoryReport) -> Vec<Section> {
    let opt = |v: Option<u64>| v.map(mib).unwrap_or_else(|| "-".into());
    let c = &r.context;
    let mut setup = Section::kv(
        format!(
            "GPU memory: {} {} {} on {}",
            r.model, r.precision, r.layout, r.device
        ),
        vec![
            (
                "Device",
                format!(
                    "{} total{}",
                    mib(r.total_bytes),
                    r.limit_bytes
                        .map(|l| format!(", gpukit limited to {} (--memory-fraction)", mib(l)))
                        .unwrap_or_default()
                ),
            ),
            (
                "CUDA context",
                format!(
                    "device used {} before, {} after opening; this process: {} = {} for the \
                     context, loaded kernels and driver state + {} of library workspaces \
                     (cuDNN's, and cuBLAS's where a batch's classifier runs on it) from the \
                     pool",
                    opt(c.device_used_before),
                    opt(c.device_used_after),
                    opt(c.process_used),
                    opt(c.context_and_code),
                    mib(c.pool_used)
                ),
            ),
            (
                "Algorithms",
                match r.max_workspace_bytes {
                    Some(b) => format!(
                        "the fastest cuDNN algorithms that need at most {} of workspace \
                         (--max-workspace)",
                        mib(b)
                    ),
                    None => {
                        "the fastest cuDNN algorithms (up to 256 MiB of workspace each)".to_string()
                    }
                },
            ),
            (
                "Baseline",
                format!(
                    "pool used {} / reserved {} after the weights and the libraries' workspaces",
                    mib(r.baseline_used),
                    mib(r.baseline_reserved)
                ),
            ),
        ],
    );
    setup.notes.push(
        "The context and kernels are not allocations: an allocator's counter (PyTorch's \
         memory_allocated) cannot see them; NVML's per-process figure can."
            .into(),
    );
    let rows = r
        .rows
        .iter()
        .map(|x| {
            let status = match &x.status {
                gpukit_bench::report::RowStatus::Ok => "ok".to_string(),
                other => format!("{other:?}"),
            };
            vec![
                if x.batch == x.batch_requested {
                    x.batch.to_string()
                } else {
                    format!("{} (asked {})", x.batch, x.batch_requested)
                },
                mib(x.weights_bytes),
                mib(x.input_bytes),
                format!(
                    "{} ({} without plan{})",
                    mib(x.arena_bytes),
                    mib(x.arena_without_plan_bytes),
                    if x.in_place { "; in place" } else { "" }
                ),
                mib(x.conv_workspace_bytes),
                mib(x.planning_used_peak),
                mib(x.pool_used_peak),
                mib(x.pool_reserved_peak),
                opt(x.process_used),
                x.ms_per_batch
                    .map(|m| format!("{m:.2} ms"))
                    .unwrap_or_default(),
                format!("{} ({:+} B)", mib(x.pool_reserved_after), x.leak_bytes),
                status,
            ]
        })
        .collect();
    let mut notes: Vec<String> = r.rows.iter().filter_map(|x| x.note.clone()).collect();
    notes.push(
        "pool peak used: the most the pool held while running the batch (weights, input, \
         activations, workspaces; what PyTorch's max_memory_allocated counts); planning peak: \
         the same while choosing algorithms (a 256 MiB search workspace, the in-place check), \
         given back before running. \"in place\": each block writes its output over its \
         shortcut, checked per convolution shape against the output written elsewhere."
            .into(),
    );
    if let Some(m) = &r.max_batch {
        notes.push(format!(
            "largest batch that fits: {} ({}; {} attempts in {:.1} s; pool reserved after: {}, {})",
            m.batch,
            m.first_failure
                .map(|f| format!("{f} did not"))
                .unwrap_or_else(|| "the search cap was reached".into()),
            m.attempts,
            m.seconds,
            mib(m.pool_reserved_after),
            if m.back_to_baseline {
                "back at the baseline"
            } else {
                "NOT back at the baseline"
            }
        ));
    }
    let mut sections = vec![
        setup,
        Section {
            title: "Per batch size".into(),
            header: Some(
                [
                    "batch",
                    "weights",
                    "input",
                    "activations (planned)",
                    "cuDNN workspace",
                    "planning peak",
                    "pool peak used",
                    "pool peak reserved",
                    "NVML process",
                    "per batch",
                    "after (vs baseline)",
                    "status",
                ]
                .map(String::from)
                .to_vec(),
            ),
            rows,
            notes,
        },
    ];
    if let Some(p) = &r.pinned {
        sections.push(Section {
            title: format!("Host memory for uploads ({} each)", mib(p.bytes)),
            header: Some(
                [
                    "host memory",
                    "allocate + first touch",
                    "free",
                    "host->device",
                ]
                .map(String::from)
                .to_vec(),
            ),
            rows: vec![
                vec![
                    "pageable (a Vec)".into(),
                    format!("{:.1} ms", p.pageable_alloc_ms),
                    String::new(),
                    format!("{:.1} GB/s", p.pageable_h2d_gb_s),
                ],
                vec![
                    "pinned (cuMemHostAlloc)".into(),
                    format!("{:.1} ms", p.pinned_alloc_ms),
                    format!("{:.1} ms", p.pinned_free_ms),
                    format!("{:.1} GB/s", p.pinned_h2d_gb_s),
                ],
            ],
            notes: vec![
                "Pinned memory copies at the link's speed and asynchronously, but costs more to \
                 allocate and free and is taken from the host's RAM for good: allocate it once \
                 and reuse it (a DataLoader's pin_memory). Every copy checked byte-exact; \
                 median of 5. All sizes and directions: gpukit bench bandwidth."
                    .into(),
            ],
        });
    }
    sections
}
