//! Who this process is among its peers: its rank, the world's size, its place on its node, and
//! where rank 0 listens for the rendezvous, read from whichever launcher started it.
//!
//! To use: [`from_process_env`] once at start; `None` means a plain single process (no launcher
//! variables), `Some(world)` goes to [`crate::rendezvous::Session::join`]. Tests pass a fake
//! environment to [`from_env`].
//!
//! Launchers, checked in this order (the first whose variables are present wins):
//!
//! 1. `gpukit launch`: `GPUKIT_LAUNCHER=gpukit` with RANK, WORLD_SIZE, LOCAL_RANK,
//!    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, all required.
//! 2. torchrun (or anything that sets RANK and WORLD_SIZE): MASTER_ADDR and MASTER_PORT are
//!    required; LOCAL_RANK defaults to 0. torchrun's elastic agent may itself serve a TCPStore on
//!    MASTER_PORT (it then sets `TORCHELASTIC_USE_AGENT_STORE=True`); gpukit then listens on
//!    MASTER_PORT+1.
//! 3. Open MPI's mpirun: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE.
//! 4. Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID, only
//!    inside a job step (see [`slurm`](self#slurm)).
//! 5. MPICH / Intel MPI (Hydra's mpiexec): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID or
//!    PMI_LOCAL_RANK.
//!
//! MPI comes before Slurm because mpirun inside an allocation starts its daemons with srun: its
//! ranks inherit the daemons' SLURM_PROCID (the node's index) and SLURM_NTASKS (the node count),
//! which are not the ranks' own. Hydra's PMI_RANK is ambiguous in the same way, and srun's own
//! PMI plugin sets PMI_RANK too, so PMI variables that agree with a Slurm step count as Slurm.
//!
//! The rendezvous port: `GPUKIT_RDZV_PORT` when set (for every launcher but `gpukit launch`,
//! which picks MASTER_PORT for gpukit alone), else MASTER_PORT (torchrun with its agent's store:
//! MASTER_PORT+1). Without MASTER_PORT: 29500 for mpirun, and 29500 + (SLURM_JOB_ID % 1000)
//! under Slurm, so that two jobs sharing a node rarely collide.
//!
//! # Slurm
//! srun starts each task inside a job *step* and sets SLURM_STEP_ID (and the older
//! SLURM_STEPID) for it. The batch script itself (sbatch's batch step) also sees SLURM_PROCID=0,
//! SLURM_LOCALID=0 and SLURM_NTASKS=<the job's --ntasks>, but no SLURM_STEP_ID (slurmstepd sets
//! it only for steps with a real step id), and no other tasks will come. So only a process with
//! SLURM_STEP_ID is taken as one of srun's ranks; in a batch script gpukit runs as one process.
//! MASTER_ADDR defaults to the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
//! where srun's block and cyclic distributions place rank 0; with `--distribution=arbitrary`
//! export MASTER_ADDR.

mod hostlist;

use crate::error::{Error, Result};
use gpukit_types::shown;
use serde::Serialize;
use std::fmt;

/// The port gpukit's rendezvous uses when a launcher gives none (PyTorch's default too).
pub const DEFAULT_PORT: u16 = 29500;

/// Which program started this process (and so which variables gave its rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// `gpukit launch`.
    Gpukit,
    /// torchrun, or another launcher that sets RANK and WORLD_SIZE.
    Torchrun,
    /// Slurm's srun.
    Slurm,
    /// An MPI launcher (Open MPI's mpirun, MPICH's or Intel MPI's mpiexec).
    Mpi,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Gpukit => "gpukit launch",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm (srun)",
            Launcher::Mpi => "mpirun",
        })
    }
}

/// A host and TCP port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// A host name or an IP address.
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl fmt::Display for Endpoint {
    /// `host:port`, with an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// This process's place among its peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct World {
    /// This process's rank, 0 to `world_size - 1`.
    pub rank: usize,
    /// How many processes (ranks) take part.
    pub world_size: usize,
    /// The rank among the processes on this node (which GPU to use, usually).
    pub local_rank: usize,
    /// How many ranks run on this node, when the launcher says.
    pub local_world_size: Option<usize>,
    /// Who started this process.
    pub launcher: Launcher,
    /// Where rank 0 listens for this crate's rendezvous.
    pub rendezvous: Endpoint,
    /// This machine's host name (for messages about this rank).
    pub hostname: String,
}

