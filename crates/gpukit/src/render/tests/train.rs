//! `gpukit train`: a classification run resumed from a checkpoint (accuracy columns, the
//! resumed line, a partial first epoch) and a regression run (no accuracy columns).

use super::{assert_drawn, terminal};
use crate::render::train_sections;
use gpukit_bench::workload::train::{Preset, TrainReport};
use gpukit_train::checkpoint::Position;
use gpukit_train::loss::LossKind;
use gpukit_train::optim::{OptimizerConfig, OptimizerKind};
use gpukit_train::run::{EpochStats, TrainConfig};

fn epoch(epoch: u64, complete: bool, loss: f64, accuracy: Option<f64>) -> EpochStats {
    EpochStats {
        epoch,
        complete,
        batches: if complete { 4 } else { 2 },
        steps: if complete { 4 } else { 2 },
        train_loss: loss,
        train_accuracy: accuracy,
        eval_loss: Some(loss * 1.1),
        eval_accuracy: accuracy.map(|a| a - 0.05),
        seconds: 0.00125,
        samples_per_s: 102_400.0,
    }
}

pub(super) fn report(loss: LossKind) -> TrainReport {
    let classes = loss == LossKind::CrossEntropy;
    let accuracy = |a: f64| classes.then_some(a);
    TrainReport {
        preset: Some(if classes {
            Preset::SeedClassification
        } else {
            Preset::SeedRegression
        }),
        device: "cpu".into(),
        precision: "fp32".into(),
        config: TrainConfig {
            widths: vec![3, 10, 2],
            loss,
            optimizer: OptimizerConfig {
                kind: if classes {
                    OptimizerKind::Sgd
                } else {
                    OptimizerKind::Adam
                },
                lr: 0.01,
                momentum: if classes { 0.9 } else { 0.0 },
                weight_decay: 0.0,
            },
            batch_size: 20,
            epochs: 3,
            seed: 4,
            shuffle: true,
            accumulate: if classes { 2 } else { 1 },
            max_steps: None,
            checkpoint_activations: false,
        },
        parameters: 62,
        data: "generated: x ~ N(0,1), labels 0/1, seed 4".into(),
        samples: 80,
        features: 3,
        eval_samples: 20,
        initial_weights: "from the checkpoint".into(),
        resumed_from: classes.then(|| "ck.safetensors".into()),
        resumed_at: classes.then_some(Position {
            step: 6,
            epoch: 1,
            batch: 2,
        }),
        epochs: vec![
            epoch(2, !classes, 0.69, accuracy(0.55)),
            epoch(3, true, 0.61, accuracy(0.7)),
        ],
        step_losses: vec![0.7; 6],
        diverged: None,
        final_position: Position {
            step: 12,
            epoch: 3,
            batch: 0,
        },
        seconds: 0.0025,
        memory: gpukit_train::run::MemoryUse {
            weights: 248,
            gradients: 248,
            optimizer_state: 248,
            activations: 1920,
            workspace: 2048,
            activations_all_kept: 1920,
            data: 0,
            pool_peak: None,
        },
        saved_checkpoint: Some("ck2.safetensors".into()),
        saved_losses: Some("losses.csv".into()),
        pytorch: None,
        gpu: None,
        data_parallel: None,
        pipeline: None,
        recording: None,
    }
}

#[test]
fn train_resumed_classification() {
    let sections = train_sections(&report(LossKind::CrossEntropy));
    assert_drawn("train_classification", &sections);
}

#[test]
fn train_regression_has_no_accuracy_columns() {
    let text = terminal(&train_sections(&report(LossKind::Mse)));
    assert!(!text.contains("acc."), "{text}");
    assert!(!text.contains("Resumed"), "{text}");
    assert!(text.contains("adam, lr 0.01, betas 0.9/0.999"), "{text}");
}

