//! `gpukit train --model`: the run's set-up, one row an update, then its speed and memory.

use super::Section;
use gpukit_bench::workload::train::cnn::CnnTrainReport;
use gpukit_bench::workload::train::cnn_parallel::CnnDataParallel;
use gpukit_bench::workload::train::cnn_peer::CnnPeer;
use gpukit_train::optim::OptimizerKind;
use gpukit_types::resources::human_bytes;

/// `gpukit train --model resnet50`.
pub fn cnn_train_sections(r: &CnnTrainReport) -> Vec<Section> {
    let o = &r.optimizer;
    let optimizer = match o.kind {
        OptimizerKind::Sgd => format!(
            "sgd, lr {}, momentum {}{}, weight decay {}",
            o.lr,
            o.momentum,
            if o.nesterov { " (Nesterov)" } else { "" },
            o.weight_decay
        ),
        kind => format!(
            "{}, lr {}, betas 0.9/0.999, weight decay {}",
            kind.name(),
            o.lr,
            o.weight_decay
        ),
    };
    let setup = Section::kv(
        format!(
            "Training {} on {} ({})",
            r.model, r.device, r.precision
        ),
        vec![
            (
                "Model",
                format!(
                    "{}, {} classes, {} parameters; initial weights: {}",
                    r.model, r.classes, r.parameters, r.initial_weights
                ),
            ),
            (
                "Data",
                format!(
                    "{} images of 3x{}x{}; {}",
                    r.images, r.image_size.0, r.image_size.1, r.data
                ),
            ),
            (
                "Loop",
                format!(
                    "cross-entropy{}, {optimizer}; batch {}, {} update(s), batches ordered by seed {}",
                    if r.label_smoothing > 0.0 {
                        format!(" (label smoothing {})", r.label_smoothing)
                    } else {
                        String::new()
                    },
                    if r.accumulate > 1 {
                        format!(
                            "{} ({} micro-batches of {} an update, their gradients summed)",
                            r.accumulate * r.batch_size,
                            r.accumulate,
                            r.batch_size
                        )
                    } else {
                        r.batch_size.to_string()
                    },
                    r.updates.len(),
                    r.seed
                ),
            ),
        ],
    );
    let rows = r
        .updates
        .iter()
        .map(|u| {
            vec![
                u.step.to_string(),
                format!("{:.6}", u.loss),
                format!("{:.1}%", 100.0 * u.accuracy),
                format!("{:.3}", u.seconds * 1e3),
            ]
        })
        .collect();
    let mut notes = Vec::new();
    if let Some(scale) = r.loss_scale {
        notes.push(format!(
            "fp16 loss scale {scale} at the end (GradScaler's rules from 65536); {} update(s) \
             skipped on an overflow",
            r.skipped_updates
        ));
    }
    if let Some(p) = &r.saved_losses {
        notes.push(format!("every update's loss written to {}", p.display()));
    }
    if r.checkpoint_activations {
        notes.push(
            "activation checkpointing: each residual block kept only its output through the \
             forward; its other maps were recomputed in its backward stage (the batch-norm \
             running statistics moved once)"
                .into(),
        );
    }
    let updates = Section {
        title: "Updates".into(),
        header: Some(
            ["update", "loss", "batch acc.", "ms"]
                .map(String::from)
                .to_vec(),
        ),
        rows,
        notes,
    };
    let mut speed = vec![
        ("Set-up", format!("{:.3} s", r.setup_seconds)),
        (
            "First update",
            format!(
                "{:.3} s (to the first update: {:.3} s)",
                r.first_step_seconds,
                r.setup_seconds + r.first_step_seconds
            ),
        ),
        (
            "Images/s",
            r.images_per_s.map_or(
                "- (one update: the rate is taken over the updates after the first)".into(),
                |v| format!("{v:.1} over updates 2 to {}", r.updates.len()),
            ),
        ),
    ];
    if let Some(how) = &r.step_launch {
        speed.push(("Updates launched", how.clone()));
    }
    if let Some(from) = &r.batches_from {
        speed.push(("Batches from", from.clone()));
    }
    if let Some(b) = r.peak_gpu_bytes {
        let parts: Vec<String> = r
            .gpu_memory
            .iter()
            .filter(|(_, bytes)| *bytes > 0)
            .map(|(name, bytes)| {
                // the plan's bounds as sizes, not byte counts
                let name = name.split(" (").next().unwrap_or(name);
                format!("{name} {}", human_bytes(*bytes))
            })
            .collect();
        let shown = match parts.is_empty() {
            true => human_bytes(b),
            false => format!("{} (allocated: {})", human_bytes(b), parts.join(", ")),
        };
        speed.push(("Peak GPU memory", shown));
    }
    let mut out = vec![setup, updates, Section::kv("Speed", speed)];
    out.extend(r.pytorch.as_ref().map(|p| pytorch_section(r, p)));
    out.extend(r.data_parallel.as_ref().map(data_parallel_section));
    out
}

