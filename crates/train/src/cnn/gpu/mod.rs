//! ResNets trained on the GPU, mirroring [`ResNet`] (the same parameters in the same order under
//! the same names, loaded from a CPU model and read back into one): convolutions forward,
//! backward data and backward filter through cuDNN's legacy calls, each pass's algorithm timed
//! by cuDNN's own search (f32: only those that sum the products as written), a channels-last
//! 1x1 filter's gradient by one cuBLAS product where that times faster (`plan.rs`); batch norm in
//! training mode through cuDNN (batch statistics, running statistics moved as PyTorch moves
//! them); the stem's ReLU and max pooling by cuDNN (fp32) or in one pass of gpukit's kernels
//! (channel-last, keeping each pooled value's position for the backward), global average pooling
//! by gpukit's kernels ([`kernels`]); the linear head through cuBLAS; the smoothed
//! cross-entropy, the loss scaler and the optimizers (SGD with momentum, Nesterov and weight
//! decay; AdamW) by the MLP engine's kernels over one flat f32 parameter buffer ([`layout`]).
//!
//! Two arithmetics ([`Precision`]):
//! - fp32, NCHW, true fp32: convolutions with cuDNN's FMA math (no TF32), the head's products
//!   with cuBLAS's plain f32 compute type; batch norm bare (SPATIAL), ReLU and the residual add
//!   by gpukit's kernels, ReLU's backward by the MLP engine's.
//! - bf16 / fp16, NHWC, as PyTorch's autocast with channels_last: f32 master weights (conv
//!   filters held in KRSC order, so the optimizer's 16-bit copy of the whole buffer is cuDNN's
//!   channels-last filter; the stem over 2x2 blocks of pixels where the image sizes are even
//!   ([`stem`]), else its 3 channels padded to 8 with zero taps, images too;
//!   [`GpuResNet::load`] and [`GpuResNet::store`] permute and pad on the host),
//!   16-bit maps and gradients, tensor-op convolutions and products summing in f32, batch norm
//!   in SPATIAL_PERSISTENT mode with its ReLU and residual add + ReLU fused forward and
//!   backward (f32 statistics and parameters), each 16-bit filter and head gradient widened
//!   into the f32 gradients as it is made, the loss in f32 from 16-bit logits. fp16 scales the
//!   loss by GradScaler's rules through the shared step state: an inf or NaN gradient skips the
//!   update and halves the scale, 2000 clean updates double it.
//!
//! Every map and gradient lives in one arena placed by lifetimes ([`memory`]); the whole update
//! can be replayed as one CUDA graph ([`GpuResNet::use_graph`]).
//!
//! To use: [`GpuResNet::new`] from a CPU model (its weights and running statistics are
//! uploaded), [`GpuResNet::train_step`] per batch, [`GpuResNet::store`] to read the model back.

pub mod kernels;
pub mod layout;
pub mod memory;
pub mod need;
mod ops;
mod parallel;
mod params;
mod plan;
pub mod stem;
mod step;
mod upload;

pub use parallel::buckets_of;
pub use plan::{device_channels, device_lens, input_maps, unit_shapes};
use plan::{filters_of, plan_unit, time_filter_products, DeviceFilter, GpuBlock, GpuUnit};

use super::data::Images;
use super::layers::Linear;
use super::optim::{CnnOptimizer, CnnOptimizerConfig};
use super::resnet::{Depth, ResNet};
use super::Tensor;
use crate::error::{Error, Result};
use crate::gpu::kernels::{StepState, TrainKernels, UpdateRule, STATE_BYTES};
use crate::gpu::{GROWTH_INTERVAL, INITIAL_SCALE};
use crate::optim::{OptimizerKind, BETA1, BETA2};
use crate::precision::Precision;
use gpukit_cuda::blas::Blas;
use gpukit_cuda::dnn::{BnBackward, BnForward, BnMode, BnOps, Dnn, Maps, MaxPool};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::profiler::{Profiler, Recording, TimingChoice};
use gpukit_cuda::transfer::{copy_pinned_to, PinnedBytes};
use gpukit_cuda::{DeviceBuffer, Gpu, View};
use gpukit_tensor::codec::{bytes_of, decode_f32, encode_f32};
use gpukit_types::{DType, Layout};
use kernels::CnnKernels;
use layout::{channels_first, channels_last, pad_rows, unpad_rows, FlatLayout};
use std::sync::Arc;

