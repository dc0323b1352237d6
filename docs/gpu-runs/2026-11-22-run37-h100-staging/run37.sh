#!/usr/bin/env bash
# Run 37: the pageable host->device staging path: piece size a thread, chunk size, and streaming
# (non-temporal) stores, alternated (experiment switches GPUKIT_STAGING_*, not all kept).
set -u
S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
run() { # env assignments...
  env "$@" $G timeout 60 $B bench bandwidth --sizes 1G --iterations 10 --json 2>/dev/null | python3 -c "
import json,sys
d=json.load(sys.stdin); d=d.get('bandwidth', d)
for r in d['rows']:
    if r['kind'] in ('h2d_pageable_staged','h2d_pageable') or 'staged' in str(r['kind']):
        print(r['kind'], round(r.get('gbs') or 0, 1), r['status'], end='; ')
"; echo
}
for round in 1 2; do
  for cfg in "X=1" "GPUKIT_STAGING_PIECE=524288" "GPUKIT_STAGING_NT=1" "GPUKIT_STAGING_NT=1 GPUKIT_STAGING_PIECE=524288" \
             "GPUKIT_STAGING_NT=1 GPUKIT_STAGING_PIECE=262144 GPUKIT_STAGING_CHUNK=4194304" \
             "GPUKIT_STAGING_NT=1 GPUKIT_STAGING_PIECE=1048576 GPUKIT_STAGING_CHUNK=16777216" \
             "GPUKIT_STAGING_PIECE=1048576 GPUKIT_STAGING_CHUNK=16777216"; do
    echo "round $round [$cfg]: $(run $cfg)"
  done
done
echo "[$((SECONDS-S)) s]"
