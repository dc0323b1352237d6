#!/usr/bin/env bash
# Run 45: PyTorch's untimed opening turn, and GPU turns lengthened to GPUKIT_TURN_BLOCK_MS
# (0 = the old 10-repetition turns), f64 and tf32 at 4096 and 8192 beside PyTorch.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
run() {  # name, env...
  local name=$1; shift
  env "$@" $G timeout 150 $B bench matmul --device cuda:0 --dtype f64,tf32 --sizes 4096,8192 --compare-pytorch --save-json $W/$name.json >$W/$name.txt 2>$W/$name.err
  echo "[$((SECONDS-S)) s] $name rc=$?"
}
run block0-a GPUKIT_TURN_BLOCK_MS=0
run block100-a GPUKIT_TURN_BLOCK_MS=100
run block0-b GPUKIT_TURN_BLOCK_MS=0
run block100-b GPUKIT_TURN_BLOCK_MS=100
run block300 GPUKIT_TURN_BLOCK_MS=300
run block100-settle5 GPUKIT_TURN_BLOCK_MS=100 GPUKIT_TURN_SETTLE_MS=5
mkdir -p "$OUT"; tar czf "$OUT/run45.tar.gz" -C "$W" .
for f in $W/*.json; do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d['matmul']['rows'] if 'matmul' in d else d['rows']
for r in rows:
    p = r.get('pytorch')
    if not p: continue
    s = r['timing']['summary_ms']
    print(sys.argv[1].rsplit('/', 1)[1][:-5], r['dtype'], r['size'], f"n={s['count']} ours {s['median']:.3f} ms p10 {s['p10']:.3f} torch {p['median_ms']:.3f} ratio {p['ratio']:.3f} rounds", " ".join(f"{x:.3f}" for x in p['turn_ratios']))
PY
done
