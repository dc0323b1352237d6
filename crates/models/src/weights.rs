//! ResNet weights: loading a torchvision state_dict saved as safetensors (checked key by key),
//! saving one, and a deterministic seeded initialisation like torchvision's.

use crate::resnet::ResNet;
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, TensorView, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One parameter or buffer, as f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// torchvision's shape, e.g. `[out, in, k, k]` for a convolution.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

/// A checked state dict: exactly the keys of `ResNet::state_dict`, each with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct StateDict {
    /// The architecture the keys and shapes were checked against.
    pub model: ResNet,
    /// Rows of `fc.weight`.
    pub num_classes: usize,
    /// torchvision key name to value; `num_batches_tracked` is never here.
    pub params: BTreeMap<String, Param>,
}

impl StateDict {
    /// The parameter or buffer stored under its torchvision key name.
    pub fn get(&self, name: &str) -> Option<&Param> {
        self.params.get(name)
    }

    /// Total bytes as f32.
    pub fn bytes(&self) -> usize {
        self.params
            .values()
            .map(|p| p.data.len() * std::mem::size_of::<f32>())
            .sum()
    }
}

/// Why a weights file could not be loaded or saved; every message names the file and, where
/// there is one, the key, so that a bad checkpoint can be fixed without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file could not be read (absent, unreadable).
    #[error("weights file {}: cannot be read: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file (or its temporary sibling) could not be written, synced or renamed.
    #[error("weights file {}: cannot be written: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The bytes are not safetensors: truncated, corrupt, or another format altogether.
    #[error("weights file {}: is not a valid safetensors file: {source}", .path.display())]
    Format {
        path: PathBuf,
        source: SafeTensorError,
    },
    /// The safetensors library refused to encode the state dict.
    #[error("weights file {}: cannot be encoded as safetensors: {source}", .path.display())]
    Encode {
        path: PathBuf,
        source: SafeTensorError,
    },
    /// A key of the model's state dict is absent from the file.
    #[error("weights file {}: missing key {key}", .path.display())]
    MissingKey { path: PathBuf, key: String },
    /// The file holds a key the model does not have.
    #[error(
        "weights file {}: unexpected key {key} (is this a {} state_dict?)",
        .path.display(),
        .model.name()
    )]
    UnexpectedKey {
        path: PathBuf,
        key: String,
        model: ResNet,
    },
    /// A key's shape differs from the model's; `expected` is written as torchvision would
    /// (`[64, 3, 7, 7]`, or `[classes, 512]` where the class count could not be inferred).
    #[error(
        "weights file {}: key {key} has shape {found:?}, {} expects {expected}",
        .path.display(),
        .model.name()
    )]
    Shape {
        path: PathBuf,
        key: String,
        model: ResNet,
        found: Vec<usize>,
        expected: String,
    },
    /// A key's element type is not a floating-point type this loader converts.
    #[error(
        "weights file {}: key {key} has dtype {dtype}; expected F32, F16, BF16 or F64",
        .path.display()
    )]
    Dtype {
        path: PathBuf,
        key: String,
        dtype: String,
    },
    /// A key's data holds a non-finite value (after conversion to f32, so F64 values beyond
    /// f32's range count as Inf).
    #[error(
        "weights file {}: key {key} holds NaN or Inf (first at element {index})",
        .path.display()
    )]
    NonFinite {
        path: PathBuf,
        key: String,
        index: usize,
    },
    /// A stored tensor's byte length does not fit its shape and dtype.
    #[error(
        "weights file {}: key {key} has {found} bytes of data, but shape {shape:?} as {dtype} needs {expected}",
        .path.display()
    )]
    ByteLength {
        path: PathBuf,
        key: String,
        shape: Vec<usize>,
        dtype: String,
        found: usize,
        expected: usize,
    },
    /// A `Param` handed to `save_safetensors` has a value count that does not fit its shape.
    #[error(
        "weights file {}: key {key} has {found} values, but shape {shape:?} needs {expected}",
        .path.display()
    )]
    ValueCount {
        path: PathBuf,
        key: String,
        shape: Vec<usize>,
        found: usize,
        expected: usize,
    },
    /// The class count is zero, which no classifier has; usually an empty `fc.weight`.
    #[error(
        "weights file {}: num_classes is 0 (fc.weight needs at least one row)",
        .path.display()
    )]
    NoClasses { path: PathBuf },
}

