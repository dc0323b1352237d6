//! How the ranks find each other and stay in touch: rank 0 listens on TCP, every other rank
//! connects and introduces itself, rank 0 hands every rank a blob (NCCL's unique id), and from
//! then on a watchdog on every connection turns a dead, failed or frozen peer into a clear exit
//! of every surviving rank instead of a hang.
//!
//! To use: [`Session::join`] with the [`World`] from [`crate::world::from_process_env`] and a
//! closure that makes the blob (called on rank 0 only, once every rank arrived); give
//! [`Session::blob`] to NCCL; [`Session::all_gather`] or [`Session::barrier`] for small exchanges;
//! [`Session::finish`] on success before exiting, [`Session::abort`] on failure.
//!
//! Connections form a star: every rank holds one connection, to rank 0; rank 0 holds one per
//! rank. Each connection has a reader thread (the watchdog), and each process one heartbeat
//! thread that sends "still here" about once a second. A connection that closes before its rank
//! said it finished, or that stays silent for [`Options::timeout`], means that rank is gone; rank
//! 0 then tells every other rank, and every rank fails per [`OnLost`]. The protocol itself is in
//! the private `wire` module.
//!
//! Every wait here (connecting, the rendezvous, an all_gather, a barrier, finishing) is bounded
//! by the timeout: nothing in this crate can hang forever.

mod join;
mod wire;

use join::{join_as_peer, join_as_root, listen};

use crate::error::{Error, Result};
use crate::world::{Endpoint, Launcher, World};
use crate::{deadline_after, stderr_line};
use gpukit_types::HasKind;
use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use wire::{Frame, Hello, WireError};

/// How often a rank retries connecting to rank 0 (which may start later).
const RETRY: Duration = Duration::from_millis(100);
/// The longest single connection attempt.
const CONNECT_TRY: Duration = Duration::from_secs(2);
/// How often rank 0 looks for new connections during the rendezvous.
const POLL: Duration = Duration::from_millis(10);
/// The heartbeat period, at most (a quarter of the timeout when that is shorter).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How much longer than the timeout a rank waits for rank 0's verdict: rank 0's own clock
/// started before this rank connected, so its verdict ("rank 3 did not arrive") comes first.
const REPLY_GRACE: Duration = Duration::from_secs(2);
/// How long finish and abort wait for the other side to close in turn.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How many ranks a message lists before it counts the rest.
const LISTED_RANKS: usize = 16;

/// How a session waits and what it does when a peer is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The bound on every wait: for the other ranks to arrive, for an all_gather or barrier to
    /// complete, and the silence after which a connected peer counts as frozen. 60 s by default.
    pub timeout: Duration,
    /// What the watchdog does when a peer is lost.
    pub on_lost: OnLost,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(60),
            on_lost: OnLost::Exit,
        }
    }
}

/// What the watchdog does when a peer exits, fails or goes silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Print `error: <message>` on stderr and exit the process with status 1, from the watchdog
    /// thread, wherever the main thread is blocked (a GPU call waiting for the dead peer, say).
    #[default]
    Exit,
    /// Keep the message: the blocked call and every later one return it as an error (for tests,
    /// and for callers that clean up themselves).
    Report,
}

/// This rank's membership of the world, after the rendezvous.
pub struct Session {
    rank: usize,
    world_size: usize,
    blob: Vec<u8>,
    /// None for a world of one: no peers, no network.
    net: Option<Net>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("blob_len", &self.blob.len())
            .finish()
    }
}

impl Session {
    /// Meets the other ranks. Rank 0 listens on `world.rendezvous` (on that address when it is
    /// a loopback one, else on every interface); the others connect, retrying every 100 ms
    /// until the timeout, since rank 0 may start later. Every rank introduces itself (protocol
    /// version, rank, world size, host, pid); rank 0 checks that the world sizes agree, that no
    /// rank comes twice and that every rank arrives within the timeout, then calls
    /// `make_blob` and sends its bytes to every rank. Any failure reaches every connected rank
    /// with the same message. A world of one returns at once, without the network.
    pub fn join(
        world: &World,
        opts: Options,
        make_blob: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    ) -> Result<Session> {
        check_world(world, &opts)?;
        if world.world_size == 1 {
            let blob = make_blob().map_err(blob_error)?;
            return Ok(Session {
                rank: 0,
                world_size: 1,
                blob,
                net: None,
            });
        }
        if world.rank == 0 {
            let listener = listen(world)?;
            join_as_root(world, opts, make_blob, listener)
        } else {
            join_as_peer(world, opts)
        }
    }

