#!/usr/bin/env bash
# Run 56: the final bench matmul beside PyTorch: both orders (gpukit opens 3 rounds, PyTorch
# opens 3), each after PyTorch's untimed opening turn and a 1.5 s soak; turns of at least 100 ms
# over at least 4 operand sets a side. Sizes 2048, 4096 and 8192, every dtype, twice.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
for i in 1 2; do
  $G timeout 280 $B bench matmul --device cuda:0 --sizes 2048,4096,8192 --compare-pytorch --save-json $W/mm-$i.json >$W/mm-$i.txt 2>$W/mm-$i.err
  echo "[$((SECONDS-S)) s] sweep $i rc=$?"
done
mkdir -p "$OUT"; tar czf "$OUT/run56.tar.gz" -C "$W" .
for f in $W/mm-*.json; do
  echo "== $(basename $f)"
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d['matmul']['rows']:
    p = r.get('pytorch'); t = r.get('timing')
    if not t: print(r['dtype'], r['size'], r['status']); continue
    c = r.get('confirmation')
    conf = f" confirm {c[0]:.3f}" if c else ""
    pt = (f" torch {p['rate']:.1f} ratio {p['ratio']:.3f} openers " + " ".join(f"{x:.3f}" for x in p.get('by_opener', []))
          + " rounds " + " ".join(f"{x:.3f}" for x in p['turn_ratios'])) if p else ""
    print(f"{r['dtype']:5} {r['size']:5} {r['tflops']:7.1f} TF {r['backend']}{conf}{pt}")
PY
done
