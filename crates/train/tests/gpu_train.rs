//! The GPU training engine against the CPU engine on fresh random models and data: per-update
//! losses and final weights (fused epilogues and gpukit's own epilogue kernels, every loss,
//! optimizer and accumulation), the loaders and graph replay bit for bit, resuming bit for
//! bit (fp16's scaler state included), mixed precision training like fp32, and fp16 surviving
//! overflowing gradients. Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a
//! missing GPU a failure.

use gpukit_cuda::loader::Discovery;
use gpukit_cuda::Gpu;
use gpukit_tensor::random::fresh_seed;
use gpukit_train::checkpoint::Position;
use gpukit_train::data::{self, Dataset, Targets};
use gpukit_train::gpu::feed::Loader;
use gpukit_train::gpu::{GpuOptions, GpuTrainer, Precision};
use gpukit_train::loss::LossKind;
use gpukit_train::model::Mlp;
use gpukit_train::optim::{Optimizer, OptimizerConfig, OptimizerKind};
use gpukit_train::run::{train_cpu, RunOutcome, TrainConfig};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::{Arc, OnceLock};

#[path = "gpu_train/parallel.rs"]
mod parallel;

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();
static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
/// One test at a time on the shared GPU stream: a graph capture in one test and work queued
/// by another would invalidate the capture.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gpu() -> Result<(&'static Discovery, Arc<Gpu>), Failed> {
    let d = DISCOVERY.get().ok_or("no discovery")?;
    if GPU.get().is_none() {
        let _ = GPU.set(Arc::new(Gpu::open(d, 0)?));
    }
    Ok((d, GPU.get().ok_or("no GPU")?.clone()))
}

/// Ends the test process naming the case when a multi-GPU case runs past `limit` (a case takes
/// seconds): a rank left in a collective whose peer failed would otherwise hang the run
/// without a word. Dropped when the case ends.
struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

impl Watchdog {
    fn new(case: String, limit: std::time::Duration) -> Watchdog {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "{case}: still running after {} s: the test process stops here (a rank hung)",
                    limit.as_secs()
                );
                std::process::exit(101);
            }
        });
        Watchdog(Some(tx))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // the sender gone wakes the watch, which then ends quietly
        self.0.take();
    }
}

fn config(widths: &[usize], loss: LossKind, kind: OptimizerKind, batch: usize) -> TrainConfig {
    TrainConfig {
        widths: widths.to_vec(),
        loss,
        optimizer: OptimizerConfig {
            kind,
            lr: if kind == OptimizerKind::Sgd {
                0.05
            } else {
                1e-3
            },
            momentum: if kind == OptimizerKind::Sgd { 0.9 } else { 0.0 },
            weight_decay: 0.01,
        },
        batch_size: batch,
        epochs: 2,
        seed: 7,
        shuffle: true,
        accumulate: 1,
        max_steps: None,
        checkpoint_activations: false,
    }
}

fn dataset(cfg: &TrainConfig, samples: usize, seed: u64) -> Dataset {
    let f = cfg.widths[0];
    match cfg.loss {
        LossKind::Mse => data::regression_preset(samples, f, seed),
        LossKind::CrossEntropy => data::classification_preset(samples, f, seed),
    }
}

struct GpuRun {
    outcome: RunOutcome,
    model: Mlp<f32>,
    opt: Optimizer<f32>,
    skipped: u64,
    scale: Option<(f64, u64)>,
}

fn run_gpu(
    cfg: &TrainConfig,
    opts: GpuOptions,
    data: &Dataset,
    model: &Mlp<f32>,
) -> Result<GpuRun, Failed> {
    let (d, g) = gpu()?;
    let mut t = GpuTrainer::new(d, g, cfg, opts, data.clone(), None)?;
    let mut model = model.clone();
    let mut opt = Optimizer::new(cfg.optimizer);
    t.load(&model, &opt, None)?;
    let (outcome, details) = t.run(Position::default(), &mut |_| {})?;
    t.store(&mut model, &mut opt)?;
    Ok(GpuRun {
        outcome,
        model,
        opt,
        skipped: details.skipped_updates,
        scale: details.scaler,
    })
}

