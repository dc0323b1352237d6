//! Meeting the other ranks: rank 0 listens, accepts connections until every rank has said who
//! it is (refusing strays, other protocol versions, duplicates and other world sizes) and
//! welcomes them with the blob; every other rank connects, retrying until rank 0 is there.
//! What follows the meeting (the links, the watchdogs) is the parent module's.

use super::*;

/// The address rank 0 binds: MASTER_ADDR itself when it is a loopback address (nothing from
/// outside could reach it anyway), else every interface, since a host name may name any of
/// them.
pub(super) fn bind_host(host: &str) -> String {
    if host.eq_ignore_ascii_case("localhost") {
        return "127.0.0.1".into();
    }
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => host.to_string(),
        Ok(IpAddr::V6(_)) => "::".into(),
        _ => "0.0.0.0".into(),
    }
}

pub(super) fn listen(world: &World) -> Result<TcpListener> {
    let bound = Endpoint {
        host: bind_host(&world.rendezvous.host),
        port: world.rendezvous.port,
    };
    TcpListener::bind(bound.to_string()).map_err(|e| listen_error(world, &bound, e))
}

fn listen_error(world: &World, bound: &Endpoint, error: io::Error) -> Error {
    let why = if error.kind() == io::ErrorKind::AddrInUse {
        "the port is in use, by another program or by an earlier run still closing".to_string()
    } else {
        error.to_string()
    };
    let hint = match world.launcher {
        Launcher::Gpukit => {
            "give `gpukit launch` another --master-port, or none to get a free one".to_string()
        }
        Launcher::Torchrun => "gpukit listens on MASTER_PORT, or on MASTER_PORT+1 when torchrun's \
             agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True); set \
             GPUKIT_RDZV_PORT to a free port, the same for every rank"
            .to_string(),
        Launcher::Slurm | Launcher::Mpi => {
            "set MASTER_PORT (or GPUKIT_RDZV_PORT) to a free port, the same for every rank"
                .to_string()
        }
    };
    let reached_as = if bound.to_string() == world.rendezvous.to_string() {
        String::new()
    } else {
        format!(" (the other ranks connect to {})", world.rendezvous)
    };
    Error::Unavailable(format!(
        "rank 0 cannot listen for gpukit's rendezvous on {bound}{reached_as}: {why}; {hint}"
    ))
}

/// What a new connection to rank 0 turned out to be.
enum Arrival {
    /// A rank, introduced.
    Rank(Arrived),
    /// A gpukit of another protocol version.
    WrongVersion {
        from: SocketAddr,
        version: u32,
        stream: TcpStream,
    },
    /// Not a rank: a stray client. `why` is None when it sent nothing (a port check), which is
    /// not worth a warning.
    Stray {
        from: SocketAddr,
        why: Option<String>,
    },
}

struct Arrived {
    hello: Hello,
    stream: TcpStream,
}

impl Arrived {
    fn who(&self) -> String {
        format!(
            "rank {} ({}, pid {})",
            self.hello.rank, self.hello.hostname, self.hello.pid
        )
    }
}

