//! A graph lowered to GPU steps for one dtype and layout: every value placed as a strided view
//! of an arena slot or of a constant, the steps in the graph's order, and the memory plan of the
//! slots. No device is needed.

use super::blocks;
use super::kernels::Window;
use super::{pad4, Strided};
use crate::graph::{Binary, Graph, Op, ValueId};
use crate::plan::{plan_no_reuse, plan_reuse, Lifetime, MemoryPlan};
use gpukit_tensor::{DType, Layout};
use std::collections::HashMap;

pub use super::steps::Unsupported;
pub(super) use super::steps::{
    Buf, Const, ConvStep, DepthwiseStep, GemmStep, MatVecStep, OwnConvStep, Slot, StemPoolStep,
    Step, Tref,
};
pub(super) use branches::Branch;

/// The compute capability from which gpukit's stem-and-pool kernel runs.
pub const STEM_POOL_CC: (u32, u32) = (8, 0);

/// A graph lowered for one dtype and layout.
#[derive(Debug, Clone)]
pub struct Program {
    pub dtype: DType,
    pub layout: Layout,
    /// Each step and the name of the graph node it comes from.
    pub(super) steps: Vec<(String, Step)>,
    pub(super) slots: Vec<Slot>,
    pub(super) consts: Vec<Const>,
    /// Per graph input: name, shape and its f32 slot.
    pub(super) inputs: Vec<(String, Vec<usize>, usize)>,
    /// Per graph output: name, shape and its f32 slot.
    pub(super) outputs: Vec<(String, Vec<usize>, usize)>,
    pub(super) plan: MemoryPlan,
    /// Per step, where it is a branch that may run beside the steps before it.
    pub(super) branches: Vec<Option<Branch>>,
    /// What the slots take without reuse.
    pub arena_bytes_without_plan: usize,
}

impl Program {
    /// Lowers `graph` (best optimized first: `crate::graph::passes::optimize`) for `dtype`
    /// (f32, tf32, f16, bf16) and `layout`; Err names the first node it cannot run.
    pub fn lower(graph: &Graph, dtype: DType, layout: Layout) -> Result<Program, Unsupported> {
        let conv1x1_gemm = std::env::var_os("GPUKIT_CONV1X1_GEMM").is_some();
        Program::lower_with_conv1x1_gemm(graph, dtype, layout, conv1x1_gemm)
    }

    /// [`Program::lower`] with 1x1 convolutions of channel-last maps as Gemm steps (what
    /// `GPUKIT_CONV1X1_GEMM` asks for) or not, whatever the environment says.
    pub fn lower_with_conv1x1_gemm(
        graph: &Graph,
        dtype: DType,
        layout: Layout,
        conv1x1_gemm: bool,
    ) -> Result<Program, Unsupported> {
        if !super::super::ENGINE_DTYPES.contains(&dtype) {
            return Err(Unsupported {
                node: "-".into(),
                op: "-".into(),
                why: format!("the GPU engine runs f32, tf32, f16 and bf16, not {dtype}"),
            });
        }
        let mut l = Lowering::new(graph, dtype, layout);
        l.conv1x1_gemm = conv1x1_gemm;
        l.run()
    }

    /// [`Program::lower`] for a GPU of compute capability `cc`: below 8.0 (Ampere), which
    /// lacks the instructions gpukit's stem-and-pool kernel uses (cp.async, mma.sync
    /// m16n8k16), the stem's convolution and its pool stay two steps.
    pub fn lower_for(
        graph: &Graph,
        dtype: DType,
        layout: Layout,
        cc: (u32, u32),
    ) -> Result<Program, Unsupported> {
        if cc >= STEM_POOL_CC {
            return Program::lower(graph, dtype, layout);
        }
        let conv1x1_gemm = std::env::var_os("GPUKIT_CONV1X1_GEMM").is_some();
        let mut l = Lowering::new(graph, dtype, layout);
        l.conv1x1_gemm = conv1x1_gemm;
        l.stem_pool = false;
        l.run()
    }

    /// Whether the program has a step only GPUs of compute capability [`STEM_POOL_CC`] and
    /// later run (a stem-and-pool step).
    pub fn needs_ampere(&self) -> bool {
        self.steps
            .iter()
            .any(|(_, s)| matches!(s, Step::StemPool(_)))
    }

