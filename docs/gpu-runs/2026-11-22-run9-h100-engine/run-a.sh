#!/usr/bin/env bash
# device run A: tests, then GPU inference beside PyTorch
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv > $OUT/nvidia-smi.txt
lscpu | grep -E 'Model name|^CPU\(s\)' >> $OUT/nvidia-smi.txt
cat $OUT/nvidia-smi.txt
for t in .device/tests/*; do
  n=$(basename $t)
  s=$(date +%s)
  clean GPUKIT_REQUIRE_GPU=1 GPUKIT_REQUIRE_ORT=0 timeout 240 $t --test-threads 1 > $OUT/test-$n.txt 2>&1
  echo "test $n rc=$? $(( $(date +%s) - s ))s: $(grep -E '^test result' $OUT/test-$n.txt | tail -1)"
done
grep -h "FAILED\|panicked" $OUT/test-*.txt | head -20
s=$(date +%s)
clean timeout 200 .device/gpukit infer --device cuda:0 --batch-sizes 1,32 --strategies fp32,fp16-nhwc,fp16-nhwc-graph > $OUT/infer-quick.txt 2>&1
echo "infer quick rc=$? $(( $(date +%s) - s ))s"; cat $OUT/infer-quick.txt | tail -30
