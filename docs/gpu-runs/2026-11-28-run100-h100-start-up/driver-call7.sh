#!/usr/bin/env bash
set -u
S=$OUT/tests-summary.txt; mkdir -p $OUT
say() { echo "$*" | tee -a $S; }
export GPUKIT_REQUIRE_GPU=1
for t in gpu_tensor gpu_program gpu_engine "gpu_train gather" "gpu_train fp32_matches" "gpu_train mixed"; do
  set -- $t; b=$1; f=${2:-}
  timeout 200 env -u LD_LIBRARY_PATH .device/tests/$b --test-threads 1 $f > $OUT/test-$b-$f.log 2>&1
  say "$b $f rc=$?: $(grep -E '^test result' $OUT/test-$b-$f.log | tail -1)"
  grep -E "FAILED|panicked" $OUT/test-$b-$f.log | head -5 | tee -a $S
done
GPUKIT_BASE=$PWD/.device/base/gpukit bash scripts/gpu-timeline.sh single ab quick > /dev/null 2>&1
cat $S
