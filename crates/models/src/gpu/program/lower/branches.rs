//! Steps that may run beside the steps just before them (decision 190): a convolution whose
//! inputs were all written before a run of other steps, that those steps neither read nor
//! overwrite, is a branch of the graph (ResNet's downsampling convolution beside its block's
//! first two). In a CUDA graph it depends only on the steps that wrote its inputs, and the
//! step after it on both it and the run (`ProgramSession::capture`); at batch 1, where one
//! convolution fills a fraction of the GPU, the two run at once. Its output's slot lives from
//! the run's first step, so the memory plan never lays the run's values over it.

use super::{Buf, Step};

/// A step that may run beside steps `from..` up to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// The first step it may run beside (every step before it wrote what it reads).
    pub from: usize,
}

/// Whether a step does enough work to be worth running a branch beside.
fn works(step: &Step) -> bool {
    matches!(
        step,
        Step::Conv(_) | Step::OwnConv(_) | Step::Gemm(_) | Step::Depthwise(_) | Step::StemPool(_)
    )
}

/// The slots a step reads and the slot it writes (values in the weights are neither).
fn slots(step: &Step) -> (Vec<usize>, Option<usize>) {
    let (reads, write) = step.operands();
    let slot = |b: Buf| match b {
        Buf::Slot(s) => Some(s),
        _ => None,
    };
    (
        reads.iter().filter_map(|t| slot(t.buf)).collect(),
        slot(write.buf),
    )
}

/// Per step, the branch it is: a convolution whose inputs' last writer is followed by at least
/// one step of work before it, none of which reads or writes its output's slot or writes a
/// slot it reads. Branches' runs do not overlap (one branch at a time).
pub(super) fn branches(steps: &[(String, Step)]) -> Vec<Option<Branch>> {
    let io: Vec<(Vec<usize>, Option<usize>)> = steps.iter().map(|(_, s)| slots(s)).collect();
    let mut out = vec![None; steps.len()];
    // the first step a new branch's run may start at (after the last branch)
    let mut free = 0;
    for (j, (_, step)) in steps.iter().enumerate() {
        let Step::Conv(_) = step else { continue };
        let (reads, Some(write)) = &io[j] else {
            continue;
        };
        let from = (0..j)
            .rev()
            .find(|&i| io[i].1.is_some_and(|w| reads.contains(&w)))
            .map_or(0, |i| i + 1);
        if from < free || from >= j || !steps[from..j].iter().any(|(_, s)| works(s)) {
            continue;
        }
        let clear = io[from..j].iter().all(|(r, w)| {
            !r.contains(write) && w.is_none_or(|w| w != *write && !reads.contains(&w))
        });
        if clear {
            out[j] = Some(Branch { from });
            free = j + 1;
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::tests::{optimized, Emu};
    use super::super::{Buf, Program, Step, Tref};
    use super::Branch;
    use crate::onnx::fixtures;
    use gpukit_tensor::random::fresh_seed;
    use gpukit_tensor::{DType, Layout};

    /// `Emu::run` with each branch run at the first step it may run beside (before those
    /// steps, as a CUDA graph may run it): the memory plan must keep its output and inputs
    /// apart from theirs.
    pub(in crate::gpu::program::lower) fn run_branches_first(
        p: &Program,
        inputs: &[&[f32]],
    ) -> Vec<Vec<f32>> {
        let mut order: Vec<usize> = Vec::new();
        for i in 0..p.steps.len() {
            if p.branches[i].is_some() {
                continue;
            }
            order
                .extend((i..p.steps.len()).filter(|&j| p.branches[j].is_some_and(|b| b.from == i)));
            order.push(i);
        }
        assert_eq!(order.len(), p.steps.len());
        Emu::run_in(order, p, inputs)
    }

    /// ResNet's downsampling convolution is a branch beside its block's first convolutions: it
    /// forks after the step that wrote the block's input, its output lives from there on, and no
    /// slot of the steps beside it shares its bytes.
    #[test]
    fn a_projected_shortcut_runs_beside_its_block() {
        let g = optimized(&fixtures::tiny_resnet(fresh_seed()));
        let p = Program::lower(&g, DType::F16, Layout::Nhwc).unwrap();
        let branches: Vec<(usize, Branch)> = p
            .branches
            .iter()
            .enumerate()
            .filter_map(|(j, b)| b.map(|b| (j, b)))
            .collect();
        assert_eq!(branches.len(), 1, "{:?}", p.step_counts());
        let (j, b) = branches[0];
        let Step::Conv(c) = &p.steps[j].1 else {
            panic!("a branch that is not a convolution");
        };
        assert_eq!((c.shape.r, c.shape.s), (1, 1), "the shortcut's 1x1");
        assert!(b.from < j);
        let span = |t: &Tref| match t.buf {
            Buf::Slot(s) => Some((p.plan.offsets[s], p.plan.offsets[s] + p.slots[s].bytes)),
            Buf::Const(_) => None,
        };
        let out = span(&c.y).unwrap();
        let ins: Vec<(usize, usize)> = std::iter::once(c.x)
            .chain(c.z)
            .filter_map(|t| span(&t))
            .collect();
        let apart = |(a, z): (usize, usize), (b, e): (usize, usize)| z <= b || a >= e;
        for (_, step) in &p.steps[b.from..j] {
            let (reads, write) = step.operands();
            for t in reads.iter().chain(Some(&write)) {
                if let Some(s) = span(t) {
                    assert!(
                        apart(s, out),
                        "a step beside the branch shares its output's bytes"
                    );
                }
            }
            if let Some(w) = span(&write) {
                assert!(
                    ins.iter().all(|&i| apart(w, i)),
                    "a step beside the branch writes its input"
                );
            }
        }
    }
}
