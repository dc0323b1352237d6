//! A safe, typed way to run CUDA C kernels: the crates that own the math (training, tensor
//! ops, inference) keep their CUDA C next to it and launch it through this module, without
//! `unsafe`.
//!
//! To use:
//! 1. describe the module: a [`KernelSource`] (its name in the kernel cache, its whole CUDA C
//!    source, the kernels to load);
//! 2. [`KernelModule::load`] once per device (compiles with NVRTC, or reads the compiled
//!    module from the on-disk cache: see `nvrtc`);
//! 3. [`KernelModule::launch`] with a [`Launch`] shape (often [`grid_for`]) and the arguments as
//!    [`Arg`]s. It enqueues on the stream given and returns at once (capturable in a graph).
//!
//! What a launch checks: when the module loads, each named `extern "C" __global__` function's
//! parameter list is read from the source (through its macros) and compared with the sizes
//! the driver reports for the compiled kernel; at every launch the arguments must match it in
//! number and kind (a pointer, a 32- or 64-bit signed or unsigned integer, a float, a double, a
//! struct of the declared name and size). An [`Arg::Size`] takes any integer parameter and is
//! an error, never a truncation, when it does not fit. Device memory must be on the module's
//! device, as must the stream.
//!
//! What it cannot check, and stays the caller's job (each owning crate checks it before a
//! launch, with [`View::require`]): that a view holds every element the kernel will index (the
//! indices are computed inside the kernel), that a pointer's element type is the one the
//! kernel reads through it (a `float*` and a `half*` are both pointers), whether a kernel may
//! write through a pointer the caller meant as read-only, how views alias, and that a struct's
//! bytes have the C layout of the kernel's struct (its size is checked, not its fields).

mod signature;

use crate::driver::Gpu;
pub use crate::error::KernelError;
use crate::error::{Error, Result};
use crate::loader::Discovery;
use crate::memory::View;
use crate::nvrtc::Module;
use crate::stream::Stream;
use cudarc::driver::{result, sys};
use gpukit_types::DType;
use signature::Declared;
use std::collections::HashMap;

pub use signature::Param;

pub use crate::nvrtc::{ARCH_SPECIFIC, PART};

/// The kernels' name for an element type: its storage type's name (`f32` for tf32). Every
/// gpukit module names its typed kernels `{kernel}_{tag}`; a module without that type's
/// version says so when the kernel is looked up.
pub fn tag(dtype: DType) -> &'static str {
    dtype.storage().name()
}

/// CUDA C shared by gpukit's modules: the 16-bit storage types (as bits, so that NVRTC needs no
/// CUDA headers and no include path) and conversions to and from f32 (`to_f`, `from_f<T>`).
/// A module's source starts with it.
pub const HALF: &str = r#"
struct H { unsigned short v; };
struct B { unsigned short v; };

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(H x) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.v)); return f;
}
__device__ __forceinline__ float to_f(B x) { return __uint_as_float(((unsigned)x.v) << 16); }

template <class T> __device__ __forceinline__ T from_f(float f);
template <> __device__ __forceinline__ float from_f<float>(float f) { return f; }
template <> __device__ __forceinline__ H from_f<H>(float f) {
    H h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.v) : "f"(f)); return h;
}
template <> __device__ __forceinline__ B from_f<B>(float f) {
    unsigned u = __float_as_uint(f);
    B b;
    if ((u & 0x7fffffffu) > 0x7f800000u) { b.v = 0x7fc0; return b; }  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                 // round to nearest even
    b.v = (unsigned short)(u >> 16);
    return b;
}
"#;

/// A module of CUDA C: its name in the kernel cache (`{stem}-{arch}-{hash}.cubin`), its whole
/// source and the kernels to load from it.
#[derive(Clone, Debug)]
pub struct KernelSource {
    pub stem: &'static str,
    pub source: String,
    pub names: Vec<String>,
}

