//! gpukit's commands, each a leaf over the shared measuring layer ([`gpukit_harness`], whose
//! modules are re-exported here under their own names) and the workloads several commands run
//! ([`workload`]). No command module uses another's; `gpukit all` runs them through the
//! [`part::Part`] each offers ([`parts`]). Every result is a plain serde struct; the CLI only
//! renders them.

#![forbid(unsafe_code)]

pub use gpukit_harness::{
    accuracy, ceilings, error, figures, gpu, hang_guard, host, measure, part, peer, power, regime,
    report, stats,
};
pub use gpukit_tensor::random;
pub mod workload;

pub mod all;
pub mod bandwidth;
pub mod check;
pub mod compare;
pub mod conv;
pub mod infer;
pub mod lessons;
pub mod matmul;
pub mod memory;
pub mod monitor;
pub mod nccl;
pub mod p2p;
pub mod profile;
pub mod stress;
pub mod train;

#[cfg(test)]
mod layers;

/// The CPU paths live with the tensors (the inference engine uses them too).
pub use gpukit_tensor::cpu;

pub use error::{Error, Result};

/// A command's report that `compare` reads though the command is not a part of `all`: the
/// command as its report names it (also the section's name), and the reader of its figures.
pub type OtherReport = (
    &'static str,
    fn(&serde_json::Value, &mut Vec<figures::Figure>),
);

/// The reports [`OtherReport`] describes.
pub fn other_reports() -> Vec<OtherReport> {
    vec![(infer::onnx::figures::SECTION, infer::onnx::figures::figures)]
}

/// The parts of `gpukit all`, in the order they run: the check first (what it finds decides
/// what the others may use), the several-GPU parts last.
pub fn parts() -> Vec<&'static dyn part::Part> {
    vec![
        &check::PART,
        &matmul::PART,
        &bandwidth::PART,
        &conv::PART,
        &infer::PART,
        &memory::PART,
        &train::PART,
        &profile::PART,
        &lessons::PART,
        &nccl::PART,
        &p2p::PART,
    ]
}
