//! Tests of the thread team through `parallel_ranges`: coverage under concurrent and nested
//! calls, and panics.

use super::*;

/// Every index is visited exactly once per call, with calls from several threads at once
/// and calls nested inside a share (which must not wait for the team it runs on).
#[test]
fn parallel_ranges_cover_everything_once_concurrently_and_nested() {
    const COUNT: usize = 1000;
    let outer: Vec<AtomicUsize> = (0..COUNT).map(|_| AtomicUsize::new(0)).collect();
    let inner = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..50 {
                    parallel_ranges(COUNT, &|range| {
                        for i in range {
                            outer[i].fetch_add(1, Ordering::Relaxed);
                        }
                        parallel_ranges(3, &|r| {
                            inner.fetch_add(r.len(), Ordering::Relaxed);
                        });
                    });
                }
            });
        }
    });
    assert!(outer.iter().all(|c| c.load(Ordering::Relaxed) == 200));
    let shares = threads().min(COUNT);
    assert_eq!(inner.load(Ordering::Relaxed), 200 * shares * 3);
    parallel_ranges(0, &|r| assert!(r.is_empty()));
}

#[test]
fn a_panicking_share_panics_the_caller_and_the_team_goes_on() {
    // the first share is the caller's own, the last a team thread's (with > 1 thread)
    for bad in [0, threads() * 4 - 1] {
        let result = std::panic::catch_unwind(|| {
            parallel_ranges(threads() * 4, &|r| {
                assert!(!r.contains(&bad), "share with {bad} panics");
            })
        });
        assert!(result.is_err(), "{bad}");
    }
    let sum = AtomicUsize::new(0);
    parallel_ranges(100, &|r| {
        sum.fetch_add(r.sum::<usize>(), Ordering::Relaxed);
    });
    assert_eq!(sum.load(Ordering::Relaxed), 4950);
}
