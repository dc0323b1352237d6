//! The binary as a user runs it: exit codes, messages, JSON, reports. Three kinds of test: those
//! that hold on any machine; those that need a GPU (reported as ignored, with the reason, where
//! there is none; GPUKIT_REQUIRE_GPU=1 on the GPU machine turns "no GPU" into a failure); and
//! those about a machine without one (ignored, with the reason, where a GPU is usable). None
//! branches on the machine inside: what a test checks is fixed by its kind. GPUKIT_BIN
//! overrides the binary's path (the staged copy on the GPU machine).

mod common;

use common::*;
use libtest_mimic::Failed;
use serde_json::Value;
use std::process::Command;

// ---- any machine ----

fn check_json_is_an_envelope_with_host_facts() -> Result<(), Failed> {
    let doc = document(&["check"], 0)?;
    let v = &doc["result"];
    ensure(doc["command"] == "check", || format!("{doc}"))?;
    ensure(v["available"].is_boolean(), || format!("{v}"))?;
    ensure(
        v["host"]["logical_cores"].as_u64().unwrap_or(0) >= 1,
        || format!("{v}"),
    )?;
    ensure(v["libraries"].as_array().map_or(0, Vec::len) == 9, || {
        format!("{v}")
    })
}

fn check_human_view_has_a_headline_and_host_facts() -> Result<(), Failed> {
    let out = gpukit(&["check"]);
    exited(&out, 0, &["check"])?;
    let s = text(&out.stdout);
    ensure(
        s.contains("GPU available") || s.contains("No GPU available"),
        || s.clone(),
    )?;
    ensure(
        s.contains("CUDA libraries") && s.contains("Host") && s.contains("SIMD"),
        || s.clone(),
    )
}

fn unknown_flag_and_bad_device_exit_2_with_a_message() -> Result<(), Failed> {
    let out = gpukit(&["check", "--bogus"]);
    exited(&out, 2, &["check", "--bogus"])?;
    ensure(text(&out.stderr).contains("--bogus"), || text(&out.stderr))?;
    let out = gpukit(&["check", "--device", "tpu:0"]);
    exited(&out, 2, &["check", "--device", "tpu:0"])?;
    ensure(text(&out.stderr).contains("unknown device 'tpu:0'"), || {
        text(&out.stderr)
    })?;
    exited(&gpukit(&["frobnicate"]), 2, &["frobnicate"])
}

fn bench_bad_input_exits_2() -> Result<(), Failed> {
    for args in [
        &["bench", "matmul", "--sizes", "0"][..],
        &["bench", "matmul", "--sizes", "12,abc"][..],
        &["bench", "matmul", "--matrix-size", "-4"][..],
        &["bench", "matmul", "--dtype", "int8"][..],
        &["bench", "matmul", "--iterations", "0"][..],
        &["bench", "bandwidth", "--sizes", "12Q"][..],
        &["bench", "conv", "--dtype", "f64"][..],
        &["bench", "conv", "--layout", "nwhc"][..],
        &["bench", "nccl", "--ops", "gather"][..],
        &["bench", "nccl", "--dtype", "f64"][..],
        &["bench", "nccl", "--redop", "prod"][..],
        &["bench", "nccl", "--min-bytes", "2G", "--max-bytes", "1G"][..],
        &["bench", "nccl", "--max-bytes", "3X"][..],
        &["bench", "nccl", "--step-factor", "1"][..],
        &["bench", "nccl", "--place", "sideways"][..],
        &["bench", "p2p", "--bytes", "0"][..],
        &["launch", "--nproc-per-node", "0", "--", "true"][..],
        &["launch", "--nproc-per-node", "2"][..],
        &["train", "--gpus", "2", "--device", "cpu"][..],
    ] {
        exited(&gpukit(args), 2, args)?;
    }
    Ok(())
}

/// `gpukit launch` starts N ranks with the variables torchrun sets, and exits as the first
/// rank that failed did, saying which.
fn launch_starts_ranks_and_passes_on_a_failure() -> Result<(), Failed> {
    let ok = gpukit(&[
        "launch",
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && test -n \"$MASTER_PORT\" && echo rank $RANK",
    ]);
    exited(&ok, 0, &["launch", "3 ranks"])?;
    let out = text(&ok.stdout);
    for r in 0..3 {
        ensure(out.contains(&format!("rank {r}")), || out.clone())?;
    }
    let bad = gpukit(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--timeout",
        "5",
        "--",
        "sh",
        "-c",
        "exit $((RANK * 3))",
    ]);
    exited(&bad, 3, &["launch", "rank 1 exits 3"])?;
    let err = text(&bad.stderr);
    ensure(err.contains("rank 1") && err.contains("status 3"), || err)
}

