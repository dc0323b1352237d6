//! Finding CUDA libraries on a user's machine and making cudarc load them.
//!
//! To use:
//! 1. Call [`prepare_process`] first thing in `main` (before any CUDA call). It searches every
//!    place users get CUDA libraries from, and when what it found is not on the dynamic loader's
//!    path it re-executes the program once with `LD_LIBRARY_PATH` extended (the loader reads that
//!    variable only at process start, and cuDNN and NCCL open further libraries by name).
//! 2. Ask the returned [`Discovery`] whether a library is [`Discovery::usable`] before the first
//!    call into it: cudarc panics on a missing library, gpukit never lets it get there.
//!
//! Discovery itself reads only the file system (plus one `python3` query), so it is cheap enough
//! to run at every start.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The CUDA major version whose libraries this build binds (cargo feature `cuda-13` or `cuda-12`).
#[cfg(not(feature = "cuda-12"))]
pub const CUDA_MAJOR: u32 = 13;
#[cfg(feature = "cuda-12")]
pub const CUDA_MAJOR: u32 = 12;

/// The lowest driver API version (as `cuDriverGetVersion` reports it) this build can run on.
#[cfg(not(feature = "cuda-12"))]
pub const REQUIRED_DRIVER_API: i32 = 13000;
#[cfg(feature = "cuda-12")]
pub const REQUIRED_DRIVER_API: i32 = 12040;

/// Environment variable carrying the parent's discovery into the re-executed child.
const DISCOVERY_ENV: &str = "GPUKIT_INTERNAL_DISCOVERY";
/// Libraries the user turns off, comma-separated by stem (`cupti`, `nvToolsExt`, `nccl`): gpukit
/// acts as if they were not installed (a profiler that holds CUPTI itself, or a test of the
/// fallback paths).
pub const DISABLE_ENV: &str = "GPUKIT_DISABLE";
/// Extra search roots given by the user, separated by `:`.
pub const USER_PATH_ENV: &str = "GPUKIT_CUDA_PATH";

/// The libraries gpukit knows about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lib {
    /// The driver API, from the NVIDIA driver.
    Cuda,
    /// NVIDIA Management Library, from the driver.
    Nvml,
    Cublas,
    CublasLt,
    Cudnn,
    Nvrtc,
    Nccl,
    Cupti,
    Nvtx,
}

impl Lib {
    pub const ALL: [Lib; 9] = [
        Lib::Cuda,
        Lib::Nvml,
        Lib::Cublas,
        Lib::CublasLt,
        Lib::Cudnn,
        Lib::Nvrtc,
        Lib::Nccl,
        Lib::Cupti,
        Lib::Nvtx,
    ];

