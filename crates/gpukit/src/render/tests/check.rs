//! `gpukit check`: one GPU, none, and two with peer access.

use super::{assert_text_drawn, h100, terminal};
use crate::render::{check_headline, check_sections};
use gpukit_bench::ceilings::{PeakSource, Peaks};
use gpukit_bench::check::{CheckReport, DriverFacts, LibraryRow};
use gpukit_bench::gpu::GpuFacts;
use gpukit_bench::host::HostFacts;
use gpukit_cuda::loader::{Lib, Source};
use std::path::PathBuf;

/// A library that was not found; callers fill in what was.
fn library(library: Lib, name: &str, used_for: &str) -> LibraryRow {
    LibraryRow {
        library,
        name: name.into(),
        soname: String::new(),
        found: false,
        version: None,
        path: None,
        source: None,
        used_for: used_for.into(),
        install: None,
        note: None,
    }
}

fn found(mut l: LibraryRow, version: Option<&str>, path: &str, source: Source) -> LibraryRow {
    l.found = true;
    l.version = version.map(str::to_string);
    l.path = Some(PathBuf::from(path));
    l.source = Some(source);
    l
}

fn missing(mut l: LibraryRow, install: &str) -> LibraryRow {
    l.install = Some(install.into());
    l
}

/// One GPU, its driver and libraries: cuDNN from a wheel the loader was pointed at, cuBLAS with
/// no version in its file name, NCCL missing.
fn one_gpu() -> CheckReport {
    let wheels = "/opt/venv/lib/python3.12/site-packages/nvidia";
    let mut cudnn = found(
        library(Lib::Cudnn, "cuDNN", "convolution (bench conv, infer)"),
        Some("9.13.0"),
        &format!("{wheels}/cudnn/lib/libcudnn.so.9"),
        Source::PythonWheels,
    );
    cudnn.note = Some("found outside the loader's path; added for this run".into());
    CheckReport {
        gpukit_version: "0.1.0".into(),
        build_cuda: 13,
        build_requires_driver_api: "13.0".into(),
        available: true,
        cuda_initialized: true,
        reason: None,
        reason_detail: None,
        driver: Some(DriverFacts {
            version: Some("580.95.05".into()),
            cuda_api: "13.0".into(),
            cuda_api_raw: 13000,
        }),
        gpus: vec![h100()],
        peer_access: None,
        libraries: vec![
            found(
                library(Lib::Cuda, "CUDA driver", "every GPU feature"),
                Some("580.95.05"),
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                Source::LinkerCache,
            ),
            found(
                library(Lib::Cublas, "cuBLAS", "matrix multiply (bench, infer)"),
                None,
                "/usr/local/cuda-13.0/lib64/libcublas.so.13",
                Source::CudaToolkit,
            ),
            cudnn,
            missing(
                library(Lib::Nccl, "NCCL", "multi-GPU collectives"),
                "pip install nvidia-nccl-cu13",
            ),
        ],
        loader_path_added: vec![PathBuf::from(format!("{wheels}/cudnn/lib"))],
        searched: Vec::new(),
        warnings: Vec::new(),
        host: HostFacts {
            cpu_model: "AMD EPYC 9454 48-Core Processor".into(),
            logical_cores: 16,
            physical_cores: Some(8),
            sockets: Some(1),
            memory_total_bytes: Some(128 << 30),
            memory_available_bytes: Some(120 << 30),
            simd: "AVX-512".into(),
            simd_features: vec!["AVX2".into(), "FMA".into(), "AVX-512F".into()],
            os: "Ubuntu 24.04.3 LTS".into(),
            arch: "x86_64".into(),
        },
    }
}

/// A second GPU of a part the datasheet table lacks, whose NVML queries failed.
fn unknown_gpu() -> GpuFacts {
    let mut g = h100();
    g.index = 1;
    g.name = "NVIDIA Example GPU".into();
    g.uuid = "GPU-0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0".into();
    g.pci_bus_id = "00000000:3B:00.0".into();
    g.memory_board_bytes = None;
    g.memory_free_bytes = None;
    g.peaks = Peaks {
        source: PeakSource::Estimate {
            sm_count: 132,
            sm_clock_mhz: 1980,
        },
        f64_tflops: Some(66.9),
        f32_tflops: Some(66.9),
        tf32_tflops: Some(535.3),
        f16_tflops: Some(1070.6),
        bf16_tflops: Some(1070.6),
        fp8_tflops: None,
        memory_gbs: None,
    };
    g.nvml = None;
    g.nvml_error = Some("Insufficient Permissions".into());
    g
}

/// What `check` prints: the headline, then the sections.
fn assert_check_drawn(name: &str, r: &CheckReport) {
    assert_text_drawn(name, &check_headline(r), &check_sections(r));
}

#[test]
fn check_with_one_gpu() {
    let r = one_gpu();
    assert_check_drawn("check_one_gpu", &r);
}

#[test]
fn check_without_a_gpu() {
    let mut r = one_gpu();
    r.available = false;
    r.cuda_initialized = false;
    r.reason = Some(
        "no NVIDIA driver found (libcuda.so.1 is not on this machine): install the NVIDIA driver"
            .into(),
    );
    r.driver = None;
    r.gpus.clear();
    r.loader_path_added.clear();
    r.libraries = vec![
        missing(
            library(Lib::Cuda, "CUDA driver", "every GPU feature"),
            "install the NVIDIA driver (R580+ for CUDA 13, R525+ for CUDA 12 builds)",
        ),
        missing(
            library(Lib::Cudnn, "cuDNN", "convolution (bench conv, infer)"),
            "pip install nvidia-cudnn-cu13 (or cuDNN 9 for CUDA 13)",
        ),
    ];
    r.host.physical_cores = None;
    r.host.sockets = None;
    r.host.memory_available_bytes = None;
    assert_check_drawn("check_no_gpu", &r);
}

#[test]
fn check_with_two_gpus_shows_peer_access() {
    let mut r = one_gpu();
    r.gpus.push(unknown_gpu());
    r.peer_access = Some(vec![vec![false, true], vec![false, false]]);
    assert_check_drawn("check_two_gpus", &r);
}

#[test]
fn quick_check_names_nvml_indices_and_what_needs_cuda() {
    let mut r = one_gpu();
    r.cuda_initialized = false;
    for g in &mut r.gpus {
        g.cuda = None;
        g.l2_cache_bytes = None;
        g.memory_usable_bytes = None;
    }
    assert!(check_headline(&r).ends_with("(--quick: NVML only, CUDA not started)"));
    let text = terminal(&check_sections(&r));
    assert!(
        text.contains("GPU NVML index 0 · NVIDIA H100 80GB HBM3"),
        "{text}"
    );
    assert!(
        text.contains("n/a (needs CUDA: run without --quick)"),
        "{text}"
    );
}
