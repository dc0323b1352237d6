//! Sampling at a fixed interval: into logs until a count or a duration, or while a command runs
//! (its footprint: duration, peak memory per GPU and per process, utilisation, energy, time
//! throttled and why).

use super::log::{csv_line, jsonl_line, CSV_HEADER};
use super::{GpuSample, Round};
use crate::error::{Error, Result};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::{throttling, NvmlSession, Readings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where sampled rounds come from: NVML, or recorded rounds in tests.
pub trait Source {
    fn round(&mut self) -> Result<Round>;
    /// Whether the next rounds read the energy counter (a footprint needs its first and last
    /// readings only; the counter costs milliseconds of CPU a read).
    fn read_energy(&mut self, _on: bool) {}
}

/// Every GPU through NVML.
pub struct NvmlSource {
    session: NvmlSession,
    last: Round,
    what: Readings,
}

impl NvmlSource {
    /// Opens NVML; without a driver the error names what to install (exit 1).
    /// `what`: the costly readings to take (the CSV shows neither processes nor energy and
    /// skips both; the live view, JSON lines, the exporter and footprints take them).
    pub fn open(discovery: &Discovery, what: Readings) -> Result<NvmlSource> {
        let session = NvmlSession::open(discovery).map_err(|e| {
            Error::Unavailable(format!(
                "gpukit monitor reads the GPUs through NVML, which could not be opened: {e}"
            ))
        })?;
        Ok(NvmlSource {
            session,
            last: Vec::new(),
            what,
        })
    }
}

impl Source for NvmlSource {
    fn round(&mut self) -> Result<Round> {
        let round = self.session.sample_all(&self.last, self.what)?;
        self.last = round.clone();
        Ok(round)
    }

    fn read_energy(&mut self, on: bool) {
        self.what.energy = on;
    }
}

/// A log destination: stdout (`-`) or a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    File(PathBuf),
}

impl Sink {
    pub fn parse(s: &str) -> Sink {
        if s == "-" {
            Sink::Stdout
        } else {
            Sink::File(PathBuf::from(s))
        }
    }

    fn open(&self, what: &'static str) -> Result<Box<dyn Write>> {
        match self {
            Sink::Stdout => Ok(Box::new(std::io::stdout())),
            Sink::File(p) => std::fs::File::create(p)
                .map(|f| Box::new(std::io::BufWriter::new(f)) as Box<dyn Write>)
                .map_err(|source| Error::Io {
                    what,
                    path: p.clone(),
                    source,
                }),
        }
    }
}

/// When sampling stops and where rounds are written.
#[derive(Debug, Clone)]
pub struct LogOptions {
    pub interval: Duration,
    /// Stop after this many rounds.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    pub csv: Option<Sink>,
    pub jsonl: Option<Sink>,
}

/// Refuses an interval that cannot sample (0, or beyond a day).
pub fn check_interval(ms: u64) -> Result<Duration> {
    if ms == 0 || ms > 86_400_000 {
        return Err(Error::BadInput(format!(
            "--interval-ms {ms}: must be between 1 and 86400000"
        )));
    }
    Ok(Duration::from_millis(ms))
}

fn write_error(what: &'static str, sink: &Option<Sink>, source: std::io::Error) -> Error {
    Error::Io {
        what,
        path: match sink {
            Some(Sink::File(p)) => p.clone(),
            _ => PathBuf::from("-"),
        },
        source,
    }
}

