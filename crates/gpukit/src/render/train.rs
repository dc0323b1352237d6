//! `gpukit train`: the run's set-up, then one row an epoch.

use super::Section;
use gpukit_bench::workload::train::{classifies, TrainReport};

/// `gpukit train`.
pub fn train_sections(r: &TrainReport) -> Vec<Section> {
    let c = &r.config;
    let o = &c.optimizer;
    let widths: Vec<String> = c.widths.iter().map(usize::to_string).collect();
    let optimizer = match o.kind {
        gpukit_train::optim::OptimizerKind::Sgd => format!(
            "sgd, lr {}, momentum {}, weight decay {}",
            o.lr, o.momentum, o.weight_decay
        ),
        kind => format!(
            "{}, lr {}, betas 0.9/0.999, weight decay {}",
            kind.name(),
            o.lr,
            o.weight_decay
        ),
    };
    let mut setup = Section::kv(
        format!(
            "Training{} on {} ({})",
            r.preset
                .map(|p| format!(" ({})", p.name()))
                .unwrap_or_default(),
            r.device,
            r.precision
        ),
        vec![
            (
                "Model",
                format!(
                    "MLP {} (ReLU between), {} parameters; initial weights: {}",
                    widths.join("-"),
                    r.parameters,
                    r.initial_weights
                ),
            ),
            (
                "Data",
                format!(
                    "{} training samples x {} features, {} held out; {}",
                    r.samples, r.features, r.eval_samples, r.data
                ),
            ),
            (
                "Loop",
                format!(
                    "{} loss, {optimizer}; batch {}{}, {} epoch(s){}{}",
                    c.loss.name(),
                    c.batch_size,
                    if c.accumulate > 1 {
                        format!(" x {} accumulated", c.accumulate)
                    } else {
                        String::new()
                    },
                    c.epochs,
                    if c.shuffle {
                        format!(", shuffled (seed {})", c.seed)
                    } else {
                        ", in data order".to_string()
                    },
                    c.max_steps
                        .map(|s| format!(", at most {s} updates"))
                        .unwrap_or_default()
                ) + if c.checkpoint_activations {
                    ", activations checkpointed"
                } else {
                    ""
                },
            ),
        ],
    );
    if let (Some(from), Some(at)) = (&r.resumed_from, r.resumed_at) {
        setup.rows.push(vec![
            "Resumed".into(),
            format!(
                "{} at update {} (epoch {}, batch {})",
                from.display(),
                at.step,
                at.epoch + 1,
                at.batch + 1
            ),
        ]);
    }
    if let Some(g) = &r.gpu {
        setup.rows.push(vec![
            "GPU path".into(),
            format!(
                "{} loader, {}; set-up (kernels, products planned{}) {:.1} ms",
                g.loader.name(),
                if g.graph {
                    "each epoch replayed from a CUDA graph"
                } else {
                    "kernels launched one by one"
                },
                if g.graph { ", graphs captured" } else { "" },
                g.setup_seconds * 1e3
            ),
        ]);
        setup
            .rows
            .push(vec!["Epilogues".into(), g.epilogues.join("; ")]);
        if let Some((scale, growth)) = g.scaler {
            setup.rows.push(vec![
                "Loss scale".into(),
                format!(
                    "{scale} at the end ({growth} clean updates since it last changed); {} \
                     update(s) skipped for inf/NaN gradients",
                    g.skipped_updates
                ),
            ]);
        }
    }
    let accuracy = classifies(r);
    let mut header = vec!["epoch", "batches", "updates", "train loss"];
    if accuracy {
        header.push("train acc.");
    }
    header.push("eval loss");
    if accuracy {
        header.push("eval acc.");
    }
    header.extend(["ms", "samples/s"]);
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |a| format!("{:.1}%", 100.0 * a));
    let rows = r
        .epochs
        .iter()
        .map(|e| {
            let mut row = vec![
                format!("{}{}", e.epoch, if e.complete { "" } else { " (part)" }),
                e.batches.to_string(),
                e.steps.to_string(),
                format!("{:.6}", e.train_loss),
            ];
            if accuracy {
                row.push(pct(e.train_accuracy));
            }
            row.push(e.eval_loss.map_or("-".into(), |l| format!("{l:.6}")));
            if accuracy {
                row.push(pct(e.eval_accuracy));
            }
            row.push(format!("{:.3}", e.seconds * 1e3));
            row.push(format!("{:.0}", e.samples_per_s));
            row
        })
        .collect();
    let mut notes = vec![format!(
        "{} update(s) in {:.3} s of training (evaluation not counted); train loss: the mean of the epoch's batch losses",
        r.step_losses.len(),
        r.seconds
    )];
    if let Some(p) = &r.saved_checkpoint {
        notes.push(format!(
            "checkpoint written to {} (resume with --resume; it continues at update {})",
            p.display(),
            r.final_position.step + 1
        ));
    }
    if let Some(p) = &r.saved_losses {
        notes.push(format!("every update's loss written to {}", p.display()));
    }
    let mut sections = vec![
        setup,
        Section {
            title: "Epochs".into(),
            header: Some(header.into_iter().map(String::from).collect()),
            rows,
            notes,
        },
    ];
    sections.push(memory_section(r));
    if let Some(pp) = &r.pipeline {
        sections.push(pipeline_section(pp));
    }
    if let Some(dp) = &r.data_parallel {
        sections.push(data_parallel_section(dp, &r.memory));
    }
    if let Some(p) = &r.pytorch {
        sections.push(peer_section(p));
    }
    sections
}

