use super::*;
use gpukit_types::{ErrorKind, HasKind};
use std::collections::HashMap;

/// The world of a fake environment.
fn world<K: AsRef<str>, V: AsRef<str>>(vars: &[(K, V)]) -> Result<Option<World>> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
        .collect();
    from_env(&move |name| map.get(name).cloned())
}

fn some_world<K: AsRef<str>, V: AsRef<str>>(vars: &[(K, V)]) -> World {
    match world(vars) {
        Ok(Some(world)) => world,
        other => panic!("expected a world, got {other:?}"),
    }
}

/// The BadInput message of a fake environment (fails the test otherwise).
fn bad<K: AsRef<str>, V: AsRef<str>>(vars: &[(K, V)]) -> String {
    match world(vars) {
        Err(error) => {
            assert_eq!(error.kind(), ErrorKind::BadInput, "{error}");
            error.to_string()
        }
        Ok(w) => panic!("expected an error, got {w:?}"),
    }
}

/// `base` with some variables set (Some) or removed (None).
fn with<K: AsRef<str>, V: AsRef<str>>(
    base: &[(K, V)],
    changes: &[(&str, Option<&str>)],
) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = base
        .iter()
        .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
        .collect();
    for &(name, value) in changes {
        vars.retain(|(k, _)| k != name);
        if let Some(value) = value {
            vars.push((name.to_string(), value.to_string()));
        }
    }
    vars
}

fn endpoint(host: &str, port: u16) -> Endpoint {
    Endpoint {
        host: host.into(),
        port,
    }
}

