//! The check every matrix product passes before its figure is reported (`bench matmul`'s rows,
//! its `--search` grid, `stress`): sampled entries against a float64 product of the same stored
//! inputs, and the tolerance by dtype; and the best rate `bench matmul --search` found on a GPU,
//! kept in gpukit's cache folder per GPU, driver and cuBLASLt (the "achievable" ceiling `stress`
//! places its rates against beside the datasheet's).

use crate::error::Result;
use crate::report::Verification;
use gpukit_cuda::loader::{Discovery, Lib};
use gpukit_cuda::nvml::NvmlSession;
use gpukit_cuda::DeviceBuffer;
use gpukit_cuda::Gpu;
use gpukit_tensor::codec::element_f64;
use gpukit_tensor::kernels::Distribution;
use gpukit_tensor::DType;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Host copies of one pair of inputs, in their storage type.
pub struct HostPair {
    pub a: Vec<u8>,
    pub b: Vec<u8>,
}

/// Relative tolerance of a sampled check, by dtype (f32 or wider accumulation). The relative
/// error does not depend on the input distribution: on an H100, f16 measured 2.0-2.1e-4 and bf16
/// 1.6-1.8e-3 at 8192 with normal and with uniform inputs alike.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        // true f32 stays far below; TF32 (about 3e-4) must not pass as f32
        DType::F32 => 5e-5,
        DType::Tf32 => 3e-3,
        // f16 output rounding alone is about 3e-4
        DType::F16 => 3e-3,
        // bf16 output rounding alone is about 2e-3
        DType::Bf16 => 1.5e-2,
        // fp8 inputs drawn exact in E4M3 (products exact in f32), f32 accumulation, bf16 output:
        // the output's rounding dominates as for bf16
        DType::F8E4M3 => 1.5e-2,
    }
}

/// Checks `c` (row-major n x n, storage `ty.product_output()`) against a float64 product of the stored inputs on
/// a grid of sampled rows and columns. NaN anywhere in the sample fails.
pub fn verify_square(
    ty: DType,
    dtype: DType,
    pair: &HostPair,
    c: &[u8],
    n: usize,
    seed: u64,
) -> Verification {
    verify_product(ty, dtype, pair, c, (n, n, n), seed)
}

/// Checks `c` (row-major m x n, storage `ty.product_output()`: bf16 for fp8) = `a` (m x k) times
/// `b` (k x n) against a float64
/// product of the stored inputs on a grid of sampled rows and columns (the last row and column
/// always among them). NaN anywhere in the sample fails.
pub fn verify_product(
    ty: DType,
    dtype: DType,
    pair: &HostPair,
    c: &[u8],
    (m, n, k): (usize, usize, usize),
    seed: u64,
) -> Verification {
    let mut s = seed | 1;
    let mut pick = |below: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % below.max(1) as u64) as usize
    };
    let mut rows: Vec<usize> = (0..16.min(m)).map(|_| pick(m)).collect();
    let mut cols: Vec<usize> = (0..16.min(n)).map(|_| pick(n)).collect();
    // the corners catch edge-tile bugs at sizes that are not multiples of the tile
    if let (Some(r), Some(c)) = (rows.first_mut(), cols.first_mut()) {
        *r = m - 1;
        *c = n - 1;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let mut nan = false;
    let out = ty.product_output();
    for &i in &rows {
        let arow: Vec<f64> = (0..k)
            .map(|p| element_f64(&pair.a, ty, i * k + p))
            .collect();
        for &j in &cols {
            let r: f64 = (0..k)
                .map(|p| arow[p] * element_f64(&pair.b, ty, p * n + j))
                .sum();
            let got = element_f64(c, out, i * n + j);
            nan |= !got.is_finite();
            num += (got - r).powi(2);
            den += r * r;
        }
    }
    let rel_err = if nan {
        f64::INFINITY
    } else {
        (num / den.max(f64::MIN_POSITIVE)).sqrt()
    };
    let tolerance = tolerance(dtype);
    Verification {
        samples: rows.len() * cols.len(),
        rel_err,
        tolerance,
        passed: rel_err <= tolerance,
    }
}

