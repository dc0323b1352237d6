#!/usr/bin/env bash
# session 29 call 6 (one H100): `all` cold and first results after pruning hopeless finalists,
# overlapping conv's CPU reference, the largest batch found on paper, matmul trials pruned
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new $OUT/base
OUT=$OUT/new bash scripts/gpu-timeline.sh all single quick > /dev/null 2>&1
cat $OUT/new/summary.txt | grep -E "rc=|pytorch first" | tee -a $S
GPUKIT_BIN=$PWD/.device/base/gpukit OUT=$OUT/base bash scripts/gpu-timeline.sh all > /dev/null 2>&1
cat $OUT/base/summary.txt | grep -E "rc=" | sed 's/^/base: /' | tee -a $S
for d in new base; do grep -m1 "gpukit 0.1.0" $OUT/$d/all-cold-report.md | sed "s/^/$d: /" | cut -c1-300 | tee -a $S; done
for d in new base; do grep -c "| failed\|FAILED" $OUT/$d/all-cold-report.md | sed "s/^/$d failed rows: /" | tee -a $S; done
cd $OUT && for d in new base; do gzip -f $d/*.trace; done
