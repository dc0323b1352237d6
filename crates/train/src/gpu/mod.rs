//! The training loop on the GPU: linear layers through cuBLASLt with their bias and ReLU fused
//! into the forward product and ReLU's and the bias's gradients into the backward products,
//! the losses, optimizers and loss scaler as gpukit's own kernels over one flat parameter
//! buffer (one launch updates every parameter), fp32 / tf32 / fp16 / bf16, four loaders, and
//! whole epochs captured as CUDA graphs.
//!
//! The layout: row-major tensors as PyTorch keeps them (x [batch, in], W [out, in], y [batch,
//! out]); cuBLASLt sees the same bytes column-major, so a layer is `y' (out x batch) = W'^T x'`
//! with W' = W^T stored in x out. Backward: `dW' (in x out) = x' dy'^T` (fp32, straight into
//! the gradients) and `dx' (in x batch) = W' dy'`, masked by the previous layer's ReLU bits.
//!
//! Mixed precision as PyTorch's autocast does it: fp32 master weights, a copy in the compute
//! type written by the optimizer itself (no separate cast pass), products accumulated in
//! fp32, losses computed in fp32; fp16 adds GradScaler's dynamic loss scale, kept on the device
//! so steps with inf/NaN gradients are skipped without a host round trip.
//!
//! Reproducible: one algorithm a shape (the heuristic's first), reductions in a fixed order,
//! so the same run gives the same bits and N steps + M resumed steps equal N + M steps.

mod batches;
mod exchange;
pub mod feed;
pub mod kernels;
pub mod links;
pub mod parallel;
pub mod pipeline;
mod plan;
pub mod split;
mod stage;
pub mod state;
mod step;

use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::model::Mlp;
use crate::optim::{Optimizer, OptimizerKind, BETA1, BETA2};
use crate::run::{MemoryUse, TrainConfig};
use feed::{target_width, Loader};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::lt::{mask_bytes, LtMatmul};
use gpukit_cuda::profiler::{Recording, TimingChoice};
use gpukit_cuda::{DeviceBuffer, Gpu, Graph};
use gpukit_types::DType;
use kernels::{StepState, TrainKernels, STATE_BYTES};
use plan::{Fusion, Layout};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

pub use crate::precision::Precision;
pub use exchange::DpPeers;

/// GradScaler's starting scale and growth interval.
pub const INITIAL_SCALE: f64 = 65536.0;
pub const GROWTH_INTERVAL: u32 = 2000;

/// How a GPU run is carried out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuOptions {
    pub precision: Precision,
    /// None: resident when the data set takes under a quarter of the free memory, else
    /// prefetch.
    pub loader: Option<Loader>,
    /// Capture each epoch's steps once as a CUDA graph and replay it (None: when the data is
    /// resident, which a graph needs).
    pub graph: Option<bool>,
    /// Let cuBLASLt fuse bias, ReLU and their gradients (false: gpukit's kernels run them
    /// after plain products, the path taken where cuBLASLt cannot fuse; tests compare both).
    pub fuse: bool,
    /// Data-parallel: this rank's share of every combined batch (None: one GPU, all rows).
    pub shard: Option<parallel::Shard>,
    /// Data-parallel: the first layer's weight gradient (backward's last product) computed in
    /// this many pieces, each averaged as soon as it is done, so that only the last piece's
    /// averaging is left after backward (0: chosen from the layer's size; 1: whole).
    pub grad_pieces: usize,
    /// Data-parallel: the type gradients are averaged in. F32 (the default) keeps the one-GPU
    /// updates up to the order of sums; Bf16 halves the bytes sent and rounds every averaged
    /// gradient to bf16 (it changes the numerics, as PyTorch's bf16 compression hook does).
    pub grad_comm: DType,
    /// Data-parallel: shard the optimizer (ZeRO stage 2's traffic): each bucket's gradients
    /// are reduce-scattered instead of all-reduced, each rank updates only its block of every
    /// bucket, and the updated weights (the 16-bit copy in mixed precision) are all-gathered
    /// on the communication stream. Half the bytes of averaging and 1/N of the optimizer's
    /// work on each rank; the same updates as averaging every gradient.
    pub shard_optimizer: bool,
    /// Data-parallel, sharded, f32 gradients, ranks as threads of one process
    /// ([`GpuTrainer::join_peers`]), op-by-op launches, the first layer's pieces left to
    /// gpukit: the gradients reduce-scattered by the copy engines, the first layer's weight
    /// gradient computed in one piece a rank, the other ranks' first, each copied to its owner
    /// while the next is computed, and the averaging done in the update's pass (exchange.rs).
    /// On unless `GPUKIT_DP_EXCHANGE=0` (then NCCL's reduce-scatter after each bucket).
    pub dp_exchange: bool,
    /// Data-parallel: multiprocessors the products leave to communication once a communicator
    /// is attached (cuBLASLt plans them for the rest, so NCCL's kernels run beside them
    /// instead of waiting for them to end; 0: products take every multiprocessor). The ranks'
    /// baseline alone is planned for all of them.
    pub comm_sms: u32,
    /// Pipeline-parallel: the layers this GPU holds, and its place in the pipeline (None: the
    /// whole model). The trainer is still given the whole model's config and weights.
    pub stage: Option<stage::Stage>,
    /// The most of the device's memory the run may plan to use, as a fraction of it (the
    /// resource guard refuses a run that needs more, before allocating).
    pub memory_fraction: Option<f64>,
}