// ---- fp8 (E4M3) products: what `bench matmul` and `stress` share ----

/// Why cuBLASLt's fp8 cannot take a shape (None for every other dtype): its fp8 kernels want
/// 16-byte aligned leading dimensions, so gpukit runs fp8 only where m, n and k are multiples of
/// 16 (1000 and 1023, in the default sizes, are not: those rows are skipped, not failed).
pub fn unsupported_shape(dtype: DType, (m, n, k): (usize, usize, usize)) -> Option<String> {
    if dtype != DType::F8E4M3 || [m, n, k].iter().all(|d| d % 16 == 0) {
        return None;
    }
    Some(format!(
        "fp8 on cuBLASLt takes dimensions that are multiples of 16; {m}x{n}x{k} is not"
    ))
}

/// An fp8 row's backend cell: what was multiplied and how closely it was checked.
pub fn fp8_backend(backend: &str, tolerance: f64) -> String {
    format!(
        "{backend}; E4M3 inputs (exact), f32 accumulation, bf16 output checked against float64 \
         to {tolerance:.1e}"
    )
}

/// Why an fp8 shape has no product: cuBLASLt offered no algorithm.
pub fn fp8_no_algorithm((m, n, k): (usize, usize, usize), said: &str) -> String {
    format!(
        "cuBLASLt has no fp8 algorithm for {m}x{n}x{k} (it said: {said}; fp8 wants dimensions \
         that are multiples of 16)"
    )
}

/// fp8 operands drawn on the host (the random kernel draws no fp8): uniform in [-2, 2) or
/// normal, rounded to E4M3 (`random::fill_e4m3`), then uploaded.
pub fn draw_fp8(gpu: &Gpu, len: usize, seed: u64, dist: Distribution) -> Result<DeviceBuffer> {
    let mut bytes = vec![0u8; len];
    gpukit_tensor::random::fill_e4m3(&mut bytes, seed, dist);
    Ok(gpu.upload(&bytes)?)
}

/// The host copy of a `k x n` B operand as the check reads it (row-major k x n): fp8's buffer
/// holds B transposed (`n x k`, the form gemm_lt takes), turned back here.
pub fn b_as_stored(ty: DType, bytes: Vec<u8>, k: usize, n: usize) -> Vec<u8> {
    if ty != DType::F8E4M3 || bytes.len() < k * n {
        return bytes;
    }
    use rayon::prelude::*;
    // each output row (one p) on any core: it reads column p of the stored rows
    let mut out = vec![0u8; k * n];
    out.par_chunks_mut(n).enumerate().for_each(|(p, row)| {
        for (j, v) in row.iter_mut().enumerate() {
            *v = bytes[j * k + p];
        }
    });
    out
}

// ---- the achievable ceiling: `bench matmul --search`'s best, kept per GPU ----

/// The best rate of one dtype over `bench matmul --search`'s grid of shapes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DtypeBest {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub tflops: f64,
}

/// What a searched rate depends on beside the GPU's model: the GPU itself (by UUID), its
/// driver and the cuBLASLt that chose the kernels. Any of them changing makes the rate stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AchievableKey {
    pub gpu_name: String,
    pub gpu_uuid: String,
    pub driver: String,
    pub cublaslt: String,
}

impl AchievableKey {
    /// The key of the GPU `uuid` as this process sees it; None when the driver's or cuBLASLt's
    /// version cannot be read (a rate then cannot be tied to them, so none is kept).
    pub fn current(discovery: &Discovery, gpu_name: &str, gpu_uuid: &str) -> Option<Self> {
        let driver = NvmlSession::open(discovery).ok()?.driver_version()?;
        let cublaslt = discovery
            .found(Lib::CublasLt)
            .and_then(|f| f.version.clone())
            .or_else(|| gpukit_cuda::libs::api_version(discovery, Lib::CublasLt))?;
        Some(AchievableKey {
            gpu_name: gpu_name.to_string(),
            gpu_uuid: gpu_uuid.to_string(),
            driver,
            cublaslt,
        })
    }