/// The element type of the master weights, gradients, statistics and optimizer state.
const F32: DType = DType::F32;

/// The 16-bit side of a bf16 / fp16 trainer.
struct Half {
    /// Every parameter in the storage type, at the f32 layout's offsets (the optimizer writes
    /// it whole; the convolutions read the filters, the head its weight).
    weights: DeviceBuffer,
    /// One filter's or the head weight's gradient, before it is widened into the f32 gradients.
    grad: DeviceBuffer,
}

/// A ResNet's training state on one GPU for one batch size and image size.
pub struct GpuResNet {
    gpu: Arc<Gpu>,
    dnn: Dnn,
    blas: Blas,
    k: TrainKernels,
    ck: CnnKernels,
    pub depth: Depth,
    pub classes: usize,
    pub batch: usize,
    /// Image height and width.
    pub image: (usize, usize),
    pub precision: Precision,
    /// Training-mode forward passes so far (every norm's `num_batches_tracked`).
    pub batches_tracked: u64,
    names: Vec<String>,
    /// Each parameter's form on the device when it is a filter held channels-last (KRSC, its
    /// channels padded with zeros to the device's; the stem's over 2x2 blocks).
    filters: Vec<Option<DeviceFilter>>,
    /// The blocked stem filter's mask (1 on the network's weights), applied to its gradient.
    stem_mask: Option<DeviceBuffer>,
    opt: CnnOptimizerConfig,
    smoothing: f32,
    params_layout: FlatLayout,
    stats_layout: FlatLayout,
    params: DeviceBuffer,
    grads: DeviceBuffer,
    half: Option<Half>,
    m: Option<DeviceBuffer>,
    v: Option<DeviceBuffer>,
    stats: DeviceBuffer,
    saved: DeviceBuffer,
    state: DeviceBuffer,
    stem: GpuUnit,
    pool: MaxPool,
    /// The max pool's window, stride and padding (gpukit's backward kernel takes them).
    pool_window: (usize, usize, usize),
    /// Every map the step keeps and every gradient of a map, placed by `maps_plan`.
    maps: DeviceBuffer,
    maps_plan: memory::MapsPlan,
    blocks: Vec<GpuBlock>,
    head: (Linear, usize, usize),
    /// The images' maps (the stem's input).
    input: Maps,
    /// The last block's maps (the average pool's input).
    last: Maps,
    images: DeviceBuffer,
    labels: DeviceBuffer,
    features: DeviceBuffer,
    logits: DeviceBuffer,
    dlogits: DeviceBuffer,
    dfeatures: DeviceBuffer,
    loss: DeviceBuffer,
    /// Each image's loss term and hit before they are summed.
    loss_rows: DeviceBuffer,
    correct: DeviceBuffer,
    workspace: DeviceBuffer,
    /// Whether a batch is on the device.
    uploaded: bool,
    /// Pinned host memory a channel-last batch is converted into and copied from (pageable
    /// memory moved 103 MB at about 3.5 GB/s, 29 ms a fresh ResNet-50 batch: run 94).
    staging: Option<PinnedBytes>,
    /// The whole data set on the device, each batch gathered from it ([`GpuResNet::keep_data`]).
    resident: Option<upload::Resident>,
    /// Updates made through [`super::run::Stepper::step`].
    updates: u64,
    /// Whether steps replay captured CUDA graphs (each kind of micro-batch captured after its
    /// first eager run, replayed after), the reason when a capture failed and steps stay
    /// eager, and the graphs: a whole update (or the first micro-batch), a middle micro-batch,
    /// the last.
    graph_on: bool,
    graph_failed: Option<String>,
    graphs: [Option<gpukit_cuda::Graph>; 3],
    /// Micro-batches an update sums the gradients of, and their sum when above 1.
    accumulate: usize,
    acc: Option<DeviceBuffer>,
    /// Whether the micro-batch being enqueued is its update's last (data-parallel with
    /// accumulation averages the summed gradients then, bucket by bucket).
    last_micro: std::cell::Cell<bool>,
    /// Data-parallel peers, when attached ([`GpuResNet::attach`]).
    dp: Option<parallel::CnnDp>,
    /// `gpukit profile train --model`: the update (0-based) to record, and how.
    profile_at: Option<(u64, Discovery, TimingChoice)>,
    recording: Option<Recording>,
}

