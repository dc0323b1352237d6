//! Small ONNX models in the shapes of the families gpukit's importer targets, written with
//! [`ModelBuilder`] and seeded random weights: what the tests run through the importer, the
//! passes, the CPU interpreter and ONNX Runtime. Each takes `input` `[batch, 3, 32, 32]` and
//! gives `logits` `[batch, 10]`.

use super::builder::{attr_float, attr_int, attr_ints, attr_tensor, i64_tensor, Dim, ModelBuilder};
use super::proto::ModelProto;

/// The classes every fixture's classifier has.
pub const CLASSES: usize = 10;
/// Every fixture's input height and width.
pub const SIDE: usize = 32;

/// A fixture: its name and its model.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: &'static str,
    pub model: ModelProto,
}

impl Fixture {
    /// The model's bytes, as a `.onnx` file holds them.
    pub fn bytes(&self) -> Vec<u8> {
        bytes(&self.model)
    }
}

/// A model's bytes, as a `.onnx` file holds them.
pub fn bytes(model: &ModelProto) -> Vec<u8> {
    prost::Message::encode_to_vec(model)
}

/// Layers on a [`ModelBuilder`], as the exporters of the families write them.
struct Net {
    m: ModelBuilder,
}

impl Net {
    fn new(opset: i64, seed: u64) -> (Net, String) {
        Net::with_image(opset, seed, (SIDE, SIDE))
    }

    /// A net over images of `h x w` pixels.
    fn with_image(opset: i64, seed: u64, (h, w): (usize, usize)) -> (Net, String) {
        let mut m = ModelBuilder::new(opset, seed);
        let x = m.input(
            "input",
            &[
                Dim::Named("batch"),
                Dim::Fixed(3),
                Dim::Fixed(h),
                Dim::Fixed(w),
            ],
        );
        (Net { m }, x)
    }

    /// A convolution with weights scaled for unit-variance outputs.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        x: &str,
        (cin, cout): (usize, usize),
        k: usize,
        stride: usize,
        pad: usize,
        groups: usize,
        bias: bool,
    ) -> String {
        let fan_in = (cin / groups * k * k) as f32;
        let w = self.m.random(
            "conv.weight",
            &[cout, cin / groups, k, k],
            0.0,
            (3.0 / fan_in).sqrt(),
        );
        let mut inputs = vec![x.to_string(), w];
        if bias {
            inputs.push(self.m.random("conv.bias", &[cout], 0.0, 0.1));
        }
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let p = pad as i64;
        self.m.node(
            "Conv",
            &refs,
            vec![
                attr_ints("dilations", &[1, 1]),
                attr_int("group", groups as i64),
                attr_ints("kernel_shape", &[k as i64, k as i64]),
                attr_ints("pads", &[p, p, p, p]),
                attr_ints("strides", &[stride as i64, stride as i64]),
            ],
        )
    }

    fn bn(&mut self, x: &str, c: usize) -> String {
        let scale = self.m.random("bn.weight", &[c], 1.0, 0.2);
        let bias = self.m.random("bn.bias", &[c], 0.0, 0.2);
        let mean = self.m.random("bn.running_mean", &[c], 0.0, 0.2);
        let var = self.m.random("bn.running_var", &[c], 1.0, 0.5);
        self.m.node(
            "BatchNormalization",
            &[x, &scale, &bias, &mean, &var],
            vec![attr_float("epsilon", 1e-5), attr_float("momentum", 0.9)],
        )
    }

    fn op(&mut self, op: &str, inputs: &[&str]) -> String {
        self.m.node(op, inputs, Vec::new())
    }

    fn conv_bn_act(
        &mut self,
        x: &str,
        ch: (usize, usize),
        k: usize,
        stride: usize,
        groups: usize,
        act: Option<&str>,
    ) -> String {
        let y = self.conv(x, ch, k, stride, k / 2, groups, false);
        let y = self.bn(&y, ch.1);
        match act {
            Some("SiLU") => {
                let s = self.op("Sigmoid", &[&y]);
                self.op("Mul", &[&y, &s])
            }
            Some(a) => self.op(a, &[&y]),
            None => y,
        }
    }

    /// Squeeze-and-excitation: GAP, 1x1 conv, activation, 1x1 conv, gate, times the input.
    fn se(&mut self, x: &str, c: usize, squeezed: usize, act: &str, gate: &str) -> String {
        let p = self.op("GlobalAveragePool", &[x]);
        let s = self.conv(&p, (c, squeezed), 1, 1, 0, 1, true);
        let s = if act == "SiLU" {
            let g = self.op("Sigmoid", &[&s]);
            self.op("Mul", &[&s, &g])
        } else {
            self.op(act, &[&s])
        };
        let e = self.conv(&s, (squeezed, c), 1, 1, 0, 1, true);
        let g = self.op(gate, &[&e]);
        self.op("Mul", &[x, &g])
    }

    /// Global average pooling, Flatten and the classifier.
    /// ResNet's max pool after its stem: 3x3, stride 2, padding 1.
    fn stem_pool(&mut self, x: &str) -> String {
        self.m.node(
            "MaxPool",
            &[x],
            vec![
                attr_ints("kernel_shape", &[3, 3]),
                attr_ints("pads", &[1, 1, 1, 1]),
                attr_ints("strides", &[2, 2]),
            ],
        )
    }

    fn head(&mut self, x: &str, c: usize) -> String {
        let p = self.op("GlobalAveragePool", &[x]);
        let f = self.m.node("Flatten", &[&p], vec![attr_int("axis", 1)]);
        self.linear(&f, c)
    }

    fn linear(&mut self, x: &str, c: usize) -> String {
        let w = self
            .m
            .random("fc.weight", &[CLASSES, c], 0.0, (3.0 / c as f32).sqrt());
        let b = self.m.random("fc.bias", &[CLASSES], 0.0, 0.1);
        self.m.node(
            "Gemm",
            &[x, &w, &b],
            vec![
                attr_float("alpha", 1.0),
                attr_float("beta", 1.0),
                attr_int("transB", 1),
            ],
        )
    }

    fn finish(mut self, logits: &str) -> ModelProto {
        self.m.rename(logits, "logits");
        self.m
            .output("logits", &[Dim::Named("batch"), Dim::Fixed(CLASSES)]);
        self.m.model()
    }
}

