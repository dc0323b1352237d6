//! Finalizing, on helper threads, the engine configurations that compile their kernel at run
//! time, ahead of the planner that times them. Finalizing such a configuration runs NVRTC
//! (about a fifth of a second each on an H100's host) where a precompiled one takes well under
//! a millisecond, and a fast search of ResNet-50 finalizes about one per convolution: in
//! sequence they were three quarters of its planning. The planner keeps the GPU busy timing
//! candidates while the host's other cores compile.
//!
//! To use: [`Dnn::precompile`] with every graph a model is about to plan (the planner's own
//! calls then take each finished plan instead of finalizing it: [`Dnn::precompiled`]), and
//! [`Dnn::finish_precompile`] once the model is planned. Each helper has its own cuDNN handle
//! (cuDNN is thread-safe across handles, not within one); a plan finalized on a helper's handle
//! keeps that handle and its descriptors alive as long as it lives ([`Kept`]).

use super::cache::{Choice, List, Op};
use super::engines::{engine_facts, finalize_plan, read_configs, Candidate, Limits};
use super::graph::{build_graph, Built, Desc};
use super::select::backend_reaches;
use super::{ok, Act, Conv, Dnn, Search};
use crate::error::Result;
use cudarc::cudnn::sys as dn;
use cudarc::driver::CudaContext;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// One operation graph the planner will build: the convolution and its epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphSpec {
    pub conv: Conv,
    pub bias: bool,
    pub residual: bool,
    pub act: Option<Act>,
}

impl GraphSpec {
    /// The bare convolution `y = conv(x, w)`.
    pub fn plain(conv: Conv) -> GraphSpec {
        GraphSpec {
            conv,
            bias: false,
            residual: false,
            act: None,
        }
    }

    /// `y = relu(conv(x, w) + bias [+ z])`.
    pub fn fused(conv: Conv, residual: bool) -> GraphSpec {
        GraphSpec {
            conv,
            bias: true,
            residual,
            act: Some(Act::Relu),
        }
    }

    /// `y = act(conv(x, w) + bias [+ z])`.
    pub fn epilogue(conv: Conv, residual: bool, act: Option<Act>) -> GraphSpec {
        GraphSpec {
            conv,
            bias: true,
            residual,
            act,
        }
    }

    /// The operation as the choices cache keys it.
    pub(super) fn op(&self) -> Op {
        match (self.bias, self.residual, self.act) {
            (false, false, None) => Op::Plain,
            (true, residual, Some(Act::Relu)) => Op::Fused { residual },
            (_, residual, act) => Op::Epilogue { residual, act },
        }
    }
}

/// Most helper threads, whatever the host has.
const MOST_HELPERS: usize = 16;

/// A helper thread's cuDNN handle, or a graph's read ahead of the planner.
pub(super) struct Handle(pub(super) dn::cudnnHandle_t);

impl Handle {
    /// A new cuDNN handle on the context current on this thread.
    fn create() -> Result<Arc<Handle>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the caller made the GPU's context current.
        ok("cudnnCreate", unsafe { dn::cudnnCreate(&mut raw) })?;
        Ok(Arc::new(Handle(raw)))
    }
}

// SAFETY: the handle is used by one thread at a time: its helper while finalizing (or, for a
// graph read ahead, while reading it), then the planner alone (finalizing that graph's plans)
// or no one (a finished plan refers to it; execution goes through the planner's own handle).
// It is only destroyed when the last plan finalized on it is dropped.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreate in `helper`, destroyed only here.
        unsafe { dn::cudnnDestroy(self.0) };
    }
}

/// What a plan finalized on a helper thread needs alive beside it: the descriptors it was
/// built from and the helper's handle.
pub(super) struct Kept {
    _parts: Vec<Desc>,
    _handle: Arc<Handle>,
}

/// A configuration a helper finalized: its plan (None: cuDNN refused the graph) and what the
/// plan needs alive.
pub(super) struct Done {
    pub plan: Option<Desc>,
    pub kept: Option<Kept>,
    /// cuDNN's global engine index, to check that the planner's list matches the helper's.
    engine: i64,
}

/// A graph built and its configurations read by a helper on a handle of their own, handed to
/// the planner whole: from then on only the planner's thread uses the handle (it finalizes the
/// graph's plans on it), so no handle is used by two threads at once.
pub(super) struct ReadAhead {
    pub built: Built,
    pub configs: Vec<Candidate>,
    pub heurs: Vec<Desc>,
    pub handle: Arc<Handle>,
    /// What was read: the planner takes it only if it would read the same.
    limits: Limits,
}

