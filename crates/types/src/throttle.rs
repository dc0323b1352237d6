//! Why a GPU's clocks are held down: NVML's clock throttle reasons
//! (`nvmlClocksThrottleReason*`), each with its bit, the name gpukit writes in its reports and
//! logs, the short word a table shows, and whether it holds the chip down for power or heat.
//! The one table every reader and writer of these reasons uses.

/// One throttle reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason {
    /// NVML's bit (nvidia-smi prints the mask as 0x...).
    pub bit: u64,
    /// The name in gpukit's reports, logs and metrics: "sw_power_cap".
    pub name: &'static str,
    /// The word a table shows: "power cap".
    pub label: &'static str,
    /// Whether it holds the chip below its clocks for power or heat (not idling, not a
    /// user-set clock).
    pub throttling: bool,
}

const fn reason(bit: u64, name: &'static str, label: &'static str, throttling: bool) -> Reason {
    Reason {
        bit,
        name,
        label,
        throttling,
    }
}

/// Every reason NVML reports, in bit order.
pub const REASONS: [Reason; 9] = [
    reason(0x1, "gpu_idle", "idle", false),
    reason(0x2, "applications_clocks", "held", false),
    reason(0x4, "sw_power_cap", "power cap", true),
    reason(0x8, "hw_slowdown", "slowdown", true),
    reason(0x10, "sync_boost", "held", false),
    reason(0x20, "sw_thermal", "thermal", true),
    reason(0x40, "hw_thermal", "thermal", true),
    reason(0x80, "hw_power_brake", "power brake", true),
    reason(0x100, "display_clocks", "held", false),
];

/// The reason of this name, if NVML has one.
pub fn by_name(name: &str) -> Option<&'static Reason> {
    REASONS.iter().find(|r| r.name == name)
}

/// The names of the reasons set in NVML's bitmask, in bit order.
pub fn names(mask: u64) -> Vec<String> {
    REASONS
        .iter()
        .filter(|r| mask & r.bit != 0)
        .map(|r| r.name.to_string())
        .collect()
}

/// NVML's bitmask of the named reasons (unknown names add nothing).
pub fn mask(names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|n| by_name(n))
        .fold(0, |m, r| m | r.bit)
}

/// Whether the named reason holds the chip down for power or heat.
pub fn throttling(name: &str) -> bool {
    by_name(name).is_some_and(|r| r.throttling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_distinct_and_names_round_trip_through_the_mask() {
        let all: u64 = REASONS.iter().map(|r| r.bit).sum();
        assert_eq!(all, 0x1ff, "nine distinct bits");
        let n = names(0x4 | 0x20);
        assert_eq!(
            n,
            vec!["sw_power_cap".to_string(), "sw_thermal".to_string()]
        );
        assert_eq!(mask(&n), 0x24);
        assert_eq!(mask(&["nonsense".to_string()]), 0);
        assert!(throttling("hw_power_brake") && !throttling("gpu_idle"));
        assert!(!throttling("unknown"));
    }
}