/// A ResNet in miniature: stem (conv, batch norm, ReLU, max pool), a basic block, a block with
/// a projected shortcut, the head.
pub fn tiny_resnet(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(17, seed);
    let s = n.conv_bn_act(&x, (3, 8), 7, 2, 1, Some("Relu"));
    let s = n.stem_pool(&s);
    let y = n.conv_bn_act(&s, (8, 8), 3, 1, 1, Some("Relu"));
    let y = n.conv_bn_act(&y, (8, 8), 3, 1, 1, None);
    let y = n.op("Add", &[&y, &s]);
    let b1 = n.op("Relu", &[&y]);
    let y = n.conv_bn_act(&b1, (8, 16), 3, 2, 1, Some("Relu"));
    let y = n.conv_bn_act(&y, (16, 16), 3, 1, 1, None);
    let d = n.conv_bn_act(&b1, (8, 16), 1, 2, 1, None);
    // the shortcut first, as torch writes `out += identity`'s operands the other way round
    let y = n.op("Add", &[&d, &y]);
    let y = n.op("Relu", &[&y]);
    let l = n.head(&y, 16);
    n.finish(&l)
}

/// MobileNetV3's inverted residual blocks: 1x1 expansion, HardSwish, depthwise 3x3, SE with
/// ReLU and HardSigmoid, 1x1 projection, residual where the shape allows.
pub fn mobilenet_v3_block(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(17, seed);
    let s = n.conv_bn_act(&x, (3, 8), 3, 2, 1, Some("HardSwish"));
    let mut y = s.clone();
    for (stride, residual) in [(2, false), (1, true)] {
        let input = y.clone();
        let e = n.conv_bn_act(&y, (8, 24), 1, 1, 1, Some("HardSwish"));
        let d = n.conv_bn_act(&e, (24, 24), 3, stride, 24, Some("HardSwish"));
        let d = n.se(&d, 24, 8, "Relu", "HardSigmoid");
        let p = n.conv_bn_act(&d, (24, 8), 1, 1, 1, None);
        y = if residual {
            n.op("Add", &[&input, &p])
        } else {
            p
        };
    }
    let l = n.head(&y, 8);
    n.finish(&l)
}

