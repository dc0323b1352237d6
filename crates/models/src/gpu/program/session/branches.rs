//! The program's branches in the CUDA graph (decision 190): a branch step
//! (`lower::branches`) whose runner shares no scratch with the steps it runs beside is
//! captured attached to the point where its inputs were written; the step after it attaches
//! to both it and the steps beside it. Run op by op (`enqueue`), every step follows the one
//! before it, as always.

use super::own_conv::ConvAlt;
use super::ProgramSession;
use crate::error::Result;
use crate::gpu::program::lower::Step;
use gpukit_cuda::{CapturePoint, Graph};
use std::collections::HashMap;

/// Whether a captured pass runs its branches beside the steps before them
/// (`GPUKIT_BRANCHES`): `off` never, `on` always, by default where the graph with branches
/// replays no slower than the one in step order (both timed at capture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branching {
    Off,
    On,
    Timed,
}

impl Branching {
    pub fn from_env() -> Branching {
        match std::env::var("GPUKIT_BRANCHES").as_deref() {
            Ok("off") => Branching::Off,
            Ok("on") => Branching::On,
            _ => Branching::Timed,
        }
    }
}

impl ProgramSession<'_> {
    /// Decides which of the program's branches run as such: convolutions on cuDNN's plan
    /// (with a workspace of their own), on gpukit's kernel in one piece, or on a cuBLASLt
    /// product without workspace; not those whose scratch the steps beside them use too
    /// (gpukit's kernel in pieces, cuBLASLt's workspace, the f64 sums). `GPUKIT_BRANCHES=off`
    /// keeps every step after the one before it.
    pub(super) fn plan_branches(&mut self) -> Result<()> {
        if Branching::from_env() == Branching::Off {
            return Ok(());
        }
        let mut workspace = 0;
        for (j, b) in self.program.branches.iter().enumerate() {
            let Step::Conv(_) = &self.program.steps[j].1 else {
                continue;
            };
            if b.is_none() {
                continue;
            }
            let runs = match self.conv_alts.get(j) {
                Some(Some(ConvAlt::Own(o))) => o.cut.pieces == 1,
                Some(Some(ConvAlt::Product { plan, .. })) => plan.workspace_bytes() == 0,
                Some(Some(ConvAlt::Exact(_))) => false,
                _ => match self.runs[j].as_deref() {
                    Some(run) => {
                        workspace = workspace.max(run.workspace_bytes());
                        true
                    }
                    None => false,
                },
            };
            self.branch[j] = runs;
        }
        if workspace > self.branch_workspace.len() {
            self.branch_workspace = self.ctx.alloc(workspace, "branch convolution workspace")?;
        }
        Ok(())
    }

    /// Enqueues one pass; while the stream captures, each branch attached where it forks and
    /// the step after it where it joins.
    pub(super) fn enqueue_branched(&self) -> Result<()> {
        let stream = self.ctx.gpu.stream();
        let program = self.program;
        // the steps branches fork before
        let mut forks: HashMap<usize, Option<CapturePoint>> = program
            .branches
            .iter()
            .zip(&self.branch)
            .filter_map(|(b, &runs)| b.filter(|_| runs).map(|b| (b.from, None)))
            .collect();
        for i in 0..program.steps.len() {
            if let Some(point) = forks.get_mut(&i) {
                *point = stream.capture_point()?;
            }
            let fork = match (program.branches[i], self.branch[i]) {
                (Some(b), true) => forks.get(&b.from).cloned().flatten(),
                _ => None,
            };
            match (fork, stream.capture_point()?) {
                (Some(fork), Some(main)) => {
                    stream.attach_capture(&fork, false)?;
                    self.enqueue_step(i)?;
                    stream.attach_capture(&main, true)?;
                }
                _ => self.enqueue_step(i)?,
            }
        }
        Ok(())
    }

    /// The pass as a CUDA graph, and whether its branches run beside the steps before them:
    /// as `how` says (timed: where that replays no slower than in step order, each timed in
    /// back-to-back replays, in turns).
    pub(super) fn capture_pass(&self, how: Branching) -> Result<(Graph, bool)> {
        let gpu = &self.ctx.gpu;
        if how == Branching::Off || self.branch_count() == 0 {
            return Ok((gpu.capture(|| self.enqueue())?, false));
        }
        let branched = match gpu.capture(|| self.enqueue_branched()) {
            Ok(g) => g,
            // a driver that refuses the attachments: the pass in step order, as before
            Err(e) if how == Branching::Timed => {
                gpukit_cuda::trace::note(|| format!("branches not captured: {e}"));
                return Ok((gpu.capture(|| self.enqueue())?, false));
            }
            Err(e) => return Err(e),
        };
        if how == Branching::On {
            return Ok((branched, true));
        }
        let in_order = gpu.capture(|| self.enqueue())?;
        let stream = gpu.stream();
        let first =
            gpukit_cuda::timing::time_on_stream::<gpukit_cuda::Error>(stream, 1, 1, || {
                in_order.launch()
            })?;
        // about 2 ms of replays a turn
        let reps = ((2.0 / first[0].max(1e-3)).ceil() as usize).clamp(3, 64);
        let mut turns = [Vec::new(), Vec::new()];
        for _ in 0..5 {
            for (t, g) in turns.iter_mut().zip([&branched, &in_order]) {
                let ms = gpukit_cuda::timing::time_on_stream::<gpukit_cuda::Error>(
                    stream,
                    0,
                    reps,
                    || g.launch(),
                )?;
                t.push(ms.iter().sum::<f64>() / reps as f64);
            }
        }
        let [b, o] = turns.map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        });
        gpukit_cuda::trace::note(|| {
            format!(
                "a pass with its {} branches beside the steps before them {:.1} us, in step \
                 order {:.1} us",
                self.branch_count(),
                b * 1e3,
                o * 1e3
            )
        });
        Ok(if b <= o {
            (branched, true)
        } else {
            (in_order, false)
        })
    }
}