/// This process's world read through `get` (a variable's value, or None when unset); None when
/// no launcher's variables are present (a plain single process).
pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<World>> {
    let env = Env { get };
    if let Some(value) = env.text("GPUKIT_LAUNCHER") {
        if value != "gpukit" {
            return Err(Error::BadInput(format!(
                "GPUKIT_LAUNCHER={} is not understood: `gpukit launch` sets it to gpukit; unset it \
                 otherwise",
                shown(&value)
            )));
        }
        return gpukit(&env).map(Some);
    }
    if env.has("RANK") || env.has("WORLD_SIZE") {
        return torchrun(&env).map(Some);
    }
    if env.has("OMPI_COMM_WORLD_RANK") || env.has("OMPI_COMM_WORLD_SIZE") {
        return open_mpi(&env).map(Some);
    }
    let slurm_step = env.has("SLURM_STEP_ID") || env.has("SLURM_STEPID");
    let pmi = env.has("PMI_RANK") || env.has("PMI_SIZE");
    if pmi && !(slurm_step && pmi_is_sruns(&env)?) {
        return hydra(&env).map(Some);
    }
    if slurm_step {
        return slurm(&env).map(Some);
    }
    Ok(None)
}

/// [`from_env`] over this process's environment.
pub fn from_process_env() -> Result<Option<World>> {
    from_env(&|name| std::env::var(name).ok())
}

/// Every host of a Slurm host list (`node[01-04,07]`, `gpu-a[1-2],gpu-b3`), zero padding kept;
/// a malformed list is a [`Error::BadInput`] naming the fault.
pub fn expand_slurm_hostlist(list: &str) -> Result<Vec<String>> {
    hostlist::expand(list).map_err(|e| Error::BadInput(format!("Slurm host list: {e}")))
}

