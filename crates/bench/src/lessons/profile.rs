//! Lesson 8: the notebook's network, forward and backward, through `gpukit profile train`.

use super::notebook::title;
use super::{Bench, Lesson, ProfileRow, Verdict};
use crate::error::Result;
use gpukit_tensor::random::fresh_seed;

/// Lesson 8: the notebook's small network (x[1024, 512] -> 256 -> relu -> 10, loss sum of
/// squares), forward and backward, through `gpukit profile train`.
pub(crate) fn lesson8(b: &Bench) -> Result<Lesson> {
    let mut l = Lesson::new(
        "8",
        title("8"),
        "you cannot optimise what you cannot measure: the profiler shows the real bottleneck",
        Some("the profiling cell printed nothing after 'Running profiler example...' (it crashed)"),
    );
    // x ~ N(0, 1) [n, 512]; targets 0 over 10 outputs, so the MSE loss is the notebook's
    // sum(output**2) up to a constant
    let n = 1024 * 12;
    let data = gpukit_train::data::Dataset {
        features: 512,
        x: gpukit_tensor::random::normal_f32(n * 512, fresh_seed()),
        y: gpukit_train::data::Targets::Values {
            width: 10,
            data: vec![0.0; n * 10],
        },
    };
    // removed when `file` drops, whatever happens below
    let file = tempfile::Builder::new()
        .prefix("gpukit-lesson8-")
        .suffix(".safetensors")
        .tempfile()
        .map_err(|source| crate::error::Error::Io {
            what: "lesson 8's data file",
            path: std::env::temp_dir(),
            source,
        })?;
    let path = file.path().to_path_buf();
    data.save(&path)?;
    let request = crate::workload::train::TrainRequest {
        layers: Some(vec![512, 256, 10]),
        data: Some(path.clone()),
        batch_size: Some(1024),
        epochs: Some(2),
        optimizer: Some(gpukit_train::optim::OptimizerKind::Sgd),
        loss: Some(gpukit_train::loss::LossKind::Mse),
        precision: Some(gpukit_types::DType::F32),
        device: Some(b.device),
        ..Default::default()
    };
    let opts = crate::workload::profile::ProfileOptions {
        steps: 10,
        top: 5,
        group_by: crate::workload::profile::table::GroupBy::Op,
        trace: None,
        timing: gpukit_cuda::profiler::TimingChoice::Auto,
    };
    let report =
        crate::workload::profile::profile_train(&b.discovery, &request, &opts, &mut |_| {})?;
    for row in report.rows.iter().take(5) {
        l.profile.push(ProfileRow {
            name: row.key.clone(),
            calls: row.calls,
            gpu_total_us: row.gpu_total_us,
            pct: row.pct_of_step,
        });
    }
    l.verdict = Verdict::Measured;
    let top = l
        .profile
        .first()
        .map(|r| format!("{} ({:.0}% of the step)", r.name, r.pct));
    let step = report
        .step_ms
        .map(|s| format!(", {:.3} ms a step without the profiler", s.median))
        .unwrap_or_default();
    l.reason = format!(
        "profiled with {} over {} steps{step}{}; the top op: {}",
        report.timing_note,
        report.steps,
        report
            .overhead_pct
            .map(|o| format!(" (profiling added {o:.0}%)"))
            .unwrap_or_default(),
        top.unwrap_or_else(|| "none".into())
    );
    l.evidence.push(
        "the notebook's cell calls loss.backward() although none of its tensors requires \
         gradients; gpukit trains the same network (x [1024, 512] -> 256 -> ReLU -> 10, loss \
         the mean of the squared outputs) with its training engine, profiled op by op"
            .into(),
    );
    for r in &l.profile {
        if r.calls > 0 {
            l.evidence.push(format!(
                "{}: {:.1} us a call",
                r.name,
                r.gpu_total_us / r.calls as f64
            ));
        }
    }
    Ok(l)
}
