#!/usr/bin/env bash
# Run 54: A/A, both sides served, with soak and 4 operand sets a side: A opens (5 rounds), B opens
# (5 rounds), A opens (6 rounds); f64 and bf16 at 8192, three attempts each.
set -u
S=$SECONDS
D=docs/gpu-runs/2026-11-22-run47-h100-aa-turns
for args in "ab 5" "ba 5" "ab 6"; do
  timeout 170 python3 $D/aa_turns.py remote soak $args
  echo "[$((SECONDS-S)) s]"
done