/// What the engine held, part by part; with accumulation, the activations a batch K times
/// larger would have needed instead.
fn memory_section(r: &TrainReport) -> Section {
    let m = &r.memory;
    let kib = |b: usize| format!("{:.1} KiB", b as f64 / 1024.0);
    let mut rows = vec![
        (
            "weights",
            match r.data_parallel.as_ref().filter(|d| d.sharded_optimizer) {
                Some(d)
                    if r.gpu
                        .as_ref()
                        .is_some_and(|g| matches!(g.precision.name(), "fp16" | "bf16")) =>
                {
                    format!(
                        "{} (this GPU's 1/{} of the f32 weights and the whole 16-bit copy)",
                        kib(m.weights),
                        d.ranks
                    )
                }
                _ => kib(m.weights),
            },
        ),
        ("gradients", kib(m.gradients)),
        (
            "optimizer state",
            match r.data_parallel.as_ref().filter(|d| d.sharded_optimizer) {
                Some(d) => format!(
                    "{} (sharded: this GPU's 1/{} of the moments)",
                    kib(m.optimizer_state),
                    d.ranks
                ),
                None => kib(m.optimizer_state),
            },
        ),
        ("activations", kib(m.activations)),
        ("workspace", kib(m.workspace)),
        ("total", kib(m.total())),
    ];
    let k = r.config.accumulate;
    if k > 1 {
        rows.push((
            "without accumulation",
            format!(
                "one batch of {} instead of {k} of {}: activations {} (they grow with the batch), \
                 total {}",
                k * r.config.batch_size,
                r.config.batch_size,
                kib(m.activations * k),
                kib(m.total() + m.activations * (k - 1))
            ),
        ));
    }
    if r.config.checkpoint_activations {
        rows.push((
            "without checkpointing",
            format!(
                "every layer output kept: activations {} instead of {} (segments of {} layers \
                 recomputed in backward)",
                kib(m.activations_all_kept),
                kib(m.activations),
                r.config.segment()
            ),
        ));
    }
    if m.data > 0 {
        rows.push(("data set (resident)", kib(m.data)));
    }
    if let Some(peak) = m.pool_peak {
        rows.push((
            "memory pool peak",
            format!(
                "{} (live buffers at their peak, data included)",
                kib(peak as usize)
            ),
        ));
    }
    let on_gpu = r.gpu.is_some();
    let mut s = Section::kv(
        if on_gpu {
            "Memory (GPU, held by the engine)"
        } else {
            "Memory (host, held by the engine: its buffers' peaks)"
        },
        rows,
    );
    s.notes.push(if on_gpu {
        "weights in f32 (plus their 16-bit copy in fp16/bf16), gradients in f32; the optimizer keeps one buffer a parameter (SGD with momentum) or two (Adam, AdamW); workspace includes cuBLASLt's 32 MiB".into()
    } else {
        "weights and gradients in f32; the optimizer keeps one buffer a parameter (SGD with momentum) or two (Adam, AdamW)".into()
    });
    s
}

