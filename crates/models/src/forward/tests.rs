//! Tests of the CPU forward pass: against an unfolded float64 reference, bad inputs, concurrent
//! passes and passes over the first stages.
use super::*;
use crate::weights::seeded_init;
use gpukit_tensor::random::fresh_seed;
use gpukit_tensor::DType;

/// Plain float64 ResNet (basic blocks: ResNet-18/34) with unfolded batch norm: the
/// independent reference.
fn reference_forward(dict: &StateDict, input: &[f32], n: usize, h: usize, w: usize) -> Vec<f64> {
    let get = |k: &str| -> Vec<f64> {
        dict.get(k)
            .unwrap()
            .data
            .iter()
            .map(|&v| f64::from(v))
            .collect()
    };
    let shape_of = |k: &str| dict.get(k).unwrap().shape.clone();
    // activations as (c, h, w, data) per image, NCHW
    struct T {
        c: usize,
        h: usize,
        w: usize,
        d: Vec<f64>,
    }
    let conv = |x: &T, name: &str, stride: usize, pad: usize| -> T {
        let wt = get(&format!("{name}.weight"));
        let s = shape_of(&format!("{name}.weight"));
        let (k, c, r) = (s[0], s[1], s[2]);
        let p = (x.h + 2 * pad - r) / stride + 1;
        let q = (x.w + 2 * pad - r) / stride + 1;
        let mut d = vec![0f64; k * p * q];
        for o in 0..k {
            for i in 0..p {
                for j in 0..q {
                    let mut acc = 0.0;
                    for ci in 0..c {
                        for a in 0..r {
                            for b in 0..r {
                                let y = (i * stride + a) as isize - pad as isize;
                                let z = (j * stride + b) as isize - pad as isize;
                                if y >= 0 && z >= 0 && (y as usize) < x.h && (z as usize) < x.w {
                                    acc += wt[((o * c + ci) * r + a) * r + b]
                                        * x.d[(ci * x.h + y as usize) * x.w + z as usize];
                                }
                            }
                        }
                    }
                    d[(o * p + i) * q + j] = acc;
                }
            }
        }
        T {
            c: k,
            h: p,
            w: q,
            d,
        }
    };
    let bn = |x: &mut T, name: &str, relu: bool| {
        let (g, b, m, v) = (
            get(&format!("{name}.weight")),
            get(&format!("{name}.bias")),
            get(&format!("{name}.running_mean")),
            get(&format!("{name}.running_var")),
        );
        let plane = x.h * x.w;
        for ch in 0..x.c {
            for e in &mut x.d[ch * plane..(ch + 1) * plane] {
                let y = (*e - m[ch]) / (v[ch] + f64::from(BN_EPS)).sqrt() * g[ch] + b[ch];
                *e = if relu { y.max(0.0) } else { y };
            }
        }
    };
    let mut logits = Vec::new();
    for img in 0..n {
        let mut x = T {
            c: 3,
            h,
            w,
            d: input[img * 3 * h * w..(img + 1) * 3 * h * w]
                .iter()
                .map(|&v| f64::from(v))
                .collect(),
        };
        x = conv(&x, "conv1", 2, 3);
        bn(&mut x, "bn1", true);
        // max pool 3x3/2 pad 1
        let (p, q) = ((x.h - 1) / 2 + 1, (x.w - 1) / 2 + 1);
        let mut d = vec![f64::NEG_INFINITY; x.c * p * q];
        for ch in 0..x.c {
            for i in 0..p {
                for j in 0..q {
                    for a in 0..3 {
                        for b in 0..3 {
                            let y = (2 * i + a) as isize - 1;
                            let z = (2 * j + b) as isize - 1;
                            if y >= 0 && z >= 0 && (y as usize) < x.h && (z as usize) < x.w {
                                let v = x.d[(ch * x.h + y as usize) * x.w + z as usize];
                                let o = &mut d[(ch * p + i) * q + j];
                                *o = o.max(v);
                            }
                        }
                    }
                }
            }
        }
        x = T {
            c: x.c,
            h: p,
            w: q,
            d,
        };
        for (stage, &nb) in dict.model.blocks().iter().enumerate() {
            for b in 0..nb {
                let pre = format!("layer{}.{b}", stage + 1);
                let stride = if b == 0 && stage > 0 { 2 } else { 1 };
                let identity = if dict.get(&format!("{pre}.downsample.0.weight")).is_some() {
                    let mut t = conv(&x, &format!("{pre}.downsample.0"), stride, 0);
                    bn(&mut t, &format!("{pre}.downsample.1"), false);
                    t
                } else {
                    T {
                        c: x.c,
                        h: x.h,
                        w: x.w,
                        d: x.d.clone(),
                    }
                };
                let mut y = conv(&x, &format!("{pre}.conv1"), stride, 1);
                bn(&mut y, &format!("{pre}.bn1"), true);
                y = conv(&y, &format!("{pre}.conv2"), 1, 1);
                bn(&mut y, &format!("{pre}.bn2"), false);
                for (e, i) in y.d.iter_mut().zip(&identity.d) {
                    *e = (*e + i).max(0.0);
                }
                x = y;
            }
        }
        let plane = (x.h * x.w) as f64;
        let feats: Vec<f64> =
            x.d.chunks(x.h * x.w)
                .map(|c| c.iter().sum::<f64>() / plane)
                .collect();
        let (fw, fb) = (get("fc.weight"), get("fc.bias"));
        for k in 0..dict.num_classes {
            logits.push(fb[k] + (0..x.c).map(|f| fw[k * x.c + f] * feats[f]).sum::<f64>());
        }
    }
    logits
}

