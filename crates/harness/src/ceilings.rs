//! Peak rates of a GPU: datasheet values for common parts, an estimate from SMs x clock x
//! per-SM rate for the rest. Every later figure is shown as a fraction of these.

use serde::{Deserialize, Serialize};

/// Where the peaks came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PeakSource {
    /// The vendor's datasheet for this part (dense, no sparsity).
    Datasheet { part: String },
    /// Computed: SMs x max SM clock x per-SM rate of the architecture; memory from clock x bus.
    Estimate { sm_count: u32, sm_clock_mhz: u32 },
}

/// Dense peak rates in TFLOP/s (None: the chip has no such unit) and memory bandwidth in GB/s.
/// f64 is the rate of the fastest unit that does f64 matmul (tensor cores where present).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    pub source: PeakSource,
    pub f64_tflops: Option<f64>,
    pub f32_tflops: Option<f64>,
    pub tf32_tflops: Option<f64>,
    pub f16_tflops: Option<f64>,
    pub bf16_tflops: Option<f64>,
    pub fp8_tflops: Option<f64>,
    pub memory_gbs: Option<f64>,
}

impl Peaks {
    /// The peak for a dtype name as bench uses it ("f32", "tf32", ...).
    pub fn for_dtype(&self, dtype: &str) -> Option<f64> {
        match dtype {
            "f64" => self.f64_tflops,
            "f32" => self.f32_tflops,
            "tf32" => self.tf32_tflops,
            "f16" => self.f16_tflops,
            "bf16" => self.bf16_tflops,
            // DType::F8E4M3's name, and the precision name
            "f8e4m3" | "fp8" => self.fp8_tflops,
            _ => None,
        }
    }
}

/// (match, part, f64, f32, tf32, f16, bf16, fp8, GB/s). Matched against the lower-cased device
/// name; the first row whose every needle is present wins, so specific rows come first.
type Row = (&'static [&'static str], &'static str, [Option<f64>; 6], f64);

const DATASHEET: &[Row] = &[
    (
        &["h200"],
        "H200 SXM",
        [
            Some(66.9),
            Some(66.9),
            Some(494.7),
            Some(989.4),
            Some(989.4),
            Some(1978.9),
        ],
        4800.0,
    ),
    (
        &["h100", "nvl"],
        "H100 NVL",
        [
            Some(60.0),
            Some(60.0),
            Some(417.5),
            Some(835.5),
            Some(835.5),
            Some(1670.5),
        ],
        3900.0,
    ),
    (
        &["h100", "pcie"],
        "H100 PCIe",
        [
            Some(51.2),
            Some(51.2),
            Some(378.0),
            Some(756.5),
            Some(756.5),
            Some(1513.0),
        ],
        2000.0,
    ),
    (
        &["h100"],
        "H100 SXM",
        [
            Some(66.9),
            Some(66.9),
            Some(494.7),
            Some(989.4),
            Some(989.4),
            Some(1978.9),
        ],
        3350.0,
    ),
    (
        &["a100", "sxm4-80gb"],
        "A100 SXM4 80GB",
        [
            Some(19.5),
            Some(19.5),
            Some(156.0),
            Some(312.0),
            Some(312.0),
            None,
        ],
        2039.0,
    ),
    (
        &["a100", "80gb", "pcie"],
        "A100 PCIe 80GB",
        [
            Some(19.5),
            Some(19.5),
            Some(156.0),
            Some(312.0),
            Some(312.0),
            None,
        ],
        1935.0,
    ),
    (
        &["a100"],
        "A100 40GB",
        [
            Some(19.5),
            Some(19.5),
            Some(156.0),
            Some(312.0),
            Some(312.0),
            None,
        ],
        1555.0,
    ),
    (
        &["l40s"],
        "L40S",
        [
            None,
            Some(91.6),
            Some(183.0),
            Some(362.1),
            Some(362.1),
            Some(733.0),
        ],
        864.0,
    ),
    (
        &["l4"],
        "L4",
        [
            None,
            Some(30.3),
            Some(60.0),
            Some(121.0),
            Some(121.0),
            Some(242.5),
        ],
        300.0,
    ),
    (
        &["a10"],
        "A10",
        [None, Some(31.2), Some(62.5), Some(125.0), Some(125.0), None],
        600.0,
    ),
    (
        &["t4"],
        "T4",
        [Some(0.25), Some(8.1), None, Some(65.0), None, None],
        320.0,
    ),
    (
        &["v100", "pcie"],
        "V100 PCIe",
        [Some(7.0), Some(14.0), None, Some(112.0), None, None],
        900.0,
    ),
    (
        &["v100"],
        "V100 SXM2",
        [Some(7.8), Some(15.7), None, Some(125.0), None, None],
        900.0,
    ),
    (
        &["rtx 4090"],
        "GeForce RTX 4090",
        [
            None,
            Some(82.6),
            Some(82.6),
            Some(165.2),
            Some(165.2),
            Some(330.3),
        ],
        1008.0,
    ),
    (
        &["rtx 3090"],
        "GeForce RTX 3090",
        [None, Some(35.6), Some(35.6), Some(71.0), Some(71.0), None],
        936.0,
    ),
];

