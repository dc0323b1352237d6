//! `bench matmul --search`: the highest matmul rate this GPU reaches over a grid of shapes, per
//! dtype (as mamf-finder searches for the "maximum achievable matmul FLOPS"). Every shape is
//! timed with cuBLAS's default and cuBLASLt's heuristic candidates, the fastest timed again,
//! and its result checked against a float64 reference on sampled entries like every matmul
//! row; a shape whose check fails gives no figure. The best of each dtype is kept in gpukit's
//! cache folder per GPU, driver and cuBLASLt, where `stress` reads it as the achievable ceiling.

use super::gpu::{gpu_candidates, pick_candidate, trial_order, Backend};
use crate::error::{Error, Result};
use crate::gpu::{describe_gpu, gpu_lacks, GpuFacts};
use crate::measure::{device_samples, tflops, Plan};
use crate::random::fresh_seed;
use crate::report::{judge_rows, Document, RowStatus, Verification};
use crate::stats::Summary;
use crate::workload::gemm::{
    b_as_stored, cache_dir, draw_fp8, fp8_backend, save_achievable, unsupported_shape,
    verify_product, AchievableKey, DtypeBest, HostPair,
};
use gpukit_cuda::blas::Blas;
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu};
use gpukit_tensor::kernels::Distribution;
use gpukit_tensor::DType;
use serde::{Deserialize, Serialize};

/// One shape: C (m x n) = A (m x k) B (k x n).
pub type Shape = (usize, usize, usize);

/// The default grid: square products from 2048 to 16384 and the flat, deep shapes (small M and
/// N, long K) where mamf-finder found an H100's highest bf16 rate (2048 x 2048 x 13312), 26
/// shapes in all: about a minute per dtype on an H100.
pub fn default_grid() -> Vec<Shape> {
    let mut grid = Vec::new();
    for n in [2048, 4096, 6144, 8192, 12288, 16384] {
        grid.push((n, n, n));
    }
    for mn in [2048, 3072, 4096] {
        for k in [8192, 12288, 13312, 16384] {
            grid.push((mn, mn, k));
        }
    }
    for (m, n, k) in [
        (4096, 8192, 8192),
        (8192, 4096, 8192),
        (8192, 8192, 4096),
        (8192, 8192, 13312),
        (2048, 8192, 13312),
        (8192, 2048, 13312),
        (4096, 4096, 4096),
        (6144, 6144, 13312),
    ] {
        if !grid.contains(&(m, n, k)) {
            grid.push((m, n, k));
        }
    }
    grid
}

/// What to search.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    pub ordinal: usize,
    pub dtypes: Vec<DType>,
    pub grid: Vec<Shape>,
    /// cuBLASLt heuristic candidates timed beside cuBLAS's default per shape.
    pub lt_candidates: usize,
    /// Timed products of the chosen candidate per shape (after 5 untimed).
    pub iterations: usize,
    /// Keep the best per dtype in the cache folder.
    pub keep: bool,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            ordinal: 0,
            dtypes: vec![DType::Bf16],
            grid: default_grid(),
            lt_candidates: 4,
            iterations: 30,
            keep: true,
        }
    }
}

/// One shape of one dtype.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchRow {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub status: RowStatus,
    pub backend: Option<String>,
    /// The median product's rate.
    pub tflops: Option<f64>,
    pub median_ms: Option<f64>,
    pub verification: Option<Verification>,
}

/// One dtype over the grid.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DtypeSearch {
    pub dtype: DType,
    pub best: Option<DtypeBest>,
    /// The spread of the shapes' rates (those that checked out).
    pub median_tflops: Option<f64>,
    pub p10_tflops: Option<f64>,
    pub p90_tflops: Option<f64>,
    pub shapes_measured: usize,
    pub peak_tflops: Option<f64>,
}

/// The whole search.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchReport {
    pub gpu: Option<GpuFacts>,
    pub rows: Vec<SearchRow>,
    pub dtypes: Vec<DtypeSearch>,
    /// Where the best rates were kept, or why they were not.
    pub kept_in: Option<String>,
    pub not_kept: Option<String>,
}

