use super::*;
use crate::monitor::sample::ProcessSample;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

const GIB: u64 = 1 << 30;
const UUID0: &str = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
const UUID1: &str = "GPU-9f8e7d6c-0000-1111-2222-333344445555";

/// A recorded round of two GPUs: the first with every field (and a model name with a
/// quote), the second with most fields unknown.
fn round() -> Vec<GpuSample> {
    let full = GpuSample {
        unix_ms: 1_764_000_000_000,
        index: 0,
        uuid: UUID0.into(),
        name: "NVIDIA H100 80GB \"HBM3\"".into(),
        pci_bus_id: "00000000:18:00.0".into(),
        utilization_gpu_pct: Some(97),
        utilization_memory_pct: Some(41),
        memory_used_bytes: Some(40 * GIB + 512 * 1024),
        memory_total_bytes: Some(80 * GIB),
        temperature_c: Some(64),
        power_draw_w: Some(699.5),
        power_instant_w: Some(701.25),
        power_limit_w: Some(700.0),
        sm_clock_mhz: Some(1755),
        memory_clock_mhz: Some(2619),
        pcie_tx_bytes_per_s: Some(3 * MIB),
        pcie_rx_bytes_per_s: Some(2048),
        pcie_tx_counter: None,
        pcie_rx_counter: None,
        energy_mj: Some(123_456_789),
        throttle_reasons: vec!["sw_power_cap".into()],
        ecc_uncorrected: Some(0),
        processes: vec![
            ProcessSample {
                pid: 4242,
                name: "python".into(),
                used_memory_bytes: Some(40 * GIB),
                sm_util_pct: Some(95),
            },
            ProcessSample {
                pid: 77,
                name: "we\"ird\\name\nx".into(),
                used_memory_bytes: Some(MIB),
                sm_util_pct: None,
            },
            // NVML can list a process twice (compute and graphics).
            ProcessSample {
                pid: 4242,
                name: "python".into(),
                used_memory_bytes: Some(40 * GIB),
                sm_util_pct: Some(95),
            },
        ],
    };
    let sparse = GpuSample {
        unix_ms: 1_764_000_000_000,
        index: 1,
        uuid: UUID1.into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        pci_bus_id: "00000000:2A:00.0".into(),
        utilization_gpu_pct: Some(0),
        memory_used_bytes: Some(0),
        power_draw_w: Some(f64::NAN),
        sm_clock_mhz: Some(345),
        memory_clock_mhz: Some(2619),
        throttle_reasons: vec!["gpu_idle".into(), "some_future_reason".into()],
        ..GpuSample::default()
    };
    vec![full, sparse]
}

fn labels0() -> String {
    format!(
        "gpu=\"0\",UUID=\"{UUID0}\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",\
         modelName=\"NVIDIA H100 80GB \\\"HBM3\\\"\",Hostname=\"node-1\""
    )
}

fn labels1() -> String {
    format!(
        "gpu=\"1\",UUID=\"{UUID1}\",pci_bus_id=\"00000000:2A:00.0\",device=\"nvidia1\",\
         modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\""
    )
}

/// The families in `text` in order, from its TYPE lines.
fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect()
}

