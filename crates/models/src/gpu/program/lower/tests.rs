//! The lowering checked without a GPU: a program is run step by step by an emulator of the
//! kernels (f32, every view read through its strides, one arena at the memory plan's offsets)
//! and its outputs compared with the graph interpreter's. Views, fusions, concatenation slices,
//! channel padding, filter layouts and slot reuse all show in the outputs when wrong.

use super::*;
use crate::graph::{forward_cpu, passes::optimize, Activation, Array, Data};
use crate::onnx::{fixtures, import_model, ImportOptions};
use gpukit_tensor::random::{fresh_seed, normal_f32};

fn act(a: Option<Activation>, x: f32) -> f32 {
    let x64 = f64::from(x);
    match a {
        None => x,
        Some(Activation::Relu) => x.max(0.0),
        Some(Activation::Sigmoid) => 1.0 / (1.0 + (-x).exp()),
        Some(Activation::HardSigmoid { alpha, beta }) => (alpha * x + beta).clamp(0.0, 1.0),
        Some(Activation::HardSwish) => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        Some(Activation::Gelu) => {
            (0.5 * x64 * (1.0 + libm::erf(x64 * std::f64::consts::FRAC_1_SQRT_2))) as f32
        }
        Some(Activation::Silu) => x / (1.0 + (-x).exp()),
    }
}

/// The index of element `o` of a row-major view with strides `rm`.
fn unravel(o: usize, rm: &Strided) -> [usize; 4] {
    let mut rest = o;
    rm.strides.map(|s| {
        let i = rest / s;
        rest %= s;
        i
    })
}

/// Every index of `dims`, row-major.
fn indices(dims: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    let [a, b, c, d] = dims;
    (0..a).flat_map(move |i| {
        (0..b).flat_map(move |j| (0..c).flat_map(move |k| (0..d).map(move |l| [i, j, k, l])))
    })
}

/// The arena as cells of 2 bytes (the smallest element): element `i` of a slot whose elements
/// take `e` bytes is the cell `offset / 2 + i * e / 2`, so slots the plan overlaps share cells.
pub(super) struct Emu<'p> {
    p: &'p Program,
    arena: Vec<f32>,
}