/// The same loop in PyTorch: how far apart the loss curves are, and both loops' times.
fn peer_section(p: &gpukit_bench::workload::train::TrainPeer) -> Section {
    let ms = |s: f64| format!("{:.3} ms", s * 1e3);
    let verdict = match (p.comparable(), p.disagreement()) {
        (false, _) => "not held to each other: the two scalers skipped different updates",
        (true, None) => "the same training",
        (true, Some(_)) => "DIFFERENT training",
    };
    Section::kv(
        format!(
            "Beside PyTorch {} on {}",
            p.torch_version,
            p.device_name.as_deref().unwrap_or("the same device")
        ),
        vec![
            (
                "Losses",
                format!(
                    "{} updates on the same data, weights and batch order: the first {} within \
                     {:.1e} (tolerance {:.0e}), the last {:.1e} apart (tolerance {:.0e}), the \
                     largest {:.1e} at update {}: {verdict}",
                    p.step_losses.len(),
                    gpukit_bench::workload::train::PEER_EARLY_UPDATES.min(p.step_losses.len()),
                    p.early_difference,
                    p.tolerance,
                    p.final_difference,
                    p.final_tolerance,
                    p.max_relative_difference,
                    p.at_update
                ),
            ),
            (
                "Time",
                format!(
                    "gpukit {} / PyTorch {} (medians of {} runs each, the loop only): gpukit \
                     takes {:.2}x PyTorch's time",
                    ms(p.gpukit_seconds_median),
                    ms(p.seconds_median),
                    p.seconds.len(),
                    p.gpukit_seconds_median / p.seconds_median
                ),
            ),
        ]
        .into_iter()
        .chain(p.peak_bytes.zip(p.gpukit_peak_bytes).map(|(theirs, ours)| {
            (
                "Peak memory",
                format!(
                    "gpukit {:.1} MiB / PyTorch {:.1} MiB (its memory pool's live peak / \
                     torch.cuda.max_memory_allocated, data included)",
                    ours as f64 / 1048576.0,
                    theirs as f64 / 1048576.0
                ),
            )
        }))
        .chain(p.skipped_updates.map(|(theirs, ours)| {
            (
                "Skipped updates",
                format!(
                    "PyTorch's GradScaler {theirs}, gpukit {ours} (gpukit keeps weight gradients \
                     in f32, where they overflow later than autocast's fp16 ones)"
                ),
            )
        }))
        .collect(),
    )
}

/// gpukit's memory pool peak beside PyTorch's data-parallel modes' (None when PyTorch's were
/// not read): gpukit's without its resident data set, which PyTorch's runs do not hold (they
/// keep one batch, as gpukit keeps its batch buffers).
fn peer_memory_row(
    peaks: &gpukit_bench::workload::train::parallel::PeerPeaks,
    memory: &gpukit_train::run::MemoryUse,
) -> Option<String> {
    let ours = memory.pool_peak?;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let modes: Vec<String> = [
        ("DDP", peaks.ddp),
        ("DDP with ZeroRedundancyOptimizer", peaks.zero),
        ("DDP compiled", peaks.compiled),
    ]
    .into_iter()
    .filter_map(|(name, b)| b.map(|b| format!("{name} {:.0} MiB", mib(b))))
    .collect();
    if modes.is_empty() {
        return None;
    }
    let data = memory.data as u64;
    Some(format!(
        "gpukit {:.0} MiB (its memory pool's live peak, less its resident data set of {:.0} MiB) / \
         PyTorch {} (torch.cuda.max_memory_allocated of its busiest GPU: model, gradients, \
         optimizer state, activations and its one batch)",
        mib(ours.saturating_sub(data)),
        mib(data),
        modes.join(", ")
    ))
}