/// Under a launcher's variables, a rank whose peers never come exits 1 within its timeout,
/// naming who did not arrive; a torchrun environment without MASTER_ADDR is bad input.
fn a_rank_without_peers_gives_up_with_a_message() -> Result<(), Failed> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())?;
    let started = std::time::Instant::now();
    let out = Command::new(bin())
        .args(["train", "--epochs", "1", "--timeout", "2"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", "0")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .output()?;
    // without a GPU it stops earlier, naming the driver; with one, at the rendezvous
    ensure(out.status.code() == Some(1), || {
        format!("{:?}: {}", out.status, text(&out.stderr))
    })?;
    ensure(started.elapsed().as_secs() < 20, || {
        format!("took {:?}", started.elapsed())
    })?;
    let err = text(&out.stderr);
    ensure(
        err.contains("did not arrive") || err.contains("NVIDIA driver"),
        || err.clone(),
    )?;
    let out = Command::new(bin())
        .args(["bench", "nccl"])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("MASTER_PORT", port.to_string())
        .env_remove("MASTER_ADDR")
        .output()?;
    exited(&out, 2, &["bench", "nccl", "(no MASTER_ADDR)"])?;
    let err = text(&out.stderr);
    ensure(err.contains("MASTER_ADDR"), || err)
}

/// `train --model` under a launcher: each process is one rank, so what one process drives
/// (several GPUs, PyTorch's DDP beside, the CPU) is refused with exit 2 before any work.
/// And `train --pipeline N` under a launcher: each process is one stage, so N must be the
/// launcher's process count, and what needs every stage's layers in one process (saving them,
/// PyTorch's pipeline beside) is refused.
fn a_launched_cnn_rank_refuses_what_one_process_drives() -> Result<(), Failed> {
    let save = std::env::temp_dir().join("gpukit-never-written.ckpt");
    let save = save.to_string_lossy().into_owned();
    for (flags, says) in [
        (&["--model", "resnet18", "--gpus", "2"][..], "--gpus"),
        (
            &["--model", "resnet18", "--compare-pytorch"][..],
            "--compare-pytorch",
        ),
        (&["--model", "resnet18", "--device", "cpu"][..], "GPUs"),
        (&["--pipeline", "3"][..], "each process is one stage"),
        (&["--pipeline", "2", "--save", &save][..], "--save"),
        (
            &["--pipeline", "2", "--compare-pytorch"][..],
            "--compare-pytorch",
        ),
        (&["--pipeline", "2", "--gpus", "2"][..], "--gpus"),
    ] {
        let mut args = vec!["train"];
        args.extend_from_slice(flags);
        let out = Command::new(bin())
            .args(&args)
            .env("RANK", "1")
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", "1")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .output()?;
        exited(&out, 2, &args)?;
        let err = text(&out.stderr);
        ensure(err.contains(says), || format!("{args:?}: {err}"))?;
    }
    Ok(())
}

/// `--html FILE` beside any command: one self-contained page (no script, nothing fetched) with
/// the command's chart drawn as inline SVG above its tables.
fn html_beside_a_command_is_one_self_contained_page() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let page = dir.path().join("matmul.html");
    let page_arg = page.to_string_lossy().into_owned();
    let args = [
        "bench",
        "matmul",
        "--device",
        "cpu",
        "--sizes",
        "64,96",
        "--dtype",
        "f32",
        "--iterations",
        "2",
        "--html",
        &page_arg,
    ];
    exited(&gpukit(&args), 0, &args)?;
    let html = std::fs::read_to_string(&page)?;
    for needle in [
        "<!DOCTYPE html>",
        "<h1>gpukit bench matmul</h1>",
        "<svg",
        "<table",
        "f32",
    ] {
        ensure(html.contains(needle), || format!("no {needle} in the page"))?;
    }
    // (the inline SVG names its namespace by URL; nothing is loaded from one)
    for banned in ["<script", "<link", "src=\"http", "href=\"http", "url(http"] {
        ensure(!html.contains(banned), || {
            format!("the page holds {banned}")
        })?;
    }
    Ok(())
}

