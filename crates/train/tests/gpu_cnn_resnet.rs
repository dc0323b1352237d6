//! A whole ResNet-18 trained on the GPU against the CPU engines (`gpukit_train::cnn`) from the
//! same initial weights and batches, on fresh seeds every run (printed): fp32 SGD and AdamW, each
//! update's loss against float64 at the GPU's own weights and the first move against float64's;
//! bf16, fp16 and tf32 against the fp32 GPU path at the same weights; fp16's overflow skip; updates
//! replayed from CUDA graphs against eager twins; checkpointed steps against twins that keep
//! every map; gradient accumulation against the CPU engine
//! and replayed; and a diagnostic of the first move's conditioning (run with `--ignored`). The parts are
//! `gpu_cnn.rs`. Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a missing
//! GPU a failure.

mod cnn_gpu_common;

use cnn_gpu_common::*;
use gpukit_tensor::random::{fresh_seed, normal_f32, uniform_f32};
use gpukit_train::cnn::gpu::GpuResNet;
use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
use gpukit_train::cnn::resnet::{Depth, ResNet};
use gpukit_train::cnn::{train_step, Tensor};
use gpukit_train::optim::OptimizerKind;
use gpukit_train::precision::Precision;
use libtest_mimic::Failed;

/// The batches of a training comparison: images (standard normal) and labels, seeded.
fn batches(
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

fn rel_f64(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}

/// The largest relative difference of two models' named tensors (each against the second's
/// largest magnitude), with the tensor's name; `base` subtracted from both first when given
/// (comparing updates rather than values).
fn worst(
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

fn named(t: &[gpukit_train::cnn::resnet::Named<f32>]) -> Vec<(String, Vec<f32>)> {
    t.iter().map(|n| (n.name.clone(), n.data.clone())).collect()
}

/// ResNet-18 on the GPU against the CPU engines: the same initial weights, batches and
/// optimizer for `steps` updates. Each update's GPU loss within 1e-5 of float64's at the GPU's
/// own weights; the first SGD move at a cosine above 1 - 1e-4 to float64's; the trajectories
/// (GPU, CPU f32, float64) printed. Then every parameter's total update (relative to its
/// largest element) and every running statistic printed against float64 beside `update_tol` /
/// 1e-4 (not judged: the trajectories have parted by then).
fn train_like_the_cpu(
    config: CnnOptimizerConfig,
    steps: usize,
    update_tol: f64,
) -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}, {config:?}");
    let (batch, size, classes, smoothing) = (8, 32, 10, 0.1);
    let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
    let mut cpu = init.clone();
    let mut cpu64 = ResNet::<f64>::new(Depth::ResNet18, classes, seed);
    cpu64.load(|name| init.tensor(name).map(|t| wide(&t.data)))?;
    let mut gpu_net = GpuResNet::new(
        d,
        g,
        &init,
        batch,
        (size, size),
        (Precision::Fp32, false),
        config,
        smoothing,
    )?;
    for line in gpu_net.conv_algorithms() {
        println!("  {line}");
    }
    let mut opt = CnnOptimizer::<f32>::new(config);
    let mut opt64 = CnnOptimizer::<f64>::new(config);
    for (s, (images, labels)) in batches(steps, batch, size, classes, seed)
        .iter()
        .enumerate()
    {
        // float64 at the GPU's weights before this update: the loss it must give (one forward
        // from identical weights is well conditioned, unlike two trajectories)
        let mut here = init.clone();
        gpu_net.store(&mut here)?;
        let mut same64 = cpu64.clone();
        same64.load(|name| here.tensor(name).map(|t| wide(&t.data)))?;
        let images64 = Tensor::from_vec(images.shape, wide(&images.data));
        let (l_same, _) = train_step(
            &mut same64,
            &mut CnnOptimizer::<f64>::new(config),
            &images64,
            labels,
            smoothing,
        );
        let (lg, cg) = gpu_net.train_step(images, labels)?;
        let (l32, c32) = train_step(&mut cpu, &mut opt, images, labels, smoothing);
        let (l64, _) = train_step(&mut cpu64, &mut opt64, &images64, labels, smoothing);
        let e_same = rel_f64(lg, l_same);
        let (e32, e_cpu, e64) = (rel_f64(lg, l32), rel_f64(l32, l64), rel_f64(lg, l64));
        println!(
            "  update {}: GPU {lg:.9} CPU f32 {l32:.9} f64 {l64:.9}: GPU-CPU {e32:.2e}, CPU-f64 {e_cpu:.2e}, GPU-f64 {e64:.2e}; f64 at the GPU's weights {l_same:.9} ({e_same:.2e}); right {cg}/{c32}",
            s + 1
        );
        check(
            &format!(
                "update {}: the GPU's loss against float64's at its weights",
                s + 1
            ),
            e_same,
            1e-5,
        )?;
        // the first update, from the same weights: the whole move's cosine with float64's
        // above 1 - 1e-4. Element by element both f32 engines part from float64 now and then
        // (a ReLU input within rounding of zero flips in one engine: the diagnostic test saw
        // the largest element error reach 5e-2 on the GPU and 8e-2 on the CPU in one seed of
        // four, at cosines of 1 - 1.4e-5 and 1 - 2.4e-5); a tensor's gradient gone wrong moves
        // the cosine by its share of the move. SGD only: Adam's first move is about lr times
        // the gradient's sign, which rounding flips where a gradient is near zero
        if s == 0 && config.kind == OptimizerKind::Sgd {
            let mut first = init.clone();
            gpu_net.store(&mut first)?;
            let moves = |m: &[gpukit_train::cnn::resnet::Named<f32>]| -> Vec<f64> {
                m.iter()
                    .zip(&init.params)
                    .flat_map(|(p, o)| {
                        p.data
                            .iter()
                            .zip(&o.data)
                            .map(|(&a, &b)| f64::from(a) - f64::from(b))
                    })
                    .collect()
            };
            let want: Vec<f64> = cpu64
                .params
                .iter()
                .zip(&init.params)
                .flat_map(|(p, o)| p.data.iter().zip(&o.data).map(|(&a, &b)| a - f64::from(b)))
                .collect();
            let cosine = |got: &[f64]| {
                let (mut d, mut a, mut b) = (0.0, 0.0, 0.0);
                for (x, y) in got.iter().zip(&want) {
                    d += x * y;
                    a += x * x;
                    b += y * y;
                }
                d / (a.sqrt() * b.sqrt()).max(1e-300)
            };
            let (c_gpu, c_cpu) = (cosine(&moves(&first.params)), cosine(&moves(&cpu.params)));
            println!(
                "  first update's move against float64's: cosine GPU 1 - {:.1e}, CPU f32 1 - {:.1e}",
                1.0 - c_gpu,
                1.0 - c_cpu
            );
            if c_gpu.partial_cmp(&(1.0 - 1e-4)) != Some(std::cmp::Ordering::Greater) {
                return Err(format!(
                    "first update: the GPU's move is at cosine 1 - {:.1e} to float64's (the CPU f32 \
                     engine's 1 - {:.1e})",
                    1.0 - c_gpu,
                    1.0 - c_cpu
                )
                .into());
            }
        }
    }
    let mut back = init.clone();
    gpu_net.store(&mut back)?;
    if back.batches_tracked != steps as u64 || cpu.batches_tracked != steps as u64 {
        return Err(format!(
            "batches tracked: GPU {}, CPU {}, {steps} steps",
            back.batches_tracked, cpu.batches_tracked
        )
        .into());
    }
    let mut gpu_opt = CnnOptimizer::<f32>::new(config);
    gpu_net.store_optimizer(&mut gpu_opt)?;
    if gpu_opt.step != steps as u64 {
        return Err(format!(
            "the GPU optimizer counted {} updates of {steps}",
            gpu_opt.step
        )
        .into());
    }
    // float64 judges: the GPU passes within the tolerance of it, or as close as the CPU's own
    // f32 engine (twice its distance: two f32 engines sum in different orders, and over a few
    // updates a ReLU that flips in one and not the other moves a layer's whole update)
    let to_f32 = |t: &[gpukit_train::cnn::resnet::Named<f64>]| -> Vec<(String, Vec<f32>)> {
        t.iter()
            .map(|n| (n.name.clone(), n.data.iter().map(|&v| v as f32).collect()))
            .collect()
    };
    let judged = |what: &str,
                  gpu: &[(String, Vec<f32>)],
                  cpu: &[(String, Vec<f32>)],
                  f64s: &[(String, Vec<f32>)],
                  base: Option<&[(String, Vec<f32>)]>,
                  tol: f64|
     -> Result<(), Failed> {
        let (e_gpu, name) = worst(gpu, f64s, base);
        let (e_cpu, name_cpu) = worst(cpu, f64s, base);
        let (e_pair, _) = worst(gpu, cpu, base);
        println!(
            "  {what}: GPU-f64 worst {e_gpu:.2e} ({name}); CPU f32-f64 worst {e_cpu:.2e} ({name_cpu}); GPU-CPU {e_pair:.2e}"
        );
        // after several updates the trajectories have parted (a ReLU flipped in one engine and
        // not another; run 94 measured the GPU 4.8e-2 and the CPU 1.2e-2 from float64 on one
        // seed, 2.4e-3 and 2.8e-3 on another): printed beside the tolerance, not judged; each
        // update's loss at the GPU's weights and the first move are judged above
        let within = e_gpu <= tol.max(4.0 * e_cpu);
        println!("    (tolerance {tol:.0e} or four times the CPU's: {within}; not judged)");
        Ok(())
    };
    let init_p = named(&init.params);
    judged(
        "parameter updates",
        &named(&back.params),
        &named(&cpu.params),
        &to_f32(&cpu64.params),
        Some(&init_p),
        update_tol,
    )?;
    judged(
        "running statistics",
        &named(&back.buffers),
        &named(&cpu.buffers),
        &to_f32(&cpu64.buffers),
        None,
        1e-4,
    )?;
    Ok(())
}

