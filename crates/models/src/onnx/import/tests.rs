//! The importer on the fixtures, on gpukit's own ResNet export, and on models broken one
//! way at a time (each error naming the file, node, operator and attribute or input).

use super::*;
use crate::graph::{forward_cpu, Array};
use crate::onnx::builder::{attr_int, attr_ints, attr_string, f32_tensor, Dim, ModelBuilder};
use crate::onnx::fixtures;
use gpukit_tensor::random::{fresh_seed, uniform_f32};

fn batch(n: usize) -> ImportOptions {
    ImportOptions {
        batch: Some(n),
        dims: Vec::new(),
    }
}

#[test]
fn every_fixture_imports_and_runs_at_the_batch_asked_for() {
    let seed = fresh_seed();
    for f in fixtures::all(seed) {
        let bytes = f.model.encode_to_vec();
        let g = import_bytes(&bytes, &batch(2)).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(g.values[g.inputs[0]].shape, [2, 3, 32, 32], "{}", f.name);
        let x = uniform_f32(2 * 3 * 32 * 32, seed);
        let out = forward_cpu(&g, &[Array::f32(&[2, 3, 32, 32], x)]).unwrap();
        assert_eq!(out[0].shape, [2, fixtures::CLASSES], "{}", f.name);
        assert!(
            out[0].as_f32().unwrap().iter().all(|v| v.is_finite()),
            "{}",
            f.name
        );
    }
}

#[test]
fn imported_resnet_export_matches_the_hand_built_forward_pass() {
    let seed = fresh_seed();
    let dict = crate::weights::seeded_init(crate::ResNet::R18, 10, seed, true);
    let folded = crate::forward::fold(&dict).unwrap();
    let options = ImportOptions {
        batch: Some(2),
        dims: vec![("height".into(), 32), ("width".into(), 40)],
    };
    let g = import_bytes(&crate::onnx::export_resnet(&folded), &options).unwrap();
    let x = uniform_f32(2 * 3 * 32 * 40, seed);
    let got = forward_cpu(&g, &[Array::f32(&[2, 3, 32, 40], x.clone())]).unwrap();
    let want = folded
        .forward_cpu(&gpukit_tensor::Tensor::from_f32(&[2, 3, 32, 40], x).unwrap())
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let got = got[0].as_f32().unwrap();
    let num: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    assert!(
        (num / den).sqrt() <= 1e-5,
        "seed {seed}: {}",
        (num / den).sqrt()
    );
}

/// A one-Conv model, with `edit` applied to its node before writing.
fn conv_model(edit: impl FnOnce(&mut ModelBuilder, &str, &str)) -> Vec<u8> {
    let mut m = ModelBuilder::new(17, 1);
    let x = m.input(
        "input",
        &[Dim::Named("N"), Dim::Fixed(3), Dim::Fixed(8), Dim::Fixed(8)],
    );
    let w = m.initializer(f32_tensor("w", &[4, 3, 3, 3], &[0.5; 108]));
    edit(&mut m, &x, &w);
    m.bytes()
}

/// The import's error message, checked to be bad input (exit code 2).
fn import_err(bytes: &[u8]) -> String {
    let e = import_bytes(bytes, &batch(1)).unwrap_err();
    let msg = e.to_string();
    assert_eq!(
        gpukit_types::HasKind::kind(&e),
        gpukit_types::ErrorKind::BadInput
    );
    assert!(matches!(e, crate::Error::Onnx(_)), "{msg}");
    msg
}

#[test]
fn unsupported_attributes_ops_and_domains_are_errors_naming_node_op_and_attribute() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            conv_model(|m, x, w| {
                let y = m.node("Conv", &[x, w], vec![attr_string("auto_pad", "SAME_UPPER")]);
                m.output(&y, &[]);
            }),
            "ONNX model <bytes>: node conv_1_node (Conv): attribute auto_pad: SAME_UPPER is not supported",
        ),
        (
            conv_model(|m, x, w| {
                let y = m.node("Conv", &[x, w], vec![attr_int("frobnicate", 1)]);
                m.output(&y, &[]);
            }),
            "node conv_1_node (Conv): attribute frobnicate: is not supported by gpukit for this operator",
        ),
        (
            conv_model(|m, x, w| {
                let y = m.node("Conv", &[x, w], vec![attr_ints("kernel_shape", &[5, 5])]);
                m.output(&y, &[]);
            }),
            "node conv_1_node (Conv): kernel_shape [5, 5] differs from the weight's [3, 3]",
        ),
        (
            conv_model(|m, x, _| {
                let y = m.node("Softmax", &[x], vec![]);
                m.output(&y, &[]);
            }),
            "node softmax_1_node (Softmax): operator Softmax is not supported; gpukit supports Add, AveragePool",
        ),
        (
            conv_model(|m, x, _| {
                let y = m.node("MaxPool", &[x], vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("dilations", &[2, 2])]);
                m.output(&y, &[]);
            }),
            "node maxpool_1_node (MaxPool): attribute dilations: [2, 2] is not supported",
        ),
        (
            conv_model(|m, x, _| {
                let y = m.node("MaxPool", &[x], vec![]);
                m.output(&y, &[]);
            }),
            "node maxpool_1_node (MaxPool): attribute kernel_shape is required",
        ),
        (
            conv_model(|m, x, w| {
                let y = m.node("Conv", &[x, w, "nope"], vec![]);
                m.output(&y, &[]);
            }),
            "node conv_1_node (Conv): input nope: is not a graph input",
        ),
        (
            conv_model(|m, x, _| {
                let y = m.node("Relu", &[x], vec![]);
                m.output(&y, &[]);
                m.output("ghost", &[]);
            }),
            "output ghost: is computed by no node",
        ),
    ];
    for (bytes, want) in cases {
        let msg = import_err(&bytes);
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    // another domain
    let mut model = ModelProto::decode(
        conv_model(|m, x, _| {
            let y = m.node("Relu", &[x], vec![]);
            m.output(&y, &[]);
        })
        .as_slice(),
    )
    .unwrap();
    model.graph.as_mut().unwrap().node[0].domain = "com.microsoft".into();
    model.graph.as_mut().unwrap().node[0].name = String::new();
    let msg = import_err(&model.encode_to_vec());
    assert!(
        msg.contains("node Relu_0 (Relu): domain \"com.microsoft\" is not supported"),
        "{msg}"
    );
    // an opset out of range
    model.opset_import[0].version = 11;
    let msg = import_err(&model.encode_to_vec());
    assert!(
        msg.contains("imports opset 11 of the default domain; gpukit reads opsets 13 to 25"),
        "{msg}"
    );
}

