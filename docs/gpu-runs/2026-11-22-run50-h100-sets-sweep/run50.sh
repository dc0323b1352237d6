#!/usr/bin/env bash
# Run 50: bench matmul beside PyTorch with at least 4 operand sets a side (both tools), 100 ms
# turns, PyTorch's untimed opening turn and the paired confirmation: the default GPU sweep twice,
# then CPU f32 at 4096.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
for i in 1 2; do
  $G timeout 280 $B bench matmul --device cuda:0 --compare-pytorch --save-json $W/mm-$i.json >$W/mm-$i.txt 2>$W/mm-$i.err
  echo "[$((SECONDS-S)) s] sweep $i rc=$?"
done
$G timeout 200 $B bench matmul --device cpu --dtype f32 --sizes 4096 --compare-pytorch --save-json $W/cpu.json >$W/cpu.txt 2>$W/cpu.err
echo "[$((SECONDS-S)) s] cpu rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run50.tar.gz" -C "$W" .
for f in $W/mm-*.json $W/cpu.json; do
  echo "== $(basename $f)"
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d['matmul']['rows'] if 'matmul' in d else d['rows']
for r in rows:
    p = r.get('pytorch'); t = r.get('timing')
    if not t: print(r['dtype'], r['size'], r['status']); continue
    c = r.get('confirmation')
    conf = f" confirm {c[0]:.3f}" if c else ""
    pt = f" torch {p['rate']:.2f} ratio {p['ratio']:.3f} ({min(p['turn_ratios']):.2f}-{max(p['turn_ratios']):.2f})" if p else ""
    print(f"{r['dtype']:5} {r['size']:5} {r['tflops']:7.2f} TF n={t['summary_ms']['count']} {r['backend']}{conf}{pt}")
PY
done
