//! Property tests of the two safetensors readers (`load_safetensors`, `load_tensor`) on bad
//! files: arbitrary bytes, well-formed files with broken header fields, valid files cut short
//! or with flipped bytes, and a full ResNet-18 with one tensor replaced. Whatever the bytes, a
//! call returns (no panic, no abort, no allocation far beyond the file's size), and an error is
//! bad input (exit code 2) whose message names the file.
//!
//! The case counts keep each property near 10 s in a debug build on a 2-core machine;
//! `PROPTEST_CASES=20000` runs a longer session (the R18 property is capped, see there).
//! Failures are not persisted: a failing input found here goes to `tests/corpus/safetensors/`,
//! replayed by `safetensors_corpus.rs`.

mod common;

use common::{check_read, config, Alloc};
use gpukit_models::weights::{load_safetensors, load_tensor, save_tensors, seeded_init};
use gpukit_models::ResNet;
use proptest::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;
use std::sync::OnceLock;

#[global_allocator]
static ALLOC: Alloc = Alloc;

/// Writes `bytes` to a fresh temp file and runs both readers on it, checking every outcome.
fn run_readers(bytes: &[u8]) -> Outcomes {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fuzzed.safetensors");
    std::fs::write(&path, bytes).unwrap();
    run_readers_at(&path, bytes.len())
}

/// What the two readers said about one file, for properties that want more than no panic.
struct Outcomes {
    tensor: Result<(Vec<usize>, Vec<f32>), String>,
    model: Result<(), String>,
}

fn run_readers_at(path: &Path, file_len: usize) -> Outcomes {
    let tensor = check_read(path, file_len, || load_tensor(path, "input"));
    let tensor = tensor.map(|(shape, data)| {
        // the library checks offsets against shape and dtype; a value count that disagrees
        // with the shape would shift every image of the batch
        let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        assert_eq!(count, Some(data.len()), "shape {shape:?}");
        (shape, data)
    });
    let model = check_read(path, file_len, || {
        load_safetensors(path, ResNet::R18, None).map(|_| ())
    });
    Outcomes { tensor, model }
}

/// A dimension as written in the header: a number (often absurd) or raw JSON text that is not
/// a valid dimension.
fn dim() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u64..5).prop_map(|d| d.to_string()),
        2 => Just("32".to_string()),
        1 => Just((1u64 << 31).to_string()),
        1 => Just(((1u64 << 32) + 1).to_string()),
        1 => Just(10u64.pow(15).to_string()),
        1 => Just(u64::MAX.to_string()),
        1 => Just((u64::MAX / 3).to_string()),
        1 => any::<u64>().prop_map(|d| d.to_string()),
        1 => prop::sample::select(vec![
            "-1", "1.5", "1e30", "18446744073709551616", "\"3\"", "null", "[]", "true",
        ])
        .prop_map(str::to_string),
    ]
}

/// Dtype strings: the four the readers convert, the others safetensors knows (sub-byte ones
/// included), and strings it does not.
const DTYPES: [&str; 16] = [
    "F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3",
    "C64", "f32", "", "F32 ",
];

/// Bits per element of a dtype string, as safetensors 0.7 counts them (None: not one it reads).
fn bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "F16" | "BF16" | "I16" | "U16" => 16,
        "F32" | "I32" | "U32" => 32,
        "F64" | "I64" | "U64" | "C64" => 64,
        _ => return None,
    })
}

/// How a tensor's `data_offsets` are written.
#[derive(Debug, Clone)]
enum Offsets {
    /// Right after the previous tensor, as long as shape and dtype need (a valid header).
    Fit,
    /// Begin and end swapped.
    Reversed,
    /// Begin and end moved by these amounts (overlaps, gaps, past the end).
    Shifted(i64, i64),
    /// Raw JSON text.
    Raw(&'static str),
}

fn offsets() -> impl Strategy<Value = Offsets> {
    prop_oneof![
        8 => Just(Offsets::Fit),
        1 => Just(Offsets::Reversed),
        2 => (-6i64..6, -6i64..6).prop_map(|(a, b)| Offsets::Shifted(a, b)),
        1 => prop::sample::select(vec![
            "[0]", "[0,4,8]", "[-1,4]", "[0,18446744073709551615]",
            "[18446744073709551615,0]", "\"0,4\"", "null", "[1.5,4]",
        ])
        .prop_map(Offsets::Raw),
    ]
}

/// One header entry.
#[derive(Debug, Clone)]
struct Entry {
    name: &'static str,
    dtype: &'static str,
    shape: Vec<String>,
    offsets: Offsets,
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        prop::sample::select(vec![
            "input",
            "input",
            "fc.weight",
            "fc.bias",
            "conv1.weight",
            "logits",
            "x",
            "",
            "in\\u0000put",
            "ïnput",
            "in\\put",
        ]),
        prop::sample::select(DTYPES.to_vec()),
        prop::collection::vec(dim(), 0..5),
        offsets(),
    )
        .prop_map(|(name, dtype, shape, offsets)| Entry {
            name,
            dtype,
            shape,
            offsets,
        })
}

