#!/usr/bin/env bash
# On the lent GPU machine, over a binary staged by ../shared/tools/stage-for-device.sh:
#   bash scripts/gpu-conv-cold.sh [RUNS]
# `bench conv --device cuda:0 --compare-pytorch` RUNS times (default 1), each from an empty
# choice cache (its own XDG_CACHE_HOME), one after the other: whether every GPU row stays at
# 0.95x PyTorch's cudnn.benchmark or better run after run. About 210 s a run on an H200: two
# runs fit one call. GPUKIT_TRACE=1 in the environment keeps each run's planning trace.
# Writes conv-cold-N.json.gz (and .trace.gz) and summary.txt under $OUT; prints the summary.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
RUNS=${1:-1}
SUMMARY=$OUT/summary.txt
mkdir -p "$OUT"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PATH=/opt/torch/.venv/bin:$PATH
say "== gpu-conv-cold $RUNS $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for i in $(seq 1 "$RUNS"); do
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$(mktemp -d)" timeout 290 "$BIN" bench conv --device cuda:0 \
    --compare-pytorch --save-json "$OUT/conv-cold-$i.json" >/dev/null 2>"$OUT/conv-cold-$i.trace"
  say "run $i rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  python3 scripts/conv_parity.py "$OUT/conv-cold-$i.json" 2>&1 | tee -a "$SUMMARY"
  gzip -f "$OUT/conv-cold-$i.json"
  if [ "${GPUKIT_TRACE:-0}" = 1 ]; then gzip -f "$OUT/conv-cold-$i.trace"; else rm -f "$OUT/conv-cold-$i.trace"; fi
done
