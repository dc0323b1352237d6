//! gpukit's CUDA C modules, compiled by NVRTC for the device's own architecture to machine code
//! (a cubin) and kept on disk (`{stem}-{arch}-{hash}.cubin` in gpukit's cache folder, the hash
//! over the source, the architecture and NVRTC's version): a module is compiled once per
//! machine. Loading PTX instead made the driver compile it again at every first load on a
//! machine whose driver cache was empty (a second per module, on a command's own path).
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
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

fn cache_file(discovery: &Discovery, source: &str, stem: &str, arch: &str) -> Option<PathBuf> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    arch.hash(&mut h);
    crate::libs::api_version(discovery, Lib::Nvrtc).hash(&mut h);
    crate::loader::cache_dir().map(|d| d.join(format!("{stem}-{arch}-{:016x}.cubin", h.finish())))
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

/// The machine code of `source` for `arch`: read from the disk cache, or compiled by NVRTC and
/// written there. Also says where it came from (the cache file, or "compiled by NVRTC").
fn cubin(discovery: &Discovery, source: &str, stem: &str, arch: &str) -> Result<(Ptx, String)> {
    let _turn = compiling(format!("{stem}-{arch}"));
    let _turn = _turn.lock().unwrap_or_else(|p| p.into_inner());
    let cached = cache_file(discovery, source, stem, arch);
    let from_cache = cached
        .as_ref()
        .and_then(|p| std::fs::read(p).ok().map(|b| (p.clone(), b)))
        .filter(|(_, b)| looks_like_cubin(b));
    if let Some((path, bytes)) = from_cache {
        return Ok((Ptx::from_binary(bytes), path.display().to_string()));
    }
    nvrtc_ready(discovery)?;
    let started = crate::trace::start();
    let bytes = compile_cubin(source, stem, &options(arch))?;
    crate::trace::done(&format!("nvrtc: {stem} compiled for {arch}"), started);
    if let Some(path) = &cached {
        // a cache: when it cannot be written, the next run compiles again
        let _ = gpukit_types::files::write_atomically(path, &bytes);
    }
    Ok((Ptx::from_binary(bytes), "compiled by NVRTC".to_string()))
}

/// The line that splits a module's source into programs NVRTC compiles apart, in parallel
/// (a large module's compile takes seconds): the text before the first such line is every
/// program's prefix, each text after one a program's own part (its kernels' instances; each
/// kernel defined in one part only). A source without it is one program.
pub const PART: &str = "\n// @part (compiled apart)\n";

/// The programs of a module's source, each with its name in the cache: the whole source as
/// `stem`, or the prefix followed by each part as `{stem}.{k}`.
fn programs(source: &str, stem: &str) -> Vec<(String, String)> {
    let mut pieces = source.split(PART);
    let prefix = pieces.next().unwrap_or_default();
    let parts: Vec<(String, String)> = pieces
        .enumerate()
        .map(|(k, part)| (format!("{stem}.{k}"), format!("{prefix}\n{part}")))
        .collect();
    if parts.is_empty() {
        vec![(stem.to_string(), source.to_string())]
    } else {
        parts
    }
}

/// Whether `bytes` can be a cubin (an ELF file): a cache file cut short or from elsewhere is
/// compiled again rather than handed to the driver.
fn looks_like_cubin(bytes: &[u8]) -> bool {
    bytes.len() > 64 && bytes.starts_with(b"\x7fELF")
}

/// NVRTC's machine code of `source` for the real architecture named in `options`.
fn compile_cubin(source: &str, stem: &str, options: &[String]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(source)
        .map_err(|_| Error::Compile(format!("{stem}: the source holds a NUL byte")))?;
    let name = std::ffi::CString::new(format!("{stem}.cu"))
        .map_err(|_| Error::Compile(format!("{stem}: the name holds a NUL byte")))?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| Error::Compile(format!("{stem}: {e:?}")))?;
    struct Program(sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: created by create_program, destroyed once, here.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let prog = Program(prog);
    // SAFETY: a live program; the options are NUL-free strings.
    if let Err(e) = unsafe { result::compile_program(prog.0, options) } {
        // SAFETY: a live program that was compiled (and failed): its log is readable.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| {
                let bytes: Vec<u8> = l
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        return Err(Error::Compile(format!("{stem}: {e:?}: {log}")));
    }
    let mut size = 0usize;
    // SAFETY: a compiled program; the out-pointer is a local.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| Error::Compile(format!("{stem}: no machine code ({e:?})")))?;
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds the size NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog.0, bytes.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| Error::Compile(format!("{stem}: no machine code ({e:?})")))?;
    Ok(bytes)
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
    for (stem, source) in modules {
        let arch = arch_for(&source, attributes.compute_capability);
        for (name, program) in programs(&source, stem) {
            let cached = cache_file(discovery, &program, &name, &arch).is_some_and(|p| p.is_file());
            if cached || !discovery.usable(Lib::Nvrtc) {
                continue;
            }
            let (discovery, arch) = (discovery.clone(), arch.clone());
            let _ = std::thread::Builder::new()
                .name(format!("nvrtc-{name}"))
                .spawn(move || {
                    let _ = cubin(&discovery, &program, &name, &arch);
                });
        }
    }
}

