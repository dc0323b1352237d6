//! Tests of the tensor type: construction, layouts, dtypes, ops and device rules.
use super::*;
use crate::check_same_device;
use crate::codec::{decode_f32, decode_f64, encode_f64, f64_to_f32_round_odd};
use crate::random::{fresh_seed, uniform_f32 as random};
use half::{bf16, f16};

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

#[test]
fn construction_checks_lengths() {
    let t = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.strides(), &[3, 1]);
    assert_eq!((t.numel(), t.bytes(), t.rank()), (6, 24, 2));
    assert_eq!(t.device(), Device::Cpu);
    assert_eq!(t.dtype(), DType::F32);
    assert!(t.is_contiguous());

    let e = Tensor::from_f32(&[2, 3], iota(5)).unwrap_err();
    assert!(matches!(
        e,
        Error::DataLength {
            expected: 6,
            got: 5,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "shape [2, 3] holds 6 elements but 5 were given"
    );
    let e = Tensor::from_bytes(&[2], DType::F16, vec![0; 3]).unwrap_err();
    assert!(e.to_string().contains("needs 4 bytes"), "{e}");
    let e = Tensor::zeros(&[usize::MAX, 2], DType::F32).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let e = Tensor::from_f64(&[1 << 62, 4], vec![]).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");

    // 0-D and empty tensors
    let s = Tensor::from_f64(&[], vec![2.5]).unwrap();
    assert_eq!((s.numel(), s.to_vec_f32().unwrap()), (1, vec![2.5]));
    let z = Tensor::zeros(&[0, 3], DType::Bf16).unwrap();
    assert_eq!((z.numel(), z.bytes()), (0, 0));
    assert!(z.to_vec_f32().unwrap().is_empty());
    assert!(z.permute(&[1, 0]).unwrap().contiguous().is_ok());
    let zz = Tensor::zeros(&[2, 2], DType::F64).unwrap();
    assert_eq!(zz.to_vec_f64().unwrap(), vec![0.0; 4]);
}

#[test]
fn nhwc_and_nchw_strides() {
    let (n, c, h, w) = (2, 3, 4, 5);
    let t = Tensor::from_f32(&[n, c, h, w], iota(n * c * h * w)).unwrap();
    assert_eq!(t.strides(), &[60, 20, 5, 1]);
    assert!(t.is_contiguous() && !t.is_nhwc());
    let l = t.to_nhwc().unwrap();
    assert_eq!(l.shape(), &[2, 3, 4, 5]);
    assert_eq!(l.strides(), &[h * w * c, 1, w * c, c]);
    assert_eq!(l.strides(), &[60, 1, 15, 3]);
    assert!(l.is_nhwc() && !l.is_contiguous());
    assert_eq!(nhwc_strides(&[1, 2, 3]), None);
    // to_nhwc of an NHWC tensor is itself; to_nchw goes back
    assert_eq!(l.to_nhwc().unwrap().strides(), l.strides());
    let back = l.to_nchw().unwrap();
    assert!(back.is_contiguous());
    assert_eq!(back.host_storage(), t.host_storage());
    let e = Tensor::zeros(&[2, 3], DType::F32)
        .unwrap()
        .to_nhwc()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "to_nhwc: needs a 4-D tensor, got shape [2, 3]"
    );
}

#[test]
fn to_nhwc_keeps_logical_values_and_moves_memory() {
    let seed = fresh_seed();
    let (n, c, h, w) = (2, 3, 5, 7);
    let x = random(n * c * h * w, seed);
    let t = Tensor::from_f32(&[n, c, h, w], x.clone()).unwrap();
    let l = t.to_nhwc().unwrap();
    assert_eq!(l.to_vec_f32().unwrap(), x, "seed {seed}");
    // memory is NHWC: element (ni, ci, hi, wi) at ((ni*h + hi)*w + wi)*c + ci
    let mem = decode_f32(l.host_storage().unwrap(), DType::F32);
    for ni in 0..n {
        for ci in 0..c {
            for hi in 0..h {
                for wi in 0..w {
                    let logical = ((ni * c + ci) * h + hi) * w + wi;
                    let physical = ((ni * h + hi) * w + wi) * c + ci;
                    assert_eq!(mem[physical], x[logical], "seed {seed}");
                }
            }
        }
    }
    // ops on channels-last tensors read them logically
    let s = l.add(&t).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v + v).collect();
    assert_eq!(s.to_vec_f32().unwrap(), want);
}

