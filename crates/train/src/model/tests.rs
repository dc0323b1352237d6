//! The MLP against float64 written from the definitions: forward on fresh random inputs, and
//! every parameter's gradient against central differences of the loss.

use super::*;
use crate::loss::{loss_and_grad, BatchTargets};
use gpukit_tensor::random::{fresh_seed, normal_f64};

/// y = relu(...relu(x W0^T + b0)...) W_last^T + b_last, one dot product per element.
fn naive_forward(model: &Mlp<f64>, x: &[f64], n: usize) -> Vec<f64> {
    let mut h = x.to_vec();
    for (i, l) in model.layers.iter().enumerate() {
        let mut z = vec![0.0; n * l.outputs];
        for r in 0..n {
            for o in 0..l.outputs {
                let dot: f64 = (0..l.inputs)
                    .map(|j| h[r * l.inputs + j] * l.weight[o * l.inputs + j])
                    .sum();
                let v = dot + l.bias[o];
                z[r * l.outputs + o] = if i + 1 < model.layers.len() {
                    v.max(0.0)
                } else {
                    v
                };
            }
        }
        h = z;
    }
    h
}

#[test]
fn forward_matches_the_definition() {
    let seed = fresh_seed();
    let model = Mlp::<f64>::new(&[7, 13, 5, 3], seed);
    let n = 11;
    let x = normal_f64(n * 7, seed ^ 9);
    let mut acts = Activations::default();
    model.forward(&x, n, &mut acts);
    let want = naive_forward(&model, &x, n);
    for (g, w) in acts.output().iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "seed {seed}: {g} vs {w}");
    }
    // the f32 model of the same seed agrees to f32's precision (values O(1), sums of <= 13)
    let m32 = Mlp::<f32>::new(&[7, 13, 5, 3], seed);
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let mut a32 = Activations::default();
    m32.forward(&x32, n, &mut a32);
    for (g, w) in a32.output().iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-5, "seed {seed}: {g} vs {w}");
    }
}

#[test]
fn initialisation_follows_pytorch_bounds_and_names() {
    let model = Mlp::<f32>::new(&[16, 64, 1], 3);
    assert_eq!(model.widths(), vec![16, 64, 1]);
    assert_eq!(model.parameters(), 16 * 64 + 64 + 64 + 1);
    let names: Vec<String> = model.named().into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
    for (l, bound) in model.layers.iter().zip([0.25f32, 0.125]) {
        assert!(l.weight.iter().chain(&l.bias).all(|v| v.abs() < bound));
        // not all in a corner: the spread fills most of the interval
        let max = l.weight.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(max > 0.8 * bound, "{max} of {bound}");
    }
    assert_ne!(Mlp::<f32>::new(&[16, 64, 1], 4), model);
}

/// Central differences in float64 (h = 1e-6: truncation ~h^2, rounding ~1e-16/h, both far
/// under the 1e-7 bound for values of order one).
#[test]
fn gradients_match_finite_differences() {
    let seed = fresh_seed();
    let widths = [4, 6, 5, 3];
    let n = 5;
    let x = normal_f64(n * 4, seed ^ 1);
    let t = normal_f64(n * 3, seed ^ 2);
    let classes = [0u32, 2, 1, 1, 0];
    for targets in [
        BatchTargets::Values(&t[..]),
        BatchTargets::Classes(&classes[..]),
    ] {
        let model = Mlp::<f64>::new(&widths, seed);
        let loss = |m: &Mlp<f64>| {
            let mut acts = Activations::default();
            m.forward(&x, n, &mut acts);
            loss_and_grad(acts.output(), 3, targets, 1.0, &mut Vec::new()).0
        };
        let mut acts = Activations::default();
        model.forward(&x, n, &mut acts);
        let mut dy = Vec::new();
        loss_and_grad(acts.output(), 3, targets, 1.0, &mut dy);
        let mut grads = Grads::zeros(&model);
        model.backward(&mut acts, &dy, &mut grads, &mut Backward::default());
        for li in 0..model.layers.len() {
            for (which, len) in [
                (0, model.layers[li].weight.len()),
                (1, model.layers[li].bias.len()),
            ] {
                for i in 0..len {
                    let h = 1e-6;
                    let mut m = model.clone();
                    let edit = |m: &mut Mlp<f64>, d: f64| {
                        let l = &mut m.layers[li];
                        if which == 0 {
                            l.weight[i] += d
                        } else {
                            l.bias[i] += d
                        }
                    };
                    edit(&mut m, h);
                    let up = loss(&m);
                    edit(&mut m, -2.0 * h);
                    let down = loss(&m);
                    let fd = (up - down) / (2.0 * h);
                    let g = if which == 0 {
                        grads.weight[li][i]
                    } else {
                        grads.bias[li][i]
                    };
                    assert!(
                        (g - fd).abs() < 1e-7,
                        "seed {seed} {targets:?} layer {li} {which} [{i}]: {g} vs {fd}"
                    );
                }
            }
        }
    }
}