fn resnet18_sgd_trains_like_the_cpu() -> Result<(), Failed> {
    // DECISIONS 111's PyTorch comparison: at this rate the f32 engines stay within 1e-5 of
    // float64 over 5 updates at batch 8
    train_like_the_cpu(nesterov_sgd(), 5, 1e-3)
}

fn resnet18_adamw_trains_like_the_cpu() -> Result<(), Failed> {
    let config = CnnOptimizerConfig {
        kind: OptimizerKind::AdamW,
        lr: 1e-4,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.01,
    };
    // Adam's first steps are g / |g|: a near-zero gradient's rounding becomes a whole step, so
    // updates are compared loosely (DECISIONS 111: both f32 engines leave float64 by ~1e-5)
    train_like_the_cpu(config, 3, 5e-2)
}

/// Nesterov SGD as DECISIONS 111 compared with PyTorch (lr 1e-3, momentum 0.9, wd 5e-4).
fn nesterov_sgd() -> CnnOptimizerConfig {
    CnnOptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 1e-3,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 5e-4,
    }
}

/// The mixed-precision tolerance of the MLP path (`gpu_train.rs`,
/// `mixed_precision_trains_like_fp32`): a loss within 2% of fp32's.
const MIXED_LOSS_TOL: f64 = 0.02;

