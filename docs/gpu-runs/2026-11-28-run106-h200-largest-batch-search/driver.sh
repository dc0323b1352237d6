#!/usr/bin/env bash
# session 29 call 7: memory's largest batch searched from the paper's answer
set -u
S=$OUT/summary.txt
export XDG_CACHE_HOME=$(mktemp -d)
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
t0=$(date +%s%N)
timeout 100 env -u LD_LIBRARY_PATH .device/gpukit memory --device cuda:0 --batch-sizes 32 --find-max-batch > $OUT/memory.txt 2>&1
say "memory --batch-sizes 32 --find-max-batch rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
grep -iE "largest batch|attempt" $OUT/memory.txt | cut -c1-250 | tee -a $S
