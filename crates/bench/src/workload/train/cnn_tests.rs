//! The request checks of `train --model` (cnn.rs) and a small CPU run, without a GPU.

use super::*;

fn request() -> CnnTrainRequest {
    CnnTrainRequest {
        model: Depth::ResNet18,
        device: Device::Cpu,
        batch_size: Some(2),
        steps: Some(2),
        epochs: None,
        image_size: Some(16),
        classes: Some(10),
        samples: None,
        optimizer: None,
        lr: None,
        momentum: None,
        nesterov: false,
        weight_decay: None,
        label_smoothing: None,
        seed: None,
        init: None,
        data: None,
        precision: None,
        save_losses: None,
        profile: None,
        graph: None,
        compare_pytorch: false,
        accumulate: None,
        gpus: None,
        launched: None,
        bucket_mb: None,
        grad_comm: None,
        checkpoint_activations: false,
    }
}

#[test]
fn a_launched_rank_refuses_what_one_process_drives() {
    let w = cnn_parallel::launched_world(1, 2, 1);
    let launched = CnnTrainRequest {
        device: Device::Cuda(1),
        launched: Some(w),
        ..request()
    };
    assert!(check_request(&launched).is_ok());
    // bucket size and averaging type are a launched world's too
    let bf16 = CnnTrainRequest {
        grad_comm: Some(DType::Bf16),
        bucket_mb: Some(25.0),
        ..launched.clone()
    };
    assert!(check_request(&bf16).is_ok());
    for (bad, says) in [
        (
            CnnTrainRequest {
                gpus: Some(2),
                ..launched.clone()
            },
            "--gpus",
        ),
        (
            CnnTrainRequest {
                compare_pytorch: true,
                ..launched.clone()
            },
            "--compare-pytorch",
        ),
        (
            CnnTrainRequest {
                device: Device::Cuda(0),
                ..launched.clone()
            },
            "LOCAL_RANK",
        ),
    ] {
        let err = check_request(&bad).unwrap_err();
        assert!(
            matches!(err, Error::BadInput(_)) && err.to_string().contains(says),
            "{says}: {err}"
        );
    }
}

#[test]
fn a_small_cpu_run_reports_every_update_and_a_rate() {
    let report =
        run_cnn_train(&request(), &gpukit_cuda::loader::discover(), &mut |_| {}).expect("a run");
    assert_eq!(report.updates.len(), 2);
    assert!(report.images_per_s.is_some() && report.peak_gpu_bytes.is_none());
    assert_eq!(report.parameters, 11_181_642);
}

#[test]
fn data_parallel_accumulation_is_a_request_like_any_other() {
    let r = CnnTrainRequest {
        gpus: Some(2),
        device: Device::Cuda(0),
        accumulate: Some(2),
        ..request()
    };
    assert!(check_request(&r).is_ok());
}

#[test]
fn contradictions_are_refused_before_work() {
    let cases = [
        (
            CnnTrainRequest {
                precision: Some(DType::Bf16),
                ..request()
            },
            "--precision bf16: the CPU trains convolutional networks in fp32",
        ),
        (
            CnnTrainRequest {
                precision: Some(DType::Tf32),
                ..request()
            },
            "--precision tf32: the CPU trains convolutional networks in fp32",
        ),
        (
            CnnTrainRequest {
                precision: Some(DType::F8E4M3),
                device: Device::Cuda(0),
                ..request()
            },
            "--precision fp8: convolutional networks train in fp32, tf32, bf16 or fp16",
        ),
        (
            CnnTrainRequest {
                gpus: Some(2),
                ..request()
            },
            "--gpus 2: data-parallel training runs on cuda:0..1; give --device cuda:0",
        ),
        (
            CnnTrainRequest {
                gpus: Some(2),
                device: Device::Cuda(0),
                profile: Some((0, TimingChoice::Auto)),
                ..request()
            },
            "--gpus: profile records one GPU's update",
        ),
        (
            CnnTrainRequest {
                grad_comm: Some(DType::Bf16),
                device: Device::Cuda(0),
                ..request()
            },
            "--grad-comm and --bucket-mb: say how data-parallel ranks average",
        ),
        (
            CnnTrainRequest {
                checkpoint_activations: true,
                ..request()
            },
            "--checkpoint-activations: the CPU path keeps every map",
        ),
        (
            CnnTrainRequest {
                data: Some("d.safetensors".into()),
                ..request()
            },
            "--image-size and --samples describe generated images",
        ),
        (
            CnnTrainRequest {
                label_smoothing: Some(1.0),
                ..request()
            },
            "--label-smoothing 1",
        ),
        (
            CnnTrainRequest {
                optimizer: Some(OptimizerKind::AdamW),
                nesterov: true,
                ..request()
            },
            "--momentum and --nesterov apply to sgd",
        ),
        (
            CnnTrainRequest {
                steps: Some(5),
                epochs: Some(2),
                ..request()
            },
            "--steps 5 needs 5 epochs of 1 batches, but --epochs 2 ends after 2",
        ),
    ];
    for (r, says) in cases {
        let e = match check_request(&r) {
            Err(e) => e.to_string(),
            Ok(()) => updates(&r, 1, 1).map_or_else(|e| e.to_string(), |_| "ran".into()),
        };
        assert!(e.contains(says), "{says}: {e}");
    }
}
