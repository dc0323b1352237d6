//! gpukit's measuring layer: the timing harness and statistics every command uses, facts about
//! the host and GPUs, the ceilings figures are placed against, and the workloads. Every result
//! is a plain serde struct; the CLI only renders them.

#![forbid(unsafe_code)]

pub mod all;
pub mod bandwidth;
pub mod ceilings;
pub mod check;
pub mod compare;
pub mod conv;
pub mod error;
pub mod hang_guard;
pub mod harness;
pub mod host;
pub mod infer;
pub mod lessons;
pub mod matmul;
pub mod memory;
pub mod monitor;
pub mod nccl;
pub mod p2p;
pub mod peer;
pub mod power;
pub mod profile;
pub mod regime;
pub mod report;
pub use gpukit_tensor::random;
pub mod stats;
pub mod train;

/// The CPU paths live with the tensors (the inference engine uses them too).
pub use gpukit_tensor::cpu;

pub use error::{Error, Result};
