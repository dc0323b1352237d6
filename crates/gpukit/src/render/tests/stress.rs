//! `gpukit stress`: two GPUs, one passing at the power cap, one failing on a differing repeat and
//! heat, with NVML readings that could not be taken.

use super::assert_drawn;
use crate::render::stress_sections;
use gpukit_bench::ceilings::datasheet_peaks;
use gpukit_bench::report::Verification;
use gpukit_bench::stress::kernels::Pattern;
use gpukit_bench::stress::verdict::{judge, Rules};
use gpukit_bench::stress::{
    AllReduceCheck, Budget, CopyStress, GpuStress, MatmulStress, MemoryStress, MultiGpu,
    PatternPass, PeerCopy, StressReport, ThrottleSeen, Watched,
};
use gpukit_bench::workload::gemm::DtypeBest;
use gpukit_cuda::nvml::HealthCounters;
use gpukit_tensor::DType;

fn checked(rel_err: f64) -> Verification {
    Verification {
        samples: 256,
        rel_err,
        tolerance: 1.5e-2,
        passed: true,
    }
}

fn matmul(dtype: DType, tflops: f64, products: u64) -> MatmulStress {
    MatmulStress {
        dtype: Some(dtype),
        size: 8192,
        backend: "cuBLAS GemmEx (default algorithm)".into(),
        products,
        seconds: 16.5,
        tflops: Some(tflops),
        tflops_min: Some(tflops * 0.96),
        tflops_max: Some(tflops * 1.01),
        reference_first: Some(checked(1.7e-3)),
        reference_last: Some(checked(1.8e-3)),
        words_per_result: 8192 * 8192 * dtype.product_output().size_bytes() as u64 / 4,
        pct_of_peak: Some(
            100.0 * tflops
                / match dtype {
                    DType::Bf16 => 989.4,
                    DType::F8E4M3 => 1978.9,
                    _ => 494.7,
                },
        ),
        ..MatmulStress::default()
    }
}

fn gpu(ordinal: usize, bf16: f64) -> GpuStress {
    let name = "NVIDIA H100 80GB HBM3";
    let health = HealthCounters {
        ecc_enabled: Some(true),
        ecc_volatile_corrected: Some(0),
        ecc_volatile_uncorrected: Some(0),
        ecc_aggregate_uncorrected: Some(0),
        remapped_rows_correctable: Some(0),
        remapped_rows_uncorrectable: Some(0),
        remapped_rows_pending: Some(false),
        remapped_rows_failed: Some(false),
        ..HealthCounters::default()
    };
    GpuStress {
        ordinal,
        name: name.into(),
        uuid: format!("GPU-{ordinal}"),
        compute_capability: Some((9, 0)),
        peaks: datasheet_peaks(name),
        achievable: vec![DtypeBest {
            dtype: DType::Bf16,
            m: 2048,
            n: 2048,
            k: 13312,
            tflops: 781.0,
        }],
        pcie_link_gbs: Some(63.0),
        matmul: vec![
            MatmulStress {
                pct_of_achievable: Some(100.0 * bf16 / 781.0),
                ..matmul(DType::Bf16, bf16, 9800)
            },
            MatmulStress {
                backend: "cuBLASLt (heuristic #0; E4M3 inputs, bf16 output)".into(),
                seconds: 4.5,
                ..matmul(DType::F8E4M3, 1296.0, 4400)
            },
            matmul(DType::Tf32, 371.0, 1900),
        ],
        memory: Some(MemoryStress {
            free_bytes: 84_000_000_000,
            tested_bytes: 75_600_000_000,
            passes: Pattern::ALL
                .iter()
                .map(|&pattern| PatternPass {
                    pattern,
                    passes: 21,
                    words_wrong: 0,
                })
                .collect(),
            seconds: 5.4,
            shortfall: None,
            error: None,
        }),
        copies: vec![
            CopyStress {
                direction: "host->device".into(),
                bytes: 256 << 20,
                copies: 130,
                gbs: Some(53.2),
                pct_of_link: Some(84.4),
                verified: true,
                bytes_wrong: 0,
                error: None,
            },
            CopyStress {
                direction: "device->host".into(),
                bytes: 256 << 20,
                copies: 128,
                gbs: Some(54.9),
                pct_of_link: Some(87.1),
                verified: true,
                bytes_wrong: 0,
                error: None,
            },
        ],
        health_before: Some(health.clone()),
        health_after: Some(health),
        watched: Watched {
            samples: 124,
            max_temperature_c: Some(67),
            max_power_w: Some(699.0),
            power_limit_w: Some(700.0),
            sm_clock_min_mhz: Some(1605),
            sm_clock_median_mhz: Some(1755),
            sm_clock_max_mhz: Some(1980),
            throttle_seen: vec![ThrottleSeen {
                name: "sw_power_cap".into(),
                share: 0.71,
            }],
            xid_events: Vec::new(),
            xid_unreadable: None,
            unreadable: None,
        },
        errors: Vec::new(),
        verdict: Default::default(),
    }
}