impl Emu<'_> {
    /// Bytes of slot `s`'s elements: the graph's inputs and outputs are f32, the others the
    /// storage type.
    fn elem(&self, s: usize) -> usize {
        let p = self.p;
        let io = p.inputs.iter().chain(&p.outputs).any(|(_, _, x)| *x == s);
        if io {
            4
        } else {
            p.dtype.storage().size_bytes()
        }
    }

    fn cell(&self, s: usize, off: usize) -> usize {
        (self.p.plan.offsets[s] + off * self.elem(s)) / 2
    }

    fn at(&self, t: &Tref, i: [usize; 4]) -> (Buf, usize) {
        let off = t.offset + (0..4).map(|a| i[a] * t.s.strides[a]).sum::<usize>();
        (t.buf, off)
    }

    fn get(&self, t: &Tref, i: [usize; 4]) -> f32 {
        match self.at(t, i) {
            (Buf::Slot(s), off) => self.arena[self.cell(s, off)],
            (Buf::Const(c), off) => self.p.consts[c].values[off],
        }
    }

    fn put(&mut self, t: &Tref, i: [usize; 4], v: f32) {
        match self.at(t, i) {
            (Buf::Slot(s), off) => {
                assert!(
                    off < self.p.slots[s].bytes / self.elem(s),
                    "write past slot {}",
                    self.p.slots[s].name
                );
                let c = self.cell(s, off);
                self.arena[c] = v;
            }
            (Buf::Const(_), _) => panic!("a step writes a constant"),
        }
    }

    /// Convolution step `c`'s outputs (its fused epilogue applied), by index.
    fn conv_out(&self, c: &ConvStep) -> Vec<([usize; 4], f32)> {
        let sh = c.shape;
        let cg = sh.group_channels();
        let kg = sh.k / sh.groups;
        let w = &self.p.consts[c.w].values;
        let mut out = Vec::new();
        for [n, ko, p, q] in indices(c.y.s.dims) {
            let g = ko / kg;
            let mut s = 0f64;
            for ci in 0..cg {
                for i in 0..sh.r {
                    for j in 0..sh.s {
                        let yy = (p * sh.stride + i) as isize - sh.pad as isize;
                        let xx = (q * sh.stride + j) as isize - sh.pad as isize;
                        if yy < 0 || xx < 0 || yy >= sh.h as isize || xx >= sh.w as isize {
                            continue;
                        }
                        let wi = match self.p.layout {
                            Layout::Nchw => ((ko * cg + ci) * sh.r + i) * sh.s + j,
                            Layout::Nhwc => ((ko * sh.r + i) * sh.s + j) * cg + ci,
                        };
                        let xv = self.get(&c.x, [n, g * cg + ci, yy as usize, xx as usize]);
                        s += f64::from(xv) * f64::from(w[wi]);
                    }
                }
            }
            let mut v = s as f32;
            if c.fused {
                v += c.bias.map_or(0.0, |b| self.p.consts[b].values[ko]);
                if let Some(z) = &c.z {
                    v += self.get(z, [n, ko, p, q]);
                }
                v = act(c.act, v);
            }
            out.push(([n, ko, p, q], v));
        }
        out
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::ConvertImage { x, y, c, .. } => {
                for i in indices(y.s.dims) {
                    let v = if i[1] < *c { self.get(x, i) } else { 0.0 };
                    self.put(y, i, v);
                }
            }
            Step::ConvertBlocks { x, y, blocks: b } => {
                let [_, _, h, w] = x.s.dims;
                for [n, ch, by, bx] in indices(y.s.dims) {
                    let (at, cc) = (ch / b.c, ch % b.c);
                    let (r, q) = (at / b.side, at % b.side);
                    let source = (at < b.side * b.side)
                        .then(|| b.rows.source(by, r, b.side, h))
                        .flatten()
                        .zip(b.cols.source(bx, q, b.side, w));
                    let v = source.map_or(0.0, |(u, v)| self.get(x, [n, cc, u, v]));
                    self.put(y, [n, ch, by, bx], v);
                }
            }
            Step::FromF32 { x, y } | Step::ToF32 { x, y } => {
                for i in indices(y.s.dims) {
                    let v = self.get(x, i);
                    self.put(y, i, v);
                }
            }
            Step::Pointwise { a, b, c, act: f, y } => {
                for i in indices(y.s.dims) {
                    let mut v = self.get(a, i);
                    if let Some((t, op)) = b {
                        let u = self.get(t, i);
                        v = match op {
                            Binary::Add => v + u,
                            Binary::Sub => v - u,
                            Binary::Mul => v * u,
                            Binary::Div => v / u,
                        };
                    }
                    if let Some(t) = c {
                        v += self.get(t, i);
                    }
                    self.put(y, i, act(*f, v));
                }
            }
            Step::Pool { x, y, win } => {
                let [h, w] = [x.s.dims[2] as isize, x.s.dims[3] as isize];
                for [n, ch, i, j] in indices(y.s.dims) {
                    let h0 = (i * win.strides[0]) as isize - win.pads[0] as isize;
                    let w0 = (j * win.strides[1]) as isize - win.pads[1] as isize;
                    let (mut m, mut taps) = (if win.max { f32::NEG_INFINITY } else { 0.0 }, 0);
                    for di in 0..win.kernel[0] as isize {
                        for dj in 0..win.kernel[1] as isize {
                            let (yy, xx) = (h0 + di, w0 + dj);
                            if yy < 0 || yy >= h || xx < 0 || xx >= w {
                                continue;
                            }
                            let v = self.get(x, [n, ch, yy as usize, xx as usize]);
                            m = if win.max { m.max(v) } else { m + v };
                            taps += 1;
                        }
                    }
                    if !win.max {
                        let div = if win.count_include_pad {
                            let he = (h0 + win.kernel[0] as isize).min(h + win.pads[2] as isize);
                            let we = (w0 + win.kernel[1] as isize).min(w + win.pads[3] as isize);
                            (he - h0) * (we - w0)
                        } else {
                            taps
                        };
                        m /= div as f32;
                    }
                    self.put(y, [n, ch, i, j], m);
                }
            }
            Step::GlobalAverage { x, y } => {
                let [n, c, h, w] = x.s.dims;
                for i in 0..n {
                    for ch in 0..c {
                        let mut s = 0.0f64;
                        for a in 0..h {
                            for b in 0..w {
                                s += f64::from(self.get(x, [i, ch, a, b]));
                            }
                        }
                        self.put(y, [i, ch, 0, 0], (s / (h * w) as f64) as f32);
                    }
                }
            }
            Step::LayerNorm {
                x,
                gamma,
                beta,
                y,
                rows,
                cols,
                eps,
            } => {
                // rows of a row-major view: element r * cols + k
                let elem = |t: &Tref, o: usize| unravel(o, &Strided::row_major(t.s.dims));
                for r in 0..*rows {
                    let xs: Vec<f64> = (0..*cols)
                        .map(|k| f64::from(self.get(x, elem(x, r * cols + k))))
                        .collect();
                    let mean = xs.iter().sum::<f64>() / *cols as f64;
                    let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / *cols as f64;
                    for (k, v) in xs.iter().enumerate() {
                        let g = f64::from(self.get(gamma, elem(gamma, k)));
                        let b = beta.map_or(0.0, |b| f64::from(self.get(&b, elem(&b, k))));
                        let out = (v - mean) / (var + f64::from(*eps)).sqrt() * g + b;
                        self.put(y, elem(y, r * cols + k), out as f32);
                    }
                }
            }
            Step::Gemm(g) => {
                let (m, n, k) = (g.m, g.n, g.k);
                let ra = Strided::row_major(g.a.s.dims);
                let at = |o: usize, t: &Tref, rm: &Strided| self.get(t, unravel(o, rm));
                let rb = Strided::row_major(g.b.s.dims);
                let ry = Strided::row_major(g.y.s.dims);
                let mut out = vec![0f32; m * n];
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0f64;
                        for l in 0..k {
                            s += f64::from(at(i * k + l, &g.a, &ra))
                                * f64::from(at(l * n + j, &g.b, &rb));
                        }
                        if let Some(c) = g.bias {
                            s += f64::from(self.p.consts[c].values[j]);
                        }
                        if let Some(z) = &g.z {
                            s += f64::from(at(i * n + j, z, &ry));
                        }
                        out[i * n + j] = act(g.act, s as f32);
                    }
                }
                for (o, v) in out.into_iter().enumerate() {
                    self.put(&g.y, unravel(o, &ry), v);
                }
            }
            Step::Conv(c) => {
                for (i, v) in self.conv_out(c) {
                    self.put(&c.y, i, v);
                }
            }
            Step::StemPool(sp) => {
                // the convolution's outputs, never in the arena, then the 3 x 3 stride-2 pool
                // (padding 1) over them
                let [_, k, p, q] = sp.conv.y.s.dims;
                let mut conv = vec![f32::NAN; sp.conv.y.s.len()];
                let at = |[n, ko, i, j]: [usize; 4]| ((n * k + ko) * p + i) * q + j;
                for (i, v) in self.conv_out(&sp.conv) {
                    conv[at(i)] = v;
                }
                for [n, ko, i, j] in indices(sp.y.s.dims) {
                    let mut m = f32::NEG_INFINITY;
                    for yy in (2 * i).saturating_sub(1)..(2 * i + 2).min(p) {
                        for xx in (2 * j).saturating_sub(1)..(2 * j + 2).min(q) {
                            m = m.max(conv[at([n, ko, yy, xx])]);
                        }
                    }
                    self.put(&sp.y, [n, ko, i, j], m);
                }
            }
            Step::OwnConv(o) => {
                let g = o.g;
                let w = &self.p.consts[o.w].values;
                let mut out = Vec::new();
                for [n, ko, p, q] in indices(o.y.s.dims) {
                    let mut s = 0f64;
                    for i in 0..g.r {
                        for j in 0..g.s {
                            let yy =
                                (p * g.stride + i * g.dilation[0]) as isize - g.pads[0] as isize;
                            let xx =
                                (q * g.stride + j * g.dilation[1]) as isize - g.pads[1] as isize;
                            if yy < 0 || xx < 0 || yy >= g.h as isize || xx >= g.w as isize {
                                continue;
                            }
                            for ch in 0..g.c {
                                let x = self.get(&o.x, [n, ch, yy as usize, xx as usize]);
                                s += f64::from(x)
                                    * f64::from(w[((i * g.s + j) * g.c + ch) * g.k + ko]);
                            }
                        }
                    }
                    let mut v = s as f32 + o.bias.map_or(0.0, |b| self.p.consts[b].values[ko]);
                    if let Some(z) = &o.z {
                        v += self.get(z, [n, ko, p, q]);
                    }
                    out.push(([n, ko, p, q], act(o.act, v)));
                }
                for (i, v) in out {
                    self.put(&o.y, i, v);
                }
            }
            Step::MatVec(m) => {
                let w = &self.p.consts[m.w].values;
                let mut out = Vec::new();
                for i in 0..m.n {
                    for o in 0..m.k {
                        let s: f64 = (0..m.c)
                            .map(|ch| {
                                f64::from(self.get(&m.x, [i, ch, 0, 0]))
                                    * f64::from(w[o * m.c + ch])
                            })
                            .sum();
                        let mut v = s as f32 + m.bias.map_or(0.0, |b| self.p.consts[b].values[o]);
                        if let Some(z) = &m.z {
                            v += self.get(z, [i, o, 0, 0]);
                        }
                        out.push(([i, o, 0, 0], act(m.act, v)));
                    }
                }
                for (i, v) in out {
                    self.put(&m.y, i, v);
                }
            }
            Step::Depthwise(d) => {
                let sh = d.shape;
                let taps = &self.p.consts[d.taps].values;
                let mut out = Vec::new();
                for [n, ch, p, q] in indices(d.y.s.dims) {
                    let mut s = 0f64;
                    for i in 0..sh.r {
                        for j in 0..sh.s {
                            let yy = (p * sh.stride + i) as isize - sh.pad as isize;
                            let xx = (q * sh.stride + j) as isize - sh.pad as isize;
                            if yy < 0 || xx < 0 || yy >= sh.h as isize || xx >= sh.w as isize {
                                continue;
                            }
                            let xv = self.get(&d.x, [n, ch, yy as usize, xx as usize]);
                            s += f64::from(xv) * f64::from(taps[(i * sh.s + j) * sh.c + ch]);
                        }
                    }
                    let mut v = s as f32 + d.bias.map_or(0.0, |b| self.p.consts[b].values[ch]);
                    if let Some(z) = &d.z {
                        v += self.get(z, [n, ch, p, q]);
                    }
                    out.push(([n, ch, p, q], act(d.act, v)));
                }
                for (i, v) in out {
                    self.put(&d.y, i, v);
                }
            }
        }
    }

    /// Runs the program on `inputs`; the outputs, f32 row-major.
    pub(super) fn run(p: &Program, inputs: &[&[f32]]) -> Vec<Vec<f32>> {
        Emu::run_in((0..p.steps.len()).collect(), p, inputs)
    }

    /// The steps of `p` in `order`.
    pub(super) fn run_in(order: Vec<usize>, p: &Program, inputs: &[&[f32]]) -> Vec<Vec<f32>> {
        // NaN everywhere first: a read of a byte nothing wrote shows
        let mut e = Emu {
            p,
            arena: vec![f32::NAN; p.plan.total / 2],
        };
        for ((_, _, slot), x) in p.inputs.iter().zip(inputs) {
            for (i, v) in x.iter().enumerate() {
                let c = e.cell(*slot, i);
                e.arena[c] = *v;
            }
        }
        for i in order {
            e.step(&p.steps[i].1);
        }
        p.outputs
            .iter()
            .map(|(_, shape, slot)| {
                let n = shape.iter().product::<usize>();
                (0..n).map(|i| e.arena[e.cell(*slot, i)]).collect()
            })
            .collect()
    }
}