fn input(n: usize, h: usize, w: usize, seed: u64) -> Vec<f32> {
    gpukit_tensor::random::uniform_f32(n * 3 * h * w, seed)
}

fn images(x: &[f32], n: usize, h: usize, w: usize) -> Tensor {
    Tensor::from_f32(&[n, 3, h, w], x.to_vec()).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

/// The f32 forward pass of ResNet-18 (batch norm folded into the convolutions) against a
/// float64 pass with batch norm applied as torchvision does, normwise over the logits.
///
/// Two effects differ: folding rounds each scaled weight once to f32 (relative 6e-8 a weight),
/// and every convolution's sums accumulate in f32. Each layer adds about sqrt(K) u of relative
/// error (K = C*R*S up to 4608 here: about 4e-6), and over ResNet-18's 20 convolutions those
/// add up as a random walk to about 2e-5; 1e-4 leaves a factor 5. The same holds for the
/// AVX-512 kernel and im2col + gemm: they order the same sums differently, and fused
/// multiply-adds only round less (see `cpu::tests::F32_SUM_TOL` in the tensor crate).
#[test]
fn folded_cpu_forward_matches_an_unfolded_float64_reference() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    let dict = seeded_init(ResNet::R18, 10, seed, true);
    let model = fold(&dict).unwrap();
    let (n, h, w) = (2, 40, 36);
    let x = input(n, h, w, seed ^ 0xABCD);
    let got = values(&model.forward_cpu(&images(&x, n, h, w)).unwrap());
    let want = reference_forward(&dict, &x, n, h, w);
    let num: f64 = got
        .iter()
        .zip(&want)
        .map(|(g, r)| (f64::from(*g) - r).powi(2))
        .sum();
    let den: f64 = want.iter().map(|r| r * r).sum();
    let rel = (num / den).sqrt();
    assert!(rel < 1e-4, "relative error {rel} (seed {seed})");
}

#[test]
fn resnet50_runs_and_bad_inputs_are_errors() {
    let model = fold(&seeded_init(ResNet::R50, 1000, 3, false)).unwrap();
    assert_eq!(model.blocks.len(), 16);
    assert!(model.blocks[0].downsample.is_some() && model.blocks[1].downsample.is_none());
    assert_eq!(
        model.blocks[3].convs[1].stride, 2,
        "v1.5: stride on the 3x3"
    );
    let x = input(1, 64, 64, 9);
    let logits = model.forward_cpu(&images(&x, 1, 64, 64)).unwrap();
    assert_eq!(logits.shape(), &[1, 1000]);
    assert!(values(&logits).iter().all(|v| v.is_finite()));
    let grey = Tensor::from_f32(&[1, 1, 64, 64], x[..64 * 64].to_vec()).unwrap();
    assert!(matches!(model.forward_cpu(&grey), Err(Error::Invalid(_))));
    assert!(matches!(
        model.forward_cpu(&images(&x[..3 * 16 * 16], 1, 16, 16)),
        Err(Error::TooSmall { .. })
    ));
    let f16 = images(&x, 1, 64, 64).to_dtype(DType::F16).unwrap();
    assert!(matches!(model.forward_cpu(&f16), Err(Error::Tensor(_))));
}

/// Concurrent passes (sharing the packed weights and the CPU thread team) give exactly
/// the logits of a lone pass; a clone repacks and agrees too.
#[test]
fn concurrent_forward_passes_agree() {
    let model = fold(&seeded_init(ResNet::R18, 10, 5, true)).unwrap();
    let (n, h, w) = (3, 40, 44);
    let x = images(&input(n, h, w, 11), n, h, w);
    let alone = values(&model.forward_cpu(&x).unwrap());
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let mut ws = Workspace::default();
                    (0..3)
                        .map(|_| values(&model.forward_cpu_with(&x, &mut ws).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for run in runs {
            for logits in run.join().unwrap() {
                assert_eq!(logits, alone);
            }
        }
    });
    let copy = model.clone();
    assert_eq!(copy, model);
    assert_eq!(format!("{:?}", copy.cpu_pack), "CpuPack { built: false }");
    assert_eq!(values(&copy.forward_cpu(&x).unwrap()), alone);
    // a channels-last input gives the same logits
    assert_eq!(
        values(&model.forward_cpu(&x.to_nhwc().unwrap()).unwrap()),
        alone
    );
}

