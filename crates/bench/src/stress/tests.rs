//! Tests of `stress` that need no GPU: the levels and arguments, the planted fault's variable,
//! and every rule of the verdict on reports built by hand.

use super::kernels::Pattern;
use super::verdict::{judge, FailReason, Rules};
use super::*;
use crate::ceilings::datasheet_peaks;
use crate::report::Verification;
use gpukit_cuda::nvml::HealthCounters;

fn checked(rel_err: f64) -> Verification {
    Verification {
        samples: 256,
        rel_err,
        tolerance: 1.5e-2,
        passed: rel_err <= 1.5e-2,
    }
}

fn matmul(dtype: DType, tflops: f64) -> MatmulStress {
    MatmulStress {
        dtype: Some(dtype),
        size: 8192,
        backend: "cuBLAS GemmEx (default algorithm)".into(),
        products: 400,
        seconds: 10.0,
        tflops: Some(tflops),
        tflops_min: Some(tflops * 0.97),
        tflops_max: Some(tflops * 1.01),
        reference_first: Some(checked(1.7e-3)),
        reference_last: Some(checked(1.7e-3)),
        words_per_result: 8192 * 8192 / 2,
        ..MatmulStress::default()
    }
}

/// A healthy H100 that ran every test.
fn h100(ordinal: usize, bf16_tflops: f64) -> GpuStress {
    let mut g = GpuStress::new(ordinal);
    g.name = "NVIDIA H100 80GB HBM3".into();
    g.uuid = format!("GPU-{ordinal}");
    g.peaks = datasheet_peaks(&g.name);
    g.matmul = vec![matmul(DType::Bf16, bf16_tflops), matmul(DType::Tf32, 380.0)];
    g.memory = Some(MemoryStress {
        free_bytes: 80 << 30,
        tested_bytes: 72 << 30,
        passes: Pattern::ALL
            .iter()
            .map(|&pattern| PatternPass {
                pattern,
                passes: 10,
                words_wrong: 0,
            })
            .collect(),
        seconds: 5.0,
        ..MemoryStress::default()
    });
    g.copies = vec![CopyStress {
        direction: "host->device".into(),
        bytes: 256 << 20,
        copies: 40,
        gbs: Some(52.0),
        pct_of_link: Some(82.0),
        verified: true,
        bytes_wrong: 0,
        error: None,
    }];
    let health = HealthCounters {
        ecc_enabled: Some(true),
        ecc_volatile_corrected: Some(0),
        ecc_volatile_uncorrected: Some(0),
        ..HealthCounters::default()
    };
    g.health_before = Some(health.clone());
    g.health_after = Some(health);
    g.watched.samples = 100;
    g
}

fn reasons(g: &GpuStress) -> Vec<FailReason> {
    g.verdict.reasons().to_vec()
}

fn judged(mut gpus: Vec<GpuStress>) -> Vec<GpuStress> {
    judge(&mut gpus, None, &Rules::default());
    gpus
}

#[test]
fn a_healthy_gpu_passes() {
    let g = &judged(vec![h100(0, 700.0)])[0];
    assert!(g.verdict.passed(), "{:?}", g.verdict);
    assert!(g.verdict.warnings().is_empty());
}

#[test]
fn a_repeat_that_differs_from_the_first_product_fails_with_the_count() {
    let mut g = h100(0, 700.0);
    g.matmul[0].repeat_words_differing = 1;
    let r = reasons(&judged(vec![g])[0]);
    assert_eq!(r.len(), 1);
    let line = r[0].describe();
    assert!(
        line.contains("matmul bf16") && line.contains("1 of ") && line.contains("words differ"),
        "{line}"
    );
}

#[test]
fn a_product_off_its_reference_fails() {
    let mut g = h100(0, 700.0);
    g.matmul[1].reference_last = Some(checked(0.5));
    let r = reasons(&judged(vec![g])[0]);
    assert!(matches!(&r[..], [FailReason::OffReference { test, .. }] if test == "matmul tf32"));
}

