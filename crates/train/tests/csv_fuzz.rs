//! Fuzzing the CSV loader: arbitrary bytes and near-valid tables (odd headers, text, empty
//! fields, NaN, huge exponents, quotes, extra or missing fields, bytes that are not UTF-8)
//! never make it panic; every error names the file, and every data set it returns is whole.
//! Well-formed tables of finite values load exactly.
//!
//! 500 cases a property unless PROPTEST_CASES says otherwise; failures are not persisted
//! (the shrunk case is in the test's output).

use gpukit_train::data::{load, Dataset, Targets, Task};
use proptest::prelude::*;
use proptest::sample::Index;

/// The file every case is written to: its name must appear in every error.
const NAME: &str = "fuzz-input.csv";

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Loads `bytes` from a fresh file named [`NAME`].
fn load_bytes(bytes: &[u8], task: Task) -> gpukit_train::Result<Dataset> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(NAME);
    std::fs::write(&path, bytes).expect("the input file is written");
    load(&path, task)
}

/// An error names the file; a data set is consistent with itself and with `task`.
fn check(bytes: &[u8], task: Task) -> Result<(), TestCaseError> {
    match load_bytes(bytes, task) {
        Err(e) => {
            let text = e.to_string();
            prop_assert!(text.contains(NAME), "{task:?}: {text}");
        }
        Ok(d) => {
            prop_assert!(!d.is_empty() && d.features > 0);
            prop_assert_eq!(d.x.len(), d.len() * d.features);
            prop_assert!(d.x.iter().all(|v| v.is_finite()));
            match (&d.y, task) {
                (Targets::Values { width, data }, Task::Regression) => {
                    prop_assert_eq!(*width, 1);
                    prop_assert_eq!(data.len(), d.len());
                    prop_assert!(data.iter().all(|v| v.is_finite()));
                }
                (Targets::Classes { classes, data }, Task::Classification) => {
                    prop_assert!(*classes >= 2);
                    prop_assert_eq!(data.len(), d.len());
                    prop_assert!(data.iter().all(|&c| (c as usize) < *classes));
                }
                (y, _) => prop_assert!(false, "{task:?} gave {y:?}"),
            }
        }
    }
    Ok(())
}

/// Fields that have tripped CSV readers: special values, out-of-range numbers, quotes.
const ODD_FIELDS: &[&str] = &[
    "",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "1e99999",
    "-1e99999",
    "1e39",
    "1e-50",
    "-1",
    "-0",
    "1.5",
    "0",
    "1",
    "2",
    "4294967296",
    "1e6",
    " 3 ",
    "\"3\"",
    "\"a,b\"",
    "\"\"",
    "\"",
    "a\"b",
    "0x10",
    "1_000",
    "+7",
    ".5",
    "5.",
    "e5",
    "--1",
];

/// A number as a CSV writer puts it (any f32, NaN and infinities included, or a class index).
fn number() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<f32>().prop_map(|v| v.to_string().into_bytes()),
        (0u32..6).prop_map(|v| v.to_string().into_bytes()),
    ]
}

/// A field a careless user (or a broken writer) might put in place of a number.
fn odd_field() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::sample::select(ODD_FIELDS).prop_map(|s| s.as_bytes().to_vec()),
        1 => "[a-z ]{1,5}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 1..4),
        1 => Just(b"\xff\xfe1".to_vec()),
    ]
}

/// A header of 0 to 5 names (mostly 2 or more), some odd.
fn header() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let name = prop_oneof![
        4 => "[a-z][a-z0-9_]{0,6}".prop_map(String::into_bytes),
        1 => Just(Vec::new()),
        1 => Just(b"\"quoted, name\"".to_vec()),
        1 => Just(b"\xe9t\xe9".to_vec()),
        1 => odd_field(),
    ];
    let width = prop_oneof![1 => 0usize..2, 6 => 2usize..6];
    width.prop_flat_map(move |w| proptest::collection::vec(name.clone(), w))
}

