//! ResNet-18, -34 and -50 as torchvision builds them (`torchvision.models.resnet18` ...):
//! a stem (7x7/2 convolution, batch norm, ReLU, 3x3/2 max pool), four stages of BasicBlocks
//! (18, 34) or Bottlenecks (50: 1x1, 3x3 carrying the stride, 1x1 expanding by 4, "v1.5"),
//! a 1x1 convolution + batch norm downsampling the shortcut where the shape changes, global
//! average pooling and a linear head. Parameters and buffers carry torchvision's state-dict
//! names (`conv1.weight`, `bn1.running_mean`, `layer1.0.conv1.weight`,
//! `layer1.0.downsample.0.weight`, `fc.bias`, ...). Any image size the stem and stages leave at
//! least one position of, any number of classes.

use super::layers::{
    add_inplace, avgpool_backward, avgpool_forward, relu_backward, relu_inplace, BatchNorm2d,
    BnCache, Conv2d, Linear, MaxPool2d,
};
use super::Tensor;
use crate::error::{Error, Result};
use crate::real::Real;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// Which network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    ResNet18,
    ResNet34,
    ResNet50,
}

impl Depth {
    /// Every network, smallest first.
    pub const ALL: [Depth; 3] = [Depth::ResNet18, Depth::ResNet34, Depth::ResNet50];

    /// torchvision's name of the network (`resnet50`).
    pub fn name(self) -> &'static str {
        match self {
            Depth::ResNet18 => "resnet18",
            Depth::ResNet34 => "resnet34",
            Depth::ResNet50 => "resnet50",
        }
    }

    /// The depth of torchvision's name (`resnet18`, `resnet34`, `resnet50`; any case, a dash
    /// allowed).
    pub fn parse(name: &str) -> Result<Depth> {
        let wanted = name.to_ascii_lowercase().replace('-', "");
        Depth::ALL
            .into_iter()
            .find(|d| d.name() == wanted)
            .ok_or_else(|| {
                Error::Setting(format!(
                    "--model {name:?}: not a known network (resnet18, resnet34, resnet50)"
                ))
            })
    }

    /// Blocks a stage.
    fn blocks(self) -> [usize; 4] {
        match self {
            Depth::ResNet18 => [2, 2, 2, 2],
            Depth::ResNet34 | Depth::ResNet50 => [3, 4, 6, 3],
        }
    }

    fn bottleneck(self) -> bool {
        self == Depth::ResNet50
    }
}

/// A named tensor: a parameter or a buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Named<T> {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// A convolution followed by its batch norm: indices of the conv weight, the norm's weight
/// and bias in the parameters, and its running mean and variance in the buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unit {
    pub conv: Conv2d,
    pub bn: BatchNorm2d,
    pub weight: usize,
    pub gamma: usize,
    pub beta: usize,
    pub mean: usize,
    pub var: usize,
}

/// A residual block: its main path (ReLU after every unit but the last), the shortcut's
/// downsampling unit if any, then add and ReLU.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub main: Vec<Unit>,
    pub down: Option<Unit>,
}

/// Whether batch norm uses the batch's statistics (and moves its running ones) or the
/// running ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Train,
    Eval,
}

/// A ResNet and its state.
#[derive(Debug, Clone)]
pub struct ResNet<T> {
    pub depth: Depth,
    pub classes: usize,
    /// Trainable tensors, in torchvision's state-dict order.
    pub params: Vec<Named<T>>,
    /// Batch norms' running means and variances, in state-dict order.
    pub buffers: Vec<Named<T>>,
    /// Training-mode forward passes so far: every norm's `num_batches_tracked`.
    pub batches_tracked: u64,
    stem: Unit,
    pool: MaxPool2d,
    blocks: Vec<Block>,
    fc: Linear,
    fc_weight: usize,
    fc_bias: usize,
}

/// What one unit's forward keeps: its input and the norm's cache.
#[derive(Debug, Clone)]
struct UnitCache<T> {
    input: Tensor<T>,
    bn: BnCache<T>,
}

#[derive(Debug, Clone)]
struct BlockCache<T> {
    main: Vec<UnitCache<T>>,
    down: Option<UnitCache<T>>,
    /// The block's output (after its last ReLU).
    out: Tensor<T>,
}

/// What a training forward keeps for backward.
#[derive(Debug, Clone)]
pub struct Tape<T> {
    stem: UnitCache<T>,
    /// The stem's ReLU output (the pool's input).
    stem_out: Tensor<T>,
    pool_arg: Vec<u32>,
    pool_out_shape: [usize; 4],
    blocks: Vec<BlockCache<T>>,
    /// Pooled features, n x channels.
    features: Vec<T>,
}