/// Loads and checks `path` against `model`'s state dict for `num_classes` (use the class count
/// from fc.weight's first dimension if num_classes is None). Accepts F32, F16, BF16 and F64
/// tensors (converted to f32). `num_batches_tracked` keys (I64 in torchvision) are accepted and
/// ignored. Every problem is reported (the first one found is fine) with the key's name.
///
/// Checks run in this order, so the first error is the most telling: the file can be read and
/// parsed, every model key is present (in torchvision's order), no other key is present (in
/// name order), then per key in torchvision's order: shape, dtype, byte length, finiteness.
pub fn load_safetensors(
    path: &Path,
    model: ResNet,
    num_classes: Option<usize>,
) -> Result<StateDict, WeightsError> {
    let bytes = std::fs::read(path).map_err(|source| WeightsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| WeightsError::Format {
        path: path.to_path_buf(),
        source,
    })?;
    let tensors: HashMap<&str, TensorView<'_>> = file.iter().collect();
    let ctx = Ctx { path, model };

    let num_classes = match num_classes {
        Some(n) => n,
        None => infer_classes(&tensors, ctx)?,
    };
    if num_classes == 0 {
        return Err(WeightsError::NoClasses {
            path: path.to_path_buf(),
        });
    }
    let specs = model.state_dict(num_classes);

    if let Some(spec) = specs
        .iter()
        .find(|s| !tensors.contains_key(s.name.as_str()))
    {
        return Err(ctx.missing(&spec.name));
    }
    let expected: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let mut names: Vec<&str> = tensors.keys().copied().collect();
    // HashMap order differs run to run; sorting makes the reported key reproducible
    names.sort_unstable();
    for name in names {
        if !expected.contains(name) && !is_ignored_counter(name, &expected) {
            return Err(WeightsError::UnexpectedKey {
                path: path.to_path_buf(),
                key: name.to_string(),
                model,
            });
        }
    }

    let mut params = BTreeMap::new();
    for spec in specs {
        let Some(view) = tensors.get(spec.name.as_str()) else {
            // unreachable after the presence check above; kept as an error, not a panic
            return Err(ctx.missing(&spec.name));
        };
        if view.shape() != spec.shape.as_slice() {
            return Err(WeightsError::Shape {
                path: path.to_path_buf(),
                key: spec.name,
                model,
                found: view.shape().to_vec(),
                expected: format!("{:?}", spec.shape),
            });
        }
        let data = convert(view, &spec.name, &spec.shape, ctx)?;
        if let Some(index) = data.iter().position(|v| !v.is_finite()) {
            return Err(WeightsError::NonFinite {
                path: path.to_path_buf(),
                key: spec.name,
                index,
            });
        }
        params.insert(
            spec.name,
            Param {
                shape: spec.shape,
                data,
            },
        );
    }
    Ok(StateDict {
        model,
        num_classes,
        params,
    })
}

/// Writes the state dict as F32 safetensors (atomically: to a temp file in the same directory,
/// then rename), with the torchvision key names.
///
/// The temp file is synced before the rename so that a crash leaves either the old file or the
/// complete new one, never a torn one. Only value counts are checked here (a file with a
/// count that does not fit its shape cannot be written); keys and values are written as given.
pub fn save_safetensors(dict: &StateDict, path: &Path) -> Result<(), WeightsError> {
    for (key, p) in &dict.params {
        let expected = p.shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d));
        if p.data.len() != expected {
            return Err(WeightsError::ValueCount {
                path: path.to_path_buf(),
                key: key.clone(),
                shape: p.shape.clone(),
                found: p.data.len(),
                expected,
            });
        }
    }
    let views: Vec<(&str, &[usize], &[f32])> = dict
        .params
        .iter()
        .map(|(k, p)| (k.as_str(), p.shape.as_slice(), p.data.as_slice()))
        .collect();
    // "pt" is what Hugging Face tooling expects of a PyTorch state dict
    write_atomic(path, &views, Some(("format", "pt")))
}