/// How the 8-byte header length is written.
#[derive(Debug, Clone)]
enum HeaderLen {
    Exact,
    Off(i64),
    Value(u64),
}

/// A whole generated file: entries, metadata, padding, the data section and its damage.
#[derive(Debug, Clone)]
struct FileSpec {
    entries: Vec<Entry>,
    metadata: Option<&'static str>,
    header_len: HeaderLen,
    /// Spaces after the JSON (safetensors pads headers to 8 bytes this way).
    padding: usize,
    /// Non-UTF-8 bytes written over the header at this fraction of its length.
    bad_utf8: Option<f64>,
    /// Bytes added to (or removed from) the data section the entries need.
    data_delta: i64,
    /// Values the data section is filled with, over and over (NaN and Inf among them).
    fill: Vec<f32>,
}

fn file_spec() -> impl Strategy<Value = FileSpec> {
    let header_len = prop_oneof![
        8 => Just(HeaderLen::Exact),
        2 => (-9i64..9).prop_map(HeaderLen::Off),
        1 => prop::sample::select(vec![0, 1, 7, 100_000_000, 100_000_001, u64::MAX, 1 << 63])
            .prop_map(HeaderLen::Value),
    ];
    let value = prop_oneof![
        4 => any::<f32>(),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::MIN_POSITIVE / 2.0),
    ];
    (
        prop::collection::vec(entry(), 0..4),
        prop::option::of(prop::sample::select(vec![
            r#"{"format":"pt"}"#,
            r#"{"a":1}"#,
            r#""pt""#,
            "null",
            r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#,
        ])),
        header_len,
        0usize..9,
        prop::option::weighted(0.1, 0.0f64..1.0),
        prop_oneof![6 => Just(0i64), 1 => -9i64..9],
        prop::collection::vec(value, 1..8),
    )
        .prop_map(
            |(entries, metadata, header_len, padding, bad_utf8, data_delta, fill)| FileSpec {
                entries,
                metadata,
                header_len,
                padding,
                bad_utf8,
                data_delta,
                fill,
            },
        )
}

/// Data sections are kept small: a header that asks for more gets this many bytes at most.
const MAX_DATA: u64 = 4096;

