use super::*;
use crate::graph::cpu::forward_cpu;
use crate::graph::{Conv, DType, Data, Epilogue, GraphBuilder};
use crate::onnx::{fixtures, import_model, ImportOptions};
use gpukit_tensor::codec::{e4m3_from_f64, e4m3_to_f64};
use gpukit_tensor::random::{fresh_seed, normal_f32, uniform_f32};

#[test]
fn e4m3_round_on_f32_bits_is_the_codecs_rounding() {
    let codec = |v: f32| e4m3_to_f64(e4m3_from_f64(f64::from(v))) as f32;
    // every E4M3 value, the midpoints between neighbours (ties), and just either side
    let mut values: Vec<f32> = (0u8..=0x7e).map(|b| e4m3_to_f64(b) as f32).collect();
    let grid = values.clone();
    for w in grid.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        values.extend([
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
        ]);
    }
    values.extend([
        448.0,
        449.0,
        464.0,
        1e9,
        f32::INFINITY,
        2f32.powi(-10),
        2f32.powi(-11),
        1e-30,
        0.0,
    ]);
    // and fresh values over every octave E4M3 covers and beyond
    let seed = fresh_seed();
    for (k, z) in normal_f32(1 << 16, seed).into_iter().enumerate() {
        values.push(z * 2f32.powi((k % 28) as i32 - 14));
    }
    for v in values {
        for x in [v, -v] {
            assert_eq!(
                e4m3_round(x).to_bits(),
                codec(x).to_bits(),
                "{x:e} (seed {seed})"
            );
        }
    }
    assert!(e4m3_round(f32::NAN).is_nan());
}

fn import(model: &crate::onnx::ModelProto, batch: usize) -> Graph {
    let options = ImportOptions {
        batch: Some(batch),
        dims: Vec::new(),
    };
    import_model(model, None, "fixture", &options).unwrap()
}

/// One input set of fresh uniform values for every graph input.
fn batch(graph: &Graph, seed: u64) -> Vec<Array> {
    graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let shape = &graph.values[v].shape;
            Array::f32(
                shape,
                uniform_f32(shape.iter().product(), seed ^ (i as u64) << 32),
            )
        })
        .collect()
}

#[test]
fn fake_quant_rounds_to_e4m3_with_its_scale() {
    let values = [
        0.0f32,
        1.0,
        -1.0,
        0.3,
        100.0,
        447.0,
        449.0,
        1e6,
        -1e6,
        2f32.powi(-9),
        1e-4,
    ];
    let one = fake_quant(&values, 1.0);
    for (v, q) in values.iter().zip(&one) {
        assert_eq!(
            f64::from(*q),
            e4m3_to_f64(e4m3_from_f64(f64::from(*v))),
            "{v}"
        );
    }
    // the threads' split gives the same values
    let many = normal_f32(PARALLEL_FROM + 3, fresh_seed());
    let split = fake_quant(&many, 0.01);
    assert!(many
        .iter()
        .zip(&split)
        .all(|(&v, &q)| q == e4m3_round(v / 0.01) * 0.01));
    // beyond 448 saturates, 0.3 has 3 mantissa bits (0.3125), below 2^-10 is zero
    assert_eq!(&one[5..9], &[448.0, 448.0, 448.0, -448.0]);
    assert_eq!(one[3], 0.3125);
    assert_eq!(one[10], 0.0);
    // a scale moves the grid: 0.3 with scale 0.01 is 30 on E4M3's grid (30 = 1.875 x 16)
    let scaled = fake_quant(&[0.3, 10.0], 0.01);
    assert!((scaled[0] - 0.3).abs() < 1e-7, "{scaled:?}");
    assert_eq!(scaled[1], 4.48);
    // rounding twice changes nothing
    assert_eq!(fake_quant(&one, 1.0), one);
}