/// A helper's task: read a graph's configurations ahead of the planner and queue those that
/// compile at run time that the planner will try (`pick` None; for a cached choice, finalize
/// it), or finalize one of them.
struct Job {
    spec: GraphSpec,
    limits: Limits,
    pick: Option<(List, usize)>,
}

type Task = (GraphSpec, Option<(List, usize)>);

#[derive(Default)]
struct State {
    /// Tasks not started, in the order the planner will want them.
    queue: VecDeque<Job>,
    running: HashSet<Task>,
    done: HashMap<(GraphSpec, (List, usize)), Done>,
    /// Graphs read ahead, not yet taken.
    read: HashMap<GraphSpec, ReadAhead>,
    /// Helpers with a handle, not yet gone.
    alive: usize,
    stop: bool,
}

impl State {
    /// Whether a helper has `pick` of `spec` to finalize, or may yet queue it.
    fn owes(&self, spec: GraphSpec, pick: (List, usize)) -> bool {
        let scan = (spec, None);
        let one = (spec, Some(pick));
        self.running.contains(&scan)
            || self.running.contains(&one)
            || self
                .queue
                .iter()
                .any(|j| j.spec == spec && (j.pick.is_none() || j.pick == Some(pick)))
    }
}

impl State {
    /// Whether a helper is reading `spec`'s graph now (the planner waits for it then; a scan
    /// still queued, or none at all, the planner does not wait for).
    fn reading(&self, spec: GraphSpec) -> bool {
        self.alive > 0 && self.running.contains(&(spec, None))
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // a helper that panicked left the state whole (every change is one statement)
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits, the state unlocked, until a helper changes it (or 50 ms pass).
    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(state, std::time::Duration::from_millis(50))
            .map(|(s, _)| s)
            .unwrap_or_else(|p| p.into_inner().0)
    }
}

/// Helper threads finalizing the configurations that compile at run time, graph by graph in
/// the order the planner will ask for them (a graph's configurations spread over the helpers).
pub(super) struct Precompiler {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Every graph it was asked for (those it had nothing to compile for included).
    specs: HashSet<GraphSpec>,
}

impl Precompiler {
    fn start(ctx: &Arc<CudaContext>, jobs: Vec<Job>, specs: HashSet<GraphSpec>) -> Precompiler {
        // every core but the planner's: compiles in parallel slow each other down (on an H100
        // host, 8 at once took 0.8 s each, 15 at once 0.66 s, one alone 0.22 s), so more of
        // them finish sooner; the planner's timing is confirmed by graph replays in turns
        // and no more than there can be plans to finalize (a cached choice is one)
        let most_plans = jobs
            .iter()
            .map(|j| match j.limits.only {
                Some(_) => 1,
                None => j.limits.runtime_compiled,
            })
            .fold(0usize, usize::saturating_add);
        let helpers = std::thread::available_parallelism()
            .map_or(1, |n| n.get().saturating_sub(1))
            .clamp(1, MOST_HELPERS)
            .min(most_plans.max(1));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: jobs.into(),
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let threads = (0..helpers)
            .filter_map(|i| {
                let (ctx, shared) = (Arc::clone(ctx), Arc::clone(&shared));
                std::thread::Builder::new()
                    .name(format!("cudnn-compile-{i}"))
                    .spawn(move || helper(&ctx, &shared))
                    .ok()
            })
            .collect();
        Precompiler {
            shared,
            threads,
            specs,
        }
    }

    /// The plan a helper finalized for `pick` of `spec`, waiting while a helper has it to do;
    /// None when no helper will (none is left, or the graph was never given to them).
    fn take(&self, spec: GraphSpec, pick: (List, usize)) -> Option<Done> {
        let mut state = self.shared.lock();
        loop {
            if let Some(done) = state.done.remove(&(spec, pick)) {
                return Some(done);
            }
            // helpers still starting count as alive: wait for them to say
            let starting = self.threads.iter().any(|t| !t.is_finished()) && state.alive == 0;
            if !state.owes(spec, pick) || (state.alive == 0 && !starting) {
                return None;
            }
            state = self.shared.wait(state);
        }
    }

