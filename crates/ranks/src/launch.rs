//! `gpukit launch`: starts one process per GPU on this node, like torchrun's standalone mode,
//! and stops them all when one fails.
//!
//! To use: fill [`LaunchOptions`] (the CLI maps its flags one to one) and call [`run`]; exit
//! with the code it returns. Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//! GROUP_RANK and NODE_RANK, MASTER_ADDR, MASTER_PORT and GPUKIT_LAUNCHER=gpukit, which
//! [`crate::world::from_env`] reads back. Children inherit stdin, stdout and stderr.
//!
//! When a rank fails (non-zero status or a signal), the others get [`LaunchOptions::timeout`] to
//! exit on their own (their watchdogs notice the lost peer within seconds), then SIGTERM, then
//! SIGKILL [`TERM_GRACE`] later.

use crate::error::{Error, Result};
use crate::{deadline_after, stderr_line};
use std::ffi::OsString;
use std::net::{IpAddr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long a rank has between SIGTERM and SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(3);
/// How often the children are polled.
const POLL: Duration = Duration::from_millis(50);

/// What to launch, and how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Processes on this node (usually one per GPU).
    pub nproc_per_node: usize,
    /// Nodes taking part (each runs its own `gpukit launch`). 1 by default.
    pub nnodes: usize,
    /// This node's index, 0 to `nnodes - 1`. 0 by default.
    pub node_rank: usize,
    /// Rank 0's host, as every rank reaches it. 127.0.0.1 by default.
    pub master_addr: String,
    /// The rendezvous port; None picks a free one (single node only).
    pub master_port: Option<u16>,
    /// How long the other ranks have to exit on their own after one failed.
    pub timeout: Duration,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            nproc_per_node: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            timeout: Duration::from_secs(60),
            command: Vec::new(),
        }
    }
}

/// Starts `nproc_per_node` copies of the command and waits for them. Returns the exit code to
/// use: 0 when every rank succeeded, else the first failure's (128 + the signal for a signal),
/// after a summary line on stderr ("gpukit launch: rank 1 exited with status 3; stopped ranks 0,
/// 2").
pub fn run(opts: &LaunchOptions) -> Result<i32> {
    validate(opts)?;
    let world_size = opts
        .nproc_per_node
        .checked_mul(opts.nnodes)
        .ok_or_else(|| Error::BadInput("--nproc-per-node times --nnodes is too large".into()))?;
    let port = match opts.master_port {
        Some(port) => port,
        None => free_port(&opts.master_addr)?,
    };
    let mut ranks = Vec::with_capacity(opts.nproc_per_node);
    for local_rank in 0..opts.nproc_per_node {
        let rank = opts.node_rank * opts.nproc_per_node + local_rank;
        match start(opts, rank, local_rank, world_size, port) {
            Ok(child) => ranks.push(Rank::new(rank, child)),
            Err(error) => {
                stop_all(&mut ranks);
                return Err(error);
            }
        }
    }
    Ok(supervise(ranks, opts.timeout))
}