    /// The cache file of this GPU in `dir` (one file a GPU; its key says for what it holds).
    pub fn path(&self, dir: &Path) -> PathBuf {
        let safe: String = self
            .gpu_uuid
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        dir.join(format!("matmul-achievable-{safe}.json"))
    }
}

/// The best rates found on one GPU, as kept on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Achievable {
    pub key: AchievableKey,
    /// The gpukit that searched.
    pub gpukit_version: String,
    pub best: Vec<DtypeBest>,
}

impl Achievable {
    /// The best rate of `dtype`, when searched.
    pub fn for_dtype(&self, dtype: DType) -> Option<&DtypeBest> {
        self.best.iter().find(|b| b.dtype == dtype)
    }
}

/// What the cache holds for a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Found(Achievable),
    /// No search was kept for this GPU.
    Missing,
    /// A search was kept for another driver, cuBLASLt or GPU: not used.
    Stale(String),
    /// The file could not be read or parsed: not used.
    Unreadable(String),
}

/// The kept search of `key`'s GPU in `dir`, if it was made under the same key.
pub fn load_achievable(dir: &Path, key: &AchievableKey) -> Lookup {
    let path = key.path(dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Missing,
        Err(e) => return Lookup::Unreadable(format!("{}: {e}", path.display())),
    };
    let kept: Achievable = match serde_json::from_slice(&bytes) {
        Ok(a) => a,
        Err(e) => return Lookup::Unreadable(format!("{}: {e}", path.display())),
    };
    if kept.key != *key {
        let mut changed = Vec::new();
        if kept.key.gpu_name != key.gpu_name || kept.key.gpu_uuid != key.gpu_uuid {
            changed.push("GPU");
        }
        if kept.key.driver != key.driver {
            changed.push("driver");
        }
        if kept.key.cublaslt != key.cublaslt {
            changed.push("cuBLASLt");
        }
        return Lookup::Stale(format!(
            "searched under another {} (then: {}, driver {}, cuBLASLt {})",
            changed.join(" and "),
            kept.key.gpu_name,
            kept.key.driver,
            kept.key.cublaslt
        ));
    }
    Lookup::Found(kept)
}

/// Keeps `found` for `key`'s GPU in `dir`, beside the dtypes an earlier search under the same
/// key found (a dtype searched again replaces its entry). The file is written whole.
pub fn save_achievable(
    dir: &Path,
    key: &AchievableKey,
    found: &[DtypeBest],
) -> std::io::Result<PathBuf> {
    let mut best = match load_achievable(dir, key) {
        Lookup::Found(a) => a.best,
        _ => Vec::new(),
    };
    for f in found {
        best.retain(|b| b.dtype != f.dtype);
        best.push(f.clone());
    }
    best.sort_by_key(|b| b.dtype.name());
    let kept = Achievable {
        key: key.clone(),
        gpukit_version: env!("CARGO_PKG_VERSION").to_string(),
        best,
    };
    let bytes = serde_json::to_vec_pretty(&kept).map_err(std::io::Error::other)?;
    let path = key.path(dir);
    gpukit_types::files::write_atomically(&path, &bytes)?;
    Ok(path)
}