/// ResNet-18 (batch 8, 32x32, 10 classes, smoothing 0.1, Nesterov SGD) in `precision` against
/// the fp32 GPU path over 5 updates, the fp32 network rebuilt before each update from the mixed
/// run's master weights: every update's loss within [`MIXED_LOSS_TOL`] of fp32's at the same
/// weights and batch, and the first update (the same start) moving the parameters in fp32's
/// direction (cosine above 0.5), the running statistics within 5% (bf16) / 1% (fp16). No update
/// skipped (fp16 at a loss scale of 1024, which these gradients cannot overflow; its scale
/// unchanged after 5 clean updates). tf32's first loss must also differ from fp32's by more than
/// strict f32's rounding: its convolutions and products ran on tensor cores.
///
/// Two free-running trajectories are not compared: with batch norm over 8 images a rounding
/// difference flips ReLUs within a few updates, and the fp32 GPU and CPU engines part from
/// float64 the same way (`resnet18_sgd_trains_like_the_cpu`).
fn trains_like_fp32(precision: Precision) -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}, {}", precision.name());
    let (batch, size, classes, smoothing, steps) = (8, 32, 10, 0.1, 5);
    let config = nesterov_sgd();
    let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
    let make = |from: &ResNet<f32>, p| {
        GpuResNet::new(
            d,
            g.clone(),
            from,
            batch,
            (size, size),
            (p, false),
            config,
            smoothing,
        )
    };
    let mut half = make(&init, precision)?;
    if precision == Precision::Fp16 {
        half.set_loss_scale(1024.0)?;
    }
    for line in half.conv_algorithms() {
        println!("  {line}");
    }
    for (s, (images, labels)) in batches(steps, batch, size, classes, seed)
        .iter()
        .enumerate()
    {
        let mut here = init.clone();
        half.store(&mut here)?;
        let mut full = make(&here, Precision::Fp32)?;
        let (l32, c32) = full.train_step(images, labels)?;
        let (l16, c16) = half.train_step(images, labels)?;
        let e = rel_f64(l16, l32);
        println!(
            "  update {}: {} {l16:.6} fp32 {l32:.6} at the same weights ({e:.2e} apart); \
             right {c16}/{c32}",
            s + 1,
            precision.name()
        );
        // tf32 multiplies on tensor cores: its loss parts from strict f32's by its rounding
        // (a plan that stayed strict would agree to about 1e-7)
        if precision == Precision::Tf32
            && s == 0
            && e.partial_cmp(&1e-6) != Some(std::cmp::Ordering::Greater)
        {
            return Err(format!(
                "tf32's first loss {l16} is {e:.1e} from strict fp32's {l32}: its convolutions \
                 did not run on tensor cores"
            )
            .into());
        }
        if e.partial_cmp(&MIXED_LOSS_TOL) != Some(std::cmp::Ordering::Less) {
            return Err(format!(
                "update {}: {} loss {l16} against fp32 {l32} at the same weights ({e:.2e} \
                 apart, tolerance {MIXED_LOSS_TOL})",
                s + 1,
                precision.name()
            )
            .into());
        }
        if s > 0 {
            continue;
        }
        let (mut a, mut b) = (init.clone(), init.clone());
        half.store(&mut a)?;
        full.store(&mut b)?;
        let init_p = named(&init.params);
        // where the moves part, tensor by tensor (a rounding amplified by a norm spreads over
        // the tensors after it; a wrong gradient stands alone)
        let (ga, gb) = (named(&a.params), named(&b.params));
        for i in 0..ga.len() {
            let one = |v: &[(String, Vec<f32>)]| vec![v[i].clone()];
            let (e, name) = worst(&one(&ga), &one(&gb), Some(&one(&init_p)));
            if e > 0.02 {
                println!("    {name}: first move {e:.2e} from fp32's");
            }
        }
        // the whole first move's direction: a wrong or missing gradient turns it away from
        // fp32's; 16-bit rounding amplified by the ill-conditioned backward pass (the CPU's own
        // f32 moves part from float64's by up to 1e-1 of a tensor's largest) leaves it close
        let cosine = move_cosine(&ga, &gb, &init_p);
        println!("  first move's cosine with fp32's: {cosine:.4}");
        if cosine.partial_cmp(&0.5) != Some(std::cmp::Ordering::Greater) {
            return Err(format!(
                "the first update moved the parameters at cosine {cosine:.3} to fp32's move"
            )
            .into());
        }
        // a batch mean over 8 images of 16-bit maps cancels: bf16 rounds 8 times coarser than
        // fp16 (measured 2.2e-2 / 2.2e-3 of a tensor's largest)
        let stats_tol = match precision {
            Precision::Bf16 => 5e-2,
            _ => 1e-2,
        };
        let (e, name) = worst(&named(&a.buffers), &named(&b.buffers), None);
        check(
            &format!("running statistics after it against fp32 (worst: {name})"),
            e,
            stats_tol,
        )?;
    }
    let st = half.scaler()?;
    let scale_kept = precision != Precision::Fp16 || st.scale == 1024.0;
    if st.skipped != 0 || st.step != steps as u32 || !scale_kept {
        return Err(format!("after {steps} clean updates the step state is {st:?}").into());
    }
    Ok(())
}

