//! ResNets trained on the GPU, fp32 NCHW, mirroring [`ResNet`] (the same parameters in the same
//! order under the same names, loaded from a CPU model and read back into one): convolutions
//! forward, backward data and backward filter through cuDNN's legacy calls on its heuristic
//! choices, batch norm in training mode through cuDNN (batch statistics, running statistics
//! moved as PyTorch moves them), max pooling through cuDNN, ReLU and the residual add by a
//! small kernel ([`kernels`]) and ReLU's backward by the MLP engine's, global average pooling
//! by gpukit's kernels, the linear head through cuBLAS, the smoothed cross-entropy and the
//! optimizers (SGD with momentum, Nesterov and weight decay; AdamW) by the MLP engine's kernels
//! over one flat parameter buffer ([`layout`]).
//!
//! fp32 is true fp32: convolutions run with cuDNN's FMA math (no TF32) and the head's products
//! with cuBLAS's plain f32 compute type.
//!
//! To use: [`GpuResNet::new`] from a CPU model (its weights and running statistics are
//! uploaded), [`GpuResNet::train_step`] per batch, [`GpuResNet::store`] to read the model back.

pub mod kernels;
pub mod layout;
pub mod need;

use super::layers::Linear;
use super::optim::{CnnOptimizer, CnnOptimizerConfig};
use super::resnet::{Depth, ResNet, Unit};
use super::Tensor;
use crate::error::{Error, Result};
use crate::gpu::kernels::{AdamArgs, StepState, TrainKernels, STATE_BYTES};
use crate::optim::{OptimizerKind, BETA1, BETA2, EPS};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::dnn::{
    BatchNorm, BnBackward, BnForward, BnMode, BnOps, Conv, ConvTrain, Dnn, Maps, MaxPool,
};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu, View};
use gpukit_tensor::codec::{bytes_of, decode_f32};
use gpukit_types::{ConvShape, DType};
use kernels::CnnKernels;
use layout::{FlatLayout, ALIGN};
use std::rc::Rc;
use std::sync::Arc;

/// The element type of every buffer here.
const F32: DType = DType::F32;

/// The convolution of a unit over `input` maps, as cuDNN describes it (in the input's layout
/// and element type), and its output maps; an error when the input's channels are not the convolution's or the maps are
/// too small to leave one output position.
pub fn unit_shapes(unit: &Unit, input: Maps) -> Result<(Conv, Maps)> {
    let c = unit.conv;
    if input.c != c.in_channels {
        return Err(Error::Setting(format!(
            "a convolution of {} input channels given maps of {}",
            c.in_channels, input.c
        )));
    }
    let shape = ConvShape {
        n: input.n,
        c: c.in_channels,
        h: input.h,
        w: input.w,
        k: c.out_channels,
        r: c.kernel,
        s: c.kernel,
        stride: c.stride,
        pad: c.padding,
        groups: 1,
    };
    let (oh, ow) = shape.out_hw();
    if oh == 0 || ow == 0 {
        return Err(Error::Setting(format!(
            "images too small: a {k}x{k} convolution of stride {s} leaves no position of {}x{} maps",
            input.h,
            input.w,
            k = c.kernel,
            s = c.stride
        )));
    }
    let conv = Conv {
        shape,
        layout: input.layout,
        dtype: input.dtype,
    };
    let output = Maps {
        c: c.out_channels,
        h: oh,
        w: ow,
        ..input
    };
    Ok((conv, output))
}

/// One convolution and its batch norm on the GPU, with the buffers the step keeps.
struct GpuUnit {
    spec: Unit,
    conv: Rc<ConvTrain>,
    bn: BatchNorm,
    /// The maps it reads and writes.
    output: Maps,
    /// The convolution's output (the norm's input), kept for the norm's backward.
    conv_out: DeviceBuffer,
    /// The norm's output, after the ReLU or the residual add and ReLU that follow it.
    bn_out: DeviceBuffer,
    reserve: Option<DeviceBuffer>,
    /// Offsets (f32 elements) of the batch mean and inverse std in the saved-statistics buffer.
    saved: (usize, usize),
}