/// Writes f32 tensors as one safetensors file: to a sibling first, synced, then renamed, so
/// that `path` is either the old file or the whole new one.
fn write_atomic(
    path: &Path,
    tensors: &[(&str, &[usize], &[f32])],
    metadata: Option<(&str, &str)>,
) -> Result<(), WeightsError> {
    let write_err = |source| WeightsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = temp_sibling(path).map_err(write_err)?;
    let views = tensors
        .iter()
        .map(|&(k, shape, data)| (k, F32View { shape, data }));
    let metadata = metadata.map(|(k, v)| HashMap::from([(k.to_string(), v.to_string())]));
    let result = safetensors::serialize_to_file(views, metadata, &tmp)
        .map_err(|e| match e {
            SafeTensorError::IoError(source) => write_err(source),
            source => WeightsError::Encode {
                path: path.to_path_buf(),
                source,
            },
        })
        .and_then(|()| {
            std::fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(write_err)
        })
        .and_then(|()| std::fs::rename(&tmp, path).map_err(write_err));
    if result.is_err() {
        // best effort: the original error is the one worth reporting
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Named f32 tensors (an input batch, logits) as one safetensors file, written atomically.
/// The message of an error names the file.
pub fn save_tensors(path: &Path, tensors: &[(&str, &[usize], &[f32])]) -> Result<(), String> {
    for &(name, shape, data) in tensors {
        if shape.iter().product::<usize>() != data.len() {
            return Err(format!(
                "{}: tensor {name} has {} values for shape {shape:?}",
                path.display(),
                data.len()
            ));
        }
    }
    write_atomic(path, tensors, None).map_err(|e| match e {
        WeightsError::Write { source, .. } => {
            format!("{}: cannot be written: {source}", path.display())
        }
        other => format!("{}: {other}", path.display()),
    })
}

/// The tensor `name` of a safetensors file as f32 (F32, F16, BF16 or F64 stored), with its
/// shape. The message of an error names the file and the key.
pub fn load_tensor(path: &Path, name: &str) -> Result<(Vec<usize>, Vec<f32>), String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{}: not a safetensors file: {e}", path.display()))?;
    let t = st.tensor(name).map_err(|_| {
        format!(
            "{}: has no tensor named {name:?} (it has: {})",
            path.display(),
            st.names().join(", ")
        )
    })?;
    let d = t.data();
    let values: Vec<f32> = match t.dtype() {
        Dtype::F32 => d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => d
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => d
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        other => {
            return Err(format!(
                "{}: tensor {name} is {other:?}; f32, f16, bf16 or f64 expected",
                path.display()
            ))
        }
    };
    Ok((t.shape().to_vec(), values))
}

/// Deterministic initialisation in torchvision's manner: convolution weights
/// kaiming_normal_(mode="fan_out", nonlinearity="relu") i.e. normal(0, sqrt(2 / (out*k*k)));
/// batch-norm weight 1, bias 0, running_mean 0, running_var 1; fc weight and bias uniform in
/// [-1/sqrt(in), 1/sqrt(in)] (PyTorch's Linear default). The same seed gives the same values on
/// every machine: use a self-written splitmix64/xorshift generator and Box-Muller (no `rand`).
/// To make inference tests meaningful (torchvision's zero-init of the last BN in each residual
/// block is NOT used; all BN weights are 1) also perturb running_mean/running_var slightly when
/// `realistic_bn` is true: running_mean ~ normal(0, 0.1), running_var ~ uniform(0.5, 1.5),
/// bn weight ~ uniform(0.5, 1.5), bn bias ~ normal(0, 0.1), so that batch-norm folding is
/// actually exercised by tests.
///
/// Each key draws from its own stream (seeded from `seed` and the key's name), so a key's values
/// do not change when other keys are added or resized, e.g. with another `num_classes`.
pub fn seeded_init(model: ResNet, num_classes: usize, seed: u64, realistic_bn: bool) -> StateDict {
    let specs = model.state_dict(num_classes);
    let fc_in = specs
        .iter()
        .find(|s| s.name == "fc.weight")
        .and_then(|s| s.shape.get(1).copied())
        .unwrap_or(1);
    let fc_bound = 1.0 / (fc_in.max(1) as f64).sqrt();
    let mut params = BTreeMap::new();
    for spec in specs {
        let n: usize = spec.shape.iter().product();
        let mut rng = SplitMix64::for_key(seed, &spec.name);
        let leaf = spec.name.rsplit('.').next().unwrap_or("");
        let data = match (spec.shape.as_slice(), leaf) {
            ([out, _, kh, kw], _) => {
                let fan_out = (out * kh * kw).max(1) as f64;
                rng.normals(n, 0.0, (2.0 / fan_out).sqrt())
            }
            _ if spec.name.starts_with("fc.") => rng.uniforms(n, -fc_bound, fc_bound),
            (_, "weight") if realistic_bn => rng.uniforms(n, 0.5, 1.5),
            (_, "bias") if realistic_bn => rng.normals(n, 0.0, 0.1),
            (_, "running_mean") if realistic_bn => rng.normals(n, 0.0, 0.1),
            (_, "running_var") if realistic_bn => rng.uniforms(n, 0.5, 1.5),
            (_, "weight" | "running_var") => vec![1.0; n],
            _ => vec![0.0; n],
        };
        params.insert(
            spec.name,
            Param {
                shape: spec.shape,
                data,
            },
        );
    }
    StateDict {
        model,
        num_classes,
        params,
    }
}

/// What every load error needs to name, passed around instead of two arguments.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    path: &'a Path,
    model: ResNet,
}

impl Ctx<'_> {
    fn missing(self, key: &str) -> WeightsError {
        WeightsError::MissingKey {
            path: self.path.to_path_buf(),
            key: key.to_string(),
        }
    }
}

