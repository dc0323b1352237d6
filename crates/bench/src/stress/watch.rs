//! The NVML thread beside a stress run: every GPU sampled a few times a second (temperature,
//! power, clocks, throttle reasons) and critical XID events waited for between samples. What
//! NVML cannot read stays None ("not readable"), never zero.

use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::{GpuSample, NvmlSession, Readings, XidWait};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the GPUs are read.
const PERIOD_MS: u32 = 250;

/// A throttle reason and the share of the readings in which it was in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThrottleSeen {
    pub name: String,
    pub share: f64,
}

/// What NVML showed of one GPU over the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Watched {
    pub samples: u64,
    pub max_temperature_c: Option<u32>,
    pub max_power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub sm_clock_min_mhz: Option<u32>,
    pub sm_clock_median_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    /// Every throttle reason seen at least once, in NVML's bit order.
    pub throttle_seen: Vec<ThrottleSeen>,
    /// Critical XID events (the XID where NVML gave it).
    pub xid_events: Vec<Option<u64>>,
    /// Why XID events could not be watched, when they could not.
    pub xid_unreadable: Option<String>,
    /// Why this GPU could not be watched at all, when it could not.
    pub unreadable: Option<String>,
}

/// Every GPU's watch, by UUID.
pub struct WatchResults {
    by_uuid: HashMap<String, Watched>,
    failure: Option<String>,
}

impl WatchResults {
    pub fn get(&self, uuid: &str) -> Option<&Watched> {
        self.by_uuid.get(uuid)
    }

    /// Why NVML could not be watched, when it could not.
    pub fn failure(&self) -> Option<String> {
        self.failure.clone()
    }
}

/// The running watch.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<WatchResults>>,
}

impl Watcher {
    pub fn start(discovery: &Discovery) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let discovery = discovery.clone();
        let thread = std::thread::Builder::new()
            .name("stress-nvml".into())
            .spawn(move || watch(&discovery, &flag))
            .ok();
        Watcher { stop, thread }
    }

    /// Stops the thread and returns what it saw.
    pub fn stop(mut self) -> WatchResults {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            _ => WatchResults {
                by_uuid: HashMap::new(),
                failure: Some("the NVML sampling thread did not run".into()),
            },
        }
    }
}

/// Readings of one GPU as they come.
#[derive(Default)]
struct Accumulator {
    samples: u64,
    temperature: Vec<u32>,
    power: Vec<f64>,
    limit: Option<f64>,
    clocks: Vec<u32>,
    throttle_counts: HashMap<String, u64>,
    xids: Vec<Option<u64>>,
}

impl Accumulator {
    fn add(&mut self, s: &GpuSample) {
        self.samples += 1;
        self.temperature.extend(s.temperature_c);
        self.power.extend(s.power_instant_w.or(s.power_draw_w));
        self.limit = s.power_limit_w.or(self.limit);
        self.clocks.extend(s.sm_clock_mhz);
        for r in &s.throttle_reasons {
            *self.throttle_counts.entry(r.clone()).or_default() += 1;
        }
    }

    fn finish(self, xid_unreadable: Option<String>) -> Watched {
        summarise(self, xid_unreadable)
    }
}

/// The summary of one GPU's readings.
fn summarise(a: Accumulator, xid_unreadable: Option<String>) -> Watched {
    let mut clocks = a.clocks.clone();
    clocks.sort_unstable();
    let n = a.samples.max(1) as f64;
    let throttle_seen = gpukit_types::throttle::REASONS
        .iter()
        .filter_map(|r| {
            a.throttle_counts.get(r.name).map(|&c| ThrottleSeen {
                name: r.name.to_string(),
                share: c as f64 / n,
            })
        })
        .collect();
    Watched {
        samples: a.samples,
        max_temperature_c: a.temperature.iter().copied().max(),
        max_power_w: a
            .power
            .iter()
            .copied()
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x)))),
        power_limit_w: a.limit,
        sm_clock_min_mhz: clocks.first().copied(),
        sm_clock_median_mhz: clocks.get(clocks.len() / 2).copied(),
        sm_clock_max_mhz: clocks.last().copied(),
        throttle_seen,
        xid_events: a.xids,
        xid_unreadable,
        unreadable: (a.samples == 0).then(|| "NVML gave no reading".to_string()),
    }
}