/// gpukit's cache folder (where the convolution choices and compiled kernels are kept too).
pub fn cache_dir() -> Option<PathBuf> {
    gpukit_cuda::loader::cache_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AchievableKey {
        AchievableKey {
            gpu_name: "NVIDIA H100 80GB HBM3".into(),
            gpu_uuid: "GPU-1234/x".into(),
            driver: "580.95.05".into(),
            cublaslt: "13.0.2".into(),
        }
    }

    fn best(dtype: DType, tflops: f64) -> DtypeBest {
        DtypeBest {
            dtype,
            m: 2048,
            n: 2048,
            k: 13312,
            tflops,
        }
    }

    #[test]
    fn a_kept_search_is_found_under_its_key_and_merged_by_dtype() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_achievable(dir.path(), &key()), Lookup::Missing);
        let path = save_achievable(dir.path(), &key(), &[best(DType::Bf16, 780.0)]).unwrap();
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with("GPU-1234_x.json"));
        save_achievable(dir.path(), &key(), &[best(DType::F16, 790.0)]).unwrap();
        save_achievable(dir.path(), &key(), &[best(DType::Bf16, 785.0)]).unwrap();
        let Lookup::Found(a) = load_achievable(dir.path(), &key()) else {
            panic!("not found")
        };
        assert_eq!(a.best.len(), 2);
        assert_eq!(a.for_dtype(DType::Bf16).unwrap().tflops, 785.0);
        assert_eq!(a.for_dtype(DType::F16).unwrap().tflops, 790.0);
    }

    #[test]
    fn a_new_driver_or_cublaslt_makes_the_kept_search_stale() {
        let dir = tempfile::tempdir().unwrap();
        save_achievable(dir.path(), &key(), &[best(DType::Bf16, 780.0)]).unwrap();
        let mut driver = key();
        driver.driver = "590.1".into();
        match load_achievable(dir.path(), &driver) {
            Lookup::Stale(why) => {
                assert!(why.starts_with("searched under another driver ("), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let mut lt = key();
        lt.cublaslt = "13.1.0".into();
        assert!(
            matches!(load_achievable(dir.path(), &lt), Lookup::Stale(w) if w.starts_with("searched under another cuBLASLt ("))
        );
        // a search under the new key starts afresh: the stale entries are not carried over
        save_achievable(dir.path(), &lt, &[best(DType::F16, 700.0)]).unwrap();
        let Lookup::Found(a) = load_achievable(dir.path(), &lt) else {
            panic!("not found")
        };
        assert_eq!(a.best.len(), 1);
    }

    #[test]
    fn a_damaged_file_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(key().path(dir.path()), b"{not json").unwrap();
        assert!(matches!(
            load_achievable(dir.path(), &key()),
            Lookup::Unreadable(_)
        ));
    }

    #[test]
    fn an_fp8_product_is_read_as_bf16_and_checked_against_float64() {
        use gpukit_tensor::codec::encode_f64;
        let (m, n, k) = (3, 2, 16);
        let a: Vec<f64> = (0..m * k).map(|i| (i % 7) as f64 * 0.25 - 0.75).collect();
        let b: Vec<f64> = (0..k * n).map(|i| 1.5 - (i % 5) as f64 * 0.5).collect();
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        let pair = HostPair {
            a: encode_f64(&a, DType::F8E4M3),
            b: encode_f64(&b, DType::F8E4M3),
        };
        let good = verify_product(
            DType::F8E4M3,
            DType::F8E4M3,
            &pair,
            &encode_f64(&c, DType::Bf16),
            (m, n, k),
            5,
        );
        assert!(good.passed && good.rel_err < 1e-2, "{good:?}");
        assert_eq!(good.tolerance, tolerance(DType::F8E4M3));
        // a wrong corner (always among the samples) fails
        c[(m - 1) * n + n - 1] *= 2.0;
        let bad = verify_product(
            DType::F8E4M3,
            DType::F8E4M3,
            &pair,
            &encode_f64(&c, DType::Bf16),
            (m, n, k),
            5,
        );
        assert!(!bad.passed, "{bad:?}");
    }

    #[test]
    fn a_product_of_any_shape_is_checked_against_float64() {
        let (m, n, k) = (5, 3, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let pair = HostPair {
            a: bytes(&a),
            b: bytes(&b),
        };
        let good = verify_product(DType::F32, DType::F32, &pair, &bytes(&c), (m, n, k), 3);
        assert!(good.passed, "{good:?}");
        c[(m - 1) * n + n - 1] += 1.0;
        let bad = verify_product(DType::F32, DType::F32, &pair, &bytes(&c), (m, n, k), 3);
        assert!(!bad.passed);
    }
}