    /// Bytes of the activation arena (inputs and outputs included).
    pub fn arena_bytes(&self) -> usize {
        self.plan.total
    }

    /// Bytes of the weights on the device.
    pub fn weight_bytes(&self) -> usize {
        let e = self.dtype.storage().size_bytes();
        self.consts
            .iter()
            .map(|c| {
                crate::plan::ALIGN
                    .max((c.values.len() * e).div_ceil(crate::plan::ALIGN) * crate::plan::ALIGN)
            })
            .sum()
    }

    /// Steps, by kind: `[("conv (cuDNN)", 53), ...]`.
    pub fn step_counts(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for (_, s) in &self.steps {
            match counts.iter_mut().find(|(k, _)| *k == s.kind()) {
                Some((_, n)) => *n += 1,
                None => counts.push((s.kind(), 1)),
            }
        }
        counts
    }

    /// The `k` largest slots of the arena: name and bytes.
    pub fn largest_slots(&self, k: usize) -> Vec<(String, usize)> {
        let mut s: Vec<(String, usize)> = self
            .slots
            .iter()
            .map(|s| (s.name.clone(), s.bytes))
            .collect();
        s.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
        s.truncate(k);
        s
    }

    /// The graph's inputs: name and shape.
    pub fn inputs(&self) -> Vec<(String, Vec<usize>)> {
        self.inputs
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect()
    }

    /// The graph's outputs: name and shape.
    pub fn outputs(&self) -> Vec<(String, Vec<usize>)> {
        self.outputs
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect()
    }
}

/// The state of one lowering.
struct Lowering<'g> {
    g: &'g Graph,
    dtype: DType,
    elem: DType,
    layout: Layout,
    /// Per graph value, where it is once placed.
    at: Vec<Option<Tref>>,
    slots: Vec<Slot>,
    consts: Vec<Const>,
    steps: Vec<(String, Step)>,
    /// Per graph value: how many node inputs read it, and whether it is a graph output.
    uses: Vec<usize>,
    is_output: Vec<bool>,
    /// Per graph value: the element-wise step that computes it, while that step's activation
    /// and added operand are still free.
    open: Vec<Option<usize>>,
    /// Per graph value: the Gemm step whose output it is (or a view of), while that step's
    /// epilogue can still take a bias, a layer scale, a residual or an activation.
    open_gemm: Vec<Option<usize>>,
    /// Graph constants already on the device (row-major, storage type).
    const_of: HashMap<ValueId, usize>,
    /// The graph input converted with padded channels: (value, channels, padded).
    padded: Option<(ValueId, usize, usize)>,
    /// The graph input converted to blocks of pixels for the one convolution that reads it.
    blocked: Option<(ValueId, blocks::Blocks)>,
    /// 1x1 convolutions of channel-last maps as Gemm steps (an experiment's switch).
    conv1x1_gemm: bool,
    /// The stem's convolution and max pool may become one step (the device runs its kernel).
    stem_pool: bool,
    input_slots: Vec<usize>,
    /// Biases of convolutions whose output only a later convolution reads, as its residual:
    /// added into that convolution's bias instead (one pass over the output fewer).
    moved_bias: HashMap<ValueId, Vec<f32>>,
    /// Concatenations that extend an earlier one, sharing its slot.
    chains: concat::Chains,
    /// Per chain, its slot (the dims of its last concatenation), once placed.
    chain_slot: HashMap<usize, Tref>,
    /// The node being lowered, for errors.
    node: (String, String),
}

type Lowered<T> = Result<T, Unsupported>;