fn run_cpu(
    cfg: &TrainConfig,
    data: &Dataset,
    model: &Mlp<f32>,
) -> Result<(RunOutcome, Mlp<f32>), Failed> {
    let mut model = model.clone();
    let mut opt = Optimizer::new(cfg.optimizer);
    let out = train_cpu(
        cfg,
        &mut model,
        &mut opt,
        Position::default(),
        data,
        None,
        &mut |_| {},
    )?;
    Ok((out, model))
}

/// `got`'s per-update losses against `want`'s: as many, each within `tol` (relative).
fn losses_within(what: &str, got: &[f64], want: &[f64], tol: f64) -> Result<(), Failed> {
    check(
        got.len() == want.len(),
        format!("{what}: {} updates against {}", got.len(), want.len()),
    )?;
    let rel = max_rel(got, want);
    check(
        rel < tol,
        format!("{what}: losses differ by {rel:.2e} (tolerance {tol:.0e})"),
    )
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-6))
        .fold(0.0, f64::max)
}

fn weights(m: &Mlp<f32>) -> Vec<f32> {
    m.layers
        .iter()
        .flat_map(|l| l.weight.iter().chain(&l.bias).copied())
        .collect()
}

/// fp32 on the GPU against the CPU engine: every loss, optimizer and accumulation, with
/// cuBLASLt's fused epilogues and with gpukit's epilogue kernels.
fn fp32_matches_the_cpu_engine() -> Result<(), Failed> {
    let seed = fresh_seed();
    let cases = [
        (
            vec![7, 33, 17, 1],
            LossKind::Mse,
            OptimizerKind::Adam,
            19,
            1,
        ),
        (
            vec![5, 24, 3],
            LossKind::CrossEntropy,
            OptimizerKind::Sgd,
            16,
            1,
        ),
        (
            vec![9, 40, 40, 1],
            LossKind::Mse,
            OptimizerKind::AdamW,
            13,
            3,
        ),
        (vec![4, 1], LossKind::Mse, OptimizerKind::Sgd, 8, 2),
    ];
    for (widths, loss, kind, batch, accumulate) in cases {
        let mut cfg = config(&widths, loss, kind, batch);
        cfg.accumulate = accumulate;
        let data = dataset(&cfg, 101, seed);
        let model = Mlp::new(&widths, seed);
        let cpu = run_cpu(&cfg, &data, &model)?;
        let what = format!(
            "{widths:?} {loss:?} {kind:?} batch {batch} accumulate {accumulate} (seed {seed})"
        );
        both_paths_match_the_cpu(&what, (&cfg, &data, &model), &cpu)?;
    }
    Ok(())
}

/// A model of 2048-wide layers (the large products' cuBLASLt algorithms and epilogues, fused
/// and not) trains in fp32 like the CPU engine. SGD: Adam's update of a weight whose gradient
/// is near zero takes the gradient's sign, so rounding alone could move it by 2 x lr.
fn wide_model_matches_the_cpu_engine() -> Result<(), Failed> {
    let seed = fresh_seed();
    let widths = [1536, 2048, 2048, 1];
    let mut cfg = config(&widths, LossKind::Mse, OptimizerKind::Sgd, 2048);
    cfg.optimizer.lr = 0.01;
    cfg.epochs = 1;
    let data = dataset(&cfg, 4096, seed);
    let model = Mlp::new(&widths, seed);
    let cpu = run_cpu(&cfg, &data, &model)?;
    let what = format!("{widths:?} batch 2048 (seed {seed})");
    both_paths_match_the_cpu(&what, (&cfg, &data, &model), &cpu)
}