/// Rank 0's side of [`Session::join`], on a listener already bound (tests bind port 0).
pub(crate) fn join_as_root(
    world: &World,
    opts: Options,
    make_blob: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    listener: TcpListener,
) -> Result<Session> {
    let deadline = deadline_after(opts.timeout);
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Unavailable(format!("cannot poll the rendezvous port: {e}")))?;
    let (arrivals_tx, arrivals) = mpsc::channel();
    let mut ranks: Vec<Option<Arrived>> = (0..world.world_size).map(|_| None).collect();
    let mut waiting = world.world_size - 1;
    while waiting > 0 {
        accept_pending(&listener, &arrivals_tx, deadline)?;
        match arrivals.recv_timeout(POLL.min(remaining(deadline)).max(Duration::from_millis(1))) {
            Ok(Arrival::Rank(arrived)) => {
                if let Err(error) = check_hello(world, &ranks, &arrived) {
                    refuse(&arrived.stream, &error);
                    return Err(refuse_all(&ranks, error));
                }
                let rank = arrived.hello.rank as usize;
                ranks[rank] = Some(arrived);
                waiting -= 1;
            }
            Ok(Arrival::WrongVersion {
                from,
                version,
                stream,
            }) => {
                let error = Error::BadInput(format!(
                    "a process at {from} speaks gpukit's rendezvous protocol version {version}, \
                     rank 0 ({}) version {}: run the same gpukit on every node",
                    world.hostname,
                    wire::VERSION
                ));
                refuse(&stream, &error);
                return Err(refuse_all(&ranks, error));
            }
            Ok(Arrival::Stray { from, why }) => {
                if let Some(why) = why {
                    stderr_line(&format!(
                        "warning: gpukit's rendezvous on port {} ignored a connection from \
                         {from} that is no gpukit rank ({why}); is another program using this \
                         port?",
                        world.rendezvous.port
                    ));
                }
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        if waiting > 0 && Instant::now() >= deadline {
            let missing: Vec<usize> = (1..world.world_size)
                .filter(|&rank| ranks[rank].is_none())
                .collect();
            let error = Error::Unavailable(format!(
                "{} did not arrive within {} (rank 0 waited at {}); check that every process \
                 was started and that MASTER_ADDR/MASTER_PORT are the same for all",
                rank_list(&missing),
                seconds(opts.timeout),
                world.rendezvous
            ));
            return Err(refuse_all(&ranks, error));
        }
    }
    drop(listener);
    let arrived: Vec<Arrived> = ranks.into_iter().flatten().collect();
    welcome(world, opts, make_blob, arrived)
}

/// Hands each waiting connection to a handshake thread, so that a silent stray client cannot
/// hold up the ranks behind it.
fn accept_pending(
    listener: &TcpListener,
    arrivals: &Sender<Arrival>,
    deadline: Instant,
) -> Result<()> {
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                let arrivals = arrivals.clone();
                let handshake = move || {
                    let _ = arrivals.send(handshake(stream, from, deadline));
                };
                if let Err(error) = spawn("gpukit-rdzv-hello", handshake) {
                    stderr_line(&format!(
                        "warning: gpukit's rendezvous dropped a connection from {from}: {error}"
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                return Err(Error::Unavailable(format!(
                    "rank 0 cannot accept connections for the rendezvous: {e}"
                )))
            }
        }
    }
}

/// Reads a connection's preamble and introduction.
fn handshake(mut stream: TcpStream, from: SocketAddr, deadline: Instant) -> Arrival {
    let ready = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.set_read_timeout(socket_timeout(remaining(deadline))));
    if let Err(e) = ready {
        return Arrival::Stray {
            from,
            why: Some(format!("its connection could not be set up: {e}")),
        };
    }
    match wire::read_preamble(&mut stream) {
        Ok(wire::VERSION) => {}
        Ok(version) => {
            return Arrival::WrongVersion {
                from,
                version,
                stream,
            }
        }
        Err(WireError::Protocol(why)) => {
            return Arrival::Stray {
                from,
                why: Some(why),
            }
        }
        Err(_) => return Arrival::Stray { from, why: None },
    }
    match wire::read_frame(&mut stream) {
        Ok(Frame::Hello(hello)) => Arrival::Rank(Arrived { hello, stream }),
        Ok(_) => Arrival::Stray {
            from,
            why: Some("it did not introduce itself".into()),
        },
        Err(WireError::Protocol(why)) => Arrival::Stray {
            from,
            why: Some(why),
        },
        Err(_) => Arrival::Stray { from, why: None },
    }
}

