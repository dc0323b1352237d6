#!/usr/bin/env bash
# On the lent GPU machine (one GPU), over binaries staged in .device/ (gpukit and
# .device/tests/{gpu_tensor,lessons_cli,profile_cli,...}):   bash scripts/gpu-lessons.sh
# Runs the staged GPU tests, then gpukit lessons twice beside PyTorch (the notebook's own code,
# for the figures and their run-to-run agreement), the bad-input exits, and the profiler with
# CUPTI hidden. No step starts after BUDGET_S seconds (default 500). Everything goes into one
# tarball under $OUT, rewritten after every step.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BUDGET_S=${BUDGET_S:-500}
W=$(mktemp -d)
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
pack() { mkdir -p "$OUT" && tar czf "$OUT/lessons-run.tar.gz" -C "$W" .; }
step() { # name timeout args...
  local name=$1 t=$2; shift 2
  [ "$SECONDS" -lt "$BUDGET_S" ] || { echo "[$SECONDS s] out of time before $name"; return; }
  clean timeout "$t" "$@" >"$W/$name.txt" 2>"$W/$name.err"
  echo "[$SECONDS s] $name rc=$?"
  pack
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
for t in .device/tests/*; do
  name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
  clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" timeout 300 "$t" --test-threads 1 >"$W/test-$name.txt" 2>&1
  echo "[$SECONDS s] tests $name rc=$?: $(grep '^test result' "$W/test-$name.txt")"
  grep -E "FAILED|panicked|^---- " "$W/test-$name.txt" | head -8
  pack
done
step lessons1 420 "$BIN" lessons all --device cuda:0 --compare-pytorch --save-json "$W/lessons1.json"
step lessons2 300 "$BIN" lessons all --device cuda:0 --compare-pytorch --save-json "$W/lessons2.json"
for args in "lessons 99" "lessons 4 --device cuda:9"; do
  clean "$BIN" $args >/dev/null 2>"$W/bad.err"; echo "gpukit $args: exit $? ($(tail -1 "$W/bad.err"))"
done
# the profiler with CUPTI turned off, as on a machine without it
step nocupti 120 env GPUKIT_DISABLE=cupti "$BIN" profile infer --device cuda:0 \
  --batch-size 32 --steps 5 --save-json "$W/nocupti.json"
grep -iE "timing|cupti|events" "$W/nocupti.txt" | head -4
# bench conv's half-precision NHWC rows beside PyTorch (finalists now ranked back to back)
step conv 240 env GPUKIT_TRACE=1 "$BIN" bench conv --device cuda:0 --dtype f16,bf16 --layout nhwc \
  --compare-pytorch --save-json "$W/conv.json"
grep -E "behind|slowest|rows" "$W/conv.txt" | tail -4
echo "wrote $OUT/lessons-run.tar.gz"
