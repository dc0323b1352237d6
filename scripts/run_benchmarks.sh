#!/usr/bin/env bash
# The seed's run_benchmarks.sh: run everything gpukit measures and write one report.
#   scripts/run_benchmarks.sh [OUT_DIR]        (default: gpukit-report)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpukit-report}
# the release binary, wherever cargo puts it (CARGO_TARGET_DIR included), built if missing
target=${CARGO_TARGET_DIR:-target}
bin=$target/release/gpukit
[ -x "$bin" ] || cargo build --release --quiet --bin gpukit
"$bin" all --out "$out"
