//! Property tests of the ONNX importer on bad models: arbitrary bytes, the fixtures cut short,
//! with bytes overwritten, or with one field of one node, initializer or input changed. Whatever
//! the bytes, an import returns (no panic, no allocation far beyond the model's size); an error
//! is bad input (exit code 2) whose message names the model; a model that imports is optimized
//! and, when small, run, and neither panics.
//!
//! The case counts keep each property to a few seconds in a debug build on a 2-core machine;
//! `PROPTEST_CASES=20000` runs a longer session. Failures are not persisted: a failing input
//! found here becomes a unit test of the importer.

mod common;

use common::{config, largest_allocation, Alloc};
use gpukit_models::graph::{forward_cpu, passes, Array, DType, Data, Graph};
use gpukit_models::onnx::proto::{AttributeProto, ModelProto};
use gpukit_models::onnx::{fixtures, import_bytes, ImportOptions, SUPPORTED_OPS};
use gpukit_models::Error;
use gpukit_types::{ErrorKind, HasKind};
use proptest::prelude::*;
use prost::Message;
use std::sync::OnceLock;

#[global_allocator]
static ALLOC: Alloc = Alloc;

/// The fixtures, decoded and encoded, weights from a fixed seed.
fn fixture_models() -> &'static [(ModelProto, Vec<u8>)] {
    static MODELS: OnceLock<Vec<(ModelProto, Vec<u8>)>> = OnceLock::new();
    MODELS.get_or_init(|| {
        // every fixture, and the dilated, unevenly padded one
        fixtures::all(7)
            .into_iter()
            .map(|f| f.model)
            .chain([fixtures::atrous(7)])
            .map(|model| {
                let bytes = model.encode_to_vec();
                (model, bytes)
            })
            .collect()
    })
}

/// The most elements of all values together for which an imported graph is also run.
const RUN_ELEMENTS: usize = 1 << 22;

/// Imports `bytes` and checks the outcome (see the module's doc). Returns the graph, or the
/// error's message.
fn check_import(bytes: &[u8]) -> Result<Graph, String> {
    let options = ImportOptions {
        batch: Some(2),
        dims: Vec::new(),
    };
    let (outcome, largest) = largest_allocation(|| import_bytes(bytes, &options));
    let limit = bytes.len().saturating_mul(4) + (1 << 20);
    assert!(
        largest <= limit,
        "an allocation of {largest} bytes for a model of {}",
        bytes.len()
    );
    match outcome {
        Ok(mut g) => {
            let _ = passes::optimize(&mut g);
            let total = g
                .values
                .iter()
                .try_fold(0usize, |a, v| a.checked_add(v.shape.iter().product()));
            if total.is_some_and(|t| t <= RUN_ELEMENTS) {
                let inputs: Vec<Array> = g
                    .inputs
                    .iter()
                    .map(|&i| {
                        let v = &g.values[i];
                        let count = v.shape.iter().product();
                        let data = match v.dtype {
                            DType::F32 => Data::F32(vec![0.5; count]),
                            DType::I64 => Data::I64(vec![0; count]),
                        };
                        Array {
                            shape: v.shape.clone(),
                            data,
                        }
                    })
                    .collect();
                let _ = forward_cpu(&g, &inputs);
            }
            Ok(g)
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(matches!(e, Error::Onnx(_)), "not an ONNX error: {msg}");
            assert_eq!(e.kind(), ErrorKind::BadInput, "{msg}");
            let problem = msg
                .strip_prefix("ONNX model <bytes>: ")
                .unwrap_or_else(|| panic!("the message does not name the model: {msg}"));
            assert!(problem.len() > 5, "{msg}");
            Err(msg)
        }
    }
}

/// One change to one field of a decoded model.
#[derive(Debug, Clone)]
enum Mutation {
    /// An attribute's int (or one of its ints) set to a value.
    AttrInt {
        node: usize,
        attr: usize,
        at: usize,
        value: i64,
    },
    /// An attribute dropped.
    DropAttr {
        node: usize,
        attr: usize,
    },
    /// A node's operator replaced.
    Op {
        node: usize,
        op: String,
    },
    /// A node input dropped, or renamed to another value of the graph.
    Input {
        node: usize,
        input: usize,
        to: Option<usize>,
    },
    /// An initializer's dimension, data type or raw data length changed.
    InitDim {
        init: usize,
        at: usize,
        value: i64,
    },
    InitType {
        init: usize,
        data_type: i32,
    },
    InitRaw {
        init: usize,
        len: usize,
    },
    /// The graph input's dimension set (a number, or made symbolic).
    InputDim {
        at: usize,
        value: Option<i64>,
    },
    /// The opset version set.
    Opset(i64),
}