impl<'g> Lowering<'g> {
    fn new(g: &'g Graph, dtype: DType, layout: Layout) -> Lowering<'g> {
        let n = g.values.len();
        let mut uses = vec![0; n];
        for &v in g.nodes.iter().flat_map(|x| &x.inputs) {
            uses[v] += 1;
        }
        let mut is_output = vec![false; n];
        for &o in &g.outputs {
            is_output[o] = true;
        }
        Lowering {
            g,
            dtype,
            elem: dtype.storage(),
            layout,
            at: vec![None; n],
            slots: Vec::new(),
            consts: Vec::new(),
            steps: Vec::new(),
            uses,
            is_output,
            open: vec![None; n],
            open_gemm: vec![None; n],
            const_of: HashMap::new(),
            padded: None,
            blocked: None,
            conv1x1_gemm: false,
            stem_pool: true,
            input_slots: Vec::new(),
            moved_bias: HashMap::new(),
            chains: concat::Chains::of(g),
            chain_slot: HashMap::new(),
            node: ("graph input".into(), "-".into()),
        }
    }

    fn fail<T>(&self, why: impl Into<String>) -> Lowered<T> {
        Err(Unsupported {
            node: self.node.0.clone(),
            op: self.node.1.clone(),
            why: why.into(),
        })
    }

    fn dims(&self, v: ValueId) -> Lowered<[usize; 4]> {
        let shape = &self.g.value(v).shape;
        match pad4(shape) {
            Some(d) => Ok(d),
            None => self.fail(format!(
                "{} has rank {}; the GPU engine takes up to 4",
                self.g.value(v).name,
                shape.len()
            )),
        }
    }

    /// A new slot of `elem`-typed (or f32) elements.
    fn slot(&mut self, elements: usize, f32: bool, name: &str) -> usize {
        let e = if f32 { 4 } else { self.elem.size_bytes() };
        self.slots.push(Slot {
            bytes: elements * e,
            name: name.to_string(),
        });
        self.slots.len() - 1
    }

    /// A new slot holding `s` (dense).
    fn new_view(&mut self, s: Strided, name: &str) -> Tref {
        let slot = self.slot(s.len(), false, name);
        Tref {
            buf: Buf::Slot(slot),
            offset: 0,
            s,
        }
    }

    /// The layout a new value of `dims` takes: the image layout for 4-D values, else row-major.
    fn default_layout(&self, v: ValueId, dims: [usize; 4]) -> Strided {
        if self.g.value(v).shape.len() == 4 {
            Strided::image(dims, self.layout)
        } else {
            Strided::row_major(dims)
        }
    }

    fn push(&mut self, step: Step) -> usize {
        self.steps.push((self.node.0.clone(), step));
        self.steps.len() - 1
    }

    fn add_const(&mut self, _name: &str, values: Vec<f32>) -> usize {
        self.consts.push(Const { values });
        self.consts.len() - 1
    }

    /// Where value `v` is: placed already, or a graph constant put on the device now.
    fn get(&mut self, v: ValueId) -> Lowered<Tref> {
        if let Some(t) = self.at[v] {
            return Ok(t);
        }
        let value = self.g.value(v);
        let Some(data) = &value.constant else {
            return self.fail(format!("{} is not computed before it is read", value.name));
        };
        let Some(values) = data.as_f32() else {
            return self.fail(format!(
                "{} is an i64 tensor the GPU engine does not read",
                value.name
            ));
        };
        let dims = self.dims(v)?;
        let c = match self.const_of.get(&v) {
            Some(&c) => c,
            None => {
                let c = self.add_const(&value.name.clone(), values.to_vec());
                self.const_of.insert(v, c);
                c
            }
        };
        Ok(Tref {
            buf: Buf::Const(c),
            offset: 0,
            s: Strided::row_major(dims),
        })
    }

    /// A constant's values, for weights the host rearranges.
    fn constant(&self, v: ValueId, what: &str) -> Lowered<&'g [f32]> {
        match self.g.value(v).constant.as_ref().and_then(|d| d.as_f32()) {
            Some(values) => Ok(values),
            None => self.fail(format!(
                "its {what} is computed; the GPU engine takes constant {what}s"
            )),
        }
    }

    /// `t` copied into a new dense slot laid out as `want`.
    fn copy_to(&mut self, t: Tref, want: Strided, name: &str) -> Tref {
        let y = self.new_view(want, name);
        self.push(Step::Pointwise {
            a: t,
            b: None,
            c: None,
            act: None,
            y,
        });
        y
    }

    /// `t` as a dense image in the engine's layout, starting a slot (copied when it is not).
    fn as_image(&mut self, t: Tref, name: &str) -> Tref {
        if t.offset == 0 && t.s.is_image(self.layout) && matches!(t.buf, Buf::Slot(_)) {
            return Tref {
                s: Strided::image(t.s.dims, self.layout),
                ..t
            };
        }
        self.copy_to(t, Strided::image(t.s.dims, self.layout), name)
    }

