//! Bad input, systematically: every command and flag with its edge values (zero, negative, huge,
//! not a number, empty, duplicated, not UTF-8, missing file, a directory for a file, a file for a
//! directory, a malformed file). Each must exit 2 before any work, with a message that names
//! what is wrong, and never panic. Runs on any machine: every case fails on its arguments, before
//! a GPU would be asked for.

mod common;

use common::bin;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::process::Command;

/// One case: the arguments and what the message must contain (every fragment, case-sensitive).
struct Case {
    args: Vec<OsString>,
    says: Vec<&'static str>,
}

fn case(args: &[&str], says: &[&'static str]) -> Case {
    Case {
        args: args.iter().map(OsString::from).collect(),
        says: says.to_vec(),
    }
}

fn with_path(args: &[&str], path: &Path, says: &[&'static str]) -> Case {
    let mut c = case(args, says);
    c.args.push(path.as_os_str().to_owned());
    c
}

/// A safetensors file holding one f32 tensor `name` of `shape` (values from `values`).
fn safetensors(path: &Path, name: &str, shape: &[usize], values: &[f32]) {
    let header = format!(
        "{{\"{name}\":{{\"dtype\":\"F32\",\"shape\":{shape:?},\"data_offsets\":[0,{}]}}}}",
        values.len() * 4
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// A safetensors file with two f32 tensors of the given names and shapes (values 0.5).
fn two_tensors(path: &Path, a: (&str, &[usize]), b: (&str, &[usize])) {
    let len = |s: &[usize]| s.iter().product::<usize>() * 4;
    let header = format!(
        "{{\"{}\":{{\"dtype\":\"F32\",\"shape\":{:?},\"data_offsets\":[0,{}]}},\"{}\":{{\"dtype\":\"F32\",\"shape\":{:?},\"data_offsets\":[{},{}]}}}}",
        a.0,
        a.1,
        len(a.1),
        b.0,
        b.1,
        len(a.1),
        len(a.1) + len(b.1)
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0.5f32.to_le_bytes(), (len(a.1) + len(b.1)) / 4).flatten());
    std::fs::write(path, bytes).unwrap();
}

fn cases(dir: &Path) -> Vec<Case> {
    let missing = dir.join("missing.safetensors");
    let not_safetensors = dir.join("text.safetensors");
    std::fs::write(&not_safetensors, b"this is not a safetensors file").unwrap();
    let nan_input = dir.join("nan.safetensors");
    let mut x = vec![0.25f32; 3 * 32 * 32];
    x[100] = f32::NAN;
    safetensors(&nan_input, "input", &[1, 3, 32, 32], &x);
    let wrong_shape = dir.join("shape.safetensors");
    safetensors(
        &wrong_shape,
        "input",
        &[1, 4, 32, 32],
        &vec![0.0; 4 * 32 * 32],
    );
    let wrong_name = dir.join("name.safetensors");
    safetensors(&wrong_name, "images", &[1, 3, 32, 32], &x);
    let a_file = dir.join("a-file");
    std::fs::write(&a_file, b"").unwrap();
    let long = "x".repeat(100_000);
    let long: &'static str = Box::leak(long.into_boxed_str());
    let not_utf8 = OsString::from_vec(vec![b'f', 0xff, b'1', b'6']);

    // train's data and checkpoint files
    let ragged = dir.join("ragged.csv");
    std::fs::write(&ragged, "a,b,y\n1,2,3\n4,5\n").unwrap();
    let text = dir.join("text.csv");
    std::fs::write(&text, "a,b,y\n1,2,3\n4,abc,6\n").unwrap();
    let no_x = dir.join("nox.safetensors");
    safetensors(&no_x, "y", &[4], &[1.0; 4]);
    let mismatch = dir.join("mismatch.safetensors");
    two_tensors(&mismatch, ("x", &[4, 2]), ("y", &[3]));
    let checkpoint = dir.join("ck.safetensors");
    let made = Command::new(bin())
        .args(["train", "--steps", "1", "--save"])
        .arg(&checkpoint)
        .output()
        .expect("run gpukit");
    assert!(made.status.success(), "{made:?}");
    let mut v = vec![
        // the command line itself
        case(&["--frobnicate"], &["--frobnicate"]),
        case(&["check", "--frobnicate"], &["--frobnicate"]),
        case(&["frobnicate"], &["frobnicate"]),
        case(&["check", "--device", "cuda:x"], &["--device", "cuda:x"]),
        case(&["check", "--device", "tpu"], &["--device", "expected cpu"]),
        // bench matmul
        case(
            &["bench", "matmul", "--sizes", "0"],
            &["--sizes", "at least 1"],
        ),
        case(
            &["bench", "matmul", "--sizes", "-1"],
            &["--sizes", "not a matrix size"],
        ),
        case(&["bench", "matmul", "--sizes", ""], &["--sizes"]),
        case(&["bench", "matmul", "--sizes", "1,,2"], &["--sizes"]),
        case(
            &["bench", "matmul", "--sizes", "99999999999"],
            &["--sizes", "too large"],
        ),
        case(
            &["bench", "matmul", "--sizes", "1e3"],
            &["--sizes", "not a matrix size"],
        ),
        case(
            &["bench", "matmul", "--matrix-size", "0"],
            &["--matrix-size", "at least 1"],
        ),
        case(
            &["bench", "matmul", "--matrix-size", "8", "--sizes", "8"],
            &["--matrix-size", "cannot be used with"],
        ),
        case(
            &["bench", "matmul", "--dtype", "f8"],
            &["--dtype", "unknown dtype"],
        ),
        case(
            &["bench", "matmul", "--dtype", long],
            &["--dtype", "(100000 characters)"],
        ),
        case(
            &["bench", "matmul", "--iterations", "0"],
            &["--iterations", "at least 1"],
        ),
        case(
            &["bench", "matmul", "--iterations", "ten"],
            &["--iterations", "not a number"],
        ),
        case(
            &["bench", "matmul", "--cpu-seconds", "-1"],
            &["--cpu-seconds"],
        ),
        case(
            &["bench", "matmul", "--cpu-seconds", "nan"],
            &["--cpu-seconds"],
        ),
        case(&["bench", "matmul", "--turns", "0"], &["--turns"]),
        case(&["bench", "matmul", "--turns", "101"], &["--turns"]),
        case(
            &["bench", "matmul", "--init", "gaussian"],
            &["--init", "unknown input distribution"],
        ),
        case(&["bench", "matmul", "--device", "cuda:-1"], &["--device"]),
        // bench bandwidth
        case(&["bench", "bandwidth", "--sizes", "0"], &["--sizes"]),
        case(
            &["bench", "bandwidth", "--sizes", "12X"],
            &["--sizes", "not a size in bytes"],
        ),
        case(
            &["bench", "bandwidth", "--sizes", "100G"],
            &["--sizes", "out of range"],
        ),
        case(
            &["bench", "bandwidth", "--device", "cpu"],
            &["--device cuda:N"],
        ),
        // bench conv
        case(
            &["bench", "conv", "--batch", "0"],
            &["--batch", "at least 1"],
        ),
        case(
            &["bench", "conv", "--batch", "99999999999"],
            &["--batch", "beyond any machine"],
        ),
        case(
            &["bench", "conv", "--batch", "-3"],
            &["--batch", "not a batch size"],
        ),
        case(&["bench", "conv", "--dtype", "f64"], &["f64"]),
        case(
            &["bench", "conv", "--layout", "nwhc"],
            &["--layout", "unknown layout"],
        ),
        case(
            &["bench", "conv", "--iterations", "0"],
            &["--iterations", "at least 1"],
        ),
        case(&["bench", "conv", "--backward"], &["--backward"]),
        // train
        case(&["train", "--batch-size", "0"], &["--batch-size"]),
        case(&["train", "--batch-size", "-1"], &["--batch-size"]),
        case(&["train", "--lr", "0"], &["--lr"]),
        case(&["train", "--lr", "-1"], &["--lr"]),
        case(&["train", "--lr", "nan"], &["--lr"]),
        case(&["train", "--layers", "16,x,1"], &["--layers"]),
        case(
            &["train", "--layers", "5,64,1"],
            &["--layers", "16 features"],
        ),
        case(&["train", "--epochs", "0"], &["--epochs"]),
        case(&["train", "--steps", "0"], &["--steps"]),
        case(&["train", "--accumulate", "0"], &["--accumulate"]),
        case(&["train", "--optimizer", "rmsprop"], &["--optimizer"]),
        case(&["train", "--loss", "hinge"], &["--loss"]),
        case(&["train", "--eval-fraction", "1"], &["--eval-fraction"]),
        case(
            &["train", "--optimizer", "adam", "--momentum", "0.9"],
            &["--momentum"],
        ),
        case(&["train", "--precision", "fp16"], &["--precision"]),
        with_path(&["train", "--data"], &ragged, &["ragged.csv", "fields"]),
        with_path(
            &["train", "--data"],
            &text,
            &["text.csv", "is not a number"],
        ),
        with_path(&["train", "--data"], &no_x, &["nox.safetensors", "\"x\""]),
        with_path(
            &["train", "--data"],
            &mismatch,
            &["mismatch.safetensors", "rows"],
        ),
        with_path(
            &["train", "--data"],
            &dir.join("missing.csv"),
            &["missing.csv"],
        ),
        with_path(
            &["train", "--samples", "10", "--data"],
            &ragged,
            &["--samples", "--data"],
        ),
        case(&["train", "--save", "/proc/x/ck.safetensors"], &["--save"]),
        case(
            &["train", "--save-losses", "/proc/x/l.csv"],
            &["--save-losses"],
        ),
        with_path(
            &["train", "--layers", "16,32,1", "--resume"],
            &checkpoint,
            &["ck.safetensors", "layers 16,64,1, not 16,32,1"],
        ),
        with_path(
            &["train", "--resume"],
            &no_x,
            &["nox.safetensors", "not a gpukit training checkpoint"],
        ),
        with_path(
            &["train", "--init", "x.safetensors", "--resume"],
            &checkpoint,
            &["--init", "--resume"],
        ),
        // infer
        case(
            &[
                "infer",
                "--strategies",
                "fp16-nhwc-graph-one-at-a-time",
                "--batch-sizes",
                "1",
            ],
            &[
                "--strategies",
                "only at batch sizes over 1",
                "--batch-sizes",
            ],
        ),
        case(
            &["infer", "--image-size", "0"],
            &["--image-size", "at least 32"],
        ),
        case(
            &["infer", "--image-size", "31"],
            &["--image-size", "at least 32"],
        ),
        case(
            &["infer", "--image-size", "100000"],
            &["--image-size", "beyond any machine"],
        ),
        case(
            &["infer", "--batch-sizes", "0"],
            &["--batch-sizes", "at least 1"],
        ),
        case(
            &["infer", "--batch-sizes", "1,x"],
            &["--batch-sizes", "not a batch size"],
        ),
        case(
            &["infer", "--model-name", "resnet9"],
            &["--model-name", "unknown model"],
        ),
        case(
            &["infer", "--strategies", "fp17"],
            &["--strategies", "unknown precision"],
        ),
        case(
            &["infer", "--strategies", "fp16-sideways"],
            &["--strategies", "unknown part"],
        ),
        case(
            &["infer", "--strategies", long],
            &["--strategies", "(100000 characters)"],
        ),
        case(
            &["infer", "--gpu-iterations", "0"],
            &["--gpu-iterations", "at least 1"],
        ),
        case(&["infer", "--save-output", "x.safetensors"], &["--input"]),
        with_path(
            &["infer", "--device", "cpu", "--weights"],
            &missing,
            &["missing.safetensors"],
        ),
        with_path(&["infer", "--device", "cpu", "--weights"], dir, &[]),
        with_path(
            &["infer", "--device", "cpu", "--weights"],
            &not_safetensors,
            &["text.safetensors"],
        ),
        with_path(
            &["infer", "--device", "cpu", "--input"],
            &missing,
            &["missing.safetensors"],
        ),
        with_path(&["infer", "--device", "cpu", "--input"], dir, &[]),
        with_path(
            &["infer", "--device", "cpu", "--input"],
            &nan_input,
            &["not finite", "index 100"],
        ),
        with_path(
            &["infer", "--device", "cpu", "--input"],
            &wrong_shape,
            &["[1, 4, 32, 32]"],
        ),
        with_path(
            &["infer", "--device", "cpu", "--input"],
            &wrong_name,
            &["input"],
        ),
        with_path(
            &["infer", "--batch-sizes", "2", "--input"],
            &nan_input,
            &["--batch-sizes", "cannot be used with"],
        ),
        // memory
        case(&["memory", "--device", "cpu"], &["cuda:N"]),
        case(
            &["memory", "--batch-sizes", "0"],
            &["--batch-sizes", "at least 1"],
        ),
        case(
            &["memory", "--memory-fraction", "2"],
            &["--memory-fraction"],
        ),
        case(
            &["memory", "--memory-fraction", "-0.5"],
            &["--memory-fraction"],
        ),
        case(
            &["memory", "--precision", "fp64"],
            &["--precision", "unknown precision"],
        ),
        case(&["memory", "--max-workspace", "1000"], &["--max-workspace"]),
        case(&["memory", "--on-oom", "retry"], &["--on-oom"]),
        // destinations, checked before any work
        case(
            &["check", "--save-json", "/proc/x/y.json"],
            &["--save-json", "does not exist"],
        ),
        with_path(
            &["check", "--save-json"],
            dir,
            &["--save-json", "is a directory"],
        ),
        with_path(
            &["check", "--save-json"],
            &a_file.join("x.json"),
            &["is not a directory"],
        ),
        case(
            &["check", "--html", "/proc/x/y.html"],
            &["--html", "does not exist"],
        ),
        with_path(&["check", "--html"], dir, &["--html", "is a directory"]),
        case(&["all", "--out", "/proc/x"], &["--out"]),
        case(&["monitor", "--interval-ms", "0"], &["--interval-ms 0"]),
        case(&["monitor", "--interval-ms=-5"], &["--interval-ms"]),
        case(&["monitor", "--count", "0"], &["--count 0"]),
        case(&["monitor", "--duration=-1"], &["--duration"]),
        case(
            &["monitor", "--csv", "/proc/x/g.csv", "--count", "1"],
            &["--csv", "does not exist"],
        ),
        case(
            &["monitor", "--prometheus", "127.0.0.1:99999"],
            &["127.0.0.1:99999"],
        ),
        case(
            &["monitor", "--prometheus", "0.0.0.0:9400"],
            &["0.0.0.0:9400", "--allow-remote"],
        ),
        with_path(&["all", "--out"], &a_file, &["--out"]),
        with_path(
            &[
                "infer",
                "--device",
                "cpu",
                "--input",
                "x.safetensors",
                "--save-output",
            ],
            dir,
            &["--save-output", "is a directory"],
        ),
    ];
    // a value that is not UTF-8
    let mut c = case(&["bench", "matmul", "--dtype"], &["--dtype"]);
    c.args.push(not_utf8);
    v.push(c);
    // an unreadable file, where this user cannot read it (root reads everything)
    let unreadable = dir.join("unreadable.safetensors");
    safetensors(&unreadable, "input", &[1, 3, 32, 32], &x);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&unreadable, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&unreadable).is_err() {
        v.push(with_path(
            &["infer", "--device", "cpu", "--input"],
            &unreadable,
            &["unreadable.safetensors"],
        ));
    }
    v
}

#[test]
fn every_bad_input_exits_2_naming_the_problem_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let all = cases(dir.path());
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = names(dir.path());
    let mut wrong = Vec::new();
    for c in &all {
        let out = Command::new(bin())
            .args(&c.args)
            .env("GPUKIT_TRACE", "0")
            .output()
            .expect("run gpukit");
        let err = String::from_utf8_lossy(&out.stderr);
        let shown: Vec<String> = c
            .args
            .iter()
            .map(|a| {
                let s = a.to_string_lossy();
                if s.len() > 40 {
                    format!("{}...", &s[..40])
                } else {
                    s.into_owned()
                }
            })
            .collect();
        let missing: Vec<&str> = c
            .says
            .iter()
            .copied()
            .filter(|s| !err.contains(s))
            .collect();
        if out.status.code() != Some(2) || !missing.is_empty() || err.contains("panicked") {
            wrong.push(format!(
                "{shown:?}: exit {:?}, missing {missing:?} in: {}",
                out.status.code(),
                err.chars().take(400).collect::<String>()
            ));
        }
        // a long value is not echoed whole (clap quotes it once; gpukit's reason does not)
        if err.len() > 120_000 {
            wrong.push(format!(
                "{shown:?}: the message repeats the value ({} bytes)",
                err.len()
            ));
        }
    }
    // nothing left behind: no temporary file beside a refused destination, no report
    assert_eq!(
        names(dir.path()),
        before,
        "files appeared in the test directory"
    );
    assert!(
        wrong.is_empty(),
        "{} of {} bad inputs were not answered well:\n{}",
        wrong.len(),
        all.len(),
        wrong.join("\n")
    );
}
