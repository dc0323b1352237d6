#!/usr/bin/env bash
# session 31 call 1 (one H200): the classifier on gpukit's kernel (no cuBLAS in ResNet's run),
# slow engines stopped after one direct run; GPU tests, first results beside PyTorch, warm rows
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new
say() { echo "$*" | tee -a $S; }
for f in .device/gpukit.gz .device/*/gpukit.gz .device/tests/*.gz; do gunzip -f $f; chmod +x ${f%.gz}; done
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for t in gpu_engine gpu_program; do
  timeout 240 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/$t --test-threads 1 > $OUT/new/$t.log 2>&1
  say "$t rc=$?: $(grep -E '^test result' $OUT/new/$t.log)"; grep -E "FAILED|panicked|classify" $OUT/new/$t.log | head -12 | tee -a $S
done
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
say "pytorch first iteration: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
bin() { [ $1 = new ] && echo $PWD/.device/gpukit || echo $PWD/.device/$1/gpukit; }
for b in new base new base; do
  c=$W/cold-$b-$RANDOM; mkdir -p $c; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$c GPUKIT_TRACE=1 $(bin $b) $one > $OUT/new/cold-$b.txt 2> $OUT/new/cold-$b.trace
  say "cold $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(grep -E 'planning [0-9]+ convolutions' $OUT/new/cold-$b.trace | tr '\n' ' ' | cut -c1-300)"
  grep -E "img/s|images/s" $OUT/new/cold-$b.txt | head -3 | tee -a $S
done
say "pytorch first iteration: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
for b in base new; do env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $(bin $b) $one > /dev/null 2>&1; done
for r in 1 2 3; do for b in base new new base; do
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b GPUKIT_TRACE=1 $(bin $b) $one > $OUT/new/ab-$b-$r.txt 2> $OUT/new/ab-$b-$r.trace
  say "warm single row $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done; done
# batch 1 and 256 rows of both binaries (the classifier kernel's speed against cuBLAS)
for b in base new new base; do
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $(bin $b) infer --device cuda:0 --batch-sizes 1,256 --strategies fp16-nhwc,fp32 --gpu-iterations 50 > $OUT/new/sizes-$b-$RANDOM.txt 2>&1
  say "sizes $b rc=$?"
done
for b in base new; do for n in 1 32 256; do
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $(bin $b) profile infer --batch-size $n --strategy fp16-nhwc-graph --group-by op --top 40 > $OUT/new/profile-$b-$n.txt 2>&1
  say "profile $b b$n rc=$?: $(grep -iE 'linear|fc ' $OUT/new/profile-$b-$n.txt | head -2 | tr -s ' ' | cut -c1-200)"
done; done
cd $OUT && tar czf runs.tar.gz new && rm -rf new
