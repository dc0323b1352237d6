#!/usr/bin/env bash
# Run 42: f64 4096 without turns: gpukit (cuBLAS GemmEx only) and PyTorch as separate processes,
# alternated three times; is the 1-2% gap of the paired turns there too?
set -u
S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
for i in 1 2 3; do
  g=$($G timeout 60 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --lt-candidates 0 --json 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['matmul']['rows'][0]; s=r['timing']['summary_ms']; print(f\"{s['median']:.3f} ms (p10 {s['p10']:.3f}, p90 {s['p90']:.3f}) {r['tflops']:.1f} TFLOP/s\")")
  p=$(timeout 60 python3 scripts/pytorch_reference.py matmul --device cuda --dtypes f64 --sizes 4096 --iterations 50 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(f\"{r['median_ms']:.3f} ms (p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f}) {r['tflops']:.1f} TFLOP/s\")")
  echo "round $i gpukit: $g"
  echo "round $i torch:  $p"
done
echo "[$((SECONDS-S)) s]"