const GPUKIT: &[(&str, &str)] = &[
    ("GPUKIT_LAUNCHER", "gpukit"),
    ("RANK", "3"),
    ("WORLD_SIZE", "4"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "2"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29400"),
];

const TORCHRUN: &[(&str, &str)] = &[
    ("RANK", "5"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "4"),
    ("MASTER_ADDR", "nodeA"),
    ("MASTER_PORT", "29500"),
    ("TORCHELASTIC_RUN_ID", "none"),
];

/// What srun sets for task 5 of 8, two nodes of four tasks, the second node.
const SRUN: &[(&str, &str)] = &[
    ("SLURM_JOB_ID", "123456"),
    ("SLURM_JOB_NODELIST", "gpu[07-08]"),
    ("SLURM_NTASKS", "8"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_STEPID", "0"),
    ("SLURM_STEP_NODELIST", "gpu[07-08]"),
    ("SLURM_STEP_NUM_TASKS", "8"),
    ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
    ("SLURM_TASKS_PER_NODE", "4(x2)"),
    ("SLURM_NODEID", "1"),
    ("SLURM_PROCID", "5"),
    ("SLURM_LOCALID", "1"),
];

#[test]
fn no_launcher_is_a_single_process() {
    assert_eq!(world::<&str, &str>(&[]), Ok(None));
    assert_eq!(world(&[("PATH", "/usr/bin"), ("HOME", "/root")]), Ok(None));
    assert_eq!(
        world(&[("RANK", "  ")]),
        Ok(None),
        "a blank variable is unset"
    );
}

#[test]
fn gpukit_launch() {
    let w = some_world(GPUKIT);
    assert_eq!(w.launcher, Launcher::Gpukit);
    assert_eq!(
        (w.rank, w.world_size, w.local_rank, w.local_world_size),
        (3, 4, 1, Some(2))
    );
    assert_eq!(w.rendezvous, endpoint("10.0.0.1", 29400));
    assert!(!w.hostname.is_empty());
    assert_eq!(w.launcher.to_string(), "gpukit launch");
}

#[test]
fn gpukit_launch_needs_every_variable() {
    for name in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        let message = bad(&with(GPUKIT, &[(name, None)]));
        assert!(message.contains(&format!("{name} is not set")), "{message}");
        assert!(message.contains("GPUKIT_LAUNCHER=gpukit"), "{message}");
    }
    let message = bad(&with(GPUKIT, &[("GPUKIT_LAUNCHER", Some("slurm"))]));
    assert!(message.contains("GPUKIT_LAUNCHER=slurm"), "{message}");
}

#[test]
fn gpukit_ignores_the_rendezvous_port_override() {
    let w = some_world(&with(GPUKIT, &[("GPUKIT_RDZV_PORT", Some("40000"))]));
    assert_eq!(
        w.rendezvous.port, 29400,
        "gpukit launch chose MASTER_PORT for gpukit alone"
    );
}

#[test]
fn torchrun() {
    let w = some_world(TORCHRUN);
    assert_eq!(w.launcher, Launcher::Torchrun);
    assert_eq!(
        (w.rank, w.world_size, w.local_rank, w.local_world_size),
        (5, 8, 1, Some(4))
    );
    assert_eq!(w.rendezvous, endpoint("nodeA", 29500));
}

#[test]
fn torchrun_agent_store_moves_gpukit_to_the_next_port() {
    let agent = with(TORCHRUN, &[("TORCHELASTIC_USE_AGENT_STORE", Some("True"))]);
    assert_eq!(some_world(&agent).rendezvous.port, 29501);
    let not_agent = with(TORCHRUN, &[("TORCHELASTIC_USE_AGENT_STORE", Some("False"))]);
    assert_eq!(some_world(&not_agent).rendezvous.port, 29500);
    let chosen = with(&agent, &[("GPUKIT_RDZV_PORT", Some("31000"))]);
    assert_eq!(
        some_world(&chosen).rendezvous.port,
        31000,
        "GPUKIT_RDZV_PORT wins"
    );
    let top = with(&agent, &[("MASTER_PORT", Some("65535"))]);
    let message = bad(&top);
    assert!(message.contains("GPUKIT_RDZV_PORT"), "{message}");
    assert!(message.contains("MASTER_PORT+1"), "{message}");
}

#[test]
fn torchrun_like_launchers_without_local_variables() {
    let vars = with(
        TORCHRUN,
        &[("LOCAL_RANK", None), ("LOCAL_WORLD_SIZE", None)],
    );
    let w = some_world(&vars);
    assert_eq!((w.local_rank, w.local_world_size), (0, None));
}

#[test]
fn rank_and_world_size_come_together() {
    let message = bad(&[("RANK", "0"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "1")]);
    assert!(
        message.contains("RANK is set but WORLD_SIZE is not"),
        "{message}"
    );
    let message = bad(&[
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "1"),
    ]);
    assert!(
        message.contains("WORLD_SIZE is set but RANK is not"),
        "{message}"
    );
}

