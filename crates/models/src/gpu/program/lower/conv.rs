//! Convolutions lowered: the checks of what the engine runs (one stride for both axes, groups
//! that fit), the filter rearranged for the layout (input channels padded where the converted
//! input is), the epilogue fused into cuDNN's call (ReLU, SiLU, GELU, sigmoid, a bias or a
//! residual, where cuDNN runs it) or left to one element-wise step, and a projection's bias
//! moved into the sum that adds it. A depthwise convolution on channel-last tensors runs on
//! gpukit's kernel with its whole epilogue, and so does a dilated or unevenly padded one (16-bit
//! channel-last only).

use super::{
    Buf, ConvStep, DepthwiseStep, GemmStep, Lowered, Lowering, MatVecStep, OwnConvStep,
    StemPoolStep, Step, Tref,
};
use crate::gpu::program::kernels::depthwise;
use crate::gpu::program::kernels::gemm::ConvGeometry;
use crate::gpu::program::kernels::stem::{StemDims, STEM_CHANNELS, STEM_OUTPUTS, STEM_TAPS};
use crate::gpu::program::kernels::Window;
use crate::gpu::program::Strided;
use crate::graph::{Activation, Binary, Op, ValueId};
use gpukit_tensor::{ConvShape, DType, Layout};

impl Lowering<'_> {
    /// Whether a convolution reads `v` as its residual input (its only reader, checked by the
    /// caller).
    fn residual_reader(&self, v: ValueId) -> bool {
        self.g.nodes.iter().any(|n| match &n.op {
            Op::Conv(c) => c.residual_input().is_some_and(|i| n.inputs[i] == v),
            _ => false,
        })
    }

    pub(super) fn conv(
        &mut self,
        node: &crate::graph::Node,
        c: &crate::graph::Conv,
    ) -> Lowered<()> {
        let name = node.name.clone();
        let out = node.outputs[0];
        let [pt, pl, pb, pr] = c.pads;
        let uneven = !(pt == pl && pl == pb && pb == pr);
        if (c.dilations != [1, 1] || uneven) && c.strides[0] == c.strides[1] {
            // cuDNN's path takes neither: gpukit's kernel, where it runs
            return self.own_conv(node, c);
        }
        if c.strides[0] != c.strides[1] {
            return self.fail("the GPU engine runs convolutions with one stride for both axes");
        }
        if self.g.value(node.inputs[0]).shape.len() != 4 {
            return self.fail("a convolution of a tensor that is not 4-D");
        }
        let xin = node.inputs[0];
        let x = self.get(xin)?;
        let x = self.as_image(x, &format!("{name} (input in the engine's layout)"));
        let [n, cin, h, w] = x.s.dims;
        let wshape = &self.g.value(node.inputs[1]).shape;
        let (k, cg, r, s) = (wshape[0], wshape[1], wshape[2], wshape[3]);
        let weights = self.constant(node.inputs[1], "weight")?;
        let blocked = match self.blocked {
            Some((v, b)) if v == xin => Some(b),
            _ => None,
        };
        let (r, s, stride, pt, cg) = match blocked {
            // the converted input is the image in blocks: a stride-1 convolution, unpadded
            Some(b) => (b.rows.taps, b.cols.taps, 1, 0, b.channels),
            None => (r, s, c.strides[0], pt, cg),
        };
        // the converted input's padded channels meet zero filter taps
        let (c_real, c_pad) = match self.padded {
            Some((v, c, cout)) if v == xin => (c, cout),
            _ => (cin, cin),
        };
        let cg_pad = if c_pad != c_real { c_pad } else { cg };
        let shape = ConvShape {
            n,
            c: cin,
            h,
            w,
            k,
            r,
            s,
            stride,
            pad: pt,
            groups: c.groups,
        };
        if shape.group_channels() != cg_pad || !shape.groups_fit() {
            return self.fail(format!(
                "a filter of {cg} channels a group does not fit {cin} input channels in {} groups",
                c.groups
            ));
        }
        let dims = self.dims(out)?;
        if (shape.out_h(), shape.out_w()) != (dims[2], dims[3]) {
            return self.fail("its output size is not what one padding for all sides gives");
        }
        let mut bias = if c.bias {
            Some(self.constant(node.inputs[2], "bias")?.to_vec())
        } else {
            None
        };
        // a residual whose bias was left to this convolution: added to this one's
        if let Some(moved) = c
            .residual_input()
            .and_then(|i| self.moved_bias.remove(&node.inputs[i]))
        {
            let b = bias.get_or_insert_with(|| vec![0.0; k]);
            for (b, m) in b.iter_mut().zip(moved) {
                *b += m;
            }
        }
        // this convolution's bias left to the one that reads its output as a residual: both
        // are added into one sum
        let act = c.epilogue.activation;
        if let (Some(b), None, None) = (&bias, act, c.residual_input()) {
            if self.uses[out] == 1 && !self.is_output[out] && self.residual_reader(out) {
                self.moved_bias.insert(out, b.clone());
                bias = None;
            }
        }
        let z = match c.residual_input() {
            Some(i) => {
                let t = self.get(node.inputs[i])?;
                Some(self.as_image(t, &format!("{name} (residual in the engine's layout)")))
            }
            None => None,
        };
        let y = self.new_view(Strided::image(dims, self.layout), &name);
        // a 1x1 convolution of 1x1 maps (squeeze-and-excitation's two layers): a
        // matrix-vector product on gpukit's kernel, bias and activation in its pass; cuDNN took
        // 4.5-7 us a call for these at batch 1. [n, c, 1, 1] is [n, c] in either layout.
        let rows = |t: &Tref, ch: usize| t.s.dims == [n, ch, 1, 1] && t.s.is_row_major();
        if (h, w, r, s, shape.groups, shape.pad) == (1, 1, 1, 1, 1, 0)
            && c_real == c_pad
            && rows(&x, cin)
            && rows(&y, k)
            && z.as_ref().is_none_or(|z| rows(z, k))
        {
            let wc = self.add_const(&format!("{name}.weight"), weights.to_vec());
            let bias = bias.map(|b| self.add_const(&format!("{name}.bias"), b));
            self.push(Step::MatVec(MatVecStep {
                x,
                w: wc,
                bias,
                z,
                act,
                y,
                n,
                k,
                c: cin,
            }));
            self.set(out, y);
            return Ok(());
        }
        let dense = |t: &Tref| t.s == Strided::image(t.s.dims, Layout::Nhwc);
        // a 1x1 convolution of channel-last maps is the product [n h w, c] x [c, k]: with
        // `conv1x1_gemm`, the engine's Gemm step (cuBLASLt's candidates and gpukit's own
        // kernel, timed per shape) instead of cuDNN's convolution
        if self.conv1x1_gemm
            && self.layout == Layout::Nhwc
            && self.dtype.uses_tensor_cores()
            && (r, s, stride, shape.pad, shape.groups) == (1, 1, 1, 0, 1)
            && c_real == c_pad
            && blocked.is_none()
            && dense(&x)
            && z.as_ref().is_none_or(dense)
        {
            let m = n * h * w;
            let rows = |t: Tref, cols: usize| Tref {
                s: Strided::row_major([1, 1, m, cols]),
                ..t
            };
            // [k, c] -> [c, k]
            let mut wt = vec![0f32; k * cin];
            for (o, row) in weights.chunks_exact(cin).enumerate() {
                for (ci, &v) in row.iter().enumerate() {
                    wt[ci * k + o] = v;
                }
            }
            let wc = self.add_const(&format!("{name}.weight"), wt);
            let bias = bias.map(|b| self.add_const(&format!("{name}.bias"), b));
            self.push(Step::Gemm(GemmStep {
                a: rows(x, cin),
                b: Tref {
                    buf: Buf::Const(wc),
                    offset: 0,
                    s: Strided::row_major([1, 1, cin, k]),
                },
                bias,
                z: z.map(|z| rows(z, k)),
                act,
                y: rows(y, k),
                m,
                n: k,
                k: cin,
                bt: None,
            }));
            self.set(out, y);
            return Ok(());
        }
        // one filter per channel on channel-last tensors: gpukit's kernel, epilogue and all
        if self.layout == Layout::Nhwc
            && c_real == c_pad
            && depthwise::depthwise_runs(&shape)
            && dense(&x)
            && z.as_ref().is_none_or(dense)
        {
            let taps = self.add_const(&format!("{name}.taps"), taps_of(weights, [k, r, s]));
            let bias = bias.map(|b| self.add_const(&format!("{name}.bias"), b));
            self.push(Step::Depthwise(DepthwiseStep {
                shape,
                x,
                taps,
                bias,
                z,
                act,
                y,
            }));
            self.set(out, y);
            return Ok(());
        }
        let filter = match blocked {
            Some(b) => b.filter(weights, [k, wshape[2], wshape[3]]),
            None => arrange_filter(weights, [k, cg, r, s], cg_pad, self.layout),
        };
        let wc = self.add_const(&format!("{name}.weight"), filter);
        // the epilogue in cuDNN's call: ReLU everywhere (the legacy fused call serves strict
        // f32), other activations and a bare bias or residual where its backend graphs were
        // checked (on tensor cores, channel-last, ungrouped: in NCHW such graphs gave wrong
        // outputs on the GPU, grouped ones too); HardSwish and HardSigmoid have no cuDNN form
        let graphs =
            self.dtype.uses_tensor_cores() && self.layout == Layout::Nhwc && shape.groups == 1;
        let in_library = match act {
            Some(Activation::Relu) => true,
            Some(Activation::HardSwish | Activation::HardSigmoid { .. }) => false,
            Some(Activation::Silu | Activation::Gelu | Activation::Sigmoid) => graphs,
            None => (bias.is_some() || z.is_some()) && graphs,
        };
        if in_library {
            let b = bias.unwrap_or_else(|| vec![0.0; k]);
            let bc = self.add_const(&format!("{name}.bias"), b);
            self.push(Step::Conv(ConvStep {
                shape,
                x,
                w: wc,
                bias: Some(bc),
                z,
                y,
                fused: true,
                act,
            }));
            self.set(out, y);
            return Ok(());
        }
        self.push(Step::Conv(ConvStep {
            shape,
            x,
            w: wc,
            bias: None,
            z: None,
            y,
            fused: false,
            act: None,
        }));
        // the epilogue as one element-wise step over the output, in place
        let b = match bias {
            Some(b) => {
                let bc = self.add_const(&format!("{name}.bias"), b);
                let s = Strided::row_major([1, k, 1, 1]).broadcast_to(dims);
                s.map(|s| {
                    (
                        Tref {
                            buf: Buf::Const(bc),
                            offset: 0,
                            s,
                        },
                        Binary::Add,
                    )
                })
            }
            None => None,
        };
        if b.is_some() || z.is_some() || act.is_some() {
            let i = self.push(Step::Pointwise {
                a: y,
                b,
                c: z,
                act,
                y,
            });
            if act.is_none() {
                self.open[out] = Some(i);
            }
        }
        self.set(out, y);
        Ok(())
    }
}

