//! The resource guard: the bytes a piece of work will hold, counted before anything is
//! allocated, set against what the machine has. Work that cannot fit is refused with what it
//! needs, what there is and which flag to change (exit 1), instead of an abort ("memory
//! allocation of N bytes failed") or the kernel's out-of-memory kill minutes later.
//!
//! Every count is overflow-safe: a product or sum that does not fit in 64 bits is "more than
//! can be counted", which no machine has.
//!
//! To use:
//! 1. Describe the work's parts: `Need::host("training MLP 16-100000-1")
//!    .with("weights", bytes(&[100000, 16], 4))` (or `Need::device(0, ...)`).
//! 2. Host work: `need.check_host("lower --layers or --batch-size")?`. Device work:
//!    `need.check(Some(free_bytes), hint)?` with the free memory the driver reports.
//! 3. Where a size cannot be known in advance, allocate with [`try_vec`], which turns an
//!    allocator's refusal into the same error instead of an abort.

use crate::error::{ErrorKind, HasKind};
use serde::{Deserialize, Serialize};

/// Which memory the work needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Memory {
    Host,
    /// A GPU's memory, by its CUDA ordinal.
    Device(usize),
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Memory::Host => write!(f, "host memory"),
            Memory::Device(n) => write!(f, "GPU memory on cuda:{n}"),
        }
    }
}

/// The bytes of `dims` elements of `elem_bytes` each; None when the product overflows.
pub fn bytes(dims: &[usize], elem_bytes: usize) -> Option<u64> {
    dims.iter()
        .chain(std::iter::once(&elem_bytes))
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
}

/// What a piece of work will hold in one memory, part by part. A part of None is more than
/// 64 bits can count.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    /// What the work is ("training MLP 16-64-1, batch 64").
    pub what: String,
    pub memory: Memory,
    pub parts: Vec<(String, Option<u64>)>,
}

impl Need {
    /// Work in host memory.
    pub fn host(what: impl Into<String>) -> Need {
        Need {
            what: what.into(),
            memory: Memory::Host,
            parts: Vec::new(),
        }
    }

    /// Work in GPU `ordinal`'s memory.
    pub fn device(ordinal: usize, what: impl Into<String>) -> Need {
        Need {
            what: what.into(),
            memory: Memory::Device(ordinal),
            parts: Vec::new(),
        }
    }

    /// Adds a part (a part of 0 bytes is left out of the message but counted).
    pub fn with(mut self, part: impl Into<String>, bytes: Option<u64>) -> Need {
        self.add(part, bytes);
        self
    }

    /// Adds a part in place.
    pub fn add(&mut self, part: impl Into<String>, bytes: Option<u64>) -> &mut Need {
        self.parts.push((part.into(), bytes));
        self
    }

    /// The sum of the parts; None when one of them, or the sum, cannot be counted.
    pub fn total(&self) -> Option<u64> {
        self.parts
            .iter()
            .try_fold(0u64, |acc, (_, b)| acc.checked_add((*b)?))
    }

    /// An error unless the parts fit in `available` bytes (None: the amount is unknown, and
    /// only a need that cannot be counted is refused). `hint` says which flag to change.
    pub fn check(&self, available: Option<u64>, hint: &str) -> Result<(), Refusal> {
        let total = self.total();
        let fits = match (total, available) {
            (None, _) => false,
            (Some(t), Some(a)) => t <= a,
            (Some(_), None) => true,
        };
        if fits {
            return Ok(());
        }
        Err(Refusal {
            what: self.what.clone(),
            memory: self.memory,
            needed_bytes: total,
            available_bytes: available,
            parts: self.parts.clone(),
            hint: hint.to_string(),
        })
    }

    /// [`Need::check`] against the host memory this process can still take
    /// ([`host_headroom`]).
    pub fn check_host(&self, hint: &str) -> Result<(), Refusal> {
        self.check(host_headroom(), hint)
    }
}

/// Work refused because it cannot fit: what it needed against what there was (exit code 1).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct Refusal {
    pub what: String,
    pub memory: Memory,
    /// None: more than 64 bits can count.
    pub needed_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub parts: Vec<(String, Option<u64>)>,
    pub hint: String,
}

/// "12.0 GiB", "640.0 MiB", "3.0 KiB", "17 B".
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let amount =
            |b: &Option<u64>| b.map_or("more than can be counted".to_string(), human_bytes);
        write!(
            f,
            "{} needs {} of {}",
            self.what,
            match self.needed_bytes {
                Some(b) => format!("about {}", human_bytes(b)),
                None => "more than can be counted".to_string(),
            },
            self.memory
        )?;
        // the largest parts, which are what the hint is about
        let mut parts: Vec<&(String, Option<u64>)> =
            self.parts.iter().filter(|(_, b)| *b != Some(0)).collect();
        parts.sort_by_key(|(_, b)| std::cmp::Reverse(b.unwrap_or(u64::MAX)));
        if parts.len() > 1 {
            let shown: Vec<String> = parts
                .iter()
                .take(4)
                .map(|(name, b)| format!("{name} {}", amount(b)))
                .collect();
            let more = if parts.len() > 4 { ", ..." } else { "" };
            write!(f, " ({}{more})", shown.join(", "))?;
        }
        match self.available_bytes {
            Some(a) => write!(f, ", and {} is available", human_bytes(a))?,
            None => write!(f, ", more than any machine has")?,
        }
        if !self.hint.is_empty() {
            write!(f, ": {}", self.hint)?;
        }
        Ok(())
    }
}