    /// `spec`'s graph and configurations as a helper read them, waiting while a helper reads
    /// them; None when none has (not started yet: the planner reads them itself).
    fn read(&self, spec: GraphSpec) -> Option<ReadAhead> {
        let mut state = self.shared.lock();
        loop {
            if let Some(read) = state.read.remove(&spec) {
                return Some(read);
            }
            if !state.reading(spec) {
                return None;
            }
            state = self.shared.wait(state);
        }
    }
}

impl Drop for Precompiler {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stop = true;
            state.queue.clear();
        }
        self.shared.changed.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Ends a task however it ends: off `running`, and (for a helper's last) off `alive`.
struct Running<'a> {
    shared: &'a Shared,
    task: Task,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.shared.lock().running.remove(&self.task);
        self.shared.changed.notify_all();
    }
}

/// Counts a helper alive while it lives.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.lock().alive -= 1;
        self.0.changed.notify_all();
    }
}

/// A helper thread: its own cuDNN handle on the GPU's context, then tasks until none are left.
fn helper(ctx: &CudaContext, shared: &Shared) {
    if ctx.bind_to_thread().is_err() {
        return;
    }
    let Ok(handle) = Handle::create() else {
        return;
    };
    shared.lock().alive += 1;
    let _alive = Alive(shared);
    loop {
        let job = {
            let mut state = shared.lock();
            if state.stop {
                return;
            }
            let Some(job) = state.queue.pop_front() else {
                // a task still running may queue more
                if state.running.is_empty() {
                    return;
                }
                drop(
                    shared
                        .changed
                        .wait_timeout(state, std::time::Duration::from_millis(20)),
                );
                continue;
            };
            state.running.insert((job.spec, job.pick));
            job
        };
        let _running = Running {
            shared,
            task: (job.spec, job.pick),
        };
        // a graph the helper cannot build is left to the planner, which will say why
        // a graph searched afresh is read ahead on a handle of its own (its configurations
        // that compile at run time queued for the helpers); a cached choice's (the planner
        // reads its list up to the choice, a millisecond) and one configuration are finalized
        let outcome = match (job.pick, job.limits.only) {
            (None, None) => read_ahead(&job).map(|(read, more)| (None, more, Some(read))),
            _ => compile(&handle, &job).map(|(finished, more)| (finished, more, None)),
        };
        let Ok((finished, more, read)) = outcome else {
            continue;
        };
        let mut state = shared.lock();
        if let Some((pick, done)) = finished {
            state.done.insert((job.spec, pick), done);
        }
        if let Some(read) = read {
            state.read.insert(job.spec, read);
        }
        // the graph's other configurations next, before later graphs
        for pick in more.into_iter().rev() {
            state.queue.push_front(Job {
                spec: job.spec,
                limits: job.limits,
                pick: Some(pick),
            });
        }
    }
}

/// A helper's scan of a graph: builds it and reads the configurations the planner will read, on
/// a handle of their own (handed to the planner with them), and names those that compile at run
/// time that the planner would try, for helpers to finalize.
fn read_ahead(job: &Job) -> Result<(ReadAhead, Vec<(List, usize)>)> {
    let spec = job.spec;
    let handle = Handle::create()?;
    let built = build_graph(handle.0, spec.conv, spec.bias, spec.residual, spec.act)?;
    let (configs, heurs) = read_configs(&built.graph, job.limits)?;
    let wanted = runtime_compiled(&configs, job.limits, job.limits);
    let read = ReadAhead {
        built,
        configs,
        heurs,
        handle,
        limits: job.limits,
    };
    Ok((read, wanted))
}

