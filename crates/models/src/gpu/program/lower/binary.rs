//! Element-wise operations of two operands lowered: joined into a product's epilogue or an
//! open element-wise step where they can be, else a step of their own.

use super::{Buf, Lowered, Lowering, Step, Tref};
use crate::graph::Binary;

impl Lowering<'_> {
    pub(super) fn binary(&mut self, node: &crate::graph::Node, op: Binary) -> Lowered<()> {
        let name = node.name.clone();
        let out = node.outputs[0];
        let dims = self.dims(out)?;
        let (av, bv) = (node.inputs[0], node.inputs[1]);
        let (a, b) = (self.get(av)?, self.get(bv)?);
        let (Some(sa), Some(sb)) = (a.s.broadcast_to(dims), b.s.broadcast_to(dims)) else {
            return self.fail("operands that do not broadcast to the output");
        };
        let (a, b) = (Tref { s: sa, ..a }, Tref { s: sb, ..b });
        if self.join_gemm_binary((av, a), (bv, b), out, op)? {
            return Ok(());
        }
        // an Add of a value an open element-wise step computes (nothing else reading it, no
        // added operand yet, of the output's dims) joins that step as its added operand
        if op == Binary::Add {
            for (x, other, ot) in [(av, bv, b), (bv, av, a)] {
                let Some(i) = self.open[x] else { continue };
                if self.uses[x] != 1 || self.is_output[x] || other == x {
                    continue;
                }
                // the operand must be computed before that step runs
                if let Buf::Slot(s) = ot.buf {
                    let later = self.steps[i + 1..]
                        .iter()
                        .any(|(_, st)| st.operands().1.buf == Buf::Slot(s));
                    if later {
                        continue;
                    }
                }
                if let (
                    _,
                    Step::Pointwise {
                        c: c @ None,
                        y,
                        act: None,
                        ..
                    },
                ) = &mut self.steps[i]
                {
                    if y.s.dims == dims {
                        *c = Some(ot);
                        let y = *y;
                        self.open[x] = None;
                        self.open[out] = Some(i);
                        self.set(out, y);
                        return Ok(());
                    }
                }
            }
        }
        let like = [a, b]
            .into_iter()
            .find(|t| t.s.dims == dims && t.s.is_dense())
            .map(|t| t.s.dense_like(dims))
            .unwrap_or_else(|| self.default_layout(out, dims));
        let y = self.new_view(like, &name);
        let i = self.push(Step::Pointwise {
            a,
            b: Some((b, op)),
            c: None,
            act: None,
            y,
        });
        self.open[out] = Some(i);
        self.set(out, y);
        Ok(())
    }
}
