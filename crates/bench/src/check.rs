//! `check`: what GPUs, driver and CUDA libraries this machine has, and what each GPU can do.
//! Gathers facts only (no context is created, so it stays fast); the CLI renders them.

use crate::error::{Error, Result};
use crate::gpu::{gpu_facts, GpuFacts};
use crate::host::{host_facts, HostFacts};
use crate::part::{Context, Machine, Outcome, Part};
use crate::report::Document;
use gpukit_cuda::driver::{self, fmt_api, DeviceAttributes, Unavailable};
use gpukit_cuda::loader::{Discovery, Lib, Source, CUDA_MAJOR, REQUIRED_DRIVER_API};
use gpukit_cuda::nvml::NvmlSession;

use gpukit_tensor::DeviceSelection;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Everything `gpukit check` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    pub gpukit_version: String,
    /// The CUDA major version this binary binds (13 by default, 12 with `--features cuda-12`).
    pub build_cuda: u32,
    pub build_requires_driver_api: String,
    /// Whether at least one GPU can be used.
    pub available: bool,
    /// Whether CUDA itself was started (cuInit) to confirm it; false for `--quick`, which asks
    /// NVML only.
    pub cuda_initialized: bool,
    /// Why no GPU is available, when none is.
    pub reason: Option<String>,
    pub reason_detail: Option<Unavailable>,
    pub driver: Option<DriverFacts>,
    pub gpus: Vec<GpuFacts>,
    /// `peer_access[i][j]`: GPU i can access GPU j's memory directly. Absent with one GPU.
    pub peer_access: Option<Vec<Vec<bool>>>,
    pub libraries: Vec<LibraryRow>,
    /// Directories gpukit put on the loader's path for this run (empty if none were needed).
    pub loader_path_added: Vec<PathBuf>,
    /// Every directory searched for libraries, in order, with where it came from.
    pub searched: Vec<(PathBuf, Source)>,
    pub warnings: Vec<String>,
    pub host: HostFacts,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriverFacts {
    /// e.g. `580.159.04` (from NVML).
    pub version: Option<String>,
    /// e.g. `13.0`.
    pub cuda_api: String,
    pub cuda_api_raw: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LibraryRow {
    pub library: Lib,
    pub name: String,
    pub soname: String,
    pub found: bool,
    pub version: Option<String>,
    pub path: Option<PathBuf>,
    pub source: Option<Source>,
    pub used_for: String,
    /// What to install, when missing.
    pub install: Option<String>,
    pub note: Option<String>,
}

/// How much `check` does.
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions {
    pub selection: DeviceSelection,
    /// Open libraries whose version the files don't say (slow for cuBLAS and cuDNN).
    pub ask_library_versions: bool,
    /// NVML only: no cuInit (which costs 0.1-0.2 s on some machines), so nothing confirms that
    /// CUDA itself starts, and CUDA-only facts (L2, usable memory, peer access) are absent.
    pub quick: bool,
}

/// What the CUDA side found (run on its own thread, beside NVML and the host facts).
struct CudaSide {
    driver: Result<driver::Driver, Unavailable>,
    devices: Vec<DeviceAttributes>,
    peer_access: Option<Vec<Vec<bool>>>,
    warnings: Vec<String>,
}

fn cuda_side(discovery: &Discovery, selection: DeviceSelection) -> CudaSide {
    let mut out = CudaSide {
        driver: driver::probe(discovery),
        devices: Vec::new(),
        peer_access: None,
        warnings: Vec::new(),
    };
    let Ok(d) = &out.driver else {
        return out;
    };
    let t = gpukit_cuda::trace::start();
    for ordinal in (0..d.device_count).filter(|&o| selection.includes_cuda(o)) {
        match driver::device_attributes(ordinal, d.device_count) {
            Ok(a) => out.devices.push(a),
            Err(e) => out.warnings.push(format!("cuda:{ordinal}: {e}")),
        }
    }
    if d.device_count > 1 {
        match driver::peer_access_matrix(d.device_count) {
            Ok(m) => out.peer_access = Some(m),
            Err(e) => out.warnings.push(format!("peer access: {e}")),
        }
    }
    gpukit_cuda::trace::done("driver: device attributes", t);
    out
}

/// Whether the driver, as NVML describes it, can run this build (the `--quick` availability).
fn nvml_availability(
    discovery: &Discovery,
    nvml: &NvmlSession,
    devices: usize,
) -> Result<i32, Unavailable> {
    if discovery.found(Lib::Cuda).is_none() {
        return Err(Unavailable::NoDriver {
            hint: Lib::Cuda.install_hint(),
        });
    }
    let api = nvml
        .cuda_driver_version()
        .ok_or_else(|| Unavailable::InitFailed {
            error: "NVML did not report the driver's CUDA version".into(),
        })?;
    if api < REQUIRED_DRIVER_API {
        return Err(Unavailable::DriverTooOld {
            driver_api: api,
            required_api: REQUIRED_DRIVER_API,
        });
    }
    if devices == 0 {
        return Err(Unavailable::NoDevice {
            error: "NVML lists no device".into(),
        });
    }
    Ok(api)
}

/// Gathers the report. CUDA (cuInit and attributes) runs on a thread of its own while NVML and
/// the host are read, since cuInit alone can take most of the time.
pub fn run_check(discovery: &Discovery, opts: CheckOptions) -> Result<CheckReport> {
    let mut warnings: Vec<String> = discovery.warnings.iter().map(|w| w.0.clone()).collect();
    let cuda_thread = (!opts.quick).then(|| {
        let d = discovery.clone();
        std::thread::spawn(move || cuda_side(&d, opts.selection))
    });
    let t = gpukit_cuda::trace::start();
    let nvml = NvmlSession::open(discovery);
    // kept as messages: they end up in the report's warnings and per-GPU notes
    let nvml_devices = match &nvml {
        Ok(n) => n.devices().map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    gpukit_cuda::trace::done("nvml: init and every device's facts", t);
    let t = gpukit_cuda::trace::start();
    let host = host_facts();
    let libraries = library_rows(discovery, opts.ask_library_versions);
    gpukit_cuda::trace::done("host facts and library table", t);
    let driver_version = nvml.as_ref().ok().and_then(|n| n.driver_version());

    let (availability, gpus, peer_access, cuda_initialized) =
        match (cuda_thread, &nvml, &nvml_devices) {
            (Some(handle), _, _) => {
                let side = handle.join().unwrap_or_else(|_| CudaSide {
                    driver: Err(Unavailable::InitFailed {
                        error: "the CUDA probe thread panicked".into(),
                    }),
                    devices: Vec::new(),
                    peer_access: None,
                    warnings: Vec::new(),
                });
                warnings.extend(side.warnings);
                let by_uuid = |uuid: &str| {
                    nvml_devices
                        .as_ref()
                        .ok()?
                        .iter()
                        .find(|n| n.uuid == uuid)
                        .cloned()
                };
                let gpus = side
                    .devices
                    .into_iter()
                    .map(|a| {
                        let nv = by_uuid(&a.uuid);
                        let err = nv.is_none().then(|| match &nvml_devices {
                            Err(e) => e.clone(),
                            Ok(_) => format!("NVML does not list {}", a.uuid),
                        });
                        gpu_facts(Some(a), nv, err)
                    })
                    .collect();
                // CUDA started only where the driver's probe (cuInit) succeeded
                let started = side.driver.is_ok();
                (
                    side.driver.map(|d| (d.api_version, d.device_count)),
                    gpus,
                    side.peer_access,
                    started,
                )
            }
            (None, Ok(n), Ok(devs)) => {
                let gpus = devs
                    .iter()
                    .filter(|d| opts.selection.includes_cuda(d.index as usize))
                    .map(|d| gpu_facts(None, Some(d.clone()), None))
                    .collect();
                (
                    nvml_availability(discovery, n, devs.len()).map(|api| (api, devs.len())),
                    gpus,
                    None,
                    false,
                )
            }
            (None, _, _) => {
                // --quick without NVML: nothing to ask; say so rather than start CUDA unasked
                let e = nvml_devices.as_ref().err().cloned().unwrap_or_default();
                let why = if discovery.found(Lib::Cuda).is_none() {
                    Unavailable::NoDriver {
                        hint: Lib::Cuda.install_hint(),
                    }
                } else {
                    Unavailable::InitFailed {
                        error: format!("--quick needs NVML: {e}"),
                    }
                };
                (Err(why), Vec::new(), None, false)
            }
        };
    let (driver, reason, reason_detail) = match availability {
        Ok((api, count)) => {
            if let Some(n) = opts.selection.named_cuda() {
                if n >= count {
                    return Err(Error::BadInput(format!(
                        "device cuda:{n} does not exist: this machine has {count} CUDA device(s) (cuda:0..cuda:{})",
                        count - 1
                    )));
                }
            }
            let facts = DriverFacts {
                version: driver_version,
                cuda_api: fmt_api(api),
                cuda_api_raw: api,
            };
            (Some(facts), None, None)
        }
        Err(u) => {
            if let Some(n) = opts.selection.named_cuda() {
                return Err(Error::Unavailable(format!(
                    "device cuda:{n} was asked for, but no GPU can be used: {u}"
                )));
            }
            (None, Some(u.to_string()), Some(u))
        }
    };
    if let (Err(e), Some(_)) = (&nvml, &driver) {
        warnings.push(e.to_string());
    }
    Ok(CheckReport {
        gpukit_version: env!("CARGO_PKG_VERSION").to_string(),
        build_cuda: CUDA_MAJOR,
        build_requires_driver_api: fmt_api(REQUIRED_DRIVER_API),
        available: driver.is_some() && !gpus.is_empty(),
        cuda_initialized,
        reason,
        reason_detail,
        driver,
        gpus,
        peer_access,
        libraries,
        loader_path_added: discovery.added_to_loader_path.clone(),
        searched: discovery.searched.clone(),
        warnings,
        host,
    })
}

/// The JSON document of `gpukit check` (the report's warnings are its notes). A machine without
/// a GPU is a finding, not a failure.
pub fn document(report: CheckReport) -> Document<CheckReport> {
    let notes = report
        .warnings
        .iter()
        .map(|w| format!("warning: {w}"))
        .collect::<Vec<_>>();
    Document::new("check", report, None).with_notes(notes)
}

fn library_rows(discovery: &Discovery, ask_versions: bool) -> Vec<LibraryRow> {
    discovery
        .libraries
        .iter()
        .map(|s| {
            let found = s.found.as_ref();
            let mut version = found.and_then(|f| f.version.clone());
            let mut notes = Vec::new();
            if ask_versions && found.is_some() {
                // what the loaded copy says is the truth; a file name or wheel can disagree
                if let Some(api) = gpukit_cuda::libs::api_version(discovery, s.lib) {
                    let mm = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
                    if version.as_deref().is_some_and(|f| mm(f) != mm(&api)) {
                        notes.push(format!(
                            "the copy that loaded reports {api}, not {}",
                            version.as_deref().unwrap_or("?")
                        ));
                    }
                    version.get_or_insert(api);
                }
            }
            if found.is_none() {
                if let Some(o) = &s.other_major {
                    notes.push(format!(
                        "a CUDA {} copy is at {}",
                        if CUDA_MAJOR == 13 { 12 } else { 13 },
                        o.display()
                    ));
                }
            }
            if !s.shadowed.is_empty() {
                notes.push(format!(
                    "{} other cop(ies) further down the search",
                    s.shadowed.len()
                ));
            }
            LibraryRow {
                library: s.lib,
                name: s.lib.name().to_string(),
                soname: s.soname.clone(),
                found: found.is_some(),
                version,
                path: found.map(|f| f.path.clone()),
                source: found.map(|f| f.source),
                used_for: s.lib.purpose().to_string(),
                install: found.is_none().then(|| s.lib.install_hint()),
                note: (!notes.is_empty()).then(|| notes.join("; ")),
            }
        })
        .collect()
}

/// `check` under `gpukit all`: with the libraries' own versions. What it finds tells the parts
/// after it what they may use; its bad input stops `all`.
pub struct CheckPart;

/// The check's part of `gpukit all`.
pub static PART: CheckPart = CheckPart;

impl Part for CheckPart {
    fn key(&self) -> &'static str {
        "check"
    }
    fn command(&self) -> &'static str {
        "check"
    }
    fn title(&self) -> &'static str {
        "Check"
    }
    fn run(&self, ctx: &Context<'_>, _progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let r = run_check(
            ctx.discovery,
            CheckOptions {
                selection: ctx.selection,
                ask_library_versions: true,
                quick: false,
            },
        )?;
        let mut o = Outcome::report(&r);
        o.machine = Some(Machine {
            available: r.available,
            reason: r.reason.clone(),
            gpu_count: r.gpus.len(),
        });
        Ok(o)
    }
}