/// A helper's task on its own handle: builds the graph and reads the configurations the
/// planner will read; finalizes the one asked for, or (a scan of a cached choice) the first that
/// compiles at run time the planner would try, and names the others.
#[allow(clippy::type_complexity)]
fn compile(
    handle: &Arc<Handle>,
    job: &Job,
) -> Result<(Option<((List, usize), Done)>, Vec<(List, usize)>)> {
    let spec = job.spec;
    let built = build_graph(handle.0, spec.conv, spec.bias, spec.residual, spec.act)?;
    // one configuration: its list read up to it (the search does not matter then)
    let limits = match job.pick {
        Some(pick) => Limits::of(Search::Fast, job.limits.strict, Some(pick)),
        None => job.limits,
    };
    let (configs, heurs) = read_configs(&built.graph, limits)?;
    let wanted = runtime_compiled(&configs, limits, job.limits);
    let Some(&pick) = wanted.first() else {
        return Ok((None, Vec::new()));
    };
    let more = wanted[1..].to_vec();
    let Some((_, _, cfg)) = configs.iter().find(|(l, i, _)| (*l, *i) == pick) else {
        return Ok((None, more));
    };
    let engine = engine_facts(cfg).map_or(-1, |(e, _)| e);
    let plan = finalize_plan(handle.0, cfg, pick, true)?;
    let parts = built.kept_with(configs.into_iter().map(|(_, _, c)| c), heurs);
    let kept = plan.as_ref().map(|_| Kept {
        _parts: parts,
        _handle: Arc::clone(handle),
    });
    Ok((Some((pick, Done { plan, kept, engine })), more))
}

/// The configurations of `configs` (read with `limits`) that compile at run time and that the
/// planner, searching with `search`, would try.
fn runtime_compiled(configs: &[Candidate], limits: Limits, search: Limits) -> Vec<(List, usize)> {
    let mut compiled_before = 0;
    let mut wanted = Vec::new();
    for (list, index, cfg) in configs {
        let pick = (*list, *index);
        if limits.only.is_some_and(|o| o != pick) {
            continue;
        }
        let Some(compiled) = search.wants((*list, cfg), compiled_before) else {
            continue;
        };
        compiled_before += usize::from(compiled);
        if compiled {
            wanted.push(pick);
        }
    }
    wanted
}

impl Dnn {
    /// Starts helper threads that finalize, for each graph in `specs` the selection policy will
    /// plan (with the current search and the choices on disk), the configurations that compile
    /// their kernel at run time. Graphs that will not use the backend API, or whose cached
    /// choice is not a backend engine, are left out. Helpers started before for every one of
    /// these graphs go on (a caller may start them for several sessions ahead of the first);
    /// otherwise they are replaced. A heuristic search times nothing, so it starts none (and
    /// leaves running ones alone).
    pub fn precompile(&self, specs: &[GraphSpec], allow_graph: bool) {
        let search = self.search();
        if !allow_graph || search == Search::Heuristic {
            return;
        }
        let covered = self
            .precompiler
            .borrow()
            .as_ref()
            .is_some_and(|p| specs.iter().all(|s| p.specs.contains(s)));
        if covered {
            return;
        }
        self.finish_precompile();
        let mut seen = HashSet::new();
        let jobs: Vec<Job> = specs
            .iter()
            .filter(|s| seen.insert(**s))
            .filter_map(|&spec| {
                let op = spec.op();
                if !backend_reaches(spec.conv, op != Op::Plain) {
                    return None;
                }
                let key = self.key(spec.conv, op, allow_graph);
                let only = match self.choices.borrow().get(&key, search) {
                    Some(Choice::Graph { list, index }) => Some((list, index)),
                    Some(_) => return None,
                    None => None,
                };
                let limits = Limits::of(search, self.strict(spec.conv.dtype), only);
                Some(Job {
                    spec,
                    limits,
                    pick: None,
                })
            })
            .collect();
        if jobs.is_empty() {
            return;
        }
        let asked = specs.iter().copied().collect();
        *self.precompiler.borrow_mut() = Some(Precompiler::start(&self.ctx, jobs, asked));
    }

    /// [`Dnn::finish_precompile`] when the helpers were given no graph beyond `specs` (one
    /// session's, planned now); helpers started for later sessions too go on.
    pub fn finish_precompile_of(&self, specs: &[GraphSpec]) {
        let beyond = self
            .precompiler
            .borrow()
            .as_ref()
            .is_some_and(|p| p.specs.iter().any(|s| !specs.contains(s)));
        if !beyond {
            self.finish_precompile();
        }
    }

    /// Stops the helpers (after the graph each is finalizing) and drops the plans nobody took.
    pub fn finish_precompile(&self) {
        let helpers = self.precompiler.borrow_mut().take();
        drop(helpers);
    }

    /// `spec`'s graph and configurations read ahead by a helper, if it read what `limits` would
    /// (waiting while it reads them); None when the planner must read them itself.
    pub(super) fn read_ahead(&self, spec: GraphSpec, limits: Limits) -> Option<ReadAhead> {
        let read = self.precompiler.borrow().as_ref()?.read(spec)?;
        (read.limits == limits).then_some(read)
    }

