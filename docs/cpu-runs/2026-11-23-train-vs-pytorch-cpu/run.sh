#!/usr/bin/env bash
# gpukit train --compare-pytorch on this development machine's CPU (2 cores), release build,
# PyTorch 2.11.0 (CPU use of the PyPI wheel) in a venv named by GPUKIT_PYTHON.
G=${GPUKIT_BIN:-../../../target/release/gpukit}
for args in "--steps 200 --epochs 13" "--preset seed-classification --epochs 200" \
  "--preset seed-regression" "--preset seed-classification" \
  "--optimizer sgd --momentum 0.9 --lr 0.01 --weight-decay 0.01 --epochs 5" \
  "--optimizer adamw --weight-decay 0.1 --epochs 5" "--accumulate 3 --epochs 5" \
  "--preset seed-classification --optimizer adam --lr 0.01 --batch-size 16 --epochs 20 --eval-fraction 0.2" \
  "--layers 16,128,64,1 --no-shuffle --epochs 4" "--layers 16,256,256,256,256,1" \
  "--layers 16,256,256,256,256,1 --checkpoint-activations"; do
  # shellcheck disable=SC2086
  $G train $args --compare-pytorch --json 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin); p = d['result']['pytorch']
print('train %-100s ok=%s updates=%3d max rel. diff %.2e (update %d); gpukit %.2f ms, PyTorch %.2f ms (%.1fx)' % (
  sys.argv[1], d['ok'], len(p['step_losses']), p['max_relative_difference'], p['at_update'],
  p['gpukit_seconds_median'] * 1e3, p['seconds_median'] * 1e3, p['seconds_median'] / p['gpukit_seconds_median']))" "$args"
done
