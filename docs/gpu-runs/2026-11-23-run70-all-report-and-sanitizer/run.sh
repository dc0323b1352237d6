#!/usr/bin/env bash
# GPU run 70: `gpukit all --out` with report.html on the H100 (its train rows now on the GPU too),
# the train CLI tests on the GPU, and compute-sanitizer memcheck/racecheck over the training
# engine's GPU path (new code: cuBLASLt epilogues, gpukit's training kernels, graphs, loaders).
# PART=all (default): tests and `all`; PART=sanitize: the sanitizer runs (two device calls).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O/w"; W=$O/w
B=$PWD/.device/gpukit; CS=/usr/local/cuda/bin/compute-sanitizer
export GPUKIT_REQUIRE_GPU=1
S=$O/summary.txt; : >"$S"
say() { echo "$*" | tee -a "$S"; }
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee -a "$S"
if [ "${PART:-all}" = all ]; then
  f=$(ls .device/tests/train_cli-* | head -1)
  clean GPUKIT_BIN="$B" timeout 200 "$f" >"$W/test-train_cli.txt" 2>&1; say "train_cli tests rc=$?"; grep -E "^test |test result" "$W/test-train_cli.txt" | tee -a "$S"
  t0=$(date +%s); clean timeout 520 "$B" all --out "$O/all" >"$W/all.txt" 2>&1; say "all rc=$? in $(( $(date +%s) - t0 )) s"; ls "$O/all" | tee -a "$S"
  tar -C "$W" -czf "$O/run70-all.tar.gz" . && rm -rf "$W"; exit 0
fi
san() { local tool=$1 name=$2; shift 2; local t0; t0=$(date +%s)
  clean timeout 300 "$CS" --tool "$tool" --error-exitcode 99 --print-limit 20 "$B" "$@" >"$W/san-$tool-$name.txt" 2>&1
  say "sanitize $tool $name rc=$? $(grep -Eo 'ERROR SUMMARY: [0-9]+' "$W/san-$tool-$name.txt" | tail -1) in $(( $(date +%s) - t0 )) s: $*"; }
T="train --device cuda:0 --epochs 1 --eval-fraction 0.2"
san memcheck reg-fp32-graph $T --preset seed-regression
san memcheck reg-fp16-nograph $T --preset seed-regression --precision fp16 --no-graph
san memcheck cls-bf16 $T --preset seed-classification --precision bf16
san memcheck reg-prefetch $T --preset seed-regression --loader prefetch --accumulate 3
san memcheck reg-pinned-sgd $T --preset seed-regression --loader pinned --optimizer sgd --momentum 0.9
san memcheck mlp-bf16 train --device cuda:0 --layers 64,256,256,3 --loss cross-entropy --preset seed-classification --samples 300 --features 64 --batch-size 64 --epochs 1 --precision bf16
san racecheck reg-fp32 $T --preset seed-regression --no-graph
san racecheck cls-fp16 $T --preset seed-classification --precision fp16 --no-graph
san synccheck reg-fp32 $T --preset seed-regression --no-graph
san initcheck reg-fp32 $T --preset seed-regression --no-graph
tar -C "$W" -czf "$O/run70-sanitize.tar.gz" . && rm -rf "$W"
