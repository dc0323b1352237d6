//! Bad input, systematically: every command and flag with its edge values (zero, negative, huge,
//! not a number, empty, duplicated, not UTF-8, missing file, a directory for a file, a file for a
//! directory, a malformed file). Each must exit 2 before any work, with a message that names
//! what is wrong, and never panic. Runs on any machine: every case fails on its arguments, before
//! a GPU would be asked for.

mod common;
#[path = "bad_input/onnx.rs"]
mod onnx;
#[path = "bad_input/train.rs"]
mod train;

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
    // an output that is also an input: refused before anything is read or written (the
    // directory's files are compared byte for byte after every case)
    let report = dir.join("R.json");
    std::fs::write(&report, b"{\"not\": \"read\"}").unwrap();
    let weights = dir.join("w.safetensors");
    safetensors(&weights, "fc.weight", &[1, 4], &[0.5; 4]);
    let csv = dir.join("data.csv");
    std::fs::write(&csv, "a,y\n1,2\n3,4\n").unwrap();
    let p = |path: &Path| path.to_str().unwrap().to_string();
    let (report_s, weights_s, csv_s, nan_s) = (p(&report), p(&weights), p(&csv), p(&nan_input));
    let same: Vec<(Vec<String>, [&'static str; 2])> = vec![
        (
            vec![
                "html".into(),
                report_s.clone(),
                "--out".into(),
                report_s.clone(),
            ],
            ["--out", "REPORT"],
        ),
        (
            vec![
                "compare".into(),
                report_s.clone(),
                p(&not_safetensors),
                "--markdown".into(),
                report_s.clone(),
            ],
            ["--markdown", "OLD"],
        ),
        (
            vec![
                "compare".into(),
                p(&not_safetensors),
                report_s.clone(),
                "--save-json".into(),
                report_s.clone(),
            ],
            ["--save-json", "NEW"],
        ),
        (
            vec![
                "infer".into(),
                "--device".into(),
                "cpu".into(),
                "--input".into(),
                nan_s.clone(),
                "--save-output".into(),
                nan_s.clone(),
            ],
            ["--save-output", "--input"],
        ),
        (
            vec![
                "infer".into(),
                "--device".into(),
                "cpu".into(),
                "--weights".into(),
                weights_s.clone(),
                "--html".into(),
                weights_s.clone(),
            ],
            ["--html", "--weights"],
        ),
        (
            vec![
                "memory".into(),
                "--weights".into(),
                weights_s.clone(),
                "--save-json".into(),
                weights_s.clone(),
            ],
            ["--save-json", "--weights"],
        ),
        (
            vec![
                "train".into(),
                "--data".into(),
                csv_s.clone(),
                "--save".into(),
                csv_s.clone(),
            ],
            ["--save", "--data"],
        ),
        (
            vec![
                "train".into(),
                "--data".into(),
                csv_s.clone(),
                "--save-losses".into(),
                csv_s.clone(),
            ],
            ["--save-losses", "--data"],
        ),
        (
            vec![
                "train".into(),
                "--init".into(),
                weights_s.clone(),
                "--save-json".into(),
                weights_s.clone(),
            ],
            ["--save-json", "--init"],
        ),
        (
            vec![
                "train".into(),
                "--resume".into(),
                p(&checkpoint),
                "--save-losses".into(),
                p(&checkpoint),
            ],
            ["--save-losses", "--resume"],
        ),
        (
            vec![
                "profile".into(),
                "infer".into(),
                "--device".into(),
                "cpu".into(),
                "--weights".into(),
                weights_s.clone(),
                "--trace".into(),
                weights_s.clone(),
            ],
            ["--trace", "--weights"],
        ),
        (
            vec![
                "profile".into(),
                "train".into(),
                "--data".into(),
                csv_s.clone(),
                "--trace".into(),
                csv_s.clone(),
            ],
            ["--trace", "--data"],
        ),
    ];
    for (args, says) in same {
        v.push(Case {
            args: args.into_iter().map(OsString::from).collect(),
            says: vec![says[0], says[1], "is also the input"],
        });
    }
    // settings that say one thing and would do another
    v.push(case(
        &["train", "--steps", "200", "--epochs", "3"],
        &["--steps 200", "--epochs 3", "48"],
    ));
    let finished = dir.join("finished.safetensors");
    let made = Command::new(bin())
        .args(["train", "--epochs", "1", "--save"])
        .arg(&finished)
        .output()
        .expect("run gpukit");
    assert!(made.status.success(), "{made:?}");
    v.push(with_path(
        &["train", "--epochs", "1", "--resume"],
        &finished,
        &["--resume", "nothing is left to train", "--epochs"],
    ));
    let csv_dir = dir.join("folder.csv");
    std::fs::create_dir(&csv_dir).unwrap();
    v.push(with_path(
        &["train", "--data"],
        &csv_dir,
        &["is a directory"],
    ));
    v.push(case(
        &[
            "profile",
            "infer",
            "--device",
            "cpu",
            "--group-by",
            "kernel",
        ],
        &["--group-by kernel", "CPU"],
    ));
    v.push(case(
        &["profile", "infer", "--device", "cpu", "--timing", "cupti"],
        &["--timing cupti", "CPU"],
    ));
    v.push(case(
        &["profile", "train", "--timing", "events"],
        &["--timing events", "CPU"],
    ));
    for cmd in [&["bench", "matmul"][..], &["bench", "conv"], &["infer"]] {
        let mut args = cmd.to_vec();
        args.extend(["--iterations", "99999999999"]);
        v.push(case(&args, &["--iterations", "at most 1000000"]));
    }
    v.push(case(
        &["train", "--epochs", "99999999999"],
        &["--epochs", "at most"],
    ));
    v.extend(train::train_flag_cases());
    v.extend(onnx::onnx_cases(dir));
    // stress: levels, durations and GPU lists, refused before a GPU is asked for
    v.extend([
        case(
            &["stress", "--level", "4"],
            &["--level", "the levels are 1"],
        ),
        case(
            &["stress", "--level", "0"],
            &["--level", "the levels are 1"],
        ),
        case(&["stress", "--level", "two"], &["--level"]),
        case(
            &["stress", "--duration", "0"],
            &["--duration", "from 1 to 604800"],
        ),
        case(
            &["stress", "--duration=-30"],
            &["--duration", "from 1 to 604800"],
        ),
        case(&["stress", "--duration", "nan"], &["--duration"]),
        case(
            &["stress", "--duration", "soon"],
            &["--duration", "not a number"],
        ),
        case(&["stress", "--duration", "1e9"], &["--duration", "604800"]),
        case(&["stress", "--gpus", "x"], &["--gpus", "not a GPU"]),
        case(&["stress", "--gpus", "0,,1"], &["--gpus"]),
        case(&["stress", "--gpus=-1"], &["--gpus"]),
        case(&["stress", "--level", "1", "--level", "2"], &["--level"]),
        case(
            &["bench", "matmul", "--search", "--device", "cpu"],
            &["--search measures a GPU", "cuda:N"],
        ),
        case(
            &["bench", "matmul", "--search", "--sizes", "1024"],
            &["--search", "--sizes"],
        ),
        case(
            &["bench", "matmul", "--search", "--dtype", "fp8_e5m2"],
            &["--dtype", "unknown dtype"],
        ),
    ]);
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
    // every file by name with its bytes (directories by name): an input written over shows
    let names = |d: &Path| {
        let mut v: Vec<(String, Option<Vec<u8>>)> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).ok(),
                )
            })
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
    assert!(
        names(dir.path()) == before,
        "files appeared in the test directory, or an input changed"
    );
    assert!(
        wrong.is_empty(),
        "{} of {} bad inputs were not answered well:\n{}",
        wrong.len(),
        all.len(),
        wrong.join("\n")
    );
}

