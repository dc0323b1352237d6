#!/usr/bin/env bash
# session 32 call 2 (one H200): next = main + confirm-long + fp8-conv. GPU tests of the engine,
# the third cold bench conv, cold planning new/main in turns, fast vs exhaustive (b32), `all` cold.
set -u
bash .device/unpack.sh
S=$OUT/summary.txt; mkdir -p $OUT/t
say() { echo "$*" | tee -a $S; }
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for t in gpu_engine gpu_program; do
  timeout 150 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) .device/tests/$t --test-threads 1 > $OUT/t/$t.log 2>&1
  say "$t rc=$?: $(grep -E '^test result' $OUT/t/$t.log)"; grep -E "FAILED|panicked" $OUT/t/$t.log | head -12 | tee -a $S
done
OUT=$OUT/conv bash scripts/gpu-conv-cold.sh 1 | tee -a $S
say "left $(left) s"
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
bin() { [ $1 = new ] && echo $PWD/.device/gpukit || echo $PWD/.device/$1/gpukit; }
for b in new base base new; do
  c=$W/cold-$b-$RANDOM; mkdir -p $c; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$c GPUKIT_TRACE=1 $(bin $b) $one > /dev/null 2> $c.trace
  say "cold $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(grep -E 'planning [0-9]+ convolutions' $c.trace | tail -1 | cut -c1-200)"
  cp $c.trace $OUT/t/
done
SKIP_256=1 OUT=$OUT/planning timeout $(( $(left) - 110 )) bash scripts/gpu-planning.sh check > /dev/null 2>&1
grep -E "rc=|pytorch|ab32|planning |img/s|sections" $OUT/planning/summary.txt | head -40 | tee -a $S
say "left $(left) s"
[ $(left) -gt 120 ] && OUT=$OUT/all timeout $(( $(left) - 5 )) bash scripts/gpu-timeline.sh all > /dev/null 2>&1
cat $OUT/all/summary.txt 2>/dev/null | head -20 | tee -a $S
grep -iE "fail|not ok" $OUT/all/all-cold-report.md | head | tee -a $S
cd $OUT && tar czf t.tar.gz t && rm -rf t
say "done, left $(left) s"
