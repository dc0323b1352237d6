//! `infer --onnx` on the importer's fixtures, without ONNX Runtime (the CLI tests run it
//! against ONNX Runtime where it is installed).

use super::model::{peak_activation_bytes, prepare, widest_f64_convolution_bytes};
use super::rows::{judge, judge_float64, Bench, Float64};
use super::*;
use gpukit_models::onnx::fixtures;
use gpukit_tensor::Device;

fn written(model: &gpukit_models::onnx::ModelProto) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, fixtures::bytes(model)).unwrap();
    (dir, path)
}

fn options(file: PathBuf, strategies: Vec<InferStrategy>) -> OnnxOptions {
    OnnxOptions {
        file,
        batch_sizes: Some(vec![2, 1]),
        dims: Vec::new(),
        iterations: 1,
        gpu_iterations: 2,
        budget_s: 5.0,
        selection: DeviceSelection::All,
        strategies,
        resnet_engine: false,
        fp8: None,
    }
}

#[test]
fn the_defaults_are_the_cpu_rows_and_named_gpu_strategies_stay() {
    let cpu = vec![InferStrategy::Cpu, InferStrategy::OnnxRuntime];
    assert_eq!(
        onnx_strategies(None, DeviceSelection::All, false).unwrap(),
        cpu
    );
    // with a usable GPU, the engine's GPU strategies too, one image at a time left out
    let both = onnx_strategies(None, DeviceSelection::All, true).unwrap();
    assert_eq!(both[..2], cpu[..]);
    assert!(both.len() > 2);
    assert!(both[2..].iter().all(|s| matches!(s, InferStrategy::Gpu(_))));
    let gpu = onnx_strategies(None, DeviceSelection::One(Device::Cuda(0)), true).unwrap();
    assert!(!gpu.is_empty() && gpu.iter().all(|s| !s.on_cpu()));
    let named = [InferStrategy::Cpu, InferStrategy::parse("fp16").unwrap()];
    assert_eq!(
        onnx_strategies(Some(&named), DeviceSelection::All, false).unwrap(),
        named
    );
}

#[test]
fn describe_counts_nodes_passes_and_resolves_shapes() {
    let (_dir, path) = written(&fixtures::tiny_resnet(3));
    let file = ModelFile::read(&path).unwrap();
    let m = describe(&file, 4, &[]).unwrap();
    assert_eq!(m.opset, 17);
    assert_eq!(m.batch, 4);
    assert_eq!(m.inputs[0].shape, [4, 3, 32, 32]);
    assert_eq!(m.inputs[0].declared, ["batch", "3", "32", "32"]);
    assert_eq!(m.outputs[0].name, "logits");
    assert_eq!(m.outputs[0].shape, [4, 10]);
    assert!(m.passes.folded_batch_norms > 0 && m.passes.fused_epilogues > 0);
    assert!(m.nodes_optimized < m.nodes_imported);
    assert!(m.parameters > 1000);
}

#[test]
fn gpu_strategies_give_skipped_rows_and_no_figure() {
    let (_dir, path) = written(&fixtures::tiny_resnet(5));
    let strategies = vec![
        InferStrategy::Cpu,
        InferStrategy::parse("fp16-nhwc-graph").unwrap(),
        InferStrategy::parse("fp16-nhwc-graph-one-at-a-time").unwrap(),
    ];
    let run = run_onnx(&options(path, strategies), None, &mut |_| {}).unwrap();
    assert_eq!(run.batch_sizes, [1, 2]);
    let gpu: Vec<&InferRow> = run.rows.iter().filter(|r| r.device != "cpu").collect();
    // fp16-nhwc-graph at 1 and 2, one at a time at 2 only
    assert_eq!(gpu.len(), 3);
    // no GPU libraries were looked for: the reason says so
    for r in gpu {
        assert!(
            matches!(&r.status, RowStatus::Skipped(why) if why.starts_with(GPU_NOT_LOOKED_FOR)),
            "{:?}",
            r.status
        );
        assert!(r.timing.is_none() && r.images_per_s.is_none());
    }
    let cpu: Vec<&InferRow> = run.rows.iter().filter(|r| r.device == "cpu").collect();
    assert_eq!(cpu.len(), 2);
    assert!(cpu
        .iter()
        .all(|r| r.strategy == GRAPH_CPU_ROW && r.timing.is_some()));
    assert!(run
        .gpu
        .as_deref()
        .is_some_and(|w| w.starts_with(GPU_NOT_LOOKED_FOR)));
}