impl GpuOptions {
    pub fn new(precision: Precision) -> GpuOptions {
        GpuOptions {
            precision,
            loader: None,
            graph: None,
            fuse: true,
            shard: None,
            grad_pieces: 0,
            grad_comm: DType::F32,
            shard_optimizer: false,
            dp_exchange: std::env::var("GPUKIT_DP_EXCHANGE").as_deref() != Ok("0"),
            comm_sms: 0,
            stage: None,
            memory_fraction: None,
        }
    }
}

/// What a GPU run did beyond the CPU's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDetails {
    pub precision: Precision,
    pub loader: Loader,
    pub graph: bool,
    /// Whether cuBLASLt fused every bias, ReLU and their gradients (else gpukit's kernels ran
    /// some of them after plain products: `epilogues` says which).
    pub fused_epilogues: bool,
    /// Each layer's epilogues, in words.
    #[serde(default)]
    pub epilogues: Vec<String>,
    /// The loss scale at the end and clean updates since it last changed (fp16).
    pub scaler: Option<(f64, u64)>,
    /// Updates skipped because their gradients held inf or NaN (fp16).
    pub skipped_updates: u64,
    /// Seconds spent before the loop: kernels loaded, products planned, data uploaded.
    pub setup_seconds: f64,
    /// Peak bytes the device's memory pool held for live buffers during the run.
    pub pool_peak_bytes: u64,
    /// The device's name.
    pub device_name: String,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    gpukit_tensor::codec::decode_f32(bytes, DType::F32)
}

/// The sum of u32 counts downloaded from the device (right answers per batch).
fn count_sum(bytes: &[u8]) -> usize {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .sum()
}

fn bytes(v: &[f32]) -> &[u8] {
    gpukit_tensor::codec::bytes_of(v)
}

/// What kind of product a plan is for (part of its key with the layer and the rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Forward,
    ForwardEval,
    WeightGrad,
    /// The weight gradient of `n` of the layer's outputs (a piece of [`Op::WeightGrad`]).
    WeightGradPiece(usize),
    InputGrad,
}

/// A product's plan is for a layer, a kind of product and a batch size.
type PlanKey = (usize, Op, usize);

/// A sharded optimizer's state gathered whole at the end of a run ([`GpuTrainer::gather_shards`]).
struct Gathered {
    /// The f32 weights, where each rank kept only its blocks of them.
    params: Option<Vec<f32>>,
    /// m, then v where the optimizer keeps it.
    moments: Vec<Vec<f32>>,
}