/// Looks the device name up in the datasheet table.
pub fn datasheet_peaks(device_name: &str) -> Option<Peaks> {
    let name = device_name.to_lowercase();
    let (_, part, r, gbs) = DATASHEET
        .iter()
        .find(|(needles, ..)| needles.iter().all(|n| contains_word(&name, n)))?;
    Some(Peaks {
        source: PeakSource::Datasheet {
            part: part.to_string(),
        },
        f64_tflops: r[0],
        f32_tflops: r[1],
        tf32_tflops: r[2],
        f16_tflops: r[3],
        bf16_tflops: r[4],
        fp8_tflops: r[5],
        memory_gbs: Some(*gbs),
    })
}

/// `needle` occurs in `hay` not followed by a letter or digit ("l4" must not match "l40s").
fn contains_word(hay: &str, needle: &str) -> bool {
    hay.match_indices(needle).any(|(i, _)| {
        let before_ok = i == 0 || !hay.as_bytes()[i - 1].is_ascii_alphanumeric();
        let after = hay.as_bytes().get(i + needle.len());
        before_ok && after.is_none_or(|c| !c.is_ascii_alphanumeric())
    })
}

/// Dense FLOP per clock per SM of an architecture: (f64, f32, f16 tensor, tf32, bf16, fp8).
/// f16 assumes f32 accumulation at the full rate (GeForce parts run it at half: an upper bound).
fn per_sm_flop_per_clock(
    cc: (u32, u32),
) -> (f64, f64, Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
    match cc {
        (7, 0) | (7, 2) => (64.0, 128.0, Some(1024.0), None, None, None),
        (7, 5) => (4.0, 128.0, Some(1024.0), None, None, None),
        (8, 0) => (128.0, 128.0, Some(2048.0), Some(1024.0), Some(2048.0), None),
        (8, 7) => (4.0, 256.0, Some(1024.0), Some(512.0), Some(1024.0), None),
        (8, 6) => (4.0, 256.0, Some(1024.0), Some(512.0), Some(1024.0), None),
        (8, 9) => (
            4.0,
            256.0,
            Some(1024.0),
            Some(512.0),
            Some(1024.0),
            Some(2048.0),
        ),
        (9, 0) => (
            256.0,
            256.0,
            Some(4096.0),
            Some(2048.0),
            Some(4096.0),
            Some(8192.0),
        ),
        (10, _) => (
            256.0,
            256.0,
            Some(8192.0),
            Some(4096.0),
            Some(8192.0),
            Some(16384.0),
        ),
        (12, _) => (
            4.0,
            256.0,
            Some(1024.0),
            Some(512.0),
            Some(1024.0),
            Some(2048.0),
        ),
        (major, _) if major > 12 => (
            4.0,
            256.0,
            Some(1024.0),
            Some(512.0),
            Some(1024.0),
            Some(2048.0),
        ),
        _ => (4.0, 128.0, None, None, None, None),
    }
}

/// Estimates peaks from the device's own figures.
pub fn estimated_peaks(
    cc: (u32, u32),
    sm_count: u32,
    max_sm_clock_mhz: u32,
    memory_clock_mhz: u32,
    bus_width_bits: u32,
) -> Peaks {
    let (f64r, f32r, f16r, tf32r, bf16r, fp8r) = per_sm_flop_per_clock(cc);
    let scale = f64::from(sm_count) * f64::from(max_sm_clock_mhz) * 1e6 / 1e12;
    // DDR: two transfers per clock of the bus.
    let memory_gbs = (memory_clock_mhz > 0 && bus_width_bits > 0)
        .then(|| 2.0 * f64::from(memory_clock_mhz) * 1e6 * f64::from(bus_width_bits) / 8.0 / 1e9);
    Peaks {
        source: PeakSource::Estimate {
            sm_count,
            sm_clock_mhz: max_sm_clock_mhz,
        },
        f64_tflops: Some(f64r * scale),
        f32_tflops: Some(f32r * scale),
        tf32_tflops: tf32r.map(|r| r * scale),
        f16_tflops: f16r.map(|r| r * scale),
        bf16_tflops: bf16r.map(|r| r * scale),
        fp8_tflops: fp8r.map(|r| r * scale),
        memory_gbs,
    }
}

