#!/usr/bin/env bash
# On the lent GPU machine (one GPU), over binaries staged in .device/ (gpukit and
# .device/tests/{profile_cli,gpu_tensor,...}):   bash scripts/gpu-profile.sh
# Runs gpukit profile's GPU tests and the runs its figures come from (ResNet-50 fp16 NHWC at
# batch 32, eager and graph, by op/kernel/layer, CUPTI and events; a training run), then
# bench conv beside PyTorch if time is left (no step starts after BUDGET_S seconds, default
# 500). Everything goes into one tarball under $OUT, rewritten after every step.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BUDGET_S=${BUDGET_S:-500}
W=$(mktemp -d)
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
pack() { mkdir -p "$OUT" && tar czf "$OUT/profile-run.tar.gz" -C "$W" .; }
step() { # name timeout args...
  local name=$1 t=$2; shift 2
  [ "$SECONDS" -lt "$BUDGET_S" ] || { echo "[$SECONDS s] out of time before $name"; return; }
  clean timeout "$t" "$@" >"$W/$name.txt" 2>"$W/$name.err"
  echo "[$SECONDS s] $name rc=$?"
  pack
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
clean "$BIN" check 2>&1 | grep -iE "cupti|nvtx|cudnn " | head -5
for t in .device/tests/*; do
  name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
  clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" timeout 300 "$t" --test-threads 1 >"$W/test-$name.txt" 2>&1
  echo "[$SECONDS s] tests $name rc=$?: $(grep '^test result' "$W/test-$name.txt")"
  grep -E "FAILED|panicked" "$W/test-$name.txt" | head -5
  pack
done
P="$BIN profile infer --device cuda:0 --batch-size 32 --steps 20"
step eager 120 $P --strategy fp16-nhwc --trace "$W/eager-trace.json" --save-json "$W/eager.json"
step graph 120 $P --strategy fp16-nhwc-graph --trace "$W/graph-trace.json" --save-json "$W/graph.json"
step eager-kernel 120 $P --strategy fp16-nhwc --group-by kernel --top 20
step eager-layer 120 $P --strategy fp16-nhwc --group-by layer --top 20
step eager-events 120 $P --strategy fp16-nhwc --timing events --save-json "$W/events.json"
step train 180 "$BIN" profile train --device cuda:0 --precision bf16 --layers 1024,4096,4096,1 \
  --samples 32768 --features 1024 --batch-size 1024 --epochs 3 --group-by op --top 20 --save-json "$W/train.json"
step conv 420 "$BIN" bench conv --device cuda:0 --dtype tf32,f16,bf16 --layout nchw,nhwc --compare-pytorch \
  --save-json "$W/conv.json"
echo "wrote $OUT/profile-run.tar.gz"
