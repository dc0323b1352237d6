//! `gpukit monitor`: the live view, the logs, the Prometheus exporter and a command's
//! footprint, over gpukit-bench's sampler.

use crate::cli::MonitorArgs;
use crate::output::{emit, Output};
use crate::render;
use anyhow::{Context, Result};
use gpukit_bench::monitor::run::{
    check_interval, footprint, sample_loop, LogOptions, NvmlSource, Sink, Source,
};
use gpukit_bench::monitor::Round;
use gpukit_bench::report::Document;
use gpukit_bench::Error;
use gpukit_cuda::loader::discover;
use gpukit_cuda::nvml::Readings;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub fn monitor(a: MonitorArgs, out: &Output) -> Result<()> {
    let interval = check_interval(a.interval_ms)?;
    if let Some(d) = a.duration {
        if !(d.is_finite() && d > 0.0) {
            return Err(Error::BadInput(format!("--duration {d}: must be above 0 seconds")).into());
        }
    }
    if a.count == Some(0) {
        return Err(Error::BadInput("--count 0: must be at least 1".into()).into());
    }
    for (flag, sink) in [("--csv", &a.csv), ("--jsonl", &a.jsonl)] {
        if let Some(Sink::File(p)) = sink.as_deref().map(Sink::parse) {
            gpukit_types::files::check_writable_file(&p).map_err(|source| Error::Io {
                what: flag,
                path: p.clone(),
                source,
            })?;
        }
    }
    // NVML is opened by its absolute path: no re-execution with the loader's path extended,
    // so a command run under `monitor --` sees the environment it was given
    let discovery = discover();
    if !a.command.is_empty() {
        let source =
            NvmlSource::open(&discovery, Readings::ALL).map(|s| Box::new(s) as Box<dyn Source>);
        let f = match footprint(&a.command, source, interval) {
            Err(Error::CommandNotFound(p)) => {
                eprintln!("error: {p}: command not found");
                std::process::exit(127);
            }
            other => other?,
        };
        let code = f.exit_code;
        let sections = render::footprint_sections(&f);
        emit(
            &Document::new("monitor", f, None),
            out,
            Vec::new(),
            sections,
        )?;
        std::process::exit(code);
    }
    let exporter = a
        .prometheus
        .as_deref()
        .map(|addr| gpukit_bench::monitor::prometheus::Exporter::bind(addr, a.allow_remote))
        .transpose()?;
    let logging = a.csv.is_some() || a.jsonl.is_some() || exporter.is_some();
    let csv_only = a.csv.is_some() && a.jsonl.is_none() && exporter.is_none();
    let what = if csv_only {
        Readings {
            processes: false,
            energy: false,
        }
    } else {
        Readings::ALL
    };
    let mut source = NvmlSource::open(&discovery, what)?;
    let opts = LogOptions {
        interval,
        count: a.count,
        duration: a.duration.map(Duration::from_secs_f64),
        csv: a.csv.as_deref().map(Sink::parse),
        jsonl: a.jsonl.as_deref().map(Sink::parse),
    };
    if logging || a.count.is_some() || a.duration.is_some() {
        return log_and_export(&mut source, &opts, exporter);
    }
    if !std::io::stdout().is_terminal() {
        return Err(Error::BadInput(
            "the live view needs a terminal; for a log use --csv - (or --jsonl -) with \
             --count or --duration"
                .into(),
        )
        .into());
    }
    live(&mut source, interval)
}

/// Logs (and serves /metrics from another thread) until the count, the duration or Ctrl-C.
fn log_and_export(
    source: &mut dyn Source,
    opts: &LogOptions,
    exporter: Option<gpukit_bench::monitor::prometheus::Exporter>,
) -> Result<()> {
    let latest = Arc::new(Mutex::new(String::new()));
    let done = Arc::new(AtomicBool::new(false));
    let host = gpukit_bench::monitor::prometheus::hostname();
    let server = exporter.map(|ex| {
        eprintln!("serving /metrics at http://{}/metrics", ex.local_addr());
        let (latest, done) = (latest.clone(), done.clone());
        std::thread::spawn(move || {
            let current = || latest.lock().map(|s| s.clone()).unwrap_or_default();
            while !done.load(Ordering::Relaxed) {
                if let Err(e) = ex.serve_one(Duration::from_millis(200), &current) {
                    eprintln!("warning: /metrics: {e}");
                }
            }
        })
    });
    let result = sample_loop(source, opts, &|| false, &mut |round: &Round| {
        if let Ok(mut s) = latest.lock() {
            *s = gpukit_bench::monitor::prometheus::exposition(round, &host);
        }
    });
    done.store(true, Ordering::Relaxed);
    if let Some(t) = server {
        let _ = t.join();
    }
    result?;
    Ok(())
}

/// The live view: sample, draw, answer keys, until q.
fn live(source: &mut dyn Source, interval: Duration) -> Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyEventKind};
    use render::monitor::{draw, handle_key, History, ViewState};
    let minutes = (5 * 60 * 1000 / interval.as_millis().max(1)) as usize;
    let mut history = History::new(minutes.clamp(10, 3000));
    let mut state = ViewState {
        selected: None,
        paused: false,
        interval_ms: interval.as_millis() as u64,
    };
    let mut terminal = ratatui::init();
    let result = (|| -> Result<()> {
        let mut next = std::time::Instant::now();
        loop {
            if std::time::Instant::now() >= next {
                if !state.paused {
                    history.push(source.round()?);
                }
                next += interval;
            }
            terminal
                .draw(|f| draw(f, &history, &state))
                .context("drawing the live view")?;
            let wait = next.saturating_duration_since(std::time::Instant::now());
            if event::poll(wait).context("reading the keyboard")? {
                if let Event::Key(k) = event::read().context("reading the keyboard")? {
                    let gpus = history.gpus();
                    if k.kind == KeyEventKind::Press && !handle_key(&mut state, k.code, gpus) {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}