impl Lowering<'_> {
    /// A convolution cuDNN's path does not take (dilated, or padded unevenly) on gpukit's own
    /// kernel: 16-bit channel-last programs, one group, channels and filters in multiples of 8
    /// (the image's channels padded to 8 count); the step carries its whole epilogue.
    fn own_conv(&mut self, node: &crate::graph::Node, c: &crate::graph::Conv) -> Lowered<()> {
        let name = node.name.clone();
        let out = node.outputs[0];
        let sixteen = matches!(
            self.elem,
            gpukit_tensor::DType::F16 | gpukit_tensor::DType::Bf16
        );
        if !(sixteen && self.layout == Layout::Nhwc && c.groups == 1) {
            return self.fail(
                "dilated or unevenly padded convolutions run on the GPU engine in 16-bit \
                 channel-last strategies (fp16-nhwc, bf16-nhwc), ungrouped",
            );
        }
        if self.g.value(node.inputs[0]).shape.len() != 4 {
            return self.fail("a convolution of a tensor that is not 4-D");
        }
        let xin = node.inputs[0];
        let x = self.get(xin)?;
        let x = self.as_image(x, &format!("{name} (input in the engine's layout)"));
        let [n, cin, h, w] = x.s.dims;
        let wshape = self.g.value(node.inputs[1]).shape.clone();
        let (k, cg, r, s) = (wshape[0], wshape[1], wshape[2], wshape[3]);
        let weights = self.constant(node.inputs[1], "weight")?.to_vec();
        let g = ConvGeometry {
            n,
            h,
            w,
            c: cin,
            k,
            r,
            s,
            stride: c.strides[0],
            pads: c.pads,
            dilation: c.dilations,
        };
        let dims = self.dims(out)?;
        let (p, q) = g.out();
        if (p, q) != (dims[2], dims[3]) {
            return self.fail(format!(
                "its output is {}x{}, not the {p}x{q} its padding, stride and dilation give",
                dims[2], dims[3]
            ));
        }
        if !g.runs() || cg > cin {
            return self.fail(format!(
                "gpukit's convolution kernel, which runs the dilated or unevenly padded ones, \
                 takes input channels and filters in multiples of 8, not {cin} and {k}"
            ));
        }
        // the filter with the converted image's padded channels zero, as [k, cin, r, s]
        let mut kcrs = vec![0f32; k * cin * r * s];
        for o in 0..k {
            for ch in 0..cg {
                let from = (o * cg + ch) * r * s;
                let to = (o * cin + ch) * r * s;
                kcrs[to..to + r * s].copy_from_slice(&weights[from..from + r * s]);
            }
        }
        let mut bias = if c.bias {
            Some(self.constant(node.inputs[2], "bias")?.to_vec())
        } else {
            None
        };
        // a residual whose bias was left to this convolution: added to this one's
        if let Some(moved) = c
            .residual_input()
            .and_then(|i| self.moved_bias.remove(&node.inputs[i]))
        {
            let b = bias.get_or_insert_with(|| vec![0.0; k]);
            for (b, m) in b.iter_mut().zip(moved) {
                *b += m;
            }
        }
        let z = match c.residual_input() {
            Some(i) => {
                let t = self.get(node.inputs[i])?;
                Some(self.as_image(t, &format!("{name} (residual in the engine's layout)")))
            }
            None => None,
        };
        let wc = self.add_const(&format!("{name}.weight"), g.filter(&kcrs));
        let bias = bias.map(|b| self.add_const(&format!("{name}.bias"), b));
        let y = self.new_view(Strided::image(dims, self.layout), &name);
        self.push(Step::OwnConv(OwnConvStep {
            g,
            x,
            w: wc,
            bias,
            z,
            act: c.epilogue.activation,
            y,
        }));
        self.set(out, y);
        Ok(())
    }
}