#[test]
fn numbers_are_checked() {
    let message = bad(&with(TORCHRUN, &[("RANK", Some("two"))]));
    assert!(
        message.contains("RANK=two is not a whole number"),
        "{message}"
    );
    let message = bad(&with(TORCHRUN, &[("WORLD_SIZE", Some("-1"))]));
    assert!(message.contains("WORLD_SIZE=-1"), "{message}");
    let message = bad(&with(TORCHRUN, &[("LOCAL_RANK", Some("1.5"))]));
    assert!(message.contains("LOCAL_RANK=1.5"), "{message}");
    let message = bad(&with(TORCHRUN, &[("RANK", Some("8"))]));
    assert!(
        message.contains("RANK=8 is not below WORLD_SIZE=8"),
        "{message}"
    );
    let message = bad(&with(
        TORCHRUN,
        &[("RANK", Some("0")), ("WORLD_SIZE", Some("0"))],
    ));
    assert!(message.contains("WORLD_SIZE=0"), "{message}");
    let message = bad(&with(TORCHRUN, &[("LOCAL_RANK", Some("4"))]));
    assert!(
        message.contains("LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        "{message}"
    );
    let message = bad(&with(TORCHRUN, &[("LOCAL_WORLD_SIZE", Some("9"))]));
    assert!(
        message.contains("LOCAL_WORLD_SIZE=9 is more than WORLD_SIZE=8"),
        "{message}"
    );
}

#[test]
fn ports_are_checked() {
    for port in ["0", "65536", "http", "-5"] {
        let message = bad(&with(TORCHRUN, &[("MASTER_PORT", Some(port))]));
        assert!(
            message.contains(&format!("MASTER_PORT={port} is not a TCP port")),
            "{message}"
        );
    }
    let message = bad(&with(TORCHRUN, &[("GPUKIT_RDZV_PORT", Some("99999"))]));
    assert!(message.contains("GPUKIT_RDZV_PORT=99999"), "{message}");
}

#[test]
fn torchrun_needs_master_addr_and_port() {
    let message = bad(&with(TORCHRUN, &[("MASTER_ADDR", None)]));
    assert!(message.contains("MASTER_ADDR is not set"), "{message}");
    assert!(message.contains("torchrun was recognised"), "{message}");
    let message = bad(&with(TORCHRUN, &[("MASTER_PORT", None)]));
    assert!(message.contains("MASTER_PORT is not set"), "{message}");
}

#[test]
fn a_world_of_one_needs_no_address() {
    let w = some_world(&[("RANK", "0"), ("WORLD_SIZE", "1")]);
    assert_eq!((w.rank, w.world_size), (0, 1));
    assert_eq!(w.rendezvous, endpoint("127.0.0.1", DEFAULT_PORT));
}

#[test]
fn long_values_are_shortened_in_messages() {
    let long = "9".repeat(200);
    let message = bad(&with(TORCHRUN, &[("RANK", Some(&long))]));
    assert!(message.len() < 200, "{message}");
}

#[test]
fn slurm_step() {
    let w = some_world(SRUN);
    assert_eq!(w.launcher, Launcher::Slurm);
    assert_eq!(
        (w.rank, w.world_size, w.local_rank, w.local_world_size),
        (5, 8, 1, Some(4))
    );
    assert_eq!(w.rendezvous, endpoint("gpu07", 29500 + 456));
    assert_eq!(w.launcher.to_string(), "Slurm (srun)");
}

#[test]
fn slurm_uses_the_legacy_step_variable_too() {
    let w = some_world(&with(SRUN, &[("SLURM_STEP_ID", None)]));
    assert_eq!(w.launcher, Launcher::Slurm);
}

#[test]
fn slurm_batch_step_is_a_single_process() {
    // What a batch script sees with `#SBATCH --ntasks=4`: no step id, no other tasks coming.
    let batch = [
        ("SLURM_JOB_ID", "123456"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NPROCS", "4"),
        ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_PROCID", "0"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", "0"),
    ];
    assert_eq!(world(&batch), Ok(None));
}

#[test]
fn slurm_addresses_and_ports() {
    let given = with(
        SRUN,
        &[("MASTER_ADDR", Some("head")), ("MASTER_PORT", Some("4000"))],
    );
    assert_eq!(some_world(&given).rendezvous, endpoint("head", 4000));
    let overridden = with(&given, &[("GPUKIT_RDZV_PORT", Some("4100"))]);
    assert_eq!(some_world(&overridden).rendezvous.port, 4100);
    let step_first = with(SRUN, &[("SLURM_STEP_NODELIST", Some("rack1-n[003-004]"))]);
    assert_eq!(some_world(&step_first).rendezvous.host, "rack1-n003");
    let job_list = with(
        SRUN,
        &[
            ("SLURM_STEP_NODELIST", None),
            ("SLURM_JOB_NODELIST", Some("a[1-2],b3")),
        ],
    );
    assert_eq!(some_world(&job_list).rendezvous.host, "a1");
    let no_job = with(SRUN, &[("SLURM_JOB_ID", None)]);
    assert_eq!(some_world(&no_job).rendezvous.port, DEFAULT_PORT);
    let message = bad(&with(SRUN, &[("SLURM_JOB_ID", Some("x1"))]));
    assert!(message.contains("SLURM_JOB_ID=x1"), "{message}");
}

#[test]
fn slurm_malformed_or_missing_node_list() {
    let message = bad(&with(SRUN, &[("SLURM_STEP_NODELIST", Some("gpu[07-"))]));
    assert!(message.contains("SLURM_STEP_NODELIST=gpu[07-"), "{message}");
    assert!(message.contains("MASTER_ADDR"), "{message}");
    let message = bad(&with(
        SRUN,
        &[("SLURM_STEP_NODELIST", None), ("SLURM_JOB_NODELIST", None)],
    ));
    assert!(message.contains("MASTER_ADDR is not set"), "{message}");
}

#[test]
fn slurm_local_size_sources() {
    let uneven = with(
        SRUN,
        &[
            ("SLURM_STEP_TASKS_PER_NODE", Some("5,3")),
            ("SLURM_PROCID", Some("6")),
        ],
    );
    assert_eq!(some_world(&uneven).local_world_size, Some(3));
    let per_node = with(
        SRUN,
        &[
            ("SLURM_STEP_TASKS_PER_NODE", None),
            ("SLURM_TASKS_PER_NODE", None),
            ("SLURM_NTASKS_PER_NODE", Some("4")),
        ],
    );
    assert_eq!(some_world(&per_node).local_world_size, Some(4));
    let unknown = with(
        SRUN,
        &[
            ("SLURM_STEP_TASKS_PER_NODE", Some("weird")),
            ("SLURM_TASKS_PER_NODE", None),
        ],
    );
    assert_eq!(some_world(&unknown).local_world_size, None);
}

#[test]
fn slurm_values_are_checked() {
    let message = bad(&with(SRUN, &[("SLURM_PROCID", Some("8"))]));
    assert!(
        message.contains("SLURM_PROCID=8 is not below SLURM_STEP_NUM_TASKS=8"),
        "{message}"
    );
    let message = bad(&with(SRUN, &[("SLURM_LOCALID", Some("x"))]));
    assert!(message.contains("SLURM_LOCALID=x"), "{message}");
    let message = bad(&with(
        SRUN,
        &[("SLURM_STEP_NUM_TASKS", None), ("SLURM_NTASKS", None)],
    ));
    assert!(message.contains("SLURM_NTASKS"), "{message}");
    let from_ntasks = with(SRUN, &[("SLURM_STEP_NUM_TASKS", None)]);
    assert_eq!(some_world(&from_ntasks).world_size, 8);
}

const OPEN_MPI: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_RANK", "2"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
];