/// fp32 on the GPU, with cuBLASLt's fused epilogues and with gpukit's kernels, against the CPU
/// engine's run (`cpu`: its outcome and model) of the same model, data and loop: as many
/// updates, every loss within 1e-4 (relative), the final weights within 1e-3 (of 1e-3 plus
/// the weight).
fn both_paths_match_the_cpu(
    what: &str,
    (cfg, data, model): (&TrainConfig, &Dataset, &Mlp<f32>),
    (cpu, cpu_model): &(RunOutcome, Mlp<f32>),
) -> Result<(), Failed> {
    for fuse in [true, false] {
        let opts = GpuOptions {
            fuse,
            ..GpuOptions::new(Precision::Fp32)
        };
        let g = run_gpu(cfg, opts, data, model)?;
        let what = format!("{what} fused {fuse}, against the CPU");
        losses_within(&what, &g.outcome.step_losses, &cpu.step_losses, 1e-4)?;
        let worst = weights(&g.model)
            .iter()
            .zip(&weights(cpu_model))
            .map(|(a, b)| (a - b).abs() / (1e-3 + b.abs()))
            .fold(0f32, f32::max);
        check(
            worst <= 1e-3,
            format!("{what}: final weights differ from the CPU's by {worst:.2e}"),
        )?;
    }
    Ok(())
}

/// The batch gather against the host: rows picked by fresh random indices, converted to each
/// type with round-to-nearest-even, bit for bit; widths with and without the 16-byte path.
fn gather_rows_matches_the_host() -> Result<(), Failed> {
    use gpukit_tensor::codec::{bytes_of, encode_f32};
    use gpukit_types::DType;
    use rand::{Rng, SeedableRng};
    let (d, g) = gpu()?;
    let k = gpukit_train::gpu::kernels::TrainKernels::new(d, &g)?;
    let seed = fresh_seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (n, rows, cols) in [
        (300, 70, 4096),
        (50, 33, 37),
        (9, 5, 4),
        (20, 7, 1),
        (40, 13, 4098),
    ] {
        let src: Vec<f32> = (0..n * cols)
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        let idx: Vec<u32> = (0..rows).map(|_| rng.random_range(0..n as u32)).collect();
        let (sb, ib) = (g.upload(bytes_of(&src))?, g.upload(bytes_of(&idx))?);
        let want: Vec<f32> = idx
            .iter()
            .flat_map(|&r| {
                src[r as usize * cols..(r as usize + 1) * cols]
                    .iter()
                    .copied()
            })
            .collect();
        for ty in [DType::F32, DType::F16, DType::Bf16] {
            let out = g.alloc(rows * cols * ty.size_bytes())?;
            k.gather_rows(sb.view(), out.view(), ib.view(), ty, (rows, cols))?;
            g.synchronize()?;
            let got = g.download(&out)?;
            check(
                got == encode_f32(&want, ty),
                format!("gather of {rows} rows of {cols} as {ty:?} differs from the host's (seed {seed})"),
            )?;
        }
    }
    Ok(())
}