/// A change to one row of a table.
#[derive(Debug, Clone)]
enum Edit {
    Replace(Vec<u8>),
    Drop,
    Add(Vec<u8>),
}

fn edit() -> impl Strategy<Value = (Index, Index, Edit)> {
    let edit = prop_oneof![
        4 => odd_field().prop_map(Edit::Replace),
        1 => Just(Edit::Drop),
        1 => number().prop_map(Edit::Add),
    ];
    (any::<Index>(), any::<Index>(), edit)
}

/// A table near a valid CSV: a header, rows of numbers as wide as it, then up to 3 edits
/// (an odd field, a field dropped or added), joined by \n or \r\n, maybe with blank lines.
fn near_valid_csv() -> impl Strategy<Value = Vec<u8>> {
    (header(), 0usize..6)
        .prop_flat_map(|(header, rows)| {
            let width = header.len();
            let table = proptest::collection::vec(proptest::collection::vec(number(), width), rows);
            let edits = proptest::collection::vec(edit(), 0..4);
            (Just(header), table, edits, any::<bool>(), any::<bool>())
        })
        .prop_map(|(header, mut table, edits, crlf, blank_line)| {
            for (row, column, edit) in edits {
                if table.is_empty() {
                    break;
                }
                let r = row.index(table.len());
                let row = &mut table[r];
                match edit {
                    Edit::Replace(f) if !row.is_empty() => {
                        let c = column.index(row.len());
                        row[c] = f;
                    }
                    Edit::Drop => drop(row.pop()),
                    Edit::Add(f) | Edit::Replace(f) => row.push(f),
                }
            }
            let end: &[u8] = if crlf { b"\r\n" } else { b"\n" };
            let mut out = header.join(&b","[..]);
            for row in table {
                out.extend_from_slice(end);
                if blank_line {
                    out.extend_from_slice(end);
                }
                out.extend(row.join(&b","[..]));
            }
            out
        })
}

/// A well-formed table: a header of `features + 1` names, then rows of finite values with a
/// class index last. (rows, values) as the loader should read them.
fn valid_csv() -> impl Strategy<Value = (usize, Vec<Vec<f32>>, Vec<u32>)> {
    (1usize..5, 1usize..10).prop_flat_map(|(features, rows)| {
        let value = any::<f32>().prop_filter("finite", |v| v.is_finite());
        (
            Just(features),
            proptest::collection::vec(proptest::collection::vec(value, features), rows),
            proptest::collection::vec(0u32..7, rows),
        )
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes, Task::Regression)?;
        check(&bytes, Task::Classification)?;
    }

    #[test]
    fn near_valid_tables_never_panic(bytes in near_valid_csv()) {
        check(&bytes, Task::Regression)?;
        check(&bytes, Task::Classification)?;
    }

    #[test]
    fn valid_tables_load_exactly((features, x, labels) in valid_csv()) {
        let mut text: String = (0..features).map(|i| format!("f{i},")).collect();
        text.push_str("label\n");
        for (row, label) in x.iter().zip(&labels) {
            for v in row {
                text.push_str(&format!("{v},"));
            }
            text.push_str(&format!("{label}\n"));
        }
        let want_x: Vec<f32> = x.concat();
        let d = load_bytes(text.as_bytes(), Task::Classification).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!((d.features, &d.x), (features, &want_x));
        let classes = labels.iter().max().map_or(2, |&m| (m as usize + 1).max(2));
        prop_assert_eq!(d.y, Targets::Classes { classes, data: labels.clone() });
        let d = load_bytes(text.as_bytes(), Task::Regression).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let values: Vec<f32> = labels.iter().map(|&c| c as f32).collect();
        prop_assert_eq!(d.x, want_x);
        prop_assert_eq!(d.y, Targets::Values { width: 1, data: values });
    }
}
