//! Devices as users write them (`cpu`, `cuda`, `cuda:1`, `all`) and as code matches on them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a tensor lives or a workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Device {
    Cpu,
    /// A CUDA device by its CUDA ordinal (as `CUDA_VISIBLE_DEVICES` numbers them).
    Cuda(usize),
}

impl Device {
    /// The CUDA ordinal of a GPU; None for the CPU.
    pub fn cuda(&self) -> Option<usize> {
        match self {
            Device::Cuda(k) => Some(*k),
            Device::Cpu => None,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// A `--device` value that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device '{given}': expected cpu, cuda, cuda:N (N = 0, 1, ...) or all")]
pub struct ParseDeviceError {
    pub given: String,
}

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let err = || ParseDeviceError {
            given: crate::shown(s),
        };
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => {
                let n = t
                    .strip_prefix("cuda:")
                    .or_else(|| t.strip_prefix("gpu:"))
                    .ok_or_else(err)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(err());
                }
                n.parse().map(Device::Cuda).map_err(|_| err())
            }
        }
    }
}

/// What a command should run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceSelection {
    /// The CPU and every GPU.
    All,
    One(Device),
}

impl DeviceSelection {
    /// Whether the selection includes this CUDA ordinal.
    pub fn includes_cuda(&self, ordinal: usize) -> bool {
        match self {
            DeviceSelection::All => true,
            DeviceSelection::One(Device::Cuda(i)) => *i == ordinal,
            DeviceSelection::One(Device::Cpu) => false,
        }
    }

    /// The CUDA ordinal the user named explicitly, if any.
    pub fn named_cuda(&self) -> Option<usize> {
        match self {
            DeviceSelection::One(Device::Cuda(i)) => Some(*i),
            _ => None,
        }
    }
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelection::All => write!(f, "all"),
            DeviceSelection::One(d) => d.fmt(f),
        }
    }
}

impl FromStr for DeviceSelection {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("all") {
            Ok(DeviceSelection::All)
        } else {
            s.parse().map(DeviceSelection::One)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_users_write() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("CUDA".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert_eq!(" gpu:1 ".parse(), Ok(Device::Cuda(1)));
        assert_eq!("all".parse(), Ok(DeviceSelection::All));
        assert_eq!("cuda:2".parse(), Ok(DeviceSelection::One(Device::Cuda(2))));
    }

    #[test]
    fn rejects_nonsense_with_the_value_in_the_message() {
        for bad in [
            "cuda:", "cuda:-1", "cuda:x", "tpu", "cuda:1:2", "", "cuda:+1",
        ] {
            let e = bad.parse::<Device>().unwrap_err();
            assert_eq!(e.given, bad);
            assert!(e.to_string().contains("expected cpu"));
        }
    }

    #[test]
    fn display_round_trips() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
    }
}
