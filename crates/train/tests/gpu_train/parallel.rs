//! The data-parallel and pipeline-parallel cases of the GPU training tests: several GPUs
//! (a thread each, NCCL between them) against one GPU on the same batches.

use super::*;

/// `f(i)` on a thread each for i in 0..n (a GPU each), joined in order; a panic is a failure.
fn per_gpu_thread<T: Send>(
    n: usize,
    f: impl Fn(usize) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..n).map(|i| scope.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a GPU's thread panicked".into()))
            })
            .collect()
    })
}

/// `model` trained by `t` from the start (a fresh optimizer): its outcome and final weights.
fn train_from_the_start(
    t: &mut GpuTrainer,
    model: &Mlp<f32>,
    cfg: &TrainConfig,
) -> Result<(RunOutcome, Mlp<f32>, Optimizer<f32>), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut m = model.clone();
    let mut opt = Optimizer::new(cfg.optimizer);
    t.load(&m, &opt, None).map_err(|x| e(&x))?;
    let (out, _) = t.run(Position::default(), &mut |_| {}).map_err(|x| e(&x))?;
    t.store(&mut m, &mut opt).map_err(|x| e(&x))?;
    Ok((out, m, opt))
}

/// How far two sets of moment tensors are apart, or None when their shapes differ: the largest
/// difference over the largest value of `want` (moments near zero have no scale of their
/// own), or with `rounded` the root of the summed squared differences over `want`'s (training
/// whose gradients are rounded to 16 bits follows one GPU's within that rounding, and a ReLU
/// that a rounded step flips for one row moves one moment by that row's share of the batch:
/// the largest difference then measures the flip, not the training; run 127 saw it at 0.8e-3
/// to 2.3e-2 over the same cases).
fn moments_apart(got: &[Vec<f32>], want: &[Vec<f32>], rounded: bool) -> Option<f32> {
    if got.len() != want.len() || got.iter().zip(want).any(|(a, b)| a.len() != b.len()) {
        return None;
    }
    let pairs = || got.iter().flatten().zip(want.iter().flatten());
    if rounded {
        let (d, w) = pairs().fold((0f64, 0f64), |(d, w), (a, b)| {
            let (a, b) = (f64::from(*a), f64::from(*b));
            (d + (a - b) * (a - b), w + b * b)
        });
        return Some((d.sqrt() / w.sqrt().max(f64::MIN_POSITIVE)) as f32);
    }
    let scale = want.iter().flatten().fold(0f32, |s, x| s.max(x.abs()));
    let far = pairs().fold(0f32, |s, (a, b)| s.max((a - b).abs()));
    Some(far / scale.max(f32::MIN_POSITIVE))
}

/// The root of the summed squared differences of `got` and `want` over that of `want`'s
/// moves from `start`: how far a rounded training's weights ended from one GPU's, against how
/// far one GPU's moved.
fn rms_apart(got: &[f32], want: &[f32], start: &[f32]) -> f32 {
    let (d, m) = got
        .iter()
        .zip(want)
        .zip(start)
        .fold((0f64, 0f64), |(d, m), ((&a, &b), &s)| {
            let (a, b, s) = (f64::from(a), f64::from(b), f64::from(s));
            (d + (a - b) * (a - b), m + (b - s) * (b - s))
        });
    (d.sqrt() / m.sqrt().max(f64::MIN_POSITIVE)) as f32
}

