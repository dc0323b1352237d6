use super::*;

/// Recorded rounds, handed out in order (the last one repeated).
struct Recorded {
    rounds: Vec<Round>,
    at: usize,
}

impl Source for Recorded {
    fn round(&mut self) -> Result<Round> {
        let r = self.rounds[self.at.min(self.rounds.len() - 1)].clone();
        self.at += 1;
        Ok(r)
    }
}

fn gpu(index: u32, t_ms: u64, util: u32, watts: f64, energy_mj: u64, throttled: bool) -> GpuSample {
    GpuSample {
        unix_ms: t_ms,
        index,
        uuid: format!("GPU-{index}"),
        name: "Test GPU".into(),
        utilization_gpu_pct: Some(util),
        memory_used_bytes: Some(u64::from(util) << 20),
        power_draw_w: Some(watts),
        power_limit_w: Some(700.0),
        energy_mj: Some(energy_mj),
        throttle_reasons: if throttled {
            vec!["sw_power_cap".into()]
        } else {
            vec!["gpu_idle".into()]
        },
        processes: vec![super::super::ProcessSample {
            pid: 42,
            name: "python3".into(),
            used_memory_bytes: Some(u64::from(util) << 21),
            sm_util_pct: Some(util),
        }],
        ..GpuSample::default()
    }
}

fn recorded() -> Recorded {
    Recorded {
        rounds: (0..5u64)
            .map(|i| {
                vec![
                    gpu(
                        0,
                        1000 + 100 * i,
                        10 * i as u32,
                        100.0 + 100.0 * i as f64,
                        50_000 + 20_000 * i,
                        i >= 3,
                    ),
                    gpu(1, 1000 + 100 * i, 0, 60.0, 7_000, false),
                ]
            })
            .collect(),
        at: 0,
    }
}

#[test]
fn the_loop_writes_a_csv_header_and_one_line_a_gpu_a_round_then_stops_at_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let (csv, jsonl) = (dir.path().join("g.csv"), dir.path().join("g.jsonl"));
    let opts = LogOptions {
        interval: Duration::from_millis(1),
        count: Some(4),
        duration: None,
        csv: Some(Sink::File(csv.clone())),
        jsonl: Some(Sink::File(jsonl.clone())),
    };
    let mut seen = 0;
    let n = sample_loop(&mut recorded(), &opts, &|| false, &mut |r| seen += r.len()).unwrap();
    assert_eq!((n, seen), (4, 8));
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 8);
    assert!(lines[0].starts_with("timestamp, index, name"));
    assert!(lines[1].contains(", 0, Test GPU, GPU-0,"), "{}", lines[1]);
    let json = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(json.lines().count(), 8);
    let back: GpuSample = serde_json::from_str(json.lines().nth(2).unwrap()).unwrap();
    assert_eq!(back.uuid, "GPU-0");
}

#[test]
fn the_loop_stops_at_the_duration_or_when_told() {
    let opts = LogOptions {
        interval: Duration::from_millis(20),
        count: None,
        duration: Some(Duration::from_millis(70)),
        csv: None,
        jsonl: None,
    };
    let n = sample_loop(&mut recorded(), &opts, &|| false, &mut |_| {}).unwrap();
    assert_eq!(n, 4, "rounds at 0, 20, 40 and 60 ms");
    let opts = LogOptions {
        duration: None,
        ..opts
    };
    let n = sample_loop(&mut recorded(), &opts, &|| true, &mut |_| {}).unwrap();
    assert_eq!(n, 1);
}

#[test]
fn an_unwritable_log_and_a_zero_interval_are_bad_input() {
    assert!(matches!(check_interval(0), Err(Error::BadInput(_))));
    assert!(check_interval(100).is_ok());
    let opts = LogOptions {
        interval: Duration::from_millis(1),
        count: Some(1),
        duration: None,
        csv: Some(Sink::File("/proc/nope/g.csv".into())),
        jsonl: None,
    };
    let e = sample_loop(&mut recorded(), &opts, &|| false, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("--csv"), "{e}");
}

