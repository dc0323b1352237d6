//! `gpukit all`: every command in one run, sized to be a tour (`quick`) or a fuller measurement,
//! and one report of them all. What runs, at which sizes and how often, is decided here: the
//! CLI only passes the user's choices and writes the files.

use crate::bandwidth::{run_bandwidth, BandwidthOptions, BandwidthReport};
use crate::check::{run_check, CheckOptions, CheckReport};
use crate::conv::{resnet50_shapes, run_conv, ConvOptions, ConvReport};
use crate::error::Result;
use crate::infer::{gpu_rows_without_figure, run_infer, InferOptions, InferReport, InferStrategy};
use crate::matmul::{run_matmul, MatmulOptions, MatmulReport};
use crate::memory::{run_memory, MemoryOptions, MemoryReport};
use crate::report::{judge_rows, Document, RowStatus};
use crate::train::{run_train, Preset, TrainReport, TrainRequest};
use gpukit_cuda::loader::Discovery;
use gpukit_models::gpu::Strategy;
use gpukit_models::ResNet;
use gpukit_tensor::{DType, Device, DeviceSelection, Layout};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What the user chose.
#[derive(Debug, Clone)]
pub struct AllOptions {
    pub selection: DeviceSelection,
    /// Fewer sizes and repetitions: a tour, not a measurement campaign.
    pub quick: bool,
    /// The command line, as it is recorded in the report.
    pub command_line: Vec<String>,
}

/// One part of `all` that did not run, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Skipped {
    pub part: String,
    pub reason: String,
}

/// Every command's report, how long each took, and what was skipped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllReport {
    pub generated_unix_s: u64,
    pub command_line: Vec<String>,
    pub check: CheckReport,
    pub matmul: MatmulReport,
    pub bandwidth: Option<BandwidthReport>,
    pub conv: ConvReport,
    pub infer: Option<InferReport>,
    /// `gpukit memory` (fp32, ResNet-50) when a GPU is there.
    pub memory: Option<MemoryReport>,
    /// `gpukit train`: each tutorial preset once.
    #[serde(default)]
    pub train: Vec<TrainReport>,
    /// `bench nccl` (all_reduce, all_gather, reduce_scatter) when the machine has several GPUs.
    #[serde(default)]
    pub nccl: Option<crate::nccl::NcclReport>,
    /// `bench p2p` when the machine has several GPUs.
    #[serde(default)]
    pub p2p: Option<crate::p2p::P2pReport>,
    /// `gpukit profile`: inference and training, the top ops of each.
    #[serde(default)]
    pub profile: Vec<crate::profile::ProfileReport>,
    /// `gpukit lessons` (all but lesson 0, which needs a process that has not opened the GPU).
    #[serde(default)]
    pub lessons: Option<crate::lessons::LessonsReport>,
    /// Seconds each part took.
    pub seconds: Vec<(String, f64)>,
    pub skipped: Vec<Skipped>,
    pub total_seconds: f64,
}

/// `profile infer` (ResNet-50 fp16 NHWC at batch 32 on a GPU; ResNet-18 at batch 1, 64 px on
/// the CPU) and `profile train` (the seed-regression preset), top 10 ops each.
fn profile_parts(
    discovery: &Discovery,
    gpu: bool,
    device: Device,
    progress: &mut dyn FnMut(&str),
    skipped: &mut Vec<Skipped>,
) -> Vec<crate::profile::ProfileReport> {
    use crate::profile::{profile_infer, profile_train, InferWorkload, ProfileOptions};
    let o = ProfileOptions {
        steps: if gpu { 10 } else { 2 },
        top: 10,
        group_by: crate::profile::table::GroupBy::Op,
        trace: None,
        timing: gpukit_cuda::profiler::TimingChoice::Auto,
    };
    let w = InferWorkload {
        model: if gpu { ResNet::R50 } else { ResNet::R18 },
        batch: if gpu { 32 } else { 1 },
        image_size: if gpu { 224 } else { 64 },
        weights: None,
        strategy: None,
        device: Some(device),
    };
    let mut out = Vec::new();
    match profile_infer(discovery, &w, &o, progress) {
        Ok(r) => out.push(r),
        Err(e) => skipped.push(Skipped {
            part: "profile infer".into(),
            reason: e.to_string(),
        }),
    }
    let request = TrainRequest {
        preset: Some(Preset::SeedRegression),
        device: Some(device),
        ..TrainRequest::default()
    };
    match profile_train(discovery, &request, &o, progress) {
        Ok(r) => out.push(r),
        Err(e) => skipped.push(Skipped {
            part: "profile train".into(),
            reason: e.to_string(),
        }),
    }
    out
}

