#!/usr/bin/env bash
# session 30 call 4 (one H100): conv rows staged through pinned memory, cuBLAS opened on its own
# thread; `all` cold, first results, and warm single rows of main (base), call 3's binary (mid)
# and this one (new) in turns; the engine's GPU tests
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new
say() { echo "$*" | tee -a $S; }
for f in .device/gpukit.gz .device/*/gpukit.gz .device/tests/*.gz; do gunzip -f $f; chmod +x ${f%.gz}; done
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for t in gpu_engine gpu_program; do
  timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/$t --test-threads 1 > $OUT/new/$t.log 2>&1
  say "$t rc=$?: $(grep -E '^test result' $OUT/new/$t.log)"; grep -E "FAILED|panicked" $OUT/new/$t.log | head -5 | tee -a $S
done
OUT=$OUT/new bash scripts/gpu-timeline.sh all single quick > /dev/null 2>&1
cat $OUT/new/summary.txt | grep -E "rc=|pytorch first" | tee -a $S
grep -c "| failed\|FAILED" $OUT/new/all-cold-report.md | sed "s/^/new failed rows: /" | tee -a $S
sed -n 3p $OUT/new/all-cold-report.md | cut -c1-330 | tee -a $S
W=$(mktemp -d)
one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
for b in base mid new; do
  B=$PWD/.device/$b/gpukit; [ $b = new ] && B=$PWD/.device/gpukit
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b $B $one > /dev/null 2>&1
done
for r in 1 2 3; do for b in base mid new new mid base; do
  B=$PWD/.device/$b/gpukit; [ $b = new ] && B=$PWD/.device/gpukit
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c-$b GPUKIT_TRACE=1 $B $one > $OUT/new/ab-$b-$r.txt 2> $OUT/new/ab-$b-$r.trace
  say "warm single row $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done; done
cd $OUT && tar czf runs.tar.gz new && rm -rf new