    /// Short display name.
    pub fn name(self) -> &'static str {
        match self {
            Lib::Cuda => "CUDA driver",
            Lib::Nvml => "NVML",
            Lib::Cublas => "cuBLAS",
            Lib::CublasLt => "cuBLASLt",
            Lib::Cudnn => "cuDNN",
            Lib::Nvrtc => "NVRTC",
            Lib::Nccl => "NCCL",
            Lib::Cupti => "CUPTI",
            Lib::Nvtx => "NVTX",
        }
    }

    /// What gpukit uses it for.
    pub fn purpose(self) -> &'static str {
        match self {
            Lib::Cuda => "every GPU feature",
            Lib::Nvml => "device facts in check, monitoring",
            Lib::Cublas => "matrix multiply (bench, infer)",
            Lib::CublasLt => "matmul with fused epilogues",
            Lib::Cudnn => "convolution (bench conv, infer)",
            Lib::Nvrtc => "gpukit's own kernels",
            Lib::Nccl => "multi-GPU collectives",
            Lib::Cupti => "profiling",
            Lib::Nvtx => "profiler ranges",
        }
    }

    /// The file stem: `lib<stem>.so.<major>`.
    fn stem(self) -> &'static str {
        match self {
            Lib::Cuda => "cuda",
            Lib::Nvml => "nvidia-ml",
            Lib::Cublas => "cublas",
            Lib::CublasLt => "cublasLt",
            Lib::Cudnn => "cudnn",
            Lib::Nvrtc => "nvrtc",
            Lib::Nccl => "nccl",
            Lib::Cupti => "cupti",
            Lib::Nvtx => "nvToolsExt",
        }
    }

    /// The SONAME major this build needs.
    fn wanted_major(self) -> u32 {
        match self {
            Lib::Cuda | Lib::Nvml | Lib::Nvtx => 1,
            Lib::Cudnn => 9,
            Lib::Nccl => 2,
            Lib::Cublas | Lib::CublasLt | Lib::Nvrtc | Lib::Cupti => CUDA_MAJOR,
        }
    }

    /// The file name the dynamic loader is asked for.
    pub fn soname(self) -> String {
        format!("lib{}.so.{}", self.stem(), self.wanted_major())
    }

    /// Whether this library follows the toolkit's major version (12 or 13).
    fn follows_toolkit(self) -> bool {
        matches!(self, Lib::Cublas | Lib::CublasLt | Lib::Nvrtc | Lib::Cupti)
    }

    /// Whether the driver ships it (so it is never in wheels or the toolkit).
    pub fn from_driver(self) -> bool {
        matches!(self, Lib::Cuda | Lib::Nvml)
    }

    /// What a user installs to get it.
    pub fn install_hint(self) -> String {
        let m = CUDA_MAJOR;
        match self {
            Lib::Cuda | Lib::Nvml => {
                "install the NVIDIA driver (R580+ for CUDA 13, R525+ for CUDA 12 builds)".into()
            }
            Lib::Cublas | Lib::CublasLt => format!(
                "pip install nvidia-cublas{} (or the CUDA {m} toolkit)",
                if m == 12 { "-cu12" } else { "" }
            ),
            Lib::Cudnn => format!("pip install nvidia-cudnn-cu{m} (or cuDNN 9 for CUDA {m})"),
            Lib::Nvrtc => format!(
                "pip install nvidia-cuda-nvrtc{} (or the CUDA {m} toolkit)",
                if m == 12 { "-cu12" } else { "" }
            ),
            Lib::Nccl => format!("pip install nvidia-nccl-cu{m}"),
            Lib::Cupti => format!(
                "pip install nvidia-cuda-cupti{} (or the CUDA {m} toolkit)",
                if m == 12 { "-cu12" } else { "" }
            ),
            Lib::Nvtx => format!(
                "pip install nvidia-nvtx{} (optional: only profiler ranges need it)",
                if m == 12 { "-cu12" } else { "" }
            ),
        }
    }

    /// Name fragment of the Python wheel's dist-info directory that ships it.
    fn wheel_dist_prefix(self) -> Option<&'static str> {
        match self {
            Lib::Cublas | Lib::CublasLt => Some("nvidia_cublas"),
            Lib::Cudnn => Some("nvidia_cudnn"),
            Lib::Nvrtc => Some("nvidia_cuda_nvrtc"),
            Lib::Nccl => Some("nvidia_nccl"),
            Lib::Cupti => Some("nvidia_cuda_cupti"),
            Lib::Nvtx => Some("nvidia_nvtx"),
            Lib::Cuda | Lib::Nvml => None,
        }
    }
}

/// Where a search root came from; shown to the user so they know which install was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    GpukitCudaPath,
    LdLibraryPath,
    CudaToolkit,
    Conda,
    PythonWheels,
    LinkerCache,
    SystemDir,
    DriverDir,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::GpukitCudaPath => "GPUKIT_CUDA_PATH",
            Source::LdLibraryPath => "LD_LIBRARY_PATH",
            Source::CudaToolkit => "CUDA toolkit",
            Source::Conda => "conda",
            Source::PythonWheels => "Python wheels",
            Source::LinkerCache => "linker cache",
            Source::SystemDir => "system library dir",
            Source::DriverDir => "driver dir",
        }
    }

    /// Whether the dynamic loader finds libraries from here without help.
    fn loader_sees_it(self) -> bool {
        matches!(self, Source::LdLibraryPath | Source::LinkerCache)
    }
}

