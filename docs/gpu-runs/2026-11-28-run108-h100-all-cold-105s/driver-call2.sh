#!/usr/bin/env bash
# session 30 call 2 (one H100): `all` cold, first results and warm single rows with the 150 ms
# power window and conversions on every core (verify30 = main + three branches) beside main
set -u
S=$OUT/summary.txt
mkdir -p $OUT/new $OUT/base
OUT=$OUT/new bash scripts/gpu-timeline.sh all single quick ab > /dev/null 2>&1
cat $OUT/new/summary.txt | grep -E "rc=|pytorch first" | tee -a $S
GPUKIT_BIN=$PWD/.device/base/gpukit OUT=$OUT/base bash scripts/gpu-timeline.sh all > /dev/null 2>&1
cat $OUT/base/summary.txt | grep -E "rc=" | sed 's/^/base: /' | tee -a $S
for d in new base; do grep -c "| failed\|FAILED" $OUT/$d/all-cold-report.md | sed "s/^/$d failed rows: /" | tee -a $S; done
cd $OUT && for d in new base; do gzip -f $d/*.trace; done
