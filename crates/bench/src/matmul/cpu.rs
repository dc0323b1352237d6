//! The CPU rows of `bench matmul`: the gemm crate's kernels, one single-threaded product per
//! output tile, each row checked like the GPU's; tf32 and bf16 reuse the f32 row (the CPU has
//! no such arithmetic).

use super::turns::{peer_figure, Turns};
use super::{MatmulOptions, MatmulRow};
use crate::cpu;
use crate::error::Error;
use crate::measure::{host_samples, tflops, Clock, Plan};
use crate::random::fresh_seed;
use crate::report::RowStatus;
use crate::workload::gemm::{verify_square, HostPair};
use gpukit_tensor::codec::{bytes_of, decode_f16, decode_f32, decode_f64};
use gpukit_tensor::{DType, Device};
use half::f16;

pub(super) fn cpu_rows(
    opts: &MatmulOptions,
    host: &crate::host::HostFacts,
    turns: &mut Turns,
    rows: &mut Vec<MatmulRow>,
    progress: &mut dyn FnMut(&str),
) {
    let dtypes = opts.dtypes.clone().unwrap_or_else(|| DType::ALL.to_vec());
    let backend = format!(
        "gemm crate, one single-threaded product per output tile ({}, {} threads)",
        host.simd,
        cpu::threads()
    );

    for &n in &opts.sizes {
        // f32 first: tf32 and bf16 reuse its figure, computed in f32
        let mut f32_row: Option<MatmulRow> = None;
        for dtype in [DType::F32, DType::F64, DType::F16, DType::Tf32, DType::Bf16] {
            let wanted = dtypes.contains(&dtype);
            let needed_for_f32 = dtype == DType::F32
                && (dtypes.contains(&DType::Tf32) || dtypes.contains(&DType::Bf16));
            if !wanted && !needed_for_f32 {
                continue;
            }
            let row = match dtype {
                DType::Tf32 | DType::Bf16 => {
                    let Some(base) = &f32_row else { continue };
                    let mut r = base.clone();
                    r.dtype = dtype;
                    r.computed_as = Some("f32 (no native CPU arithmetic; the f32 row's run)".into());
                    // PyTorch's figure beside it was its f32 product, not this dtype's
                    r.pytorch = None;
                    r
                }
                _ if opts.cpu_max_size.is_some_and(|m| n > m) => MatmulRow::skipped(
                    Device::Cpu,
                    dtype,
                    n,
                    format!(
                        "CPU rows stop at size {} here (run `gpukit bench matmul` for the full sweep)",
                        opts.cpu_max_size.unwrap_or(0)
                    ),
                ),
                _ => {
                    let need = (n as u64)
                        .checked_mul(n as u64)
                        .and_then(|e| e.checked_mul(6 * dtype.size_bytes() as u64));
                    let guard = gpukit_types::resources::Need::host(format!(
                        "the {dtype} CPU product at {n}x{n}"
                    ))
                    .with("operands, their copies, the result and its copy", need)
                    .check_host("lower --sizes");
                    if let Err(refused) = guard {
                        MatmulRow::skipped(Device::Cpu, dtype, n, refused.to_string())
                    } else {
                        progress(&format!("matmul cpu {dtype} {n}x{n}"));
                        let mut r = cpu_row(dtype, n, opts, turns);
                        r.backend = Some(backend.clone());
                        r
                    }
                }
            };
            if dtype == DType::F32 {
                f32_row = Some(row.clone());
            }
            if wanted {
                rows.push(row);
            }
        }
        if dtypes.contains(&DType::F8E4M3) {
            rows.push(MatmulRow::skipped(
                Device::Cpu,
                DType::F8E4M3,
                n,
                CPU_FP8.into(),
            ));
        }
    }
}

/// Why a CPU row of fp8 is not run.
pub(super) const CPU_FP8: &str =
    "fp8 products run on GPUs only (cuBLASLt, compute capability 8.9 and newer)";

fn cpu_row(dtype: DType, n: usize, opts: &MatmulOptions, turns: &mut Turns) -> MatmulRow {
    let mut row = MatmulRow::new(Device::Cpu, dtype, n);
    let seed = fresh_seed();
    let ty = dtype;
    let pair = HostPair {
        a: opts.init.draw_storage(ty, n * n, seed ^ 1),
        b: opts.init.draw_storage(ty, n * n, seed ^ 2),
    };
    let plan = Plan::new(1.min(opts.warmup), opts.iterations).with_budget(opts.cpu_budget_s);
    let flops = 2.0 * (n as f64).powi(3);
    let mut time = |work: &mut dyn FnMut()| {
        let (timing, theirs, _) =
            turns.time(Clock::Host, ("cpu", dtype, n), opts, plan, None, &mut |p| {
                host_samples(p, || {
                    work();
                    Ok::<(), Error>(())
                })
            });
        (timing, theirs)
    };
    // the operands, read in their own type from the stored bytes the check reads too (a
    // detour through f64 would take four times an f16 operand's memory, which the guard
    // does not count)
    let ((timing, theirs), c_bytes) = match dtype {
        DType::F64 => {
            let (a, b) = (decode_f64(&pair.a, ty), decode_f64(&pair.b, ty));
            let mut c = vec![f64::NAN; n * n];
            let t = time(&mut || cpu::matmul_f64(&a, &b, &mut c, n, n, n));
            (t, bytes_of(&c).to_vec())
        }
        DType::F16 => {
            let (a, b) = (decode_f16(&pair.a, ty), decode_f16(&pair.b, ty));
            let mut c = vec![f16::NAN; n * n];
            let t = time(&mut || cpu::matmul_f16(&a, &b, &mut c, n, n, n));
            (t, bytes_of(&c).to_vec())
        }
        _ => {
            let (a, b) = (decode_f32(&pair.a, ty), decode_f32(&pair.b, ty));
            let mut c = vec![f32::NAN; n * n];
            let t = time(&mut || cpu::matmul_f32(&a, &b, &mut c, n, n, n));
            (t, bytes_of(&c).to_vec())
        }
    };
    let timing = match timing {
        Ok(t) => t,
        Err(e) => {
            row.status = RowStatus::Failed(e.to_string());
            return row;
        }
    };
    let v = verify_square(ty, dtype, &pair, &c_bytes, n, seed);
    if v.passed {
        let ours = tflops(flops, timing.summary_ms.median);
        row.tflops = Some(ours);
        row.pytorch = peer_figure(theirs, flops, ours);
        row.timing = Some(timing);
    } else {
        row.status = RowStatus::Failed(format!(
            "wrong result: relative error {:.2e} over tolerance {:.0e}",
            v.rel_err, v.tolerance
        ));
    }
    row.verification = Some(v);
    row
}
