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
