#!/usr/bin/env bash
# Run 55: does the side that opens the timed rounds gain, with gpukit against PyTorch?
# GPUKIT_TURN_PEER_OPENS=1 (an experiment switch) lets PyTorch open; f64 4096, f64 8192 and
# bf16 8192, alternating gpukit-opens and PyTorch-opens, twice each.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
for i in 1 2; do
  for o in 0 1; do
    GPUKIT_TURN_PEER_OPENS=$o $G timeout 150 $B bench matmul --device cuda:0 --dtype f64,bf16 --sizes 4096,8192 --compare-pytorch --save-json $W/open$o-$i.json >$W/open$o-$i.txt 2>$W/open$o-$i.err
    echo "[$((SECONDS-S)) s] peer opens=$o, $i rc=$?"
  done
done
mkdir -p "$OUT"; tar czf "$OUT/run55.tar.gz" -C "$W" .
for f in $W/open*.json; do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d['matmul']['rows']:
    p = r.get('pytorch')
    if not p: print(r['dtype'], r['size'], r['status']); continue
    print(sys.argv[1].rsplit('/', 1)[1][:-5], f"{r['dtype']:5} {r['size']} {r['backend']}: ratio {p['ratio']:.3f} rounds", " ".join(f"{x:.3f}" for x in p['turn_ratios']))
PY
done