pub(super) fn optimized(model: &crate::onnx::ModelProto) -> Graph {
    let options = ImportOptions {
        batch: Some(2),
        dims: Vec::new(),
    };
    let mut g = import_model(model, None, "fixture", &options).unwrap();
    optimize(&mut g).unwrap();
    g
}

/// Fresh standard normal inputs for graph `g`, and the interpreter's outputs for them.
pub(super) fn random_run(g: &Graph) -> (Vec<Array>, Vec<Array>) {
    let inputs: Vec<Array> = g
        .inputs
        .iter()
        .map(|&i| {
            let shape = g.value(i).shape.clone();
            Array::f32(&shape, normal_f32(shape.iter().product(), fresh_seed()))
        })
        .collect();
    let want = forward_cpu(g, &inputs).unwrap();
    (inputs, want)
}

pub(super) fn max_rel(got: &[f32], want: &[f32]) -> f64 {
    let scale = want
        .iter()
        .fold(0f64, |m, v| m.max(f64::from(v.abs())))
        .max(1e-12);
    got.iter()
        .zip(want)
        .map(|(a, b)| {
            let d = (f64::from(*a) - f64::from(*b)).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0f64, f64::max)
        / scale
}

#[test]
fn every_fixture_lowers_and_its_program_computes_the_graph() {
    let (mut converted, mut branched) = (0, 0);
    for f in fixtures::all(fresh_seed()) {
        let g = optimized(&f.model);
        let inputs: Vec<Array> = g
            .inputs
            .iter()
            .map(|&i| {
                let shape = g.value(i).shape.clone();
                let x = normal_f32(shape.iter().product(), fresh_seed());
                Array::f32(&shape, x)
            })
            .collect();
        let want = forward_cpu(&g, &inputs).unwrap();
        let xs: Vec<&[f32]> = inputs.iter().map(|a| a.as_f32().unwrap()).collect();
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let p = Program::lower(&g, DType::F32, layout)
                .unwrap_or_else(|e| panic!("{} {layout:?}: {e}", f.name));
            // f16's program too (the emulator computes in f32): its fusions differ from f32's
            let h = Program::lower(&g, DType::F16, layout).unwrap();
            for (dtype, p) in [(DType::F32, &p), (DType::F16, &h)] {
                let got = Emu::run(p, &xs);
                assert_eq!(got.len(), want.len(), "{}", f.name);
                // branches run before the steps they may run beside compute the same
                let early = super::branches::tests::run_branches_first(p, &xs);
                let outs = got.iter().chain(&early);
                for (o, (g, w)) in outs.zip(want.iter().cycle()).enumerate() {
                    let rel = max_rel(g, w.as_f32().unwrap());
                    assert!(
                        rel <= 1e-5,
                        "{} {dtype} {layout:?} output {o}: max rel. diff {rel:.1e}\n{:?}",
                        f.name,
                        p.step_counts()
                    );
                }
                branched += p.branches.iter().flatten().count();
            }
            // 1x1 convolutions of channel-last maps as Gemm steps (the experiment's switch)
            if layout == Layout::Nhwc {
                let q = Program::lower_with_conv1x1_gemm(&g, DType::F16, layout, true).unwrap();
                for (o, (g, w)) in Emu::run(&q, &xs).iter().zip(&want).enumerate() {
                    let rel = max_rel(g, w.as_f32().unwrap());
                    assert!(
                        rel <= 1e-5,
                        "{} 1x1 as gemm output {o}: max rel. diff {rel:.1e}\n{:?}",
                        f.name,
                        q.step_counts()
                    );
                }
                let gemms = |p: &Program| {
                    p.steps
                        .iter()
                        .filter(|(_, s)| matches!(s, Step::Gemm(_)))
                        .count()
                };
                converted += gemms(&q) - gemms(&h);
            }
            assert!(p.arena_bytes() <= p.arena_bytes_without_plan);
            // the other storage types lower to the same steps, but for converting the input
            let computing = |p: &Program| {
                let mut c = p.step_counts();
                c.retain(|(k, _)| *k != "convert input");
                c
            };
            // (strict f32 keeps the epilogues cuDNN would fuse on tensor cores apart: the same
            // convolutions, more element-wise steps; 16-bit types fuse GELU into cuBLASLt's
            // call where tf32 keeps it apart: fewer element-wise steps)
            let tensor_cores = Program::lower(&g, DType::Tf32, layout).unwrap();
            let q = Program::lower(&g, DType::Bf16, layout).unwrap();
            assert_eq!(computing(&q), computing(&h), "{} bf16", f.name);
            let but_elementwise = |p: &Program| {
                let mut c = computing(p);
                c.retain(|(k, _)| *k != "element-wise");
                c
            };
            assert_eq!(
                but_elementwise(&h),
                but_elementwise(&tensor_cores),
                "{} f16",
                f.name
            );
            let convs = |p: &Program| {
                p.steps
                    .iter()
                    .filter(|(_, s)| matches!(s, Step::Conv(_) | Step::Depthwise(_)))
                    .count()
            };
            assert_eq!(convs(&tensor_cores), convs(&p), "{}", f.name);
        }
    }
    // MobileNetV3's, EfficientNet's, RegNet's and DenseNet's fixtures have 1x1 convolutions
    assert!(
        converted >= 4,
        "{converted} 1x1 convolutions became Gemm steps"
    );
    assert!(branched >= 2, "{branched} shortcut branches");
}