impl KernelSource {
    /// Each named kernel's parameters as the source declares them (read through its macros;
    /// no GPU needed): an error naming the first kernel that is not an `extern "C"
    /// __global__` function of the source or whose parameters cannot be read.
    pub fn signatures(&self) -> Result<HashMap<String, Vec<Param>>, KernelError> {
        Ok(self
            .declared()?
            .into_iter()
            .map(|(name, d)| (name, d.into_iter().map(|d| d.param).collect()))
            .collect())
    }

    /// How the source's kernels differ from what their launchers pass, for the owning crate's
    /// test (empty: they agree). `expected` gives each kernel's parameters one letter each (p
    /// pointer, i int, l long, u unsigned long long, f float, d double, s the struct `Dims`);
    /// a name ending in `_` stands for that name with each of `tags` after it. A kernel of the
    /// module that `expected` does not name is a difference too.
    pub fn signature_differences(&self, expected: &[(&str, &str)], tags: &[&str]) -> Vec<String> {
        let got = match self.signatures() {
            Ok(g) => g,
            Err(e) => return vec![e.to_string()],
        };
        let kinds = |code: &str| -> Result<Vec<Param>, String> {
            code.split_whitespace()
                .map(|c| match c {
                    "p" => Ok(Param::Ptr),
                    "i" => Ok(Param::I32),
                    "l" => Ok(Param::I64),
                    "u" => Ok(Param::U64),
                    "u32" => Ok(Param::U32),
                    "f" => Ok(Param::F32),
                    "d" => Ok(Param::F64),
                    "s" => Ok(Param::Struct("Dims".into())),
                    other => Err(format!("unknown parameter letter {other:?}")),
                })
                .collect()
        };
        let mut out = Vec::new();
        let mut named = std::collections::HashSet::new();
        for (name, code) in expected {
            let names: Vec<String> = if tags.is_empty() || !name.ends_with('_') {
                vec![name.to_string()]
            } else {
                tags.iter().map(|t| format!("{name}{t}")).collect()
            };
            for n in names {
                match kinds(code) {
                    Ok(want) if got.get(&n) == Some(&want) => {}
                    Ok(want) => out.push(format!(
                        "{n}: declared {:?}, launched with {want:?}",
                        got.get(&n)
                    )),
                    Err(e) => out.push(format!("{n}: {e}")),
                }
                named.insert(n);
            }
        }
        let mut unnamed: Vec<&String> = got.keys().filter(|k| !named.contains(*k)).collect();
        unnamed.sort();
        out.extend(
            unnamed
                .into_iter()
                .map(|k| format!("{k}: no expected signature")),
        );
        // a kernel the source declares but the module never loads: a launch by that name
        // would fail on the GPU only
        let mut unloaded: Vec<String> = signature::kernels(&self.source)
            .into_keys()
            .filter(|k| !self.names.contains(k))
            .collect();
        unloaded.sort();
        out.extend(unloaded.into_iter().map(|k| {
            format!(
                "{k}: declared in the source but not among the names {} loads",
                self.stem
            )
        }));
        out
    }

    fn declared(&self) -> Result<HashMap<String, Vec<Declared>>, KernelError> {
        let mut parsed = signature::kernels(&self.source);
        let mut declared = HashMap::new();
        for name in &self.names {
            let params = parsed
                .remove(name)
                .ok_or_else(|| format!("not an extern \"C\" __global__ function of {}", self.stem))
                .and_then(|r| r)
                .map_err(|reason| KernelError::Signature {
                    kernel: name.clone(),
                    reason,
                })?;
            declared.insert(name.clone(), params);
        }
        Ok(declared)
    }
}

/// Compiles `module` for `arch` (such as "sm_90") with NVRTC on this thread, with no GPU and
/// no disk cache: whether its source compiles, before a GPU machine is spent on it. Returns each
/// program's name and machine code (a cubin, for `cuobjdump -sass` / `-res-usage`); an error
/// carries NVRTC's log, or names what to install.
pub fn compile_offline(
    discovery: &Discovery,
    module: &KernelSource,
    arch: &str,
) -> Result<Vec<(String, Vec<u8>)>> {
    crate::nvrtc::compile_offline(discovery, &module.source, module.stem, arch)
}