/// `--compare-pytorch`: gpukit's row and each of PyTorch's modes, the speed against gpukit's,
/// and how the losses compare.
fn pytorch_section(r: &CnnTrainReport, p: &CnnPeer) -> Section {
    let ours = r.images_per_s;
    let fmt_rate = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    let mut rows = vec![vec![
        "gpukit".into(),
        fmt_rate(ours),
        "1.00x".into(),
        format!("{:.2}", r.setup_seconds + r.first_step_seconds),
        r.peak_gpu_bytes.map_or("-".into(), human_bytes),
        r.updates
            .first()
            .map_or("-".into(), |u| format!("{:.6}", u.loss)),
    ]];
    for m in &p.rows {
        if let Some(why) = &m.failed {
            rows.push(vec![
                m.mode.clone(),
                format!("failed: {why}"),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
            continue;
        }
        rows.push(vec![
            m.mode.clone(),
            fmt_rate(m.images_per_s),
            match (ours, m.images_per_s) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
                _ => "-".into(),
            },
            m.first_step_s.map_or("-".into(), |v| format!("{v:.2}")),
            m.peak_bytes.map_or("-".into(), human_bytes),
            m.losses.first().map_or("-".into(), |l| format!("{l:.6}")),
        ]);
    }
    let mut notes = vec![
        format!(
            "PyTorch {}: the same weights, images, batch order and optimizer; modes: eager, \
             torch.compile, torch.compile with CUDA graphs (reduce-overhead) and the fused \
             optimizer{}",
            p.torch_version,
            if p.checkpoint {
                "; each residual block under torch.utils.checkpoint, as gpukit recomputed them"
            } else {
                ""
            }
        ),
        format!(
            "first update's loss {:.1e} from eager PyTorch's (relative; tolerance {:.0e}): {}",
            p.first_difference,
            p.tolerance,
            if p.disagreement().is_none() {
                "the same forward pass and loss"
            } else {
                "FAILED"
            }
        ),
        format!(
            "later losses, reported: up to {:.1e} apart (update {}); two engines' ResNet \
             trajectories part by more than rounding within a few updates (PyTorch's f32 from \
             its own float64 too)",
            p.max_difference, p.at_update
        ),
        "speed ratio: gpukit's images/s over the mode's; first update: seconds from the start \
         to the first update's end (gpukit) or the first update's seconds, compilation \
         included (PyTorch)"
            .into(),
    ];
    if let Some(best) = p.best() {
        notes.push(format!("PyTorch's fastest here: {}", best.mode));
    }
    Section {
        title: "PyTorch beside gpukit".into(),
        header: Some(
            [
                "run",
                "images/s",
                "gpukit vs it",
                "first update s",
                "peak memory",
                "loss 1",
            ]
            .map(String::from)
            .to_vec(),
        ),
        rows,
        notes,
    }
}

/// `--gpus N`: the ranks, alone and data-parallel, the scaling efficiency, and PyTorch's
/// DistributedDataParallel beside when compared.
pub(super) fn data_parallel_section(dp: &CnnDataParallel) -> Section {
    let mut rows = vec![
        (
            "GPUs".to_string(),
            format!(
                "{} (batch {} each, {} combined); {:.1} MiB of f32 gradients averaged{} {}",
                dp.ranks,
                dp.batch_per_gpu,
                dp.combined_batch,
                dp.gradient_mib,
                match dp.grad_comm.as_str() {
                    "f32" => String::new(),
                    t => format!(" in {t} (each averaged gradient rounded to it)"),
                },
                match dp.buckets {
                    1 => "in one bucket after backward".to_string(),
                    n => format!(
                        "in {n} buckets of at least {:.1} MiB while backward goes on",
                        dp.bucket_mb
                    ),
                }
            ),
        ),
        (
            "Each GPU alone".to_string(),
            format!(
                "{:.1} images/s ({:.2} ms an update, the same batches, no communication)",
                dp.single_images_per_s, dp.single_step_ms
            ),
        ),
        (
            "Data-parallel".to_string(),
            format!(
                "{:.1} images/s ({:.2} ms an update)",
                dp.images_per_s, dp.step_ms
            ),
        ),
        (
            "Scaling efficiency".to_string(),
            format!(
                "{:.3} (the update alone over the update data-parallel; 1: the averaging hidden)",
                dp.scaling_efficiency
            ),
        ),
    ];
    for row in &dp.ddp {
        let shown = match (&row.failed, row.images_per_s) {
            (Some(why), _) => format!("failed: {why}"),
            (None, Some(ips)) => format!(
                "{ips:.1} images/s (alone {}), efficiency {}; gpukit {:.2}x{}",
                row.single_images_per_s
                    .map_or("-".into(), |v| format!("{v:.1}")),
                row.scaling_efficiency
                    .map_or("-".into(), |v| format!("{v:.3}")),
                dp.images_per_s / ips,
                row.peak_bytes.map_or(String::new(), |b| format!(
                    "; peak memory {} a GPU (its busiest, one batch of images held)",
                    human_bytes(b)
                ))
            ),
            (None, None) => "no figures".into(),
        };
        rows.push((format!("PyTorch {}", row.mode), shown));
    }
    let rows = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Section::kv("Data-parallel", rows)
}