#[test]
fn layouts_decide_the_copies_and_fusions_are_counted() {
    let count = |p: &Program, kind: &str| {
        p.step_counts()
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n)
    };
    // ConvNeXt's transposes around its layer norm and linear layers: free in NHWC, where the
    // channels-last order is the bytes' order, a copy each way in NCHW
    let g = optimized(&fixtures::convnext(fresh_seed()));
    let nhwc = Program::lower(&g, DType::F16, Layout::Nhwc).unwrap();
    let nchw = Program::lower(&g, DType::F16, Layout::Nchw).unwrap();
    assert!(
        count(&nhwc, "element-wise") < count(&nchw, "element-wise"),
        "{:?} vs {:?}",
        nhwc.step_counts(),
        nchw.step_counts()
    );
    // ...and its linear layers' epilogues in cuBLASLt's call: the first's bias and GELU (16-bit
    // only), the second's bias, layer scale (folded into its weights) and, through the
    // transpose back, the block's residual; the classifier's bias
    let gemms = |p: &Program| -> Vec<(bool, Option<Activation>, bool)> {
        p.steps
            .iter()
            .filter_map(|(_, s)| match s {
                Step::Gemm(g) => Some((g.bias.is_some(), g.act, g.z.is_some())),
                _ => None,
            })
            .collect()
    };
    let (some, gelu) = (true, Some(Activation::Gelu));
    assert_eq!(
        gemms(&nhwc),
        vec![(some, gelu, false), (some, None, true), (some, None, false)]
    );
    let f32 = Program::lower(&g, DType::Tf32, Layout::Nhwc).unwrap();
    assert_eq!(
        gemms(&f32),
        vec![(some, None, false), (some, None, true), (some, None, false)]
    );
    assert_eq!(
        count(&f32, "element-wise"),
        count(&nhwc, "element-wise") + 1,
        "{:?}",
        f32.step_counts()
    );
    // EfficientNet: every SiLU is a convolution's epilogue, in NHWC in cuDNN's call or the
    // depthwise kernel's pass, never a step of its own; every convolution is one step, the
    // squeeze-and-excitation's two on 1x1 maps gpukit's matrix-vector kernel in both layouts
    let g = optimized(&fixtures::efficientnet_se(fresh_seed()));
    let convs = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Conv(_)))
        .count();
    for layout in [Layout::Nhwc, Layout::Nchw] {
        let p = Program::lower(&g, DType::F16, layout).unwrap();
        let silus = p
            .steps
            .iter()
            .filter(|(_, s)| match s {
                Step::Pointwise { act, .. } => *act == Some(Activation::Silu),
                Step::Depthwise(d) => d.act == Some(Activation::Silu),
                Step::MatVec(m) => m.act == Some(Activation::Silu),
                Step::Conv(c) => c.fused && c.act == Some(Activation::Silu),
                _ => false,
            })
            .count();
        assert_eq!(silus, 3, "{layout:?}: {:?}", p.step_counts());
        let depthwise = count(&p, "depthwise conv (gpukit)");
        assert_eq!(
            depthwise > 0,
            layout == Layout::Nhwc,
            "{:?}",
            p.step_counts()
        );
        let elementwise_silus = p
            .steps
            .iter()
            .filter(|(_, s)| {
                matches!(
                    s,
                    Step::Pointwise {
                        act: Some(Activation::Silu),
                        ..
                    }
                )
            })
            .count();
        // (NCHW keeps them in element-wise steps: cuDNN's graphs are used channel-last only;
        // the matrix-vector kernel takes its own in both)
        let matvecs = count(&p, "1x1 conv of 1x1 maps (gpukit)");
        assert_eq!(matvecs, 2, "{layout:?}: {:?}", p.step_counts());
        let in_matvec = p
            .steps
            .iter()
            .filter(|(_, s)| matches!(s, Step::MatVec(m) if m.act == Some(Activation::Silu)))
            .count();
        let apart = if layout == Layout::Nhwc {
            0
        } else {
            silus - in_matvec
        };
        assert_eq!(elementwise_silus, apart, "{:?}", p.step_counts());
        assert_eq!(
            count(&p, "conv (cuDNN)")
                + count(&p, "conv+bias+relu (cuDNN)")
                + count(&p, "conv+epilogue (cuDNN)")
                + depthwise
                + matvecs,
            convs,
            "{layout:?}: {:?}",
            p.step_counts()
        );
    }
    // the ResNet fixture: every ReLU fused into cuDNN's call, the stem's input padded to 8
    // channels in NHWC
    let g = optimized(&fixtures::tiny_resnet(fresh_seed()));
    let p = Program::lower(&g, DType::F16, Layout::Nhwc).unwrap();
    assert!(
        count(&p, "conv+bias+relu (cuDNN)") >= 3,
        "{:?}",
        p.step_counts()
    );
    // its projection's bias joined the sum of the convolution that adds it: the projection
    // is a bare convolution with no element-wise step after it, and the classifier's bias is
    // cuBLASLt's epilogue: no element-wise step at all
    assert_eq!(count(&p, "conv (cuDNN)"), 1, "{:?}", p.step_counts());
    assert_eq!(count(&p, "element-wise"), 0, "{:?}", p.step_counts());
    // its stem (7x7, stride 2, 3 channels) reads the image as 2x2 blocks of pixels, 16
    // channels (12 values and 4 zeros), a 4x4 filter; strict f32 (NCHW) pads the channels to 8
    // where it is channel-last, and keeps the image otherwise
    let blocks = |p: &Program| {
        p.steps.iter().find_map(|(_, s)| match s {
            Step::ConvertBlocks { blocks, .. } => Some(*blocks),
            _ => None,
        })
    };
    let b = blocks(&p).expect("the stem's input in blocks");
    assert_eq!(
        (b.side, b.channels, b.rows.taps, b.cols.taps),
        (2, 16, 4, 4)
    );
    let stem = p.steps.iter().find_map(|(_, s)| match s {
        Step::Conv(c) if c.shape.c == 16 => Some(c.shape),
        _ => None,
    });
    assert_eq!(
        stem.map(|s| (s.r, s.s, s.stride, s.pad)),
        Some((4, 4, 1, 0))
    );
    let f32_nhwc = Program::lower(&g, DType::F32, Layout::Nhwc).unwrap();
    assert_eq!(blocks(&f32_nhwc), None);
    assert!(f32_nhwc
        .steps
        .iter()
        .any(|(_, s)| matches!(s, Step::ConvertImage { cout: 8, .. })));
}