/// The JSON document of `bench matmul --search`: a failed shape fails the run.
pub fn search_document(report: SearchReport) -> Document<SearchReport> {
    let failure = judge_rows(report.rows.iter().map(|r| &r.status));
    Document::new("bench matmul --search", report, failure)
}

/// Searches every dtype over the grid on GPU `opts.ordinal`. An error: no GPU.
pub fn run_search(
    discovery: &Discovery,
    opts: &SearchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<SearchReport> {
    let gpu = Gpu::open(discovery, opts.ordinal)?;
    let facts = describe_gpu(discovery, opts.ordinal)?;
    let blas = Blas::new(discovery, &gpu)?;
    let cc = facts.compute_capability.unwrap_or((0, 0));
    let mut rows = Vec::new();
    for &dtype in &opts.dtypes {
        for &(m, n, k) in &opts.grid {
            let mut row = SearchRow {
                dtype,
                m,
                n,
                k,
                status: RowStatus::Ok,
                backend: None,
                tflops: None,
                median_ms: None,
                verification: None,
            };
            if let Some(why) = gpu_lacks(cc, dtype).or_else(|| unsupported_shape(dtype, (m, n, k)))
            {
                row.status = RowStatus::Skipped(why);
                rows.push(row);
                continue;
            }
            progress(&format!("search cuda:{} {dtype} {m}x{n}x{k}", opts.ordinal));
            if let Err(e) = search_shape(&gpu, &blas, opts, &mut row) {
                row.status = RowStatus::Failed(e.to_string());
                row.tflops = None;
            }
            rows.push(row);
        }
    }
    let dtypes = summarise(&rows, &opts.dtypes, Some(&facts));
    let mut report = SearchReport {
        gpu: Some(facts),
        rows,
        dtypes,
        kept_in: None,
        not_kept: None,
    };
    if opts.keep {
        keep(discovery, &mut report);
    }
    Ok(report)
}

/// The best of each dtype and the spread of its shapes' rates.
pub fn summarise(
    rows: &[SearchRow],
    dtypes: &[DType],
    facts: Option<&GpuFacts>,
) -> Vec<DtypeSearch> {
    dtypes
        .iter()
        .map(|&dtype| {
            let ok: Vec<&SearchRow> = rows
                .iter()
                .filter(|r| r.dtype == dtype && r.status == RowStatus::Ok)
                .filter(|r| r.tflops.is_some())
                .collect();
            let rates: Vec<f64> = ok.iter().filter_map(|r| r.tflops).collect();
            let spread = Summary::of(&rates);
            let best = ok
                .iter()
                .filter_map(|r| r.tflops.map(|t| (t, r)))
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(tflops, r)| DtypeBest {
                    dtype,
                    m: r.m,
                    n: r.n,
                    k: r.k,
                    tflops,
                });
            DtypeSearch {
                dtype,
                best,
                median_tflops: spread.map(|s| s.median),
                p10_tflops: spread.map(|s| s.p10),
                p90_tflops: spread.map(|s| s.p90),
                shapes_measured: rates.len(),
                peak_tflops: facts.and_then(|f| f.peaks.for_dtype(dtype.name())),
            }
        })
        .collect()
}

/// Keeps the best rates of a search whose every shape checked out.
fn keep(discovery: &Discovery, report: &mut SearchReport) {
    if report
        .rows
        .iter()
        .any(|r| matches!(r.status, RowStatus::Failed(_)))
    {
        report.not_kept = Some("a shape failed: a failing GPU's rates are not kept".into());
        return;
    }
    let best: Vec<DtypeBest> = report
        .dtypes
        .iter()
        .filter_map(|d| d.best.clone())
        .collect();
    if best.is_empty() {
        report.not_kept = Some("nothing was measured".into());
        return;
    }
    let Some(facts) = &report.gpu else { return };
    let Some(key) = AchievableKey::current(discovery, &facts.name, &facts.uuid) else {
        report.not_kept =
            Some("the driver's or cuBLASLt's version could not be read to file them under".into());
        return;
    };
    let Some(dir) = cache_dir() else {
        report.not_kept = Some("no cache folder can be written".into());
        return;
    };
    match save_achievable(&dir, &key, &best) {
        Ok(p) => report.kept_in = Some(p.display().to_string()),
        Err(e) => report.not_kept = Some(format!("writing the cache: {e}")),
    }
}

