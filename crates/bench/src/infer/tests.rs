//! Tests of `gpukit infer`'s parts that need no GPU.
use super::gpu::{dependent_status, engine_status, is_oom, pairs};
use super::report::row;
use super::*;
use crate::measure::Measurement;
use crate::stats::Summary;
use gpukit_models::Error as EngineError;
use gpukit_tensor::{DType, Layout};
use std::path::Path;

#[test]
fn agreement_counts_top1_and_errors() {
    let reference = [1.0, 2.0, 3.0, 0.5, 0.1, 0.0];
    let a = agreement(&reference, &reference, 3);
    assert_eq!((a.max_abs, a.top1), (0.0, 1.0));
    let other = [1.0, 2.0, 3.0, 0.0, 0.6, 0.0];
    let b = agreement(&other, &reference, 3);
    assert_eq!(b.top1, 0.5);
    assert!((b.max_abs - 0.5).abs() < 1e-6);
    assert!((b.max_rel - 0.5 / 3.0).abs() < 1e-6);
    let nan = [f32::NAN; 6];
    assert!(agreement(&nan, &reference, 3).max_abs.is_infinite());
}

#[test]
fn strategies_parse_by_name_and_say_what_is_wrong() {
    assert_eq!(InferStrategy::parse("cpu").ok(), Some(InferStrategy::Cpu));
    assert_eq!(
        InferStrategy::parse(" ORT ").ok(),
        Some(InferStrategy::OnnxRuntime)
    );
    assert_eq!(
        InferStrategy::parse("onnxruntime").ok(),
        Some(InferStrategy::OnnxRuntime)
    );
    assert_eq!(
        InferStrategy::parse("FP16-nhwc-graph").ok(),
        Some(InferStrategy::Gpu(Strategy {
            dtype: DType::F16,
            layout: Layout::Nhwc,
            graph: true
        }))
    );
    for bad in ["fp8", "fp16-fast", "", "gpu"] {
        let e = InferStrategy::parse(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("{bad:?}")), "{e}");
        assert!(e.contains("onnxruntime"), "{e}");
    }
    let names: Vec<String> = InferStrategy::defaults()
        .iter()
        .map(InferStrategy::name)
        .collect();
    assert_eq!(names.len(), 15);
    assert_eq!(names[..3], ["cpu", "onnxruntime", "fp32"]);
    assert_eq!(names[14], "fp16-nhwc-graph-one-at-a-time");
    for s in InferStrategy::defaults() {
        assert_eq!(InferStrategy::parse(&s.name()).ok(), Some(s));
    }
}

#[test]
fn one_at_a_time_strategies_parse_and_run_on_the_gpu() {
    let s = |t: &str| Strategy::parse(t).unwrap();
    assert_eq!(
        InferStrategy::parse("FP16-NHWC-graph-one-at-a-time").ok(),
        Some(InferStrategy::OneAtATime(s("fp16-nhwc-graph")))
    );
    assert_eq!(
        InferStrategy::parse("fp32-one-at-a-time").ok(),
        Some(InferStrategy::OneAtATime(s("fp32")))
    );
    assert_eq!(
        InferStrategy::OneAtATime(s("bf16-nhwc")).name(),
        "bf16-nhwc-one-at-a-time"
    );
    assert_eq!(
        InferStrategy::default_one_at_a_time(),
        InferStrategy::OneAtATime(s("fp16-nhwc-graph"))
    );
    for bad in [
        "one-at-a-time",
        "cpu-one-at-a-time",
        "fp16-one-at-a-time-graph",
        "fp16-one-at-a-time-one-at-a-time",
    ] {
        let e = InferStrategy::parse(bad).unwrap_err().to_string();
        assert!(e.contains("-one-at-a-time]"), "{bad}: {e}");
    }
    let single = InferStrategy::parse("fp16-one-at-a-time").unwrap();
    assert!(!single.on_cpu());
    let cpu = DeviceSelection::One(Device::Cpu);
    let e = select_strategies(Some(&[single]), cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fp16-one-at-a-time") && e.contains("a GPU"),
        "{e}"
    );
    // the batched strategy and the same one at a time are two rows
    let batched = InferStrategy::parse("fp16").unwrap();
    assert_eq!(
        select_strategies(Some(&[batched, single, single]), DeviceSelection::All).unwrap(),
        vec![batched, single]
    );
}

#[test]
fn one_at_a_time_reps_bound_the_passes() {
    assert_eq!(one_at_a_time_reps(50, 2), 50);
    assert_eq!(one_at_a_time_reps(50, 32), 50);
    assert_eq!(one_at_a_time_reps(50, 128), 32);
    assert_eq!(one_at_a_time_reps(50, 4096), ONE_AT_A_TIME_MIN_REPS);
    assert_eq!(one_at_a_time_reps(3, 4096), 3, "never more than asked");
    assert_eq!(one_at_a_time_reps(1, 0), 1);
}