fn validate(opts: &LaunchOptions) -> Result<()> {
    if opts.command.is_empty() {
        return Err(Error::BadInput(
            "no command to launch: give it after the options, e.g. `gpukit launch \
             --nproc-per-node 2 -- gpukit ...`"
                .into(),
        ));
    }
    if opts.nproc_per_node == 0 {
        return Err(Error::BadInput(
            "--nproc-per-node is 0: launch at least one process".into(),
        ));
    }
    if opts.nnodes == 0 {
        return Err(Error::BadInput(
            "--nnodes is 0: at least this node takes part".into(),
        ));
    }
    if opts.node_rank >= opts.nnodes {
        return Err(Error::BadInput(format!(
            "--node-rank {} is not below --nnodes {}: nodes count from 0",
            opts.node_rank, opts.nnodes
        )));
    }
    if opts.master_addr.trim().is_empty() {
        return Err(Error::BadInput("--master-addr is empty".into()));
    }
    if opts.master_port == Some(0) {
        return Err(Error::BadInput(
            "--master-port 0: give a port from 1 to 65535, or none to get a free one".into(),
        ));
    }
    if opts.nnodes > 1 {
        if opts.master_port.is_none() {
            return Err(Error::BadInput(format!(
                "--nnodes {}: give --master-port, the same on every node (a free port is only \
                 picked for a single node)",
                opts.nnodes
            )));
        }
        if is_loopback(&opts.master_addr) {
            return Err(Error::BadInput(format!(
                "--nnodes {}: --master-addr {} cannot be reached from the other nodes; give node \
                 0's host name or address",
                opts.nnodes, opts.master_addr
            )));
        }
    }
    Ok(())
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A port nothing listens on now (rank 0 binds it moments later).
fn free_port(master_addr: &str) -> Result<u16> {
    let host = if is_loopback(master_addr) {
        "127.0.0.1"
    } else {
        "0.0.0.0"
    };
    TcpListener::bind((host, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| Error::Unavailable(format!("cannot find a free port for the ranks: {e}")))
}

fn start(
    opts: &LaunchOptions,
    rank: usize,
    local_rank: usize,
    world_size: usize,
    port: u16,
) -> Result<Child> {
    let (program, args) = match opts.command.split_first() {
        Some(split) => split,
        None => return Err(Error::BadInput("no command to launch".into())),
    };
    Command::new(program)
        .args(args)
        .env("GPUKIT_LAUNCHER", "gpukit")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("LOCAL_RANK", local_rank.to_string())
        .env("LOCAL_WORLD_SIZE", opts.nproc_per_node.to_string())
        .env("GROUP_RANK", opts.node_rank.to_string())
        .env("NODE_RANK", opts.node_rank.to_string())
        .env("MASTER_ADDR", &opts.master_addr)
        .env("MASTER_PORT", port.to_string())
        .stdin(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            Error::BadInput(format!(
                "cannot start {} for rank {rank}: {e}",
                program.to_string_lossy()
            ))
        })
}

/// One launched rank.
struct Rank {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
    /// The launcher had to stop it.
    stopped: bool,
}

impl Rank {
    fn new(rank: usize, child: Child) -> Rank {
        Rank {
            rank,
            child,
            status: None,
            stopped: false,
        }
    }

    /// Records the exit status if the process ended.
    fn poll(&mut self) {
        if self.status.is_none() {
            match self.child.try_wait() {
                Ok(status) => self.status = status,
                Err(_) => {
                    // The status cannot be read: make sure the process is gone, and count it
                    // as failed.
                    let _ = self.child.kill();
                    self.status = self.child.wait().ok();
                    self.stopped = true;
                }
            }
        }
    }

    fn running(&self) -> bool {
        self.status.is_none() && !self.stopped
    }
}

/// Waits for every rank; after the first failure gives the others `grace` to exit, then stops
/// them. Returns the exit code for the launcher.
fn supervise(mut ranks: Vec<Rank>, grace: Duration) -> i32 {
    let mut first_failure: Option<(usize, ExitStatus)> = None;
    let mut stop_at: Option<Instant> = None;
    loop {
        for rank in &mut ranks {
            rank.poll();
            if let Some(status) = rank.status {
                if !status.success() && first_failure.is_none() {
                    first_failure = Some((rank.rank, status));
                    stop_at = Some(deadline_after(grace));
                }
            }
        }
        if ranks.iter().all(|rank| !rank.running()) {
            break;
        }
        if stop_at.is_some_and(|at| Instant::now() >= at) {
            stop_all(&mut ranks);
            break;
        }
        thread::sleep(POLL);
    }
    let Some((failed, status)) = first_failure else {
        return 0;
    };
    stderr_line(&summary(&ranks, failed, status));
    exit_code(status)
}

/// "gpukit launch: rank 1 exited with status 3; stopped ranks 0, 2".
fn summary(ranks: &[Rank], failed: usize, status: ExitStatus) -> String {
    let mut line = format!("gpukit launch: rank {failed} {}", describe(status));
    let stopped: Vec<usize> = ranks.iter().filter(|r| r.stopped).map(|r| r.rank).collect();
    let followed: Vec<String> = ranks
        .iter()
        .filter(|r| r.rank != failed && !r.stopped)
        .filter_map(|r| r.status.filter(|s| !s.success()).map(|s| (r.rank, s)))
        .map(|(rank, status)| format!("rank {rank} {}", describe(status)))
        .collect();
    if !followed.is_empty() {
        line.push_str(&format!("; then {}", followed.join(", ")));
    }
    if !stopped.is_empty() {
        let list: Vec<String> = stopped.iter().map(usize::to_string).collect();
        let word = if stopped.len() == 1 { "rank" } else { "ranks" };
        line.push_str(&format!("; stopped {word} {}", list.join(", ")));
    }
    line
}

/// SIGTERM to every running rank, SIGKILL to those still running [`TERM_GRACE`] later.
fn stop_all(ranks: &mut [Rank]) {
    let running: Vec<usize> = (0..ranks.len()).filter(|&i| ranks[i].running()).collect();
    for &i in &running {
        terminate(&mut ranks[i].child);
    }
    let deadline = deadline_after(TERM_GRACE);
    while Instant::now() < deadline && running.iter().any(|&i| ranks[i].running()) {
        for &i in &running {
            ranks[i].poll();
        }
        thread::sleep(POLL);
    }
    for &i in &running {
        let rank = &mut ranks[i];
        if rank.status.is_none() {
            let _ = rank.child.kill();
            rank.status = rank.child.wait().ok();
        }
        rank.stopped = true;
    }
}

/// SIGTERM through kill(1), so that the rank can clean up (std only offers SIGKILL); SIGKILL
/// when kill(1) cannot run.
fn terminate(child: &mut Child) {
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !sent {
        let _ = child.kill();
    }
}

/// The code a shell would show: the exit status, or 128 + the signal.
fn exit_code(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    signal(status).map_or(1, |signal| 128 + signal)
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), signal(status)) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}{}", signal_name(signal)),
        (None, None) => "ended without an exit status".into(),
    }
}

