//! gpukit's shared measuring layer, below every command: the timing harness and statistics,
//! reports and their verdicts, accuracy judgements, facts about the host and GPUs and the
//! ceilings figures are placed against, power sampling, regimes, the PyTorch peer, and the
//! [`part::Part`] through which `gpukit all` composes the commands. Nothing here knows a command.

#![forbid(unsafe_code)]

pub mod accuracy;
pub mod ceilings;
pub mod error;
pub mod figures;
pub mod gpu;
pub mod hang_guard;
pub mod host;
pub mod measure;
pub mod part;
pub mod peer;
pub mod power;
pub mod regime;
pub mod report;
pub mod stats;

pub use error::{Error, Result};
