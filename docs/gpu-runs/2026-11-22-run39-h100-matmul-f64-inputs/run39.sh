#!/usr/bin/env bash
# Run 39: bench matmul beside PyTorch (paired turns) with f64 rows on full-precision f64 inputs
# (before: f32 values widened), GPU 4096/8192; f64 4096 again with 10 turns of 10.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
$G timeout 200 $B bench matmul --device cuda:0 --sizes 4096,8192 --compare-pytorch --save-json $W/mm-gpu.json >$W/mm-gpu.txt 2>$W/mm-gpu.err
t "gpu matmul rc=$?"
$G timeout 100 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --iterations 100 --turns 10 --compare-pytorch --save-json $W/f64-10.json >$W/f64-10.txt 2>$W/f64-10.err
t "f64 10 turns rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run39.tar.gz" -C "$W" .
for f in mm-gpu f64-10; do
  echo "== $f"; grep -E "^│ (cuda|cpu)" $W/$f.txt | awk -F'│|┆' '{print $2,$3,$4,$5,$6,$10,$(NF-3),$(NF-2),$(NF-1)}' | sed 's/  */ /g'
  tail -1 $W/$f.err
done