#[test]
fn open_sizes_resolve_from_the_options_or_are_errors_naming_the_input() {
    let bytes = conv_model(|m, _, _| {
        let x2 = m.input(
            "image",
            &[
                Dim::Named("N"),
                Dim::Fixed(3),
                Dim::Named("H"),
                Dim::Fixed(8),
            ],
        );
        let y = m.node("Relu", &[&x2], vec![]);
        m.output(&y, &[]);
    });
    let msg = import_bytes(&bytes, &batch(4)).unwrap_err().to_string();
    assert!(
        msg.contains("input image: dimension 2 (\"H\") is not resolved: give its size"),
        "{msg}"
    );
    let options = ImportOptions {
        batch: Some(4),
        dims: vec![("H".into(), 5)],
    };
    let g = import_bytes(&bytes, &options).unwrap();
    assert_eq!(g.values[g.inputs[1]].shape, [4, 3, 5, 8]);
    // a fixed batch other than the one asked for
    let fixed = conv_model(|m, _, _| {
        let x2 = m.input("image", &[Dim::Fixed(1), Dim::Fixed(3)]);
        let y = m.node("Relu", &[&x2], vec![]);
        m.output(&y, &[]);
    });
    let msg = import_bytes(&fixed, &batch(4)).unwrap_err().to_string();
    assert!(
        msg.contains("input image: has a fixed batch of 1; a batch of 4 was asked for"),
        "{msg}"
    );
    assert!(import_bytes(&fixed, &ImportOptions::default()).is_ok());
}

#[test]
fn external_data_is_read_beside_the_model_and_a_short_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let values = uniform_f32(108, fresh_seed());
    let mut m = ModelBuilder::new(17, 1);
    let x = m.input(
        "input",
        &[Dim::Named("N"), Dim::Fixed(3), Dim::Fixed(8), Dim::Fixed(8)],
    );
    let mut w = f32_tensor("w", &[4, 3, 3, 3], &[]);
    w.data_location = crate::onnx::proto::DATA_LOCATION_EXTERNAL;
    let entry = |k: &str, v: &str| crate::onnx::proto::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    w.external_data = vec![
        entry("location", "weights.bin"),
        entry("offset", "16"),
        entry("length", "432"),
    ];
    m.initializer(w);
    let y = m.node("Conv", &[&x, "w"], vec![]);
    m.output(&y, &[]);
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, m.bytes()).unwrap();
    let mut file = vec![0u8; 16];
    file.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.path().join("weights.bin"), &file).unwrap();
    let g = import_file(&path, &batch(1)).unwrap();
    let w = g.values.iter().find(|v| v.name == "w").unwrap();
    assert_eq!(
        w.constant.as_ref().unwrap().as_f32().unwrap(),
        values.as_slice()
    );
    // one byte short, then absent
    std::fs::write(dir.path().join("weights.bin"), &file[..file.len() - 1]).unwrap();
    let msg = import_file(&path, &batch(1)).unwrap_err().to_string();
    assert!(
        msg.contains("model.onnx: tensor w: external data file")
            && msg.contains("weights.bin: has 447 bytes; the tensor needs bytes 16 to 448"),
        "{msg}"
    );
    std::fs::remove_file(dir.path().join("weights.bin")).unwrap();
    let msg = import_file(&path, &batch(1)).unwrap_err().to_string();
    assert!(
        msg.contains("tensor w: external data file") && msg.contains("cannot be opened"),
        "{msg}"
    );
    // from memory there is no folder
    let msg = import_bytes(&std::fs::read(&path).unwrap(), &batch(1))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("a model read from memory has no folder"),
        "{msg}"
    );
}