#[test]
fn what_the_engine_cannot_run_is_named() {
    let g = optimized(&fixtures::tiny_resnet(fresh_seed()));
    let e = Program::lower(&g, DType::F64, Layout::Nchw).unwrap_err();
    assert!(e.why.contains("f64"), "{e}");
    // a dilated convolution names its node
    let mut d = g.clone();
    let (i, node) = d
        .nodes
        .iter()
        .enumerate()
        .find(|(_, n)| matches!(n.op, Op::Conv(_)))
        .unwrap();
    let name = node.name.clone();
    if let Op::Conv(c) = &mut d.nodes[i].op {
        c.dilations = [2, 2];
    }
    let e = Program::lower(&d, DType::F16, Layout::Nhwc).unwrap_err();
    assert_eq!((e.node.as_str(), e.op.as_str()), (name.as_str(), "Conv"));
    // (its output shape is still the undilated one)
    assert!(e.to_string().contains("dilation give"), "{e}");
    let e = Program::lower(&d, DType::F32, Layout::Nchw).unwrap_err();
    assert!(e.to_string().contains("16-bit channel-last"), "{e}");
}

#[test]
fn a_chain_of_concatenations_copies_each_feature_once() {
    // the DenseNet fixture: [f0], [f0, y1], [f0, y1, y2] as torch.onnx writes a block, then a
    // concatenation of the last with y3: one slot, each of the four features copied once
    // (eight copies when each concatenation copies all its inputs)
    let g = optimized(&fixtures::densenet(fresh_seed()));
    let concats: Vec<&str> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Concat { .. }))
        .map(|n| n.name.as_str())
        .collect();
    assert!(concats.len() >= 3, "{concats:?}");
    for layout in [Layout::Nhwc, Layout::Nchw] {
        let p = Program::lower(&g, DType::F16, layout).unwrap();
        let copies = p
            .steps
            .iter()
            .filter(|(name, _)| concats.contains(&name.as_str()))
            .count();
        assert_eq!(copies, 4, "{layout:?}");
        let slots: std::collections::HashSet<Buf> = p
            .steps
            .iter()
            .filter(|(name, _)| concats.contains(&name.as_str()))
            .map(|(_, s)| s.operands().1.buf)
            .collect();
        assert_eq!(slots.len(), 1, "{layout:?}");
    }
}