/// Reads variables, and says in errors which launcher they were read for.
struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    /// The variable's value, trimmed; None when unset or blank.
    fn text(&self, name: &str) -> Option<String> {
        (self.get)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn has(&self, name: &str) -> bool {
        self.text(name).is_some()
    }

    /// The first of `names` that is set, with its name.
    fn first(&self, names: &[&'static str]) -> Option<(&'static str, String)> {
        names
            .iter()
            .find_map(|&name| self.text(name).map(|value| (name, value)))
    }

    /// A whole number, or None when unset.
    fn number(&self, name: &str, why: &str) -> Result<Option<usize>> {
        let Some(value) = self.text(name) else {
            return Ok(None);
        };
        value.parse().map(Some).map_err(|_| {
            Error::BadInput(format!(
                "{name}={} is not a whole number ({why})",
                shown(&value)
            ))
        })
    }

    /// A whole number that must be set.
    fn required_number(&self, name: &str, why: &str) -> Result<usize> {
        self.number(name, why)?
            .ok_or_else(|| Error::BadInput(format!("{name} is not set ({why}, which sets it)")))
    }

    /// A TCP port (1-65535), or None when unset.
    fn port(&self, name: &str, why: &str) -> Result<Option<u16>> {
        let Some(value) = self.text(name) else {
            return Ok(None);
        };
        match value.parse::<u16>() {
            Ok(port) if port > 0 => Ok(Some(port)),
            _ => Err(Error::BadInput(format!(
                "{name}={} is not a TCP port (1-65535) ({why})",
                shown(&value)
            ))),
        }
    }
}

/// The numbers every launcher yields, with the names they came from (for messages).
struct Ranks {
    why: &'static str,
    rank: (&'static str, usize),
    size: (&'static str, usize),
    local_rank: (&'static str, usize),
    local_size: Option<(&'static str, usize)>,
}

/// Checks the numbers against each other and builds the world.
fn build(ranks: Ranks, launcher: Launcher, rendezvous: Endpoint) -> Result<World> {
    let Ranks {
        why,
        rank: (rank_name, rank),
        size: (size_name, size),
        local_rank: (local_rank_name, local_rank),
        local_size,
    } = ranks;
    if size == 0 {
        return Err(Error::BadInput(format!(
            "{size_name}=0: a world needs at least one rank ({why})"
        )));
    }
    if rank >= size {
        return Err(Error::BadInput(format!(
            "{rank_name}={rank} is not below {size_name}={size}: ranks count from 0 ({why})"
        )));
    }
    if let Some((local_size_name, local_size)) = local_size {
        if local_rank >= local_size {
            return Err(Error::BadInput(format!(
                "{local_rank_name}={local_rank} is not below {local_size_name}={local_size}: local \
                 ranks count from 0 ({why})"
            )));
        }
        if local_size > size {
            return Err(Error::BadInput(format!(
                "{local_size_name}={local_size} is more than {size_name}={size} ({why})"
            )));
        }
    }
    Ok(World {
        rank,
        world_size: size,
        local_rank,
        local_world_size: local_size.map(|(_, n)| n),
        launcher,
        rendezvous,
        hostname: local_hostname(),
    })
}

/// MASTER_ADDR, required for a world of more than one rank; a world of one needs no peer and
/// defaults to this machine.
fn master_addr(env: &Env, size: usize, why: &str, launcher: Launcher) -> Result<String> {
    match env.text("MASTER_ADDR") {
        Some(addr) => Ok(addr),
        None if size == 1 => Ok("127.0.0.1".into()),
        None => Err(Error::BadInput(format!(
            "MASTER_ADDR is not set: {launcher} was recognised ({why}) and it always sets \
             MASTER_ADDR to rank 0's host; set it (the same on every rank)"
        ))),
    }
}

/// MASTER_PORT, required for a world of more than one rank.
fn master_port(env: &Env, size: usize, why: &str, launcher: Launcher) -> Result<u16> {
    match env.port("MASTER_PORT", why)? {
        Some(port) => Ok(port),
        None if size == 1 => Ok(DEFAULT_PORT),
        None => Err(Error::BadInput(format!(
            "MASTER_PORT is not set: {launcher} was recognised ({why}) and it always sets \
             MASTER_PORT; set it (the same on every rank)"
        ))),
    }
}

/// GPUKIT_RDZV_PORT, which overrides the port every launcher but gpukit's would give.
fn override_port(env: &Env) -> Result<Option<u16>> {
    env.port(
        "GPUKIT_RDZV_PORT",
        "it chooses the port of gpukit's rendezvous",
    )
}

fn gpukit(env: &Env) -> Result<World> {
    const WHY: &str = "GPUKIT_LAUNCHER=gpukit: started by `gpukit launch`";
    let size = env.required_number("WORLD_SIZE", WHY)?;
    let local_size = env.required_number("LOCAL_WORLD_SIZE", WHY)?;
    let ranks = Ranks {
        why: WHY,
        rank: ("RANK", env.required_number("RANK", WHY)?),
        size: ("WORLD_SIZE", size),
        local_rank: ("LOCAL_RANK", env.required_number("LOCAL_RANK", WHY)?),
        local_size: Some(("LOCAL_WORLD_SIZE", local_size)),
    };
    let host = env
        .text("MASTER_ADDR")
        .ok_or_else(|| Error::BadInput(format!("MASTER_ADDR is not set ({WHY}, which sets it)")))?;
    let port = env
        .port("MASTER_PORT", WHY)?
        .ok_or_else(|| Error::BadInput(format!("MASTER_PORT is not set ({WHY}, which sets it)")))?;
    build(ranks, Launcher::Gpukit, Endpoint { host, port })
}

fn torchrun(env: &Env) -> Result<World> {
    const WHY: &str = "RANK/WORLD_SIZE: started by torchrun or a launcher like it";
    let (rank, size) = match (env.number("RANK", WHY)?, env.number("WORLD_SIZE", WHY)?) {
        (Some(rank), Some(size)) => (rank, size),
        (Some(_), None) => {
            return Err(Error::BadInput(
                "RANK is set but WORLD_SIZE is not: a launcher sets both (torchrun does); set \
                 WORLD_SIZE to the number of processes, or unset RANK for a single process"
                    .into(),
            ))
        }
        (None, _) => {
            return Err(Error::BadInput(
                "WORLD_SIZE is set but RANK is not: a launcher sets both (torchrun does); set \
                 RANK to this process's rank, or unset WORLD_SIZE for a single process"
                    .into(),
            ))
        }
    };
    let local_rank = env.number("LOCAL_RANK", WHY)?.unwrap_or(0);
    let local_size = env.number("LOCAL_WORLD_SIZE", WHY)?;
    let host = master_addr(env, size, WHY, Launcher::Torchrun)?;
    let port = match override_port(env)? {
        Some(port) => port,
        None => torchrun_port(env, size, WHY)?,
    };
    let ranks = Ranks {
        why: WHY,
        rank: ("RANK", rank),
        size: ("WORLD_SIZE", size),
        local_rank: ("LOCAL_RANK", local_rank),
        local_size: local_size.map(|n| ("LOCAL_WORLD_SIZE", n)),
    };
    build(ranks, Launcher::Torchrun, Endpoint { host, port })
}

/// MASTER_PORT, or MASTER_PORT+1 when torchrun's agent already serves its TCPStore there.
fn torchrun_port(env: &Env, size: usize, why: &str) -> Result<u16> {
    let port = master_port(env, size, why, Launcher::Torchrun)?;
    if !uses_agent_store(env) {
        return Ok(port);
    }
    port.checked_add(1).ok_or_else(|| {
        Error::BadInput(format!(
            "MASTER_PORT={port}: torchrun's agent serves its store there \
             (TORCHELASTIC_USE_AGENT_STORE=True), so gpukit would use MASTER_PORT+1, which is \
             not a port; set GPUKIT_RDZV_PORT to a free port (the same on every node)"
        ))
    })
}

/// Whether torchrun's elastic agent already listens on MASTER_PORT (its own TCPStore).
fn uses_agent_store(env: &Env) -> bool {
    env.text("TORCHELASTIC_USE_AGENT_STORE")
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

fn open_mpi(env: &Env) -> Result<World> {
    const WHY: &str = "OMPI_COMM_WORLD_*: started by Open MPI's mpirun";
    let size = env.required_number("OMPI_COMM_WORLD_SIZE", WHY)?;
    let local_size = env.number("OMPI_COMM_WORLD_LOCAL_SIZE", WHY)?;
    let ranks = Ranks {
        why: WHY,
        rank: (
            "OMPI_COMM_WORLD_RANK",
            env.required_number("OMPI_COMM_WORLD_RANK", WHY)?,
        ),
        size: ("OMPI_COMM_WORLD_SIZE", size),
        local_rank: (
            "OMPI_COMM_WORLD_LOCAL_RANK",
            env.number("OMPI_COMM_WORLD_LOCAL_RANK", WHY)?.unwrap_or(0),
        ),
        local_size: local_size.map(|n| ("OMPI_COMM_WORLD_LOCAL_SIZE", n)),
    };
    let rendezvous = mpi_rendezvous(env, size, local_size, WHY)?;
    build(ranks, Launcher::Mpi, rendezvous)
}

fn hydra(env: &Env) -> Result<World> {
    const WHY: &str = "PMI_RANK/PMI_SIZE: started by MPICH's or Intel MPI's mpiexec";
    let size = env.required_number("PMI_SIZE", WHY)?;
    let local_rank = match env.first(&["MPI_LOCALRANKID", "PMI_LOCAL_RANK"]) {
        Some((name, _)) => (name, env.required_number(name, WHY)?),
        None => ("MPI_LOCALRANKID", 0),
    };
    let local_size = match env.first(&["MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"]) {
        Some((name, _)) => Some((name, env.required_number(name, WHY)?)),
        None => None,
    };
    let ranks = Ranks {
        why: WHY,
        rank: ("PMI_RANK", env.required_number("PMI_RANK", WHY)?),
        size: ("PMI_SIZE", size),
        local_rank,
        local_size,
    };
    let rendezvous = mpi_rendezvous(env, size, local_size.map(|(_, n)| n), WHY)?;
    build(ranks, Launcher::Mpi, rendezvous)
}

/// MPI launchers do not set MASTER_ADDR: it is exported by the user, or defaults to this machine
/// when every rank runs here.
fn mpi_rendezvous(
    env: &Env,
    size: usize,
    local_size: Option<usize>,
    why: &str,
) -> Result<Endpoint> {
    let all_here = size == 1 || local_size == Some(size);
    let host = match env.text("MASTER_ADDR") {
        Some(host) => host,
        None if all_here => "127.0.0.1".into(),
        None => {
            return Err(Error::BadInput(format!(
                "MASTER_ADDR is not set: mpirun was recognised ({why}) and its ranks run on \
                 several machines, so every rank must be told rank 0's host: `mpirun -x \
                 MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ...` (Open MPI) or `mpiexec \
                 -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT 29500 ...` (MPICH, Intel \
                 MPI)"
            )))
        }
    };
    let port = match override_port(env)? {
        Some(port) => port,
        None => env.port("MASTER_PORT", why)?.unwrap_or(DEFAULT_PORT),
    };
    Ok(Endpoint { host, port })
}

/// Whether PMI_RANK/PMI_SIZE were set by srun's own PMI plugin (they then agree with the step's
/// SLURM_PROCID and task count) rather than by a Hydra mpiexec whose proxies srun started.
fn pmi_is_sruns(env: &Env) -> Result<bool> {
    const WHY: &str = "PMI_RANK/PMI_SIZE: started by an MPI launcher or srun's PMI plugin";
    let pmi = (env.number("PMI_RANK", WHY)?, env.number("PMI_SIZE", WHY)?);
    let slurm = (
        env.text("SLURM_PROCID").and_then(|v| v.parse().ok()),
        env.first(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])
            .and_then(|(_, v)| v.parse().ok()),
    );
    Ok(pmi == slurm)
}

fn slurm(env: &Env) -> Result<World> {
    const WHY: &str = "SLURM_STEP_ID: started by srun";
    let (size_name, _) = env
        .first(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])
        .ok_or_else(|| {
            Error::BadInput(format!(
                "neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is set ({WHY}, which sets them)"
            ))
        })?;
    let size = env.required_number(size_name, WHY)?;
    let rank = env.required_number("SLURM_PROCID", WHY)?;
    let local_rank = env.required_number("SLURM_LOCALID", WHY)?;
    let local_size = slurm_local_size(env)?;
    let host = match env.text("MASTER_ADDR") {
        Some(host) => host,
        None => slurm_first_host(env, size)?,
    };
    let port = match override_port(env)? {
        Some(port) => port,
        None => match env.port("MASTER_PORT", WHY)? {
            Some(port) => port,
            None => slurm_default_port(env)?,
        },
    };
    let ranks = Ranks {
        why: WHY,
        rank: ("SLURM_PROCID", rank),
        size: (size_name, size),
        local_rank: ("SLURM_LOCALID", local_rank),
        local_size,
    };
    build(ranks, Launcher::Slurm, Endpoint { host, port })
}

/// This node's task count: the step's tasks-per-node list at SLURM_NODEID, else
/// SLURM_NTASKS_PER_NODE. Unknown (None) when Slurm does not say or says it in a form not read
/// here: it only refines messages and GPU choice, so it is no reason to refuse to run.
fn slurm_local_size(env: &Env) -> Result<Option<(&'static str, usize)>> {
    let node = env
        .text("SLURM_NODEID")
        .and_then(|v| v.parse::<usize>().ok());
    if let (Some(node), Some((name, list))) = (
        node,
        env.first(&["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]),
    ) {
        if let Ok(Some(count)) = hostlist::tasks_on_node(&list, node) {
            return Ok(Some((name, count)));
        }
    }
    let per_node = env
        .text("SLURM_NTASKS_PER_NODE")
        .and_then(|v| v.parse::<usize>().ok());
    Ok(per_node.map(|n| ("SLURM_NTASKS_PER_NODE", n)))
}

/// The first host of the step's node list (where srun starts rank 0).
fn slurm_first_host(env: &Env, size: usize) -> Result<String> {
    let Some((name, list)) = env.first(&[
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]) else {
        if size == 1 {
            return Ok("127.0.0.1".into());
        }
        return Err(Error::BadInput(
            "MASTER_ADDR is not set and neither is SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST \
             (Slurm (srun) was recognised: SLURM_STEP_ID is set); export MASTER_ADDR=<host of \
             rank 0>"
                .into(),
        ));
    };
    hostlist::first_host(&list).map_err(|e| {
        Error::BadInput(format!(
            "{name}={}: {e}; export MASTER_ADDR=<host of rank 0> to bypass it",
            shown(&list)
        ))
    })
}

/// 29500 + (SLURM_JOB_ID % 1000): one port per job, so two jobs on one node rarely collide.
fn slurm_default_port(env: &Env) -> Result<u16> {
    const WHY: &str = "it chooses gpukit's port when MASTER_PORT is not set";
    let job = match env.first(&["SLURM_JOB_ID", "SLURM_JOBID"]) {
        Some((name, _)) => env.required_number(name, WHY)?,
        None => 0,
    };
    // job % 1000 < 1000, so the sum stays below 30500.
    Ok(DEFAULT_PORT + (job % 1000) as u16)
}

/// This machine's name, for messages about this rank.
fn local_hostname() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string());
    from_kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests;