/// Builds the names and shapes (with what initialises each) while indices are handed out.
struct Builder<T> {
    params: Vec<Named<T>>,
    buffers: Vec<Named<T>>,
    rng: ChaCha8Rng,
}

impl<T: Real> Builder<T> {
    fn param(&mut self, name: String, shape: Vec<usize>, data: Vec<T>) -> usize {
        self.params.push(Named { name, shape, data });
        self.params.len() - 1
    }

    fn buffer(&mut self, name: String, channels: usize, value: f64) -> usize {
        self.buffers.push(Named {
            name,
            shape: vec![channels],
            data: vec![T::from_f64(value); channels],
        });
        self.buffers.len() - 1
    }

    /// Conv `conv_name` and norm `bn_name`: the weight from kaiming_normal_(fan_out, relu)
    /// as torchvision initialises it, the norm's weight 1 and bias 0, running mean 0 and
    /// variance 1.
    fn unit(&mut self, conv: Conv2d, conv_name: &str, bn_name: &str) -> Unit {
        let fan_out = conv.out_channels * conv.kernel * conv.kernel;
        let normal = Normal::new(0.0, (2.0 / fan_out as f64).sqrt()).expect("a finite std");
        let w: Vec<T> = (0..conv.weight_len())
            .map(|_| T::from_f64(normal.sample(&mut self.rng)))
            .collect();
        let k = conv.kernel;
        let shape = vec![conv.out_channels, conv.in_channels, k, k];
        let c = conv.out_channels;
        Unit {
            conv,
            bn: BatchNorm2d::new(c),
            weight: self.param(format!("{conv_name}.weight"), shape, w),
            gamma: self.param(
                format!("{bn_name}.weight"),
                vec![c],
                vec![T::from_f64(1.0); c],
            ),
            beta: self.param(format!("{bn_name}.bias"), vec![c], vec![T::ZERO; c]),
            mean: self.buffer(format!("{bn_name}.running_mean"), c, 0.0),
            var: self.buffer(format!("{bn_name}.running_var"), c, 1.0),
        }
    }
}

fn conv(in_channels: usize, out_channels: usize, kernel: usize, stride: usize) -> Conv2d {
    Conv2d {
        in_channels,
        out_channels,
        kernel,
        stride,
        padding: kernel / 2,
    }
}

impl<T: Real> ResNet<T> {
    /// The network with `classes` outputs, initialised as torchvision does (convolutions
    /// kaiming-normal by fan-out, norms 1 and 0, the head uniform in +-1/sqrt(inputs)) from a
    /// seeded ChaCha8 stream; [`ResNet::load`] takes PyTorch's own values.
    pub fn new(depth: Depth, classes: usize, seed: u64) -> ResNet<T> {
        let mut b = Builder {
            params: Vec::new(),
            buffers: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
        };
        let stem = b.unit(conv(3, 64, 7, 2), "conv1", "bn1");
        let expansion = if depth.bottleneck() { 4 } else { 1 };
        let mut blocks = Vec::new();
        let mut inplanes = 64;
        for (s, &count) in depth.blocks().iter().enumerate() {
            let planes = 64 << s;
            for i in 0..count {
                let stride = if s > 0 && i == 0 { 2 } else { 1 };
                let p = format!("layer{}.{i}", s + 1);
                let main = if depth.bottleneck() {
                    vec![
                        b.unit(
                            conv(inplanes, planes, 1, 1),
                            &format!("{p}.conv1"),
                            &format!("{p}.bn1"),
                        ),
                        b.unit(
                            conv(planes, planes, 3, stride),
                            &format!("{p}.conv2"),
                            &format!("{p}.bn2"),
                        ),
                        b.unit(
                            conv(planes, planes * 4, 1, 1),
                            &format!("{p}.conv3"),
                            &format!("{p}.bn3"),
                        ),
                    ]
                } else {
                    vec![
                        b.unit(
                            conv(inplanes, planes, 3, stride),
                            &format!("{p}.conv1"),
                            &format!("{p}.bn1"),
                        ),
                        b.unit(
                            conv(planes, planes, 3, 1),
                            &format!("{p}.conv2"),
                            &format!("{p}.bn2"),
                        ),
                    ]
                };
                let down = (stride != 1 || inplanes != planes * expansion).then(|| {
                    b.unit(
                        conv(inplanes, planes * expansion, 1, stride),
                        &format!("{p}.downsample.0"),
                        &format!("{p}.downsample.1"),
                    )
                });
                blocks.push(Block { main, down });
                inplanes = planes * expansion;
            }
        }
        let fc = Linear {
            inputs: inplanes,
            outputs: classes,
        };
        let bound = 1.0 / (inplanes as f64).sqrt();
        let mut uniform = |n: usize| -> Vec<T> {
            (0..n)
                .map(|_| T::from_f64(b.rng.random_range(-bound..bound)))
                .collect()
        };
        let (w, bias) = (uniform(classes * inplanes), uniform(classes));
        let fc_weight = b.param("fc.weight".into(), vec![classes, inplanes], w);
        let fc_bias = b.param("fc.bias".into(), vec![classes], bias);
        ResNet {
            depth,
            classes,
            params: b.params,
            buffers: b.buffers,
            batches_tracked: 0,
            stem,
            pool: MaxPool2d {
                kernel: 3,
                stride: 2,
                padding: 1,
            },
            blocks,
            fc,
            fc_weight,
            fc_bias,
        }
    }

