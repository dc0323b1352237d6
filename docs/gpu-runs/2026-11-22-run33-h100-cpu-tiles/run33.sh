#!/usr/bin/env bash
# Run 33: CPU f32 matmul at 4096: gemm's own threading against output tiles of several sizes
# (one single-threaded gemm per tile, GPUKIT_CPU_TILE), alternated, with PyTorch between.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
run() { # $1: tile or "gemm"
  if [ "$1" = gemm ]; then E=env; else E="env GPUKIT_CPU_TILE=$1"; fi
  $E $G timeout 60 $B bench matmul --device cpu --dtype f32 --sizes 4096 --cpu-seconds 5 --json 2>/dev/null \
    | python3 -c "import json,sys; r=json.load(sys.stdin)['matmul']['rows'][0]; s=r['timing']['summary_ms']; print(f\"{r['tflops']:.3f} TFLOP/s (p10 {2*4096**3/s['p10']/1e9:.3f}) {r['verification']['passed']}\")"
}
for round in 1 2; do
  for v in gemm 1024 512x1024 512 256x1024 256 gemm; do
    echo "round $round $v: $(run $v)"
  done
  echo "round $round torch: $(timeout 60 python3 scripts/pytorch_reference.py matmul --device cpu --dtypes f32 --sizes 4096 --iterations 20 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(f\"{r['tflops']:.3f}\")")"
done
echo "[$((SECONDS-S)) s]"
