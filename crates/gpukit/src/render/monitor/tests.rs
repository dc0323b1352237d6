use super::*;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const H100: &str = "NVIDIA H100 80GB HBM3";
const A100: &str = "NVIDIA A100-SXM4-40GB";

/// GPU `i` at round `t`: even GPUs are H100s at the power cap with two processes, odd ones
/// A100s that NVML tells less about (no ECC, PCIe or temperature).
fn gpu(i: u32, t: u64) -> GpuSample {
    let even = i.is_multiple_of(2);
    GpuSample {
        unix_ms: 1_700_000_000_000 + t * 500,
        index: i,
        uuid: format!("GPU-{i}a2b3c4d-0000-1111-2222-333344445555"),
        name: if even { H100 } else { A100 }.to_string(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
        utilization_gpu_pct: Some(((t * 7 + u64::from(i) * 13) % 101) as u32),
        utilization_memory_pct: Some(42),
        memory_used_bytes: Some(12 * (1 << 30) + (1 << 29)),
        memory_total_bytes: Some(if even { 80 } else { 40 } * (1 << 30)),
        temperature_c: even.then_some(65),
        power_draw_w: Some(if even {
            699.6
        } else {
            250.0 + (t % 100) as f64
        }),
        power_instant_w: None,
        power_limit_w: Some(if even { 700.0 } else { 400.0 }),
        sm_clock_mhz: Some(1980),
        memory_clock_mhz: Some(2619),
        pcie_tx_bytes_per_s: even.then_some(12_300_000),
        pcie_rx_bytes_per_s: even.then_some(4_500_000),
        pcie_tx_counter: None,
        pcie_rx_counter: None,
        energy_mj: Some(1_000_000 + t),
        throttle_reasons: if even {
            vec!["sw_power_cap".to_string()]
        } else {
            Vec::new()
        },
        ecc_uncorrected: even.then_some(0),
        processes: if even {
            vec![
                ProcessSample {
                    pid: 4242,
                    name: "python3".to_string(),
                    used_memory_bytes: Some(10 * (1 << 30)),
                    sm_util_pct: Some(80),
                },
                ProcessSample {
                    pid: 777,
                    name: "gpukit".to_string(),
                    used_memory_bytes: Some(512 << 20),
                    sm_util_pct: None,
                },
            ]
        } else {
            Vec::new()
        },
    }
}

fn state(interval_ms: u64) -> ViewState {
    ViewState {
        selected: None,
        paused: false,
        interval_ms,
    }
}

fn history(gpus: u32, rounds: u64) -> History {
    let mut h = History::new(600);
    for t in 0..rounds {
        h.push((0..gpus).map(|i| gpu(i, t)).collect());
    }
    h
}

fn render(w: u16, h: u16, history: &History, state: &ViewState) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| draw(f, history, state)).unwrap();
    let buf = term.backend().buffer();
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol()).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn monitor_view_zero_gpus() {
    let state = state(500);
    for (w, h) in [(80, 24), (200, 50)] {
        let empty = render(w, h, &History::new(10), &state);
        assert!(empty.contains("no GPU sampled yet"), "{empty}");
        let none = render(w, h, &history(0, 3), &state);
        assert!(none.contains("no GPU sampled"), "{none}");
        assert!(!none.contains("GPU 0"));
    }
}

#[test]
fn monitor_view_one_gpu() {
    let state = state(500);
    for (w, h) in [(80, 24), (200, 50)] {
        let text = render(w, h, &history(1, 40), &state);
        assert!(
            text.contains("GPU 0 · NVIDIA H100 80GB HBM3 · GPU-0a2b3c4d"),
            "{text}"
        );
        assert!(text.contains("700/700 W"), "{text}");
        assert!(text.contains("12.5/80.0 GiB"), "{text}");
        assert!(text.contains("sw_power_cap"), "{text}");
        assert!(text.contains("65 °C"), "{text}");
        assert!(text.contains("1980 MHz"), "{text}");
        assert!(text.contains("tx 12.3 rx 4.5 MB/s"), "{text}");
        assert!(text.contains("python3") && text.contains("4242"), "{text}");
        assert!(text.contains("10.0 GiB"), "{text}");
        // SM% of gpukit's process is unknown.
        assert!(text.contains("n/a"), "{text}");
        assert!(
            text.contains("SM util") && text.contains("last 19s"),
            "{text}"
        );
        assert!(
            text.contains("q quit") && text.contains("p pause"),
            "{text}"
        );
        assert!(!text.contains("paused"), "{text}");
    }
}

#[test]
fn monitor_view_none_fields_show_na() {
    let mut g = gpu(1, 0);
    g.utilization_gpu_pct = None;
    g.power_draw_w = None;
    g.memory_used_bytes = None;
    g.sm_clock_mhz = None;
    let mut h = History::new(10);
    h.push(vec![g]);
    for (w, rows) in [(80, 24), (200, 50), (40, 6)] {
        let text = render(w, rows, &h, &state(500));
        assert!(text.contains("temp n/a"), "{text}");
        assert!(text.contains("PCIe n/a"), "{text}");
        assert!(
            text.contains("SM n/a") || text.contains("SM util n/a"),
            "{text}"
        );
        assert!(
            text.contains("ECC uncorr. n/a") || text.contains("ECC n/a"),
            "{text}"
        );
        assert!(
            text.contains("SM clock n/a") || text.contains("clk n/a/2619 MHz"),
            "{text}"
        );
        assert!(text.contains("n/a / 400 W"), "{text}");
        assert!(text.contains("n/a / 40.0 GiB"), "{text}");
        assert!(
            !text.contains("0 °C") && !text.contains("0/400 W"),
            "{text}"
        );
    }
}

