//! Ranks as threads of this process, on 127.0.0.1 and ports the OS picks; losses are reported
//! (OnLost::Report), not turned into exits (the process tests in tests/ cover those).

use super::join::bind_host;
use super::*;
use crate::world::Launcher;
use gpukit_types::ErrorKind;
use std::io::Read;

const HOST: &str = "testhost";

fn world(rank: usize, world_size: usize, port: u16) -> World {
    World {
        rank,
        world_size,
        local_rank: rank,
        local_world_size: Some(world_size),
        launcher: Launcher::Gpukit,
        rendezvous: Endpoint {
            host: "127.0.0.1".into(),
            port,
        },
        hostname: HOST.into(),
    }
}

fn options(timeout_ms: u64) -> Options {
    Options {
        timeout: Duration::from_millis(timeout_ms),
        on_lost: OnLost::Report,
    }
}

fn nccl_id() -> std::result::Result<Vec<u8>, String> {
    Ok((0..128).collect())
}

fn listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test port");
    let port = listener.local_addr().expect("local address").port();
    (listener, port)
}

/// Joins as `rank`: rank 0 on the test's listener, the others by connecting.
fn join(
    rank: usize,
    world_size: usize,
    port: u16,
    listener: Option<TcpListener>,
    timeout_ms: u64,
) -> Result<Session> {
    let me = world(rank, world_size, port);
    match listener {
        Some(listener) => join_as_root(&me, options(timeout_ms), nccl_id, listener),
        None => Session::join(&me, options(timeout_ms), nccl_id),
    }
}

/// Runs `body` for each of `ranks` (0 among them, on a fresh port) in its own thread, after
/// joining a world of `world_size`; returns each rank's result in the order of `ranks`.
fn run<T: Send>(
    world_size: usize,
    ranks: &[usize],
    timeout_ms: u64,
    body: impl Fn(usize, Result<Session>) -> T + Sync,
) -> Vec<T> {
    let (listener, port) = listener();
    let mut listener = Some(listener);
    thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|&rank| {
                let mine = if rank == 0 { listener.take() } else { None };
                let body = &body;
                scope.spawn(move || body(rank, join(rank, world_size, port, mine, timeout_ms)))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a rank thread panicked"))
            .collect()
    })
}

fn message(result: &Result<impl fmt::Debug>) -> String {
    match result {
        Err(error) => error.to_string(),
        Ok(value) => panic!("expected an error, got {value:?}"),
    }
}

#[test]
fn sessions_can_move_between_threads() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Session>();
}

#[test]
fn four_ranks_receive_rank_0s_blob() {
    let results = run(4, &[0, 1, 2, 3], 10_000, |rank, session| {
        let session = session.expect("join");
        assert_eq!((session.rank(), session.world_size()), (rank, 4));
        let blob = session.blob().to_vec();
        session.finish().expect("finish");
        blob
    });
    for blob in results {
        assert_eq!(blob, nccl_id().unwrap());
    }
}

#[test]
fn all_gather_returns_every_rank_in_order() {
    let results = run(4, &[3, 1, 0, 2], 10_000, |rank, session| {
        let session = session.expect("join");
        let first = session
            .all_gather(&vec![rank as u8; rank])
            .expect("first all_gather");
        let second = session
            .all_gather(format!("rank {rank}").as_bytes())
            .expect("second all_gather");
        session.barrier().expect("barrier");
        session.barrier().expect("barrier");
        session.finish().expect("finish");
        (first, second)
    });
    for (first, second) in results {
        assert_eq!(first, vec![vec![], vec![1], vec![2, 2], vec![3, 3, 3]]);
        let second: Vec<String> = second
            .into_iter()
            .map(|bytes| String::from_utf8(bytes).unwrap())
            .collect();
        assert_eq!(second, ["rank 0", "rank 1", "rank 2", "rank 3"]);
    }
}

