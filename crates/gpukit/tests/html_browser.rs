//! report.html in a real browser: `gpukit html` draws the run-67 H100 report, headless Chromium
//! loads it from disk, takes a screenshot (a sizeable PNG of more than one colour) and dumps the
//! DOM it built (every section there). Where no Chromium is on PATH the test is reported as
//! ignored, with the reason (`.ci/run` installs it where apt-get can).
//!
//! `GPUKIT_SCREENSHOT=FILE` keeps the screenshot.

mod common;

use common::bin;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// Runs `cmd`, killed after `limit`.
fn run_with_limit(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the browser starts");
    let started = Instant::now();
    // both pipes are drained while it runs: a full pipe would stall the browser
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                r.read_to_end(&mut v).ok();
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > limit {
            child.kill().ok();
            panic!("the browser ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn browser(exe: &Path, profile: &Path, args: &[String]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args([
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args);
    run_with_limit(cmd, Duration::from_secs(120))
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let exe = chromium();
    if exe.is_none() {
        eprintln!(
            "browser test ignored: no chromium, chromium-browser or google-chrome on PATH \
             (apt-get install chromium)"
        );
    }
    let ignored = exe.is_none();
    let trial = libtest_mimic::Trial::test("report_html_renders_in_a_browser", move || {
        if let Some(exe) = exe {
            report_html_renders_in_a_browser(exe);
        }
        Ok(())
    })
    .with_ignored_flag(ignored);
    libtest_mimic::run(&args, vec![trial]).exit();
}

/// Draws a real H100 `all` report (tests/fixtures), takes a screenshot and the DOM in headless Chromium, and checks the
/// page rendered: a large, varied image and every section in the DOM.
fn report_html_renders_in_a_browser(exe: PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let gz = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/all-h100.json.gz");
    let unzipped = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
    assert!(unzipped.status.success(), "gzip -dc {}", gz.display());
    let json = dir.path().join("report.json");
    std::fs::write(&json, unzipped.stdout).unwrap();
    let html = dir.path().join("report.html");
    let o = Command::new(bin())
        .arg("html")
        .arg(&json)
        .arg("--out")
        .arg(&html)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let url = format!("file://{}", html.display());

    let png_path = dir.path().join("shot.png");
    let profile = dir.path().join("profile");
    let o = browser(
        &exe,
        &profile,
        &[
            format!("--screenshot={}", png_path.display()),
            "--window-size=1280,4000".into(),
            url.clone(),
        ],
    );
    let bytes = std::fs::read(&png_path).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}): {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert!(bytes.len() > 20_000, "screenshot of {} bytes", bytes.len());
    let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1280, 4000));
    let px = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    let mut colours: Vec<&[u8]> = pixels.iter().step_by(7).copied().collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(colours.len() > 50, "{} colours", colours.len());
    // not blank: a fair share of the page is not the background
    let background = pixels[0];
    let inked = pixels.iter().filter(|p| **p != background).count();
    assert!(
        inked * 50 > pixels.len(),
        "{inked} of {} pixels drawn",
        pixels.len()
    );
    if let Some(keep) = std::env::var_os("GPUKIT_SCREENSHOT") {
        std::fs::copy(&png_path, keep).unwrap();
    }

    let o = browser(&exe, &profile, &["--dump-dom".into(), url]);
    let dom = String::from_utf8_lossy(&o.stdout);
    for id in [
        "machine",
        "check",
        "matmul",
        "bandwidth",
        "conv",
        "infer",
        "memory",
    ] {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "section {id} missing from the DOM: {}",
            &dom[..dom.len().min(2000)]
        );
    }
    assert!(
        dom.matches("<svg").count() >= 6,
        "the charts are in the DOM"
    );
}