fn watch(discovery: &Discovery, stop: &AtomicBool) -> WatchResults {
    let nvml = match NvmlSession::open(discovery) {
        Ok(n) => n,
        Err(e) => {
            return WatchResults {
                by_uuid: HashMap::new(),
                failure: Some(format!("NVML could not be opened: {e}")),
            }
        }
    };
    let readings = Readings {
        processes: false,
        energy: false,
    };
    let mut acc: HashMap<String, Accumulator> = HashMap::new();
    let mut index_uuid: HashMap<u32, String> = HashMap::new();
    let mut previous: Vec<GpuSample> = Vec::new();
    let count = nvml.devices().map(|d| d.len()).unwrap_or(0) as u32;
    let indices: Vec<u32> = (0..count).collect();
    let (xids, mut xid_unreadable) = match nvml.watch_xid(&indices) {
        Ok(w) => (Some(w), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut failure = None;
    loop {
        match nvml.sample_all(&previous, readings) {
            Ok(samples) => {
                for s in &samples {
                    index_uuid.insert(s.index, s.uuid.clone());
                    acc.entry(s.uuid.clone()).or_default().add(s);
                }
                previous = samples;
            }
            Err(e) => failure = Some(format!("NVML sampling failed: {e}")),
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match &xids {
            Some(w) => match w.wait(PERIOD_MS) {
                XidWait::Event { index, xid } => {
                    if let Some(u) = index_uuid.get(&index) {
                        acc.entry(u.clone()).or_default().xids.push(xid);
                    }
                }
                XidWait::Quiet => {}
                XidWait::Failed(e) => {
                    xid_unreadable = Some(format!("waiting for XID events failed: {e}"));
                    std::thread::sleep(Duration::from_millis(u64::from(PERIOD_MS)));
                }
            },
            None => std::thread::sleep(Duration::from_millis(u64::from(PERIOD_MS))),
        }
    }
    let by_uuid = acc
        .into_iter()
        .map(|(u, a)| (u, a.finish(xid_unreadable.clone())))
        .collect();
    WatchResults { by_uuid, failure }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(temp: Option<u32>, w: Option<f64>, clock: u32, reasons: &[&str]) -> GpuSample {
        GpuSample {
            temperature_c: temp,
            power_draw_w: w,
            power_limit_w: Some(700.0),
            sm_clock_mhz: Some(clock),
            throttle_reasons: reasons.iter().map(|r| r.to_string()).collect(),
            ..GpuSample::default()
        }
    }

    #[test]
    fn the_summary_keeps_maxima_shares_and_what_was_not_readable() {
        let mut a = Accumulator::default();
        a.add(&sample(Some(60), Some(650.0), 1980, &[]));
        a.add(&sample(Some(71), Some(699.0), 1755, &["sw_power_cap"]));
        a.add(&sample(None, None, 1830, &["sw_power_cap", "hw_thermal"]));
        a.add(&sample(Some(65), Some(690.0), 1800, &["sw_power_cap"]));
        let w = a.finish(Some("no permission".into()));
        assert_eq!(w.samples, 4);
        assert_eq!(w.max_temperature_c, Some(71));
        assert_eq!(w.max_power_w, Some(699.0));
        assert_eq!(w.power_limit_w, Some(700.0));
        assert_eq!(
            (w.sm_clock_min_mhz, w.sm_clock_max_mhz),
            (Some(1755), Some(1980))
        );
        let names: Vec<&str> = w.throttle_seen.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["sw_power_cap", "hw_thermal"]);
        assert_eq!(w.throttle_seen[0].share, 0.75);
        assert_eq!(w.xid_unreadable.as_deref(), Some("no permission"));
        assert!(w.unreadable.is_none());
    }

    #[test]
    fn temperature_never_read_stays_unknown_not_zero() {
        let mut a = Accumulator::default();
        a.add(&sample(None, None, 1000, &[]));
        let w = a.finish(None);
        assert_eq!(w.max_temperature_c, None);
        assert_eq!(w.max_power_w, None);
        assert!(Accumulator::default().finish(None).unreadable.is_some());
    }
}