/// One library found on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Found {
    pub path: PathBuf,
    pub source: Source,
    /// Version read from the file name or the wheel that installed it, when either says.
    pub version: Option<String>,
}

/// What the search found for one library.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibraryStatus {
    pub lib: Lib,
    pub soname: String,
    pub found: Option<Found>,
    /// A copy built for the other CUDA major, reported so the user knows which build to use.
    pub other_major: Option<PathBuf>,
    /// Everything else of the same SONAME found further down the search order.
    pub shadowed: Vec<PathBuf>,
    /// Turned off by the user (`GPUKIT_DISABLE`): what was found is kept in `shadowed`, and the
    /// library counts as absent.
    #[serde(default)]
    pub disabled: bool,
}

/// Problems with the user's own settings; worth a warning, never fatal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Warning(pub String);

/// Everything the search found, in the order searched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Discovery {
    pub libraries: Vec<LibraryStatus>,
    pub warnings: Vec<Warning>,
    /// The directories that were searched, with where each came from.
    pub searched: Vec<(PathBuf, Source)>,
    /// Directories prepended to `LD_LIBRARY_PATH` by the re-exec, empty when none was needed.
    pub added_to_loader_path: Vec<PathBuf>,
    /// Directory of alias links (`libnccl.so` -> the real file) for names cudarc asks for.
    pub alias_dir: Option<PathBuf>,
}

impl Discovery {
    pub fn status(&self, lib: Lib) -> Option<&LibraryStatus> {
        self.libraries.iter().find(|s| s.lib == lib)
    }

    pub fn found(&self, lib: Lib) -> Option<&Found> {
        self.status(lib).and_then(|s| s.found.as_ref())
    }

    /// True when the library was found and the loader path was arranged so cudarc opens it.
    pub fn usable(&self, lib: Lib) -> bool {
        self.found(lib).is_some()
            && (lib != Lib::Nccl || self.alias_dir.is_some() || self.loader_has_plain_name(lib))
    }

    fn loader_has_plain_name(&self, lib: Lib) -> bool {
        self.found(lib).is_some_and(|f| {
            f.path
                .parent()
                .is_some_and(|d| d.join(format!("lib{}.so", lib.stem())).exists())
        })
    }

    /// One line saying why a library cannot be used and what to install.
    pub fn missing_message(&self, lib: Lib) -> String {
        if self.status(lib).is_some_and(|s| s.disabled) {
            return format!(
                "{} is turned off by {DISABLE_ENV} (unset it, or leave {} out of it, to use it)",
                lib.name(),
                lib.stem()
            );
        }
        let mut msg = format!(
            "{} ({}) was not found; {}",
            lib.name(),
            lib.soname(),
            lib.install_hint()
        );
        if let Some(other) = self.status(lib).and_then(|s| s.other_major.as_ref()) {
            let other_major = if CUDA_MAJOR == 13 { 12 } else { 13 };
            msg.push_str(&format!(
                ". A CUDA {other_major} copy exists at {}: build gpukit with `--no-default-features --features cuda-{other_major}` to use it",
                other.display()
            ));
        }
        msg
    }
}

/// Searches for every library in [`Lib::ALL`]. Reads the environment but changes nothing.
pub fn discover() -> Discovery {
    let t = crate::trace::start();
    let mut warnings = Vec::new();
    let roots = search_roots(&mut warnings);
    crate::trace::done("discover: search roots (python3 site-packages included)", t);
    let t = crate::trace::start();
    let cache = linker_cache();
    crate::trace::done("discover: ldconfig -p", t);
    let t = crate::trace::start();
    let mut site_versions = WheelVersions::default();
    let mut libraries = Vec::new();
    let disabled: Vec<String> = std::env::var(DISABLE_ENV)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    for lib in Lib::ALL {
        let mut status = find_library(lib, &roots, &cache, &mut site_versions);
        if lib != Lib::Cuda && disabled.contains(&lib.stem().to_ascii_lowercase()) {
            status.disabled = true;
            if let Some(f) = status.found.take() {
                status.shadowed.insert(0, f.path);
            }
        }
        libraries.push(status);
    }
    crate::trace::done("discover: find libraries", t);
    Discovery {
        libraries,
        warnings,
        searched: roots,
        added_to_loader_path: Vec::new(),
        alias_dir: None,
    }
}