/// The bytes of `spec`.
fn build(spec: &FileSpec) -> Vec<u8> {
    let mut parts = Vec::new();
    if let Some(m) = spec.metadata {
        parts.push(format!(r#""__metadata__":{m}"#));
    }
    let mut start = 0u64;
    for e in &spec.entries {
        let count = e
            .shape
            .iter()
            .map(|d| d.parse::<u64>().ok())
            .try_fold(1u64, |acc, d| d.and_then(|d| acc.checked_mul(d)));
        let size = count
            .zip(bits(e.dtype))
            .and_then(|(c, b)| c.checked_mul(b))
            .map(|b| b.div_ceil(8))
            .unwrap_or(4);
        let end = start.saturating_add(size);
        let offsets = match &e.offsets {
            Offsets::Fit => format!("[{start},{end}]"),
            Offsets::Reversed => format!("[{end},{start}]"),
            Offsets::Shifted(a, b) => format!(
                "[{},{}]",
                start.saturating_add_signed(*a),
                end.saturating_add_signed(*b)
            ),
            Offsets::Raw(r) => r.to_string(),
        };
        parts.push(format!(
            r#""{}":{{"dtype":"{}","shape":[{}],"data_offsets":{offsets}}}"#,
            e.name,
            e.dtype,
            e.shape.join(",")
        ));
        start = end;
    }
    let mut header = format!("{{{}}}", parts.join(",")).into_bytes();
    header.resize(header.len() + spec.padding, b' ');
    if let Some(at) = spec.bad_utf8 {
        let i = ((header.len() as f64 * at) as usize).min(header.len() - 1);
        header[i] = 0xff;
    }
    let n = match spec.header_len {
        HeaderLen::Exact => header.len() as u64,
        HeaderLen::Off(d) => (header.len() as u64).saturating_add_signed(d),
        HeaderLen::Value(v) => v,
    };
    let data_len = start
        .min(MAX_DATA)
        .saturating_add_signed(spec.data_delta)
        .min(MAX_DATA) as usize;
    let mut bytes = n.to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    let fill = spec.fill.iter().cycle().flat_map(|v| v.to_le_bytes());
    bytes.extend(fill.take(data_len));
    bytes
}

/// A small valid file of `tensors`, as `save_tensors` writes it.
fn saved(tensors: &[(&str, &[usize], &[f32])]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valid.safetensors");
    save_tensors(&path, tensors).unwrap();
    std::fs::read(&path).unwrap()
}

/// A valid input batch and a second tensor, with `n` images of 3x`h`x`w`.
fn valid_file() -> impl Strategy<Value = Vec<u8>> {
    (0usize..3, 1usize..4, 1usize..4, any::<u64>()).prop_map(|(n, h, w, seed)| {
        let shape = [n, 3, h, w];
        let data: Vec<f32> = (0..n * 3 * h * w)
            .map(|i| (seed.wrapping_mul(i as u64 + 1) % 1000) as f32 / 10.0)
            .collect();
        saved(&[("input", &shape, &data), ("scale", &[2], &[0.5, 2.0])])
    })
}

proptest! {
    #![proptest_config(config(1500, u32::MAX))]

    #[test]
    fn arbitrary_bytes_are_refused_or_read(
        len_prefix in prop::option::of(0u64..600),
        body in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut bytes = len_prefix.map(|n| n.to_le_bytes().to_vec()).unwrap_or_default();
        bytes.extend(body);
        run_readers(&bytes);
    }
}

proptest! {
    #![proptest_config(config(1500, u32::MAX))]

    #[test]
    fn broken_header_fields_are_refused_or_read(spec in file_spec()) {
        let bytes = build(&spec);
        let out = run_readers(&bytes);
        // no file here has the 62 keys of a ResNet-18
        prop_assert!(out.model.is_err());
        if let Ok((shape, data)) = out.tensor {
            // only a header whose every field fits could have been read
            let input = spec.entries.iter().rev().find(|e| e.name == "input").unwrap();
            prop_assert_eq!(shape.len(), input.shape.len());
            prop_assert!(bits(input.dtype).is_some());
            prop_assert!(data.len() as u64 <= MAX_DATA);
        }
    }

    #[test]
    fn valid_files_cut_short_are_refused(bytes in valid_file(), at in 0.0f64..1.0) {
        let cut = (bytes.len() as f64 * at) as usize;
        let out = run_readers(&bytes[..cut]);
        let e = out.tensor.unwrap_err();
        prop_assert!(e.contains("is not a valid safetensors file"), "{}", e);
    }

    #[test]
    fn valid_files_with_flipped_bytes_are_refused_or_read(
        bytes in valid_file(),
        flips in prop::collection::vec((0.0f64..1.0, 1u8..=255), 1..4),
    ) {
        let mut bytes = bytes;
        for (at, x) in flips {
            let i = (bytes.len() as f64 * at) as usize;
            bytes[i] ^= x;
        }
        run_readers(&bytes);
    }
}

/// One tensor as safetensors stores it: name, shape, F32 little-endian bytes.
type RawTensor = (String, Vec<usize>, Vec<u8>);

/// The R18 state dict as safetensors tensors, built once.
fn r18_raw() -> &'static Vec<RawTensor> {
    static RAW: OnceLock<Vec<RawTensor>> = OnceLock::new();
    RAW.get_or_init(|| {
        seeded_init(ResNet::R18, 10, 3, true)
            .params
            .into_iter()
            .map(|(k, p)| {
                let bytes = p.data.iter().flat_map(|v| v.to_le_bytes()).collect();
                (k, p.shape, bytes)
            })
            .collect()
    })
}

/// A replacement for one tensor of a full model: a dtype, a shape near the right one, and
/// values that may hold NaN or Inf at one position.
#[derive(Debug, Clone)]
struct Swap {
    key: usize,
    dtype: Dtype,
    /// Change to one dimension: index and new value (None: the model's own shape).
    dim: Option<(usize, usize)>,
    /// A non-finite value at this fraction of the tensor.
    poison: Option<(f64, f32)>,
}

fn swap() -> impl Strategy<Value = Swap> {
    (
        0usize..62,
        prop::sample::select(vec![
            Dtype::F32,
            Dtype::F16,
            Dtype::BF16,
            Dtype::F64,
            Dtype::I32,
            Dtype::I64,
            Dtype::U8,
        ]),
        prop::option::weighted(0.3, (0usize..4, 0usize..5)),
        prop::option::weighted(
            0.5,
            (
                0.0f64..1.0,
                prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0]),
            ),
        ),
    )
        .prop_map(|(key, dtype, dim, poison)| Swap {
            key,
            dtype,
            dim,
            poison,
        })
}

