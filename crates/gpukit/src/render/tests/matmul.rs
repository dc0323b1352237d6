//! `gpukit bench matmul`: rows that passed, failed and were skipped, with and without PyTorch.

use super::{assert_drawn, h100, pytorch, timing, verified};
use crate::render::{matmul_search_sections, matmul_sections};
use gpukit_bench::matmul::{Init, MatmulReport, MatmulRow};
use gpukit_bench::measure::Clock;
use gpukit_bench::power::RowPower;
use gpukit_bench::report::RowStatus;
use gpukit_tensor::{DType, Device};

/// A row that produced a figure: `tflops` at `median` ms.
fn measured(device: Device, dtype: DType, size: usize, median: f64, tflops: f64) -> MatmulRow {
    let clock = match device {
        Device::Cpu => Clock::Host,
        Device::Cuda(_) => Clock::CudaEvents,
    };
    MatmulRow {
        timing: Some(timing(clock, median, median * 0.98, median * 1.05, 50)),
        tflops: Some(tflops),
        pct_of_best: Some(100.0),
        verification: Some(verified(2.4e-7)),
        ..without_figure(device, dtype, size, RowStatus::Ok)
    }
}

fn without_figure(device: Device, dtype: DType, size: usize, status: RowStatus) -> MatmulRow {
    MatmulRow {
        device,
        dtype,
        size,
        status,
        backend: None,
        computed_as: None,
        timing: None,
        tflops: None,
        pct_of_peak: None,
        pct_of_best: None,
        speedup_vs_cpu: None,
        verification: None,
        pytorch: None,
        candidates: Vec::new(),
        confirmation: None,
        power: None,
        pytorch_power: None,
    }
}

/// What the chip drew during a row's blocks: `w` watts, held at the power cap for `capped` of
/// the readings, with `others` other processes on the GPU.
fn drew(w: f64, capped: f64, others: usize) -> RowPower {
    RowPower {
        readings: 40,
        mean_w: w - 5.0,
        median_w: w,
        max_w: w + 12.0,
        limit_w: Some(700.0),
        instant: true,
        mean_sm_clock_mhz: Some(1755.0),
        throttled: if capped > 0.0 {
            [("sw_power_cap".to_string(), capped)].into()
        } else {
            Default::default()
        },
        other_processes: (0..others as u32).map(|p| 9000 + p).collect(),
    }
}

/// CPU and GPU rows at two sizes: a CPU dtype computed in f32, a GPU row whose check failed, a
/// CPU row skipped for time.
fn report() -> MatmulReport {
    let gpu = Device::Cuda(0);
    let mut cpu_f32 = measured(Device::Cpu, DType::F32, 1024, 1.412, 1.52);
    cpu_f32.backend = Some("gemm crate (AVX-512)".into());
    let mut cpu_tf32 = measured(Device::Cpu, DType::Tf32, 1024, 1.398, 1.54);
    cpu_tf32.computed_as = Some("f32".into());
    let mut f32_small = measured(gpu, DType::F32, 1024, 0.052, 41.3);
    f32_small.backend = Some("cuBLAS GemmEx".into());
    f32_small.pct_of_peak = Some(61.7);
    f32_small.pct_of_best = Some(80.1);
    f32_small.speedup_vs_cpu = Some(27.2);
    let mut f32_large = measured(gpu, DType::F32, 8192, 21.33, 51.55);
    f32_large.backend = Some("cuBLAS GemmEx".into());
    f32_large.pct_of_peak = Some(77.1);
    let mut tf32 = measured(gpu, DType::Tf32, 8192, 2.905, 378.5);
    tf32.backend = Some("cuBLASLt (heuristic #2)".into());
    tf32.pct_of_peak = Some(76.5);
    tf32.verification = Some(verified(2.9e-4));
    let mut bf16 = measured(gpu, DType::Bf16, 8192, 1.543, 712.4);
    bf16.backend = Some("cuBLAS GemmEx".into());
    bf16.pct_of_peak = Some(72.0);
    bf16.verification = Some(verified(1.7e-3));
    MatmulReport {
        gpu: Some(h100()),
        gpu_unavailable: None,
        cpu_model: "AMD EPYC 9454 48-Core Processor".into(),
        cpu_threads: 16,
        iterations: 50,
        inputs: Init::Normal,
        rounds: 0,
        turn_ms: 0.0,
        soak_ms: 0.0,
        achievable: Vec::new(),
        rows: vec![
            cpu_f32,
            cpu_tf32,
            without_figure(
                Device::Cpu,
                DType::F32,
                8192,
                RowStatus::Skipped("over the CPU's 5 s budget".into()),
            ),
            f32_small,
            f32_large,
            tf32,
            bf16,
            without_figure(
                gpu,
                DType::F16,
                8192,
                RowStatus::Failed("relative error 3.1e-2 over the tolerance 1e-2".into()),
            ),
        ],
    }
}