/// `monitor -- CMD`: the command's output and exit code pass through, its footprint is printed
/// (without a GPU: timed, "not sampled" said); a command that does not exist exits 127.
fn monitor_runs_a_command_and_passes_its_exit_code() -> Result<(), Failed> {
    let args = [
        "monitor",
        "--interval-ms",
        "20",
        "--",
        "sh",
        "-c",
        "echo from-the-command; exit 3",
    ];
    let out = gpukit(&args);
    exited(&out, 3, &args)?;
    let stdout = text(&out.stdout);
    ensure(
        stdout.contains("from-the-command") && stdout.contains("Footprint of `sh -c"),
        || stdout.clone(),
    )?;
    let args = ["monitor", "--", "gpukit-no-such-command"];
    let out = gpukit(&args);
    exited(&out, 127, &args)?;
    ensure(text(&out.stderr).contains("command not found"), || {
        text(&out.stderr)
    })
}

fn bench_matmul_on_the_cpu_verifies_and_reports() -> Result<(), Failed> {
    let args = [
        "bench",
        "matmul",
        "--device",
        "cpu",
        "--sizes",
        "65,128",
        "--iterations",
        "3",
    ];
    let doc = document(&args, 0)?;
    ensure(doc["command"] == "bench matmul", || format!("{doc}"))?;
    let rows = doc["result"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure(rows.len() == 10, || format!("5 dtypes x 2 sizes: {doc}"))?;
    for r in rows {
        ensure(r["status"]["status"] == "ok", || format!("{r}"))?;
        ensure(r["verification"]["passed"] == true, || format!("{r}"))?;
        ensure(r["tflops"].as_f64().unwrap_or(0.0) > 0.0, || format!("{r}"))?;
    }
    Ok(())
}

fn bench_conv_on_the_cpu_runs_every_shape() -> Result<(), Failed> {
    let args = [
        "bench",
        "conv",
        "--device",
        "cpu",
        "--batch",
        "1",
        "--iterations",
        "1",
        "--layout",
        "nhwc",
    ];
    let out = gpukit(&args);
    exited(&out, 0, &args)?;
    let s = text(&out.stdout);
    for shape in [
        "conv1 7x7/2 3->64 @224",
        "layer1 3x3 64->64 @56",
        "layer4 1x1 2048->512 @7",
    ] {
        ensure(s.contains(shape), || s.clone())?;
    }
    Ok(())
}

fn gpukit_cuda_path_pointing_nowhere_warns_and_carries_on() -> Result<(), Failed> {
    let out = Command::new(bin())
        .args(["check", "--json"])
        .env("GPUKIT_CUDA_PATH", "/nonexistent/cuda")
        .output()?;
    exited(&out, 0, &["check", "--json"])?;
    let err = text(&out.stderr);
    ensure(
        err.contains("GPUKIT_CUDA_PATH") && err.contains("/nonexistent/cuda"),
        || err.clone(),
    )?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    ensure(
        doc["result"]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("/nonexistent/cuda")),
        || format!("{doc}"),
    )?;
    // the warning is one of the document's notes too
    ensure(
        doc["notes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n.as_str().is_some_and(|n| n.contains("/nonexistent/cuda")))
        }),
        || format!("{doc}"),
    )
}

fn gpukit_cuda_path_finds_libraries_placed_there() -> Result<(), Failed> {
    // A fake libnccl.so.2 in a user directory must be found there, ahead of anything else.
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("lib"))?;
    std::fs::write(dir.path().join("lib/libnccl.so.2"), b"not really a library")?;
    let out = Command::new(bin())
        .args(["check", "--json"])
        .env("GPUKIT_CUDA_PATH", dir.path())
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .output()?;
    exited(&out, 0, &["check", "--json"])?;
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    let nccl = doc["result"]["libraries"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["library"] == "nccl").cloned())
        .ok_or("no nccl row")?;
    ensure(nccl["found"] == true, || format!("{nccl}"))?;
    ensure(nccl["source"] == "gpukit_cuda_path", || format!("{nccl}"))?;
    let want = dir.path().join("lib/libnccl.so.2");
    ensure(nccl["path"] == want.to_str().unwrap_or_default(), || {
        format!("{nccl}")
    })
}

