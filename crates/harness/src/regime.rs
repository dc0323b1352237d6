//! What bounds a piece of GPU work, placed against the roofline: one vocabulary for the
//! lessons' versions and the profile's kernel groups.

use serde::{Deserialize, Serialize};

/// What bounds a piece of work (the notebook's three regimes, and the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// So short that launches, not the GPU's units, set the time (under ~10 us of work per
    /// launch).
    LaunchOverhead,
    /// Below the roofline's ridge: bytes per FLOP high enough that memory bandwidth bounds it.
    Memory,
    /// At or above the ridge: the arithmetic units bound it.
    Compute,
    /// Work on the CPU and copies over PCIe dominate.
    HostAndTransfer,
}

impl Regime {
    pub fn name(self) -> &'static str {
        match self {
            Regime::LaunchOverhead => "launch-bound",
            Regime::Memory => "memory-bound",
            Regime::Compute => "compute-bound",
            Regime::HostAndTransfer => "host/PCIe-bound",
        }
    }
}