struct GpuBlock {
    main: Vec<GpuUnit>,
    down: Option<GpuUnit>,
}

/// Plans a unit over `input` and allocates its buffers; `saved_at` hands out its place in the
/// saved-statistics buffer.
fn plan_unit(
    dnn: &Dnn,
    gpu: &Gpu,
    spec: &Unit,
    input: Maps,
    saved_at: &mut usize,
) -> Result<GpuUnit> {
    let (conv, output) = unit_shapes(spec, input)?;
    let conv = dnn.plan_conv_train(conv)?;
    let bn = dnn.batch_norm(
        output,
        BnOps::Bn,
        BnMode::Spatial,
        (spec.bn.eps, spec.bn.momentum),
    )?;
    let c = output.c;
    let mean = *saved_at;
    let invstd = (mean + c).next_multiple_of(ALIGN);
    *saved_at = (invstd + c).next_multiple_of(ALIGN);
    let reserve = match bn.reserve_bytes() {
        0 => None,
        r => Some(gpu.alloc(r)?),
    };
    Ok(GpuUnit {
        spec: *spec,
        conv,
        output,
        conv_out: gpu.alloc(output.bytes())?,
        bn_out: gpu.alloc(output.bytes())?,
        reserve,
        saved: (mean, invstd),
        bn,
    })
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
    /// Training-mode forward passes so far (every norm's `num_batches_tracked`).
    pub batches_tracked: u64,
    names: Vec<String>,
    opt: CnnOptimizerConfig,
    smoothing: f32,
    params_layout: FlatLayout,
    stats_layout: FlatLayout,
    params: DeviceBuffer,
    grads: DeviceBuffer,
    m: Option<DeviceBuffer>,
    v: Option<DeviceBuffer>,
    stats: DeviceBuffer,
    saved: DeviceBuffer,
    state: DeviceBuffer,
    stem: GpuUnit,
    pool: MaxPool,
    pool_out: DeviceBuffer,
    blocks: Vec<GpuBlock>,
    head: (Linear, usize, usize),
    /// The last block's maps (the average pool's input).
    last: Maps,
    images: DeviceBuffer,
    labels: DeviceBuffer,
    features: DeviceBuffer,
    logits: DeviceBuffer,
    dlogits: DeviceBuffer,
    dfeatures: DeviceBuffer,
    loss: DeviceBuffer,
    correct: DeviceBuffer,
    /// Gradients of activations: three buffers, each as large as the largest map.
    scratch: [DeviceBuffer; 3],
    workspace: DeviceBuffer,
    /// Whether a batch is on the device.
    uploaded: bool,
}

impl super::run::Stepper for GpuResNet {
    fn step(&mut self, images: &Tensor<f32>, labels: &[u32], fresh: bool) -> Result<(f64, usize)> {
        if fresh || !self.uploaded {
            self.upload(images, labels)?;
        }
        self.step_uploaded()
    }
}

fn f32_view<'a>(buf: &'a DeviceBuffer, layout: &FlatLayout, i: usize) -> Result<View<'a>> {
    let (o, n) = layout.range(i)?;
    Ok(buf.view().sub(o * 4, n * 4)?)
}