/// Samples every `interval` (on a fixed schedule: a slow round does not shift the later ones)
/// until the count, the duration or `stop()`; writes each round to the logs (flushed every
/// round, so a log cut short keeps every whole line) and hands it to `on_round`. Returns the
/// rounds taken.
pub fn sample_loop(
    source: &mut dyn Source,
    opts: &LogOptions,
    stop: &dyn Fn() -> bool,
    on_round: &mut dyn FnMut(&Round),
) -> Result<u64> {
    let mut csv = opts.csv.as_ref().map(|s| s.open("--csv")).transpose()?;
    let mut jsonl = opts.jsonl.as_ref().map(|s| s.open("--jsonl")).transpose()?;
    if let Some(w) = csv.as_mut() {
        writeln!(w, "{CSV_HEADER}").map_err(|e| write_error("--csv", &opts.csv, e))?;
    }
    let start = Instant::now();
    let mut rounds = 0u64;
    loop {
        let round = source.round()?;
        if let Some(w) = csv.as_mut() {
            for s in &round {
                writeln!(w, "{}", csv_line(s)).map_err(|e| write_error("--csv", &opts.csv, e))?;
            }
            w.flush().map_err(|e| write_error("--csv", &opts.csv, e))?;
        }
        if let Some(w) = jsonl.as_mut() {
            for s in &round {
                writeln!(w, "{}", jsonl_line(s))
                    .map_err(|e| write_error("--jsonl", &opts.jsonl, e))?;
            }
            w.flush()
                .map_err(|e| write_error("--jsonl", &opts.jsonl, e))?;
        }
        on_round(&round);
        rounds += 1;
        if opts.count.is_some_and(|c| rounds >= c) || stop() {
            return Ok(rounds);
        }
        let next = opts.interval * rounds as u32;
        if opts.duration.is_some_and(|d| next > d) {
            return Ok(rounds);
        }
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

/// One GPU over a command's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GpuFootprint {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub samples: u64,
    pub peak_memory_bytes: Option<u64>,
    pub mean_utilization_pct: Option<f64>,
    pub max_utilization_pct: Option<u32>,
    pub mean_power_w: Option<f64>,
    pub max_power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    /// NVML's energy counter, last reading minus first (joules).
    pub energy_j: Option<f64>,
    /// The power readings integrated over time (trapezoids between readings), to check the
    /// counter against (joules).
    pub energy_from_power_j: Option<f64>,
    /// Which readings were integrated: "instant" or "average" (NVML's ~1 s average).
    #[serde(default)]
    pub power_for_energy: Option<String>,
    /// Seconds between the first and last reading.
    pub sampled_seconds: f64,
    /// Seconds the chip was held down, by reason (each reading counts its interval).
    pub throttled_seconds: BTreeMap<String, f64>,
}

/// A process's peak memory on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessPeak {
    pub gpu: u32,
    pub pid: u32,
    pub name: String,
    pub peak_memory_bytes: u64,
}

/// What a command did to the GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Footprint {
    pub command: Vec<String>,
    /// The command's exit code (128 + the signal when a signal ended it).
    pub exit_code: i32,
    pub seconds: f64,
    pub interval_ms: u64,
    pub gpus: Vec<GpuFootprint>,
    pub processes: Vec<ProcessPeak>,
    /// Why nothing was sampled (no NVML or no GPU): the command still ran.
    pub not_sampled: Option<String>,
}

/// Sums rounds into footprints, GPU by GPU (by UUID).
#[derive(Debug, Default)]
pub struct Accumulator {
    gpus: BTreeMap<String, (GpuFootprint, Vec<GpuSample>)>,
    processes: BTreeMap<(u32, u32), ProcessPeak>,
}

impl Accumulator {
    /// Adds one round. Each reading stands for the time since the GPU's previous one (the
    /// first for none), so throttled time follows the real spacing of the readings.
    pub fn add(&mut self, round: &Round) {
        for s in round {
            let (fp, kept) = self.gpus.entry(s.uuid.clone()).or_insert_with(|| {
                (
                    GpuFootprint {
                        index: s.index,
                        name: s.name.clone(),
                        uuid: s.uuid.clone(),
                        ..GpuFootprint::default()
                    },
                    Vec::new(),
                )
            });
            fp.samples += 1;
            fp.peak_memory_bytes = fp.peak_memory_bytes.max(s.memory_used_bytes);
            fp.max_utilization_pct = fp.max_utilization_pct.max(s.utilization_gpu_pct);
            fp.power_limit_w = s.power_limit_w.or(fp.power_limit_w);
            let since = kept.last().map_or(0.0, |p: &GpuSample| {
                s.unix_ms.saturating_sub(p.unix_ms) as f64 / 1e3
            });
            for r in s.throttle_reasons.iter().filter(|r| throttling(r)) {
                *fp.throttled_seconds.entry(r.clone()).or_default() += since;
            }
            kept.push(s.clone());
            for p in &s.processes {
                let used = p.used_memory_bytes.unwrap_or(0);
                let e = self
                    .processes
                    .entry((s.index, p.pid))
                    .or_insert_with(|| ProcessPeak {
                        gpu: s.index,
                        pid: p.pid,
                        name: p.name.clone(),
                        peak_memory_bytes: 0,
                    });
                e.peak_memory_bytes = e.peak_memory_bytes.max(used);
            }
        }
    }

