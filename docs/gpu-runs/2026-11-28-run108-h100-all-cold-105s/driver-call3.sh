#!/usr/bin/env bash
# session 30 call 3 (one H100): `all` cold and warm single rows after: heuristic picks kept,
# infer's power read until it settles, conv's CPU rows 5 runs, long products' shorter trials,
# fp8 operands drawn faster; main beside in the same call
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new $OUT/base
OUT=$OUT/new bash scripts/gpu-timeline.sh all single quick ab > /dev/null 2>&1
cat $OUT/new/summary.txt | grep -E "rc=|pytorch first" | tee -a $S
GPUKIT_BIN=$PWD/.device/base/gpukit OUT=$OUT/base bash scripts/gpu-timeline.sh all > /dev/null 2>&1
cat $OUT/base/summary.txt | grep -E "rc=" | sed 's/^/base: /' | tee -a $S
for d in new base; do grep -c "| failed\|FAILED" $OUT/$d/all-cold-report.md | sed "s/^/$d failed rows: /" | tee -a $S; done
for d in new base; do sed -n 3p $OUT/$d/all-cold-report.md | cut -c1-330 | sed "s/^/$d: /" | tee -a $S; done
cd $OUT && tar czf runs.tar.gz new base && rm -rf new base