    /// The stem's convolution and norm (a ReLU and [`ResNet::pool`] follow).
    pub fn stem(&self) -> &Unit {
        &self.stem
    }

    /// The stem's max pooling.
    pub fn pool(&self) -> MaxPool2d {
        self.pool
    }

    /// The residual blocks in order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The linear head and the indices of its weight and bias in [`ResNet::params`].
    pub fn head(&self) -> (Linear, usize, usize) {
        (self.fc, self.fc_weight, self.fc_bias)
    }

    /// Zeros shaped like every parameter, in [`ResNet::params`] order.
    pub fn zero_grads(&self) -> Vec<Vec<T>> {
        self.params
            .iter()
            .map(|p| vec![T::ZERO; p.data.len()])
            .collect()
    }

    /// Parameter count.
    pub fn parameter_count(&self) -> usize {
        self.params.iter().map(|p| p.data.len()).sum()
    }

    /// The parameter or buffer of a state-dict name.
    pub fn tensor(&self, name: &str) -> Option<&Named<T>> {
        self.params
            .iter()
            .chain(&self.buffers)
            .find(|t| t.name == name)
    }

    /// Sets every parameter and buffer from `get(name, shape)` (e.g. a torchvision state
    /// dict), refusing a missing tensor or one of another size.
    pub fn load(&mut self, mut get: impl FnMut(&str) -> Option<Vec<T>>) -> Result<()> {
        for t in self.params.iter_mut().chain(self.buffers.iter_mut()) {
            let data = get(&t.name)
                .ok_or_else(|| Error::Setting(format!("the state dict has no {}", t.name)))?;
            if data.len() != t.data.len() {
                return Err(Error::Setting(format!(
                    "{}: {} values where {:?} needs {}",
                    t.name,
                    data.len(),
                    t.shape,
                    t.data.len()
                )));
            }
            t.data = data;
        }
        Ok(())
    }

    fn unit_forward(
        &mut self,
        u: &Unit,
        x: &Tensor<T>,
        mode: Mode,
    ) -> (Tensor<T>, Option<BnCache<T>>) {
        let y = u.conv.forward(&self.params[u.weight].data, x);
        let (gamma, beta) = (&self.params[u.gamma].data, &self.params[u.beta].data);
        match mode {
            Mode::Train => {
                let (lo, hi) = self.buffers.split_at_mut(u.var);
                let (y, cache) =
                    u.bn.forward_train((gamma, beta), (&mut lo[u.mean].data, &mut hi[0].data), &y);
                (y, Some(cache))
            }
            Mode::Eval => (
                u.bn.forward_eval(
                    (gamma, beta),
                    (&self.buffers[u.mean].data, &self.buffers[u.var].data),
                    &y,
                ),
                None,
            ),
        }
    }