fn find_library(
    lib: Lib,
    roots: &[(PathBuf, Source)],
    cache: &[(String, PathBuf)],
    wheels: &mut WheelVersions,
) -> LibraryStatus {
    let soname = lib.soname();
    let other_soname = (lib.follows_toolkit()).then(|| {
        let other = if CUDA_MAJOR == 13 { 12 } else { 13 };
        format!("lib{}.so.{other}", lib.stem())
    });
    let mut hits: Vec<(PathBuf, Source)> = Vec::new();
    let mut other_major = None;
    let mut seen = HashSet::new();
    let mut consider = |path: PathBuf, source: Source, hits: &mut Vec<(PathBuf, Source)>| {
        let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.insert(key) {
            hits.push((path, source));
        }
    };
    for (dir, source) in roots {
        let candidate = dir.join(&soname);
        if candidate.is_file() {
            consider(candidate, *source, &mut hits);
        }
        if other_major.is_none() {
            if let Some(other) = &other_soname {
                let c = dir.join(other);
                if c.is_file() {
                    other_major = Some(c);
                }
            }
        }
    }
    for (name, path) in cache {
        if *name == soname && path.is_file() {
            consider(path.clone(), Source::LinkerCache, &mut hits);
        } else if other_major.is_none() && other_soname.as_deref() == Some(name.as_str()) {
            other_major = Some(path.clone());
        }
    }
    // A system-dir hit that the linker cache also lists needs no help from gpukit.
    for (path, source) in hits.iter_mut() {
        if *source == Source::SystemDir && cache.iter().any(|(_, p)| p == path) {
            *source = Source::LinkerCache;
        }
    }
    let mut hits = hits.into_iter();
    let found = hits.next().map(|(path, source)| {
        let version = version_from_file(&path).or_else(|| wheels.version_for(lib, &path));
        Found {
            path,
            source,
            version,
        }
    });
    LibraryStatus {
        lib,
        soname,
        found,
        other_major,
        shadowed: hits.map(|(p, _)| p).collect(),
        disabled: false,
    }
}

/// `libcublas.so.13.1.0.3` -> `13.1.0.3`, following a symlink to the real file first.
fn version_from_file(path: &Path) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?;
    let (_, tail) = name.split_once(".so.")?;
    (tail.split('.').count() >= 2 && tail.split('.').all(|p| p.parse::<u32>().is_ok()))
        .then(|| tail.to_string())
}

/// Versions of NVIDIA wheels, read from the dist-info directory names of a site-packages.
#[derive(Default)]
struct WheelVersions {
    by_site: BTreeMap<PathBuf, Vec<String>>,
}

impl WheelVersions {
    fn version_for(&mut self, lib: Lib, path: &Path) -> Option<String> {
        let prefix = lib.wheel_dist_prefix()?;
        // .../site-packages/nvidia/<pkg>/lib/libX.so.N
        let site = path.ancestors().find(|a| a.ends_with("nvidia"))?.parent()?;
        let entries = self.by_site.entry(site.to_path_buf()).or_insert_with(|| {
            std::fs::read_dir(site)
                .map(|rd| {
                    rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .filter(|n| n.starts_with("nvidia_") && n.ends_with(".dist-info"))
                        .collect()
                })
                .unwrap_or_default()
        });
        entries.iter().find_map(|n| {
            let stem = n.strip_suffix(".dist-info")?;
            let (dist, version) = stem.split_once('-')?;
            let rest = dist.strip_prefix(prefix)?;
            // nvidia_cudnn_cu13 matches nvidia_cudnn; nvidia_cublasmp must not match nvidia_cublas
            (rest.is_empty() || rest.starts_with("_cu")).then(|| version.to_string())
        })
    }
}