/// The class count is fc.weight's first dimension; a tensor that is not a matrix cannot say it,
/// so that is reported as a shape error against the known input width.
fn infer_classes(
    tensors: &HashMap<&str, TensorView<'_>>,
    ctx: Ctx<'_>,
) -> Result<usize, WeightsError> {
    let key = "fc.weight";
    let Some(view) = tensors.get(key) else {
        return Err(ctx.missing(key));
    };
    match view.shape() {
        [classes, _] => Ok(*classes),
        found => {
            let width = ctx
                .model
                .state_dict(1)
                .into_iter()
                .find(|s| s.name == key)
                .and_then(|s| s.shape.get(1).copied())
                .unwrap_or(0);
            Err(WeightsError::Shape {
                path: ctx.path.to_path_buf(),
                key: key.to_string(),
                model: ctx.model,
                found: found.to_vec(),
                expected: format!("[classes, {width}]"),
            })
        }
    }
}

/// torchvision saves `<bn>.num_batches_tracked` next to each batch norm; it only drives the
/// momentum schedule of training, so it is skipped, but only beside a batch norm the model has
/// (elsewhere it betrays a different architecture).
fn is_ignored_counter(name: &str, expected: &HashSet<&str>) -> bool {
    name.strip_suffix(".num_batches_tracked")
        .is_some_and(|bn| expected.contains(format!("{bn}.running_mean").as_str()))
}

/// Converts little-endian F32/F16/BF16/F64 bytes to f32; `as_chunks` copes with the data's
/// arbitrary alignment inside the file buffer.
fn convert(
    view: &TensorView<'_>,
    key: &str,
    shape: &[usize],
    ctx: Ctx<'_>,
) -> Result<Vec<f32>, WeightsError> {
    let dtype = view.dtype();
    let width = match dtype {
        Dtype::F32 => 4,
        Dtype::F16 | Dtype::BF16 => 2,
        Dtype::F64 => 8,
        other => {
            return Err(WeightsError::Dtype {
                path: ctx.path.to_path_buf(),
                key: key.to_string(),
                dtype: other.to_string(),
            })
        }
    };
    let bytes = view.data();
    let count = shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d));
    // the library checks offsets against shape and dtype already; this guards against a
    // future version that does not, since a short tensor would silently shift every value
    let expected = count.saturating_mul(width);
    if bytes.len() != expected {
        return Err(WeightsError::ByteLength {
            path: ctx.path.to_path_buf(),
            key: key.to_string(),
            shape: shape.to_vec(),
            dtype: dtype.to_string(),
            found: bytes.len(),
            expected,
        });
    }
    let data: Vec<f32> = match dtype {
        Dtype::F16 => bytes
            .as_chunks::<2>()
            .0
            .iter()
            .map(|c| half::f16::from_le_bytes(*c).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .as_chunks::<2>()
            .0
            .iter()
            .map(|c| half::bf16::from_le_bytes(*c).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .as_chunks::<8>()
            .0
            .iter()
            .map(|c| f64::from_le_bytes(*c) as f32)
            .collect(),
        _ => bytes
            .as_chunks::<4>()
            .0
            .iter()
            .map(|c| f32::from_le_bytes(*c))
            .collect(),
    };
    Ok(data)
}

/// A Param seen as a safetensors F32 tensor; bytes are produced one tensor at a time while the
/// file is written, so saving never holds a second copy of the whole model.
struct F32View<'a> {
    shape: &'a [usize],
    data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}

/// A fresh name beside `path`: the same directory makes the final rename atomic (no
/// cross-filesystem copy), and the pid plus a counter keep concurrent savers apart.
fn temp_sibling(path: &Path) -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let Some(name) = path.file_name() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path does not name a file",
        ));
    };
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id());
    Ok(path.parent().unwrap_or(Path::new("")).join(tmp))
}

/// splitmix64 (Steele, Lea and Flood): tiny, passes BigCrush, and fully specified by integer
/// arithmetic, so every machine produces the same stream.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    /// Mixing the key's FNV-1a hash into the seed gives each key an independent stream.
    fn for_key(seed: u64, key: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        SplitMix64 { state: seed ^ h }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn uniforms(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (hi - lo) * self.next_f64()) as f32)
            .collect()
    }

    /// Box-Muller, both outputs of each pair used.
    fn normals(&mut self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            // 1 - u lies in (0, 1], keeping ln away from 0
            let u1 = 1.0 - self.next_f64();
            let u2 = self.next_f64();
            let r = (-2.0 * det_ln(u1)).sqrt();
            let (c, s) = det_cos_sin_turns(u2);
            out.push((mean + std * r * c) as f32);
            if out.len() < n {
                out.push((mean + std * r * s) as f32);
            }
        }
        out
    }
}

// std's ln, sin and cos come from the platform's libm, whose last bit differs between glibc,
// musl, macOS and Windows; these use only +, -, *, / and sqrt, which IEEE 754 rounds exactly,
// so the seeded values are bit-identical everywhere (Rust never fuses them into FMAs).