/// After update `update` of two trainers from the same weights `here`: the move of `a` within
/// `cos_tol` of `b`'s direction (1 - cosine) and their running statistics within `stats_tol`
/// of a tensor's largest; `whose` names `b` in the messages.
fn moved_alike(
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

/// The cosine between two models' moves from `from` (every parameter as one vector).
fn move_cosine(
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

/// Steps replayed from one captured CUDA graph compute what eager steps compute: ResNet-18 in
/// fp32 and fp16 (whose loss scale lives in the graph's device state) trains 4 fresh batches
/// with graphs on (the first update eager and then captured, all later replayed); before
/// each, an eager twin is built from the graph net's weights, running statistics, optimizer
/// state and loss scale (fp16 from 1024, which these gradients do not overflow). Each
/// update's loss within 1e-5 (fp32; bit for bit where both plan the same algorithms) / 1e-2
/// (fp16) of the twin's, the same count right, the
/// move's cosine with the twin's above 1 - 1e-4 (fp32) / 0.9 (fp16), the running statistics
/// within 1e-4 / 1e-2 of a tensor's largest, and the step count advanced inside the graph.
fn graph_replay_matches_eager_steps() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let (batch, size, classes, smoothing, steps) = (8, 32, 10, 0.1, 4);
    let config = nesterov_sgd();
    let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
    for (precision, loss_tol, cos_tol, stats_tol) in [
        (Precision::Fp32, 1e-5, 1e-4, 1e-4),
        // the twin plans its own algorithms: fp16's sums may be ordered otherwise (2e-4 to 1e-3
        // apart by update 3, measured); a replay of stale weights or a lost update is 10% off
        (Precision::Fp16, 1e-2, 0.1, 1e-2),
    ] {
        let make = |from: &ResNet<f32>| {
            GpuResNet::new(
                d,
                g.clone(),
                from,
                batch,
                (size, size),
                (precision, false),
                config,
                smoothing,
            )
        };
        let mut replayed = make(&init)?;
        replayed.use_graph(true);
        if precision == Precision::Fp16 {
            // GradScaler's 65536 overflows these gradients (skipped updates move nothing)
            replayed.set_loss_scale(1024.0)?;
        }
        for (s, (images, labels)) in batches(steps, batch, size, classes, seed + 7)
            .iter()
            .enumerate()
        {
            let mut here = init.clone();
            replayed.store(&mut here)?;
            let mut twin = make(&here)?;
            let mut opt = CnnOptimizer::new(config);
            replayed.store_optimizer(&mut opt)?;
            twin.load_optimizer(&opt)?;
            if precision == Precision::Fp16 {
                let scale = replayed.scaler()?.scale;
                twin.set_loss_scale(scale)?;
            }
            let (le, ce) = twin.train_step(images, labels)?;
            let (lg, cg) = replayed.train_step(images, labels)?;
            let e = rel_f64(lg, le);
            println!(
                "  {} update {}: graph {lg:.6}, eager {le:.6} ({e:.2e}); right {cg}/{ce}; {}",
                precision.name(),
                s + 1,
                replayed.step_launch()
            );
            check(&format!("update {} loss", s + 1), e, loss_tol)?;
            if cg != ce {
                return Err(format!("update {}: {cg} right replayed, {ce} eager", s + 1).into());
            }
            let (skipped, twin_skipped) = (replayed.scaler()?.skipped, twin.scaler()?.skipped);
            if skipped != 0 || twin_skipped != 0 {
                return Err(format!(
                    "update {}: skipped {skipped} replayed, {twin_skipped} eager at scale 1024",
                    s + 1
                )
                .into());
            }
            moved_alike(
                (s + 1, "eager's"),
                (&init, &here),
                (&replayed, &twin),
                (cos_tol, stats_tol),
            )?;
        }
        if !replayed.step_launch().starts_with("CUDA graph") {
            return Err(format!("the steps ran {}", replayed.step_launch()).into());
        }
        let st = replayed.scaler()?;
        if st.step + st.skipped != steps as u32 {
            return Err(format!("after {steps} updates the step state is {st:?}").into());
        }
    }
    Ok(())
}

/// Activation checkpointing recomputes what the kept maps held: ResNet-18 fp32 and ResNet-50
/// bf16 (bottleneck blocks, cuDNN's fused 16-bit norms, the gathered strided shortcut) train 3
/// fresh batches checkpointed, with graphs on (the recomputation captured and replayed); before
/// each update a twin that keeps every map is built from the checkpointed net's weights,
/// running statistics and optimizer state, its convolutions on the checkpointed net's
/// algorithms (two timed plans may choose differently, and bf16 rounding through ResNet-50's
/// norms over 1x1 maps of 8 images moved a first loss by 3.6%). Each update's loss within 1e-5
/// (fp32) / 2e-2 (bf16) of the twin's, the move's cosine with the twin's above
/// 1 - 1e-4 / 0.9, and the running statistics within 1e-4 / 5e-2 of a tensor's largest: a
/// recomputation that moved them a second time is off by a tenth of the batch's statistics.
/// The checkpointed arena is the smaller.
fn checkpointed_steps_match_kept_maps() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let (batch, size, classes, smoothing, steps) = (8, 32, 10, 0.1, 3);
    let config = nesterov_sgd();
    for (depth, precision, loss_tol, cos_tol, stats_tol) in [
        (Depth::ResNet18, Precision::Fp32, 1e-5, 1e-4, 1e-4),
        (Depth::ResNet50, Precision::Bf16, 2e-2, 0.1, 5e-2),
    ] {
        let init = ResNet::<f32>::new(depth, classes, seed);
        let make = |from: &ResNet<f32>, checkpoint| {
            GpuResNet::new(
                d,
                g.clone(),
                from,
                batch,
                (size, size),
                (precision, checkpoint),
                config,
                smoothing,
            )
        };
        let mut ckpt = make(&init, true)?;
        ckpt.use_graph(true);
        if !ckpt.checkpointed() {
            return Err("a trainer asked to checkpoint keeps every map".into());
        }
        for (s, (images, labels)) in batches(steps, batch, size, classes, seed + 11)
            .iter()
            .enumerate()
        {
            let mut here = init.clone();
            ckpt.store(&mut here)?;
            let mut twin = make(&here, false)?;
            twin.same_algorithms_as(&ckpt)?;
            let mut opt = CnnOptimizer::new(config);
            ckpt.store_optimizer(&mut opt)?;
            twin.load_optimizer(&opt)?;
            if s == 0 {
                let arena = |n: &GpuResNet| n.memory_parts()[0].1;
                println!(
                    "  {} {}: maps arena {} MiB checkpointed, {} MiB kept",
                    depth.name(),
                    precision.name(),
                    arena(&ckpt) >> 20,
                    arena(&twin) >> 20
                );
                if arena(&ckpt) >= arena(&twin) {
                    return Err("checkpointing did not shrink the maps' arena".into());
                }
            }
            let (lk, ck) = twin.train_step(images, labels)?;
            let (lc, cc) = ckpt.train_step(images, labels)?;
            let e = rel_f64(lc, lk);
            println!(
                "  {} {} update {}: checkpointed {lc:.6}, kept {lk:.6} ({e:.2e}); right \
                 {cc}/{ck}; {}",
                depth.name(),
                precision.name(),
                s + 1,
                ckpt.step_launch()
            );
            check(&format!("update {} loss", s + 1), e, loss_tol)?;
            moved_alike(
                (s + 1, "the kept maps'"),
                (&init, &here),
                (&ckpt, &twin),
                (cos_tol, stats_tol),
            )?;
        }
        if !ckpt.step_launch().starts_with("CUDA graph") {
            return Err(format!("the checkpointed steps ran {}", ckpt.step_launch()).into());
        }
    }
    Ok(())
}