/// `values` stored as `dtype` (integers as they come, by truncation).
fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    use half::{bf16, f16};
    let mut out = Vec::new();
    for &v in values {
        match dtype {
            Dtype::F32 => out.extend(v.to_le_bytes()),
            Dtype::F16 => out.extend(f16::from_f32(v).to_le_bytes()),
            Dtype::BF16 => out.extend(bf16::from_f32(v).to_le_bytes()),
            Dtype::F64 => out.extend(f64::from(v).to_le_bytes()),
            Dtype::I32 => out.extend((v as i32).to_le_bytes()),
            Dtype::I64 => out.extend((v as i64).to_le_bytes()),
            _ => out.push(v as u8),
        }
    }
    out
}

proptest! {
    // each case writes and reads a 45 MB model: few cases, whatever PROPTEST_CASES says
    #![proptest_config(config(24, 200))]

    #[test]
    fn a_bad_tensor_in_a_full_model_is_named(swap in swap()) {
        let raw = r18_raw();
        let (key, shape, _) = &raw[swap.key % raw.len()];
        let mut new_shape = shape.clone();
        if let Some((i, d)) = swap.dim {
            if let Some(slot) = new_shape.get_mut(i) {
                *slot = d;
            }
        }
        let count: usize = new_shape.iter().product();
        let mut values: Vec<f32> = (0..count).map(|i| (i % 7) as f32 * 0.25).collect();
        let mut poisoned = None;
        if let Some((at, v)) = swap.poison {
            if count > 0 {
                let i = ((count as f64 * at) as usize).min(count - 1);
                values[i] = v;
                poisoned = (!v.is_finite()).then_some(i);
            }
        }
        let new_bytes = encode(&values, swap.dtype);
        let views = raw.iter().map(|(k, s, b)| {
            if k == key {
                (k.as_str(), TensorView::new(swap.dtype, new_shape.clone(), &new_bytes).unwrap())
            } else {
                (k.as_str(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())
            }
        });
        let bytes = safetensors::serialize(views, None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r18.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let got = check_read(&path, bytes.len(), || {
            load_safetensors(&path, ResNet::R18, None).map(|d| d.params[key.as_str()].data.clone())
        });
        let float = matches!(swap.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64);
        let fits = new_shape == *shape;
        // only fc.weight's rows changed: the class count follows them, so fc.bias is wrong
        let rows_only = key == "fc.weight" && !fits && new_shape[1..] == shape[1..];
        let accepted = float && fits && poisoned.is_none();
        match got {
            Ok(data) => {
                prop_assert!(accepted, "accepted {:?}", swap);
                prop_assert_eq!(data, values);
            }
            Err(e) => {
                prop_assert!(!accepted, "refused {:?}: {}", swap, e);
                if rows_only && new_shape[0] == 0 {
                    prop_assert!(e.contains("num_classes is 0"), "{}", e);
                } else if rows_only {
                    prop_assert!(e.contains("key fc.weight ") || e.contains("key fc.bias "), "{}", e);
                } else {
                    prop_assert!(e.contains(&format!("key {key} ")), "{}", e);
                }
                if let Some(i) = poisoned.filter(|_| float && fits) {
                    let want = format!("holds NaN or Inf (first at element {i})");
                    prop_assert!(e.contains(&want), "{}", e);
                }
            }
        }
    }
}