fn peer(from: usize, to: usize, verified: bool) -> PeerCopy {
    PeerCopy {
        from,
        to,
        link: Some("NV18 (NVLink 4)".into()),
        peer_access: true,
        bytes: 64 << 20,
        gbs: verified.then_some(371.2),
        pct_of_link: verified.then_some(82.5),
        verified,
        bytes_wrong: 0,
        error: None,
    }
}

fn report() -> StressReport {
    let mut bad = gpu(1, 702.0);
    bad.matmul[0].repeat_words_differing = 1;
    bad.matmul[0].tflops = None;
    bad.matmul[0].pct_of_peak = None;
    bad.matmul[0].pct_of_achievable = None;
    bad.watched.throttle_seen.push(ThrottleSeen {
        name: "hw_thermal".into(),
        share: 0.05,
    });
    bad.watched.max_temperature_c = None;
    bad.watched.xid_unreadable = Some("XID events of device 1: Insufficient Permissions".into());
    if let Some(h) = bad.health_after.as_mut() {
        h.ecc_volatile_corrected = Some(2);
    }
    bad.health_before = None;
    let multi = MultiGpu {
        peer_copies: vec![peer(0, 1, true), peer(1, 0, true)],
        all_reduce: Some(AllReduceCheck {
            gpus: vec![0, 1],
            dtype: DType::F32,
            count: 64 << 20,
            rounds: 5,
            wrong: vec![0, 0],
            busbw_gbs: Some(361.5),
            error: None,
        }),
    };
    let mut gpus = vec![gpu(0, 705.3), bad];
    judge(&mut gpus, Some(&multi), &Rules::default());
    StressReport {
        level: 1,
        duration_s: 30.0,
        budget: Budget::split(30.0),
        elapsed_s: 34.2,
        rules: Rules::default(),
        gpus,
        multi_gpu: Some(multi),
        multi_gpu_not_run: None,
        planted: None,
        fp8_not_run: "fp8 (E4M3) matmul is not run: gpukit's cuBLASLt wrapper has no fp8 types \
                      yet"
        .into(),
    }
}

#[test]
fn stress_one_gpu_passing_at_the_power_cap_one_failing() {
    assert_drawn("stress", &stress_sections(&report()));
}

#[test]
fn stress_says_not_readable_never_zero() {
    let text = super::terminal(&stress_sections(&report()));
    assert!(text.contains("not readable: XID events of device 1"));
    // cuda:1's counters before the run could not be read: no change is claimed
    assert!(text.contains("not readable"));
    assert!(text.contains("PASS") && text.contains("FAIL"));
}

#[test]
fn stress_on_one_gpu_says_what_it_did_not_run() {
    let mut r = report();
    r.gpus.truncate(1);
    r.multi_gpu = None;
    r.multi_gpu_not_run =
        Some("one GPU tested: there is no pair for peer copies or an all-reduce".into());
    let text = super::terminal(&stress_sections(&r));
    assert!(
        text.contains("not run (not passed): one GPU tested"),
        "{text}"
    );
    assert!(text.contains("had none to compare with"));
}

#[test]
fn stress_says_fp8_was_not_run_on_a_gpu_without_it() {
    let mut r = report();
    r.gpus.truncate(1);
    let g = &mut r.gpus[0];
    g.name = "NVIDIA A100-SXM4-80GB".into();
    g.compute_capability = Some((8, 0));
    let why = Budget::split(30.0).matmul_mix((8, 0))[1]
        .1
        .clone()
        .unwrap_err();
    g.matmul[1] = MatmulStress {
        dtype: Some(DType::F8E4M3),
        size: 8192,
        skipped: Some(why),
        ..MatmulStress::default()
    };
    let text = super::terminal(&stress_sections(&r));
    assert!(
        text.contains("not run: f8e4m3 needs compute capability 8.9 or newer; this GPU is 8.0"),
        "{text}"
    );
    assert!(text.contains("its time went to bf16"), "{text}");
}