/// Times one shape: cuBLAS's default and the cuBLASLt candidates briefly in interleaved rounds,
/// the fastest (cuBLAS's unless another beats it by more than 1%; for fp8, cuBLASLt's first
/// choice in cuBLAS's place) for `opts.iterations`
/// products, then its result checked.
fn search_shape(gpu: &Gpu, blas: &Blas, opts: &SearchOptions, row: &mut SearchRow) -> Result<()> {
    let (dtype, m, n, k) = (row.dtype, row.m, row.n, row.k);
    let e = dtype.size_bytes();
    // fp8 writes bf16
    let out = dtype.product_output().size_bytes();
    let bytes = (m * k + k * n) * e + m * n * out;
    let free = gpu.mem_info()?.0 as usize;
    if bytes + gpukit_cuda::blas::WORKSPACE_BYTES > free {
        row.status = RowStatus::Skipped(format!(
            "needs {:.1} GiB of GPU memory, {:.1} GiB free",
            bytes as f64 / f64::from(1u32 << 30),
            free as f64 / f64::from(1u32 << 30)
        ));
        return Ok(());
    }
    let ops = gpukit_tensor::kernels::tensor_ops(gpu)?;
    let seed = fresh_seed();
    let draw = |count: usize, salt: u64| -> Result<DeviceBuffer> {
        if dtype == DType::F8E4M3 {
            return draw_fp8(gpu, count, seed ^ salt, Distribution::Normal);
        }
        let buf = gpu.alloc(count * e)?;
        ops.kernels.fill_random(
            gpu.stream(),
            buf.view(),
            dtype,
            count,
            seed ^ salt,
            Distribution::Normal,
        )?;
        Ok(buf)
    };
    // for fp8, b is B transposed (n x k): the form gemm_lt's fp8 takes
    let (a, b) = (draw(m * k, 1)?, draw(k * n, 2)?);
    let mut c = gpu.alloc(m * n * out)?;
    let candidates =
        gpu_candidates(blas, dtype, (m, n, k), opts.lt_candidates).map_err(Error::Failed)?;
    let run = |backend: &Backend, c: &mut DeviceBuffer| -> Result<()> {
        match backend {
            Backend::Cublas => blas.gemm(dtype, &a, &b, c, (m, n, k)),
            Backend::Lt(plan) => blas.gemm_lt(plan, &a, &b, c),
        }
        .map_err(Error::from)
    };
    let stream = gpu.stream().clone();
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    for round in 0..3 {
        for i in trial_order(candidates.len(), round) {
            let samples = device_samples(&stream, Plan::new(2, 5), || run(&candidates[i], &mut c));
            if let Some(s) = samples.ok().as_deref().and_then(Summary::of) {
                medians[i].push(s.median);
            }
        }
    }
    let scores: Vec<Option<f64>> = medians
        .into_iter()
        .map(|mut m| {
            m.sort_by(f64::total_cmp);
            m.get(m.len() / 2).copied()
        })
        .collect();
    let Some((_, chosen)) = pick_candidate(&scores) else {
        return Err(Error::Failed(
            "neither cuBLAS nor any cuBLASLt algorithm ran".into(),
        ));
    };
    let backend = &candidates[chosen];
    row.backend = Some(backend.label());
    let samples = device_samples(&stream, Plan::new(5, opts.iterations), || {
        run(backend, &mut c)
    })?;
    let s = Summary::of(&samples).ok_or_else(|| Error::Failed("no finite timing".into()))?;
    // poison, recompute, compare: a wrong fast number is never reported
    gpu.fill(c.view(), 0xFF)?;
    run(backend, &mut c)?;
    let pair = HostPair {
        a: gpu.download(&a)?,
        b: b_as_stored(dtype, gpu.download(&b)?, k, n),
    };
    let got = gpu.download(&c)?;
    let v = verify_product(dtype, dtype, &pair, &got, (m, n, k), seed);
    if v.passed {
        row.median_ms = Some(s.median);
        row.tflops = Some(tflops(2.0 * m as f64 * n as f64 * k as f64, s.median));
    } else {
        row.status = RowStatus::Failed(format!(
            "wrong result: relative error {:.2e} over tolerance {:.0e}",
            v.rel_err, v.tolerance
        ));
    }
    if dtype == DType::F8E4M3 {
        row.backend = Some(fp8_backend(&backend.label(), v.tolerance));
    }
    row.verification = Some(v);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grid_has_mamf_finders_best_shape_and_no_duplicates() {
        let g = default_grid();
        assert!(g.contains(&(2048, 2048, 13312)));
        assert!(g.contains(&(8192, 8192, 8192)));
        let mut sorted = g.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), g.len());
        // multiples of 256 from 2048 to 16384: what tensor-core tiles divide evenly
        for &(m, n, k) in &g {
            for d in [m, n, k] {
                assert!(d % 256 == 0 && (2048..=16384).contains(&d), "{d}");
            }
        }
        // small enough for a minute or two per dtype: the largest (16384^3 bf16) is 1.5 GiB
        assert!(g.len() <= 30, "{}", g.len());
    }

    fn row(dtype: DType, (m, n, k): Shape, tflops: Option<f64>, status: RowStatus) -> SearchRow {
        SearchRow {
            dtype,
            m,
            n,
            k,
            status,
            backend: None,
            tflops,
            median_ms: None,
            verification: None,
        }
    }

    #[test]
    fn the_summary_picks_the_best_checked_shape_and_the_spread() {
        let rows = vec![
            row(DType::Bf16, (2048, 2048, 13312), Some(790.0), RowStatus::Ok),
            row(DType::Bf16, (8192, 8192, 8192), Some(700.0), RowStatus::Ok),
            row(DType::Bf16, (4096, 4096, 4096), Some(650.0), RowStatus::Ok),
            // a failed shape never counts, however fast it looked
            row(
                DType::Bf16,
                (16384, 16384, 16384),
                Some(990.0),
                RowStatus::Failed("wrong result".into()),
            ),
            row(DType::F16, (2048, 2048, 2048), Some(500.0), RowStatus::Ok),
        ];
        let s = summarise(&rows, &[DType::Bf16, DType::F16, DType::Tf32], None);
        let bf16 = &s[0];
        let best = bf16.best.as_ref().unwrap();
        assert_eq!(
            (best.m, best.n, best.k, best.tflops),
            (2048, 2048, 13312, 790.0)
        );
        assert_eq!(bf16.median_tflops, Some(700.0));
        assert_eq!(bf16.shapes_measured, 3);
        assert!(bf16.p10_tflops.unwrap() < 700.0 && bf16.p90_tflops.unwrap() > 700.0);
        assert_eq!(s[1].best.as_ref().unwrap().tflops, 500.0);
        assert!(s[2].best.is_none() && s[2].median_tflops.is_none());
    }

    #[test]
    fn a_search_with_a_failed_shape_is_a_failed_run() {
        let report = SearchReport {
            gpu: None,
            rows: vec![
                row(DType::Bf16, (2048, 2048, 2048), Some(600.0), RowStatus::Ok),
                row(
                    DType::Bf16,
                    (4096, 4096, 4096),
                    None,
                    RowStatus::Failed("wrong result".into()),
                ),
            ],
            dtypes: Vec::new(),
            kept_in: None,
            not_kept: None,
        };
        assert!(search_document(report).failure.is_some());
    }
}