#[test]
fn a_fixed_batch_model_refuses_another_batch_before_any_work() {
    let mut m = fixtures::tiny_resnet(1);
    let dim = &mut m.graph.as_mut().unwrap().input[0]
        .r#type
        .as_mut()
        .unwrap()
        .tensor_type
        .as_mut()
        .unwrap()
        .shape
        .as_mut()
        .unwrap()
        .dim[0];
    dim.dim_param = None;
    dim.dim_value = Some(1);
    let (_dir, path) = written(&m);
    let e = run_onnx(
        &options(path.clone(), vec![InferStrategy::Cpu]),
        None,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("fixed batch of 1") && e.contains("asks for 2"),
        "{e}"
    );
    let mut o = options(path, vec![InferStrategy::Cpu]);
    o.batch_sizes = None;
    assert_eq!(run_onnx(&o, None, &mut |_| {}).unwrap().batch_sizes, [1]);
}

#[test]
fn input_dims_may_not_name_the_batch_or_an_unknown_axis() {
    let (_dir, path) = written(&fixtures::tiny_resnet(1));
    for (name, says) in [
        ("batch", "--batch-sizes"),
        ("height", "no axis named height"),
    ] {
        let mut o = options(path.clone(), vec![InferStrategy::Cpu]);
        o.dims = vec![(name.to_string(), 8)];
        let e = run_onnx(&o, None, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn judge_names_the_output_that_differs_and_passes_within_tolerance() {
    let names = vec!["logits".to_string()];
    let want = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.0])];
    let close = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.000_01])];
    assert!(judge(&close, &want, &names).1.is_none());
    let far = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.01])];
    let why = judge(&far, &want, &names).1.unwrap();
    assert!(why.starts_with("output logits:"), "{why}");
    let shape = vec![(vec![4], vec![1.0, -2.0, 3.0, 4.0])];
    assert!(judge(&shape, &want, &names).1.unwrap().contains("shape"));
    let nan = vec![(vec![2, 2], vec![1.0, f32::NAN, 3.0, 4.0])];
    assert!(judge(&nan, &want, &names).1.unwrap().contains("not finite"));
}

#[test]
fn the_peak_counts_live_values_not_all_of_them() {
    let (_dir, path) = written(&fixtures::tiny_resnet(1));
    let file = ModelFile::read(&path).unwrap();
    let p = prepare(&file, 2, &[]).unwrap();
    let g = &p.optimized;
    let peak = peak_activation_bytes(g).unwrap();
    let all: u64 = g
        .values
        .iter()
        .filter(|v| v.constant.is_none())
        .map(|v| v.shape.iter().product::<usize>() as u64 * 4)
        .sum();
    let input = 2 * 3 * 32 * 32 * 4;
    assert!(peak >= input && peak < all, "{peak} of {all}");
}