#[test]
fn a_barrier_waits_for_the_slowest_rank() {
    let waits = run(3, &[0, 1, 2], 10_000, |rank, session| {
        let session = session.expect("join");
        session.barrier().expect("first barrier");
        if rank == 2 {
            thread::sleep(Duration::from_millis(300));
        }
        let started = Instant::now();
        session.barrier().expect("second barrier");
        let waited = started.elapsed();
        session.finish().expect("finish");
        (rank, waited)
    });
    for (rank, waited) in waits {
        if rank != 2 {
            assert!(
                waited >= Duration::from_millis(250),
                "rank {rank} waited {waited:?}"
            );
        }
    }
}

#[test]
fn a_world_of_one_needs_no_network() {
    let session = Session::join(&world(0, 1, 1), options(1000), nccl_id).expect("join");
    assert_eq!(session.blob(), nccl_id().unwrap().as_slice());
    assert_eq!(session.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
    session.barrier().unwrap();
    session.abort("nothing to tell");
    session.finish().unwrap();
}

#[test]
fn a_rank_that_never_arrives_fails_everyone_within_the_timeout() {
    let started = Instant::now();
    let results = run(4, &[0, 1, 2], 1000, |_, session| session.map(|_| ()));
    let elapsed = started.elapsed();
    for result in &results {
        let text = message(result);
        assert!(text.contains("rank 3 did not arrive within 1 s"), "{text}");
        assert!(text.contains("MASTER_ADDR/MASTER_PORT"), "{text}");
        assert_eq!(result.as_ref().unwrap_err().kind(), ErrorKind::Unavailable);
    }
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
}

#[test]
fn several_missing_ranks_are_listed() {
    let results = run(4, &[0, 2], 500, |_, session| session.map(|_| ()));
    for result in &results {
        let text = message(result);
        assert!(
            text.contains("ranks 1, 3 did not arrive within 0.5 s"),
            "{text}"
        );
    }
}

#[test]
fn a_world_size_mismatch_reaches_every_connected_rank() {
    let (listener, port) = listener();
    thread::scope(|scope| {
        let root = scope.spawn(move || join(0, 3, port, Some(listener), 5000).map(|_| ()));
        let good = scope.spawn(move || join(1, 3, port, None, 5000).map(|_| ()));
        // Rank 1 is in before the odd one out arrives.
        thread::sleep(Duration::from_millis(300));
        let odd = scope.spawn(move || join(2, 4, port, None, 5000).map(|_| ()));
        for handle in [root, good, odd] {
            let result = handle.join().expect("rank thread");
            let text = message(&result);
            assert!(
                text.contains("rank 2 says WORLD_SIZE=4 but rank 0 has 3"),
                "{text}"
            );
            assert_eq!(result.unwrap_err().kind(), ErrorKind::BadInput);
        }
    });
}

#[test]
fn a_duplicate_rank_is_refused() {
    let (listener, port) = listener();
    thread::scope(|scope| {
        let root = scope.spawn(move || join(0, 3, port, Some(listener), 5000).map(|_| ()));
        let first = scope.spawn(move || join(1, 3, port, None, 5000).map(|_| ()));
        thread::sleep(Duration::from_millis(300));
        let second = scope.spawn(move || join(1, 3, port, None, 5000).map(|_| ()));
        for handle in [root, first, second] {
            let result = handle.join().expect("rank thread");
            let text = message(&result);
            assert!(text.contains("two processes say they are rank 1"), "{text}");
        }
    });
}

#[test]
fn a_port_in_use_is_named() {
    let (_taken, port) = listener();
    let mut me = world(0, 2, port);
    me.launcher = Launcher::Torchrun;
    let error = Session::join(&me, options(1000), nccl_id).unwrap_err();
    let text = error.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("in use"), "{text}");
    assert!(text.contains("GPUKIT_RDZV_PORT"), "{text}");
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    me.launcher = Launcher::Gpukit;
    let text = Session::join(&me, options(1000), nccl_id)
        .unwrap_err()
        .to_string();
    assert!(text.contains("--master-port"), "{text}");
}