/// A GPU trainer: buffers, plans and graphs for one model shape, data set and settings;
/// [`GpuTrainer::run`] may be called again after [`GpuTrainer::load`] (repeated timings reuse
/// the plans and graphs, as a warmed-up PyTorch reuses its own).
pub struct GpuTrainer {
    gpu: Arc<Gpu>,
    blas: Blas,
    k: TrainKernels,
    cfg: TrainConfig,
    opts: GpuOptions,
    loader: Loader,
    layout: Layout,
    fusion: Vec<Fusion>,
    /// The f32 weights: every parameter's, or with a sharded optimizer in mixed precision this
    /// rank's blocks only, packed ([`GpuTrainer::params_span`]).
    params: DeviceBuffer,
    grads: DeviceBuffer,
    /// The optimizer's moments: every parameter's, or with a sharded optimizer this rank's
    /// blocks only, packed ([`GpuTrainer::state_span`]).
    m: Option<DeviceBuffer>,
    v: Option<DeviceBuffer>,
    /// A sharded optimizer's state made whole at the end of the last run, for `store`.
    gathered: std::cell::RefCell<Option<Gathered>>,
    half: Option<Arc<DeviceBuffer>>,
    bias_scratch: Vec<DeviceBuffer>,
    state: DeviceBuffer,
    /// The batch's targets when gathered on the device (resident data, evaluation).
    tgt: DeviceBuffer,
    /// The copy stream of the prefetch loader.
    copies: Option<gpukit_cuda::Stream>,
    /// f32 batches as copied from the host (two slots for prefetch; none when resident).
    stage: Vec<DeviceBuffer>,
    /// A batch's maps: one set, or on a pipeline stage one a micro-batch in flight
    /// (`slot` picks the one the next ops use).
    maps: Vec<Maps>,
    slot: std::cell::Cell<usize>,
    /// Layer l's output is `acts[act_of[l]]` of a [`Maps`].
    act_of: Vec<usize>,
    /// Layers a checkpointed segment spans (None: every output kept).
    segment: Option<usize>,
    dz: [DeviceBuffer; 2],
    losses: DeviceBuffer,
    correct: DeviceBuffer,
    train: Arc<Dataset>,
    resident: Option<(DeviceBuffer, DeviceBuffer, DeviceBuffer)>,
    eval: Option<(Dataset, DeviceBuffer, DeviceBuffer, DeviceBuffer)>,
    plans: HashMap<PlanKey, LtMatmul>,
    graphs: HashMap<(u64, u64), Graph>,
    setup_seconds: f64,
    memory: MemoryUse,
    /// The data-parallel communicator and buckets, once attached.
    dp: Option<parallel::Dp>,
    /// Data-parallel ranks of one process: where the exchange meets the others (set before
    /// [`GpuTrainer::attach`]).
    peers: Option<Arc<DpPeers>>,
    /// The first layer's weight gradient in pieces (data-parallel): its outputs' ranges
    /// `[a, b)`; empty when it is computed whole.
    grad_pieces: Vec<(usize, usize)>,
    /// Pipeline-parallel: how the stages beside this one are reached, once attached.
    pipe: Option<pipeline::Pipe>,
    /// With `GPUKIT_TRACE=1`, a pipeline stage's timed marks of its last update
    /// ([`GpuTrainer::pipeline_trace`]).
    pipe_marks: std::cell::RefCell<Vec<(char, usize, gpukit_cuda::Event)>>,
    /// Multiprocessors the products are planned for (None: the GPU's all).
    sm_target: Option<u32>,
    /// The epoch to profile, with how ([`GpuTrainer::profile_epoch`]).
    profile_at: Option<(u64, Discovery, TimingChoice)>,
    /// That epoch's recording, once made.
    recording: Option<Recording>,
}

/// One batch's maps: the first layer's input, the layer outputs (every layer's own buffer, or
/// with checkpointing only the kept layers' (each segment's last and the model's output) plus
/// one a position in a segment that recomputed outputs share) and the ReLU bits.
struct Maps {
    x_in: DeviceBuffer,
    acts: Vec<DeviceBuffer>,
    masks: Vec<Option<DeviceBuffer>>,
}