#[test]
fn exposition_has_dcgm_names_labels_and_one_header_per_family() {
    let text = exposition(&round(), "node-1");
    let fams = families(&text);
    let names: Vec<&str> = fams.iter().map(|(n, _)| n.as_str()).collect();
    let mut expected: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
    expected.extend([
        "gpukit_process_gpu_memory_used_bytes",
        "gpukit_process_sm_util_percent",
    ]);
    assert_eq!(names, expected);
    for (name, kind) in &fams {
        let help = format!("# HELP {name} ");
        let typ = format!("# TYPE {name} {kind}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with(&help)).count(),
            1,
            "{name}"
        );
        assert_eq!(text.lines().filter(|l| *l == typ).count(), 1, "{name}");
    }
    let kind = |n: &str| fams.iter().find(|(f, _)| f == n).map(|(_, k)| k.clone());
    assert_eq!(
        kind("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").as_deref(),
        Some("counter")
    );
    assert_eq!(kind("DCGM_FI_DEV_GPU_UTIL").as_deref(), Some("gauge"));

    // Every sample sits under its own family's header, each family in one block.
    let mut current = "";
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            current = rest.split(' ').next().unwrap_or_default();
        } else if !line.starts_with('#') {
            let name = line.split('{').next().unwrap_or_default();
            assert_eq!(name, current, "{line}");
        }
    }
    assert!(text.ends_with('\n'));

    let (l0, l1) = (labels0(), labels1());
    for line in [
        format!("DCGM_FI_DEV_GPU_UTIL{{{l0}}} 97"),
        format!("DCGM_FI_DEV_MEM_COPY_UTIL{{{l0}}} 41"),
        format!("DCGM_FI_DEV_FB_USED{{{l0}}} 40960"),
        format!("DCGM_FI_DEV_FB_FREE{{{l0}}} 40959"),
        format!("DCGM_FI_DEV_GPU_TEMP{{{l0}}} 64"),
        format!("DCGM_FI_DEV_POWER_USAGE{{{l0}}} 699.5"),
        format!("DCGM_FI_DEV_POWER_USAGE_INSTANT{{{l0}}} 701.25"),
        format!("DCGM_FI_DEV_POWER_MGMT_LIMIT{{{l0}}} 700"),
        format!("DCGM_FI_DEV_SM_CLOCK{{{l0}}} 1755"),
        format!("DCGM_FI_DEV_MEM_CLOCK{{{l0}}} 2619"),
        format!("DCGM_FI_DEV_PCIE_TX_THROUGHPUT{{{l0}}} 3072"),
        format!("DCGM_FI_DEV_PCIE_RX_THROUGHPUT{{{l0}}} 2"),
        format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{l0}}} 123456789"),
        format!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{l0}}} 0"),
        format!("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{l0}}} 4"),
        format!("DCGM_FI_DEV_GPU_UTIL{{{l1}}} 0"),
        format!("DCGM_FI_DEV_FB_USED{{{l1}}} 0"),
        format!("DCGM_FI_DEV_SM_CLOCK{{{l1}}} 345"),
        format!(
            "gpukit_process_gpu_memory_used_bytes{{gpu=\"0\",UUID=\"{UUID0}\",pid=\"4242\",\
             process=\"python\"}} 42949672960"
        ),
        format!(
            "gpukit_process_gpu_memory_used_bytes{{gpu=\"0\",UUID=\"{UUID0}\",pid=\"77\",\
             process=\"we\\\"ird\\\\name\\nx\"}} 1048576"
        ),
        format!(
            "gpukit_process_sm_util_percent{{gpu=\"0\",UUID=\"{UUID0}\",pid=\"4242\",\
             process=\"python\"}} 95"
        ),
    ] {
        assert_eq!(
            text.lines().filter(|l| *l == line).count(),
            1,
            "{line}\n{text}"
        );
    }
    // None (and NaN, and an unmappable throttle reason) is left out, never written as 0.
    for missing in [
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_POWER_USAGE_INSTANT",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    ] {
        let prefix = format!("{missing}{{gpu=\"1\"");
        assert!(!text.lines().any(|l| l.starts_with(&prefix)), "{missing}");
    }
    assert!(!text.contains("NaN"));
    assert_eq!(text.lines().filter(|l| l.contains("pid=\"77\"")).count(), 1);
    assert_eq!(
        text.lines().filter(|l| l.contains("pid=\"4242\"")).count(),
        2
    );
    // 15 DCGM samples for GPU 0, 4 for GPU 1; 2 + 1 process samples.
    assert_eq!(
        text.lines().filter(|l| !l.starts_with('#')).count(),
        15 + 4 + 3
    );
}

#[test]
fn throttle_mask_follows_nvml_bits() {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(throttle_mask(&[]), Some(0));
    assert_eq!(
        throttle_mask(&names(&["sw_power_cap", "sw_thermal"])),
        Some(0x24)
    );
    let all: Vec<&str> = gpukit_types::throttle::REASONS
        .iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(throttle_mask(&names(&all)), Some(0x1ff));
    assert_eq!(throttle_mask(&names(&["gpu_idle", "unknown"])), None);
}

