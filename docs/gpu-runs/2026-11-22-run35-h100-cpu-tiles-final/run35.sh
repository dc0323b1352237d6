#!/usr/bin/env bash
# Run 35: CPU matmul on output tiles (decision 33) beside PyTorch taking turns, f32/f64/f16 at
# 2048, 4096 and 8192; then the whole default `bench matmul` sweep (GPU and CPU, no PyTorch).
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
$G timeout 400 $B bench matmul --device cpu --sizes 2048,4096,8192 --dtype f32,f64,f16 --compare-pytorch --save-json $W/mm-cpu.json >$W/mm-cpu.txt 2>$W/mm-cpu.err
t "cpu beside PyTorch rc=$?"
$G timeout 300 $B bench matmul --save-json $W/mm-all.json >$W/mm-all.txt 2>$W/mm-all.err
t "default sweep rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run35.tar.gz" -C "$W" .
for f in mm-cpu mm-all; do
  echo "== $f"; grep -E "^│ (cuda|cpu)" $W/$f.txt | awk -F'│|┆' '{print $2,$3,$4,$5,$6,$10,$(NF-2),$(NF-1)}' | sed 's/  */ /g'
  tail -2 $W/$f.err
done