/// EfficientNet's MBConv: SiLU (x * sigmoid x), depthwise 5x5, SE with SiLU and Sigmoid.
pub fn efficientnet_se(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(13, seed);
    let s = n.conv_bn_act(&x, (3, 8), 3, 2, 1, Some("SiLU"));
    let d = n.conv_bn_act(&s, (8, 8), 5, 1, 8, Some("SiLU"));
    let d = n.se(&d, 8, 2, "SiLU", "Sigmoid");
    let p = n.conv_bn_act(&d, (8, 16), 1, 1, 1, None);
    let l = n.head(&p, 16);
    n.finish(&l)
}

/// RegNet's X block: grouped 3x3 convolution (4 groups) between 1x1s, projected shortcut.
pub fn regnet_grouped(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(17, seed);
    let s = n.conv_bn_act(&x, (3, 16), 3, 2, 1, Some("Relu"));
    let a = n.conv_bn_act(&s, (16, 32), 1, 1, 1, Some("Relu"));
    let b = n.conv_bn_act(&a, (32, 32), 3, 2, 4, Some("Relu"));
    let c = n.conv_bn_act(&b, (32, 32), 1, 1, 1, None);
    let d = n.conv_bn_act(&s, (16, 32), 1, 2, 1, None);
    let y = n.op("Add", &[&c, &d]);
    let y = n.op("Relu", &[&y]);
    let l = n.head(&y, 32);
    n.finish(&l)
}

/// DenseNet: batch norm before (not after) each convolution, features concatenated, a
/// transition with average pooling; then pooling with ceil mode, asymmetric pads and
/// count_include_pad.
pub fn densenet(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(17, seed);
    let f0 = n.conv(&x, (3, 8), 3, 1, 1, 1, false);
    let layer = |n: &mut Net, f: &str, c: usize| {
        let y = n.bn(f, c);
        let y = n.op("Relu", &[&y]);
        let y = n.conv(&y, (c, 16), 1, 1, 0, 1, false);
        let y = n.bn(&y, 16);
        let y = n.op("Relu", &[&y]);
        n.conv(&y, (16, 4), 3, 1, 1, 1, false)
    };
    // as torch.onnx writes torchvision's blocks: each layer concatenates every feature before
    // it (the first layer's of one input), the block's output all of them
    let mut features = vec![f0];
    let mut c = 8;
    for _ in 0..2 {
        let refs: Vec<&str> = features.iter().map(String::as_str).collect();
        let f = n.m.node("Concat", &refs, vec![attr_int("axis", 1)]);
        let y = layer(&mut n, &f, c);
        features.push(y);
        c += 4;
    }
    let refs: Vec<&str> = features.iter().map(String::as_str).collect();
    let f = n.m.node("Concat", &refs, vec![attr_int("axis", 1)]);
    // and a concatenation of that concatenation
    let y = layer(&mut n, &f, c);
    let f = n.m.node("Concat", &[&f, &y], vec![attr_int("axis", 1)]);
    c += 4;
    let t = n.bn(&f, c);
    let t = n.op("Relu", &[&t]);
    let t = n.conv(&t, (c, 8), 1, 1, 0, 1, false);
    let t = n.m.node(
        "AveragePool",
        &[&t],
        vec![
            attr_ints("kernel_shape", &[2, 2]),
            attr_ints("strides", &[2, 2]),
        ],
    );
    // 16x16: pooling with every option
    let t = n.m.node(
        "MaxPool",
        &[&t],
        vec![
            attr_int("ceil_mode", 1),
            attr_ints("kernel_shape", &[3, 2]),
            attr_ints("pads", &[1, 0, 0, 1]),
            attr_ints("strides", &[2, 2]),
        ],
    );
    let a = n.m.node(
        "AveragePool",
        &[&t],
        vec![
            attr_int("ceil_mode", 1),
            attr_int("count_include_pad", 1),
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("pads", &[1, 1, 1, 1]),
            attr_ints("strides", &[2, 2]),
        ],
    );
    let b = n.m.node(
        "AveragePool",
        &[&t],
        vec![
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("pads", &[1, 1, 1, 1]),
            attr_ints("strides", &[2, 2]),
            attr_int("ceil_mode", 1),
        ],
    );
    let y = n.op("Sub", &[&a, &b]);
    let y = n.bn(&y, 8);
    let y = n.op("Relu", &[&y]);
    let l = n.head(&y, 8);
    n.finish(&l)
}

