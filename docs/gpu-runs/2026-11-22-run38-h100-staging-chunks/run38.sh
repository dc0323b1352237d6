#!/usr/bin/env bash
# Run 38: staging chunk 16 MiB (the new default, one piece a thread) against 8, 32 and 64 MiB,
# alternated; then the whole `bench bandwidth --compare-pytorch` on the new default.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
run() {
  env "$@" $G timeout 60 $B bench bandwidth --sizes 256M,1G --iterations 10 --json 2>/dev/null | python3 -c "
import json,sys
d=json.load(sys.stdin); d=d.get('bandwidth', d)
print('; '.join(f\"{r['kind']} {r['bytes']>>20} MiB {round(r.get('gbs') or 0, 1)}\" for r in d['rows'] if 'pageable' in r['kind'] and 'h2d' in r['kind']))
"
}
for round in 1 2; do
  for c in 16777216 8388608 33554432 67108864; do
    echo "round $round chunk $((c >> 20)) MiB: $(run GPUKIT_STAGING_CHUNK=$c)"
  done
done
$G timeout 200 $B bench bandwidth --compare-pytorch --save-json $W/bw.json >$W/bw.txt 2>$W/bw.err
echo "[$((SECONDS-S)) s] bandwidth rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run38.tar.gz" -C "$W" .
grep -E "1 GiB|256 MiB" $W/bw.txt | sed 's/  */ /g'
