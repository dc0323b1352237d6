#!/usr/bin/env bash
# Run 34: tile sizes around 256 at 2048, 4096 and 8192, alternated, with PyTorch between.
# (one single-threaded gemm per tile, GPUKIT_CPU_TILE), alternated, with PyTorch between.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
run() { # $1: tile or "gemm", $2: size
  if [ "$1" = gemm ]; then E=env; else E="env GPUKIT_CPU_TILE=$1"; fi
  $E $G timeout 60 $B bench matmul --device cpu --dtype f32 --sizes $2 --cpu-seconds 5 --json 2>/dev/null \
    | python3 -c "import json,sys; r=json.load(sys.stdin)['matmul']['rows'][0]; s=r['timing']['summary_ms']; print(f\"{r['tflops']:.3f} TFLOP/s (p10 {2*$2**3/s['p10']/1e9:.3f}) {r['verification']['passed']}\")"
}
for round in 1 2; do
  for v in 128 192 256 320 384 256x512 512x256 gemm; do
    echo "round $round 4096 $v: $(run $v 4096)"
  done
  echo "round $round 4096 torch: $(timeout 60 python3 scripts/pytorch_reference.py matmul --device cpu --dtypes f32 --sizes 4096 --iterations 20 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(f\"{r['tflops']:.3f}\")")"
done
for n in 2048 8192; do
  for v in 192 256 384 gemm; do
    echo "$n $v: $(run $v $n)"
  done
  echo "$n torch: $(timeout 90 python3 scripts/pytorch_reference.py matmul --device cpu --dtypes f32 --sizes $n --iterations 10 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(f\"{r['tflops']:.3f}\")")"
done
echo "[$((SECONDS-S)) s]"