/// Theoretical memory bandwidth from the memory clock and bus width (GB/s).
pub fn theoretical_bandwidth_gbs(memory_clock_mhz: u32, bus_width_bits: u32) -> Option<f64> {
    estimated_peaks((0, 0), 0, 0, memory_clock_mhz, bus_width_bits).memory_gbs
}

/// PCIe payload bandwidth per direction (GB/s) for a generation and lane count, after line
/// encoding (8b/10b for gen 1-2, 128b/130b from gen 3; gen 6 FLIT counted like gen 5's).
pub fn pcie_gbs(generation: u32, lanes: u32) -> Option<f64> {
    let per_lane_gts = match generation {
        1 => 2.5,
        2 => 5.0,
        3 => 8.0,
        4 => 16.0,
        5 => 32.0,
        6 => 64.0,
        _ => return None,
    };
    let efficiency = if generation <= 2 { 0.8 } else { 128.0 / 130.0 };
    Some(per_lane_gts * efficiency * f64::from(lanes) / 8.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasheet_names_as_nvidia_smi_prints_them() {
        let h100 = datasheet_peaks("NVIDIA H100 80GB HBM3").unwrap();
        // dense fp8 (1979 TFLOP/s on the datasheet), under DType::F8E4M3's name too
        assert_eq!(h100.for_dtype("f8e4m3"), Some(1978.9));
        assert_eq!(h100.for_dtype("fp8"), Some(1978.9));
        assert_eq!(
            h100.source,
            PeakSource::Datasheet {
                part: "H100 SXM".into()
            }
        );
        assert_eq!(h100.bf16_tflops, Some(989.4));
        assert_eq!(h100.memory_gbs, Some(3350.0));
        let pcie = datasheet_peaks("NVIDIA H100 PCIe").unwrap();
        assert_eq!(pcie.memory_gbs, Some(2000.0));
        assert_eq!(
            datasheet_peaks("NVIDIA H200").unwrap().memory_gbs,
            Some(4800.0)
        );
        assert_eq!(datasheet_peaks("Tesla T4").unwrap().bf16_tflops, None);
        assert_eq!(
            datasheet_peaks("NVIDIA A100-SXM4-80GB").unwrap().memory_gbs,
            Some(2039.0)
        );
        assert_eq!(
            datasheet_peaks("NVIDIA A100-SXM4-40GB").unwrap().memory_gbs,
            Some(1555.0)
        );
        // "l4" must not catch the L40S, nor "a10" the A100
        assert_eq!(
            datasheet_peaks("NVIDIA L40S").unwrap().memory_gbs,
            Some(864.0)
        );
        assert_eq!(
            datasheet_peaks("NVIDIA L4").unwrap().memory_gbs,
            Some(300.0)
        );
        assert_eq!(
            datasheet_peaks("NVIDIA A10").unwrap().memory_gbs,
            Some(600.0)
        );
        assert!(datasheet_peaks("NVIDIA GeForce GTX 1080").is_none());
    }

    #[test]
    fn estimate_reproduces_known_parts() {
        // H100 SXM: 132 SMs at 1980 MHz: f32 66.9, f64 tensor 66.9; HBM3 2619 MHz x 5120 bit.
        let e = estimated_peaks((9, 0), 132, 1980, 2619, 5120);
        assert!((e.f32_tflops.unwrap() - 66.9).abs() < 0.1, "{e:?}");
        assert!((e.f64_tflops.unwrap() - 66.9).abs() < 0.1);
        assert!((e.memory_gbs.unwrap() - 3352.3).abs() < 1.0);
        // A100: 108 SMs at 1410 MHz: f16 312, tf32 156.
        let a = estimated_peaks((8, 0), 108, 1410, 1215, 5120);
        assert!((a.f16_tflops.unwrap() - 311.9).abs() < 0.5, "{a:?}");
        assert!((a.tf32_tflops.unwrap() - 155.9).abs() < 0.5);
        // T4 (7.5) has no tf32 or bf16 units.
        let t = estimated_peaks((7, 5), 40, 1590, 5001, 256);
        assert_eq!((t.tf32_tflops, t.bf16_tflops), (None, None));
        assert!((t.f16_tflops.unwrap() - 65.1).abs() < 0.2);
    }

    #[test]
    fn pcie_rates() {
        assert!((pcie_gbs(5, 16).unwrap() - 63.015).abs() < 0.01);
        assert!((pcie_gbs(4, 16).unwrap() - 31.508).abs() < 0.01);
        assert!((pcie_gbs(2, 16).unwrap() - 8.0).abs() < 1e-9);
        assert_eq!(pcie_gbs(0, 16), None);
    }
}