fn interesting_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => -3i64..8,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => Just(1i64 << 31),
        1 => Just(1i64 << 40),
        1 => any::<i64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let ops: Vec<String> = SUPPORTED_OPS
        .iter()
        .map(|s| s.to_string())
        .chain(["Softmax".to_string(), String::new()])
        .collect();
    prop_oneof![
        4 => (any::<usize>(), any::<usize>(), 0usize..4, interesting_int())
            .prop_map(|(node, attr, at, value)| Mutation::AttrInt { node, attr, at, value }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(node, attr)| Mutation::DropAttr { node, attr }),
        2 => (any::<usize>(), prop::sample::select(ops)).prop_map(|(node, op)| Mutation::Op { node, op }),
        2 => (any::<usize>(), any::<usize>(), prop::option::of(any::<usize>()))
            .prop_map(|(node, input, to)| Mutation::Input { node, input, to }),
        2 => (any::<usize>(), 0usize..4, interesting_int())
            .prop_map(|(init, at, value)| Mutation::InitDim { init, at, value }),
        1 => (any::<usize>(), prop::sample::select(vec![0, 1, 2, 6, 7, 10, 11, 16, 99]))
            .prop_map(|(init, data_type)| Mutation::InitType { init, data_type }),
        1 => (any::<usize>(), 0usize..64).prop_map(|(init, len)| Mutation::InitRaw { init, len }),
        1 => (0usize..5, prop::option::of(interesting_int()))
            .prop_map(|(at, value)| Mutation::InputDim { at, value }),
        1 => prop::sample::select(vec![0i64, 1, 12, 13, 20, 25, 26, i64::MAX]).prop_map(Mutation::Opset),
    ]
}

fn pick<T>(v: &mut [T], i: usize) -> Option<&mut T> {
    let n = v.len();
    (n > 0).then(|| &mut v[i % n])
}

fn set_int(a: &mut AttributeProto, at: usize, value: i64) {
    if let Some(slot) = pick(&mut a.ints, at) {
        *slot = value;
    } else {
        a.i = Some(value);
    }
}

/// `m` with the mutation applied (a no-op where its target does not exist).
fn apply(mut m: ModelProto, mutation: &Mutation) -> ModelProto {
    let Some(g) = m.graph.as_mut() else { return m };
    let names: Vec<String> = g
        .initializer
        .iter()
        .map(|t| t.name.clone())
        .chain(g.node.iter().flat_map(|n| n.output.clone()))
        .collect();
    match mutation.clone() {
        Mutation::AttrInt {
            node,
            attr,
            at,
            value,
        } => {
            if let Some(a) = pick(&mut g.node, node).and_then(|n| pick(&mut n.attribute, attr)) {
                set_int(a, at, value);
            }
        }
        Mutation::DropAttr { node, attr } => {
            if let Some(n) = pick(&mut g.node, node) {
                if !n.attribute.is_empty() {
                    let i = attr % n.attribute.len();
                    n.attribute.remove(i);
                }
            }
        }
        Mutation::Op { node, op } => {
            if let Some(n) = pick(&mut g.node, node) {
                n.op_type = op;
            }
        }
        Mutation::Input { node, input, to } => {
            if let Some(n) = pick(&mut g.node, node) {
                if !n.input.is_empty() {
                    let i = input % n.input.len();
                    match to {
                        Some(t) => n.input[i] = names[t % names.len()].clone(),
                        None => {
                            n.input.remove(i);
                        }
                    }
                }
            }
        }
        Mutation::InitDim { init, at, value } => {
            if let Some(d) = pick(&mut g.initializer, init).and_then(|t| pick(&mut t.dims, at)) {
                *d = value;
            }
        }
        Mutation::InitType { init, data_type } => {
            if let Some(t) = pick(&mut g.initializer, init) {
                t.data_type = data_type;
            }
        }
        Mutation::InitRaw { init, len } => {
            if let Some(t) = pick(&mut g.initializer, init) {
                let keep = t.raw_data.len().saturating_sub(len);
                t.raw_data.truncate(keep);
            }
        }
        Mutation::InputDim { at, value } => {
            let dims = g
                .input
                .first_mut()
                .and_then(|i| i.r#type.as_mut())
                .and_then(|t| t.tensor_type.as_mut())
                .and_then(|t| t.shape.as_mut());
            if let Some(d) = dims.and_then(|s| pick(&mut s.dim, at)) {
                d.dim_value = value;
                d.dim_param = value.is_none().then(|| "open".to_string());
            }
        }
        Mutation::Opset(v) => {
            if let Some(o) = m.opset_import.first_mut() {
                o.version = v;
            }
        }
    }
    m
}

proptest! {
    #![proptest_config(config(256, 100_000))]

    #[test]
    fn arbitrary_bytes_are_refused_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = check_import(&bytes);
    }

    #[test]
    fn a_fixture_cut_short_is_an_error(which in 0usize..7, cut in 0.0f64..1.0) {
        let (_, bytes) = &fixture_models()[which];
        let len = ((bytes.len() as f64 * cut) as usize).min(bytes.len() - 1);
        prop_assert!(check_import(&bytes[..len]).is_err());
    }

    #[test]
    fn a_fixture_with_bytes_overwritten_never_panics(
        which in 0usize..7,
        writes in prop::collection::vec((0.0f64..1.0, any::<u8>()), 1..6),
    ) {
        let mut bytes = fixture_models()[which].1.clone();
        for (at, b) in writes {
            let i = ((bytes.len() as f64 * at) as usize).min(bytes.len() - 1);
            bytes[i] = b;
        }
        let _ = check_import(&bytes);
    }

    #[test]
    fn a_fixture_with_one_field_changed_never_panics(which in 0usize..7, mutations in prop::collection::vec(mutation(), 1..3)) {
        let mut m = fixture_models()[which].0.clone();
        for mu in &mutations {
            m = apply(m, mu);
        }
        let _ = check_import(&m.encode_to_vec());
    }
}

#[test]
fn every_fixture_imports_unchanged() {
    for (m, bytes) in fixture_models() {
        let name = &m.graph.as_ref().unwrap().name;
        check_import(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
