#!/usr/bin/env bash
# session 31 call 5 (one H200): the final binary (a warp an output up to 4 rows, a block beyond);
# the engine's GPU tests, the classifier's time at 1/4/5/8 rows, warm single rows
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new
say() { echo "$*" | tee -a $S; }
for f in .device/gpukit.gz .device/*/gpukit.gz .device/tests/*.gz; do gunzip -f $f; chmod +x ${f%.gz}; done
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 100 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/gpu_engine --test-threads 1 > $OUT/new/gpu_engine.log 2>&1
say "gpu_engine rc=$?: $(grep -E '^test result' $OUT/new/gpu_engine.log)"; grep -E "FAILED|panicked|classify" $OUT/new/gpu_engine.log | head -14 | tee -a $S
W=$(mktemp -d)
for n in 1 4 5 8; do
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c timeout 40 .device/gpukit profile infer --batch-size $n --strategy fp16-nhwc-graph --group-by op --top 40 > $OUT/new/profile-$n.txt 2>&1
  say "profile new b$n rc=$?: $(grep -iE 'linear' $OUT/new/profile-$n.txt | head -1 | awk -F'┆' '{print $1 $4 $NF}' | tr -s ' ' | cut -c1-160)"
done
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
t0=$(date +%s%N)
env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c $PWD/.device/gpukit $one > $OUT/new/cold.txt 2>&1
say "first single row (kernels cached, choices not) rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
for r in 1 2 3; do
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c $PWD/.device/gpukit $one > $OUT/new/warm-$r.txt 2>&1
  say "warm single row new rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
cd $OUT && tar czf runs.tar.gz new && rm -rf new
