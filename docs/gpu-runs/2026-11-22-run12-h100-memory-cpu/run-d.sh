#!/usr/bin/env bash
# device run D: new GPU tests, gpukit memory (fp32, fp16, limit, find-max-batch) beside PyTorch, one-at-a-time rows, CPU inference beside ONNX Runtime and PyTorch
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
G=.device/gpukit
for t in .device/tests/gpu_tensor-* .device/tests/gpu_engine-*; do
  n=$(basename $t); s=$(date +%s)
  clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN=$PWD/$G timeout 120 $t --test-threads 1 > $OUT/test-$n.txt 2>&1
  echo "test $n rc=$? $(( $(date +%s) - s ))s: $(grep -E '^test result' $OUT/test-$n.txt | tail -1)"
done
grep -h "FAILED\|panicked" $OUT/test-*.txt | head
run() { local name=$1; shift; local s=$(date +%s); clean timeout ${T:-120} "$@" > $OUT/$name.txt 2> $OUT/$name.err; echo "== $name rc=$? $(( $(date +%s) - s ))s: $*"; }
run memory-fp32 $G memory --batch-sizes 16,32,64,128 --find-max-batch --save-json $OUT/memory-fp32.json
run memory-fp16 $G memory --precision fp16 --batch-sizes 16,32,64,128 --save-json $OUT/memory-fp16.json
run memory-limit-fail $G memory --memory-fraction 0.05 --batch-sizes 1024
run memory-limit-halve $G memory --memory-fraction 0.05 --batch-sizes 1024 --on-oom halve
cat $OUT/memory-fp32.txt | cut -c1-220; tail -3 $OUT/memory-limit-fail.err; grep -E "halved|^│ [0-9]" $OUT/memory-limit-halve.txt | cut -c1-200
clean timeout 120 /opt/torch/.venv/bin/python .device/torch_memory.py > $OUT/torch-memory.json 2> $OUT/torch-memory.err; echo "torch memory rc=$?"; head -c 1500 $OUT/torch-memory.json
T=150 run infer-one-at-a-time $G infer --device cuda:0 --batch-sizes 8,32 --strategies fp16-nhwc-graph,fp16-nhwc-graph-one-at-a-time,fp16-nhwc-one-at-a-time --save-json $OUT/infer-one.json
grep -E "one image|TensorRT|^│ fp16" $OUT/infer-one-at-a-time.txt | cut -c1-200
T=240 run infer-cpu $G infer --device cpu --batch-sizes 1,32 --compare-pytorch --save-json $OUT/infer-cpu.json
grep -E "^│ (gpukit|ONNX)|eager_fp32|logits" $OUT/infer-cpu.txt | cut -c1-220
T=240 run infer-cpu-helper .device/gpukit-cpuwt infer --device cpu --batch-sizes 1,32 --save-json $OUT/infer-cpu-helper.json
grep -E "^│ (gpukit|ONNX)" $OUT/infer-cpu-helper.txt | cut -c1-220
