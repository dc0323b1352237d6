//! The GPU trainer of a whole ResNet against itself, on fresh seeds every run (printed): bf16,
//! fp16 and tf32 against the fp32 GPU path at the same weights; fp16's overflow skip; updates
//! replayed from CUDA graphs against eager twins; checkpointed steps against twins that keep
//! every map. Against the CPU engines: `gpu_cnn_resnet.rs`. Ignored, with the reason, without a
//! GPU; GPUKIT_REQUIRE_GPU=1 makes a missing GPU a failure.

mod cnn_gpu_common;

use cnn_gpu_common::resnet::*;
use cnn_gpu_common::*;
use gpukit_tensor::random::fresh_seed;
use gpukit_train::cnn::gpu::GpuResNet;
use gpukit_train::cnn::resnet::{Depth, ResNet};
use gpukit_train::precision::Precision;
use libtest_mimic::Failed;

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
            let (here, mut twin) = twin_of(&replayed, &init, config, make)?;
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
            let (here, mut twin) = twin_of(&ckpt, &init, config, |w| make(w, false))?;
            twin.same_algorithms_as(&ckpt)?;
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

/// A data set kept on the GPU feeds the network the bytes a host batch does: ResNet-18 (batch
/// 8, 32x32, 10 classes) over 6 updates of a 40-image data set (fresh batches in the loop's
/// seeded order, an epoch and a part), fp32 (NCHW) and bf16 (the stem's channel-last blocks).
/// One network trains from the data set kept on the GPU, then, reloaded with the same weights
/// and a fresh optimizer, from host batches; at lr 1e-12 the weights stay where they were (each
/// loss is its batch's forward pass alone), so every update's loss and right answers must be
/// equal bit for bit, and differ from batch to batch.
fn resident_data_feeds_the_host_batches_bytes() -> Result<(), Failed> {
    use gpukit_train::cnn::optim::{CnnOptimizer, CnnOptimizerConfig};
    use gpukit_train::cnn::run::{self, LoopConfig};
    use gpukit_train::optim::OptimizerKind;
    let (d, g) = gpu()?;
    let seed = fresh_seed();
    println!("seed {seed}");
    let (batch, size, classes) = (8, 32, 10);
    let config = CnnOptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr: 1e-12,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let init = ResNet::<f32>::new(Depth::ResNet18, classes, seed);
    let data = gpukit_train::cnn::data::generated(40, (size, size), classes, seed + 1)?;
    let cfg = LoopConfig {
        batch_size: batch,
        steps: 6,
        accumulate: 1,
        seed: seed + 2,
    };
    for precision in [Precision::Fp32, Precision::Bf16] {
        let name = precision.name();
        let mut net = GpuResNet::new(
            d,
            g.clone(),
            &init,
            batch,
            (size, size),
            (precision, false),
            config,
            0.0,
        )?;
        if let Some(why) = net.keep_data(&data, 0.25)? {
            return Err(format!("{name}: the data set stayed on the host: {why}").into());
        }
        let kept = run::train(&mut net, &data, &cfg, &mut |_| {})?;
        net.forget_data();
        net.load(&init)?;
        net.load_optimizer(&CnnOptimizer::new(config))?;
        let host = run::train(&mut net, &data, &cfg, &mut |_| {})?;
        let pairs: Vec<_> = kept.updates.iter().zip(&host.updates).collect();
        for (k, h) in &pairs {
            println!(
                "  {name} update {}: kept {:.9} ({:.3}), host {:.9} ({:.3})",
                k.step, k.loss, k.accuracy, h.loss, h.accuracy
            );
        }
        if pairs.len() != 6
            || pairs
                .iter()
                .any(|(k, h)| k.loss != h.loss || k.accuracy != h.accuracy)
        {
            return Err(
                format!("{name}: the kept data set's updates differ from the host's").into(),
            );
        }
        if kept.updates.windows(2).any(|w| w[0].loss == w[1].loss) {
            return Err(format!(
                "{name}: two updates in a row had the same loss: not fresh batches"
            )
            .into());
        }
    }
    Ok(())
}

fn main() {
    run(
        vec![
            (
                "gpu_cnn_modes::resnet18_bf16_trains_like_fp32",
                resnet18_bf16_trains_like_fp32,
            ),
            (
                "gpu_cnn_modes::resnet18_fp16_trains_like_fp32",
                resnet18_fp16_trains_like_fp32,
            ),
            (
                "gpu_cnn_modes::resnet18_tf32_trains_like_fp32",
                resnet18_tf32_trains_like_fp32,
            ),
            (
                "gpu_cnn_modes::fp16_skips_an_overflowing_update",
                fp16_skips_an_overflowing_update,
            ),
            (
                "gpu_cnn_modes::graph_replay_matches_eager_steps",
                graph_replay_matches_eager_steps,
            ),
            (
                "gpu_cnn_modes::checkpointed_steps_match_kept_maps",
                checkpointed_steps_match_kept_maps,
            ),
            (
                "gpu_cnn_modes::resident_data_feeds_the_host_batches_bytes",
                resident_data_feeds_the_host_batches_bytes,
            ),
        ],
        vec![],
    );
}
