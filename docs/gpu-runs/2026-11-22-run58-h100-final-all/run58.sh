#!/usr/bin/env bash
# Run 58: the final binary's main job (`gpukit all`) and bench bandwidth without PyTorch, then
# the gpu_ops test binary.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
$G timeout 300 $B all --out $W/all >$W/all.txt 2>$W/all.err
echo "[$((SECONDS-S)) s] all rc=$?"; tail -3 $W/all.err
$G timeout 120 $B bench bandwidth --device cuda:0 --sizes 4096,1073741824 >$W/bw.txt 2>$W/bw.err
echo "[$((SECONDS-S)) s] bandwidth rc=$?"; grep -E "^│" $W/bw.txt | awk -F'┆' '{print $1,$2,$4,$(NF-1)}'
for tb in .device/tests/gpu_ops-*; do
  $G GPUKIT_REQUIRE_GPU=1 timeout 120 $tb >$W/test-gpu_ops.txt 2>&1
  echo "[$((SECONDS-S)) s] gpu_ops rc=$? $(grep -E '^test result' $W/test-gpu_ops.txt)"
done
mkdir -p "$OUT"; tar czf "$OUT/run58.tar.gz" -C "$W" .
grep -E "^\| |^## " $W/all/report.md | head -40