/// Data-parallel training over every GPU of the machine (a thread a GPU, NCCL between them)
/// makes the same updates as one GPU training on the combined batch: the same per-update
/// losses and final weights, up to the order of f32 sums. With a last combined batch that does
/// not divide evenly, gradient accumulation, epochs replayed as CUDA graphs (the
/// communication captured in them), and the first layer's weight gradient in pieces each
/// averaged on its own.
pub(super) fn data_parallel_matches_one_gpu_on_the_combined_batch() -> Result<(), Failed> {
    use gpukit_cuda::nccl::{Comm, UniqueId};
    use gpukit_train::gpu::parallel::Shard;
    let (d, _) = gpu()?;
    let world = gpukit_cuda::driver::probe(d)
        .map_err(|e| e.to_string())?
        .device_count;
    let per_gpu = 16;
    use gpukit_types::DType;
    // the optimizer: every rank updating every parameter, sharded, or asked to be sharded
    // where it must not be (in bf16 with gpukit's bias kernels the forward reads the f32
    // biases, which a sharded rank does not keep current): averaged instead
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Sharding {
        Off,
        On,
        Unfused,
        /// On, and the first layer's weight gradient exchanged piece by piece through the
        /// copy engines (exchange.rs).
        Exchange,
    }
    // (loss, optimizer, accumulate, graph, first-layer pieces, averaged in, sharding,
    // precision)
    let cases = [
        (
            LossKind::CrossEntropy,
            OptimizerKind::Adam,
            1,
            false,
            0,
            DType::F32,
            Sharding::Exchange,
            Precision::Fp32,
        ),
        // the exchange runs op by op only (a graph cannot hold another thread's copy)
        (
            LossKind::Mse,
            OptimizerKind::AdamW,
            2,
            false,
            0,
            DType::F32,
            Sharding::Exchange,
            Precision::Bf16,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Adam,
            1,
            false,
            1,
            DType::F32,
            Sharding::Off,
            Precision::Fp32,
        ),
        (
            LossKind::Mse,
            OptimizerKind::Sgd,
            2,
            false,
            3,
            DType::F32,
            Sharding::Off,
            Precision::Fp32,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::AdamW,
            1,
            true,
            1,
            DType::F32,
            Sharding::Off,
            Precision::Fp32,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Sgd,
            1,
            true,
            5,
            DType::F32,
            Sharding::Off,
            Precision::Fp32,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Sgd,
            1,
            false,
            3,
            DType::Bf16,
            Sharding::Off,
            Precision::Fp32,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Adam,
            1,
            true,
            3,
            DType::F32,
            Sharding::On,
            Precision::Fp32,
        ),
        (
            LossKind::Mse,
            OptimizerKind::AdamW,
            2,
            false,
            1,
            DType::F32,
            Sharding::On,
            Precision::Bf16,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Sgd,
            1,
            true,
            4,
            DType::Bf16,
            Sharding::On,
            Precision::Bf16,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Adam,
            1,
            false,
            1,
            DType::F32,
            Sharding::Unfused,
            Precision::Bf16,
        ),
    ];
    for (loss, kind, accumulate, graph, pieces, comm, sharding, precision) in cases {
        let _watch = super::Watchdog::new(
            format!("data-parallel case {loss:?} {kind:?} {} accumulate {accumulate} graph {graph} pieces {pieces} averaged in {comm} {sharding:?}", precision.name()),
            std::time::Duration::from_secs(120),
        );
        // averaging in bf16 rounds every gradient to 8 bits of mantissa (2^-9 relative), and
        // bf16 products round every map: the updates then follow one GPU's within that
        // rounding, not within f32's, so the weights are judged by how far they are from one
        // GPU's against the largest move one GPU made (a weight near zero has no scale of its
        // own to be judged against)
        let sharded = sharding != Sharding::Off;
        // products planned for fewer multiprocessors once the communicator is attached (other
        // algorithms, the same sums up to their order)
        let exchange = sharding == Sharding::Exchange;
        let comm_sms = if sharding == Sharding::On && graph {
            16
        } else {
            0
        };
        // one bucket above the first layer's pieces (or with the first layer in it, whose
        // second layer's weight gradient backward computes last), or a bucket a layer
        let bucket = if graph && sharding == Sharding::Off {
            1 << 30
        } else {
            4 << 10
        };
        let rounded = comm == DType::Bf16 || precision == Precision::Bf16;
        let (loss_tol, weight_tol) = if rounded { (1e-2, 2e-2) } else { (1e-4, 1e-3) };
        // rounded: the moments' root-sum-of-squares distance (run 127: up to 1.9e-2 over twelve
        // runs of the case that rounds both the maps and the averaging)
        let moment_tol = if rounded { 5e-2 } else { weight_tol };
        let widths = match loss {
            LossKind::Mse => vec![24, 64, 64, 1],
            LossKind::CrossEntropy => vec![24, 64, 64, 3],
        };
        let mut cfg = config(&widths, loss, kind, per_gpu * world);
        cfg.accumulate = accumulate;
        let samples = per_gpu * world * 5 + 7;
        let data = dataset(&cfg, samples, fresh_seed());
        let model = Mlp::new(&widths, fresh_seed());
        let opts = GpuOptions {
            loader: Some(Loader::Resident),
            graph: Some(graph),
            fuse: sharding != Sharding::Unfused,
            ..GpuOptions::new(precision)
        };
        let one = run_gpu(&cfg, opts, &data, &model)?;
        let mut shard_cfg = cfg.clone();
        shard_cfg.batch_size = per_gpu;
        let id = UniqueId::new()?;
        let peers = gpukit_train::gpu::DpPeers::new(world, std::time::Duration::from_secs(60));
        let runs = per_gpu_thread(world, |rank| {
            let e = |e: &dyn std::fmt::Display| e.to_string();
            let g = Arc::new(Gpu::open(d, rank).map_err(|x| e(&x))?);
            let o = GpuOptions {
                shard: Some(Shard { rank, world }),
                grad_pieces: pieces,
                grad_comm: comm,
                shard_optimizer: sharded,
                dp_exchange: exchange,
                comm_sms,
                ..opts
            };
            let mut t = GpuTrainer::new(d, g.clone(), &shard_cfg, o, data.clone(), None)
                .map_err(|x| e(&x))?;
            let stream = g.new_stream().map_err(|x| e(&x))?;
            let comm = Comm::init_rank_on(&g, stream, &id, rank, world).map_err(|x| e(&x))?;
            if exchange {
                t.join_peers(peers.clone());
            }
            let attached = t.attach(comm, bucket);
            if attached.is_err() {
                peers.close();
            }
            attached.map_err(|x| e(&x))?;
            if t.sharded_optimizer() != (sharding == Sharding::On || exchange) {
                return Err(format!(
                    "asked for {sharding:?}, the optimizer is{} sharded ({:?})",
                    if t.sharded_optimizer() { "" } else { " not" },
                    t.unsharded_reason()
                ));
            }
            if exchange && t.grad_pieces() != world {
                return Err(format!(
                    "the exchange asked for: the first layer in {} pieces, not one a rank",
                    t.grad_pieces()
                ));
            }
            if exchange != t.first_layer_exchanged() {
                peers.close();
                return Err(format!(
                    "the exchange asked for: {exchange}, made: {}",
                    t.first_layer_exchanged()
                ));
            }
            let trained = train_from_the_start(&mut t, &model, &shard_cfg);
            if trained.is_err() {
                peers.close();
            }
            trained
        });
        let tag = format!(
            "{loss:?} {kind:?} {} accumulate {accumulate} graph {graph} first-layer pieces {pieces} averaged in {comm}, buckets of {bucket} bytes{}{}, {world} GPUs",
            precision.name(),
            match sharding {
                Sharding::Off => "",
                Sharding::On => ", optimizer sharded",
                Sharding::Unfused => ", unfused, sharding asked for and refused",
                Sharding::Exchange => ", optimizer sharded, first layer exchanged piece by piece",
            },
            if comm_sms > 0 { ", 16 SMs left to communication" } else { "" }
        );
        // the largest distances over the ranks: weights, m, v
        let mut apart = [0f32; 3];
        for (rank, r) in runs.into_iter().enumerate() {
            let (out, m, opt) = r.map_err(|e| format!("{tag}: rank {rank}: {e}"))?;
            // a sharded rank keeps only its blocks of the moments: gathered back, every
            // rank's are one GPU's
            for (k, what, got, want) in [(1, "m", &opt.m, &one.opt.m), (2, "v", &opt.v, &one.opt.v)]
            {
                match moments_apart(got, want, rounded) {
                    Some(d) if d < moment_tol => apart[k] = apart[k].max(d),
                    d => check(
                        false,
                        format!("{tag}: rank {rank}: the optimizer's {what} differs from one GPU's by {d:?} of {} (tolerance {moment_tol:e})", if rounded { "its root sum of squares" } else { "its largest value" }),
                    )?,
                }
            }
            losses_within(
                &format!("{tag}: rank {rank}, against one GPU"),
                &out.step_losses,
                &one.outcome.step_losses,
                loss_tol,
            )?;
            let (a, b) = (weights(&m), weights(&one.model));
            let worst = if rounded {
                let start = weights(&model);
                let moved = b
                    .iter()
                    .zip(&start)
                    .map(|(y, s)| (y - s).abs())
                    .fold(0.0f32, f32::max)
                    .max(f32::MIN_POSITIVE);
                let far = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                far / moved
            } else {
                a.iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs() / y.abs().max(1e-2))
                    .fold(0.0f32, f32::max)
            };
            check(
                worst < weight_tol,
                format!(
                    "{tag}: rank {rank}: weights differ by {worst:e} (tolerance {weight_tol:e})"
                ),
            )?;
            apart[0] = apart[0].max(worst);
        }
        eprintln!(
            "    {tag}: every rank made one GPU's updates (weights within {:.1e}, tolerance {weight_tol:e}; m {:.1e}, v {:.1e}, tolerance {moment_tol:e})",
            apart[0], apart[1], apart[2]
        );
    }
    Ok(())
}