impl HasKind for Refusal {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Unavailable
    }
}

/// `len` copies of `value`, or the guard's error when the allocator refuses (where an
/// estimate cannot be exact: the allocation itself is the check, and it never aborts).
pub fn try_vec<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>, Refusal> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Refusal {
        what: what.to_string(),
        memory: Memory::Host,
        needed_bytes: bytes(&[len], std::mem::size_of::<T>()),
        available_bytes: host_headroom(),
        parts: Vec::new(),
        hint: String::new(),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// Bytes this process can still allocate without being killed or refused: the least of the
/// kernel's MemAvailable, the cgroup's limit less its usage (v2 `memory.max`, v1
/// `memory.limit_in_bytes`) and the address-space limit (`ulimit -v`) less the process's size.
/// None when none of them can be read.
pub fn host_headroom() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let meminfo = read("/proc/meminfo").unwrap_or_default();
    let available = meminfo_kib(&meminfo, "MemAvailable").map(|k| k.saturating_mul(1024));
    let cgroup = cgroup_headroom(
        read("/sys/fs/cgroup/memory.max")
            .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes")),
        read("/sys/fs/cgroup/memory.current")
            .or_else(|| read("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
    );
    let address_space = address_space_headroom(
        &read("/proc/self/limits").unwrap_or_default(),
        &read("/proc/self/status").unwrap_or_default(),
    );
    [available, cgroup, address_space]
        .into_iter()
        .flatten()
        .min()
}

/// A `/proc/meminfo`-style field in KiB ("MemAvailable:   1000 kB" -> 1000).
pub fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

/// A cgroup's limit less its usage; None without a limit ("max", or v1's huge number).
fn cgroup_headroom(limit: Option<String>, usage: Option<String>) -> Option<u64> {
    let limit: u64 = limit?.trim().parse().ok()?;
    if limit >= 1 << 60 {
        return None;
    }
    let usage: u64 = usage.and_then(|u| u.trim().parse().ok()).unwrap_or(0);
    Some(limit.saturating_sub(usage))
}

/// `ulimit -v` less the process's virtual size; None when unlimited.
fn address_space_headroom(limits: &str, status: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let size = meminfo_kib(status, "VmSize").map_or(0, |k| k.saturating_mul(1024));
    Some(soft.saturating_sub(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_and_sums_that_overflow_cannot_be_counted() {
        assert_eq!(bytes(&[100_000, 100_000], 4), Some(40_000_000_000));
        assert_eq!(bytes(&[usize::MAX, 2], 1), None);
        let need = Need::host("x").with("a", Some(u64::MAX)).with("b", Some(1));
        assert_eq!(need.total(), None);
        let e = need.check(Some(1 << 40), "lower --n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("more than can be counted"), "{text}");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn a_refusal_names_the_need_the_largest_parts_what_there_is_and_the_flag() {
        let need = Need::host("training MLP 16-50000-50000-1")
            .with("weights", Some(10 << 30))
            .with("gradients", Some(10 << 30))
            .with("Adam's two moments", Some(20 << 30))
            .with("batch", Some(0));
        assert!(need.check(Some(41 << 30), "").is_ok());
        let text = need
            .check(Some(23 << 30), "lower --layers")
            .unwrap_err()
            .to_string();
        assert_eq!(
            text,
            "training MLP 16-50000-50000-1 needs about 40.0 GiB of host memory (Adam's two \
             moments 20.0 GiB, weights 10.0 GiB, gradients 10.0 GiB), and 23.0 GiB is \
             available: lower --layers"
        );
        let gpu = Need::device(0, "w")
            .with("a", Some(3 << 20))
            .check(Some(1 << 20), "h");
        assert!(gpu
            .unwrap_err()
            .to_string()
            .contains("GPU memory on cuda:0"));
    }

    #[test]
    fn an_unknown_amount_refuses_only_what_cannot_be_counted() {
        assert!(Need::host("x")
            .with("a", Some(1 << 50))
            .check(None, "")
            .is_ok());
        assert!(Need::host("x").with("a", None).check(None, "").is_err());
    }

    #[test]
    fn an_impossible_allocation_is_an_error_not_an_abort() {
        let e = try_vec(usize::MAX / 2, 0u64, "the samples").unwrap_err();
        assert!(e.to_string().starts_with("the samples needs"), "{e}");
        assert_eq!(try_vec(3, 7u8, "x").unwrap(), vec![7, 7, 7]);
    }

    #[test]
    fn limits_are_read_from_the_kernel_texts() {
        assert_eq!(
            meminfo_kib(
                "MemTotal: 24576000 kB\nMemAvailable:   1000 kB\n",
                "MemAvailable"
            ),
            Some(1000)
        );
        assert_eq!(
            cgroup_headroom(Some("1000\n".into()), Some("400\n".into())),
            Some(600)
        );
        assert_eq!(cgroup_headroom(Some("max\n".into()), None), None);
        let limits = "Max address space         8000000000           unlimited            bytes\n";
        assert_eq!(
            address_space_headroom(limits, "VmSize:\t  1000 kB\n"),
            Some(8_000_000_000 - 1_024_000)
        );
        assert_eq!(
            address_space_headroom("Max address space unlimited unlimited bytes\n", ""),
            None
        );
        assert_eq!(human_bytes(17), "17 B");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