    /// Logits (n x classes) of a batch of images (n, 3, h, w), in `mode`; in training mode
    /// also what backward needs, and the running statistics move.
    pub fn forward(&mut self, x: &Tensor<T>, mode: Mode) -> (Vec<T>, Option<Tape<T>>) {
        assert_eq!(x.shape[1], 3, "images have 3 channels");
        if mode == Mode::Train {
            self.batches_tracked += 1;
        }
        let train = mode == Mode::Train;
        let keep = |t: &Tensor<T>| {
            if train {
                t.clone()
            } else {
                Tensor::zeros([0; 4])
            }
        };
        let stem = self.stem;
        let (mut h, bn) = self.unit_forward(&stem, x, mode);
        relu_inplace(&mut h);
        let stem_cache = bn.map(|bn| UnitCache {
            input: x.clone(),
            bn,
        });
        let (pooled, pool_arg) = self.pool.forward(&h);
        let stem_out = keep(&h);
        let pool_out_shape = pooled.shape;
        let mut h = pooled;
        let mut caches = Vec::new();
        let blocks = std::mem::take(&mut self.blocks);
        for block in &blocks {
            let input = h;
            let mut main = Vec::new();
            let mut cur = keep(&input);
            let mut y = Tensor::zeros([0; 4]);
            for (i, u) in block.main.iter().enumerate() {
                let src = if i == 0 { &input } else { &y };
                let (mut out, bn) = self.unit_forward(u, src, mode);
                if i + 1 < block.main.len() {
                    relu_inplace(&mut out);
                }
                if let Some(bn) = bn {
                    main.push(UnitCache { input: cur, bn });
                }
                cur = keep(&out);
                y = out;
            }
            let mut down = None;
            match &block.down {
                Some(u) => {
                    let (shortcut, bn) = self.unit_forward(u, &input, mode);
                    add_inplace(&mut y, &shortcut);
                    down = bn.map(|bn| UnitCache {
                        input: keep(&input),
                        bn,
                    });
                }
                None => add_inplace(&mut y, &input),
            }
            relu_inplace(&mut y);
            if train {
                caches.push(BlockCache {
                    main,
                    down,
                    out: y.clone(),
                });
            }
            h = y;
        }
        self.blocks = blocks;
        let features = avgpool_forward(&h);
        let logits = self.fc.forward(
            (
                &self.params[self.fc_weight].data,
                &self.params[self.fc_bias].data,
            ),
            &features,
        );
        let tape = stem_cache.map(|stem| Tape {
            stem,
            stem_out,
            pool_arg,
            pool_out_shape,
            blocks: caches,
            features,
        });
        (logits, tape)
    }

    /// Backward through one unit from the gradient of its norm's output.
    fn unit_backward(
        &self,
        u: &Unit,
        cache: &UnitCache<T>,
        dy: &Tensor<T>,
        grads: &mut [Vec<T>],
        need_dx: bool,
    ) -> Option<Tensor<T>> {
        let (dgamma, dbeta) = two_mut(grads, u.gamma, u.beta);
        let d =
            u.bn.backward(&self.params[u.gamma].data, &cache.bn, dy, (dgamma, dbeta));
        u.conv.backward(
            &self.params[u.weight].data,
            &cache.input,
            &d,
            &mut grads[u.weight],
            need_dx,
        )
    }

    /// Adds every parameter's gradient of the loss whose gradient with respect to the
    /// logits is `dlogits` to `grads` ([`ResNet::params`] order).
    pub fn backward(&self, tape: &Tape<T>, dlogits: &[T], grads: &mut [Vec<T>]) {
        let (dw, db) = two_mut(grads, self.fc_weight, self.fc_bias);
        let dfeat = self.fc.backward(
            &self.params[self.fc_weight].data,
            &tape.features,
            dlogits,
            (dw, db),
        );
        let last_shape = tape
            .blocks
            .last()
            .map_or(tape.pool_out_shape, |b| b.out.shape);
        let mut d = avgpool_backward(last_shape, &dfeat);
        for (block, cache) in self.blocks.iter().zip(&tape.blocks).rev() {
            relu_backward(&cache.out, &mut d);
            let shortcut = match (&block.down, &cache.down) {
                (Some(u), Some(c)) => self
                    .unit_backward(u, c, &d, grads, true)
                    .expect("asked for dx"),
                _ => d.clone(),
            };
            let count = block.main.len();
            for (i, (u, c)) in block.main.iter().zip(&cache.main).enumerate().rev() {
                if i + 1 < count {
                    // the ReLU after unit i made unit i + 1's input
                    relu_backward(&cache.main[i + 1].input, &mut d);
                }
                d = self
                    .unit_backward(u, c, &d, grads, true)
                    .expect("asked for dx");
            }
            add_inplace(&mut d, &shortcut);
        }
        let mut d = self.pool.backward(tape.stem_out.shape, &tape.pool_arg, &d);
        relu_backward(&tape.stem_out, &mut d);
        self.unit_backward(&self.stem, &tape.stem, &d, grads, false);
    }
}

/// Two distinct elements of a slice, both mutable.
fn two_mut<T>(v: &mut [Vec<T>], a: usize, b: usize) -> (&mut [T], &mut [T]) {
    assert!(a < b, "two_mut wants a before b");
    let (lo, hi) = v.split_at_mut(b);
    (&mut lo[a], &mut hi[0])
}
