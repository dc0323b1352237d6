//! Runs that several commands measure, between the harness and the commands: the training run
//! (`train`, `profile train`, lesson 8 and `all` run it), the profiler over a workload
//! (`profile`, lesson 8 and `all`), the inference strategies' vocabulary (`infer`,
//! `profile infer`), and the check of a matrix product with the matmul ceilings found before
//! (`gemm`: `bench matmul`, `stress`). A command module uses these and the harness, never another command.

pub mod gemm;
pub mod profile;
pub mod strategy;
pub mod train;
