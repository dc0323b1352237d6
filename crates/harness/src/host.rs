//! Facts about the host: CPU model, cores, memory and SIMD level, read from /proc and CPUID.

use gpukit_types::resources::meminfo_kib;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    pub cpu_model: String,
    /// Threads this process may use (honours affinity masks and cgroup quotas).
    pub logical_cores: usize,
    /// Distinct (package, core) pairs in /proc/cpuinfo; None when it does not say.
    pub physical_cores: Option<usize>,
    pub sockets: Option<usize>,
    pub memory_total_bytes: Option<u64>,
    pub memory_available_bytes: Option<u64>,
    /// Best vector extension: "AVX-512", "AVX2", "SSE4.2", ...
    pub simd: String,
    /// Every extension worth knowing for matmul speed that this CPU has.
    pub simd_features: Vec<String>,
    pub os: String,
    pub arch: String,
}

/// Reads the host facts; never fails (unknown fields are None or "unknown").
pub fn host_facts() -> HostFacts {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (physical_cores, sockets) = count_cores(&cpuinfo);
    let features = simd_features();
    HostFacts {
        cpu_model: cpu_model(&cpuinfo),
        logical_cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        physical_cores,
        sockets,
        memory_total_bytes: meminfo_kib(&meminfo, "MemTotal").map(|k| k * 1024),
        memory_available_bytes: meminfo_kib(&meminfo, "MemAvailable").map(|k| k * 1024),
        simd: best_simd(&features).to_string(),
        simd_features: features.iter().map(|s| s.to_string()).collect(),
        os: os_name(),
        arch: std::env::consts::ARCH.to_string(),
    }
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let (k, v) = line.split_once(':')?;
    (k.trim() == key).then(|| v.trim())
}

fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|l| field(l, "model name"))
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn count_cores(cpuinfo: &str) -> (Option<usize>, Option<usize>) {
    let mut pairs = std::collections::HashSet::new();
    let mut packages = std::collections::HashSet::new();
    let mut package = None;
    for line in cpuinfo.lines() {
        if let Some(v) = field(line, "physical id") {
            package = Some(v.to_string());
            packages.insert(v.to_string());
        }
        if let Some(v) = field(line, "core id") {
            pairs.insert((package.clone(), v.to_string()));
        }
    }
    (
        (!pairs.is_empty()).then_some(pairs.len()),
        (!packages.is_empty()).then_some(packages.len()),
    )
}

fn os_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_string())
}

#[cfg(target_arch = "x86_64")]
fn simd_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    macro_rules! probe {
        ($($name:tt => $label:expr),*) => {
            $(if std::arch::is_x86_feature_detected!($name) { f.push($label); })*
        };
    }
    probe!(
        "sse4.2" => "SSE4.2", "avx" => "AVX", "avx2" => "AVX2", "fma" => "FMA",
        "f16c" => "F16C", "avx512f" => "AVX-512F", "avx512bw" => "AVX-512BW",
        "avx512vl" => "AVX-512VL", "avx512bf16" => "AVX-512-BF16",
        "avx512fp16" => "AVX-512-FP16", "avx512vnni" => "AVX-512-VNNI"
    );
    f
}

#[cfg(target_arch = "aarch64")]
fn simd_features() -> Vec<&'static str> {
    let mut f = vec!["NEON"];
    if std::arch::is_aarch64_feature_detected!("sve") {
        f.push("SVE");
    }
    f
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_features() -> Vec<&'static str> {
    Vec::new()
}

fn best_simd(features: &[&str]) -> &'static str {
    for (needle, label) in [
        ("AVX-512F", "AVX-512"),
        ("AVX2", "AVX2"),
        ("AVX", "AVX"),
        ("SSE4.2", "SSE4.2"),
        ("SVE", "SVE"),
        ("NEON", "NEON"),
    ] {
        if features.contains(&needle) {
            return label;
        }
    }
    "none detected"
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO: &str = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)   Platinum 8480+\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R)   Platinum 8480+\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 2\nphysical id\t: 1\ncore id\t\t: 0\n";

    #[test]
    fn parses_cpuinfo() {
        assert_eq!(cpu_model(CPUINFO), "Intel(R) Xeon(R) Platinum 8480+");
        // hyperthreads of one core count once; the same core id on another package counts again
        assert_eq!(count_cores(CPUINFO), (Some(2), Some(2)));
        assert_eq!(cpu_model(""), "unknown");
        assert_eq!(count_cores(""), (None, None));
    }

    #[test]
    fn best_simd_prefers_widest() {
        assert_eq!(best_simd(&["SSE4.2", "AVX2", "AVX-512F"]), "AVX-512");
        assert_eq!(best_simd(&["SSE4.2", "AVX", "AVX2"]), "AVX2");
        assert_eq!(best_simd(&[]), "none detected");
    }

    #[test]
    fn live_host_facts_are_sane() {
        let h = host_facts();
        assert!(h.logical_cores >= 1);
        assert!(h.memory_total_bytes.unwrap_or(1) > 0);
        assert!(!h.simd.is_empty());
    }
}