/// Gradient accumulation on the GPU against the CPU engine and against itself eager:
/// ResNet-18 fp32, updates of 2 micro-batches of 4 images (each loss over 2). The first update
/// (the same weights on both engines): each micro-batch's loss within 1e-5 of the CPU's and
/// the update's move at cosine above 1 - 1e-4 to the CPU's. Updates 2 and 3 replay the graphs
/// of the first and the last micro-batch; before each, an eager twin is built from the
/// graph net's weights, statistics and optimizer state: losses within 1e-5, moves at cosine
/// above 1 - 1e-4.
fn accumulated_updates_match_the_cpu_and_replay() -> Result<(), Failed> {
    use gpukit_train::cnn::run::{CpuResNet, Stepper};
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let (batch, size, classes, smoothing, k) = (4, 32, 10, 0.1, 2);
    let config = nesterov_sgd();
    let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
    let make = |from: &ResNet<f32>, graphs: bool| -> Result<GpuResNet, Failed> {
        let mut n = GpuResNet::new(
            d,
            g.clone(),
            from,
            batch,
            (size, size),
            (Precision::Fp32, false),
            config,
            smoothing,
        )?;
        n.use_graph(graphs);
        n.set_accumulate(k)?;
        Ok(n)
    };
    let data = batches(3 * k, batch, size, classes, seed + 11);
    let mut replayed = make(&init, true)?;
    let mut cpu = CpuResNet::new(init.clone(), CnnOptimizer::new(config), smoothing);
    for u in 0..3 {
        let mut here = init.clone();
        replayed.store(&mut here)?;
        let mut twin = make(&here, false)?;
        let mut opt = CnnOptimizer::new(config);
        replayed.store_optimizer(&mut opt)?;
        twin.load_optimizer(&opt)?;
        for i in 0..k {
            let (x, y) = &data[u * k + i];
            let (lg, _) = replayed.step((x, y), true, (i, k))?;
            let (lt, _) = twin.step((x, y), true, (i, k))?;
            check(
                &format!(
                    "update {} micro-batch {} loss, graph against eager",
                    u + 1,
                    i + 1
                ),
                rel_f64(lg, lt),
                1e-5,
            )?;
            if u == 0 {
                let (lc, _) = cpu.step((x, y), true, (i, k))?;
                check(
                    &format!("update 1 micro-batch {} loss against the CPU", i + 1),
                    rel_f64(lg, lc),
                    1e-5,
                )?;
            }
        }
        let (mut a, mut b) = (init.clone(), init.clone());
        replayed.store(&mut a)?;
        twin.store(&mut b)?;
        let from = named(&here.params);
        let cosine = move_cosine(&named(&a.params), &named(&b.params), &from);
        check(
            &format!("update {}: 1 - the move's cosine with eager's", u + 1),
            1.0 - cosine,
            1e-4,
        )?;
        if u == 0 {
            let cosine = move_cosine(&named(&a.params), &named(&cpu.model.params), &from);
            check(
                "update 1: 1 - the move's cosine with the CPU's",
                1.0 - cosine,
                1e-4,
            )?;
        }
    }
    println!("  {}", replayed.step_launch());
    if !replayed.step_launch().starts_with("CUDA graph") {
        return Err(format!("the micro-batches ran {}", replayed.step_launch()).into());
    }
    Ok(())
}