    /// `t` in row-major order (copied when it is not).
    fn as_row_major(&mut self, t: Tref, name: &str) -> Tref {
        if t.s.is_row_major() {
            return Tref {
                s: Strided::row_major(t.s.dims),
                ..t
            };
        }
        self.copy_to(t, Strided::row_major(t.s.dims), name)
    }

    fn set(&mut self, v: ValueId, t: Tref) {
        self.at[v] = Some(t);
    }

    fn run(mut self) -> Lowered<Program> {
        let g = self.g;
        self.place_inputs()?;
        for node in &g.nodes {
            self.node = (node.name.clone(), node.op.name().to_string());
            self.lower_node(node)?;
        }
        self.node = ("graph output".into(), "-".into());
        self.transpose_small_products();
        let mut outputs = Vec::new();
        for &o in &g.outputs {
            let x = self.get(o)?;
            let shape = g.value(o).shape.clone();
            let slot = self.slot(x.s.len(), true, &g.value(o).name.clone());
            let y = Tref {
                buf: Buf::Slot(slot),
                offset: 0,
                s: Strided::row_major(x.s.dims),
            };
            self.push(Step::ToF32 { x, y });
            outputs.push((g.value(o).name.clone(), shape, slot));
        }
        let inputs = g
            .inputs
            .iter()
            .zip(&self.input_slots)
            .map(|(&i, &s)| (g.value(i).name.clone(), g.value(i).shape.clone(), s))
            .collect::<Vec<_>>();
        // lifetimes: from the first step that touches a slot to the last; inputs and outputs
        // live throughout (written before, read after)
        let steps = self.steps.len();
        let mut life: Vec<Lifetime> = self
            .slots
            .iter()
            .map(|s| Lifetime {
                bytes: s.bytes,
                first: usize::MAX,
                last: 0,
            })
            .collect();
        for (i, (_, step)) in self.steps.iter().enumerate() {
            let (reads, write) = step.operands();
            for t in reads.iter().chain(Some(&write)) {
                if let Buf::Slot(s) = t.buf {
                    life[s].first = life[s].first.min(i);
                    life[s].last = life[s].last.max(i);
                }
            }
        }
        // a branch's output lives from the first step it may run beside
        let branches = branches::branches(&self.steps);
        for (j, b) in branches.iter().enumerate() {
            if let (Some(b), Buf::Slot(s)) = (b, self.steps[j].1.operands().1.buf) {
                life[s].first = life[s].first.min(b.from);
            }
        }
        for &s in inputs
            .iter()
            .map(|(_, _, s)| s)
            .chain(outputs.iter().map(|(_, _, s)| s))
        {
            life[s].first = 0;
            life[s].last = steps;
        }
        for l in &mut life {
            if l.first == usize::MAX {
                // no step touches it (a convolution's output the stem's pool took in): no bytes
                l.first = 0;
                l.bytes = 0;
            }
        }
        let plan = plan_reuse(&life);
        Ok(Program {
            dtype: self.dtype,
            layout: self.layout,
            steps: self.steps,
            slots: self.slots,
            consts: self.consts,
            inputs,
            outputs,
            arena_bytes_without_plan: plan_no_reuse(&life).total,
            plan,
            branches,
        })
    }

    /// Each graph input gets an f32 slot; 4-D inputs that only convolutions read are converted
    /// to the image layout (channels padded to 8 in NHWC, as tensor-core engines want), others
    /// to the storage type where it is not f32.
    fn place_inputs(&mut self) -> Lowered<()> {
        let g = self.g;
        for &i in &g.inputs {
            let dims = self.dims(i)?;
            let name = g.value(i).name.clone();
            let slot = self.slot(dims.iter().product(), true, &name);
            self.input_slots.push(slot);
            let x = Tref {
                buf: Buf::Slot(slot),
                offset: 0,
                s: Strided::row_major(dims),
            };
            let rank4 = g.value(i).shape.len() == 4;
            let only_convs = g.nodes.iter().filter(|n| n.inputs.contains(&i)).all(|n| {
                matches!(&n.op, Op::Conv(c) if c.groups == 1 && n.inputs[0] == i
                    && !n.inputs[1..].contains(&i))
            });
            let c = dims[1];
            if let Some(b) = self.blocks_for(i).filter(|_| rank4 && only_convs) {
                let y = self.new_view(
                    Strided::image(b.dims(dims[0]), self.layout),
                    &format!("{name} (converted to blocks)"),
                );
                self.push(Step::ConvertBlocks { x, y, blocks: b });
                self.blocked = Some((i, b));
                self.set(i, y);
            } else if rank4 && only_convs && self.layout == Layout::Nhwc && c % 8 != 0 {
                let cout = c.div_ceil(8) * 8;
                let y = self.new_view(
                    Strided::image([dims[0], cout, dims[2], dims[3]], self.layout),
                    &format!("{name} (converted)"),
                );
                self.push(Step::ConvertImage { x, y, c, cout });
                self.padded = Some((i, c, cout));
                self.set(i, y);
            } else if self.elem == DType::F32 && (!rank4 || self.layout == Layout::Nchw) {
                self.set(i, x);
            } else {
                let want = self.default_layout(i, dims);
                let y = self.new_view(want, &format!("{name} (converted)"));
                self.push(Step::FromF32 { x, y });
                self.set(i, y);
            }
        }
        Ok(())
    }

