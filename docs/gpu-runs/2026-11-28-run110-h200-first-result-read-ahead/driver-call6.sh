#!/usr/bin/env bash
# session 31 call 6 (one H200): the committed tree; `gpukit all` with an empty cache (every
# command's rows verified)
set -u
S=$OUT/summary.txt
say() { echo "$*" | tee -a $S; }
gunzip -f .device/gpukit.gz; chmod +x .device/gpukit
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
t0=$(date +%s%N)
env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c timeout 150 .device/gpukit all --out $W/all > $OUT/all.txt 2> $OUT/all.err
say "all (empty cache) rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
cp $W/all/report.md $OUT/all-cold-report.md 2>/dev/null
grep -c "| failed\|FAILED" $OUT/all-cold-report.md | sed "s/^/failed rows: /" | tee -a $S
sed -n 1,6p $OUT/all-cold-report.md | cut -c1-400 | tee -a $S
tail -3 $OUT/all.err | tee -a $S
