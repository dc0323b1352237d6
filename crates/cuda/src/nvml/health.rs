//! What a burn-in watches beside the clocks: ECC error counts, retired pages and remapped rows
//! (read before and after, compared), and critical XID events (waited for on NVML's event set).
//! Every count is None where the driver does not report it, never zero.
//!
//! To use: [`NvmlSession::health`] by NVML index before and after the work;
//! [`NvmlSession::watch_xid`] once on the sampling thread, then [`XidWatch::wait`] in its loop.

use super::{fields, NvmlSession};
use crate::error::{Error, Result};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_UNC, NVML_FI_DEV_RETIRED_DBE, NVML_FI_DEV_RETIRED_PENDING,
    NVML_FI_DEV_RETIRED_SBE,
};
use serde::{Deserialize, Serialize};

/// A device's memory-health counters at one moment; None: not readable on this device or driver.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthCounters {
    /// Whether ECC is on now.
    pub ecc_enabled: Option<bool>,
    /// Corrected (single-bit) ECC errors since the driver loaded.
    pub ecc_volatile_corrected: Option<u64>,
    /// Uncorrected (double-bit) ECC errors since the driver loaded.
    pub ecc_volatile_uncorrected: Option<u64>,
    /// The same over the board's life (the InfoROM's counts).
    pub ecc_aggregate_corrected: Option<u64>,
    pub ecc_aggregate_uncorrected: Option<u64>,
    /// Pages retired for repeated single-bit and for double-bit errors (before Ampere).
    pub retired_pages_single_bit: Option<u64>,
    pub retired_pages_double_bit: Option<u64>,
    /// A page waits for the next driver load to be retired.
    pub retired_pages_pending: Option<bool>,
    /// Rows remapped for correctable and uncorrectable errors (Ampere and later).
    pub remapped_rows_correctable: Option<u64>,
    pub remapped_rows_uncorrectable: Option<u64>,
    /// A remapping waits for the next GPU reset.
    pub remapped_rows_pending: Option<bool>,
    /// A remapping failed: the row could not be replaced.
    pub remapped_rows_failed: Option<bool>,
}

/// What one wait on the XID event set gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidWait {
    /// A critical XID on the device with this NVML index (the XID number, when NVML gives it).
    Event { index: u32, xid: Option<u64> },
    /// Nothing within the timeout.
    Quiet,
    /// The wait itself failed (the watch should stop).
    Failed(String),
}

/// Critical XID events of some devices, registered on one NVML event set.
pub struct XidWatch<'a> {
    set: nvml_wrapper::event::EventSet<'a>,
}

impl NvmlSession {
    /// The memory-health counters of device `index`.
    pub fn health(&self, index: u32) -> Result<HealthCounters> {
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| Error::Nvml(format!("device {index}: {e}")))?;
        let ecc = |kind, counter| d.total_ecc_errors(kind, counter).ok();
        let [sbe, dbe, pending, cor, unc, rpending, failed] = fields(
            &d,
            [
                NVML_FI_DEV_RETIRED_SBE,
                NVML_FI_DEV_RETIRED_DBE,
                NVML_FI_DEV_RETIRED_PENDING,
                NVML_FI_DEV_REMAPPED_COR,
                NVML_FI_DEV_REMAPPED_UNC,
                NVML_FI_DEV_REMAPPED_PENDING,
                NVML_FI_DEV_REMAPPED_FAILURE,
            ],
        );
        let count = |v: Option<f64>| v.filter(|x| *x >= 0.0).map(|x| x as u64);
        let flag = |v: Option<f64>| v.map(|x| x != 0.0);
        Ok(HealthCounters {
            ecc_enabled: d.is_ecc_enabled().ok().map(|m| m.currently_enabled),
            ecc_volatile_corrected: ecc(MemoryError::Corrected, EccCounter::Volatile),
            ecc_volatile_uncorrected: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            ecc_aggregate_corrected: ecc(MemoryError::Corrected, EccCounter::Aggregate),
            ecc_aggregate_uncorrected: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            retired_pages_single_bit: count(sbe),
            retired_pages_double_bit: count(dbe),
            retired_pages_pending: flag(pending),
            remapped_rows_correctable: count(cor),
            remapped_rows_uncorrectable: count(unc),
            remapped_rows_pending: flag(rpending),
            remapped_rows_failed: flag(failed),
        })
    }

    /// Registers the devices with these NVML indices for critical XID events. An error (the
    /// driver or a device does not offer the events, or the process may not register) means
    /// XIDs cannot be watched here, and says why.
    pub fn watch_xid(&self, indices: &[u32]) -> Result<XidWatch<'_>> {
        let mut set = self
            .nvml
            .create_event_set()
            .map_err(|e| Error::Nvml(format!("creating an event set: {e}")))?;
        for &i in indices {
            let d = self
                .nvml
                .device_by_index(i)
                .map_err(|e| Error::Nvml(format!("device {i}: {e}")))?;
            set = d
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| Error::Nvml(format!("XID events of device {i}: {e}")))?;
        }
        Ok(XidWatch { set })
    }
}

impl XidWatch<'_> {
    /// Waits up to `timeout_ms` for a critical XID on a watched device.
    pub fn wait(&self, timeout_ms: u32) -> XidWait {
        match self.set.wait(timeout_ms) {
            Ok(e) => XidWait::Event {
                index: e.device.index().unwrap_or(u32::MAX),
                xid: match e.event_data {
                    Some(XidError::Value(x)) => Some(x),
                    _ => None,
                },
            },
            Err(NvmlError::Timeout) => XidWait::Quiet,
            Err(e) => XidWait::Failed(e.to_string()),
        }
    }
}