/// torch's `x * 0.5 * (1 + erf(x / sqrt(2)))`, as torch.onnx writes nn.GELU before opset 20.
fn gelu_by_erf(n: &mut Net, x: &str) -> String {
    let sqrt2 = n.m.weight("sqrt2", &[], &[std::f32::consts::SQRT_2]);
    let one = n.m.weight("one", &[], &[1.0]);
    let half = n.m.weight("half", &[], &[0.5]);
    let d = n.op("Div", &[x, &sqrt2]);
    let e = n.op("Erf", &[&d]);
    let a = n.op("Add", &[&e, &one]);
    let m = n.op("Mul", &[x, &a]);
    n.op("Mul", &[&m, &half])
}

/// ConvNeXt: a patchify stem, a block of depthwise 7x7, Transpose to channels-last,
/// LayerNormalization, MatMul, GELU through Erf, MatMul, Transpose back, layer scale and the
/// residual; the head averages with ReduceMean and normalizes before the classifier.
pub fn convnext(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(17, seed);
    let c = 16;
    let s = n.conv(&x, (3, c), 4, 4, 0, 1, true);
    let s =
        n.m.node("Transpose", &[&s], vec![attr_ints("perm", &[0, 2, 3, 1])]);
    let (g, b) = (
        n.m.random("ln.weight", &[c], 1.0, 0.2),
        n.m.random("ln.bias", &[c], 0.0, 0.2),
    );
    let s = n.m.node(
        "LayerNormalization",
        &[&s, &g, &b],
        vec![attr_int("axis", -1), attr_float("epsilon", 1e-6)],
    );
    let s =
        n.m.node("Transpose", &[&s], vec![attr_ints("perm", &[0, 3, 1, 2])]);
    let d = n.conv(&s, (c, c), 7, 1, 3, c, true);
    let t =
        n.m.node("Transpose", &[&d], vec![attr_ints("perm", &[0, 2, 3, 1])]);
    let (g, b) = (
        n.m.random("ln.weight", &[c], 1.0, 0.2),
        n.m.random("ln.bias", &[c], 0.0, 0.2),
    );
    let t = n.m.node(
        "LayerNormalization",
        &[&t, &g, &b],
        vec![attr_float("epsilon", 1e-6)],
    );
    let w1 =
        n.m.random("pwconv1.weight", &[c, 4 * c], 0.0, (3.0 / c as f32).sqrt());
    let b1 = n.m.random("pwconv1.bias", &[4 * c], 0.0, 0.1);
    let t = n.op("MatMul", &[&t, &w1]);
    let t = n.op("Add", &[&b1, &t]);
    let t = gelu_by_erf(&mut n, &t);
    let w2 = n.m.random(
        "pwconv2.weight",
        &[4 * c, c],
        0.0,
        (3.0 / (4 * c) as f32).sqrt(),
    );
    let b2 = n.m.random("pwconv2.bias", &[c], 0.0, 0.1);
    let t = n.op("MatMul", &[&t, &w2]);
    let t = n.op("Add", &[&t, &b2]);
    // torchvision's layer scale is [c, 1, 1], after the transpose back
    let t =
        n.m.node("Transpose", &[&t], vec![attr_ints("perm", &[0, 3, 1, 2])]);
    let gamma = n.m.random("layer_scale", &[c, 1, 1], 0.5, 0.2);
    let t = n.op("Mul", &[&gamma, &t]);
    let y = n.op("Add", &[&s, &t]);
    let p = n.m.node(
        "ReduceMean",
        &[&y],
        vec![attr_ints("axes", &[-2, -1]), attr_int("keepdims", 0)],
    );
    let (g, b) = (
        n.m.random("ln.weight", &[c], 1.0, 0.2),
        n.m.random("ln.bias", &[c], 0.0, 0.2),
    );
    let p = n.m.node(
        "LayerNormalization",
        &[&p, &g, &b],
        vec![attr_float("epsilon", 1e-6)],
    );
    let l = n.linear(&p, c);
    n.finish(&l)
}