/// Runs `g` through the emulator in both layouts (f32 and f16 programs) against the interpreter
/// on fresh inputs; the f16 NHWC program.
fn emulated(g: &Graph) -> Program {
    let (inputs, want) = random_run(g);
    let xs: Vec<&[f32]> = inputs.iter().map(|a| a.as_f32().unwrap()).collect();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for dtype in [DType::F32, DType::F16] {
            let p = Program::lower(g, dtype, layout).unwrap();
            for (o, (got, w)) in Emu::run(&p, &xs).iter().zip(&want).enumerate() {
                let rel = max_rel(got, w.as_f32().unwrap());
                assert!(rel <= 1e-5, "{dtype} {layout:?} output {o}: {rel:.1e}");
            }
        }
    }
    Program::lower(g, DType::F16, Layout::Nhwc).unwrap()
}

#[test]
fn concatenations_that_do_not_extend_one_another_each_copy_their_inputs() {
    use crate::graph::GraphBuilder;
    let mut b = GraphBuilder::new();
    let x = b
        .input("x", crate::graph::DType::F32, vec![2, 8, 3, 3])
        .unwrap();
    let relu = Op::Activation(Activation::Relu);
    let sig = Op::Activation(Activation::Sigmoid);
    let r = b.node("r", relu, &[x], &["r"]).unwrap()[0];
    let s = b.node("s", sig, &[x], &["s"]).unwrap()[0];
    let cat = |axis| Op::Concat { axis };
    // the second's inputs do not begin with the first's; the third is along another axis
    let c1 = b.node("c1", cat(1), &[r, s], &["c1"]).unwrap()[0];
    let c2 = b.node("c2", cat(1), &[s, r, x], &["c2"]).unwrap()[0];
    let c3 = b.node("c3", cat(2), &[r, s, x], &["c3"]).unwrap()[0];
    for v in [c1, c2, c3] {
        b.output(v);
    }
    let g = b.finish().unwrap();
    let p = emulated(&g);
    let copies = p
        .steps
        .iter()
        .filter(|(name, _)| name.starts_with('c'))
        .count();
    assert_eq!(copies, 2 + 3 + 3, "{:?}", p.step_counts());
}