#[test]
fn footprints_sum_peaks_energy_and_throttled_time() {
    let mut acc = Accumulator::default();
    let mut src = recorded();
    for _ in 0..5 {
        acc.add(&src.round().unwrap());
    }
    let (gpus, procs) = acc.finish();
    assert_eq!(gpus.len(), 2);
    let g = &gpus[0];
    assert_eq!(g.samples, 5);
    assert_eq!(g.peak_memory_bytes, Some(40 << 20));
    assert_eq!(g.max_utilization_pct, Some(40));
    assert_eq!(g.mean_utilization_pct, Some(20.0));
    assert_eq!(g.mean_power_w, Some(300.0));
    assert_eq!(g.max_power_w, Some(500.0));
    assert!((g.sampled_seconds - 0.4).abs() < 1e-9);
    assert_eq!(g.energy_j, Some(80.0));
    assert!((g.energy_from_power_j.unwrap() - 120.0).abs() < 1e-9);
    assert_eq!(g.power_for_energy.as_deref(), Some("average"));
    // two readings under the power cap, 100 ms each; idling is not throttling
    assert_eq!(g.throttled_seconds.get("sw_power_cap"), Some(&0.2));
    assert!(!gpus[1].throttled_seconds.contains_key("gpu_idle"));
    let p = procs.iter().find(|p| p.gpu == 0).unwrap();
    assert_eq!((p.pid, p.peak_memory_bytes), (42, 80 << 20));
}

#[test]
fn a_command_runs_its_exit_code_passes_through_and_a_missing_one_is_named() {
    let cmd = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let f = footprint(
        &cmd(&["sh", "-c", "sleep 0.05; exit 3"]),
        Ok(Box::new(recorded())),
        Duration::from_millis(10),
    )
    .unwrap();
    assert_eq!(f.exit_code, 3);
    assert!(f.seconds >= 0.05, "{}", f.seconds);
    assert_eq!(f.gpus.len(), 2);
    assert!(f.gpus[0].samples >= 2);
    // no NVML: the command still runs and is timed
    let f = footprint(
        &cmd(&["true"]),
        Err(Error::Unavailable("no NVML here".into())),
        Duration::from_millis(10),
    )
    .unwrap();
    assert_eq!(f.exit_code, 0);
    assert_eq!(f.not_sampled.as_deref(), Some("no NVML here"));
    let e = footprint(
        &cmd(&["gpukit-no-such-program"]),
        Ok(Box::new(recorded())),
        Duration::from_millis(10),
    )
    .unwrap_err();
    assert!(matches!(e, Error::CommandNotFound(ref p) if p == "gpukit-no-such-program"));
}

#[test]
fn energy_integrates_uneven_readings_and_prefers_instant_power() {
    // readings at 0, 100 and 400 ms: a flat 100 W then a ramp to 400 W
    let mut acc = Accumulator::default();
    for (t, avg, inst) in [(0u64, 50.0, 100.0), (100, 60.0, 100.0), (400, 70.0, 400.0)] {
        let mut s = gpu(0, t, 50, avg, 0, t == 400);
        s.power_instant_w = Some(inst);
        acc.add(&vec![s]);
    }
    let (gpus, _) = acc.finish();
    let g = &gpus[0];
    // 0.1 s x 100 W + 0.3 s x (100 + 400) / 2 W = 85 J (the averaged readings would give 19.5)
    assert!(
        (g.energy_from_power_j.unwrap() - 85.0).abs() < 1e-9,
        "{g:?}"
    );
    assert_eq!(g.power_for_energy.as_deref(), Some("instant"));
    // the throttled reading stands for the 300 ms since the one before it
    assert!((g.throttled_seconds["sw_power_cap"] - 0.3).abs() < 1e-9);
    // one reading without an instantaneous figure: the averaged ones are integrated instead
    let mut acc = Accumulator::default();
    for (t, inst) in [(0u64, Some(100.0)), (100, None)] {
        let mut s = gpu(0, t, 50, 80.0, 0, false);
        s.power_instant_w = inst;
        acc.add(&vec![s]);
    }
    let (gpus, _) = acc.finish();
    assert!((gpus[0].energy_from_power_j.unwrap() - 8.0).abs() < 1e-9);
    assert_eq!(gpus[0].power_for_energy.as_deref(), Some("average"));
}
