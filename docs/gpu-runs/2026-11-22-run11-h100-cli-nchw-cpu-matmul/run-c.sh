#!/usr/bin/env bash
# device run C: CLI GPU tests, engine tests, fp16 NCHW after the projection/NCHW graph change, CPU matmul thread sweep
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
for t in .device/tests/cli-* .device/tests/gpu_engine-*; do
  n=$(basename $t); s=$(date +%s)
  clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN=$PWD/.device/gpukit timeout 300 $t --test-threads 1 > $OUT/test-$n.txt 2>&1
  echo "test $n rc=$? $(( $(date +%s) - s ))s: $(grep -E '^test result' $OUT/test-$n.txt | tail -1)"
done
grep -h "FAILED\|panicked" $OUT/test-*.txt | head -20
s=$(date +%s)
clean timeout 200 .device/gpukit infer --device cuda:0 --batch-sizes 1,32,256 --strategies fp32,fp16,fp16-graph,fp16-nhwc-graph --save-json $OUT/infer-nchw.json > $OUT/infer-nchw.txt 2>&1
echo "infer nchw rc=$? $(( $(date +%s) - s ))s"; grep -E "^│ (fp|bf|tf)" $OUT/infer-nchw.txt | cut -c1-140
for th in 16 8; do
  s=$(date +%s)
  clean RAYON_NUM_THREADS=$th timeout 100 .device/gpukit bench matmul --device cpu --sizes 4096 --dtype f32 --compare-pytorch > $OUT/matmul-cpu-$th.txt 2>&1
  echo "matmul cpu threads=$th rc=$? $(( $(date +%s) - s ))s"; grep -E "4096|PyTorch" $OUT/matmul-cpu-$th.txt | cut -c1-200 | head -5
done