/// The CUDA ordinal the GPU parts run on.
fn ordinal(selection: DeviceSelection) -> usize {
    selection.named_cuda().unwrap_or(0)
}

fn matmul_options(gpu: bool, o: &AllOptions) -> MatmulOptions {
    if !gpu {
        // without a GPU only the CPU runs: sizes a small machine does in seconds
        return MatmulOptions {
            sizes: vec![256, 1024],
            selection: DeviceSelection::One(Device::Cpu),
            iterations: 5,
            cpu_budget_s: if o.quick { 2.0 } else { 5.0 },
            cpu_max_size: Some(1024),
            ..MatmulOptions::default()
        };
    }
    MatmulOptions {
        sizes: if o.quick {
            vec![1024, 4096]
        } else {
            vec![1024, 4096, 8192]
        },
        selection: o.selection,
        iterations: if o.quick { 10 } else { 30 },
        cpu_budget_s: if o.quick { 2.0 } else { 5.0 },
        cpu_max_size: Some(if o.quick { 1024 } else { 4096 }),
        ..MatmulOptions::default()
    }
}

fn bandwidth_options(o: &AllOptions) -> BandwidthOptions {
    BandwidthOptions {
        ordinal: ordinal(o.selection),
        sizes_bytes: if o.quick {
            vec![4 << 10, 16 << 20]
        } else {
            vec![4 << 10, 1 << 20, 64 << 20, 1 << 30]
        },
        iterations: if o.quick { 5 } else { 10 },
        ..BandwidthOptions::default()
    }
}

fn conv_options(gpu: bool, o: &AllOptions) -> ConvOptions {
    ConvOptions {
        batches: vec![match (gpu, o.quick) {
            (false, _) => 2,
            (true, true) => 8,
            (true, false) => 32,
        }],
        ordinal: gpu.then(|| ordinal(o.selection)),
        iterations: if o.quick || !gpu { 3 } else { 20 },
        cpu_budget_s: if o.quick || !gpu { 1.0 } else { 3.0 },
        ..ConvOptions::default()
    }
}

fn infer_options(gpu: bool, o: &AllOptions) -> InferOptions {
    let strategies = if gpu && o.quick {
        let mut v = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
        v.extend(
            ["fp32", "fp16-nhwc", "fp16-nhwc-graph"]
                .iter()
                .filter_map(|s| Strategy::parse(s).ok())
                .map(InferStrategy::Gpu),
        );
        v
    } else {
        InferStrategy::defaults()
    };
    InferOptions {
        model: ResNet::R50,
        batch_sizes: match (gpu, o.quick) {
            (false, _) => vec![1],
            (true, true) => vec![1, 32],
            (true, false) => vec![1, 8, 32],
        },
        iterations: if o.quick { 2 } else { 5 },
        weights: None,
        image_size: 224,
        budget_s: 5.0,
        selection: if gpu {
            o.selection
        } else {
            DeviceSelection::One(Device::Cpu)
        },
        strategies,
        gpu_iterations: if o.quick { 20 } else { 50 },
        // the CPU rows at large batches take minutes: the GPU rows' comparison is enough
        cpu_max_batch: Some(if o.quick { 1 } else { 8 }),
        search: gpukit_cuda::dnn::Search::Fast,
    }
}

fn memory_options(o: &AllOptions) -> MemoryOptions {
    MemoryOptions {
        model: ResNet::R50,
        batch_sizes: if o.quick {
            vec![16, 64]
        } else {
            vec![16, 32, 64, 128]
        },
        dtype: DType::F32,
        layout: Layout::Nchw,
        image_size: 224,
        weights: None,
        ordinal: ordinal(o.selection),
        memory_fraction: None,
        on_oom_halve: true,
        find_max_batch: !o.quick,
        max_workspace_bytes: None,
    }
}