/// Natural log of a positive normal `x` (Box-Muller's argument is at least 2^-53), accurate
/// to about 1e-16 relative: x = m * 2^e with m near 1, ln m = 2 atanh((m-1)/(m+1)).
fn det_ln(x: f64) -> f64 {
    const TERMS: usize = 12;
    const INV_ODD: [f64; TERMS] = {
        let mut c = [0.0; TERMS];
        let mut k = 0;
        while k < TERMS {
            c[k] = 1.0 / (2 * k + 1) as f64;
            k += 1;
        }
        c
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let poly = INV_ODD.iter().rev().fold(0.0, |acc, &c| acc * s2 + c);
    2.0 * s * poly + e as f64 * std::f64::consts::LN_2
}

/// (cos, sin) of `turns` full turns, `turns` in [0, 1): the quadrant is split off exactly, and
/// Taylor series on [0, pi/2) are accurate to about 1e-16.
fn det_cos_sin_turns(turns: f64) -> (f64, f64) {
    const TERMS: usize = 12;
    // COS[k] = (-1)^k / (2k)!, SIN[k] = (-1)^k / (2k+1)!
    const COS: [f64; TERMS] = {
        let mut c = [0.0; TERMS];
        let mut k = 0;
        let mut f = 1.0;
        while k < TERMS {
            c[k] = if k % 2 == 0 { 1.0 / f } else { -1.0 / f };
            f *= ((2 * k + 1) * (2 * k + 2)) as f64;
            k += 1;
        }
        c
    };
    const SIN: [f64; TERMS] = {
        let mut c = [0.0; TERMS];
        let mut k = 0;
        let mut f = 1.0;
        while k < TERMS {
            c[k] = if k % 2 == 0 { 1.0 / f } else { -1.0 / f };
            f *= ((2 * k + 2) * (2 * k + 3)) as f64;
            k += 1;
        }
        c
    };
    let t = turns * 4.0;
    let quadrant = t as u32; // t >= 0: truncation is floor
    let x = (t - f64::from(quadrant)) * std::f64::consts::FRAC_PI_2;
    let x2 = x * x;
    let c = COS.iter().rev().fold(0.0, |acc, &k| acc * x2 + k);
    let s = x * SIN.iter().rev().fold(0.0, |acc, &k| acc * x2 + k);
    match quadrant % 4 {
        0 => (c, s),
        1 => (-s, c),
        2 => (-c, -s),
        _ => (s, -c),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn single_tensors_round_trip_and_errors_name_file_and_key() {
        let dir = std::env::temp_dir().join(format!("gpukit-tensors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        save_tensors(
            &path,
            &[("input", &[2, 3, 2, 2], &data), ("b", &[1], &[7.0])],
        )
        .unwrap();
        let (shape, back) = load_tensor(&path, "input").unwrap();
        assert_eq!((shape, back), (vec![2, 3, 2, 2], data.clone()));
        let e = load_tensor(&path, "logits").unwrap_err();
        assert!(
            e.contains("logits") && e.contains("t.safetensors") && e.contains("input"),
            "{e}"
        );
        let e = save_tensors(&path, &[("x", &[5], &data)]).unwrap_err();
        assert!(e.contains("24 values"), "{e}");
        std::fs::write(&path, b"short").unwrap();
        assert!(load_tensor(&path, "input")
            .unwrap_err()
            .contains("not a safetensors"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
    use super::*;
    use std::sync::OnceLock;

    /// A file under the temp dir, deleted when the test ends (pass or fail).
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str) -> Self {
            TempFile(std::env::temp_dir().join(format!(
                "gpukit-weights-{}-{tag}.safetensors",
                std::process::id()
            )))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// One R18 dict shared by the tests: building it once keeps the suite fast.
    fn r18() -> &'static StateDict {
        static DICT: OnceLock<StateDict> = OnceLock::new();
        DICT.get_or_init(|| seeded_init(ResNet::R18, 10, 7, true))
    }

    /// A tensor as raw file bytes, so tests can write dtypes and shapes `save` never would.
    struct Raw {
        dtype: Dtype,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    }

    impl Raw {
        fn f32(shape: &[usize], data: &[f32]) -> Self {
            Raw {
                dtype: Dtype::F32,
                shape: shape.to_vec(),
                bytes: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            }
        }
    }

    fn raw_dict(dict: &StateDict) -> BTreeMap<String, Raw> {
        dict.params
            .iter()
            .map(|(k, p)| (k.clone(), Raw::f32(&p.shape, &p.data)))
            .collect()
    }

    fn write_raw(raw: &BTreeMap<String, Raw>, path: &Path) {
        let views: Vec<(&str, TensorView<'_>)> = raw
            .iter()
            .map(|(k, r)| {
                (
                    k.as_str(),
                    TensorView::new(r.dtype, r.shape.clone(), &r.bytes).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    /// Writes R18 with `edit` applied and returns the loader's error message.
    fn load_error(tag: &str, edit: impl FnOnce(&mut BTreeMap<String, Raw>)) -> String {
        let file = TempFile::new(tag);
        let mut raw = raw_dict(r18());
        edit(&mut raw);
        write_raw(&raw, &file.0);
        let err = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
        err.to_string()
    }

    fn std_dev(v: &[f32]) -> f64 {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        (v.iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt()
    }

    #[test]
    fn seeded_init_is_deterministic_and_has_the_state_dict_keys() {
        let a = seeded_init(ResNet::R18, 10, 7, true);
        assert_eq!(&a, r18());
        let b = seeded_init(ResNet::R18, 10, 8, true);
        for (key, p) in &a.params {
            let q = &b.params[key];
            assert_eq!(p.shape, q.shape);
            // constant-free keys must differ with the seed
            assert_ne!(p.data, q.data, "{key} did not change with the seed");
        }
        let specs = ResNet::R18.state_dict(10);
        assert_eq!(a.params.len(), specs.len());
        for spec in &specs {
            let p = a.get(&spec.name).unwrap();
            assert_eq!(p.shape, spec.shape, "{}", spec.name);
            assert_eq!(p.data.len(), spec.shape.iter().product::<usize>());
        }
        let values: usize = specs
            .iter()
            .map(|s| s.shape.iter().product::<usize>())
            .sum();
        assert_eq!(a.bytes(), 4 * values);
        // a key's stream depends only on the seed and its name
        let c = seeded_init(ResNet::R18, 1000, 7, true);
        assert_eq!(c.get("conv1.weight"), a.get("conv1.weight"));
    }

    #[test]
    fn seeded_init_uses_torchvisions_scales() {
        let d = r18();
        // layer4.0.conv2: fan_out = 512 * 3 * 3
        let w = &d.get("layer4.0.conv2.weight").unwrap().data;
        let want = (2.0f64 / 4608.0).sqrt();
        let got = std_dev(w);
        assert!((got / want - 1.0).abs() < 0.1, "std {got}, want {want}");
        let bound = 1.0 / 512f32.sqrt();
        for key in ["fc.weight", "fc.bias"] {
            let v = &d.get(key).unwrap().data;
            assert!(v.iter().all(|x| x.abs() <= bound), "{key}");
            assert!(v.iter().any(|x| x.abs() > bound / 2.0), "{key}");
        }
        for key in ["bn1.weight", "layer3.1.bn2.running_var"] {
            let v = &d.get(key).unwrap().data;
            assert!(v.iter().all(|x| (0.5..=1.5).contains(x)), "{key}");
            assert!(v.iter().any(|&x| x != 1.0), "{key}");
        }
        let mean = &d.get("layer2.0.downsample.1.running_mean").unwrap().data;
        let s = std_dev(mean);
        assert!((0.07..0.13).contains(&s), "running_mean std {s}");

        let plain = seeded_init(ResNet::R50, 1000, 7, false);
        for (key, p) in &plain.params {
            let want = match key.rsplit('.').next().unwrap() {
                _ if key.starts_with("fc.") || p.shape.len() == 4 => continue,
                "weight" | "running_var" => 1.0,
                _ => 0.0,
            };
            assert!(p.data.iter().all(|&x| x == want), "{key}");
        }
    }

    #[test]
    fn generator_is_pinned_and_its_math_is_accurate() {
        // published splitmix64 reference outputs for seed 0
        let mut g = SplitMix64 { state: 0 };
        assert_eq!(g.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(g.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(g.next_u64(), 0x06c4_5d18_8009_454f);

        for i in 1..=2000 {
            let x = i as f64 / 2000.0;
            let x = x * x * x; // reaches down to 1.25e-10
            let (a, b) = (det_ln(x), x.ln());
            assert!(
                (a - b).abs() <= 1e-15 * b.abs().max(1.0),
                "ln {x}: {a} vs {b}"
            );
            let (c, s) = det_cos_sin_turns(x);
            let t = x * std::f64::consts::TAU;
            assert!((c - t.cos()).abs() < 1e-15, "cos {x}");
            assert!((s - t.sin()).abs() < 1e-15, "sin {x}");
        }
        assert!((det_ln(2f64.powi(-53)) - 2f64.powi(-53).ln()).abs() < 1e-13);

        // the values themselves, so a change to the generator shows up as a failing test
        let w = &seeded_init(ResNet::R18, 10, 0, false).params["conv1.weight"].data;
        let bits: Vec<u32> = w[..4].iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, PINNED, "{:?}", &w[..4]);
    }

    // also what an independent Python splitmix64 + Box-Muller (with libm's log and cos) gives
    const PINNED: [u32; 4] = [3128724486, 3171009549, 3119969908, 3148974576];

    #[test]
    fn save_then_load_round_trips() {
        let file = TempFile::new("roundtrip");
        save_safetensors(r18(), &file.0).unwrap();
        let inferred = load_safetensors(&file.0, ResNet::R18, None).unwrap();
        assert_eq!(inferred.num_classes, 10);
        assert_eq!(&inferred, r18());
        let given = load_safetensors(&file.0, ResNet::R18, Some(10)).unwrap();
        assert_eq!(&given, r18());
        // overwriting goes through the temp file too and leaves none behind
        save_safetensors(&seeded_init(ResNet::R18, 10, 9, false), &file.0).unwrap();
        let again = load_safetensors(&file.0, ResNet::R18, None).unwrap();
        assert_eq!(again, seeded_init(ResNet::R18, 10, 9, false));
        let prefix = format!(
            ".{}.{}.",
            file.0.file_name().unwrap().to_string_lossy(),
            std::process::id()
        );
        let leftovers = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count();
        assert_eq!(leftovers, 0);
    }

    #[test]
    fn save_reports_bad_counts_and_unwritable_paths() {
        let mut dict = seeded_init(ResNet::R18, 10, 1, false);
        dict.params.get_mut("fc.bias").unwrap().data.pop();
        let file = TempFile::new("badcount");
        let e = save_safetensors(&dict, &file.0).unwrap_err().to_string();
        assert!(
            e.contains("key fc.bias has 9 values, but shape [10] needs 10"),
            "{e}"
        );
        assert!(!file.0.exists());

        let dir =
            std::env::temp_dir().join(format!("gpukit-weights-{}-absent", std::process::id()));
        let e = save_safetensors(r18(), &dir.join("x.safetensors")).unwrap_err();
        assert!(matches!(e, WeightsError::Write { .. }), "{e}");
        assert!(
            e.to_string().contains("x.safetensors: cannot be written"),
            "{e}"
        );
    }

    #[test]
    fn load_reports_a_missing_key() {
        let e = load_error("missing", |raw| {
            raw.remove("layer3.1.bn1.running_var");
        });
        assert!(e.ends_with(": missing key layer3.1.bn1.running_var"), "{e}");
        assert!(e.starts_with("weights file "), "{e}");
        let e = load_error("missingfc", |raw| {
            raw.remove("fc.weight");
        });
        assert!(e.ends_with(": missing key fc.weight"), "{e}");
    }

    #[test]
    fn load_reports_an_unexpected_key() {
        let e = load_error("extra", |raw| {
            raw.insert("fc2.weight".into(), Raw::f32(&[2], &[1.0, 2.0]));
        });
        assert!(
            e.ends_with(": unexpected key fc2.weight (is this a resnet18 state_dict?)"),
            "{e}"
        );
        // a counter beside a batch norm the model lacks betrays another architecture
        let e = load_error("extracounter", |raw| {
            raw.insert(
                "layer1.0.bn3.num_batches_tracked".into(),
                Raw {
                    dtype: Dtype::I64,
                    shape: vec![],
                    bytes: 0i64.to_le_bytes().to_vec(),
                },
            );
        });
        assert!(
            e.contains("unexpected key layer1.0.bn3.num_batches_tracked"),
            "{e}"
        );
    }

    #[test]
    fn load_reports_a_wrong_shape() {
        let e = load_error("shape", |raw| {
            raw.insert(
                "conv1.weight".into(),
                Raw::f32(&[64, 3, 3, 3], &[0.5; 64 * 27]),
            );
        });
        assert!(
            e.ends_with(
                ": key conv1.weight has shape [64, 3, 3, 3], resnet18 expects [64, 3, 7, 7]"
            ),
            "{e}"
        );
        let e = load_error("shapefc", |raw| {
            raw.insert("fc.weight".into(), Raw::f32(&[5120], &[0.5; 5120]));
        });
        assert!(
            e.ends_with(": key fc.weight has shape [5120], resnet18 expects [classes, 512]"),
            "{e}"
        );
    }

    #[test]
    fn load_checks_the_class_count() {
        let file = TempFile::new("classes");
        save_safetensors(r18(), &file.0).unwrap();
        let e = load_safetensors(&file.0, ResNet::R18, Some(1000))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("key fc.weight has shape [10, 512], resnet18 expects [1000, 512]"),
            "{e}"
        );
        // a resnet18 file read as resnet50: the first key it lacks is reported
        let e = load_safetensors(&file.0, ResNet::R50, None)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("missing key layer1.0.conv3.weight"), "{e}");
        let e = load_safetensors(&file.0, ResNet::R18, Some(0)).unwrap_err();
        assert!(matches!(e, WeightsError::NoClasses { .. }), "{e}");
    }

    #[test]
    fn load_reports_a_wrong_dtype() {
        let e = load_error("dtype", |raw| {
            raw.insert(
                "fc.weight".into(),
                Raw {
                    dtype: Dtype::I32,
                    shape: vec![10, 512],
                    bytes: vec![0; 4 * 5120],
                },
            );
        });
        assert!(
            e.ends_with(": key fc.weight has dtype I32; expected F32, F16, BF16 or F64"),
            "{e}"
        );
    }

    #[test]
    fn load_reports_nan_and_inf() {
        let e = load_error("nan", |raw| {
            let r = raw.get_mut("bn1.running_var").unwrap();
            r.bytes[17 * 4..18 * 4].copy_from_slice(&f32::NAN.to_le_bytes());
        });
        assert!(
            e.ends_with(": key bn1.running_var holds NaN or Inf (first at element 17)"),
            "{e}"
        );
        // an F64 beyond f32's range would be Inf in f32 arithmetic
        let e = load_error("inf", |raw| {
            let mut v = [0.0f64; 10];
            v[3] = 1e300;
            raw.insert(
                "fc.bias".into(),
                Raw {
                    dtype: Dtype::F64,
                    shape: vec![10],
                    bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                },
            );
        });
        assert!(
            e.ends_with(": key fc.bias holds NaN or Inf (first at element 3)"),
            "{e}"
        );
    }

    #[test]
    fn load_reports_a_truncated_file() {
        let file = TempFile::new("truncated");
        save_safetensors(r18(), &file.0).unwrap();
        let bytes = std::fs::read(&file.0).unwrap();
        std::fs::write(&file.0, &bytes[..bytes.len() / 2]).unwrap();
        let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
        assert!(matches!(e, WeightsError::Format { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("truncated.safetensors: is not a valid safetensors file: "),
            "{msg}"
        );
    }

    #[test]
    fn load_reports_a_file_that_is_not_safetensors() {
        let file = TempFile::new("notst");
        std::fs::write(
            &file.0,
            b"PK\x03\x04 this is a torch zip archive, not safetensors",
        )
        .unwrap();
        let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
        assert!(matches!(e, WeightsError::Format { .. }), "{e}");
        std::fs::write(&file.0, b"").unwrap();
        let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
        assert!(
            e.to_string().contains("is not a valid safetensors file"),
            "{e}"
        );
    }

    #[test]
    fn load_reports_a_path_that_does_not_exist() {
        let file = TempFile::new("absent");
        let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
        assert!(matches!(e, WeightsError::Read { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("absent.safetensors: cannot be read: "),
            "{msg}"
        );
    }

    #[test]
    fn load_converts_f16_bf16_and_f64() {
        let file = TempFile::new("halves");
        let mut raw = raw_dict(r18());
        let conv1 = &r18().get("conv1.weight").unwrap().data;
        raw.insert(
            "conv1.weight".into(),
            Raw {
                dtype: Dtype::F16,
                shape: vec![64, 3, 7, 7],
                bytes: conv1
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
            },
        );
        let bn1: Vec<f32> = (0..64).map(|i| 0.5 + i as f32 / 64.0).collect();
        raw.insert(
            "bn1.weight".into(),
            Raw {
                dtype: Dtype::BF16,
                shape: vec![64],
                bytes: bn1
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
            },
        );
        let fc_bias: Vec<f64> = (0..10).map(|i| 0.1 * f64::from(i) - 0.45).collect();
        raw.insert(
            "fc.bias".into(),
            Raw {
                dtype: Dtype::F64,
                shape: vec![10],
                bytes: fc_bias.iter().flat_map(|x| x.to_le_bytes()).collect(),
            },
        );
        write_raw(&raw, &file.0);
        let d = load_safetensors(&file.0, ResNet::R18, None).unwrap();

        let got = &d.get("conv1.weight").unwrap().data;
        for (i, (&g, &w)) in got.iter().zip(conv1).enumerate() {
            assert_eq!(g, half::f16::from_f32(w).to_f32(), "conv1.weight[{i}]");
            assert!(
                (g - w).abs() <= w.abs() / 1024.0 + 1e-7,
                "conv1.weight[{i}]"
            );
        }
        let got = &d.get("bn1.weight").unwrap().data;
        // multiples of 1/64 between 0.5 and 1.5 fit bf16's 8 significant bits exactly
        assert_eq!(got, &bn1);
        let got = &d.get("fc.bias").unwrap().data;
        assert_eq!(got[0], -0.45f32);
        assert_eq!(got[9], (0.1 * 9.0 - 0.45) as f32);
        assert_eq!(got.len(), 10);
        assert_eq!(d.get("fc.weight"), r18().get("fc.weight"));
    }

    #[test]
    fn load_ignores_num_batches_tracked() {
        let file = TempFile::new("counters");
        let mut raw = raw_dict(r18());
        let bns: Vec<String> = raw
            .keys()
            .filter_map(|k| k.strip_suffix(".running_mean").map(str::to_string))
            .collect();
        assert!(bns.len() > 10);
        for bn in bns {
            raw.insert(
                format!("{bn}.num_batches_tracked"),
                Raw {
                    dtype: Dtype::I64,
                    shape: vec![],
                    bytes: 1234i64.to_le_bytes().to_vec(),
                },
            );
        }
        write_raw(&raw, &file.0);
        let d = load_safetensors(&file.0, ResNet::R18, None).unwrap();
        assert_eq!(&d, r18());
    }
}
