//! Squeeze-and-excitation's gate in two steps: the block's global average (the channel-last
//! kernel, many blocks an image), then its two 1x1 convolutions and their activations
//! (`gate = act2(W2 act1(W1 mean + b1) + b2)`) in one block an image, where the passes
//! recognised the block ([`crate::graph::SqueezeExcite`]), the layout is channel-last, nothing
//! else reads the values inside and the weights are small (`c * squeezed` at most
//! [`MOST_WEIGHTS`]: one block's loops over larger ones took longer than cuDNN's two calls).
//! The multiply by the gate stays an element-wise step.
//!
//! Measured (H200, 2026-11-27): the average inside the gate's kernel, one block an image, cost
//! MobileNetV3 a fifth of its speed at batch 32.

use super::{Lowered, Lowering, SqueezeStep, Step};
use crate::gpu::program::kernels::channels_last::{SE_MOST_CHANNELS, SE_MOST_SQUEEZED};
use crate::gpu::program::Strided;
use crate::graph::{Activation, Conv, Node, Op, Pattern, ValueId};
use gpukit_tensor::Layout;

/// Most weights (`c * squeezed`) of a gate on gpukit's kernel.
pub const MOST_WEIGHTS: usize = 64 * 1024;

/// The convolutions of one block: the squeeze and the gate.
struct Convs<'g> {
    squeeze: (&'g Node, &'g Conv),
    gate: (&'g Node, &'g Conv),
}

impl<'g> Lowering<'g> {
    /// The node computing `v`, when it is a 1x1 convolution with no residual whose output
    /// nothing else reads.
    fn lone_conv(&self, v: ValueId) -> Option<(&'g Node, &'g Conv)> {
        let g = self.g;
        let node = g.nodes.iter().find(|n| n.outputs.first() == Some(&v))?;
        match &node.op {
            Op::Conv(c)
                if c.kernel == [1, 1]
                    && c.groups == 1
                    && c.strides == [1, 1]
                    && c.pads == [0; 4]
                    && c.dilations == [1, 1]
                    && !c.epilogue.residual =>
            {
                Some((node, c))
            }
            _ => None,
        }
    }

    /// The block whose pooled value `pooled` is, when the gate can be one step here.
    fn squeeze_block(&self, pooled: ValueId) -> Option<(ValueId, Convs<'g>, Activation)> {
        if self.layout != Layout::Nhwc {
            return None;
        }
        let se = self.g.patterns.iter().find_map(|p| match p {
            Pattern::SqueezeExcite(s) if s.pooled == pooled => Some(s),
            _ => None,
        })?;
        let squeeze = self.lone_conv(se.squeezed)?;
        let gate = self.lone_conv(se.gate)?;
        let alone = |v: ValueId| self.uses[v] == 1 && !self.is_output[v];
        let fits = squeeze.0.inputs[0] == pooled
            && gate.0.inputs[0] == se.squeezed
            && gate.1.epilogue.activation == Some(se.gate_activation)
            && alone(pooled)
            && alone(se.squeezed);
        fits.then_some((se.input, Convs { squeeze, gate }, se.gate_activation))
    }

    /// Lowers the GlobalAveragePool computing `pooled` with the rest of its block's gate, when
    /// it is one (the block's convolutions are then skipped as they come); false otherwise.
    pub(super) fn squeeze_excite(&mut self, pooled: ValueId) -> Lowered<bool> {
        let Some((input, convs, gate_act)) = self.squeeze_block(pooled) else {
            return Ok(false);
        };
        let x = self.get(input)?;
        let [n, c, _, _] = x.s.dims;
        if x.s != Strided::image(x.s.dims, Layout::Nhwc) {
            return Ok(false);
        }
        let (sq_node, sq) = convs.squeeze;
        let (gate_node, gc) = convs.gate;
        let cr = self.g.value(sq_node.inputs[1]).shape[0];
        if c > SE_MOST_CHANNELS || cr > SE_MOST_SQUEEZED || c * cr > MOST_WEIGHTS {
            return Ok(false);
        }
        // W1 [cr, c] as stored; W2 [c, cr] transposed to [cr, c], so that the gate's threads
        // (one a channel) read it consecutively
        let w1 = self.constant(sq_node.inputs[1], "weight")?.to_vec();
        let w2 = self.constant(gate_node.inputs[1], "weight")?;
        let mut w2t = vec![0f32; c * cr];
        for i in 0..c {
            for j in 0..cr {
                w2t[j * c + i] = w2[i * cr + j];
            }
        }
        let bias = |this: &Self, node: &Node, conv: &Conv, len: usize| -> Lowered<Vec<f32>> {
            Ok(match conv.bias {
                true => this.constant(node.inputs[2], "bias")?.to_vec(),
                false => vec![0.0; len],
            })
        };
        let b1 = bias(self, sq_node, sq, cr)?;
        let b2 = bias(self, gate_node, gc, c)?;
        let name = gate_node.name.clone();
        let mean = self.new_view(
            Strided::image([n, c, 1, 1], Layout::Nhwc),
            &format!("{name} (mean)"),
        );
        self.push(Step::GlobalAverage { x, y: mean });
        let step = SqueezeStep {
            x: mean,
            w1: self.add_const(&format!("{name}.squeeze"), w1),
            b1: self.add_const(&format!("{name}.squeeze_bias"), b1),
            act1: sq.epilogue.activation,
            w2: self.add_const(&format!("{name}.excite"), w2t),
            b2: self.add_const(&format!("{name}.excite_bias"), b2),
            act2: gate_act,
            squeezed: cr,
            y: self.new_view(Strided::image([n, c, 1, 1], Layout::Nhwc), &name),
        };
        let y = step.y;
        self.push(Step::SqueezeExcite(step));
        self.set(gate_node.outputs[0], y);
        self.skipped.insert(sq_node.name.clone());
        self.skipped.insert(gate_node.name.clone());
        Ok(true)
    }
}
