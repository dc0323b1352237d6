#!/usr/bin/env bash
# Run 30: the final bench matmul beside PyTorch (paired turns; cuBLAS's choice kept unless a
# cuBLASLt algorithm beats it by more than 1%), GPU and CPU at 4096 and 8192.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
$G timeout 200 $B bench matmul --device cuda:0 --sizes 4096,8192 --compare-pytorch --save-json $W/mm-gpu.json >$W/mm-gpu.txt 2>$W/mm-gpu.err
t "gpu matmul rc=$?"
$G timeout 200 $B bench matmul --device cpu --sizes 4096,8192 --dtype f32 --compare-pytorch --save-json $W/mm-cpu.json >$W/mm-cpu.txt 2>$W/mm-cpu.err
t "cpu matmul rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run30.tar.gz" -C "$W" .
for f in mm-gpu mm-cpu; do
  echo "== $f"; grep -E "^│ (cuda|cpu)" $W/$f.txt | awk -F'│|┆' '{print $2,$3,$4,$5,$6,$(NF-3),$(NF-2),$(NF-1)}' | sed 's/  */ /g'
  tail -2 $W/$f.err
done