fn push_dir(roots: &mut Vec<(PathBuf, Source)>, dir: PathBuf, source: Source) {
    if dir.is_dir() && !roots.iter().any(|(d, _)| *d == dir) {
        roots.push((dir, source));
    }
}

/// The search order: the user's own setting first, then what the loader already sees, then the
/// active Python or conda environment and the one gpukit is installed in (PyTorch's own,
/// version-matched set), then CUDA toolkits, then the driver's and the system's directories.
/// Earlier wins.
fn search_roots(warnings: &mut Vec<Warning>) -> Vec<(PathBuf, Source)> {
    let mut roots = Vec::new();
    if let Some(val) = std::env::var_os(USER_PATH_ENV) {
        for entry in std::env::split_paths(&val).filter(|p| !p.as_os_str().is_empty()) {
            if !entry.is_dir() {
                warnings.push(Warning(format!(
                    "{USER_PATH_ENV} names {}, which is not a directory; ignoring it",
                    entry.display()
                )));
                continue;
            }
            let before = roots.len();
            for sub in ["", "lib64", "lib", "targets/x86_64-linux/lib"] {
                push_dir(&mut roots, entry.join(sub), Source::GpukitCudaPath);
            }
            for wheel_lib in wheel_lib_dirs(&entry) {
                push_dir(&mut roots, wheel_lib, Source::GpukitCudaPath);
            }
            if roots.len() == before + 1 && !dir_has_any_lib(&entry) {
                warnings.push(Warning(format!(
                    "{USER_PATH_ENV} names {}, which holds no CUDA library",
                    entry.display()
                )));
            }
        }
    }
    if let Some(val) = std::env::var_os("LD_LIBRARY_PATH") {
        for entry in std::env::split_paths(&val).filter(|p| !p.as_os_str().is_empty()) {
            push_dir(&mut roots, entry, Source::LdLibraryPath);
        }
    }
    if let Some(conda) = std::env::var_os("CONDA_PREFIX") {
        push_dir(&mut roots, PathBuf::from(conda).join("lib"), Source::Conda);
    }
    for site in python_site_packages() {
        for d in wheel_lib_dirs(&site) {
            push_dir(&mut roots, d, Source::PythonWheels);
        }
    }
    let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    toolkits.push(PathBuf::from("/usr/local/cuda"));
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut versioned: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("cuda-"))
            })
            .collect();
        versioned.sort();
        versioned.reverse(); // newest first
        toolkits.extend(versioned);
    }
    for tk in toolkits {
        for sub in [
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "extras/CUPTI/lib64",
        ] {
            push_dir(&mut roots, tk.join(sub), Source::CudaToolkit);
        }
    }
    // Container runtimes mount the driver here, WSL there; neither is on the loader's path.
    for d in [
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
        "/usr/lib/wsl/lib",
    ] {
        push_dir(&mut roots, PathBuf::from(d), Source::DriverDir);
    }
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"] {
        push_dir(&mut roots, PathBuf::from(d), Source::SystemDir);
    }
    roots
}

fn dir_has_any_lib(dir: &Path) -> bool {
    Lib::ALL.iter().any(|l| dir.join(l.soname()).exists())
}

/// `site-packages/nvidia/*/lib` (cu12 wheels: one package a library; cu13: `nvidia/cu13/lib`).
fn wheel_lib_dirs(site: &Path) -> Vec<PathBuf> {
    let nvidia = site.join("nvidia");
    let mut dirs: Vec<PathBuf> = match std::fs::read_dir(&nvidia) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("lib"))
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    };
    // cu13 before cu12 so the newest toolkit wins inside one site-packages
    dirs.sort_by(|a, b| b.cmp(a));
    dirs
}

