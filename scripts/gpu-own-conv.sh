#!/usr/bin/env bash
# Runs on the lent GPU machine from the project root, over binaries staged into .device/
# (gzipped or not: .device/gpukit and .device/tests/gpu_program):
#   bash scripts/gpu-own-conv.sh [MODEL] [BATCHES]          (defaults: resnet50, 1)
# gpukit's own convolution kernels, what a change to them must show in one call:
# 1. their GPU tests against float64 (`gpu_program small`: every cut of every shape, each run
#    twice), then compute-sanitizer memcheck and racecheck on the convolution's test;
# 2. MODEL (torchvision's, exported with scripts/export_torchvision.py) at each of BATCHES with
#    every cut timed beside cuDNN's plan (GPUKIT_OWN_CONV=timed-own GPUKIT_TRACE=1): the
#    per-shape timings, in microseconds in the trace's order;
# 3. in turns (base new new base, separate choice caches): "base" = $BASE_ENV (default:
#    gpukit's kernel not timed, GPUKIT_OWN_CONV=timed-products), "new" = $NEW_ENV (default:
#    the default); "base" runs $GPUKIT_BASE_BIN where given (the build before a change, same
#    environment); every row checked against ONNX Runtime by `infer --onnx`. The pass is the
#    arbiter: a per-shape timing replays one kernel after itself (warm caches, its early start
#    overlapping the instance before), which can rank two builds opposite to the pass;
# 4. `profile infer` at the first of BATCHES with each binary: every kernel's time inside the
#    pass (its graph in step order).
# Writes $OUT/0-summary.txt (printed as it goes) and $OUT/own-conv.tar.gz with every output.
set -u
MODEL=${1:-resnet50}
BATCHES=${2:-1}
OUT=${OUT:-$PWD/gpu-run-out}
W=$(mktemp -d)
T=$OUT/own-conv
mkdir -p "$T"
S=$OUT/0-summary.txt
: >>"$S"
say() { echo "$*" | tee -a "$S"; }
for f in $(find .device -name '*.gz' 2>/dev/null); do gunzip -f "$f"; done
chmod -R +x .device 2>/dev/null
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
BASE_BIN=${GPUKIT_BASE_BIN:-$BIN}
TEST=${GPUKIT_TEST:-$PWD/.device/tests/gpu_program}
export PATH=/opt/torch/.venv/bin:$PATH
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])' 2>/dev/null)
SAN=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
say "== gpu-own-conv $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $MODEL at $BATCHES"

# 1. the kernels' tests, then the sanitizers on the convolution's test (PASS_ONLY=1: steps 3
#    and 4 alone, for a change that leaves the kernels as an earlier call verified them)
if [ "${PASS_ONLY:-0}" != 1 ]; then
timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME="$W/cache-test" "$TEST" --test-threads 1 small >"$T/gpu_program.log" 2>&1
say "gpu_program small rc=$?: $(grep -E '^test result' "$T/gpu_program.log" | head -1)"
grep -E "FAILED|panicked|failed" "$T/gpu_program.log" | head -20 | tee -a "$S"
for tool in memcheck racecheck; do
  extra=""; [ "$tool" = memcheck ] && extra="--report-api-errors no"
  # shellcheck disable=SC2086
  timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 "$SAN" --tool "$tool" $extra "$TEST" --test-threads 1 conv_small >"$T/sanitize-$tool.log" 2>&1
  say "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$T/sanitize-$tool.log" | tr '\n' ' ')"
done
fi

# 2. every cut timed, per shape
(cd scripts && python3 export_torchvision.py "$W" "$MODEL") >"$T/export.log" 2>&1
if [ ! -f "$W/$MODEL.onnx" ]; then
  say "$MODEL: not exported (see export.log)"
else
  infer() { # label env...
    local label=$1 bin=$BIN; shift
    case $label in *base) bin=$BASE_BIN ;; esac
    env -u LD_LIBRARY_PATH "$@" XDG_CACHE_HOME="$W/cache-$label" GPUKIT_ORT_LIB="$ORT" timeout 300 "$bin" infer --onnx "$W/$MODEL.onnx" \
      --device cuda:0 --batch-sizes "$BATCHES" --strategies fp16-nhwc-graph --gpu-iterations 300 \
      --save-json "$T/$label.json" >"$T/$label.txt" 2>&1
    say "$label rc=$?"
    python3 scripts/onnx_rows.py "$T/$label.json" 2>&1 | grep -v " cpu " | head -4 | tee -a "$S"
  }
  if [ "${PASS_ONLY:-0}" != 1 ]; then
    infer timed-own GPUKIT_OWN_CONV=timed-own GPUKIT_TRACE=1
    grep "cuDNN's plan, gpukit's" "$T/timed-own.txt" | sed 's/trace: conv //; s/ConvGeometry { //; s/dilation: \[1, 1\] }//' >"$T/conv-timings.txt"
    say "per-shape timings (cuDNN's plan first, then gpukit's cuts, then cuBLASLt's): $(wc -l <"$T/conv-timings.txt") shapes in conv-timings.txt"
  fi
  # 3. in turns against the kernel untimed
  BASE_ENV=${BASE_ENV:-GPUKIT_OWN_CONV=timed-products}
  NEW_ENV=${NEW_ENV:-GPUKIT_TRACE=0}
  i=0
  for which in base new new base; do
    i=$((i + 1))
    case $which in
      # shellcheck disable=SC2086
      base) infer "$i-base" $BASE_ENV ;;
      # shellcheck disable=SC2086
      new) infer "$i-new" $NEW_ENV ;;
    esac
  done
  # 4. the kernels' times inside the pass (each arm's binary and environment)
  for which in base new; do
    bin=$BIN envs=$NEW_ENV
    [ "$which" = base ] && bin=$BASE_BIN envs=$BASE_ENV
    # shellcheck disable=SC2086
    env -u LD_LIBRARY_PATH $envs XDG_CACHE_HOME="$W/cache-profile-$which" timeout 150 "$bin" profile infer --onnx "$W/$MODEL.onnx" \
      --batch-size "${BATCHES%%,*}" --strategy fp16-nhwc-graph --group-by op --top 12 >"$T/profile-$which.txt" 2>&1
    say "profile $which rc=$?"
    grep -E "Step without|gpukit\)" "$T/profile-$which.txt" | cut -c1-170 | tee -a "$S"
  done
fi
(cd "$OUT" && tar czf own-conv.tar.gz own-conv && rm -rf own-conv)
say "== done $(date -u +%FT%TZ)"
