use super::*;

fn sample() -> GpuSample {
    GpuSample {
        unix_ms: 1_795_451_401_123,
        index: 0,
        uuid: "GPU-1234".into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        pci_bus_id: "00000000:00:06.0".into(),
        utilization_gpu_pct: Some(97),
        utilization_memory_pct: None,
        memory_used_bytes: Some(2048 << 20),
        memory_total_bytes: Some(81_559 << 20),
        temperature_c: Some(61),
        power_draw_w: Some(699.456),
        power_instant_w: Some(702.5),
        power_limit_w: Some(700.0),
        sm_clock_mhz: Some(1755),
        memory_clock_mhz: Some(2619),
        pcie_tx_bytes_per_s: Some(12_500_000),
        pcie_rx_bytes_per_s: None,
        pcie_tx_counter: None,
        pcie_rx_counter: None,
        energy_mj: Some(123_456_789),
        throttle_reasons: vec!["sw_power_cap".into()],
        ecc_uncorrected: Some(0),
        processes: Vec::new(),
    }
}

#[test]
fn csv_lines_follow_nvidia_smis_names_units_and_missing_marker() {
    let line = csv_line(&sample());
    let fields: Vec<&str> = line.split(", ").collect();
    let header: Vec<&str> = CSV_HEADER.split(", ").collect();
    assert_eq!(fields.len(), header.len(), "{line}");
    assert_eq!(fields[0], "2026/11/23 16:30:01.123");
    assert_eq!(fields[5], "97");
    assert_eq!(fields[6], "[N/A]");
    assert_eq!(fields[7], "2048");
    assert_eq!(fields[10], "699.46");
    assert_eq!(fields[11], "702.50");
    assert_eq!(fields[15], "0x0000000000000004");
    assert_eq!(fields[17], "[N/A]");
    let mut named = sample();
    named.name = "a, \"b\"".into();
    assert!(csv_line(&named).contains("\"a, \"\"b\"\"\""));
}

#[test]
fn timestamps_are_civil_utc_dates() {
    assert_eq!(timestamp(0), "1970/01/01 00:00:00.000");
    assert_eq!(timestamp(951_782_400_000), "2000/02/29 00:00:00.000");
    assert_eq!(timestamp(4_102_444_799_999), "2099/12/31 23:59:59.999");
}

#[test]
fn json_lines_round_trip() {
    let s = sample();
    let back: GpuSample = serde_json::from_str(&jsonl_line(&s)).unwrap();
    assert_eq!(back, s);
}
