//! Tests of `bench matmul` that need no GPU.
use super::gpu::{pick_candidate, trial_for, trial_order};
use super::turns::{block_reps, peer_figure, TurnShape};
use super::*;
use crate::cpu;
use crate::gpu::gpu_lacks;
use crate::measure::PeerSamples;
use crate::measure::MAX_BLOCK_REPS;
use crate::workload::gemm::{verify_square, HostPair};
use gpukit_tensor::codec::element_f64;

fn cpu_only(sizes: Vec<usize>, dtypes: Vec<DType>) -> MatmulReport {
    let discovery = gpukit_cuda::loader::discover();
    let opts = MatmulOptions {
        sizes,
        dtypes: Some(dtypes),
        selection: DeviceSelection::One(Device::Cpu),
        iterations: 3,
        warmup: 1,
        cpu_budget_s: 5.0,
        lt_candidates: 0,
        ..MatmulOptions::default()
    };
    run_matmul(&discovery, &opts, &mut |_| {})
}

#[cfg(unix)]
#[test]
fn a_peer_takes_turns_on_every_cpu_row() {
    let dir = std::env::temp_dir().join(format!("gpukit-turns-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let python = gpukit_harness::peer::fake::fake_python(&dir).unwrap();
    let server = PeerServer::start_with(python, "cpu", Some(1)).unwrap();
    let mut turns = Turns {
        server: Some(server),
        missed: Vec::new(),
        meter: None,
    };
    let opts = MatmulOptions {
        sizes: vec![48],
        dtypes: Some(vec![DType::F32, DType::Bf16]),
        selection: DeviceSelection::One(Device::Cpu),
        iterations: 6,
        rounds: 3,
        ..MatmulOptions::default()
    };
    let discovery = gpukit_cuda::loader::discover();
    let r = run_matmul_turns(&discovery, &opts, &mut turns, &mut |_| {});
    let f32_row = r.rows.iter().find(|r| r.dtype == DType::F32).unwrap();
    let p = f32_row.pytorch.as_ref().expect("a PyTorch figure");
    // the fake answers [1.5, 2.5] per block: median 2.0 ms
    assert_eq!(p.median_ms, 2.0);
    assert_eq!(p.turn_ratios.len(), 3);
    assert!(p.turn_ratios.iter().all(|x| x.is_finite() && *x > 0.0));
    // our 6 iterations were split over the 3 rounds
    assert_eq!(f32_row.timing.as_ref().unwrap().summary_ms.count, 6);
    // bf16 on the CPU is the f32 run relabelled: no PyTorch figure of another dtype
    let bf16_row = r.rows.iter().find(|r| r.dtype == DType::Bf16).unwrap();
    assert!(bf16_row.pytorch.is_none());
    assert!(turns.missed.is_empty(), "{:?}", turns.missed);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_ratio_averages_both_openers() {
    // ours 2% ahead when we opened, 2% behind when PyTorch did: parity, not either
    let peer = PeerSamples {
        samples: vec![1.0; 4],
        turn_ratios: vec![1.03, 1.02, 1.01, 0.97, 0.98, 0.99],
        by_opener: vec![1.02, 0.98],
    };
    let f = peer_figure(Some(peer), 2e12, 2.0).unwrap();
    assert!((f.ratio - (1.02f64 * 0.98).sqrt()).abs() < 1e-12);
    assert_eq!(f.by_opener, vec![1.02, 0.98]);
    // one order only: its median
    let one = PeerSamples {
        samples: vec![1.0; 2],
        turn_ratios: vec![1.1],
        by_opener: vec![1.1],
    };
    assert_eq!(peer_figure(Some(one), 2e12, 2.0).unwrap().ratio, 1.1);
}

#[test]
fn gpu_turns_are_lengthened_to_the_shortest_block() {
    let shape = |per_rep_ms, sets| Some(TurnShape { per_rep_ms, sets });
    // f64 at 4096: 2.4 ms a product, 10 repetitions a turn asked, 100 ms wanted
    assert_eq!(block_reps(10, shape(2.4, 1), 100.0), 42);
    // long products keep the asked count
    assert_eq!(block_reps(10, shape(20.0, 1), 100.0), 10);
    // tiny ones stop at the cap; unknown or zero times, or no minimum, change nothing
    assert_eq!(block_reps(10, shape(1e-4, 1), 100.0), MAX_BLOCK_REPS);
    assert_eq!(block_reps(10, None, 100.0), 10);
    assert_eq!(block_reps(10, shape(0.0, 1), 100.0), 10);
    assert_eq!(block_reps(10, shape(2.4, 1), 0.0), 10);
    // whole passes over the operand sets: 42 -> 44 over 4 sets, 10 -> 12
    assert_eq!(block_reps(10, shape(2.4, 4), 100.0), 44);
    assert_eq!(block_reps(10, shape(20.0, 4), 100.0), 12);
}

#[test]
fn trial_rounds_vary_who_runs_first() {
    assert_eq!(trial_order(4, 0), vec![0, 1, 2, 3]);
    assert_eq!(trial_order(4, 1), vec![1, 0, 3, 2]);
    assert_eq!(trial_order(4, 2), vec![2, 3, 0, 1]);
    assert!(trial_order(0, 3).is_empty());
    // every round runs every candidate once
    for r in 0..6 {
        let mut o = trial_order(5, r);
        o.sort_unstable();
        assert_eq!(o, vec![0, 1, 2, 3, 4]);
    }
    let firsts: Vec<usize> = (0..3).map(|r| trial_order(5, r)[0]).collect();
    assert_eq!(firsts, vec![0, 1, 2]);
}

#[test]
fn candidates_must_beat_cublas_by_a_margin() {
    // a hair faster: cuBLAS's own choice stays
    assert_eq!(pick_candidate(&[Some(1.0), Some(0.995)]), Some((1.0, 0)));
    // clearly faster: taken
    assert_eq!(
        pick_candidate(&[Some(1.0), Some(0.9), Some(0.95)]),
        Some((0.9, 1))
    );
    // cuBLAS failed to run: the best of the rest
    assert_eq!(
        pick_candidate(&[None, Some(2.0), Some(1.5)]),
        Some((1.5, 2))
    );
    assert_eq!(pick_candidate(&[None, None]), None);
    assert_eq!(pick_candidate(&[]), None);
}

#[test]
fn cpu_rows_are_verified_and_rated() {
    let r = cpu_only(
        vec![33, 64],
        vec![DType::F64, DType::F32, DType::F16, DType::Bf16],
    );
    assert_eq!(r.rows.len(), 8);
    for row in &r.rows {
        assert_eq!(row.status, RowStatus::Ok, "{row:?}");
        let v = row.verification.as_ref().unwrap();
        assert!(v.passed && v.rel_err < v.tolerance, "{row:?}");
        assert!(row.tflops.unwrap() > 0.0);
        assert!(row.pct_of_best.unwrap() <= 100.0 + 1e-9);
    }
    let bf = r.rows.iter().find(|x| x.dtype == DType::Bf16).unwrap();
    assert!(bf.computed_as.as_deref().unwrap().starts_with("f32"));
}

#[test]
fn a_wrong_product_fails_verification() {
    let n = 24;
    let ty = DType::F32;
    let pair = HostPair {
        a: encode_f32(&uniform_f32(n * n, 1), ty),
        b: encode_f32(&uniform_f32(n * n, 2), ty),
    };
    let a: Vec<f32> = (0..n * n)
        .map(|i| element_f64(&pair.a, ty, i) as f32)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| element_f64(&pair.b, ty, i) as f32)
        .collect();
    let mut c = vec![0f32; n * n];
    cpu::matmul_f32(&a, &b, &mut c, n, n, n);
    let good = bytes_of(&c).to_vec();
    assert!(verify_square(ty, DType::F32, &pair, &good, n, 9).passed);
    // one wrong entry in the last row/column (always sampled) must fail
    c[n * n - 1] += 0.5;
    let bad = bytes_of(&c).to_vec();
    assert!(!verify_square(ty, DType::F32, &pair, &bad, n, 9).passed);
    // NaN (an unwritten poisoned output) must fail
    let nan = vec![0xFFu8; n * n * 4];
    let v = verify_square(ty, DType::F32, &pair, &nan, n, 9);
    assert!(!v.passed && v.rel_err.is_infinite());
}

#[test]
fn tf32_error_cannot_pass_as_f32() {
    // TF32 keeps 10 mantissa bits: rounding inputs so must exceed the f32 tolerance
    let n = 256;
    let ty = DType::F32;
    let a = uniform_f32(n * n, 3);
    let b = uniform_f32(n * n, 4);
    let round = |x: f32| f32::from_bits(x.to_bits() & !0x1FFF);
    let at: Vec<f32> = a.iter().map(|&x| round(x)).collect();
    let bt: Vec<f32> = b.iter().map(|&x| round(x)).collect();
    let mut c = vec![0f32; n * n];
    cpu::matmul_f32(&at, &bt, &mut c, n, n, n);
    let pair = HostPair {
        a: encode_f32(&a, ty),
        b: encode_f32(&b, ty),
    };
    let bytes = bytes_of(&c).to_vec();
    let v = verify_square(ty, DType::F32, &pair, &bytes, n, 5);
    assert!(!v.passed, "{v:?}");
    assert!(verify_square(ty, DType::Tf32, &pair, &bytes, n, 5).passed);
}

#[test]
fn fp8_rows_are_skipped_below_compute_capability_8_9() {
    let dev = Device::Cuda(0);
    let rows = super::gpu::lacking_rows(dev, (8, 0), DType::F8E4M3, &[1024, 4096]).unwrap();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r.dtype, DType::F8E4M3);
        match &r.status {
            RowStatus::Skipped(why) => assert!(why.contains("8.9"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(r.tflops.is_none());
    }
    // Ada (8.9) and Hopper run them
    assert!(super::gpu::lacking_rows(dev, (8, 9), DType::F8E4M3, &[1024]).is_none());
    assert!(super::gpu::lacking_rows(dev, (9, 0), DType::F8E4M3, &[1024]).is_none());
}

#[test]
fn fp8_shapes_must_be_multiples_of_16_and_others_are_free() {
    use crate::workload::gemm::unsupported_shape;
    assert_eq!(unsupported_shape(DType::F8E4M3, (1024, 1024, 1024)), None);
    assert_eq!(unsupported_shape(DType::F8E4M3, (2048, 2048, 13312)), None);
    // the default sizes 1000 and 1023 are skipped, with the reason
    for n in [1000, 1023] {
        let why = unsupported_shape(DType::F8E4M3, (n, n, n)).unwrap();
        assert!(
            why.contains("multiples of 16") && why.contains(&n.to_string()),
            "{why}"
        );
    }
    assert!(unsupported_shape(DType::F8E4M3, (64, 48, 40)).is_some());
    assert_eq!(unsupported_shape(DType::Bf16, (1023, 1023, 1023)), None);
}

#[test]
fn fp8_asked_of_the_cpu_is_a_skipped_row() {
    let r = cpu_only(vec![64], vec![DType::F8E4M3]);
    assert_eq!(r.rows.len(), 1);
    assert_eq!(
        r.rows[0].status,
        RowStatus::Skipped(super::cpu::CPU_FP8.into())
    );
}

#[test]
fn the_fp8_b_operand_is_read_back_untransposed() {
    // B (k = 2 x n = 3) stored transposed: rows of B^T are B's columns
    let bt = vec![1u8, 4, 2, 5, 3, 6];
    let b = crate::workload::gemm::b_as_stored(DType::F8E4M3, bt.clone(), 2, 3);
    assert_eq!(b, vec![1, 2, 3, 4, 5, 6]);
    // other dtypes are stored as B already
    assert_eq!(
        crate::workload::gemm::b_as_stored(DType::Bf16, bt.clone(), 2, 3),
        bt
    );
    // an fp8 row says how closely it was checked
    let cell = crate::workload::gemm::fp8_backend("cuBLASLt (heuristic #0)", 1.5e-2);
    assert!(cell.starts_with("cuBLASLt (heuristic #0); E4M3"), "{cell}");
    assert!(cell.ends_with("to 1.5e-2"), "{cell}");
}

#[test]
fn dtype_support_by_compute_capability() {
    assert!(gpu_lacks((7, 5), DType::Bf16).is_some());
    assert!(gpu_lacks((7, 5), DType::F16).is_none());
    assert!(gpu_lacks((8, 0), DType::Tf32).is_none());
    assert!(gpu_lacks((9, 0), DType::F64).is_none());
    assert!(gpu_lacks((7, 0), DType::Tf32).unwrap().contains("8.0"));
}

#[test]
fn finish_rows_derives_ratios() {
    let mut g = MatmulRow::new(Device::Cuda(0), DType::F32, 8);
    g.tflops = Some(50.0);
    let mut g2 = MatmulRow::new(Device::Cuda(0), DType::F32, 16);
    g2.tflops = Some(25.0);
    let mut c = MatmulRow::new(Device::Cpu, DType::F32, 8);
    c.tflops = Some(2.0);
    let mut rows = vec![g, g2, c];
    let peaks = crate::ceilings::datasheet_peaks("NVIDIA H100 80GB HBM3").unwrap();
    finish_rows(&mut rows, Some(&peaks));
    assert_eq!(rows[0].pct_of_best, Some(100.0));
    assert_eq!(rows[1].pct_of_best, Some(50.0));
    assert_eq!(rows[0].speedup_vs_cpu, Some(25.0));
    assert!((rows[0].pct_of_peak.unwrap() - 100.0 * 50.0 / 66.9).abs() < 1e-9);
    assert_eq!(rows[2].speedup_vs_cpu, None);
}

#[test]
fn long_products_take_shorter_trials() {
    let t = super::Trial {
        warmup: 2,
        reps: 5,
        rounds: 3,
    };
    // short products and an unknown length keep the trial
    assert_eq!(trial_for(t, None), t);
    assert_eq!(trial_for(t, Some(2.8)), t);
    assert_eq!(trial_for(t, Some(7.9)), t);
    // a 22 ms product: one warm-up, two runs (40 ms a turn), the same rounds
    let long = trial_for(t, Some(22.0));
    assert_eq!((long.warmup, long.reps, long.rounds), (1, 2, 3));
    // 9 ms: five runs fill 40 ms, never more than the trial's own
    assert_eq!(trial_for(t, Some(9.0)).reps, 5);
    assert_eq!(trial_for(t, Some(10.0)).reps, 4);
}
