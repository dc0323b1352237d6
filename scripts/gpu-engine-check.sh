#!/usr/bin/env bash
# On the lent GPU machine, over binaries staged by ../shared/tools/stage-for-device.sh:
#   bash scripts/gpu-engine-check.sh
# Re-checks the GPU engine's correctness problem of runs 12-14 (wrong NHWC logits at batch 8/32,
# see docs/DECISIONS.md 22): the engine test twice, then NHWC strategies measured afresh
# (GPUKIT_REPLAN=1) twice, if time is left (no step starts after BUDGET_S seconds, default 450). Everything goes into one tarball
# under $OUT (the device tool returns few files), rewritten after every step.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BUDGET_S=${BUDGET_S:-450}
W=$(mktemp -d)
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
pack() {
  cp ~/.cache/gpukit/cudnn-choices-* "$W/" 2>/dev/null
  mkdir -p "$OUT" && tar czf "$OUT/engine-check.tar.gz" -C "$W" .
}
STRATS=fp32,fp16-nhwc,fp16-nhwc-graph,tf32-nhwc,tf32-nhwc-graph,bf16-nhwc,bf16-nhwc-graph
for i in 1 2; do
  [ "$SECONDS" -lt "$BUDGET_S" ] || break
  clean GPUKIT_REQUIRE_GPU=1 timeout 150 .device/tests/gpu_engine-* --test-threads 1 >"$W/engine-$i.txt" 2>&1
  echo "[$SECONDS s] gpu_engine $i rc=$?: $(grep '^test result' "$W/engine-$i.txt")"
  grep -E "differs|rel error|FAILED|panicked" "$W/engine-$i.txt" | head -3
  pack
done
for mode in replan-1 replan-2; do
  [ "$SECONDS" -lt "$BUDGET_S" ] || { echo "[$SECONDS s] out of time before $mode"; break; }
  clean env GPUKIT_REPLAN=1 timeout 200 "$BIN" infer --device cuda:0 --batch-sizes 8,32 --strategies "$STRATS" \
    --save-json "$W/infer-$mode.json" >"$W/infer-$mode.txt" 2>"$W/infer-$mode.err"
  echo "[$SECONDS s] infer $mode rc=$? failed rows: $(grep -c FAILED "$W/infer-$mode.txt")"
  grep -E "FAILED" "$W/infer-$mode.txt" | cut -c1-200 | head -4
  pack
done
echo "wrote $OUT/engine-check.tar.gz"