#[test]
fn matmul_rows_that_passed_failed_and_were_skipped() {
    assert_drawn("matmul", &matmul_sections(&report()));
}

#[test]
fn matmul_against_pytorch() {
    let mut r = report();
    r.rounds = 5;
    r.inputs = Init::Uniform;
    for row in r.rows.iter_mut().filter(|x| x.device != Device::Cpu) {
        row.pytorch = row.tflops.map(|t| match row.dtype {
            DType::Tf32 => pytorch(t / 1.02, 1.02, &[0.99, 1.02, 1.03, 1.01, 1.05]),
            _ => pytorch(t * 1.1, 0.91, &[]),
        });
    }
    assert_drawn("matmul_pytorch", &matmul_sections(&r));
}

#[test]
fn matmul_gpu_rows_with_power_beside_pytorchs() {
    let mut r = report();
    r.rounds = 5;
    for row in r.rows.iter_mut().filter(|x| x.device != Device::Cpu) {
        row.pytorch = row.tflops.map(|t| pytorch(t / 1.01, 1.01, &[]));
        if row.tflops.is_some() {
            let (capped, others) = match (row.dtype, row.size) {
                (DType::Bf16, _) => (0.92, 0),
                (DType::F32, 1024) => (0.0, 1),
                _ => (0.1, 0),
            };
            row.power = Some(drew(300.0 + row.size as f64 / 20.0, capped, others));
            row.pytorch_power = Some(drew(310.0 + row.size as f64 / 20.0, capped, 0));
        }
    }
    assert_drawn("matmul_power", &matmul_sections(&r));
}

#[test]
fn matmul_names_the_searched_ceiling_when_one_was_kept() {
    let mut r = report();
    r.achievable = vec![gpukit_bench::workload::gemm::DtypeBest {
        dtype: DType::Bf16,
        m: 2048,
        n: 2048,
        k: 13312,
        tflops: 785.3,
    }];
    let notes = &matmul_sections(&r)[0].notes;
    assert!(
        notes.iter().any(|n| n
            == "achievable ceiling (bench matmul --search on this GPU, driver and cuBLASLt): bf16 785 TFLOP/s at 2048x2048x13312"),
        "{notes:#?}"
    );
}

#[test]
fn matmul_without_a_gpu_says_why() {
    let mut r = report();
    r.gpu = None;
    r.gpu_unavailable = Some("no NVIDIA driver found".into());
    r.rows.retain(|x| x.device == Device::Cpu);
    let notes = &matmul_sections(&r)[0].notes;
    assert_eq!(
        notes[2..],
        [
            "GPU rows skipped: no NVIDIA driver found",
            "CPU: AMD EPYC 9454 48-Core Processor with 16 threads",
        ]
    );
}

#[test]
fn matmul_search_best_shape_spread_and_every_row() {
    use gpukit_bench::matmul::search::{summarise, SearchReport, SearchRow};
    let shape = |m: usize, n: usize, k: usize, ms: f64, status: RowStatus| {
        let ok = status == RowStatus::Ok;
        let tflops = 2.0 * (m * n * k) as f64 / (ms * 1e9);
        SearchRow {
            dtype: DType::Bf16,
            m,
            n,
            k,
            status,
            backend: ok.then(|| "cuBLASLt (heuristic #0)".to_string()),
            tflops: ok.then_some(tflops),
            median_ms: ok.then_some(ms),
            verification: ok.then(|| verified(1.7e-3)),
        }
    };
    let rows = vec![
        shape(2048, 2048, 13312, 0.1407, RowStatus::Ok),
        shape(8192, 8192, 8192, 1.5433, RowStatus::Ok),
        shape(4096, 4096, 4096, 0.2062, RowStatus::Ok),
        shape(
            16384,
            16384,
            16384,
            0.0,
            RowStatus::Failed("wrong result: relative error 3.1e-1 over tolerance 2e-2".into()),
        ),
    ];
    let gpu = h100();
    let report = SearchReport {
        dtypes: summarise(&rows, &[DType::Bf16], Some(&gpu)),
        gpu: Some(gpu),
        rows,
        kept_in: None,
        not_kept: Some("a shape failed: a failing GPU's rates are not kept".into()),
    };
    assert_drawn("matmul_search", &matmul_search_sections(&report));
}