/// site-packages of `$VIRTUAL_ENV`, of the Python environment gpukit itself is installed in
/// ([`installed_site_packages`]), and of the `python3` on PATH (python3's answer is cached).
pub fn python_site_packages() -> Vec<PathBuf> {
    let venv = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from);
    let own = std::env::current_exe()
        .map(|exe| installed_site_packages(&exe))
        .unwrap_or_default();
    sites_in_order(venv.as_deref(), own, python3_site_packages_cached())
}

/// The site-packages in search order, each once: `$VIRTUAL_ENV`'s, the binary's own
/// environment's, then python3's.
fn sites_in_order(venv: Option<&Path>, own: Vec<PathBuf>, python3: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut sites = Vec::new();
    if let Some(venv) = venv {
        sites.extend(glob_site_packages(venv));
    }
    for p in own.into_iter().chain(python3) {
        if p.is_dir() && !sites.contains(&p) {
            sites.push(p);
        }
    }
    sites
}

/// The site-packages of the Python environment the binary `exe` was installed into: `pip install
/// gpukit` puts it in `<prefix>/bin/` (a virtual environment, a conda environment, `--user`'s
/// `~/.local`) beside `<prefix>/lib/python3.X/site-packages`, where PyTorch's CUDA wheels are, so
/// they are found without the environment being activated. Empty for a binary outside a `bin`
/// directory (cargo's `target/release/`) or whose prefix holds no site-packages.
fn installed_site_packages(exe: &Path) -> Vec<PathBuf> {
    match exe.parent() {
        Some(bin) if bin.file_name().is_some_and(|n| n == "bin") => {
            bin.parent().map(glob_site_packages).unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

/// Asking python3 costs 20-60 ms (more behind a pyenv shim), too much for every start, so the
/// answer is cached per interpreter (path and modification time) and environment, for a day,
/// and asked again as soon as a cached directory has gone.
fn python3_site_packages_cached() -> Vec<PathBuf> {
    let Some(python) = find_on_path("python3") else {
        return Vec::new();
    };
    let stamp = std::fs::metadata(&python)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut key = format!("{}|{stamp}", python.display());
    for var in [
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "PYENV_VERSION",
        "PYTHONHOME",
        "PYTHONPATH",
    ] {
        key.push('|');
        key.push_str(&std::env::var(var).unwrap_or_default());
    }
    let cache_file =
        cache_dir().map(|d| d.join(format!("python-sites-{:016x}", fnv1a(key.as_bytes()))));
    if let Some(f) = &cache_file {
        let fresh = std::fs::metadata(f)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() < 24 * 3600);
        if fresh {
            if let Ok(text) = std::fs::read_to_string(f) {
                let sites: Vec<PathBuf> = text.lines().map(PathBuf::from).collect();
                if sites.iter().all(|p| p.is_dir()) {
                    return sites;
                }
            }
        }
    }
    // -I: no user environment or cwd. Not -S: site.py is what points sys.prefix at a venv.
    let script = "import site,sysconfig\nfor p in {sysconfig.get_paths()['purelib'],sysconfig.get_paths()['platlib'],*site.getsitepackages(),site.getusersitepackages()}: print(p)";
    let sites: Vec<PathBuf> = match Command::new(&python).args(["-I", "-c", script]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| PathBuf::from(l.trim()))
            .filter(|p| p.is_dir())
            .collect(),
        _ => Vec::new(),
    };
    if let Some(f) = &cache_file {
        let text: String = sites.iter().map(|p| format!("{}\n", p.display())).collect();
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    sites
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn glob_site_packages(prefix: &Path) -> Vec<PathBuf> {
    let lib = prefix.join("lib");
    let Ok(rd) = std::fs::read_dir(&lib) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect()
}

/// (name, path) pairs from `ldconfig -p`, for the names gpukit cares about.
fn linker_cache() -> Vec<(String, PathBuf)> {
    let wanted: Vec<String> = Lib::ALL
        .iter()
        .map(|l| format!("lib{}.so", l.stem()))
        .collect();
    linker_cache_named(&wanted)
}

/// (name, path) pairs from `ldconfig -p` whose name starts with one of `wanted`.
fn linker_cache_named(wanted: &[String]) -> Vec<(String, PathBuf)> {
    let out = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|exe| Command::new(exe).arg("-p").output().ok())
        .filter(|o| o.status.success());
    let Some(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let (name, rest) = line.split_once(' ')?;
            if !rest.contains("x86-64") && cfg!(target_arch = "x86_64") {
                return None;
            }
            let path = rest.rsplit_once("=> ")?.1;
            wanted
                .iter()
                .any(|w| name.starts_with(w.as_str()))
                .then(|| (name.to_string(), PathBuf::from(path)))
        })
        .collect()
}

/// Subdirectories of a site-packages where pip's TensorRT wheels put their libraries
/// (`pip install tensorrt`: `tensorrt_libs/libnvinfer.so.10`; older wheels: `tensorrt/`).
const TENSORRT_WHEEL_DIRS: [&str; 2] = ["tensorrt_libs", "tensorrt"];

/// Where [`find_extra_library`] looks, in order: the directories discovery searched (its
/// order), with the TensorRT wheel directories of each Python site-packages where discovery
/// put the Python wheels, and those of each `GPUKIT_CUDA_PATH` entry (one may be a
/// site-packages).
pub fn extra_library_dirs(discovery: &Discovery) -> Vec<PathBuf> {
    extra_dirs_from(&discovery.searched, &python_site_packages())
}

fn extra_dirs_from(searched: &[(PathBuf, Source)], sites: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let push = |d: PathBuf, dirs: &mut Vec<PathBuf>| {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    };
    // discovery's order: user roots, loader path, conda, Python wheels, then the rest
    let after_wheels = |s: Source| {
        matches!(
            s,
            Source::CudaToolkit | Source::LinkerCache | Source::SystemDir | Source::DriverDir
        )
    };
    let mut sites_done = false;
    for (dir, source) in searched {
        if !sites_done && after_wheels(*source) {
            for site in sites {
                for sub in TENSORRT_WHEEL_DIRS {
                    push(site.join(sub), &mut dirs);
                }
            }
            sites_done = true;
        }
        push(dir.clone(), &mut dirs);
        if *source == Source::GpukitCudaPath {
            for sub in TENSORRT_WHEEL_DIRS {
                push(dir.join(sub), &mut dirs);
            }
        }
    }
    if !sites_done {
        for site in sites {
            for sub in TENSORRT_WHEEL_DIRS {
                push(site.join(sub), &mut dirs);
            }
        }
    }
    dirs
}

/// The first file named `lib<stem>.so` or `lib<stem>.so.*` in `dirs`, in their order (within
/// one directory a versioned name before the bare one). `lib<stem>_plugin.so` is not a match.
pub fn find_library_file(dirs: &[PathBuf], stem: &str) -> Option<PathBuf> {
    let plain = format!("lib{stem}.so");
    dirs.iter().find_map(|dir| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| is_library_name(n, &plain))
            .filter(|n| dir.join(n).is_file())
            .collect();
        names.sort_by(|a, b| (*a == plain, a).cmp(&(*b == plain, b)));
        names.first().map(|n| dir.join(n))
    })
}

/// `libnvinfer.so` or `libnvinfer.so.10...` for `plain` = `libnvinfer.so`.
fn is_library_name(name: &str, plain: &str) -> bool {
    name == plain
        || name
            .strip_prefix(plain)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// A library gpukit does not load but reports (TensorRT's `libnvinfer`: stem `nvinfer`),
/// searched where discovery searched ([`extra_library_dirs`]), then in the linker cache.
pub fn find_extra_library(discovery: &Discovery, stem: &str) -> Option<PathBuf> {
    find_library_file(&extra_library_dirs(discovery), stem).or_else(|| {
        let plain = format!("lib{stem}.so");
        linker_cache_named(std::slice::from_ref(&plain))
            .into_iter()
            .find(|(name, path)| is_library_name(name, &plain) && path.is_file())
            .map(|(_, path)| path)
    })
}

mod process;
#[cfg(test)]
mod tests;

pub use process::cache_dir;
use process::fnv1a;
pub use process::prepare_process;