#[test]
fn backward_adds_to_the_gradients_it_is_given() {
    let seed = fresh_seed();
    let model = Mlp::<f64>::new(&[3, 4, 2], seed);
    let x = normal_f64(6, seed ^ 3);
    let mut acts = Activations::default();
    model.forward(&x, 2, &mut acts);
    let dy = normal_f64(4, seed ^ 4);
    let mut once = Grads::zeros(&model);
    let mut scratch = Backward::default();
    model.backward(&mut acts, &dy, &mut once, &mut scratch);
    let mut twice = once.clone();
    model.backward(&mut acts, &dy, &mut twice, &mut scratch);
    for (a, b) in once
        .weight
        .iter()
        .flatten()
        .zip(twice.weight.iter().flatten())
    {
        assert!((2.0 * a - b).abs() < 1e-12);
    }
    twice.clear();
    assert!(twice.weight.iter().flatten().all(|&v| v == 0.0));
}

#[test]
fn layer_lists_are_parsed_or_refused_naming_the_flag() {
    assert_eq!(parse_widths("16,64,1").unwrap(), vec![16, 64, 1]);
    assert_eq!(parse_widths(" 3 , 10,2").unwrap(), vec![3, 10, 2]);
    for bad in ["", "16", "16,0,1", "16,x,1", "16,,1", "-1,2"] {
        let e = parse_widths(bad).unwrap_err().to_string();
        assert!(e.contains("--layers"), "{bad}: {e}");
    }
}

/// Checkpointed forward and backward give the same output and gradients, bit for bit, for
/// every segment length, and keep fewer layer outputs.
#[test]
fn checkpointing_changes_memory_not_results() {
    let seed = fresh_seed();
    let widths = [5, 9, 7, 8, 6, 4, 3];
    let model = Mlp::<f32>::new(&widths, seed);
    let n = 6;
    let x: Vec<f32> = gpukit_tensor::random::normal_f32(n * 5, seed ^ 5);
    let dy: Vec<f32> = gpukit_tensor::random::normal_f32(n * 3, seed ^ 6);
    let mut acts = Activations::default();
    model.forward(&x, n, &mut acts);
    let want_out = acts.output().to_vec();
    let mut want = Grads::zeros(&model);
    model.backward(&mut acts, &dy, &mut want, &mut Backward::default());
    let all_kept: usize = acts.outs.iter().map(Vec::len).sum();
    for segment in 1..=7 {
        let mut c = Activations::default();
        model.forward_checkpointed(&x, n, segment, &mut c);
        assert_eq!(c.output(), want_out.as_slice(), "segment {segment}");
        let kept: usize = c.outs.iter().map(Vec::len).sum();
        if segment > 1 {
            assert!(kept < all_kept, "segment {segment}: {kept} of {all_kept}");
        }
        let mut got = Grads::zeros(&model);
        model.backward(&mut c, &dy, &mut got, &mut Backward::default());
        assert_eq!(got, want, "seed {seed} segment {segment}");
    }
}
