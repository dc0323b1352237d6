//! Element types. `Tf32` is a compute mode of f32 storage on tensor cores, listed because users
//! choose it like a dtype.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    Tf32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 5] = [DType::F64, DType::F32, DType::Tf32, DType::F16, DType::Bf16];

    /// Bytes of one stored element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::Tf32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::Tf32 => "tf32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype '{given}': expected one of f64, f32, tf32, f16, bf16")]
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
            _ => Err(ParseDTypeError {
                given: s.to_string(),
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
        for d in DType::ALL {
            assert_eq!(d.name().parse(), Ok(d));
        }
        assert_eq!(DType::Bf16.size_bytes(), 2);
    }
}