#[test]
fn open_mpi_across_nodes_needs_master_addr() {
    let message = bad(OPEN_MPI);
    assert!(message.contains("MASTER_ADDR is not set"), "{message}");
    assert!(message.contains("mpirun -x MASTER_ADDR="), "{message}");
    let w = some_world(&with(
        OPEN_MPI,
        &[("MASTER_ADDR", Some("a")), ("MASTER_PORT", Some("29600"))],
    ));
    assert_eq!(w.launcher, Launcher::Mpi);
    assert_eq!(
        (w.rank, w.world_size, w.local_rank, w.local_world_size),
        (2, 4, 0, Some(2))
    );
    assert_eq!(w.rendezvous, endpoint("a", 29600));
    let default_port = some_world(&with(OPEN_MPI, &[("MASTER_ADDR", Some("a"))]));
    assert_eq!(default_port.rendezvous.port, DEFAULT_PORT);
    assert_eq!(w.launcher.to_string(), "mpirun");
}

#[test]
fn open_mpi_on_one_node_defaults_to_this_machine() {
    let one_node = with(OPEN_MPI, &[("OMPI_COMM_WORLD_LOCAL_SIZE", Some("4"))]);
    assert_eq!(
        some_world(&one_node).rendezvous,
        endpoint("127.0.0.1", DEFAULT_PORT)
    );
    let message = bad(&with(OPEN_MPI, &[("OMPI_COMM_WORLD_SIZE", None)]));
    assert!(
        message.contains("OMPI_COMM_WORLD_SIZE is not set"),
        "{message}"
    );
    let message = bad(&with(
        one_node.as_slice(),
        &[("OMPI_COMM_WORLD_RANK", Some("4"))],
    ));
    assert!(
        message.contains("OMPI_COMM_WORLD_RANK=4 is not below"),
        "{message}"
    );
}