/// Runs every command in turn. `progress` gets a line as each part starts (and the parts' own
/// lines). Errors only where nothing can run at all (the check's bad input).
pub fn run_all(
    discovery: &Discovery,
    opts: &AllOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<AllReport> {
    let started = Instant::now();
    let mut seconds = Vec::new();
    let mut skipped = Vec::new();
    let timed = |name: &str, seconds: &mut Vec<(String, f64)>, t: Instant| {
        seconds.push((name.to_string(), t.elapsed().as_secs_f64()));
    };

    progress("[gpukit all] check");
    let t = Instant::now();
    let check = run_check(
        discovery,
        CheckOptions {
            selection: opts.selection,
            ask_library_versions: true,
            quick: false,
        },
    )?;
    timed("check", &mut seconds, t);
    let gpu = check.available && opts.selection != DeviceSelection::One(Device::Cpu);
    // why the GPU rows are absent, said in every report that has them (not "not selected")
    let no_gpu = (!gpu).then(|| match (&check.reason, check.available) {
        (Some(r), _) => r.clone(),
        (None, true) => "--device cpu".to_string(),
        (None, false) => "no GPU can be used".to_string(),
    });
    if let Some(reason) = &no_gpu {
        skipped.push(Skipped {
            part: "GPU rows of bench matmul, bench conv and infer, bench bandwidth and memory"
                .into(),
            reason: reason.clone(),
        });
    }

    // gpukit's own kernels compile on other cores while the first parts run (the lessons,
    // training and memory parts use them)
    if gpu {
        gpukit_cuda::kernel::warm_cache(
            discovery,
            ordinal(opts.selection),
            &[
                gpukit_models::gpu::kernels::kernel_source(),
                gpukit_tensor::kernels::kernel_source(),
                gpukit_train::gpu::kernels::kernel_source(),
                gpukit_cuda::pattern::kernel_source(),
            ],
        );
    }
    progress("[gpukit all] bench matmul");
    let t = Instant::now();
    let mut matmul = run_matmul(discovery, &matmul_options(gpu, opts), progress);
    if matmul.gpu_unavailable.is_none() {
        matmul.gpu_unavailable.clone_from(&no_gpu);
    }
    timed("bench matmul", &mut seconds, t);

    let bandwidth = gpu.then(|| {
        progress("[gpukit all] bench bandwidth");
        let t = Instant::now();
        let b = run_bandwidth(discovery, &bandwidth_options(opts), progress);
        timed("bench bandwidth", &mut seconds, t);
        b
    });

    progress("[gpukit all] bench conv");
    let t = Instant::now();
    let copts = conv_options(gpu, opts);
    let mut conv = run_conv(discovery, &resnet50_shapes(1), &copts, progress);
    if conv.gpu_unavailable.is_none() {
        conv.gpu_unavailable.clone_from(&no_gpu);
    }
    timed("bench conv", &mut seconds, t);

    progress("[gpukit all] infer");
    let t = Instant::now();
    let infer = match run_infer(discovery, &infer_options(gpu, opts), progress) {
        Ok(mut r) => {
            if r.gpu_unavailable.is_none() {
                r.gpu_unavailable.clone_from(&no_gpu);
            }
            let gpu_skipped = r
                .gpu_unavailable
                .clone()
                .or_else(|| gpu_rows_without_figure(&r));
            // (without a GPU the general entry above says it already)
            if let Some(reason) = gpu_skipped.filter(|_| no_gpu.is_none()) {
                skipped.push(Skipped {
                    part: "infer's GPU rows".into(),
                    reason,
                });
            }
            Some(r)
        }
        Err(e) => {
            skipped.push(Skipped {
                part: "infer".into(),
                reason: e.to_string(),
            });
            None
        }
    };
    timed("infer", &mut seconds, t);

    let memory = if gpu {
        progress("[gpukit all] memory");
        let t = Instant::now();
        let m = match run_memory(discovery, &memory_options(opts), progress) {
            Ok(m) => Some(m),
            Err(e) => {
                skipped.push(Skipped {
                    part: "memory".into(),
                    reason: e.to_string(),
                });
                None
            }
        };
        timed("memory", &mut seconds, t);
        m
    } else {
        None
    };

    progress("[gpukit all] train");
    let t = Instant::now();
    let mut train = Vec::new();
    let mut devices = vec![Device::Cpu];
    if gpu {
        devices.push(match opts.selection {
            DeviceSelection::One(d @ Device::Cuda(_)) => d,
            _ => Device::Cuda(0),
        });
    }
    for device in devices {
        for preset in [Preset::SeedRegression, Preset::SeedClassification] {
            let request = TrainRequest {
                preset: Some(preset),
                eval_fraction: Some(0.2),
                device: Some(device),
                // the defaults: the data resident on the GPU, each epoch replayed as one graph
                ..TrainRequest::default()
            };
            match run_train(&request, discovery, progress) {
                Ok(r) => train.push(r),
                Err(e) => skipped.push(Skipped {
                    part: format!("train --preset {} --device {device}", preset.name()),
                    reason: e.to_string(),
                }),
            }
        }
    }
    timed("train", &mut seconds, t);

    // where the time goes: inference and training profiled, the top 10 ops of each
    progress("[gpukit all] profile");
    let t = Instant::now();
    let device = if gpu {
        Device::Cuda(ordinal(opts.selection))
    } else {
        Device::Cpu
    };
    let profile = profile_parts(discovery, gpu, device, progress, &mut skipped);
    timed("profile", &mut seconds, t);

    progress("[gpukit all] lessons");
    let t = Instant::now();
    let lesson_opts = crate::lessons::LessonsOptions {
        lessons: crate::lessons::LESSONS[1..]
            .iter()
            .map(|l| l.to_string())
            .collect(),
        device: Some(device),
        compare_pytorch: false,
        samples: if opts.quick { 5 } else { 10 },
        min_sample_ms: if opts.quick { 1.0 } else { 2.0 },
    };
    let lessons = match crate::lessons::run_lessons(discovery, &lesson_opts, progress) {
        Ok(r) => {
            for l in r.lessons.iter().filter(|l| l.failed) {
                skipped.push(Skipped {
                    part: format!("lessons {}", l.id),
                    reason: l.reason.clone(),
                });
            }
            Some(r)
        }
        Err(e) => {
            skipped.push(Skipped {
                part: "lessons".into(),
                reason: e.to_string(),
            });
            None
        }
    };
    timed("lessons", &mut seconds, t);

    // several GPUs: what their links and NCCL deliver
    let several = gpu && opts.selection == DeviceSelection::All && check.gpus.len() > 1;
    let (mut nccl, mut p2p) = (None, None);
    if several {
        progress("[gpukit all] bench nccl");
        let t = Instant::now();
        let o = crate::nccl::NcclOptions {
            ops: vec![
                crate::nccl::sweep::Collective::AllReduce,
                crate::nccl::sweep::Collective::AllGather,
                crate::nccl::sweep::Collective::ReduceScatter,
            ],
            places: vec![crate::nccl::Place::Out],
            max_bytes: if opts.quick { 64 << 20 } else { 1 << 30 },
            step_factor: 4,
            ..crate::nccl::NcclOptions::default()
        };
        match crate::nccl::run_nccl(discovery, &o, progress) {
            Ok(r) => nccl = r.map(|(r, _)| r),
            Err(e) => skipped.push(Skipped {
                part: "bench nccl".into(),
                reason: e.to_string(),
            }),
        }
        timed("bench nccl", &mut seconds, t);
        progress("[gpukit all] bench p2p");
        let t = Instant::now();
        match crate::p2p::run_p2p(discovery, &crate::p2p::P2pOptions::default(), progress) {
            Ok((r, _)) => p2p = Some(r),
            Err(e) => skipped.push(Skipped {
                part: "bench p2p".into(),
                reason: e.to_string(),
            }),
        }
        timed("bench p2p", &mut seconds, t);
    }

    Ok(AllReport {
        generated_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command_line: opts.command_line.clone(),
        check,
        matmul,
        bandwidth,
        conv,
        infer,
        memory,
        train,
        nccl,
        p2p,
        profile,
        lessons,
        seconds,
        skipped,
        total_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Every row status of the report, for the verdict.
fn statuses(r: &AllReport) -> impl Iterator<Item = &RowStatus> {
    r.matmul
        .rows
        .iter()
        .map(|x| &x.status)
        .chain(
            r.bandwidth
                .iter()
                .flat_map(|b| b.rows.iter().map(|x| &x.status)),
        )
        .chain(r.conv.rows.iter().map(|x| &x.status))
        .chain(
            r.infer
                .iter()
                .flat_map(|i| i.rows.iter().map(|x| &x.status)),
        )
        .chain(
            r.memory
                .iter()
                .flat_map(|m| m.rows.iter().map(|x| &x.status)),
        )
}

/// The JSON document of `gpukit all` (report.json): the report, its notes (what was skipped and
/// why, the check's warnings) and the verdict over every row of every part.
pub fn document(report: AllReport) -> Document<AllReport> {
    let failure = judge_rows(statuses(&report));
    let notes: Vec<String> = report
        .check
        .warnings
        .iter()
        .map(|w| format!("warning: {w}"))
        .chain(
            report
                .skipped
                .iter()
                .map(|s| format!("skipped {}: {}", s.part, s.reason)),
        )
        .collect();
    Document::new("all", report, failure).with_notes(notes)
}
