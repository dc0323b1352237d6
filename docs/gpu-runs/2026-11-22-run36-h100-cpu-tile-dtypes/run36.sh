#!/usr/bin/env bash
# Run 36: tile edges by dtype (GPUKIT_CPU_TILE=edge, an experiment switch not kept): f64 and f16
# at 4096, f32 at 8192, with the default rule's edge beside and PyTorch once per case.
set -u
S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
run() { # $1: edge or "rule", $2: dtype, $3: size
  if [ "$1" = rule ]; then E=env; else E="env GPUKIT_CPU_TILE=$1"; fi
  $E $G timeout 60 $B bench matmul --device cpu --dtype $2 --sizes $3 --cpu-seconds 6 --json 2>/dev/null \
    | python3 -c "import json,sys; r=json.load(sys.stdin)['matmul']['rows'][0]; print(f\"{r['tflops']:.3f} TFLOP/s {r['verification']['passed']}\")"
}
torch() { timeout 90 python3 scripts/pytorch_reference.py matmul --device cpu --dtypes $1 --sizes $2 --iterations 10 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(f\"{r['tflops']:.3f}\")"; }
for case in "f64 4096" "f16 4096" "f32 8192"; do
  set -- $case
  for e in rule 128 192 256 384 512 rule; do echo "$1 $2 edge $e: $(run $e $1 $2)"; done
  echo "$1 $2 torch: $(torch $1 $2)"
done
echo "[$((SECONDS-S)) s]"