#[test]
fn a_constant_that_varies_along_the_rows_is_not_a_gemm_bias() {
    use crate::graph::GraphBuilder;
    let mut b = GraphBuilder::new();
    let x = b.input("x", crate::graph::DType::F32, vec![4, 6]).unwrap();
    let w = b
        .constant("w", vec![6, 5], Data::F32(normal_f32(30, fresh_seed())))
        .unwrap();
    // [4, 1] broadcast over the columns: one value a row, not a row of the columns
    let per_row = b
        .constant(
            "per_row",
            vec![4, 1],
            Data::F32(normal_f32(4, fresh_seed())),
        )
        .unwrap();
    let row = b
        .constant("row", vec![5], Data::F32(normal_f32(5, fresh_seed())))
        .unwrap();
    let y = b.node("mm", Op::MatMul, &[x, w], &["y"]).unwrap()[0];
    let y = b
        .node("add", Op::Binary(Binary::Add), &[y, per_row], &["a"])
        .unwrap()[0];
    let y = b
        .node("mul", Op::Binary(Binary::Mul), &[y, row], &["m"])
        .unwrap()[0];
    b.output(y);
    let g = b.finish().unwrap();
    let p = emulated(&g);
    let gemm = p
        .steps
        .iter()
        .find_map(|(_, s)| match s {
            Step::Gemm(g) => Some(g.clone()),
            _ => None,
        })
        .unwrap();
    // neither joined: the Add's constant is not a row, and the Mul comes after that Add's step
    assert!(gemm.bias.is_none() && gemm.act.is_none() && gemm.z.is_none());
    assert_eq!(
        p.step_counts()
            .iter()
            .find(|(k, _)| *k == "element-wise")
            .map(|(_, n)| *n),
        Some(2)
    );
}