#[test]
fn a_pipeline_run_shows_its_split_bubble_and_the_one_gpu_run_beside() {
    use gpukit_bench::workload::train::pipeline::{OneGpu, Pipeline, PipelinePeer};
    let mut r = report(LossKind::Mse);
    r.pipeline = Some(Pipeline {
        stages: 2,
        started_by: "threads in one process".into(),
        transfers: "the GPUs' copy engines".into(),
        micro_batches: 8,
        micro_rows: 512,
        layers: vec![(0, 4), (4, 9)],
        split_given: false,
        layer_ms: vec![0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.25],
        layer_update_ms: vec![0.1; 9],
        alone_step_ms: vec![29.6, 37.3],
        step_ms: vec![41.7, 41.6],
        optimizer_ms: vec![0.31, 0.29],
        samples_per_s: 97_152.0,
        bubble: 0.106,
        bubble_schedule: 1.0 / 9.0,
        bubble_without_flush: 0.109,
        stage_peak_bytes: vec![1 << 30, 3 << 29],
        one_gpu_refused: Some("needs about 37.1 GiB, 31.7 GiB is available".into()),
        one_gpu: Some(OneGpu {
            step_ms: 60.7,
            samples_per_s: 67_471.0,
            max_loss_rel_diff: 9.4e-9,
            tolerance: 1e-5,
            peak_bytes: 5 << 29,
            graph: true,
            step_losses: vec![2.7, 2.6],
        }),
        disagreement: None,
        pytorch: Some(PipelinePeer {
            torch_version: "2.11.0".into(),
            step_ms: 42.61,
            per_stage_step_ms: vec![42.61, 42.5],
            samples_per_s: 96_125.0,
        }),
    });
    let text = terminal(&train_sections(&r));
    for want in [
        "Pipeline-parallel",
        "layers 1-4 | 5-9",
        "3.50, 4.25 ms a stage; optimizer steps about 0.40, 0.50 ms",
        "8 micro-batches of up to 512 rows",
        "gradients through the GPUs' copy engines",
        "41.70, 41.60 ms in the pipeline",
        "0.106 of the update idle",
        "0.109 without the optimizer steps (the first stage's, 0.31 ms,",
        "the schedule's with equal stages 0.111",
        "1.00 GiB, 1.50 GiB",
        "refused: needs about 37.1 GiB",
        "within 9.4e-9",
        "the pipeline 1.44x",
        "96125 samples/s (Schedule1F1B",
        "gpukit 1.01x",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

#[test]
fn a_data_parallel_run_names_its_sharded_optimizer_and_both_pytorch_peers() {
    use gpukit_bench::workload::train::parallel::{CompiledPeer, DataParallel, DdpPeer, PeerPeaks};
    let dp = |sharded: bool, reason: Option<&str>, single: f64, step: f64| DataParallel {
        ranks: 2,
        started_by: "threads in one process".into(),
        batch_per_gpu: 4096,
        combined_batch: 8192,
        buckets: 2,
        bucket_mb: 25.0,
        grad_pieces: 1,
        first_layer_exchanged: false,
        weights_gathered_by_copies: false,
        grad_comm: "f32".into(),
        sharded_optimizer: sharded,
        unsharded_reason: reason.map(str::to_string),
        comm_sms: 0,
        gradient_mib: 128.0,
        single_step_ms: vec![single, single],
        step_ms: vec![step, step],
        samples_per_s: 8192.0 / (step / 1e3),
        single_samples_per_s: 4096.0 / (single / 1e3),
        scaling_efficiency: single / step,
        exposed_comm_ms: step - single,
        pytorch: Some(DdpPeer {
            torch_version: "2.11.0".into(),
            single_samples_per_s: 2_053_108.0,
            samples_per_s: 3_384_251.0,
            scaling_efficiency: 0.824,
            zero: sharded.then_some((2_398_104.0, 0.584)),
            compiled: sharded.then_some(CompiledPeer {
                single_samples_per_s: 2_400_000.0,
                samples_per_s: 4_000_000.0,
                scaling_efficiency: 0.833,
            }),
            peaks: PeerPeaks {
                ddp: Some(1_000 << 20),
                zero: sharded.then_some(800 << 20),
                compiled: None,
            },
        }),
    };
    let mut r = report(LossKind::Mse);
    r.data_parallel = Some(dp(true, None, 1.52, 1.61));
    r.memory.pool_peak = Some(1_700 << 20);
    r.memory.data = 512 << 20;
    let text = terminal(&train_sections(&r));
    for want in [
        "128.0 MiB reduce-scattered in 2 bucket(s)",
        "sharded: each GPU keeps the optimizer's moments of 1/2 of the parameters",
        "(sharded: this GPU's 1/2 of the moments)",
        "0.944 (0.09 ms a step of communication backward did not hide)",
        "efficiency 0.824",
        "2398104 samples/s (ZeroRedundancyOptimizer): efficiency 0.584; gpukit's throughput 2.12x",
        "4000000 samples/s (torch.compile, fused optimizer), one GPU 2400000: efficiency 0.833; gpukit's throughput 1.27x",
        "gpukit's throughput 1.27x PyTorch's fastest data-parallel mode (4000000 samples/s)",
        "gpukit 1188 MiB (its memory pool's live peak, less its resident data set of 512 MiB) / PyTorch DDP 1000 MiB, DDP with ZeroRedundancyOptimizer 800 MiB",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    // a step shorter than each GPU alone (the shared update) says so; a refused sharding
    // says why
    r.data_parallel = Some(dp(
        false,
        Some("layer 0's forward reads its bias in f32"),
        1.6,
        1.5,
    ));
    let text = terminal(&train_sections(&r));
    for want in [
        "128.0 MiB averaged in 2 bucket(s)",
        "not sharded: layer 0's forward reads its bias in f32",
        "a step 0.10 ms shorter than each GPU alone",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert!(!text.contains("ZeroRedundancyOptimizer"), "{text}");
    assert!(text.contains("PyTorch DDP 1000 MiB (torch"), "{text}");
    // without the other modes, eager DDP is PyTorch's best
    assert!(
        text.contains("PyTorch's fastest data-parallel mode (3384251 samples/s)"),
        "{text}"
    ); // the copy engines and the first layer exchanged piece by piece say how
    let mut exchanged = dp(true, None, 1.52, 1.55);
    exchanged.grad_pieces = 2;
    exchanged.first_layer_exchanged = true;
    r.data_parallel = Some(exchanged);
    let text = terminal(&train_sections(&r));
    assert!(
        text.contains("every block carried to the GPU that updates it by the copy engines")
            && text.contains("in 2 pieces, one a GPU, the others' computed first and each sent while the next is computed"),
        "{text}"
    );
    assert!(
        !text.contains("each averaged as soon as it is computed"),
        "{text}"
    );
}

#[test]
fn a_cnn_data_parallel_run_shows_each_pytorch_mode_with_its_memory() {
    use gpukit_bench::workload::train::cnn_parallel::{CnnDataParallel, DdpCnnRow};
    let ddp = |mode: &str, ips: Option<f64>, peak: Option<u64>, failed: Option<&str>| DdpCnnRow {
        mode: mode.into(),
        failed: failed.map(str::to_string),
        single_images_per_s: ips.map(|v| v / 1.9),
        images_per_s: ips,
        scaling_efficiency: ips.map(|_| 0.95),
        peak_bytes: peak,
    };
    let dp = CnnDataParallel {
        ranks: 2,
        batch_per_gpu: 256,
        combined_batch: 512,
        buckets: 1,
        bucket_mb: 97.5,
        grad_comm: "f32".into(),
        gradient_mib: 97.5,
        single_step_ms: 34.6,
        step_ms: 35.3,
        single_images_per_s: 7_400.0,
        images_per_s: 14_500.0,
        scaling_efficiency: 0.979,
        ddp: vec![
            ddp("ddp", Some(9_259.0), Some(21_000 << 20), None),
            ddp("ddp_compile", Some(12_792.0), None, None),
            ddp("ddp_compile_fused", None, None, Some("out of memory")),
        ],
    };
    let text = terminal(&[crate::render::train_cnn::data_parallel_section(&dp)]);
    for want in [
        "PyTorch ddp",
        "9259.0 images/s (alone 4873.2), efficiency 0.950; gpukit 1.57x; peak memory 20.5 GiB a GPU",
        "12792.0 images/s (alone 6732.6), efficiency 0.950; gpukit 1.13x",
        "failed: out of memory",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    // a mode without a memory figure says none
    let compiled = text
        .lines()
        .find(|l| l.contains("12792.0"))
        .unwrap_or_default();
    assert!(!compiled.contains("peak memory"), "{compiled}");
}
