//! What the whole-network GPU tests share (`gpu_cnn_resnet.rs`, `gpu_cnn_modes.rs`): seeded
//! batches, relative differences of named tensors, the cosine of two moves, the optimizer they
//! train with, and twins of a trainer built from its state.

use super::{check, rel};
use gpukit_tensor::random::{normal_f32, uniform_f32};
use gpukit_train::cnn::gpu::GpuResNet;
use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
use gpukit_train::cnn::resnet::ResNet;
use gpukit_train::cnn::Tensor;
use gpukit_train::optim::OptimizerKind;
use libtest_mimic::Failed;

/// The batches of a training comparison: images (standard normal) and labels, seeded.
pub fn batches(
    steps: usize,
    batch: usize,
    size: usize,
    classes: usize,
    seed: u64,
) -> Vec<(Tensor<f32>, Vec<u32>)> {
    (0..steps as u64)
        .map(|s| {
            let images = Tensor::from_vec(
                [batch, 3, size, size],
                normal_f32(batch * 3 * size * size, seed + 100 * s),
            );
            let labels = uniform_f32(batch, seed + 100 * s + 1)
                .iter()
                .map(|v| (((v + 1.0) * 0.5 * classes as f32) as u32).min(classes as u32 - 1))
                .collect();
            (images, labels)
        })
        .collect()
}

pub fn rel_f64(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}

/// The largest relative difference of two models' named tensors (each against the second's
/// largest magnitude), with the tensor's name; `base` subtracted from both first when given
/// (comparing updates rather than values).
pub fn worst(
    got: &[(String, Vec<f32>)],
    want: &[(String, Vec<f32>)],
    base: Option<&[(String, Vec<f32>)]>,
) -> (f64, String) {
    let mut out = (0.0, String::new());
    for (i, ((name, g), (_, w))) in got.iter().zip(want).enumerate() {
        let b = base.map(|b| &b[i].1);
        let minus = |v: &[f32]| -> Vec<f64> {
            v.iter()
                .enumerate()
                .map(|(j, &x)| f64::from(x) - b.map_or(0.0, |b| f64::from(b[j])))
                .collect()
        };
        let (gd, wd) = (minus(g), minus(w));
        let gd32: Vec<f32> = gd.iter().map(|&v| v as f32).collect();
        let e = rel(&gd32, &wd);
        if e > out.0 || !e.is_finite() {
            out = (e, name.clone());
        }
    }
    out
}

pub fn named(t: &[gpukit_train::cnn::resnet::Named<f32>]) -> Vec<(String, Vec<f32>)> {
    t.iter().map(|n| (n.name.clone(), n.data.clone())).collect()
}

/// Nesterov SGD as DECISIONS 111 compared with PyTorch (lr 1e-3, momentum 0.9, wd 5e-4).
pub fn nesterov_sgd() -> CnnOptimizerConfig {
    CnnOptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 1e-3,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 5e-4,
    }
}

/// The cosine between two models' moves from `from` (every parameter as one vector).
pub fn move_cosine(
    a: &[(String, Vec<f32>)],
    b: &[(String, Vec<f32>)],
    from: &[(String, Vec<f32>)],
) -> f64 {
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for ((x, y), z) in a.iter().zip(b).zip(from) {
        for ((&p, &q), &o) in x.1.iter().zip(&y.1).zip(&z.1) {
            let (u, v) = (f64::from(p) - f64::from(o), f64::from(q) - f64::from(o));
            dot += u * v;
            na += u * u;
            nb += v * v;
        }
    }
    dot / (na.sqrt() * nb.sqrt()).max(1e-300)
}

/// After update `update` of two trainers from the same weights `here`: the move of `a` within
/// `cos_tol` of `b`'s direction (1 - cosine) and their running statistics within `stats_tol`
/// of a tensor's largest; `whose` names `b` in the messages.
pub fn moved_alike(
    (update, whose): (usize, &str),
    (init, here): (&ResNet<f32>, &ResNet<f32>),
    (a, b): (&GpuResNet, &GpuResNet),
    (cos_tol, stats_tol): (f64, f64),
) -> Result<(), Failed> {
    let (mut ma, mut mb) = (init.clone(), init.clone());
    a.store(&mut ma)?;
    b.store(&mut mb)?;
    let cosine = move_cosine(&named(&ma.params), &named(&mb.params), &named(&here.params));
    check(
        &format!("update {update}: 1 - the move's cosine with {whose}"),
        1.0 - cosine,
        cos_tol,
    )?;
    let (e, name) = worst(&named(&ma.buffers), &named(&mb.buffers), None);
    check(
        &format!("update {update}: running statistics (worst: {name})"),
        e,
        stats_tol,
    )
}

/// A twin of `net` (which started from `init`): the trainer `make` builds from `net`'s weights
/// and running statistics, returned beside them, with `net`'s optimizer state (`config`'s
/// rule) loaded.
pub fn twin_of(
    net: &GpuResNet,
    init: &ResNet<f32>,
    config: CnnOptimizerConfig,
    make: impl FnOnce(&ResNet<f32>) -> gpukit_train::Result<GpuResNet>,
) -> Result<(ResNet<f32>, GpuResNet), Failed> {
    let mut here = init.clone();
    net.store(&mut here)?;
    let mut twin = make(&here)?;
    let mut opt = CnnOptimizer::new(config);
    net.store_optimizer(&mut opt)?;
    twin.load_optimizer(&opt)?;
    Ok((here, twin))
}
