#!/usr/bin/env bash
# session 31 call 2 (one H200): the classifier kernel's three blockings, graphs read ahead by the
# helpers; GPU tests, first results (new and main in turns) beside PyTorch, warm rows, the fast
# choice against the exhaustive one at batch 32; then the first cold bench conv beside PyTorch
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new
say() { echo "$*" | tee -a $S; }
for f in .device/gpukit.gz .device/*/gpukit.gz .device/tests/*.gz; do gunzip -f $f; chmod +x ${f%.gz}; done
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
fails=0
for t in gpu_engine gpu_program; do
  timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/$t --test-threads 1 > $OUT/new/$t.log 2>&1
  rc=$?; [ $rc = 0 ] || fails=1
  say "$t rc=$rc: $(grep -E '^test result' $OUT/new/$t.log)"; grep -E "FAILED|panicked|classify" $OUT/new/$t.log | head -12 | tee -a $S
done
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
bin() { [ $1 = new ] && echo $PWD/.device/gpukit || echo $PWD/.device/$1/gpukit; }
say "pytorch first iteration: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
for b in new base base new; do
  c=$W/cold-$b-$RANDOM; mkdir -p $c; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$c GPUKIT_TRACE=1 $(bin $b) $one > $OUT/new/cold-$b-$RANDOM.txt 2> $c.trace
  say "cold $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(grep -E 'planning [0-9]+ convolutions' $c.trace | tr '\n' ' ' | cut -c1-260)"
  cp $c.trace $OUT/new/
done
say "pytorch first iteration: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
for b in base new; do env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $(bin $b) $one > /dev/null 2>&1; done
for r in 1 2; do for b in base new new base; do
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b GPUKIT_TRACE=1 $(bin $b) $one > $OUT/new/ab-$b-$r.txt 2> $OUT/new/ab-$b-$r.trace
  say "warm single row $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done; done
for n in 1 32 256; do
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-new $(bin new) profile infer --batch-size $n --strategy fp16-nhwc-graph --group-by op --top 40 > $OUT/new/profile-new-$n.txt 2>&1
  say "profile new b$n rc=$?: $(grep -iE 'linear' $OUT/new/profile-new-$n.txt | head -1 | tr -s ' ' | cut -c1-200)"
done
SKIP_256=1 OUT=$OUT/new/planning timeout 200 bash scripts/gpu-planning.sh check > /dev/null 2>&1
grep -E "rc=|pytorch|ab32|planning " $OUT/new/planning/summary.txt | head -30 | tee -a $S
cd $OUT && tar czf runs.tar.gz new && rm -rf new && cd - > /dev/null
if [ $fails = 0 ]; then
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$(mktemp -d) timeout 280 .device/gpukit bench conv --device cuda:0 --compare-pytorch --save-json $OUT/conv-cold-1.json > $OUT/conv-cold-1.txt 2> /dev/null
  say "bench conv --device cuda:0 --compare-pytorch (empty cache) rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  python3 scripts/conv_parity.py $OUT/conv-cold-1.json 2>&1 | tee -a $S
  gzip -f $OUT/conv-cold-1.json; rm -f $OUT/conv-cold-1.txt
fi