/// Data-parallel training: how the ranks scaled against each GPU doing its share alone, and
/// PyTorch DDP's scaling on the same model beside it.
fn data_parallel_section(
    d: &gpukit_bench::workload::train::parallel::DataParallel,
    memory: &gpukit_train::run::MemoryUse,
) -> Section {
    let ms = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut rows = vec![
        (
            "Ranks",
            format!(
                "{} GPUs ({}), {} rows each of every combined batch of {}",
                d.ranks, d.started_by, d.batch_per_gpu, d.combined_batch
            ),
        ),
        (
            "Gradients",
            format!(
                "{:.1} MiB {} in {}{} bucket(s) of about {:.0} MiB, each launched as soon as backward has finished its layers{}",
                d.gradient_mib,
                if d.sharded_optimizer { "reduce-scattered" } else { "averaged" },
                if d.grad_comm == "bf16" { "bf16 (rounded), " } else { "" },
                d.buckets,
                d.bucket_mb,
                if d.first_layer_exchanged {
                    format!(
                        "; every block carried to the GPU that updates it by the copy engines (no communication kernel), the first layer's weight gradient in {} pieces, one a GPU, the others' computed first and each sent while the next is computed; the averaging done in the optimizer's pass",
                        d.grad_pieces
                    )
                } else if d.grad_pieces > 1 {
                    format!(
                        "; the first layer's weight gradient in {} pieces, each averaged as soon as it is computed",
                        d.grad_pieces
                    )
                } else {
                    String::new()
                }
            ),
        ),
    ];
    if d.sharded_optimizer {
        rows.push((
            "Optimizer",
            format!(
                "sharded: each GPU keeps the optimizer's moments of 1/{} of the parameters and \
                 updates those (its block of every bucket); the updated weights are gathered in \
                 the order the next forward pass reads them{}",
                d.ranks,
                if d.weights_gathered_by_copies {
                    ", each GPU's copy engine writing its block into the others' 16-bit weights"
                } else {
                    ""
                }
            ),
        ));
    } else if let Some(why) = &d.unsharded_reason {
        rows.push(("Optimizer", format!("not sharded: {why}")));
    }
    if d.comm_sms > 0 {
        rows.push((
            "Products",
            format!(
                "planned for {} fewer multiprocessors, left to communication (the baseline alone uses all)",
                d.comm_sms
            ),
        ));
    }
    rows.extend([
        (
            "Step time",
            format!(
                "{} ms data-parallel (each rank) vs {} ms for the same batches on each GPU alone",
                ms(&d.step_ms),
                ms(&d.single_step_ms)
            ),
        ),
        (
            "Throughput",
            format!(
                "{:.0} samples/s on {} GPUs, {:.0} per GPU; one GPU alone: {:.0}",
                d.samples_per_s,
                d.ranks,
                d.samples_per_s / d.ranks.max(1) as f64,
                d.single_samples_per_s
            ),
        ),
        (
            "Scaling efficiency",
            if d.exposed_comm_ms >= 0.0 {
                format!(
                    "{:.3} ({:.2} ms a step of communication backward did not hide)",
                    d.scaling_efficiency, d.exposed_comm_ms
                )
            } else {
                format!(
                    "{:.3} (a step {:.2} ms shorter than each GPU alone: the update's work is shared)",
                    d.scaling_efficiency, -d.exposed_comm_ms
                )
            },
        ),
    ]);
    if let Some(p) = &d.pytorch {
        rows.push((
            "PyTorch DDP",
            format!(
                "{:.0} samples/s on {} GPUs, one GPU {:.0}: efficiency {:.3} (PyTorch {}); gpukit's throughput {:.2}x",
                p.samples_per_s,
                d.ranks,
                p.single_samples_per_s,
                p.scaling_efficiency,
                p.torch_version,
                d.samples_per_s / p.samples_per_s
            ),
        ));
        if let Some((sps, eff)) = p.zero {
            rows.push((
                "PyTorch DDP, optimizer sharded",
                format!(
                    "{sps:.0} samples/s (ZeroRedundancyOptimizer): efficiency {eff:.3}; gpukit's throughput {:.2}x",
                    d.samples_per_s / sps
                ),
            ));
        }
        if let Some(c) = p.compiled {
            rows.push((
                "PyTorch DDP, compiled",
                format!(
                    "{:.0} samples/s (torch.compile, fused optimizer), one GPU {:.0}: efficiency {:.3}; gpukit's throughput {:.2}x",
                    c.samples_per_s,
                    c.single_samples_per_s,
                    c.scaling_efficiency,
                    d.samples_per_s / c.samples_per_s
                ),
            ));
        }
        if let Some(row) = peer_memory_row(&p.peaks, memory) {
            rows.push(("Peak memory a GPU", row));
        }
        let best = p.best_samples_per_s();
        if best.is_finite() {
            rows.push((
                "Against PyTorch's best",
                format!(
                    "gpukit's throughput {:.2}x PyTorch's fastest data-parallel mode ({best:.0} samples/s)",
                    d.samples_per_s / best
                ),
            ));
        }
    }
    Section::kv("Data-parallel", rows)
}