/// Compiles, each on its own thread, every module of `modules` the disk cache lacks for the GPU
/// `ordinal`'s architecture (nothing when the cache has them all, or NVRTC or the GPU is
/// missing: the module's first use then says why). Returns at once; the threads end with their
/// compile. The crates that own modules each say which they have.
pub fn warm_cache(discovery: &Discovery, ordinal: usize, modules: &[KernelSource]) {
    let pairs = modules.iter().map(|m| (m.stem, m.source.clone())).collect();
    crate::nvrtc::warm_cache(discovery, ordinal, pairs);
}

/// Threads per block of [`grid_for`].
pub const BLOCK: u32 = 256;

/// Dynamic shared memory a launch may take without raising the kernel's limit (48 KiB); a
/// [`Launch::shared_bytes`] above it raises the limit to what the launch takes.
pub const STATIC_SHARED_BYTES: u32 = 48 << 10;

/// The shape of a launch: blocks, threads per block, dynamic shared memory, and whether the
/// grid may start before the kernel ahead of it on the stream has finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
    /// Programmatic dependent launch (compute capability 9.0 and later; an ordinary launch
    /// elsewhere or with `GPUKIT_NO_EARLY_START=1`): the grid may be scheduled while the kernel
    /// ahead of it still runs, once that kernel lets it (`griddepcontrol.launch_dependents`) or
    /// ends. Only for a kernel that executes `griddepcontrol.wait` (the prelude's
    /// `wait_for_previous_grid()`) before it reads anything an earlier kernel writes and before
    /// it writes anything: what it does before that may only read constants (weights).
    pub early_start: bool,
}

impl Launch {
    /// `grid` blocks of `block` threads, no dynamic shared memory, an ordinary launch.
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Launch {
        Launch {
            grid,
            block,
            shared_bytes: 0,
            early_start: false,
        }
    }

    /// The same launch, started early where the GPU allows (see [`Launch::early_start`]).
    pub fn starting_early(self) -> Launch {
        Launch {
            early_start: true,
            ..self
        }
    }
}

/// Whether launches marked [`Launch::early_start`] start early: not with
/// `GPUKIT_NO_EARLY_START=1` (to measure what it gives), read once.
fn early_start_allowed() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var_os("GPUKIT_NO_EARLY_START").is_none_or(|v| v != "1"))
}

/// The launch of a grid-stride loop over `total` elements: blocks of [`BLOCK`] threads, as many
/// as cover `total` up to a bound (the loop covers the rest), at least one.
pub fn grid_for(total: usize) -> Launch {
    let blocks = total.div_ceil(BLOCK as usize).clamp(1, 65_535 * 8) as u32;
    Launch::new((blocks, 1, 1), (BLOCK, 1, 1))
}