#[test]
fn calibration_keeps_each_inputs_largest_magnitude_and_each_output_channels() {
    let g = import(&fixtures::tiny_resnet(fresh_seed()), 2);
    let batches: Vec<Vec<Array>> = (0..3).map(|b| batch(&g, fresh_seed() ^ b)).collect();
    let s = calibrate(&g, &batches, Method::Max).unwrap();
    assert_eq!(s.batches, 3);
    let convs = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Conv(_)))
        .count();
    let gemms = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Gemm(_) | Op::MatMul))
        .count();
    assert_eq!(s.nodes.len(), convs + gemms);
    assert!(convs >= 6 && gemms >= 1, "{convs} {gemms}");
    // the stem reads the graph input: its scale is the inputs' largest magnitude / 448
    let stem = g
        .nodes
        .iter()
        .find(|n| matches!(n.op, Op::Conv(_)) && n.inputs[0] == g.inputs[0])
        .expect("a convolution reads the input");
    let amax = batches
        .iter()
        .flat_map(|b| b[0].as_f32().unwrap().iter())
        .fold(0f32, |m, v| m.max(v.abs()));
    let found = s.nodes.iter().find(|n| n.node == stem.name).unwrap();
    assert_eq!(found.input, (f64::from(amax) / 448.0) as f32);
    // its weight per output channel: channel k's largest magnitude / 448
    let w = &g.values[stem.inputs[1]];
    let values = w.constant.as_ref().unwrap().as_f32().unwrap();
    let WeightScales::PerChannel(per) = &found.weight else {
        panic!(
            "a constant weight is scaled per channel: {:?}",
            found.weight
        )
    };
    assert_eq!(per.len(), w.shape[0]);
    let per_k = values.len() / w.shape[0];
    for (k, chunk) in values.chunks(per_k).enumerate() {
        let m = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(per[k], (f64::from(m) / 448.0) as f32, "channel {k}");
    }
    // a percentile below 100 stands for less than the largest magnitude
    let p = calibrate(&g, &batches, Method::Percentile(50.0)).unwrap();
    let half = p.nodes.iter().find(|n| n.node == stem.name).unwrap();
    assert!(
        half.input < found.input && half.input > 0.0,
        "{} {}",
        half.input,
        found.input
    );
    assert!(calibrate(&g, &batches, Method::Percentile(0.0)).is_err());
    assert!(calibrate(&g, &[], Method::Max).is_err());
}

#[test]
fn fp8_runs_close_to_f32_on_inputs_calibration_did_not_see() {
    let g = import(&fixtures::tiny_resnet(fresh_seed()), 8);
    let seed = fresh_seed();
    let calibration: Vec<Vec<Array>> = (0..2).map(|b| batch(&g, seed ^ b)).collect();
    let unseen: Vec<Vec<Array>> = (10..13).map(|b| batch(&g, seed ^ b)).collect();
    let s = calibrate(&g, &calibration, Method::Max).unwrap();
    let a = judge(&g, &s, &unseen).unwrap();
    assert_eq!(a.rows, 8 * 3);
    // rounded: not f32's output, but within E4M3's 2^-4 relative step, averaged
    assert!(a.mean_rel_error > 1e-4 && a.max_rel_error < 0.25, "{a:?}");
    assert_eq!(a.layers.len(), s.nodes.len());
    for l in &a.layers {
        assert!(l.rel_error > 0.0 && l.rel_error < 0.2, "{l:?}");
    }
    assert!(a
        .layers
        .windows(2)
        .all(|w| w[0].rel_error >= w[1].rel_error));
    // the fp8 run is what judge compared: its logits differ from f32's by the reported error
    let f = forward_fp8(&g, &s, &unseen[0]).unwrap();
    let r = forward_cpu(&g, &unseen[0]).unwrap();
    assert_ne!(f[0], r[0]);
    // scales made for another graph name the node they lack
    let other = import(&fixtures::mobilenet_v3_block(fresh_seed()), 8);
    let e = forward_fp8(&other, &s, &batch(&other, seed))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fp8 scales have none"), "{e}");
}

