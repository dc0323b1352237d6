#!/usr/bin/env bash
# device run B: GPU inference beside PyTorch (ResNet-50, batch 1/8/32/256)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
s=$(date +%s)
clean timeout 560 .device/gpukit infer --device cuda:0 --batch-sizes 1,8,32,256 --compare-pytorch --save-json $OUT/infer-gpu.json > $OUT/infer-gpu.txt 2> $OUT/infer-gpu.err
echo "infer gpu rc=$? $(( $(date +%s) - s ))s"
tail -3 $OUT/infer-gpu.err
cat $OUT/infer-gpu.txt
cp ~/.cache/gpukit/cudnn-choices-* $OUT/ 2>/dev/null
