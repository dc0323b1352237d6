#!/usr/bin/env bash
# session 31 call 4 (one H200): the classifier's warp kernel sums only the batch's rows, up to 8
# rows; GPU tests, the third cold bench conv beside PyTorch (traced), rows at batch 1/32 of main
# and new in turns, the classifier's time at 1/8/9/32 rows, warm single rows
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new
say() { echo "$*" | tee -a $S; }
for f in .device/gpukit.gz .device/*/gpukit.gz .device/tests/*.gz; do gunzip -f $f; chmod +x ${f%.gz}; done
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 120 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/gpu_engine --test-threads 1 > $OUT/new/gpu_engine.log 2>&1
say "gpu_engine rc=$?: $(grep -E '^test result' $OUT/new/gpu_engine.log)"; grep -E "FAILED|panicked|classify" $OUT/new/gpu_engine.log | head -14 | tee -a $S
export PATH=/opt/torch/.venv/bin:$PATH
t0=$(date +%s%N)
env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$(mktemp -d) GPUKIT_TRACE=1 timeout 290 .device/gpukit bench conv --device cuda:0 --compare-pytorch --save-json $OUT/conv-cold-3.json > /dev/null 2> $OUT/conv-cold-3.trace
say "bench conv --device cuda:0 --compare-pytorch (empty cache, traced) rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
python3 scripts/conv_parity.py $OUT/conv-cold-3.json 2>&1 | tee -a $S
gzip -f $OUT/conv-cold-3.json $OUT/conv-cold-3.trace
W=$(mktemp -d)
bin() { [ $1 = new ] && echo $PWD/.device/gpukit || echo $PWD/.device/$1/gpukit; }
rows="infer --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 200"
for b in base new; do env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b timeout 60 $(bin $b) $rows > /dev/null 2>&1; done
for b in base new new base; do
  f=$OUT/new/rows-$b-$RANDOM.txt
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b timeout 60 $(bin $b) $rows > $f 2>&1
  say "rows $b rc=$?: $(grep -E '^│ fp16' $f | head -2 | awk -F'┆' '{print $3 $4}' | tr -s ' ' | tr '\n' ' ')"
done
for b in base new; do for n in 1 8 9 32; do
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b timeout 60 $(bin $b) profile infer --batch-size $n --strategy fp16-nhwc-graph --group-by op --top 40 > $OUT/new/profile-$b-$n.txt 2>&1
  say "profile $b b$n rc=$?: $(grep -iE 'linear' $OUT/new/profile-$b-$n.txt | head -1 | awk -F'┆' '{print $1 $4 $NF}' | tr -s ' ' | cut -c1-160)"
done; done
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
for b in base new; do env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $(bin $b) $one > /dev/null 2>&1; done
for b in base new new base; do
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $(bin $b) $one > /dev/null 2>&1
  say "warm single row $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
cd $OUT && tar czf runs.tar.gz new && rm -rf new
