#!/usr/bin/env bash
# Run 40: cublasDgemm as a candidate for f64 rows, beside PyTorch (paired turns); the GPU op tests.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
for i in 1 2; do
  $G timeout 100 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096,8192 --compare-pytorch --save-json $W/f64-$i.json >$W/f64-$i.txt 2>$W/f64-$i.err
  t "f64 $i rc=$?"
done
for tb in .device/tests/gpu_ops-*; do
  $G GPUKIT_REQUIRE_GPU=1 timeout 120 $tb >$W/test-gpu_ops.txt 2>&1
  t "gpu_ops rc=$? $(grep -E '^test result' $W/test-gpu_ops.txt)"
done
mkdir -p "$OUT"; tar czf "$OUT/run40.tar.gz" -C "$W" .
for f in f64-1 f64-2; do
  echo "== $f"; grep -E "^│ cuda" $W/$f.txt | awk -F'│|┆' '{print $2,$3,$4,$5,$6,$10,$(NF-3),$(NF-2),$(NF-1)}' | sed 's/  */ /g'
  python3 -c "
import json; d=json.load(open('$W/$f.json'))['matmul']
for r in d['rows']: print(r['size'], [(c[0], round(c[1] or 0,3)) for c in r['candidates']])"
done
grep -E "FAILED|panicked|Error" $W/test-gpu_ops.txt | head
