#!/usr/bin/env bash
# Run 26: CPU f32 matmul on the packed AVX-512 kernel, beside PyTorch.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
lscpu | grep -E "Model name|^CPU\(s\)|L2"
$G timeout 200 .device/gpukit bench matmul --device cpu --sizes 1024,2048,4096,8192 --dtype f32 --compare-pytorch --save-json $W/mm-cpu.json >$W/mm-cpu.txt 2>$W/mm-cpu.err
echo "[$((SECONDS-S)) s] rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run26.tar.gz" -C "$W" .
grep -E "^│ cpu" $W/mm-cpu.txt | awk -F'┆' '{print $3,$4,$5,$9,$(NF-1),$NF}'
tail -2 $W/mm-cpu.err