/// A depthwise `[k, 1, r, s]` filter as the depthwise kernel reads it: `[r, s, k]`.
fn taps_of(w: &[f32], [k, r, s]: [usize; 3]) -> Vec<f32> {
    let mut out = vec![0f32; k * r * s];
    for o in 0..k {
        for t in 0..r * s {
            out[t * k + o] = w[o * r * s + t];
        }
    }
    out
}

/// A `[k, cg, r, s]` filter as the layout stores it (KCRS or KRSC), input channels zero-padded
/// to `cg_pad`.
fn arrange_filter(w: &[f32], [k, cg, r, s]: [usize; 4], cg_pad: usize, layout: Layout) -> Vec<f32> {
    let mut out = vec![0f32; k * cg_pad * r * s];
    for o in 0..k {
        for c in 0..cg {
            for i in 0..r {
                for j in 0..s {
                    let v = w[((o * cg + c) * r + i) * s + j];
                    let at = match layout {
                        Layout::Nchw => ((o * cg_pad + c) * r + i) * s + j,
                        Layout::Nhwc => ((o * r + i) * s + j) * cg_pad + c,
                    };
                    out[at] = v;
                }
            }
        }
    }
    out
}

impl Lowering<'_> {
    /// Takes the 3 x 3 stride-2 max pool (padding 1) of `v` (its view `x`, into `y`) into the
    /// convolution step just before it, as one stem-and-pool step on gpukit's kernel: where
    /// that step computes `x` alone (its ReLU fused, no residual), only the pool reads it, and
    /// the kernel takes its shape (16-bit channel-last, 16 channels in, 64 out, 4 x 4 taps at
    /// stride 1 unpadded: the blocked 7 x 7 stem). `GPUKIT_NO_STEM_POOL=1` keeps the two steps
    /// (A/B runs). Whether it did.
    pub(super) fn join_stem_pool(&mut self, v: ValueId, x: Tref, y: Tref, win: &Window) -> bool {
        let pool = win.max && win.kernel == [3, 3] && win.strides == [2, 2] && win.pads == [1; 4];
        let sixteen = matches!(self.elem, DType::F16 | DType::Bf16);
        if !pool
            || !sixteen
            || !self.stem_pool
            || self.layout != Layout::Nhwc
            || self.uses[v] != 1
            || self.is_output[v]
            || std::env::var_os("GPUKIT_NO_STEM_POOL").is_some_and(|s| s == "1")
        {
            return false;
        }
        let Some((_, Step::Conv(c))) = self.steps.last() else {
            return false;
        };
        let sh = c.shape;
        let dense = |t: &Tref| t.s == Strided::image(t.s.dims, Layout::Nhwc);
        let [n, _, pp, pq] = y.s.dims;
        let dims = StemDims {
            n,
            hb: sh.h,
            wb: sh.w,
            pp,
            pq,
        };
        let takes = c.y == x
            && c.fused_relu()
            && c.z.is_none()
            && (sh.c, sh.k, sh.r, sh.s) == (STEM_CHANNELS, STEM_OUTPUTS, STEM_TAPS, STEM_TAPS)
            && (sh.stride, sh.pad, sh.groups) == (1, 0, 1)
            && dense(&c.x)
            && dense(&y)
            && y.s.dims[1] == STEM_OUTPUTS
            && dims.consistent();
        if !takes {
            return false;
        }
        let conv = c.clone();
        let (name, _) = self.steps.pop().expect("the convolution step just read");
        self.steps
            .push((name, Step::StemPool(StemPoolStep { conv, y })));
        true
    }
}
