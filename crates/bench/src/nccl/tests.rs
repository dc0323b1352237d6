use super::*;

fn row(rank_times: Vec<f64>, wrong: u64) -> NcclRow {
    NcclRow {
        op: Collective::AllReduce,
        dtype: DType::F32,
        redop: Some(RedOp::Sum),
        root: None,
        bytes: 1 << 20,
        count: 1 << 18,
        out_of_place: Some(Figure::of(
            Collective::AllReduce,
            1 << 20,
            2,
            rank_times,
            wrong,
        )),
        in_place: None,
        status: RowStatus::Ok,
        pytorch: None,
    }
}

#[test]
fn figures_are_nccl_tests_arithmetic() {
    // 1 MiB all_reduce over 2 ranks at 10 us: algbw 104.9 GB/s, busbw x 2(n-1)/n = x1
    let f = Figure::of(Collective::AllReduce, 1 << 20, 2, vec![10.0, 10.0], 0);
    assert!((f.algbw_gbs - 104.8576).abs() < 1e-9);
    assert!((f.busbw_gbs - f.algbw_gbs).abs() < 1e-12);
    // the time is the mean over ranks (nccl-tests' default)
    let g = Figure::of(
        Collective::AllGather,
        1 << 20,
        4,
        vec![10.0, 20.0, 30.0, 40.0],
        0,
    );
    assert_eq!(g.time_us, 25.0);
    assert!((g.busbw_gbs - g.algbw_gbs * 0.75).abs() < 1e-12);
}

#[test]
fn merging_ranks_combines_times_and_wrong_counts() {
    let merged = merge(vec![vec![row(vec![10.0], 0)], vec![row(vec![30.0], 3)]], 2).unwrap();
    let f = merged[0].out_of_place.as_ref().unwrap();
    assert_eq!(f.rank_time_us, vec![10.0, 30.0]);
    assert_eq!(f.time_us, 20.0);
    assert_eq!(f.wrong, 3);
    // a wrong element anywhere fails the row, so the run cannot exit 0
    assert!(matches!(merged[0].status, RowStatus::Failed(ref m) if m.contains("3 output")));
    assert!(judge_rows(merged.iter().map(|r| &r.status)).is_some());
}

#[test]
fn ranks_that_measured_different_sweeps_are_an_error() {
    let e = merge(vec![vec![row(vec![1.0], 0)], vec![]], 2).unwrap_err();
    assert!(e.to_string().contains("same arguments"), "{e}");
    let mut other = row(vec![1.0], 0);
    other.bytes = 8;
    assert!(merge(vec![vec![row(vec![1.0], 0)], vec![other]], 2).is_err());
}

#[test]
fn options_that_cannot_be_measured_are_bad_input() {
    let bad = |f: &dyn Fn(&mut NcclOptions)| {
        let mut o = NcclOptions::default();
        f(&mut o);
        match check_options(&o) {
            Err(Error::BadInput(m)) => m,
            other => panic!("expected bad input, got {other:?}"),
        }
    };
    assert!(bad(&|o| o.min_bytes = 1 << 31).contains("--min-bytes"));
    assert!(bad(&|o| o.step_factor = 1).contains("--step-factor"));
    assert!(bad(&|o| o.iterations = 0).contains("--iterations"));
    assert!(bad(&|o| o.dtypes = vec![DType::F64]).contains("f64"));
    assert!(bad(&|o| o.redops = vec![RedOp::Prod]).contains("prod"));
    assert!(check_options(&NcclOptions::default()).is_ok());
}
