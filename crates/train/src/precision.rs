//! The arithmetic of a GPU run: a training mode built on the element type ([`DType`]), with
//! what it implies (storage type, the loss scaler). Its own module so that the run's budget and
//! the GPU loop can both name it without importing each other.

use gpukit_types::DType;
use serde::{Deserialize, Serialize};

/// The arithmetic of a GPU run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Fp16,
        Precision::Bf16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }

    /// The training mode of an element type (None for f64, which gpukit does not train in).
    pub fn of(dtype: DType) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.inputs() == dtype)
    }

    /// The products' input type (and arithmetic).
    pub(crate) fn inputs(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::Tf32 => DType::Tf32,
            Precision::Fp16 => DType::F16,
            Precision::Bf16 => DType::Bf16,
        }
    }

    /// Storage type of activations and their gradients.
    pub(crate) fn storage(self) -> DType {
        self.inputs().storage()
    }

    pub(crate) fn half(self) -> bool {
        matches!(self, Precision::Fp16 | Precision::Bf16)
    }

    /// fp16 needs the loss scaler (bf16 has fp32's range).
    pub fn scaled(self) -> bool {
        self == Precision::Fp16
    }
}