    /// The bytes rank 0's `make_blob` returned (the same on every rank).
    pub fn blob(&self) -> &[u8] {
        &self.blob
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks take part.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Every rank contributes `mine`; every rank gets all ranks' bytes in rank order (through
    /// rank 0). Every rank must make the same sequence of all_gather and barrier calls. Bounded
    /// by the timeout; a failure ends the session for every rank.
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        match &self.net {
            None => Ok(vec![mine.to_vec()]),
            Some(net) => net.all_gather(mine),
        }
    }

    /// Returns once every rank reached its barrier. Bounded by the timeout.
    pub fn barrier(&self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    /// Orderly end: after this, the other ranks closing their connections is no failure (and
    /// this rank's closing is none to them). Call on success before exiting; it returns the
    /// loss of a peer if one was recorded (with [`OnLost::Report`]).
    pub fn finish(mut self) -> Result<()> {
        match self.net.take() {
            None => Ok(()),
            Some(mut net) => net.finish(),
        }
    }

    /// Tells every other rank that this one failed with `message`, then returns (the caller
    /// exits). The others then stop with `rank R failed: <message>`.
    pub fn abort(&self, message: &str) {
        if let Some(net) = &self.net {
            net.abort(message);
        }
    }
}

fn check_world(world: &World, opts: &Options) -> Result<()> {
    if world.world_size == 0 || world.rank >= world.world_size {
        return Err(Error::BadInput(format!(
            "rank {} of a world of {} cannot join: ranks run from 0 to the world size - 1",
            world.rank, world.world_size
        )));
    }
    if opts.timeout.is_zero() {
        return Err(Error::BadInput(
            "the rendezvous timeout is zero: give the ranks time to meet".into(),
        ));
    }
    Ok(())
}

fn blob_error(message: String) -> Error {
    Error::Failed(format!(
        "rank 0 could not make the data it shares with the other ranks: {message}"
    ))
}

/// Locks, recovering the data when a thread panicked while holding the lock (the state here is
/// plain data that stays consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// "1 s", "60 s", "0.5 s".
fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{secs:.1} s")
    }
}