impl super::run::Stepper for GpuResNet {
    /// One update; the one [`GpuResNet::profile_update`] names is recorded, its batch's upload
    /// included.
    fn step(
        &mut self,
        batch: super::run::Batch<'_>,
        fresh: bool,
        micro: (usize, usize),
    ) -> Result<(f64, usize)> {
        if micro.1 != self.accumulate || micro.0 >= micro.1 {
            return Err(Error::Failed(format!(
                "micro-batch {micro:?} of a trainer of {} an update",
                self.accumulate
            )));
        }
        let profiler = match &self.profile_at {
            Some((at, discovery, timing)) if *at == self.updates => {
                Some(Profiler::start(&self.gpu, discovery, *timing)?)
            }
            _ => None,
        };
        self.updates += 1;
        if fresh || !self.uploaded {
            match batch.images {
                _ if self.resident.is_some() => self.gather_batch(batch.indices)?,
                Some(images) => self.upload(images, batch.labels)?,
                None => {
                    return Err(Error::Failed(
                        "a batch without its images for a trainer that keeps no data set".into(),
                    ))
                }
            }
        }
        // a recorded update runs eagerly: the profiler ties each launch to its op
        let out = self.step_on_device(profiler.is_some(), micro);
        if let Some(p) = profiler {
            self.recording = Some(p.finish()?);
        }
        out
    }

    fn resident(&self) -> bool {
        self.resident.is_some()
    }
}

/// Tensor `i` of a flat buffer of `elem`-byte values laid out by `layout`.
fn tensor_view<'a>(
    buf: &'a DeviceBuffer,
    layout: &FlatLayout,
    i: usize,
    elem: usize,
) -> Result<View<'a>> {
    let (o, n) = layout.range(i)?;
    Ok(buf.view().sub(o * elem, n * elem)?)
}

fn f32_view<'a>(buf: &'a DeviceBuffer, layout: &FlatLayout, i: usize) -> Result<View<'a>> {
    tensor_view(buf, layout, i, 4)
}

