#!/usr/bin/env bash
# Run 41: trial rounds that rotate and reverse the candidates' order, bench matmul beside PyTorch
# (paired turns), twice.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
for i in 1 2; do
  $G timeout 150 $B bench matmul --device cuda:0 --sizes 4096,8192 --compare-pytorch --save-json $W/mm-gpu-$i.json >$W/mm-gpu-$i.txt 2>$W/mm-gpu-$i.err
  echo "[$((SECONDS-S)) s] gpu matmul $i rc=$?"
done
mkdir -p "$OUT"; tar czf "$OUT/run41.tar.gz" -C "$W" .
for i in 1 2; do
  echo "== $i"; grep -E "^│ cuda" $W/mm-gpu-$i.txt | awk -F'│|┆' '{print $3,$4,$6,$10,$(NF-3),$(NF-2),$(NF-1)}' | sed 's/  */ /g'
done