#[cfg(unix)]
fn signal(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

#[cfg(not(unix))]
fn signal(_status: ExitStatus) -> Option<i32> {
    None
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        1 => " (SIGHUP)",
        2 => " (SIGINT)",
        6 => " (SIGABRT)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        15 => " (SIGTERM)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_types::{ErrorKind, HasKind};

    fn options(command: &[&str]) -> LaunchOptions {
        LaunchOptions {
            nproc_per_node: 2,
            command: command.iter().map(OsString::from).collect(),
            ..LaunchOptions::default()
        }
    }

    fn bad(opts: &LaunchOptions) -> String {
        match run(opts) {
            Err(error) => {
                assert_eq!(error.kind(), ErrorKind::BadInput, "{error}");
                error.to_string()
            }
            Ok(code) => panic!("expected an error, got exit code {code}"),
        }
    }

    #[test]
    fn options_are_checked() {
        assert!(bad(&options(&[])).contains("no command"));
        let none = LaunchOptions {
            nproc_per_node: 0,
            ..options(&["true"])
        };
        assert!(bad(&none).contains("--nproc-per-node is 0"));
        let outside = LaunchOptions {
            nnodes: 2,
            node_rank: 2,
            ..options(&["true"])
        };
        assert!(bad(&outside).contains("--node-rank 2 is not below --nnodes 2"));
        let no_port = LaunchOptions {
            nnodes: 2,
            master_addr: "node0".into(),
            ..options(&["true"])
        };
        assert!(bad(&no_port).contains("--master-port"));
        let loopback = LaunchOptions {
            nnodes: 2,
            master_port: Some(29500),
            ..options(&["true"])
        };
        assert!(bad(&loopback).contains("cannot be reached from the other nodes"));
        let zero_port = LaunchOptions {
            master_port: Some(0),
            ..options(&["true"])
        };
        assert!(bad(&zero_port).contains("--master-port 0"));
    }

    #[test]
    fn a_missing_program_is_named() {
        let message = bad(&options(&["/nonexistent/gpukit-no-such-program", "x"]));
        assert!(
            message.contains("/nonexistent/gpukit-no-such-program"),
            "{message}"
        );
        assert!(message.contains("No such file"), "{message}");
    }

    #[cfg(unix)]
    #[test]
    fn exit_codes_follow_the_shell() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(
            describe(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            "exited with status 3"
        );
    }

    #[cfg(unix)]
    #[test]
    fn plain_commands_report_the_first_failure() {
        // Rank 0 fails at once; rank 1 would sleep for a minute but is stopped after the grace.
        let script = "if [ \"$RANK\" = 0 ]; then exit 4; else exec sleep 60; fi";
        let opts = LaunchOptions {
            timeout: Duration::from_millis(200),
            ..options(&["sh", "-c", script])
        };
        let started = Instant::now();
        assert_eq!(run(&opts), Ok(4));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let ok = options(&[
            "sh",
            "-c",
            "test \"$GPUKIT_LAUNCHER\" = gpukit && test \"$WORLD_SIZE\" = 2",
        ]);
        assert_eq!(run(&ok), Ok(0));
    }
}