impl GpuResNet {
    /// The GPU copy of `model` for batches of `batch` images of `image` (height, width), trained
    /// in `precision` (fp32, tf32, bf16 or fp16), with activation checkpointing when `checkpoint`
    /// (each block's maps but its output recomputed in its backward stage), by `opt` with label
    /// smoothing `smoothing`: plans
    /// every convolution and norm, allocates every buffer and uploads the model (its optimizer
    /// starts fresh, fp16's loss scale at GradScaler's 65536; see
    /// [`GpuResNet::load_optimizer`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        discovery: &Discovery,
        gpu: Arc<Gpu>,
        model: &ResNet<f32>,
        batch: usize,
        image: (usize, usize),
        (precision, checkpoint): (Precision, bool),
        opt: CnnOptimizerConfig,
        smoothing: f64,
    ) -> Result<GpuResNet> {
        opt.check()?;
        if !(0.0..1.0).contains(&smoothing) {
            return Err(Error::Setting(format!(
                "--label-smoothing {smoothing}: must be in [0, 1)"
            )));
        }
        if batch == 0 || model.classes == 0 {
            return Err(Error::Setting(format!(
                "a batch of {batch} images and {} classes: both must be positive",
                model.classes
            )));
        }
        let input = input_maps(precision, batch, image)?;
        let elem = input.dtype.size_bytes();
        gpu.reset_pool_peaks()?;
        let dnn = Dnn::new(discovery, &gpu)?;
        let blas = Blas::new(discovery, &gpu)?;
        let k = TrainKernels::new(discovery, &gpu)?;
        let ck = CnnKernels::new(discovery, &gpu)?;
        let net = need::net_maps(model, input)?;
        let pool_kernels = plan::pools_on_kernels(&net.stem, model.pool().kernel);
        let maps_plan = memory::plan_maps(&net, pool_kernels, checkpoint)?;
        let mut saved_at = 0;
        let on = (&dnn, gpu.as_ref(), precision.inputs());
        // the stem's ReLU runs in gpukit's pool kernels where they take its maps
        let stem_role = match pool_kernels {
            true => BnOps::Bn,
            false => BnOps::BnRelu,
        };
        let stem = plan_unit(
            on,
            (model.stem(), stem_role),
            (input, maps_plan.stem),
            &mut saved_at,
        )?;
        let p = model.pool();
        let pool = dnn.max_pool(stem.output, p.kernel, p.stride, p.padding)?;
        let mut maps = pool.output;
        let mut blocks = Vec::new();
        for (b, slots) in model.blocks().iter().zip(&maps_plan.blocks) {
            let block_in = maps;
            let mut main = Vec::new();
            for (i, (u, &at)) in b.main.iter().zip(&slots.main).enumerate() {
                let role = if i + 1 == b.main.len() {
                    BnOps::BnAddRelu
                } else {
                    BnOps::BnRelu
                };
                let unit = plan_unit(on, (u, role), (maps, at), &mut saved_at)?;
                let again = slots.recompute.as_ref().map(|r| r.main.get(i).copied());
                let unit = plan::recomputed_in(unit, again)?;
                maps = unit.output;
                main.push(unit);
            }
            let down = match (&b.down, slots.down) {
                (Some(u), Some(at)) => Some(plan::recomputed_in(
                    plan_unit(on, (u, BnOps::Bn), (block_in, at), &mut saved_at)?,
                    slots.recompute.as_ref().map(|r| r.down),
                )?),
                (None, None) => None,
                _ => {
                    return Err(Error::Failed(
                        "the maps' plan and the network disagree on a shortcut".into(),
                    ))
                }
            };
            let shortcut = down.as_ref().map_or(block_in, |d| d.output);
            if shortcut != maps || main.is_empty() || main.len() != b.main.len() {
                return Err(Error::Failed(format!(
                    "a residual block of {} units adds {shortcut:?} to {maps:?}",
                    main.len()
                )));
            }
            blocks.push(GpuBlock { main, down });
        }
        if blocks.len() != maps_plan.blocks.len() || pool.output != net.pooled {
            return Err(Error::Failed(
                "the maps' plan and the network disagree".into(),
            ));
        }
        let head = model.head();
        if head.0.inputs != maps.c || head.0.outputs != model.classes {
            return Err(Error::Failed(format!(
                "the head takes {} features to {} classes, the last block gives {}",
                head.0.inputs, head.0.outputs, maps.c
            )));
        }
        let units = || {
            std::iter::once(&stem).chain(
                blocks
                    .iter()
                    .flat_map(|b| b.main.iter().chain(b.down.as_ref())),
            )
        };
        // every distinct convolution's passes timed as PyTorch's cudnn.benchmark times them
        // (cuDNN's own search on buffers of its shapes): the fastest within the workspace limit
        // runs, not the heuristic's first guess
        let mut timed = std::collections::HashSet::new();
        for u in units() {
            if timed.insert(u.conv.conv()) {
                dnn.benchmark_conv_train(&u.conv)?;
            }
        }
        dnn.release_workspace();
        let products = time_filter_products(
            (&dnn, &blas, &ck, &gpu),
            units()
                .map(|u| u.conv.clone())
                .collect::<Vec<_>>()
                .into_iter(),
        )?;
        let (mut stem, mut blocks) = (stem, blocks);
        for u in std::iter::once(&mut stem).chain(
            blocks
                .iter_mut()
                .flat_map(|b| b.main.iter_mut().chain(b.down.as_mut())),
        ) {
            u.gemm_filter = products.get(&u.conv.conv()).copied().unwrap_or(false);
        }
        let units = || {
            std::iter::once(&stem).chain(
                blocks
                    .iter()
                    .flat_map(|b| b.main.iter().chain(b.down.as_ref())),
            )
        };
        let workspace_bytes = units()
            .map(|u| u.conv.workspace_bytes().max(u.bn.workspace_bytes()))
            .max()
            .unwrap_or(0);
        let params_layout = FlatLayout::new(device_lens(model, input));
        let stats_layout = FlatLayout::new(model.buffers.iter().map(|b| b.data.len()));
        let momentum = match opt.kind {
            OptimizerKind::Sgd => opt.momentum != 0.0,
            OptimizerKind::Adam | OptimizerKind::AdamW => true,
        };
        let moments = |on: bool| -> Result<Option<DeviceBuffer>> {
            Ok(if on {
                Some(gpu.alloc(params_layout.total * 4)?)
            } else {
                None
            })
        };
        let filters = filters_of(model, input);
        let stem_mask = match filters.get(model.stem().weight) {
            Some(Some(DeviceFilter::Blocks { k })) => Some(gpu.upload(bytes_of(&stem::mask(*k)))?),
            _ => None,
        };
        let (classes, features) = (model.classes, maps.c);
        let alloc = |bytes: usize| gpu.alloc(bytes.max(4));
        let half = if precision.half() {
            // the largest tensor whose gradient a 16-bit product makes: a filter or fc.weight
            let widest = units()
                .map(|u| u.conv.conv().shape.weight_len())
                .chain([head.0.inputs * head.0.outputs])
                .max()
                .unwrap_or(0);
            Some(Half {
                weights: alloc(params_layout.total * elem)?,
                grad: alloc(widest * elem)?,
            })
        } else {
            None
        };
        let mut net = GpuResNet {
            dnn,
            blas,
            k,
            ck,
            depth: model.depth,
            classes,
            batch,
            image,
            precision,
            batches_tracked: model.batches_tracked,
            names: model.params.iter().map(|p| p.name.clone()).collect(),
            filters,
            stem_mask,
            opt,
            smoothing: smoothing as f32,
            params: alloc(params_layout.total * 4)?,
            grads: alloc(params_layout.total * 4)?,
            half,
            m: moments(momentum)?,
            v: moments(opt.kind != OptimizerKind::Sgd)?,
            stats: alloc(stats_layout.total * 4)?,
            saved: alloc(saved_at * 4)?,
            state: alloc(STATE_BYTES)?,
            params_layout,
            stats_layout,
            stem,
            pool,
            pool_window: (
                model.pool().kernel,
                model.pool().stride,
                model.pool().padding,
            ),
            maps: alloc(maps_plan.total)?,
            maps_plan,
            blocks,
            head,
            input,
            last: maps,
            images: alloc(input.bytes())?,
            labels: alloc(batch * 4)?,
            features: alloc(batch * features * elem)?,
            logits: alloc(batch * classes * elem)?,
            dlogits: alloc(batch * classes * elem)?,
            dfeatures: alloc(batch * features * elem)?,
            loss: alloc(8)?,
            loss_rows: alloc(batch * 16)?,
            correct: alloc(4)?,
            workspace: alloc(workspace_bytes.max(256))?,
            uploaded: false,
            staging: None,
            resident: None,
            updates: 0,
            graph_on: false,
            graph_failed: None,
            graphs: [None, None, None],
            accumulate: 1,
            acc: None,
            last_micro: std::cell::Cell::new(true),
            dp: None,
            profile_at: None,
            recording: None,
            gpu,
        };
        net.load(model)?;
        Ok(net)
    }

    /// The algorithms cuDNN's heuristics gave each convolution, `name: forward / backward data /
    /// backward filter`, and each norm's kernels where they are not the bare SPATIAL ones
    /// (`[persistent, fused]`), for reports and for the first GPU run to check.
    /// Records update `at` (0-based) of the updates made through the stepper with a profiler.
    pub fn profile_update(&mut self, at: u64, discovery: &Discovery, timing: TimingChoice) {
        self.profile_at = Some((at, discovery.clone(), timing));
        self.recording = None;
    }

    /// The recording [`GpuResNet::profile_update`] asked for, once that update ran.
    pub fn take_recording(&mut self) -> Option<Recording> {
        self.recording.take()
    }

    pub fn conv_algorithms(&self) -> Vec<String> {
        use gpukit_cuda::dnn::Pass;
        self.units()
            .map(|u| {
                let names: Vec<String> = Pass::ALL
                    .iter()
                    .map(|&p| {
                        u.conv.chosen(p).map_or("?".into(), |c| {
                            format!("{}{}", c.name, if c.deterministic { "" } else { "*" })
                        })
                    })
                    .collect();
                let name = self.names.get(u.spec.weight).map_or("?", String::as_str);
                let norm = match (u.bn.mode, u.fused() && u.role != BnOps::Bn) {
                    (BnMode::Spatial, false) => "",
                    (BnMode::Spatial, true) => " [fused]",
                    (BnMode::SpatialPersistent, false) => " [persistent]",
                    (BnMode::SpatialPersistent, true) => " [persistent, fused]",
                };
                let filter = if u.gemm_filter {
                    " [filter gradient: cuBLAS]"
                } else {
                    ""
                };
                format!("{name}: {}{norm}{filter}", names.join(" / "))
            })
            .collect()
    }

    /// Runs each convolution pass with the algorithm `other` chose for the same unit (and its
    /// filter gradients where `other`'s do), so that two trainers of one network differ only in
    /// what is compared (tests of checkpointing: cuDNN's timed choice may differ between two
    /// plans, and 16-bit rounding through small batch norms then shows). An error when the
    /// networks' units or candidates differ.
    pub fn same_algorithms_as(&mut self, other: &GpuResNet) -> Result<()> {
        use gpukit_cuda::dnn::Pass;
        let theirs: Vec<(std::rc::Rc<gpukit_cuda::dnn::ConvTrain>, bool)> = other
            .units()
            .map(|u| (u.conv.clone(), u.gemm_filter))
            .collect();
        if theirs.len() != self.units().count() {
            return Err(Error::Failed("trainers of different networks".into()));
        }
        let mine = std::iter::once(&mut self.stem).chain(
            self.blocks
                .iter_mut()
                .flat_map(|b| b.main.iter_mut().chain(b.down.as_mut())),
        );
        for (u, (conv, gemm)) in mine.zip(theirs) {
            if u.conv.conv() != conv.conv() {
                return Err(Error::Failed(format!(
                    "units {:?} and {:?} differ",
                    u.conv.conv(),
                    conv.conv()
                )));
            }
            for pass in Pass::ALL {
                let name = conv.chosen(pass)?.name;
                let at = u
                    .conv
                    .candidates(pass)
                    .iter()
                    .position(|c| c.name == name)
                    .ok_or_else(|| {
                        Error::Failed(format!("{name} is not a candidate of {:?}", conv.conv()))
                    })?;
                u.conv.choose(pass, at)?;
            }
            u.gemm_filter = gemm;
        }
        let needed = self
            .units()
            .map(|u| u.conv.workspace_bytes().max(u.bn.workspace_bytes()))
            .max()
            .unwrap_or(0);
        if needed > self.workspace.len() {
            self.workspace = self.gpu.alloc(needed)?;
        }
        self.graphs = [None, None, None];
        Ok(())
    }

    fn units(&self) -> impl Iterator<Item = &GpuUnit> {
        std::iter::once(&self.stem).chain(
            self.blocks
                .iter()
                .flat_map(|b| b.main.iter().chain(b.down.as_ref())),
        )
    }

    /// The storage type of maps, their gradients and the products' inputs.
    fn dtype(&self) -> DType {
        self.input.dtype
    }

    fn param(&self, i: usize) -> Result<View<'_>> {
        f32_view(&self.params, &self.params_layout, i)
    }

    /// Parameter `i` as the products read it: the 16-bit copy, or the f32 master.
    fn weight(&self, i: usize) -> Result<View<'_>> {
        match &self.half {
            Some(h) => tensor_view(
                &h.weights,
                &self.params_layout,
                i,
                self.dtype().size_bytes(),
            ),
            None => self.param(i),
        }
    }

    fn grad(&self, i: usize) -> Result<View<'_>> {
        f32_view(&self.grads, &self.params_layout, i)
    }

    /// Where a product writes parameter `i`'s gradient: the 16-bit scratch (then
    /// [`GpuResNet::widen_grad`]), or the f32 gradient itself.
    fn product_grad(&self, i: usize) -> Result<View<'_>> {
        match &self.half {
            Some(h) => {
                let n = self.params_layout.range(i)?.1;
                Ok(h.grad.view().sub(0, n * self.dtype().size_bytes())?)
            }
            None => self.grad(i),
        }
    }

    /// Parameter `i`'s gradient, just made by a product: a 16-bit one widened into the f32
    /// gradients; the blocked stem's masked in any precision (its unused taps stay zero).
    fn widen_grad(&self, i: usize) -> Result<()> {
        let n = self.params_layout.range(i)?.1;
        if self.half.is_some() {
            self.k
                .widen(self.product_grad(i)?, self.grad(i)?, self.dtype(), n)?;
        }
        if let (Some(mask), Some(Some(DeviceFilter::Blocks { .. }))) =
            (&self.stem_mask, self.filters.get(i))
        {
            self.ck.mask_f32(self.grad(i)?, mask.view(), n)?;
        }
        Ok(())
    }

    /// A map or gradient of the arena.
    fn at(&self, s: memory::Slot) -> Result<View<'_>> {
        Ok(self.maps.view().sub(s.offset, s.bytes)?)
    }

    fn stat(&self, i: usize) -> Result<View<'_>> {
        f32_view(&self.stats, &self.stats_layout, i)
    }

    fn saved_stats(&self, u: &GpuUnit) -> Result<(View<'_>, View<'_>)> {
        let c = u.output.c * 4;
        let s = self.saved.view();
        Ok((s.sub(u.saved.0 * 4, c)?, s.sub(u.saved.1 * 4, c)?))
    }

    /// One update as [`super::train_step`] makes it: forward in training mode (the running
    /// statistics move), the smoothed cross-entropy, backward and the optimizer's step (fp16:
    /// skipped when a gradient overflowed). Returns the batch's loss before the update and how
    /// many images were classified right.
    pub fn train_step(&mut self, images: &Tensor<f32>, labels: &[u32]) -> Result<(f64, usize)> {
        self.upload(images, labels)?;
        self.step_uploaded()
    }

    /// Whether each residual block's maps but its output are recomputed in backward
    /// (activation checkpointing).
    pub fn checkpointed(&self) -> bool {
        self.maps_plan.blocks.iter().any(|b| b.recompute.is_some())
    }

    /// What this trainer allocated, part by part (bytes): for reports beside the pool's peak.
    pub fn memory_parts(&self) -> Vec<(String, u64)> {
        let len = |b: &DeviceBuffer| b.len() as u64;
        let opt = self.m.iter().chain(&self.v).map(len).sum::<u64>();
        let half = self
            .half
            .as_ref()
            .map_or(0, |h| len(&h.weights) + len(&h.grad));
        let reserve: u64 = self
            .units()
            .filter_map(|u| u.reserve.as_ref())
            .map(len)
            .sum();
        let plan = &self.maps_plan;
        let head = [
            &self.labels,
            &self.features,
            &self.logits,
            &self.dlogits,
            &self.dfeatures,
            &self.loss,
            &self.loss_rows,
            &self.correct,
            &self.state,
        ];
        vec![
            (
                format!(
                    "maps and their gradients, one plan{} (lower bound {}, each its own {})",
                    if self.checkpointed() {
                        ", blocks recomputed"
                    } else {
                        ""
                    },
                    plan.lower_bound,
                    plan.without_reuse
                ),
                len(&self.maps),
            ),
            (
                "f32 weights and gradients".into(),
                len(&self.params) + len(&self.grads),
            ),
            ("optimizer state".into(), opt),
            (
                "gradient accumulator".into(),
                self.acc.as_ref().map_or(0, len),
            ),
            ("16-bit weights and a gradient".into(), half),
            (
                "norm statistics and reserve".into(),
                len(&self.stats) + len(&self.saved) + reserve,
            ),
            ("images".into(), len(&self.images)),
            (
                "data set".into(),
                self.resident.as_ref().map_or(0, upload::Resident::bytes),
            ),
            (
                "labels, head and loss".into(),
                head.iter().map(|b| len(b)).sum(),
            ),
            ("convolution workspace".into(), len(&self.workspace)),
        ]
    }

    /// The most bytes the device's memory pool held for live buffers since this trainer began
    /// allocating (every buffer of the step comes from the pool; cuDNN's and cuBLAS's own
    /// handles do not).
    pub fn peak_bytes(&self) -> Result<u64> {
        Ok(self.gpu.pool_stats()?.used_high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every unit of ResNet-18 and -50 maps onto a cuDNN convolution whose output is the next
    /// unit's input, down to the head's features; a too-small image is refused by name.
    #[test]
    fn units_map_onto_convolutions_in_order() {
        for (depth, features) in [(Depth::ResNet18, 512), (Depth::ResNet50, 2048)] {
            let model = ResNet::<f32>::new(depth, 10, 1);
            let (conv, stem) =
                unit_shapes(model.stem(), Maps::nchw_f32(4, 3, 32, 32)).expect("stem");
            assert_eq!(
                (
                    conv.shape.r,
                    conv.shape.stride,
                    conv.shape.pad,
                    conv.shape.k
                ),
                (7, 2, 3, 64)
            );
            assert_eq!((stem.c, stem.h, stem.w), (64, 16, 16));
            let pool = model.pool();
            let mut maps = Maps {
                h: gpukit_cuda::dnn::pool_out(stem.h, pool.kernel, pool.stride, pool.padding),
                w: gpukit_cuda::dnn::pool_out(stem.w, pool.kernel, pool.stride, pool.padding),
                ..stem
            };
            assert_eq!((maps.h, maps.w), (8, 8));
            for b in model.blocks() {
                let input = maps;
                for u in &b.main {
                    maps = unit_shapes(u, maps).expect("main path").1;
                }
                let shortcut = match &b.down {
                    Some(d) => unit_shapes(d, input).expect("downsample").1,
                    None => input,
                };
                assert_eq!(shortcut, maps);
            }
            assert_eq!((maps.c, maps.h, maps.w), (features, 1, 1));
            assert_eq!(model.head().0.inputs, features);
        }
        let model = ResNet::<f32>::new(Depth::ResNet18, 10, 1);
        let e = unit_shapes(model.stem(), Maps::nchw_f32(1, 3, 0, 4))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("images too small"), "{e}");
        let e = unit_shapes(&model.blocks()[0].main[0], Maps::nchw_f32(1, 3, 8, 8))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("64 input channels given maps of 3"), "{e}");
    }

    /// fp32 and tf32 train NCHW f32 maps (tf32 multiplies them on tensor cores), bf16 and
    /// fp16 channels-last 16-bit ones (the images' 3 channels padded to 8, or in 2x2 blocks of
    /// 16 channels where the sizes are even).
    #[test]
    fn each_precision_has_its_maps() {
        let m = input_maps(Precision::Fp32, 2, (8, 9)).unwrap();
        assert_eq!(m, Maps::nchw_f32(2, 3, 8, 9));
        assert_eq!(input_maps(Precision::Tf32, 2, (8, 9)).unwrap(), m);
        for (p, dtype) in [
            (Precision::Bf16, DType::Bf16),
            (Precision::Fp16, DType::F16),
        ] {
            let m = input_maps(p, 2, (8, 9)).unwrap();
            assert_eq!(
                (m.layout, m.dtype, m.c, m.h, m.w),
                (Layout::Nhwc, dtype, 8, 8, 9)
            );
            let m = input_maps(p, 2, (224, 160)).unwrap();
            assert_eq!(
                (m.layout, m.dtype, m.c, m.h, m.w),
                (Layout::Nhwc, dtype, 16, 115, 83)
            );
        }
        let arithmetic = Precision::ALL.map(Precision::inputs);
        assert_eq!(
            arithmetic,
            [DType::F32, DType::Tf32, DType::F16, DType::Bf16],
            "{:?}",
            Precision::ALL
        );
    }

    /// Channel-last, only the stem's filter changes length: padded to 8 channels, or 4x4 taps
    /// of 16 channels over 2x2 blocks; the stem's unit over blocks is a 4x4 stride-1
    /// convolution of 16 channels with the stride-2 convolution's output.
    #[test]
    fn only_the_stems_filter_is_padded_on_the_device() {
        let model = ResNet::<f32>::new(Depth::ResNet50, 10, 3);
        let own: Vec<usize> = model.params.iter().map(|p| p.data.len()).collect();
        let on = |p, size| input_maps(p, 2, (size, size)).unwrap();
        assert_eq!(device_lens(&model, on(Precision::Fp32, 32)), own);
        let wide = device_lens(&model, on(Precision::Bf16, 31));
        assert_eq!(model.params[0].name, "conv1.weight");
        assert_eq!((own[0], wide[0]), (64 * 3 * 49, 64 * 8 * 49));
        assert_eq!(wide[1..], own[1..]);
        let blocks = device_lens(&model, on(Precision::Bf16, 32));
        assert_eq!(blocks[0], 64 * 16 * 16);
        assert_eq!(blocks[1..], own[1..]);
        let (conv, out) = unit_shapes(model.stem(), on(Precision::Bf16, 32)).unwrap();
        let s = conv.shape;
        assert_eq!((s.c, s.h, s.r, s.stride, s.pad), (16, 19, 4, 1, 0));
        let (_, plain) = unit_shapes(model.stem(), on(Precision::Fp32, 32)).unwrap();
        assert_eq!((out.c, out.h, out.w), (plain.c, plain.h, plain.w));
    }

    #[test]
    fn the_flat_layout_holds_the_parameters_in_order() {
        let model = ResNet::<f32>::new(Depth::ResNet18, 10, 3);
        let layout = FlatLayout::new(model.params.iter().map(|p| p.data.len()));
        assert_eq!(layout.len(), model.params.len());
        let flat = layout
            .pack(model.params.iter().map(|p| p.data.as_slice()))
            .unwrap();
        let back = layout.unpack(&flat).unwrap();
        for (p, b) in model.params.iter().zip(&back) {
            assert_eq!(&p.data, b, "{}", p.name);
        }
        let fc = model.head();
        assert_eq!(model.params[fc.1].name, "fc.weight");
        assert_eq!(model.params[fc.2].name, "fc.bias");
        assert_eq!(model.params[model.stem().weight].name, "conv1.weight");
        assert_eq!(model.buffers[model.stem().var].name, "bn1.running_var");
    }
}