fn all_writes_the_three_reports() -> Result<(), Failed> {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir()?;
    // a directory name that is not UTF-8 is a name like any other
    let out_dir = dir.path().join(std::ffi::OsStr::from_bytes(b"report-\xff"));
    let out = Command::new(bin())
        .arg("all")
        .arg("--out")
        .arg(&out_dir)
        .output()?;
    exited(&out, 0, &["all", "--out", "report-\u{fffd}"])?;
    let json: Value = serde_json::from_slice(&std::fs::read(out_dir.join("report.json"))?)?;
    ensure(json["command"] == "all" && json["ok"] == true, || {
        format!("{json}")
    })?;
    ensure(
        json["result"]["check"]["host"]["cpu_model"].is_string(),
        || format!("{json}"),
    )?;
    // the GPU rows are there (a device named) or say why not: never neither
    let infer = &json["result"]["infer"];
    ensure(
        infer["gpu_device"].is_string() || infer["gpu_unavailable"].is_string(),
        || format!("{infer}"),
    )?;
    let md = std::fs::read_to_string(out_dir.join("report.md"))?;
    ensure(md.starts_with("# gpukit report"), || md.clone())?;
    ensure(!md.contains("not selected"), || md.clone())?;
    ensure(md.contains("### CUDA libraries"), || md.clone())?;
    // every note of the document is in report.md too
    for n in json["notes"].as_array().cloned().unwrap_or_default() {
        let n = n.as_str().unwrap_or_default().to_string();
        ensure(md.contains(&n), || {
            format!("note {n:?} missing from report.md")
        })?;
    }
    let names: Vec<String> = std::fs::read_dir(&out_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let html = std::fs::read_to_string(out_dir.join("report.html"))?;
    ensure(
        html.starts_with("<!DOCTYPE html>")
            && html.contains("id=\"matmul\"")
            && !html.contains("<script"),
        || html.chars().take(2000).collect(),
    )?;
    ensure(names.len() == 3, || format!("{names:?}"))
}

fn all_into_an_unwritable_place_fails_at_once_with_the_path() -> Result<(), Failed> {
    let args = ["all", "--out", "/proc/gpukit-cannot-write-here"];
    let started = std::time::Instant::now();
    let out = gpukit(&args);
    exited(&out, 2, &args)?;
    ensure(
        text(&out.stderr).contains("/proc/gpukit-cannot-write-here"),
        || text(&out.stderr),
    )?;
    // checked before any benchmark runs
    ensure(started.elapsed().as_secs_f64() < 5.0, || {
        format!("took {:?}", started.elapsed())
    })
}

fn help_lists_only_real_commands() -> Result<(), Failed> {
    let out = gpukit(&["--help"]);
    exited(&out, 0, &["--help"])?;
    let s = text(&out.stdout);
    ensure(s.contains("check") && s.contains("all"), || s.clone())
}

fn memory_bad_input_exits_2() -> Result<(), Failed> {
    for (args, needle) in [
        (&["memory", "--memory-fraction", "0"][..], "above 0"),
        (&["memory", "--memory-fraction", "1.5"][..], "at most 1"),
        (&["memory", "--memory-fraction", "half"][..], "'half'"),
        (&["memory", "--batch-sizes", "0"][..], "at least 1"),
        (&["memory", "--batch-sizes=-4"][..], "'-4'"),
        (&["memory", "--precision", "fp8"][..], "fp8"),
        (&["memory", "--device", "cpu"][..], "cuda:N"),
        (&["memory", "--max-workspace", "300"][..], "256 MiB"),
        (&["memory", "--max-workspace", "lots"][..], "'lots'"),
    ] {
        let o = gpukit(args);
        exited(&o, 2, args)?;
        ensure(text(&o.stderr).contains(needle), || {
            format!("{args:?}: {}", text(&o.stderr))
        })?;
    }
    Ok(())
}

/// The planted fault's variable is read strictly, before any GPU is asked for.
fn stress_a_bad_planted_fault_exits_2() -> Result<(), Failed> {
    let args = ["stress", "--duration", "5"];
    let out = Command::new(bin())
        .args(args)
        .env("GPUKIT_STRESS_PLANT_FAULT", "disk:0")
        .output()
        .map_err(|e| Failed::from(e.to_string()))?;
    exited(&out, 2, &args)?;
    ensure(text(&out.stderr).contains("matmul:N or memory:N"), || {
        text(&out.stderr)
    })
}

// ---- a machine without a GPU ----

/// Without a driver, sampling exits 1 naming NVML and the driver.
fn without_a_gpu_monitor_names_what_to_install() -> Result<(), Failed> {
    let args = ["monitor", "--csv", "-", "--count", "1"];
    let out = gpukit(&args);
    exited(&out, 1, &args)?;
    let e = text(&out.stderr);
    ensure(e.contains("NVML") && e.contains("driver"), || e.clone())
}

fn without_a_gpu_check_says_why() -> Result<(), Failed> {
    for quick in [false, true] {
        let args: &[&str] = if quick {
            &["check", "--quick"]
        } else {
            &["check"]
        };
        let doc = document(args, 0)?;
        let v = &doc["result"];
        ensure(v["available"] == false, || format!("{v}"))?;
        let reason = v["reason"].as_str().unwrap_or_default();
        ensure(reason.contains("driver") && reason.len() > 20, || {
            format!("{v}")
        })?;
        ensure(v["gpus"].as_array().is_some_and(Vec::is_empty), || {
            format!("{v}")
        })?;
        ensure(v["cuda_initialized"] == false, || format!("{v}"))?;
    }
    Ok(())
}

fn without_a_gpu_a_named_gpu_exits_1_naming_the_driver() -> Result<(), Failed> {
    for args in [
        &["check", "--device", "cuda:9"][..],
        &["bench", "matmul", "--device", "cuda:0", "--sizes", "64"][..],
        &["memory", "--batch-sizes", "1"][..],
        &["bench", "nccl", "--max-bytes", "1M"][..],
        &["bench", "p2p"][..],
        &["stress", "--duration", "5"][..],
        &["bench", "matmul", "--search"][..],
        &["train", "--gpus", "2", "--epochs", "1"][..],
        &[
            "infer",
            "--device",
            "cuda:0",
            "--model-name",
            "resnet18",
            "--batch-sizes",
            "1",
            "--image-size",
            "32",
        ][..],
    ] {
        let out = gpukit(args);
        exited(&out, 1, args)?;
        let err = text(&out.stderr);
        ensure(err.contains("NVIDIA driver"), || format!("{args:?}: {err}"))?;
        ensure(out.stdout.is_empty(), || {
            format!("{args:?} printed a report")
        })?;
    }
    Ok(())
}

// ---- a machine with a GPU ----

fn with_a_gpu_check_reports_it() -> Result<(), Failed> {
    let doc = document(&["check"], 0)?;
    let v = &doc["result"];
    ensure(v["available"] == true && v["reason"].is_null(), || {
        format!("{v}")
    })?;
    let gpu = &v["gpus"][0];
    ensure(gpu["sm_count"].as_u64().unwrap_or(0) > 0, || {
        format!("{gpu}")
    })?;
    ensure(gpu["l2_cache_bytes"].as_u64().unwrap_or(0) > 0, || {
        format!("{gpu}")
    })?;
    ensure(v["cuda_initialized"] == true, || format!("{v}"))?;
    ensure(
        gpu["peaks"]["f32_tflops"].as_f64().unwrap_or(0.0) > 0.0,
        || format!("{gpu}"),
    )?;
    for lib in v["libraries"].as_array().cloned().unwrap_or_default() {
        // NVTX's library is optional (NVTX 3 is header-only); the rest must be found
        if lib["library"] != "nvtx" {
            ensure(lib["found"] == true, || format!("{lib}"))?;
        }
    }
    let quick = document(&["check", "--quick"], 0)?;
    let q = &quick["result"];
    ensure(
        q["available"] == true && q["cuda_initialized"] == false,
        || format!("{q}"),
    )?;
    let qg = &q["gpus"][0];
    ensure(
        qg["memory_board_bytes"].as_u64().unwrap_or(0) > 0 && qg["l2_cache_bytes"].is_null(),
        || format!("L2 comes from CUDA only: {qg}"),
    )
}

fn with_a_gpu_a_device_past_the_last_exits_2() -> Result<(), Failed> {
    for args in [
        &["check", "--device", "cuda:9"][..],
        &["bench", "matmul", "--device", "cuda:9", "--sizes", "64"][..],
        &["stress", "--gpus", "9", "--duration", "5"][..],
        &["bench", "matmul", "--search", "--device", "cuda:9"][..],
        &[
            "infer",
            "--device",
            "cuda:9",
            "--model-name",
            "resnet18",
            "--batch-sizes",
            "1",
            "--image-size",
            "32",
        ][..],
    ] {
        let out = gpukit(args);
        exited(&out, 2, args)?;
        ensure(text(&out.stderr).contains("cuda:9"), || text(&out.stderr))?;
    }
    Ok(())
}

/// A short stress run: every test ran on GPU 0 (fp8 where the GPU has it), every product was
/// compared with the first and checked against float64, memory was written and read, copies arrived; the verdict is the
/// GPU's (the exit code follows it, whichever it is).
fn with_a_gpu_stress_checks_every_result_and_judges_each_gpu() -> Result<(), Failed> {
    let args = ["stress", "--gpus", "0", "--duration", "8", "--json"];
    let out = gpukit(&args);
    let code = out.status.code();
    ensure(code == Some(0) || code == Some(1), || {
        format!("exit {code:?}: {}", text(&out.stderr))
    })?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Failed::from(format!("not JSON: {e}: {}", text(&out.stdout))))?;
    let g = &doc["result"]["gpus"][0];
    for m in g["matmul"].as_array().into_iter().flatten() {
        if m["skipped"].is_string() {
            continue;
        }
        ensure(m["products"].as_u64().unwrap_or(0) >= 2, || m.to_string())?;
        ensure(m["reference_first"]["passed"] == true, || m.to_string())?;
        ensure(m["repeat_words_differing"] == 0, || m.to_string())?;
    }
    // fp8 is in the mix from compute capability 8.9, and says why not below it
    let cc = g["compute_capability"]
        .as_array()
        .and_then(|v| Some((v.first()?.as_u64()?, v.get(1)?.as_u64()?)));
    let fp8 = g["matmul"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["dtype"] == "f8e4m3")
        .ok_or_else(|| Failed::from(format!("no fp8 entry: {g}")))?;
    match cc {
        Some(cc) if cc >= (8, 9) => ensure(
            fp8["skipped"].is_null() && fp8["products"].as_u64().unwrap_or(0) >= 2,
            || fp8.to_string(),
        )?,
        _ => ensure(
            fp8["skipped"].as_str().is_some_and(|w| w.contains("8.9")),
            || fp8.to_string(),
        )?,
    }
    ensure(
        g["memory"]["tested_bytes"].as_u64().unwrap_or(0) > 0,
        || g.to_string(),
    )?;
    ensure(
        g["memory"]["passes"][0]["passes"].as_u64().unwrap_or(0) >= 1,
        || g.to_string(),
    )?;
    ensure(
        g["copies"]
            .as_array()
            .is_some_and(|c| c.len() == 2 && c.iter().all(|c| c["verified"] == true)),
        || g.to_string(),
    )?;
    let passed = g["verdict"]["verdict"] == "pass";
    ensure(passed == (code == Some(0)), || doc.to_string())
}

