#!/usr/bin/env bash
# Run 46: the default GPU sweep of bench matmul beside PyTorch, twice, with PyTorch's untimed
# opening turn, 100 ms turns and the paired confirmation of cuBLASLt winners.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
for i in 1 2; do
  $G timeout 280 $B bench matmul --device cuda:0 --compare-pytorch --save-json $W/mm-$i.json >$W/mm-$i.txt 2>$W/mm-$i.err
  echo "[$((SECONDS-S)) s] sweep $i rc=$?"
done
mkdir -p "$OUT"; tar czf "$OUT/run46.tar.gz" -C "$W" .
for f in $W/mm-*.json; do
  echo "== $f"
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d['matmul']['rows'] if 'matmul' in d else d['rows']
for r in rows:
    p = r.get('pytorch'); t = r.get('timing')
    if not t: print(r['dtype'], r['size'], r['status']); continue
    c = r.get('confirmation')
    conf = f" confirm {c[0]:.3f}" if c else ""
    pt = f" torch {p['rate']:.1f} ratio {p['ratio']:.3f} ({min(p['turn_ratios']):.2f}-{max(p['turn_ratios']):.2f})" if p else ""
    print(f"{r['dtype']:5} {r['size']:5} {r['tflops']:7.1f} TF {r['backend']}{conf}{pt}")
PY
done