fn resnet18_bf16_trains_like_fp32() -> Result<(), Failed> {
    trains_like_fp32(Precision::Bf16)
}

fn resnet18_fp16_trains_like_fp32() -> Result<(), Failed> {
    trains_like_fp32(Precision::Fp16)
}

fn resnet18_tf32_trains_like_fp32() -> Result<(), Failed> {
    trains_like_fp32(Precision::Tf32)
}

/// fp16 at a loss scale of 2^24: the loss's gradient itself overflows fp16, so the update is
/// skipped (every parameter keeps its bits, the step count stays 0), the scale halves and the
/// skip is counted; the forward still ran (the running statistics moved, as PyTorch's do). Then
/// GradScaler's default 65536 on 3 fresh updates: the skips it makes are printed, not judged.
fn fp16_skips_an_overflowing_update() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let (batch, size, classes, smoothing) = (8, 32, 10, 0.1);
    let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
    let make = || {
        GpuResNet::new(
            d,
            g.clone(),
            &init,
            batch,
            (size, size),
            (Precision::Fp16, false),
            nesterov_sgd(),
            smoothing,
        )
    };
    let mut net = make()?;
    let huge = 16_777_216.0;
    net.set_loss_scale(huge)?;
    let data = batches(3, batch, size, classes, seed);
    let (loss, _) = net.train_step(&data[0].0, &data[0].1)?;
    let st = net.scaler()?;
    println!("  loss {loss:.6}, then {st:?}");
    if st.skipped != 1 || st.step != 0 || st.scale != huge / 2.0 || st.found_inf {
        return Err(format!("an overflow at scale 2^24 left the step state {st:?}").into());
    }
    let mut after = init.clone();
    net.store(&mut after)?;
    for (p, q) in after.params.iter().zip(&init.params) {
        if p.data != q.data {
            return Err(format!("{} changed in a skipped update", p.name).into());
        }
    }
    if after.batches_tracked != init.batches_tracked + 1 || after.buffers == init.buffers {
        return Err("the skipped update's forward did not move the running statistics".into());
    }
    let mut net = make()?;
    for (images, labels) in &data {
        net.train_step(images, labels)?;
    }
    println!("  GradScaler's defaults, 3 updates: {:?}", net.scaler()?);
    Ok(())
}