/// Running the first stages a few images at a time changes nothing but the order of sums.
///
/// The AVX-512 kernel gives the same bits: each output's sum runs over the same taps in the
/// same order whatever the batch, since its tiles never mix pixels' sums. im2col + gemm may
/// block a sum of K = C*R*S products differently when the number of pixels changes; each such
/// dot product then moves by about sqrt(K) rounding units (u = 2^-24) of its magnitude, about
/// 4e-6 at ResNet's largest K (4608), and those moves add up over the ~25 convolutions of the
/// first two stages as a random walk (about 2e-5). The bound, 1e-4 of the logits' scale, is
/// that figure with a factor 5 of margin; the worst case of every rounding in one direction
/// (K u per layer, about 7e-3 over 25 layers) never happens with random data.
#[test]
fn passes_over_the_first_stages_give_the_same_logits() {
    let exact = gpukit_tensor::cpu::uses_avx512_kernel();
    for (model, (n, h, w)) in [(ResNet::R18, (5, 40, 36)), (ResNet::R50, (3, 64, 48))] {
        let model = fold(&seeded_init(model, 10, 21, true)).unwrap();
        let x = input(n, h, w, 13);
        let mut ws = Workspace::default();
        let whole = model.forward_in_passes(&x, (n, h, w), n, &mut ws, None);
        let scale = whole.iter().fold(0f32, |m, v| m.max(v.abs()));
        for pass in [1, 2, n - 1] {
            let parts = model.forward_in_passes(&x, (n, h, w), pass, &mut ws, None);
            if exact {
                assert_eq!(parts, whole, "{:?} in passes of {pass}", model.model);
                continue;
            }
            let worst = parts
                .iter()
                .zip(&whole)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            assert!(
                worst < 1e-4,
                "{:?} in passes of {pass}: {worst:e} of the logits' scale",
                model.model
            );
        }
    }
}

#[test]
fn fold_reports_a_missing_key() {
    let mut dict = seeded_init(ResNet::R18, 10, 1, false);
    dict.params.remove("layer2.0.bn1.running_var");
    let e = fold(&dict).unwrap_err();
    assert!(
        matches!(&e, Error::Fold(why) if why.contains("layer2.0.bn1.running_var")),
        "{e}"
    );
}

#[test]
fn the_probed_pass_names_every_layer_and_finds_where_values_grow_past_a_limit() {
    let (n, h, w) = (1, 32, 32);
    let x = input(n, h, w, fresh_seed());
    let dict = seeded_init(ResNet::R18, 10, fresh_seed(), true);
    let model = fold(&dict).unwrap();
    let (logits, peaks) = model.forward_cpu_probed(&images(&x, n, h, w)).unwrap();
    // the same logits as the plain pass, bit for bit
    assert_eq!(
        values(&logits),
        values(&model.forward_cpu(&images(&x, n, h, w)).unwrap())
    );
    // every convolution (torchvision's names), then the classifier
    let mut want: Vec<String> = ResNet::R18
        .convolutions(h)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    want.push("fc".into());
    let mut got: Vec<String> = peaks.0.iter().map(|(name, _)| name.clone()).collect();
    // within a block the projection is recorded first; compare as sets, and the ends in order
    assert_eq!(
        (got[0].as_str(), got.last().unwrap().as_str()),
        ("conv1", "fc")
    );
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert!(peaks.0.iter().all(|(_, p)| p.is_finite() && *p > 0.0));
    // weights of layer2.0.conv2 scaled up: the first layer past the limit is that one
    let mut big = model.clone();
    let limit = peaks.max() * 10.0;
    for v in &mut big.blocks[2].convs[1].weight {
        *v *= 1e4;
    }
    let (_, grown) = big.forward_cpu_probed(&images(&x, n, h, w)).unwrap();
    assert_eq!(
        grown.first_over(limit).map(|(l, _)| l),
        Some("layer2.0.conv2")
    );
    assert_eq!(peaks.first_over(limit), None);
}

#[test]
fn cpu_forward_memory_grows_with_the_batch_and_image_and_never_overflows() {
    let model = fold(&seeded_init(ResNet::R50, 1000, 0, true)).unwrap();
    let one = model.cpu_forward_bytes(1, 224, 224).unwrap();
    // the stem's output, 64 x 112 x 112 f32, four times, and the input twice
    assert_eq!(one, (2 * 3 * 224 * 224 + 4 * 64 * 112 * 112) * 4);
    assert_eq!(model.cpu_forward_bytes(8, 224, 224), Some(8 * one));
    assert!(model.cpu_forward_bytes(1, 100_000, 100_000).unwrap() > 1 << 40);
    assert_eq!(model.cpu_forward_bytes(usize::MAX, 224, 224), None);
}
