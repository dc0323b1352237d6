//! Replays the safetensors corpus: files that broke, or nearly broke, a reader (found by the
//! property tests in `fuzz_safetensors.rs` and by hand), each with the outcome it must keep
//! giving. `tests/corpus/safetensors/EXPECTED` lists every file with "ok SHAPE COUNT" or
//! "err FRAGMENT"; a file in the folder that the list lacks fails the test, so a new finding
//! cannot be dropped in without saying what it should do.

mod common;

use common::{check_read, Alloc};
use gpukit_models::weights::{load_safetensors, load_tensor};
use gpukit_models::ResNet;
use std::collections::BTreeSet;
use std::path::PathBuf;

#[global_allocator]
static ALLOC: Alloc = Alloc;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/safetensors")
}

#[test]
fn every_corpus_file_gives_its_recorded_outcome() {
    let dir = corpus();
    let list = std::fs::read_to_string(dir.join("EXPECTED")).unwrap();
    let mut listed = BTreeSet::new();
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (file, expected) = line.split_once('\t').expect("file<TAB>outcome");
        listed.insert(file.to_string());
        let path = dir.join(file);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        let got = check_read(&path, len, || load_tensor(&path, "input"));
        match (expected.split_once(' ').unwrap(), got) {
            (("ok", want), Ok((shape, data))) => {
                let shape: Vec<String> = shape.iter().map(usize::to_string).collect();
                let got = format!("[{}] {}", shape.join(","), data.len());
                assert_eq!(got, want, "{file}");
            }
            (("err", fragment), Err(msg)) => {
                assert!(msg.contains(fragment), "{file}: {msg:?} lacks {fragment:?}");
            }
            ((want, _), got) => panic!("{file}: expected {want}, got {:?}", got.map(|_| ())),
        }
        // none of these is a model: the model reader refuses each with a message naming it
        let model = check_read(&path, len, || load_safetensors(&path, ResNet::R18, None));
        assert!(model.is_err(), "{file}");
    }
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "EXPECTED")
        .collect();
    assert_eq!(
        present, listed,
        "files in the corpus and lines in EXPECTED differ"
    );
}