/// One argument of a launch.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// Device memory, for a pointer parameter: the view's first byte.
    Ptr(View<'a>),
    /// A null pointer, for a pointer parameter the kernel treats as optional.
    Null,
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A count or index for any integer parameter, converted to its width (an error when it
    /// does not fit).
    Size(usize),
    /// A flag, for an `int` or `unsigned` parameter: 1 or 0.
    Bool(bool),
    /// A struct passed by value: the C type's name and its bytes (in the C layout).
    Struct(&'static str, &'a [u8]),
}

impl<'a> Arg<'a> {
    /// A pointer argument from an optional view ([`Arg::Null`] for none).
    pub fn opt(view: Option<View<'a>>) -> Arg<'a> {
        view.map_or(Arg::Null, Arg::Ptr)
    }

    fn describe(&self) -> String {
        match self {
            Arg::Ptr(_) => "device memory".into(),
            Arg::Null => "a null pointer".into(),
            Arg::I32(_) => "i32".into(),
            Arg::U32(_) => "u32".into(),
            Arg::I64(_) => "i64".into(),
            Arg::U64(_) => "u64".into(),
            Arg::F32(_) => "f32".into(),
            Arg::F64(_) => "f64".into(),
            Arg::Size(_) => "a size (usize)".into(),
            Arg::Bool(_) => "a flag (bool)".into(),
            Arg::Struct(name, _) => format!("struct {name}"),
        }
    }
}

/// One kernel's parameters: as the source declares them, with the byte sizes the driver
/// reports for the compiled kernel (None: not reported).
#[derive(Clone, Debug)]
struct Signature {
    declared: Vec<Declared>,
    sizes: Vec<Option<usize>>,
}

/// One argument as the driver reads it: its bytes, 8-byte aligned.
struct Slot(Vec<u64>);

impl Slot {
    fn of(bytes: &[u8]) -> Slot {
        let mut words = vec![0u64; bytes.len().div_ceil(8).max(1)];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_ne_bytes(b);
        }
        Slot(words)
    }
}

/// The arguments' bytes for `kernel`, each checked against its declared parameter, or why not.
fn encode(
    kernel: &str,
    sig: &Signature,
    device: usize,
    args: &[Arg<'_>],
) -> Result<Vec<Slot>, KernelError> {
    if args.len() != sig.declared.len() {
        return Err(KernelError::Count {
            kernel: kernel.into(),
            declared: sig.declared.len(),
            given: args.len(),
        });
    }
    let mut slots = Vec::with_capacity(args.len());
    for (index, (arg, (d, size))) in args
        .iter()
        .zip(sig.declared.iter().zip(&sig.sizes))
        .enumerate()
    {
        let param = if d.name.is_empty() {
            "unnamed".to_string()
        } else {
            d.name.clone()
        };
        let kind = || KernelError::Kind {
            kernel: kernel.into(),
            index,
            param: param.clone(),
            declared: d.param.describe(),
            given: arg.describe(),
        };
        let range = |value: String| KernelError::Range {
            kernel: kernel.into(),
            index,
            param: param.clone(),
            value,
            declared: d.param.describe(),
        };
        let bytes: Vec<u8> = match (&d.param, *arg) {
            (Param::Ptr, Arg::Ptr(v)) => {
                if v.device() != device {
                    return Err(KernelError::Device {
                        kernel: kernel.into(),
                        index,
                        param,
                        memory: v.device(),
                        module: device,
                    });
                }
                v.addr().to_ne_bytes().to_vec()
            }
            (Param::Ptr, Arg::Null) => 0u64.to_ne_bytes().to_vec(),
            (Param::I32, Arg::I32(x)) => x.to_ne_bytes().to_vec(),
            (Param::U32, Arg::U32(x)) => x.to_ne_bytes().to_vec(),
            (Param::I64, Arg::I64(x)) => x.to_ne_bytes().to_vec(),
            (Param::U64, Arg::U64(x)) => x.to_ne_bytes().to_vec(),
            (Param::F32, Arg::F32(x)) => x.to_ne_bytes().to_vec(),
            (Param::F64, Arg::F64(x)) => x.to_ne_bytes().to_vec(),
            (Param::I32 | Param::U32, Arg::Bool(b)) => u32::from(b).to_ne_bytes().to_vec(),
            (Param::I32, Arg::Size(n)) => i32::try_from(n)
                .map_err(|_| range(n.to_string()))?
                .to_ne_bytes()
                .to_vec(),
            (Param::U32, Arg::Size(n)) => u32::try_from(n)
                .map_err(|_| range(n.to_string()))?
                .to_ne_bytes()
                .to_vec(),
            (Param::I64, Arg::Size(n)) => i64::try_from(n)
                .map_err(|_| range(n.to_string()))?
                .to_ne_bytes()
                .to_vec(),
            (Param::U64, Arg::Size(n)) => u64::try_from(n)
                .map_err(|_| range(n.to_string()))?
                .to_ne_bytes()
                .to_vec(),
            (Param::Struct(name), Arg::Struct(given, bytes)) if name == given => {
                let declared = size.ok_or_else(|| KernelError::Signature {
                    kernel: kernel.into(),
                    reason: format!(
                        "the driver did not report the size of struct parameter {param}, so \
                         a struct argument cannot be checked"
                    ),
                })?;
                if bytes.len() != declared {
                    return Err(KernelError::StructSize {
                        kernel: kernel.into(),
                        index,
                        param,
                        name: name.clone(),
                        declared,
                        given: bytes.len(),
                    });
                }
                bytes.to_vec()
            }
            _ => return Err(kind()),
        };
        slots.push(Slot::of(&bytes));
    }
    Ok(slots)
}

/// The most threads a block may have on every GPU gpukit runs on.
const MAX_BLOCK_THREADS: u64 = 1024;

fn check_shape(kernel: &str, launch: Launch) -> Result<(), KernelError> {
    let (g, b) = (launch.grid, launch.block);
    let reason = if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
        Some("a dimension of 0".to_string())
    } else if u64::from(b.0) * u64::from(b.1) * u64::from(b.2) > MAX_BLOCK_THREADS {
        Some(format!("more than {MAX_BLOCK_THREADS} threads a block"))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(KernelError::Shape {
            kernel: kernel.into(),
            grid: g,
            block: b,
            reason,
        }),
        None => Ok(()),
    }
}

/// A module loaded on one device, with each kernel's checked signature.
pub struct KernelModule {
    module: Module,
    signatures: HashMap<String, Signature>,
    device: usize,
    /// Where the machine code came from: "compiled by NVRTC" or the cache file.
    pub origin: String,
    /// Milliseconds spent compiling or reading the cache and loading the module.
    pub load_ms: f64,
    /// Whether the device starts grids early ([`Launch::early_start`]): compute capability 9.0
    /// and later.
    early_start: bool,
}

impl KernelModule {
    /// Compiles `spec` for `gpu` (or reads its cached machine code), loads the kernels it names
    /// and reads their parameters: an error when a named kernel is not an `extern "C" __global__`
    /// function of the source, when its parameters cannot be read, or when they disagree with
    /// the compiled kernel's.
    pub fn load(discovery: &Discovery, gpu: &Gpu, spec: &KernelSource) -> Result<KernelModule> {
        let declared = spec.declared()?;
        let module = Module::load(discovery, gpu, &spec.source, spec.stem, &spec.names)?;
        let mut signatures = HashMap::new();
        for (name, declared) in declared {
            let f = module.function(&name)?;
            let sizes = driver_sizes(&name, f.cu_function(), &declared)?;
            signatures.insert(name, Signature { declared, sizes });
        }
        let early_start = gpu.compute_capability().is_ok_and(|(major, _)| major >= 9);
        Ok(KernelModule {
            origin: module.origin.clone(),
            load_ms: module.load_ms,
            early_start,
            module,
            signatures,
            device: gpu.ordinal,
        })
    }

    /// Enqueues kernel `name` on `stream` with `args`, after checking them against its
    /// parameters (see the module's documentation for what is and is not checked).
    pub fn launch(
        &self,
        name: &str,
        stream: &Stream,
        launch: Launch,
        args: &[Arg<'_>],
    ) -> Result<()> {
        let f = self.module.function(name)?;
        let sig = self
            .signatures
            .get(name)
            .ok_or_else(|| Error::Invalid(format!("gpukit has no kernel {name} in this module")))?;
        let stream_device = stream.raw().context().ordinal();
        if stream_device != self.device {
            return Err(KernelError::Stream {
                kernel: name.into(),
                stream: stream_device,
                module: self.device,
            }
            .into());
        }
        check_shape(name, launch)?;
        let mut slots = encode(name, sig, self.device, args)?;
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| s.0.as_mut_ptr().cast::<std::ffi::c_void>())
            .collect();
        stream.raw().context().bind_to_thread()?;
        if launch.shared_bytes > STATIC_SHARED_BYTES {
            // more dynamic shared memory than a kernel gets unasked: the function's limit is
            // raised to what this launch takes (the launch fails if the device has less)
            // SAFETY: a live function handle of this module, in its (bound) context.
            unsafe {
                sys::cuFuncSetAttribute(
                    f.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.shared_bytes as std::ffi::c_int,
                )
            }
            .result()?;
        }
        if launch.early_start && self.early_start && early_start_allowed() {
            let mut attribute = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue {
                    programmaticStreamSerializationAllowed: 1,
                },
            };
            let config = sys::CUlaunchConfig {
                gridDimX: launch.grid.0,
                gridDimY: launch.grid.1,
                gridDimZ: launch.grid.2,
                blockDimX: launch.block.0,
                blockDimY: launch.block.1,
                blockDimZ: launch.block.2,
                sharedMemBytes: launch.shared_bytes,
                hStream: stream.cu(),
                attrs: &mut attribute,
                numAttrs: 1,
            };
            // SAFETY: as for the ordinary launch below; the configuration and its one
            // attribute are live locals for the call, which copies them. That the kernel waits
            // before touching what earlier kernels use is the caller's promise (early_start).
            unsafe {
                sys::cuLaunchKernelEx(
                    &config,
                    f.cu_function(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()?;
            return Ok(());
        }
        // SAFETY: the function belongs to this module, loaded in the stream's context (same
        // device, checked); there is one parameter pointer per declared parameter, each to at
        // least as many live, 8-byte aligned bytes as the parameter takes (sizes checked against
        // the declaration and, where the driver reports them, the compiled kernel); pointer
        // arguments are device addresses of the module's device or null. What the kernel then
        // reads or writes through them is bounded by the caller's size checks (see above).
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                launch.grid,
                launch.block,
                launch.shared_bytes,
                stream.cu(),
                &mut params,
            )
        }?;
        Ok(())
    }
}

/// The sizes the driver reports for the compiled kernel's parameters, checked against the
/// declaration (count and every size the declaration fixes). All None where the driver
/// does not report them.
fn driver_sizes(
    name: &str,
    f: sys::CUfunction,
    declared: &[Declared],
) -> Result<Vec<Option<usize>>> {
    let info = |index: usize| -> std::result::Result<usize, sys::CUresult> {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a live function handle of a loaded module; both outputs are live locals.
        let rc = unsafe { sys::cuFuncGetParamInfo(f, index, &mut offset, &mut size) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            Ok(size)
        } else {
            Err(rc)
        }
    };
    let mismatch = |reason: String| -> Error {
        KernelError::Signature {
            kernel: name.into(),
            reason,
        }
        .into()
    };
    let mut sizes = Vec::with_capacity(declared.len());
    for (index, d) in declared.iter().enumerate() {
        match info(index) {
            Ok(size) => {
                if d.param.size().is_some_and(|s| s != size) {
                    return Err(mismatch(format!(
                        "parameter {index} ({}) is read from the source as {} but the compiled \
                         kernel's takes {size} bytes",
                        d.name,
                        d.param.describe()
                    )));
                }
                sizes.push(Some(size));
            }
            Err(sys::CUresult::CUDA_ERROR_INVALID_VALUE) => {
                return Err(mismatch(format!(
                    "the source declares {} parameters, the compiled kernel has {index}",
                    declared.len()
                )))
            }
            // the driver cannot say: the declaration alone is checked
            Err(_) => return Ok(vec![None; declared.len()]),
        }
    }
    if info(declared.len()).is_ok() {
        return Err(mismatch(format!(
            "the source declares {} parameters, the compiled kernel has more",
            declared.len()
        )));
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests;
