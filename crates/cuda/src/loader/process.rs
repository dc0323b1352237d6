//! Making this process find what discovery found: the links named as cudarc asks for them, the
//! re-execution with `LD_LIBRARY_PATH` extended, and gpukit's cache directory.

use super::{discover, Discovery, Lib, Warning, DISCOVERY_ENV};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// Discovers the libraries and, when the loader would not find them on its own, re-executes the
/// current program once with `LD_LIBRARY_PATH` extended. Returns in the (possibly new) process.
pub fn prepare_process() -> Discovery {
    if let Some(json) = std::env::var_os(DISCOVERY_ENV) {
        // Not inherited by programs gpukit starts (python3 for --compare-pytorch).
        std::env::remove_var(DISCOVERY_ENV);
        if let Some(d) = json.to_str().and_then(|s| serde_json::from_str(s).ok()) {
            return d;
        }
    }
    let mut discovery = discover();
    discovery.alias_dir = make_alias_dir(&discovery);
    let current: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    let mut needed: Vec<PathBuf> = Vec::new();
    if let Some(a) = &discovery.alias_dir {
        needed.push(a.clone());
    }
    for status in &discovery.libraries {
        if let Some(found) = &status.found {
            if found.source.loader_sees_it() {
                continue;
            }
            if let Some(dir) = found.path.parent() {
                if !needed.iter().any(|d| d == dir) {
                    needed.push(dir.to_path_buf());
                }
            }
        }
    }
    needed.retain(|d| !current.contains(d));
    if needed.is_empty() {
        return discovery;
    }
    discovery.added_to_loader_path = needed.clone();
    let new_path = std::env::join_paths(needed.iter().chain(current.iter()));
    let (Ok(new_path), Ok(exe)) = (new_path, std::env::current_exe()) else {
        discovery.warnings.push(Warning(
            "could not extend LD_LIBRARY_PATH; libraries outside it may fail to load".into(),
        ));
        discovery.added_to_loader_path.clear();
        return discovery;
    };
    let Ok(json) = serde_json::to_string(&discovery) else {
        return discovery;
    };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    use std::os::unix::process::CommandExt;
    let err = Command::new(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", new_path)
        .env(DISCOVERY_ENV, json)
        .exec();
    // exec only returns on failure
    discovery.warnings.push(Warning(format!(
        "re-executing with the CUDA libraries on LD_LIBRARY_PATH failed ({err}); set LD_LIBRARY_PATH to {} yourself",
        needed
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    )));
    discovery.added_to_loader_path.clear();
    discovery
}

/// Makes links named as cudarc asks first (`lib<stem>.so`) to the files found, and puts them
/// first on the loader's path. Without them cudarc could open another copy than the one `check`
/// reports (seen on the lent machine: a system `libcudnn.so` 9.14 beside PyTorch's cuDNN 9.19),
/// and NCCL, whose SONAME `libnccl.so.2` is not among cudarc's names, would not open at all.
/// Returns the directory.
fn make_alias_dir(discovery: &Discovery) -> Option<PathBuf> {
    let targets: Vec<(String, PathBuf)> = discovery
        .libraries
        .iter()
        .filter(|s| s.lib != Lib::Nvml)
        .filter_map(|s| {
            let f = s.found.as_ref()?;
            Some((format!("lib{}.so", s.lib.stem()), f.path.clone()))
        })
        .collect();
    if targets.is_empty() {
        return None;
    }
    let base = cache_dir()?;
    // One directory per set of targets, so two installs never fight over one link.
    let mut key = String::new();
    for (n, p) in &targets {
        key.push_str(n);
        key.push_str(&p.to_string_lossy());
    }
    let dir = base.join(format!("lib-aliases-{:016x}", fnv1a(key.as_bytes())));
    let complete = targets
        .iter()
        .all(|(n, p)| std::fs::read_link(dir.join(n)).is_ok_and(|t| t == *p));
    if complete {
        return Some(dir);
    }
    // Build aside, then rename into place: a reader never sees a half-made directory.
    let tmp = base.join(format!(
        ".lib-aliases-{}-{}",
        std::process::id(),
        fnv1a(key.as_bytes())
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).ok()?;
    for (n, p) in &targets {
        std::os::unix::fs::symlink(p, tmp.join(n)).ok()?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        // another process may have won the race with the same content
        let ok = targets
            .iter()
            .all(|(n, p)| std::fs::read_link(dir.join(n)).is_ok_and(|t| t == *p));
        return ok.then_some(dir);
    }
    Some(dir)
}

/// gpukit's cache folder (`$XDG_CACHE_HOME/gpukit`, else `~/.cache/gpukit`, else one in the
/// temporary folder), created if missing; None when none of them can be written.
pub fn cache_dir() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("gpukit")),
        std::env::var_os("HOME").map(|p| PathBuf::from(p).join(".cache/gpukit")),
        Some(std::env::temp_dir().join(format!("gpukit-{}", current_uid()))),
    ];
    candidates.into_iter().flatten().find(|d| {
        std::fs::create_dir_all(d).is_ok() && {
            let probe = d.join(format!(".probe-{}", std::process::id()));
            let ok = std::fs::write(&probe, b"").is_ok();
            let _ = std::fs::remove_file(&probe);
            ok
        }
    })
}

fn current_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
