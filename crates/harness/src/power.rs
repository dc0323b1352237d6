//! Power beside timed work: a sampler thread reads the GPU every few milliseconds (NVML:
//! instantaneous power, SM clock, throttle reasons, the processes on it; never the energy
//! counter, whose read costs milliseconds of CPU) while a command runs,
//! and each benchmark row asks what the chip did during its own timed blocks.
//!
//! To use: [`PowerMeter::start`] once per command for the device it measures; wrap each timed
//! block in [`PowerMeter::timed`] with the row's [`Windows`]; [`PowerMeter::during`] summarises
//! the readings that fall inside them. Without NVML the meter is absent and rows carry no power.

use gpukit_cuda::loader::Discovery;
use gpukit_cuda::nvml::{NvmlSession, PowerReading};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the sampler reads the GPU.
const PERIOD: Duration = Duration::from_millis(10);
/// The process list is slower to read: every this many readings.
const PROCESS_EVERY: u32 = 10;
/// Fewer readings than this inside a row's blocks give no figure (blocks too short to read).
pub const MIN_READINGS: usize = 5;
/// A workload whose timed passes are too short to read runs again, untimed, in stretches of
/// this long (about 7 readings at [`PERIOD`]) until its draw settles ([`PowerMeter::steady`]).
pub const STRETCH_MS: f64 = 75.0;
/// The draw has settled when the median of a stretch's readings is within this share of the
/// stretch's before (a fixed 150 ms read 5-30% lower than 300 ms at batch 1 and 8 on an H100,
/// the board still ramping; the same at batch 32).
pub const SETTLED: f64 = 0.03;
/// The most stretches a workload runs for its power (600 ms).
pub const MAX_STRETCHES: usize = 8;
/// Share of a row's readings under a power or thermal limit past which the row is marked.
pub const THROTTLED_SHARE: f64 = 0.2;

/// What the chip did during a row's timed blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowPower {
    /// Readings inside the row's blocks.
    pub readings: usize,
    pub mean_w: f64,
    /// The median reading: the figure shown, as the gaps between blocks (a request to PyTorch,
    /// a synchronisation) pull the mean down without being the workload's draw.
    pub median_w: f64,
    pub max_w: f64,
    pub limit_w: Option<f64>,
    /// Whether the readings were NVML's instantaneous power (else its ~1 s average).
    pub instant: bool,
    pub mean_sm_clock_mhz: Option<f64>,
    /// Share of the readings held down for power or heat, by reason ("sw_power_cap", ...).
    pub throttled: BTreeMap<String, f64>,
    /// Processes other than gpukit (and its PyTorch peer) holding memory on the GPU meanwhile.
    pub other_processes: Vec<u32>,
}

