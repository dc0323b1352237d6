//! What each op of a [`GpuResNet`] training step is, for `gpukit profile train --model`: its
//! name, the layer as torchvision names it (`layer3.1.conv2`, `layer3.1.bn2`), shapes, the
//! library behind it and its work. Nothing is built unless a profiler records on this thread.

use super::{GpuResNet, GpuUnit};
use gpukit_cuda::dnn::BnOps;
use gpukit_cuda::profiler::{op, OpGuard, OpInfo};

/// What a unit's op computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UnitOp {
    ConvForward,
    ConvBackwardData,
    ConvBackwardFilter,
    NormForward,
    NormBackward,
}

impl GpuResNet {
    /// The parameter's torchvision name without `.weight`.
    fn layer_of(&self, param: usize) -> String {
        self.names
            .get(param)
            .map_or("?", |n| n.strip_suffix(".weight").unwrap_or(n))
            .to_string()
    }

    /// One op of unit `u`: a convolution pass (cuDNN) or its norm's forward or backward
    /// (cuDNN's batch norm, with the ReLU or residual add it runs fused or gpukit's kernel).
    pub(super) fn op_unit(&self, u: &GpuUnit, what: UnitOp) -> Option<OpGuard> {
        op(|| {
            let conv = u.conv.conv();
            let s = conv.shape;
            let es = conv.dtype.size_bytes() as f64;
            let (input, filter, output) = (
                s.input_len() as f64,
                s.weight_len() as f64,
                s.output_len() as f64,
            );
            let shape = format!(
                "{}x{}x{}x{} -> {}, {}x{}/{} {} {}",
                s.n,
                s.c,
                s.h,
                s.w,
                s.k,
                s.r,
                s.s,
                s.stride,
                conv.dtype.name(),
                conv.layout.name()
            );
            let (name, param, bytes, flops, library) = match what {
                UnitOp::ConvForward => (
                    "conv forward",
                    u.spec.weight,
                    es * (input + filter + output),
                    s.flops(),
                    "cuDNN",
                ),
                UnitOp::ConvBackwardData => (
                    "conv backward data",
                    u.spec.weight,
                    es * (input + filter + output),
                    s.flops(),
                    "cuDNN",
                ),
                UnitOp::ConvBackwardFilter => (
                    "conv backward filter",
                    u.spec.weight,
                    // the 16-bit gradient widened into the f32 gradients is part of it
                    es * (input + output + filter) + 4.0 * filter,
                    s.flops(),
                    if u.gemm_filter { "cuBLAS" } else { "cuDNN" },
                ),
                // x read, y written (and the residual read); the statistics are small
                UnitOp::NormForward => (
                    "batch norm forward",
                    u.spec.gamma,
                    es * output * if u.role == BnOps::BnAddRelu { 3.0 } else { 2.0 },
                    8.0 * output,
                    if u.fused() { "cuDNN" } else { "cuDNN + NVRTC" },
                ),
                // x, y and dy read, dx (and the residual's gradient) written
                UnitOp::NormBackward => (
                    "batch norm backward",
                    u.spec.gamma,
                    es * output * 5.0,
                    12.0 * output,
                    if u.fused() { "cuDNN" } else { "cuDNN + NVRTC" },
                ),
            };
            OpInfo {
                name: name.into(),
                layer: Some(self.layer_of(param)),
                detail: shape,
                library: library.into(),
                flops,
                bytes,
                dtype: conv.dtype.name().into(),
            }
        })
    }

    /// Other work of a step (pooling, the head, the loss, widening): `values` read and
    /// written once each in the step's element type.
    pub(super) fn op_other(
        &self,
        name: &str,
        layer: &str,
        values: usize,
        library: &str,
    ) -> Option<OpGuard> {
        op(|| {
            let dt = self.dtype();
            OpInfo {
                name: name.into(),
                layer: Some(layer.into()),
                detail: format!("{values} values {}", dt.name()),
                library: library.into(),
                flops: values as f64,
                bytes: 2.0 * values as f64 * dt.size_bytes() as f64,
                dtype: dt.name().into(),
            }
        })
    }

    /// The head's product `(m, n, k)` (cuBLAS).
    pub(super) fn op_head(&self, name: &str, (m, n, k): (usize, usize, usize)) -> Option<OpGuard> {
        op(|| {
            let dt = self.dtype();
            OpInfo {
                name: name.into(),
                layer: Some("fc".into()),
                detail: format!("{m}x{k} x {k}x{n} {}", dt.name()),
                library: "cuBLAS".into(),
                flops: 2.0 * (m * n * k) as f64,
                bytes: dt.size_bytes() as f64 * (m * k + k * n + m * n) as f64,
                dtype: dt.name().into(),
            }
        })
    }

    /// The optimizer's step over every parameter: f32 weights, gradients and moments read,
    /// weights and moments written (and the 16-bit copy of the weights, when kept).
    pub(super) fn op_update(&self) -> Option<OpGuard> {
        op(|| {
            let n = self.params_layout.total;
            let moments = usize::from(self.m.is_some()) + usize::from(self.v.is_some());
            let half = if self.half.is_some() {
                self.dtype().size_bytes()
            } else {
                0
            };
            OpInfo {
                name: "optimizer step".into(),
                layer: Some("optimizer".into()),
                detail: format!("{n} parameters, {moments} moment(s)"),
                library: "NVRTC".into(),
                flops: (n * (4 + 6 * moments)) as f64,
                bytes: (n * (4 * 2 * (1 + moments) + 4 + half)) as f64,
                dtype: "f32".into(),
            }
        })
    }
}
