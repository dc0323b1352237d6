//! Element types. `Tf32` is a compute mode of f32 storage on tensor cores, listed because users
//! choose it like a dtype: its storage is f32 ([`DType::storage`]). `F8E4M3` (fp8) is a matmul
//! input type only (cuBLASLt on compute capability 8.9 and newer): no tensor op, convolution,
//! inference engine or training step takes it, so it is not in [`DType::ALL`].

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What one element is, and for `Tf32` how products of it are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    /// f32 storage, products on TF32 tensor cores with f32 accumulation.
    Tf32,
    F16,
    Bf16,
    /// fp8 E4M3 (the "fn" variant: no infinities, one NaN pattern a sign, largest finite 448):
    /// matmul inputs only, products with f32 accumulation written as bf16.
    F8E4M3,
}

impl DType {
    /// The dtypes of gpukit's tensors and ops (everything but the matmul-only `F8E4M3`).
    pub const ALL: [DType; 5] = [DType::F64, DType::F32, DType::Tf32, DType::F16, DType::Bf16];

    /// The dtypes `bench matmul` measures: [`DType::ALL`] and fp8.
    pub const MATMUL: [DType; 6] = [
        DType::F64,
        DType::F32,
        DType::Tf32,
        DType::F16,
        DType::Bf16,
        DType::F8E4M3,
    ];

    /// Bytes of one stored element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::Tf32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::F8E4M3 => 1,
        }
    }

    /// The type the elements are stored as (`Tf32` is stored as `F32`).
    pub fn storage(self) -> DType {
        match self {
            DType::Tf32 => DType::F32,
            d => d,
        }
    }

    /// `f64`, `f32`, `tf32`, `f16`, `bf16`, `f8e4m3`: how tables and JSON name it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::Tf32 => "tf32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
        }
    }

    /// `fp64`, `fp32`, `tf32`, `fp16`, `bf16`, `fp8`: how inference strategies name it (PyTorch's
    /// tutorials say "fp16").
    pub fn precision_name(self) -> &'static str {
        match self {
            DType::F64 => "fp64",
            DType::F32 => "fp32",
            DType::Tf32 => "tf32",
            DType::F16 => "fp16",
            DType::Bf16 => "bf16",
            DType::F8E4M3 => "fp8",
        }
    }

    /// Whether products of this type run on tensor cores (f32 and f64 stay on the CUDA cores
    /// in gpukit: f32 is the reference and f64 the float64 check).
    pub fn uses_tensor_cores(self) -> bool {
        matches!(self, DType::Tf32 | DType::F16 | DType::Bf16 | DType::F8E4M3)
    }

    /// Whether only matrix products take this type (fp8): tensor ops, convolutions, the
    /// inference engine and training refuse it.
    pub fn matmul_only(self) -> bool {
        self == DType::F8E4M3
    }

    /// The type a product of two `self` inputs is written as: bf16 for fp8 (cuBLASLt's fp8
    /// products accumulate in f32 and write a wider type), the storage type otherwise.
    pub fn product_output(self) -> DType {
        match self {
            DType::F8E4M3 => DType::Bf16,
            d => d.storage(),
        }
    }

    /// The largest finite value the storage type holds (f16: 65504).
    pub fn max_finite(self) -> f64 {
        match self.storage() {
            DType::F64 => f64::MAX,
            DType::F16 => 65504.0,
            // bf16 keeps f32's exponent: its largest finite value is (2 - 2^-7) * 2^127
            DType::Bf16 => 3.3895313892515355e38,
            // E4M3: 1.75 * 2^8 (the all-ones pattern is NaN, not a number)
            DType::F8E4M3 => 448.0,
            _ => f64::from(f32::MAX),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype '{given}': expected one of f64, f32, tf32, f16, bf16, fp8")]
pub struct ParseDTypeError {
    pub given: String,
}

impl FromStr for DType {
    type Err = ParseDTypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f64" | "fp64" | "float64" | "double" => Ok(DType::F64),
            "f32" | "fp32" | "float32" | "float" => Ok(DType::F32),
            "tf32" => Ok(DType::Tf32),
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            // not "f8": it would not say which fp8 (E5M2 is the other)
            "fp8" | "f8e4m3" | "e4m3" | "float8_e4m3fn" | "fp8_e4m3" => Ok(DType::F8E4M3),
            _ => Err(ParseDTypeError {
                given: crate::shown(s),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_aliases_and_rejects_others() {
        assert_eq!("FP16".parse(), Ok(DType::F16));
        assert_eq!("bfloat16".parse(), Ok(DType::Bf16));
        assert_eq!("double".parse(), Ok(DType::F64));
        assert!("int8"
            .parse::<DType>()
            .unwrap_err()
            .to_string()
            .contains("int8"));
        assert_eq!("fp8".parse(), Ok(DType::F8E4M3));
        assert_eq!("F8E4M3".parse(), Ok(DType::F8E4M3));
        assert_eq!("float8_e4m3fn".parse(), Ok(DType::F8E4M3));
        assert!("fp8_e5m2".parse::<DType>().is_err());
        assert!("f8".parse::<DType>().is_err());
        assert!(!DType::ALL.contains(&DType::F8E4M3));
        assert_eq!(DType::MATMUL.len(), DType::ALL.len() + 1);
        for d in DType::MATMUL {
            assert_eq!(d.name().parse(), Ok(d));
            assert_eq!(d.precision_name().parse(), Ok(d));
        }
        assert_eq!(DType::Bf16.size_bytes(), 2);
        assert_eq!(DType::F8E4M3.size_bytes(), 1);
        assert_eq!(DType::F8E4M3.to_string(), "f8e4m3");
        assert_eq!(DType::F8E4M3.precision_name(), "fp8");
        // serde and the tables agree on the name
        assert_eq!(serde_json::to_string(&DType::F8E4M3).unwrap(), "\"f8e4m3\"");
    }

    #[test]
    fn storage_and_ranges() {
        assert_eq!(DType::Tf32.storage(), DType::F32);
        assert_eq!(DType::Tf32.size_bytes(), DType::F32.size_bytes());
        assert_eq!(DType::F16.max_finite(), 65504.0);
        assert_eq!(DType::Tf32.max_finite(), f64::from(f32::MAX));
        // bf16's largest finite value is f32's largest with the low 16 bits dropped
        let bf16_max = f32::from_bits(0x7f7f_0000);
        assert_eq!(DType::Bf16.max_finite(), f64::from(bf16_max));
        assert!(DType::F16.uses_tensor_cores() && !DType::F32.uses_tensor_cores());
        assert_eq!(DType::F8E4M3.max_finite(), 448.0);
        assert_eq!(DType::F8E4M3.storage(), DType::F8E4M3);
        assert_eq!(DType::F8E4M3.product_output(), DType::Bf16);
        assert_eq!(DType::F16.product_output(), DType::F16);
        assert!(DType::F8E4M3.matmul_only() && !DType::Bf16.matmul_only());
    }
}
