#!/usr/bin/env bash
# Run 47: A/A tests of the turn-taking method, PyTorch on both sides (aa_turns.py).
set -u
S=$SECONDS
D=docs/gpu-runs/2026-11-22-run47-h100-aa-turns
timeout 250 python3 $D/aa_turns.py local
echo "[$((SECONDS-S)) s]"
timeout 250 python3 $D/aa_turns.py remote
echo "[$((SECONDS-S)) s]"