#[test]
fn memory_words_off_their_pattern_fail_with_the_count() {
    let mut g = h100(0, 700.0);
    if let Some(m) = g.memory.as_mut() {
        m.passes[2].words_wrong = 3;
    }
    let r = reasons(&judged(vec![g])[0]);
    match &r[..] {
        [FailReason::WrongResult {
            test,
            wrong,
            checked,
            ..
        }] => {
            assert_eq!((test.as_str(), *wrong), ("memory", 3));
            // 40 passes over 72 GiB, counted in 4-byte words
            assert_eq!(*checked, 40 * (72u64 << 30) / 4);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_copy_that_did_not_arrive_intact_fails_and_an_error_is_never_a_pass() {
    let mut g = h100(0, 700.0);
    g.copies[0].verified = false;
    g.copies[0].bytes_wrong = 2;
    let mut h = h100(1, 700.0);
    h.matmul[1].error = Some("CUBLAS_STATUS_EXECUTION_FAILED".into());
    let gpus = judged(vec![g, h]);
    assert!(
        matches!(&reasons(&gpus[0])[..], [FailReason::WrongResult { test, .. }] if test == "copy host->device")
    );
    assert!(
        matches!(&reasons(&gpus[1])[..], [FailReason::TestError { test, .. }] if test == "matmul tf32")
    );
}

#[test]
fn a_gpu_that_ran_nothing_fails() {
    let mut g = GpuStress::new(0);
    g.name = "x".into();
    let r = reasons(&judged(vec![g])[0]);
    assert!(matches!(&r[..], [FailReason::TestError { .. }]), "{r:?}");
}

#[test]
fn new_uncorrected_ecc_errors_fail_and_corrected_ones_warn() {
    let mut g = h100(0, 700.0);
    if let Some(after) = g.health_after.as_mut() {
        after.ecc_volatile_uncorrected = Some(2);
        after.ecc_volatile_corrected = Some(5);
    }
    let g = &judged(vec![g])[0];
    assert_eq!(reasons(g), [FailReason::EccErrors { uncorrected: 2 }]);
    assert!(g.verdict.warnings()[0].contains("5 corrected"));
}

#[test]
fn unreadable_ecc_counts_neither_fail_nor_pass_as_zero() {
    let mut g = h100(0, 700.0);
    g.health_before = Some(HealthCounters::default());
    g.health_after = Some(HealthCounters {
        ecc_volatile_uncorrected: Some(9),
        ..HealthCounters::default()
    });
    // before was not readable: no difference can be claimed
    assert!(judged(vec![g])[0].verdict.passed());
}

#[test]
fn a_failed_row_remapping_and_an_xid_fail() {
    let mut g = h100(0, 700.0);
    if let Some(after) = g.health_after.as_mut() {
        after.remapped_rows_failed = Some(true);
    }
    g.watched.xid_events = vec![Some(79)];
    let r = reasons(&judged(vec![g])[0]);
    assert!(r.contains(&FailReason::RowRemapFailed));
    assert!(r.contains(&FailReason::Xid {
        xids: vec![Some(79)]
    }));
    assert!(r.iter().any(|x| x.describe().contains("79")));
}

#[test]
fn heat_fails_but_the_power_cap_does_not() {
    let mut capped = h100(0, 700.0);
    capped.watched.throttle_seen = vec![ThrottleSeen {
        name: "sw_power_cap".into(),
        share: 0.9,
    }];
    let mut hot = h100(1, 700.0);
    hot.watched.throttle_seen = vec![
        ThrottleSeen {
            name: "sw_power_cap".into(),
            share: 0.9,
        },
        ThrottleSeen {
            name: "hw_thermal".into(),
            share: 0.1,
        },
    ];
    let mut braked = h100(2, 700.0);
    braked.watched.throttle_seen = vec![ThrottleSeen {
        name: "hw_power_brake".into(),
        share: 0.05,
    }];
    let gpus = judged(vec![capped, hot, braked]);
    assert!(gpus[0].verdict.passed());
    assert_eq!(
        reasons(&gpus[1]),
        [FailReason::Thermal {
            reasons: vec!["hw_thermal".into()]
        }]
    );
    assert!(gpus[2].verdict.passed());
    assert!(gpus[2].verdict.warnings()[0].contains("hw_power_brake"));
}

#[test]
fn below_ninety_percent_of_the_best_gpu_of_the_same_model_fails() {
    // 629 < 0.9 x 700 = 630; 631 passes
    let gpus = judged(vec![h100(0, 700.0), h100(1, 629.0), h100(2, 631.0)]);
    assert!(gpus[0].verdict.passed());
    match &reasons(&gpus[1])[..] {
        [FailReason::BelowBest {
            best_gpu,
            best_tflops,
            ..
        }] => assert_eq!((*best_gpu, *best_tflops), (0, 700.0)),
        other => panic!("{other:?}"),
    }
    assert!(gpus[2].verdict.passed());
    // another model is not held to an H100's rate
    let mut other = h100(3, 300.0);
    other.name = "NVIDIA A100-SXM4-80GB".into();
    other.peaks = datasheet_peaks(&other.name);
    let gpus = judged(vec![h100(0, 700.0), other]);
    assert!(gpus[1].verdict.passed(), "{:?}", gpus[1].verdict);
}

#[test]
fn below_the_datasheet_floor_fails_where_gpukit_knows_the_peak() {
    // an H100 SXM's bf16 datasheet peak is 989.4: 60% is 593.6
    let g = &judged(vec![h100(0, 590.0)])[0];
    assert!(matches!(&reasons(g)[..], [FailReason::BelowPeak { floor, .. }] if *floor == 0.6));
    // an estimated peak is not a datasheet: no floor
    let mut est = h100(0, 100.0);
    est.peaks = None;
    assert!(judged(vec![est])[0].verdict.passed());
}

#[test]
fn fp8_is_held_to_the_best_gpu_of_its_model_not_to_the_datasheet() {
    let with_fp8 = |ordinal: usize, fp8: f64| {
        let mut g = h100(ordinal, 700.0);
        g.matmul.insert(1, matmul(DType::F8E4M3, fp8));
        g
    };
    // 900 is 45% of an H100's fp8 datasheet peak (1978.9): no floor for fp8 yet
    let gpus = judged(vec![with_fp8(0, 900.0)]);
    assert!(gpus[0].verdict.passed(), "{:?}", gpus[0].verdict);
    // but an fp8 rate under 90% of the best H100's fails
    let gpus = judged(vec![with_fp8(0, 1300.0), with_fp8(1, 1100.0)]);
    assert!(gpus[0].verdict.passed());
    assert!(
        matches!(
            &reasons(&gpus[1])[..],
            [FailReason::BelowBest {
                dtype: DType::F8E4M3,
                ..
            }]
        ),
        "{:?}",
        gpus[1].verdict
    );
}

#[test]
fn every_reason_is_listed_not_just_the_first() {
    let mut g = h100(0, 590.0);
    g.matmul[0].repeat_words_differing = 4;
    g.watched.throttle_seen = vec![ThrottleSeen {
        name: "sw_thermal".into(),
        share: 0.5,
    }];
    assert_eq!(reasons(&judged(vec![g])[0]).len(), 3);
}

#[test]
fn the_document_names_each_failing_gpu() {
    let mut bad = h100(1, 700.0);
    bad.matmul[0].repeat_words_differing = 1;
    let gpus = judged(vec![h100(0, 700.0), bad]);
    let report = StressReport {
        level: 1,
        duration_s: 30.0,
        budget: Budget::split(30.0),
        elapsed_s: 31.0,
        rules: Rules::default(),
        gpus,
        multi_gpu: None,
        multi_gpu_not_run: None,
        planted: Some(PlantedFault {
            test: FaultTest::Matmul,
            gpu: 1,
        }),
        fp8_not_run: String::new(),
    };
    let doc = document(report);
    let failure = doc.failure.unwrap();
    assert!(
        failure.starts_with("cuda:1 failed: wrong result in matmul bf16"),
        "{failure}"
    );
    assert!(!failure.contains("cuda:0"));
    assert!(doc.notes[0].contains("planted"));
}

#[test]
fn levels_durations_and_gpus_are_checked() {
    assert_eq!(level_seconds(1).unwrap(), 30.0);
    assert_eq!(level_seconds(2).unwrap(), 180.0);
    assert_eq!(level_seconds(3).unwrap(), 900.0);
    for bad in [0, 4] {
        assert!(matches!(level_seconds(bad), Err(Error::BadInput(_))));
    }
    assert_eq!(StressOptions::new(2, None).unwrap().duration_s, 180.0);
    assert_eq!(StressOptions::new(2, Some(90.0)).unwrap().duration_s, 90.0);
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e9] {
        assert!(
            matches!(StressOptions::new(1, Some(bad)), Err(Error::BadInput(_))),
            "{bad}"
        );
    }
    assert_eq!(select_gpus(None, 2).unwrap(), [0, 1]);
    assert_eq!(select_gpus(Some(&[1, 1, 0]), 2).unwrap(), [1, 0]);
    assert!(matches!(select_gpus(Some(&[2]), 2), Err(Error::BadInput(m)) if m.contains("cuda:2")));
    assert!(matches!(select_gpus(None, 0), Err(Error::Unavailable(_))));
}

#[test]
fn the_budget_gives_most_time_to_bf16_and_fits_the_duration() {
    let b = Budget::split(30.0);
    let total = b.matmul_bf16_s + b.matmul_fp8_s + b.matmul_tf32_s + b.memory_s + b.copies_s;
    assert!(total < 30.0 && total > 27.0, "{total}");
    assert!(b.matmul_bf16_s > b.matmul_tf32_s && b.matmul_bf16_s > b.memory_s);
    assert!(b.matmul_fp8_s > 0.0);
}

#[test]
fn fp8_joins_the_matmul_mix_from_compute_capability_8_9() {
    let b = Budget::split(100.0);
    // Hopper: bf16, fp8 and tf32, each its own share
    let h100 = b.matmul_mix((9, 0));
    let dtypes: Vec<DType> = h100.iter().map(|(d, _)| *d).collect();
    assert_eq!(dtypes, [DType::Bf16, DType::F8E4M3, DType::Tf32]);
    assert_eq!(h100[0].1, Ok(b.matmul_bf16_s));
    assert_eq!(h100[1].1, Ok(b.matmul_fp8_s));
    assert_eq!(h100[2].1, Ok(b.matmul_tf32_s));
    // Ada has fp8 too
    assert!(b.matmul_mix((8, 9))[1].1.is_ok());
    // A100: fp8 not run, with the reason; its time goes to bf16, the total stays
    let a100 = b.matmul_mix((8, 0));
    let why = a100[1].1.clone().unwrap_err();
    assert!(
        why.contains("8.9") && why.contains("this GPU is 8.0"),
        "{why}"
    );
    assert_eq!(a100[0].1, Ok(b.matmul_bf16_s + b.matmul_fp8_s));
    assert_eq!(a100[2].1, Ok(b.matmul_tf32_s));
    // Turing: only f16-era arithmetic, none of the three
    assert!(b.matmul_mix((7, 5)).iter().all(|(_, s)| s.is_err()));
}

#[test]
fn the_planted_fault_variable_is_read_strictly() {
    assert_eq!(parse_plant(None).unwrap(), None);
    assert_eq!(parse_plant(Some("")).unwrap(), None);
    assert_eq!(
        parse_plant(Some("matmul:0")).unwrap(),
        Some(PlantedFault {
            test: FaultTest::Matmul,
            gpu: 0
        })
    );
    assert_eq!(
        parse_plant(Some(" memory:3 ")).unwrap(),
        Some(PlantedFault {
            test: FaultTest::Memory,
            gpu: 3
        })
    );
    for bad in ["matmul", "matmul:x", "disk:0", ":0"] {
        assert!(
            matches!(parse_plant(Some(bad)), Err(Error::BadInput(_))),
            "{bad}"
        );
    }
}

#[test]
fn a_wrong_peer_copy_fails_both_gpus_and_a_wrong_all_reduce_the_gpu_it_was_wrong_on() {
    let copy = |from: usize, to: usize, verified: bool| PeerCopy {
        from,
        to,
        link: Some("NV18 (NVLink 4)".into()),
        peer_access: true,
        bytes: 64 << 20,
        gbs: verified.then_some(370.0),
        pct_of_link: verified.then_some(82.0),
        verified,
        bytes_wrong: if verified { 0 } else { 3 },
        error: None,
    };
    let multi = MultiGpu {
        peer_copies: vec![
            copy(0, 1, false),
            copy(1, 0, true),
            copy(0, 2, true),
            copy(2, 0, true),
            copy(1, 2, true),
            copy(2, 1, true),
        ],
        all_reduce: Some(AllReduceCheck {
            gpus: vec![0, 1, 2],
            dtype: DType::F32,
            count: 1 << 20,
            rounds: 5,
            wrong: vec![0, 0, 7],
            busbw_gbs: Some(360.0),
            error: None,
        }),
    };
    let mut gpus = vec![h100(0, 700.0), h100(1, 700.0), h100(2, 700.0)];
    judge(&mut gpus, Some(&multi), &Rules::default());
    for g in &gpus[..2] {
        assert!(
            matches!(&reasons(g)[..], [FailReason::WrongResult { test, .. }] if test == "peer copy cuda:0 -> cuda:1"),
            "{:?}",
            g.verdict
        );
    }
    match &reasons(&gpus[2])[..] {
        [FailReason::WrongResult {
            test,
            wrong,
            checked,
            ..
        }] => assert_eq!(
            (test.as_str(), *wrong, *checked),
            ("NCCL all-reduce", 7, 5 << 20)
        ),
        other => panic!("{other:?}"),
    }
    // an all-reduce that could not run is never a pass for the GPUs in it
    let failed = MultiGpu {
        peer_copies: Vec::new(),
        all_reduce: Some(AllReduceCheck {
            error: Some("NCCL: unhandled system error".into()),
            ..multi.all_reduce.clone().unwrap()
        }),
    };
    let mut gpus = vec![h100(0, 700.0), h100(1, 700.0)];
    judge(&mut gpus, Some(&failed), &Rules::default());
    assert!(gpus.iter().all(|g| !g.verdict.passed()));
}

#[test]
fn differing_bytes_are_counted_with_a_short_copy_as_wrong() {
    assert_eq!(bytes_differing(b"abcd", b"abcd"), 0);
    assert_eq!(bytes_differing(b"abcd", b"abXY"), 2);
    assert_eq!(bytes_differing(b"abcd", b"ab"), 2);
}
