#!/usr/bin/env bash
# The seed's run_benchmarks.sh: run everything gpukit measures and write one report.
#   scripts/run_benchmarks.sh [OUT_DIR]        (default: gpukit-report)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpukit-report}
if [ -x target/release/gpukit ]; then bin=target/release/gpukit; else
  cargo build --release --quiet; bin=target/release/gpukit; fi
"$bin" all --out "$out"