#[test]
fn the_tensorrt_line_says_whether_libnvinfer_is_there() {
    let absent = tensorrt_status(None);
    assert_eq!(
        absent,
        "unavailable: libnvinfer not found (install TensorRT, e.g. pip install tensorrt, to compare)"
    );
    let found = tensorrt_status(Some(Path::new(
        "/venv/site-packages/tensorrt_libs/libnvinfer.so.10",
    )));
    assert_eq!(
        found,
        "libnvinfer found at /venv/site-packages/tensorrt_libs/libnvinfer.so.10; gpukit has no TensorRT strategy yet"
    );
}

#[test]
fn the_device_narrows_the_strategies() {
    let cpu = DeviceSelection::One(Device::Cpu);
    let gpu = DeviceSelection::One(Device::Cuda(0));
    let all = DeviceSelection::All;
    assert_eq!(select_strategies(None, all).unwrap().len(), 15);
    assert_eq!(
        select_strategies(None, cpu).unwrap(),
        vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime]
    );
    assert_eq!(select_strategies(None, gpu).unwrap().len(), 13);
    let fp16 = InferStrategy::parse("fp16").unwrap();
    let req = [fp16, InferStrategy::Cpu, fp16];
    assert_eq!(
        select_strategies(Some(&req), all).unwrap(),
        vec![fp16, InferStrategy::Cpu],
        "duplicates dropped, order kept"
    );
    let e = select_strategies(Some(&req), cpu).unwrap_err().to_string();
    assert!(e.contains("fp16") && e.contains("--device cpu"), "{e}");
    let e = select_strategies(Some(&[InferStrategy::OnnxRuntime]), gpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("onnxruntime") && e.contains("cuda:0"), "{e}");
}

#[test]
fn tolerances_and_verdicts() {
    assert_eq!(tolerance(DType::F32), 1e-4);
    assert_eq!(tolerance(DType::Tf32), 1e-2);
    assert_eq!(tolerance(DType::F16), 1e-2);
    assert_eq!(tolerance(DType::Bf16), 5e-2);
    let reference = [1.0f32, 2.0, 3.0, 4.0];
    let close = [1.0f32, 2.0, 3.0, 4.01];
    let a = agreement(&close, &reference, 2);
    assert!(verdict(&close, &a, 1e-2).is_none());
    let e = verdict(&close, &a, 1e-4).unwrap();
    assert!(e.contains("2.5e-3") && e.contains("1e-4"), "{e}");
    let inf = [1.0f32, f32::INFINITY, 3.0, 4.0];
    let a = agreement(&inf, &reference, 2);
    assert!(verdict(&inf, &a, 1.0).unwrap().contains("not finite"));
    let nan_rel = Agreement {
        max_abs: f64::NAN,
        max_rel: f64::NAN,
        top1: 1.0,
    };
    assert!(verdict(&reference, &nan_rel, 1.0).is_some());
}

fn timed(strategy: &str, device: &str, batch: usize, rate: Option<f64>) -> InferRow {
    let mut r = row(strategy, device, batch);
    r.images_per_s = rate;
    r.timing = rate.map(|x| Measurement {
        clock: crate::measure::Clock::CudaEvents,
        warmup: 3,
        reps_planned: 5,
        summary_ms: Summary::of(&[batch as f64 / x * 1e3]).unwrap(),
    });
    r
}

#[test]
fn rows_sort_by_batch_then_cpu_then_asked_order() {
    let mut rows = vec![
        timed("fp16-graph", "cuda:0", 1, Some(3.0)),
        timed("fp32", "cuda:0", 8, Some(1.0)),
        timed(ORT_ROW, "cpu", 8, Some(1.0)),
        timed("fp32", "cuda:0", 1, Some(1.0)),
        timed(CPU_ROW, "cpu", 1, Some(1.0)),
        timed(CPU_ROW, "cpu", 8, Some(1.0)),
    ];
    sort_rows(&mut rows, &["fp32".into(), "fp16-graph".into()]);
    let got: Vec<(usize, &str)> = rows
        .iter()
        .map(|r| (r.batch, r.strategy.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, CPU_ROW),
            (1, "fp32"),
            (1, "fp16-graph"),
            (8, ORT_ROW),
            (8, CPU_ROW),
            (8, "fp32"),
        ]
    );
}