#[test]
fn mpirun_inside_a_slurm_allocation_is_mpi() {
    // Open MPI's daemons were started by srun: the ranks inherit the daemons' step variables.
    let mut vars = with(
        SRUN,
        &[
            ("SLURM_PROCID", Some("1")),
            ("SLURM_STEP_NUM_TASKS", Some("2")),
        ],
    );
    vars.extend(with(OPEN_MPI, &[("MASTER_ADDR", Some("gpu07"))]));
    let w = some_world(&vars);
    assert_eq!(w.launcher, Launcher::Mpi);
    assert_eq!((w.rank, w.world_size), (2, 4));
}

#[test]
fn hydra_mpiexec() {
    let vars = [
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("MPI_LOCALRANKID", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("MASTER_ADDR", "a"),
    ];
    let w = some_world(&vars);
    assert_eq!(w.launcher, Launcher::Mpi);
    assert_eq!(
        (w.rank, w.world_size, w.local_rank, w.local_world_size),
        (3, 4, 1, Some(2))
    );
    let bare = some_world(&[("PMI_RANK", "3"), ("PMI_SIZE", "4"), ("MASTER_ADDR", "a")]);
    assert_eq!((bare.local_rank, bare.local_world_size), (0, None));
    let other_names = some_world(&[
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("PMI_LOCAL_RANK", "1"),
        ("PMI_LOCAL_SIZE", "4"),
    ]);
    assert_eq!(other_names.local_rank, 1);
    assert_eq!(
        other_names.rendezvous.host, "127.0.0.1",
        "all four ranks are local"
    );
    let message = bad(&[("PMI_RANK", "3"), ("PMI_SIZE", "4")]);
    assert!(message.contains("MASTER_ADDR"), "{message}");
    let message = bad(&[("PMI_RANK", "3"), ("MASTER_ADDR", "a")]);
    assert!(message.contains("PMI_SIZE is not set"), "{message}");
}

#[test]
fn srun_pmi_plugin_counts_as_slurm() {
    let vars = with(SRUN, &[("PMI_RANK", Some("5")), ("PMI_SIZE", Some("8"))]);
    assert_eq!(some_world(&vars).launcher, Launcher::Slurm);
    // Hydra's proxies started by srun: the PMI numbers disagree with the step's.
    let hydra = with(
        SRUN,
        &[
            ("SLURM_PROCID", Some("1")),
            ("SLURM_STEP_NUM_TASKS", Some("2")),
            ("PMI_RANK", Some("5")),
            ("PMI_SIZE", Some("8")),
            ("MASTER_ADDR", Some("gpu07")),
        ],
    );
    assert_eq!(some_world(&hydra).launcher, Launcher::Mpi);
}

#[test]
fn endpoints_print_as_host_and_port() {
    assert_eq!(endpoint("a", 1).to_string(), "a:1");
    assert_eq!(endpoint("::1", 29500).to_string(), "[::1]:29500");
}

#[test]
fn launcher_serialises_in_snake_case() {
    assert_eq!(
        serde_json::to_string(&Launcher::Gpukit).ok().as_deref(),
        Some("\"gpukit\"")
    );
    assert_eq!(
        serde_json::to_string(&Launcher::Slurm).ok().as_deref(),
        Some("\"slurm\"")
    );
}

#[test]
fn public_host_list_expansion() {
    assert_eq!(
        expand_slurm_hostlist("node[01-02,07]"),
        Ok(vec!["node01".to_string(), "node02".into(), "node07".into()])
    );
    let error = expand_slurm_hostlist("node[01-").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
}
