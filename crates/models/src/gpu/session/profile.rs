//! What each op of a forward pass is, for `gpukit profile`: its name, torchvision's name for
//! its layer, its shapes, the library call behind it, and the work it does (FLOPs, the bytes it
//! must move at least).

use super::super::lower::{relu_of, Op};
use super::Session;
use gpukit_cuda::profiler::OpInfo;
use gpukit_tensor::DType;

impl Session<'_> {
    /// The description of op `i` (a profiler records it around the op's calls).
    pub(super) fn op_info(&self, i: usize) -> OpInfo {
        let n = self.n;
        let layout = self.weights.layout.name();
        let elems = |t: usize| {
            let s = self.shapes[t].shape(n);
            s.iter().product::<usize>() as f64
        };
        let bytes = |t: usize| elems(t) * self.shapes[t].dtype.size_bytes() as f64;
        let dims = |t: usize| {
            let [n, c, h, w] = self.shapes[t].shape(n);
            format!("{n}x{c}x{h}x{w}")
        };
        let storage = self.weights.shape.activation_dtype();
        let info =
            |name: &str, layer: &str, detail: String, library: String, work: (f64, f64)| OpInfo {
                name: name.to_string(),
                layer: Some(layer.to_string()),
                detail,
                library,
                flops: work.0,
                bytes: work.1,
                dtype: storage.name().to_string(),
            };
        match (self.ops[i], self.runs.get(i).and_then(|r| r.as_deref())) {
            (Op::Convert { x, y }, _) => info(
                "convert_input",
                "input",
                format!("{} f32 NCHW -> {} {layout}", dims(x), storage.name()),
                "NVRTC".into(),
                (elems(y), bytes(x) + bytes(y)),
            ),
            (Op::Conv { conv, x, y, z, .. }, run) => {
                let c = self.weights.shape.convs[conv];
                let t = self.shapes[x];
                let shape = c.at(n, t.h, t.w);
                let mut name = String::from("conv");
                if relu_of(self.ops[i]) {
                    name.push_str("+bias");
                }
                if z.is_some() {
                    name.push_str("+add");
                }
                if relu_of(self.ops[i]) {
                    name.push_str("+relu");
                }
                let weight_bytes = (c.k * c.c * c.r * c.r * storage.size_bytes()) as f64;
                let library = match run {
                    Some(r) => format!("cuDNN {} API: {}", r.api(), r.name()),
                    None => "cuDNN".into(),
                };
                OpInfo {
                    dtype: self.weights.dtype.name().to_string(),
                    ..info(
                        &name,
                        self.layer_names.get(conv).map_or("conv", String::as_str),
                        format!(
                            "{} {} {layout}, {}x{}/{}",
                            dims(x),
                            storage.name(),
                            c.r,
                            c.r,
                            c.stride
                        ),
                        library,
                        (
                            shape.flops(),
                            bytes(x) + weight_bytes + bytes(y) + z.map_or(0.0, bytes),
                        ),
                    )
                }
            }
            (Op::MaxPool { x, y }, _) => info(
                "max_pool",
                "maxpool",
                format!("{} {} {layout}, 3x3/2", dims(x), storage.name()),
                "NVRTC".into(),
                (9.0 * elems(y), bytes(x) + bytes(y)),
            ),
            (Op::AvgPool { x, y }, _) => info(
                "avg_pool",
                "avgpool",
                format!("{} {} {layout} -> f32", dims(x), storage.name()),
                "NVRTC".into(),
                (elems(x), bytes(x) + bytes(y)),
            ),
            (Op::Classifier { x, y }, _) => {
                let (classes, features) =
                    (self.weights.shape.num_classes, self.weights.shape.features);
                OpInfo {
                    dtype: DType::F32.name().to_string(),
                    ..info(
                        "linear+bias",
                        "fc",
                        format!("{n}x{features} x ({classes}x{features})^T f32"),
                        match self.classifier_on_blas() {
                            true => "cuBLAS + NVRTC bias".into(),
                            false => "NVRTC (product and bias)".into(),
                        },
                        (
                            2.0 * (n * classes * features) as f64,
                            bytes(x) + (features * classes * 4) as f64 + bytes(y),
                        ),
                    )
                }
            }
        }
    }

    /// The description of one replay of the captured graph: the whole pass as one op.
    pub(super) fn graph_info(&self) -> OpInfo {
        let ops: Vec<OpInfo> = (0..self.ops.len()).map(|i| self.op_info(i)).collect();
        OpInfo {
            name: "graph replay".into(),
            layer: None,
            detail: format!("{} ops, batch {}", ops.len(), self.n),
            library: "CUDA graph".into(),
            flops: ops.iter().map(|o| o.flops).sum(),
            bytes: ops.iter().map(|o| o.bytes).sum(),
            dtype: self.weights.dtype.name().to_string(),
        }
    }

    /// Each op's description, in launch order: how a graph replay's kernels are attributed
    /// (they run in the order the eager pass launched them).
    pub fn op_infos(&self) -> Vec<OpInfo> {
        (0..self.ops.len()).map(|i| self.op_info(i)).collect()
    }
}
