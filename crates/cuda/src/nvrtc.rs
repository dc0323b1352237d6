//! gpukit's CUDA C modules, compiled by NVRTC for the device's own architecture and kept on
//! disk as PTX (`{stem}-{arch}-{hash}.ptx` in gpukit's cache folder, the hash over the source,
//! the architecture and NVRTC's version): a module is compiled once per machine.
//!
//! Used through `kernel`, the public API: [`Module::load`] where a module is first needed;
//! [`warm_cache`] at the start of a long command compiles every module the cache lacks on
//! helper threads, so that none is compiled on the command's own path (the first use then only
//! reads the file; a use that comes while its module is still compiling waits for that compile
//! rather than start another).

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

fn cache_file(discovery: &Discovery, source: &str, stem: &str, arch: &str) -> Option<PathBuf> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    arch.hash(&mut h);
    crate::libs::api_version(discovery, Lib::Nvrtc).hash(&mut h);
    crate::loader::cache_dir().map(|d| d.join(format!("{stem}-{arch}-{:016x}.ptx", h.finish())))
}

/// One lock per module and architecture: a second caller waits for the first one's compile.
fn compiling(key: String) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Arc::clone(locks.entry(key).or_default())
}

/// The PTX of `source` for `arch`: read from the disk cache, or compiled by NVRTC and written
/// there. Also says where it came from (the cache file, or "compiled by NVRTC").
fn ptx(discovery: &Discovery, source: &str, stem: &str, arch: &str) -> Result<(Ptx, String)> {
    let _turn = compiling(format!("{stem}-{arch}"));
    let _turn = _turn.lock().unwrap_or_else(|p| p.into_inner());
    let cached = cache_file(discovery, source, stem, arch);
    let from_cache = cached
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok().map(|s| (p.clone(), s)));
    if let Some((path, text)) = from_cache {
        return Ok((Ptx::from_src(text), path.display().to_string()));
    }
    if !discovery.usable(Lib::Nvrtc) {
        return Err(Error::MissingLibrary(discovery.missing_message(Lib::Nvrtc)));
    }
    // SAFETY: asks the loader only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::MissingLibrary(
            "NVRTC was found but did not load".into(),
        ));
    }
    let started = crate::trace::start();
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| Error::Compile(e.to_string()))?;
    crate::trace::done(&format!("nvrtc: {stem} compiled for {arch}"), started);
    if let Some(path) = &cached {
        // a cache: when it cannot be written, the next run compiles again
        let _ = gpukit_types::files::write_atomically(path, ptx.to_src().as_bytes());
    }
    Ok((ptx, "compiled by NVRTC".to_string()))
}

/// Compiles, each on its own thread, every module of `modules` (name in the cache, source) the
/// disk cache lacks for the GPU `ordinal`'s architecture (nothing when the cache has them all,
/// or NVRTC or the GPU is missing: the module's first use then says why). Returns at once; the
/// threads end with their compile.
pub(crate) fn warm_cache(
    discovery: &Discovery,
    ordinal: usize,
    modules: Vec<(&'static str, String)>,
) {
    let count = crate::driver::probe(discovery).map_or(0, |d| d.device_count);
    let Ok(attributes) = crate::driver::device_attributes(ordinal, count) else {
        return;
    };
    let (major, minor) = attributes.compute_capability;
    let arch = format!("sm_{major}{minor}");
    for (stem, source) in modules {
        let cached = cache_file(discovery, &source, stem, &arch).is_some_and(|p| p.is_file());
        if cached || !discovery.usable(Lib::Nvrtc) {
            continue;
        }
        let (discovery, arch) = (discovery.clone(), arch.clone());
        let _ = std::thread::Builder::new()
            .name(format!("nvrtc-{stem}"))
            .spawn(move || {
                let _ = ptx(&discovery, &source, stem, &arch);
            });
    }
}

/// CUDA C compiled by NVRTC for one device (or read from the on-disk PTX cache) and loaded,
/// with the functions named.
pub(crate) struct Module {
    _module: Arc<CudaModule>,
    pub(crate) functions: HashMap<String, CudaFunction>,
    pub(crate) origin: String,
    pub(crate) load_ms: f64,
}

impl Module {
    /// Compiles `source` for `gpu`'s architecture (cached as `{stem}-{arch}-{hash}.ptx`) and
    /// loads the functions in `names`.
    pub(crate) fn load(
        discovery: &Discovery,
        gpu: &Gpu,
        source: &str,
        stem: &str,
        names: &[String],
    ) -> Result<Module> {
        let start = std::time::Instant::now();
        let (major, minor) = gpu.compute_capability()?;
        let arch = format!("sm_{major}{minor}");
        let (ptx, origin) = ptx(discovery, source, stem, &arch)?;
        let module = gpu.ctx().load_module(ptx)?;
        let mut functions = HashMap::new();
        for name in names {
            let f = module.load_function(name)?;
            functions.insert(name.clone(), f);
        }
        Ok(Module {
            _module: module,
            functions,
            origin,
            load_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    pub(crate) fn function(&self, name: &str) -> Result<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| {
            Error::Invalid(format!(
                "gpukit has no kernel {name} (no version for that element type or layout)"
            ))
        })
    }
}
