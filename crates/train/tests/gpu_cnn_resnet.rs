//! A whole ResNet trained on the GPU against the CPU engines (`gpukit_train::cnn`) from the
//! same initial weights and batches, on fresh seeds every run (printed): fp32 SGD and AdamW, each
//! update's loss against float64 at the GPU's own weights and the first move against float64's;
//! gradient accumulation against the CPU engine and replayed; and a diagnostic of the first
//! move's conditioning (run with `--ignored`). The GPU trainer's modes against itself are
//! `gpu_cnn_modes.rs`, the parts `gpu_cnn.rs`. Ignored, with the reason, without a GPU;
//! GPUKIT_REQUIRE_GPU=1 makes a missing GPU a failure.

mod cnn_gpu_common;

use cnn_gpu_common::resnet::*;
use cnn_gpu_common::*;
use gpukit_tensor::random::fresh_seed;
use gpukit_train::cnn::gpu::GpuResNet;
use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
use gpukit_train::cnn::resnet::{Depth, ResNet};
use gpukit_train::cnn::run::Batch;
use gpukit_train::cnn::{train_step, Tensor};
use gpukit_train::optim::OptimizerKind;
use gpukit_train::precision::Precision;
use libtest_mimic::Failed;

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
            let (lg, _) = replayed.step(Batch::of(x, y), true, (i, k))?;
            let (lt, _) = twin.step(Batch::of(x, y), true, (i, k))?;
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
                let (lc, _) = cpu.step(Batch::of(x, y), true, (i, k))?;
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