    /// The footprints (means over the readings; energy from the counter and from power).
    pub fn finish(self) -> (Vec<GpuFootprint>, Vec<ProcessPeak>) {
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let mut gpus: Vec<GpuFootprint> = self
            .gpus
            .into_values()
            .map(|(mut fp, kept)| {
                fp.mean_utilization_pct = mean(
                    kept.iter()
                        .filter_map(|s| s.utilization_gpu_pct.map(f64::from))
                        .collect(),
                );
                let power: Vec<f64> = kept.iter().filter_map(|s| s.power_draw_w).collect();
                fp.max_power_w = power.iter().copied().reduce(f64::max);
                fp.mean_power_w = mean(power);
                let (first, last) = (kept.first(), kept.last());
                if let (Some(a), Some(b)) = (first, last) {
                    fp.sampled_seconds = b.unix_ms.saturating_sub(a.unix_ms) as f64 / 1e3;
                    fp.energy_j = a
                        .energy_mj
                        .zip(b.energy_mj)
                        .map(|(x, y)| y.saturating_sub(x) as f64 / 1e3);
                }
                // the instantaneous readings where every sample has one: the averaged reading
                // trails a change of load by about a second
                let instant = kept.iter().all(|s| s.power_instant_w.is_some());
                let watts = |s: &GpuSample| {
                    if instant {
                        s.power_instant_w
                    } else {
                        s.power_draw_w
                    }
                };
                fp.energy_from_power_j = integral(&kept, watts);
                fp.power_for_energy = fp
                    .energy_from_power_j
                    .map(|_| if instant { "instant" } else { "average" }.to_string());
                fp
            })
            .collect();
        gpus.sort_by_key(|g| g.index);
        (gpus, self.processes.into_values().collect())
    }
}

/// The time integral of `value` over readings (trapezoids; None without two readings that
/// both have a value).
fn integral(kept: &[GpuSample], value: impl Fn(&GpuSample) -> Option<f64>) -> Option<f64> {
    let mut total = None;
    for w in kept.windows(2) {
        if let (Some(a), Some(b)) = (value(&w[0]), value(&w[1])) {
            let dt = w[1].unix_ms.saturating_sub(w[0].unix_ms) as f64 / 1e3;
            if a.is_finite() && b.is_finite() {
                *total.get_or_insert(0.0) += 0.5 * (a + b) * dt;
            }
        }
    }
    total
}

/// Runs `command` (its output passes through), sampling every `interval` while it runs;
/// without a source (no NVML) it still runs the command and times it. A command that cannot
/// be started is an error naming it (the CLI exits 127 for one that does not exist, as shells
/// do).
pub fn footprint(
    command: &[String],
    mut source: Result<Box<dyn Source>>,
    interval: Duration,
) -> Result<Footprint> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Error::BadInput("monitor --: no command given".into()))?;
    let started = Instant::now();
    let mut child = std::process::Command::new(program)
        .args(args)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::CommandNotFound(program.clone()),
            _ => Error::Failed(format!("cannot start {program}: {e}")),
        })?;
    let mut acc = Accumulator::default();
    let mut not_sampled = None;
    let mut rounds = 0u32;
    let status = loop {
        if let Ok(s) = source.as_mut() {
            let round = s.round();
            // the energy counter at the first reading and the last only
            s.read_energy(false);
            match round {
                Ok(round) => acc.add(&round),
                Err(e) => {
                    not_sampled.get_or_insert(e.to_string());
                    source = Err(e);
                }
            }
        }
        // readings on a fixed schedule from the start (a slow reading does not push the
        // later ones back), never two at once after a stall
        rounds += 1;
        let next = (interval * rounds).max(started.elapsed());
        // wait for the command or the next reading, whichever comes first
        let exited = loop {
            let status = child
                .try_wait()
                .map_err(|e| Error::Failed(format!("waiting for {program}: {e}")))?;
            if status.is_some() || started.elapsed() >= next {
                break status;
            }
            std::thread::sleep(Duration::from_millis(1).min(interval));
        };
        if let Some(status) = exited {
            break status;
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    // one reading after the end, so the energy counter covers the whole run
    if let Ok(s) = source.as_mut() {
        s.read_energy(true);
        if let Ok(round) = s.round() {
            acc.add(&round);
        }
    }
    if let Err(e) = &source {
        not_sampled.get_or_insert(e.to_string());
    }
    let (gpus, processes) = acc.finish();
    Ok(Footprint {
        command: command.to_vec(),
        exit_code: exit_code(&status),
        seconds,
        interval_ms: interval.as_millis() as u64,
        gpus,
        processes,
        not_sampled,
    })
}

fn exit_code(status: &std::process::ExitStatus) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    status.code().unwrap_or(1)
}

#[cfg(test)]
mod tests;