/// The planted fault (tests only) flips one word of one product on GPU 0: the run must fail
/// that GPU with exit 1, naming it and the test.
fn with_a_gpu_stress_fails_the_gpu_a_fault_was_planted_on() -> Result<(), Failed> {
    let args = ["stress", "--gpus", "0", "--duration", "6"];
    let out = std::process::Command::new(common::bin())
        .args(args)
        .env("GPUKIT_STRESS_PLANT_FAULT", "matmul:0")
        .output()
        .map_err(|e| Failed::from(e.to_string()))?;
    exited(&out, 1, &args)?;
    let err = text(&out.stderr);
    ensure(
        err.contains("cuda:0 failed") && err.contains("wrong result in matmul bf16"),
        || err.clone(),
    )
}

/// The conventions of command-line tools: a version that says the build's CUDA, completion
/// scripts for the shells, a man page; each names every command.
fn version_completions_and_man_page() -> Result<(), Failed> {
    let out = gpukit(&["--version"]);
    exited(&out, 0, &["--version"])?;
    let v = text(&out.stdout);
    ensure(
        v.starts_with("gpukit ") && v.contains("CUDA") && v.contains("build"),
        || v.clone(),
    )?;
    for shell in ["bash", "zsh", "fish"] {
        let out = gpukit(&["completions", shell]);
        exited(&out, 0, &["completions", shell])?;
        let script = text(&out.stdout);
        for command in ["check", "infer", "train", "compare", "all"] {
            ensure(script.contains(command), || {
                format!("{shell} lacks {command}")
            })?;
        }
    }
    let out = gpukit(&["completions", "tcsh"]);
    exited(&out, 2, &["completions", "tcsh"])?;
    let out = gpukit(&["man"]);
    exited(&out, 0, &["man"])?;
    let page = text(&out.stdout);
    ensure(
        page.contains(".TH gpukit 1") && page.contains("train"),
        || page.chars().take(300).collect(),
    )
}