#[test]
fn one_at_a_time_rows_sort_where_they_were_asked() {
    let mut rows = vec![
        timed("fp16-nhwc-graph-one-at-a-time", "cuda:0", 8, Some(1.0)),
        timed("fp16-nhwc-graph", "cuda:0", 8, Some(1.0)),
        timed("fp32", "cuda:0", 8, Some(1.0)),
        timed(CPU_ROW, "cpu", 8, Some(1.0)),
        timed("fp16-nhwc-graph", "cuda:0", 1, Some(1.0)),
    ];
    let order: Vec<String> = InferStrategy::defaults()
        .iter()
        .filter(|s| !s.on_cpu())
        .map(InferStrategy::name)
        .collect();
    sort_rows(&mut rows, &order);
    let got: Vec<(usize, &str)> = rows
        .iter()
        .map(|r| (r.batch, r.strategy.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "fp16-nhwc-graph"),
            (8, CPU_ROW),
            (8, "fp32"),
            (8, "fp16-nhwc-graph"),
            (8, "fp16-nhwc-graph-one-at-a-time"),
        ]
    );
    assert!(is_one_at_a_time(&rows[4]));
    assert!(!is_one_at_a_time(&rows[3]) && !is_one_at_a_time(&rows[1]));
}

#[test]
fn best_rows_are_the_fastest_passing_gpu_row_per_batch() {
    let mut failed = timed("bf16-nhwc", "cuda:0", 1, Some(99.0));
    failed.status = RowStatus::Failed("wrong".into());
    let rows = vec![
        timed(CPU_ROW, "cpu", 1, Some(50.0)),
        timed("fp32", "cuda:0", 1, Some(10.0)),
        timed("fp16-nhwc-graph", "cuda:0", 1, Some(30.0)),
        failed,
        timed("fp16", "cuda:0", 1, Some(20.0)),
        timed("fp32", "cuda:0", 32, Some(100.0)),
        // never the best: it shows the batch without batching
        timed("fp32-one-at-a-time", "cuda:0", 32, Some(1000.0)),
        timed(CPU_ROW, "cpu", 64, Some(1.0)),
    ];
    let best: Vec<(usize, &str)> = best_gpu_rows(&rows)
        .iter()
        .map(|r| (r.batch, r.strategy.as_str()))
        .collect();
    assert_eq!(best, vec![(1, "fp16-nhwc-graph"), (32, "fp32")]);
}

fn report(rows: Vec<InferRow>) -> InferReport {
    InferReport {
        model: "resnet18".into(),
        parameters: 1,
        weights: "seeded".into(),
        image_size: 224,
        cpu_threads: 1,
        cpu_kernel: "im2col + gemm".into(),
        rows,
        onnxruntime_unavailable: None,
        gpu_device: Some("cuda:0 Test GPU".into()),
        gpu_unavailable: None,
        pytorch: None,
        tensorrt: None,
        planning: Vec::new(),
        cache_note: None,
    }
}

#[test]
fn gpu_rows_that_all_ran_out_of_memory_are_a_failure() {
    let mut oom = timed("fp16", "cuda:0", 4096, None);
    oom.status = RowStatus::Skipped("preparing batch 4096: out of GPU memory".into());
    let cpu = timed(CPU_ROW, "cpu", 4096, Some(1.0));
    let why = gpu_rows_without_figure(&report(vec![cpu.clone(), oom.clone()])).unwrap();
    assert!(
        why.contains("fp16 at batch 4096") && why.contains("out of GPU memory"),
        "{why}"
    );
    assert!(gpu_rows_without_figure(&report(vec![cpu.clone()])).is_none());
    let ok = timed("fp16", "cuda:0", 1, Some(5.0));
    assert!(gpu_rows_without_figure(&report(vec![cpu, oom, ok])).is_none());
}

#[test]
fn reports_without_the_gpu_fields_still_read() {
    let old = r#"{"model":"resnet50","parameters":25557032,"weights":"seeded","image_size":224,
        "cpu_threads":2,"onnxruntime_unavailable":null,"rows":[{"strategy":"gpukit f32 (folded BN, im2col+gemm)",
        "device":"cpu","batch":1,"status":{"status":"ok"},"timing":null,"images_per_s":3.5,
        "speedup_vs_reference":1.0,"agreement":null}]}"#;
    let r: InferReport = serde_json::from_str(old).unwrap();
    assert_eq!(r.rows[0].images_per_s, Some(3.5));
    assert!(r.gpu_device.is_none() && r.rows[0].gpu_memory_bytes.is_none());
    assert!(r.tensorrt.is_none() && r.rows[0].batching_gain.is_none());
    // and the new shape round-trips
    let mut g = timed("fp16-nhwc-graph", "cuda:0", 32, Some(1000.0));
    g.gpu_memory_bytes = Some(123);
    g.speedup_vs_fp32_eager = Some(3.0);
    g.batching_gain = Some(7.5);
    let mut rep = report(vec![g]);
    rep.tensorrt = Some(tensorrt_status(None));
    let text = serde_json::to_string(&rep).unwrap();
    let back: InferReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back.rows[0].gpu_memory_bytes, Some(123));
    assert_eq!(back.rows[0].speedup_vs_fp32_eager, Some(3.0));
    assert_eq!(back.rows[0].batching_gain, Some(7.5));
    assert_eq!(back.tensorrt, rep.tensorrt);
}

