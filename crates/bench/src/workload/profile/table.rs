//! The key-averages table: op records grouped by op, kernel or layer, with what each group cost
//! and which regime bounds it (the notebook's three: launch overhead, memory, compute).

use super::{KernelRecord, OpRecord};
pub use crate::regime::Regime;
use serde::{Deserialize, Serialize};

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// By op name and detail (`conv 32x256x14x14 f16 NHWC, 3x3`).
    Op,
    /// By kernel name (from the kernel records).
    Kernel,
    /// By the model's layer.
    Layer,
}

impl GroupBy {
    pub fn parse(s: &str) -> Option<GroupBy> {
        match s.trim() {
            "op" => Some(GroupBy::Op),
            "kernel" => Some(GroupBy::Kernel),
            "layer" => Some(GroupBy::Layer),
            _ => None,
        }
    }
}

/// The chip's ceilings for one element type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    pub tflops: f64,
    pub memory_gbs: f64,
}

impl Roofline {
    /// FLOPs per byte where the two ceilings meet.
    pub fn ridge(&self) -> f64 {
        self.tflops * 1e12 / (self.memory_gbs * 1e9)
    }
}

/// A kernel or op shorter than this, on average, is launch-bound whatever its intensity: a
/// launch costs a few microseconds of host and GPU front-end time (measured by gpukit's
/// inference engine on an H100: 2-4 us per kernel eager).
pub const LAUNCH_BOUND_US: f64 = 5.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub key: String,
    pub calls: usize,
    pub gpu_total_us: f64,
    /// GPU time minus that of the group's kernels nested in other groups' (as key_averages'
    /// self time); the same as the total for gpukit's flat ops.
    pub gpu_self_us: f64,
    pub gpu_avg_us: f64,
    /// Of the step's (wall) GPU time.
    pub pct_of_step: f64,
    pub cpu_launch_us: f64,
    pub flops: f64,
    pub bytes: f64,
    pub tflops: Option<f64>,
    pub gbs: Option<f64>,
    /// FLOPs per byte.
    pub intensity: Option<f64>,
    pub regime: Option<Regime>,
}

fn regime(avg_us: f64, intensity: Option<f64>, roof: Option<Roofline>) -> Option<Regime> {
    if avg_us < LAUNCH_BOUND_US {
        return Some(Regime::LaunchOverhead);
    }
    let (i, r) = (intensity?, roof?);
    Some(if i < r.ridge() {
        Regime::Memory
    } else {
        Regime::Compute
    })
}