/// The first layer's input comes from here.
#[derive(Clone, Copy)]
enum Input {
    /// gathered from the resident data by the epoch's order
    Resident { first_row: usize },
    /// already in x_in (f32 precision) or in staging slot `slot` (cast into x_in)
    Staged { slot: usize },
}

impl GpuTrainer {
    /// Opens everything a run needs: kernels, device buffers (the data set too when resident),
    /// and the products' plans for the full and the last partial batch.
    pub fn new(
        discovery: &Discovery,
        gpu: Arc<Gpu>,
        cfg: &TrainConfig,
        opts: GpuOptions,
        train: Dataset,
        eval: Option<Dataset>,
    ) -> Result<GpuTrainer> {
        cfg.check()?;
        cfg.check_data(&train)?;
        // a pipeline stage plans, allocates and trains its own layers only
        let staged;
        let cfg = match &opts.stage {
            Some(stage) => {
                staged = stage.config(cfg)?;
                &staged
            }
            None => cfg,
        };
        let first_stage = opts.stage.is_none_or(|s| s.first());
        let started = Instant::now();
        let shape = crate::budget::DataShape {
            train: train.len(),
            eval: eval.as_ref().map_or(0, Dataset::len),
            features: cfg.widths[0],
            target_width: target_width(&train),
        };
        let (free, total_memory) = gpu.mem_info()?;
        // --memory-fraction: what the run may plan to use
        let free = opts
            .memory_fraction
            .map_or(free, |f| free.min((total_memory as f64 * f) as u64));
        let loader = opts
            .loader
            .unwrap_or_else(|| crate::budget::default_loader(&shape, free));
        // refused before the first allocation, with what it needs against what is free
        crate::budget::device_need(gpu.ordinal, cfg, &shape, opts.precision, loader)
            .check(Some(free), crate::budget::HINT)?;
        // a sharded optimizer's ranks each take an equal block of every bucket
        let layout = match opts.shard {
            Some(s) if opts.shard_optimizer => Layout::aligned(&cfg.widths, s.world),
            _ => Layout::new(&cfg.widths),
        };
        let mut opts = opts;
        let graph = opts.graph.unwrap_or(loader == Loader::Resident);
        opts.graph = Some(graph);
        if graph && loader != Loader::Resident {
            return Err(Error::Setting(format!(
                "--graph replays whole epochs with the data on the GPU: use --loader resident \
                 (the {} loader copies each batch from the host, which a graph cannot replay)",
                loader.name()
            )));
        }
        let blas = Blas::new(discovery, &gpu)?;
        let k = TrainKernels::new(discovery, &gpu)?;
        gpu.reset_pool_peaks()?;
        let p = opts.precision;
        let st = p.storage().size_bytes();
        let eval_len = eval.as_ref().map_or(0, Dataset::len);
        let rows = cfg.batch_size.min(train.len().max(eval_len)).max(1);
        // a pipeline stage holds a micro-batch's maps a slot
        let (rows, slots) = match &opts.stage {
            Some(s) => (rows.div_ceil(s.micro), s.slots()),
            None => (rows, 1),
        };
        let f = cfg.widths[0];
        let tw = target_width(&train);
        let per_epoch = train.len().div_ceil(cfg.batch_size);
        let n_layers = layout.layers();
        let total = layout.total;
        let uses_m = cfg.optimizer.kind != OptimizerKind::Sgd || cfg.optimizer.momentum != 0.0;
        let uses_v = cfg.optimizer.kind != OptimizerKind::Sgd;
        let alloc = |n: usize| gpu.alloc(n.max(4));
        let params = alloc(total * 4)?;
        let grads = alloc(total * 4)?;
        let m = uses_m.then(|| alloc(total * 4)).transpose()?;
        let v = uses_v.then(|| alloc(total * 4)).transpose()?;
        let half = p
            .half()
            .then(|| alloc(total * st))
            .transpose()?
            .map(Arc::new);
        let micro = opts.stage.map_or(cfg.accumulate, |s| s.micro);
        let bias_scratch = if micro > 1 {
            (0..n_layers)
                .map(|l| alloc(layout.io(l).1 * 4))
                .collect::<gpukit_cuda::Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let state = alloc(STATE_BYTES)?;
        let tgt = alloc(rows * tw * 4)?;
        let copies = (loader == Loader::Prefetch)
            .then(|| gpu.new_stream())
            .transpose()?;
        let stage_bytes = rows * (f + tw) * 4;
        let stage = match loader {
            Loader::Resident => Vec::new(),
            Loader::Prefetch => vec![alloc(stage_bytes)?, alloc(stage_bytes)?],
            Loader::Plain | Loader::Pinned => vec![alloc(stage_bytes)?],
        };
        let widest = cfg.widths.iter().copied().max().unwrap_or(1);
        let segment = cfg.checkpoint_activations.then(|| cfg.segment());
        let kept =
            |l: usize| segment.is_none_or(|s| (l + 1).is_multiple_of(s) || l + 1 == n_layers);
        let last_stage = opts.stage.is_none_or(|s| s.last());
        let mut maps = Vec::new();
        let mut act_of = Vec::new();
        let mut all_kept = 0;
        for _ in 0..slots {
            let x_in = alloc(rows * f * st)?;
            let mut acts = Vec::new();
            let mut masks = Vec::new();
            act_of.clear();
            all_kept = 0;
            // recomputed outputs share one buffer a position in the segment (as wide as the
            // widest)
            let mut shared: HashMap<usize, usize> = HashMap::new();
            for l in 0..n_layers {
                let out = layout.io(l).1;
                all_kept += rows * out * st;
                if kept(l) {
                    act_of.push(acts.len());
                    acts.push(alloc(rows * out * st)?);
                } else {
                    let position = l % segment.unwrap_or(1);
                    let at = match shared.get(&position) {
                        Some(&at) => at,
                        None => {
                            acts.push(alloc(rows * widest * st)?);
                            shared.insert(position, acts.len() - 1);
                            acts.len() - 1
                        }
                    };
                    act_of.push(at);
                }
                // the ReLU bits (one bit an element) stay for every layer
                let hidden = l + 1 < n_layers || !last_stage;
                masks.push(hidden.then(|| alloc(mask_bytes(out, rows))).transpose()?);
            }
            if opts.stage.is_some() {
                // a stage that times its layers alone reads what is there: zeros, not garbage
                gpu.fill(x_in.view(), 0)?;
            }
            maps.push(Maps { x_in, acts, masks });
        }
        let dz = [alloc(rows * widest * st)?, alloc(rows * widest * st)?];
        if opts.stage.is_some() {
            gpu.fill(dz[0].view(), 0)?;
        }
        let eval_batches = eval
            .as_ref()
            .map_or(0, |e| e.len().div_ceil(cfg.batch_size));
        let loss_slots = (per_epoch * opts.stage.map_or(1, |s| s.micro))
            .max(eval_batches)
            .max(1);
        let losses = alloc(loss_slots * 8)?;
        let correct = alloc(loss_slots * 4)?;
        // a stage before the last computes no loss: its slots read as zeros
        gpu.fill(losses.view(), 0)?;
        gpu.fill(correct.view(), 0)?;
        let upload_targets = |d: &Dataset| -> gpukit_cuda::Result<DeviceBuffer> {
            match &d.y {
                Targets::Values { data, .. } => gpu.upload(bytes(data)),
                Targets::Classes { data, .. } => {
                    gpu.upload(gpukit_tensor::codec::bytes_of(data.as_slice()))
                }
            }
        };
        let resident = if loader == Loader::Resident {
            Some((
                // only the first stage reads the inputs
                if first_stage {
                    gpu.upload(bytes(&train.x))?
                } else {
                    alloc(4)?
                },
                upload_targets(&train)?,
                alloc(train.len() * 4)?,
            ))
        } else {
            None
        };
        let eval = match eval {
            Some(e) => {
                let order: Vec<u32> = (0..e.len() as u32).collect();
                let x = gpu.upload(bytes(&e.x))?;
                let y = upload_targets(&e)?;
                let idx = gpu.upload(gpukit_tensor::codec::bytes_of(order.as_slice()))?;
                Some((e, x, y, idx))
            }
            None => None,
        };
        let f32b = |n: usize| n * 4;
        let mask_bytes_all = maps[0]
            .masks
            .iter()
            .flatten()
            .map(DeviceBuffer::len)
            .sum::<usize>();
        let act_bytes: usize = maps
            .iter()
            .map(|m| {
                m.acts.iter().map(DeviceBuffer::len).sum::<usize>() + mask_bytes_all + m.x_in.len()
            })
            .sum();
        let all_kept = (all_kept + mask_bytes_all + maps[0].x_in.len()) * slots;
        let memory = MemoryUse {
            weights: f32b(total) + half.as_deref().map_or(0, DeviceBuffer::len),
            gradients: f32b(total) + bias_scratch.iter().map(DeviceBuffer::len).sum::<usize>(),
            optimizer_state: m.as_ref().map_or(0, DeviceBuffer::len)
                + v.as_ref().map_or(0, DeviceBuffer::len),
            activations: act_bytes,
            workspace: tgt.len()
                + dz[0].len()
                + dz[1].len()
                + stage.iter().map(DeviceBuffer::len).sum::<usize>()
                + gpukit_cuda::blas::WORKSPACE_BYTES
                + losses.len()
                + correct.len()
                + state.len(),
            activations_all_kept: all_kept,
            data: resident
                .as_ref()
                .map_or(0, |(x, y, i)| x.len() + y.len() + i.len())
                + eval
                    .as_ref()
                    .map_or(0, |(_, x, y, i)| x.len() + y.len() + i.len()),
            pool_peak: None,
        };
        let mut trainer = GpuTrainer {
            gpu,
            blas,
            k,
            cfg: cfg.clone(),
            opts,
            loader,
            layout,
            fusion: Vec::new(),
            params,
            grads,
            m,
            v,
            gathered: std::cell::RefCell::new(None),
            half,
            bias_scratch,
            state,
            tgt,
            copies,
            stage,
            maps,
            slot: std::cell::Cell::new(0),
            act_of,
            segment,
            dz,
            losses,
            correct,
            train: Arc::new(train),
            resident,
            eval,
            plans: HashMap::new(),
            graphs: HashMap::new(),
            profile_at: None,
            recording: None,
            setup_seconds: 0.0,
            memory,
            dp: None,
            peers: None,
            grad_pieces: Vec::new(),
            pipe: None,
            pipe_marks: Default::default(),
            sm_target: None,
        };
        trainer.plan_all()?;
        trainer.setup_seconds = started.elapsed().as_secs_f64();
        Ok(trainer)
    }

    /// The loader the run uses.
    /// Records epoch `epoch` (0-based) of the next [`GpuTrainer::run`] with a profiler:
    /// every op of its steps, from the start of its first step to the end of its last (the
    /// evaluation after it is left out); [`GpuTrainer::take_recording`] returns it.
    pub fn profile_epoch(&mut self, epoch: u64, discovery: &Discovery, timing: TimingChoice) {
        self.profile_at = Some((epoch, discovery.clone(), timing));
        self.recording = None;
    }

    /// The recording [`GpuTrainer::profile_epoch`] asked for, when that epoch ran.
    pub fn take_recording(&mut self) -> Option<Recording> {
        self.recording.take()
    }

    pub fn loader(&self) -> Loader {
        self.loader
    }

    /// Puts the model, the optimizer's state and the scaler's on the device.
    pub fn load(
        &mut self,
        model: &Mlp<f32>,
        opt: &Optimizer<f32>,
        scaler: Option<(f64, u64)>,
    ) -> Result<()> {
        let g = &self.gpu;
        // a pipeline stage's own layers, and their tensors of the optimizer's state
        let (first, end) = self.own_layers();
        let own = Mlp {
            layers: model.layers[first..end].to_vec(),
        };
        let flat = self.layout.pack(&own);
        self.upload_params(&flat)?;
        let mine = |saved: &[Vec<f32>]| -> Vec<Vec<f32>> {
            saved
                .get(2 * first..2 * end)
                .map_or_else(Vec::new, <[_]>::to_vec)
        };
        self.gathered.replace(None);
        for (buf, saved) in [(&self.m, mine(&opt.m)), (&self.v, mine(&opt.v))] {
            if let Some(buf) = buf {
                if saved.is_empty() {
                    g.fill(buf.view(), 0)?;
                } else {
                    let mut flat = vec![0f32; self.layout.total];
                    let mut parts = saved.iter();
                    for (wo, bo) in &self.layout.offsets {
                        for at in [*wo, *bo] {
                            let part = parts.next().ok_or_else(|| {
                                Error::Failed("the optimizer state has too few tensors".into())
                            })?;
                            flat[at..at + part.len()].copy_from_slice(part);
                        }
                    }
                    self.upload_state(buf, &flat)?;
                }
            }
        }
        if let Some(h) = &self.half {
            // the 16-bit copy of every weight: from the f32 ones, or where a rank keeps only
            // its blocks of them, from every weight put in the gradients' buffer
            let from = if self.params_sharded() {
                g.upload_into(self.grads.view(), bytes(&flat))?;
                &self.grads
            } else {
                &self.params
            };
            self.k.cast(
                from.view(),
                h.view(),
                self.opts.precision.storage(),
                self.layout.total,
            )?;
        }
        g.fill(self.grads.view(), 0)?;
        let (scale, growth) = match (self.opts.precision.scaled(), scaler) {
            (true, Some(s)) => s,
            (true, None) => (INITIAL_SCALE, 0),
            (false, _) => (1.0, 0),
        };
        let t = (opt.step + 1) as f64;
        let st = StepState {
            scale: scale as f32,
            step_size: (opt.config.lr / (1.0 - BETA1.powf(t))) as f32,
            bc2_sqrt: (1.0 - BETA2.powf(t)).sqrt() as f32,
            found_inf: false,
            step: u32::try_from(opt.step)
                .map_err(|_| Error::Failed("more than 2^32 updates".into()))?,
            growth: growth as u32,
            skipped: 0,
        };
        g.upload_into(self.state.view(), &st.to_bytes())?;
        g.synchronize()?;
        Ok(())
    }

    /// Reads the model, the optimizer's state and the scaler's back.
    pub fn store(&self, model: &mut Mlp<f32>, opt: &mut Optimizer<f32>) -> Result<StepState> {
        let g = &self.gpu;
        let st = StepState::from_bytes(&g.download(&self.state)?)?;
        let gathered = self.gathered.borrow();
        let flat = match gathered.as_ref().and_then(|w| w.params.as_ref()) {
            Some(p) => p.clone(),
            None if self.params_sharded() => {
                return Err(Error::Failed(
                    "the sharded optimizer's f32 weights were not gathered".into(),
                ))
            }
            None => f32s(&g.download(&self.params)?),
        };
        // a pipeline stage writes its own layers (and their optimizer state) only
        let (first, _) = self.own_layers();
        for (l, mut tensors) in self
            .layout
            .unpack(&flat)
            .chunks(2)
            .map(|c| c.to_vec())
            .enumerate()
        {
            let layer = &mut model.layers[first + l];
            layer.bias = tensors.pop().unwrap_or_default();
            layer.weight = tensors.pop().unwrap_or_default();
        }
        opt.step = u64::from(st.step);
        let stepped = st.step > 0;
        let whole = 2 * model.layers.len();
        for (i, (buf, saved)) in [(&self.m, &mut opt.m), (&self.v, &mut opt.v)]
            .into_iter()
            .enumerate()
        {
            match (buf, stepped) {
                (Some(b), true) => {
                    let values = match gathered.as_ref().and_then(|w| w.moments.get(i)) {
                        Some(w) => w.clone(),
                        None if self.moments_sharded() => {
                            return Err(Error::Failed(
                                "the sharded optimizer's moments were not gathered".into(),
                            ))
                        }
                        None => f32s(&g.download(b)?),
                    };
                    let mine = self.layout.unpack(&values);
                    saved.resize(whole, Vec::new());
                    for (at, t) in mine.into_iter().enumerate() {
                        saved[2 * first + at] = t;
                    }
                }
                _ => saved.clear(),
            }
        }
        Ok(st)
    }
}
