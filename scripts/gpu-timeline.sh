#!/usr/bin/env bash
# On the lent GPU machine, over binaries staged by ../shared/tools/stage-for-device.sh:
#   bash scripts/gpu-timeline.sh [single] [quick] [all] [ab]
# Where the seconds of a first result go: GPUKIT_TRACE=1 timelines (every step with its time
# since the start) of ResNet-50 fp16 NHWC batch 32 one strategy, with an empty choice cache and
# then twice warm (single); `all --quick` with an empty cache (quick); `all` with an empty cache
# (all). PyTorch's first iteration with cudnn.benchmark beside (single). Each cache is its own
# XDG_CACHE_HOME. Writes summary.txt and the traces under $OUT.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
W=$(mktemp -d)
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
SUMMARY=$OUT/summary.txt
mkdir -p "$OUT"; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
run() {
  local cache=$1 name=$2; shift 2
  mkdir -p "$W/cache-$cache"
  local t0; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH XDG_CACHE_HOME="$W/cache-$cache" GPUKIT_TRACE=1 \
    timeout 560 "$BIN" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.trace"
  say "$name rc=$? wall $(ms_since "$t0") ms: gpukit $*"
  grep -E "planning [0-9]+ convolutions|total in this process|^trace: +[0-9.]+ ms  (all|infer|bench|memory|lessons|train|profile)[: ]" "$OUT/$name.trace" \
    | grep -v "planning convolutions: [0-9]" | tail -30 | tee -a "$SUMMARY" >/dev/null
}
say "== gpu-timeline $* $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
export PATH=/opt/torch/.venv/bin:$PATH
for mode in "$@"; do
  case $mode in
  single)
    say "pytorch first iteration: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
    one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
    # shellcheck disable=SC2086
    run single single-cold $one
    # shellcheck disable=SC2086
    run single single-warm1 $one
    # shellcheck disable=SC2086
    run single single-warm2 $one ;;
  quick) run quick all-quick-cold all --quick --out "$W/all-quick" ;;
  all) run full all-cold all --out "$W/all"
    cp "$W/all/report.md" "$OUT/all-cold-report.md" 2>/dev/null ;;
  # warm single rows of $GPUKIT_BASE (default .device/base/gpukit) against $BIN, order A B B A
  # twice, each binary's cache warmed first: whole-command wall times
  ab)
    A=${GPUKIT_BASE:-$PWD/.device/base/gpukit}
    one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
    for b in "$A" "$BIN"; do
      # shellcheck disable=SC2086
      env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache-ab-$(basename "$(dirname "$b")")" "$b" $one >/dev/null 2>&1
    done
    for b in "$A" "$BIN" "$BIN" "$A" "$A" "$BIN" "$BIN" "$A"; do
      t0=$(date +%s%N)
      # shellcheck disable=SC2086
      env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache-ab-$(basename "$(dirname "$b")")" "$b" $one >/dev/null 2>&1
      say "warm single row rc=$? wall $(ms_since "$t0") ms: $b"
    done ;;
  esac
done