    /// The plan a helper finalized for configuration `pick` of `spec` (waiting for it when a
    /// helper is at work on the graph), if it is the engine `cfg` names; None when the planner
    /// must finalize it itself.
    pub(super) fn precompiled(
        &self,
        spec: GraphSpec,
        pick: (List, usize),
        cfg: &Desc,
    ) -> Option<Done> {
        let done = self.precompiler.borrow().as_ref()?.take(spec, pick)?;
        let engine = engine_facts(cfg).map_or(-1, |(e, _)| e);
        if done.engine != engine {
            crate::trace::note(|| {
                format!(
                    "helper's {pick:?} was engine {}, the planner's is {engine}: not used",
                    done.engine
                )
            });
            return None;
        }
        Some(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnn::Strict;
    use gpukit_types::{ConvShape, DType, Layout};

    fn spec(k: usize) -> GraphSpec {
        let shape = ConvShape {
            n: 2,
            c: 8,
            h: 9,
            w: 9,
            k,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
            groups: 1,
        };
        GraphSpec::fused(
            Conv {
                shape,
                layout: Layout::Nhwc,
                dtype: DType::F16,
            },
            true,
        )
    }

    fn job(spec: GraphSpec, pick: Option<(List, usize)>) -> Job {
        Job {
            spec,
            limits: Limits::of(Search::Fast, Strict::Any, None),
            pick,
        }
    }

    /// The planner waits for a configuration while a helper may still finalize it: its graph
    /// queued or being read, or the configuration itself queued or finalizing; not otherwise.
    #[test]
    fn a_helper_owes_what_it_may_still_finalize() {
        let (a, b) = (spec(16), spec(32));
        let h3 = (List::Heuristic, 3);
        let mut state = State::default();
        assert!(!state.owes(a, h3), "nothing queued");
        state.queue.push_back(job(a, None));
        assert!(state.owes(a, h3), "the graph's scan is queued");
        assert!(
            !state.owes(b, h3),
            "another graph's scan says nothing of this one"
        );
        state.queue.clear();
        state.running.insert((a, None));
        assert!(state.owes(a, h3), "the graph is being read");
        state.running.clear();
        state.queue.push_back(job(a, Some((List::Heuristic, 5))));
        assert!(!state.owes(a, h3), "only another configuration is queued");
        state.running.insert((a, Some(h3)));
        assert!(state.owes(a, h3), "the configuration is finalizing");
    }

    /// The planner waits for a graph read ahead only while a helper is reading it: not while
    /// its scan is queued (it reads the graph itself), nor when no helper is left.
    #[test]
    fn the_planner_waits_only_for_a_graph_being_read() {
        let (a, b) = (spec(16), spec(32));
        let mut state = State {
            alive: 1,
            ..State::default()
        };
        assert!(!state.reading(a), "nothing queued");
        state.queue.push_back(job(a, None));
        assert!(!state.reading(a), "a queued scan is not waited for");
        state.queue.clear();
        state.running.insert((a, None));
        assert!(state.reading(a), "the graph is being read");
        assert!(
            !state.reading(b),
            "another graph's read says nothing of this one"
        );
        state.running.insert((a, Some((List::Heuristic, 3))));
        state.running.remove(&(a, None));
        assert!(
            !state.reading(a),
            "a configuration finalizing is not a read"
        );
        state.running.insert((a, None));
        state.alive = 0;
        assert!(!state.reading(a), "no helper left");
    }

    /// A fast search finalizes a bounded number of runtime-compiled configurations, a cached
    /// choice or an exhaustive search every one it reads; a cached choice reads its own list up
    /// to its index only.
    #[test]
    fn limits_follow_the_search() {
        let fast = Limits::of(Search::Fast, Strict::Any, None);
        assert!(fast.runtime_compiled < usize::MAX && fast.timed > 1);
        let exhaustive = Limits::of(Search::Exhaustive, Strict::Any, None);
        assert_eq!(exhaustive.runtime_compiled, usize::MAX);
        assert!(exhaustive.heuristic > fast.heuristic);
        let cached = Limits::of(Search::Fast, Strict::Any, Some((List::Fallback, 2)));
        assert_eq!((cached.heuristic, cached.fallback, cached.timed), (0, 3, 1));
        assert_eq!(cached.runtime_compiled, usize::MAX);
    }
}
