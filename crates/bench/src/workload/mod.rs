//! Runs that several commands measure, between the harness and the commands: the training run
//! (`train`, `profile train`, lesson 8 and `all` run it), the profiler over a workload
//! (`profile`, lesson 8 and `all`), and the inference strategies' vocabulary (`infer`,
//! `profile infer`). A command module uses these and the harness, never another command.

pub mod profile;
pub mod strategy;
pub mod train;