/// Diagnostic, run by name with `--ignored`: how far the first SGD update's moves of ResNet-18
/// lie from float64's, for the GPU and for the CPU's f32 engine, over fresh seeds and two image
/// sizes: per tensor the largest element error and the L2 error (each against that tensor's
/// float64 move; the worst tensor named), and the whole move's cosine with float64's. Judges
/// nothing: it tells an engine's error from the network's conditioning.
fn first_move_conditioning() -> Result<(), Failed> {
    let (d, g) = gpu()?;
    let config = nesterov_sgd();
    let (batch, classes, smoothing) = (8, 10, 0.1);
    for size in [32usize, 64] {
        for k in 0..4u64 {
            let seed = fresh_seed().wrapping_add(k);
            let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
            let mut cpu = init.clone();
            let mut cpu64 = ResNet::<f64>::new(Depth::ResNet18, classes, seed);
            cpu64.load(|name| init.tensor(name).map(|t| wide(&t.data)))?;
            let mut net = GpuResNet::new(
                d,
                g.clone(),
                &init,
                batch,
                (size, size),
                (Precision::Fp32, false),
                config,
                smoothing,
            )?;
            let (images, labels) = &batches(1, batch, size, classes, seed)[0];
            net.train_step(images, labels)?;
            train_step(
                &mut cpu,
                &mut CnnOptimizer::new(config),
                images,
                labels,
                smoothing,
            );
            let images64 = Tensor::from_vec(images.shape, wide(&images.data));
            let mut opt64 = CnnOptimizer::<f64>::new(config);
            train_step(&mut cpu64, &mut opt64, &images64, labels, smoothing);
            let mut on_gpu = init.clone();
            net.store(&mut on_gpu)?;
            let want: Vec<Vec<f64>> = cpu64
                .params
                .iter()
                .zip(&init.params)
                .map(|(p, o)| {
                    p.data
                        .iter()
                        .zip(&o.data)
                        .map(|(a, &b)| a - f64::from(b))
                        .collect()
                })
                .collect();
            let judge = |m: &ResNet<f32>| {
                let (mut max_e, mut l2_e, mut dot, mut na, mut nb) =
                    ((0.0, ""), (0.0, ""), 0.0, 0.0, 0.0);
                for ((p, o), w) in m.params.iter().zip(&init.params).zip(&want) {
                    let got: Vec<f64> = p
                        .data
                        .iter()
                        .zip(&o.data)
                        .map(|(&a, &b)| f64::from(a) - f64::from(b))
                        .collect();
                    let scale = w.iter().fold(0.0f64, |s, v| s.max(v.abs())).max(1e-300);
                    let (mut big, mut sq, mut wsq) = (0.0f64, 0.0, 0.0);
                    for (x, y) in got.iter().zip(w) {
                        big = big.max((x - y).abs());
                        sq += (x - y) * (x - y);
                        wsq += y * y;
                        dot += x * y;
                        na += x * x;
                        nb += y * y;
                    }
                    let (e1, e2) = (big / scale, (sq / wsq.max(1e-300)).sqrt());
                    if e1 > max_e.0 {
                        max_e = (e1, p.name.as_str());
                    }
                    if e2 > l2_e.0 {
                        l2_e = (e2, p.name.as_str());
                    }
                }
                format!(
                    "largest element {:.2e} ({}), L2 {:.2e} ({}), cosine 1 - {:.1e}",
                    max_e.0,
                    max_e.1,
                    l2_e.0,
                    l2_e.1,
                    1.0 - dot / (na.sqrt() * nb.sqrt()).max(1e-300)
                )
            };
            println!(
                "{size}x{size} seed {seed}:\n  GPU     {}\n  CPU f32 {}",
                judge(&on_gpu),
                judge(&cpu)
            );
        }
    }
    Ok(())
}

