#!/usr/bin/env bash
# Run 29: bench matmul beside PyTorch with paired per-round ratios (two invocations, then 10
# turns x 20 at 8192); CPU matmul tiles against gemm's own threading in one run; the CLI and
# GPU op test binaries.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
for i in 1 2; do
  $G timeout 200 $B bench matmul --device cuda:0 --sizes 4096,8192 --compare-pytorch --save-json $W/mm-gpu-$i.json >$W/mm-gpu-$i.txt 2>$W/mm-gpu-$i.err
  t "gpu matmul $i rc=$?"
done
$G timeout 200 $B bench matmul --device cuda:0 --sizes 8192 --dtype f16,bf16 --iterations 200 --turns 10 --compare-pytorch --save-json $W/mm-gpu-long.json >$W/mm-gpu-long.txt 2>$W/mm-gpu-long.err
t "gpu matmul 10 turns rc=$?"
$G timeout 200 $B bench matmul --device cpu --sizes 2048,4096 --dtype f32 --compare-pytorch --save-json $W/mm-cpu-tiles.json >$W/mm-cpu-tiles.txt 2>$W/mm-cpu-tiles.err
t "cpu tiles rc=$?"
GPUKIT_CPU_MATMUL=gemm $G timeout 200 $B bench matmul --device cpu --sizes 2048,4096 --dtype f32 --compare-pytorch --save-json $W/mm-cpu-gemm.json >$W/mm-cpu-gemm.txt 2>$W/mm-cpu-gemm.err
t "cpu gemm threading rc=$?"
for tb in .device/tests/cli-* .device/tests/gpu_ops-*; do
  $G GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN=$PWD/.device/gpukit timeout 240 $tb >$W/test-$(basename $tb).txt 2>&1
  t "$(basename $tb) rc=$? $(grep -E '^test result' $W/test-$(basename $tb).txt)"
done
mkdir -p "$OUT"; tar czf "$OUT/run29.tar.gz" -C "$W" .
for f in mm-gpu-1 mm-gpu-2 mm-gpu-long mm-cpu-tiles mm-cpu-gemm; do
  echo "== $f"; grep -E "^│ (cuda|cpu)" $W/$f.txt | awk -F'│|┆' '{print $2,$3,$4,$5,$6,$(NF-3),$(NF-2),$(NF-1)}' | sed 's/  */ /g'
  tail -2 $W/$f.err
done
grep -h -E "FAILED|panicked" $W/test-*.txt | head -20