impl GpuResNet {
    /// The GPU copy of `model` for batches of `batch` images of `image` (height, width), trained
    /// by `opt` with label smoothing `smoothing`: plans every convolution and norm, allocates
    /// every buffer and uploads the model (its optimizer starts fresh; see
    /// [`GpuResNet::load_optimizer`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        discovery: &Discovery,
        gpu: Arc<Gpu>,
        model: &ResNet<f32>,
        batch: usize,
        image: (usize, usize),
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
        gpu.reset_pool_peaks()?;
        let dnn = Dnn::new(discovery, &gpu)?;
        let blas = Blas::new(discovery, &gpu)?;
        let k = TrainKernels::new(discovery, &gpu)?;
        let ck = CnnKernels::new(discovery, &gpu)?;
        let mut saved_at = 0;
        let input = Maps::nchw_f32(batch, 3, image.0, image.1);
        let stem = plan_unit(&dnn, &gpu, model.stem(), input, &mut saved_at)?;
        let p = model.pool();
        let pool = dnn.max_pool(stem.output, p.kernel, p.stride, p.padding)?;
        let pool_out = gpu.alloc(pool.output.bytes())?;
        let mut maps = pool.output;
        let mut largest = stem.output.bytes().max(maps.bytes());
        let mut blocks = Vec::new();
        for b in model.blocks() {
            let block_in = maps;
            let mut main = Vec::new();
            for u in &b.main {
                let unit = plan_unit(&dnn, &gpu, u, maps, &mut saved_at)?;
                maps = unit.output;
                largest = largest.max(maps.bytes());
                main.push(unit);
            }
            let down = match &b.down {
                Some(u) => Some(plan_unit(&dnn, &gpu, u, block_in, &mut saved_at)?),
                None => None,
            };
            let shortcut = down.as_ref().map_or(block_in, |d| d.output);
            if shortcut != maps {
                return Err(Error::Failed(format!(
                    "a residual block adds {shortcut:?} to {maps:?}"
                )));
            }
            blocks.push(GpuBlock { main, down });
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
        let workspace_bytes = units()
            .map(|u| u.conv.workspace_bytes().max(u.bn.workspace_bytes()))
            .max()
            .unwrap_or(0);
        let params_layout = FlatLayout::new(model.params.iter().map(|p| p.data.len()));
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
        let (classes, features) = (model.classes, maps.c);
        let alloc = |bytes: usize| gpu.alloc(bytes.max(4));
        let mut net = GpuResNet {
            dnn,
            blas,
            k,
            ck,
            depth: model.depth,
            classes,
            batch,
            image,
            batches_tracked: model.batches_tracked,
            names: model.params.iter().map(|p| p.name.clone()).collect(),
            opt,
            smoothing: smoothing as f32,
            params: alloc(params_layout.total * 4)?,
            grads: alloc(params_layout.total * 4)?,
            m: moments(momentum)?,
            v: moments(opt.kind != OptimizerKind::Sgd)?,
            stats: alloc(stats_layout.total * 4)?,
            saved: alloc(saved_at * 4)?,
            state: alloc(STATE_BYTES)?,
            params_layout,
            stats_layout,
            stem,
            pool,
            pool_out,
            blocks,
            head,
            last: maps,
            images: alloc(input.bytes())?,
            labels: alloc(batch * 4)?,
            features: alloc(batch * features * 4)?,
            logits: alloc(batch * classes * 4)?,
            dlogits: alloc(batch * classes * 4)?,
            dfeatures: alloc(batch * features * 4)?,
            loss: alloc(8)?,
            correct: alloc(4)?,
            scratch: [alloc(largest)?, alloc(largest)?, alloc(largest)?],
            workspace: alloc(workspace_bytes.max(256))?,
            uploaded: false,
            gpu,
        };
        net.load(model)?;
        Ok(net)
    }

