//! Checkpoints and initial weights: round trips, and every bad file refused naming the problem.

use super::*;
use crate::optim::OptimizerKind;
use safetensors::tensor::TensorView;

fn meta(widths: &[usize]) -> Meta {
    Meta {
        format: 0,
        widths: widths.to_vec(),
        optimizer: OptimizerConfig {
            kind: OptimizerKind::Adam,
            lr: 1e-3,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        position: Position {
            step: 12,
            epoch: 1,
            batch: 3,
        },
        seed: 5,
        scaler: Some((65536.0, 12)),
    }
}

#[test]
fn a_checkpoint_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let widths = [3, 5, 2];
    let model = Mlp::<f32>::new(&widths, 1);
    let mut opt = Optimizer::new(meta(&widths).optimizer);
    let mut grads = crate::model::Grads::zeros(&model);
    grads.weight[0][0] = 1.0;
    let mut stepped = model.clone();
    opt.update(&mut stepped, &grads);
    save(&path, &stepped, &opt, &meta(&widths)).unwrap();
    let (m, o, back) = load(&path, &widths).unwrap();
    assert_eq!(m, stepped);
    assert_eq!((o.m.clone(), o.v.clone()), (opt.m.clone(), opt.v.clone()));
    assert_eq!(o.step, 12, "the step comes from the saved position");
    assert_eq!(
        back,
        Meta {
            format: FORMAT,
            ..meta(&widths)
        }
    );
    // nothing but the file itself is left in the directory
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_checkpoint_for_other_layers_or_not_one_at_all_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let model = Mlp::<f32>::new(&[3, 5, 2], 1);
    save(
        &path,
        &model,
        &Optimizer::new(meta(&[3, 5, 2]).optimizer),
        &meta(&[3, 5, 2]),
    )
    .unwrap();
    let e = load(&path, &[3, 6, 2]).unwrap_err().to_string();
    assert!(e.contains("layers 3,5,2, not 3,6,2"), "{e}");
    let plain = dir.path().join("plain.safetensors");
    let t = TensorView::new(Dtype::F32, vec![1], &[0u8; 4]).unwrap();
    std::fs::write(&plain, safetensors::serialize([("x", t)], None).unwrap()).unwrap();
    let e = load(&plain, &[3, 5, 2]).unwrap_err().to_string();
    assert!(e.contains("not a gpukit training checkpoint"), "{e}");
    std::fs::write(&plain, b"garbage").unwrap();
    let e = load(&plain, &[3, 5, 2]).unwrap_err().to_string();
    assert!(
        e.contains("not a valid safetensors file") && e.contains("plain.safetensors"),
        "{e}"
    );
}

/// A tensor to write: name, dtype, shape, bytes.
type Raw<'a> = (&'a str, Dtype, Vec<usize>, Vec<u8>);

fn write(path: &Path, tensors: &[Raw<'_>]) {
    let views = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()));
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn f64s(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn initial_weights_from_pytorch_load_in_any_float_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("init.safetensors");
    let w0: Vec<f64> = (0..6).map(|i| i as f64 * 0.5).collect();
    write(
        &path,
        &[
            ("0.weight", Dtype::F64, vec![3, 2], f64s(&w0)),
            ("0.bias", Dtype::F64, vec![3], f64s(&[1.0, 2.0, 3.0])),
            ("2.weight", Dtype::F64, vec![1, 3], f64s(&[-1.0, 0.0, 1.0])),
            ("2.bias", Dtype::F64, vec![1], f64s(&[0.25])),
        ],
    );
    let m = load_init(&path, &[2, 3, 1]).unwrap();
    assert_eq!(m.layers[0].weight, vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    assert_eq!(m.layers[1].bias, vec![0.25]);
}

#[test]
fn bad_initial_weights_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("init.safetensors");
    let good = |name: &'static str, shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        (name, Dtype::F64, shape, f64s(&vec![0.5; n]))
    };
    let cases: Vec<(Vec<Raw<'_>>, &str)> = vec![
        (
            vec![
                good("0.weight", vec![3, 2]),
                good("0.bias", vec![3]),
                good("2.weight", vec![1, 3]),
            ],
            "has no tensor \"2.bias\"",
        ),
        (
            vec![
                good("0.weight", vec![3, 3]),
                good("0.bias", vec![3]),
                good("2.weight", vec![1, 3]),
                good("2.bias", vec![1]),
            ],
            "0.weight has shape [3, 3]",
        ),
        (
            vec![
                good("0.weight", vec![3, 2]),
                good("0.bias", vec![3]),
                good("2.weight", vec![1, 3]),
                good("2.bias", vec![1]),
                good("4.weight", vec![1]),
            ],
            "has tensor \"4.weight\"",
        ),
        (
            vec![
                good("0.weight", vec![3, 2]),
                ("0.bias", Dtype::F64, vec![3], f64s(&[0.0, f64::NAN, 0.0])),
                good("2.weight", vec![1, 3]),
                good("2.bias", vec![1]),
            ],
            "0.bias holds NaN or Inf (first at element 1)",
        ),
        (
            vec![
                good("0.weight", vec![3, 2]),
                ("0.bias", Dtype::I64, vec![3], vec![0u8; 24]),
                good("2.weight", vec![1, 3]),
                good("2.bias", vec![1]),
            ],
            "0.bias has dtype I64",
        ),
    ];
    for (tensors, fragment) in cases {
        write(&path, &tensors);
        let e = load_init(&path, &[2, 3, 1]).unwrap_err();
        assert_eq!(
            gpukit_types::HasKind::kind(&e),
            gpukit_types::ErrorKind::BadInput
        );
        let e = e.to_string();
        assert!(
            e.contains(fragment) && e.contains("init.safetensors"),
            "{fragment}: {e}"
        );
    }
}