#[test]
fn contiguous_of_a_permuted_tensor_matches_a_hand_computed_result() {
    // [[0, 1, 2], [3, 4, 5]] transposed
    let t = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
    let p = t.permute(&[1, 0]).unwrap();
    assert_eq!(p.shape(), &[3, 2]);
    assert_eq!(p.strides(), &[1, 3]);
    assert!(!p.is_contiguous());
    assert_eq!(
        p.host_storage(),
        t.host_storage(),
        "a view shares the buffer"
    );
    let c = p.contiguous().unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.strides(), &[2, 1]);
    assert_eq!(c.to_vec_f32().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
    assert_eq!(
        decode_f32(c.host_storage().unwrap(), DType::F32),
        vec![0., 3., 1., 4., 2., 5.]
    );

    // [2, 3, 2] with element (i, j, k) = 6i + 2j + k, permuted to (k, i, j)
    let t = Tensor::from_f32(&[2, 3, 2], iota(12)).unwrap();
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[2, 2, 3]);
    assert_eq!(p.strides(), &[1, 6, 2]);
    assert_eq!(
        p.contiguous().unwrap().to_vec_f32().unwrap(),
        vec![0., 2., 4., 6., 8., 10., 1., 3., 5., 7., 9., 11.]
    );
    // permuting back is the original, without a copy
    let q = p.permute(&[1, 2, 0]).unwrap();
    assert!(q.is_contiguous());
    assert_eq!(q.to_vec_f32().unwrap(), iota(12));
}

#[test]
fn permute_and_reshape_reject_bad_input() {
    let t = Tensor::from_f32(&[2, 3, 4], iota(24)).unwrap();
    for bad in [&[0, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 3]] {
        let e = t.permute(bad).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidPermutation { rank: 3, dims } if dims == bad),
            "{e}"
        );
    }
    let r = t.reshape(&[6, 4]).unwrap();
    assert_eq!((r.shape(), r.strides()), (&[6, 4][..], &[4, 1][..]));
    assert_eq!(r.to_vec_f32().unwrap(), iota(24));
    let e = t.reshape(&[5, 5]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "reshape: shape [2, 3, 4] (24 elements) cannot become [5, 5] (25 elements)"
    );
    let p = t.permute(&[2, 1, 0]).unwrap();
    let e = p.reshape(&[24]).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { op: "reshape", .. }));
    assert!(e.to_string().contains(".contiguous()"), "{e}");
    assert!(t.reshape(&[usize::MAX, 3]).is_err());
    // size-1 dimensions do not break contiguity
    let one = t.reshape(&[2, 1, 12]).unwrap().permute(&[1, 0, 2]).unwrap();
    assert!(one.is_contiguous());
    assert_eq!(one.reshape(&[24]).unwrap().to_vec_f32().unwrap(), iota(24));
}

