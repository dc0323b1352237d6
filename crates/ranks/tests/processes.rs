//! Ranks as real processes: `gpukit launch` end to end, and the watchdog's exit (OnLost::Exit)
//! when a peer exits, is killed or freezes. The children are this test binary itself, running
//! the ignored test `child` with a role in GPUKIT_DIST_TEST_ROLE.

use gpukit_ranks::launch::{self, LaunchOptions};
use gpukit_ranks::rendezvous::{OnLost, Options, Session};
use gpukit_ranks::world;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const ROLE: &str = "GPUKIT_DIST_TEST_ROLE";
const TIMEOUT_MS: &str = "GPUKIT_DIST_TEST_TIMEOUT_MS";
/// How long a child rank would sit "in a GPU call" if its watchdog did not end it.
const STUCK: Duration = Duration::from_secs(30);

/// Not a test on its own: the body of the child processes the tests below start.
#[test]
#[ignore = "run as a child process by the other tests"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "launch-ok" => std::process::exit(launch_ranks("rank-ok")),
        "launch-exit3" => std::process::exit(launch_ranks("rank-exit3")),
        "rank-ok" => rank_ok(),
        "rank-exit3" => rank_exit3(),
        "rank-stuck" => rank_stuck(),
        other => panic!("unknown role {other}"),
    }
}

/// The arguments that make this binary run `child` only, output not captured.
fn child_args() -> Vec<OsString> {
    [
        "--exact",
        "child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

fn this_exe() -> OsString {
    std::env::current_exe()
        .expect("the test binary's path")
        .into_os_string()
}

/// As the launcher: three ranks of this binary in `rank_role`, through `env` to set the role.
fn launch_ranks(rank_role: &str) -> i32 {
    let mut command = vec![
        OsString::from("env"),
        OsString::from(format!("{ROLE}={rank_role}")),
        this_exe(),
    ];
    command.extend(child_args());
    let opts = LaunchOptions {
        nproc_per_node: 3,
        timeout: Duration::from_secs(10),
        command,
        ..LaunchOptions::default()
    };
    match launch::run(&opts) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            2
        }
    }
}

fn join() -> Session {
    let world = world::from_process_env()
        .expect("a valid environment")
        .expect("a launcher's environment");
    let timeout_ms = std::env::var(TIMEOUT_MS)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(10_000);
    let opts = Options {
        timeout: Duration::from_millis(timeout_ms),
        on_lost: OnLost::Exit,
    };
    Session::join(&world, opts, || Ok(b"nccl-unique-id".to_vec())).expect("join")
}

fn rank_ok() {
    let session = join();
    let rank = session.rank();
    let parts = session.all_gather(&[rank as u8]).expect("all_gather");
    assert_eq!(parts, vec![vec![0], vec![1], vec![2]]);
    assert_eq!(session.blob(), b"nccl-unique-id");
    session.barrier().expect("barrier");
    println!("rank {rank} ok");
    session.finish().expect("finish");
}

fn rank_exit3() {
    let session = join();
    session.barrier().expect("barrier");
    if session.rank() == 1 {
        std::process::exit(3);
    }
    // As if blocked in a collective that waits for rank 1 forever: only the watchdog ends it.
    thread::sleep(STUCK);
    std::process::exit(6);
}

fn rank_stuck() {
    let session = join();
    session.barrier().expect("barrier");
    println!("rank {} ready", session.rank());
    thread::sleep(STUCK);
    std::process::exit(6);
}

/// A child's collected output.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// A started child whose output is read as it comes (so pipes never fill).
struct Running {
    child: Child,
    started: Instant,
    lines: mpsc::Receiver<String>,
    stdout: thread::JoinHandle<String>,
    stderr: thread::JoinHandle<String>,
}

fn spawn_child(vars: &[(&str, String)]) -> Running {
    let mut command = Command::new(this_exe());
    command
        .args(child_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in vars {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("start the test binary");
    let (line_tx, lines) = mpsc::channel();
    let out = child.stdout.take().expect("stdout");
    let stdout = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = line_tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut err = child.stderr.take().expect("stderr");
    let stderr = thread::spawn(move || {
        let mut all = String::new();
        let _ = err.read_to_string(&mut all);
        all
    });
    Running {
        child,
        started: Instant::now(),
        lines,
        stdout,
        stderr,
    }
}

impl Running {
    /// Waits until stdout shows a line containing `text`.
    fn wait_for_line(&self, text: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(_) => panic!("no line with {text:?} within {limit:?}"),
            }
        }
    }

    /// Waits for the exit (killing the child past `limit`, which fails the test).
    fn finish(mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("a child ran past {limit:?}");
            }
            thread::sleep(Duration::from_millis(20));
        };
        let took = self.started.elapsed();
        Finished {
            status,
            stdout: self.stdout.join().expect("stdout reader"),
            stderr: self.stderr.join().expect("stderr reader"),
            took,
        }
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