#[test]
fn rows_without_a_reference_fail_only_when_nothing_else_says_why() {
    let why = || "the GPU fp32 logits differ".to_string();
    assert!(
        matches!(dependent_status(why(), false, false), RowStatus::Failed(w) if w.contains("not verifiable"))
    );
    assert!(matches!(
        dependent_status(why(), false, true),
        RowStatus::Skipped(_)
    ));
    assert!(matches!(
        dependent_status(why(), true, false),
        RowStatus::Skipped(_)
    ));
    let oom = EngineError::OutOfMemory {
        what: "activation arena".into(),
        requested_mib: 10.0,
        free_mib: 1.0,
        total_mib: 80.0,
        reserved_mib: 0.0,
        limit_mib: None,
    };
    assert!(is_oom(&oom));
    // out of memory inside a library is typed where the status is read
    assert!(is_oom(&EngineError::Cuda(gpukit_cuda::Error::Library {
        library: "cuDNN",
        call: "cudnnFindConvolutionForwardAlgorithmEx",
        status: "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED".into(),
        out_of_memory: true,
    })));
    // and never read from words in a message
    assert!(!is_oom(&EngineError::Invalid(
        "CUDNN_STATUS_ALLOC_FAILED".into()
    )));
    assert!(!is_oom(&EngineError::Invalid(
        "batch size must be at least 1".into()
    )));
    assert!(
        matches!(engine_status("preparing batch 8", &oom), RowStatus::Skipped(w) if w.contains("10.0 MiB"))
    );
}

#[test]
fn upload_pairs_start_with_the_reference() {
    let s = |t: &str| Strategy::parse(t).unwrap();
    assert_eq!(
        pairs(&[s("fp16-nhwc-graph"), s("fp16-nhwc"), s("tf32")]),
        vec![
            (DType::F32, Layout::Nchw),
            (DType::F16, Layout::Nhwc),
            (DType::Tf32, Layout::Nchw)
        ]
    );
    assert_eq!(pairs(&[s("fp32-graph")]), vec![(DType::F32, Layout::Nchw)]);
    assert_eq!(pairs(&[]), vec![(DType::F32, Layout::Nchw)]);
}

#[test]
fn cpu_inference_runs_and_ort_rows_agree_where_present() {
    let mut opts = InferOptions::cpu_only(ResNet::R18, vec![1, 2]);
    opts.iterations = 2;
    opts.image_size = 48;
    opts.budget_s = 5.0;
    let r = run_infer(&gpukit_cuda::loader::discover(), &opts, &mut |_| {}).unwrap();
    let gpukit_rows: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.strategy.starts_with("gpukit"))
        .collect();
    assert_eq!(gpukit_rows.len(), 2);
    assert!(gpukit_rows.iter().all(|x| x.images_per_s.unwrap() > 0.0));
    for ort in r.rows.iter().filter(|x| x.strategy.starts_with("ONNX")) {
        assert_eq!(ort.status, RowStatus::Ok, "{ort:?}");
        assert!(ort.agreement.as_ref().unwrap().top1 == 1.0);
    }
    assert_eq!(r.parameters, 11_689_512);
    assert!(r.rows.iter().all(|x| !is_gpu_row(x)));
    assert!(
        r.gpu_unavailable.is_none(),
        "the CPU selection opens no GPU"
    );
    assert!(r.tensorrt.is_none(), "no GPU strategy, no TensorRT line");
}

#[test]
fn ort_alone_is_checked_against_an_untimed_reference() {
    let mut opts = InferOptions::cpu_only(ResNet::R18, vec![1]);
    opts.iterations = 1;
    opts.image_size = 32;
    opts.strategies = vec![InferStrategy::OnnxRuntime];
    let r = run_infer(&gpukit_cuda::loader::discover(), &opts, &mut |_| {}).unwrap();
    assert!(r.rows.iter().all(|x| x.strategy == ORT_ROW), "{:?}", r.rows);
    match &r.onnxruntime_unavailable {
        Some(_) => assert!(r.rows.is_empty()),
        None => {
            assert_eq!(r.rows.len(), 1);
            assert_eq!(r.rows[0].status, RowStatus::Ok, "{:?}", r.rows[0]);
            assert_eq!(r.rows[0].speedup_vs_reference, None);
        }
    }
}