#[test]
fn dtype_round_trips_within_precision() {
    let seed = fresh_seed();
    let x: Vec<f32> = random(1000, seed).iter().map(|v| v * 100.0).collect();
    let t = Tensor::from_f32(&[10, 100], x.clone()).unwrap();
    for (dtype, rel) in [
        (DType::F16, 2f32.powi(-11)),
        (DType::Bf16, 2f32.powi(-8)),
        (DType::F64, 0.0),
        (DType::Tf32, 0.0),
        (DType::F32, 0.0),
    ] {
        let h = t.to_dtype(dtype).unwrap();
        assert_eq!(h.dtype(), dtype);
        assert_eq!(h.bytes(), 1000 * dtype.size_bytes());
        let back = h.to_vec_f32().unwrap();
        for (b, v) in back.iter().zip(&x) {
            // f16 subnormals (below 2^-14) are spaced 2^-24 apart
            let abs = if dtype == DType::F16 {
                2f32.powi(-25)
            } else {
                0.0
            };
            assert!(
                (b - v).abs() <= v.abs() * rel + abs,
                "{dtype}: {v} came back as {b} (seed {seed})"
            );
        }
        // from_f32_as stores what half's conversion gives
        let direct = Tensor::from_f32_as(&[10, 100], &x, dtype).unwrap();
        assert_eq!(direct.host_storage(), h.host_storage(), "{dtype}");
        // and values the dtype holds exactly come back exactly
        let exact = [0.0f32, 1.0, -2.5, 0.375, 1024.0];
        let e = Tensor::from_f32_as(&[5], &exact, dtype).unwrap();
        assert_eq!(e.to_vec_f32().unwrap(), exact, "{dtype}");
        assert_eq!(
            e.to_dtype(DType::F32)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .host_storage(),
            e.host_storage()
        );
    }
    let f16_bits = Tensor::from_f32_as(&[1], &[1.0], DType::F16).unwrap();
    assert_eq!(
        f16_bits.host_storage().unwrap(),
        &0x3c00u16.to_ne_bytes()[..]
    );
    let bf16_bits = Tensor::from_f32_as(&[1], &[1.0], DType::Bf16).unwrap();
    assert_eq!(
        bf16_bits.host_storage().unwrap(),
        &0x3f80u16.to_ne_bytes()[..]
    );
    // f64 -> f16 rounds once: 1 + 2^-11 + 2^-40 rounds up, not to even
    let t = Tensor::from_f64(&[1], vec![1.0 + 2f64.powi(-11) + 2f64.powi(-40)]).unwrap();
    assert_eq!(
        t.to_dtype(DType::F16).unwrap().to_vec_f64().unwrap(),
        vec![1.0 + 2f64.powi(-10)]
    );
    let t = Tensor::from_f64(&[1], vec![1.0 + 2f64.powi(-8) + 2f64.powi(-40)]).unwrap();
    assert_eq!(
        t.to_dtype(DType::Bf16).unwrap().to_vec_f64().unwrap(),
        vec![1.0 + 2f64.powi(-7)]
    );
    // a permuted tensor converts in logical order
    let p = Tensor::from_f32(&[2, 3], iota(6))
        .unwrap()
        .permute(&[1, 0])
        .unwrap()
        .to_dtype(DType::Bf16)
        .unwrap();
    assert!(p.is_contiguous());
    assert_eq!(p.to_vec_f32().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
}

/// The f16/bf16 value nearest to a positive finite `v` (ties to the even one), by search.
fn nearest_half(v: f64, to_f64: fn(u16) -> f64) -> u16 {
    let mut best = 0u16;
    let (mut lo, mut hi) = (0u16, 0x7f80u16);
    // the largest bit pattern whose value is <= v (positive patterns are ordered; those
    // past infinity are NaN, never <= v)
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if to_f64(mid) <= v {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let mut best_err = f64::INFINITY;
    for b in [lo, lo + 1] {
        let err = (to_f64(b) - v).abs();
        if err < best_err || (err == best_err && b % 2 == 0) {
            (best, best_err) = (b, err);
        }
    }
    best
}

#[test]
fn f64_to_half_rounds_once() {
    let seed = fresh_seed();
    let mut s = seed;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let f16_of = |b: u16| f16::from_bits(b).to_f64();
    let bf16_of = |b: u16| bf16::from_bits(b).to_f64();
    for (dtype, to_f64, exps, max) in [
        (
            DType::F16,
            f16_of as fn(u16) -> f64,
            -26..16,
            f16::MAX.to_f64(),
        ),
        (DType::Bf16, bf16_of, -135..127, bf16::MAX.to_f64()),
    ] {
        let mut values = Vec::new();
        for e in exps {
            for _ in 0..40 {
                values.push(f64::from_bits(next() >> 12 | 0x3ff0_0000_0000_0000) * 2f64.powi(e));
            }
            // exactly halfway between two representable values, and either side of it
            let a = to_f64(nearest_half(2f64.powi(e), to_f64));
            let b = to_f64(nearest_half(2f64.powi(e), to_f64) + 1);
            let mid = (a + b) / 2.0;
            values.extend([
                mid,
                mid * (1.0 + 2f64.powi(-50)),
                mid * (1.0 - 2f64.powi(-50)),
            ]);
        }
        for v in values.into_iter().filter(|v| *v > 0.0 && *v < max) {
            let got = encode_f64(&[v, -v], dtype);
            let want = nearest_half(v, to_f64);
            let pos = u16::from_ne_bytes([got[0], got[1]]);
            let neg = u16::from_ne_bytes([got[2], got[3]]);
            assert_eq!(pos, want, "{dtype}: {v:e} (seed {seed})");
            assert_eq!(neg, want | 0x8000, "{dtype}: -{v:e} (seed {seed})");
        }
    }
    // beyond the range: infinity; NaN stays NaN
    let big = decode_f64(&encode_f64(&[1e300, -1e300, 7e4], DType::F16), DType::F16);
    assert_eq!(big, vec![f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY]);
    let big = decode_f64(&encode_f64(&[1e300, 3.3e38], DType::Bf16), DType::Bf16);
    assert_eq!(big[0], f64::INFINITY);
    assert!(big[1].is_finite());
    for dtype in DType::ALL {
        let nan = decode_f64(&encode_f64(&[f64::NAN], dtype), dtype);
        assert!(nan[0].is_nan(), "{dtype}");
    }
    assert_eq!(f64_to_f32_round_odd(1e-300), f32::from_bits(1));
    assert_eq!(f64_to_f32_round_odd(-1e300), -f32::MAX);
}

#[test]
fn add_matches_native_addition() {
    let seed = fresh_seed();
    let shape = [3, 4, 5];
    let a = random(60, seed);
    let b = random(60, seed ^ 0x9e37_79b9);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let ta = Tensor::from_f32(&shape, a.clone()).unwrap();
    let tb = Tensor::from_f32(&shape, b.clone()).unwrap();
    assert_eq!(
        ta.add(&tb).unwrap().to_vec_f32().unwrap(),
        want,
        "seed {seed}"
    );

    let want64: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f64::from(*x) * 3.0 + f64::from(*y) / 7.0)
        .collect();
    let a64: Vec<f64> = a.iter().map(|x| f64::from(*x) * 3.0).collect();
    let b64: Vec<f64> = b.iter().map(|y| f64::from(*y) / 7.0).collect();
    let s = Tensor::from_f64(&shape, a64)
        .unwrap()
        .add(&Tensor::from_f64(&shape, b64).unwrap())
        .unwrap();
    assert_eq!(s.dtype(), DType::F64);
    assert_eq!(s.to_vec_f64().unwrap(), want64, "seed {seed}");

    for dtype in [DType::F16, DType::Bf16] {
        let ha = Tensor::from_f32_as(&shape, &a, dtype).unwrap();
        let hb = Tensor::from_f32_as(&shape, &b, dtype).unwrap();
        let got = ha.add(&hb).unwrap();
        assert_eq!(got.dtype(), dtype);
        let (va, vb) = (ha.to_vec_f32().unwrap(), hb.to_vec_f32().unwrap());
        let want: Vec<f32> = va
            .iter()
            .zip(&vb)
            .map(|(x, y)| match dtype {
                DType::F16 => (f16::from_f32(*x) + f16::from_f32(*y)).to_f32(),
                _ => (bf16::from_f32(*x) + bf16::from_f32(*y)).to_f32(),
            })
            .collect();
        assert_eq!(got.to_vec_f32().unwrap(), want, "{dtype} seed {seed}");
    }

    // strided operands are read logically
    let pa = ta.permute(&[2, 0, 1]).unwrap();
    let pb = tb.permute(&[2, 0, 1]).unwrap().contiguous().unwrap();
    let got = pa.add(&pb).unwrap().permute(&[1, 2, 0]).unwrap();
    assert_eq!(got.to_vec_f32().unwrap(), want, "seed {seed}");
}

#[test]
fn add_rejects_mismatched_shapes_and_dtypes() {
    let a = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let e = a
        .add(&Tensor::zeros(&[3, 2], DType::F32).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "add: shapes [2, 3] and [3, 2] do not fit (equal shapes)"
    );
    let e = a
        .add(&Tensor::zeros(&[2, 3], DType::F16).unwrap())
        .unwrap_err();
    assert!(matches!(
        e,
        Error::DTypeMismatch {
            op: "add",
            left: DType::F32,
            right: DType::F16
        }
    ));
    assert_eq!(
        e.to_string(),
        "add: dtypes differ (f32 and f16): convert one with .to_dtype(...) first"
    );
}

fn naive_matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

#[test]
fn matmul_matches_a_simple_loop() {
    let seed = fresh_seed();
    for (m, n, k) in [(1, 1, 1), (3, 5, 7), (17, 9, 33), (4, 6, 0), (0, 3, 2)] {
        let a = random(m * k, seed ^ (m as u64));
        let b = random(k * n, seed ^ 0xabcd ^ (n as u64));
        let a64: Vec<f64> = a.iter().map(|v| f64::from(*v)).collect();
        let b64: Vec<f64> = b.iter().map(|v| f64::from(*v)).collect();
        let want = naive_matmul(&a64, &b64, m, n, k);

        let c = Tensor::from_f64(&[m, k], a64.clone())
            .unwrap()
            .matmul(&Tensor::from_f64(&[k, n], b64.clone()).unwrap())
            .unwrap();
        assert_eq!((c.shape(), c.dtype()), (&[m, n][..], DType::F64));
        for (g, w) in c.to_vec_f64().unwrap().iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-12 * (k as f64 + 1.0),
                "{m}x{n}x{k} seed {seed}"
            );
        }

        let c = Tensor::from_f32(&[m, k], a.clone())
            .unwrap()
            .matmul(&Tensor::from_f32(&[k, n], b.clone()).unwrap())
            .unwrap();
        assert_eq!(c.to_vec_f32().unwrap().len(), m * n);
        for (g, w) in c.to_vec_f32().unwrap().iter().zip(&want) {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-5 * (k as f64 + 1.0),
                "{m}x{n}x{k} seed {seed}"
            );
        }
    }
    // a transposed (strided) operand is read logically
    let a = Tensor::from_f64(&[3, 2], vec![1., 2., 3., 4., 5., 6.]).unwrap();
    let at = a.permute(&[1, 0]).unwrap(); // [[1, 3, 5], [2, 4, 6]]
    let c = at.matmul(&a).unwrap();
    assert_eq!(c.to_vec_f64().unwrap(), vec![35., 44., 44., 56.]);
}