#[test]
fn dilated_and_unevenly_padded_convolutions_run_on_gpukits_kernel() {
    let g = optimized(&fixtures::atrous(fresh_seed()));
    let (inputs, want) = random_run(&g);
    let xs: Vec<&[f32]> = inputs.iter().map(|a| a.as_f32().unwrap()).collect();
    for dtype in [DType::F16, DType::Bf16] {
        let p = Program::lower(&g, dtype, Layout::Nhwc).unwrap();
        let own: Vec<&OwnConvStep> = p
            .steps
            .iter()
            .filter_map(|(_, s)| match s {
                Step::OwnConv(o) => Some(o),
                _ => None,
            })
            .collect();
        // the three: dilated with the residual and ReLU, padded unevenly, dilated unevenly
        assert_eq!(own.len(), 3, "{:?}", p.step_counts());
        assert!(own[0].z.is_some() && own[0].act == Some(Activation::Relu));
        assert_eq!(own[2].g.dilation, [2, 3]);
        for (o, (got, w)) in Emu::run(&p, &xs).iter().zip(&want).enumerate() {
            let rel = max_rel(got, w.as_f32().unwrap());
            assert!(rel <= 1e-5, "{dtype} output {o}: max rel. diff {rel:.1e}");
        }
    }
    // cuDNN's path takes neither: strict f32 and NCHW name what runs them
    for (dtype, layout) in [(DType::F32, Layout::Nhwc), (DType::F16, Layout::Nchw)] {
        let e = Program::lower(&g, dtype, layout).unwrap_err();
        assert!(e.why.contains("16-bit channel-last"), "{e}");
    }
}
