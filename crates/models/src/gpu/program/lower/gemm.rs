//! Matrix products with constant weights (Gemm, MatMul) lowered to cuBLASLt steps, and what
//! their epilogue takes from the nodes after them: a constant row as the bias (Add), a
//! constant row as a layer scale folded into the weights and bias (Mul), a residual laid out
//! as the output, also through a view such as ConvNeXt's transpose back (Add, cuBLASLt's C),
//! and ReLU or, for 16-bit types, GELU. Each joins only while nothing else reads the value.

use super::{Buf, GemmStep, Lowered, Lowering, Step, Tref};
use crate::gpu::program::Strided;
use crate::graph::{Activation, Binary, ValueId};
use gpukit_tensor::DType;

/// The most rows a product may have for gpukit's matrix-vector kernel to be timed on it.
pub const MATVEC_ROWS: usize = 8;

impl Lowering<'_> {
    /// `a [m, k] x weight [k, n]` (row-major, the weight a new constant) into a new row-major
    /// slot for value `out`: the Gemm step of Gemm and MatMul.
    pub(super) fn gemm(
        &mut self,
        a: Tref,
        weight: Vec<f32>,
        (m, n, k): (usize, usize, usize),
        out: ValueId,
        name: &str,
    ) -> Lowered<Tref> {
        let wc = self.add_const(&format!("{name}.weight"), weight);
        let b = Tref {
            buf: Buf::Const(wc),
            offset: 0,
            s: Strided::row_major([1, 1, k, n]),
        };
        let dims = self.dims(out)?;
        let y = self.new_view(Strided::row_major(dims), name);
        let i = self.push(Step::Gemm(GemmStep {
            a,
            b,
            bias: None,
            z: None,
            act: None,
            y,
            m,
            n,
            k,
            bt: None,
        }));
        self.open_gemm[out] = Some(i);
        self.set(out, y);
        Ok(y)
    }

    /// Products of at most [`MATVEC_ROWS`] rows of 16-bit programs whose operands are dense
    /// row-major get their weights transposed as a constant of their own ([`GemmStep::bt`]):
    /// the session times gpukit's matrix-vector kernel on them beside cuBLASLt. Run once the
    /// lowering is done, after every fold into the weights.
    pub(super) fn transpose_small_products(&mut self) {
        // `GPUKIT_NO_GEMM_MATVEC=1`: none (A/B runs); f32 programs keep cuBLAS's sums (the
        // kernel was measured in 16-bit programs only)
        let sixteen = matches!(self.elem, DType::F16 | DType::Bf16);
        if !sixteen || std::env::var_os("GPUKIT_NO_GEMM_MATVEC").is_some_and(|v| v == "1") {
            return;
        }
        for i in 0..self.steps.len() {
            let Step::Gemm(g) = &self.steps[i].1 else {
                continue;
            };
            let dense = |t: &Tref| t.s.is_row_major() && t.s.len() == t.s.span();
            let Buf::Const(c) = g.b.buf else {
                continue;
            };
            let (k, n) = (g.k, g.n);
            let plain = g.b.offset == 0 && g.b.s == Strided::row_major([1, 1, k, n]);
            let z_dense =
                g.z.as_ref()
                    .is_none_or(|z| dense(z) && z.s.dims == g.y.s.dims);
            if g.m > MATVEC_ROWS || !plain || !dense(&g.a) || !dense(&g.y) || !z_dense {
                continue;
            }
            let w = &self.consts[c].values;
            let mut t = vec![0f32; k * n];
            for (r, row) in w.chunks(n).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    t[j * k + r] = v;
                }
            }
            let bt = self.add_const("weights transposed", t);
            if let Step::Gemm(g) = &mut self.steps[i].1 {
                g.bt = Some(bt);
            }
        }
    }

    /// The open Gemm step of value `x`, when nothing else reads `x`.
    pub(super) fn open_gemm_of(&self, x: ValueId) -> Option<usize> {
        let i = self.open_gemm[x]?;
        (self.uses[x] == 1 && !self.is_output[x]).then_some(i)
    }

    /// `out`, a view of `x`'s bytes, keeps `x`'s open Gemm step.
    pub(super) fn carry_open_gemm(&mut self, x: ValueId, out: ValueId) {
        if let Some(i) = self.open_gemm_of(x) {
            self.open_gemm[x] = None;
            self.open_gemm[out] = Some(i);
        }
    }

    /// Step `i`'s Gemm (every caller holds an index `open_gemm` gave).
    fn gemm_step(&mut self, i: usize) -> &mut GemmStep {
        match &mut self.steps[i].1 {
            Step::Gemm(g) => g,
            _ => unreachable!("open_gemm indexes Gemm steps only"),
        }
    }

    /// Value `out` is `x` with the Gemm step's epilogue grown: `x` is that step's open output.
    fn joined(&mut self, x: ValueId, out: ValueId, i: usize, open: bool) {
        self.open_gemm[x] = None;
        self.open_gemm[out] = open.then_some(i);
        let t = self.at[x];
        self.at[out] = t;
    }

    /// `act(x)` into the epilogue of the Gemm step computing `x`: ReLU, or GELU where the
    /// storage is 16-bit (cuBLASLt's GELU is the tanh form, within 16-bit rounding of erf's).
    pub(super) fn join_gemm_activation(&mut self, x: ValueId, out: ValueId, a: Activation) -> bool {
        let Some(i) = self.open_gemm_of(x) else {
            return false;
        };
        let ok = match a {
            Activation::Relu => true,
            Activation::Gelu => matches!(self.elem, DType::F16 | DType::Bf16),
            _ => false,
        };
        if !ok || self.gemm_step(i).act.is_some() {
            return false;
        }
        self.gemm_step(i).act = Some(a);
        self.joined(x, out, i, false);
        true
    }

    /// The values of constant `c` when, seen from the Gemm output `x`'s index space (the step's
    /// own row-major output, or a permuted view of it such as ConvNeXt's transpose back to
    /// channels-first, whose layer scale is `[c, 1, 1]`), it is a row of the step's `n` columns
    /// broadcast over the rows: it varies along the one axis that walks the columns, with
    /// stride 1, and along no other.
    fn gemm_row(&mut self, i: usize, x: ValueId, c: ValueId) -> Lowered<Option<Vec<f32>>> {
        let g = self.gemm_step(i).clone();
        let Some(xt) = self.at[x] else {
            return Ok(None);
        };
        if xt.buf != g.y.buf || xt.offset != g.y.offset || self.g.value(c).constant.is_none() {
            return Ok(None);
        }
        let ct = self.get(c)?;
        let Some(bs) = ct.s.broadcast_to(xt.s.dims) else {
            return Ok(None);
        };
        let mut columns = 0;
        for a in 0..4 {
            if xt.s.dims[a] == 1 {
                continue;
            }
            if xt.s.strides[a] == 1 {
                if bs.strides[a] != 1 || xt.s.dims[a] != g.n {
                    return Ok(None);
                }
                columns += 1;
            } else if bs.strides[a] != 0 {
                return Ok(None);
            }
        }
        if columns != 1 && g.n != 1 {
            return Ok(None);
        }
        Ok(self
            .constant(c, "row")
            .ok()
            .filter(|v| v.len() == g.n)
            .map(|v| v.to_vec()))
    }

    /// The open Gemm step `open` (its index and a copy) and constant `c` as a row of its columns,
    /// unless `blocked` says its epilogue has gone past where `c` may join.
    fn row_for(
        &mut self,
        open: Option<usize>,
        x: ValueId,
        c: ValueId,
        blocked: fn(&GemmStep) -> bool,
    ) -> Lowered<Option<(usize, GemmStep, Vec<f32>)>> {
        let Some(i) = open else {
            return Ok(None);
        };
        let g = self.gemm_step(i).clone();
        if blocked(&g) {
            return Ok(None);
        }
        Ok(self.gemm_row(i, x, c)?.map(|row| (i, g, row)))
    }

    /// `x + c` into the Gemm step computing `x` as its bias, `c` a constant row; Ok(true) when
    /// joined.
    pub(super) fn join_gemm_bias(&mut self, x: ValueId, c: ValueId) -> Lowered<bool> {
        self.join_gemm_bias_as(x, x, c)
    }

    /// [`Self::join_gemm_bias`] for a node whose output `out` is `x + c` (`x` itself: the
    /// Gemm node's own C).
    fn join_gemm_bias_as(&mut self, x: ValueId, out: ValueId, c: ValueId) -> Lowered<bool> {
        let open = if x == out {
            self.open_gemm[x]
        } else {
            self.open_gemm_of(x)
        };
        let blocked = |g: &GemmStep| g.bias.is_some() || g.act.is_some();
        let Some((i, _, row)) = self.row_for(open, x, c, blocked)? else {
            return Ok(false);
        };
        let name = self.node.0.clone();
        let b = self.add_const(&format!("{name}.bias"), row);
        self.gemm_step(i).bias = Some(b);
        if x != out {
            self.joined(x, out, i, true);
        }
        Ok(true)
    }

    /// `x * c`, `c` a constant row, folded into the Gemm step computing `x`: its weights'
    /// columns and its bias scaled. Ok(true) when joined.
    fn join_gemm_scale(&mut self, x: ValueId, out: ValueId, c: ValueId) -> Lowered<bool> {
        let open = self.open_gemm_of(x);
        let blocked = |g: &GemmStep| g.z.is_some() || g.act.is_some();
        let Some((i, g, row)) = self.row_for(open, x, c, blocked)? else {
            return Ok(false);
        };
        let Buf::Const(w) = g.b.buf else {
            return Ok(false);
        };
        for (j, v) in self.consts[w].values.iter_mut().enumerate() {
            *v *= row[j % g.n];
        }
        if let Some(b) = g.bias {
            for (v, r) in self.consts[b].values.iter_mut().zip(&row) {
                *v *= r;
            }
        }
        self.joined(x, out, i, true);
        Ok(true)
    }

    /// `x + r` into the Gemm step computing `x`, `r` laid out as `x` (read through the same
    /// strides) and computed before the step: cuBLASLt's C. Ok(true) when joined.
    fn join_gemm_residual(&mut self, x: ValueId, out: ValueId, r: Tref) -> bool {
        let Some(i) = self.open_gemm_of(x) else {
            return false;
        };
        let g = self.gemm_step(i).clone();
        let Some(xt) = self.at[x] else { return false };
        if g.z.is_some() || g.act.is_some() || xt.offset != g.y.offset || r.s != xt.s {
            return false;
        }
        if let Buf::Slot(s) = r.buf {
            let later = self.steps[i + 1..]
                .iter()
                .any(|(_, st)| st.operands().1.buf == Buf::Slot(s));
            if later || r.buf == g.y.buf {
                return false;
            }
        }
        self.gemm_step(i).z = Some(Tref {
            buf: r.buf,
            offset: r.offset,
            s: g.y.s,
        });
        self.joined(x, out, i, true);
        true
    }

    /// `out = a op b` into the epilogue of the Gemm step computing one operand: a constant row
    /// as its bias (Add) or layer scale (Mul), or a residual laid out as the output (Add).
    /// Ok(true) when joined.
    pub(super) fn join_gemm_binary(
        &mut self,
        (av, a): (ValueId, Tref),
        (bv, b): (ValueId, Tref),
        out: ValueId,
        op: Binary,
    ) -> Lowered<bool> {
        for (x, other, ot) in [(av, bv, b), (bv, av, a)] {
            if self.open_gemm_of(x).is_none() || other == x {
                continue;
            }
            let constant = self.g.value(other).constant.is_some();
            let joined = match op {
                Binary::Add if constant => self.join_gemm_bias_as(x, out, other)?,
                Binary::Add => self.join_gemm_residual(x, out, ot),
                Binary::Mul if constant => self.join_gemm_scale(x, out, other)?,
                _ => false,
            };
            if joined {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::optimized;
    use super::*;
    use crate::graph::passes::optimize;
    use crate::onnx::{fixtures, import_model, ImportOptions};
    use gpukit_tensor::random::fresh_seed;
    use gpukit_tensor::Layout;

    /// Each Gemm step's transposed weights against its weights, and how many it has.
    fn transposed(p: &super::super::Program) -> usize {
        let mut with = 0;
        for (_, s) in &p.steps {
            let Step::Gemm(g) = s else { continue };
            let Some(bt) = g.bt else { continue };
            let Buf::Const(c) = g.b.buf else {
                panic!("transposed weights of a product whose weights are not a constant")
            };
            let (w, t) = (&p.consts[c].values, &p.consts[bt].values);
            assert_eq!(t.len(), g.k * g.n);
            for r in 0..g.k {
                for j in 0..g.n {
                    assert_eq!(t[j * g.k + r], w[r * g.n + j], "row {r} column {j}");
                }
            }
            assert!(g.m <= MATVEC_ROWS);
            with += 1;
        }
        with
    }

    #[test]
    fn products_of_few_rows_carry_their_weights_transposed() {
        let seed = fresh_seed();
        let mut with = 0;
        for f in fixtures::all(seed) {
            // batch 2: every classifier is a product of 2 rows
            let g = optimized(&f.model);
            for dtype in [DType::F16, DType::Bf16] {
                with += transposed(&super::super::Program::lower(&g, dtype, Layout::Nhwc).unwrap());
            }
            // f32 programs keep cuBLAS's sums
            let f32 = super::super::Program::lower(&g, DType::F32, Layout::Nhwc).unwrap();
            assert_eq!(transposed(&f32), 0, "{} f32", f.name);
            // batch 16: none
            let options = ImportOptions {
                batch: Some(16),
                dims: Vec::new(),
            };
            let mut g = import_model(&f.model, None, "fixture", &options).unwrap();
            optimize(&mut g).unwrap();
            let p = super::super::Program::lower(&g, DType::F16, Layout::Nhwc).unwrap();
            assert_eq!(transposed(&p), 0, "{}", f.name);
        }
        // the seven fixtures' classifiers (and the products before some), in both 16-bit types
        assert!(with >= 14, "{with}");
    }
}