#[test]
fn an_int64_input_is_refused_naming_it() {
    let mut m = fixtures::tiny_resnet(1);
    if let Some(t) = m
        .graph
        .as_mut()
        .and_then(|g| g.input.first_mut())
        .and_then(|i| i.r#type.as_mut())
        .and_then(|t| t.tensor_type.as_mut())
    {
        t.elem_type = 7;
    }
    let (_dir, path) = written(&m);
    let e = run_onnx(&options(path, vec![InferStrategy::Cpu]), None, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("input input is int64") && e.contains("f32"),
        "{e}"
    );
}

#[test]
fn fp32_rows_may_be_1e5_from_float64_or_as_far_as_onnxruntimes_f32() {
    assert_eq!(float64_tolerance(None), TOLERANCE);
    assert_eq!(float64_tolerance(Some(3e-6)), TOLERANCE);
    assert_eq!(float64_tolerance(Some(1.5e-5)), 1.5e-5);
    // ONNX Runtime's own outputs not finite: no allowance
    assert_eq!(float64_tolerance(Some(f64::NAN)), TOLERANCE);
    assert_eq!(float64_tolerance(Some(f64::INFINITY)), TOLERANCE);
}

#[test]
fn an_fp32_row_is_judged_by_its_distance_from_float64_beside_onnxruntimes() {
    let names = vec!["logits".to_string()];
    let float64 = |ort: Option<f64>| Float64 {
        outputs: vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.0])],
        onnxruntime_max_rel: ort,
    };
    // 2.0e-5 from float64 (max |float64| is 4)
    let last = 4.000_08f32;
    let row = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, last])];
    let dist = (f64::from(last) - 4.0) / 4.0;
    assert!((dist - 2e-5).abs() < 1e-7, "{dist}");
    // ONNX Runtime's f32 closer to float64 than the row, and 1e-5 too: fails naming both
    let (check, why) = judge_float64(&row, &float64(Some(1.5e-5)), &names);
    let check = check.unwrap();
    assert_eq!(
        (check.max_rel, check.onnxruntime_max_rel, check.tolerance),
        (dist, Some(1.5e-5), 1.5e-5)
    );
    let why = why.unwrap();
    assert!(
        why.contains("2.0e-5 from float64") && why.contains("1e-5") && why.contains("1.5e-5"),
        "{why}"
    );
    // ONNX Runtime's f32 farther than the row: the row passes
    let (check, why) = judge_float64(&row, &float64(Some(2.5e-5)), &names);
    assert!(why.is_none(), "{why:?}");
    assert_eq!(check.unwrap().tolerance, 2.5e-5);
    // ONNX Runtime's closer than 1e-5: 1e-5 is the bound
    let close = vec![(vec![2, 2], vec![1.0, -2.0, 3.0, 4.000_02])];
    let (check, why) = judge_float64(&close, &float64(Some(1e-7)), &names);
    assert!(why.is_none() && check.unwrap().tolerance == TOLERANCE);
    // no ONNX Runtime: within 1e-5 of float64
    let (_, why) = judge_float64(&row, &float64(None), &names);
    assert!(why.unwrap().contains("no ONNX Runtime outputs"));
    assert!(judge_float64(&close, &float64(None), &names).1.is_none());
    // values not finite or a shape that differs fail whatever the distances
    let nan = vec![(vec![2, 2], vec![1.0, f32::NAN, 3.0, 4.0])];
    let why = judge_float64(&nan, &float64(Some(1.0)), &names).1.unwrap();
    assert!(why.contains("not finite"), "{why}");
    let shape = vec![(vec![4], vec![1.0, -2.0, 3.0, 4.0])];
    let why = judge_float64(&shape, &float64(Some(1.0)), &names)
        .1
        .unwrap();
    assert!(why.contains("shape"), "{why}");
}

#[test]
fn the_float64_reference_is_computed_at_a_batch_only_where_fp32_gpu_rows_follow() {
    let (_dir, path) = written(&fixtures::tiny_resnet(4));
    let file = ModelFile::read(&path).unwrap();
    let p = prepare(&file, 2, &[]).unwrap();
    let outputs = vec!["logits".to_string()];
    let bench = |float64| Bench {
        plan: Plan::new(0, 1),
        input: "input",
        outputs: &outputs,
        cpu: false,
        ort: false,
        keep_reference: true,
        float64,
    };
    let at = bench(true).rows_at(2, &p, None, false, &mut |_| {});
    let account = at.float64_reference.unwrap();
    assert_eq!(
        (
            account.batch,
            account.onnxruntime_max_rel,
            account.unavailable
        ),
        (2, None, None)
    );
    assert!(account.seconds.is_some_and(|s| s >= 0.0));
    let float64 = at.float64.unwrap();
    assert_eq!(float64.outputs[0].0, [2, fixtures::CLASSES]);
    // without ONNX Runtime the f32 reference is the interpreter's, within 1e-5 of float64
    let (reference, label) = at.reference.unwrap();
    assert!(label.contains(GRAPH_CPU_ROW), "{label}");
    let (check, why) = judge_float64(&reference, &float64, &outputs);
    assert!(why.is_none(), "{why:?}");
    assert!(check.is_some_and(|c| c.max_rel > 0.0 && c.max_rel <= TOLERANCE));
    let at = bench(false).rows_at(2, &p, None, false, &mut |_| {});
    assert!(at.float64.is_none() && at.float64_reference.is_none());
    assert!(at.reference.is_some());
}