    /// Graph input `i` as blocks of pixels ([`blocks::Blocks`]): where one convolution reads it,
    /// in 16-bit channel-last programs, unless `GPUKIT_NO_BLOCKED_STEM` is set.
    fn blocks_for(&self, i: ValueId) -> Option<blocks::Blocks> {
        let sixteen_bit = matches!(self.elem, DType::F16 | DType::Bf16);
        if !sixteen_bit
            || self.layout != Layout::Nhwc
            || std::env::var_os("GPUKIT_NO_BLOCKED_STEM").is_some()
        {
            return None;
        }
        let mut readers = self.g.nodes.iter().filter(|n| n.inputs.contains(&i));
        let (node, None) = (readers.next()?, readers.next()) else {
            return None;
        };
        let Op::Conv(conv) = &node.op else {
            return None;
        };
        if node.inputs[0] != i || node.inputs[1..].contains(&i) {
            return None;
        }
        let x = pad4(&self.g.value(i).shape)?;
        let y = pad4(&self.g.value(node.outputs[0]).shape)?;
        blocks::Blocks::of(conv, x[1], (x[2], x[3]), (y[2], y[3]))
    }

    fn lower_node(&mut self, node: &crate::graph::Node) -> Lowered<()> {
        let name = node.name.clone();
        let out = node.outputs[0];
        match &node.op {
            Op::Conv(c) => self.conv(node, c),
            Op::Activation(a) => {
                let x = node.inputs[0];
                let t = self.get(x)?;
                if self.join_gemm_activation(x, out, *a) {
                    return Ok(());
                }
                // fused into the element-wise step that computes x, when nothing else reads x
                if let Some(i) = self.open[x] {
                    if self.uses[x] == 1 && !self.is_output[x] {
                        if let (_, Step::Pointwise { act, .. }) = &mut self.steps[i] {
                            *act = Some(*a);
                        }
                        self.open[x] = None;
                        self.set(out, t);
                        return Ok(());
                    }
                }
                let want = t.s.dense_like(t.s.dims);
                let y = self.new_view(want, &name);
                self.push(Step::Pointwise {
                    a: t,
                    b: None,
                    c: None,
                    act: Some(*a),
                    y,
                });
                self.set(out, y);
                Ok(())
            }
            Op::Binary(op) => self.binary(node, *op),
            Op::BatchNorm { epsilon } => {
                let x = self.get(node.inputs[0])?;
                let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| node.inputs[i]);
                let (s, b, m, v) = (
                    self.constant(scale, "scale")?,
                    self.constant(bias, "bias")?,
                    self.constant(mean, "mean")?,
                    self.constant(var, "variance")?,
                );
                let mul: Vec<f32> = s
                    .iter()
                    .zip(v)
                    .map(|(s, v)| s / (v + epsilon).sqrt())
                    .collect();
                let add: Vec<f32> = b
                    .iter()
                    .zip(m)
                    .zip(&mul)
                    .map(|((b, m), k)| b - m * k)
                    .collect();
                let rank = self.g.value(node.inputs[0]).shape.len();
                let mut shape = vec![1usize; rank];
                if rank < 2 {
                    return self.fail("batch norm of a tensor without a channel axis");
                }
                shape[1] = mul.len();
                let Some(cd) = pad4(&shape) else {
                    return self.fail("rank over 4");
                };
                let bcast = |c: usize| -> Option<Tref> {
                    Some(Tref {
                        buf: Buf::Const(c),
                        offset: 0,
                        s: Strided::row_major(cd).broadcast_to(x.s.dims)?,
                    })
                };
                let (k, a) = (
                    self.add_const(&format!("{name}.scale"), mul),
                    self.add_const(&format!("{name}.shift"), add),
                );
                let (Some(k), Some(a)) = (bcast(k), bcast(a)) else {
                    return self.fail("its parameters do not match the channels");
                };
                let y = self.new_view(x.s.dense_like(x.s.dims), &name);
                let i = self.push(Step::Pointwise {
                    a: x,
                    b: Some((k, Binary::Mul)),
                    c: Some(a),
                    act: None,
                    y,
                });
                self.open[out] = Some(i);
                self.set(out, y);
                Ok(())
            }
            Op::MaxPool(p) | Op::AveragePool(p) => {
                let x = self.get(node.inputs[0])?;
                if self.g.value(node.inputs[0]).shape.len() != 4 {
                    return self.fail("pooling of a tensor that is not 4-D");
                }
                let dims = self.dims(out)?;
                let y = self.new_view(Strided::image(dims, self.layout), &name);
                let win = Window {
                    kernel: p.kernel,
                    strides: p.strides,
                    pads: p.pads,
                    max: matches!(node.op, Op::MaxPool(_)),
                    count_include_pad: p.count_include_pad,
                };
                if !self.join_stem_pool(node.inputs[0], x, y, &win) {
                    self.push(Step::Pool { x, y, win });
                }
                self.set(out, y);
                Ok(())
            }
            Op::GlobalAveragePool => self.global_average(node.inputs[0], out, &name),
            Op::ReduceMean { axes, keep_dims } => {
                let rank = self.g.value(node.inputs[0]).shape.len();
                if rank != 4 || axes != &[2, 3] {
                    return self
                        .fail("a mean over other axes than the spatial ones of a 4-D tensor");
                }
                self.global_average(node.inputs[0], out, &name)?;
                if !keep_dims {
                    let t = self.get(out)?;
                    self.relabel(t, out, &name)?;
                }
                Ok(())
            }
            Op::Flatten { .. }
            | Op::Reshape
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Identity => {
                let t = self.get(node.inputs[0])?;
                let viewed = t.s.is_row_major();
                self.relabel(t, out, &name)?;
                if viewed {
                    self.carry_open_gemm(node.inputs[0], out);
                }
                Ok(())
            }
            Op::Transpose { perm } => {
                let t = self.get(node.inputs[0])?;
                let r = perm.len();
                let mut p4 = [0, 1, 2, 3];
                for (i, &p) in perm.iter().enumerate() {
                    p4[4 - r + i] = 4 - r + p;
                }
                self.set(
                    out,
                    Tref {
                        s: t.s.permuted(p4),
                        ..t
                    },
                );
                self.carry_open_gemm(node.inputs[0], out);
                Ok(())
            }
            Op::Concat { axis } => self.concat(node, *axis),
            Op::LayerNorm { axis, epsilon } => {
                let x = self.get(node.inputs[0])?;
                let shape = &self.g.value(node.inputs[0]).shape;
                let rows: usize = shape[..*axis].iter().product();
                let cols: usize = shape[*axis..].iter().product();
                let x = self.as_row_major(x, &format!("{name} (input, row-major)"));
                let gamma = self.get(node.inputs[1])?;
                let gamma = self.as_row_major(gamma, &format!("{name}.scale"));
                let beta = match node.inputs.get(2) {
                    Some(&b) => {
                        let b = self.get(b)?;
                        Some(self.as_row_major(b, &format!("{name}.bias")))
                    }
                    None => None,
                };
                if gamma.s.len() != cols || beta.is_some_and(|b| b.s.len() != cols) {
                    return self.fail("its scale or bias is not of the normalized axes' size");
                }
                let y = self.new_view(Strided::row_major(x.s.dims), &name);
                self.push(Step::LayerNorm {
                    x,
                    gamma,
                    beta,
                    y,
                    rows,
                    cols,
                    eps: *epsilon,
                });
                self.set(out, y);
                Ok(())
            }
            Op::Gemm(gm) => {
                if gm.trans_a {
                    return self.fail("a transposed first operand (transA)");
                }
                let a = self.get(node.inputs[0])?;
                let a = self.as_row_major(a, &format!("{name} (A, row-major)"));
                let b = self.constant(node.inputs[1], "weight")?;
                let bs = &self.g.value(node.inputs[1]).shape;
                let (k, n) = if gm.trans_b {
                    (bs[1], bs[0])
                } else {
                    (bs[0], bs[1])
                };
                if a.s.dims[3] != k {
                    return self.fail("A's columns are not B's rows");
                }
                let m = a.s.len() / k.max(1);
                // B as [k, n] row-major, times alpha
                let mut w = vec![0f32; k * n];
                for i in 0..k {
                    for j in 0..n {
                        let v = if gm.trans_b {
                            b[j * k + i]
                        } else {
                            b[i * n + j]
                        };
                        w[i * n + j] = gm.alpha * v;
                    }
                }
                let y = self.gemm(a, w, (m, n, k), out, &name)?;
                let dims = y.s.dims;
                if let Some(&c) = node.inputs.get(2) {
                    if gm.beta == 1.0 && self.join_gemm_bias(out, c)? {
                        return Ok(());
                    }
                    let ct = match self.g.value(c).constant.as_ref().and_then(|d| d.as_f32()) {
                        Some(v) => {
                            let scaled = v.iter().map(|x| x * gm.beta).collect();
                            let cd = self.dims(c)?;
                            let ci = self.add_const(&format!("{name}.bias"), scaled);
                            Tref {
                                buf: Buf::Const(ci),
                                offset: 0,
                                s: Strided::row_major(cd),
                            }
                        }
                        None if gm.beta == 1.0 => self.get(c)?,
                        None => return self.fail("a computed C scaled by beta"),
                    };
                    let Some(cs) = ct.s.broadcast_to(dims) else {
                        return self.fail("C does not broadcast to the output");
                    };
                    let i = self.push(Step::Pointwise {
                        a: y,
                        b: Some((Tref { s: cs, ..ct }, Binary::Add)),
                        c: None,
                        act: None,
                        y,
                    });
                    self.open[out] = Some(i);
                }
                self.set(out, y);
                Ok(())
            }
            Op::MatMul => {
                let bv = node.inputs[1];
                if self.g.value(bv).shape.len() != 2 {
                    return self.fail("a second operand that is not a 2-D constant");
                }
                let b = self.constant(bv, "second operand")?.to_vec();
                let [k, n] = [self.g.value(bv).shape[0], self.g.value(bv).shape[1]];
                let a = self.get(node.inputs[0])?;
                let a = self.as_row_major(a, &format!("{name} (A, row-major)"));
                if a.s.dims[3] != k {
                    return self.fail("the first operand's last axis is not the second's rows");
                }
                let m = a.s.len() / k.max(1);
                let y = self.gemm(a, b, (m, n, k), out, &name)?;
                self.set(out, y);
                Ok(())
            }
            Op::Erf | Op::Constant { .. } | Op::Shape { .. } | Op::Gather { .. } => self.fail(
                "left after constant folding; the GPU engine runs it only as part of GELU or of \
                 shape arithmetic on constants",
            ),
        }
    }

    /// `t`'s elements as value `out` of another shape, in row-major order: a relabelling of
    /// the same bytes (a copy first when they are not row-major).
    fn relabel(&mut self, t: Tref, out: ValueId, name: &str) -> Lowered<()> {
        let d = self.dims(out)?;
        let t = self.as_row_major(t, name);
        self.set(
            out,
            Tref {
                s: Strided::row_major(d),
                ..t
            },
        );
        Ok(())
    }

    fn global_average(&mut self, x: ValueId, out: ValueId, name: &str) -> Lowered<()> {
        if self.g.value(x).shape.len() != 4 {
            return self.fail("a global average of a tensor that is not 4-D");
        }
        let t = self.get(x)?;
        let [n, c, _, _] = t.s.dims;
        let y = self.new_view(Strided::image([n, c, 1, 1], self.layout), name);
        self.push(Step::GlobalAverage { x: t, y });
        self.set(out, y);
        Ok(())
    }
}

mod binary;
mod branches;
mod concat;
mod conv;
mod gemm;
#[cfg(test)]
mod stem_tests;
#[cfg(test)]
mod tests;