    /// The algorithms cuDNN's heuristics gave each convolution, `name: forward / backward data /
    /// backward filter`, for reports and for the first GPU run to check.
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
                format!("{name}: {}", names.join(" / "))
            })
            .collect()
    }

    fn units(&self) -> impl Iterator<Item = &GpuUnit> {
        std::iter::once(&self.stem).chain(
            self.blocks
                .iter()
                .flat_map(|b| b.main.iter().chain(b.down.as_ref())),
        )
    }

    fn param(&self, i: usize) -> Result<View<'_>> {
        f32_view(&self.params, &self.params_layout, i)
    }

    fn grad(&self, i: usize) -> Result<View<'_>> {
        f32_view(&self.grads, &self.params_layout, i)
    }

    fn stat(&self, i: usize) -> Result<View<'_>> {
        f32_view(&self.stats, &self.stats_layout, i)
    }

    fn saved_stats(&self, u: &GpuUnit) -> Result<(View<'_>, View<'_>)> {
        let c = u.output.c * 4;
        let s = self.saved.view();
        Ok((s.sub(u.saved.0 * 4, c)?, s.sub(u.saved.1 * 4, c)?))
    }

    /// Uploads the model's parameters, running statistics and batch count, and starts the
    /// optimizer afresh.
    pub fn load(&mut self, model: &ResNet<f32>) -> Result<()> {
        if model.depth != self.depth || model.classes != self.classes {
            return Err(Error::Setting(format!(
                "a {:?} of {} classes loaded into a GPU {:?} of {}",
                model.depth, model.classes, self.depth, self.classes
            )));
        }
        let g = &self.gpu;
        let params = self
            .params_layout
            .pack(model.params.iter().map(|p| p.data.as_slice()))?;
        g.upload_into(self.params.view(), bytes_of(&params))?;
        let stats = self
            .stats_layout
            .pack(model.buffers.iter().map(|b| b.data.as_slice()))?;
        g.upload_into(self.stats.view(), bytes_of(&stats))?;
        self.batches_tracked = model.batches_tracked;
        self.load_optimizer(&CnnOptimizer::new(self.opt))
    }

    /// Uploads an optimizer's state (its configuration must be this trainer's).
    pub fn load_optimizer(&mut self, opt: &CnnOptimizer<f32>) -> Result<()> {
        if opt.config != self.opt {
            return Err(Error::Setting(format!(
                "optimizer state of {:?} loaded into a trainer of {:?}",
                opt.config, self.opt
            )));
        }
        let g = &self.gpu;
        for (buf, saved) in [(&self.m, &opt.m), (&self.v, &opt.v)] {
            let Some(buf) = buf else { continue };
            let flat = if opt.step == 0 || saved.is_empty() {
                vec![0f32; self.params_layout.total]
            } else {
                self.params_layout.pack(saved.iter().map(Vec::as_slice))?
            };
            g.upload_into(buf.view(), bytes_of(&flat))?;
        }
        g.fill(self.grads.view(), 0)?;
        let t = (opt.step + 1) as f64;
        let st = StepState {
            scale: 1.0,
            step_size: (self.opt.lr / (1.0 - BETA1.powf(t))) as f32,
            bc2_sqrt: (1.0 - BETA2.powf(t)).sqrt() as f32,
            found_inf: false,
            step: u32::try_from(opt.step)
                .map_err(|_| Error::Failed("more than 2^32 updates".into()))?,
            growth: 0,
            skipped: 0,
        };
        g.upload_into(self.state.view(), &st.to_bytes())?;
        Ok(())
    }

    /// Reads the parameters, running statistics and batch count back into `model` (a model of
    /// this depth and class count).
    pub fn store(&self, model: &mut ResNet<f32>) -> Result<()> {
        if model.depth != self.depth || model.classes != self.classes {
            return Err(Error::Setting(format!(
                "a GPU {:?} of {} classes stored into a {:?} of {}",
                self.depth, self.classes, model.depth, model.classes
            )));
        }
        let g = &self.gpu;
        let params = self
            .params_layout
            .unpack(&decode_f32(&g.download(&self.params)?, F32))?;
        for (p, data) in model.params.iter_mut().zip(params) {
            p.data = data;
        }
        let stats = self
            .stats_layout
            .unpack(&decode_f32(&g.download(&self.stats)?, F32))?;
        for (b, data) in model.buffers.iter_mut().zip(stats) {
            b.data = data;
        }
        model.batches_tracked = self.batches_tracked;
        Ok(())
    }

    /// Reads the optimizer's state back (step count and moment buffers).
    pub fn store_optimizer(&self, opt: &mut CnnOptimizer<f32>) -> Result<()> {
        let g = &self.gpu;
        let st = StepState::from_bytes(&g.download(&self.state)?)?;
        opt.config = self.opt;
        opt.step = u64::from(st.step);
        let read = |buf: &Option<DeviceBuffer>| -> Result<Vec<Vec<f32>>> {
            match buf {
                Some(b) if st.step > 0 => {
                    self.params_layout.unpack(&decode_f32(&g.download(b)?, F32))
                }
                _ => Ok(Vec::new()),
            }
        };
        opt.m = read(&self.m)?;
        opt.v = read(&self.v)?;
        Ok(())
    }

    /// The gradients of the last step, in [`ResNet::params`] order.
    pub fn gradients(&self) -> Result<Vec<Vec<f32>>> {
        self.params_layout
            .unpack(&decode_f32(&self.gpu.download(&self.grads)?, F32))
    }

    /// One update as [`super::train_step`] makes it: forward in training mode (the running
    /// statistics move), the smoothed cross-entropy, backward and the optimizer's step. Returns
    /// the batch's loss before the update and how many images were classified right.
    pub fn train_step(&mut self, images: &Tensor<f32>, labels: &[u32]) -> Result<(f64, usize)> {
        self.upload(images, labels)?;
        self.step_uploaded()
    }

    /// Copies a batch to the device for the next [`GpuResNet::step_uploaded`]s, after checking
    /// its shape and labels.
    pub fn upload(&mut self, images: &Tensor<f32>, labels: &[u32]) -> Result<()> {
        let (h, w) = self.image;
        if images.shape != [self.batch, 3, h, w]
            || images.data.len() != images.shape.iter().product::<usize>()
        {
            return Err(Error::Setting(format!(
                "images of shape {:?}; this trainer takes {:?}",
                images.shape,
                [self.batch, 3, h, w]
            )));
        }
        if labels.len() != self.batch {
            return Err(Error::Setting(format!(
                "{} labels for a batch of {}",
                labels.len(),
                self.batch
            )));
        }
        if let Some(&bad) = labels.iter().find(|&&l| l as usize >= self.classes) {
            return Err(Error::Setting(format!(
                "label {bad} of {} classes",
                self.classes
            )));
        }
        let g = &self.gpu;
        g.upload_into(self.images.view(), bytes_of(&images.data))?;
        g.upload_into(self.labels.view(), bytes_of(labels))?;
        self.uploaded = true;
        Ok(())
    }

    /// One update on the batch last uploaded (see [`GpuResNet::train_step`]).
    pub fn step_uploaded(&mut self) -> Result<(f64, usize)> {
        if !self.uploaded {
            return Err(Error::Failed("a step before any batch was uploaded".into()));
        }
        let g = self.gpu.clone();
        self.forward()?;
        self.backward()?;
        self.update()?;
        self.batches_tracked += 1;
        let loss = g.download_from(self.loss.view(), 8)?;
        let correct = g.download_from(self.correct.view(), 4)?;
        let loss = f64::from_ne_bytes(
            loss.try_into()
                .map_err(|_| Error::Failed("the loss is not 8 bytes".into()))?,
        );
        let correct = u32::from_ne_bytes(
            correct
                .try_into()
                .map_err(|_| Error::Failed("the count is not 4 bytes".into()))?,
        );
        Ok((loss, correct as usize))
    }

    /// The most bytes the device's memory pool held for live buffers since this trainer began
    /// allocating (every buffer of the step comes from the pool; cuDNN's and cuBLAS's own
    /// handles do not).
    pub fn peak_bytes(&self) -> Result<u64> {
        Ok(self.gpu.pool_stats()?.used_high)
    }

    /// Convolution then training-mode batch norm of one unit from `x`.
    fn unit_forward(&self, u: &GpuUnit, x: View<'_>) -> Result<()> {
        let ws = self.workspace.view();
        self.dnn.conv_train_forward(
            &u.conv,
            x,
            self.param(u.spec.weight)?,
            u.conv_out.view(),
            ws,
        )?;
        let (saved_mean, saved_invstd) = self.saved_stats(u)?;
        let args = BnForward {
            x: u.conv_out.view(),
            z: None,
            y: u.bn_out.view(),
            gamma: self.param(u.spec.gamma)?,
            beta: self.param(u.spec.beta)?,
            running_mean: self.stat(u.spec.mean)?,
            running_var: self.stat(u.spec.var)?,
            saved_mean,
            saved_invstd,
        };
        self.dnn
            .bn_forward_training(&u.bn, &args, ws, u.reserve.as_ref().map(|r| r.view()))?;
        Ok(())
    }

    /// Backward through one unit from the gradient of its norm's output in `dy`: the norm's
    /// gradients, the convolution's filter gradient and (into `dx`, added to what it holds
    /// when `accumulate`) its input's; `tmp` holds the norm's input gradient.
    fn unit_backward(
        &self,
        u: &GpuUnit,
        x: View<'_>,
        (dy, tmp, dx): (View<'_>, View<'_>, Option<View<'_>>),
        accumulate: bool,
    ) -> Result<()> {
        let ws = self.workspace.view();
        let (saved_mean, saved_invstd) = self.saved_stats(u)?;
        let args = BnBackward {
            x: u.conv_out.view(),
            y: None,
            dy,
            dz: None,
            dx: tmp,
            gamma: self.param(u.spec.gamma)?,
            beta: self.param(u.spec.beta)?,
            dgamma: self.grad(u.spec.gamma)?,
            dbeta: self.grad(u.spec.beta)?,
            saved_mean,
            saved_invstd,
        };
        self.dnn.bn_backward(
            &u.bn,
            &args,
            ws,
            u.reserve.as_ref().map(|r| r.view()),
            false,
        )?;
        let weight = self.param(u.spec.weight)?;
        if let Some(dx) = dx {
            self.dnn
                .conv_backward_data(&u.conv, (weight, tmp, dx), ws, accumulate)?;
        }
        self.dnn
            .conv_backward_filter(&u.conv, (x, tmp, self.grad(u.spec.weight)?), ws, false)?;
        Ok(())
    }

    fn forward(&self) -> Result<()> {
        let stem = &self.stem;
        self.unit_forward(stem, self.images.view())?;
        self.ck
            .add_relu(stem.bn_out.view(), None, F32, stem.output.elements())?;
        self.dnn
            .max_pool_forward(&self.pool, stem.bn_out.view(), self.pool_out.view())?;
        let mut x = self.pool_out.view();
        for b in &self.blocks {
            let mut src = x;
            for (i, u) in b.main.iter().enumerate() {
                self.unit_forward(u, src)?;
                if i + 1 < b.main.len() {
                    self.ck
                        .add_relu(u.bn_out.view(), None, F32, u.output.elements())?;
                }
                src = u.bn_out.view();
            }
            let shortcut = match &b.down {
                Some(d) => {
                    self.unit_forward(d, x)?;
                    d.bn_out.view()
                }
                None => x,
            };
            let last = b
                .main
                .last()
                .ok_or_else(|| Error::Failed("a residual block without units".into()))?;
            self.ck.add_relu(
                last.bn_out.view(),
                Some(shortcut),
                F32,
                last.output.elements(),
            )?;
            x = last.bn_out.view();
        }
        let (fc, w, bias) = self.head;
        let (n, c) = (self.batch, self.last.c);
        let plane = self.last.h * self.last.w;
        self.ck
            .avg_pool(x, self.features.view(), F32, (n * c, plane))?;
        self.blas.gemm_batched(
            F32,
            (self.features.view(), self.param(w)?, self.logits.view()),
            (1, n, fc.outputs, fc.inputs),
            (false, true),
        )?;
        self.k.bias_act(
            self.logits.view(),
            self.param(bias)?,
            F32,
            (fc.outputs, n),
            false,
        )?;
        self.k.cross_entropy(
            self.logits.view(),
            self.labels.view(),
            Some(self.dlogits.view()),
            F32,
            (n, fc.outputs),
            None,
            (1.0, self.smoothing),
            self.loss.view(),
            self.correct.view(),
        )?;
        Ok(())
    }

    fn backward(&self) -> Result<()> {
        let (fc, w, bias) = self.head;
        let (n, c) = (self.batch, self.last.c);
        self.blas.gemm_batched(
            F32,
            (self.dlogits.view(), self.features.view(), self.grad(w)?),
            (1, fc.outputs, fc.inputs, n),
            (true, false),
        )?;
        self.k.bias_grad(
            self.dlogits.view(),
            self.grad(bias)?,
            F32,
            (fc.outputs, n),
            0.0,
        )?;
        self.blas.gemm_batched(
            F32,
            (self.dlogits.view(), self.param(w)?, self.dfeatures.view()),
            (1, n, fc.inputs, fc.outputs),
            (false, false),
        )?;
        let s = |i: usize| self.scratch[i].view();
        // o: the gradient of the current block's output; p, q: the other two
        let mut o = 0;
        self.ck.avg_pool_back(
            self.dfeatures.view(),
            s(o),
            F32,
            (n * c, self.last.h * self.last.w),
        )?;
        let pool_out = self.pool_out.view();
        for (bi, b) in self.blocks.iter().enumerate().rev() {
            let (p, q) = ((o + 1) % 3, (o + 2) % 3);
            let block_in = match bi {
                0 => pool_out,
                _ => self.blocks[bi - 1]
                    .main
                    .last()
                    .ok_or_else(|| Error::Failed("a residual block without units".into()))?
                    .bn_out
                    .view(),
            };
            let count = b.main.len();
            let last = b
                .main
                .last()
                .ok_or_else(|| Error::Failed("a residual block without units".into()))?;
            let out_elements = last.output.elements();
            self.k
                .relu_grad(s(o), last.bn_out.view(), F32, out_elements)?;
            for (i, u) in b.main.iter().enumerate().rev() {
                let dy = if i + 1 == count {
                    s(o)
                } else {
                    // the ReLU after unit i made unit i + 1's input
                    self.k
                        .relu_grad(s(q), u.bn_out.view(), F32, u.output.elements())?;
                    s(q)
                };
                let x = if i == 0 {
                    block_in
                } else {
                    b.main[i - 1].bn_out.view()
                };
                self.unit_backward(u, x, (dy, s(p), Some(s(q))), false)?;
            }
            match &b.down {
                Some(d) => self.unit_backward(d, block_in, (s(o), s(p), Some(s(q))), true)?,
                None => self.k.axpy(s(q), s(o), out_elements)?,
            }
            o = q;
        }
        let (p, q) = ((o + 1) % 3, (o + 2) % 3);
        let stem = &self.stem;
        self.dnn
            .max_pool_backward(&self.pool, (stem.bn_out.view(), pool_out), s(o), s(p))?;
        self.k
            .relu_grad(s(p), stem.bn_out.view(), F32, stem.output.elements())?;
        self.unit_backward(stem, self.images.view(), (s(p), s(q), None), false)?;
        Ok(())
    }

    /// The optimizer's step over every parameter at once, then the step count.
    fn update(&self) -> Result<()> {
        let c = self.opt;
        let n = self.params_layout.total;
        let (p, g, st) = (self.params.view(), self.grads.view(), self.state.view());
        match c.kind {
            OptimizerKind::Sgd => self.k.sgd(
                (p, g, self.m.as_ref().map(|m| m.view())),
                None,
                F32,
                n,
                st,
                (
                    c.lr as f32,
                    c.weight_decay as f32,
                    c.momentum as f32,
                    c.nesterov,
                ),
                false,
            )?,
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                let (Some(m), Some(v)) = (&self.m, &self.v) else {
                    return Err(Error::Failed("AdamW without its moments".into()));
                };
                self.k.adam(
                    (p, g, m.view(), v.view()),
                    None,
                    F32,
                    n,
                    st,
                    AdamArgs {
                        weight_decay: c.weight_decay as f32,
                        decay: (1.0 - c.lr * c.weight_decay) as f32,
                        beta1: BETA1,
                        beta2: BETA2,
                        eps: EPS as f32,
                        adamw: c.kind == OptimizerKind::AdamW,
                    },
                    false,
                )?
            }
        }
        self.k
            .advance(st, false, (c.lr, BETA1, BETA2), crate::gpu::GROWTH_INTERVAL)?;
        Ok(())
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

    /// The flat parameter layout follows the CPU model's parameter order, so tensor i of the
    /// GPU buffer is `params[i]` by name.
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