/// The chain torch.onnx writes for `x.view(x.size(0), -1)` (Shape, Gather, Unsqueeze, Concat,
/// Reshape, with Constant nodes for the indices), at opset 18 (ReduceMean's axes an input).
pub fn torch_flatten(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(18, seed);
    let y = n.conv_bn_act(&x, (3, 8), 3, 2, 1, Some("Relu"));
    let axes = n.m.ints("axes", &[2], &[2, 3]);
    let p =
        n.m.node("ReduceMean", &[&y, &axes], vec![attr_int("keepdims", 1)]);
    let shape = n.op("Shape", &[&p]);
    let zero = n.m.node(
        "Constant",
        &[],
        vec![attr_tensor("value", i64_tensor("zero", &[], &[0]))],
    );
    let batch =
        n.m.node("Gather", &[&shape, &zero], vec![attr_int("axis", 0)]);
    let axis0 =
        n.m.node("Constant", &[], vec![attr_ints("value_ints", &[0])]);
    let batch = n.op("Unsqueeze", &[&batch, &axis0]);
    let rest = n.m.node(
        "Constant",
        &[],
        vec![attr_tensor("value", i64_tensor("rest", &[1], &[-1]))],
    );
    let target =
        n.m.node("Concat", &[&batch, &rest], vec![attr_int("axis", 0)]);
    let f = n.op("Reshape", &[&p, &target]);
    let l = n.linear(&f, 8);
    n.finish(&l)
}

/// ResNet's stem at its width: a 7x7 stride-2 convolution of 3 channels to 64, batch norm,
/// ReLU, the 3x3 stride-2 max pool, over a 60 x 44 image (pooled 15 x 11: tiles of 8 or 4 fit
/// neither side), its output the pooled map itself (every value compared, none averaged away).
/// Not in [`all`]: its output is not logits; the GPU engine's stem-and-pool kernel is tested on it.
pub fn resnet_stem(seed: u64) -> ModelProto {
    let (mut n, x) = Net::with_image(17, seed, (60, 44));
    let s = n.conv_bn_act(&x, (3, 64), 7, 2, 1, Some("Relu"));
    let s = n.stem_pool(&s);
    n.m.rename(&s, "pooled");
    n.m.output(
        "pooled",
        &[
            Dim::Named("batch"),
            Dim::Fixed(64),
            Dim::Fixed(15),
            Dim::Fixed(11),
        ],
    );
    n.m.model()
}

/// DeepLab's atrous layers and TensorFlow's "same" padding: a 3x3 convolution dilated by 2 with
/// a residual, one padded unevenly with stride 2, one dilated unevenly (2 down, 3 across), the
/// head. Not in [`all`]: the GPU engine runs these only on gpukit's own kernel (16-bit,
/// channel-last), so they are tested apart.
pub fn atrous(seed: u64) -> ModelProto {
    let (mut n, x) = Net::new(17, seed);
    let s = n.conv_bn_act(&x, (3, 16), 3, 1, 1, Some("Relu"));
    let dilated = |n: &mut Net, x: &str, (cin, cout), stride, pads: [i64; 4], dil: [i64; 2]| {
        let w = n.m.random(
            "conv.weight",
            &[cout, cin, 3, 3],
            0.0,
            (3.0 / (cin * 9) as f32).sqrt(),
        );
        let b = n.m.random("conv.bias", &[cout], 0.0, 0.1);
        n.m.node(
            "Conv",
            &[x, &w, &b],
            vec![
                attr_ints("dilations", &dil),
                attr_int("group", 1),
                attr_ints("kernel_shape", &[3, 3]),
                attr_ints("pads", &pads),
                attr_ints("strides", &[stride, stride]),
            ],
        )
    };
    let d = dilated(&mut n, &s, (16, 16), 1, [2, 2, 2, 2], [2, 2]);
    let d = n.op("Add", &[&d, &s]);
    let d = n.op("Relu", &[&d]);
    let u = dilated(&mut n, &d, (16, 24), 2, [0, 0, 1, 1], [1, 1]);
    let u = n.op("Relu", &[&u]);
    let v = dilated(&mut n, &u, (24, 16), 1, [2, 3, 2, 3], [2, 3]);
    let l = n.head(&v, 16);
    n.finish(&l)
}

/// Every fixture, with weights drawn from `seed`.
pub fn all(seed: u64) -> Vec<Fixture> {
    vec![
        Fixture {
            name: "tiny_resnet",
            model: tiny_resnet(seed),
        },
        Fixture {
            name: "mobilenet_v3_block",
            model: mobilenet_v3_block(seed),
        },
        Fixture {
            name: "efficientnet_se",
            model: efficientnet_se(seed),
        },
        Fixture {
            name: "regnet_grouped",
            model: regnet_grouped(seed),
        },
        Fixture {
            name: "densenet",
            model: densenet(seed),
        },
        Fixture {
            name: "convnext",
            model: convnext(seed),
        },
        Fixture {
            name: "torch_flatten",
            model: torch_flatten(seed),
        },
    ]
}