/// Compiles every program of `source` for `arch` (such as "sm_90") with NVRTC, on this thread,
/// without a GPU and without the disk cache; returns each program's name and machine code. A
/// program that does not compile is an error with NVRTC's log.
pub(crate) fn compile_offline(
    discovery: &Discovery,
    source: &str,
    stem: &str,
    arch: &str,
) -> Result<Vec<(String, Vec<u8>)>> {
    nvrtc_ready(discovery)?;
    programs(source, stem)
        .into_iter()
        .map(|(name, program)| {
            let cubin = compile_cubin(&program, &name, &options(arch))?;
            Ok((name, cubin))
        })
        .collect()
}

/// An error naming what to install where NVRTC was not found or did not load.
fn nvrtc_ready(discovery: &Discovery) -> Result<()> {
    if !discovery.usable(Lib::Nvrtc) {
        return Err(Error::MissingLibrary(discovery.missing_message(Lib::Nvrtc)));
    }
    // SAFETY: asks the loader only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::MissingLibrary(
            "NVRTC was found but did not load".into(),
        ));
    }
    Ok(())
}

/// The line a module's source holds to be compiled for its GPU's architecture-specific target
/// (`sm_90a` on compute capability 9.0: Hopper's warpgroup MMA and tensor-memory loads, which
/// no later architecture runs). Such a module loads only on the architecture it was built for.
pub const ARCH_SPECIFIC: &str = "// gpukit: architecture-specific";

/// The real architecture NVRTC compiles `source` for on a GPU of compute capability
/// (`major`, `minor`): `sm_XY`, or `sm_XYa` where the source asks for it (from 9.0 on).
pub(crate) fn arch_for(source: &str, (major, minor): (u32, u32)) -> String {
    let specific = major >= 9 && source.contains(ARCH_SPECIFIC);
    format!("sm_{major}{minor}{}", if specific { "a" } else { "" })
}

/// NVRTC's options for machine code of the real architecture `arch`.
fn options(arch: &str) -> [String; 2] {
    [format!("--gpu-architecture={arch}"), "-std=c++17".into()]
}

/// CUDA C compiled by NVRTC for one device (or read from the on-disk cache) and loaded,
/// with the functions named.
pub(crate) struct Module {
    _modules: Vec<Arc<CudaModule>>,
    pub(crate) functions: HashMap<String, CudaFunction>,
    pub(crate) origin: String,
    pub(crate) load_ms: f64,
}

impl Module {
    /// Compiles `source` for `gpu`'s architecture (cached as `{stem}-{arch}-{hash}.cubin`) and
    /// loads the functions in `names`.
    pub(crate) fn load(
        discovery: &Discovery,
        gpu: &Gpu,
        source: &str,
        stem: &str,
        names: &[String],
    ) -> Result<Module> {
        let start = std::time::Instant::now();
        let arch = arch_for(source, gpu.compute_capability()?);
        // a module's parts compile on threads of their own (each read from the cache when
        // there), then load one after the other
        let programs = programs(source, stem);
        let images: Vec<Result<(Ptx, String)>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = programs
                .iter()
                .map(|(name, program)| scope.spawn(|| cubin(discovery, program, name, &arch)))
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(Error::Compile(format!("{stem}: NVRTC stopped"))))
                })
                .collect()
        });
        let mut modules = Vec::new();
        let mut origins = Vec::new();
        for image in images {
            let (image, origin) = image?;
            modules.push(gpu.ctx().load_module(image)?);
            if !origins.contains(&origin) {
                origins.push(origin);
            }
        }
        let mut functions = HashMap::new();
        for name in names {
            let mut found = None;
            for m in &modules {
                if let Ok(f) = m.load_function(name) {
                    found = Some(f);
                    break;
                }
            }
            let f = found.ok_or_else(|| {
                Error::Invalid(format!(
                    "the module {stem} has no kernel {name} once compiled"
                ))
            })?;
            functions.insert(name.clone(), f);
        }
        Ok(Module {
            _modules: modules,
            functions,
            origin: origins.join(", "),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_splits_into_its_prefix_and_each_part() {
        assert_eq!(
            programs("whole", "m"),
            vec![("m".to_string(), "whole".to_string())]
        );
        let split = programs(&format!("pre{PART}one{PART}two"), "m");
        assert_eq!(
            split,
            vec![
                ("m.0".to_string(), "pre\none".to_string()),
                ("m.1".to_string(), "pre\ntwo".to_string())
            ]
        );
    }
}