/// x -> conv "spread" (1x1, channel 0 a million times the others) -> conv "crushed" (1x1,
/// reading only the small channels): one scale for the whole of crushed's input spends E4M3's
/// range on channel 0, the others round to zero, and judge names crushed.
#[test]
fn judge_names_the_layer_that_fp8_hurts() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![2, 4, 3, 3]).unwrap();
    let conv = |bias: bool| {
        Op::Conv(Conv {
            kernel: [1, 1],
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            groups: 1,
            bias,
            epilogue: Epilogue::default(),
        })
    };
    let mut spread = vec![0f32; 16];
    for k in 0..4 {
        spread[k * 4 + k] = if k == 0 { 1e6 } else { 1.0 };
    }
    let w1 = b
        .constant("w1", vec![4, 4, 1, 1], Data::F32(spread))
        .unwrap();
    let y = b.node("spread", conv(false), &[x, w1], &["y"]).unwrap()[0];
    let crushed: Vec<f32> = (0..8).map(|i| if i % 4 == 0 { 0.0 } else { 0.5 }).collect();
    let w2 = b
        .constant("w2", vec![2, 4, 1, 1], Data::F32(crushed))
        .unwrap();
    let z = b.node("crushed", conv(false), &[y, w2], &["z"]).unwrap()[0];
    b.output(z);
    let g = b.finish().unwrap();
    let seed = fresh_seed();
    let s = calibrate(&g, &[batch(&g, seed)], Method::Max).unwrap();
    let a = judge(&g, &s, &[batch(&g, seed ^ 1)]).unwrap();
    assert_eq!(a.layers[0].node, "crushed", "{a:?}");
    assert!(a.layers[0].rel_error > 0.9, "{a:?}");
    assert!(a.layers[1].rel_error < 0.1, "{a:?}");
    let e = a.verdict(0.99, 1e-2).unwrap_err();
    assert!(e.contains("crushed"), "{e}");
    // keeping crushed out of fp8 is what it takes, and enough (80%: spread's own rounding flips
    // about 1.5% of the near-tied rows, and with crushed in fp8 a third to three quarters agree;
    // 48 rows keep the two apart: over 300 fresh seeds of 12 rows, 0.83 and 0.75 were the
    // extremes, and a bound of 90% failed one run in 200)
    let unseen: Vec<Vec<Array>> = (2..10).map(|i| batch(&g, seed ^ i)).collect();
    let plain = judge(&g, &s, &unseen).unwrap();
    let r = rescue(&g, &s, &unseen, &plain.layers, 0.8, 8).unwrap();
    assert!(plain.top1_agreement < 0.8, "{plain:?}");
    assert_eq!(r.kept, ["crushed"], "{r:?}");
    assert!(r.enough && r.top1_agreement >= 0.8, "{r:?}");
    // an agreement no count reaches: the most tried, and said so
    let r = rescue(&g, &s, &unseen, &plain.layers, 1.01, 8).unwrap();
    assert_eq!(r.kept.len(), 2);
    assert!(!r.enough);
    // none tried: fp8's own agreement
    let r = rescue(&g, &s, &unseen, &plain.layers, 0.99, 0).unwrap();
    assert!(
        r.kept.is_empty() && r.top1_agreement == plain.top1_agreement,
        "{r:?}"
    );
}

#[test]
fn a_verdict_passes_within_its_bounds_and_names_the_worst_layer_otherwise() {
    let a = Fp8Accuracy {
        rows: 100,
        top1_agreement: 0.995,
        max_rel_error: 0.03,
        mean_rel_error: 0.01,
        layers: vec![
            LayerError {
                node: "layer4.0.conv2".into(),
                rel_error: 0.08,
            },
            LayerError {
                node: "conv1".into(),
                rel_error: 0.02,
            },
        ],
    };
    assert!(a.verdict(0.99, 0.05).is_ok());
    let e = a.verdict(0.999, 0.05).unwrap_err();
    assert!(e.contains("99.50%") && e.contains("layer4.0.conv2"), "{e}");
    let e = a.verdict(0.99, 0.01).unwrap_err();
    assert!(
        e.contains("3.000e-2") && e.contains("layer4.0.conv2"),
        "{e}"
    );
}

#[test]
fn samples_come_from_the_inputs_tensor_or_x_or_the_only_one() {
    use safetensors::tensor::{serialize, Dtype, TensorView};
    let values: Vec<f32> = (0..2 * 3 * 2 * 2).map(|i| i as f32).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let file = |name: &str, shape: Vec<usize>, dtype: Dtype, data: &[u8]| {
        let view = TensorView::new(dtype, shape, data).unwrap();
        serialize([(name, view)], None).unwrap()
    };
    let row = [3, 2, 2];
    let (n, got) = samples_from_safetensors(
        &file("input", vec![2, 3, 2, 2], Dtype::F32, &bytes),
        "input",
        &row,
    )
    .unwrap();
    assert_eq!((n, got), (2, values.clone()));
    assert_eq!(
        samples_from_safetensors(
            &file("images", vec![2, 3, 2, 2], Dtype::F32, &bytes),
            "input",
            &row
        )
        .unwrap()
        .0,
        2
    );
    let e = samples_from_safetensors(
        &file("x", vec![4, 3, 1, 2], Dtype::F32, &bytes),
        "input",
        &row,
    )
    .unwrap_err();
    assert!(
        e.contains("[4, 3, 1, 2]") && e.contains("[n, 3, 2, 2]"),
        "{e}"
    );
    let e = samples_from_safetensors(
        &file("x", vec![2, 3, 2, 2], Dtype::I32, &bytes),
        "input",
        &row,
    )
    .unwrap_err();
    assert!(e.contains("F32"), "{e}");
    assert!(samples_from_safetensors(b"not a file", "input", &row)
        .unwrap_err()
        .contains("safetensors"));
}