#[test]
fn label_values_are_escaped() {
    let mut out = String::new();
    push_escaped(&mut out, "a\\b\"c\nd");
    assert_eq!(out, "a\\\\b\\\"c\\nd");
}

#[test]
fn empty_round_gives_empty_text_and_a_bare_gpu_only_its_mask() {
    assert_eq!(exposition(&[], "node-1"), "");
    let bare = GpuSample {
        index: 3,
        uuid: "GPU-x".into(),
        name: "x".into(),
        ..GpuSample::default()
    };
    // Every field None; an empty reason list means running free (mask 0), per GpuSample.
    let text = exposition(&[bare], "node-1");
    assert_eq!(families(&text).len(), 1, "{text}");
    assert!(text.contains("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu=\"3\""));
}

#[test]
fn repeated_gpu_is_written_once() {
    let mut r = round();
    r.push(r[0].clone());
    assert_eq!(exposition(&r, "node-1"), exposition(&round(), "node-1"));
}

/// One raw HTTP/1.1 request; returns the status, the header block and the body.
fn http(addr: &str, method: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let raw = String::from_utf8(raw).expect("utf-8");
    let (head, body) = raw.split_once("\r\n\r\n").expect("header end");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head.to_string(), body.to_string())
}

#[test]
fn serves_metrics_and_404_otherwise() {
    let exporter = Exporter::bind("127.0.0.1:0", false).expect("bind");
    let addr = exporter.local_addr();
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    assert!(!exporter
        .serve_one(Duration::from_millis(10), &|| String::new())
        .expect("idle"));

    let client = std::thread::spawn(move || {
        [
            http(&addr, "GET", "/metrics"),
            http(&addr, "GET", "/metrics?format=text"),
            http(&addr, "GET", "/"),
            http(&addr, "POST", "/metrics"),
        ]
    });
    let body = exposition(&round(), "node-1");
    for _ in 0..4 {
        assert!(exporter
            .serve_one(Duration::from_secs(20), &|| body.clone())
            .expect("serve"));
    }
    let answers = client.join().expect("client");
    for (status, head, got) in &answers[..2] {
        assert_eq!(*status, 200);
        assert!(head
            .to_ascii_lowercase()
            .contains(&format!("content-type: {CONTENT_TYPE}")));
        assert_eq!(got, &body);
    }
    for (status, _, _) in &answers[2..] {
        assert_eq!(*status, 404);
    }
}

/// Resident set size in KiB (VmRSS of /proc/self/status).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

const SCRAPE_CHILD: &str = "GPUKIT_PROMETHEUS_SCRAPE_CHILD";

#[test]
fn thousand_scrapes_leave_memory_flat() {
    // Other tests in this process allocate too: measure in a child running only this test.
    if std::env::var_os(SCRAPE_CHILD).is_none() {
        let module = module_path!()
            .split_once("::")
            .map(|(_, m)| m)
            .unwrap_or_default();
        let name = format!("{module}::thousand_scrapes_leave_memory_flat");
        let exe = std::env::current_exe().expect("test binary");
        let out = Command::new(exe)
            .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
            .env(SCRAPE_CHILD, "1")
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child failed");
        assert!(
            stdout.contains("1 passed"),
            "the child did not run the test"
        );
        return;
    }

    let exporter = Exporter::bind("127.0.0.1:0", false).expect("bind");
    let addr = exporter.local_addr();
    let mut gpus = Vec::new();
    for i in 0..8 {
        let mut g = round()[0].clone();
        g.index = i;
        g.uuid = format!("GPU-{i}");
        gpus.push(g);
    }
    let expected = exposition(&gpus, "node-1");
    let server = std::thread::spawn(move || {
        let current = || exposition(&gpus, "node-1");
        let mut served = 0;
        while served < 1000 {
            match exporter.serve_one(Duration::from_secs(20), &current) {
                Ok(true) => served += 1,
                _ => break,
            }
        }
        served
    });
    let mut after_first_half = 0;
    for i in 0..1000 {
        let (status, _, body) = http(&addr, "GET", "/metrics");
        assert_eq!(status, 200, "request {i}");
        assert_eq!(body, expected, "request {i}");
        if i == 499 {
            after_first_half = rss_kib();
        }
    }
    let after_all = rss_kib();
    assert_eq!(server.join().expect("server"), 1000);
    println!(
        "RSS after 500 scrapes: {after_first_half} KiB, after 1000: {after_all} KiB \
         ({} bytes of text a scrape)",
        expected.len()
    );
    assert!(
        after_all <= after_first_half + 1024,
        "RSS grew from {after_first_half} KiB to {after_all} KiB over the last 500 scrapes"
    );
}

