#!/usr/bin/env bash
set -u
GPUKIT_BASE=$PWD/.device/base/gpukit bash scripts/gpu-timeline.sh single ab > /dev/null 2>&1
# a second A/B round, order B A A B
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
for b in .device/gpukit .device/base/gpukit; do env -u LD_LIBRARY_PATH XDG_CACHE_HOME=/tmp/cache-ab-$(basename $(dirname $PWD/$b)) $PWD/$b $one > /dev/null 2>&1; done
for b in .device/gpukit .device/base/gpukit .device/base/gpukit .device/gpukit .device/gpukit .device/base/gpukit; do
  t0=$(date +%s%N); env -u LD_LIBRARY_PATH XDG_CACHE_HOME=/tmp/cache-ab-$(basename $(dirname $PWD/$b)) $PWD/$b $one > /dev/null 2>&1
  echo "warm single row rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: $b" >> $OUT/summary.txt
done