#[test]
fn without_gpu_discovery_fp32_strategies_are_skipped_and_the_cpu_row_is_judged_against_float64() {
    let (_dir, path) = written(&fixtures::tiny_resnet(6));
    let strategies = vec![InferStrategy::Cpu, InferStrategy::parse("fp32").unwrap()];
    let run = run_onnx(&options(path.clone(), strategies), None, &mut |_| {}).unwrap();
    let fp32: Vec<&InferRow> = run.rows.iter().filter(|r| r.device != "cpu").collect();
    assert_eq!(fp32.len(), 2);
    assert!(fp32
        .iter()
        .all(|r| matches!(r.status, RowStatus::Skipped(_)) && r.float64.is_none()));
    // gpukit's CPU row is an f32 row: judged against float64 at every batch size
    assert_eq!(run.float64.len(), run.batch_sizes.len());
    let cpu: Vec<&InferRow> = run
        .rows
        .iter()
        .filter(|r| r.strategy == GRAPH_CPU_ROW)
        .collect();
    assert!(!cpu.is_empty());
    for r in cpu {
        assert_eq!(r.status, RowStatus::Ok, "{r:?}");
        let check = r.float64.as_ref().expect("the CPU row's float64 check");
        assert!(
            check.max_rel > 0.0 && check.max_rel <= check.tolerance,
            "{check:?}"
        );
    }
    // without the CPU row (nor fp32 GPU rows that run) nothing is computed in f64
    let only_gpu = vec![InferStrategy::parse("fp32").unwrap()];
    let run = run_onnx(&options(path, only_gpu), None, &mut |_| {}).unwrap();
    assert!(run.float64.is_empty());
}

#[test]
fn the_engine_line_says_whether_its_steps_are_planned_or_as_lowered() {
    let planned = (
        general::program_label(gpukit_tensor::DType::F32, gpukit_tensor::Layout::Nhwc),
        vec![
            ("conv+epilogue (f64 sums)".to_string(), 3),
            ("pool".to_string(), 1),
        ],
        true,
    );
    let lowered = (
        "f16 nhwc".to_string(),
        vec![("conv+bias+relu (cuDNN)".to_string(), 4)],
        false,
    );
    let line = general::describe(Some(&[planned, lowered]), "H200");
    assert!(
        line.contains("f32 nhwc: 3 conv+epilogue (f64 sums), 1 pool;"),
        "{line}"
    );
    assert!(
        line.ends_with("f16 nhwc (as lowered, not planned): 4 conv+bias+relu (cuDNN)"),
        "{line}"
    );
}

#[test]
fn the_widest_convolution_in_f64_counts_its_operands_at_8_bytes() {
    use gpukit_models::graph::{Conv, DType, Data, Epilogue, GraphBuilder, Op};
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![1, 3, 8, 8]).unwrap();
    let w = b
        .constant("w", vec![4, 3, 3, 3], Data::F32(vec![0.5; 108]))
        .unwrap();
    let cv = Conv {
        kernel: [3, 3],
        strides: [1, 1],
        pads: [1; 4],
        dilations: [1, 1],
        groups: 1,
        bias: false,
        epilogue: Epilogue::default(),
    };
    let y = b.node("conv", Op::Conv(cv), &[x, w], &["y"]).unwrap()[0];
    b.output(y);
    let g = b.finish().unwrap();
    // x 192, w 108, y 256 values
    assert_eq!(
        widest_f64_convolution_bytes(&g),
        Some((192 + 108 + 256) * 8)
    );
}