#[test]
fn remote_address_needs_allow_remote() {
    match Exporter::bind("0.0.0.0:0", false) {
        Err(Error::BadInput(msg)) => {
            assert!(
                msg.contains("0.0.0.0:0") && msg.contains("loopback"),
                "{msg}"
            )
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("bound a remote address without allow_remote"),
    }
    let exporter = Exporter::bind("0.0.0.0:0", true).expect("allowed");
    assert!(exporter.local_addr().starts_with("0.0.0.0:"));
}

#[test]
fn port_in_use_or_bad_address_is_bad_input() {
    let first = Exporter::bind("127.0.0.1:0", false).expect("bind");
    let addr = first.local_addr();
    match Exporter::bind(&addr, false) {
        Err(Error::BadInput(msg)) => {
            assert!(msg.contains(&addr), "{msg}");
            assert!(msg.to_lowercase().contains("in use"), "{msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("bound {addr} twice"),
    }
    for bad in ["127.0.0.1", "127.0.0.1:99999", ""] {
        match Exporter::bind(bad, false) {
            Err(Error::BadInput(msg)) => assert!(msg.contains(&format!("on {bad}:")), "{msg}"),
            Err(e) => panic!("wrong error for {bad:?}: {e}"),
            Ok(_) => panic!("bound {bad:?}"),
        }
    }
}

const PARSE: &str = "import sys, json
from prometheus_client.parser import text_string_to_metric_families as p
fams = list(p(sys.stdin.read()))
print(len(fams))
print(json.dumps([[f.name, f.type, len(f.samples)] for f in fams]))
print(json.dumps(sorted({s.labels[k] for f in fams for s in f.samples
                     for k in ('modelName', 'process') if k in s.labels})))";

#[test]
fn prometheus_client_parses_the_text() {
    let present = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !present {
        assert!(
            std::env::var("GPUKIT_REQUIRE_PROMETHEUS_CLIENT").as_deref() != Ok("1"),
            "GPUKIT_REQUIRE_PROMETHEUS_CLIENT=1 but python3 cannot import prometheus_client"
        );
        println!("skipped: prometheus_client not installed");
        return;
    }
    for (round, want_families) in [(round(), 17usize), (Vec::new(), 0)] {
        let text = exposition(&round, "node-1");
        let mut child = Command::new("python3")
            .args(["-c", PARSE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 3, "{stdout}");
        assert_eq!(
            lines[0].parse::<usize>().ok(),
            Some(want_families),
            "{stdout}"
        );

        // Names, types and sample counts as the text has them.
        let parsed: Vec<(String, String, usize)> = serde_json::from_str(lines[1]).expect("json");
        let ours: Vec<(String, String, usize)> = families(&text)
            .into_iter()
            .map(|(name, kind)| {
                let prefix = format!("{name}{{");
                let n = text.lines().filter(|l| l.starts_with(&prefix)).count();
                (name, kind, n)
            })
            .collect();
        assert_eq!(parsed, ours);

        // Escaped label values come back as they were.
        let values: Vec<String> = serde_json::from_str(lines[2]).expect("json");
        let want: Vec<String> = if round.is_empty() {
            vec![]
        } else {
            vec![
                "NVIDIA H100 80GB \"HBM3\"".into(),
                "NVIDIA H100 80GB HBM3".into(),
                "python".into(),
                "we\"ird\\name\nx".into(),
            ]
        };
        assert_eq!(values, want);
    }
}