/// Whether an introduced rank fits the world and the ranks before it.
fn check_hello(world: &World, ranks: &[Option<Arrived>], arrived: &Arrived) -> Result<()> {
    let hello = &arrived.hello;
    if hello.world_size != world.world_size as u64 {
        return Err(Error::BadInput(format!(
            "rank {} says WORLD_SIZE={} but rank 0 has {} (rank {} is {}, pid {}); start every \
             rank with the same world size",
            hello.rank, hello.world_size, world.world_size, hello.rank, hello.hostname, hello.pid
        )));
    }
    if hello.rank == 0 {
        return Err(Error::BadInput(format!(
            "two processes say they are rank 0: {} (pid {}) and {} (pid {}); every process needs \
             its own rank",
            world.hostname,
            std::process::id(),
            hello.hostname,
            hello.pid
        )));
    }
    let Some(earlier) = usize::try_from(hello.rank)
        .ok()
        .and_then(|rank| ranks.get(rank))
    else {
        return Err(Error::BadInput(format!(
            "{} is outside the world of {} ranks",
            arrived.who(),
            world.world_size
        )));
    };
    if let Some(earlier) = earlier {
        return Err(Error::BadInput(format!(
            "two processes say they are rank {}: {} (pid {}) and {} (pid {}); every process \
             needs its own rank (check RANK, SLURM_PROCID or the launcher's options)",
            hello.rank, earlier.hello.hostname, earlier.hello.pid, hello.hostname, hello.pid
        )));
    }
    Ok(())
}

/// Tells one connected rank why the rendezvous failed.
fn refuse(stream: &TcpStream, error: &Error) {
    let frame = Frame::Refused {
        kind: error.kind(),
        message: error.to_string(),
    };
    let mut stream = stream;
    let _ = stream.set_write_timeout(socket_timeout(CLOSE_WAIT));
    let _ = wire::write_frame(&mut stream, &frame);
}

/// Tells every connected rank, and returns the error for rank 0 itself.
fn refuse_all(ranks: &[Option<Arrived>], error: Error) -> Error {
    for arrived in ranks.iter().flatten() {
        refuse(&arrived.stream, &error);
    }
    error
}

/// Everyone is here: make the blob, send it with rank 0's identity, start the watchdogs.
fn welcome(
    world: &World,
    opts: Options,
    make_blob: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    arrived: Vec<Arrived>,
) -> Result<Session> {
    let everyone: Vec<Option<Arrived>> = arrived.into_iter().map(Some).collect();
    let blob = match make_blob() {
        Ok(blob) => blob,
        Err(message) => return Err(refuse_all(&everyone, blob_error(message))),
    };
    let frame = Frame::Welcome {
        pid: std::process::id(),
        hostname: world.hostname.clone(),
        blob,
    };
    let bytes = match wire::encode(&frame) {
        Ok(bytes) => bytes,
        Err(why) => return Err(refuse_all(&everyone, blob_error(why))),
    };
    let mut peers = Vec::new();
    for arrived in everyone.into_iter().flatten() {
        let peer = Peer {
            rank: arrived.hello.rank as usize,
            host: arrived.hello.hostname.clone(),
            pid: arrived.hello.pid,
            stream: arrived.stream,
        };
        peers.push(peer);
    }
    let blob = match frame {
        Frame::Welcome { blob, .. } => blob,
        _ => Vec::new(),
    };
    let net = Net::start(0, world.world_size, opts, peers, |links| {
        for link in links {
            link.send_bytes(&bytes).map_err(|e| {
                Error::PeerLost(format!(
                    "{} exited or lost its connection during the rendezvous ({e})",
                    link.who()
                ))
            })?;
        }
        Ok(())
    });
    Ok(Session {
        rank: 0,
        world_size: world.world_size,
        blob,
        net: Some(net?),
    })
}

// ---------------------------------------------------------------------------------------------
// Ranks other than 0: connecting.

