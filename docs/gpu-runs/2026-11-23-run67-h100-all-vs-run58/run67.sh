#!/usr/bin/env bash
# Run 67: `gpukit all` as run 58 ran it, to compare every row with run 58's report; then, with
# the plan cache that `all` filled, compute-sanitizer over infer's strategies at batch 1 (224).
set -u
S=$SECONDS
CS=/usr/local/cuda/bin/compute-sanitizer
env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH timeout 330 .device/gpukit all --out "$OUT/all" >"$OUT/all.txt" 2>"$OUT/all.err"
echo "[$((SECONDS-S)) s] all rc=$?"; tail -3 "$OUT/all.err"
left=$(( 400 - (SECONDS - S) )); [ $left -lt 60 ] && left=60
mkdir -p "$OUT/san"
one() { # tool strategy
  env -u LD_LIBRARY_PATH timeout "$left" $CS --tool "$1" --error-exitcode 99 --print-limit 20 .device/gpukit infer --device cuda:0 --strategies "$2" --batch-sizes 1 --gpu-iterations 1 >"$OUT/san/$1-$2.txt" 2>&1
  echo "$1 $2 rc=$? $(grep -Eo 'ERROR SUMMARY: [0-9]+' "$OUT/san/$1-$2.txt" | tail -1)"
}
export -f one; export OUT CS left
{ for st in fp32 fp32-graph tf32 tf32-nhwc tf32-nhwc-graph fp16 fp16-graph fp16-nhwc fp16-nhwc-graph bf16-nhwc bf16-nhwc-graph fp16-nhwc-graph-one-at-a-time; do echo memcheck $st; done
  for t in racecheck synccheck; do for st in fp16-nhwc fp16-nhwc-graph fp32; do echo $t $st; done; done; } \
  | xargs -P 9 -L 1 bash -c 'one "$@"' _ | sort | tee "$OUT/sanitize-summary.txt"
echo "[$((SECONDS-S)) s] sanitize done"
tar czf "$OUT/san.tar.gz" -C "$OUT" san && rm -rf "$OUT/san"
