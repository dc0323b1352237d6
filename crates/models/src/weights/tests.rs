//! Tests of loading, saving and the seeded initialisation, each error naming file and key.
#[test]
fn single_tensors_round_trip_and_errors_name_file_and_key() {
    let dir = std::env::temp_dir().join(format!("gpukit-tensors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.safetensors");
    let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    save_tensors(
        &path,
        &[("input", &[2, 3, 2, 2], &data), ("b", &[1], &[7.0])],
    )
    .unwrap();
    let (shape, back) = load_tensor(&path, "input").unwrap();
    assert_eq!((shape, back), (vec![2, 3, 2, 2], data.clone()));
    let e = load_tensor(&path, "logits").unwrap_err().to_string();
    assert!(
        e.contains("logits") && e.contains("t.safetensors") && e.contains("input"),
        "{e}"
    );
    let e = save_tensors(&path, &[("x", &[5], &data)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("24 values"), "{e}");
    std::fs::write(&path, b"short").unwrap();
    let e = load_tensor(&path, "input").unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
use super::*;
use crate::error::Error;
use std::path::PathBuf;
use std::sync::OnceLock;

/// A file under the temp dir, deleted when the test ends (pass or fail).
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!(
            "gpukit-weights-{}-{tag}.safetensors",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One R18 dict shared by the tests: building it once keeps the suite fast.
fn r18() -> &'static StateDict {
    static DICT: OnceLock<StateDict> = OnceLock::new();
    DICT.get_or_init(|| seeded_init(ResNet::R18, 10, 7, true))
}

/// A tensor as raw file bytes, so tests can write dtypes and shapes `save` never would.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Raw {
    fn f32(shape: &[usize], data: &[f32]) -> Self {
        Raw {
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            bytes: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

fn raw_dict(dict: &StateDict) -> BTreeMap<String, Raw> {
    dict.params
        .iter()
        .map(|(k, p)| (k.clone(), Raw::f32(&p.shape, &p.data)))
        .collect()
}

fn write_raw(raw: &BTreeMap<String, Raw>, path: &Path) {
    let views: Vec<(&str, TensorView<'_>)> = raw
        .iter()
        .map(|(k, r)| {
            (
                k.as_str(),
                TensorView::new(r.dtype, r.shape.clone(), &r.bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Writes R18 with `edit` applied and returns the loader's error message.
fn load_error(tag: &str, edit: impl FnOnce(&mut BTreeMap<String, Raw>)) -> String {
    let file = TempFile::new(tag);
    let mut raw = raw_dict(r18());
    edit(&mut raw);
    write_raw(&raw, &file.0);
    let err = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
    err.to_string()
}

fn std_dev(v: &[f32]) -> f64 {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    (v.iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt()
}

#[test]
fn seeded_init_is_deterministic_and_has_the_state_dict_keys() {
    let a = seeded_init(ResNet::R18, 10, 7, true);
    assert_eq!(&a, r18());
    let b = seeded_init(ResNet::R18, 10, 8, true);
    for (key, p) in &a.params {
        let q = &b.params[key];
        assert_eq!(p.shape, q.shape);
        // constant-free keys must differ with the seed
        assert_ne!(p.data, q.data, "{key} did not change with the seed");
    }
    let specs = ResNet::R18.state_dict(10);
    assert_eq!(a.params.len(), specs.len());
    for spec in &specs {
        let p = a.get(&spec.name).unwrap();
        assert_eq!(p.shape, spec.shape, "{}", spec.name);
        assert_eq!(p.data.len(), spec.shape.iter().product::<usize>());
    }
    let values: usize = specs
        .iter()
        .map(|s| s.shape.iter().product::<usize>())
        .sum();
    assert_eq!(a.bytes(), 4 * values);
    // a key's stream depends only on the seed and its name
    let c = seeded_init(ResNet::R18, 1000, 7, true);
    assert_eq!(c.get("conv1.weight"), a.get("conv1.weight"));
}

#[test]
fn seeded_init_uses_torchvisions_scales() {
    let d = r18();
    // layer4.0.conv2: fan_out = 512 * 3 * 3
    let w = &d.get("layer4.0.conv2.weight").unwrap().data;
    let want = (2.0f64 / 4608.0).sqrt();
    let got = std_dev(w);
    assert!((got / want - 1.0).abs() < 0.1, "std {got}, want {want}");
    let bound = 1.0 / 512f32.sqrt();
    for key in ["fc.weight", "fc.bias"] {
        let v = &d.get(key).unwrap().data;
        assert!(v.iter().all(|x| x.abs() <= bound), "{key}");
        assert!(v.iter().any(|x| x.abs() > bound / 2.0), "{key}");
    }
    for key in ["bn1.weight", "layer3.1.bn2.running_var"] {
        let v = &d.get(key).unwrap().data;
        assert!(v.iter().all(|x| (0.5..=1.5).contains(x)), "{key}");
        assert!(v.iter().any(|&x| x != 1.0), "{key}");
    }
    let mean = &d.get("layer2.0.downsample.1.running_mean").unwrap().data;
    let s = std_dev(mean);
    assert!((0.07..0.13).contains(&s), "running_mean std {s}");

    let plain = seeded_init(ResNet::R50, 1000, 7, false);
    for (key, p) in &plain.params {
        let want = match key.rsplit('.').next().unwrap() {
            _ if key.starts_with("fc.") || p.shape.len() == 4 => continue,
            "weight" | "running_var" => 1.0,
            _ => 0.0,
        };
        assert!(p.data.iter().all(|&x| x == want), "{key}");
    }
}

#[test]
fn seeded_values_are_pinned() {
    // the values themselves, so a change to the generator shows up as a failing test
    let w = &seeded_init(ResNet::R18, 10, 0, false).params["conv1.weight"].data;
    let bits: Vec<u32> = w[..4].iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, PINNED, "{:?}", &w[..4]);
}

// computed once from ChaCha8 (rand_chacha 0.9) and libm: a change here changes every seeded
// model, so make it on purpose only
const PINNED: [u32; 4] = [994182782, 3149078376, 1024087109, 1013127582];

#[test]
fn save_then_load_round_trips() {
    let file = TempFile::new("roundtrip");
    save_safetensors(r18(), &file.0).unwrap();
    let inferred = load_safetensors(&file.0, ResNet::R18, None).unwrap();
    assert_eq!(inferred.num_classes, 10);
    assert_eq!(&inferred, r18());
    let given = load_safetensors(&file.0, ResNet::R18, Some(10)).unwrap();
    assert_eq!(&given, r18());
    // overwriting goes through the temp file too and leaves none behind
    save_safetensors(&seeded_init(ResNet::R18, 10, 9, false), &file.0).unwrap();
    let again = load_safetensors(&file.0, ResNet::R18, None).unwrap();
    assert_eq!(again, seeded_init(ResNet::R18, 10, 9, false));
    let prefix = format!(
        ".{}.{}.",
        file.0.file_name().unwrap().to_string_lossy(),
        std::process::id()
    );
    let leftovers = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn save_reports_bad_counts_and_unwritable_paths() {
    let mut dict = seeded_init(ResNet::R18, 10, 1, false);
    dict.params.get_mut("fc.bias").unwrap().data.pop();
    let file = TempFile::new("badcount");
    let e = save_safetensors(&dict, &file.0).unwrap_err().to_string();
    assert!(
        e.contains("key fc.bias has 9 values, but shape [10] needs 10"),
        "{e}"
    );
    assert!(!file.0.exists());

    let dir = std::env::temp_dir().join(format!("gpukit-weights-{}-absent", std::process::id()));
    let e = save_safetensors(r18(), &dir.join("x.safetensors")).unwrap_err();
    assert!(
        matches!(e, Error::Weights(WeightsError::Write { .. })),
        "{e}"
    );
    assert!(
        e.to_string().contains("x.safetensors: cannot be written"),
        "{e}"
    );
}

#[test]
fn load_reports_a_missing_key() {
    let e = load_error("missing", |raw| {
        raw.remove("layer3.1.bn1.running_var");
    });
    assert!(e.ends_with(": missing key layer3.1.bn1.running_var"), "{e}");
    assert!(e.starts_with("weights file "), "{e}");
    let e = load_error("missingfc", |raw| {
        raw.remove("fc.weight");
    });
    assert!(e.ends_with(": missing key fc.weight"), "{e}");
}

#[test]
fn load_reports_an_unexpected_key() {
    let e = load_error("extra", |raw| {
        raw.insert("fc2.weight".into(), Raw::f32(&[2], &[1.0, 2.0]));
    });
    assert!(
        e.ends_with(": unexpected key fc2.weight (is this a resnet18 state_dict?)"),
        "{e}"
    );
    // a counter beside a batch norm the model lacks betrays another architecture
    let e = load_error("extracounter", |raw| {
        raw.insert(
            "layer1.0.bn3.num_batches_tracked".into(),
            Raw {
                dtype: Dtype::I64,
                shape: vec![],
                bytes: 0i64.to_le_bytes().to_vec(),
            },
        );
    });
    assert!(
        e.contains("unexpected key layer1.0.bn3.num_batches_tracked"),
        "{e}"
    );
}

#[test]
fn load_reports_a_wrong_shape() {
    let e = load_error("shape", |raw| {
        raw.insert(
            "conv1.weight".into(),
            Raw::f32(&[64, 3, 3, 3], &[0.5; 64 * 27]),
        );
    });
    assert!(
        e.ends_with(": key conv1.weight has shape [64, 3, 3, 3], resnet18 expects [64, 3, 7, 7]"),
        "{e}"
    );
    let e = load_error("shapefc", |raw| {
        raw.insert("fc.weight".into(), Raw::f32(&[5120], &[0.5; 5120]));
    });
    assert!(
        e.ends_with(": key fc.weight has shape [5120], resnet18 expects [classes, 512]"),
        "{e}"
    );
}

#[test]
fn load_checks_the_class_count() {
    let file = TempFile::new("classes");
    save_safetensors(r18(), &file.0).unwrap();
    let e = load_safetensors(&file.0, ResNet::R18, Some(1000))
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("key fc.weight has shape [10, 512], resnet18 expects [1000, 512]"),
        "{e}"
    );
    // a resnet18 file read as resnet50: the first key it lacks is reported
    let e = load_safetensors(&file.0, ResNet::R50, None)
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("missing key layer1.0.conv3.weight"), "{e}");
    let e = load_safetensors(&file.0, ResNet::R18, Some(0)).unwrap_err();
    assert!(
        matches!(e, Error::Weights(WeightsError::NoClasses { .. })),
        "{e}"
    );
}

#[test]
fn load_reports_a_wrong_dtype() {
    let e = load_error("dtype", |raw| {
        raw.insert(
            "fc.weight".into(),
            Raw {
                dtype: Dtype::I32,
                shape: vec![10, 512],
                bytes: vec![0; 4 * 5120],
            },
        );
    });
    assert!(
        e.ends_with(": key fc.weight has dtype I32; expected F32, F16, BF16 or F64"),
        "{e}"
    );
}

#[test]
fn load_reports_nan_and_inf() {
    let e = load_error("nan", |raw| {
        let r = raw.get_mut("bn1.running_var").unwrap();
        r.bytes[17 * 4..18 * 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    assert!(
        e.ends_with(": key bn1.running_var holds NaN or Inf (first at element 17)"),
        "{e}"
    );
    // an F64 beyond f32's range would be Inf in f32 arithmetic
    let e = load_error("inf", |raw| {
        let mut v = [0.0f64; 10];
        v[3] = 1e300;
        raw.insert(
            "fc.bias".into(),
            Raw {
                dtype: Dtype::F64,
                shape: vec![10],
                bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            },
        );
    });
    assert!(
        e.ends_with(": key fc.bias holds NaN or Inf (first at element 3)"),
        "{e}"
    );
}

#[test]
fn load_reports_a_truncated_file() {
    let file = TempFile::new("truncated");
    save_safetensors(r18(), &file.0).unwrap();
    let bytes = std::fs::read(&file.0).unwrap();
    std::fs::write(&file.0, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
    assert!(
        matches!(e, Error::Weights(WeightsError::Format { .. })),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("truncated.safetensors: is not a valid safetensors file: "),
        "{msg}"
    );
}

#[test]
fn load_reports_a_file_that_is_not_safetensors() {
    let file = TempFile::new("notst");
    std::fs::write(
        &file.0,
        b"PK\x03\x04 this is a torch zip archive, not safetensors",
    )
    .unwrap();
    let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
    assert!(
        matches!(e, Error::Weights(WeightsError::Format { .. })),
        "{e}"
    );
    std::fs::write(&file.0, b"").unwrap();
    let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
    assert!(
        e.to_string().contains("is not a valid safetensors file"),
        "{e}"
    );
}

#[test]
fn load_reports_a_path_that_does_not_exist() {
    let file = TempFile::new("absent");
    let e = load_safetensors(&file.0, ResNet::R18, None).unwrap_err();
    assert!(
        matches!(e, Error::Weights(WeightsError::Read { .. })),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("absent.safetensors: cannot be read: "),
        "{msg}"
    );
}

#[test]
fn load_converts_f16_bf16_and_f64() {
    let file = TempFile::new("halves");
    let mut raw = raw_dict(r18());
    let conv1 = &r18().get("conv1.weight").unwrap().data;
    raw.insert(
        "conv1.weight".into(),
        Raw {
            dtype: Dtype::F16,
            shape: vec![64, 3, 7, 7],
            bytes: conv1
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
        },
    );
    let bn1: Vec<f32> = (0..64).map(|i| 0.5 + i as f32 / 64.0).collect();
    raw.insert(
        "bn1.weight".into(),
        Raw {
            dtype: Dtype::BF16,
            shape: vec![64],
            bytes: bn1
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
        },
    );
    let fc_bias: Vec<f64> = (0..10).map(|i| 0.1 * f64::from(i) - 0.45).collect();
    raw.insert(
        "fc.bias".into(),
        Raw {
            dtype: Dtype::F64,
            shape: vec![10],
            bytes: fc_bias.iter().flat_map(|x| x.to_le_bytes()).collect(),
        },
    );
    write_raw(&raw, &file.0);
    let d = load_safetensors(&file.0, ResNet::R18, None).unwrap();

    let got = &d.get("conv1.weight").unwrap().data;
    for (i, (&g, &w)) in got.iter().zip(conv1).enumerate() {
        assert_eq!(g, half::f16::from_f32(w).to_f32(), "conv1.weight[{i}]");
        assert!(
            (g - w).abs() <= w.abs() / 1024.0 + 1e-7,
            "conv1.weight[{i}]"
        );
    }
    let got = &d.get("bn1.weight").unwrap().data;
    // multiples of 1/64 between 0.5 and 1.5 fit bf16's 8 significant bits exactly
    assert_eq!(got, &bn1);
    let got = &d.get("fc.bias").unwrap().data;
    assert_eq!(got[0], -0.45f32);
    assert_eq!(got[9], (0.1 * 9.0 - 0.45) as f32);
    assert_eq!(got.len(), 10);
    assert_eq!(d.get("fc.weight"), r18().get("fc.weight"));
}

#[test]
fn load_ignores_num_batches_tracked() {
    let file = TempFile::new("counters");
    let mut raw = raw_dict(r18());
    let bns: Vec<String> = raw
        .keys()
        .filter_map(|k| k.strip_suffix(".running_mean").map(str::to_string))
        .collect();
    assert!(bns.len() > 10);
    for bn in bns {
        raw.insert(
            format!("{bn}.num_batches_tracked"),
            Raw {
                dtype: Dtype::I64,
                shape: vec![],
                bytes: 1234i64.to_le_bytes().to_vec(),
            },
        );
    }
    write_raw(&raw, &file.0);
    let d = load_safetensors(&file.0, ResNet::R18, None).unwrap();
    assert_eq!(&d, r18());
}