/// One row per group, sorted by GPU total (largest first). `step_us` is the profiled step's
/// GPU wall time; `roof(dtype)` the chip's ceilings for an element type, when known. Grouping
/// by kernel needs `kernels` (their time is the GPU time; an op's FLOPs and bytes go to its
/// kernels in proportion to their time).
pub fn key_averages(
    ops: &[OpRecord],
    kernels: &[KernelRecord],
    by: GroupBy,
    step_us: f64,
    roof: &dyn Fn(&str) -> Option<Roofline>,
) -> Vec<Row> {
    // (key, dtype) -> (calls, gpu us, cpu us, flops, bytes)
    let mut groups: Vec<(String, String, usize, f64, f64, f64, f64)> = Vec::new();
    let mut add =
        |key: String, dtype: &str, gpu: f64, cpu: f64, flops: f64, bytes: f64| match groups
            .iter_mut()
            .find(|g| g.0 == key)
        {
            Some(g) => {
                g.2 += 1;
                g.3 += gpu;
                g.4 += cpu;
                g.5 += flops;
                g.6 += bytes;
            }
            None => groups.push((key, dtype.to_string(), 1, gpu, cpu, flops, bytes)),
        };
    match by {
        GroupBy::Op | GroupBy::Layer => {
            for o in ops {
                let key = match by {
                    GroupBy::Layer => o.layer.clone().unwrap_or_else(|| o.name.clone()),
                    _ => format!("{} {}", o.name, o.detail),
                };
                let gpu = o.gpu.map_or(0.0, |g| g.dur_us);
                add(key, &o.dtype, gpu, o.cpu.dur_us, o.flops, o.bytes);
            }
        }
        GroupBy::Kernel => {
            // each op's kernels share its work in proportion to their time
            let mut op_kernel_us = vec![0.0; ops.len()];
            for k in kernels {
                if let Some(i) = k.op.filter(|&i| i < ops.len()) {
                    op_kernel_us[i] += k.gpu.dur_us;
                }
            }
            for k in kernels {
                let (flops, bytes, dtype) = match k.op.filter(|&i| i < ops.len()) {
                    Some(i) if op_kernel_us[i] > 0.0 => {
                        let share = k.gpu.dur_us / op_kernel_us[i];
                        (
                            ops[i].flops * share,
                            ops[i].bytes * share,
                            ops[i].dtype.as_str(),
                        )
                    }
                    _ => (0.0, 0.0, ""),
                };
                add(k.name.clone(), dtype, k.gpu.dur_us, 0.0, flops, bytes);
            }
        }
    }
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|(key, dtype, calls, gpu, cpu, flops, bytes)| {
            let avg = gpu / calls.max(1) as f64;
            let rate = |amount: f64, scale: f64| {
                (gpu > 0.0 && amount > 0.0).then(|| amount / (gpu * 1e-6) / scale)
            };
            let intensity = (bytes > 0.0 && flops > 0.0).then(|| flops / bytes);
            Row {
                key,
                calls,
                gpu_total_us: gpu,
                gpu_self_us: gpu,
                gpu_avg_us: avg,
                pct_of_step: if step_us > 0.0 {
                    100.0 * gpu / step_us
                } else {
                    0.0
                },
                cpu_launch_us: cpu,
                flops,
                bytes,
                tflops: rate(flops, 1e12),
                gbs: rate(bytes, 1e9),
                intensity,
                regime: regime(avg, intensity, roof(&dtype)),
            }
        })
        .collect();
    rows.sort_by(|a, b| b.gpu_total_us.total_cmp(&a.gpu_total_us));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::profile::Span;

    fn op(name: &str, layer: &str, gpu_us: f64, flops: f64, bytes: f64) -> OpRecord {
        OpRecord {
            name: name.into(),
            layer: Some(layer.into()),
            detail: "x".into(),
            library: "test".into(),
            stream: 0,
            cpu: Span {
                start_us: 0.0,
                dur_us: 2.0,
            },
            gpu: Some(Span {
                start_us: 0.0,
                dur_us: gpu_us,
            }),
            flops,
            bytes,
            dtype: "f16".into(),
        }
    }

    fn h100(_: &str) -> Option<Roofline> {
        // 989 TFLOP/s f16, 3350 GB/s: the ridge at 295 FLOPs a byte
        Some(Roofline {
            tflops: 989.0,
            memory_gbs: 3350.0,
        })
    }

    #[test]
    fn rows_sum_group_and_place_against_the_roofline() {
        let ops = vec![
            // a big matmul: 2 TFLOP in 4 ms, 50 MB -> intensity 40000: compute
            op("matmul", "fc1", 4000.0, 2e12, 5e7),
            op("matmul", "fc1", 4000.0, 2e12, 5e7),
            // an elementwise op: 1 MFLOP over 8 MB in 10 us -> memory
            op("relu", "fc1", 10.0, 1e6, 8e6),
            // a tiny kernel: launch-bound whatever its intensity
            op("bias", "fc2", 2.0, 1e3, 1e3),
        ];
        let rows = key_averages(&ops, &[], GroupBy::Op, 10_000.0, &h100);
        assert_eq!(rows[0].key, "matmul x");
        assert_eq!(rows[0].calls, 2);
        assert_eq!(rows[0].gpu_total_us, 8000.0);
        assert_eq!(rows[0].pct_of_step, 80.0);
        assert!((rows[0].tflops.unwrap() - 500.0).abs() < 1e-9);
        assert_eq!(rows[0].regime, Some(Regime::Compute));
        let relu = rows.iter().find(|r| r.key == "relu x").unwrap();
        assert_eq!(relu.regime, Some(Regime::Memory));
        assert!((relu.gbs.unwrap() - 800.0).abs() < 1e-9);
        let bias = rows.iter().find(|r| r.key == "bias x").unwrap();
        assert_eq!(bias.regime, Some(Regime::LaunchOverhead));
        // by layer
        let layers = key_averages(&ops, &[], GroupBy::Layer, 10_000.0, &h100);
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[0].key, "fc1");
        assert_eq!(layers[0].calls, 3);
        // no roofline known: no regime unless launch-bound
        let none = key_averages(&ops, &[], GroupBy::Op, 0.0, &|_| None);
        assert_eq!(none[0].regime, None);
        assert_eq!(none[0].pct_of_step, 0.0);
    }

    #[test]
    fn kernels_share_their_ops_work_by_time() {
        let ops = vec![op("conv", "layer1", 30.0, 3e9, 3e6)];
        let k = |name: &str, us: f64| KernelRecord {
            name: name.into(),
            stream: 0,
            gpu: Span {
                start_us: 0.0,
                dur_us: us,
            },
            op: Some(0),
        };
        let rows = key_averages(
            &ops,
            &[k("implicit_gemm", 20.0), k("reorder", 10.0)],
            GroupBy::Kernel,
            30.0,
            &h100,
        );
        assert_eq!(rows[0].key, "implicit_gemm");
        assert!((rows[0].flops - 2e9).abs() < 1.0);
        assert!((rows[1].flops - 1e9).abs() < 1.0);
        let total: f64 = rows.iter().map(|r| r.pct_of_step).sum();
        assert!((total - 100.0).abs() < 1e-9);
        assert_eq!(GroupBy::parse("kernel"), Some(GroupBy::Kernel));
        assert_eq!(GroupBy::parse("stream"), None);
    }
}