pub(super) fn join_as_peer(world: &World, opts: Options) -> Result<Session> {
    let endpoint = &world.rendezvous;
    let mut stream = connect(endpoint, deadline_after(opts.timeout), opts.timeout)?;
    let waited = opts.timeout.saturating_add(REPLY_GRACE);
    let reply_deadline = deadline_after(waited);
    let hello = Frame::Hello(Hello {
        rank: world.rank as u64,
        world_size: world.world_size as u64,
        pid: std::process::id(),
        hostname: world.hostname.clone(),
    });
    let sent = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_write_timeout(socket_timeout(opts.timeout)))
        .and_then(|()| wire::write_preamble(&mut stream))
        .and_then(|()| wire::write_frame(&mut stream, &hello))
        .and_then(|()| stream.set_read_timeout(socket_timeout(remaining(reply_deadline))));
    if let Err(e) = sent {
        return Err(Error::Unavailable(format!(
            "rank {} could not introduce itself to rank 0 at {endpoint}: {e}",
            world.rank
        )));
    }
    match wire::read_frame(&mut stream) {
        Ok(Frame::Welcome {
            pid,
            hostname,
            blob,
        }) => {
            let rank0 = Peer {
                rank: 0,
                host: hostname,
                pid,
                stream,
            };
            let net = Net::start(world.rank, world.world_size, opts, vec![rank0], |_| Ok(()))?;
            Ok(Session {
                rank: world.rank,
                world_size: world.world_size,
                blob,
                net: Some(net),
            })
        }
        Ok(Frame::Refused { kind, message }) => Err(Error::of_kind(kind, message)),
        Ok(_) => Err(Error::Failed(format!(
            "{endpoint} answered rank {}'s introduction with something else than gpukit's rank \
             0 would: is another program listening there? set MASTER_PORT or GPUKIT_RDZV_PORT",
            world.rank
        ))),
        Err(WireError::Closed) => Err(Error::Unavailable(format!(
            "rank 0 at {endpoint} closed the connection before the rendezvous finished: it \
             failed or was stopped (see its output)"
        ))),
        Err(WireError::TimedOut) => Err(Error::Unavailable(format!(
            "rank 0 at {endpoint} took rank {}'s connection but did not finish the rendezvous \
             within {}: it is stuck, or another program listens on that port (torchrun's own \
             store on MASTER_PORT, for instance: set GPUKIT_RDZV_PORT)",
            world.rank,
            seconds(waited)
        ))),
        Err(WireError::Io(e)) => Err(Error::Unavailable(format!(
            "the connection to rank 0 at {endpoint} failed during the rendezvous: {e}"
        ))),
        // A rank 0 of another protocol version refuses this rank in its own encoding, which
        // reads as garbage here; rank 0's output names both versions.
        Err(WireError::Protocol(why)) => Err(Error::Failed(format!(
            "{endpoint} does not speak gpukit's rendezvous protocol version {} ({why}): is \
             another program listening there (set MASTER_PORT or GPUKIT_RDZV_PORT), or is it \
             a gpukit of another version (see rank 0's output)?",
            wire::VERSION
        ))),
    }
}

/// Connects to rank 0, retrying until `deadline` (rank 0 may not be listening yet).
fn connect(endpoint: &Endpoint, deadline: Instant, timeout: Duration) -> Result<TcpStream> {
    let mut last_error = String::from("no attempt finished");
    loop {
        match (endpoint.host.as_str(), endpoint.port).to_socket_addrs() {
            Ok(addresses) => {
                for address in addresses {
                    let attempt = remaining(deadline)
                        .min(CONNECT_TRY)
                        .max(Duration::from_millis(1));
                    match TcpStream::connect_timeout(&address, attempt) {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last_error = format!("{address}: {e}"),
                    }
                }
            }
            Err(e) => last_error = format!("cannot resolve {}: {e}", endpoint.host),
        }
        if Instant::now() >= deadline {
            return Err(Error::Unavailable(format!(
                "could not reach rank 0 at {endpoint} within {} (last attempt: {last_error}); \
                 check that rank 0 was started, that MASTER_ADDR/MASTER_PORT are the same for \
                 every rank, and that no firewall blocks the port",
                seconds(timeout)
            )));
        }
        thread::sleep(RETRY.min(remaining(deadline)));
    }
}

// ---------------------------------------------------------------------------------------------
// After the rendezvous: links, watchdogs, heartbeats, collectives.