#[test]
fn an_unreachable_rank_0_is_reported_after_retrying() {
    let port = {
        let (listener, port) = listener();
        drop(listener);
        port
    };
    let started = Instant::now();
    let text = message(&join(1, 2, port, None, 500));
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(
        text.contains(&format!(
            "could not reach rank 0 at 127.0.0.1:{port} within 0.5 s"
        )),
        "{text}"
    );
}

#[test]
fn a_rank_0_that_never_answers_is_reported() {
    // Listening but never accepting: the connection succeeds, no welcome ever comes.
    let (_listener, port) = listener();
    let text = message(&join(1, 2, port, None, 200));
    assert!(text.contains("did not finish the rendezvous"), "{text}");
}

#[test]
fn a_failing_blob_reaches_every_rank() {
    let (listener, port) = listener();
    thread::scope(|scope| {
        let root = scope.spawn(move || {
            join_as_root(
                &world(0, 2, port),
                options(5000),
                || Err("no GPU".into()),
                listener,
            )
            .map(|_| ())
        });
        let peer = scope.spawn(move || join(1, 2, port, None, 5000).map(|_| ()));
        for handle in [root, peer] {
            let text = message(&handle.join().expect("rank thread"));
            assert!(text.contains("rank 0 could not make the data"), "{text}");
            assert!(text.contains("no GPU"), "{text}");
        }
    });
}

/// Joins a world of three, lets `quitter` drop its session without finish, and returns what the
/// others' blocked all_gather said, with how long it took.
fn lost_rank(quitter: usize) -> Vec<(usize, String, Duration)> {
    let results = run(3, &[0, 1, 2], 20_000, |rank, session| {
        let session = session.expect("join");
        session.barrier().expect("barrier");
        if rank == quitter {
            thread::sleep(Duration::from_millis(200));
            drop(session);
            return None;
        }
        let started = Instant::now();
        let text = message(&session.all_gather(b"never completes"));
        let later = message(&session.barrier());
        assert_eq!(later, text, "later calls fail the same way");
        Some((rank, text, started.elapsed()))
    });
    results.into_iter().flatten().collect()
}

#[test]
fn a_peer_that_leaves_without_finish_fails_the_others() {
    for (rank, text, took) in lost_rank(2) {
        assert!(
            text.contains(&format!(
                "rank 2 ({HOST}, pid {}) exited or lost its connection",
                std::process::id()
            )),
            "rank {rank}: {text}"
        );
        assert!(took < Duration::from_secs(2), "rank {rank} took {took:?}");
    }
}

#[test]
fn rank_0_leaving_fails_the_others() {
    for (rank, text, took) in lost_rank(0) {
        assert!(text.contains("rank 0 (testhost"), "rank {rank}: {text}");
        assert!(
            text.contains("exited or lost its connection"),
            "rank {rank}: {text}"
        );
        assert!(took < Duration::from_secs(2), "rank {rank} took {took:?}");
    }
}