/// Pipeline-parallel over two GPUs against the whole model on one, the same batches: the 1F1B
/// schedule's micro-batches (uneven ones, and a last partial batch) sum to the batch's
/// gradient, so every update's loss is one GPU's within f32's order of sums (the 1e-5
/// relative) and so are the final weights; bf16 within its rounding. Each case runs with the
/// transfers through NCCL and through the copy engines (the peers' mailboxes).
pub(super) fn pipeline_matches_one_gpu_on_the_same_batches() -> Result<(), Failed> {
    use gpukit_cuda::nccl::{Comm, UniqueId};
    use gpukit_train::gpu::links::Links;
    use gpukit_train::gpu::pipeline::Stage;
    let d = DISCOVERY.get().ok_or("no discovery")?;
    for (loss, kind, widths, spans, micro, batch, p) in [
        (
            LossKind::Mse,
            OptimizerKind::Adam,
            vec![24, 64, 64, 64, 1],
            vec![(0, 2), (2, 4)],
            4,
            32,
            Precision::Fp32,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::Sgd,
            vec![24, 48, 64, 3],
            vec![(0, 1), (1, 3)],
            3,
            31,
            Precision::Fp32,
        ),
        (
            LossKind::CrossEntropy,
            OptimizerKind::AdamW,
            vec![32, 128, 128, 128, 8],
            vec![(0, 3), (3, 4)],
            8,
            64,
            Precision::Bf16,
        ),
    ] {
        let (loss_tol, weight_tol) = match p {
            Precision::Fp32 => (1e-5, 1e-4),
            _ => (5e-2, 5e-2),
        };
        let cfg = config(&widths, loss, kind, batch);
        let data = dataset(&cfg, batch * 5 + 7, fresh_seed());
        let model = Mlp::new(&widths, fresh_seed());
        let opts = GpuOptions {
            loader: Some(Loader::Resident),
            graph: Some(false),
            ..GpuOptions::new(p)
        };
        let one = run_gpu(&cfg, opts, &data, &model)?;
        let count = spans.len();
        for copies in [false, true] {
            let _watch = super::Watchdog::new(
                format!(
                    "pipeline case {loss:?} {kind:?} {widths:?} {} copies {copies}",
                    p.name()
                ),
                std::time::Duration::from_secs(120),
            );
            let id = UniqueId::new()?;
            let links = Links::new(count, std::time::Duration::from_secs(60));
            let runs = per_gpu_thread(count, |index| {
                let e = |e: &dyn std::fmt::Display| e.to_string();
                let g = Arc::new(Gpu::open(d, index).map_err(|x| e(&x))?);
                let stage = Stage {
                    index,
                    count,
                    layers: spans[index],
                    micro,
                };
                let o = GpuOptions {
                    stage: Some(stage),
                    ..opts
                };
                let mut t = GpuTrainer::new(d, g.clone(), &cfg, o, data.clone(), None)
                    .map_err(|x| e(&x))?;
                if copies {
                    let mine = links
                        .connect(index, &g, t.pipeline_inbox_bytes())
                        .map_err(|x| e(&x))?;
                    t.attach_pipeline_links(mine).map_err(|x| e(&x))?;
                } else {
                    let comm =
                        Comm::init_rank_on(&g, t.stream(), &id, index, count).map_err(|x| e(&x))?;
                    t.attach_pipeline(comm).map_err(|x| e(&x))?;
                }
                train_from_the_start(&mut t, &model, &cfg)
            });
            let tag = format!(
            "{loss:?} {kind:?} {widths:?} stages {spans:?} {micro} micro-batches of batch {batch}, {}, {}",
            p.name(),
            if copies { "copy engines" } else { "NCCL" }
        );
            let mut trained = model.clone();
            let mut last = None;
            for (r, &(a, b)) in runs.into_iter().zip(&spans) {
                let (out, m, _) = r.map_err(|e| format!("{tag}: {e}"))?;
                trained.layers[a..b].clone_from_slice(&m.layers[a..b]);
                last = Some(out);
            }
            let out = last.ok_or("no stage ran")?;
            losses_within(
                &format!("{tag}, against one GPU"),
                &out.step_losses,
                &one.outcome.step_losses,
                loss_tol,
            )?;
            // bf16: the micro-batches' products round their maps otherwise than the whole
            // batch's, and Adam's first steps move a weight whose gradient nearly cancels by
            // its learning rate either way: judged over all weights against their moves
            let (a, b) = (weights(&trained), weights(&one.model));
            let worst = match p {
                Precision::Fp32 => a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs() / y.abs().max(1e-2))
                    .fold(0.0f32, f32::max),
                _ => rms_apart(&a, &b, &weights(&model)),
            };
            check(
                worst < weight_tol,
                format!("{tag}: weights differ by {worst:e} (tolerance {weight_tol:e})"),
            )?;
            eprintln!(
                "    {tag}: {} updates, losses within {:.1e}, weights within {worst:.1e}",
                out.step_losses.len(),
                max_rel(&out.step_losses, &one.outcome.step_losses)
            );
        }
    }
    Ok(())
}
