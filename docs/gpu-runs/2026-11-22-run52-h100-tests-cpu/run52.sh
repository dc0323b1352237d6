#!/usr/bin/env bash
# Run 52: the CLI and gpu_ops test binaries on the GPU (GPUKIT_REQUIRE_GPU=1) with the final
# bench code, then CPU f32 matmul at 4096 beside PyTorch twice (PyTorch's untimed opening turn
# is new since run 35).
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
for tb in .device/tests/cli-* .device/tests/gpu_ops-*; do
  $G GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN=$PWD/.device/gpukit timeout 280 $tb >$W/test-$(basename $tb).txt 2>&1
  echo "[$((SECONDS-S)) s] $(basename $tb) rc=$? $(grep -E '^test result' $W/test-$(basename $tb).txt)"
done
grep -h -E "FAILED|panicked" $W/test-*.txt | head -20
for i in 1 2; do
  $G timeout 150 $B bench matmul --device cpu --dtype f32 --sizes 4096 --compare-pytorch --save-json $W/cpu-$i.json >$W/cpu-$i.txt 2>$W/cpu-$i.err
  echo "[$((SECONDS-S)) s] cpu $i rc=$?"
  grep -E "^│ cpu" $W/cpu-$i.txt
done
mkdir -p "$OUT"; tar czf "$OUT/run52.tar.gz" -C "$W" .