/// The one-pass ReLU and bias gradient against the host, bit for bit: the masked gradient in
/// each type, and the bias gradient summed in the kernel's order (32 partial sums a column,
/// each over every 32nd row, then added in order), onto a bias gradient already there or not.
fn relu_bias_grad_matches_the_host() -> Result<(), Failed> {
    use gpukit_tensor::codec::{bytes_of, decode_f32, encode_f32};
    use gpukit_types::DType;
    use rand::{Rng, SeedableRng};
    let (d, g) = gpu()?;
    let k = gpukit_train::gpu::kernels::TrainKernels::new(d, &g)?;
    let seed = fresh_seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (m, n) in [(4096, 70), (37, 100), (1, 5), (65, 33)] {
        for ty in [DType::F32, DType::F16, DType::Bf16] {
            for beta in [0.0f32, 1.0] {
                let mut draw = || -> Vec<f32> {
                    let v: Vec<f32> = (0..m * n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                    decode_f32(&encode_f32(&v, ty), ty)
                };
                let (dy, h) = (draw(), draw());
                let db0: Vec<f32> = (0..m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let dyb = g.upload(&encode_f32(&dy, ty))?;
                let hb = g.upload(&encode_f32(&h, ty))?;
                let dbb = g.upload(bytes_of(&db0))?;
                k.relu_bias_grad((dyb.view(), hb.view()), dbb.view(), ty, (m, n), beta)?;
                g.synchronize()?;
                let masked: Vec<f32> = dy
                    .iter()
                    .zip(&h)
                    .map(|(&v, &hv)| if hv > 0.0 { v } else { 0.0 })
                    .collect();
                let want_db: Vec<f32> = (0..m)
                    .map(|i| {
                        let t = (0..32).fold(0.0f32, |s, y| {
                            s + (y..n)
                                .step_by(32)
                                .fold(0.0f32, |p, j| p + masked[i + j * m])
                        });
                        if beta != 0.0 {
                            beta * db0[i] + t
                        } else {
                            t
                        }
                    })
                    .collect();
                let what = format!("{m} x {n} {ty:?} beta {beta} (seed {seed})");
                check(
                    g.download(&dyb)? == encode_f32(&masked, ty),
                    format!("{what}: the masked gradient differs from the host's"),
                )?;
                check(
                    g.download(&dbb)? == bytes_of(&want_db),
                    format!("{what}: the bias gradient differs from the host's"),
                )?;
            }
        }
    }
    Ok(())
}

/// Every loader, and graph replay, computes the same bits.
fn loaders_and_graphs_agree_bit_for_bit() -> Result<(), Failed> {
    let seed = fresh_seed();
    let cfg = config(&[16, 64, 1], LossKind::Mse, OptimizerKind::Adam, 64);
    let data = dataset(&cfg, 1000, seed);
    let model = Mlp::new(&cfg.widths, seed);
    let eager = GpuOptions {
        loader: Some(Loader::Resident),
        graph: Some(false),
        ..GpuOptions::new(Precision::Fp32)
    };
    let base = run_gpu(&cfg, eager, &data, &model)?;
    for (loader, graph) in [
        (Loader::Plain, false),
        (Loader::Pinned, false),
        (Loader::Prefetch, false),
        (Loader::Resident, true),
    ] {
        let opts = GpuOptions {
            loader: Some(loader),
            graph: Some(graph),
            ..GpuOptions::new(Precision::Fp32)
        };
        let r = run_gpu(&cfg, opts, &data, &model)?;
        if r.outcome.step_losses != base.outcome.step_losses
            || weights(&r.model) != weights(&base.model)
        {
            return Err(format!(
                "{} (graph {graph}) differs from resident (seed {seed})",
                loader.name()
            )
            .into());
        }
    }
    Ok(())
}

/// N updates, then M resumed from what the trainer stored, equal N + M updates, bit for bit
/// (fp16: the loss scale and its growth count carried).
fn resuming_is_bit_exact() -> Result<(), Failed> {
    let seed = fresh_seed();
    let (d, g) = gpu()?;
    for precision in [Precision::Fp32, Precision::Fp16] {
        let mut cfg = config(&[16, 48, 48, 1], LossKind::Mse, OptimizerKind::Adam, 32);
        cfg.epochs = 3;
        let data = dataset(&cfg, 300, seed);
        let model0 = Mlp::new(&cfg.widths, seed);
        let whole = run_gpu(&cfg, GpuOptions::new(precision), &data, &model0)?;
        let mut first = cfg.clone();
        first.max_steps = Some(13);
        let mut t = GpuTrainer::new(
            d,
            g.clone(),
            &first,
            GpuOptions::new(precision),
            data.clone(),
            None,
        )?;
        let (mut model, mut opt) = (model0.clone(), Optimizer::new(cfg.optimizer));
        t.load(&model, &opt, None)?;
        let (a, da) = t.run(Position::default(), &mut |_| {})?;
        t.store(&mut model, &mut opt)?;
        drop(t);
        let mut t = GpuTrainer::new(
            d,
            g.clone(),
            &cfg,
            GpuOptions::new(precision),
            data.clone(),
            None,
        )?;
        t.load(&model, &opt, da.scaler)?;
        let (b, _) = t.run(a.position, &mut |_| {})?;
        t.store(&mut model, &mut opt)?;
        let joined: Vec<f64> = a
            .step_losses
            .iter()
            .chain(&b.step_losses)
            .copied()
            .collect();
        if joined != whole.outcome.step_losses || weights(&model) != weights(&whole.model) {
            return Err(format!(
                "{}: 13 + resumed updates differ from one run (seed {seed})",
                precision.name()
            )
            .into());
        }
    }
    Ok(())
}

/// tf32, fp16 and bf16 train like fp32: final loss within 2%.
fn mixed_precision_trains_like_fp32() -> Result<(), Failed> {
    let seed = fresh_seed();
    let mut cfg = config(&[16, 64, 1], LossKind::Mse, OptimizerKind::Adam, 64);
    cfg.epochs = 3;
    let data = dataset(&cfg, 1024, seed);
    let model = Mlp::new(&cfg.widths, seed);
    let fp32 = run_gpu(&cfg, GpuOptions::new(Precision::Fp32), &data, &model)?;
    let last = |r: &GpuRun| r.outcome.step_losses.last().copied().unwrap_or(f64::NAN);
    for p in [Precision::Tf32, Precision::Fp16, Precision::Bf16] {
        let r = run_gpu(&cfg, GpuOptions::new(p), &data, &model)?;
        let rel = (last(&r) - last(&fp32)).abs() / last(&fp32);
        if rel.partial_cmp(&0.02) != Some(std::cmp::Ordering::Less) {
            return Err(format!(
                "{}: final loss {} vs fp32 {} ({rel:.2e} apart; seed {seed})",
                p.name(),
                last(&r),
                last(&fp32)
            )
            .into());
        }
        if p == Precision::Fp16 && r.skipped != 0 {
            return Err(format!(
                "fp16 skipped {} updates on data that cannot overflow",
                r.skipped
            )
            .into());
        }
    }
    Ok(())
}

/// fp16 with targets so large that the scaled loss gradient overflows fp16: the scale falls,
/// those updates are skipped, and training goes on to end where fp32 ends (within 5%: the
/// skipped updates are the only difference).
fn fp16_survives_overflow() -> Result<(), Failed> {
    let seed = fresh_seed();
    let mut cfg = config(&[16, 64, 1], LossKind::Mse, OptimizerKind::Adam, 64);
    cfg.epochs = 20;
    cfg.optimizer.lr = 0.05;
    let mut data = dataset(&cfg, 1024, seed);
    if let Targets::Values { data: y, .. } = &mut data.y {
        for v in y.iter_mut() {
            *v = *v * 10.0 + 100.0;
        }
    }
    let model = Mlp::new(&cfg.widths, seed);
    let fp32 = run_gpu(&cfg, GpuOptions::new(Precision::Fp32), &data, &model)?;
    let r = run_gpu(&cfg, GpuOptions::new(Precision::Fp16), &data, &model)?;
    let (scale, _) = r.scale.ok_or("fp16 reported no scaler")?;
    if r.skipped == 0 || scale >= 65536.0 {
        return Err(format!("no overflow handled: skipped {}, scale {scale}", r.skipped).into());
    }
    // One batch's loss at this learning rate moves by more than 10% from update to update, so
    // the runs are compared over their last epoch (16 updates), not on their last batch.
    let per_epoch = 1024 / 64;
    let last_epoch = |r: &GpuRun| {
        let l = &r.outcome.step_losses;
        l[l.len().saturating_sub(per_epoch)..].iter().sum::<f64>() / per_epoch as f64
    };
    let first = r.outcome.step_losses[0];
    let (half, full) = (last_epoch(&r), last_epoch(&fp32));
    let rel = (half - full).abs() / full;
    if rel.partial_cmp(&0.05) != Some(std::cmp::Ordering::Less) || half >= first * 0.05 {
        return Err(format!(
            "fp16 after {} skipped updates: last epoch's mean loss {half} (from {first}), \
             fp32's {full} (seed {seed})",
            r.skipped
        )
        .into());
    }
    Ok(())
}

/// Activation checkpointing recomputes the same outputs: the same bits as keeping them all,
/// with less activation memory (fused epilogues and gpukit's kernels, fp32 and bf16).
fn checkpointing_computes_the_same_bits() -> Result<(), Failed> {
    let seed = fresh_seed();
    let (d, g) = gpu()?;
    let mut cfg = config(
        &[8, 48, 40, 48, 32, 48, 24, 1],
        LossKind::Mse,
        OptimizerKind::Adam,
        32,
    );
    cfg.epochs = 2;
    let data = dataset(&cfg, 200, seed);
    let model = Mlp::new(&cfg.widths, seed);
    for precision in [Precision::Fp32, Precision::Bf16] {
        for fuse in [true, false] {
            let opts = GpuOptions {
                fuse,
                ..GpuOptions::new(precision)
            };
            let all = run_gpu(&cfg, opts, &data, &model)?;
            let mut ck = cfg.clone();
            ck.checkpoint_activations = true;
            let r = run_gpu(&ck, opts, &data, &model)?;
            let what = format!("{} fused {fuse} (seed {seed})", precision.name());
            if r.outcome.step_losses != all.outcome.step_losses
                || weights(&r.model) != weights(&all.model)
            {
                return Err(format!("{what}: checkpointed training differs").into());
            }
            let (a, b) = (r.outcome.memory.activations, all.outcome.memory.activations);
            if a >= b || r.outcome.memory.activations_all_kept != b {
                return Err(format!(
                    "{what}: activations {a} checkpointed vs {b} all kept (all-kept figure {})",
                    r.outcome.memory.activations_all_kept
                )
                .into());
            }
            let mut t = GpuTrainer::new(d, g.clone(), &ck, opts, data.clone(), Some(data.clone()))?;
            t.load(&model, &Optimizer::new(cfg.optimizer), None)?;
            t.evaluate()?;
        }
    }
    Ok(())
}

fn check(ok: bool, msg: String) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(msg.into())
    }
}