#[test]
fn matmul_rejects_bad_input() {
    let a = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let e = a
        .matmul(&Tensor::zeros(&[2, 3], DType::F32).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "matmul: shapes [2, 3] and [2, 3] do not fit ([m, k] and [k, n])"
    );
    let e = a
        .matmul(&Tensor::zeros(&[3], DType::F32).unwrap())
        .unwrap_err();
    assert!(matches!(&e, Error::Rank { expected: 2, shape, .. } if shape == &[3]));
    let h = Tensor::zeros(&[2, 2], DType::F16).unwrap();
    let e = h.matmul(&h).unwrap_err();
    assert_eq!(
        e.to_string(),
        "matmul: dtype f16 is not supported (supported: f64, f32, tf32)"
    );
    let e = a
        .matmul(&Tensor::zeros(&[3, 2], DType::F64).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }));
}

#[test]
fn device_mismatch_names_both_devices() {
    assert!(check_same_device("add", Device::Cpu, Device::Cpu).is_ok());
    assert!(check_same_device("add", Device::Cuda(1), Device::Cuda(1)).is_ok());
    let e = check_same_device("add", Device::Cpu, Device::Cuda(0)).unwrap_err();
    assert!(matches!(
        e,
        Error::DeviceMismatch {
            op: "add",
            left: Device::Cpu,
            right: Device::Cuda(0)
        }
    ));
    assert_eq!(
        e.to_string(),
        "add: tensors are on different devices (cpu and cuda:0): move one with .to(...) first"
    );
    let e = check_same_device("matmul", Device::Cuda(0), Device::Cuda(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "matmul: tensors are on different devices (cuda:0 and cuda:1): move one with .to(...) first"
    );
}

#[test]
fn moving_without_a_gpu_is_a_typed_error() {
    let devices = Devices::cpu_only();
    let t = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
    let e = t.to(Device::Cuda(0), &devices).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoGpu {
                device: Device::Cuda(0),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().starts_with("cuda:0 is not available"), "{e}");
    let e = Tensor::zeros_on(&[2], DType::F32, Device::Cuda(3), &devices).unwrap_err();
    assert!(e.to_string().starts_with("cuda:3 is not available"), "{e}");
    // the same device is a cheap clone sharing the buffer
    let same = t.to(Device::Cpu, &devices).unwrap();
    assert_eq!(
        same.host_storage().map(<[u8]>::as_ptr),
        t.host_storage().map(<[u8]>::as_ptr)
    );
    let z = Tensor::zeros_on(&[2], DType::F32, Device::Cpu, &devices).unwrap();
    assert_eq!(z.to_vec_f32().unwrap(), vec![0.0, 0.0]);
    assert!(t.gpu().is_none() && t.device_view().is_err());
    assert!(format!("{devices:?}").contains("cuda: false"));
    assert!(format!("{t:?}").contains("Cpu"));
}

#[test]
fn gather_refuses_views_past_the_storage() {
    let e = gather(&[0; 7], &[2], &[1], 4).unwrap_err();
    assert!(matches!(
        e,
        Error::StorageTooSmall {
            storage_bytes: 7,
            needed: 8
        }
    ));
    assert_eq!(
        gather(&[1, 2, 3, 4], &[2, 2], &[1, 2], 1).unwrap(),
        vec![1, 3, 2, 4]
    );
}

/// The elementwise, reduction and batched ops the lessons use, against plain f64 loops on fresh
/// random inputs (non-contiguous operands included).
#[test]
fn mul_in_place_sum_and_bmm_match_float64_loops() {
    let seed = fresh_seed();
    let (a, b) = (random(24, seed), random(24, seed + 1));
    let ta = Tensor::from_f32(&[2, 3, 4], a.clone()).unwrap();
    let tb = Tensor::from_f32(&[2, 3, 4], b.clone()).unwrap();
    // mul, and in place: the tensor's own storage changes, a clone taken before keeps its values
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    assert_eq!(ta.mul(&tb).unwrap().to_vec_f32().unwrap(), want);
    let mut c = ta.clone();
    c.mul_assign(&tb).unwrap();
    assert_eq!(c.to_vec_f32().unwrap(), want);
    assert_eq!(ta.to_vec_f32().unwrap(), a);
    let mut d = ta.clone();
    d.add_assign(&tb).unwrap();
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(d.to_vec_f32().unwrap(), sum);
    // sum along every axis, also of a permuted (non-contiguous) view
    let at = |i: usize, j: usize, k: usize| f64::from(a[(i * 3 + j) * 4 + k]);
    let s0 = ta.sum_axis(0).unwrap();
    assert_eq!(s0.shape(), &[3, 4]);
    let w0: Vec<f32> = (0..12)
        .map(|x| (at(0, x / 4, x % 4) + at(1, x / 4, x % 4)) as f32)
        .collect();
    assert_eq!(s0.to_vec_f32().unwrap(), w0);
    let s2 = ta.sum_axis(2).unwrap();
    assert_eq!(s2.shape(), &[2, 3]);
    let w2: Vec<f32> = (0..6)
        .map(|x| (0..4).map(|k| at(x / 3, x % 3, k)).sum::<f64>() as f32)
        .collect();
    assert_eq!(s2.to_vec_f32().unwrap(), w2);
    let p = ta.permute(&[2, 0, 1]).unwrap();
    assert!(!p.is_contiguous());
    // permuted [4, 2, 3] summed over its axis 0 (the original axis 2)
    assert_eq!(p.sum_axis(0).unwrap().to_vec_f32().unwrap(), w2);
    assert!(matches!(
        ta.sum_axis(3),
        Err(Error::Axis {
            axis: 3,
            rank: 3,
            ..
        })
    ));
    // bmm: every batch item's product
    let (x, y) = (random(3 * 5 * 7, seed + 2), random(3 * 7 * 2, seed + 3));
    let tx = Tensor::from_f32(&[3, 5, 7], x.clone()).unwrap();
    let ty = Tensor::from_f32(&[3, 7, 2], y.clone()).unwrap();
    let z = tx.bmm(&ty).unwrap();
    assert_eq!(z.shape(), &[3, 5, 2]);
    let got = z.to_vec_f32().unwrap();
    for bi in 0..3 {
        for i in 0..5 {
            for j in 0..2 {
                let r: f64 = (0..7)
                    .map(|k| {
                        f64::from(x[(bi * 5 + i) * 7 + k]) * f64::from(y[(bi * 7 + k) * 2 + j])
                    })
                    .sum();
                let g = f64::from(got[(bi * 5 + i) * 2 + j]);
                assert!(
                    (g - r).abs() <= 1e-5 * r.abs().max(1.0),
                    "{bi} {i} {j}: {g} vs {r}"
                );
            }
        }
    }
    assert!(matches!(
        tx.bmm(&tx),
        Err(Error::ShapeMismatch { op: "bmm", .. })
    ));
    assert!(matches!(
        ta.sum_axis(1).unwrap().bmm(&ty),
        Err(Error::Rank { op: "bmm", .. })
    ));
    assert!(matches!(
        ta.mul(&tx),
        Err(Error::ShapeMismatch { op: "mul", .. })
    ));
}

#[test]
fn scalar_ops_round_once_and_work_in_place() {
    let x = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
    let y = x.mul_scalar(0.5).unwrap().add_scalar(1.0).unwrap();
    assert_eq!(y.to_vec_f32().unwrap(), vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    // in place through a transposed view writes the storage in its own layout
    let mut t = x.transpose(0, 1).unwrap();
    t.mul_scalar_assign(2.0).unwrap();
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(t.to_vec_f32().unwrap(), vec![0.0, 6.0, 2.0, 8.0, 4.0, 10.0]);
    // bf16: 1 + 2^-9 is not representable; the sum rounds once to nearest even (1.0)
    let b = Tensor::from_f32_as(&[1], &[1.0], DType::Bf16).unwrap();
    assert_eq!(
        b.add_scalar(2f64.powi(-9)).unwrap().to_vec_f32().unwrap(),
        vec![1.0]
    );
    let mut a = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
    a.add_assign(&x).unwrap();
    assert_eq!(a.to_vec_f32().unwrap(), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
}

#[test]
fn sum_transpose_select_and_stack() {
    let x = Tensor::from_f32(&[2, 3], iota(6)).unwrap();
    let s = x.sum().unwrap();
    assert!(s.shape().is_empty());
    assert_eq!(s.to_vec_f32().unwrap(), vec![15.0]);
    let t = x.transpose(0, 1).unwrap();
    assert_eq!(
        (t.shape(), t.strides()),
        (&[3usize, 2][..], &[1usize, 3][..])
    );
    assert_eq!(
        t.sum_axis(0).unwrap().to_vec_f32().unwrap(),
        vec![3.0, 12.0]
    );
    assert!(x.transpose(0, 2).is_err());
    let row = x.select(1).unwrap();
    assert_eq!(row.shape(), &[3]);
    assert_eq!(row.to_vec_f32().unwrap(), vec![3.0, 4.0, 5.0]);
    assert!(x.select(2).is_err());
    let st = Tensor::stack(&[row.clone(), x.select(0).unwrap()]).unwrap();
    assert_eq!(st.shape(), &[2, 3]);
    assert_eq!(st.to_vec_f32().unwrap(), vec![3.0, 4.0, 5.0, 0.0, 1.0, 2.0]);
    assert!(Tensor::stack(&[]).is_err());
    assert!(Tensor::stack(&[row, x.clone()]).is_err());
}

#[test]
fn random_on_the_cpu_is_seeded_and_distributed() {
    let devices = Devices::cpu_only();
    let seed = fresh_seed();
    for dtype in [DType::F32, DType::F64, DType::Bf16] {
        let n = Tensor::random(
            &[256, 256],
            dtype,
            Device::Cpu,
            &devices,
            seed,
            Distribution::Normal,
        )
        .unwrap();
        let v = n.to_vec_f64().unwrap();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{dtype}: {mean} {var} (seed {seed})"
        );
        let again = Tensor::random(
            &[256, 256],
            dtype,
            Device::Cpu,
            &devices,
            seed,
            Distribution::Normal,
        )
        .unwrap();
        assert_eq!(again.to_bytes().unwrap(), n.to_bytes().unwrap());
        let u = Tensor::random(
            &[4096],
            dtype,
            Device::Cpu,
            &devices,
            seed,
            Distribution::Uniform,
        )
        .unwrap();
        assert!(u
            .to_vec_f64()
            .unwrap()
            .iter()
            .all(|&x| (-1.0..=1.0).contains(&x)));
    }
    // a GPU from a registry without CUDA is a typed error, not a panic
    assert!(matches!(
        Tensor::random(
            &[2],
            DType::F32,
            Device::Cuda(0),
            &devices,
            1,
            Distribution::Normal
        ),
        Err(Error::NoGpu { .. })
    ));
}

#[test]
fn fp8_is_refused_as_a_tensor_type() {
    let e = Tensor::zeros(&[2, 2], DType::F8E4M3).unwrap_err();
    assert!(e.to_string().contains("matmul input type only"), "{e}");
    assert!(Tensor::from_f32_as(&[1], &[1.0], DType::F8E4M3).is_err());
}
