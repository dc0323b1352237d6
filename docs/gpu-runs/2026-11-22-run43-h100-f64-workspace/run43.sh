#!/usr/bin/env bash
# Run 43: f64 4096 standalone with the cuBLAS workspace at 0, 4, 8 and 32 MiB (GPUKIT_BLAS_WORKSPACE_MIB, an experiment switch), PyTorch between.
set -u
S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
for i in 0 4 8 32 0 4; do
  g=$(GPUKIT_BLAS_WORKSPACE_MIB=$i $G timeout 60 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --lt-candidates 0 --json 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['matmul']['rows'][0]; s=r['timing']['summary_ms']; print(f\"{s['median']:.3f} ms (p10 {s['p10']:.3f}, p90 {s['p90']:.3f}) {r['tflops']:.1f} TFLOP/s\")")
  p=$(timeout 60 python3 scripts/pytorch_reference.py matmul --device cuda --dtypes f64 --sizes 4096 --iterations 50 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(f\"{r['median_ms']:.3f} ms (p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f}) {r['tflops']:.1f} TFLOP/s\")")
  echo "workspace $i MiB gpukit: $g"
  echo "             torch:  $p"
done
echo "[$((SECONDS-S)) s]"