#[test]
fn abort_tells_every_rank() {
    let results = run(3, &[0, 1, 2], 20_000, |rank, session| {
        let session = session.expect("join");
        session.barrier().expect("barrier");
        if rank == 1 {
            thread::sleep(Duration::from_millis(100));
            session.abort("CUDA out of memory");
            let own = message(&session.barrier());
            assert!(own.contains("CUDA out of memory"), "{own}");
            return None;
        }
        let started = Instant::now();
        let text = message(&session.barrier());
        Some((text, started.elapsed()))
    });
    for (text, took) in results.into_iter().flatten() {
        assert!(text.contains("rank 1 failed: CUDA out of memory"), "{text}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}

#[test]
fn finishing_at_different_times_is_no_failure() {
    let started = Instant::now();
    let results = run(3, &[0, 1, 2], 20_000, |rank, session| {
        let session = session.expect("join");
        session.barrier().expect("barrier");
        thread::sleep(Duration::from_millis(150 * [1, 0, 3][rank]));
        session.finish()
    });
    for result in results {
        result.expect("finish");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn collectives_after_a_peer_finished_are_refused() {
    let results = run(2, &[0, 1], 20_000, |rank, session| {
        let session = session.expect("join");
        if rank == 1 {
            return session.finish().map(|()| String::new());
        }
        thread::sleep(Duration::from_millis(300));
        let text = message(&session.all_gather(b"late"));
        Ok(text)
    });
    let text = results[0].as_ref().expect("rank 0");
    assert!(text.contains("has already called finish"), "{text}");
    results[1].as_ref().expect("rank 1 finished");
}

#[test]
fn a_rank_missing_from_an_all_gather_times_out_and_tells_the_others() {
    let results = run(2, &[0, 1], 1000, |rank, session| {
        let session = session.expect("join");
        if rank == 0 {
            let started = Instant::now();
            let text = message(&session.all_gather(b"alone"));
            return (text, started.elapsed());
        }
        // Rank 1 is busy elsewhere; when it comes back, rank 0 has told it why the session is over.
        thread::sleep(Duration::from_millis(1500));
        (message(&session.barrier()), Duration::ZERO)
    });
    let (root, took) = &results[0];
    assert!(
        root.contains("all_gather #0: rank 1 did not take part within 1 s"),
        "{root}"
    );
    assert!(
        *took >= Duration::from_millis(900) && *took < Duration::from_secs(3),
        "{took:?}"
    );
    let (peer, _) = &results[1];
    assert!(
        peer.contains("rank 0 failed: all_gather #0: rank 1 did not take part"),
        "{peer}"
    );
}

/// A hand-made rank 1 that joins properly, then speaks only when told.
fn fake_rank(port: u16, version: u32) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut preamble = wire::MAGIC.to_vec();
    preamble.extend_from_slice(&version.to_be_bytes());
    stream.write_all(&preamble).expect("preamble");
    let hello = Frame::Hello(Hello {
        rank: 1,
        world_size: 2,
        pid: 4242,
        hostname: "fake".into(),
    });
    wire::write_frame(&mut stream, &hello).expect("hello");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
}

#[test]
fn a_silent_peer_counts_as_frozen() {
    let (listener, port) = listener();
    thread::scope(|scope| {
        let root = scope.spawn(move || {
            let session = join(0, 2, port, Some(listener), 1000).expect("join");
            // Busy elsewhere (a GPU call, say) while the watchdog notices the silence.
            thread::sleep(Duration::from_millis(2500));
            let started = Instant::now();
            (message(&session.barrier()), started.elapsed())
        });
        let mut fake = fake_rank(port, wire::VERSION);
        let welcome = wire::read_frame(&mut fake).expect("welcome");
        assert!(matches!(welcome, Frame::Welcome { .. }), "{welcome:?}");
        // The fake never sends a heartbeat or its part of the barrier: frozen, socket open.
        let (text, took) = root.join().expect("rank 0");
        assert!(
            text.contains("rank 1 (fake, pid 4242) sent nothing for 1 s"),
            "{text}"
        );
        assert!(
            took < Duration::from_millis(100),
            "recorded while rank 0 was busy: {took:?}"
        );
        drop(fake);
    });
}

#[test]
fn heartbeats_keep_an_idle_session_alive() {
    let results = run(2, &[0, 1], 500, |_, session| {
        let session = session.expect("join");
        // Idle for three timeouts: only heartbeats flow.
        thread::sleep(Duration::from_millis(1500));
        session.barrier()?;
        session.finish()
    });
    for result in results {
        result.expect("an idle session stays alive");
    }
}

#[test]
fn another_protocol_version_is_refused_clearly() {
    let (listener, port) = listener();
    thread::scope(|scope| {
        let root = scope.spawn(move || join(0, 2, port, Some(listener), 5000).map(|_| ()));
        let mut fake = fake_rank(port, wire::VERSION + 98);
        let text = message(&root.join().expect("rank 0"));
        assert!(
            text.contains(&format!("protocol version {}", wire::VERSION + 98)),
            "{text}"
        );
        match wire::read_frame(&mut fake) {
            Ok(Frame::Refused { message, .. }) => assert_eq!(message, text),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_rank_0_of_another_version_is_named_as_a_possibility() {
    let (listener, port) = listener();
    thread::scope(|scope| {
        // A rank 0 of protocol version 1 refusing this rank in version 1's encoding: a tag
        // byte, the kind, then the message as a u32 big-endian length and its bytes.
        scope.spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut preamble = [0u8; 12];
            stream.read_exact(&mut preamble).expect("preamble");
            // Read whole: unread bytes at close would reset the connection.
            wire::read_frame(&mut stream).expect("hello");
            let message = b"rank 0 speaks version 1";
            let mut body = vec![3, 0];
            body.extend_from_slice(&(message.len() as u32).to_be_bytes());
            body.extend_from_slice(message);
            let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
            bytes.extend_from_slice(&body);
            stream.write_all(&bytes).expect("refusal");
        });
        let text = message(&join(1, 2, port, None, 5000).map(|_| ()));
        assert!(text.contains("a gpukit of another version"), "{text}");
        assert!(
            text.contains(&format!("protocol version {}", wire::VERSION)),
            "{text}"
        );
    });
}

#[test]
fn a_stray_client_does_not_disturb_the_ranks() {
    let (listener, port) = listener();
    let mut silent = TcpStream::connect(("127.0.0.1", port)).expect("silent client");
    let mut http = TcpStream::connect(("127.0.0.1", port)).expect("http client");
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    thread::scope(|scope| {
        let root = scope.spawn(move || {
            let session = join(0, 3, port, Some(listener), 5000)?;
            let blob = session.blob().to_vec();
            session.finish().map(|()| blob)
        });
        let peers: Vec<_> = [1, 2]
            .map(|rank| {
                scope.spawn(move || {
                    let session = join(rank, 3, port, None, 5000)?;
                    let blob = session.blob().to_vec();
                    session.finish().map(|()| blob)
                })
            })
            .into_iter()
            .collect();
        // The HTTP client is hung up on (closed or reset), not answered.
        http.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut reply = Vec::new();
        let read = http.read_to_end(&mut reply);
        assert!(read.is_ok() || reply.is_empty(), "{read:?}");
        assert!(reply.is_empty(), "{reply:?}");
        for handle in std::iter::once(root).chain(peers) {
            let blob = handle.join().expect("rank thread").expect("rank joined");
            assert_eq!(blob, nccl_id().unwrap());
        }
    });
    silent.write_all(b"late").ok();
}

#[test]
fn helpers_format_for_people() {
    assert_eq!(seconds(Duration::from_secs(60)), "60 s");
    assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
    assert_eq!(rank_list(&[3]), "rank 3");
    assert_eq!(rank_list(&[2, 3]), "ranks 2, 3");
    let many: Vec<usize> = (0..20).collect();
    assert!(rank_list(&many).ends_with("15 and 4 more"));
    assert_eq!(bind_host("127.0.0.1"), "127.0.0.1");
    assert_eq!(bind_host("localhost"), "127.0.0.1");
    assert_eq!(bind_host("::1"), "::1");
    assert_eq!(bind_host("node-a"), "0.0.0.0");
    assert_eq!(bind_host("10.1.2.3"), "0.0.0.0");
    assert_eq!(bind_host("fe80::1"), "::");
}

#[test]
fn bad_worlds_and_options_are_refused() {
    let error = Session::join(&world(2, 2, 1), options(1000), nccl_id).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    let error = Session::join(&world(0, 2, 1), options(0), nccl_id).unwrap_err();
    assert!(error.to_string().contains("timeout is zero"), "{error}");
}