/// "rank 3", "ranks 2, 3", "ranks 0, 1, ..., 15 and 84 more".
fn rank_list(ranks: &[usize]) -> String {
    let shown: Vec<String> = ranks
        .iter()
        .take(LISTED_RANKS)
        .map(usize::to_string)
        .collect();
    let more = ranks.len().saturating_sub(LISTED_RANKS);
    let word = if ranks.len() == 1 { "rank" } else { "ranks" };
    if more == 0 {
        format!("{word} {}", shown.join(", "))
    } else {
        format!("{word} {} and {more} more", shown.join(", "))
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A socket timeout must not be zero (that means "none" to the OS): at least a millisecond.
fn socket_timeout(duration: Duration) -> Option<Duration> {
    Some(duration.max(Duration::from_millis(1)))
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    thread::Builder::new()
        .name(name.to_string())
        .spawn(body)
        .map_err(|e| Error::Failed(format!("cannot start the {name} thread: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Rank 0: listening and the rendezvous.

/// A connected rank, before its watchdog starts.
struct Peer {
    rank: usize,
    host: String,
    pid: u32,
    stream: TcpStream,
}

/// The connection to one other rank.
struct Link {
    rank: usize,
    host: String,
    pid: u32,
    /// Whole frames are written under this lock, so threads never interleave them.
    writer: Mutex<TcpStream>,
    /// For shutting the connection down without waiting for a writer.
    control: TcpStream,
    /// The other side said Finish: its connection closing is no failure.
    finished: AtomicBool,
}

impl Link {
    fn who(&self) -> String {
        format!("rank {} ({}, pid {})", self.rank, self.host, self.pid)
    }

    fn send_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        lock(&self.writer).write_all(bytes)
    }

    fn send(&self, frame: &Frame) -> io::Result<()> {
        let bytes =
            wire::encode(frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.send_bytes(&bytes)
    }

    fn is_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    fn close(&self, how: Shutdown) {
        let _ = self.control.shutdown(how);
    }
}

/// What the watchdogs hand to the caller's thread.
enum Inbound {
    /// At rank 0: a rank's part of all_gather `seq`.
    Contribution {
        from: usize,
        seq: u64,
        data: Vec<u8>,
    },
    /// At other ranks: all_gather `seq`'s result.
    Gathered { seq: u64, parts: Vec<Vec<u8>> },
    /// A rank said Finish.
    Finished { from: usize },
    /// A rank was lost ([`OnLost::Report`]).
    Lost(Error),
}

#[derive(Default)]
struct State {
    /// The first failure; every later call returns it.
    lost: Option<Error>,
    /// finish, abort or drop began: connections closing now are expected.
    closing: bool,
}

/// What the caller's thread, the watchdogs and the heartbeat share.
struct Shared {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    on_lost: OnLost,
    links: Vec<Arc<Link>>,
    state: Mutex<State>,
    events: Sender<Inbound>,
    stop: Mutex<bool>,
    /// A watchdog is exiting the process ([`OnLost::Exit`]).
    exiting: AtomicBool,
    wake: Condvar,
}

impl Shared {
    /// Records the first failure; false when one was recorded already or the session is
    /// closing (then nothing more is reported).
    fn record(&self, error: &Error) -> bool {
        let mut state = lock(&self.state);
        if state.closing || state.lost.is_some() {
            return false;
        }
        state.lost = Some(error.clone());
        true
    }

    /// The recorded failure (or `fallback` when none was, which cannot happen after record).
    fn recorded(&self, fallback: Error) -> Error {
        lock(&self.state).lost.clone().unwrap_or(fallback)
    }

    /// Sends Abort with `message` to every rank but `except` that has not finished.
    fn tell(&self, message: &str, except: Option<usize>) {
        let frame = Frame::Abort {
            message: message.to_string(),
        };
        for link in &self.links {
            if Some(link.rank) != except && !link.is_finished() {
                let _ = link.send(&frame);
            }
        }
    }

    /// A peer is gone or failed (seen by a watchdog or a failed write): record it, and at rank 0
    /// tell every other rank. True when this was the first failure.
    fn peer_lost(&self, error: &Error, from: usize) -> bool {
        if !self.record(error) {
            return false;
        }
        if self.rank == 0 {
            self.tell(&error.to_string(), Some(from));
        }
        true
    }

    /// This rank's own call failed: record it and tell the others ("rank R failed: ...").
    fn fail(&self, error: Error) -> Error {
        if self.record(&error) {
            self.tell(&format!("rank {} failed: {error}", self.rank), None);
        }
        self.recorded(error)
    }

    /// A write to `link` failed: the peer is gone.
    fn write_failed(&self, link: &Link, error: io::Error) -> Error {
        self.await_exit();
        let lost = Error::PeerLost(format!(
            "{} exited or lost its connection ({error})",
            link.who()
        ));
        self.peer_lost(&lost, link.rank);
        self.recorded(lost)
    }

    /// A watchdog saw `from` go (or heard that some rank failed). Report: record it, tell the
    /// others (at rank 0) and wake the blocked call. Exit: tell the others and exit the process;
    /// the loss is not recorded, so that the caller's thread cannot print it a second time in
    /// the moment before the exit.
    fn watchdog_lost(&self, error: Error, from: usize) {
        match self.on_lost {
            OnLost::Report => {
                if self.peer_lost(&error, from) {
                    let _ = self.events.send(Inbound::Lost(error));
                }
            }
            OnLost::Exit => {
                {
                    let state = lock(&self.state);
                    // Closing: expected. Recorded: the caller's own failure, which it reports.
                    if state.closing || state.lost.is_some() {
                        return;
                    }
                }
                if self.exiting.swap(true, Ordering::SeqCst) {
                    return;
                }
                if self.rank == 0 {
                    self.tell(&error.to_string(), Some(from));
                }
                stderr_line(&format!("error: {error}"));
                // Half-close so that the abort frames just sent leave before exit closes the
                // sockets (a close with unread data resets the connection).
                for link in &self.links {
                    link.close(Shutdown::Write);
                }
                thread::sleep(Duration::from_millis(100));
                crate::run_before_exit();
                std::process::exit(1);
            }
        }
    }

    /// With [`OnLost::Exit`], a watchdog may be about to exit the process: the caller's thread
    /// waits for that rather than report the same loss again.
    fn await_exit(&self) {
        if self.exiting.load(Ordering::SeqCst) {
            thread::sleep(CLOSE_WAIT);
        }
    }

    fn check_usable(&self) -> Result<()> {
        self.await_exit();
        {
            let state = lock(&self.state);
            if let Some(error) = &state.lost {
                return Err(error.clone());
            }
            if state.closing {
                return Err(Error::Failed("this session has ended".into()));
            }
        }
        if let Some(link) = self.links.iter().find(|link| link.is_finished()) {
            return Err(Error::Failed(format!(
                "{} has already called finish: every rank must make the same all_gather and \
                 barrier calls before finish",
                link.who()
            )));
        }
        Ok(())
    }
}

/// The network side of a session of more than one rank.
struct Net {
    shared: Arc<Shared>,
    inbox: Mutex<Inbox>,
    readers: Vec<JoinHandle<()>>,
    heartbeat: Option<JoinHandle<()>>,
}

/// The caller's end of the watchdogs' channel, and the all_gather count.
struct Inbox {
    events: Receiver<Inbound>,
    next_seq: u64,
}

impl Net {
    /// Sets up the links, runs `before_watch` (rank 0 sends the welcome there, before any
    /// watchdog reads), then starts one watchdog per link and the heartbeat.
    fn start(
        rank: usize,
        world_size: usize,
        opts: Options,
        peers: Vec<Peer>,
        before_watch: impl FnOnce(&[Arc<Link>]) -> Result<()>,
    ) -> Result<Net> {
        let mut links = Vec::new();
        let mut streams = Vec::new();
        for peer in peers {
            let (link, stream) = make_link(peer, opts.timeout)?;
            links.push(Arc::new(link));
            streams.push(stream);
        }
        before_watch(&links)?;
        let (events, inbox) = mpsc::channel();
        let shared = Arc::new(Shared {
            rank,
            world_size,
            timeout: opts.timeout,
            on_lost: opts.on_lost,
            links,
            state: Mutex::new(State::default()),
            events,
            stop: Mutex::new(false),
            exiting: AtomicBool::new(false),
            wake: Condvar::new(),
        });
        let mut net = Net {
            shared: Arc::clone(&shared),
            inbox: Mutex::new(Inbox {
                events: inbox,
                next_seq: 0,
            }),
            readers: Vec::new(),
            heartbeat: None,
        };
        // If a thread cannot start, dropping `net` closes every connection: the peers see this
        // rank exit, which is what happens next.
        for (link, stream) in shared.links.iter().zip(streams) {
            let (shared, link) = (Arc::clone(&shared), Arc::clone(link));
            net.readers.push(spawn("gpukit-watchdog", move || {
                watch(&shared, &link, stream)
            })?);
        }
        let beat = Arc::clone(&shared);
        net.heartbeat = Some(spawn("gpukit-heartbeat", move || heartbeat(&beat))?);
        Ok(net)
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut inbox = lock(&self.inbox);
        self.shared.check_usable()?;
        let seq = inbox.next_seq;
        inbox.next_seq += 1;
        if self.shared.rank == 0 {
            self.gather_at_root(&inbox, seq, mine)
        } else {
            self.gather_at_peer(&inbox, seq, mine)
        }
    }

    /// Rank 0 waits for every rank's part, then sends everyone the whole.
    fn gather_at_root(&self, inbox: &Inbox, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let shared = &self.shared;
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; shared.world_size];
        parts[0] = Some(mine.to_vec());
        let deadline = deadline_after(shared.timeout);
        while parts.iter().any(Option::is_none) {
            match inbox.events.recv_timeout(remaining(deadline)) {
                Ok(Inbound::Contribution {
                    from,
                    seq: got,
                    data,
                }) => {
                    let slot = parts.get_mut(from).filter(|slot| slot.is_none());
                    match slot {
                        Some(slot) if got == seq => *slot = Some(data),
                        _ => {
                            return Err(shared.fail(Error::Failed(format!(
                                "rank {from} sent its part of all_gather #{got} while rank 0 \
                                 collects #{seq}: the ranks' all_gather and barrier calls are out \
                                 of step"
                            ))))
                        }
                    }
                }
                Ok(Inbound::Finished { from }) => {
                    return Err(shared.fail(Error::Failed(format!(
                        "rank {from} called finish while rank 0 waits for it in all_gather \
                         #{seq}: every rank must make the same all_gather and barrier calls \
                         before finish"
                    ))))
                }
                Ok(Inbound::Lost(error)) => return Err(error),
                Ok(Inbound::Gathered { .. }) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    let missing: Vec<usize> = (0..parts.len())
                        .filter(|&rank| parts[rank].is_none())
                        .collect();
                    return Err(shared.fail(Error::Failed(format!(
                        "all_gather #{seq}: {} did not take part within {}: still busy, stuck, \
                         or making fewer all_gather/barrier calls than rank 0",
                        rank_list(&missing),
                        seconds(shared.timeout)
                    ))));
                }
            }
        }
        let parts: Vec<Vec<u8>> = parts.into_iter().flatten().collect();
        let bytes = wire::encode_gathered(seq, &parts)
            .map_err(|why| shared.fail(Error::Failed(format!("all_gather #{seq}: {why}"))))?;
        for link in &shared.links {
            if let Err(e) = link.send_bytes(&bytes) {
                return Err(shared.write_failed(link, e));
            }
        }
        Ok(parts)
    }

    /// Another rank sends its part to rank 0 and waits for the whole.
    fn gather_at_peer(&self, inbox: &Inbox, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let shared = &self.shared;
        let Some(rank0) = shared.links.first() else {
            return Err(Error::Failed(
                "this rank has no connection to rank 0".into(),
            ));
        };
        let bytes = wire::encode(&Frame::Gather {
            seq,
            data: mine.to_vec(),
        })
        .map_err(|why| shared.fail(Error::Failed(format!("all_gather #{seq}: {why}"))))?;
        if let Err(e) = rank0.send_bytes(&bytes) {
            return Err(shared.write_failed(rank0, e));
        }
        let deadline = deadline_after(shared.timeout);
        loop {
            match inbox.events.recv_timeout(remaining(deadline)) {
                Ok(Inbound::Gathered { seq: got, parts }) => {
                    if got != seq || parts.len() != shared.world_size {
                        return Err(shared.fail(Error::Failed(format!(
                            "rank 0 answered all_gather #{seq} with #{got} of {} parts: the \
                             ranks' all_gather and barrier calls are out of step",
                            parts.len()
                        ))));
                    }
                    return Ok(parts);
                }
                Ok(Inbound::Finished { .. }) => {
                    return Err(shared.fail(Error::Failed(format!(
                        "rank 0 called finish while rank {} waits in all_gather #{seq}: every \
                         rank must make the same all_gather and barrier calls before finish",
                        shared.rank
                    ))))
                }
                Ok(Inbound::Lost(error)) => return Err(error),
                Ok(Inbound::Contribution { .. }) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    return Err(shared.fail(Error::Failed(format!(
                        "all_gather #{seq}: rank 0 did not answer within {}: some rank has not \
                         reached this all_gather (still busy, stuck, or making fewer \
                         all_gather/barrier calls)",
                        seconds(shared.timeout)
                    ))))
                }
            }
        }
    }

    fn finish(&mut self) -> Result<()> {
        let lost = {
            let mut state = lock(&self.shared.state);
            state.closing = true;
            state.lost.clone()
        };
        if let Some(error) = lost {
            return Err(error);
        }
        self.stop_heartbeat();
        for link in &self.shared.links {
            if !link.is_finished() {
                let _ = link.send(&Frame::Finish);
            }
            link.close(Shutdown::Write);
        }
        self.wait_for_readers();
        Ok(())
    }

    fn abort(&self, message: &str) {
        {
            let mut state = lock(&self.shared.state);
            if state.closing {
                return;
            }
            state.closing = true;
            if state.lost.is_none() {
                state.lost = Some(Error::Failed(format!(
                    "this rank stopped the session: {message}"
                )));
            }
        }
        let text = format!("rank {} failed: {message}", self.shared.rank);
        self.shared.tell(&text, None);
        for link in &self.shared.links {
            link.close(Shutdown::Write);
        }
        self.wait_for_readers();
    }

    /// Waits (bounded) for the other sides to close in turn, so that nothing sent is reset
    /// away by closing with unread data.
    fn wait_for_readers(&self) {
        let deadline = deadline_after(self.shared.timeout.min(CLOSE_WAIT));
        while Instant::now() < deadline && !self.readers.iter().all(JoinHandle::is_finished) {
            thread::sleep(POLL);
        }
    }

    fn stop_heartbeat(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(beat) = self.heartbeat.take() {
            let _ = beat.join();
        }
    }
}

impl Drop for Net {
    /// Without finish: the peers see this rank exit.
    fn drop(&mut self) {
        lock(&self.shared.state).closing = true;
        for link in &self.shared.links {
            link.close(Shutdown::Both);
        }
        self.stop_heartbeat();
    }
}

fn make_link(peer: Peer, timeout: Duration) -> Result<(Link, TcpStream)> {
    let Peer {
        rank,
        host,
        pid,
        stream,
    } = peer;
    let setup = || -> io::Result<(TcpStream, TcpStream)> {
        stream.set_nodelay(true)?;
        // The silence after which the peer counts as frozen; heartbeats come far more often.
        stream.set_read_timeout(socket_timeout(timeout))?;
        stream.set_write_timeout(socket_timeout(timeout))?;
        Ok((stream.try_clone()?, stream.try_clone()?))
    };
    let (writer, control) = setup().map_err(|e| {
        Error::Failed(format!(
            "cannot set up the connection to rank {rank} ({host}): {e}"
        ))
    })?;
    let link = Link {
        rank,
        host,
        pid,
        writer: Mutex::new(writer),
        control,
        finished: AtomicBool::new(false),
    };
    Ok((link, stream))
}

/// The watchdog of one connection: hands data to the caller and turns the connection's end or
/// silence into a loss.
fn watch(shared: &Shared, link: &Link, mut stream: TcpStream) {
    let lost = loop {
        match wire::read_frame(&mut stream) {
            Ok(Frame::Heartbeat) => {}
            Ok(Frame::Gather { seq, data }) if shared.rank == 0 => {
                let from = link.rank;
                let _ = shared
                    .events
                    .send(Inbound::Contribution { from, seq, data });
            }
            Ok(Frame::Gathered { seq, parts }) if shared.rank != 0 => {
                let _ = shared.events.send(Inbound::Gathered { seq, parts });
            }
            Ok(Frame::Finish) => {
                link.finished.store(true, Ordering::SeqCst);
                let _ = shared.events.send(Inbound::Finished { from: link.rank });
                // Close our half in turn; keep reading until theirs closes.
                link.close(Shutdown::Write);
            }
            Ok(Frame::Abort { message }) => break Error::PeerLost(message),
            Ok(_) => {
                break Error::Failed(format!(
                    "{} sent a message out of place in gpukit's rendezvous protocol",
                    link.who()
                ))
            }
            Err(error) => {
                if link.is_finished() || lock(&shared.state).closing {
                    return;
                }
                break match error {
                    WireError::Closed => {
                        Error::PeerLost(format!("{} exited or lost its connection", link.who()))
                    }
                    WireError::TimedOut => Error::PeerLost(format!(
                        "{} sent nothing for {} (not even a heartbeat): it is frozen (stopped, \
                         swapping, stuck in the kernel) or the network between us failed",
                        link.who(),
                        seconds(shared.timeout)
                    )),
                    WireError::Io(e) => {
                        Error::PeerLost(format!("the connection to {} failed: {e}", link.who()))
                    }
                    WireError::Protocol(why) => Error::Failed(format!(
                        "{} broke gpukit's rendezvous protocol: {why}",
                        link.who()
                    )),
                };
            }
        }
    };
    shared.watchdog_lost(lost, link.rank);
    link.close(Shutdown::Both);
}

/// Sends a heartbeat to every unfinished link about once a second until stopped.
fn heartbeat(shared: &Shared) {
    let period = (shared.timeout / 4).clamp(Duration::from_millis(10), HEARTBEAT);
    let bytes = match wire::encode(&Frame::Heartbeat) {
        Ok(bytes) => bytes,
        Err(_) => return,
    };
    loop {
        {
            let stop = lock(&shared.stop);
            let stop = match shared.wake.wait_timeout_while(stop, period, |stop| !*stop) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
            if *stop {
                return;
            }
        }
        for link in &shared.links {
            if !link.is_finished() {
                // A failed write is the watchdog's to notice.
                let _ = link.send_bytes(&bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests;