fn main() {
    let any: Vec<(&str, Test)> = vec![
        (
            "check_json_is_an_envelope_with_host_facts",
            check_json_is_an_envelope_with_host_facts,
        ),
        (
            "check_human_view_has_a_headline_and_host_facts",
            check_human_view_has_a_headline_and_host_facts,
        ),
        (
            "unknown_flag_and_bad_device_exit_2_with_a_message",
            unknown_flag_and_bad_device_exit_2_with_a_message,
        ),
        ("bench_bad_input_exits_2", bench_bad_input_exits_2),
        (
            "launch_starts_ranks_and_passes_on_a_failure",
            launch_starts_ranks_and_passes_on_a_failure,
        ),
        (
            "a_rank_without_peers_gives_up_with_a_message",
            a_rank_without_peers_gives_up_with_a_message,
        ),
        (
            "a_launched_cnn_rank_refuses_what_one_process_drives",
            a_launched_cnn_rank_refuses_what_one_process_drives,
        ),
        (
            "monitor_runs_a_command_and_passes_its_exit_code",
            monitor_runs_a_command_and_passes_its_exit_code,
        ),
        (
            "html_beside_a_command_is_one_self_contained_page",
            html_beside_a_command_is_one_self_contained_page,
        ),
        (
            "bench_matmul_on_the_cpu_verifies_and_reports",
            bench_matmul_on_the_cpu_verifies_and_reports,
        ),
        (
            "bench_conv_on_the_cpu_runs_every_shape",
            bench_conv_on_the_cpu_runs_every_shape,
        ),
        (
            "gpukit_cuda_path_pointing_nowhere_warns_and_carries_on",
            gpukit_cuda_path_pointing_nowhere_warns_and_carries_on,
        ),
        (
            "gpukit_cuda_path_finds_libraries_placed_there",
            gpukit_cuda_path_finds_libraries_placed_there,
        ),
        ("all_writes_the_three_reports", all_writes_the_three_reports),
        (
            "all_into_an_unwritable_place_fails_at_once_with_the_path",
            all_into_an_unwritable_place_fails_at_once_with_the_path,
        ),
        (
            "help_lists_only_real_commands",
            help_lists_only_real_commands,
        ),
        (
            "version_completions_and_man_page",
            version_completions_and_man_page,
        ),
        ("memory_bad_input_exits_2", memory_bad_input_exits_2),
        (
            "stress_a_bad_planted_fault_exits_2",
            stress_a_bad_planted_fault_exits_2,
        ),
    ];
    let no_gpu: Vec<(&str, Test)> = vec![
        ("no_gpu::check_says_why", without_a_gpu_check_says_why),
        (
            "no_gpu::monitor_names_what_to_install",
            without_a_gpu_monitor_names_what_to_install,
        ),
        (
            "no_gpu::a_named_gpu_exits_1_naming_the_driver",
            without_a_gpu_a_named_gpu_exits_1_naming_the_driver,
        ),
    ];
    let gpu: Vec<(&str, Test)> = vec![
        ("gpu::check_reports_it", with_a_gpu_check_reports_it),
        (
            "gpu::a_device_past_the_last_exits_2",
            with_a_gpu_a_device_past_the_last_exits_2,
        ),
        (
            "gpu::stress_checks_every_result_and_judges_each_gpu",
            with_a_gpu_stress_checks_every_result_and_judges_each_gpu,
        ),
        (
            "gpu::stress_fails_the_gpu_a_fault_was_planted_on",
            with_a_gpu_stress_fails_the_gpu_a_fault_was_planted_on,
        ),
    ];
    run_kinds(any, no_gpu, gpu, Vec::new());
}