impl RowPower {
    /// The largest share of readings held down by one reason, with the reason.
    pub fn worst_throttle(&self) -> Option<(&str, f64)> {
        self.throttled
            .iter()
            .map(|(r, s)| (r.as_str(), *s))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Whether the row ran under a power or thermal limit for a notable share of its time.
    pub fn throttled(&self) -> bool {
        self.worst_throttle()
            .is_some_and(|(_, s)| s >= THROTTLED_SHARE)
    }

    /// Units of work per joule for a rate of `per_second` units a second (at the median draw).
    pub fn per_joule(&self, per_second: f64) -> Option<f64> {
        (self.median_w > 0.0).then(|| per_second / self.median_w)
    }
}

/// The stretches of time a row's blocks ran.
#[derive(Debug, Default, Clone)]
pub struct Windows(Vec<(Instant, Instant)>);

impl Windows {
    fn contains(&self, t: Instant) -> bool {
        self.0.iter().any(|&(a, b)| a <= t && t <= b)
    }
}

struct Reading {
    at: Instant,
    r: PowerReading,
}

/// A sampler thread over one GPU, for as long as it lives.
pub struct PowerMeter {
    readings: Arc<Mutex<Vec<Reading>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    limit_w: Option<f64>,
    /// Processes that are part of the measurement (gpukit itself, its PyTorch peer).
    own: Mutex<Vec<u32>>,
}

impl PowerMeter {
    /// Starts sampling the GPU with this UUID; None without NVML or the device.
    pub fn start(discovery: &Discovery, uuid: &str) -> Option<PowerMeter> {
        let session = NvmlSession::open(discovery).ok()?;
        let index = session.index_of(uuid).ok()?;
        session.power_reading(index, false).ok()?;
        let limit_w = session.power_limit_w(index);
        let readings = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (readings.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gpukit-power".into())
            .spawn(move || sample(&session, index, &r, &s))
            .ok()?;
        Some(PowerMeter {
            readings,
            stop,
            thread: Some(thread),
            limit_w,
            own: Mutex::new(vec![std::process::id()]),
        })
    }

    /// Starts sampling CUDA device `ordinal` (found in NVML by its UUID).
    pub fn for_ordinal(discovery: &Discovery, ordinal: usize) -> Option<PowerMeter> {
        let d = gpukit_cuda::driver::probe(discovery).ok()?;
        let a = gpukit_cuda::driver::device_attributes(ordinal, d.device_count).ok()?;
        PowerMeter::start(discovery, &a.uuid)
    }

    /// Counts `pid` as part of the measurement (the PyTorch peer's server).
    pub fn own_process(&self, pid: u32) {
        if let Ok(mut own) = self.own.lock() {
            own.push(pid);
        }
    }

    /// Runs `f`, adding the time it took to `w`.
    pub fn timed<T>(&self, w: &mut Windows, f: impl FnOnce() -> T) -> T {
        let a = Instant::now();
        let out = f();
        w.0.push((a, Instant::now()));
        out
    }

    /// The draw of a workload whose timed passes are too short to read: `stretch` (which runs
    /// it for about [`STRETCH_MS`], untimed) is called until the median of its last stretch's
    /// readings is within [`SETTLED`] of the one before, at least twice and at most
    /// [`MAX_STRETCHES`] times; the figure is the last two stretches' readings. None when a
    /// stretch fails or the readings are too few.
    pub fn steady<E>(&self, mut stretch: impl FnMut() -> Result<(), E>) -> Option<RowPower> {
        let mut windows: Vec<Windows> = Vec::new();
        let mut medians: Vec<f64> = Vec::new();
        for _ in 0..MAX_STRETCHES {
            let mut w = Windows::default();
            self.timed(&mut w, &mut stretch).ok()?;
            medians.push(self.during(&w).map_or(f64::NAN, |p| p.median_w));
            windows.push(w);
            if settled(&medians) {
                break;
            }
        }
        let mut last_two = Windows::default();
        for w in windows.iter().rev().take(2) {
            last_two.0.extend(w.0.iter().copied());
        }
        self.during(&last_two)
    }

    /// The readings inside `w`, summarised; None when none fell inside (blocks too short).
    pub fn during(&self, w: &Windows) -> Option<RowPower> {
        let readings = self.readings.lock().ok()?;
        let own = self.own.lock().ok()?.clone();
        let inside: Vec<&PowerReading> = readings
            .iter()
            .filter(|x| w.contains(x.at))
            .map(|x| &x.r)
            .collect();
        summarise(&inside, self.limit_w, &own)
    }
}

impl Drop for PowerMeter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn sample(session: &NvmlSession, index: u32, out: &Mutex<Vec<Reading>>, stop: &AtomicBool) {
    let start = Instant::now();
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        if let Ok(r) = session.power_reading(index, n.is_multiple_of(PROCESS_EVERY)) {
            if let Ok(mut v) = out.lock() {
                v.push(Reading {
                    at: Instant::now(),
                    r,
                });
            }
        }
        n += 1;
        // a fixed schedule from the start; after a stall, carry on from now
        let next = (PERIOD * n).max(start.elapsed());
        std::thread::sleep(next.saturating_sub(start.elapsed()));
    }
}

/// Whether the last two stretches' median draws (`medians`, in order) agree within [`SETTLED`].
fn settled(medians: &[f64]) -> bool {
    match medians {
        [.., a, b] if a.is_finite() && b.is_finite() => (a - b).abs() <= SETTLED * a.max(*b),
        _ => false,
    }
}

/// Summarises readings taken during a row (`own`: processes that belong to the measurement).
pub fn summarise(
    readings: &[&PowerReading],
    limit_w: Option<f64>,
    own: &[u32],
) -> Option<RowPower> {
    let mut watts: Vec<f64> = readings
        .iter()
        .filter_map(|r| r.power_w)
        .filter(|w| w.is_finite())
        .collect();
    if watts.len() < MIN_READINGS {
        return None;
    }
    watts.sort_by(f64::total_cmp);
    let n = readings.len() as f64;
    let clocks: Vec<f64> = readings
        .iter()
        .filter_map(|r| r.sm_clock_mhz.map(f64::from))
        .collect();
    let mut throttled: BTreeMap<String, f64> = BTreeMap::new();
    for r in readings {
        for reason in r
            .throttle_reasons
            .iter()
            .filter(|x| gpukit_cuda::nvml::throttling(x))
        {
            *throttled.entry(reason.clone()).or_default() += 1.0 / n;
        }
    }
    let mut other_processes: Vec<u32> = readings
        .iter()
        .filter_map(|r| r.pids.as_ref())
        .flatten()
        .copied()
        .filter(|p| !own.contains(p))
        .collect();
    other_processes.sort_unstable();
    other_processes.dedup();
    Some(RowPower {
        readings: watts.len(),
        mean_w: watts.iter().sum::<f64>() / watts.len() as f64,
        median_w: crate::stats::Summary::of(&watts).map_or(f64::NAN, |s| s.median),
        max_w: watts.iter().copied().fold(f64::MIN, f64::max),
        limit_w,
        instant: readings.iter().all(|r| r.instant),
        mean_sm_clock_mhz: (!clocks.is_empty())
            .then(|| clocks.iter().sum::<f64>() / clocks.len() as f64),
        throttled,
        other_processes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(w: f64, clock: u32, reasons: &[&str], pids: Option<Vec<u32>>) -> PowerReading {
        PowerReading {
            power_w: Some(w),
            instant: true,
            sm_clock_mhz: Some(clock),
            throttle_reasons: reasons.iter().map(|r| r.to_string()).collect(),
            pids,
        }
    }

    #[test]
    fn a_rows_readings_give_mean_power_clock_throttle_shares_and_strangers() {
        let rs = [
            reading(600.0, 1980, &[], Some(vec![10, 11, 99])),
            reading(700.0, 1700, &["sw_power_cap"], None),
            reading(690.0, 1650, &["sw_power_cap", "gpu_idle"], None),
            reading(f64::NAN, 1650, &["sw_thermal"], Some(vec![10])),
            reading(120.0, 1980, &[], None),
            reading(695.0, 1650, &["sw_power_cap"], None),
            reading(698.0, 1700, &["sw_power_cap"], None),
            reading(f64::NAN, 1700, &[], None),
        ];
        let refs: Vec<&PowerReading> = rs.iter().collect();
        let p = summarise(&refs, Some(700.0), &[10, 11]).unwrap();
        assert_eq!(p.readings, 6);
        assert!((p.mean_w - 583.833_333_333).abs() < 1e-6, "{p:?}");
        // the idle gap's reading pulls the mean down, not the median
        assert_eq!(p.median_w, 692.5);
        assert_eq!(p.max_w, 700.0);
        assert_eq!(p.mean_sm_clock_mhz, Some(1751.25));
        assert_eq!(p.throttled.get("sw_power_cap"), Some(&0.5));
        assert_eq!(p.throttled.get("sw_thermal"), Some(&0.125));
        assert!(!p.throttled.contains_key("gpu_idle"));
        assert_eq!(p.worst_throttle(), Some(("sw_power_cap", 0.5)));
        assert!(p.throttled());
        assert_eq!(p.other_processes, vec![99]);
        assert!((p.per_joule(692.5 * 2.0).unwrap() - 2.0).abs() < 1e-9);
        assert!(p.instant);
    }

    #[test]
    fn no_readings_no_figure_and_a_free_chip_is_not_marked() {
        assert_eq!(summarise(&[], None, &[]), None);
        let rs = [300.0, 310.0, 305.0, 302.0].map(|w| reading(w, 1980, &[], None));
        let refs: Vec<&PowerReading> = rs.iter().collect();
        assert_eq!(summarise(&refs, None, &[]), None, "4 readings are too few");
        let rs = [300.0, 310.0, 305.0, 302.0, 301.0].map(|w| reading(w, 1980, &[], None));
        let refs: Vec<&PowerReading> = rs.iter().collect();
        let p = summarise(&refs, None, &[]).unwrap();
        assert!(!p.throttled());
        assert_eq!(p.worst_throttle(), None);
    }

    /// A meter without a sampler thread, whose readings the test writes.
    fn fake_meter() -> (PowerMeter, Arc<Mutex<Vec<Reading>>>) {
        let readings = Arc::new(Mutex::new(Vec::new()));
        let meter = PowerMeter {
            readings: readings.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
            limit_w: None,
            own: Mutex::new(Vec::new()),
        };
        (meter, readings)
    }

    /// One stretch: 6 readings of `w` watts, each taken inside it.
    fn stretch_of(readings: &Mutex<Vec<Reading>>, w: f64) {
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(1));
            let r = reading(w, 1980, &[], None);
            readings.lock().unwrap().push(Reading {
                at: Instant::now(),
                r,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    #[test]
    fn steady_power_runs_until_two_stretches_agree_and_reports_the_last_two() {
        let (meter, readings) = fake_meter();
        // a board ramping up: 300, 360, 400, then 404 W (within 3% of 400)
        let draws = [300.0, 360.0, 400.0, 404.0, 404.0];
        let mut runs = 0;
        let p = meter
            .steady(|| -> Result<(), ()> {
                stretch_of(&readings, draws[runs]);
                runs += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(runs, 4);
        assert_eq!(p.readings, 12, "the last two stretches' readings only");
        assert_eq!(p.median_w, 402.0);
        // a draw that never settles stops at the most stretches
        let (meter, readings) = fake_meter();
        let mut runs = 0;
        let p = meter
            .steady(|| -> Result<(), ()> {
                stretch_of(&readings, if runs % 2 == 0 { 300.0 } else { 400.0 });
                runs += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(runs, MAX_STRETCHES);
        assert_eq!(p.readings, 12);
        // a failed stretch gives no figure
        let (meter, _) = fake_meter();
        assert_eq!(meter.steady(|| Err::<(), ()>(())), None);
    }

    #[test]
    fn the_draw_settles_when_two_stretches_agree() {
        assert!(!settled(&[]));
        assert!(!settled(&[400.0]));
        // still ramping: 10% apart, then 2%
        assert!(!settled(&[360.0, 400.0]));
        assert!(settled(&[360.0, 400.0, 408.0]));
        assert!(settled(&[500.0, 500.0]));
        // a stretch too short to read never counts as settled
        assert!(!settled(&[f64::NAN, 400.0]));
        assert!(!settled(&[400.0, f64::NAN]));
    }

    #[test]
    fn windows_hold_the_blocks_they_timed() {
        let t0 = Instant::now();
        let mut w = Windows::default();
        w.0.push((t0, t0 + Duration::from_millis(5)));
        assert!(w.contains(t0 + Duration::from_millis(2)));
        assert!(!w.contains(t0 + Duration::from_millis(6)));
    }
}
