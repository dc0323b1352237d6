//! `infer --onnx`'s GPU rows: a model of torchvision's ResNet family, read back from the
//! optimized graph as the [`FoldedResNet`] gpukit's GPU engine runs, and checked equal to the
//! graph on the CPU before any GPU row is timed. The rows themselves are `infer`'s, with every
//! check it makes (the fp32 reference on the GPU, the CPU's logits, the tolerance per
//! precision).

use super::model::Prepared;
use super::OnnxOptions;

/// How far the model read back may be from the graph on the CPU: both are f32 computations of
/// the same sums in another order (a misread model is off by the size of its outputs); with
/// batch-norm statistics measured on data ResNet-50's two agree within 1e-5 to 1e-4.
pub const READ_BACK_TOLERANCE: f64 = 1e-4;
use crate::accuracy::agreement;
use crate::infer::{InferOptions, InferStrategy};
use crate::random::fresh_seed;
use gpukit_models::forward::FoldedResNet;
use gpukit_models::graph::recognize::as_resnet;
use gpukit_models::graph::{forward_cpu, Array};
use gpukit_tensor::Tensor;

/// The model the GPU rows run, and the check that it is the graph.
pub(super) struct ReadResnet {
    pub folded: FoldedResNet,
    pub image: usize,
    /// Max |diff| / max |graph's| of the two on one random batch, on the CPU.
    pub max_rel: f64,
    pub batch: usize,
}

impl ReadResnet {
    pub fn describe(&self, device: Option<&str>) -> String {
        format!(
            "{} read from the graph (on the CPU at batch {}: max rel. diff {:.1e} against \
             gpukit's interpreter, <= {READ_BACK_TOLERANCE:.0e}); gpukit's ResNet engine{}",
            self.folded.model.name(),
            self.batch,
            self.max_rel,
            device.map(|d| format!(" on {d}")).unwrap_or_default()
        )
    }
}

/// The optimized graph as a ResNet the GPU engine runs, checked equal to the graph on one
/// random batch on the CPU; Err: why the GPU rows cannot run (the model is not of the family,
/// its images are not square, or the two differ).
pub(super) fn resnet_of(prepared: &Prepared) -> Result<ReadResnet, String> {
    let graph = &prepared.optimized;
    let folded = as_resnet(graph).map_err(|why| {
        format!("the GPU engine runs imported graphs of torchvision's ResNet family only, so far: {why}")
    })?;
    let shape = graph
        .inputs
        .first()
        .map(|&i| graph.value(i).shape.clone())
        .unwrap_or_default();
    let [n, 3, h, w] = shape[..] else {
        return Err(format!("an input of shape {shape:?}"));
    };
    if h != w {
        return Err(format!(
            "the GPU engine takes square images; this model's are {h}x{w}"
        ));
    }
    let x = gpukit_tensor::random::normal_f32(n * 3 * h * w, fresh_seed());
    let ours = forward_cpu(graph, &[Array::f32(&shape, x.clone())])
        .map_err(|e| format!("running the graph on the CPU: {e}"))?;
    let theirs = Tensor::from_f32(&shape, x)
        .map_err(|e| e.to_string())
        .and_then(|t| folded.forward_cpu(&t).map_err(|e| e.to_string()))
        .and_then(|t| t.to_vec_f32().map_err(|e| e.to_string()))
        .map_err(|e| format!("running the read model on the CPU: {e}"))?;
    let graph_out = ours
        .first()
        .and_then(Array::as_f32)
        .ok_or("the graph's output is not f32")?;
    let classes = folded.num_classes.max(1);
    if graph_out.len() != theirs.len() {
        return Err("the read model's output has another size than the graph's".into());
    }
    let a = agreement(&theirs, graph_out, classes);
    // NaN is over too
    if a.max_rel.is_nan() || a.max_rel > READ_BACK_TOLERANCE {
        return Err(format!(
            "read as {}, it differs from the graph on the CPU by {:.1e} (over {READ_BACK_TOLERANCE:.0e})",
            folded.model.name(),
            a.max_rel
        ));
    }
    Ok(ReadResnet {
        folded,
        image: h,
        max_rel: a.max_rel,
        batch: n,
    })
}

/// `infer`'s options for the GPU rows: the strategies asked for at the batch sizes asked for.
pub(super) fn options(
    opts: &OnnxOptions,
    read: &ReadResnet,
    strategies: &[InferStrategy],
    sizes: &[usize],
) -> InferOptions {
    InferOptions {
        model: read.folded.model,
        batch_sizes: sizes.to_vec(),
        iterations: opts.iterations,
        weights: None,
        image_size: read.image,
        budget_s: opts.budget_s,
        selection: opts.selection,
        strategies: strategies.to_vec(),
        gpu_iterations: 50,
        cpu_max_batch: None,
        search: gpukit_cuda::dnn::Search::Fast,
        tolerance: crate::accuracy::graph_tolerance,
    }
}