fn main() {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    type GpuTest = fn() -> Result<(), Failed>;
    let tests: Vec<(&str, GpuTest)> = vec![
        (
            "gpu::fp32_matches_the_cpu_engine",
            fp32_matches_the_cpu_engine,
        ),
        (
            "gpu::gather_rows_matches_the_host",
            gather_rows_matches_the_host,
        ),
        (
            "gpu::wide_model_matches_the_cpu_engine",
            wide_model_matches_the_cpu_engine,
        ),
        (
            "gpu::relu_bias_grad_matches_the_host",
            relu_bias_grad_matches_the_host,
        ),
        (
            "gpu::loaders_and_graphs_agree_bit_for_bit",
            loaders_and_graphs_agree_bit_for_bit,
        ),
        ("gpu::resuming_is_bit_exact", resuming_is_bit_exact),
        (
            "gpu::mixed_precision_trains_like_fp32",
            mixed_precision_trains_like_fp32,
        ),
        ("gpu::fp16_survives_overflow", fp16_survives_overflow),
        (
            "gpu::checkpointing_computes_the_same_bits",
            checkpointing_computes_the_same_bits,
        ),
    ];
    let gpus = DISCOVERY
        .get()
        .and_then(|d| gpukit_cuda::driver::probe(d).ok())
        .map_or(0, |d| d.device_count);
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| {
            Trial::test(name, move || {
                let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
                f()
            })
            .with_ignored_flag(skip.is_some())
        })
        .collect();
    if gpus < 2 {
        eprintln!("gpu::data_parallel_matches_one_gpu_on_the_combined_batch and gpu::pipeline_matches_one_gpu_on_the_same_batches need 2 or more GPUs ({gpus} here): ignored");
    }
    trials.push(
        Trial::test(
            "gpu::data_parallel_matches_one_gpu_on_the_combined_batch",
            || {
                let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
                parallel::data_parallel_matches_one_gpu_on_the_combined_batch()
            },
        )
        .with_ignored_flag(gpus < 2),
    );
    trials.push(
        Trial::test("gpu::pipeline_matches_one_gpu_on_the_same_batches", || {
            let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
            parallel::pipeline_matches_one_gpu_on_the_same_batches()
        })
        .with_ignored_flag(gpus < 2),
    );
    libtest_mimic::run(&args, trials).exit();
}
