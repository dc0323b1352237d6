//! What each op of a training step is, for `gpukit profile train`: its name, the layer
//! (`fc1`, ... as PyTorch's Sequential of Linear layers would be read), shapes, the library
//! behind it and its work. Nothing is built unless a profiler records on this thread.

use super::super::{GpuTrainer, Op};
use gpukit_cuda::profiler::{op, OpGuard, OpInfo};

impl GpuTrainer {
    /// A product of layer `l` on `rows` rows: forward, weight gradient or input gradient
    /// (with the epilogue work that goes with it).
    pub(super) fn op_product(&self, l: usize, kind: Op, rows: usize) -> Option<OpGuard> {
        op(|| {
            let (i, o) = self.layout.io(l);
            let p = self.opts.precision;
            let es = p.storage().size_bytes() as f64;
            let hidden = self.hidden(l);
            let (name, fused) = match kind {
                Op::Forward | Op::ForwardEval => (
                    if hidden {
                        "linear+bias+relu"
                    } else {
                        "linear+bias"
                    },
                    self.fusion[l].forward.is_some(),
                ),
                Op::WeightGrad => ("linear weight+bias grad", self.fusion[l].bgrad_b),
                Op::WeightGradPiece(_) => ("linear weight grad (a piece)", true),
                Op::InputGrad => ("linear input grad+relu grad", true),
            };
            let (m, n, k) = match kind {
                Op::WeightGrad => (i, o, rows),
                Op::WeightGradPiece(n) => (i, n, rows),
                Op::InputGrad => (rows, i, o),
                _ => (rows, o, i),
            };
            OpInfo {
                name: name.into(),
                layer: Some(format!("fc{}", l + 1)),
                detail: format!("{m}x{k} x {k}x{n} {}", p.name()),
                library: if fused {
                    "cuBLASLt (fused epilogue)".into()
                } else {
                    "cuBLASLt + NVRTC epilogue".into()
                },
                flops: 2.0 * (m * n * k) as f64,
                bytes: es * (m * k + k * n + m * n) as f64,
                dtype: dtype_of(p),
            }
        })
    }

    /// The update over every parameter: f32 weights, gradients and the optimizer's moments
    /// read, weights and moments written (and the 16-bit copy of the weights, when kept).
    pub(super) fn op_update(&self) -> Option<OpGuard> {
        op(|| {
            let p = self.opts.precision;
            let n = self.layout.total;
            let moments = usize::from(self.m.is_some()) + usize::from(self.v.is_some());
            let half = if self.half.is_some() {
                p.storage().size_bytes()
            } else {
                0
            };
            // weights and moments read and written, gradients read
            let per = 4 * 2 * (1 + moments) + 4 + half;
            OpInfo {
                name: "optimizer step".into(),
                layer: Some("optimizer".into()),
                detail: format!("{n} parameters, {} moment(s)", moments),
                library: "NVRTC".into(),
                flops: (n * (4 + 6 * moments)) as f64,
                bytes: (n * per) as f64,
                dtype: "f32".into(),
            }
        })
    }

    /// Other work of a step: `elems` values read and written once.
    pub(super) fn op_other(&self, name: &str, layer: &str, elems: usize) -> Option<OpGuard> {
        op(|| {
            let p = self.opts.precision;
            OpInfo {
                name: name.into(),
                layer: Some(layer.into()),
                detail: format!("{elems} values {}", p.name()),
                library: "NVRTC".into(),
                flops: elems as f64,
                bytes: 2.0 * elems as f64 * p.storage().size_bytes() as f64,
                dtype: dtype_of(p),
            }
        })
    }
}

fn dtype_of(p: super::super::Precision) -> String {
    match p.name() {
        "fp32" => "f32",
        "tf32" => "tf32",
        "fp16" => "f16",
        _ => "bf16",
    }
    .into()
}
