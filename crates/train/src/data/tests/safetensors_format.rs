//! The safetensors reader and the file formats: every dtype, every fault named.

use super::*;

#[test]
fn unknown_formats_and_missing_files() {
    for name in ["d.txt", "d", "d.json", "d.csv.gz"] {
        let text = file_error(name, b"a,y\n1,2\n", Task::Regression);
        assert!(
            text.contains(".safetensors") && text.contains(".csv"),
            "{text}"
        );
    }
    let (_dir, path) = temp_file("absent.csv");
    match load(&path, Task::Regression) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("absent.csv"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn safetensors_reads_every_float_dtype_and_label_dtype() {
    let x64 = f64_bytes(&[1.0, 2.5, -3.0, 4.0]);
    let y32 = f32_bytes(&[0.5, -1.0]);
    let d = load_bytes(
        "d.safetensors",
        &safetensors_bytes(&[
            ("x", Dtype::F64, &[2, 2], &x64),
            ("y", Dtype::F32, &[2], &y32),
        ]),
        Task::Regression,
    )
    .unwrap();
    assert_eq!((d.features, d.x.clone()), (2, vec![1.0, 2.5, -3.0, 4.0]));
    assert_eq!(
        d.y,
        Targets::Values {
            width: 1,
            data: vec![0.5, -1.0]
        }
    );

    // f16 1.0 = 0x3c00, bf16 1.0 = 0x3f80; x of shape [n] is one feature
    let f16s: Vec<u8> = [0x3c00u16, 0xc000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = [0x3f80u16, 0x4000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let labels: [(Dtype, Vec<u8>); 4] = [
        (Dtype::I64, i64_bytes(&[0, 3])),
        (
            Dtype::I32,
            [0i32, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (Dtype::U8, vec![0, 3]),
        (Dtype::F64, f64_bytes(&[0.0, 3.0])),
    ];
    for (dtype, y) in &labels {
        for (x_dtype, x, want) in [
            (Dtype::F16, &f16s, [1.0, -2.0]),
            (Dtype::BF16, &bf16s, [1.0, 2.0]),
        ] {
            let bytes = safetensors_bytes(&[("x", x_dtype, &[2], x), ("y", *dtype, &[2], y)]);
            let d = load_bytes("d.safetensors", &bytes, Task::Classification).unwrap();
            assert_eq!((d.features, d.x), (1, want.to_vec()), "{dtype}");
            assert_eq!(
                d.y,
                Targets::Classes {
                    classes: 4,
                    data: vec![0, 3]
                },
                "{dtype}"
            );
        }
    }
    // regression targets of width 3, beside other tensors
    let y = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let x = f32_bytes(&[7.0, 8.0]);
    let bytes = safetensors_bytes(&[
        ("x", Dtype::F32, &[2], &x),
        ("y", Dtype::F32, &[2, 3], &y),
        ("z", Dtype::BOOL, &[1], &[1]),
    ]);
    let d = load_bytes("d.safetensors", &bytes, Task::Regression).unwrap();
    assert_eq!((d.outputs(), d.len()), (3, 2));
}

#[test]
fn safetensors_faults_are_named() {
    let r = Task::Regression;
    let c = Task::Classification;
    let st = |tensors: &[(&str, Dtype, &[usize], &[u8])]| safetensors_bytes(tensors);
    let four = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let two = f32_bytes(&[1.0, 2.0]);
    let n = "d.safetensors";

    refused(
        n,
        &st(&[("b", Dtype::F32, &[2], &two), ("a", Dtype::F32, &[2], &two)]),
        r,
        "has no tensor named \"x\" (it has: a, b)",
    );
    refused(
        n,
        &st(&[("x", Dtype::F32, &[2], &two)]),
        r,
        "has no tensor named \"y\" (it has: x)",
    );
    refused(n, &st(&[]), c, "has no tensor named \"x\" (it has none)");
    let many: Vec<(String, Vec<u8>)> = (0..10).map(|i| (format!("t{i}"), two.clone())).collect();
    let many: Vec<(&str, Dtype, &[usize], &[u8])> = many
        .iter()
        .map(|(k, v)| (k.as_str(), Dtype::F32, &[2][..], &v[..]))
        .collect();
    refused(
        n,
        &st(&many),
        r,
        "(it has: t0, t1, t2, t3, t4, t5, t6, t7, and 2 more)",
    );

    let x100 = f32_bytes(&[0.5; 100]);
    let y99 = f32_bytes(&[0.5; 99]);
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[100], &x100),
            ("y", Dtype::F32, &[99], &y99),
        ]),
        r,
        "x has 100 rows but y has 99",
    );
    let x24 = f32_bytes(&[0.5; 24]);
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2, 3, 4], &x24),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x must be [n, features] or [n], not [2, 3, 4]",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[], &two[..4]),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x must be [n, features] or [n], not []",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2, 0], &[]),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x has no features",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[0, 2], &[]),
            ("y", Dtype::F32, &[0], &[]),
        ]),
        r,
        "holds no samples",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::F32, &[2, 0], &[]),
        ]),
        r,
        "y has no values a sample",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::F32, &[1, 2, 1], &two),
        ]),
        r,
        "y must be [n, width] or [n], not [1, 2, 1]",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::I64, &[2, 1], &i64_bytes(&[0, 1])),
        ]),
        c,
        "y must be [n] (one class index a sample), not [2, 1]",
    );

    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::BOOL, &[2], &[0, 1]),
        ]),
        r,
        "y has dtype BOOL; expected F32, F64, F16 or BF16",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::BOOL, &[2], &[0, 1]),
        ]),
        c,
        "y has dtype BOOL; expected class indices as I64, I32, U8",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::I64, &[2], &i64_bytes(&[0, 1])),
        ]),
        r,
        "y has dtype I64; expected F32",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::I64, &[2], &i64_bytes(&[0, 1])),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x has dtype I64; expected F32, F64, F16 or BF16",
    );

    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::I64, &[2], &i64_bytes(&[0, -1])),
        ]),
        c,
        "y[1]: -1 is not a class index (a non-negative integer)",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::I64, &[2], &i64_bytes(&[i64::MAX, 0])),
        ]),
        c,
        "y[0]: 9223372036854775807 is above the largest class index",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::F32, &[2], &f32_bytes(&[2.5, 1.0])),
        ]),
        c,
        "y[0]: 2.5 is not a class index",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::F64, &[2], &f64_bytes(&[1.0, 1.0 + 1e-12])),
        ]),
        c,
        "y[1]: 1.000000000001 is not a class index",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            ("y", Dtype::F32, &[2], &f32_bytes(&[1.0, f32::NAN])),
        ]),
        c,
        "y[1] is NaN",
    );

    let mut x = [0.0f32; 6];
    x[5] = f32::NAN;
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2, 3], &f32_bytes(&x)),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x[1, 2] is NaN",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[4], &four),
            (
                "y",
                Dtype::F32,
                &[4],
                &f32_bytes(&[0.0, 0.0, 0.0, f32::INFINITY]),
            ),
        ]),
        r,
        "y[3] is inf",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[4], &four),
            (
                "y",
                Dtype::F32,
                &[2, 2],
                &f32_bytes(&[0.0, 0.0, 0.0, f32::NEG_INFINITY]),
            ),
        ]),
        r,
        "has 4 rows but y has 2",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F32, &[2], &two),
            (
                "y",
                Dtype::F32,
                &[2, 2],
                &f32_bytes(&[0.0, 0.0, 0.0, f32::NEG_INFINITY]),
            ),
        ]),
        r,
        "y[1, 1] is -inf",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F64, &[2], &f64_bytes(&[1e300, 0.0])),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x[0] is 1e300, beyond f32's range",
    );
    refused(
        n,
        &st(&[
            ("x", Dtype::F64, &[2], &f64_bytes(&[0.0, f64::INFINITY])),
            ("y", Dtype::F32, &[2], &two),
        ]),
        r,
        "x[1] is inf",
    );

    refused(n, b"", r, "not a valid safetensors file");
    refused(
        n,
        b"\xff\xff\xff\xff\xff\xff\xff\xffgarbage",
        c,
        "not a valid safetensors file",
    );
    let mut truncated = st(&[("x", Dtype::F32, &[2], &two), ("y", Dtype::F32, &[2], &two)]);
    truncated.pop();
    refused(n, &truncated, r, "not a valid safetensors file");
}