#[test]
fn monitor_view_eight_gpus() {
    let h = history(8, 700);
    let state = state(500);
    let small = render(80, 24, &h, &state);
    for i in 0..8 {
        assert!(small.contains(&format!("GPU {i} ")), "GPU {i}:\n{small}");
    }
    assert!(small.contains(H100) && small.contains(A100), "{small}");
    assert!(small.contains("q quit"), "{small}");
    assert!(small.contains("8 GPUs"), "{small}");
    let large = render(200, 50, &h, &state);
    for i in 0..8 {
        assert!(large.contains(&format!("GPU {i} ")), "GPU {i}:\n{large}");
    }
    assert!(
        large.contains("700/700 W") && large.contains("/400 W"),
        "{large}"
    );
    assert!(
        large.contains("PID") && large.contains("python3"),
        "{large}"
    );
    assert!(
        large.contains("SM util") && large.contains("last 4m59s"),
        "{large}"
    );
    assert!(large.contains("throttle none"), "{large}");
    assert!(large.contains("600/600 rounds"), "{large}");
}

#[test]
fn monitor_view_paused_marker() {
    let mut state = state(500);
    state.paused = true;
    for (w, h) in [(80, 24), (200, 50)] {
        for gpus in [0, 1, 8] {
            let text = render(w, h, &history(gpus, 5), &state);
            assert!(
                text.contains("paused") && text.contains("p resume"),
                "{text}"
            );
        }
    }
}

#[test]
fn monitor_view_selected_gpu_alone() {
    let h = history(8, 20);
    let mut state = state(500);
    state.selected = Some(3);
    for (w, rows) in [(80, 24), (200, 50)] {
        let text = render(w, rows, &h, &state);
        assert!(text.contains("GPU 3 · NVIDIA A100"), "{text}");
        for j in (0..8).filter(|j| *j != 3) {
            assert!(!text.contains(&format!("GPU {j} ")), "GPU {j}:\n{text}");
        }
        assert!(text.contains("showing 3 of 8"), "{text}");
    }
    // A GPU that left the round: all are shown.
    state.selected = Some(9);
    let text = render(200, 50, &h, &state);
    assert!(text.contains("GPU 0 ") && text.contains("GPU 7 "), "{text}");
}

#[test]
fn monitor_view_any_size_no_panic() {
    let mut full = history(8, 50);
    // Power above its limit and an empty name must not upset the gauges.
    let mut odd = gpu(8, 50);
    odd.power_draw_w = Some(900.0);
    odd.name.clear();
    odd.memory_total_bytes = Some(0);
    full.push((0..8).map(|i| gpu(i, 51)).chain([odd]).collect());
    for gpus in [full, history(1, 3), history(0, 1)] {
        for w in [
            1, 2, 5, 10, 20, 29, 30, 37, 38, 39, 40, 41, 60, 79, 80, 81, 120, 200, 250,
        ] {
            for h in [1, 2, 3, 4, 5, 7, 8, 9, 10, 16, 23, 24, 25, 50, 60] {
                render(w, h, &gpus, &state(100));
            }
        }
    }
}

#[test]
fn monitor_view_history_is_bounded() {
    let mut h = History::new(4);
    for t in 0..10 {
        h.push(vec![gpu(0, t)]);
    }
    assert_eq!(h.len(), 4);
    assert_eq!(h.gpus(), 1);
    assert_eq!(h.latest().unwrap()[0].unix_ms, gpu(0, 9).unix_ms);
    assert_eq!(h.series(0, |g| Some(g.unix_ms)).len(), 4);
    assert_eq!(h.span_ms(0), 3 * 500);
    assert_eq!(History::new(0).capacity(), 1);
}

#[test]
fn monitor_view_fit_averages_buckets() {
    let points: Vec<Option<u64>> = (0..1000).map(|i| Some(i / 100)).collect();
    assert_eq!(fit(&points, 10), (0..10).map(Some).collect::<Vec<_>>());
    assert_eq!(fit(&[None, None, Some(4), Some(6)], 2), vec![None, Some(5)]);
    assert_eq!(fit(&[Some(1)], 10), vec![Some(1)]);
}

#[test]
fn monitor_view_keys() {
    let mut s = state(500);
    assert!(!handle_key(&mut s, KeyCode::Char('q'), 8));
    assert!(!handle_key(&mut s, KeyCode::Esc, 8));
    assert!(handle_key(&mut s, KeyCode::Char('p'), 8));
    assert!(s.paused);
    assert!(handle_key(&mut s, KeyCode::Char('p'), 8));
    assert!(!s.paused);
    assert!(handle_key(&mut s, KeyCode::Char('7'), 8));
    assert_eq!(s.selected, Some(7));
    assert!(handle_key(&mut s, KeyCode::Char('8'), 8));
    assert_eq!(s.selected, Some(7), "GPU 8 does not exist");
    assert!(handle_key(&mut s, KeyCode::Char('a'), 8));
    assert_eq!(s.selected, None);
    assert!(handle_key(&mut s, KeyCode::Char('0'), 0));
    assert_eq!(s.selected, None, "no GPU to pick");
    assert!(handle_key(&mut s, KeyCode::Char('0'), 1));
    assert_eq!(s.selected, Some(0));
    handle_key(&mut s, KeyCode::Tab, 2);
    assert_eq!(s.selected, Some(1));
    handle_key(&mut s, KeyCode::Tab, 2);
    assert_eq!(s.selected, Some(0));
    handle_key(&mut s, KeyCode::BackTab, 2);
    assert_eq!(s.selected, Some(1));
    assert!(handle_key(&mut s, KeyCode::Char('x'), 2));
    assert_eq!(
        s,
        ViewState {
            selected: Some(1),
            paused: false,
            interval_ms: 500
        }
    );
}