/// Requests larger than the machine, each refused before allocating: exit 1 within 2 s, naming
/// what it needs against what is available, never an abort (134) or an out-of-memory kill
/// (137). The process runs with a 16 GiB address-space limit (`ulimit -v`), which the guard
/// reads like any other limit, so the verdict does not hang on how much memory the machine
/// running the tests has; a wrong estimate would end in the allocator's abort here.
#[test]
fn requests_larger_than_the_machine_are_refused_before_allocating() {
    let cases: &[&[&str]] = &[
        &["train", "--layers", "16,100000,100000,1"],
        &[
            "train",
            "--layers",
            "100000,100000,1",
            "--features",
            "100000",
        ],
        &[
            "train",
            "--samples",
            "16777216",
            "--features",
            "100000",
            "--layers",
            "100000,1",
        ],
        &[
            "train",
            "--samples",
            "16777216",
            "--batch-size",
            "16777216",
            "--layers",
            "16,4096,1",
        ],
        &["train", "--layers", "16,50000,50000,1", "--samples", "64"],
        &[
            "profile",
            "infer",
            "--device",
            "cpu",
            "--batch-size",
            "100000",
        ],
        &["profile", "train", "--layers", "16,100000,100000,1"],
        &[
            "bench", "matmul", "--device", "cpu", "--sizes", "40000", "--dtype", "f16",
        ],
        &[
            "bench", "matmul", "--device", "cpu", "--sizes", "60000", "--dtype", "f32",
        ],
        &["bench", "conv", "--device", "cpu", "--batch", "100000"],
        &[
            "infer",
            "--device",
            "cpu",
            "--strategies",
            "cpu",
            "--batch-sizes",
            "100000",
        ],
    ];
    let mut wrong = Vec::new();
    for args in cases {
        let started = std::time::Instant::now();
        let out = Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 16777216 && exec \"$0\" \"$@\"")
            .arg(bin())
            .args(*args)
            .env("GPUKIT_TRACE", "0")
            .output()
            .expect("run gpukit");
        let seconds = started.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&out.stderr);
        let all = format!("{err}{}", String::from_utf8_lossy(&out.stdout));
        let said = all.contains("needs") && all.contains("available");
        if out.status.code() != Some(1) || !said || err.contains("panicked") || seconds > 2.0 {
            wrong.push(format!(
                "{args:?}: exit {:?} after {seconds:.2} s: {}",
                out.status.code(),
                err.chars().take(500).collect::<String>()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} requests were not refused well:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}