/// Pipeline-parallel training: the split, each stage busy against the pipeline's update, the
/// bubble against the schedule's, and the whole model on one GPU beside.
fn pipeline_section(p: &gpukit_bench::workload::train::pipeline::Pipeline) -> Section {
    let ms = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let stage_cost: Vec<f64> = p
        .layers
        .iter()
        .map(|&(a, b)| p.layer_ms[a..b].iter().sum())
        .collect();
    let step_cost: Vec<f64> = p
        .layers
        .iter()
        .map(|&(a, b)| p.layer_update_ms.get(a..b).map_or(0.0, |v| v.iter().sum()))
        .collect();
    let steps = if p.layer_update_ms.is_empty() {
        String::new()
    } else {
        format!("; optimizer steps about {} ms", ms(&step_cost))
    };
    let mut rows = vec![
        (
            "Stages",
            format!(
                "{} GPUs ({}), layers {}{} (products of a micro-batch {} ms a stage{steps})",
                p.stages,
                if p.started_by.is_empty() {
                    "threads in one process"
                } else {
                    &p.started_by
                },
                p.layers
                    .iter()
                    .map(|(a, b)| format!("{}-{}", a + 1, b))
                    .collect::<Vec<_>>()
                    .join(" | "),
                if p.split_given {
                    " as --pipeline-split gave them"
                } else {
                    ""
                },
                ms(&stage_cost)
            ),
        ),
        (
            "Schedule",
            format!(
                "1F1B, {} micro-batches of up to {} rows a batch; activations and their gradients through {}",
                p.micro_batches,
                p.micro_rows,
                if p.transfers.is_empty() {
                    "NCCL send/receive"
                } else {
                    &p.transfers
                }
            ),
        ),
        (
            "Step time",
            format!(
                "{} ms in the pipeline (each stage) vs {} ms each stage's micro-batches alone",
                ms(&p.step_ms),
                ms(&p.alone_step_ms)
            ),
        ),
        (
            "Bubble",
            format!(
                "{:.3} of the update idle on the busiest stage; {:.3} without the optimizer steps (the first stage's, {:.2} ms, the others wait for at every flush); the schedule's with equal stages {:.3}",
                p.bubble,
                p.bubble_without_flush,
                p.optimizer_ms.first().copied().unwrap_or(0.0),
                p.bubble_schedule
            ),
        ),
        ("Throughput", format!("{:.0} samples/s", p.samples_per_s)),
        (
            "Peak GPU memory",
            p.stage_peak_bytes
                .iter()
                .map(|&b| format!("{:.2} GiB", gib(b)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
    ];
    if let Some(why) = &p.one_gpu_refused {
        rows.push(("One GPU, --memory-fraction", format!("refused: {why}")));
    }
    match &p.one_gpu {
        Some(o) => rows.push((
            "One GPU, same batches",
            format!(
                "{:.0} samples/s ({:.2} ms an update{}, {:.2} GiB); per-update losses within {:.1e} of the pipeline's (allowed {:.0e}); the pipeline {:.2}x",
                o.samples_per_s,
                o.step_ms,
                if o.graph { ", CUDA graph" } else { "" },
                gib(o.peak_bytes),
                o.max_loss_rel_diff,
                o.tolerance,
                p.samples_per_s / o.samples_per_s
            ),
        )),
        None => rows.push((
            "One GPU, same batches",
            "not run: the whole model does not fit one GPU (the losses were not compared)".into(),
        )),
    }
    if let Some(t) = &p.pytorch {
        rows.push((
            "PyTorch pipelining",
            format!(
                "{:.0} samples/s (Schedule1F1B, the same split and micro-batches, PyTorch {}; {:.2} ms an update); gpukit {:.2}x",
                t.samples_per_s,
                t.torch_version,
                t.step_ms,
                p.samples_per_s / t.samples_per_s
            ),
        ));
    }
    Section::kv("Pipeline-parallel", rows)
}