#[test]
fn launch_runs_three_ranks_to_success() {
    let done = spawn_child(&[(ROLE, "launch-ok".into())]).finish(Duration::from_secs(30));
    assert_eq!(done.status.code(), Some(0), "{}", done.stderr);
    for rank in 0..3 {
        assert!(
            done.stdout.contains(&format!("rank {rank} ok")),
            "{}",
            done.stdout
        );
    }
    assert!(!done.stderr.contains("gpukit launch:"), "{}", done.stderr);
}

#[test]
fn launch_returns_the_failing_ranks_code_and_the_others_exit_on_their_own() {
    let done = spawn_child(&[(ROLE, "launch-exit3".into())]).finish(Duration::from_secs(30));
    assert_eq!(done.status.code(), Some(3), "{}", done.stderr);
    let stderr = &done.stderr;
    assert!(
        stderr.contains("gpukit launch: rank 1 exited with status 3"),
        "{stderr}"
    );
    // Ranks 0 and 2 were stuck for 30 s; their watchdogs ended them, not the launcher.
    assert!(
        stderr.contains("then rank 0 exited with status 1, rank 2 exited with status 1"),
        "{stderr}"
    );
    assert!(!stderr.contains("stopped"), "{stderr}");
    let lost = stderr
        .lines()
        .filter(|line| {
            line.starts_with("error: rank 1 (") && line.ends_with("exited or lost its connection")
        })
        .count();
    assert_eq!(lost, 2, "{stderr}");
    assert!(done.took < Duration::from_secs(10), "{:?}", done.took);
}

/// Starts three stuck ranks on a fresh port and waits until all joined.
fn three_stuck_ranks(timeout_ms: u64) -> Vec<Running> {
    let port = free_port();
    let ranks: Vec<Running> = (0..3)
        .map(|rank| {
            spawn_child(&[
                (ROLE, "rank-stuck".into()),
                (TIMEOUT_MS, timeout_ms.to_string()),
                ("GPUKIT_LAUNCHER", "gpukit".into()),
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", "3".into()),
                ("LOCAL_RANK", rank.to_string()),
                ("LOCAL_WORLD_SIZE", "3".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.to_string()),
            ])
        })
        .collect();
    for (rank, running) in ranks.iter().enumerate() {
        running.wait_for_line(&format!("rank {rank} ready"), Duration::from_secs(20));
    }
    ranks
}

/// SIGKILLs rank `victim` and checks that the others exit with status 1 within a few seconds,
/// naming it.
fn kill_and_watch(victim: usize) {
    let mut ranks = three_stuck_ranks(10_000);
    let killed_at = Instant::now();
    ranks[victim].child.kill().expect("SIGKILL");
    for (rank, running) in ranks.into_iter().enumerate() {
        let done = running.finish(Duration::from_secs(15));
        if rank == victim {
            continue;
        }
        assert_eq!(done.status.code(), Some(1), "rank {rank}: {}", done.stderr);
        let expected = format!("error: rank {victim} (");
        assert!(
            done.stderr.contains(&expected),
            "rank {rank}: {}",
            done.stderr
        );
        assert!(
            done.stderr.contains("exited or lost its connection"),
            "rank {rank}: {}",
            done.stderr
        );
    }
    assert!(
        killed_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed_at.elapsed()
    );
}

#[test]
fn a_killed_rank_is_noticed_by_the_survivors() {
    kill_and_watch(2);
}

#[test]
fn a_killed_rank_0_is_noticed_by_the_survivors() {
    kill_and_watch(0);
}

#[cfg(unix)]
#[test]
fn a_frozen_rank_is_noticed_by_the_survivors() {
    let ranks = three_stuck_ranks(3000);
    let frozen = ranks[2].child.id().to_string();
    let stopped = Command::new("kill").args(["-STOP", &frozen]).status();
    assert!(stopped.is_ok_and(|s| s.success()), "kill -STOP");
    let frozen_at = Instant::now();
    let mut ranks = ranks;
    let victim = ranks.pop().expect("rank 2");
    for (rank, running) in ranks.into_iter().enumerate() {
        let done = running.finish(Duration::from_secs(15));
        assert_eq!(done.status.code(), Some(1), "rank {rank}: {}", done.stderr);
        assert!(
            done.stderr.contains("error: rank 2 ("),
            "rank {rank}: {}",
            done.stderr
        );
        assert!(
            done.stderr.contains("sent nothing for 3 s"),
            "rank {rank}: {}",
            done.stderr
        );
    }
    assert!(
        frozen_at.elapsed() < Duration::from_secs(6),
        "{:?}",
        frozen_at.elapsed()
    );
    let mut victim = victim;
    victim.child.kill().expect("SIGKILL the frozen rank");
    let done = victim.finish(Duration::from_secs(5));
    assert!(!done.status.success());
}