fn main() {
    run(
        vec![
            (
                "gpu_cnn_resnet::resnet18_sgd_trains_like_the_cpu",
                resnet18_sgd_trains_like_the_cpu,
            ),
            (
                "gpu_cnn_resnet::resnet18_adamw_trains_like_the_cpu",
                resnet18_adamw_trains_like_the_cpu,
            ),
            (
                "gpu_cnn_resnet::resnet18_bf16_trains_like_fp32",
                resnet18_bf16_trains_like_fp32,
            ),
            (
                "gpu_cnn_resnet::resnet18_fp16_trains_like_fp32",
                resnet18_fp16_trains_like_fp32,
            ),
            (
                "gpu_cnn_resnet::resnet18_tf32_trains_like_fp32",
                resnet18_tf32_trains_like_fp32,
            ),
            (
                "gpu_cnn_resnet::fp16_skips_an_overflowing_update",
                fp16_skips_an_overflowing_update,
            ),
            (
                "gpu_cnn_resnet::graph_replay_matches_eager_steps",
                graph_replay_matches_eager_steps,
            ),
            (
                "gpu_cnn_resnet::checkpointed_steps_match_kept_maps",
                checkpointed_steps_match_kept_maps,
            ),
            (
                "gpu_cnn_resnet::accumulated_updates_match_the_cpu_and_replay",
                accumulated_updates_match_the_cpu_and_replay,
            ),
        ],
        vec![(
            "gpu_cnn_resnet::diagnostic_first_move_conditioning",
            first_move_conditioning,
        )],
    );
}
